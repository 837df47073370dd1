/* scale_audit.c — Part 2 of `tandem audit e4m3`: the scale-storage audit (see scale_audit.h).
 *
 * Flow: open the checkpoint (config, quantization metadata, tensors) → list the selected NVFP4
 * modules per layer → for each layer: resolve every block-scale view and global on this thread
 * (td_st_set is not thread-safe), let worker threads audit the tensors (census, per-check
 * counts, first offenders, per rank slice), then compute stages, global-slot layout checks and
 * sibling findings here, and hand the layer to the sink.
 */
#include "scale_audit.h"
#include "config.h"
#include "progress.h"
#include "quant.h"
#include "safetensors.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------------------------ */

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void td_scale_opts_init(td_scale_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tp = 1;
}

const char *td_scale_finding_kind_name(td_scale_finding_kind k)
{
    switch (k) {
    case TD_SCALE_FIND_SIBLING_GLOBALS: return "sibling_globals";
    case TD_SCALE_FIND_TP_NOT_DIVISIBLE: return "tp_not_divisible";
    case TD_SCALE_FIND_LAYOUT_NA: return "layout_not_applicable";
    case TD_SCALE_FIND_FUSED_EXPERTS: return "fused_experts";
    default: return "unknown";
    }
}

bool td_scale_summary_failed(const td_scale_summary *s)
{
    return s->total.rejected > 0 || s->total.stages_admitted < s->total.stages ||
           s->total.failed_findings > 0;
}

/* Last dotted component of a module name. */
static const char *leaf_of(const char *module)
{
    const char *d = strrchr(module, '.');
    return d ? d + 1 : module;
}

static bool is_row_parallel(const char *module)
{
    const char *l = leaf_of(module);
    return !strcmp(l, "down_proj") || !strcmp(l, "o_proj") || !strcmp(l, "out_proj");
}

/* Copy a string, truncating to cap - 1 bytes. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static bool in_list(const int64_t *v, size_t n, int64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x) return true;
    return false;
}

/* ---- census and counts -------------------------------------------------------------------- */

static void counts_init(td_scale_counts *c)
{
    memset(c, 0, sizeof *c);
    c->reason = TD_SCALE_OK;
    c->first.row = c->first.col = -1;
    c->first_any.row = c->first_any.col = -1;
}

/* The highest-precedence reason present (TD_SCALE_OK when nothing was rejected). */
static void counts_pick_reason(td_scale_counts *c)
{
    c->reason = TD_SCALE_OK;
    for (int r = 1; r < TD_SCALE_REASON_COUNT; r++)
        if (c->by_reason[r]) {
            c->reason = (td_scale_reason)r;
            return;
        }
}

static void census_init(td_scale_census *c)
{
    memset(c, 0, sizeof *c);
    c->code_min = c->code_max = -1;
    c->prep_min = c->prep_max = NAN;
}

static void counts_add(td_scale_counts *c, const td_recon_eval *ev, int64_t n)
{
    c->elements += n;
    if (!ev->strict_ok) c->strict_mismatch += n;
    if (!ev->fast_ok) c->fast_mismatch += n;
    if (!ev->finite_ok) c->nonfinite += n;
    if (!ev->range_ok) c->out_of_range += n;
    if (!ev->admit) {
        c->rejected += n;
        c->by_reason[ev->reason] += n;
    }
}

static void first_set(td_scale_first *f, int64_t row, int64_t col, const td_recon_eval *ev)
{
    if (f->row >= 0) return;
    f->row = row;
    f->col = col;
    f->ev = *ev;
}

static void census_add(td_scale_census *c, const td_recon_eval *ev, int64_t n)
{
    uint8_t code = ev->code;
    c->hist[code] += n;
    if (td_e4m3_is_nan(code)) c->nan += n;
    else if (code & 0x80) c->negative += n;
    else if (code == 0) c->zero += n;
    else if (code < 8) c->subnormal += n;
    uint16_t p = ev->prepared, a = (uint16_t)(p & 0x7FFF);
    if (td_f16_is_nan(p)) c->prep_nan += n;
    else if (a == TD_F16_INF) c->prep_inf += n;
    else if (a == 0) c->prep_zero += n;
    else {
        if (a < TD_F16_MIN_NORMAL) c->prep_subnormal += n;
        float v = (float)td_f16_value(a);
        if (isnan(c->prep_min) || v < c->prep_min) c->prep_min = v;
        if (isnan(c->prep_max) || v > c->prep_max) c->prep_max = v;
    }
}

static void census_finish(td_scale_census *c)
{
    for (int code = 0; code < 256; code++) {
        if (!c->hist[code]) continue;
        if (c->code_min < 0) c->code_min = code;
        c->code_max = code;
        c->distinct++;
    }
}

/* ---- one tensor (worker) ------------------------------------------------------------------- */

typedef struct job {
    td_scale_tensor *t;
    int fd;                /* shard holding the block scales; -1 when set-up failed */
    int64_t offset;        /* file offset of the [rows, cols] scale bytes */
} job;

/* Read len bytes at offset (pread, restarted on EINTR and short reads). */
static bool read_at(int fd, int64_t offset, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= (size_t)n;
        offset += n;
    }
    return true;
}

/* A worker's scale buffer: the one tensor it holds at a time. */
typedef struct scratch {
    uint8_t *buf;
    size_t cap;
} scratch;

/* The scale bytes of a job in s->buf; NULL (and the tensor marked) when they cannot be read. */
static const uint8_t *load_scales(job *j, scratch *s)
{
    td_scale_tensor *t = j->t;
    size_t len = (size_t)(t->rows * t->cols);
    if (len > s->cap) {
        uint8_t *b = realloc(s->buf, len);
        if (!b) {
            t->status = TD_ERR_NOMEM;
            snprintf(t->error, sizeof t->error, "out of memory reading %zu bytes", len);
            return NULL;
        }
        s->buf = b;
        s->cap = len;
    }
    if (len && !read_at(j->fd, j->offset, s->buf, len)) {
        t->status = TD_ERR_IO;
        snprintf(t->error, sizeof t->error, "cannot read the block scales (%zu bytes at offset %lld)", len,
                 (long long)j->offset);
        return NULL;
    }
    return s->buf;
}

/* Rank of element (row, col) for a tensor with n_ranks slices. */
static int rank_of(const td_scale_tensor *t, int64_t row, int64_t col)
{
    if (t->n_ranks <= 1) return 0;
    if (t->row_parallel) return (int)(col / (t->cols / t->n_ranks));
    return (int)(row / (t->rows / t->n_ranks));
}

/* First element of rank slice `rank` (or the whole tensor when rank < 0), in row-major order,
 * that the table rejects, with reason `reason` (TD_SCALE_OK: any reason). */
static void find_first(const td_scale_tensor *t, const uint8_t *data, const td_recon_eval *ev,
                       int rank, td_scale_reason reason, td_scale_first *f)
{
    int64_t r0 = 0, r1 = t->rows, c0 = 0, c1 = t->cols;
    if (rank >= 0 && t->n_ranks > 1) {
        if (t->row_parallel) {
            int64_t w = t->cols / t->n_ranks;
            c0 = rank * w;
            c1 = c0 + w;
        } else {
            int64_t h = t->rows / t->n_ranks;
            r0 = rank * h;
            r1 = r0 + h;
        }
    }
    bool bad[256];
    for (int code = 0; code < 256; code++)
        bad[code] = !ev[code].admit && (reason == TD_SCALE_OK || ev[code].reason == reason);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = data + r * t->cols;
        for (int64_t col = c0; col < c1; col++)
            if (bad[p[col]]) {
                first_set(f, r, col, &ev[p[col]]);
                return;
            }
    }
}

/* Reason, first element of that reason and first element of any reason of a slice. */
static void finish_slice(const td_scale_tensor *t, const uint8_t *data, const td_recon_eval *ev, int rank,
                         td_scale_counts *c)
{
    counts_pick_reason(c);
    if (!c->rejected) return;
    find_first(t, data, ev, rank, c->reason, &c->first);
    find_first(t, data, ev, rank, TD_SCALE_OK, &c->first_any);
}

static void audit_tensor_tables(const td_codec *codec, td_scale_tensor *t, const uint8_t *data)
{
    td_recon_eval ev[256];
    for (int code = 0; code < 256; code++) td_recon_eval_code(codec, (uint8_t)code, &t->gl, &t->gl, &ev[code]);
    int nr = t->n_ranks > 0 ? t->n_ranks : 1;
    int64_t hist[TD_SCALE_MAX_TP][256];
    memset(hist, 0, sizeof(int64_t) * 256 * (size_t)nr);
    for (int64_t r = 0; r < t->rows; r++) {
        const uint8_t *p = data + r * t->cols;
        if (nr == 1 || !t->row_parallel) {
            int64_t *h = hist[nr == 1 ? 0 : rank_of(t, r, 0)];
            for (int64_t col = 0; col < t->cols; col++) h[p[col]]++;
        } else {
            int64_t w = t->cols / nr;
            for (int k = 0; k < nr; k++) {
                int64_t *h = hist[k];
                for (int64_t col = k * w; col < (k + 1) * w; col++) h[p[col]]++;
            }
        }
    }
    int64_t whole[256] = {0};
    for (int k = 0; k < nr; k++)
        for (int code = 0; code < 256; code++) whole[code] += hist[k][code];
    for (int code = 0; code < 256; code++) {
        if (!whole[code]) continue;
        census_add(&t->census, &ev[code], whole[code]);
        counts_add(&t->all, &ev[code], whole[code]);
    }
    finish_slice(t, data, ev, -1, &t->all);
    if (t->n_ranks > 1) {
        for (int k = 0; k < nr; k++) {
            for (int code = 0; code < 256; code++)
                if (hist[k][code]) counts_add(&t->ranks[k], &ev[code], hist[k][code]);
            finish_slice(t, data, ev, k, &t->ranks[k]);
        }
    }
}

/* First rejected element per reason of one slice, for the element-by-element mode. */
typedef struct slice_firsts {
    td_scale_first by_reason[TD_SCALE_REASON_COUNT];
} slice_firsts;

static void slice_firsts_init(slice_firsts *s)
{
    for (int r = 0; r < TD_SCALE_REASON_COUNT; r++) s->by_reason[r].row = s->by_reason[r].col = -1;
}

static void slice_firsts_apply(const slice_firsts *s, td_scale_counts *c)
{
    counts_pick_reason(c);
    if (!c->rejected) return;
    c->first = s->by_reason[c->reason];
    for (int r = 1; r < TD_SCALE_REASON_COUNT; r++) {
        const td_scale_first *f = &s->by_reason[r];
        if (f->row < 0) continue;
        if (c->first_any.row < 0 || f->row < c->first_any.row ||
            (f->row == c->first_any.row && f->col < c->first_any.col))
            c->first_any = *f;
    }
}

static void audit_tensor_elementwise(const td_codec *codec, td_scale_tensor *t, const uint8_t *data)
{
    slice_firsts whole, ranks[TD_SCALE_MAX_TP];
    slice_firsts_init(&whole);
    for (int k = 0; k < TD_SCALE_MAX_TP; k++) slice_firsts_init(&ranks[k]);
    for (int64_t r = 0; r < t->rows; r++) {
        const uint8_t *p = data + r * t->cols;
        for (int64_t col = 0; col < t->cols; col++) {
            td_recon_eval ev;
            td_recon_eval_code(codec, p[col], &t->gl, &t->gl, &ev);
            census_add(&t->census, &ev, 1);
            counts_add(&t->all, &ev, 1);
            if (!ev.admit) first_set(&whole.by_reason[ev.reason], r, col, &ev);
            if (t->n_ranks > 1) {
                int k = rank_of(t, r, col);
                counts_add(&t->ranks[k], &ev, 1);
                if (!ev.admit) first_set(&ranks[k].by_reason[ev.reason], r, col, &ev);
            }
        }
    }
    slice_firsts_apply(&whole, &t->all);
    for (int k = 0; t->n_ranks > 1 && k < t->n_ranks; k++) slice_firsts_apply(&ranks[k], &t->ranks[k]);
}

static void audit_tensor(const td_codec *codec, bool elementwise, job *j, scratch *s)
{
    td_scale_tensor *t = j->t;
    if (t->status != TD_OK) return;
    const uint8_t *data = load_scales(j, s);
    if (!data) return;
    if (elementwise) audit_tensor_elementwise(codec, t, data);
    else audit_tensor_tables(codec, t, data);
    census_finish(&t->census);
    if (t->n_ranks == 1) t->ranks[0] = t->all;
    t->admit = t->all.rejected == 0;
}

/* ---- worker pool ------------------------------------------------------------------------- */

typedef struct pool {
    const td_codec *codec;
    bool elementwise;
    job *jobs;
    size_t n;
    atomic_size_t next;
    atomic_size_t done;
} pool;

static void *pool_worker(void *arg)
{
    pool *p = arg;
    scratch s = {NULL, 0};
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        audit_tensor(p->codec, p->elementwise, &p->jobs[i], &s);
        atomic_fetch_add(&p->done, 1);
    }
    free(s.buf);
    return NULL;
}

static td_status pool_run(pool *p, int threads, td_progress *prog, uint64_t done_before, td_err *err)
{
    if (threads > (int)p->n) threads = (int)p->n;
    if (threads <= 1) {
        scratch s = {NULL, 0};
        for (size_t i = 0; i < p->n; i++) {
            audit_tensor(p->codec, p->elementwise, &p->jobs[i], &s);
            td_progress_update(prog, done_before + i + 1);
        }
        free(s.buf);
        return TD_OK;
    }
    pthread_t tid[TD_SCALE_MAX_THREADS];
    int started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tid[started], NULL, pool_worker, p) != 0) break;
    if (started == 0) return td_err_set(err, TD_ERR_INTERNAL, "audit e4m3: cannot start worker threads");
    if (td_progress_enabled(prog)) {
        while (atomic_load(&p->done) < p->n) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            td_progress_update(prog, done_before + atomic_load(&p->done));
        }
    }
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    return TD_OK;
}

/* ---- checkpoint and selection ----------------------------------------------------------------- */

typedef struct sel_module {
    const td_module *m;
    td_quant_tensors qt;
} sel_module;

typedef struct audit_ctx {
    const td_scale_opts *o;
    const td_codec *codec;
    td_config *cfg;
    td_quant quant;
    bool quant_loaded;
    td_st_set *set;
    td_layout layout;
    bool layout_built;
    sel_module *sel;
    size_t n_sel;
    int threads;
    uint32_t *all_globals;    /* stored global bits over the whole selection */
    size_t n_all_globals, cap_all_globals;
    struct shard_fd {
        char name[256];       /* shard file name */
        int fd;
        int64_t data_off;     /* 8 + header length: where tensor offsets start */
    } *shards;
    size_t n_shards, cap_shards;
} audit_ctx;

static void ctx_free(audit_ctx *a)
{
    for (size_t i = 0; i < a->n_shards; i++) close(a->shards[i].fd);
    free(a->shards);
    free(a->sel);
    free(a->all_globals);
    if (a->layout_built) td_layout_free(&a->layout);
    td_st_set_close(a->set);
    if (a->quant_loaded) td_quant_free(&a->quant);
    free(a->cfg);
}

static td_status ctx_open(audit_ctx *a, td_err *err)
{
    const td_scale_opts *o = a->o;
    a->cfg = calloc(1, sizeof *a->cfg);
    if (!a->cfg) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    td_status st = td_config_load(o->model, a->cfg, err);
    if (st) return st;
    st = td_quant_load(o->model, &a->quant, err);
    if (st) return st;
    a->quant_loaded = true;
    st = td_st_set_open(o->model, &a->set, err);
    if (st) return st;
    st = td_layout_build(a->cfg, td_layout_set_prefix(a->set), &a->layout, err);
    if (st) return st;
    a->layout_built = true;

    for (size_t i = 0; i < o->n_layers; i++)
        if (o->layers[i] < 0 || o->layers[i] >= a->cfg->num_hidden_layers)
            return td_err_set(err, TD_ERR_ARG, "--layers: layer %lld is out of range (the checkpoint "
                              "has %lld layers)", (long long)o->layers[i],
                              (long long)a->cfg->num_hidden_layers);
    for (size_t i = 0; i < o->n_experts; i++)
        if (o->experts[i] < 0 || o->experts[i] >= a->cfg->num_experts)
            return td_err_set(err, TD_ERR_ARG, "--experts: expert %lld is out of range (the "
                              "checkpoint has %lld routed experts)", (long long)o->experts[i],
                              (long long)a->cfg->num_experts);

    a->sel = calloc(a->layout.n ? a->layout.n : 1, sizeof *a->sel);
    if (!a->sel) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    for (size_t i = 0; i < a->layout.n; i++) {
        const td_module *m = &a->layout.mods[i];
        if (m->kind != TD_MOD_LINEAR) continue;
        if (o->n_layers && !in_list(o->layers, o->n_layers, m->layer)) continue;
        if (m->expert >= 0 && o->n_experts && !in_list(o->experts, o->n_experts, m->expert)) continue;
        td_quant_tensors qt;
        st = td_quant_resolve(&a->quant, m->name, true, &qt, err);
        if (st) return st;
        if (qt.scheme != TD_SCHEME_NVFP4 && qt.scheme != TD_SCHEME_NVFP4_CT) continue;
        a->sel[a->n_sel].m = m;
        a->sel[a->n_sel].qt = qt;
        a->n_sel++;
    }
    return TD_OK;
}

/* Open (once) the shard file `shard` and return its entry; the data of its tensors is read
 * with pread, never through a memory map, so memory stays bounded by the tensors being held. */
static struct shard_fd *shard_open(audit_ctx *a, const char *shard, td_err *err)
{
    for (size_t i = 0; i < a->n_shards; i++)
        if (!strcmp(a->shards[i].name, shard)) return &a->shards[i];
    if (a->n_shards == a->cap_shards) {
        size_t cap = a->cap_shards ? 2 * a->cap_shards : 8;
        struct shard_fd *p = realloc(a->shards, cap * sizeof *p);
        if (!p) {
            td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
            return NULL;
        }
        a->shards = p;
        a->cap_shards = cap;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", a->o->model, shard);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    uint8_t h[8];
    if (!read_at(fd, 0, h, 8)) {
        close(fd);
        td_err_set(err, TD_ERR_IO, "%s: cannot read the header length", path);
        return NULL;
    }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | h[k];
    struct shard_fd *e = &a->shards[a->n_shards++];
    copy_str(e->name, sizeof e->name, shard);
    e->fd = fd;
    e->data_off = 8 + (int64_t)n;
    return e;
}

/* Resolve one tensor's metadata, file offsets and global on the calling thread. Problems become
 * the tensor's status and message (input errors), not a failure of the audit. */
static void tensor_setup(audit_ctx *a, const sel_module *s, td_scale_tensor *t, job *j)
{
    const td_module *m = s->m;
    int tp = a->o->tp;
    memset(t, 0, sizeof *t);
    snprintf(t->module, sizeof t->module, "%s", m->name);
    copy_str(t->scale_name, sizeof t->scale_name, s->qt.scale);
    copy_str(t->global_name, sizeof t->global_name, s->qt.global);
    t->layer = m->layer;
    t->expert = m->expert;
    t->proj = m->moe_proj;
    if (m->expert >= 0) snprintf(t->stage, sizeof t->stage, "%s", m->moe_proj == TD_MOE_DOWN ? "w2" : "w13");
    else snprintf(t->stage, sizeof t->stage, "%s", m->name);
    t->row_parallel = is_row_parallel(m->name);
    t->conv = s->qt.scheme == TD_SCHEME_NVFP4_CT ? TD_NVFP4_CT : TD_NVFP4_MODELOPT;
    census_init(&t->census);
    counts_init(&t->all);
    for (int k = 0; k < TD_SCALE_MAX_TP; k++) counts_init(&t->ranks[k]);
    t->status = TD_OK;
    j->t = t;
    j->fd = -1;
    j->offset = 0;

    td_err e;
    td_err_clear(&e);
    int64_t out = m->shape[0], in = m->shape[1];
    const td_st_info *si = NULL, *gi = NULL;
    const char *shard = NULL, *gshard = NULL;
    struct shard_fd *sf, *gf;
    if (in % 16 != 0) {
        t->status = td_err_set(&e, TD_ERR_FORMAT, "%s: in_features %lld is not a multiple of 16",
                               m->name, (long long)in);
        goto fail;
    }
    t->rows = out;
    t->cols = in / 16;
    if (!td_st_set_has(a->set, t->scale_name)) {
        t->status = td_err_set(&e, TD_ERR_NOTFOUND, "block-scale tensor %s is missing", t->scale_name);
        goto fail;
    }
    if (!td_st_set_has(a->set, t->global_name)) {
        t->status = td_err_set(&e, TD_ERR_NOTFOUND, "global-scale tensor %s is missing", t->global_name);
        goto fail;
    }
    t->status = td_st_set_info(a->set, t->scale_name, &si, &shard, &e);
    if (t->status) goto fail;
    if (si->dtype != TD_F8_E4M3 || si->ndim != 2 || si->shape[0] != t->rows || si->shape[1] != t->cols) {
        char got[96];
        td_shape_str(si->ndim, si->shape, got, sizeof got);
        t->status = td_err_set(&e, TD_ERR_FORMAT, "%s: %s %s, expected F8_E4M3 [%lld, %lld]",
                               t->scale_name, td_dtype_name(si->dtype), got, (long long)t->rows,
                               (long long)t->cols);
        goto fail;
    }
    t->status = td_st_set_info(a->set, t->global_name, &gi, &gshard, &e);
    if (t->status) goto fail;
    int64_t gnumel = 1;
    for (int d = 0; d < gi->ndim; d++) gnumel *= gi->shape[d];
    if (gi->dtype != TD_F32 || gnumel != 1 || gi->ndim > 1) {
        char got[96];
        td_shape_str(gi->ndim, gi->shape, got, sizeof got);
        t->status = td_err_set(&e, TD_ERR_FORMAT, "%s: %s %s, expected an F32 scalar ([] or [1])",
                               t->global_name, td_dtype_name(gi->dtype), got);
        goto fail;
    }
    sf = shard_open(a, shard, &e);
    gf = sf ? shard_open(a, gshard, &e) : NULL;
    if (!sf || !gf) {
        t->status = e.code;
        goto fail;
    }
    uint8_t gb[4];
    if (!read_at(gf->fd, gf->data_off + (int64_t)gi->begin, gb, 4)) {
        t->status = td_err_set(&e, TD_ERR_IO, "%s: cannot read it from %s", t->global_name, gshard);
        goto fail;
    }
    uint32_t gu = (uint32_t)gb[0] | (uint32_t)gb[1] << 8 | (uint32_t)gb[2] << 16 | (uint32_t)gb[3] << 24;
    memcpy(&t->global, &gu, sizeof t->global);
    td_recon_global_init(a->codec, td_nvfp4_g_dec(t->global, t->conv), &t->gl);
    j->fd = sf->fd;
    j->offset = sf->data_off + (int64_t)si->begin;
    if (tp == 1) t->n_ranks = 1;
    else if ((t->row_parallel ? t->cols : t->rows) % tp == 0) t->n_ranks = tp;
    else t->n_ranks = 0;
    return;
fail:
    copy_str(t->error, sizeof t->error, e.msg);
    j->fd = -1;
}

/* ---- stages, layouts, findings -------------------------------------------------------------- */

typedef struct layer_out {
    td_scale_tensor *tensors;
    job *jobs;
    size_t n_tensors;
    td_scale_stage *stages;
    size_t n_stages, cap_stages;
    td_scale_finding *findings;
    size_t n_findings, cap_findings;
} layer_out;

static td_scale_finding *add_finding(layer_out *L, td_scale_finding_kind kind, bool counts,
                                     int32_t layer, int32_t expert, const char *module)
{
    if (L->n_findings == L->cap_findings) {
        size_t cap = L->cap_findings ? 2 * L->cap_findings : 16;
        td_scale_finding *f = realloc(L->findings, cap * sizeof *f);
        if (!f) return NULL;
        L->findings = f;
        L->cap_findings = cap;
    }
    td_scale_finding *f = &L->findings[L->n_findings++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->counts = counts;
    f->layer = layer;
    f->expert = expert;
    f->a = f->b = NAN;
    snprintf(f->module, sizeof f->module, "%s", module);
    return f;
}

static td_scale_stage *add_stage(layer_out *L)
{
    if (L->n_stages == L->cap_stages) {
        size_t cap = L->cap_stages ? 2 * L->cap_stages : 16;
        td_scale_stage *s = realloc(L->stages, cap * sizeof *s);
        if (!s) return NULL;
        L->stages = s;
        L->cap_stages = cap;
    }
    td_scale_stage *s = &L->stages[L->n_stages++];
    memset(s, 0, sizeof *s);
    s->first_reason = TD_SCALE_OK;
    for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++) {
        s->layout[l].first_expert = -1;
        s->layout[l].first_col = s->layout[l].first_group = -1;
    }
    return s;
}

/* Global-slot check of one w13 stage slice (rank >= 0, or -1 for whole tensors). */
static void layout_check(audit_ctx *a, layer_out *L, const char *stage, int rank, td_scale_stage *s,
                         td_w13_layout lay)
{
    td_scale_layout_check *lc = &s->layout[lay];
    int (*slot_fn)(td_w13_layout, int64_t, int64_t) = a->o->w13_slot ? a->o->w13_slot : td_w13_slot;
    scratch bufs[2] = {{NULL, 0}, {NULL, 0}};
    lc->applicable = true;
    for (size_t i = 0; i < L->n_tensors; i++) {
        td_scale_tensor *gate = &L->tensors[i];
        if (strcmp(gate->stage, stage) || gate->proj != TD_MOE_GATE || gate->status) continue;
        td_scale_tensor *up = NULL;
        job *up_job = NULL;
        for (size_t k = 0; k < L->n_tensors; k++)
            if (L->tensors[k].expert == gate->expert && L->tensors[k].proj == TD_MOE_UP &&
                !L->tensors[k].status && L->tensors[k].rows == gate->rows &&
                L->tensors[k].cols == gate->cols) {
                up = &L->tensors[k];
                up_job = &L->jobs[k];
            }
        if (!up) continue;
        int64_t i_r = rank >= 0 && a->o->tp > 1 ? gate->rows / a->o->tp : gate->rows;
        int64_t row0 = rank >= 0 && a->o->tp > 1 ? rank * i_r : 0;
        if (lay == TD_W13_INTERLEAVED && i_r % 32 != 0) {
            lc->applicable = false;
            break;
        }
        const td_scale_tensor *half[2] = {gate, up};
        job *jobs[2] = {&L->jobs[i], up_job};
        const uint8_t *data[2] = {NULL, NULL};   /* read only when a wrong slot matters */
        td_recon_eval cross[2][256];
        bool have_cross[2] = {false, false};
        int64_t n = 2 * i_r;
        for (int64_t col = 0; col < n; col++) {
            int64_t row;
            int h = td_w13_origin(lay, col, i_r, &row);
            int slot = slot_fn(lay, col, n) ? 1 : 0;
            lc->columns++;
            if (h == slot) continue;
            lc->slot_mismatch++;
            if (fbits(half[h]->gl.g) == fbits(half[slot]->gl.g)) continue; /* same bits: harmless */
            if (!have_cross[h]) {
                for (int code = 0; code < 256; code++)
                    td_recon_eval_code(a->codec, (uint8_t)code, &half[h]->gl, &half[slot]->gl, &cross[h][code]);
                have_cross[h] = true;
            }
            if (!data[h]) {
                data[h] = load_scales(jobs[h], &bufs[h]);
                if (!data[h]) {
                    lc->rejected++;   /* unreadable now: cannot vouch for the slot */
                    continue;
                }
            }
            const uint8_t *p = data[h] + (row0 + row) * gate->cols;
            for (int64_t g = 0; g < gate->cols; g++) {
                if (cross[h][p[g]].admit) continue;
                lc->rejected++;
                if (lc->first_expert < 0) {
                    lc->first_expert = gate->expert;
                    lc->first_col = col;
                    lc->first_group = g;
                }
            }
        }
    }
    free(bufs[0].buf);
    free(bufs[1].buf);
}

static const td_scale_counts *slice_counts(const td_scale_tensor *t, int rank)
{
    return rank >= 0 ? &t->ranks[rank] : &t->all;
}

static td_status build_stages(audit_ctx *a, layer_out *L, int32_t layer, td_err *err)
{
    int tp = a->o->tp;
    for (size_t i = 0; i < L->n_tensors; i++) {
        const char *stage = L->tensors[i].stage;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++) seen = !strcmp(L->tensors[k].stage, stage);
        if (seen) continue;
        /* Rank rows when every member divides by tp, else one row over whole tensors. */
        bool by_rank = true;
        bool is_w13 = !strcmp(stage, "w13") && L->tensors[i].expert >= 0;
        for (size_t k = i; k < L->n_tensors; k++)
            if (!strcmp(L->tensors[k].stage, stage) && !L->tensors[k].status && L->tensors[k].n_ranks == 0)
                by_rank = false;
        if (!by_rank)
            add_finding(L, TD_SCALE_FIND_TP_NOT_DIVISIBLE, false, layer, -1, stage);
        int nr = by_rank ? tp : 1;
        for (int r = 0; r < nr; r++) {
            int rank = by_rank ? r : -1;
            td_scale_stage *s = add_stage(L);
            if (!s) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
            snprintf(s->name, sizeof s->name, "%s", stage);
            s->layer = layer;
            s->rank = rank;
            s->is_w13 = is_w13;
            bool ok = true;
            for (size_t k = i; k < L->n_tensors; k++) {
                const td_scale_tensor *t = &L->tensors[k];
                if (strcmp(t->stage, stage)) continue;
                s->tensors++;
                s->globals++;
                if (t->status) {
                    ok = false;
                    s->tensors_rejected++;
                    continue;
                }
                const td_scale_counts *c = slice_counts(t, rank);
                s->elements += c->elements;
                s->rejected += c->rejected;
                if (c->rejected) {
                    ok = false;
                    s->tensors_rejected++;
                    if (!s->first_tensor[0]) {
                        snprintf(s->first_tensor, sizeof s->first_tensor, "%s", t->scale_name);
                        s->first_reason = c->reason;
                    }
                }
            }
            if (is_w13) {
                for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++) {
                    layout_check(a, L, stage, rank, s, (td_w13_layout)l);
                    if (s->layout[l].rejected) {
                        ok = false;
                        if (!s->first_tensor[0]) {
                            snprintf(s->first_tensor, sizeof s->first_tensor, "%s layout %s", stage,
                                     td_w13_layout_name((td_w13_layout)l));
                            s->first_reason = TD_SCALE_LAYOUT_MISMATCH;
                        }
                    }
                }
                if (!s->layout[TD_W13_INTERLEAVED].applicable && r == 0)
                    add_finding(L, TD_SCALE_FIND_LAYOUT_NA, false, layer, -1, stage);
            }
            s->admit = ok;
            s->saved_bytes = ok ? s->elements - 4 * s->globals : 0;
        }
    }
    for (size_t i = 0; i < L->n_findings; i++) {
        td_scale_finding *f = &L->findings[i];
        char where[200];
        if (f->layer >= 0) snprintf(where, sizeof where, "layer %d %s", (int)f->layer, f->module);
        else snprintf(where, sizeof where, "%s", f->module);
        if (f->kind == TD_SCALE_FIND_TP_NOT_DIVISIBLE && !f->msg[0])
            snprintf(f->msg, sizeof f->msg, "%s: the TP view does not apply (tp %d does not divide its "
                     "split dimension); judged on whole tensors", where, tp);
        if (f->kind == TD_SCALE_FIND_LAYOUT_NA && !f->msg[0])
            snprintf(f->msg, sizeof f->msg, "%s: interleaved W13 layout not applicable (rows per rank "
                     "not a multiple of 32); non-interleaved checked", where);
    }
    return TD_OK;
}

/* gate/up and q/k/v siblings under one parent must share their global. */
static td_status sibling_findings(layer_out *L, int32_t layer, td_err *err)
{
    for (size_t i = 0; i < L->n_tensors; i++) {
        const td_scale_tensor *t = &L->tensors[i];
        if (t->status) continue;
        const char *leaf = leaf_of(t->module);
        const char *fam = NULL;
        if (!strcmp(leaf, "gate_proj")) fam = "gate_up";
        else if (!strcmp(leaf, "q_proj")) fam = "qkv";
        if (!fam) continue;  /* groups are led by their gate_proj / q_proj member */
        size_t plen = (size_t)(leaf - t->module);
        for (size_t k = 0; k < L->n_tensors; k++) {
            const td_scale_tensor *u = &L->tensors[k];
            if (k == i || u->status || strncmp(u->module, t->module, plen) || strchr(u->module + plen, '.'))
                continue;
            const char *ul = u->module + plen;
            bool sib = !strcmp(fam, "gate_up") ? !strcmp(ul, "up_proj")
                                               : (!strcmp(ul, "k_proj") || !strcmp(ul, "v_proj"));
            if (!sib || fbits(u->global) == fbits(t->global)) continue;
            char parent[160];
            snprintf(parent, sizeof parent, "%.*s", (int)(plen ? plen - 1 : 0), t->module);
            td_scale_finding *f = add_finding(L, TD_SCALE_FIND_SIBLING_GLOBALS, true, layer, t->expert, parent);
            if (!f) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
            f->a = t->global;
            f->b = u->global;
            snprintf(f->msg, sizeof f->msg,
                     "%s: %s global %.9g != %s global %.9g (ratio %.6g); an engine that keeps one "
                     "global for the fused GEMM mis-scales one of them", parent, leaf,
                     (double)t->global, ul, (double)u->global, (double)u->global / (double)t->global);
        }
    }
    return TD_OK;
}

/* ---- sums ---------------------------------------------------------------------------------- */

static void sum_init(td_scale_layer_sum *s)
{
    memset(s, 0, sizeof *s);
    s->code_min = s->code_max = -1;
    s->prep_min = s->prep_max = NAN;
    s->global_min = s->global_max = NAN;
}

static void minf(float *dst, float v)
{
    if (!isnan(v) && (isnan(*dst) || v < *dst)) *dst = v;
}

static void maxf(float *dst, float v)
{
    if (!isnan(v) && (isnan(*dst) || v > *dst)) *dst = v;
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

static size_t unique_u32(uint32_t *v, size_t n)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_u32);
    size_t m = 1;
    for (size_t i = 1; i < n; i++)
        if (v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

static td_status layer_sum(audit_ctx *a, const layer_out *L, td_scale_layer_sum *s, td_err *err)
{
    sum_init(s);
    uint32_t *gb = malloc((L->n_tensors ? L->n_tensors : 1) * sizeof *gb);
    if (!gb) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    size_t ng = 0;
    for (size_t i = 0; i < L->n_tensors; i++) {
        const td_scale_tensor *t = &L->tensors[i];
        s->tensors++;
        if (t->status) {
            s->input_errors++;
            continue;
        }
        if (t->admit) s->admitted++;
        else {
            s->rejected++;
            s->by_reason[t->all.reason]++;
        }
        s->elements += t->all.elements;
        s->rejected_elements += t->all.rejected;
        const td_scale_census *c = &t->census;
        s->zero += c->zero;
        s->subnormal += c->subnormal;
        s->negative += c->negative;
        s->nan += c->nan;
        if (c->code_min >= 0 && (s->code_min < 0 || c->code_min < s->code_min)) s->code_min = c->code_min;
        if (c->code_max > s->code_max) s->code_max = c->code_max;
        s->prep_zero += c->prep_zero;
        s->prep_subnormal += c->prep_subnormal;
        s->prep_inf += c->prep_inf;
        s->prep_nan += c->prep_nan;
        minf(&s->prep_min, c->prep_min);
        maxf(&s->prep_max, c->prep_max);
        if (isfinite(t->global)) {
            minf(&s->global_min, t->global);
            maxf(&s->global_max, t->global);
        }
        gb[ng++] = fbits(t->global);
    }
    if (a->n_all_globals + ng > a->cap_all_globals) {
        size_t cap = (a->n_all_globals + ng) * 2 + 64;
        uint32_t *p = realloc(a->all_globals, cap * sizeof *p);
        if (!p) {
            free(gb);
            return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
        }
        a->all_globals = p;
        a->cap_all_globals = cap;
    }
    memcpy(a->all_globals + a->n_all_globals, gb, ng * sizeof *gb);
    a->n_all_globals += ng;
    s->globals_distinct = (int64_t)unique_u32(gb, ng);
    free(gb);
    for (size_t i = 0; i < L->n_stages; i++) {
        const td_scale_stage *st = &L->stages[i];
        s->stages++;
        if (st->admit) s->stages_admitted++;
        s->saved_bytes += st->saved_bytes;
        for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++)
            if (st->layout[l].rejected) s->by_reason[TD_SCALE_LAYOUT_MISMATCH]++;
    }
    for (size_t i = 0; i < L->n_findings; i++) {
        if (L->findings[i].counts) s->failed_findings++;
        else s->notes++;
    }
    return TD_OK;
}

static void sum_merge(td_scale_layer_sum *d, const td_scale_layer_sum *s)
{
    d->tensors += s->tensors;
    d->admitted += s->admitted;
    d->rejected += s->rejected;
    d->input_errors += s->input_errors;
    d->elements += s->elements;
    d->rejected_elements += s->rejected_elements;
    for (int r = 0; r < TD_SCALE_REASON_COUNT; r++) d->by_reason[r] += s->by_reason[r];
    d->zero += s->zero;
    d->subnormal += s->subnormal;
    d->negative += s->negative;
    d->nan += s->nan;
    if (s->code_min >= 0 && (d->code_min < 0 || s->code_min < d->code_min)) d->code_min = s->code_min;
    if (s->code_max > d->code_max) d->code_max = s->code_max;
    d->prep_zero += s->prep_zero;
    d->prep_subnormal += s->prep_subnormal;
    d->prep_inf += s->prep_inf;
    d->prep_nan += s->prep_nan;
    minf(&d->prep_min, s->prep_min);
    maxf(&d->prep_max, s->prep_max);
    minf(&d->global_min, s->global_min);
    maxf(&d->global_max, s->global_max);
    d->stages += s->stages;
    d->stages_admitted += s->stages_admitted;
    d->saved_bytes += s->saved_bytes;
    d->failed_findings += s->failed_findings;
    d->notes += s->notes;
}

/* ---- driver -------------------------------------------------------------------------------- */

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > TD_SCALE_MAX_THREADS) n = TD_SCALE_MAX_THREADS;
    return (int)n;
}

/* Audit the selected modules [b, e) of one layer and deliver them. */
static td_status run_layer(audit_ctx *a, size_t b, size_t e, int32_t layer, const td_scale_sink *sink,
                           td_progress *prog, uint64_t *done, td_scale_summary *sum, td_err *err)
{
    layer_out L;
    memset(&L, 0, sizeof L);
    td_status st = TD_OK;
    /* Fused routed experts: per-expert modules are absent; note it and skip them. */
    bool fused = false;
    if (layer >= 0) {
        char gu[128], dn[128];
        int64_t gus[3], dns[3];
        td_layout_fused_experts(a->cfg, a->layout.prefix, layer, gu, gus, dn, dns);
        fused = td_st_set_has(a->set, gu) || td_st_set_has(a->set, dn);
    }
    size_t n = 0;
    for (size_t i = b; i < e; i++)
        if (!(fused && a->sel[i].m->expert >= 0)) n++;
    L.tensors = calloc(n ? n : 1, sizeof *L.tensors);
    L.jobs = calloc(n ? n : 1, sizeof *L.jobs);
    if (!L.tensors || !L.jobs) {
        st = td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory (%zu tensors)", n);
        goto done;
    }
    if (fused) {
        td_scale_finding *f = add_finding(&L, TD_SCALE_FIND_FUSED_EXPERTS, false, layer, -1, "experts");
        if (f) snprintf(f->msg, sizeof f->msg, "layer %d stores its routed experts fused (3-D); they are "
                        "not audited", (int)layer);
    }
    for (size_t i = b; i < e; i++) {
        if (fused && a->sel[i].m->expert >= 0) continue;
        tensor_setup(a, &a->sel[i], &L.tensors[L.n_tensors], &L.jobs[L.n_tensors]);
        L.n_tensors++;
    }
    pool p;
    p.codec = a->codec;
    p.elementwise = a->o->elementwise;
    p.jobs = L.jobs;
    p.n = L.n_tensors;
    atomic_init(&p.next, 0);
    atomic_init(&p.done, 0);
    st = pool_run(&p, a->threads, prog, *done, err);
    if (st) goto done;
    *done += L.n_tensors;
    st = build_stages(a, &L, layer, err);
    if (!st) st = sibling_findings(&L, layer, err);
    td_scale_layer out;
    memset(&out, 0, sizeof out);
    if (!st) st = layer_sum(a, &L, &out.sum, err);
    if (st) goto done;
    out.layer = layer;
    out.tp = a->o->tp;
    out.tensors = L.tensors;
    out.n_tensors = L.n_tensors;
    out.stages = L.stages;
    out.n_stages = L.n_stages;
    out.findings = L.findings;
    out.n_findings = L.n_findings;
    sum_merge(&sum->total, &out.sum);
    sum->layers++;
    if (sink && sink->layer) st = sink->layer(sink->ctx, &out, err);
done:
    free(L.tensors);
    free(L.jobs);
    free(L.stages);
    free(L.findings);
    return st;
}

td_status td_scale_audit(const td_scale_opts *o, const td_scale_sink *sink, td_scale_summary *sum_out,
                         td_err *err)
{
    TD_ASSERT(o);
    double t0 = now_s();
    if (!o->model || !o->model[0]) return td_err_set(err, TD_ERR_ARG, "audit e4m3: no checkpoint directory given");
    if (o->tp < 1 || o->tp > TD_SCALE_MAX_TP)
        return td_err_set(err, TD_ERR_ARG, "--tp %d: must be between 1 and %d", o->tp, TD_SCALE_MAX_TP);
    if (o->threads < 0) return td_err_set(err, TD_ERR_ARG, "--threads %d: must be >= 0", o->threads);
    audit_ctx a;
    memset(&a, 0, sizeof a);
    a.o = o;
    a.codec = o->codec ? o->codec : td_codec_tandem();
    a.threads = o->threads ? o->threads : online_cpus();
    if (a.threads > TD_SCALE_MAX_THREADS) a.threads = TD_SCALE_MAX_THREADS;
    td_scale_summary sum;
    memset(&sum, 0, sizeof sum);
    sum_init(&sum.total);
    sum.tp = o->tp;
    sum.threads = a.threads;
    td_status st = ctx_open(&a, err);
    if (st) goto out;

    /* Layer groups in ascending layer order, modules outside layers (layer -1) last. */
    int64_t nl = a.cfg->num_hidden_layers;
    int64_t groups = 0;
    for (int64_t l = -1; l < nl; l++)
        for (size_t i = 0; i < a.n_sel; i++)
            if (a.sel[i].m->layer == l) {
                groups++;
                break;
            }
    if (sink && sink->begin) {
        td_scale_info info;
        memset(&info, 0, sizeof info);
        info.model = o->model;
        info.family = td_family_name(a.cfg->family);
        info.model_type = a.cfg->model_type;
        info.prefix = a.layout.prefix;
        info.quant_algo = a.quant.quant_algo;
        info.producer = a.quant.producer;
        info.tp = o->tp;
        info.threads = a.threads;
        info.elementwise = o->elementwise;
        info.tensors = (int64_t)a.n_sel;
        info.layers = groups;
        st = sink->begin(sink->ctx, &info, err);
        if (st) goto out;
    }
    td_progress prog;
    td_progress_init_ex(&prog, stderr, "audit e4m3", a.n_sel, o->progress ? -1 : 0, NULL, NULL);
    uint64_t done = 0;
    /* Group the selection by layer: ascending layers, then the modules outside layers. */
    sel_module *tmp = malloc((a.n_sel ? a.n_sel : 1) * sizeof *tmp);
    if (!tmp) {
        st = td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
        goto out;
    }
    size_t k = 0;
    for (int64_t l = 0; l <= nl; l++) {
        int64_t want = l < nl ? l : -1;
        for (size_t i = 0; i < a.n_sel; i++)
            if (a.sel[i].m->layer == want) tmp[k++] = a.sel[i];
    }
    memcpy(a.sel, tmp, a.n_sel * sizeof *tmp);
    free(tmp);
    for (size_t b = 0; b < a.n_sel && !st;) {
        int32_t layer = a.sel[b].m->layer;
        size_t e = b;
        while (e < a.n_sel && a.sel[e].m->layer == layer) e++;
        st = run_layer(&a, b, e, layer, sink, &prog, &done, &sum, err);
        b = e;
    }
    if (!st) td_progress_done(&prog);
    sum.total.globals_distinct = (int64_t)unique_u32(a.all_globals, a.n_all_globals);
out:
    ctx_free(&a);
    sum.seconds = now_s() - t0;
    if (sum_out) *sum_out = sum;
    return st;
}
