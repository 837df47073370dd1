/* json.c — hostile-input JSON parsing (see json.h). */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool td_utf8_valid(const char *buf, size_t len, size_t *bad_off)
{
    const unsigned char *s = (const unsigned char *)buf;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp;
        if (c == 0) goto bad;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
        else goto bad;
        if (len - i <= n) goto bad;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) goto bad;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
        i += n + 1;
    }
    return true;
bad:
    if (bad_off) *bad_off = i;
    return false;
}

/* Maximum nesting depth of [ and { outside strings; stops counting at limit+1. */
static int json_depth(const char *buf, size_t len, size_t *where)
{
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '[' || c == '{') {
            if (++depth > max) {
                max = depth;
                if (max > TD_JSON_MAX_DEPTH) { *where = i; return max; }
            }
        } else if (c == ']' || c == '}') depth--;
    }
    return max;
}

/* Objects with many keys make the pairwise check quadratic; large objects (safetensors
 * headers with 10^5 tensors) are checked by sorting key pointers instead. */
static int cmp_keyptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static td_status check_unique_keys_sorted(const cJSON *node, const char *what, td_err *err)
{
    if (cJSON_IsObject(node)) {
        size_t n = 0;
        for (const cJSON *c = node->child; c; c = c->next) n++;
        if (n > 32) {
            const char **keys = malloc(n * sizeof *keys);
            if (!keys) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
            size_t k = 0;
            for (const cJSON *c = node->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
            qsort(keys, n, sizeof *keys, cmp_keyptr);
            for (size_t i = 1; i < n; i++) {
                if (strcmp(keys[i - 1], keys[i]) == 0) {
                    td_status st = td_err_set(err, TD_ERR_FORMAT, "%s: duplicate key \"%s\"",
                                              what, keys[i]);
                    free(keys);
                    return st;
                }
            }
            free(keys);
        } else {
            for (const cJSON *a = node->child; a; a = a->next)
                for (const cJSON *b = a->next; b; b = b->next)
                    if (a->string && b->string && strcmp(a->string, b->string) == 0)
                        return td_err_set(err, TD_ERR_FORMAT, "%s: duplicate key \"%s\"", what,
                                          a->string);
        }
    }
    if (cJSON_IsObject(node) || cJSON_IsArray(node)) {
        for (const cJSON *c = node->child; c; c = c->next) {
            td_status st = check_unique_keys_sorted(c, what, err);
            if (st) return st;
        }
    }
    return TD_OK;
}

td_status td_json_parse(const char *buf, size_t len, size_t max_len, const char *what,
                        cJSON **out, td_err *err)
{
    *out = NULL;
    if (len == 0) return td_err_set(err, TD_ERR_FORMAT, "%s: empty JSON", what);
    if (len > max_len)
        return td_err_set(err, TD_ERR_RANGE, "%s: JSON of %zu bytes exceeds the limit of %zu",
                          what, len, max_len);
    size_t bad = 0;
    if (!td_utf8_valid(buf, len, &bad))
        return td_err_set(err, TD_ERR_FORMAT, "%s: invalid UTF-8 or NUL byte at offset %zu",
                          what, bad);
    if (json_depth(buf, len, &bad) > TD_JSON_MAX_DEPTH)
        return td_err_set(err, TD_ERR_FORMAT, "%s: JSON nested deeper than %d (offset %zu)",
                          what, TD_JSON_MAX_DEPTH, bad);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!root) {
        size_t off = (end && end >= buf && end <= buf + len) ? (size_t)(end - buf) : 0;
        return td_err_set(err, TD_ERR_FORMAT, "%s: JSON syntax error near offset %zu", what,
                          off);
    }
    for (const char *p = end; p && p < buf + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return td_err_set(err, TD_ERR_FORMAT, "%s: trailing data after JSON at offset %zu",
                              what, (size_t)(p - buf));
        }
    }
    td_status st = check_unique_keys_sorted(root, what, err);
    if (st) {
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return TD_OK;
}

td_status td_json_read_file(const char *path, size_t max_len, cJSON **out, td_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return td_err_set(err, TD_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max_len) {
        fclose(f);
        return td_err_set(err, TD_ERR_RANGE, "%s: %lld bytes exceeds the limit of %zu", path,
                          (long long)sb.st_size, max_len);
    }
    size_t len = (size_t)sb.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        fclose(f);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = len ? fread(buf, 1, len, f) : 0;
    fclose(f);
    if (got != len) {
        free(buf);
        return td_err_set(err, TD_ERR_IO, "%s: short read", path);
    }
    buf[len] = '\0';
    td_status st = td_json_parse(buf, len, max_len, path, out, err);
    free(buf);
    return st;
}

static td_status lookup(const cJSON *obj, const char *key, const char *where, const cJSON **out,
                        td_err *err)
{
    if (!cJSON_IsObject(obj))
        return td_err_set(err, TD_ERR_FORMAT, "%s: expected an object holding \"%s\"", where, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return td_err_set(err, TD_ERR_NOTFOUND, "%s: missing key \"%s\"", where, key);
    *out = v;
    return TD_OK;
}

td_status td_json_as_int(const cJSON *v, const char *where, int64_t *out, td_err *err)
{
    if (!cJSON_IsNumber(v))
        return td_err_set(err, TD_ERR_FORMAT, "%s: expected an integer", where);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d >= (double)TD_JSON_MAX_INT || d <= -(double)TD_JSON_MAX_INT)
        return td_err_set(err, TD_ERR_FORMAT, "%s: %.17g is not an integer within +-(2^53-1)", where, d);
    *out = (int64_t)d;
    return TD_OK;
}

td_status td_json_get_int(const cJSON *obj, const char *key, const char *where, int64_t *out,
                          td_err *err)
{
    const cJSON *v;
    td_status st = lookup(obj, key, where, &v, err);
    if (st) return st;
    char ctx[512];
    snprintf(ctx, sizeof ctx, "%s: \"%s\"", where, key);
    return td_json_as_int(v, ctx, out, err);
}

td_status td_json_get_num(const cJSON *obj, const char *key, const char *where, double *out,
                          td_err *err)
{
    const cJSON *v;
    td_status st = lookup(obj, key, where, &v, err);
    if (st) return st;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a finite number", where, key);
    *out = v->valuedouble;
    return TD_OK;
}

td_status td_json_get_str(const cJSON *obj, const char *key, const char *where,
                          const char **out, td_err *err)
{
    const cJSON *v;
    td_status st = lookup(obj, key, where, &v, err);
    if (st) return st;
    if (!cJSON_IsString(v) || !v->valuestring)
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a string", where, key);
    *out = v->valuestring;
    return TD_OK;
}

td_status td_json_get_bool(const cJSON *obj, const char *key, const char *where, bool *out,
                           td_err *err)
{
    const cJSON *v;
    td_status st = lookup(obj, key, where, &v, err);
    if (st) return st;
    if (!cJSON_IsBool(v))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be true or false", where, key);
    *out = cJSON_IsTrue(v);
    return TD_OK;
}

#define TD_JSON_OPT(name, type)                                                               \
    td_status td_json_opt_##name(const cJSON *obj, const char *key, const char *where,        \
                                 type *out, td_err *err)                                      \
    {                                                                                         \
        if (!cJSON_IsObject(obj)) return TD_OK;                                               \
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);                          \
        if (!v || cJSON_IsNull(v)) return TD_OK;                                              \
        return td_json_get_##name(obj, key, where, out, err);                                 \
    }
TD_JSON_OPT(int, int64_t)
TD_JSON_OPT(num, double)
TD_JSON_OPT(str, const char *)
TD_JSON_OPT(bool, bool)

void td_json_fput_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}
