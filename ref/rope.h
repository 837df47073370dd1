/* rope.h — partial half-split (NeoX) rotary position embedding (MODEL_SPEC.md A3.3).
 *
 * Numerics, for rotary dimension `rot` (even), half h = rot / 2, position p, i in [0, h):
 *   e_i   = fl32(float(2i) / float(rot))
 *   inv_i = fl32(1 / fl32(pow(theta, e_i)))          (pow in double, rounded once; as the
 *                                                     float32 inv_freq table of the public code)
 *   a     = fl32(float(p) * inv_i)                    (the float32 angle)
 *   c, s  = fl32(cos(a)), fl32(sin(a))                (double, rounded once)
 *   out[i]     = fl32(fl32(x[i] * c) - fl32(x[i+h] * s))
 *   out[i + h] = fl32(fl32(x[i+h] * c) + fl32(x[i] * s))
 * Dimensions rot .. head_dim - 1 are left unchanged. Positions are 0-based absolute indices
 * (exactly representable in float32 up to 2^24).
 *
 * Contract: ref_rope_table fills cos/sin [h] for one position; ref_rope_apply rotates one head
 * in place. Pure.
 */
#ifndef TD_REF_ROPE_H
#define TD_REF_ROPE_H

#include <stdint.h>

void ref_rope_table(int64_t rot, double theta, int64_t pos, float *cos_out, float *sin_out);
void ref_rope_apply(float *x, int64_t rot, const float *cos_t, const float *sin_t);

#endif /* TD_REF_ROPE_H */
