/* safetensors.c — memory-mapped safetensors reader, sharded checkpoints and a streaming
 * writer (see safetensors.h and docs/safetensors.md). */
#include "safetensors.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest integer the reader accepts in shape/data_offsets (JSON numbers are exact below it). */
#define ST_MAX_INT ((uint64_t)1 << 53)
/* Tensor names are quoted in messages with at most this many bytes. */
#define NM "\"%.300s\""

static const char st_single_name[] = "model.safetensors";
static const char st_index_name[] = "model.safetensors.index.json";
static const char st_suffix[] = ".safetensors";

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static const char *st_json_kind(const cJSON *v)
{
    if (!v) return "nothing";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

static char *st_join(const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    bool slash = dl > 0 && dir[dl - 1] != '/';
    char *p = malloc(dl + (slash ? 1 : 0) + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl++] = '/';
    memcpy(p + dl, name, nl + 1);
    return p;
}

static uint64_t st_load_u64le(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* Lexical facts about JSON text that cJSON does not keep: whether each number was written as a
 * plain non-negative integer literal (cJSON stores only a double, so 2.0, 2e0 and -0 would
 * otherwise pass as integers), and whether a string contains the escape \u0000 (cJSON would
 * silently cut the string there). Runs on text that td_json_parse already accepted, so number
 * tokens correspond one to one, in document order, to cJSON number nodes. */
typedef struct st_lex {
    size_t n_numbers;    /* number tokens outside strings */
    size_t bad_number;   /* ordinal of the first non-plain number, SIZE_MAX when none */
    size_t bad_off, bad_len;
    size_t nul_off;      /* offset of the first \u0000 escape, SIZE_MAX when none */
} st_lex;

static bool st_is_numchar(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static void st_lex_scan(const char *s, size_t len, st_lex *lx)
{
    lx->n_numbers = 0;
    lx->bad_number = SIZE_MAX;
    lx->bad_off = lx->bad_len = 0;
    lx->nul_off = SIZE_MAX;
    size_t i = 0;
    while (i < len) {
        char c = s[i];
        if (c == '"') {
            i++;
            while (i < len && s[i] != '"') {
                if (s[i] == '\\') {
                    if (lx->nul_off == SIZE_MAX && i + 5 < len && s[i + 1] == 'u' &&
                        memcmp(s + i + 2, "0000", 4) == 0)
                        lx->nul_off = i;
                    i += 2;
                } else {
                    i++;
                }
            }
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = i;
            bool plain = true;
            while (i < len && st_is_numchar(s[i])) {
                if (s[i] < '0' || s[i] > '9') plain = false;
                i++;
            }
            if (i - start > 1 && s[start] == '0') plain = false;
            if (!plain && lx->bad_number == SIZE_MAX) {
                lx->bad_number = lx->n_numbers;
                lx->bad_off = start;
                lx->bad_len = i - start;
            }
            lx->n_numbers++;
        } else {
            i++;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* header parsing                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct st_ctx {
    const char *what;       /* file name for messages */
    const char *text;       /* header JSON text (for quoting bad literals) */
    const st_lex *lx;
    size_t num_seen;        /* number nodes visited so far, in document order */
} st_ctx;

/* A non-negative integer element of "shape" or "data_offsets". */
static td_status st_uint(st_ctx *c, const cJSON *v, const char *tname, const char *field,
                         uint64_t *out, td_err *err)
{
    if (!cJSON_IsNumber(v))
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor " NM ": \"%s\" must hold non-negative integers, found %s",
                          c->what, tname, field, st_json_kind(v));
    size_t k = c->num_seen++;
    if (k >= c->lx->bad_number) {
        int n = c->lx->bad_len > 40 ? 40 : (int)c->lx->bad_len;
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor " NM ": \"%s\" value %.*s is not a non-negative integer",
                          c->what, tname, field, n, c->text + c->lx->bad_off);
    }
    double d = v->valuedouble;
    if (!(d >= 0.0) || d != floor(d)) /* unreachable after the lexical check; kept as a guard */
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor " NM ": \"%s\" value %g is not a non-negative integer",
                          c->what, tname, field, d);
    if (d >= (double)ST_MAX_INT)
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: tensor " NM ": \"%s\" value %.0f exceeds 2^53 - 1", c->what,
                          tname, field, d);
    *out = (uint64_t)d;
    return TD_OK;
}

static td_status st_parse_entry(st_ctx *c, const cJSON *e, uint64_t data_len, td_st_info *out,
                                td_err *err)
{
    const char *tname = e->string;
    if (!cJSON_IsObject(e))
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor " NM ": entry must be an object with \"dtype\", \"shape\" "
                          "and \"data_offsets\", found %s", c->what, tname, st_json_kind(e));
    const cJSON *jd = NULL, *js = NULL, *jo = NULL;
    uint64_t off[2] = {0, 0};
    for (const cJSON *k = e->child; k; k = k->next) {
        if (strcmp(k->string, "dtype") == 0) {
            jd = k;
            if (!cJSON_IsString(k))
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM ": \"dtype\" must be a string, found %s",
                                  c->what, tname, st_json_kind(k));
            out->dtype = td_dtype_from_name(k->valuestring);
            if (out->dtype == TD_DTYPE_INVALID)
                return td_err_set(err, TD_ERR_FORMAT, "%s: tensor " NM ": unknown dtype \"%.40s\"",
                                  c->what, tname, k->valuestring);
        } else if (strcmp(k->string, "shape") == 0) {
            js = k;
            if (!cJSON_IsArray(k))
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM ": \"shape\" must be an array, found %s",
                                  c->what, tname, st_json_kind(k));
            int nd = 0;
            for (const cJSON *d = k->child; d; d = d->next) {
                if (nd == TD_MAX_DIMS) {
                    int total = nd;
                    for (const cJSON *x = d; x; x = x->next) total++;
                    return td_err_set(err, TD_ERR_RANGE,
                                      "%s: tensor " NM ": rank %d exceeds the maximum of %d",
                                      c->what, tname, total, TD_MAX_DIMS);
                }
                uint64_t v;
                td_status st = st_uint(c, d, tname, "shape", &v, err);
                if (st) return st;
                out->shape[nd++] = (int64_t)v;
            }
            out->ndim = nd;
        } else if (strcmp(k->string, "data_offsets") == 0) {
            jo = k;
            if (!cJSON_IsArray(k))
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM ": \"data_offsets\" must be an array [begin, "
                                  "end], found %s", c->what, tname, st_json_kind(k));
            int n = 0;
            for (const cJSON *d = k->child; d; d = d->next) {
                if (n == 2)
                    return td_err_set(err, TD_ERR_FORMAT,
                                      "%s: tensor " NM ": \"data_offsets\" must have exactly 2 "
                                      "elements", c->what, tname);
                td_status st = st_uint(c, d, tname, "data_offsets", &off[n++], err);
                if (st) return st;
            }
            if (n != 2)
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM ": \"data_offsets\" must have exactly 2 "
                                  "elements, found %d", c->what, tname, n);
        } else {
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: tensor " NM ": unknown key \"%.60s\" (allowed: dtype, shape, "
                              "data_offsets)", c->what, tname, k->string);
        }
    }
    const char *missing = !jd ? "dtype" : !js ? "shape" : !jo ? "data_offsets" : NULL;
    if (missing)
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor " NM ": missing \"%s\"", c->what,
                          tname, missing);
    out->begin = off[0];
    out->end = off[1];
    if (off[0] > off[1])
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: tensor " NM ": data_offsets begin %llu > end %llu", c->what,
                          tname, (unsigned long long)off[0], (unsigned long long)off[1]);
    char shp[160];
    td_shape_str(out->ndim, out->shape, shp, sizeof shp);
    int64_t numel = 0, nbytes = 0;
    td_err sub;
    if (td_shape_numel(out->ndim, out->shape, &numel, &sub) != TD_OK)
        return td_err_set(err, TD_ERR_RANGE, "%s: tensor " NM ": shape %s: %s", c->what, tname,
                          shp, sub.msg);
    td_status st = td_dtype_nbytes(out->dtype, numel, &nbytes, &sub);
    if (st != TD_OK)
        return td_err_set(err, st == TD_ERR_FORMAT ? TD_ERR_FORMAT : TD_ERR_RANGE,
                          "%s: tensor " NM ": shape %s: %s", c->what, tname, shp, sub.msg);
    if ((uint64_t)nbytes != off[1] - off[0])
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor " NM ": data_offsets [%llu, %llu] span %llu bytes but %s "
                          "%s needs %lld", c->what, tname, (unsigned long long)off[0],
                          (unsigned long long)off[1], (unsigned long long)(off[1] - off[0]),
                          td_dtype_name(out->dtype), shp, (long long)nbytes);
    if (off[1] > data_len)
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: tensor " NM ": data_offsets [%llu, %llu] run past the end of the "
                          "%llu-byte data buffer", c->what, tname, (unsigned long long)off[0],
                          (unsigned long long)off[1], (unsigned long long)data_len);
    return TD_OK;
}

static td_status st_parse_meta(st_ctx *c, const cJSON *m, td_st_header *h, td_err *err)
{
    if (!cJSON_IsObject(m))
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: \"__metadata__\" must be an object of strings, found %s", c->what,
                          st_json_kind(m));
    size_t n = 0;
    for (const cJSON *k = m->child; k; k = k->next) {
        if (!cJSON_IsString(k))
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: \"__metadata__\" value of \"%.200s\" must be a string, found %s",
                              c->what, k->string, st_json_kind(k));
        n++;
    }
    if (n == 0) return TD_OK;
    h->meta_keys = calloc(n, sizeof *h->meta_keys);
    h->meta_vals = calloc(n, sizeof *h->meta_vals);
    if (!h->meta_keys || !h->meta_vals)
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", c->what);
    for (const cJSON *k = m->child; k; k = k->next) {
        h->meta_keys[h->n_meta] = strdup(k->string);
        h->meta_vals[h->n_meta] = strdup(k->valuestring);
        h->n_meta++;
        if (!h->meta_keys[h->n_meta - 1] || !h->meta_vals[h->n_meta - 1])
            return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", c->what);
    }
    /* sort keys (with their values) so lookups are binary searches */
    for (size_t i = 1; i < h->n_meta; i++) {
        char *k = h->meta_keys[i], *v = h->meta_vals[i];
        size_t j = i;
        for (; j > 0 && strcmp(h->meta_keys[j - 1], k) > 0; j--) {
            h->meta_keys[j] = h->meta_keys[j - 1];
            h->meta_vals[j] = h->meta_vals[j - 1];
        }
        h->meta_keys[j] = k;
        h->meta_vals[j] = v;
    }
    return TD_OK;
}

static int st_cmp_info_name(const void *a, const void *b)
{
    return strcmp(((const td_st_info *)a)->name, ((const td_st_info *)b)->name);
}

static int st_cmp_info_range(const void *a, const void *b)
{
    const td_st_info *x = *(const td_st_info *const *)a, *y = *(const td_st_info *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Sorted by (begin, end), the ranges must tile [0, data_len). */
static td_status st_check_layout(const td_st_header *h, const char *what, td_err *err)
{
    if (h->n == 0) {
        if (h->data_len != 0)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: data buffer holds %llu bytes but the header lists no tensors "
                              "(trailing bytes)", what, (unsigned long long)h->data_len);
        return TD_OK;
    }
    const td_st_info **by = malloc(h->n * sizeof *by);
    if (!by) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
    for (size_t i = 0; i < h->n; i++) by[i] = &h->tensors[i];
    qsort(by, h->n, sizeof *by, st_cmp_info_range);
    td_status st = TD_OK;
    uint64_t pos = 0;
    const td_st_info *prev = NULL;
    for (size_t i = 0; i < h->n && st == TD_OK; i++) {
        const td_st_info *t = by[i];
        if (t->begin > pos)
            st = td_err_set(err, TD_ERR_FORMAT,
                            "%s: bytes [%llu, %llu) of the data buffer belong to no tensor (hole "
                            "before tensor " NM ")", what, (unsigned long long)pos,
                            (unsigned long long)t->begin, t->name);
        else if (t->begin < pos)
            st = td_err_set(err, TD_ERR_FORMAT,
                            "%s: tensor " NM " bytes [%llu, %llu) overlap tensor " NM
                            " bytes [%llu, %llu)", what, t->name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, prev->name,
                            (unsigned long long)prev->begin, (unsigned long long)prev->end);
        pos = t->end;
        prev = t;
    }
    if (st == TD_OK && pos != h->data_len)
        st = td_err_set(err, TD_ERR_FORMAT,
                        "%s: data buffer holds %llu bytes but the tensors end at %llu (trailing "
                        "bytes after tensor " NM ")", what, (unsigned long long)h->data_len,
                        (unsigned long long)pos, prev->name);
    free(by);
    return st;
}

void td_st_header_free(td_st_header *h)
{
    if (!h) return;
    for (size_t i = 0; i < h->n; i++) free(h->tensors[i].name);
    free(h->tensors);
    for (size_t i = 0; i < h->n_meta; i++) {
        free(h->meta_keys[i]);
        free(h->meta_vals[i]);
    }
    /* meta arrays may be allocated with fewer filled entries after an allocation failure */
    free(h->meta_keys);
    free(h->meta_vals);
    memset(h, 0, sizeof *h);
}

static td_status st_parse_json_header(const char *text, size_t n_hdr, uint64_t data_len,
                                      const char *what, td_st_header *h, td_err *err)
{
    char *jwhat = malloc(strlen(what) + 16);
    if (!jwhat) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
    sprintf(jwhat, "%s: header", what);
    cJSON *root = NULL;
    td_status st = td_json_parse(text, n_hdr, (size_t)TD_ST_MAX_HEADER, jwhat, &root, err);
    free(jwhat);
    if (st) return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return td_err_set(err, TD_ERR_FORMAT, "%s: header must be a JSON object", what);
    }
    st_lex lx;
    st_lex_scan(text, n_hdr, &lx);
    if (lx.nul_off != SIZE_MAX) {
        cJSON_Delete(root);
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: header string contains the escape \\u0000 (NUL) at header offset "
                          "%zu", what, lx.nul_off);
    }
    st_ctx c = {what, text, &lx, 0};
    h->header_len = n_hdr;
    h->data_len = data_len;
    size_t n = 0;
    for (const cJSON *k = root->child; k; k = k->next)
        if (strcmp(k->string, "__metadata__") != 0) n++;
    if (n) {
        h->tensors = calloc(n, sizeof *h->tensors);
        if (!h->tensors) st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
    }
    for (const cJSON *k = root->child; k && st == TD_OK; k = k->next) {
        if (strcmp(k->string, "__metadata__") == 0) {
            st = st_parse_meta(&c, k, h, err);
            continue;
        }
        td_st_info *t = &h->tensors[h->n];
        st = st_parse_entry(&c, k, data_len, t, err);
        if (st) break;
        t->name = strdup(k->string);
        if (!t->name) {
            st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
            break;
        }
        h->n++;
    }
    if (st == TD_OK) {
        /* Every number of a valid header sits in a shape or data_offsets array. */
        TD_ASSERT(c.num_seen == lx.n_numbers);
        if (h->n > 1) qsort(h->tensors, h->n, sizeof *h->tensors, st_cmp_info_name);
        st = st_check_layout(h, what, err);
    }
    cJSON_Delete(root);
    return st;
}

td_status td_st_parse_header(const uint8_t *buf, size_t len, const char *what,
                             td_st_header *out, td_err *err)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    if (!what) what = "safetensors";
    if (len == 0) return td_err_set(err, TD_ERR_FORMAT, "%s: file is empty (0 bytes)", what);
    if (len < 8)
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: file is %zu bytes, too short for the 8-byte header length", what,
                          len);
    uint64_t n_hdr = st_load_u64le(buf);
    if (n_hdr < 2)
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: header length %llu is too small (a header is at least \"{}\")",
                          what, (unsigned long long)n_hdr);
    if (n_hdr > TD_ST_MAX_HEADER)
        return td_err_set(err, TD_ERR_RANGE, "%s: header length %llu exceeds the limit of %llu",
                          what, (unsigned long long)n_hdr, (unsigned long long)TD_ST_MAX_HEADER);
    if (n_hdr > len - 8)
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: header length %llu runs past the end of the file (%zu bytes "
                          "follow the length)", what, (unsigned long long)n_hdr, len - 8);
    const char *text = (const char *)buf + 8;
    if (text[0] != '{')
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: header does not start with '{' (byte 0x%02x)", what,
                          (unsigned)(uint8_t)text[0]);
    uint64_t data_len = (uint64_t)len - 8 - n_hdr;
    td_st_header h;
    memset(&h, 0, sizeof h);
    td_status st = st_parse_json_header(text, (size_t)n_hdr, data_len, what, &h, err);
    if (st) {
        td_st_header_free(&h);
        return st;
    }
    *out = h;
    return TD_OK;
}

const td_st_info *td_st_header_find(const td_st_header *h, const char *name)
{
    if (!h || !name) return NULL;
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->tensors[mid].name, name);
        if (c == 0) return &h->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *td_st_header_meta(const td_st_header *h, const char *key)
{
    if (!h || !key) return NULL;
    size_t lo = 0, hi = h->n_meta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->meta_keys[mid], key);
        if (c == 0) return h->meta_vals[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* single mapped file                                                                         */
/* ------------------------------------------------------------------------------------------ */

struct td_st_file {
    char *path;
    uint8_t *map;      /* NULL for an empty mapping */
    size_t size;
    td_st_header hdr;
};

td_status td_st_file_open(const char *path, td_st_file **out, td_err *err)
{
    TD_ASSERT(path && out);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return td_err_set(err, errno == ENOENT ? TD_ERR_NOTFOUND : TD_ERR_IO,
                          "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return td_err_set(err, TD_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return td_err_set(err, TD_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return td_err_set(err, TD_ERR_RANGE, "%s: file too large to map", path);
    }
    td_st_file *f = calloc(1, sizeof *f);
    if (f) f->path = strdup(path);
    if (!f || !f->path) {
        close(fd);
        free(f);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            td_st_file_close(f);
            return td_err_set(err, TD_ERR_IO, "%s: mmap of %zu bytes failed: %s", path,
                              (size_t)sb.st_size, strerror(e));
        }
        f->map = m;
    }
    close(fd);
    static const uint8_t empty[1] = {0};
    td_status st = td_st_parse_header(f->map ? f->map : empty, f->size, path, &f->hdr, err);
    if (st) {
        td_st_file_close(f);
        return st;
    }
    *out = f;
    return TD_OK;
}

void td_st_file_close(td_st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    td_st_header_free(&f->hdr);
    free(f->path);
    free(f);
}

const td_st_header *td_st_file_header(const td_st_file *f) { return &f->hdr; }
const char *td_st_file_path(const td_st_file *f) { return f->path; }
uint64_t td_st_file_size(const td_st_file *f) { return f->size; }

static void st_file_view(const td_st_file *f, const td_st_info *t, td_tensor *view)
{
    void *data = NULL;
    if (t->end > t->begin)
        data = (void *)(f->map + 8 + f->hdr.header_len + t->begin);
    td_tensor_init(view, t->dtype, t->ndim, t->shape, data, f);
}

td_status td_st_file_tensor(const td_st_file *f, const char *name, td_tensor *view, td_err *err)
{
    TD_ASSERT(f && name && view);
    const td_st_info *t = td_st_header_find(&f->hdr, name);
    if (!t)
        return td_err_set(err, TD_ERR_NOTFOUND, "%s: no tensor " NM, f->path, name);
    st_file_view(f, t, view);
    return TD_OK;
}

void td_st_file_tensor_at(const td_st_file *f, size_t i, td_tensor *view)
{
    TD_ASSERT(f && view && i < f->hdr.n);
    st_file_view(f, &f->hdr.tensors[i], view);
}

/* ------------------------------------------------------------------------------------------ */
/* index                                                                                      */
/* ------------------------------------------------------------------------------------------ */

void td_st_index_free(td_st_index *idx)
{
    if (!idx) return;
    if (idx->names)
        for (size_t i = 0; i < idx->n; i++) free(idx->names[i]);
    free(idx->names);
    free(idx->shards); /* entries alias shard_files */
    if (idx->shard_files)
        for (size_t i = 0; i < idx->n_shards; i++) free(idx->shard_files[i]);
    free(idx->shard_files);
    memset(idx, 0, sizeof *idx);
}

/* Why a shard file name is not acceptable, or NULL. */
static const char *st_bad_shard_name(const char *s)
{
    size_t n = strlen(s), sl = sizeof st_suffix - 1;
    if (n == 0) return "is empty";
    if (strchr(s, '/') || strchr(s, '\\')) return "contains a path separator";
    if (strstr(s, "..")) return "contains \"..\"";
    if (n <= sl || strcmp(s + n - sl, st_suffix) != 0)
        return "does not end in \".safetensors\" after a non-empty stem";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) return "contains a control character";
    return NULL;
}

typedef struct st_pair {
    const char *name, *shard;
} st_pair;

static int st_cmp_pair(const void *a, const void *b)
{
    return strcmp(((const st_pair *)a)->name, ((const st_pair *)b)->name);
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static td_status st_index_build(const cJSON *wm, const char *what, td_st_index *idx, td_err *err)
{
    size_t n = 0;
    for (const cJSON *k = wm->child; k; k = k->next) {
        if (!cJSON_IsString(k))
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: weight_map: tensor " NM " must map to a shard file name "
                              "(string), found %s", what, k->string, st_json_kind(k));
        const char *why = st_bad_shard_name(k->valuestring);
        if (why)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: weight_map: tensor " NM ": shard name \"%.200s\" %s (shards "
                              "must be plain file names in the checkpoint directory)", what,
                              k->string, k->valuestring, why);
        n++;
    }
    if (n == 0) return td_err_set(err, TD_ERR_FORMAT, "%s: weight_map is empty", what);
    st_pair *pairs = malloc(n * sizeof *pairs);
    const char **sh = malloc(n * sizeof *sh);
    idx->names = calloc(n, sizeof *idx->names);
    idx->shards = calloc(n, sizeof *idx->shards);
    idx->shard_files = calloc(n, sizeof *idx->shard_files);
    td_status st = TD_OK;
    if (!pairs || !sh || !idx->names || !idx->shards || !idx->shard_files) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
        goto done;
    }
    size_t i = 0;
    for (const cJSON *k = wm->child; k; k = k->next, i++) {
        pairs[i].name = k->string;
        pairs[i].shard = k->valuestring;
        sh[i] = k->valuestring;
    }
    qsort(pairs, n, sizeof *pairs, st_cmp_pair);
    qsort(sh, n, sizeof *sh, st_cmp_str);
    for (i = 0; i < n; i++) {
        if (i > 0 && strcmp(sh[i], sh[i - 1]) == 0) continue;
        idx->shard_files[idx->n_shards] = strdup(sh[i]);
        if (!idx->shard_files[idx->n_shards]) {
            st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        idx->n_shards++;
    }
    for (i = 0; i < n; i++) {
        idx->names[i] = strdup(pairs[i].name);
        if (!idx->names[i]) {
            st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
            goto done;
        }
        idx->n = i + 1;
        char **hit = bsearch(&pairs[i].shard, idx->shard_files, idx->n_shards,
                             sizeof *idx->shard_files, st_cmp_str);
        TD_ASSERT(hit);
        idx->shards[i] = *hit;
    }
done:
    free(pairs);
    free(sh);
    return st;
}

td_status td_st_index_parse(const char *buf, size_t len, const char *what, td_st_index *out,
                            td_err *err)
{
    TD_ASSERT(out);
    memset(out, 0, sizeof *out);
    if (!what) what = st_index_name;
    cJSON *root = NULL;
    td_status st = td_json_parse(buf, len, TD_ST_INDEX_MAX_BYTES, what, &root, err);
    if (st) return st;
    if (!cJSON_IsObject(root)) {
        st = td_err_set(err, TD_ERR_FORMAT, "%s: index must be a JSON object, found %s", what,
                        st_json_kind(root));
        goto done;
    }
    st_lex lx;
    st_lex_scan(buf, len, &lx);
    if (lx.nul_off != SIZE_MAX) {
        st = td_err_set(err, TD_ERR_FORMAT,
                        "%s: string contains the escape \\u0000 (NUL) at offset %zu", what,
                        lx.nul_off);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!wm) {
        st = td_err_set(err, TD_ERR_FORMAT, "%s: missing \"weight_map\"", what);
        goto done;
    }
    if (!cJSON_IsObject(wm)) {
        st = td_err_set(err, TD_ERR_FORMAT,
                        "%s: \"weight_map\" must be an object (tensor name -> shard file), found "
                        "%s", what, st_json_kind(wm));
        goto done;
    }
    st = st_index_build(wm, what, out, err);
    if (st) td_st_index_free(out);
done:
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* sharded checkpoint namespace                                                               */
/* ------------------------------------------------------------------------------------------ */

struct td_st_set {
    char *dir;
    char *index_path;       /* NULL for a single-file checkpoint */
    td_st_index idx;        /* sharded only */
    size_t *name_shard;     /* [idx.n] shard number of each name (sharded only) */
    td_st_file **files;     /* [n_shards], opened lazily (single file: opened at once) */
    size_t n_shards;
};

static td_status st_read_small_file(const char *path, size_t max_len, char **buf, size_t *len,
                                    td_err *err)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return td_err_set(err, errno == ENOENT ? TD_ERR_NOTFOUND : TD_ERR_IO,
                          "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return td_err_set(err, TD_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > max_len) {
        close(fd);
        return td_err_set(err, TD_ERR_RANGE, "%s: %llu bytes exceeds the limit of %zu", path,
                          (unsigned long long)sb.st_size, max_len);
    }
    size_t n = (size_t)sb.st_size;
    char *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(b);
            return td_err_set(err, TD_ERR_IO, "%s: read failed: %s", path,
                              e ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    b[n] = '\0';
    *buf = b;
    *len = n;
    return TD_OK;
}

static bool st_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

td_status td_st_set_open(const char *dir, td_st_set **out, td_err *err)
{
    TD_ASSERT(dir && out);
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return td_err_set(err, errno == ENOENT ? TD_ERR_NOTFOUND : TD_ERR_IO,
                          "%s: cannot open checkpoint directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return td_err_set(err, TD_ERR_ARG, "%s: not a directory", dir);
    td_st_set *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(dir))) {
        free(s);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
    }
    td_status st = TD_OK;
    char *single = st_join(dir, st_single_name);
    char *index = st_join(dir, st_index_name);
    char *buf = NULL;
    size_t len = 0;
    if (!single || !index) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    /* Same precedence as the HF loaders: a single model.safetensors wins over an index. */
    if (st_is_file(single)) {
        s->n_shards = 1;
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) {
            st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        st = td_st_file_open(single, &s->files[0], err);
        goto done;
    }
    if (!st_is_file(index)) {
        st = td_err_set(err, TD_ERR_NOTFOUND, "%s: no %s or %s in the checkpoint directory", dir,
                        st_single_name, st_index_name);
        goto done;
    }
    st = st_read_small_file(index, TD_ST_INDEX_MAX_BYTES, &buf, &len, err);
    if (st) goto done;
    st = td_st_index_parse(buf, len, index, &s->idx, err);
    if (st) goto done;
    s->index_path = index;
    index = NULL;
    s->n_shards = s->idx.n_shards;
    s->files = calloc(s->n_shards, sizeof *s->files);
    s->name_shard = calloc(s->idx.n, sizeof *s->name_shard);
    if (!s->files || !s->name_shard) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    for (size_t i = 0; i < s->idx.n; i++) {
        char **hit = bsearch(&s->idx.shards[i], s->idx.shard_files, s->idx.n_shards,
                             sizeof *s->idx.shard_files, st_cmp_str);
        TD_ASSERT(hit);
        s->name_shard[i] = (size_t)(hit - s->idx.shard_files);
    }
done:
    free(single);
    free(index);
    free(buf);
    if (st) {
        td_st_set_close(s);
        return st;
    }
    *out = s;
    return TD_OK;
}

void td_st_set_close(td_st_set *s)
{
    if (!s) return;
    if (s->files)
        for (size_t i = 0; i < s->n_shards; i++) td_st_file_close(s->files[i]);
    free(s->files);
    free(s->name_shard);
    td_st_index_free(&s->idx);
    free(s->index_path);
    free(s->dir);
    free(s);
}

size_t td_st_set_count(const td_st_set *s)
{
    return s->index_path ? s->idx.n : s->files[0]->hdr.n;
}

const char *td_st_set_name(const td_st_set *s, size_t i)
{
    TD_ASSERT(i < td_st_set_count(s));
    return s->index_path ? s->idx.names[i] : s->files[0]->hdr.tensors[i].name;
}

/* Position of name in the sorted index, or SIZE_MAX. */
static size_t st_index_find(const td_st_index *idx, const char *name)
{
    size_t lo = 0, hi = idx->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(idx->names[mid], name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return SIZE_MAX;
}

bool td_st_set_has(const td_st_set *s, const char *name)
{
    if (!name) return false;
    if (s->index_path) return st_index_find(&s->idx, name) != SIZE_MAX;
    return td_st_header_find(&s->files[0]->hdr, name) != NULL;
}

size_t td_st_set_shard_count(const td_st_set *s) { return s->n_shards; }

const char *td_st_set_shard_name(const td_st_set *s, size_t i)
{
    TD_ASSERT(i < s->n_shards);
    return s->index_path ? s->idx.shard_files[i] : st_single_name;
}

static const char *st_shard_name(const td_st_set *s, size_t i)
{
    return td_st_set_shard_name(s, i);
}

/* Open shard i on first use. */
static td_status st_set_shard(td_st_set *s, size_t i, td_st_file **out, td_err *err)
{
    if (!s->files[i]) {
        char *p = st_join(s->dir, st_shard_name(s, i));
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", s->dir);
        td_status st = td_st_file_open(p, &s->files[i], err);
        free(p);
        if (st == TD_ERR_NOTFOUND)
            return td_err_set(err, TD_ERR_NOTFOUND,
                              "%s: shard \"%s\" named by the index is missing from directory %s",
                              s->index_path, st_shard_name(s, i), s->dir);
        if (st) return st;
    }
    *out = s->files[i];
    return TD_OK;
}

static td_status st_set_lookup(td_st_set *s, const char *name, td_st_file **file,
                               const td_st_info **info, size_t *shard, td_err *err)
{
    TD_ASSERT(s && name);
    size_t si = 0;
    if (s->index_path) {
        size_t k = st_index_find(&s->idx, name);
        if (k == SIZE_MAX)
            return td_err_set(err, TD_ERR_NOTFOUND, "%s: no tensor " NM " in the checkpoint index",
                              s->index_path, name);
        si = s->name_shard[k];
    }
    td_st_file *f;
    td_status st = st_set_shard(s, si, &f, err);
    if (st) return st;
    const td_st_info *t = td_st_header_find(&f->hdr, name);
    if (!t) {
        if (s->index_path)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: index says tensor " NM " is in shard %s but %s does not "
                              "contain it", s->index_path, name, st_shard_name(s, si),
                              st_shard_name(s, si));
        return td_err_set(err, TD_ERR_NOTFOUND, "%s: no tensor " NM, f->path, name);
    }
    *file = f;
    *info = t;
    *shard = si;
    return TD_OK;
}

td_status td_st_set_info(td_st_set *s, const char *name, const td_st_info **info,
                         const char **shard, td_err *err)
{
    td_st_file *f;
    const td_st_info *t;
    size_t si;
    td_status st = st_set_lookup(s, name, &f, &t, &si, err);
    if (st) return st;
    if (info) *info = t;
    if (shard) *shard = st_shard_name(s, si);
    return TD_OK;
}

td_status td_st_set_tensor(td_st_set *s, const char *name, td_tensor *view, td_err *err)
{
    TD_ASSERT(view);
    td_st_file *f;
    const td_st_info *t;
    size_t si;
    td_status st = st_set_lookup(s, name, &f, &t, &si, err);
    if (st) return st;
    st_file_view(f, t, view);
    return TD_OK;
}

td_status td_st_set_validate(td_st_set *s, td_err *err)
{
    TD_ASSERT(s);
    if (!s->index_path) return TD_OK; /* the single header was validated at open */
    for (size_t i = 0; i < s->n_shards; i++) {
        td_st_file *f;
        td_status st = st_set_shard(s, i, &f, err);
        if (st) return st;
    }
    for (size_t k = 0; k < s->idx.n; k++) {
        size_t si = s->name_shard[k];
        if (!td_st_header_find(&s->files[si]->hdr, s->idx.names[k]))
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: index says tensor " NM " is in shard %s but %s does not "
                              "contain it", s->index_path, s->idx.names[k], st_shard_name(s, si),
                              st_shard_name(s, si));
    }
    for (size_t i = 0; i < s->n_shards; i++) {
        const td_st_header *h = &s->files[i]->hdr;
        for (size_t j = 0; j < h->n; j++) {
            const char *name = h->tensors[j].name;
            size_t k = st_index_find(&s->idx, name);
            if (k == SIZE_MAX)
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM " is in shard %s but the index does not list "
                                  "it", s->index_path, name, st_shard_name(s, i));
            if (s->name_shard[k] != i)
                return td_err_set(err, TD_ERR_FORMAT,
                                  "%s: tensor " NM " is in shard %s but the index assigns it to "
                                  "%s", s->index_path, name, st_shard_name(s, i),
                                  st_shard_name(s, s->name_shard[k]));
        }
    }
    return TD_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* streaming writer                                                                           */
/* ------------------------------------------------------------------------------------------ */

enum { WR_DECLARE, WR_BEGUN, WR_DONE, WR_FAILED };

typedef struct st_wtensor {
    char *name;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    uint64_t nbytes, begin;
    bool written;
} st_wtensor;

struct td_st_writer {
    char *path, *tmp;
    st_wtensor *t;
    size_t n, cap;
    size_t *ht;            /* open addressing: tensor index + 1, 0 = empty */
    size_t ht_cap;         /* power of two, > 2 * n */
    char **mkeys, **mvals;
    size_t n_meta, cap_meta;
    int fd;
    bool tmp_created;
    int phase;
    uint64_t data_start;   /* 8 + N */
    uint64_t data_len;
};

static uint64_t st_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* Slot for name: its entry when present, else the empty slot where it would go. */
static size_t st_ht_slot(const td_st_writer *w, const char *name)
{
    size_t mask = w->ht_cap - 1, i = (size_t)st_hash(name) & mask;
    while (w->ht[i] && strcmp(w->t[w->ht[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static bool st_ht_grow(td_st_writer *w)
{
    size_t cap = w->ht_cap ? w->ht_cap * 2 : 64;
    size_t *old = w->ht, old_cap = w->ht_cap;
    w->ht = calloc(cap, sizeof *w->ht);
    if (!w->ht) {
        w->ht = old;
        return false;
    }
    w->ht_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) w->ht[st_ht_slot(w, w->t[old[i] - 1].name)] = old[i];
    free(old);
    return true;
}

/* Any failure: remove PATH.tmp and refuse every later call. Returns code. */
static td_status st_writer_fail(td_st_writer *w, td_status code)
{
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->tmp_created) {
        unlink(w->tmp);
        w->tmp_created = false;
    }
    w->phase = WR_FAILED;
    return code;
}

#define WFAIL(w, err, code, ...) st_writer_fail((w), td_err_set((err), (code), __VA_ARGS__))

static td_status st_writer_state(td_st_writer *w, int want, const char *op, td_err *err)
{
    TD_ASSERT(w);
    if (w->phase == want) return TD_OK;
    if (w->phase == WR_FAILED)
        return td_err_set(err, TD_ERR_ARG, "%s: %s after an earlier failure of this writer",
                          w->path, op);
    static const char *const names[] = {"declaring", "writing", "finished", "failed"};
    return WFAIL(w, err, TD_ERR_ARG, "%s: %s called while the writer is %s", w->path, op,
                 names[w->phase]);
}

td_status td_st_writer_init(const char *path, td_st_writer **out, td_err *err)
{
    TD_ASSERT(out);
    *out = NULL;
    if (!path || !*path) return td_err_set(err, TD_ERR_ARG, "safetensors writer: empty path");
    td_st_writer *w = calloc(1, sizeof *w);
    if (!w) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    if (!w->path || !w->tmp || !st_ht_grow(w)) {
        td_st_writer_free(w);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    sprintf(w->tmp, "%s.tmp", path);
    *out = w;
    return TD_OK;
}

static const char *st_bad_text(const char *s)
{
    size_t off;
    if (!td_utf8_valid(s, strlen(s), &off)) return "is not valid UTF-8";
    return NULL;
}

td_status td_st_writer_meta(td_st_writer *w, const char *key, const char *value, td_err *err)
{
    td_status st = st_writer_state(w, WR_DECLARE, "td_st_writer_meta", err);
    if (st) return st;
    if (!key || !value)
        return WFAIL(w, err, TD_ERR_ARG, "%s: metadata key and value must not be NULL", w->path);
    const char *why = st_bad_text(key);
    if (why) return WFAIL(w, err, TD_ERR_ARG, "%s: metadata key %s", w->path, why);
    if ((why = st_bad_text(value)))
        return WFAIL(w, err, TD_ERR_ARG, "%s: metadata value of \"%.200s\" %s", w->path, key, why);
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->mkeys[i], key) == 0)
            return WFAIL(w, err, TD_ERR_ARG, "%s: duplicate metadata key \"%.200s\"", w->path, key);
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? w->cap_meta * 2 : 8;
        char **k = realloc(w->mkeys, cap * sizeof *k);
        if (k) w->mkeys = k;
        char **v = k ? realloc(w->mvals, cap * sizeof *v) : NULL;
        if (v) w->mvals = v;
        if (!k || !v) return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
        w->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
    }
    w->mkeys[w->n_meta] = k;
    w->mvals[w->n_meta] = v;
    w->n_meta++;
    return TD_OK;
}

td_status td_st_writer_declare(td_st_writer *w, const char *name, td_dtype dtype, int ndim,
                               const int64_t *shape, td_err *err)
{
    td_status st = st_writer_state(w, WR_DECLARE, "td_st_writer_declare", err);
    if (st) return st;
    if (!name || !*name)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor name must not be empty", w->path);
    if (strcmp(name, "__metadata__") == 0)
        return WFAIL(w, err, TD_ERR_ARG, "%s: \"__metadata__\" is reserved, not a tensor name",
                     w->path);
    const char *why = st_bad_text(name);
    if (why) return WFAIL(w, err, TD_ERR_ARG, "%s: tensor name %s", w->path, why);
    if (dtype <= TD_DTYPE_INVALID || dtype >= TD_DTYPE_COUNT)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": invalid dtype %d", w->path, name,
                     (int)dtype);
    if (ndim < 0 || ndim > TD_MAX_DIMS)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": rank %d outside 0..%d", w->path,
                     name, ndim, TD_MAX_DIMS);
    if (ndim > 0 && !shape)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": NULL shape", w->path, name);
    int64_t numel = 0, nbytes = 0;
    td_err sub;
    char shp[160];
    td_shape_str(ndim, shape, shp, sizeof shp);
    if (td_shape_numel(ndim, shape, &numel, &sub) != TD_OK ||
        td_dtype_nbytes(dtype, numel, &nbytes, &sub) != TD_OK)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": %s %s: %s", w->path, name,
                     td_dtype_name(dtype), shp, sub.msg);
    if ((uint64_t)nbytes >= ST_MAX_INT)
        return WFAIL(w, err, TD_ERR_RANGE, "%s: tensor " NM ": %lld bytes exceeds 2^53 - 1",
                     w->path, name, (long long)nbytes);
    size_t slot = st_ht_slot(w, name);
    if (w->ht[slot])
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM " declared twice", w->path, name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        st_wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
        w->t = t;
        w->cap = cap;
    }
    st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = (uint64_t)nbytes;
    w->n++;
    w->ht[slot] = w->n;
    if (2 * w->n >= w->ht_cap && !st_ht_grow(w))
        return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
    return TD_OK;
}

/* growable byte buffer for the header */
typedef struct st_buf {
    char *p;
    size_t len, cap;
    bool oom;
} st_buf;

static void sb_put(st_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(st_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(st_buf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* JSON string literal: quotes, backslashes and control characters escaped; UTF-8 kept. */
static void sb_json_str(st_buf *b, const char *s)
{
    sb_put(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_put(b, run, (size_t)(s - run));
        char esc[8];
        switch (c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        }
        run = s + 1;
    }
    sb_put(b, run, (size_t)(s - run));
    sb_put(b, "\"", 1);
}

/* Merge sort of tensor indices by name (qsort has no context argument in C11). */
static void st_sort_idx(size_t *v, size_t *tmp, size_t n, const st_wtensor *t)
{
    if (n < 2) return;
    size_t h = n / 2;
    st_sort_idx(v, tmp, h, t);
    st_sort_idx(v + h, tmp, n - h, t);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = strcmp(t[v[i]].name, t[v[j]].name) <= 0 ? v[i++] : v[j++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static td_status st_pwrite_all(int fd, const void *data, uint64_t n, uint64_t off, const char *path,
                               td_err *err)
{
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = pwrite(fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return td_err_set(err, TD_ERR_IO, "%s: write of %zu bytes at offset %llu failed: %s",
                              path, chunk, (unsigned long long)off,
                              r < 0 ? strerror(errno) : "no progress");
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return TD_OK;
}

td_status td_st_writer_begin(td_st_writer *w, td_err *err)
{
    td_status st = st_writer_state(w, WR_DECLARE, "td_st_writer_begin", err);
    if (st) return st;
    uint64_t pos = 0;
    for (size_t i = 0; i < w->n; i++) {
        w->t[i].begin = pos;
        pos += w->t[i].nbytes;
        if (pos >= ST_MAX_INT)
            return WFAIL(w, err, TD_ERR_RANGE, "%s: tensor data exceeds 2^53 - 1 bytes", w->path);
    }
    w->data_len = pos;
    size_t *ord = malloc((w->n ? w->n : 1) * sizeof *ord);
    size_t *tmp = malloc((w->n ? w->n : 1) * sizeof *tmp);
    size_t *mord = malloc((w->n_meta ? w->n_meta : 1) * sizeof *mord);
    if (!ord || !tmp || !mord) {
        free(ord);
        free(tmp);
        free(mord);
        return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
    }
    for (size_t i = 0; i < w->n; i++) ord[i] = i;
    st_sort_idx(ord, tmp, w->n, w->t);
    /* metadata keys sorted too (insertion sort: few keys) */
    for (size_t i = 0; i < w->n_meta; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(w->mkeys[mord[j - 1]], w->mkeys[i]) > 0; j--) mord[j] = mord[j - 1];
        mord[j] = i;
    }
    st_buf b = {0};
    sb_put(&b, "{", 1);
    for (size_t k = 0; k < w->n; k++) {
        const st_wtensor *t = &w->t[ord[k]];
        if (k) sb_put(&b, ",", 1);
        sb_json_str(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, td_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_put(&b, ",", 1);
            sb_u64(&b, (uint64_t)t->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, t->begin);
        sb_put(&b, ",", 1);
        sb_u64(&b, t->begin + t->nbytes);
        sb_str(&b, "]}");
    }
    if (w->n_meta) {
        if (w->n) sb_put(&b, ",", 1);
        sb_str(&b, "\"__metadata__\":{");
        for (size_t k = 0; k < w->n_meta; k++) {
            if (k) sb_put(&b, ",", 1);
            sb_json_str(&b, w->mkeys[mord[k]]);
            sb_put(&b, ":", 1);
            sb_json_str(&b, w->mvals[mord[k]]);
        }
        sb_put(&b, "}", 1);
    }
    sb_put(&b, "}", 1);
    while (!b.oom && b.len % 8 != 0) sb_put(&b, " ", 1);
    free(ord);
    free(tmp);
    free(mord);
    if (b.oom) {
        free(b.p);
        return WFAIL(w, err, TD_ERR_NOMEM, "%s: out of memory", w->path);
    }
    if (b.len > TD_ST_MAX_HEADER) {
        free(b.p);
        return WFAIL(w, err, TD_ERR_RANGE, "%s: header of %zu bytes exceeds the limit of %llu",
                     w->path, b.len, (unsigned long long)TD_ST_MAX_HEADER);
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w->fd < 0) {
        free(b.p);
        return WFAIL(w, err, TD_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    }
    w->tmp_created = true;
    uint8_t lenle[8];
    for (int i = 0; i < 8; i++) lenle[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
    w->data_start = 8 + (uint64_t)b.len;
    st = st_pwrite_all(w->fd, lenle, 8, 0, w->tmp, err);
    if (!st) st = st_pwrite_all(w->fd, b.p, b.len, 8, w->tmp, err);
    free(b.p);
    if (st) return st_writer_fail(w, st);
    if (ftruncate(w->fd, (off_t)(w->data_start + w->data_len)) != 0)
        return WFAIL(w, err, TD_ERR_IO, "%s: cannot size to %llu bytes: %s", w->tmp,
                     (unsigned long long)(w->data_start + w->data_len), strerror(errno));
    w->phase = WR_BEGUN;
    return TD_OK;
}

td_status td_st_writer_write(td_st_writer *w, const char *name, const void *data,
                             size_t nbytes, td_err *err)
{
    td_status st = st_writer_state(w, WR_BEGUN, "td_st_writer_write", err);
    if (st) return st;
    if (!name) return WFAIL(w, err, TD_ERR_ARG, "%s: NULL tensor name", w->path);
    size_t slot = st_ht_slot(w, name);
    if (!w->ht[slot])
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM " was not declared", w->path, name);
    st_wtensor *t = &w->t[w->ht[slot] - 1];
    if (t->written)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM " written twice", w->path, name);
    if ((uint64_t)nbytes != t->nbytes)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": got %zu bytes, declared %s needs %llu",
                     w->path, name, nbytes, td_dtype_name(t->dtype),
                     (unsigned long long)t->nbytes);
    if (nbytes && !data)
        return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": NULL data", w->path, name);
    if (nbytes) {
        st = st_pwrite_all(w->fd, data, nbytes, w->data_start + t->begin, w->tmp, err);
        if (st) {
            td_err_prefix(err, "tensor \"%.300s\": ", name);
            return st_writer_fail(w, st);
        }
    }
    t->written = true;
    return TD_OK;
}

static void st_fsync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path ? 1 : 0)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: some file systems refuse fsync on directories */
        close(fd);
    }
    free(dir);
}

td_status td_st_writer_finish(td_st_writer *w, td_err *err)
{
    td_status st = st_writer_state(w, WR_BEGUN, "td_st_writer_finish", err);
    if (st) return st;
    for (size_t i = 0; i < w->n; i++)
        if (!w->t[i].written)
            return WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM " was declared but never written",
                         w->path, w->t[i].name);
    if (fsync(w->fd) != 0)
        return WFAIL(w, err, TD_ERR_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return WFAIL(w, err, TD_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
    if (rename(w->tmp, w->path) != 0)
        return WFAIL(w, err, TD_ERR_IO, "%s: cannot rename %s into place: %s", w->path, w->tmp,
                     strerror(errno));
    w->tmp_created = false;
    st_fsync_dir(w->path);
    w->phase = WR_DONE;
    return TD_OK;
}

void td_st_writer_free(td_st_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp_created) unlink(w->tmp);
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->ht);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->mkeys[i]);
        free(w->mvals[i]);
    }
    free(w->mkeys);
    free(w->mvals);
    free(w->path);
    free(w->tmp);
    free(w);
}

td_status td_st_write_file(const char *path, size_t n, const char *const *names,
                           const td_tensor *tensors, size_t n_meta, const char *const *meta_keys,
                           const char *const *meta_vals, td_err *err)
{
    if ((n && (!names || !tensors)) || (n_meta && (!meta_keys || !meta_vals)))
        return td_err_set(err, TD_ERR_ARG, "%s: NULL tensor or metadata arrays", path ? path : "");
    td_st_writer *w;
    td_status st = td_st_writer_init(path, &w, err);
    if (st) return st;
    for (size_t i = 0; i < n_meta && !st; i++)
        st = td_st_writer_meta(w, meta_keys[i], meta_vals[i], err);
    for (size_t i = 0; i < n && !st; i++) {
        const td_tensor *t = &tensors[i];
        if (t->ndim < 0 || t->ndim > TD_MAX_DIMS)
            st = WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM ": rank %d outside 0..%d", path,
                       names[i] ? names[i] : "", t->ndim, TD_MAX_DIMS);
        else if (td_tensor_numel(t) != 0 && !td_tensor_is_contiguous(t)) /* empty: no layout */
            st = WFAIL(w, err, TD_ERR_ARG, "%s: tensor " NM " is not contiguous", path,
                       names[i] ? names[i] : "");
        else
            st = td_st_writer_declare(w, names[i], t->dtype, t->ndim, t->shape, err);
    }
    if (!st) st = td_st_writer_begin(w, err);
    for (size_t i = 0; i < n && !st; i++) {
        size_t slot = st_ht_slot(w, names[i]);
        st = td_st_writer_write(w, names[i], tensors[i].data, (size_t)w->t[w->ht[slot] - 1].nbytes,
                                err);
    }
    if (!st) st = td_st_writer_finish(w, err);
    td_st_writer_free(w);
    return st;
}
