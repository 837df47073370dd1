/* test_safetensors.c — safetensors reader, sharded sets and writer (core/safetensors).
 *
 * With TD_ST_CROSSCHECK_DIR set, st_crosscheck_dir_when_requested also writes files plus a
 * manifest for scripts/st_crosscheck.py and verifies the files that script wrote (see
 * docs/safetensors.md, "Cross-check against the public implementation").
 */
#include "test_common.h"
#include "json.h"
#include "safetensors.h"
#include "sha256.h"

#include <signal.h>
#include <sys/resource.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131u + seed * 17u + 7u);
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void rm_rf(const char *path)
{
    assert_int_equal(td_test_sh("rm -rf '%s'", path), 0);
}

/* dir/name in a rotating buffer (8 slots); dir may itself come from sub(). */
static const char *sub(const char *dir, const char *name)
{
    static char bufs[8][2048];
    static int slot;
    char d[2048];
    int n = snprintf(d, sizeof d, "%s", dir);
    assert_true(n >= 0 && (size_t)n < sizeof d);
    char *b = bufs[slot++ & 7];
    n = snprintf(b, sizeof bufs[0], "%s/%s", d, name);
    assert_true(n >= 0 && (size_t)n < sizeof bufs[0]);
    return b;
}

static const char *mkdir_fresh(const char *name)
{
    const char *d = td_test_path(name);
    rm_rf(d);
    assert_int_equal(mkdir(d, 0777), 0);
    return d;
}

/* A safetensors image: u64 LE length of `json`, the JSON, then dlen data bytes. */
static uint8_t *image(const char *json, size_t jlen, size_t dlen, size_t *len)
{
    *len = 8 + jlen + dlen;
    uint8_t *b = malloc(*len ? *len : 1);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)jlen >> (8 * i));
    memcpy(b + 8, json, jlen);
    fill(b + 8 + jlen, dlen, 3);
    return b;
}

static void assert_msg_has(const td_err *err, const char *needle, const char *ctx)
{
    if (needle && !strstr(err->msg, needle))
        fail_msg("%s: message '%s' lacks '%s'", ctx, err->msg, needle);
}

/* Declared test tensor: name, dtype, shape and its bytes. */
typedef struct tt {
    char name[64];
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    uint8_t *data;
    size_t nbytes;
} tt;

static void tt_make(tt *t, const char *name, td_dtype dt, int ndim, const int64_t *shape,
                    unsigned seed)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    int64_t numel, nb;
    assert_int_equal(td_shape_numel(ndim, shape, &numel, NULL), TD_OK);
    assert_int_equal(td_dtype_nbytes(dt, numel, &nb, NULL), TD_OK);
    t->nbytes = (size_t)nb;
    t->data = nb ? malloc((size_t)nb) : NULL;
    fill(t->data, t->nbytes, seed);
    if (dt == TD_BOOL)
        for (size_t i = 0; i < t->nbytes; i++) t->data[i] &= 1;
}

static void tt_free(tt *t, size_t n)
{
    for (size_t i = 0; i < n; i++) free(t[i].data);
}

/* One tensor of every dtype (whole-byte shapes), scalars, zero-size tensors and names that
 * need JSON escaping. `only_common` keeps the dtypes that every safetensors release knows. */
static size_t tt_all(tt *t, size_t cap, bool sub_byte_and_new)
{
    size_t n = 0;
    for (int d = 1; d < TD_DTYPE_COUNT; d++) {
        td_dtype dt = (td_dtype)d;
        bool newer = dt == TD_F4 || dt == TD_F6_E2M3 || dt == TD_F6_E3M2 || dt == TD_F8_E8M0 ||
                     dt == TD_F8_E4M3FNUZ || dt == TD_F8_E5M2FNUZ || dt == TD_C64;
        if (newer != sub_byte_and_new) continue;
        char name[64];
        snprintf(name, sizeof name, "t.%s", td_dtype_name(dt));
        int bits = td_dtype_bits(dt);
        int64_t s2[2] = {2, 3}, s1[1] = {4}, s3[3] = {2, 1, 5};
        assert_true(n < cap);
        if (bits == 6) tt_make(&t[n++], name, dt, 1, s1, (unsigned)d);
        else if (d % 3 == 0) tt_make(&t[n++], name, dt, 3, s3, (unsigned)d);
        else tt_make(&t[n++], name, dt, 2, s2, (unsigned)d);
    }
    int64_t z1[2] = {0, 5}, z2[2] = {3, 0}, z3[1] = {0};
    assert_true(n + 6 <= cap);
    if (!sub_byte_and_new) {
        tt_make(&t[n++], "scalar.f32", TD_F32, 0, NULL, 91);
        tt_make(&t[n++], "scalar.bf16", TD_BF16, 0, NULL, 92);
        tt_make(&t[n++], "empty.bf16", TD_BF16, 2, z1, 93);
        tt_make(&t[n++], "empty.u8", TD_U8, 2, z2, 94);
        tt_make(&t[n++], "q\"uote\\back\nnl\x01" "ctl", TD_I16, 1, z3 + 0 /* [0] */, 95);
        int64_t s[1] = {3};
        tt_make(&t[n++], "\xc3\xbcnic\xc3\xb8" "de.w", TD_U8, 1, s, 96);
    } else {
        tt_make(&t[n++], "empty.f4", TD_F4, 1, z3, 97);
        tt_make(&t[n++], "scalar.e8m0", TD_F8_E8M0, 0, NULL, 98);
    }
    return n;
}

static const char *const meta_k[] = {"format", "note", "\xc3\xbcnicode"};
static const char *const meta_v[] = {"pt", "tab\there \"quoted\" \\ back\nslash", "\xe2\x9c\x93"};

/* Write t[0..n) with the streaming writer: declared in the given order, written in reverse. */
static td_status write_tt(const char *path, const tt *t, size_t n, bool with_meta, td_err *err)
{
    td_st_writer *w;
    td_status st = td_st_writer_init(path, &w, err);
    if (st) return st;
    for (size_t i = 0; with_meta && i < TD_ARRAY_LEN(meta_k) && !st; i++)
        st = td_st_writer_meta(w, meta_k[i], meta_v[i], err);
    for (size_t i = 0; i < n && !st; i++)
        st = td_st_writer_declare(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, err);
    if (!st) st = td_st_writer_begin(w, err);
    for (size_t i = n; i-- > 0 && !st;)
        st = td_st_writer_write(w, t[i].name, t[i].data, t[i].nbytes, err);
    if (!st) st = td_st_writer_finish(w, err);
    td_st_writer_free(w);
    return st;
}

static void check_tt(const td_st_file *f, const tt *t, size_t n)
{
    const td_st_header *h = td_st_file_header(f);
    assert_int_equal(h->n, n);
    for (size_t i = 0; i < n; i++) {
        td_tensor v;
        td_err err;
        if (td_st_file_tensor(f, t[i].name, &v, &err) != TD_OK) fail_msg("%s", err.msg);
        assert_int_equal(v.dtype, t[i].dtype);
        assert_int_equal(v.ndim, t[i].ndim);
        for (int d = 0; d < v.ndim; d++) assert_int_equal(v.shape[d], t[i].shape[d]);
        assert_ptr_equal(v.owner, f);
        if (t[i].nbytes == 0) {
            assert_null(v.data);
        } else {
            assert_non_null(v.data);
            assert_memory_equal(v.data, t[i].data, t[i].nbytes);
        }
        const td_st_info *info = td_st_header_find(h, t[i].name);
        assert_non_null(info);
        assert_int_equal(info->end - info->begin, t[i].nbytes);
    }
}

/* ---- round trip and writer ---------------------------------------------------------------- */

static void st_roundtrip_every_dtype_matches(void **state)
{
    (void)state;
    tt t[64];
    size_t n = tt_all(t, 64, false);
    n += tt_all(t + n, 64 - n, true);
    assert_int_equal(n, TD_DTYPE_COUNT - 1 + 8);
    const char *path = td_test_path("all.safetensors");
    td_err err;
    if (write_tt(path, t, n, true, &err) != TD_OK) fail_msg("%s", err.msg);
    td_st_file *f;
    if (td_st_file_open(path, &f, &err) != TD_OK) fail_msg("%s", err.msg);
    check_tt(f, t, n);
    const td_st_header *h = td_st_file_header(f);
    /* every dtype is present */
    for (int d = 1; d < TD_DTYPE_COUNT; d++) {
        char name[64];
        snprintf(name, sizeof name, "t.%s", td_dtype_name((td_dtype)d));
        const td_st_info *i = td_st_header_find(h, name);
        assert_non_null(i);
        assert_int_equal(i->dtype, d);
    }
    /* metadata */
    assert_int_equal(h->n_meta, 3);
    for (size_t i = 0; i < 3; i++) assert_string_equal(td_st_header_meta(h, meta_k[i]), meta_v[i]);
    assert_null(td_st_header_meta(h, "absent"));
    /* names sorted, tensor_at follows that order */
    for (size_t i = 1; i < h->n; i++)
        assert_true(strcmp(h->tensors[i - 1].name, h->tensors[i].name) < 0);
    td_tensor v;
    td_st_file_tensor_at(f, 0, &v);
    assert_int_equal(v.dtype, h->tensors[0].dtype);
    /* absent tensor names the file and the tensor */
    assert_int_equal(td_st_file_tensor(f, "nope.weight", &v, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "all.safetensors", "absent");
    assert_msg_has(&err, "nope.weight", "absent");
    assert_null(td_st_header_find(h, "nope.weight"));
    assert_int_equal(td_st_file_size(f), 8 + h->header_len + h->data_len);
    assert_string_equal(td_st_file_path(f), path);
    td_st_file_close(f);
    td_st_file_close(NULL);
    tt_free(t, n);
}

static void st_writer_same_inputs_byte_identical(void **state)
{
    (void)state;
    tt t[64];
    size_t n = tt_all(t, 64, false);
    const char *a = td_test_path("same_a.safetensors"), *b = td_test_path("same_b.safetensors");
    const char *c = td_test_path("same_c.safetensors");
    td_err err;
    assert_int_equal(write_tt(a, t, n, true, &err), TD_OK);
    assert_int_equal(write_tt(b, t, n, true, &err), TD_OK);
    /* the one-call form with the same declarations gives the same bytes */
    td_tensor views[64];
    const char *names[64];
    for (size_t i = 0; i < n; i++) {
        td_tensor_init(&views[i], t[i].dtype, t[i].ndim, t[i].shape, t[i].data, NULL);
        names[i] = t[i].name;
    }
    if (td_st_write_file(c, n, names, views, 3, meta_k, meta_v, &err) != TD_OK)
        fail_msg("%s", err.msg);
    size_t la, lb, lc;
    char *ba = td_test_slurp(a, &la), *bb = td_test_slurp(b, &lb), *bc = td_test_slurp(c, &lc);
    assert_non_null(ba);
    assert_non_null(bb);
    assert_non_null(bc);
    assert_int_equal(la, lb);
    assert_int_equal(la, lc);
    assert_memory_equal(ba, bb, la);
    assert_memory_equal(ba, bc, la);
    free(ba);
    free(bb);
    free(bc);
    tt_free(t, n);
}

static void st_writer_layout_padded_sorted_declaration_order(void **state)
{
    (void)state;
    tt t[3];
    int64_t s[1] = {3};
    tt_make(&t[0], "zeta", TD_U8, 1, s, 1);   /* declared first: data offset 0 */
    tt_make(&t[1], "alpha", TD_F32, 1, s, 2); /* then 3 */
    tt_make(&t[2], "mid", TD_U8, 0, NULL, 3); /* then 15 */
    const char *path = td_test_path("layout.safetensors");
    td_err err;
    assert_int_equal(write_tt(path, t, 3, false, &err), TD_OK);
    size_t len;
    char *b = td_test_slurp(path, &len);
    assert_non_null(b);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)b[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(len, 8 + n + 3 + 12 + 1);
    const char *expect = "{\"alpha\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[3,15]},"
                         "\"mid\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[15,16]},"
                         "\"zeta\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
    assert_memory_equal(b + 8, expect, strlen(expect));
    for (size_t i = strlen(expect); i < n; i++) assert_int_equal(b[8 + i], ' ');
    assert_memory_equal(b + 8 + n, t[0].data, 3);
    assert_memory_equal(b + 8 + n + 3, t[1].data, 12);
    free(b);
    /* an empty file is the 8-byte header "{}" padded */
    const char *e = td_test_path("empty_w.safetensors");
    assert_int_equal(td_st_write_file(e, 0, NULL, NULL, 0, NULL, NULL, &err), TD_OK);
    b = td_test_slurp(e, &len);
    assert_non_null(b);
    assert_int_equal(len, 16);
    assert_memory_equal(b, "\x08\0\0\0\0\0\0\0{}      ", 16);
    free(b);
    tt_free(t, 3);
}

typedef enum { BAD_DECLARE, BAD_META, BAD_WRITE, BAD_WRITE_TWICE, BAD_FINISH } bad_phase;

static void st_writer_bad_calls_rejected(void **state)
{
    (void)state;
    static const struct {
        bad_phase phase;
        const char *name;
        td_dtype dt;
        int ndim;
        int64_t shape[9];
        size_t nbytes;       /* for BAD_WRITE */
        td_status code;
        const char *needle;
    } cases[] = {
        {BAD_DECLARE, "w", TD_F32, 1, {4}, 0, TD_ERR_ARG, "declared twice"},
        {BAD_DECLARE, "", TD_F32, 1, {4}, 0, TD_ERR_ARG, "empty"},
        {BAD_DECLARE, "__metadata__", TD_F32, 1, {4}, 0, TD_ERR_ARG, "reserved"},
        {BAD_DECLARE, "f4", TD_F4, 1, {3}, 0, TD_ERR_ARG, "whole number of bytes"},
        {BAD_DECLARE, "f6", TD_F6_E2M3, 0, {0}, 0, TD_ERR_ARG, "whole number of bytes"},
        {BAD_DECLARE, "neg", TD_F32, 2, {2, -1}, 0, TD_ERR_ARG, "negative"},
        {BAD_DECLARE, "r9", TD_F32, 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, TD_ERR_ARG, "rank 9"},
        {BAD_DECLARE, "bad", TD_DTYPE_INVALID, 1, {1}, 0, TD_ERR_ARG, "invalid dtype"},
        {BAD_DECLARE, "bad\xff", TD_U8, 1, {1}, 0, TD_ERR_ARG, "UTF-8"},
        {BAD_META, "format", TD_U8, 0, {0}, 0, TD_ERR_ARG, "duplicate metadata key"},
        {BAD_WRITE, "w", TD_U8, 0, {0}, 3, TD_ERR_ARG, "got 3 bytes"},
        {BAD_WRITE, "ghost", TD_U8, 0, {0}, 16, TD_ERR_ARG, "not declared"},
        {BAD_WRITE_TWICE, "w", TD_U8, 0, {0}, 16, TD_ERR_ARG, "written twice"},
        {BAD_FINISH, "w", TD_U8, 0, {0}, 0, TD_ERR_ARG, "never written"},
    };
    const char *path = td_test_path("bad_w.safetensors");
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint8_t data[16] = {0};
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        td_st_writer *w;
        td_err err;
        int64_t s4[1] = {4};
        assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
        assert_int_equal(td_st_writer_meta(w, "format", "pt", &err), TD_OK);
        assert_int_equal(td_st_writer_declare(w, "w", TD_F32, 1, s4, &err), TD_OK);
        td_status st = TD_OK;
        switch (cases[i].phase) {
        case BAD_DECLARE:
            st = td_st_writer_declare(w, cases[i].name, cases[i].dt, cases[i].ndim,
                                      cases[i].shape, &err);
            break;
        case BAD_META: st = td_st_writer_meta(w, cases[i].name, "x", &err); break;
        case BAD_WRITE:
            assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
            assert_true(exists(tmp));
            st = td_st_writer_write(w, cases[i].name, data, cases[i].nbytes, &err);
            break;
        case BAD_WRITE_TWICE:
            assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
            assert_int_equal(td_st_writer_write(w, cases[i].name, data, cases[i].nbytes, &err),
                             TD_OK);
            st = td_st_writer_write(w, cases[i].name, data, cases[i].nbytes, &err);
            break;
        case BAD_FINISH:
            assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
            st = td_st_writer_finish(w, &err);
            break;
        }
        if (st != cases[i].code || !strstr(err.msg, cases[i].needle) ||
            !strstr(err.msg, "bad_w.safetensors"))
            fail_msg("case %zu: status %d msg '%s'", i, st, err.msg);
        /* the writer is now failed: later calls are refused, nothing is left on disk */
        assert_false(exists(tmp));
        assert_int_not_equal(td_st_writer_finish(w, &err), TD_OK);
        assert_msg_has(&err, "earlier failure", "sticky");
        td_st_writer_free(w);
        assert_false(exists(path));
        assert_false(exists(tmp));
    }
    /* calls out of order */
    td_st_writer *w;
    td_err err;
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_write(w, "x", data, 1, &err), TD_ERR_ARG);
    assert_msg_has(&err, "declaring", "order");
    td_st_writer_free(w);
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
    int64_t s1[1] = {1};
    assert_int_equal(td_st_writer_declare(w, "late", TD_U8, 1, s1, &err), TD_ERR_ARG);
    td_st_writer_free(w);
    td_st_writer_free(NULL);
    assert_false(exists(path));
    assert_false(exists(tmp));
    /* a non-contiguous view is refused by the one-call form */
    td_tensor v;
    int64_t s2[2] = {2, 2};
    td_tensor_init(&v, TD_F32, 2, s2, data, NULL);
    v.strides[0] = 1;
    v.strides[1] = 2;
    const char *nm[1] = {"nc"};
    assert_int_equal(td_st_write_file(path, 1, nm, &v, 0, NULL, NULL, &err), TD_ERR_ARG);
    assert_msg_has(&err, "not contiguous", "view");
    assert_false(exists(path));
    assert_int_equal(td_st_writer_init("", &w, &err), TD_ERR_ARG);
    /* a NULL td_err still gets the status code */
    assert_int_equal(td_st_writer_init(path, &w, NULL), TD_OK);
    assert_int_equal(td_st_writer_declare(w, "", TD_U8, 1, s1, NULL), TD_ERR_ARG);
    assert_int_equal(td_st_writer_begin(w, NULL), TD_ERR_ARG);
    td_st_writer_free(w);
    td_st_header h;
    assert_int_equal(td_st_parse_header((const uint8_t *)"\1\0\0\0\0\0\0\0{", 9, "n", &h, NULL),
                     TD_ERR_FORMAT);
}

static void st_writer_failure_leaves_no_files(void **state)
{
    (void)state;
    const char *dir = mkdir_fresh("wfail");
    td_err err;
    td_st_writer *w;
    uint8_t data[8192];
    fill(data, sizeof data, 5);
    int64_t big[1] = {2048};

    /* (a) free before finish: PATH.tmp removed, an existing PATH keeps its bytes */
    const char *path = sub(dir, "keep.safetensors"), *tmp = sub(dir, "keep.safetensors.tmp");
    td_test_write_str(path, "old contents");
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_declare(w, "w", TD_F32, 1, big, &err), TD_OK);
    assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
    assert_true(exists(tmp));
    assert_int_equal(td_st_writer_write(w, "w", data, sizeof data, &err), TD_OK);
    td_st_writer_free(w);
    assert_false(exists(tmp));
    size_t len;
    char *b = td_test_slurp(path, &len);
    assert_non_null(b);
    assert_string_equal(b, "old contents");
    free(b);

    /* (b) an I/O failure (file size limit) in begin */
    path = sub(dir, "fsize.safetensors");
    tmp = sub(dir, "fsize.safetensors.tmp");
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_declare(w, "w", TD_F32, 1, big, &err), TD_OK);
    td_status st = td_st_writer_begin(w, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    if (st != TD_ERR_IO) fail_msg("fsize: status %d msg '%s'", st, err.msg);
    assert_msg_has(&err, "fsize.safetensors.tmp", "fsize");
    assert_false(exists(tmp));
    assert_false(exists(path));
    td_st_writer_free(w);
    assert_false(exists(tmp));

    /* (c) rename onto a directory fails in finish: PATH (the directory) stays, no tmp */
    path = sub(dir, "isdir.safetensors");
    tmp = sub(dir, "isdir.safetensors.tmp");
    assert_int_equal(mkdir(path, 0777), 0);
    td_test_write_str(sub(path, "x"), "x");
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_declare(w, "w", TD_F32, 1, big, &err), TD_OK);
    assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
    assert_int_equal(td_st_writer_write(w, "w", data, sizeof data, &err), TD_OK);
    assert_int_equal(td_st_writer_finish(w, &err), TD_ERR_IO);
    assert_msg_has(&err, "isdir.safetensors", "rename");
    assert_false(exists(tmp));
    td_st_writer_free(w);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));

    /* (d) directory that does not exist */
    path = sub(dir, "nodir/x.safetensors");
    assert_int_equal(td_st_writer_init(path, &w, &err), TD_OK);
    assert_int_equal(td_st_writer_begin(w, &err), TD_ERR_IO);
    assert_msg_has(&err, "nodir/x.safetensors.tmp", "nodir");
    td_st_writer_free(w);
    assert_false(exists(sub(dir, "nodir")));

    /* (e) td_st_write_file failing half way (second view has NULL data) leaves nothing */
    path = sub(dir, "half.safetensors");
    td_tensor v[2];
    int64_t s[1] = {4};
    td_tensor_init(&v[0], TD_U8, 1, s, data, NULL);
    td_tensor_init(&v[1], TD_U8, 1, s, NULL, NULL);
    const char *names[2] = {"a", "b"};
    assert_int_equal(td_st_write_file(path, 2, names, v, 0, NULL, NULL, &err), TD_ERR_ARG);
    assert_msg_has(&err, "\"b\"", "half");
    assert_false(exists(path));
    assert_false(exists(sub(dir, "half.safetensors.tmp")));
}

/* ---- reader: valid edge cases, malformed corpus ------------------------------------------- */

static void st_header_valid_edge_cases_accepted(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        size_t dlen, ntensors, nmeta;
    } ok[] = {
        {"{}", 0, 0, 0},
        {"{}      ", 0, 0, 0},
        {"{} \n\t\r ", 0, 0, 0},
        {"{\"__metadata__\":{}}", 0, 0, 0},
        {"{\"__metadata__\":{\"a\":\"1\",\"b\":\"\"}}", 0, 0, 2},
        /* zero-size tensors at the start, the middle and the end; a scalar */
        {"{\"z0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
         "\"a\":{\"shape\":[2],\"data_offsets\":[0,4],\"dtype\":\"BF16\"},"
         "\"z1\":{\"dtype\":\"F4\",\"shape\":[4,0],\"data_offsets\":[4,4]},"
         "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[4,12]},"
         "\"z2\":{\"dtype\":\"I64\",\"shape\":[0,0,0],\"data_offsets\":[12,12]}}",
         12, 5, 0},
        /* packed sub-byte types */
        {"{\"f4\":{\"dtype\":\"F4\",\"shape\":[16,2],\"data_offsets\":[0,16]},"
         "\"f6\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[16,19]}}", 19, 2, 0},
        /* rank 8, huge-but-zero shape */
        {"{\"r8\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]},"
         "\"zz\":{\"dtype\":\"U8\",\"shape\":[9007199254740991,0],\"data_offsets\":[2,2]}}", 2, 2, 0},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(ok); i++) {
        size_t len;
        uint8_t *b = image(ok[i].json, strlen(ok[i].json), ok[i].dlen, &len);
        td_st_header h;
        td_err err;
        if (td_st_parse_header(b, len, "ok.safetensors", &h, &err) != TD_OK)
            fail_msg("case %zu: %s", i, err.msg);
        assert_int_equal(h.n, ok[i].ntensors);
        assert_int_equal(h.n_meta, ok[i].nmeta);
        assert_int_equal(h.header_len, strlen(ok[i].json));
        assert_int_equal(h.data_len, ok[i].dlen);
        td_st_header_free(&h);
        td_st_header_free(&h); /* idempotent on a freed header */
        free(b);
    }
    td_st_header_free(NULL);
    /* a zero-size tensor's view has no data */
    const char *json = ok[5].json;
    size_t len;
    uint8_t *b = image(json, strlen(json), 12, &len);
    const char *path = td_test_path("zero.safetensors");
    td_test_write(path, b, len);
    free(b);
    td_st_file *f;
    td_err err;
    assert_int_equal(td_st_file_open(path, &f, &err), TD_OK);
    td_tensor v;
    assert_int_equal(td_st_file_tensor(f, "z1", &v, &err), TD_OK);
    assert_null(v.data);
    assert_int_equal(v.ndim, 2);
    assert_int_equal(td_st_file_tensor(f, "s", &v, &err), TD_OK);
    assert_int_equal(v.ndim, 0);
    assert_non_null(v.data);
    td_st_file_close(f);
}

#define E3(name, dt, shape, off) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

typedef enum { RAW_NONE, RAW_EMPTY, RAW_SHORT, RAW_LEN0, RAW_LEN1, RAW_PAST, RAW_HUGE, RAW_SPACES,
               RAW_DEEP } raw_kind;

static void st_malformed_corpus_clear_errors(void **state)
{
    (void)state;
    static const struct {
        const char *slug;
        raw_kind raw;
        const char *json;
        size_t dlen;
        td_status code;
        const char *needle;
        const char *tensor; /* must appear in the message too, when set */
    } cases[] = {
        {"empty_file", RAW_EMPTY, NULL, 0, TD_ERR_FORMAT, "empty", NULL},
        {"truncated_length", RAW_SHORT, NULL, 0, TD_ERR_FORMAT, "too short", NULL},
        {"header_len_0", RAW_LEN0, NULL, 0, TD_ERR_FORMAT, "too small", NULL},
        {"header_len_1", RAW_LEN1, NULL, 0, TD_ERR_FORMAT, "too small", NULL},
        {"header_past_eof", RAW_PAST, NULL, 0, TD_ERR_RANGE, "past the end of the file", NULL},
        {"header_over_limit", RAW_HUGE, NULL, 0, TD_ERR_RANGE, "exceeds the limit", NULL},
        {"header_all_spaces", RAW_SPACES, NULL, 0, TD_ERR_FORMAT, "start with '{'", NULL},
        {"deep_nesting", RAW_DEEP, NULL, 0, TD_ERR_FORMAT, "nested deeper", NULL},
        {"header_array", RAW_NONE, "[]", 0, TD_ERR_FORMAT, "start with '{'", NULL},
        {"not_json", RAW_NONE, "{\"w\": {\"dtype\": \"F32\",", 0, TD_ERR_FORMAT, "syntax", NULL},
        {"trailing_garbage", RAW_NONE, "{}  x", 0, TD_ERR_FORMAT, "trailing data", NULL},
        {"non_utf8", RAW_NONE, "{\"w\xff\":{}}", 0, TD_ERR_FORMAT, "UTF-8", NULL},
        {"escaped_nul", RAW_NONE, "{" E3("a\\u0000b", "U8", "[1]", "[0,1]") "}", 1,
         TD_ERR_FORMAT, "\\u0000", NULL},
        {"duplicate_name", RAW_NONE,
         "{" E3("w", "F32", "[1]", "[0,4]") "," E3("w", "F32", "[1]", "[4,8]") "}", 8,
         TD_ERR_FORMAT, "duplicate key", "\"w\""},
        {"entry_not_object", RAW_NONE, "{\"w\":[1]}", 0, TD_ERR_FORMAT, "must be an object",
         "\"w\""},
        {"unknown_dtype", RAW_NONE, "{" E3("w", "F7", "[1]", "[0,1]") "}", 1, TD_ERR_FORMAT,
         "unknown dtype \"F7\"", "\"w\""},
        {"dtype_lowercase", RAW_NONE, "{" E3("w", "f32", "[1]", "[0,4]") "}", 4, TD_ERR_FORMAT,
         "unknown dtype", "\"w\""},
        {"dtype_not_string", RAW_NONE,
         "{\"w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, TD_ERR_FORMAT,
         "\"dtype\" must be a string", "\"w\""},
        {"shape_negative", RAW_NONE, "{" E3("w", "U8", "[-1]", "[0,1]") "}", 1, TD_ERR_FORMAT,
         "-1 is not a non-negative integer", "\"w\""},
        {"shape_float", RAW_NONE, "{" E3("w", "U8", "[2.5]", "[0,2]") "}", 2, TD_ERR_FORMAT,
         "2.5 is not", "\"w\""},
        {"shape_float_integral", RAW_NONE, "{" E3("w", "U8", "[2.0]", "[0,2]") "}", 2,
         TD_ERR_FORMAT, "2.0 is not", "\"w\""},
        {"shape_exponent", RAW_NONE, "{" E3("w", "U8", "[2e0]", "[0,2]") "}", 2, TD_ERR_FORMAT,
         "2e0 is not", "\"w\""},
        {"shape_huge_dim", RAW_NONE, "{" E3("w", "U8", "[99999999999999999999]", "[0,1]") "}", 1,
         TD_ERR_RANGE, "exceeds 2^53", "\"w\""},
        {"shape_numel_overflow", RAW_NONE,
         "{" E3("w", "U8", "[4294967296,4294967296,4294967296]", "[0,1]") "}", 1, TD_ERR_RANGE,
         "overflow", "\"w\""},
        {"shape_rank_9", RAW_NONE, "{" E3("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1,
         TD_ERR_RANGE, "rank 9", "\"w\""},
        {"shape_not_array", RAW_NONE, "{" E3("w", "U8", "\"2\"", "[0,2]") "}", 2, TD_ERR_FORMAT,
         "\"shape\" must be an array", "\"w\""},
        {"shape_string_dim", RAW_NONE, "{" E3("w", "U8", "[\"2\"]", "[0,2]") "}", 2,
         TD_ERR_FORMAT, "found a string", "\"w\""},
        {"shape_nested", RAW_NONE, "{" E3("w", "U8", "[[1]]", "[0,1]") "}", 1, TD_ERR_FORMAT,
         "found an array", "\"w\""},
        {"offsets_out_of_range", RAW_NONE, "{" E3("w", "F32", "[1]", "[0,4]") "}", 2,
         TD_ERR_RANGE, "past the end of the 2-byte data buffer", "\"w\""},
        {"offsets_begin_gt_end", RAW_NONE, "{" E3("w", "F32", "[1]", "[4,0]") "}", 4,
         TD_ERR_RANGE, "begin 4 > end 0", "\"w\""},
        {"offsets_three", RAW_NONE, "{" E3("w", "U8", "[1]", "[0,1,1]") "}", 1, TD_ERR_FORMAT,
         "exactly 2", "\"w\""},
        {"offsets_negative", RAW_NONE, "{" E3("w", "U8", "[0]", "[-1,-1]") "}", 0,
         TD_ERR_FORMAT, "-1 is not", "\"w\""},
        {"offsets_leading_zero", RAW_NONE, "{" E3("w", "U8", "[1]", "[00,1]") "}", 1,
         TD_ERR_FORMAT, "00 is not", "\"w\""},
        {"offsets_overlap", RAW_NONE,
         "{" E3("a", "F32", "[2]", "[0,8]") "," E3("b", "F32", "[1]", "[4,8]") "}", 8,
         TD_ERR_FORMAT, "overlap tensor \"a\"", "\"b\""},
        {"offsets_hole", RAW_NONE,
         "{" E3("a", "F32", "[1]", "[0,4]") "," E3("b", "F32", "[1]", "[8,12]") "}", 12,
         TD_ERR_FORMAT, "bytes [4, 8) of the data buffer belong to no tensor", "\"b\""},
        {"offsets_not_from_zero", RAW_NONE, "{" E3("a", "F32", "[1]", "[4,8]") "}", 8,
         TD_ERR_FORMAT, "hole", "\"a\""},
        {"trailing_bytes", RAW_NONE, "{" E3("a", "F32", "[1]", "[0,4]") "}", 6, TD_ERR_FORMAT,
         "trailing bytes", "\"a\""},
        {"trailing_bytes_no_tensors", RAW_NONE, "{}", 3, TD_ERR_FORMAT, "no tensors", NULL},
        {"byte_count_mismatch", RAW_NONE, "{" E3("w", "F32", "[2]", "[0,4]") "}", 4,
         TD_ERR_FORMAT, "needs 8", "\"w\""},
        {"f4_odd_count", RAW_NONE, "{" E3("w", "F4", "[3]", "[0,2]") "}", 2, TD_ERR_FORMAT,
         "whole number of bytes", "\"w\""},
        {"meta_non_string", RAW_NONE, "{\"__metadata__\":{\"a\":\"x\",\"n\":1}}", 0,
         TD_ERR_FORMAT, "value of \"n\" must be a string", "__metadata__"},
        {"meta_nested", RAW_NONE, "{\"__metadata__\":{\"o\":{\"k\":\"v\"}}}", 0, TD_ERR_FORMAT,
         "must be a string", "__metadata__"},
        {"meta_not_object", RAW_NONE, "{\"__metadata__\":[\"x\"]}", 0, TD_ERR_FORMAT,
         "object of strings", "__metadata__"},
        {"missing_data_offsets", RAW_NONE, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
         TD_ERR_FORMAT, "missing \"data_offsets\"", "\"w\""},
        {"missing_dtype", RAW_NONE, "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         TD_ERR_FORMAT, "missing \"dtype\"", "\"w\""},
        {"extra_key", RAW_NONE,
         "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}", 1,
         TD_ERR_FORMAT, "unknown key \"foo\"", "\"w\""},
    };
    const char *dir = mkdir_fresh("malformed");
    char deep[400];
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        uint8_t *b = NULL;
        size_t len = 0;
        switch (cases[i].raw) {
        case RAW_NONE: b = image(cases[i].json, strlen(cases[i].json), cases[i].dlen, &len); break;
        case RAW_EMPTY: b = image("", 0, 0, &len); len = 0; break;
        case RAW_SHORT: b = image("{}", 2, 0, &len); len = 5; break;
        case RAW_LEN0: b = image("", 0, 4, &len); break;
        case RAW_LEN1: b = image("{", 1, 0, &len); break;
        case RAW_PAST:
            b = image("{}", 2, 0, &len);
            b[0] = 200; /* says 200 bytes, 2 follow */
            break;
        case RAW_HUGE:
            b = image("{}", 2, 0, &len);
            b[5] = 1; /* 2^40 + 2 */
            break;
        case RAW_SPACES: b = image("        ", 8, 0, &len); break;
        case RAW_DEEP: {
            size_t n = 0;
            n += (size_t)sprintf(deep, "{\"a\":");
            for (int k = 0; k < 100; k++) deep[n++] = '[';
            for (int k = 0; k < 100; k++) deep[n++] = ']';
            deep[n++] = '}';
            b = image(deep, n, 0, &len);
            break;
        }
        }
        char fname[128];
        snprintf(fname, sizeof fname, "bad_%02zu_%s.safetensors", i, cases[i].slug);
        const char *path = sub(dir, fname);
        td_test_write(path, b, len);
        td_st_file *f = (td_st_file *)&f;
        td_err err;
        td_status st = td_st_file_open(path, &f, &err);
        if (st != cases[i].code || !strstr(err.msg, fname) || !strstr(err.msg, cases[i].needle) ||
            (cases[i].tensor && !strstr(err.msg, cases[i].tensor)))
            fail_msg("%s: status %d (%s), msg '%s'", fname, st, td_status_str(st), err.msg);
        assert_null(f);
        /* the in-memory parser gives the same verdict and leaves the header empty */
        td_st_header h;
        assert_int_equal(td_st_parse_header(b, len, fname, &h, &err), cases[i].code);
        assert_int_equal(h.n, 0);
        assert_null(h.tensors);
        assert_null(h.meta_keys);
        free(b);
    }
    /* not a regular file, and a missing file */
    td_st_file *f;
    td_err err;
    assert_int_equal(td_st_file_open(dir, &f, &err), TD_ERR_IO);
    assert_msg_has(&err, "not a regular file", "dir");
    assert_int_equal(td_st_file_open(sub(dir, "absent.safetensors"), &f, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "absent.safetensors", "absent");
}

static void st_nan_bytes_parse_unchanged(void **state)
{
    (void)state;
    tt t[3];
    int64_t s[2] = {4, 4};
    tt_make(&t[0], "nan.f32", TD_F32, 2, s, 1);
    memset(t[0].data, 0xff, t[0].nbytes); /* all quiet NaN with payload */
    tt_make(&t[1], "inf.f16", TD_F16, 2, s, 2);
    for (size_t i = 0; i < t[1].nbytes; i += 2) {
        t[1].data[i] = 0x00;
        t[1].data[i + 1] = (i & 2) ? 0x7c : 0xfe; /* +inf and NaN */
    }
    tt_make(&t[2], "nan.e4m3", TD_F8_E4M3, 2, s, 3);
    memset(t[2].data, 0x7f, t[2].nbytes);
    const char *path = td_test_path("nan.safetensors");
    td_err err;
    assert_int_equal(write_tt(path, t, 3, false, &err), TD_OK);
    td_st_file *f;
    if (td_st_file_open(path, &f, &err) != TD_OK) fail_msg("%s", err.msg);
    check_tt(f, t, 3);
    td_st_file_close(f);
    tt_free(t, 3);
}

/* ---- index and sharded sets --------------------------------------------------------------- */

static void st_index_malformed_rejected(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        td_status code;
        const char *needle, *tensor;
    } cases[] = {
        {"", TD_ERR_FORMAT, "empty", NULL},
        {"{\"weight_map\": {", TD_ERR_FORMAT, "syntax", NULL},
        {"[]", TD_ERR_FORMAT, "must be a JSON object", NULL},
        {"{\"metadata\": {\"total_size\": 1}}", TD_ERR_FORMAT, "missing \"weight_map\"", NULL},
        {"{\"weight_map\": [\"a\"]}", TD_ERR_FORMAT, "must be an object", NULL},
        {"{\"weight_map\": {}}", TD_ERR_FORMAT, "weight_map is empty", NULL},
        {"{\"weight_map\": {\"w\": 3}}", TD_ERR_FORMAT, "found a number", "\"w\""},
        {"{\"weight_map\": {\"w\": \"../x.safetensors\"}}", TD_ERR_FORMAT, "path separator", "\"w\""},
        {"{\"weight_map\": {\"w\": \"..x.safetensors\"}}", TD_ERR_FORMAT, "\"..\"", "\"w\""},
        {"{\"weight_map\": {\"w\": \"sub/x.safetensors\"}}", TD_ERR_FORMAT, "separator", "\"w\""},
        {"{\"weight_map\": {\"w\": \"/abs.safetensors\"}}", TD_ERR_FORMAT, "separator", "\"w\""},
        {"{\"weight_map\": {\"w\": \"\"}}", TD_ERR_FORMAT, "is empty", "\"w\""},
        {"{\"weight_map\": {\"w\": \"x.bin\"}}", TD_ERR_FORMAT, ".safetensors", "\"w\""},
        {"{\"weight_map\": {\"w\": \".safetensors\"}}", TD_ERR_FORMAT, "non-empty stem", "\"w\""},
        {"{\"weight_map\": {\"w\": \"a\\nb.safetensors\"}}", TD_ERR_FORMAT, "control", "\"w\""},
        {"{\"weight_map\": {\"w\\u0000x\": \"a.safetensors\"}}", TD_ERR_FORMAT, "\\u0000", NULL},
        {"{\"weight_map\": {\"w\": \"a.safetensors\", \"w\": \"b.safetensors\"}}", TD_ERR_FORMAT,
         "duplicate key", "\"w\""},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        td_st_index idx;
        td_err err;
        td_status st = td_st_index_parse(cases[i].text, strlen(cases[i].text), "idx.json", &idx,
                                         &err);
        if (st != cases[i].code || !strstr(err.msg, "idx.json") ||
            !strstr(err.msg, cases[i].needle) ||
            (cases[i].tensor && !strstr(err.msg, cases[i].tensor)))
            fail_msg("index case %zu: status %d msg '%s'", i, st, err.msg);
        assert_int_equal(idx.n, 0);
        assert_null(idx.names);
        assert_null(idx.shard_files);
        td_st_index_free(&idx);
    }
    td_st_index_free(NULL);
}

static void st_index_valid_sorted_deduplicated(void **state)
{
    (void)state;
    const char *text =
        "{\"metadata\": {\"total_size\": 123.5, \"x\": [1, -2]}, \"extra\": null,\n"
        " \"weight_map\": {\"z.w\": \"model-00002-of-00002.safetensors\",\n"
        "                \"a.w\": \"model-00001-of-00002.safetensors\",\n"
        "                \"m.w_scale\": \"model-00002-of-00002.safetensors\"}}\n";
    td_st_index idx;
    td_err err;
    if (td_st_index_parse(text, strlen(text), "idx.json", &idx, &err) != TD_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(idx.n, 3);
    assert_string_equal(idx.names[0], "a.w");
    assert_string_equal(idx.names[1], "m.w_scale");
    assert_string_equal(idx.names[2], "z.w");
    assert_int_equal(idx.n_shards, 2);
    assert_string_equal(idx.shard_files[0], "model-00001-of-00002.safetensors");
    assert_string_equal(idx.shard_files[1], "model-00002-of-00002.safetensors");
    assert_ptr_equal(idx.shards[0], idx.shard_files[0]);
    assert_ptr_equal(idx.shards[1], idx.shard_files[1]);
    assert_ptr_equal(idx.shards[2], idx.shard_files[1]);
    td_st_index_free(&idx);
    assert_int_equal(idx.n, 0);
}

/* dir/NAME holding tensors t[0..n) (no metadata). */
static void write_shard(const char *dir, const char *name, const tt *t, size_t n)
{
    td_err err;
    if (write_tt(sub(dir, name), t, n, false, &err) != TD_OK) fail_msg("%s", err.msg);
}

#define SH1 "model-00001-of-00002.safetensors"
#define SH2 "model-00002-of-00002.safetensors"

/* A two-shard checkpoint: a.w, a.w_scale (shard 1); b.w, b.w_scale (shard 2). */
static const char *make_sharded(const char *name, tt t[4])
{
    const char *dir = mkdir_fresh(name);
    int64_t s[2] = {4, 8}, ss[2] = {4, 1};
    tt_make(&t[0], "a.w", TD_U8, 2, s, 11);
    tt_make(&t[1], "a.w_scale", TD_F8_E4M3, 2, ss, 12);
    tt_make(&t[2], "b.w", TD_BF16, 2, s, 13);
    tt_make(&t[3], "b.w_scale", TD_F32, 2, ss, 14);
    write_shard(dir, SH1, t, 2);
    write_shard(dir, SH2, t + 2, 2);
    td_test_write_str(sub(dir, "model.safetensors.index.json"),
                      "{\"metadata\": {\"total_size\": 1},\n \"weight_map\": {\n"
                      "  \"b.w\": \"" SH2 "\", \"a.w\": \"" SH1 "\",\n"
                      "  \"b.w_scale\": \"" SH2 "\", \"a.w_scale\": \"" SH1 "\"}}\n");
    return dir;
}

static void st_set_sharded_roundtrip_lazy(void **state)
{
    (void)state;
    tt t[4];
    const char *dir = make_sharded("sharded", t);
    td_st_set *s;
    td_err err;
    if (td_st_set_open(dir, &s, &err) != TD_OK) fail_msg("%s", err.msg);
    assert_int_equal(td_st_set_count(s), 4);
    assert_string_equal(td_st_set_name(s, 0), "a.w");
    assert_string_equal(td_st_set_name(s, 3), "b.w_scale");
    assert_true(td_st_set_has(s, "b.w"));
    assert_false(td_st_set_has(s, "c.w"));
    assert_int_equal(td_st_set_shard_count(s), 2);
    assert_string_equal(td_st_set_shard_name(s, 0), SH1);
    assert_string_equal(td_st_set_shard_name(s, 1), SH2);
    /* Lazy opening: remove shard 2 now. Tensors of shard 1 still resolve; shard 2 was never
     * mapped, so its tensors now report the missing shard, naming it and the directory. */
    assert_int_equal(unlink(sub(dir, SH2)), 0);
    const td_st_info *info;
    const char *shard;
    if (td_st_set_info(s, "a.w_scale", &info, &shard, &err) != TD_OK) fail_msg("%s", err.msg);
    assert_string_equal(shard, SH1);
    assert_int_equal(info->dtype, TD_F8_E4M3);
    td_tensor v;
    assert_int_equal(td_st_set_tensor(s, "a.w", &v, &err), TD_OK);
    assert_memory_equal(v.data, t[0].data, t[0].nbytes);
    assert_int_equal(td_st_set_tensor(s, "b.w", &v, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, SH2, "missing shard");
    assert_msg_has(&err, dir, "missing shard dir");
    assert_int_equal(td_st_set_validate(s, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, SH2, "validate missing shard");
    /* shard back: the same set object now opens it */
    write_shard(dir, SH2, t + 2, 2);
    assert_int_equal(td_st_set_tensor(s, "b.w", &v, &err), TD_OK);
    assert_memory_equal(v.data, t[2].data, t[2].nbytes);
    assert_int_equal(td_st_set_info(s, "b.w_scale", NULL, &shard, &err), TD_OK);
    assert_string_equal(shard, SH2);
    if (td_st_set_validate(s, &err) != TD_OK) fail_msg("%s", err.msg);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(td_st_set_tensor(s, t[i].name, &v, &err), TD_OK);
        assert_int_equal(v.dtype, t[i].dtype);
        assert_memory_equal(v.data, t[i].data, t[i].nbytes);
    }
    assert_int_equal(td_st_set_tensor(s, "c.w", &v, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "\"c.w\"", "absent");
    assert_msg_has(&err, "model.safetensors.index.json", "absent");
    td_st_set_close(s);
    td_st_set_close(NULL);
    tt_free(t, 4);
}

static void st_set_inconsistent_index_reported(void **state)
{
    (void)state;
    tt t[4], x;
    int64_t s1[1] = {2};
    tt_make(&x, "extra.w", TD_U8, 1, s1, 21);
    td_st_set *s;
    td_err err;
    td_tensor v;

    /* index names a shard that lacks the tensor */
    const char *dir = make_sharded("lacks", t);
    write_shard(dir, SH2, t + 2, 1); /* shard 2 without b.w_scale */
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_OK);
    assert_int_equal(td_st_set_tensor(s, "b.w_scale", &v, &err), TD_ERR_FORMAT);
    assert_msg_has(&err, "index says tensor \"b.w_scale\" is in shard " SH2, "lacks");
    assert_msg_has(&err, "does not contain it", "lacks");
    assert_int_equal(td_st_set_validate(s, &err), TD_ERR_FORMAT);
    assert_msg_has(&err, "\"b.w_scale\"", "lacks validate");
    td_st_set_close(s);
    tt_free(t, 4);

    /* a tensor present in a shard but absent from the index */
    dir = make_sharded("unlisted", t);
    tt with[3] = {t[2], t[3], x};
    write_shard(dir, SH2, with, 3);
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_OK);
    assert_int_equal(td_st_set_validate(s, &err), TD_ERR_FORMAT);
    assert_msg_has(&err, "tensor \"extra.w\" is in shard " SH2, "unlisted");
    assert_msg_has(&err, "does not list it", "unlisted");
    assert_false(td_st_set_has(s, "extra.w"));
    td_st_set_close(s);

    /* a tensor stored in both shards: the copy the index does not point at is reported */
    tt dup[3] = {t[0], t[1], t[2]};
    write_shard(dir, SH1, dup, 3);
    write_shard(dir, SH2, t + 2, 2);
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_OK);
    assert_int_equal(td_st_set_validate(s, &err), TD_ERR_FORMAT);
    assert_msg_has(&err, "tensor \"b.w\" is in shard " SH1 " but the index assigns it to " SH2,
                   "dup");
    td_st_set_close(s);

    /* a malformed shard is reported with the shard's path */
    td_test_write_str(sub(dir, SH2), "garbage!");
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_OK);
    assert_int_equal(td_st_set_tensor(s, "a.w", &v, &err), TD_OK);
    assert_int_equal(td_st_set_tensor(s, "b.w", &v, &err), TD_ERR_RANGE);
    assert_msg_has(&err, SH2, "bad shard");
    assert_msg_has(&err, "header length", "bad shard");
    td_st_set_close(s);

    /* index problems surface at open, naming the index file */
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"weight_map\": ", "syntax"},
        {"{\"metadata\": {}}", "missing \"weight_map\""},
        {"{\"weight_map\": {\"a.w\": \"../" SH1 "\"}}", "path separator"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        td_test_write_str(sub(dir, "model.safetensors.index.json"), bad[i].text);
        s = (td_st_set *)&s;
        assert_int_equal(td_st_set_open(dir, &s, &err), TD_ERR_FORMAT);
        assert_null(s);
        assert_msg_has(&err, "model.safetensors.index.json", bad[i].text);
        assert_msg_has(&err, bad[i].needle, bad[i].text);
    }
    /* an index naming a shard that does not exist */
    td_test_write_str(sub(dir, "model.safetensors.index.json"),
                      "{\"weight_map\": {\"a.w\": \"" SH1 "\", \"q.w\": \"model-gone.safetensors\"}}");
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_OK);
    assert_int_equal(td_st_set_tensor(s, "q.w", &v, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "shard \"model-gone.safetensors\"", "gone");
    assert_msg_has(&err, dir, "gone");
    td_st_set_close(s);
    tt_free(t, 4);
    tt_free(&x, 1);
}

static void st_set_single_file_and_missing_files(void **state)
{
    (void)state;
    td_st_set *s;
    td_err err;
    /* neither model.safetensors nor an index */
    const char *dir = mkdir_fresh("nothing");
    td_test_write_str(sub(dir, "config.json"), "{}");
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, dir, "nothing");
    assert_msg_has(&err, "model.safetensors", "nothing");
    assert_int_equal(td_st_set_open(sub(dir, "no-such-dir"), &s, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "no-such-dir", "no dir");
    assert_int_equal(td_st_set_open(sub(dir, "config.json"), &s, &err), TD_ERR_ARG);
    assert_msg_has(&err, "not a directory", "file as dir");

    /* single file */
    dir = mkdir_fresh("single");
    tt t[2];
    int64_t sh[1] = {5};
    tt_make(&t[0], "w2", TD_I32, 1, sh, 1);
    tt_make(&t[1], "w1", TD_U8, 0, NULL, 2);
    write_shard(dir, "model.safetensors", t, 2);
    if (td_st_set_open(dir, &s, &err) != TD_OK) fail_msg("%s", err.msg);
    assert_int_equal(td_st_set_count(s), 2);
    assert_string_equal(td_st_set_name(s, 0), "w1");
    assert_string_equal(td_st_set_name(s, 1), "w2");
    assert_int_equal(td_st_set_shard_count(s), 1);
    assert_string_equal(td_st_set_shard_name(s, 0), "model.safetensors");
    assert_true(td_st_set_has(s, "w2"));
    const char *shard;
    const td_st_info *info;
    assert_int_equal(td_st_set_info(s, "w2", &info, &shard, &err), TD_OK);
    assert_string_equal(shard, "model.safetensors");
    assert_int_equal(info->shape[0], 5);
    td_tensor v;
    assert_int_equal(td_st_set_tensor(s, "w2", &v, &err), TD_OK);
    assert_memory_equal(v.data, t[0].data, t[0].nbytes);
    assert_int_equal(td_st_set_tensor(s, "w3", &v, &err), TD_ERR_NOTFOUND);
    assert_msg_has(&err, "model.safetensors", "w3");
    assert_msg_has(&err, "\"w3\"", "w3");
    assert_int_equal(td_st_set_validate(s, &err), TD_OK);
    td_st_set_close(s);
    /* a broken single file fails at open, naming it */
    td_test_write_str(sub(dir, "model.safetensors"), "\x02\0\0\0\0\0\0\0{]");
    assert_int_equal(td_st_set_open(dir, &s, &err), TD_ERR_FORMAT);
    assert_msg_has(&err, "model.safetensors", "broken single");
    tt_free(t, 2);
}

/* ---- optional cross-check against the public implementation ------------------------------- */

static void sha_hex(const void *p, size_t n, char hex[TD_SHA256_HEX_LEN])
{
    uint8_t d[TD_SHA256_DIGEST_LEN];
    td_sha256(p, n, d);
    td_sha256_hex(d, hex);
}

static cJSON *manifest_entry(const char *file, const tt *t, size_t n, bool with_meta)
{
    cJSON *e = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "file", file);
    for (size_t i = 0; with_meta && i < TD_ARRAY_LEN(meta_k); i++)
        cJSON_AddStringToObject(m, meta_k[i], meta_v[i]);
    cJSON_AddItemToObject(e, "metadata", m);
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "name", t[i].name);
        cJSON_AddStringToObject(o, "dtype", td_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        char hex[TD_SHA256_HEX_LEN];
        sha_hex(t[i].data, t[i].nbytes, hex);
        cJSON_AddStringToObject(o, "sha256", hex);
        cJSON_AddItemToArray(ts, o);
    }
    cJSON_AddItemToObject(e, "tensors", ts);
    return e;
}

/* Verify every file listed in DIR/py/manifest.json (written by scripts/st_crosscheck.py). */
static void verify_py_manifest(const char *pydir)
{
    cJSON *root;
    td_err err;
    if (td_json_read_file(sub(pydir, "manifest.json"), 64u << 20, &root, &err) != TD_OK)
        fail_msg("%s", err.msg);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    assert_true(cJSON_IsArray(files));
    size_t nfiles = 0, ntensors = 0;
    for (const cJSON *e = files->child; e; e = e->next) {
        const char *fname;
        assert_int_equal(td_json_get_str(e, "file", "manifest", &fname, &err), TD_OK);
        td_st_file *f;
        if (td_st_file_open(sub(pydir, fname), &f, &err) != TD_OK)
            fail_msg("public-library file rejected: %s", err.msg);
        const td_st_header *h = td_st_file_header(f);
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "tensors");
        assert_int_equal((size_t)cJSON_GetArraySize(ts), h->n);
        for (const cJSON *o = ts->child; o; o = o->next) {
            const char *name, *dt, *sha;
            assert_int_equal(td_json_get_str(o, "name", fname, &name, &err), TD_OK);
            assert_int_equal(td_json_get_str(o, "dtype", fname, &dt, &err), TD_OK);
            assert_int_equal(td_json_get_str(o, "sha256", fname, &sha, &err), TD_OK);
            td_tensor v;
            if (td_st_file_tensor(f, name, &v, &err) != TD_OK) fail_msg("%s", err.msg);
            if (strcmp(td_dtype_name(v.dtype), dt) != 0)
                fail_msg("%s/%s: dtype %s, library says %s", fname, name, td_dtype_name(v.dtype), dt);
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
            assert_int_equal(cJSON_GetArraySize(sh), v.ndim);
            int d = 0;
            for (const cJSON *x = sh->child; x; x = x->next, d++)
                if ((double)v.shape[d] != x->valuedouble)
                    fail_msg("%s/%s: shape mismatch in dim %d", fname, name, d);
            const td_st_info *info = td_st_header_find(h, name);
            char hex[TD_SHA256_HEX_LEN];
            sha_hex(v.data, (size_t)(info->end - info->begin), hex);
            if (strcmp(hex, sha) != 0) fail_msg("%s/%s: bytes differ (sha256)", fname, name);
            ntensors++;
        }
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "metadata");
        size_t nm = 0;
        for (const cJSON *k = m ? m->child : NULL; k; k = k->next, nm++) {
            const char *got = td_st_header_meta(h, k->string);
            if (!got || !cJSON_IsString(k) || strcmp(got, k->valuestring) != 0)
                fail_msg("%s: metadata \"%s\" differs", fname, k->string);
        }
        assert_int_equal(nm, h->n_meta);
        td_st_file_close(f);
        nfiles++;
    }
    cJSON_Delete(root);
    print_message("cross-check: %zu public-library files, %zu tensors verified\n", nfiles, ntensors);
}

static void st_crosscheck_dir_when_requested(void **state)
{
    (void)state;
    const char *base = getenv("TD_ST_CROSSCHECK_DIR");
    if (!base || !*base) skip();
    mkdir(base, 0777);
    char cdir[1024];
    snprintf(cdir, sizeof cdir, "%s/c", base);
    mkdir(cdir, 0777);
    td_err err;
    tt common[64], newer[16], one[1];
    size_t nc = tt_all(common, 64, false), nn = tt_all(newer, 16, true);
    int64_t s[1] = {3};
    tt_make(&one[0], "only", TD_F32, 1, s, 1);
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
    assert_int_equal(write_tt(sub(cdir, "common.safetensors"), common, nc, true, &err), TD_OK);
    cJSON_AddItemToArray(files, manifest_entry("common.safetensors", common, nc, true));
    assert_int_equal(write_tt(sub(cdir, "newer_dtypes.safetensors"), newer, nn, false, &err), TD_OK);
    cJSON_AddItemToArray(files, manifest_entry("newer_dtypes.safetensors", newer, nn, false));
    assert_int_equal(write_tt(sub(cdir, "meta_only.safetensors"), NULL, 0, true, &err), TD_OK);
    cJSON_AddItemToArray(files, manifest_entry("meta_only.safetensors", NULL, 0, true));
    assert_int_equal(write_tt(sub(cdir, "empty.safetensors"), NULL, 0, false, &err), TD_OK);
    cJSON_AddItemToArray(files, manifest_entry("empty.safetensors", NULL, 0, false));
    assert_int_equal(write_tt(sub(cdir, "one.safetensors"), one, 1, false, &err), TD_OK);
    cJSON_AddItemToArray(files, manifest_entry("one.safetensors", one, 1, false));
    cJSON_AddItemToObject(root, "files", files);
    char *text = cJSON_Print(root);
    td_test_write_str(sub(cdir, "manifest.json"), text);
    free(text);
    cJSON_Delete(root);
    tt_free(common, nc);
    tt_free(newer, nn);
    tt_free(one, 1);
    print_message("cross-check: wrote %s/c (run scripts/st_crosscheck.py %s)\n", base, base);
    char pydir[1024];
    snprintf(pydir, sizeof pydir, "%s/py", base);
    if (exists(sub(pydir, "manifest.json"))) verify_py_manifest(pydir);
    else print_message("cross-check: no %s/manifest.json yet\n", pydir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(st_roundtrip_every_dtype_matches),
        cmocka_unit_test(st_writer_same_inputs_byte_identical),
        cmocka_unit_test(st_writer_layout_padded_sorted_declaration_order),
        cmocka_unit_test(st_writer_bad_calls_rejected),
        cmocka_unit_test(st_writer_failure_leaves_no_files),
        cmocka_unit_test(st_header_valid_edge_cases_accepted),
        cmocka_unit_test(st_malformed_corpus_clear_errors),
        cmocka_unit_test(st_nan_bytes_parse_unchanged),
        cmocka_unit_test(st_index_malformed_rejected),
        cmocka_unit_test(st_index_valid_sorted_deduplicated),
        cmocka_unit_test(st_set_sharded_roundtrip_lazy),
        cmocka_unit_test(st_set_inconsistent_index_reported),
        cmocka_unit_test(st_set_single_file_and_missing_files),
        cmocka_unit_test(st_crosscheck_dir_when_requested),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
