/* moe.c — the reference MoE block (see moe.h for the math and rounding points). */
#include "moe.h"
#include "formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Rows of the router / down projection computed per work item. */
#define ROUTER_CHUNK 16
#define DOWN_CHUNK 64
/* Tokens combined per work item. */
#define TOKEN_CHUNK 4

/* ==== pieces ================================================================================= */

float ref_round_act(float v, td_act_dtype a)
{
    switch (a) {
    case TD_ACT_FP16: return td_f16_to_f32(td_f32_to_f16(v));
    case TD_ACT_BF16: return td_bf16_to_f32(td_f32_to_bf16(v));
    default: return v;
    }
}

float ref_silu(float g)
{
    double d = (double)g;
    return (float)(d / (1.0 + exp(-d)));
}

float ref_sigmoid(float v)
{
    return (float)(1.0 / (1.0 + exp(-(double)v)));
}

void ref_softmax(const float *logits, int64_t n, float *p, td_accum accum)
{
    if (n <= 0) return;
    float m = logits[0];
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > m || isnan(m)) m = logits[i];
    if (accum == TD_ACCUM_FP64) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) s += exp((double)logits[i] - (double)m);
        for (int64_t i = 0; i < n; i++) p[i] = (float)(exp((double)logits[i] - (double)m) / s);
        return;
    }
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        p[i] = (float)exp((double)(logits[i] - m)); /* e_i, overwritten below */
        s += p[i];
    }
    for (int64_t i = 0; i < n; i++) p[i] = p[i] / s;
}

/* a (index ia) ranks before b (index ib): larger first, NaN last, lower index on ties. */
static bool ranks_before(float a, int64_t ia, float b, int64_t ib)
{
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b)) return true;
    if (a != b) return a > b;
    return ia < ib;
}

void ref_topk(const float *p, int64_t n, int64_t k, int32_t *ids, float *vals)
{
    TD_ASSERT(k >= 1 && k <= n);
    int64_t have = 0;
    for (int64_t i = 0; i < n; i++) {
        if (have == k && !ranks_before(p[i], i, vals[k - 1], ids[k - 1])) continue;
        int64_t pos = have < k ? have++ : k - 1; /* slot to fill, then bubble up */
        while (pos > 0 && ranks_before(p[i], i, vals[pos - 1], ids[pos - 1])) {
            vals[pos] = vals[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        vals[pos] = p[i];
        ids[pos] = (int32_t)i;
    }
}

void ref_renorm(float *w, int64_t k, td_accum accum)
{
    if (accum == TD_ACCUM_FP64) {
        double s = 0.0;
        for (int64_t j = 0; j < k; j++) s += (double)w[j];
        for (int64_t j = 0; j < k; j++) w[j] = (float)((double)w[j] / s);
        return;
    }
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += w[j];
    for (int64_t j = 0; j < k; j++) w[j] = w[j] / s;
}

td_status ref_expert_shard(const ref_expert *whole, int64_t inter, int tp_size, int rank,
                           td_fault fault, ref_expert *out, td_err *err)
{
    TD_ASSERT(tp_size >= 1 && rank >= 0 && rank < tp_size);
    if (inter % tp_size)
        return td_err_set(err, TD_ERR_RANGE, "intermediate size %lld is not divisible by tp_size %d",
                          (long long)inter, tp_size);
    const int64_t il = inter / tp_size;
    const int down_rank = fault == TD_FAULT_TP_SLICE ? (rank + 1) % tp_size : rank;
    td_status st = ref_linear_rows_slice(&whole->gate, rank * il, il, &out->gate, err);
    if (!st) st = ref_linear_rows_slice(&whole->up, rank * il, il, &out->up, err);
    if (!st) st = ref_linear_cols_slice(&whole->down, down_rank * il, il, &out->down, err);
    if (st) return td_err_prefix(err, "TP rank %d of %d: ", rank, tp_size);
    return TD_OK;
}

/* ==== workspace ============================================================================== */

void ref_moe_ws_free(ref_moe_ws *ws)
{
    if (!ws) return;
    free(ws->x);
    free(ws->logits);
    free(ws->probs);
    free(ws->ids);
    free(ws->weights);
    free(ws->offset);
    free(ws->cursor);
    free(ws->slots);
    free(ws->active);
    free(ws->act);
    free(ws->eout);
    free(ws->sh_act);
    free(ws->sh_out);
    free(ws->sh_gate);
    free(ws->sh_gate_w);
    free(ws->partial);
    free(ws->scratch);
    free(ws->tmp);
    free(ws->xp);
    free(ws->yp);
    memset(ws, 0, sizeof *ws);
}

static bool grow(void **p, size_t count, size_t size)
{
    if (count == 0) count = 1;
    void *q = realloc(*p, count * size);
    if (!q) return false;
    *p = q;
    return true;
}

td_status ref_moe_ws_reserve(ref_moe_ws *ws, const ref_moe_weights *w, int64_t tokens, int workers,
                             td_err *err)
{
    const int64_t H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter, Is = w->shared_inter;
    int64_t max_cols = H > I ? H : I;
    if (Is > max_cols) max_cols = Is;
    if (tokens <= ws->cap_tokens && workers <= ws->workers && H == ws->hidden && E == ws->n_experts &&
        k == ws->top_k && I <= ws->inter && Is <= ws->shared_inter && max_cols <= ws->max_cols)
        return TD_OK;
    /* Grow to the largest of what is held and what is asked. */
    int64_t M = tokens > ws->cap_tokens ? tokens : ws->cap_tokens;
    int nw = workers > ws->workers ? workers : ws->workers;
    int64_t Ic = I > ws->inter ? I : ws->inter;
    int64_t Isc = Is > ws->shared_inter ? Is : ws->shared_inter;
    if (ws->max_cols > max_cols) max_cols = ws->max_cols;
    if (M > TD_ENGINE_MAX_TOKENS || k > 4096 || E > (1 << 24))
        return td_err_set(err, TD_ERR_RANGE, "ref moe: workspace for %lld tokens x top-%lld is too large",
                          (long long)M, (long long)k);
    const size_t mk = (size_t)(M * k), lmax = mk > (size_t)M ? mk : (size_t)M;
    const size_t f = sizeof(float);
    bool ok = grow((void **)&ws->x, (size_t)(M * H), f) && grow((void **)&ws->logits, (size_t)(M * E), f) &&
              grow((void **)&ws->probs, (size_t)(M * E), f) &&
              grow((void **)&ws->ids, mk, sizeof(int32_t)) && grow((void **)&ws->weights, mk, f) &&
              grow((void **)&ws->offset, (size_t)E + 1, sizeof(int64_t)) &&
              grow((void **)&ws->cursor, (size_t)E, sizeof(int64_t)) &&
              grow((void **)&ws->slots, mk, sizeof(int64_t)) &&
              grow((void **)&ws->active, (size_t)E, sizeof(int32_t)) &&
              grow((void **)&ws->act, mk * (size_t)Ic, f) && grow((void **)&ws->eout, mk * (size_t)H, f) &&
              grow((void **)&ws->sh_act, (size_t)(M * Isc), f) && grow((void **)&ws->sh_out, (size_t)(M * H), f) &&
              grow((void **)&ws->sh_gate, (size_t)M, f) && grow((void **)&ws->sh_gate_w, (size_t)H, f) &&
              grow((void **)&ws->partial, (size_t)(M * H), f) &&
              grow((void **)&ws->scratch, (size_t)nw * REF_LINEAR_SCRATCH(max_cols), f) &&
              grow((void **)&ws->tmp, (size_t)nw * 2 * lmax * REF_MOE_CHUNK, f) &&
              grow((void **)&ws->xp, (size_t)nw * lmax, sizeof(float *)) &&
              grow((void **)&ws->yp, (size_t)nw * 2 * lmax, sizeof(float *));
    if (!ok)
        return td_err_set(err, TD_ERR_NOMEM, "ref moe: out of memory (workspace for %lld tokens)",
                          (long long)M);
    ws->cap_tokens = M;
    ws->workers = nw;
    ws->hidden = H;
    ws->n_experts = E;
    ws->top_k = k;
    ws->inter = Ic;
    ws->shared_inter = Isc;
    ws->max_cols = max_cols;
    return TD_OK;
}

/* ==== one run: shared state of the work items ================================================ */

typedef struct moe_run {
    const ref_moe_weights *w;
    const ref_moe_opts *o;
    ref_moe_ws *ws;
    int64_t M, H, E, k;
    int rank;                   /* the rank being computed */
    int64_t il, isl;            /* per-rank intermediate sizes */
    int64_t n_active;           /* experts with slots */
    int64_t chunks_a, chunks_as;/* gate/up chunks per routed / shared expert */
    int64_t chunks_b;           /* down chunks per expert */
    size_t lmax;                /* max inputs of one linear call */
    ref_expert shared;          /* this rank's shard of the shared expert */
    float *out;                 /* [M, H] */
} moe_run;

/* A run of M tokens over the layer's shapes; the rest zero. */
static moe_run moe_run_of(const ref_moe_weights *w, const ref_moe_opts *o, ref_moe_ws *ws, int64_t M)
{
    moe_run R;
    memset(&R, 0, sizeof R);
    R.w = w;
    R.o = o;
    R.ws = ws;
    R.M = M;
    R.H = w->hidden;
    R.E = w->n_experts;
    R.k = w->top_k;
    R.lmax = (size_t)(M * w->top_k > M ? M * w->top_k : M);
    return R;
}

static float *worker_scratch(const moe_run *R, int worker)
{
    return R->ws->scratch + (size_t)worker * REF_LINEAR_SCRATCH(R->ws->max_cols);
}

/* Router logits: rows [16c, 16c + 16) of the router for every token. */
static void router_item(void *ctx, int64_t item, int worker)
{
    moe_run *R = ctx;
    ref_moe_ws *ws = R->ws;
    const int64_t r0 = item * ROUTER_CHUNK;
    const int64_t r1 = r0 + ROUTER_CHUNK < R->E ? r0 + ROUTER_CHUNK : R->E;
    const float **xp = ws->xp + (size_t)worker * R->lmax; /* [M] token inputs */
    float **yp = ws->yp + (size_t)worker * 2 * R->lmax;    /* [M] logit rows at column r0 */
    for (int64_t t = 0; t < R->M; t++) {
        xp[t] = ws->x + t * R->H;
        yp[t] = ws->logits + t * R->E + r0;
    }
    ref_linear_rows(&R->w->router, &R->o->nx, r0, r1, xp, yp, R->M, worker_scratch(R, worker));
}

/* Softmax, top-k and renormalization of one token. */
static void route_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    moe_run *R = ctx;
    ref_moe_ws *ws = R->ws;
    float *p = ws->probs + t * R->E;
    ref_softmax(ws->logits + t * R->E, R->E, p, R->o->nx.accum);
    int32_t *ids = ws->ids + t * R->k;
    float *w = ws->weights + t * R->k;
    ref_topk(p, R->E, R->k, ids, w);
    if (R->o->nx.fault == TD_FAULT_TOPK_SKIP && R->k < R->E) {
        /* the planted bug: the last slot takes the best unselected expert (lowest index on ties) */
        int64_t best = -1;
        for (int64_t e = 0; e < R->E; e++) {
            bool sel = false;
            for (int64_t j = 0; j < R->k && !sel; j++) sel = ids[j] == (int32_t)e;
            if (!sel && (best < 0 || p[e] > p[best])) best = e;
        }
        ids[R->k - 1] = (int32_t)best;
        w[R->k - 1] = p[best];
    }
    if (R->w->norm_topk_prob && R->o->nx.fault != TD_FAULT_NO_RENORM)
        ref_renorm(ws->weights + t * R->k, R->k, R->o->nx.accum);
}

/* Destination row of list entry i: base + (idx ? idx[i] : i) * stride. */
static inline float *list_row(float *base, const int64_t *idx, int64_t i, int64_t stride)
{
    return base + (idx ? idx[i] : i) * stride;
}

/* Gate/up rows [c0, c1) of one expert for n inputs xp[i], SwiGLU, into the rows of `dst`
 * picked by idx (act rows of the slots, or shared rows of the tokens). */
static void swiglu_rows(moe_run *R, const ref_expert *ex, int64_t c0, int64_t c1, const float *const *xp,
                        int64_t n, float *dst, const int64_t *idx, int64_t stride, int worker)
{
    ref_moe_ws *ws = R->ws;
    float *tg = ws->tmp + (size_t)worker * 2 * R->lmax * REF_MOE_CHUNK; /* [n, CHUNK] gate */
    float *tu = tg + R->lmax * REF_MOE_CHUNK;                          /* [n, CHUNK] up */
    float **yg = ws->yp + (size_t)worker * 2 * R->lmax;                /* [n] -> tg rows */
    float **yu = yg + R->lmax;                                         /* [n] -> tu rows */
    for (int64_t i = 0; i < n; i++) {
        yg[i] = tg + i * REF_MOE_CHUNK;
        yu[i] = tu + i * REF_MOE_CHUNK;
    }
    float *scratch = worker_scratch(R, worker);
    ref_linear_rows(&ex->gate, &R->o->nx, c0, c1, xp, yg, n, scratch);
    ref_linear_rows(&ex->up, &R->o->nx, c0, c1, xp, yu, n, scratch);
    const bool swap = R->o->nx.fault == TD_FAULT_GATE_UP_SWAP;
    for (int64_t i = 0; i < n; i++) {
        float *d = list_row(dst, idx, i, stride);
        for (int64_t c = c0; c < c1; c++) {
            const float g = yg[i][c - c0], u = yu[i][c - c0];
            const float h = swap ? ref_silu(u) * g : ref_silu(g) * u;
            d[c] = ref_round_act(h, R->o->act);
        }
    }
}

/* Down rows [h0, h1) of one expert for n inputs (rows of `src` picked by idx), into the
 * matching rows of `dst` (stride H), rounded to act_dtype. */
static void down_rows(moe_run *R, const ref_expert *ex, int64_t h0, int64_t h1, const float *src,
                      int64_t src_stride, const int64_t *idx, int64_t n, float *dst, int worker)
{
    ref_moe_ws *ws = R->ws;
    const float **xp = ws->xp + (size_t)worker * R->lmax; /* [n] intermediate rows */
    float **yp = ws->yp + (size_t)worker * 2 * R->lmax;    /* [n] output rows at column h0 */
    for (int64_t i = 0; i < n; i++) {
        xp[i] = src + (idx ? idx[i] : i) * src_stride;
        yp[i] = list_row(dst, idx, i, R->H) + h0;
    }
    ref_linear_rows(&ex->down, &R->o->nx, h0, h1, xp, yp, n, worker_scratch(R, worker));
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < h1 - h0; h++) yp[i][h] = ref_round_act(yp[i][h], R->o->act);
}

static void shard_of(const moe_run *R, int64_t e, ref_expert *out)
{
    td_err e2;
    /* Shapes were validated for every expert before the phase started. */
    td_status st = ref_expert_shard(&R->w->experts[e], R->w->inter, R->o->tp_size, R->rank,
                                    R->o->nx.fault, out, &e2);
    TD_ASSERT(st == TD_OK);
}

/* Phase A: one chunk of REF_MOE_CHUNK intermediate rows of one expert (routed, then shared). */
static void swiglu_item(void *ctx, int64_t item, int worker)
{
    moe_run *R = ctx;
    ref_moe_ws *ws = R->ws;
    const float **xp = ws->xp + (size_t)worker * R->lmax; /* [n] token inputs of the list */
    if (item < R->n_active * R->chunks_a) {
        const int64_t e = ws->active[item / R->chunks_a];
        const int64_t c0 = (item % R->chunks_a) * REF_MOE_CHUNK;
        const int64_t c1 = c0 + REF_MOE_CHUNK < R->il ? c0 + REF_MOE_CHUNK : R->il;
        ref_expert ex;
        shard_of(R, e, &ex);
        const int64_t s0 = ws->offset[e], n = ws->offset[e + 1] - s0;
        for (int64_t i = 0; i < n; i++) xp[i] = ws->x + (ws->slots[s0 + i] / R->k) * R->H;
        swiglu_rows(R, &ex, c0, c1, xp, n, ws->act, ws->slots + s0, R->il, worker);
        return;
    }
    const int64_t c0 = (item - R->n_active * R->chunks_a) * REF_MOE_CHUNK;
    const int64_t c1 = c0 + REF_MOE_CHUNK < R->isl ? c0 + REF_MOE_CHUNK : R->isl;
    for (int64_t t = 0; t < R->M; t++) xp[t] = ws->x + t * R->H;
    swiglu_rows(R, &R->shared, c0, c1, xp, R->M, ws->sh_act, NULL, R->isl, worker);
}

/* Phase B: one chunk of DOWN_CHUNK output rows of one expert (routed, then shared). */
static void down_item(void *ctx, int64_t item, int worker)
{
    moe_run *R = ctx;
    ref_moe_ws *ws = R->ws;
    const int64_t a = item / R->chunks_b;
    const int64_t h0 = (item % R->chunks_b) * DOWN_CHUNK;
    const int64_t h1 = h0 + DOWN_CHUNK < R->H ? h0 + DOWN_CHUNK : R->H;
    if (a < R->n_active) {
        const int64_t e = ws->active[a];
        ref_expert ex;
        shard_of(R, e, &ex);
        const int64_t s0 = ws->offset[e], n = ws->offset[e + 1] - s0;
        down_rows(R, &ex, h0, h1, ws->act, R->il, ws->slots + s0, n, ws->eout, worker);
        return;
    }
    down_rows(R, &R->shared, h0, h1, ws->sh_act, R->isl, NULL, R->M, ws->sh_out, worker);
}

/* Phase C: the shared gate and the weighted sum of TOKEN_CHUNK tokens. */
static void combine_item(void *ctx, int64_t item, int worker)
{
    (void)worker;
    moe_run *R = ctx;
    ref_moe_ws *ws = R->ws;
    const bool f64 = R->o->nx.accum == TD_ACCUM_FP64;
    const bool shared = R->w->has_shared;
    const int64_t t1 = (item + 1) * TOKEN_CHUNK < R->M ? (item + 1) * TOKEN_CHUNK : R->M;
    for (int64_t t = item * TOKEN_CHUNK; t < t1; t++) {
        const float *w = ws->weights + t * R->k;        /* [k] */
        const float *y = ws->eout + t * R->k * R->H;    /* [k, H] */
        float *o = R->out + t * R->H;                    /* [H] */
        float sg = 0.0f;
        if (shared) {
            sg = ref_sigmoid(ref_dot(ws->sh_gate_w, ws->x + t * R->H, R->H, R->o->nx.accum));
            ws->sh_gate[t] = sg;
        }
        const float *ys = ws->sh_out + t * R->H;        /* [H] */
        for (int64_t h = 0; h < R->H; h++) {
            float v;
            if (f64) {
                double acc = 0.0;
                for (int64_t j = 0; j < R->k; j++) acc += (double)w[j] * (double)y[j * R->H + h];
                if (shared) acc += (double)sg * (double)ys[h];
                v = (float)acc;
            } else {
                float acc = 0.0f;
                for (int64_t j = 0; j < R->k; j++) acc += w[j] * y[j * R->H + h];
                if (shared) acc += sg * ys[h];
                v = acc;
            }
            o[h] = ref_round_act(v, R->o->act);
        }
    }
}

/* ==== the block ============================================================================== */

static void round_input(const ref_moe_opts *o, ref_moe_ws *ws, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) ws->x[i] = ref_round_act(x[i], o->act);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static td_status check_reserved(const ref_moe_weights *w, const ref_moe_ws *ws, int64_t M, ref_pool *pool,
                                td_err *err)
{
    if (M < 1 || M > ws->cap_tokens || ws->hidden != w->hidden || ws->n_experts != w->n_experts ||
        ws->top_k != w->top_k || ws->inter < w->inter || ws->shared_inter < w->shared_inter ||
        ws->workers < ref_pool_threads(pool))
        return td_err_set(err, TD_ERR_INTERNAL, "ref moe: workspace not reserved for %lld tokens",
                          (long long)M);
    return TD_OK;
}

td_status ref_moe_router(const ref_moe_weights *w, const ref_moe_opts *o, ref_pool *pool, ref_moe_ws *ws,
                         const float *x, int64_t M, float *out, td_err *err)
{
    td_status st = check_reserved(w, ws, M, pool, err);
    if (st) return st;
    if (!w->has_router) return td_err_set(err, TD_ERR_NOTFOUND, "ref moe: the layer has no router");
    moe_run R = moe_run_of(w, o, ws, M);
    round_input(o, ws, x, M * R.H);
    ref_pool_run(pool, ceil_div(R.E, ROUTER_CHUNK), router_item, &R);
    memcpy(out, ws->logits, (size_t)(M * R.E) * sizeof(float));
    return TD_OK;
}

/* Group the M*k slots by expert (counting sort, ascending slot order within an expert). */
static void group_slots(moe_run *R)
{
    ref_moe_ws *ws = R->ws;
    const int64_t n = R->M * R->k;
    memset(ws->offset, 0, (size_t)(R->E + 1) * sizeof(int64_t));
    for (int64_t s = 0; s < n; s++) ws->offset[ws->ids[s] + 1]++;
    R->n_active = 0;
    for (int64_t e = 0; e < R->E; e++) {
        if (ws->offset[e + 1]) ws->active[R->n_active++] = (int32_t)e;
        ws->offset[e + 1] += ws->offset[e];
    }
    /* fill in ascending slot order: a cursor per expert, starting at its offset */
    memcpy(ws->cursor, ws->offset, (size_t)R->E * sizeof(int64_t));
    for (int64_t s = 0; s < n; s++) ws->slots[ws->cursor[ws->ids[s]]++] = s;
}

/* One rank's partial output into out [M, H]. */
static td_status run_rank(moe_run *R, ref_pool *pool, int rank, float *out, td_err *err)
{
    const ref_moe_weights *w = R->w;
    R->rank = rank;
    R->out = out;
    const int T = R->o->tp_size;
    R->il = w->inter / T;
    R->isl = w->has_shared ? w->shared_inter / T : 0;
    /* validate every shard this rank will use before any work item runs */
    for (int64_t a = 0; a < R->n_active; a++) {
        ref_expert ex;
        const int64_t e = R->ws->active[a];
        td_status st = ref_expert_shard(&w->experts[e], w->inter, T, rank, R->o->nx.fault, &ex, err);
        if (st) return td_err_prefix(err, "expert %lld: ", (long long)e);
    }
    if (w->has_shared) {
        td_status st = ref_expert_shard(&w->shared, w->shared_inter, T, rank, R->o->nx.fault, &R->shared, err);
        if (st) return td_err_prefix(err, "shared expert: ");
    }
    R->chunks_a = ceil_div(R->il, REF_MOE_CHUNK);
    R->chunks_as = w->has_shared ? ceil_div(R->isl, REF_MOE_CHUNK) : 0;
    R->chunks_b = ceil_div(R->H, DOWN_CHUNK);
    ref_pool_run(pool, R->n_active * R->chunks_a + R->chunks_as, swiglu_item, R);
    ref_pool_run(pool, (R->n_active + (w->has_shared ? 1 : 0)) * R->chunks_b, down_item, R);
    ref_pool_run(pool, ceil_div(R->M, TOKEN_CHUNK), combine_item, R);
    return TD_OK;
}

td_status ref_moe_run(const ref_moe_weights *w, const ref_moe_opts *o, ref_pool *pool, ref_moe_ws *ws,
                      const float *x, int64_t M, const int32_t *ids, const float *weights, float *out,
                      td_err *err)
{
    td_status st = check_reserved(w, ws, M, pool, err);
    if (st) return st;
    const int T = o->tp_size;
    if (T < 1 || (o->tp_rank != TD_TP_RANK_ALL && (o->tp_rank < 0 || o->tp_rank >= T)))
        return td_err_set(err, TD_ERR_ARG, "ref moe: tp_rank %d with tp_size %d", o->tp_rank, T);
    if (w->inter % T || (w->has_shared && w->shared_inter % T))
        return td_err_set(err, TD_ERR_RANGE,
                          "ref moe: intermediate sizes %lld (experts) and %lld (shared) are not divisible by tp_size %d",
                          (long long)w->inter, (long long)w->shared_inter, T);
    moe_run R = moe_run_of(w, o, ws, M);
    const int64_t nk = M * R.k;
    if (ids) {
        for (int64_t s = 0; s < nk; s++)
            if (ids[s] < 0 || ids[s] >= R.E)
                return td_err_set(err, TD_ERR_RANGE,
                                  "ref moe: route id %d of token %lld slot %lld is outside [0, %lld)",
                                  (int)ids[s], (long long)(s / R.k), (long long)(s % R.k), (long long)R.E);
    } else if (!w->has_router) {
        return td_err_set(err, TD_ERR_NOTFOUND, "ref moe: the layer has no router and no routes were given");
    }
    round_input(o, ws, x, M * R.H);
    ws->router_ran = !ids;
    if (ids) {
        memcpy(ws->ids, ids, (size_t)nk * sizeof(int32_t));
        memcpy(ws->weights, weights, (size_t)nk * sizeof(float));
    } else {
        ref_pool_run(pool, ceil_div(R.E, ROUTER_CHUNK), router_item, &R);
        ref_pool_run(pool, M, route_item, &R);
    }
    group_slots(&R);
    if (w->has_shared) ref_linear_decode_row(&w->shared_gate, &o->nx, 0, ws->sh_gate_w);

    if (o->tp_rank != TD_TP_RANK_ALL) return run_rank(&R, pool, o->tp_rank, out, err);
    /* every rank, summed in rank order (float32 or double), then rounded again */
    for (int r = 0; r < T; r++) {
        st = run_rank(&R, pool, r, r == 0 ? out : ws->partial, err);
        if (st) return st;
        if (r == 0) continue;
        const int64_t n = M * R.H;
        for (int64_t i = 0; i < n; i++) out[i] = out[i] + ws->partial[i];
    }
    for (int64_t i = 0; i < M * R.H; i++) out[i] = ref_round_act(out[i], o->act);
    return TD_OK;
}
