/* provenance.c — host, process, binary, environment and checkpoint facts (provenance.h). */
#include "provenance.h"
#include "json.h"
#include "sha256.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ==== small file helpers ===================================================================== */

/* First line of a small text file, trailing whitespace removed; "" when unreadable. */
static void read_line(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)cap, f)) out[0] = '\0';
    fclose(f);
    size_t n = strlen(out);
    while (n && isspace((unsigned char)out[n - 1])) out[--n] = '\0';
}

/* ==== host and process ======================================================================= */

static void cpu_model(char *out, size_t cap)
{
    char model[200] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            /* x86: "model name"; some ARM kernels: "Hardware" or "Processor" */
            if (!strncmp(line, "model name", 10) || !strncmp(line, "Hardware", 8) ||
                !strncmp(line, "Processor", 9)) {
                const char *c = strchr(line, ':');
                if (!c) continue;
                c++;
                while (*c == ' ' || *c == '\t') c++;
                snprintf(model, sizeof model, "%s", c);
                size_t n = strlen(model);
                while (n && isspace((unsigned char)model[n - 1])) model[--n] = '\0';
                if (model[0]) break;
            }
        }
        fclose(f);
    }
    if (!model[0]) {
        struct utsname u;
        if (uname(&u) == 0) snprintf(model, sizeof model, "%s", u.machine);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu > 0) snprintf(out, cap, "%s (x%ld)", model[0] ? model : "unknown", ncpu);
    else snprintf(out, cap, "%s", model[0] ? model : "unknown");
}

/* Start time (field 22) of /proc/PID/stat; -1 when absent or a zombie. */
int64_t td_prov_proc_start(int64_t pid)
{
    if (pid <= 0) return -1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    /* field 2 (comm) is parenthesised and may contain spaces or ')': skip to the last ')' */
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    p++;
    /* fields from 3 on: state is field 3, starttime field 22 */
    int field = 2;
    char state = '?';
    while (*p) {
        while (*p == ' ') p++;
        if (!*p) break;
        field++;
        if (field == 3) state = *p;
        if (field == 22) {
            if (state == 'Z' || state == 'X') return -1;
            char *end;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (errno || end == p) return -1;
            return v;
        }
        while (*p && *p != ' ') p++;
    }
    return -1;
}

void td_prov_host_get(td_prov_host *out)
{
    memset(out, 0, sizeof *out);
    if (gethostname(out->host, sizeof out->host - 1) != 0 || !out->host[0])
        snprintf(out->host, sizeof out->host, "unknown");
    read_line("/etc/machine-id", out->machine_id, sizeof out->machine_id);
    read_line("/proc/sys/kernel/random/boot_id", out->boot_id, sizeof out->boot_id);
    cpu_model(out->cpu, sizeof out->cpu);
    out->pid = (int64_t)getpid();
    out->proc_start = td_prov_proc_start(out->pid);
}

/* ==== environment ============================================================================ */

bool td_prov_env_selected(const char *name)
{
    static const char *const prefixes[] = {"TANDEM_", "TD_",     "CUDA_",   "NCCL_",
                                           "OMP_",    "NVIDIA_", "CUBLAS",  "CUDNN_"};
    static const char *const exact[] = {"LD_LIBRARY_PATH", "LD_PRELOAD"};
    for (size_t i = 0; i < TD_ARRAY_LEN(prefixes); i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
    for (size_t i = 0; i < TD_ARRAY_LEN(exact); i++)
        if (!strcmp(name, exact[i])) return true;
    return false;
}

static bool env_secret(const char *name)
{
    static const char *const words[] = {"TOKEN", "SECRET", "PASSWORD", "KEY"};
    for (size_t i = 0; i < TD_ARRAY_LEN(words); i++)
        if (strstr(name, words[i])) return true;
    return false;
}

char *td_prov_utf8_clean(const char *s)
{
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (!c) return NULL;
    memcpy(c, s, n + 1);
    size_t off = 0, bad;
    while (off < n && !td_utf8_valid(c + off, n - off, &bad)) {
        c[off + bad] = '?';
        off += bad + 1;
    }
    return c;
}

extern char **environ;

cJSON *td_prov_env_json(void)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    /* collect the selected names, sorted so the JSON is stable */
    size_t n = 0;
    for (char **e = environ; e && *e; e++) n++;
    const char **sel = calloc(n ? n : 1, sizeof *sel);
    if (!sel) { cJSON_Delete(o); return NULL; }
    size_t k = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || eq == *e) continue;
        char name[256];
        size_t len = (size_t)(eq - *e);
        if (len >= sizeof name) continue;
        memcpy(name, *e, len);
        name[len] = '\0';
        if (td_prov_env_selected(name)) sel[k++] = *e;
    }
    for (size_t i = 1; i < k; i++) /* insertion sort by name (few entries) */
        for (size_t j = i; j > 0 && strcmp(sel[j - 1], sel[j]) > 0; j--) {
            const char *t = sel[j];
            sel[j] = sel[j - 1];
            sel[j - 1] = t;
        }
    for (size_t i = 0; i < k; i++) {
        const char *eq = strchr(sel[i], '=');
        char name[256];
        size_t len = (size_t)(eq - sel[i]);
        memcpy(name, sel[i], len);
        name[len] = '\0';
        char *cn = td_prov_utf8_clean(name);
        char *cv = td_prov_utf8_clean(env_secret(name) ? "<redacted>" : eq + 1);
        if (cn && cv && !cJSON_GetObjectItemCaseSensitive(o, cn)) cJSON_AddStringToObject(o, cn, cv);
        free(cn);
        free(cv);
    }
    free(sel);
    return o;
}

/* ==== time =================================================================================== */

void td_prov_time_iso(int64_t sec, int ms, char out[TD_PROV_TIME_LEN + 1])
{
    time_t t = (time_t)sec;
    struct tm tm;
    gmtime_r(&t, &tm);
    char buf[96]; /* wide enough for any int fields, so the compiler can see no truncation */
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms % 1000);
    size_t n = strnlen(buf, TD_PROV_TIME_LEN);
    memcpy(out, buf, n);
    out[n] = '\0';
}

void td_prov_now_iso(char out[TD_PROV_TIME_LEN + 1])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    td_prov_time_iso((int64_t)ts.tv_sec, (int)(ts.tv_nsec / 1000000), out);
}

/* ==== uid ==================================================================================== */

static bool random_bytes(uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got == n) return true;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f) return false;
    bool ok = fread(b, 1, n, f) == n;
    fclose(f);
    return ok;
}

td_status td_prov_uid(char out[37], td_err *err)
{
    (void)err;
    uint8_t b[16];
    if (!random_bytes(b, sizeof b)) {
        /* no randomness source: hash what makes this call unique on this host */
        struct {
            char host[256];
            long pid;
            struct timespec rt, mt;
            const void *stack;
        } seed;
        memset(&seed, 0, sizeof seed);
        gethostname(seed.host, sizeof seed.host - 1);
        seed.pid = (long)getpid();
        clock_gettime(CLOCK_REALTIME, &seed.rt);
        clock_gettime(CLOCK_MONOTONIC, &seed.mt);
        seed.stack = &seed;
        uint8_t d[32];
        td_sha256(&seed, sizeof seed, d);
        memcpy(b, d, sizeof b);
    }
    b[6] = (uint8_t)((b[6] & 0x0F) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3F) | 0x80); /* RFC 4122 variant */
    static const char hexd[] = "0123456789abcdef";
    size_t o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        out[o++] = hexd[b[i] >> 4];
        out[o++] = hexd[b[i] & 15];
    }
    out[o] = '\0';
    return TD_OK;
}

/* ==== binary and checkpoint hashes =========================================================== */

td_status td_prov_self_sha256(char hex[65], td_err *err)
{
    return td_sha256_file("/proc/self/exe", hex, err);
}

/* Feed "name size\n" and then the file's bytes. */
static td_status hash_file_bytes(td_sha256_ctx *ctx, const char *dir, const char *name, bool required,
                                 td_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return td_err_set(err, TD_ERR_ARG, "%s: path too long", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT && !required) return TD_OK;
        return td_err_set(err, errno == ENOENT ? TD_ERR_NOTFOUND : TD_ERR_IO, "%s: %s", path,
                          strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return td_err_set(err, TD_ERR_IO, "%s: not a regular file", path);
    }
    char head[512];
    int hl = snprintf(head, sizeof head, "%s %lld\n", name, (long long)sb.st_size);
    td_sha256_update(ctx, head, (size_t)hl);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) td_sha256_update(ctx, buf, n);
    bool bad = ferror(f);
    fclose(f);
    if (bad) return td_err_set(err, TD_ERR_IO, "%s: read error", path);
    return TD_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

td_status td_prov_checkpoint_fingerprint(const char *dir, bool full, char hex[65], td_err *err)
{
    hex[0] = '\0';
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return td_err_set(err, TD_ERR_NOTFOUND, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return td_err_set(err, TD_ERR_ARG, "%s: a checkpoint is a directory", dir);

    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    const char *tag = full ? "tandem-checkpoint-full-v1\n" : "tandem-checkpoint-v1\n";
    td_sha256_update(&ctx, tag, strlen(tag));
    td_status s = hash_file_bytes(&ctx, dir, "config.json", true, err);
    if (s == TD_OK) s = hash_file_bytes(&ctx, dir, "hf_quant_config.json", false, err);
    if (s == TD_OK) s = hash_file_bytes(&ctx, dir, "model.safetensors.index.json", false, err);
    if (s != TD_OK) return s;

    DIR *d = opendir(dir);
    if (!d) return td_err_set(err, TD_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) { s = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir); break; }
            names = nn;
        }
        names[n] = strdup(e->d_name);
        if (!names[n]) { s = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir); break; }
        n++;
    }
    closedir(d);
    if (s == TD_OK) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && s == TD_OK; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path) {
            s = td_err_set(err, TD_ERR_ARG, "%s: path too long", dir);
            break;
        }
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            s = td_err_set(err, TD_ERR_IO, "%s: not a readable regular file", path);
            break;
        }
        char line[600];
        int ll;
        if (full) {
            char fh[65];
            s = td_sha256_file(path, fh, err);
            if (s != TD_OK) break;
            ll = snprintf(line, sizeof line, "%s %lld %s\n", names[i], (long long)sb.st_size, fh);
        } else {
            ll = snprintf(line, sizeof line, "%s %lld\n", names[i], (long long)sb.st_size);
        }
        td_sha256_update(&ctx, line, (size_t)(ll < (int)sizeof line ? ll : (int)sizeof line - 1));
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (s != TD_OK) return s;
    uint8_t dg[32];
    td_sha256_final(&ctx, dg);
    td_sha256_hex(dg, hex);
    return TD_OK;
}
