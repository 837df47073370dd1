/* mm.c — a linear over M inputs, parallel across row chunks (contract in mm.h). */
#include "mm.h"

#include <stdlib.h>

td_status ref_grow(float **buf, int64_t *cap, int64_t n, td_err *err)
{
    if (n <= *cap) return TD_OK;
    float *p = realloc(*buf, (size_t)n * sizeof *p);
    if (!p) return td_err_set(err, TD_ERR_NOMEM, "ref: out of memory (%lld floats)", (long long)n);
    *buf = p;
    *cap = n;
    return TD_OK;
}

td_status ref_mm_reserve(ref_mm_ws *ws, int workers, int64_t m, int64_t cols, td_err *err)
{
    if (workers <= ws->workers && m <= ws->cap_m && cols <= ws->cap_cols) return TD_OK;
    if (workers < ws->workers) workers = ws->workers;
    if (m < ws->cap_m) m = ws->cap_m;
    if (cols < ws->cap_cols) cols = ws->cap_cols;
    ref_mm_free(ws);
    ws->scratch = malloc((size_t)workers * REF_LINEAR_SCRATCH(cols) * sizeof *ws->scratch);
    ws->xp = malloc((size_t)workers * (size_t)m * sizeof *ws->xp);
    ws->yp = malloc((size_t)workers * (size_t)m * sizeof *ws->yp);
    if (!ws->scratch || !ws->xp || !ws->yp) {
        ref_mm_free(ws);
        return td_err_set(err, TD_ERR_NOMEM, "ref: out of memory (linear workspace)");
    }
    ws->workers = workers;
    ws->cap_m = m;
    ws->cap_cols = cols;
    return TD_OK;
}

void ref_mm_free(ref_mm_ws *ws)
{
    free(ws->scratch);
    free(ws->xp);
    free(ws->yp);
    *ws = (ref_mm_ws){0};
}

typedef struct mm_ctx {
    const ref_linear *l;
    const ref_numerics *nx;
    ref_mm_ws *ws;
    const float *x;
    float *y;
    int64_t xs, ys, m;
} mm_ctx;

static void mm_item(void *ctx, int64_t item, int worker)
{
    mm_ctx *c = ctx;
    const int64_t r0 = item * REF_MM_CHUNK;
    int64_t r1 = r0 + REF_MM_CHUNK;
    if (r1 > c->l->rows) r1 = c->l->rows;
    const float **xp = c->ws->xp + (size_t)worker * (size_t)c->ws->cap_m;
    float **yp = c->ws->yp + (size_t)worker * (size_t)c->ws->cap_m;
    for (int64_t i = 0; i < c->m; i++) {
        xp[i] = c->x + i * c->xs;
        yp[i] = c->y + i * c->ys + r0;
    }
    ref_linear_rows(c->l, c->nx, r0, r1, (const float *const *)xp, (float *const *)yp, c->m,
                    c->ws->scratch + (size_t)worker * REF_LINEAR_SCRATCH(c->ws->cap_cols));
}

void ref_mm(const ref_linear *l, const ref_numerics *nx, ref_pool *pool, ref_mm_ws *ws, const float *x,
            int64_t xs, int64_t m, float *y, int64_t ys)
{
    TD_ASSERT(m <= ws->cap_m && l->cols <= ws->cap_cols && ref_pool_threads(pool) <= ws->workers);
    mm_ctx c = {l, nx, ws, x, y, xs, ys, m};
    ref_pool_run(pool, (l->rows + REF_MM_CHUNK - 1) / REF_MM_CHUNK, mm_item, &c);
}
