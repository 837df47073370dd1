/* layer_audit.c — the per-layer MoE audit (see layer_audit.h). */
#include "layer_audit.h"
#include "db/db.h"
#include "engines.h"
#include "progress.h"
#include "ref/moe.h"
#include "rng.h"
#include "routes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ==== names, pairs =========================================================================== */

static const char *const route_names[] = {"router", "random", "same-expert", "invalid", "mod17"};
_Static_assert(TD_ARRAY_LEN(route_names) == TD_ROUTE_COUNT, "route names");

const char *td_route_kind_name(td_route_kind r)
{
    return (unsigned)r < TD_ROUTE_COUNT ? route_names[r] : NULL;
}

td_status td_route_kind_parse(const char *s, td_route_kind *r, td_err *err)
{
    for (int i = 0; i < TD_ROUTE_COUNT; i++)
        if (!strcmp(s, route_names[i])) {
            *r = (td_route_kind)i;
            return TD_OK;
        }
    return td_err_set(err, TD_ERR_ARG, "route '%s': expected router, random, same-expert, invalid or mod17", s);
}

const char *const td_layer_tap_suffixes[] = {
    "moe.router_logits", "moe.topk", "moe.topk_weights", "moe.expert_act", "moe.expert_out", "moe.shared_out",
};
const size_t td_layer_tap_suffix_count = TD_ARRAY_LEN(td_layer_tap_suffixes);

/* Precision rank of what a variant computes in: 0 FP32, 1 FP16, 2 BF16. */
/* Coarsest activation rounding a variant applies: 2 BF16, 1 FP16, 0 FP32. */
static int precision_rank(const td_variant *v)
{
    return v->act_dtype == TD_ACT_BF16 ? 2 : v->act_dtype == TD_ACT_FP16 ? 1 : 0;
}

/* Does the variant multiply NVFP4 codes by FP16 effective scales? ref with scale=fp16, and the
 * cuda engine always (storage=raw is admitted only when bit-identical to prepared). */
static bool fp16_scales(const td_variant *v)
{
    return v->scale == TD_SCALE_FP16 || !strcmp(v->engine, "cuda");
}

/* Does `tok` start a new variant (an engine name, bare or followed by ':')? Options are
 * `name=value` with no ':' before the '='. */
static bool starts_variant(const char *tok)
{
    const char *eq = strchr(tok, '='), *colon = strchr(tok, ':');
    if (!eq) return true;
    return colon && colon < eq;
}

td_status td_layer_pair_parse(const char *text, td_layer_pair *p, td_err *err)
{
    memset(p, 0, sizeof *p);
    char buf[2 * TD_VARIANT_TEXT_MAX + 64];
    if (!text || !*text || strlen(text) >= sizeof buf)
        return td_err_set(err, TD_ERR_ARG, "pair '%.60s': empty or too long (expected A,B such as ref,ref:scale=fp16)",
                          text ? text : "");
    snprintf(buf, sizeof buf, "%s", text);
    char *at = strrchr(buf, '@');
    if (at) {
        *at = 0;
        const char *ex = at + 1;
        if (!strcmp(ex, "exact")) {
            p->expect = TD_EXPECT_EXACT;
        } else if (!strncmp(ex, "bounded", 7) && (ex[7] == 0 || ex[7] == '=')) {
            p->expect = TD_EXPECT_BOUNDED;
            p->bound = (double)NAN;
            if (ex[7] == '=') {
                char *end;
                double b = strtod(ex + 8, &end);
                if (end == ex + 8 || *end || !(b > 0.0) || !isfinite(b))
                    return td_err_set(err, TD_ERR_ARG, "pair '%s': bound '%s': expected a positive number", text,
                                      ex + 8);
                p->bound = b;
            }
        } else {
            return td_err_set(err, TD_ERR_ARG, "pair '%s': '@%s': expected @exact, @bounded or @bounded=X", text, ex);
        }
        p->expect_given = true;
    }
    /* split at the comma that starts the second variant */
    char *second = NULL;
    int starts = 0;
    for (char *q = buf; q; ) {
        char *comma = strchr(q, ',');
        char save = 0;
        if (comma) {
            save = *comma;
            *comma = 0;
        }
        bool sv = *q && starts_variant(q);
        if (comma) *comma = save;
        if (sv) {
            starts++;
            if (starts == 2) second = q;
        }
        q = comma ? comma + 1 : NULL;
    }
    if (starts != 2 || !second || second == buf)
        return td_err_set(err, TD_ERR_ARG,
                          "pair '%s': expected exactly two variants A,B (e.g. ref:scale=exact,ref:scale=fp16)", text);
    second[-1] = 0;
    td_status st = td_variant_parse(buf, &p->a, err);
    if (!st) st = td_variant_parse(second, &p->b, err);
    if (st) return td_err_prefix(err, "pair '%s': ", text);
    td_variant_format(&p->a, p->a_text, sizeof p->a_text);
    td_variant_format(&p->b, p->b_text, sizeof p->b_text);
    if (!p->expect_given) {
        td_variant ra = p->a, rb = p->b;
        td_variant_resolve(&ra);
        td_variant_resolve(&rb);
        unsigned diff = td_variant_diff(&ra, &rb);
        bool neutral = !strcmp(ra.engine, rb.engine);
        for (int o = 0; o < TD_OPT_COUNT && neutral; o++)
            if ((diff & TD_OPT_BIT(o)) && !td_opt_is_neutral((td_opt)o)) neutral = false;
        p->expect = neutral ? TD_EXPECT_EXACT : TD_EXPECT_BOUNDED;
        p->bound = (double)NAN;
    }
    if (p->expect == TD_EXPECT_BOUNDED && isnan(p->bound)) {
        int r = precision_rank(&p->a) > precision_rank(&p->b) ? precision_rank(&p->a) : precision_rank(&p->b);
        if (fp16_scales(&p->a) != fp16_scales(&p->b) && r < 1) r = 1; /* FP16 vs exact scales */
        p->bound = td_metrics_bound(r == 2 ? TD_BF16 : r == 1 ? TD_F16 : TD_F32);
    }
    if (p->expect == TD_EXPECT_EXACT) p->bound = (double)NAN;
    return TD_OK;
}

void td_layer_audit_opts_init(td_layer_audit_opts *o)
{
    memset(o, 0, sizeof *o);
    o->tp = 4;
    o->seed = 20260905;
    o->outlier_mag = 100.0;
}

/* ==== engines (one per distinct resolved variant, kept for the whole audit) =================== */

typedef struct slot {
    td_variant v;                     /* resolved, TP filled in */
    char text[TD_VARIANT_TEXT_MAX];   /* canonical text (TP and threads resolved) */
    char label[TD_VARIANT_TEXT_MAX];  /* the variant as the pairs name it (first pair side) */
    td_engine *e;
    td_taps *taps[2];                 /* run 1, run 2 (repeat) */
    float *out[2];                    /* [cap] outputs of run 1 and run 2 */
    size_t cap;                       /* floats */
} slot;

typedef struct audit {
    const td_layer_audit_opts *o;
    char **tap_patterns;              /* [n_patterns] "L*.suffix": the taps asked for, then the
                                       * routes' taps the audit needs itself (moe) */
    size_t n_patterns;
    td_taps *want;                    /* the taps asked for (compared); NULL when none */
    float *ca, *cb;                   /* [cap_ca], [cap_cb]: the kept tokens' elements of a compared tensor */
    size_t cap_ca, cap_cb;
    uint8_t *mask;                    /* [cap_m] per token: TD_ROUTE_FLIP | TD_ROUTE_ORDER */
    size_t cap_m;
    slot *slots;
    size_t n_slots, cap_slots;
    td_layer_check *checks;
    size_t n_checks, cap_checks;
    float *x;                         /* [cap_x] activations */
    size_t cap_x;
    int32_t *ids;                     /* [cap_r] imposed routes */
    float *weights;                   /* [cap_r] */
    float *scores;                    /* [cap_s] random route scores */
    size_t cap_r, cap_w, cap_s;
    td_engine_model model;            /* of the first engine */
    bool have_model;
    td_engine_device device;          /* of the first engine on a GPU */
} audit;

static td_status variant_for_row(const audit *A, const td_variant *v, int64_t rank, td_variant *out, td_err *err)
{
    char text[TD_VARIANT_TEXT_MAX];
    *out = *v;
    if (!(v->set & TD_OPT_BIT(TD_OPT_TP_SIZE))) out->tp_size = A->o->tp;
    if (!(v->set & TD_OPT_BIT(TD_OPT_TP_RANK))) {
        if (rank >= out->tp_size)
            return td_err_set(err, TD_ERR_ARG, "variant '%s' runs tp_size %d: rank %lld is out of range",
                              td_variant_format(v, text, sizeof text), out->tp_size, (long long)rank);
        out->tp_rank = (int)rank;
    }
    td_variant_resolve(out);
    return TD_OK;
}

/* What a resolved variant's block output is: the full output (tp_size 1 or tp_rank=all) or one
 * rank's partial sum. */
static void describe_output(const td_variant *v, char *buf, size_t n)
{
    if (v->tp_size == 1 || v->tp_rank == TD_TP_RANK_ALL)
        snprintf(buf, n, "the full output");
    else
        snprintf(buf, n, "rank %d's partial sum of tp_size %d", v->tp_rank, v->tp_size);
}

/* The two sides of a pair must compute the same quantity: both the full output, or the same
 * rank's slice of the same tp_size. A rank's partial sum against a full output differs by
 * design, whatever the engines do. */
static td_status same_output(const td_variant *a, const td_variant *b, const td_layer_pair *p, td_err *err)
{
    const bool fa = a->tp_size == 1 || a->tp_rank == TD_TP_RANK_ALL;
    const bool fb = b->tp_size == 1 || b->tp_rank == TD_TP_RANK_ALL;
    if (fa && fb) return TD_OK;
    if (!fa && !fb && a->tp_size == b->tp_size && a->tp_rank == b->tp_rank) return TD_OK;
    char da[64], db[64];
    describe_output(a, da, sizeof da);
    describe_output(b, db, sizeof db);
    return td_err_set(err, TD_ERR_ARG,
                      "pair '%s' vs '%s' compares %s with %s: give both sides the same tp_size and tp_rank "
                      "(a side that sets neither runs --tp and the row's rank)",
                      p->a_text, p->b_text, da, db);
}

static td_status slot_get(audit *A, const td_variant *v, const char *label, size_t *idx, td_err *err)
{
    for (size_t i = 0; i < A->n_slots; i++)
        if (td_variant_equal(&A->slots[i].v, v)) {
            *idx = i;
            return TD_OK;
        }
    if (A->n_slots == A->cap_slots) {
        size_t nc = A->cap_slots ? 2 * A->cap_slots : 8;
        slot *ns = realloc(A->slots, nc * sizeof *ns);
        if (!ns) return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
        A->slots = ns;
        A->cap_slots = nc;
    }
    slot *s = &A->slots[A->n_slots];
    memset(s, 0, sizeof *s);
    s->v = *v;
    td_variant_format(v, s->text, sizeof s->text);
    snprintf(s->label, sizeof s->label, "%s", label);
    td_status st = td_engine_load(A->o->model, v, &s->e, err);
    if (st) return td_err_prefix(err, "variant '%s': ", s->label);
    for (int r = 0; r < 2 && !st; r++)
        st = td_taps_new((const char *const *)A->tap_patterns, A->n_patterns, &s->taps[r], err);
    if (st) {
        td_taps_free(s->taps[0]);
        td_engine_free(s->e);
        return st;
    }
    if (!A->have_model) {
        A->model = *td_engine_model_info(s->e);
        A->have_model = true;
    }
    if (!A->device.gpu_name[0]) A->device = *td_engine_device_info(s->e);
    *idx = A->n_slots++;
    return TD_OK;
}

static void audit_free(audit *A)
{
    for (size_t i = 0; i < A->n_slots; i++) {
        slot *s = &A->slots[i];
        td_engine_free(s->e);
        td_taps_free(s->taps[0]);
        td_taps_free(s->taps[1]);
        free(s->out[0]);
        free(s->out[1]);
    }
    free(A->slots);
    if (A->tap_patterns)
        for (size_t i = 0; i < A->n_patterns; i++) free(A->tap_patterns[i]);
    free(A->tap_patterns);
    td_taps_free(A->want);
    free(A->ca);
    free(A->cb);
    free(A->mask);
    free(A->checks);
    free(A->x);
    free(A->ids);
    free(A->weights);
    free(A->scores);
}

static bool reserve(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap) return true;
    void *q = realloc(*p, n * size);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

/* ==== inputs ================================================================================= */

static uint64_t double_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static void row_rng(uint64_t seed, int64_t layer, int64_t rank, int64_t tokens, double scale, td_rng *out)
{
    td_rng r;
    td_rng_seed(&r, seed);
    td_rng_split(&r, (uint64_t)layer, &r);
    td_rng_split(&r, (uint64_t)rank, &r);
    td_rng_split(&r, (uint64_t)tokens, &r);
    td_rng_split(&r, double_bits(scale), out);
}

static void make_inputs(audit *A, const td_rng *row, int64_t M, double scale)
{
    const int64_t H = A->model.hidden;
    td_rng xs, os;
    td_rng_split(row, 1, &xs);
    td_rng_split(row, 2, &os);
    for (int64_t i = 0; i < M * H; i++) A->x[i] = (float)(scale * td_rng_normal(&xs));
    if (A->o->outlier_frac > 0.0)
        for (int64_t i = 0; i < M * H; i++)
            if (td_rng_uniform(&os) < A->o->outlier_frac) A->x[i] = (float)((double)A->x[i] * A->o->outlier_mag);
}

/* Softmax of k N(0,1) draws as the weights of one token. */
static void random_weights(td_rng *ws, int64_t k, float *w)
{
    float v[64];
    float *vals = k <= 64 ? v : w; /* k > 64: draw in place (softmax reads before it writes) */
    for (int64_t j = 0; j < k; j++) vals[j] = td_rng_normal_f32(ws);
    ref_softmax(vals, k, w, TD_ACCUM_FP32);
}

static void make_routes(audit *A, const td_rng *row, td_route_kind route, int64_t M)
{
    const int64_t E = A->model.num_experts, k = A->model.top_k;
    td_rng rs, ws;
    td_rng_split(row, 3, &rs);
    td_rng_split(row, 4, &ws);
    for (int64_t t = 0; t < M; t++) {
        int32_t *id = A->ids + t * k;
        float *w = A->weights + t * k;
        switch (route) {
        case TD_ROUTE_RANDOM: {
            for (int64_t e = 0; e < E; e++) A->scores[e] = td_rng_normal_f32(&rs);
            float vals[64];
            float *v = k <= 64 ? vals : w;
            ref_topk(A->scores, E, k, id, v);
            ref_softmax(v, k, w, TD_ACCUM_FP32);
            break;
        }
        case TD_ROUTE_SAME_EXPERT:
            for (int64_t j = 0; j < k; j++) id[j] = 0;
            random_weights(&ws, k, w);
            break;
        case TD_ROUTE_MOD17:
            for (int64_t j = 0; j < k; j++) {
                int64_t v = (t * k + j) % 17;
                id[j] = (int32_t)(E < 17 ? v % E : v);
            }
            random_weights(&ws, k, w);
            break;
        case TD_ROUTE_INVALID:
            for (int64_t j = 0; j < k; j++)
                id[j] = (int32_t)(j % 3 == 0 ? -1 : j % 3 == 1 ? E + j : j % E);
            random_weights(&ws, k, w);
            break;
        default:
            break;
        }
    }
}

/* ==== checks ================================================================================= */

/* A check of `kind` (pair index `pair`, -1 for none) of la against lb on `tap`, with its
 * expectation (the bound kept for bounded ones only); metrics, verdict and message empty. */
static void check_init(td_layer_check *c, const char *kind, int pair, const char *la, const char *lb, const char *tap,
                       td_expect expect, double bound)
{
    memset(c, 0, sizeof *c);
    snprintf(c->kind, sizeof c->kind, "%s", kind);
    c->pair = pair;
    snprintf(c->a, sizeof c->a, "%s", la);
    snprintf(c->b, sizeof c->b, "%s", lb);
    snprintf(c->tap, sizeof c->tap, "%s", tap);
    c->expect = expect;
    c->bound = expect == TD_EXPECT_BOUNDED ? bound : (double)NAN;
    c->rel_l2_all = (double)NAN;
}

/* Append a copy of the finished check c to the row's checks. */
static td_status push_check(audit *A, const td_layer_check *c, td_err *err)
{
    if (A->n_checks == A->cap_checks) {
        size_t nc = A->cap_checks ? 2 * A->cap_checks : 32;
        td_layer_check *n = realloc(A->checks, nc * sizeof *n);
        if (!n) return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
        A->checks = n;
        A->cap_checks = nc;
    }
    A->checks[A->n_checks++] = *c;
    return TD_OK;
}

static td_dtype compare_dtype(const td_variant *a, const td_variant *b)
{
    return a->act_dtype == b->act_dtype ? td_act_dtype_tensor(a->act_dtype) : TD_F32;
}

/* Tap suffixes whose rows are the tokens' and depend on the routes, and the route differences
 * that change them: the block output sums the token's experts (another set changes it, another
 * order only reorders the sum); the per-slot taps hold slot j's expert (any difference). */
static uint8_t route_bits(const char *name)
{
    const char *suffix = name[0] == 'L' && strchr(name, '.') ? strchr(name, '.') + 1 : name;
    if (!strcmp(suffix, "moe.out")) return TD_ROUTE_FLIP;
    if (!strcmp(suffix, "moe.topk_weights") || !strcmp(suffix, "moe.expert_act") || !strcmp(suffix, "moe.expert_out"))
        return TD_ROUTE_FLIP | TD_ROUTE_ORDER;
    return 0;
}

/* The routes of a bounded pair, when they differ on some tokens and both sides' top-k follow
 * their logits: route-dependent tensors are judged on the other tokens (docs/audit-layer.md,
 * "Routes that differ"). */
typedef struct route_keep {
    const uint8_t *mask; /* [M]; NULL: judge every token */
    int64_t M;
    const char *routes_tap;
} route_keep;

/* Compare one tensor of two runs and append the check; with keep, a route-dependent float tensor
 * whose rows are the M tokens' is judged on the tokens whose routes agree. */
static td_status add_compare(audit *A, const char *kind, int pair, const char *la, const char *lb, const char *tap,
                             td_dtype dt, bool is_int, const void *a, const void *b, int64_t na, int64_t nb,
                             td_expect expect, double bound, const route_keep *keep, td_err *err)
{
    td_layer_check c;
    check_init(&c, kind, pair, la, lb, tap, expect, bound);
    if (na != nb) {
        td_metrics_f32(NULL, NULL, 0, TD_F32, &c.m);
        c.m.exact = false;
        c.m.numel = na;
        c.judged = true;
        c.pass = false;
        snprintf(c.message, sizeof c.message, "sizes differ: %lld vs %lld elements", (long long)na, (long long)nb);
        return push_check(A, &c, err);
    }
    if (is_int) td_metrics_i32(a, b, na, &c.m);
    else td_metrics_f32(a, b, na, dt, &c.m);
    c.judged = !(is_int && expect == TD_EXPECT_BOUNDED);
    c.pass = c.judged ? td_metrics_pass(&c.m, expect, c.bound) : true;
    const uint8_t bits = keep && keep->mask && !is_int ? route_bits(tap) : 0;
    if (!bits || keep->M < 1 || na % keep->M) return push_check(A, &c, err);
    const int64_t M = keep->M, per = na / M;
    int64_t kept = 0;
    for (int64_t t = 0; t < M; t++) kept += !(keep->mask[t] & bits);
    if (kept == M) return push_check(A, &c, err);
    c.tokens_excluded = M - kept;
    c.rel_l2_all = c.m.rel_l2;
    const double max_abs_all = c.m.max_abs;
    if (!kept) {
        c.pass = false;
        snprintf(c.message, sizeof c.message,
                 "every token routes differently (%s): nothing left to judge; all tokens: rel_l2 %.3e", keep->routes_tap,
                 c.rel_l2_all);
        return push_check(A, &c, err);
    }
    if (!reserve((void **)&A->ca, &A->cap_ca, (size_t)(kept * per), sizeof(float)) ||
        !reserve((void **)&A->cb, &A->cap_cb, (size_t)(kept * per), sizeof(float)))
        return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
    const float *fa = a, *fb = b;
    int64_t o = 0;
    for (int64_t t = 0; t < M; t++) {
        if (keep->mask[t] & bits) continue;
        memcpy(A->ca + o, fa + t * per, (size_t)per * sizeof(float));
        memcpy(A->cb + o, fb + t * per, (size_t)per * sizeof(float));
        o += per;
    }
    td_metrics_f32(A->ca, A->cb, o, dt, &c.m);
    if (c.m.first_diff >= 0) { /* back to the index in the whole tensor */
        int64_t want = c.m.first_diff / per, t = 0;
        for (;; t++)
            if (!(keep->mask[t] & bits) && want-- == 0) break;
        c.m.first_diff = t * per + c.m.first_diff % per;
    }
    c.pass = td_metrics_pass(&c.m, expect, c.bound);
    snprintf(c.message, sizeof c.message,
             "judged on %lld of %lld tokens: %lld route differently (%s); all tokens: rel_l2 %.3e, max |a-b| %.3e",
             (long long)kept, (long long)M, (long long)(M - kept), keep->routes_tap, c.rel_l2_all, max_abs_all);
    return push_check(A, &c, err);
}

/* The output tap of the audited block on layer L: L{l}.{block}.out (moe.out, attn.out, gdn.out). */
static void block_out_tap(char *name, size_t cap, int64_t layer, td_block b)
{
    char suffix[24];
    snprintf(suffix, sizeof suffix, "%s.out", td_block_name(b));
    td_tap_name(name, cap, layer, suffix);
}

/* The taps of one run that the routes check reads, or NULL when the run lacks them (M tokens,
 * E experts, top-k). */
static void find_route_taps(const td_taps *t, int64_t layer, int64_t M, int64_t E, int64_t k, const int32_t **ids,
                       const float **logits)
{
    char n1[TD_TAP_NAME_MAX], n2[TD_TAP_NAME_MAX];
    td_tap_name(n1, sizeof n1, layer, "moe.topk");
    td_tap_name(n2, sizeof n2, layer, "moe.router_logits");
    const td_tap *x = td_taps_find(t, n1), *y = td_taps_find(t, n2);
    *ids = x && x->dtype == TD_I32 && x->numel == M * k ? x->data : NULL;
    *logits = y && y->dtype == TD_F32 && y->numel == M * E ? y->data : NULL;
}

static const char *side_fault(const td_route_side *s, char *buf, size_t cap)
{
    switch (s->why) {
    case TD_ROUTE_BAD_ID:
        snprintf(buf, cap, "token %lld: id %d is not an expert", (long long)s->token, (int)s->sel);
        break;
    case TD_ROUTE_DUP_ID:
        snprintf(buf, cap, "token %lld: expert %d selected twice", (long long)s->token, (int)s->sel);
        break;
    case TD_ROUTE_NONFINITE:
        snprintf(buf, cap, "token %lld: logit of expert %d is %g", (long long)s->token, (int)s->sel,
                 (double)s->sel_logit);
        break;
    default:
        snprintf(buf, cap, "token %lld: expert %d selected (logit %.7g) below expert %d (%.7g)", (long long)s->token,
                 (int)s->sel, (double)s->sel_logit, (int)s->unsel, (double)s->unsel_logit);
        break;
    }
    return buf;
}

/* The routes check of a bounded pair (L{l}.moe.routes) from the two runs' taps ta and tb, into c
 * (not appended): metrics as docs/audit-layer.md says, recorded only when a side lacks the taps;
 * fills *keep when the route-dependent tensors are to be judged on the agreeing tokens. */
static td_status routes_check(audit *A, int pair, const char *la, const char *lb, int64_t layer, int64_t M,
                              const td_taps *ta, const td_taps *tb, double bound, td_layer_check *c, route_keep *keep,
                              td_err *err)
{
    const int64_t E = A->model.num_experts, k = A->model.top_k;
    char tap[TD_TAP_NAME_MAX];
    td_tap_name(tap, sizeof tap, layer, "moe.routes");
    check_init(c, "pair", pair, la, lb, tap, TD_EXPECT_BOUNDED, bound);
    keep->mask = NULL;
    keep->M = M;
    keep->routes_tap = c->tap;
    const int32_t *ia, *ib;
    const float *lga, *lgb;
    find_route_taps(ta, layer, M, E, k, &ia, &lga);
    find_route_taps(tb, layer, M, E, k, &ib, &lgb);
    if (!ia || !lga || !ib || !lgb) { /* an engine that did not capture them: recorded, not judged */
        td_metrics_i32(NULL, NULL, 0, &c->m);
        c->m.numel = M;
        c->m.exact = false;
        c->pass = true;
        snprintf(c->message, sizeof c->message,
                 "routes not compared: %s did not capture moe.topk and moe.router_logits of %lld tokens",
                 !(ia && lga) ? la : lb, (long long)M);
        return TD_OK;
    }
    if (!reserve((void **)&A->mask, &A->cap_m, (size_t)M, 1))
        return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
    td_route_cmp r;
    td_status st = td_route_compare(ia, lga, ib, lgb, M, E, k, A->mask, &r, err);
    if (st) return st;
    td_metrics_f32(lga, lgb, M * E, TD_F32, &c->m); /* rel_l2, nmse, cosine, max_ulp, finite: the logits' */
    const int64_t differ = r.flipped + r.reordered;
    c->m.numel = M;
    c->m.exact = differ == 0;
    c->m.mismatches = differ;
    c->m.first_diff = -1;
    for (int64_t t = 0; t < M && c->m.first_diff < 0; t++)
        if (A->mask[t]) c->m.first_diff = t;
    c->m.first_a = c->m.first_b = (double)NAN;
    c->m.max_abs = r.max_gap;
    c->judged = true;
    const bool follow = !r.side[0].unfollowed && !r.side[1].unfollowed;
    const bool near = differ == 0 || (c->m.finite && c->m.rel_l2 <= bound);
    c->pass = follow && near;
    char f[160];
    if (!follow) {
        const int s = r.side[0].unfollowed ? 0 : 1;
        snprintf(c->message, sizeof c->message, "%s's top-k does not follow its router logits on %lld of %lld tokens (%s)",
                 s ? lb : la, (long long)r.side[s].unfollowed, (long long)M, side_fault(&r.side[s], f, sizeof f));
    } else if (!near) {
        snprintf(c->message, sizeof c->message,
                 "%lld of %lld tokens route differently and the router logits differ beyond the bound (rel_l2 %.3e > "
                 "%.0e): not near-ties",
                 (long long)differ, (long long)M, c->m.rel_l2, bound);
    } else if (r.flipped) {
        snprintf(c->message, sizeof c->message,
                 "%lld of %lld tokens route to other experts, %lld more in another order: near-ties (largest logit gap "
                 "%.3e, token %lld: expert %d vs %d; logits rel_l2 %.3e); both sides' top-k follow their logits",
                 (long long)r.flipped, (long long)M, (long long)r.reordered, r.max_gap, (long long)r.gap_token,
                 (int)r.gap_a, (int)r.gap_b, c->m.rel_l2);
    } else if (r.reordered) {
        snprintf(c->message, sizeof c->message,
                 "%lld of %lld tokens have the same experts in another order; both sides' top-k follow their logits",
                 (long long)r.reordered, (long long)M);
    }
    if (c->pass && differ) keep->mask = A->mask;
    return TD_OK;
}

/* Block output and every tap asked for that both runs captured. A bounded pair of a moe block
 * with the engines' own routes (routes) also gets the routes check, after the block output, and
 * its route-dependent tensors are judged on the tokens whose routes agree when it passes. */
static td_status compare_runs(audit *A, const char *kind, int pair, const char *la, const char *lb, const slot *sa,
                              int ra, const slot *sb, int rb, int64_t layer, int64_t M, td_expect expect, double bound,
                              bool routes, td_err *err)
{
    const td_dtype dt = compare_dtype(&sa->v, &sb->v);
    char out_name[TD_TAP_NAME_MAX];
    block_out_tap(out_name, sizeof out_name, layer, A->o->block);
    const int64_t n = M * A->model.hidden;
    const td_taps *ta = sa->taps[ra], *tb = sb->taps[rb];
    route_keep keep = {NULL, M, ""};
    td_layer_check rc;
    const bool check_routes = routes && expect == TD_EXPECT_BOUNDED && A->o->block == TD_BLOCK_MOE;
    td_status st = check_routes ? routes_check(A, pair, la, lb, layer, M, ta, tb, bound, &rc, &keep, err) : TD_OK;
    if (!st)
        st = add_compare(A, kind, pair, la, lb, out_name, dt, false, sa->out[ra], sb->out[rb], n, n, expect, bound,
                         &keep, err);
    if (!st && check_routes) st = push_check(A, &rc, err);
    for (size_t i = 0; i < td_taps_count(ta) && !st; i++) {
        const td_tap *x = td_taps_at(ta, i);
        if (!strcmp(x->name, out_name) || !A->want || !td_taps_wants(A->want, x->name)) continue;
        const td_tap *y = td_taps_find(tb, x->name);
        if (!y || x->dtype != y->dtype) continue;
        st = add_compare(A, kind, pair, la, lb, x->name, x->dtype == TD_I32 ? TD_I32 : dt, x->dtype == TD_I32, x->data,
                         y->data, x->numel, y->numel, expect, bound, &keep, err);
    }
    return st;
}

/* ==== rows =================================================================================== */

static td_status run_slot(audit *A, slot *s, int run, const td_block_call *base, td_err *err)
{
    const size_t need = (size_t)(base->n_tokens * A->model.hidden);
    if (need > s->cap) {
        for (int r = 0; r < 2; r++) {
            float *p = realloc(s->out[r], need * sizeof(float));
            if (!p) return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
            s->out[r] = p;
        }
        s->cap = need;
    }
    /* poison: a block that does not write every output element is caught by the repeat */
    for (size_t i = 0; i < need; i++) s->out[run][i] = NAN;
    td_taps_reset(s->taps[run]);
    td_engine_set_taps(s->e, A->n_patterns ? s->taps[run] : NULL);
    td_block_call c = *base;
    c.output = s->out[run];
    return td_engine_run_block(s->e, &c, err);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static td_status do_row(audit *A, int64_t layer, int64_t rank, int64_t M, double scale, td_route_kind route,
                        const td_layer_sink *sink, td_layer_summary *sum, td_err *err);

static td_status group_add(td_layer_summary *s, const td_layer_row *row, const td_layer_check *c, td_err *err)
{
    const char *suffix = c->tap;
    if (suffix[0] == 'L') {
        const char *dot = strchr(suffix, '.');
        if (dot) suffix = dot + 1;
    }
    td_layer_group *g = NULL;
    for (size_t i = 0; i < s->n_groups && !g; i++) {
        td_layer_group *x = &s->groups[i];
        if (!strcmp(x->kind, c->kind) && !strcmp(x->a, c->a) && !strcmp(x->b, c->b) && !strcmp(x->tap, suffix) &&
            x->expect == c->expect)
            g = x;
    }
    if (!g) {
        td_layer_group *ng = realloc(s->groups, (s->n_groups + 1) * sizeof *ng);
        if (!ng) return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
        s->groups = ng;
        g = &s->groups[s->n_groups++];
        memset(g, 0, sizeof *g);
        snprintf(g->kind, sizeof g->kind, "%s", c->kind);
        snprintf(g->a, sizeof g->a, "%s", c->a);
        snprintf(g->b, sizeof g->b, "%s", c->b);
        snprintf(g->tap, sizeof g->tap, "%s", suffix);
        g->expect = c->expect;
        g->bound = c->bound;
        g->worst_layer = g->worst_rank = g->worst_tokens = -1;
        g->worst_first_diff = -1;
        g->worst_rel_l2 = -1.0;
    }
    g->checks++;
    if (!c->judged) g->skipped++;
    else if (c->pass) g->passed++;
    else g->failed++;
    if (c->m.exact && strcmp(c->kind, "reject")) g->exact++;
    if (c->tokens_excluded > 0) {
        g->tokens_excluded += c->tokens_excluded;
        g->checks_excluding++;
    }
    double rl = isnan(c->m.rel_l2) ? HUGE_VAL : c->m.rel_l2;
    bool first_failure = c->judged && !c->pass && g->failed == 1;
    if (rl > g->worst_rel_l2 || first_failure) {
        if (rl > g->worst_rel_l2) g->worst_rel_l2 = rl;
        g->worst_layer = row->layer;
        g->worst_rank = row->rank;
        g->worst_tokens = row->tokens;
        g->worst_first_diff = c->m.first_diff;
    }
    double ma = isnan(c->m.max_abs) ? HUGE_VAL : c->m.max_abs;
    if (ma > g->worst_max_abs) g->worst_max_abs = ma;
    return TD_OK;
}

static td_status do_row(audit *A, int64_t layer, int64_t rank, int64_t M, double scale, td_route_kind route,
                        const td_layer_sink *sink, td_layer_summary *sum, td_err *err)
{
    const td_layer_audit_opts *o = A->o;
    const double t0 = now_s();
    A->n_checks = 0;
    /* the distinct variants of this row, and the slot of each pair side */
    size_t pa[64], pb[64], distinct[128], n_distinct = 0;
    for (size_t i = 0; i < o->n_pairs; i++) {
        td_variant va, vb;
        td_status st = variant_for_row(A, &o->pairs[i].a, rank, &va, err);
        if (!st) st = variant_for_row(A, &o->pairs[i].b, rank, &vb, err);
        if (!st) st = same_output(&va, &vb, &o->pairs[i], err);
        if (!st) st = slot_get(A, &va, o->pairs[i].a_text, &pa[i], err);
        if (!st) st = slot_get(A, &vb, o->pairs[i].b_text, &pb[i], err);
        if (st) return st;
        size_t both[2] = {pa[i], pb[i]};
        for (int s = 0; s < 2; s++) {
            bool seen = false;
            for (size_t j = 0; j < n_distinct; j++) seen = seen || distinct[j] == both[s];
            if (!seen) distinct[n_distinct++] = both[s];
        }
    }
    const td_engine_model *m = &A->model;
    if (layer >= m->layers)
        return td_err_set(err, TD_ERR_RANGE, "layer %lld: the checkpoint has %lld layers", (long long)layer,
                          (long long)m->layers);
    const bool moe = o->block == TD_BLOCK_MOE;
    if (moe && m->num_experts < 1)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: the model has no MoE experts", o->model);
    const int64_t H = m->hidden, k = moe ? m->top_k : 1;
    if (!reserve((void **)&A->x, &A->cap_x, (size_t)(M * H), sizeof(float)) ||
        !reserve((void **)&A->ids, &A->cap_r, (size_t)(M * k), sizeof(int32_t)) ||
        !reserve((void **)&A->weights, &A->cap_w, (size_t)(M * k), sizeof(float)) ||
        !reserve((void **)&A->scores, &A->cap_s, (size_t)(moe ? m->num_experts : 1), sizeof(float)))
        return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory (%lld tokens)", (long long)M);
    td_rng rr;
    row_rng(o->seed, layer, rank, M, scale, &rr);
    make_inputs(A, &rr, M, scale);
    if (route != TD_ROUTE_ROUTER) make_routes(A, &rr, route, M);

    td_block_call call;
    memset(&call, 0, sizeof call);
    call.layer = layer;
    call.block = o->block;
    call.n_tokens = M;
    call.input = A->x;
    if (route != TD_ROUTE_ROUTER) {
        call.route_ids = A->ids;
        call.route_weights = A->weights;
    }
    td_status st = TD_OK;
    if (route == TD_ROUTE_INVALID) {
        for (size_t d = 0; d < n_distinct && !st; d++) {
            slot *s = &A->slots[distinct[d]];
            td_err e2;
            td_err_clear(&e2);
            td_status rs = run_slot(A, s, 0, &call, &e2);
            char tap[TD_TAP_NAME_MAX];
            block_out_tap(tap, sizeof tap, layer, o->block);
            td_layer_check c;
            check_init(&c, "reject", -1, s->label, s->label, tap, TD_EXPECT_EXACT, (double)NAN);
            td_metrics_f32(NULL, NULL, 0, TD_F32, &c.m);
            c.judged = true;
            c.pass = rs == TD_ERR_RANGE;
            c.m.exact = c.pass;
            if (rs == TD_OK) snprintf(c.message, sizeof c.message, "invalid route ids were accepted");
            else snprintf(c.message, sizeof c.message, "%.250s", e2.msg);
            st = push_check(A, &c, err);
        }
        if (st) return st;
    } else {
        for (size_t d = 0; d < n_distinct && !st; d++) {
            slot *s = &A->slots[distinct[d]];
            for (int r = 0; r < 2 && !st; r++) st = run_slot(A, s, r, &call, err);
            if (st) return td_err_prefix(err, "variant '%s', layer %lld, rank %lld, %lld tokens: ", s->text,
                                         (long long)layer, (long long)rank, (long long)M);
        }
        for (size_t i = 0; i < o->n_pairs && !st; i++) {
            const td_layer_pair *p = &o->pairs[i];
            st = compare_runs(A, "pair", (int)i, p->a_text, p->b_text, &A->slots[pa[i]], 0, &A->slots[pb[i]], 0, layer,
                              M, p->expect, p->bound, route == TD_ROUTE_ROUTER, err);
        }
        for (size_t d = 0; d < n_distinct && !st; d++) {
            slot *s = &A->slots[distinct[d]];
            st = compare_runs(A, "repeat", -1, s->label, s->label, s, 0, s, 1, layer, M, TD_EXPECT_EXACT, (double)NAN,
                              false, err);
        }
        if (st) return st;
    }
    td_layer_row row;
    memset(&row, 0, sizeof row);
    row.layer = layer;
    row.rank = rank;
    row.tokens = M;
    row.tp = o->tp;
    row.scale = scale;
    row.route = route;
    row.seed = o->seed;
    row.outliers = o->outlier_frac > 0.0;
    row.checks = A->checks;
    row.n_checks = A->n_checks;
    row.pass = true;
    for (size_t i = 0; i < A->n_checks; i++) {
        const td_layer_check *c = &A->checks[i];
        sum->checks++;
        if (!c->judged) sum->skipped++;
        else if (c->pass) sum->passed++;
        else {
            sum->failed++;
            row.pass = false;
        }
        st = group_add(sum, &row, c, err);
        if (st) return st;
    }
    sum->rows++;
    if (!row.pass) sum->rows_failed++;
    row.seconds = now_s() - t0;
    if (sink && sink->row) {
        st = sink->row(sink->ctx, &row, err);
        if (st) return st;
    }
    return TD_OK;
}

void td_layer_summary_free(td_layer_summary *s)
{
    if (!s) return;
    free(s->groups);
    memset(s, 0, sizeof *s);
}

td_status td_layer_audit_run(const td_layer_audit_opts *o, const td_layer_sink *sink, td_layer_summary *sum,
                             td_err *err)
{
    memset(sum, 0, sizeof *sum);
    if (!o->model) return td_err_set(err, TD_ERR_ARG, "audit layer: no checkpoint (--model DIR)");
    if (!o->n_layers || !o->n_ranks || !o->n_tokens || !o->n_scales || !o->n_routes || !o->n_pairs)
        return td_err_set(err, TD_ERR_ARG, "audit layer: empty layers, ranks, tokens, scales, routes or pairs");
    if (o->n_pairs > 64) return td_err_set(err, TD_ERR_ARG, "audit layer: at most 64 pairs");
    if (o->tp < 1 || o->tp > TD_TP_MAX) return td_err_set(err, TD_ERR_ARG, "audit layer: tp %d (expected 1..%d)", o->tp, TD_TP_MAX);
    for (size_t i = 0; i < o->n_ranks; i++)
        if (o->ranks[i] < 0 || o->ranks[i] >= o->tp)
            return td_err_set(err, TD_ERR_ARG, "audit layer: rank %lld is not in 0..%d (tp %d)", (long long)o->ranks[i],
                              o->tp - 1, o->tp);
    for (size_t i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] < 1 || o->tokens[i] > TD_ENGINE_MAX_TOKENS)
            return td_err_set(err, TD_ERR_ARG, "audit layer: %lld tokens (expected 1..%d)", (long long)o->tokens[i],
                              TD_ENGINE_MAX_TOKENS);
    for (size_t i = 0; i < o->n_scales; i++)
        if (!isfinite(o->scales[i]) || o->scales[i] < 0.0)
            return td_err_set(err, TD_ERR_ARG, "audit layer: scale %g (expected a finite value >= 0)", o->scales[i]);
    if (o->block != TD_BLOCK_MOE && o->block != TD_BLOCK_ATTN && o->block != TD_BLOCK_GDN)
        return td_err_set(err, TD_ERR_ARG, "audit layer: block '%s' (expected moe, attn or gdn)",
                          td_block_name(o->block) ? td_block_name(o->block) : "?");
    for (size_t i = 0; i < o->n_routes && o->block != TD_BLOCK_MOE; i++)
        if (o->routes[i] != TD_ROUTE_ROUTER)
            return td_err_set(err, TD_ERR_ARG, "audit layer: route '%s' applies to the moe block only (block %s)",
                              td_route_kind_name(o->routes[i]), td_block_name(o->block));
    if (!(o->outlier_frac >= 0.0 && o->outlier_frac <= 1.0) || !isfinite(o->outlier_mag))
        return td_err_set(err, TD_ERR_ARG, "audit layer: outlier fraction must be in [0, 1], magnitude finite");
    audit A;
    memset(&A, 0, sizeof A);
    A.o = o;
    td_status st = TD_OK;
    /* the taps asked for, then (moe) the routes' own: the routes check reads each side's top-k
     * and router logits whether or not they are asked for; only the asked-for taps are compared */
    static const char *const own_taps[] = {"moe.topk", "moe.router_logits"};
    const size_t n_own = o->block == TD_BLOCK_MOE ? TD_ARRAY_LEN(own_taps) : 0;
    A.n_patterns = o->n_taps + n_own;
    if (A.n_patterns) {
        A.tap_patterns = calloc(A.n_patterns, sizeof *A.tap_patterns);
        for (size_t i = 0; A.tap_patterns && i < A.n_patterns; i++) {
            const char *suffix = i < o->n_taps ? o->taps[i] : own_taps[i - o->n_taps];
            size_t l = strlen(suffix) + 4;
            A.tap_patterns[i] = malloc(l);
            if (!A.tap_patterns[i]) break;
            snprintf(A.tap_patterns[i], l, "L*.%s", suffix);
        }
        for (size_t i = 0; A.tap_patterns && i < A.n_patterns && !st; i++)
            if (!A.tap_patterns[i]) st = td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
        if (!A.tap_patterns) {
            A.n_patterns = 0;
            st = td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
        }
    }
    if (!st && o->n_taps) st = td_taps_new((const char *const *)A.tap_patterns, o->n_taps, &A.want, err);
    const uint64_t total = (uint64_t)(o->n_layers * o->n_ranks * o->n_tokens * o->n_scales * o->n_routes);
    td_progress prog;
    td_progress_init_ex(&prog, stderr, "audit layer", total, o->progress ? -1 : 0, NULL, NULL);
    const double t0 = now_s();
    uint64_t done = 0;
    for (size_t li = 0; li < o->n_layers && !st; li++)
        for (size_t ri = 0; ri < o->n_ranks && !st; ri++)
            for (size_t ti = 0; ti < o->n_tokens && !st; ti++)
                for (size_t si = 0; si < o->n_scales && !st; si++)
                    for (size_t ui = 0; ui < o->n_routes && !st; ui++) {
                        st = do_row(&A, o->layers[li], o->ranks[ri], o->tokens[ti], o->scales[si], o->routes[ui],
                                    sink, sum, err);
                        td_progress_update(&prog, ++done);
                    }
    if (!st) td_progress_done(&prog);
    else if (td_progress_enabled(&prog)) fputc('\n', stderr);
    sum->seconds = now_s() - t0;
    audit_free(&A);
    if (st) td_layer_summary_free(sum);
    sum->device = A.device; /* kept on failure too: the GPU the engines that loaded ran on */
    return st;
}

/* ==== output ================================================================================= */

static void num_or_null(cJSON *o, const char *key, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

static const char *dtype_key(td_dtype d)
{
    switch (d) {
    case TD_F16: return "f16";
    case TD_BF16: return "bf16";
    case TD_I32: return "i32";
    default: return "f32";
    }
}

static const char *verdict_of(const td_layer_check *c)
{
    return !c->judged ? "skip" : c->pass ? "pass" : "fail";
}

cJSON *td_layer_row_json(const td_layer_row *row)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "layer", (double)row->layer);
    cJSON_AddNumberToObject(o, "rank", (double)row->rank);
    cJSON_AddNumberToObject(o, "tp", row->tp);
    cJSON_AddNumberToObject(o, "tokens", (double)row->tokens);
    cJSON_AddNumberToObject(o, "scale", row->scale);
    cJSON_AddStringToObject(o, "route", td_route_kind_name(row->route));
    cJSON_AddNumberToObject(o, "seed", (double)row->seed);
    cJSON_AddBoolToObject(o, "outliers", row->outliers);
    cJSON_AddBoolToObject(o, "pass", row->pass);
    cJSON_AddNumberToObject(o, "seconds", row->seconds);
    cJSON *arr = cJSON_AddArrayToObject(o, "checks");
    for (size_t i = 0; arr && i < row->n_checks; i++) {
        const td_layer_check *c = &row->checks[i];
        cJSON *j = cJSON_CreateObject();
        if (!j) break;
        cJSON_AddStringToObject(j, "check", c->kind);
        if (c->pair >= 0) cJSON_AddNumberToObject(j, "pair", c->pair);
        else cJSON_AddNullToObject(j, "pair");
        cJSON_AddStringToObject(j, "a", c->a);
        cJSON_AddStringToObject(j, "b", c->b);
        cJSON_AddStringToObject(j, "tap", c->tap);
        cJSON_AddStringToObject(j, "expect", td_expect_name(c->expect));
        num_or_null(j, "bound", c->bound);
        cJSON_AddStringToObject(j, "dtype", dtype_key(c->m.dtype));
        cJSON_AddNumberToObject(j, "numel", (double)c->m.numel);
        cJSON_AddBoolToObject(j, "exact", c->m.exact);
        cJSON_AddBoolToObject(j, "finite", c->m.finite);
        cJSON_AddNumberToObject(j, "mismatches", (double)c->m.mismatches);
        num_or_null(j, "max_abs", c->m.max_abs);
        num_or_null(j, "relative_l2", c->m.rel_l2);
        num_or_null(j, "nmse", c->m.nmse);
        num_or_null(j, "cosine", c->m.cosine);
        if (c->m.max_ulp >= 0) cJSON_AddNumberToObject(j, "max_ulp", (double)c->m.max_ulp);
        else cJSON_AddNullToObject(j, "max_ulp");
        if (c->m.first_diff >= 0) {
            cJSON_AddNumberToObject(j, "first_diff", (double)c->m.first_diff);
            num_or_null(j, "first_a", c->m.first_a);
            num_or_null(j, "first_b", c->m.first_b);
        } else {
            cJSON_AddNullToObject(j, "first_diff");
        }
        cJSON_AddNumberToObject(j, "tokens_excluded", (double)c->tokens_excluded);
        if (c->tokens_excluded > 0) num_or_null(j, "relative_l2_all", c->rel_l2_all);
        cJSON_AddStringToObject(j, "verdict", verdict_of(c));
        if (c->message[0]) cJSON_AddStringToObject(j, "message", c->message);
        cJSON_AddItemToArray(arr, j);
    }
    return o;
}

cJSON *td_layer_summary_json(const td_layer_summary *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "rows", (double)s->rows);
    cJSON_AddNumberToObject(o, "rows_failed", (double)s->rows_failed);
    cJSON_AddNumberToObject(o, "checks", (double)s->checks);
    cJSON_AddNumberToObject(o, "passed", (double)s->passed);
    cJSON_AddNumberToObject(o, "failed", (double)s->failed);
    cJSON_AddNumberToObject(o, "skipped", (double)s->skipped);
    cJSON_AddNumberToObject(o, "seconds", s->seconds);
    if (s->device.gpu_name[0]) {
        cJSON *d = cJSON_AddObjectToObject(o, "device");
        if (d) {
            cJSON_AddStringToObject(d, "gpu_name", s->device.gpu_name);
            cJSON_AddStringToObject(d, "gpu_driver", s->device.gpu_driver);
            cJSON_AddStringToObject(d, "cuda_version", s->device.cuda_version);
        }
    } else {
        cJSON_AddNullToObject(o, "device");
    }
    cJSON *arr = cJSON_AddArrayToObject(o, "groups");
    for (size_t i = 0; arr && i < s->n_groups; i++) {
        const td_layer_group *g = &s->groups[i];
        cJSON *j = cJSON_CreateObject();
        if (!j) break;
        cJSON_AddStringToObject(j, "check", g->kind);
        cJSON_AddStringToObject(j, "a", g->a);
        cJSON_AddStringToObject(j, "b", g->b);
        cJSON_AddStringToObject(j, "tap", g->tap);
        cJSON_AddStringToObject(j, "expect", td_expect_name(g->expect));
        num_or_null(j, "bound", g->bound);
        cJSON_AddNumberToObject(j, "checks", (double)g->checks);
        cJSON_AddNumberToObject(j, "passed", (double)g->passed);
        cJSON_AddNumberToObject(j, "failed", (double)g->failed);
        cJSON_AddNumberToObject(j, "skipped", (double)g->skipped);
        cJSON_AddNumberToObject(j, "exact", (double)g->exact);
        num_or_null(j, "worst_relative_l2", g->worst_rel_l2);
        num_or_null(j, "worst_max_abs", g->worst_max_abs);
        cJSON_AddNumberToObject(j, "tokens_excluded", (double)g->tokens_excluded);
        cJSON_AddNumberToObject(j, "checks_excluding", (double)g->checks_excluding);
        cJSON_AddItemToArray(arr, j);
    }
    return o;
}

void td_layer_summary_print(const td_layer_summary *s, FILE *f)
{
    const td_layer_group *prev = NULL;
    for (size_t i = 0; i < s->n_groups; i++) {
        const td_layer_group *g = &s->groups[i];
        if (!prev || strcmp(prev->kind, g->kind) || strcmp(prev->a, g->a) || strcmp(prev->b, g->b) ||
            prev->expect != g->expect) {
            char ex[32];
            if (g->expect == TD_EXPECT_BOUNDED) snprintf(ex, sizeof ex, "bounded, rel_l2 <= %.0e", g->bound);
            else snprintf(ex, sizeof ex, "exact");
            if (!strcmp(g->kind, "pair")) fprintf(f, "%s%s vs %s (%s)\n", i ? "\n" : "", g->a, g->b, ex);
            else if (!strcmp(g->kind, "repeat")) fprintf(f, "%srepeat of %s (%s)\n", i ? "\n" : "", g->a, ex);
            else fprintf(f, "%sinvalid routes rejected by %s\n", i ? "\n" : "", g->a);
            fprintf(f, "  %-20s %7s %6s %6s %6s %12s %12s\n", "tap", "checks", "pass", "fail", "exact", "max rel_l2",
                    "max |a-b|");
        }
        prev = g;
        fprintf(f, "  %-20s %7lld %6lld %6lld %6lld %12.3e %12.3e%s\n", g->tap, (long long)g->checks,
                (long long)g->passed, (long long)g->failed, (long long)g->exact,
                g->worst_rel_l2 < 0 ? 0.0 : g->worst_rel_l2, g->worst_max_abs,
                g->skipped == g->checks ? "  (recorded only)" : "");
        if (g->checks_excluding)
            fprintf(f, "  - %lld check(s) judged without %lld token(s) whose routes differ (moe.routes)\n",
                    (long long)g->checks_excluding, (long long)g->tokens_excluded);
        if (g->failed)
            fprintf(f, "  ! first failure / worst at layer %lld rank %lld tokens %lld, first differing index %lld\n",
                    (long long)g->worst_layer, (long long)g->worst_rank, (long long)g->worst_tokens,
                    (long long)g->worst_first_diff);
    }
    fprintf(f, "\n%lld row(s), %lld check(s): %lld passed, %lld failed, %lld recorded only; %.1f s\n",
            (long long)s->rows, (long long)s->checks, (long long)s->passed, (long long)s->failed,
            (long long)s->skipped, s->seconds);
    if (s->device.gpu_name[0])
        fprintf(f, "GPU: %s (driver %s, CUDA %s)\n", s->device.gpu_name,
                s->device.gpu_driver[0] ? s->device.gpu_driver : "unknown",
                s->device.cuda_version[0] ? s->device.cuda_version : "unknown");
}

void td_layer_tap_key(const td_layer_row *row, const td_layer_check *c, char *buf, size_t cap)
{
    size_t l = (size_t)snprintf(buf, cap, "%s", c->tap);
    if (row->scale != 0.1 && l < cap) l += (size_t)snprintf(buf + l, cap - l, "#scale=%g", row->scale);
    if (row->route != TD_ROUTE_ROUTER && l < cap)
        l += (size_t)snprintf(buf + l, cap - l, "#route=%s", td_route_kind_name(row->route));
    if (row->outliers && l < cap) snprintf(buf + l, cap - l, "#outliers");
}

td_status td_layer_row_db(struct td_db *db, int64_t run_id, const td_layer_row *row, td_err *err)
{
    if (!row->n_checks) return TD_OK;
    td_db_layer_row *rows = calloc(row->n_checks, sizeof *rows);
    char(*keys)[TD_TAP_NAME_MAX + 64] = calloc(row->n_checks, sizeof *keys);
    char(*vb)[TD_VARIANT_TEXT_MAX + 16] = calloc(row->n_checks, sizeof *vb);
    if (!rows || !keys || !vb) {
        free(rows);
        free(keys);
        free(vb);
        return td_err_set(err, TD_ERR_NOMEM, "audit layer: out of memory");
    }
    for (size_t i = 0; i < row->n_checks; i++) {
        const td_layer_check *c = &row->checks[i];
        td_db_layer_row *r = &rows[i];
        td_layer_tap_key(row, c, keys[i], sizeof keys[i]);
        if (!strcmp(c->kind, "pair")) snprintf(vb[i], sizeof vb[i], "%s", c->b);
        else snprintf(vb[i], sizeof vb[i], "%s#%s", c->b, c->kind);
        r->layer = (int32_t)row->layer;
        r->rank = (int32_t)row->rank;
        r->tokens = (int32_t)row->tokens;
        r->tap = keys[i];
        r->variant_a = c->a;
        r->variant_b = vb[i];
        r->expectation = c->expect == TD_EXPECT_BOUNDED ? TD_DB_EXPECT_BOUNDED : TD_DB_EXPECT_EXACT;
        r->dtype = dtype_key(c->m.dtype);
        r->numel = c->m.numel;
        r->exact = c->m.exact;
        r->mismatches = c->m.mismatches;
        r->max_abs = c->m.max_abs;
        r->rel_l2 = c->m.rel_l2;
        r->max_ulp = c->m.max_ulp;
        r->nmse = c->m.nmse;
        r->cosine = c->m.cosine;
        r->finite = c->m.finite;
        r->first_diff = c->m.first_diff;
        r->verdict = !c->judged ? TD_DB_SKIP : c->pass ? TD_DB_PASS : TD_DB_FAIL;
    }
    td_status st = td_db_put_layers(db, run_id, rows, row->n_checks, err);
    free(rows);
    free(keys);
    free(vb);
    return st;
}
