/* gdn.c — Gated DeltaNet (numerics in gdn.h). */
#include "gdn.h"
#include "moe.h"
#include "norm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GDN_CONV_CHUNK 64

int64_t ref_gdn_channels(const ref_gdn_dims *d)
{
    return 2 * d->nk * d->dk + d->nv * d->dv;
}

td_status ref_gdn_state_init(ref_gdn_state *s, const ref_gdn_dims *d, td_err *err)
{
    const int64_t C = ref_gdn_channels(d);
    s->conv = calloc((size_t)(C * (d->kconv - 1) + 1), sizeof *s->conv);
    s->S = calloc((size_t)(d->nv * d->dk * d->dv), sizeof *s->S);
    if (!s->conv || !s->S) {
        ref_gdn_state_free(s);
        return td_err_set(err, TD_ERR_NOMEM, "ref gdn: out of memory (state)");
    }
    return TD_OK;
}

void ref_gdn_state_reset(ref_gdn_state *s, const ref_gdn_dims *d)
{
    memset(s->conv, 0, (size_t)(ref_gdn_channels(d) * (d->kconv - 1) + 1) * sizeof *s->conv);
    memset(s->S, 0, (size_t)(d->nv * d->dk * d->dv) * sizeof *s->S);
}

void ref_gdn_state_free(ref_gdn_state *s)
{
    free(s->conv);
    free(s->S);
    s->conv = s->S = NULL;
}

void ref_gdn_ws_free(ref_gdn_ws *ws)
{
    ref_mm_free(&ws->mm);
    free(ws->P);
    free(ws->Q);
    free(ws->mixed);
    free(ws->u);
    free(ws->y);
    free(ws->partial);
    *ws = (ref_gdn_ws){0};
}

typedef struct gdn_ctx {
    const ref_gdn_weights *w;
    const ref_gdn_dims *d;
    ref_gdn_ws *ws;
    ref_gdn_state *s;
    int64_t m, C;
} gdn_ctx;

/* Split P/Q of token t into mixed [C] (q | k | v) and the gate z (kept in P's z columns). */
static void split_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    gdn_ctx *c = ctx;
    const ref_gdn_dims *d = c->d;
    const int64_t r = d->nv / d->nk, G = 2 * d->dk + 2 * r * d->dv;
    const float *P = c->ws->P + t * d->nk * G;
    float *mx = c->ws->mixed + t * c->C;
    for (int64_t g = 0; g < d->nk; g++) {
        memcpy(mx + g * d->dk, P + g * G, (size_t)d->dk * sizeof *mx);
        memcpy(mx + d->nk * d->dk + g * d->dk, P + g * G + d->dk, (size_t)d->dk * sizeof *mx);
        memcpy(mx + 2 * d->nk * d->dk + g * r * d->dv, P + g * G + 2 * d->dk, (size_t)(r * d->dv) * sizeof *mx);
    }
}

static void conv_item(void *ctx, int64_t item, int worker)
{
    (void)worker;
    gdn_ctx *c = ctx;
    const int64_t K = c->d->kconv, c0 = item * GDN_CONV_CHUNK;
    int64_t c1 = c0 + GDN_CONV_CHUNK;
    if (c1 > c->C) c1 = c->C;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *wt = c->w->conv_w + ch * K;
        float *st = c->s->conv + ch * (K - 1);
        for (int64_t t = 0; t < c->m; t++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                const int64_t src = t - (K - 1) + j; /* token index; < 0 reads the state */
                const float in = src >= 0 ? c->ws->mixed[src * c->C + ch] : st[K - 1 + src];
                acc = acc + wt[j] * in;
            }
            c->ws->u[t * c->C + ch] = ref_silu(acc);
        }
        /* New state: the last K-1 inputs (state then this call's tokens), oldest first. */
        for (int64_t j = 0; j < K - 1; j++) {
            const int64_t src = c->m - (K - 1) + j;
            st[j] = src >= 0 ? c->ws->mixed[src * c->C + ch] : st[K - 1 + src];
        }
    }
}

/* Note on conv_item's state update: entries are read oldest first and j ascending, and a read
 * of st[K-1+src] (src < 0) is at index >= j, never an entry already overwritten. */

static void qk_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    gdn_ctx *c = ctx;
    const ref_gdn_dims *d = c->d;
    const float qs = (float)(1.0 / sqrt((double)d->dk));
    float *u = c->ws->u + t * c->C;
    for (int64_t h = 0; h < 2 * d->nk; h++) {
        float *x = u + h * d->dk;
        ref_l2norm(x, d->dk, 1e-6f, x);
        if (h < d->nk)
            for (int64_t i = 0; i < d->dk; i++) x[i] = x[i] * qs;
    }
}

static void head_item(void *ctx, int64_t j, int worker)
{
    (void)worker;
    gdn_ctx *c = ctx;
    const ref_gdn_dims *d = c->d;
    const int64_t r = d->nv / d->nk, G = 2 * d->dk + 2 * r * d->dv, kh = j / r, dk = d->dk, dv = d->dv;
    float *S = c->s->S + j * dk * dv;
    const float eA = (float)exp((double)c->w->A_log[j]);
    for (int64_t t = 0; t < c->m; t++) {
        const float *u = c->ws->u + t * c->C;
        const float *q = u + kh * dk, *k = u + d->nk * dk + kh * dk, *v = u + 2 * d->nk * dk + j * dv;
        const float *Qr = c->ws->Q + t * 2 * d->nv + kh * 2 * r;
        const float bj = d->split ? c->ws->Q[t * 2 * d->nv + j] : Qr[j % r];
        const float aj = d->split ? c->ws->Q[t * 2 * d->nv + d->nv + j] : Qr[r + j % r];
        const float beta = ref_sigmoid(bj);
        const float g = -eA * ref_softplus(aj + c->w->dt_bias[j]);
        const float decay = (float)exp((double)g);
        float *y = c->ws->y + t * d->nv * dv + j * dv;
        for (int64_t i = 0; i < dk * dv; i++) S[i] = S[i] * decay;
        for (int64_t e = 0; e < dv; e++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < dk; i++) acc = acc + S[i * dv + e] * k[i];
            y[e] = (v[e] - acc) * beta; /* delta, kept in y until the read-out */
        }
        for (int64_t i = 0; i < dk; i++)
            for (int64_t e = 0; e < dv; e++) S[i * dv + e] = S[i * dv + e] + k[i] * y[e];
        for (int64_t e = 0; e < dv; e++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < dk; i++) acc = acc + S[i * dv + e] * q[i];
            y[e] = acc;
        }
        const float *z = d->split ? c->ws->P + t * d->nv * dv + j * dv
                                  : c->ws->P + t * d->nk * G + kh * G + 2 * dk + r * dv + (j % r) * dv;
        if (d->sigmoid_gate)
            ref_rmsnorm_gated_sigmoid(y, z, dv, c->w->norm_w, d->eps, y);
        else
            ref_rmsnorm_gated(y, z, dv, c->w->norm_w, d->eps, y);
    }
}

td_status ref_gdn_run(const ref_gdn_weights *w, const ref_gdn_dims *d, const ref_numerics *nx,
                      const ref_rowpar *rp, ref_pool *pool, ref_gdn_ws *ws, ref_gdn_state *s, const float *x, int64_t m,
                      float *out, td_err *err)
{
    const int64_t H = d->hidden, r = d->nv / d->nk, G = 2 * d->dk + 2 * r * d->dv, C = ref_gdn_channels(d);
    const int64_t Y = d->nv * d->dv;
    if (rp->tp_size < 1 || d->nk % rp->tp_size)
        return td_err_set(err, TD_ERR_RANGE, "ref gated deltanet: tp_size %d does not divide the %lld key heads",
                          rp->tp_size, (long long)d->nk);
    td_status st = ref_rowpar_check(&w->out, rp, err);
    if (!st) st = ref_mm_reserve(&ws->mm, ref_pool_threads(pool), m, H > Y ? H : Y, err);
    if (!st) st = ref_grow(&ws->P, &ws->cap_P, m * (d->split ? Y : d->nk * G), err);
    if (!st) st = ref_grow(&ws->Q, &ws->cap_Q, m * 2 * d->nv, err);
    if (!st) st = ref_grow(&ws->mixed, &ws->cap_mixed, m * C, err);
    if (!st) st = ref_grow(&ws->u, &ws->cap_u, m * C, err);
    if (!st) st = ref_grow(&ws->y, &ws->cap_y, m * Y, err);
    if (!st && rp->tp_size > 1) st = ref_grow(&ws->partial, &ws->cap_partial, m * H, err);
    if (st) return st;
    gdn_ctx c = {w, d, ws, s, m, C};
    if (d->split) {
        ref_mm(&w->qkv, nx, pool, &ws->mm, x, H, m, ws->mixed, C);
        ref_mm(&w->z, nx, pool, &ws->mm, x, H, m, ws->P, Y);
        ref_mm(&w->b, nx, pool, &ws->mm, x, H, m, ws->Q, 2 * d->nv);
        ref_mm(&w->a, nx, pool, &ws->mm, x, H, m, ws->Q + d->nv, 2 * d->nv);
    } else {
        ref_mm(&w->qkvz, nx, pool, &ws->mm, x, H, m, ws->P, d->nk * G);
        ref_mm(&w->ba, nx, pool, &ws->mm, x, H, m, ws->Q, 2 * d->nv);
        ref_pool_run(pool, m, split_item, &c);
    }
    ref_pool_run(pool, (C + GDN_CONV_CHUNK - 1) / GDN_CONV_CHUNK, conv_item, &c);
    ref_pool_run(pool, m, qk_item, &c);
    ref_pool_run(pool, d->nv, head_item, &c);
    return ref_mm_rowpar(&w->out, nx, rp, pool, &ws->mm, ws->y, Y, m, out, H, ws->partial, err);
}
