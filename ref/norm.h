/* norm.h — the reference normalizations of Qwen3-Next (MODEL_SPEC.md A3.1, A3.2, A3.5 step 7).
 *
 * Numerics (float32, fixed order, no FMA: the build uses -ffp-contract=off)
 * - Sum of squares: ss = +0, then for j ascending ss = fl32(ss + fl32(x_j * x_j)).
 * - RMSNorm (eps on the mean): mean = fl32(ss / n); inv = fl32(1 / sqrt(double(fl32(mean + eps))))
 *   (square root and quotient in double, rounded once);
 *     zero-centred:  y_i = fl32(fl32(x_i * inv) * fl32(1 + w_i))        (A3.1, weights (1+w))
 *     gated (GDN):   y_i = fl32(fl32(fl32(x_i * inv) * w_i) * silu(z_i))  (A3.2, weights w,
 *                    normalise first, then weight, then the silu gate; silu as ref_silu)
 * - L2 normalization (eps inside the sqrt, on the sum): inv = fl32(1 / sqrt(double(fl32(ss + eps))));
 *   y_i = fl32(x_i * inv).
 * - softplus(x) = x for x > 20, else fl32(log1p(exp(x))) evaluated in double (PyTorch threshold).
 * exp/log/sqrt come from the C library in double and are rounded to float32 once: the double
 * results are correctly rounded or within an ulp of double, far below float32 resolution, so
 * the float32 result does not depend on the C library except in (rare) double-rounding ties.
 *
 * Contract: pure functions; x and y may be the same array (in-place), z must not alias y.
 */
#ifndef TD_REF_NORM_H
#define TD_REF_NORM_H

#include <stdint.h>

void ref_rmsnorm_zc(const float *x, int64_t n, const float *w, float eps, float *y);
void ref_rmsnorm_gated(const float *x, const float *z, int64_t n, const float *w, float eps, float *y);
/* The gated norm with a sigmoid gate (qwen4_exp output_gate_type "sigmoid", B3.1):
 * y_i = fl32(fl32(fl32(x_i * inv) * w_i) * sigmoid(z_i)) (ref_sigmoid). */
void ref_rmsnorm_gated_sigmoid(const float *x, const float *z, int64_t n, const float *w, float eps, float *y);
void ref_l2norm(const float *x, int64_t n, float eps, float *y);
float ref_softplus(float x);

#endif /* TD_REF_NORM_H */
