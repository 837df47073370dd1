/* ple.c — hashed n-gram per-layer embedding (numerics in ple.h). */
#include "ple.h"
#include "formats.h"
#include "hc.h"
#include "moe.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define PLE_GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define PLE_CONV_CHUNK 64

uint64_t ref_splitmix64(uint64_t v)
{
    v += PLE_GOLDEN;
    v = (v ^ (v >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    v = (v ^ (v >> 27)) * UINT64_C(0x94D049BB133111EB);
    return v ^ (v >> 31);
}

void ref_ple_multipliers(int64_t seed, int64_t ple_index, int64_t vocab, int64_t n, uint64_t *out)
{
    const uint64_t half = ((uint64_t)INT64_MAX / (uint64_t)vocab) / 2;
    for (int64_t k = 0; k < n; k++) {
        const uint64_t v = (uint64_t)seed + UINT64_C(10007) * (uint64_t)ple_index + PLE_GOLDEN * (uint64_t)(k + 1);
        out[k] = 2 * (ref_splitmix64(v) % half) + 1;
    }
}

td_status ref_ple_state_init(ref_ple_state *s, const ref_ple_dims *d, td_err *err)
{
    const int64_t P = d->hc * d->hidden, S = d->dilation * (d->kconv - 1);
    for (int i = 0; i < REF_PLE_MAX_NGRAM; i++) s->ctx[i] = (int32_t)d->eos;
    s->conv = calloc((size_t)(P * S + 1), sizeof *s->conv);
    if (!s->conv) return td_err_set(err, TD_ERR_NOMEM, "ref ple: out of memory (state)");
    return TD_OK;
}

void ref_ple_state_free(ref_ple_state *s)
{
    free(s->conv);
    s->conv = NULL;
}

void ref_ple_ws_free(ref_ple_ws *ws)
{
    ref_mm_free(&ws->mm);
    free(ws->ids);
    free(ws->e);
    free(ws->k);
    free(ws->v);
    free(ws->q);
    free(ws->g);
    free(ws->gn);
    free(ws->a);
    *ws = (ref_ple_ws){0};
}

void ref_ple_hash(const ref_ple_dims *d, const uint64_t *mult, const int64_t *sizes, const int64_t *offsets,
                  int32_t *ctx, const int32_t *tokens, int64_t m, int64_t *ids)
{
    const int64_t n = d->ngram, nc = n - 1;
    const int32_t eos = (int32_t)d->eos;
    for (int64_t t = 0; t < m; t++) {
        int32_t ts[REF_PLE_MAX_NGRAM];
        ts[0] = tokens[t];
        bool blocked = false;
        for (int64_t s = 1; s < n; s++) {
            const int64_t p = t - s;
            const int32_t tk = p >= 0 ? tokens[p] : ctx[nc + p];
            if (blocked || tk == eos) {
                blocked = true;
                ts[s] = eos;
            } else {
                ts[s] = tk;
            }
        }
        uint64_t mix = 0;
        for (int64_t o = 0; o < n; o++) {
            mix ^= (uint64_t)(uint32_t)ts[o] * mult[o];
            if (o == 0) continue;
            for (int64_t k = 0; k < d->heads_per_ngram; k++) {
                const int64_t h = (o - 1) * d->heads_per_ngram + k;
                ids[t * d->heads + h] = (int64_t)(mix % (uint64_t)sizes[h]) + offsets[h];
            }
        }
    }
    /* the context becomes the last n-1 tokens of (context, tokens) */
    for (int64_t j = 0; j < nc; j++) {
        const int64_t p = m - nc + j;
        ctx[j] = p >= 0 ? tokens[p] : ctx[nc + p];
    }
}

void ref_ple_table_row(const ref_ple_table *t, int64_t id, float *out)
{
    const int64_t part = id / t->rows_per_part, row = id % t->rows_per_part;
    const uint8_t *base = t->shards[part];
    switch (t->dtype) {
    case TD_F8_E4M3:
        for (int64_t i = 0; i < t->dim; i++) out[i] = td_e4m3_to_f32(base[row * t->dim + i]) * t->scale;
        break;
    case TD_BF16:
    case TD_F16:
        for (int64_t i = 0; i < t->dim; i++) {
            uint16_t h;
            memcpy(&h, base + (row * t->dim + i) * 2, sizeof h);
            out[i] = t->dtype == TD_BF16 ? td_bf16_to_f32(h) : td_f16_to_f32(h);
        }
        break;
    default:
        memcpy(out, base + row * t->dim * 4, (size_t)t->dim * sizeof *out);
        break;
    }
}

typedef struct ple_ctx {
    const ref_ple_weights *w;
    const ref_ple_dims *d;
    ref_ple_ws *ws;
    ref_ple_state *s;
    const float *X;
    float *out;
    int64_t m;
} ple_ctx;

static void gather_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    ple_ctx *c = ctx;
    const ref_ple_dims *d = c->d;
    for (int64_t h = 0; h < d->heads; h++)
        ref_ple_table_row(&c->w->table, c->ws->ids[t * d->heads + h], c->ws->e + t * d->embed_dim + h * d->head_dim);
}

static void gate_item(void *ctx, int64_t t, int worker)
{
    (void)worker;
    ple_ctx *c = ctx;
    const ref_ple_dims *d = c->d;
    const int64_t H = d->hidden, P = d->hc * H;
    float *K = c->ws->k + t * P, *Q = c->ws->q + t * P, *G = c->ws->g + t * P;
    const float *v = c->ws->v + t * H;
    ref_rmsnorm_zc_grouped(K, d->hc, H, c->w->norm_key, d->eps, K);
    ref_rmsnorm_zc_grouped(c->X + t * P, d->hc, H, c->w->norm_query, d->eps, Q);
    const float sq = (float)sqrt((double)H);
    for (int64_t s = 0; s < d->hc; s++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < H; i++) acc = acc + K[s * H + i] * Q[s * H + i];
        float a = acc / sq;
        const float mag = fabsf(a) > 1e-6f ? fabsf(a) : 1e-6f;
        const float r = (float)sqrt((double)mag);
        a = a > 0.0f ? r : (a < 0.0f ? -r : 0.0f);
        c->ws->a[t * d->hc + s] = a;
        const float g = ref_sigmoid(a);
        for (int64_t i = 0; i < H; i++) G[s * H + i] = g * v[i];
    }
    ref_rmsnorm_zc_grouped(G, d->hc, H, c->w->norm_conv, d->eps, c->ws->gn + t * P);
}

static void conv_item(void *ctx, int64_t item, int worker)
{
    (void)worker;
    ple_ctx *c = ctx;
    const ref_ple_dims *d = c->d;
    const int64_t P = d->hc * d->hidden, K = d->kconv, D = d->dilation, S = D * (K - 1);
    const int64_t c0 = item * PLE_CONV_CHUNK, c1 = c0 + PLE_CONV_CHUNK < P ? c0 + PLE_CONV_CHUNK : P;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *wt = c->w->conv_w + ch * K;
        float *st = c->s->conv + ch * S;
        for (int64_t t = 0; t < c->m; t++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                const int64_t src = t - D * (K - 1 - j);
                const float in = src >= 0 ? c->ws->gn[src * P + ch] : st[S + src];
                acc = acc + wt[j] * in;
            }
            c->out[t * P + ch] = c->ws->g[t * P + ch] + ref_silu(acc);
        }
        /* new state: the last S inputs, oldest first (reads index S + src >= j: not yet overwritten) */
        for (int64_t j = 0; j < S; j++) {
            const int64_t src = c->m - S + j;
            st[j] = src >= 0 ? c->ws->gn[src * P + ch] : st[S + src];
        }
    }
}

td_status ref_ple_run(const ref_ple_weights *w, const ref_ple_dims *d, const ref_numerics *nx, ref_pool *pool,
                      ref_ple_ws *ws, ref_ple_state *s, const float *X, const int32_t *tokens, int64_t m,
                      float *out, td_err *err)
{
    const int64_t H = d->hidden, P = d->hc * H, D = d->embed_dim;
    for (int64_t t = 0; t < m; t++)
        if (tokens[t] < 0 || tokens[t] >= d->vocab)
            return td_err_set(err, TD_ERR_RANGE, "ref ple: token %d outside [0, %lld)", tokens[t], (long long)d->vocab);
    td_status st = ref_mm_reserve(&ws->mm, ref_pool_threads(pool), m, D, err);
    if (!st) st = ref_grow(&ws->e, &ws->cap_e, m * D, err);
    if (!st) st = ref_grow(&ws->k, &ws->cap_k, m * P, err);
    if (!st) st = ref_grow(&ws->v, &ws->cap_v, m * H, err);
    if (!st) st = ref_grow(&ws->q, &ws->cap_q, m * P, err);
    if (!st) st = ref_grow(&ws->g, &ws->cap_g, m * P, err);
    if (!st) st = ref_grow(&ws->gn, &ws->cap_gn, m * P, err);
    if (!st) st = ref_grow(&ws->a, &ws->cap_a, m * d->hc, err);
    if (!st && m * d->heads > ws->cap_ids) {
        int64_t *p = realloc(ws->ids, (size_t)(m * d->heads) * sizeof *p);
        if (!p) st = td_err_set(err, TD_ERR_NOMEM, "ref ple: out of memory");
        else {
            ws->ids = p;
            ws->cap_ids = m * d->heads;
        }
    }
    if (st) return st;
    ref_ple_hash(d, w->mult, w->sizes, w->offsets, s->ctx, tokens, m, ws->ids);
    ple_ctx c = {w, d, ws, s, X, out, m};
    ref_pool_run(pool, m, gather_item, &c);
    ref_mm(&w->key, nx, pool, &ws->mm, ws->e, D, m, ws->k, P);
    ref_mm(&w->value, nx, pool, &ws->mm, ws->e, D, m, ws->v, H);
    ref_pool_run(pool, m, gate_item, &c);
    ref_pool_run(pool, (P + PLE_CONV_CHUNK - 1) / PLE_CONV_CHUNK, conv_item, &c);
    return TD_OK;
}
