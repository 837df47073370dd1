/* nvfp4.h — NVFP4 two-level block quantization and dequantization of a 2-D weight.
 *
 * Contract
 * - Layout (NVFP4_SPEC.md §3.1): a weight W is row-major [rows, k] float32 (rows = N =
 *   out_features, k = K = in_features). Blocks are TD_NVFP4_BLOCK = 16 consecutive elements
 *   along k; k must be a multiple of 16. Outputs are the on-disk tensors:
 *     packed  U8      [rows, k/2]   E2M1 codes, element 2j in the low nibble (§2.3)
 *     scales  F8_E4M3 [rows, k/16]  one E4M3FN block scale per block, linear (not swizzled)
 *     global  F32     scalar        the per-tensor scale of the chosen convention
 * - Conventions (§3.2), never inferred from magnitudes:
 *     TD_NVFP4_MODELOPT  global = g_dec = amax/2688, a multiplier (`weight_scale_2`)
 *     TD_NVFP4_CT        global = g_enc = 2688/amax, a divisor (`weight_global_scale`)
 *   td_nvfp4_quantize() follows the exact float32 operation order of the producer (§3.3), so
 *   it reproduces ModelOpt ([MO] variant, scales clamped to [2^-9, 448]) and compressed-tensors
 *   bytes; td_nvfp4_dequantize() follows each producer's dequant order (§3.4).
 * - Policies decided here (docs/numeric-formats.md explains them):
 *   * amax: pass NAN to use max|w| over the tensor, or a finite amax >= 0 shared with sibling
 *     tensors (gate/up). A given amax smaller than max|w| is allowed (scales clamp to 448 and
 *     codes saturate at ±6, as in ModelOpt's static path); a negative, infinite or
 *     non-zero amax below TD_NVFP4_AMAX_MIN fails with TD_ERR_RANGE (the global would be
 *     subnormal or infinite).
 *   * All-zero tensor (amax == 0): global = 1.0 in both conventions (1.0 is its own
 *     reciprocal), every code 0 (or 0x8 for -0.0 under CT's signbit rule), every scale the
 *     convention's zero-block byte (ModelOpt 0x38 = 1.0, CT 0x20 = 0.125). The inf that CT's
 *     2688/0 would give is never produced. amax == 0 given for a tensor with a non-zero
 *     element fails with TD_ERR_RANGE naming the element.
 *   * Non-finite w fails with TD_ERR_ARG naming the row and column.
 *   On any error nothing is written to packed, scales or *global.
 * - td_nvfp4_dequantize(): a global that is not finite and > 0 fails with TD_ERR_RANGE. Scale
 *   bytes are used as stored: NaN codes (0x7F/0xFF) give NaN outputs for the whole block and
 *   a set sign bit negates the block; neither is an error (audits report them).
 * - Sizes: rows >= 0, k >= 0, rows*k <= 2^62; violations fail with TD_ERR_ARG. Buffers are
 *   borrowed, must not overlap, and may be NULL only when rows*k == 0.
 * - No allocation, no global state; thread-safe.
 */
#ifndef TD_NVFP4_H
#define TD_NVFP4_H

#include "td.h"

#define TD_NVFP4_BLOCK 16

/* 2688 = E2M1 max (6) * E4M3 max (448). */
#define TD_NVFP4_AMAX_SCALE 2688.0f
/* Smallest non-zero tensor amax accepted: 2688 * 2^-126, so that g_dec = amax/2688 is a
 * normal float32 (and g_enc = 2688/amax is finite). */
#define TD_NVFP4_AMAX_MIN 0x1.5p-115f

typedef enum td_nvfp4_conv {
    TD_NVFP4_MODELOPT = 0, /* NVIDIA ModelOpt: weight_scale_2 = g_dec = amax/2688 */
    TD_NVFP4_CT,           /* compressed-tensors: weight_global_scale = g_enc = 2688/amax */
    TD_NVFP4_CONV_COUNT
} td_nvfp4_conv;

/* "modelopt", "compressed-tensors"; "unknown" for an out-of-range value. Never NULL. */
const char *td_nvfp4_conv_name(td_nvfp4_conv conv);

/* Quantize w [rows, k] (row-major float32) to NVFP4.
 *   amax     tensor amax the global is derived from, or NAN to compute max|w| here
 *   packed   out: [rows, k/2] bytes
 *   scales   out: [rows, k/16] E4M3FN bytes
 *   global   out: g_dec (ModelOpt) or g_enc (CT)
 * ModelOpt order, per block b (all float32, each operation rounded):
 *   g_dec = amax / 2688 ; s_raw = amax_b / (6 * g_dec) ; s_raw == 0 -> 1.0 ;
 *   S = e4m3_torch(clamp(s_raw, 2^-9, 448)) ; y = w / (f32(S) * g_dec) ;
 *   code = e2m1(y), sign rule y < 0.
 * compressed-tensors order:
 *   g_enc = 2688 / amax ; s_raw = g_enc * (amax_b / 6) ; S = e4m3_torch(clamp(s_raw, -448, 448)) ;
 *   S == 0 -> 0x20 (0.125) ; eff = f32(S) / g_enc ; y = clamp(w / eff, -6, 6) ;
 *   code = e2m1(y), sign rule signbit(y). */
td_status td_nvfp4_quantize(const float *w, int64_t rows, int64_t k, td_nvfp4_conv conv,
                            float amax, uint8_t *packed, uint8_t *scales, float *global,
                            td_err *err);

/* Dequantize to out [rows, k] float32:
 *   ModelOpt: out = e2m1(code) * (f32(S) * g_dec)       (global = g_dec)
 *   CT:       out = e2m1(code) * (f32(S) / g_enc)       (global = g_enc)
 * The parenthesised per-block factor is rounded to float32 first, then the product is
 * rounded once; this is each producer's own order, so outputs match it bit for bit. */
td_status td_nvfp4_dequantize(const uint8_t *packed, const uint8_t *scales, float global,
                              td_nvfp4_conv conv, int64_t rows, int64_t k, float *out,
                              td_err *err);

/* The decode multiplier g_dec for a stored global: ModelOpt: global; CT: fl32(1/global).
 * For CT this reciprocal is one extra rounding (exact only for powers of two), which is why
 * td_nvfp4_dequantize() divides by g_enc instead of multiplying by this value. */
float td_nvfp4_g_dec(float global, td_nvfp4_conv conv);

/* The per-block decode factor used by td_nvfp4_dequantize() for scale byte `scale`:
 * ModelOpt fl32(f32(S) * global), CT fl32(f32(S) / global). */
float td_nvfp4_block_factor(uint8_t scale, float global, td_nvfp4_conv conv);

#endif /* TD_NVFP4_H */
