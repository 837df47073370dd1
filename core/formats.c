/* formats.c — FP16, BF16, E4M3FN and E2M1 conversions (see formats.h).
 *
 * All encoders work on the float32 bit pattern with integer arithmetic, so the result does
 * not depend on the FPU rounding mode, FTZ/DAZ or excess precision. Rounding is done by one
 * helper, round_shift_rne(), which divides a significand by 2^shift with ties to even.
 */
#include "formats.h"

#include <string.h>

/* sig / 2^shift rounded to nearest, ties to even. 1 <= shift <= 31. */
static uint32_t round_shift_rne(uint32_t sig, unsigned shift)
{
    uint32_t q = sig >> shift;
    uint32_t rem = sig & ((UINT32_C(1) << shift) - 1);
    uint32_t half = UINT32_C(1) << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

/* ---- FP16 ----------------------------------------------------------------------------- */

#define F32_EXP_MASK UINT32_C(0x7F800000)
#define F32_ABS_MASK UINT32_C(0x7FFFFFFF)
#define F32_MANT_MASK UINT32_C(0x007FFFFF)

uint16_t td_f32_to_f16(float x)
{
    uint32_t u = td_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & F32_ABS_MASK;

    if (a > F32_EXP_MASK) /* NaN: quiet, sign and top 10 payload bits kept */
        return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF));
    if (a >= UINT32_C(0x477FF000)) /* >= 65520 (tie above 65504 rounds to the even 2^16), inf */
        return (uint16_t)(sign | 0x7C00);
    if (a >= UINT32_C(0x38800000)) {
        /* Result is normal in FP16 (|x| >= 2^-14): rebias the exponent (127 -> 15) and round
         * the 23-bit mantissa to 10 bits. A carry out of the mantissa correctly bumps the
         * exponent; it cannot reach 0x7C00 because |x| < 65520. */
        uint32_t rebased = a - (UINT32_C(112) << 23); /* exponent field now biased by 15 */
        return (uint16_t)(sign | round_shift_rne(rebased, 13));
    }
    if (a < UINT32_C(0x33000000)) /* < 2^-25: below half the smallest subnormal */
        return sign;
    /* FP16 subnormal range: value = sig * 2^(e-150); in units of 2^-24 that is
     * sig * 2^(e-126), i.e. a right shift by 126-e (between 14 and 24 here). Rounding up
     * to 0x400 gives the smallest normal, which is the right encoding. */
    uint32_t e = a >> 23;
    uint32_t sig = (a & F32_MANT_MASK) | UINT32_C(0x800000);
    return (uint16_t)(sign | round_shift_rne(sig, 126 - e));
}

float td_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1F;
    uint32_t m = h & 0x3FF;
    if (e == 0x1F) /* inf or NaN: payload bits moved into place unchanged */
        return td_f32_from_bits(sign | F32_EXP_MASK | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float32 */
        float v = (float)m * 0x1p-24f;
        return td_f32_from_bits(sign | td_f32_bits(v));
    }
    return td_f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- BF16 ----------------------------------------------------------------------------- */

uint16_t td_f32_to_bf16(float x)
{
    uint32_t u = td_f32_bits(x);
    if ((u & F32_ABS_MASK) > F32_EXP_MASK) /* NaN: quiet, sign and top 7 payload bits kept */
        return (uint16_t)((u >> 16) | 0x0040);
    /* Drop 16 bits with RNE. The exponent field sits directly above the mantissa, so a
     * carry turns the largest finite values into inf and subnormals into normals, as RNE
     * requires. Computed in 64 bits so that the sign bit never overflows. */
    uint64_t r = ((uint64_t)u + UINT64_C(0x7FFF) + ((u >> 16) & 1)) >> 16;
    return (uint16_t)r;
}

float td_bf16_to_f32(uint16_t h)
{
    return td_f32_from_bits((uint32_t)h << 16);
}

/* ---- E4M3FN --------------------------------------------------------------------------- */

static const char *const e4m3_mode_names[] = {
    [TD_E4M3_TORCH] = "torch",
    [TD_E4M3_SATFINITE] = "satfinite",
    [TD_E4M3_NOSAT] = "nosat",
};
_Static_assert(TD_ARRAY_LEN(e4m3_mode_names) == TD_E4M3_MODE_COUNT, "e4m3_mode_names incomplete");

const char *td_e4m3_mode_name(td_e4m3_mode mode)
{
    if ((unsigned)mode >= TD_E4M3_MODE_COUNT) return "unknown";
    return e4m3_mode_names[mode];
}

td_status td_e4m3_mode_from_name(const char *name, td_e4m3_mode *mode, td_err *err)
{
    TD_ASSERT(mode);
    for (unsigned i = 0; name && i < TD_E4M3_MODE_COUNT; i++) {
        if (strcmp(name, e4m3_mode_names[i]) == 0) {
            *mode = (td_e4m3_mode)i;
            return TD_OK;
        }
    }
    return td_err_set(err, TD_ERR_ARG, "unknown E4M3 rounding mode '%s' (expected torch, "
                      "satfinite or nosat)", name ? name : "(null)");
}

float td_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    uint32_t e = (b >> 3) & 0xF;
    uint32_t m = b & 7;
    if ((b & 0x7F) == 0x7F) return td_f32_from_bits(sign | UINT32_C(0x7FC00000));
    if (e == 0) { /* zero or subnormal: m * 2^-9 */
        float v = (float)m * 0x1p-9f;
        return td_f32_from_bits(sign | td_f32_bits(v));
    }
    /* (1 + m/8) * 2^(e-7): rebias 7 -> 127 and put m at the top of the mantissa */
    return td_f32_from_bits(sign | ((e + 120) << 23) | (m << 20));
}

/* |x| (finite float32 bits `a`) -> E4M3 magnitude code with RNE. Returns a value > 0x7E when
 * the result overflows the finite range (the caller applies the mode's overflow rule). */
static uint32_t e4m3_round_magnitude(uint32_t a)
{
    uint32_t ebits = a >> 23;
    if (ebits == 0) return 0;                    /* float32 subnormal: far below 2^-10 */
    int e = (int)ebits - 127;                    /* |x| = sig * 2^(e-23) */
    if (e > 8) return 0x80;                      /* >= 512: overflow in every mode */
    uint32_t sig = (a & F32_MANT_MASK) | UINT32_C(0x800000);
    /* The quantum (value of one unit in the last place) is 2^(e-3) for normal results and
     * 2^-9 for subnormal ones (e < -6). */
    int qexp = (e < -6 ? -6 : e) - 3;
    int shift = qexp - (e - 23);                 /* 20 for normals, 21..24 below 2^-6 */
    if (shift > 24) return 0;                    /* |x| < 2^-10: rounds to zero */
    uint32_t q = round_shift_rne(sig, (unsigned)shift); /* |x| ≈ q * 2^qexp, q <= 16 */
    /* code = (biased exponent << 3) + mantissa, biased exponent = qexp + 10; q counts from 8
     * for normals, and q = 16 (mantissa carry) or subnormal q <= 8 land on the right code. */
    return (uint32_t)((qexp + 10) << 3) + q - 8;
}

uint8_t td_f32_to_e4m3(float x, td_e4m3_mode mode)
{
    TD_ASSERT((unsigned)mode < TD_E4M3_MODE_COUNT);
    uint32_t u = td_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & F32_ABS_MASK;
    uint8_t overflow = (mode == TD_E4M3_SATFINITE) ? 0x7E : 0x7F;

    if (a > F32_EXP_MASK) /* NaN */
        return mode == TD_E4M3_TORCH ? (uint8_t)(sign | 0x7F) : (uint8_t)0x7F;
    if (a == F32_EXP_MASK) /* ±inf */
        return (uint8_t)(sign | overflow);
    uint32_t c = e4m3_round_magnitude(a);
    if (c > 0x7E) return (uint8_t)(sign | overflow);
    return (uint8_t)(sign | c);
}

/* ---- E2M1 ----------------------------------------------------------------------------- */

td_status td_f32_to_e2m1(float y, td_e2m1_sign sign_rule, uint8_t *code, td_err *err)
{
    TD_ASSERT(code);
    TD_ASSERT((unsigned)sign_rule < TD_E2M1_SIGN_COUNT);
    if (isnan(y))
        return td_err_set(err, TD_ERR_ARG, "E2M1 encode: input is NaN (float32 bits 0x%08X)",
                          (unsigned)td_f32_bits(y));
    *code = td_e2m1_encode(y, sign_rule);
    return TD_OK;
}

void td_e2m1_pack(const uint8_t *codes, size_t n, uint8_t *bytes)
{
    if (n == 0) return;
    TD_ASSERT(codes && bytes);
    size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; j++)
        bytes[j] = (uint8_t)((codes[2 * j] & 0xF) | ((codes[2 * j + 1] & 0xF) << 4));
    if (n & 1) bytes[pairs] = (uint8_t)(codes[n - 1] & 0xF);
}

void td_e2m1_unpack(const uint8_t *bytes, size_t n, uint8_t *codes)
{
    if (n == 0) return;
    TD_ASSERT(codes && bytes);
    size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; j++) {
        codes[2 * j] = bytes[j] & 0xF;
        codes[2 * j + 1] = (uint8_t)(bytes[j] >> 4);
    }
    if (n & 1) codes[n - 1] = bytes[pairs] & 0xF;
}
