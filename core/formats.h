/* formats.h — bit-exact scalar number formats: FP16, BF16, FP8 E4M3FN and FP4 E2M1.
 *
 * Contract
 * - Every conversion is a pure function of its arguments: no global state, no allocation,
 *   thread-safe, independent of the FPU rounding mode and of FTZ/DAZ (all rounding is done on
 *   integer bit patterns; float<->bits punning uses memcpy).
 * - Decoders (x -> float) are exact: every FP16, BF16, E4M3FN and E2M1 value is a float32.
 * - Encoders (float -> x) round to nearest, ties to even (RNE), in a single rounding from the
 *   float32 input. Overflow, infinity, NaN and the sign of zero are specified per function.
 * - NaN conventions (documented per function, see docs/numeric-formats.md):
 *   FP16/BF16 encoders keep the NaN's sign and the top payload bits that fit and set the
 *   quiet bit, so a NaN never turns into infinity; the decoders embed the bits unchanged
 *   (a signalling FP16/BF16 NaN decodes to the corresponding signalling float32 NaN).
 * - E4M3FN (NVFP4_SPEC.md §1): no infinities; NaN only at 0x7F and 0xFF; max 448; subnormals
 *   m·2^-9. The encoder takes one of three named overflow/NaN semantics (§1.4); callers
 *   record which one they used.
 * - E2M1 (§2): codes 0..15 in the low 4 bits, no NaN or inf; encoders saturate to ±6.
 *   td_f32_to_e2m1() rejects NaN with TD_ERR_ARG; td_e2m1_encode() never fails and maps
 *   NaN to code 0x7 (+6), as the PTX cvt and ModelOpt do.
 * - Nibble order (§2.3): element 2j in the low nibble (bits 3..0) of byte j, element 2j+1 in
 *   the high nibble (bits 7..4).
 * - Pointer arguments are borrowed and must be valid for the stated element counts; passing
 *   NULL with a non-zero count is a programmer error (TD_ASSERT).
 */
#ifndef TD_FORMATS_H
#define TD_FORMATS_H

#include "td.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* ---- FP16 (IEEE binary16: 1-5-10, bias 15, max 65504) ----------------------------------- */

/* float32 -> FP16, RNE. |x| >= 65520 (the midpoint between 65504 and 2^16) and ±inf give
 * ±inf (0x7C00 / 0xFC00); |x| <= 2^-25 gives ±0; FP16 subnormals (multiples of 2^-24) are
 * produced in between. NaN -> NaN with the same sign, the quiet bit (0x0200) set and the
 * top 10 bits of the float32 payload kept: sign | 0x7E00 | ((bits >> 13) & 0x3FF). */
uint16_t td_f32_to_f16(float x);
/* FP16 -> float32, exact for every pattern (NaN payload shifted into place, bits << 13). */
float td_f16_to_f32(uint16_t h);

/* ---- BF16 (1-8-7, the top half of a float32) ---------------------------------------------- */

/* float32 -> BF16, RNE (overflow past the largest finite value gives ±inf; float32
 * subnormals round to BF16 subnormals). NaN -> NaN with the same sign, the quiet bit
 * (0x0040) set and the top 7 payload bits kept: sign | 0x7FC0 | ((bits >> 16) & 0x7F). */
uint16_t td_f32_to_bf16(float x);
/* BF16 -> float32, exact for every pattern (bits << 16). */
float td_bf16_to_f32(uint16_t h);

/* ---- FP8 E4M3FN (NVFP4_SPEC.md §1) --------------------------------------------------------- */

#define TD_E4M3_MAX 448.0f   /* largest finite value, code 0x7E */
#define TD_E4M3_NAN 0x7F     /* the positive NaN code; 0xFF is the negative one */

/* The three real-world float32 -> E4M3FN semantics (§1.4). All are RNE and agree for
 * |x| <= 464 (464 itself is a tie and rounds to 448); they differ for larger values, ±inf and
 * the sign of NaN:
 *                        |x| > 464 finite   ±inf          NaN
 *   TD_E4M3_TORCH        0x7F / 0xFF        0x7F / 0xFF   0x7F / 0xFF (sign of the NaN kept)
 *   TD_E4M3_SATFINITE    0x7E / 0xFE        0x7E / 0xFE   0x7F always
 *   TD_E4M3_NOSAT        0x7F / 0xFF        0x7F / 0xFF   0x7F always
 * TORCH reproduces torch `.to(float8_e4m3fn)` and ml_dtypes (what ModelOpt and
 * compressed-tensors write); SATFINITE reproduces CUDA __NV_SATFINITE, PTX
 * cvt.rn.satfinite.e4m3x2.f32 and CUTLASS (what vLLM/FlashInfer kernels write); NOSAT
 * reproduces CUDA __NV_NOSAT. */
typedef enum td_e4m3_mode {
    TD_E4M3_TORCH = 0,
    TD_E4M3_SATFINITE,
    TD_E4M3_NOSAT,
    TD_E4M3_MODE_COUNT
} td_e4m3_mode;

/* "torch", "satfinite", "nosat"; "unknown" for an out-of-range value. Never NULL. */
const char *td_e4m3_mode_name(td_e4m3_mode mode);
/* Inverse of td_e4m3_mode_name(). Unknown names fail with TD_ERR_ARG naming the string. */
td_status td_e4m3_mode_from_name(const char *name, td_e4m3_mode *mode, td_err *err);

/* float32 <-> bit pattern (memcpy, no aliasing hazards). */
static inline uint32_t td_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float td_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* E4M3FN -> float32, exact. 0x7F -> +NaN (0x7FC00000), 0xFF -> -NaN (0xFFC00000), 0x80 ->
 * -0.0, codes with exponent field 0 are subnormals m·2^-9. */
float td_e4m3_to_f32(uint8_t b);
/* float32 -> E4M3FN under `mode` (table above). -0.0 -> 0x80; |x| <= 2^-10 -> ±0.
 * An out-of-range mode is a programmer error (TD_ASSERT). */
uint8_t td_f32_to_e4m3(float x, td_e4m3_mode mode);
/* true for the two NaN codes 0x7F and 0xFF. */
static inline bool td_e4m3_is_nan(uint8_t b) { return (b & 0x7F) == 0x7F; }

/* ---- FP4 E2M1 (NVFP4_SPEC.md §2) ----------------------------------------------------------- */

#define TD_E2M1_MAX 6.0f

/* How the sign bit of an E2M1 code is chosen. The magnitude rounding is the same for both.
 *   TD_E2M1_SIGNBIT   sign = signbit(y): -0.0 and negatives that round to 0 give 0x8.
 *                     PTX/CUDA cvt, ml_dtypes, compressed-tensors pack (torch.signbit).
 *   TD_E2M1_NEGATIVE  sign = (y < 0): -0.0 gives 0x0, negatives that round to 0 give 0x8.
 *                     ModelOpt `_cast_fp4`. */
typedef enum td_e2m1_sign {
    TD_E2M1_SIGNBIT = 0,
    TD_E2M1_NEGATIVE,
    TD_E2M1_SIGN_COUNT
} td_e2m1_sign;

/* E2M1 code (low 4 bits used, upper bits ignored) -> float32: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6};
 * code 0x8 is -0.0. Inline because dequantization calls it once per element. */
static inline float td_e2m1_to_f32(uint8_t code)
{
    static const float values[16] = {
        0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
    };
    return values[code & 0xF];
}

/* float32 -> E2M1 code (0..15), RNE with saturation to ±6 (§2.2 thresholds on |y|:
 * [0,0.25]->0, (0.25,0.75)->0.5, [0.75,1.25]->1, (1.25,1.75)->1.5, [1.75,2.5]->2,
 * (2.5,3.5)->3, [3.5,5]->4, (5,inf]->6). NaN fails with TD_ERR_ARG and leaves *code
 * unchanged. */
td_status td_f32_to_e2m1(float y, td_e2m1_sign sign_rule, uint8_t *code, td_err *err);

/* Non-failing form of td_f32_to_e2m1() for inner loops: identical for every non-NaN input;
 * NaN of either sign gives 0x7 (+6), the PTX cvt.rn.satfinite.e2m1x2 and ModelOpt result.
 * An out-of-range sign_rule is treated as TD_E2M1_SIGNBIT. */
static inline uint8_t td_e2m1_encode(float y, td_e2m1_sign sign_rule)
{
    if (isnan(y)) return 0x7;
    float a = fabsf(y);
    uint8_t mag;
    if (a <= 0.25f) mag = 0;        /* 0.25 is a tie -> 0 (even) */
    else if (a < 0.75f) mag = 1;
    else if (a <= 1.25f) mag = 2;   /* 0.75 and 1.25 are ties -> 1 (even) */
    else if (a < 1.75f) mag = 3;
    else if (a <= 2.5f) mag = 4;    /* 1.75 and 2.5 are ties -> 2 (even) */
    else if (a < 3.5f) mag = 5;
    else if (a <= 5.0f) mag = 6;    /* 3.5 and 5 are ties -> 4 (even) */
    else mag = 7;                   /* saturates; +inf included */
    bool neg = (sign_rule == TD_E2M1_NEGATIVE) ? (y < 0.0f) : (signbit(y) != 0);
    return (uint8_t)(mag | (neg ? 0x8 : 0x0));
}

/* Pack n codes into (n+1)/2 bytes: byte j = codes[2j] & 0xF | (codes[2j+1] & 0xF) << 4.
 * NVFP4 tensors always have n even; for odd n the high nibble of the last byte is 0. */
void td_e2m1_pack(const uint8_t *codes, size_t n, uint8_t *bytes);
/* Unpack n codes from (n+1)/2 bytes: codes[2j] = low nibble, codes[2j+1] = high nibble.
 * For odd n the high nibble of the last byte is not read. */
void td_e2m1_unpack(const uint8_t *bytes, size_t n, uint8_t *codes);

#endif /* TD_FORMATS_H */
