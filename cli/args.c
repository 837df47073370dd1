/* args.c — option-value parsing shared by the subcommands (see args.h). */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int cli_int_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int64_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long long a = strtoll(p, &end, 10);
        if (end == p || errno || a < lo || a > hi) goto bad;
        long long b = a;
        p = end;
        if (*p == '-') {
            p++;
            b = strtoll(p, &end, 10);
            if (end == p || errno || b < a || b > hi || b - a >= CLI_LIST_MAX) goto bad;
            p = end;
        }
        for (long long x = a; x <= b; x++) {
            bool dup = false;
            for (size_t i = 0; i < k && !dup; i++) dup = v[i] == x;
            if (dup) continue;
            if (k == CLI_LIST_MAX) goto bad;
            if (k == cap) {
                cap *= 2;
                int64_t *q = realloc(v, cap * sizeof *q);
                if (!q) goto bad;
                v = q;
            }
            v[k++] = x;
        }
        if (*p == ',') {
            p++;
            if (!*p) goto bad;
        } else if (*p) {
            goto bad;
        }
    }
    if (!k) goto bad;
    *out = v;
    *n = k;
    return 0;
bad:
    free(v);
    return -1;
}

int cli_size(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end || v > (1ull << 52) / mul) return -1;
    *out = (int64_t)(v * mul);
    return 0;
}

const char *cli_value(int argc, char **argv, int *i, const char *cmd)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "tandem %s: %s needs a value (see --help)\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

void cli_error(const char *cmd, const char *msg)
{
    const char *word = strrchr(cmd, ' ');
    word = word ? word + 1 : cmd;
    const char *const prefixes[2] = {cmd, word};
    for (int p = 0; p < 2; p++) {
        const size_t n = strlen(prefixes[p]);
        if (n && !strncmp(msg, prefixes[p], n) && msg[n] == ':' && msg[n + 1] == ' ') {
            msg += n + 2;
            break;
        }
    }
    fprintf(stderr, "tandem %s: %s\n", cmd, msg);
}
