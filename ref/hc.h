/* hc.h — hyper-connection residual of Qwen3.8-Flash-Next (MODEL_SPEC.md B3.1, B3.2).
 *
 * The residual is hc streams of `hidden` floats per token, stream-major (X[s * hidden + i]).
 * For M tokens (one row of hc * hidden floats each):
 *   ref_rmsnorm_zc_grouped: each of the `groups` groups of n floats is normalised on its own
 *     with the zero-centred RMSNorm of norm.h and its slice of the per-element weight.
 *   ref_hc_mix (weights norm, down [r, hc H], up [hc H, r], inject [hc, hc H] when present):
 *     Xn  = grouped norm(X; norm)                                   (norm.h numerics)
 *     dp  = down Xn, d_j = silu(fl32(dp_j / hc))                     (linear.h; ref_silu)
 *     mp  = up d,  xin_i = fl32(acc_i / hc), acc_i = +0, then for s ascending
 *           acc_i = fl32(acc_i + fl32(sigmoid(mp_{s H + i}) * Xn_{s H + i}))
 *     ip  = inject Xn, inj_s = fl32(2 * sigmoid(fl32(ip_s / hc)))  (only with an inject weight)
 *   ref_hc_combine: X_{s H + i} = fl32(X_{s H + i} + fl32(inj_s * y_i)).
 * The linears follow linear.h (accum applies to them); everything else is float32 with exp
 * in double rounded once (ref_sigmoid, ref_silu). Every value is computed by one thread in
 * this order, independent of the thread count and of M.
 *
 * Contract: the workspace grows only (ref_hc_mix allocates through it); X, xin, inj must not
 * alias each other. Weights are views (not owned).
 */
#ifndef TD_REF_HC_H
#define TD_REF_HC_H

#include "mm.h"

#include <stdbool.h>

typedef struct ref_hc_dims {
    int64_t hidden, hc, rank;
    float eps;
} ref_hc_dims;

typedef struct ref_hc_weights {
    const float *norm;          /* [hc * hidden] zero-centred, per element */
    ref_linear down;            /* [rank, hc * hidden] */
    ref_linear up;              /* [hc * hidden, rank] */
    ref_linear inject;          /* [hc, hc * hidden] (has_inject) */
    bool has_inject;            /* false for the final mixer */
} ref_hc_weights;

typedef struct ref_hc_ws {
    ref_mm_ws mm;
    float *xn, *d, *mp, *ip;    /* [M, hc H], [M, rank], [M, hc H], [M, hc] */
    int64_t cap_xn, cap_d, cap_mp, cap_ip;
} ref_hc_ws;

void ref_hc_ws_free(ref_hc_ws *ws);

void ref_rmsnorm_zc_grouped(const float *x, int64_t groups, int64_t n, const float *w, float eps, float *y);

/* xin [M, hidden]; inj [M, hc] (ignored, may be NULL, without an inject weight). */
td_status ref_hc_mix(const ref_hc_weights *w, const ref_hc_dims *d, const ref_numerics *nx, ref_pool *pool,
                     ref_hc_ws *ws, const float *X, int64_t m, float *xin, float *inj, td_err *err);

void ref_hc_combine(const ref_hc_dims *d, float *X, const float *y, const float *inj, int64_t m);

#endif /* TD_REF_HC_H */
