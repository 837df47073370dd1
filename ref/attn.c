/* attn.c — gated full attention with a KV cache (numerics in attn.h). */
#include "attn.h"
#include "moe.h"
#include "norm.h"
#include "rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_kv_free(ref_kv *kv)
{
    free(kv->k);
    free(kv->v);
    *kv = (ref_kv){0};
}

void ref_attn_ws_free(ref_attn_ws *ws)
{
    ref_mm_free(&ws->mm);
    free(ws->qg);
    free(ws->q);
    free(ws->k);
    free(ws->v);
    free(ws->o);
    free(ws->rope);
    free(ws->scores);
    free(ws->partial);
    *ws = (ref_attn_ws){0};
}

static td_status kv_reserve(ref_kv *kv, int64_t n, int64_t width, td_err *err)
{
    if (kv->width && kv->width != width)
        return td_err_set(err, TD_ERR_ARG, "ref attn: cache width %lld, layer needs %lld", (long long)kv->width,
                          (long long)width);
    kv->width = width;
    if (n <= kv->cap) return TD_OK;
    int64_t cap = kv->cap ? kv->cap : 16;
    while (cap < n) cap *= 2;
    float *k = realloc(kv->k, (size_t)(cap * width) * sizeof *k);
    if (!k) return td_err_set(err, TD_ERR_NOMEM, "ref attn: out of memory (KV cache of %lld tokens)", (long long)cap);
    kv->k = k;
    float *v = realloc(kv->v, (size_t)(cap * width) * sizeof *v);
    if (!v) return td_err_set(err, TD_ERR_NOMEM, "ref attn: out of memory (KV cache of %lld tokens)", (long long)cap);
    kv->v = v;
    kv->cap = cap;
    return TD_OK;
}

typedef struct attn_ctx {
    const ref_attn_weights *w;
    const ref_attn_dims *d;
    ref_attn_ws *ws;
    ref_kv *kv;
    int64_t m, len0, scores_stride;
    float scale;
} attn_ctx;

/* Per token: q/k norms, RoPE, append K and V to the cache. */
static void prep_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    attn_ctx *c = ctx;
    const ref_attn_dims *d = c->d;
    const int64_t hd = d->head_dim, half = d->rot / 2, W = d->kv_heads * hd;
    float *cs = c->ws->rope + t * 2 * half;
    ref_rope_table(d->rot, d->theta, c->len0 + t, cs, cs + half);
    for (int64_t h = 0; h < d->heads; h++) {
        const float *src = c->ws->qg + (t * d->heads + h) * 2 * hd;
        float *q = c->ws->q + (t * d->heads + h) * hd;
        ref_rmsnorm_zc(src, hd, c->w->q_norm, d->eps, q);
        ref_rope_apply(q, d->rot, cs, cs + half);
    }
    float *kc = c->kv->k + (c->len0 + t) * W, *vc = c->kv->v + (c->len0 + t) * W;
    for (int64_t j = 0; j < d->kv_heads; j++) {
        ref_rmsnorm_zc(c->ws->k + t * W + j * hd, hd, c->w->k_norm, d->eps, kc + j * hd);
        ref_rope_apply(kc + j * hd, d->rot, cs, cs + half);
    }
    memcpy(vc, c->ws->v + t * W, (size_t)W * sizeof *vc);
}

/* Per (token, query head): causal softmax attention and the sigmoid gate. */
static void head_item(void *ctx, int64_t item, int worker)
{
    attn_ctx *c = ctx;
    const ref_attn_dims *d = c->d;
    const int64_t t = item / d->heads, h = item % d->heads, hd = d->head_dim, W = d->kv_heads * hd;
    const int64_t kvh = h / (d->heads / d->kv_heads), n = c->len0 + t + 1;
    const float *q = c->ws->q + (t * d->heads + h) * hd;
    float *s = c->ws->scores + (int64_t)worker * c->scores_stride;
    float *p = s + c->scores_stride / 2;
    for (int64_t j = 0; j < n; j++) {
        const float *k = c->kv->k + j * W + kvh * hd;
        float acc = 0.0f;
        for (int64_t e = 0; e < hd; e++) acc = acc + q[e] * k[e];
        s[j] = acc * c->scale;
    }
    ref_softmax(s, n, p, TD_ACCUM_FP32);
    const float *g = c->ws->qg + (t * d->heads + h) * 2 * hd + hd;
    float *o = c->ws->o + (t * d->heads + h) * hd;
    for (int64_t e = 0; e < hd; e++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) acc = acc + p[j] * c->kv->v[j * W + kvh * hd + e];
        o[e] = acc * ref_sigmoid(g[e]);
    }
}

td_status ref_attn_run(const ref_attn_weights *w, const ref_attn_dims *d, const ref_numerics *nx,
                       const ref_rowpar *rp, ref_pool *pool, ref_attn_ws *ws, ref_kv *kv, const float *x, int64_t m,
                       float *out, td_err *err)
{
    const int64_t H = d->hidden, hd = d->head_dim, W = d->kv_heads * hd, Q = d->heads * hd;
    const int64_t len0 = kv->len, n_max = len0 + m, workers = ref_pool_threads(pool);
    int64_t cols = H > Q ? H : Q;
    if (rp->tp_size < 1 || d->heads % rp->tp_size)
        return td_err_set(err, TD_ERR_RANGE, "ref attention: tp_size %d does not divide the %lld query heads",
                          rp->tp_size, (long long)d->heads);
    td_status st = ref_rowpar_check(&w->o, rp, err);
    if (st) return st;
    st = kv_reserve(kv, n_max, W, err);
    if (!st) st = ref_mm_reserve(&ws->mm, (int)workers, m, cols, err);
    if (!st) st = ref_grow(&ws->qg, &ws->cap_qg, m * 2 * Q, err);
    if (!st) st = ref_grow(&ws->q, &ws->cap_q, m * Q, err);
    if (!st) st = ref_grow(&ws->k, &ws->cap_k, m * W, err);
    if (!st) st = ref_grow(&ws->v, &ws->cap_v, m * W, err);
    if (!st) st = ref_grow(&ws->o, &ws->cap_o, m * Q, err);
    if (!st) st = ref_grow(&ws->rope, &ws->cap_rope, m * d->rot, err);
    if (!st) st = ref_grow(&ws->scores, &ws->cap_scores, workers * 2 * n_max, err);
    if (!st && rp->tp_size > 1) st = ref_grow(&ws->partial, &ws->cap_partial, m * H, err);
    if (st) return st;
    ref_mm(&w->q, nx, pool, &ws->mm, x, H, m, ws->qg, 2 * Q);
    ref_mm(&w->k, nx, pool, &ws->mm, x, H, m, ws->k, W);
    ref_mm(&w->v, nx, pool, &ws->mm, x, H, m, ws->v, W);
    attn_ctx c = {w, d, ws, kv, m, len0, 2 * n_max, (float)(1.0 / sqrt((double)hd))};
    ref_pool_run(pool, m, prep_item, &c);
    ref_pool_run(pool, m * d->heads, head_item, &c);
    kv->len = n_max;
    return ref_mm_rowpar(&w->o, nx, rp, pool, &ws->mm, ws->o, Q, m, out, H, ws->partial, err);
}
