/* engine.c — variants, tap sets, the engine interface wrappers and the registry (engine.h). */
#include "engine.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== option tables ========================================================================== */

static const char *const storage_names[] = {"prepared", "raw"};
static const char *const dispatch_names[] = {"direct", "grouped"};
static const char *const act_names[] = {"fp32", "fp16", "bf16"};
static const char *const accum_names[] = {"fp32", "fp64"};
static const char *const scale_names[] = {"exact", "fp16"};
static const char *const fault_names[] = {"none", "nibble_order", "reciprocal_global",
                                          "gate_up_swap", "no_renorm", "tp_slice",
                                          "topk_skip", "no_route_taps"};
static const char *const kernels_names[] = {"fast", "generic"};
_Static_assert(TD_ARRAY_LEN(storage_names) == TD_STORAGE_COUNT, "storage names");
_Static_assert(TD_ARRAY_LEN(dispatch_names) == TD_DISPATCH_COUNT, "dispatch names");
_Static_assert(TD_ARRAY_LEN(act_names) == TD_ACT_COUNT, "act_dtype names");
_Static_assert(TD_ARRAY_LEN(accum_names) == TD_ACCUM_COUNT, "accum names");
_Static_assert(TD_ARRAY_LEN(scale_names) == TD_SCALE_COUNT, "scale names");
_Static_assert(TD_ARRAY_LEN(fault_names) == TD_FAULT_COUNT, "fault names");

static const struct {
    const char *name;
    bool neutral; /* a correct engine gives the same bits for every value */
} opt_table[] = {
    [TD_OPT_STORAGE] = {"storage", true},
    [TD_OPT_MOE_DISPATCH] = {"moe_dispatch", false},
    [TD_OPT_ACT_DTYPE] = {"act_dtype", false},
    [TD_OPT_ACCUM] = {"accum", false},
    [TD_OPT_SCALE] = {"scale", false},
    [TD_OPT_TP_SIZE] = {"tp_size", false},
    [TD_OPT_TP_RANK] = {"tp_rank", false},
    [TD_OPT_GRAPHS] = {"graphs", true},
    [TD_OPT_THREADS] = {"threads", true},
    [TD_OPT_FAULT] = {"fault", true},
    [TD_OPT_KERNELS] = {"kernels", true},
};
_Static_assert(TD_ARRAY_LEN(opt_table) == TD_OPT_COUNT, "one entry per option");

static const char *name_at(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : NULL;
}

const char *td_opt_name(td_opt o) { return (unsigned)o < TD_OPT_COUNT ? opt_table[o].name : NULL; }
bool td_opt_is_neutral(td_opt o) { return (unsigned)o < TD_OPT_COUNT && opt_table[o].neutral; }
const char *td_act_dtype_name(td_act_dtype a) { return name_at(act_names, TD_ACT_COUNT, (int)a); }
const char *td_accum_name(td_accum a) { return name_at(accum_names, TD_ACCUM_COUNT, (int)a); }
const char *td_scale_mode_name(td_scale_mode s) { return name_at(scale_names, TD_SCALE_COUNT, (int)s); }
const char *td_storage_name(td_storage s) { return name_at(storage_names, TD_STORAGE_COUNT, (int)s); }
const char *td_moe_dispatch_name(td_moe_dispatch d)
{
    return name_at(dispatch_names, TD_DISPATCH_COUNT, (int)d);
}
const char *td_fault_name(td_fault f) { return name_at(fault_names, TD_FAULT_COUNT, (int)f); }

td_dtype td_act_dtype_tensor(td_act_dtype a)
{
    switch (a) {
    case TD_ACT_FP16: return TD_F16;
    case TD_ACT_BF16: return TD_BF16;
    default: return TD_F32;
    }
}

/* ==== registry =============================================================================== */

#define REF_OPTIONS                                                                                \
    (TD_OPT_BIT(TD_OPT_ACT_DTYPE) | TD_OPT_BIT(TD_OPT_ACCUM) | TD_OPT_BIT(TD_OPT_SCALE) |         \
     TD_OPT_BIT(TD_OPT_TP_SIZE) | TD_OPT_BIT(TD_OPT_TP_RANK) | TD_OPT_BIT(TD_OPT_THREADS) |       \
     TD_OPT_BIT(TD_OPT_FAULT))
#define CUDA_OPTIONS                                                                               \
    (TD_OPT_BIT(TD_OPT_STORAGE) | TD_OPT_BIT(TD_OPT_MOE_DISPATCH) | TD_OPT_BIT(TD_OPT_ACT_DTYPE) | \
     TD_OPT_BIT(TD_OPT_TP_SIZE) | TD_OPT_BIT(TD_OPT_TP_RANK) | TD_OPT_BIT(TD_OPT_GRAPHS) |      \
     TD_OPT_BIT(TD_OPT_KERNELS))

static const td_engine_entry registry[] = {
    {"ref", "scalar CPU reference engine (the oracle): FP32 in a fixed order, FP64 on request",
     REF_OPTIONS},
    {"cuda", "optimized CUDA engine: NVFP4 decoded in registers, FP16/BF16 activations",
     CUDA_OPTIONS},
};

size_t td_engine_count(void) { return TD_ARRAY_LEN(registry); }

const td_engine_entry *td_engine_at(size_t i)
{
    TD_ASSERT(i < TD_ARRAY_LEN(registry));
    return &registry[i];
}

const td_engine_entry *td_engine_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < TD_ARRAY_LEN(registry); i++)
        if (!strcmp(registry[i].name, name)) return &registry[i];
    return NULL;
}

static void engine_list(char *buf, size_t cap)
{
    buf[0] = 0;
    for (size_t i = 0; i < TD_ARRAY_LEN(registry); i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", i ? ", " : "", registry[i].name);
    }
}

/* ==== variants =============================================================================== */

void td_variant_init(td_variant *v, const char *engine)
{
    memset(v, 0, sizeof *v);
    snprintf(v->engine, sizeof v->engine, "%s", engine ? engine : "");
    v->tp_size = 1;
    v->tp_rank = 0;
}

static int parse_choice(const char *val, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(val, names[i])) return (int)i;
    return -1;
}

static void choices(const char *const *names, size_t n, char *buf, size_t cap)
{
    buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", i ? "|" : "", names[i]);
    }
}

/* Decimal integer in [lo, hi] without sign, spaces or leading zeros (except "0"). */
static bool parse_uint(const char *s, long lo, long hi, long *out)
{
    if (!*s || (s[0] == '0' && s[1])) return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p)) return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static td_status set_option(const char *text, td_variant *v, const char *key, const char *val,
                            td_err *err)
{
    int o = -1;
    for (int i = 0; i < TD_OPT_COUNT; i++)
        if (!strcmp(key, opt_table[i].name)) o = i;
    if (o < 0) {
        char all[256] = "";
        for (int i = 0; i < TD_OPT_COUNT; i++) {
            size_t l = strlen(all);
            snprintf(all + l, sizeof all - l, "%s%s", i ? ", " : "", opt_table[i].name);
        }
        return td_err_set(err, TD_ERR_ARG, "variant '%s': unknown option '%s' (options: %s)", text,
                          key, all);
    }
    const td_engine_entry *en = td_engine_find(v->engine);
    if (!en || !(en->options & TD_OPT_BIT(o)))
        return td_err_set(err, TD_ERR_ARG, "variant '%s': option '%s' is not supported by engine '%s'",
                          text, key, v->engine);
    if (v->set & TD_OPT_BIT(o))
        return td_err_set(err, TD_ERR_ARG, "variant '%s': option '%s' is given twice", text, key);
    v->set |= TD_OPT_BIT(o);

    const char *const *names = NULL;
    size_t n_names = 0;
    switch ((td_opt)o) {
    case TD_OPT_STORAGE: names = storage_names; n_names = TD_STORAGE_COUNT; break;
    case TD_OPT_MOE_DISPATCH: names = dispatch_names; n_names = TD_DISPATCH_COUNT; break;
    case TD_OPT_ACT_DTYPE: names = act_names; n_names = TD_ACT_COUNT; break;
    case TD_OPT_ACCUM: names = accum_names; n_names = TD_ACCUM_COUNT; break;
    case TD_OPT_SCALE: names = scale_names; n_names = TD_SCALE_COUNT; break;
    case TD_OPT_FAULT: names = fault_names; n_names = TD_FAULT_COUNT; break;
    case TD_OPT_GRAPHS: {
        static const char *const onoff[] = {"off", "on"};
        names = onoff;
        n_names = 2;
        break;
    }
    case TD_OPT_KERNELS: names = kernels_names; n_names = TD_ARRAY_LEN(kernels_names); break;
    case TD_OPT_TP_SIZE: {
        long x;
        if (!parse_uint(val, 1, TD_TP_MAX, &x))
            return td_err_set(err, TD_ERR_ARG, "variant '%s': tp_size '%s': expected an integer in [1, %d]",
                              text, val, TD_TP_MAX);
        v->tp_size = (int)x;
        return TD_OK;
    }
    case TD_OPT_TP_RANK: {
        long x;
        if (!strcmp(val, "all")) {
            v->tp_rank = TD_TP_RANK_ALL;
            return TD_OK;
        }
        if (!parse_uint(val, 0, TD_TP_MAX - 1, &x))
            return td_err_set(err, TD_ERR_ARG,
                              "variant '%s': tp_rank '%s': expected an integer in [0, %d] or 'all'", text,
                              val, TD_TP_MAX - 1);
        v->tp_rank = (int)x;
        return TD_OK;
    }
    case TD_OPT_THREADS: {
        long x;
        if (!strcmp(val, "auto")) {
            v->threads = 0;
            return TD_OK;
        }
        if (!parse_uint(val, 1, TD_ENGINE_MAX_THREADS, &x))
            return td_err_set(err, TD_ERR_ARG,
                              "variant '%s': threads '%s': expected an integer in [1, %d] or 'auto'", text,
                              val, TD_ENGINE_MAX_THREADS);
        v->threads = (int)x;
        return TD_OK;
    }
    case TD_OPT_COUNT: break;
    }
    int c = parse_choice(val, names, n_names);
    if (c < 0) {
        char list[160];
        choices(names, n_names, list, sizeof list);
        return td_err_set(err, TD_ERR_ARG, "variant '%s': %s '%s': expected %s", text, key, val, list);
    }
    switch ((td_opt)o) {
    case TD_OPT_STORAGE: v->storage = (td_storage)c; break;
    case TD_OPT_MOE_DISPATCH: v->moe_dispatch = (td_moe_dispatch)c; break;
    case TD_OPT_ACT_DTYPE: v->act_dtype = (td_act_dtype)c; break;
    case TD_OPT_ACCUM: v->accum = (td_accum)c; break;
    case TD_OPT_SCALE: v->scale = (td_scale_mode)c; break;
    case TD_OPT_FAULT: v->fault = (td_fault)c; break;
    case TD_OPT_GRAPHS: v->graphs = c == 1; break;
    case TD_OPT_KERNELS: v->generic = c == 1; break;
    default: break;
    }
    return TD_OK;
}

td_status td_variant_parse(const char *text, td_variant *v, td_err *err)
{
    if (!text || !*text) return td_err_set(err, TD_ERR_ARG, "empty engine variant (expected e.g. 'ref' or 'ref:scale=fp16')");
    size_t len = strlen(text);
    if (len >= TD_VARIANT_TEXT_MAX)
        return td_err_set(err, TD_ERR_ARG, "variant '%.40s...': longer than %d characters", text,
                          TD_VARIANT_TEXT_MAX - 1);
    char buf[TD_VARIANT_TEXT_MAX];
    memcpy(buf, text, len + 1);
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
    const char *engine = buf;
    bool name_ok = *engine != 0 && strlen(engine) < TD_ENGINE_NAME_MAX;
    for (const char *p = engine; *p && name_ok; p++)
        name_ok = islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '_';
    const td_engine_entry *en = name_ok ? td_engine_find(engine) : NULL;
    if (!en) {
        char list[128];
        engine_list(list, sizeof list);
        return td_err_set(err, TD_ERR_ARG, "variant '%s': unknown engine '%s' (engines: %s)", text,
                          engine, list);
    }
    td_variant_init(v, engine);
    if (colon) {
        char *p = colon + 1;
        if (!*p)
            return td_err_set(err, TD_ERR_ARG, "variant '%s': no option after ':' (write '%s' alone)",
                              text, engine);
        for (;;) {
            char *comma = strchr(p, ',');
            if (comma) *comma = 0;
            char *eq = strchr(p, '=');
            if (!*p || !eq || eq == p || !eq[1])
                return td_err_set(err, TD_ERR_ARG,
                                  "variant '%s': '%s' is not an option=value pair", text, p);
            *eq = 0;
            td_status st = set_option(text, v, p, eq + 1, err);
            if (st) return st;
            if (!comma) break;
            p = comma + 1;
        }
    }
    if (v->tp_rank != TD_TP_RANK_ALL && v->tp_rank >= v->tp_size)
        return td_err_set(err, TD_ERR_ARG, "variant '%s': tp_rank %d is not below tp_size %d", text,
                          v->tp_rank, v->tp_size);
    return TD_OK;
}

char *td_variant_format(const td_variant *v, char *buf, size_t cap)
{
    TD_ASSERT(buf && cap > 0);
    size_t l = (size_t)snprintf(buf, cap, "%s", v->engine);
    char val[32];
    bool first = true;
    for (int o = 0; o < TD_OPT_COUNT; o++) {
        const char *s = NULL;
        switch ((td_opt)o) {
        case TD_OPT_STORAGE: if (v->storage) s = storage_names[v->storage]; break;
        case TD_OPT_MOE_DISPATCH: if (v->moe_dispatch) s = dispatch_names[v->moe_dispatch]; break;
        case TD_OPT_ACT_DTYPE: if (v->act_dtype) s = act_names[v->act_dtype]; break;
        case TD_OPT_ACCUM: if (v->accum) s = accum_names[v->accum]; break;
        case TD_OPT_SCALE: if (v->scale) s = scale_names[v->scale]; break;
        case TD_OPT_TP_SIZE:
            if (v->tp_size != 1) {
                snprintf(val, sizeof val, "%d", v->tp_size);
                s = val;
            }
            break;
        case TD_OPT_TP_RANK:
            if (v->tp_rank == TD_TP_RANK_ALL) s = "all";
            else if (v->tp_rank != 0) {
                snprintf(val, sizeof val, "%d", v->tp_rank);
                s = val;
            }
            break;
        case TD_OPT_GRAPHS: if (v->graphs) s = "on"; break;
        case TD_OPT_THREADS:
            if (v->threads) {
                snprintf(val, sizeof val, "%d", v->threads);
                s = val;
            }
            break;
        case TD_OPT_FAULT: if (v->fault) s = fault_names[v->fault]; break;
        case TD_OPT_KERNELS: if (v->generic) s = kernels_names[1]; break;
        case TD_OPT_COUNT: break;
        }
        if (!s) continue;
        if (l < cap)
            l += (size_t)snprintf(buf + l, cap - l, "%s%s=%s", first ? ":" : ",", opt_table[o].name, s);
        first = false;
    }
    return buf;
}

void td_variant_resolve(td_variant *v)
{
    if (v->threads > 0) return;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > TD_ENGINE_MAX_THREADS) n = TD_ENGINE_MAX_THREADS;
    v->threads = (int)n;
}

unsigned td_variant_diff(const td_variant *a, const td_variant *b)
{
    unsigned d = 0;
    if (a->storage != b->storage) d |= TD_OPT_BIT(TD_OPT_STORAGE);
    if (a->moe_dispatch != b->moe_dispatch) d |= TD_OPT_BIT(TD_OPT_MOE_DISPATCH);
    if (a->act_dtype != b->act_dtype) d |= TD_OPT_BIT(TD_OPT_ACT_DTYPE);
    if (a->accum != b->accum) d |= TD_OPT_BIT(TD_OPT_ACCUM);
    if (a->scale != b->scale) d |= TD_OPT_BIT(TD_OPT_SCALE);
    if (a->tp_size != b->tp_size) d |= TD_OPT_BIT(TD_OPT_TP_SIZE);
    if (a->tp_rank != b->tp_rank) d |= TD_OPT_BIT(TD_OPT_TP_RANK);
    if (a->graphs != b->graphs) d |= TD_OPT_BIT(TD_OPT_GRAPHS);
    if (a->threads != b->threads) d |= TD_OPT_BIT(TD_OPT_THREADS);
    if (a->fault != b->fault) d |= TD_OPT_BIT(TD_OPT_FAULT);
    if (a->generic != b->generic) d |= TD_OPT_BIT(TD_OPT_KERNELS);
    return d;
}

bool td_variant_equal(const td_variant *a, const td_variant *b)
{
    return !strcmp(a->engine, b->engine) && td_variant_diff(a, b) == 0;
}

/* ==== blocks ================================================================================= */

static const char *const block_names[] = {"moe", "router", "attn", "gdn", "hc_mix", "hc_combine", "ple"};
_Static_assert(TD_ARRAY_LEN(block_names) == TD_BLOCK_COUNT, "block names");

const char *td_block_name(td_block b) { return name_at(block_names, TD_BLOCK_COUNT, (int)b); }

/* ==== taps =================================================================================== */

typedef struct tap_slot {
    td_tap tap;
    void *buf;      /* owned */
    size_t cap;     /* bytes */
    bool live;      /* captured since the last reset */
} tap_slot;

struct td_taps {
    char (*patterns)[TD_TAP_NAME_MAX]; /* [n_patterns] */
    size_t n_patterns;
    tap_slot *slots;                   /* [n_slots], capture order of the first put */
    size_t n_slots, cap_slots;
    size_t *order;                     /* [n_live] live slot indices in capture order */
    size_t n_live;
};

td_status td_taps_new(const char *const *patterns, size_t n, td_taps **out, td_err *err)
{
    *out = NULL;
    td_taps *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "taps: out of memory");
    if (n) {
        t->patterns = calloc(n, sizeof *t->patterns);
        if (!t->patterns) {
            free(t);
            return td_err_set(err, TD_ERR_NOMEM, "taps: out of memory");
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!patterns[i] || !*patterns[i] || strlen(patterns[i]) >= TD_TAP_NAME_MAX) {
            td_taps_free(t);
            return td_err_set(err, TD_ERR_ARG, "tap pattern '%.80s': empty or longer than %d characters",
                              patterns[i] ? patterns[i] : "", TD_TAP_NAME_MAX - 1);
        }
        snprintf(t->patterns[i], TD_TAP_NAME_MAX, "%s", patterns[i]);
        t->n_patterns++;
    }
    *out = t;
    return TD_OK;
}

void td_taps_free(td_taps *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_slots; i++) free(t->slots[i].buf);
    free(t->slots);
    free(t->order);
    free(t->patterns);
    free(t);
}

bool td_taps_wants(const td_taps *t, const char *name)
{
    if (!t || !name) return false;
    for (size_t i = 0; i < t->n_patterns; i++)
        if (!strcmp(t->patterns[i], name) || fnmatch(t->patterns[i], name, 0) == 0) return true;
    return false;
}

td_status td_taps_put(td_taps *t, const char *name, td_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, td_err *err)
{
    TD_ASSERT(t && name && shape);
    if (strlen(name) >= TD_TAP_NAME_MAX)
        return td_err_set(err, TD_ERR_ARG, "tap '%.40s...': name too long", name);
    if ((dtype != TD_F32 && dtype != TD_I32) || ndim < 0 || ndim > TD_TAP_MAX_DIMS)
        return td_err_set(err, TD_ERR_ARG, "tap '%s': dtype must be F32 or I32 with at most %d dims", name,
                          TD_TAP_MAX_DIMS);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && numel > (INT64_MAX / 8) / shape[i]))
            return td_err_set(err, TD_ERR_RANGE, "tap '%s': bad shape", name);
        numel *= shape[i];
    }
    size_t bytes = (size_t)numel * 4u;
    tap_slot *s = NULL;
    size_t idx = 0;
    for (size_t i = 0; i < t->n_slots; i++)
        if (!strcmp(t->slots[i].tap.name, name)) {
            s = &t->slots[i];
            idx = i;
        }
    if (!s) {
        if (t->n_slots == t->cap_slots) {
            size_t nc = t->cap_slots ? 2 * t->cap_slots : 8;
            tap_slot *ns = realloc(t->slots, nc * sizeof *ns);
            if (!ns) return td_err_set(err, TD_ERR_NOMEM, "tap '%s': out of memory", name);
            t->slots = ns;
            size_t *no = realloc(t->order, nc * sizeof *no);
            if (!no) return td_err_set(err, TD_ERR_NOMEM, "tap '%s': out of memory", name);
            t->order = no;
            t->cap_slots = nc;
        }
        idx = t->n_slots++;
        s = &t->slots[idx];
        memset(s, 0, sizeof *s);
        snprintf(s->tap.name, sizeof s->tap.name, "%s", name);
    }
    if (bytes > s->cap) {
        void *nb = realloc(s->buf, bytes);
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "tap '%s': out of memory (%zu bytes)", name, bytes);
        s->buf = nb;
        s->cap = bytes;
    }
    if (bytes) memcpy(s->buf, data, bytes);
    s->tap.dtype = dtype;
    s->tap.ndim = ndim;
    memset(s->tap.shape, 0, sizeof s->tap.shape);
    for (int i = 0; i < ndim; i++) s->tap.shape[i] = shape[i];
    s->tap.numel = numel;
    s->tap.data = s->buf;
    if (!s->live) {
        s->live = true;
        t->order[t->n_live++] = idx;
    }
    return TD_OK;
}

void td_taps_reset(td_taps *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_slots; i++) t->slots[i].live = false;
    t->n_live = 0;
}

size_t td_taps_count(const td_taps *t) { return t ? t->n_live : 0; }

const td_tap *td_taps_at(const td_taps *t, size_t i)
{
    TD_ASSERT(t && i < t->n_live);
    return &t->slots[t->order[i]].tap;
}

const td_tap *td_taps_find(const td_taps *t, const char *name)
{
    if (!t) return NULL;
    for (size_t i = 0; i < t->n_live; i++)
        if (!strcmp(t->slots[t->order[i]].tap.name, name)) return &t->slots[t->order[i]].tap;
    return NULL;
}

char *td_tap_name(char *buf, size_t cap, int64_t layer, const char *suffix)
{
    if (layer < 0) snprintf(buf, cap, "%s", suffix);
    else snprintf(buf, cap, "L%lld.%s", (long long)layer, suffix);
    return buf;
}

bool td_tap_known(const char *name)
{
    static const char *const global[] = {"final.hidden", "logits"};
    static const char *const per_layer[] = {
        "hc_attn.mix", "attn.out", "gdn.out", "moe.router_logits", "moe.topk", "moe.topk_weights",
        "moe.expert_act", "moe.expert_out", "moe.shared_out", "moe.out", "ple.out", "resid",
        "hc_attn.inject", "hc_attn.combine", "hc_mlp.mix", "hc_mlp.inject", "hc_mlp.combine", "qsa.blocks",
    };
    if (!name) return false;
    for (size_t i = 0; i < TD_ARRAY_LEN(global); i++)
        if (!strcmp(name, global[i])) return true;
    if (name[0] != 'L' || !isdigit((unsigned char)name[1])) return false;
    const char *p = name + 1;
    if (p[0] == '0' && isdigit((unsigned char)p[1])) return false;
    while (isdigit((unsigned char)*p)) p++;
    if (*p != '.' || p - name > 8) return false;
    p++;
    for (size_t i = 0; i < TD_ARRAY_LEN(per_layer); i++)
        if (!strcmp(p, per_layer[i])) return true;
    return false;
}

/* ==== engine interface ======================================================================= */

td_status td_engine_run_block(td_engine *e, const td_block_call *c, td_err *err)
{
    TD_ASSERT(e && c);
    const char *bn = td_block_name(c->block);
    if (!bn) return td_err_set(err, TD_ERR_ARG, "engine %s: invalid block %d", e->ops->name, (int)c->block);
    if (!c->input || !c->output)
        return td_err_set(err, TD_ERR_ARG, "engine %s: block %s of layer %lld: input and output buffers are required",
                          e->ops->name, bn, (long long)c->layer);
    if (c->n_tokens < 1 || c->n_tokens > TD_ENGINE_MAX_TOKENS)
        return td_err_set(err, TD_ERR_RANGE, "engine %s: block %s of layer %lld: %lld tokens (expected 1..%d)",
                          e->ops->name, bn, (long long)c->layer, (long long)c->n_tokens,
                          TD_ENGINE_MAX_TOKENS);
    if (c->layer < 0 || c->layer >= e->model.layers)
        return td_err_set(err, TD_ERR_RANGE, "engine %s: layer %lld is outside the model (%lld layers)",
                          e->ops->name, (long long)c->layer, (long long)e->model.layers);
    if (!c->route_ids != !c->route_weights)
        return td_err_set(err, TD_ERR_ARG, "engine %s: route_ids and route_weights go together",
                          e->ops->name);
    if (c->route_ids && c->block != TD_BLOCK_MOE)
        return td_err_set(err, TD_ERR_ARG, "engine %s: imposed routes only apply to the moe block",
                          e->ops->name);
    return e->ops->run_block(e, c, err);
}

td_status td_engine_prefill(td_engine *e, int64_t seq, const int32_t *tokens, int64_t n, float *logits,
                            td_err *err)
{
    TD_ASSERT(e);
    if (!e->ops->prefill)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine %s: prefill is not implemented", e->ops->name);
    return e->ops->prefill(e, seq, tokens, n, logits, err);
}

td_status td_engine_decode(td_engine *e, const td_decode_item *batch, int64_t n, float *logits, td_err *err)
{
    TD_ASSERT(e);
    if (!e->ops->decode)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine %s: decode is not implemented", e->ops->name);
    return e->ops->decode(e, batch, n, logits, err);
}

void td_engine_set_taps(td_engine *e, td_taps *taps)
{
    TD_ASSERT(e);
    e->taps = taps;
}

const td_variant *td_engine_variant(const td_engine *e) { return &e->variant; }
const td_engine_model *td_engine_model_info(const td_engine *e) { return &e->model; }
const td_engine_device *td_engine_device_info(const td_engine *e) { return &e->device; }

void td_engine_driver_version(const char *text, size_t len, char *out, size_t cap)
{
    static const char key[] = "NVRM version:";
    const size_t kl = sizeof key - 1;
    if (cap) out[0] = '\0';
    if (!text || !out || !cap) return;
    size_t i = 0;
    /* the line that starts with the key */
    for (;;) {
        if (len - i >= kl && !memcmp(text + i, key, kl)) break;
        while (i < len && text[i] != '\n') i++;
        if (i >= len) return;
        i++;
    }
    i += kl;
    while (i < len && text[i] != '\n') {
        while (i < len && (text[i] == ' ' || text[i] == '\t')) i++;
        size_t b = i, dots = 0;
        bool digits_dots = true;
        while (i < len && text[i] != ' ' && text[i] != '\t' && text[i] != '\n') {
            if (text[i] == '.') dots++;
            else if (text[i] < '0' || text[i] > '9') digits_dots = false;
            i++;
        }
        const size_t n = i - b;
        if (n && digits_dots && dots && text[b] != '.' && text[i - 1] != '.') {
            if (n >= cap) return;
            memcpy(out, text + b, n);
            out[n] = '\0';
            return;
        }
    }
}

void td_engine_read_driver_version(char *out, size_t cap)
{
    if (!out || !cap) return;
    out[0] = '\0';
    FILE *f = fopen("/proc/driver/nvidia/version", "rb");
    if (!f) return;
    char buf[4096];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    td_engine_driver_version(buf, n, out, cap);
}

void td_engine_free(td_engine *e)
{
    if (!e) return;
    e->ops->free(e);
}

td_status td_engine_put_tap(td_engine *e, int64_t layer, const char *suffix, td_dtype dtype, int ndim,
                            const int64_t *shape, const void *data, td_err *err)
{
    char name[TD_TAP_NAME_MAX];
    td_tap_name(name, sizeof name, layer, suffix);
    if (!td_taps_wants(e->taps, name)) return TD_OK;
    return td_taps_put(e->taps, name, dtype, ndim, shape, data, err);
}

void td_engine_model_from_config(const td_config *c, td_engine_model *m)
{
    m->family = c->family;
    m->hidden = c->hidden_size;
    m->layers = c->num_hidden_layers;
    m->num_experts = c->num_experts;
    m->top_k = c->num_experts_per_tok;
    m->moe_inter = c->moe_intermediate_size;
    m->shared_inter = c->shared_expert_intermediate_size;
    m->norm_topk_prob = c->norm_topk_prob;
}

td_status td_engine_check_tp(const td_config *c, int tp_size, const char *engine, const char *checkpoint,
                             td_err *err)
{
    if (tp_size <= 1 || c->num_experts <= 0) return TD_OK;
    if (c->moe_intermediate_size % tp_size == 0 && c->shared_expert_intermediate_size % tp_size == 0) return TD_OK;
    return td_err_set(err, TD_ERR_ARG,
                      "engine %s: tp_size %d does not divide moe_intermediate_size %lld / "
                      "shared_expert_intermediate_size %lld of %s",
                      engine, tp_size, (long long)c->moe_intermediate_size,
                      (long long)c->shared_expert_intermediate_size, checkpoint);
}
