/* mm.h — a linear applied to M input vectors, parallel across output rows (ref/pool.h).
 *
 * y[i, r] = W[r, :] . x[i] for every i < M and row r, each output computed by ref_linear_rows
 * in the documented order (linear.h), so results do not depend on the thread count, on M or
 * on the row chunking. The workspace grows only (ref_mm_reserve allocates; ref_mm does not).
 */
#ifndef TD_REF_MM_H
#define TD_REF_MM_H

#include "linear.h"
#include "pool.h"

typedef struct ref_mm_ws {
    int workers;
    int64_t cap_m, cap_cols;
    float *scratch;             /* [workers, REF_LINEAR_SCRATCH(cap_cols)] */
    const float **xp;           /* [workers, cap_m] */
    float **yp;                 /* [workers, cap_m] */
} ref_mm_ws;

/* Rows per work item. */
#define REF_MM_CHUNK 16

td_status ref_mm_reserve(ref_mm_ws *ws, int workers, int64_t m, int64_t cols, td_err *err);
void ref_mm_free(ref_mm_ws *ws);
/* y (row stride ys floats) = W x (row stride xs floats) for M inputs; reserved for M, W's cols. */
void ref_mm(const ref_linear *l, const ref_numerics *nx, ref_pool *pool, ref_mm_ws *ws, const float *x,
            int64_t xs, int64_t m, float *y, int64_t ys);

/* Grow a float buffer to at least n elements (keeps the contents' prefix). */
td_status ref_grow(float **buf, int64_t *cap, int64_t n, td_err *err);

#endif /* TD_REF_MM_H */
