/* hc.c — hyper-connection mix and combine (numerics in hc.h). */
#include "hc.h"
#include "moe.h"
#include "norm.h"

#include <stdlib.h>

void ref_hc_ws_free(ref_hc_ws *ws)
{
    ref_mm_free(&ws->mm);
    free(ws->xn);
    free(ws->d);
    free(ws->mp);
    free(ws->ip);
    *ws = (ref_hc_ws){0};
}

void ref_rmsnorm_zc_grouped(const float *x, int64_t groups, int64_t n, const float *w, float eps, float *y)
{
    for (int64_t g = 0; g < groups; g++) ref_rmsnorm_zc(x + g * n, n, w + g * n, eps, y + g * n);
}

typedef struct hc_ctx {
    const ref_hc_weights *w;
    const ref_hc_dims *d;
    ref_hc_ws *ws;
    const float *X;
    float *xin, *inj;
} hc_ctx;

static void norm_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    hc_ctx *c = ctx;
    const int64_t P = c->d->hc * c->d->hidden;
    ref_rmsnorm_zc_grouped(c->X + t * P, c->d->hc, c->d->hidden, c->w->norm, c->d->eps, c->ws->xn + t * P);
}

static void act_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    hc_ctx *c = ctx;
    const float hc = (float)c->d->hc;
    float *dd = c->ws->d + t * c->d->rank;
    for (int64_t j = 0; j < c->d->rank; j++) dd[j] = ref_silu(dd[j] / hc);
}

static void out_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    hc_ctx *c = ctx;
    const int64_t H = c->d->hidden, P = c->d->hc * H;
    const float hc = (float)c->d->hc;
    const float *mp = c->ws->mp + t * P, *xn = c->ws->xn + t * P;
    float *xin = c->xin + t * H;
    for (int64_t i = 0; i < H; i++) {
        float acc = 0.0f;
        for (int64_t s = 0; s < c->d->hc; s++) acc = acc + ref_sigmoid(mp[s * H + i]) * xn[s * H + i];
        xin[i] = acc / hc;
    }
    if (c->w->has_inject && c->inj) {
        const float *ip = c->ws->ip + t * c->d->hc;
        for (int64_t s = 0; s < c->d->hc; s++) c->inj[t * c->d->hc + s] = 2.0f * ref_sigmoid(ip[s] / hc);
    }
}

td_status ref_hc_mix(const ref_hc_weights *w, const ref_hc_dims *d, const ref_numerics *nx, ref_pool *pool,
                     ref_hc_ws *ws, const float *X, int64_t m, float *xin, float *inj, td_err *err)
{
    const int64_t P = d->hc * d->hidden;
    td_status st = ref_mm_reserve(&ws->mm, ref_pool_threads(pool), m, P > d->rank ? P : d->rank, err);
    if (!st) st = ref_grow(&ws->xn, &ws->cap_xn, m * P, err);
    if (!st) st = ref_grow(&ws->d, &ws->cap_d, m * d->rank, err);
    if (!st) st = ref_grow(&ws->mp, &ws->cap_mp, m * P, err);
    if (!st) st = ref_grow(&ws->ip, &ws->cap_ip, m * d->hc, err);
    if (st) return st;
    hc_ctx c = {w, d, ws, X, xin, inj};
    ref_pool_run(pool, m, norm_item, &c);
    ref_mm(&w->down, nx, pool, &ws->mm, ws->xn, P, m, ws->d, d->rank);
    ref_pool_run(pool, m, act_item, &c);
    ref_mm(&w->up, nx, pool, &ws->mm, ws->d, d->rank, m, ws->mp, P);
    if (w->has_inject) ref_mm(&w->inject, nx, pool, &ws->mm, ws->xn, P, m, ws->ip, d->hc);
    ref_pool_run(pool, m, out_item, &c);
    return TD_OK;
}

void ref_hc_combine(const ref_hc_dims *d, float *X, const float *y, const float *inj, int64_t m)
{
    const int64_t H = d->hidden, P = d->hc * H;
    for (int64_t t = 0; t < m; t++)
        for (int64_t s = 0; s < d->hc; s++) {
            const float g = inj[t * d->hc + s];
            float *x = X + t * P + s * H;
            const float *yy = y + t * H;
            for (int64_t i = 0; i < H; i++) x[i] = x[i] + g * yy[i];
        }
}
