/* qsa.c — QSA sparse attention with indexer (numerics in qsa.h). */
#include "qsa.h"
#include "moe.h"
#include "norm.h"
#include "rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_qsa_cache_free(ref_qsa_cache *c)
{
    free(c->k);
    free(c->v);
    free(c->ki);
    free(c->kb);
    *c = (ref_qsa_cache){0};
}

void ref_qsa_ws_free(ref_qsa_ws *ws)
{
    ref_mm_free(&ws->mm);
    free(ws->qg);
    free(ws->q);
    free(ws->k);
    free(ws->v);
    free(ws->o);
    free(ws->iq);
    free(ws->iqn);
    free(ws->rope);
    free(ws->scores);
    free(ws->pairs);
    free(ws->bscore);
    free(ws->sel);
    free(ws->nsel);
    *ws = (ref_qsa_ws){0};
}

static td_status grow_bytes(void **p, int64_t *cap, int64_t n, size_t el, td_err *err)
{
    if (n <= *cap) return TD_OK;
    void *q = realloc(*p, (size_t)n * el);
    if (!q) return td_err_set(err, TD_ERR_NOMEM, "ref qsa: out of memory");
    *p = q;
    *cap = n;
    return TD_OK;
}

static td_status cache_reserve(ref_qsa_cache *c, const ref_qsa_dims *d, int64_t n, td_err *err)
{
    const int64_t kw = d->a.kv_heads * d->a.head_dim;
    if (c->kw && c->kw != kw) return td_err_set(err, TD_ERR_ARG, "ref qsa: cache width mismatch");
    c->kw = kw;
    if (n <= c->cap) return TD_OK;
    int64_t cap = c->cap ? c->cap : 16;
    while (cap < n) cap *= 2;
    float *k = realloc(c->k, (size_t)(cap * kw) * sizeof *k);
    if (k) c->k = k;
    float *v = k ? realloc(c->v, (size_t)(cap * kw) * sizeof *v) : NULL;
    if (v) c->v = v;
    float *ki = v ? realloc(c->ki, (size_t)(cap * d->idx_dim) * sizeof *ki) : NULL;
    if (ki) c->ki = ki;
    float *kb = ki ? realloc(c->kb, (size_t)((cap / d->block + 1) * d->idx_dim) * sizeof *kb) : NULL;
    if (!kb) return td_err_set(err, TD_ERR_NOMEM, "ref qsa: out of memory (cache of %lld tokens)", (long long)cap);
    c->kb = kb;
    c->cap = cap;
    return TD_OK;
}

typedef struct qsa_ctx {
    const ref_qsa_weights *w;
    const ref_qsa_dims *d;
    ref_qsa_ws *ws;
    ref_qsa_cache *c;
    int64_t m, len0, scores_stride, pairs_stride;
    float scale, iscale;
} qsa_ctx;

/* Per token: main q/k norms + RoPE, K/V into the cache; indexer queries; raw indexer key. */
static void prep_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    qsa_ctx *c = ctx;
    const ref_attn_dims *a = &c->d->a;
    const int64_t hd = a->head_dim, half = a->rot / 2, W = a->kv_heads * hd, di = c->d->idx_dim;
    const int64_t ih = c->d->idx_heads;
    float *cs = c->ws->rope + t * 2 * half;
    ref_rope_table(a->rot, a->theta, c->len0 + t, cs, cs + half);
    for (int64_t h = 0; h < a->heads; h++) {
        float *q = c->ws->q + (t * a->heads + h) * hd;
        ref_rmsnorm_zc(c->ws->qg + (t * a->heads + h) * 2 * hd, hd, c->w->a.q_norm, a->eps, q);
        ref_rope_apply(q, a->rot, cs, cs + half);
    }
    float *kc = c->c->k + (c->len0 + t) * W;
    for (int64_t j = 0; j < a->kv_heads; j++) {
        ref_rmsnorm_zc(c->ws->k + t * W + j * hd, hd, c->w->a.k_norm, a->eps, kc + j * hd);
        ref_rope_apply(kc + j * hd, a->rot, cs, cs + half);
    }
    memcpy(c->c->v + (c->len0 + t) * W, c->ws->v + t * W, (size_t)W * sizeof(float));
    const float *iq = c->ws->iq + t * (ih + 1) * di;
    for (int64_t h = 0; h < ih; h++) {
        float *qn = c->ws->iqn + (t * ih + h) * di;
        ref_rmsnorm_zc(iq + h * di, di, c->w->q_ln, a->eps, qn);
        ref_rope_apply(qn, a->rot, cs, cs + half);
    }
    memcpy(c->c->ki + (c->len0 + t) * di, iq + ih * di, (size_t)di * sizeof(float));
}

/* Per token: block scores and the selected blocks (ascending ids). */
static void select_item(void *ctx, int64_t t, int worker)
{
    qsa_ctx *c = ctx;
    const ref_qsa_dims *d = c->d;
    const int64_t p = c->len0 + t, nb = (p + 1) / d->block, di = d->idx_dim, ih = d->idx_heads;
    int32_t *sel = c->ws->sel + t * d->topk;
    for (int64_t i = 0; i < d->topk; i++) sel[i] = -1;
    if (nb <= d->topk) {
        for (int64_t b = 0; b < nb; b++) sel[b] = (int32_t)b;
        c->ws->nsel[t] = nb;
        return;
    }
    ref_topk_pair *pr = c->ws->pairs + (int64_t)worker * c->pairs_stride;
    float *sc = c->ws->bscore + (int64_t)worker * c->pairs_stride;
    const float *qn = c->ws->iqn + t * ih * di;
    for (int64_t b = 0; b < nb; b++) {
        const float *kb = c->c->kb + b * di;
        float acc = 0.0f;
        for (int64_t h = 0; h < ih; h++) {
            float dot = 0.0f;
            for (int64_t e = 0; e < di; e++) dot = dot + qn[h * di + e] * kb[e];
            acc = acc + (dot > 0.0f ? dot : 0.0f);
        }
        sc[b] = acc * c->iscale;
    }
    ref_topk_torch(sc, nb, d->topk, pr, sel);
    c->ws->nsel[t] = d->topk;
}

/* Per (token, query head): softmax attention over Sel(t) and the sigmoid gate. */
static void head_item(void *ctx, int64_t item, int worker)
{
    qsa_ctx *c = ctx;
    const ref_attn_dims *a = &c->d->a;
    const int64_t t = item / a->heads, h = item % a->heads, hd = a->head_dim, W = a->kv_heads * hd;
    const int64_t kvh = h / (a->heads / a->kv_heads), p = c->len0 + t, B = c->d->block;
    const int64_t nb = (p + 1) / B, ns = c->ws->nsel[t];
    const int32_t *sel = c->ws->sel + t * c->d->topk;
    const float *q = c->ws->q + (t * a->heads + h) * hd;
    float *s = c->ws->scores + (int64_t)worker * c->scores_stride;
    float *pr = s + c->scores_stride / 3;
    int32_t *pos = (int32_t *)(pr + c->scores_stride / 3);
    int64_t n = 0;
    for (int64_t i = 0; i < ns; i++)
        for (int64_t j = 0; j < B; j++) pos[n++] = (int32_t)(sel[i] * B + j);
    for (int64_t j = nb * B; j <= p; j++) pos[n++] = (int32_t)j;
    for (int64_t i = 0; i < n; i++) {
        const float *k = c->c->k + (int64_t)pos[i] * W + kvh * hd;
        float acc = 0.0f;
        for (int64_t e = 0; e < hd; e++) acc = acc + q[e] * k[e];
        s[i] = acc * c->scale;
    }
    ref_softmax(s, n, pr, TD_ACCUM_FP32);
    const float *g = c->ws->qg + (t * a->heads + h) * 2 * hd + hd;
    float *o = c->ws->o + (t * a->heads + h) * hd;
    for (int64_t e = 0; e < hd; e++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; i++) acc = acc + pr[i] * c->c->v[(int64_t)pos[i] * W + kvh * hd + e];
        o[e] = acc * ref_sigmoid(g[e]);
    }
}

/* Keys of the blocks completed by the first n tokens (serial; cheap). */
static void block_keys(const ref_qsa_weights *w, const ref_qsa_dims *d, ref_qsa_cache *c, int64_t n, float *cs)
{
    const int64_t B = d->block, di = d->idx_dim, half = d->a.rot / 2;
    const float fb = (float)B;
    for (; c->nblocks < n / B; c->nblocks++) {
        const int64_t b = c->nblocks;
        float *kb = c->kb + b * di;
        for (int64_t e = 0; e < di; e++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < B; j++) acc = acc + c->ki[(b * B + j) * di + e];
            kb[e] = acc / fb;
        }
        ref_rmsnorm_zc(kb, di, w->k_ln, d->a.eps, kb);
        ref_rope_table(d->a.rot, d->a.theta, b * B, cs, cs + half);
        ref_rope_apply(kb, d->a.rot, cs, cs + half);
    }
}

td_status ref_qsa_run(const ref_qsa_weights *w, const ref_qsa_dims *d, const ref_numerics *nx, ref_pool *pool,
                      ref_qsa_ws *ws, ref_qsa_cache *cache, const float *x, int64_t m, float *out,
                      int32_t *sel_out, td_err *err)
{
    const ref_attn_dims *a = &d->a;
    const int64_t H = a->hidden, hd = a->head_dim, W = a->kv_heads * hd, Q = a->heads * hd;
    const int64_t di = d->idx_dim, ih = d->idx_heads, len0 = cache->len, n_max = len0 + m;
    const int64_t workers = ref_pool_threads(pool), nbmax = n_max / d->block + 1;
    if (a->rot > di || d->block < 1 || d->topk < 1)
        return td_err_set(err, TD_ERR_ARG, "ref qsa: rotary dim %lld > indexer head dim %lld or bad block/topk",
                          (long long)a->rot, (long long)di);
    const int64_t sstride = 3 * n_max;
    td_status st = cache_reserve(cache, d, n_max, err);
    if (!st) st = ref_mm_reserve(&ws->mm, (int)workers, m, H > Q ? H : Q, err);
    if (!st) st = ref_grow(&ws->qg, &ws->cap_qg, m * 2 * Q, err);
    if (!st) st = ref_grow(&ws->q, &ws->cap_q, m * Q, err);
    if (!st) st = ref_grow(&ws->k, &ws->cap_k, m * W, err);
    if (!st) st = ref_grow(&ws->v, &ws->cap_v, m * W, err);
    if (!st) st = ref_grow(&ws->o, &ws->cap_o, m * Q, err);
    if (!st) st = ref_grow(&ws->iq, &ws->cap_iq, m * (ih + 1) * di, err);
    if (!st) st = ref_grow(&ws->iqn, &ws->cap_iqn, m * ih * di, err);
    if (!st) st = ref_grow(&ws->rope, &ws->cap_rope, (m + 1) * a->rot, err);
    if (!st) st = ref_grow(&ws->scores, &ws->cap_scores, workers * sstride, err);
    if (!st) st = grow_bytes((void **)&ws->pairs, &ws->cap_pairs, workers * nbmax, sizeof *ws->pairs, err);
    if (!st) st = ref_grow(&ws->bscore, &ws->cap_bscore, workers * nbmax, err);
    if (!st) st = grow_bytes((void **)&ws->sel, &ws->cap_sel, m * d->topk, sizeof *ws->sel, err);
    if (!st) st = grow_bytes((void **)&ws->nsel, &ws->cap_nsel, m, sizeof *ws->nsel, err);
    if (st) return st;
    ref_mm(&w->a.q, nx, pool, &ws->mm, x, H, m, ws->qg, 2 * Q);
    ref_mm(&w->a.k, nx, pool, &ws->mm, x, H, m, ws->k, W);
    ref_mm(&w->a.v, nx, pool, &ws->mm, x, H, m, ws->v, W);
    ref_mm(&w->idx, nx, pool, &ws->mm, x, H, m, ws->iq, (ih + 1) * di);
    qsa_ctx c = {w, d, ws, cache, m, len0, sstride, nbmax, (float)(1.0 / sqrt((double)hd)),
                 (float)(1.0 / sqrt((double)di))};
    ref_pool_run(pool, m, prep_item, &c);
    block_keys(w, d, cache, n_max, ws->rope + m * a->rot);
    ref_pool_run(pool, m, select_item, &c);
    ref_pool_run(pool, m * a->heads, head_item, &c);
    cache->len = n_max;
    if (sel_out) memcpy(sel_out, ws->sel, (size_t)(m * d->topk) * sizeof *sel_out);
    ref_mm(&w->a.o, nx, pool, &ws->mm, ws->o, Q, m, out, H);
    return TD_OK;
}
