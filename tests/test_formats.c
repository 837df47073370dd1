/* test_formats.c — FP16, BF16, E4M3FN and E2M1 conversions and nibble packing (core/formats).
 *
 * Every expected value comes from an oracle written differently from the code under test:
 * decoders are checked against sign/exponent/mantissa arithmetic in double (ldexp) and
 * against the tables of NVFP4_SPEC.md; encoders are checked at every decision point (each
 * representable value, each midpoint and one float32 ULP either side) and on millions of
 * seeded random float32 patterns against reference encoders that use double arithmetic with
 * nearbyint (FP16, BF16) or a nearest-value search with ties to the even code over a sorted
 * value table (E4M3, E2M1).
 */
#include "test_common.h"
#include "bits_fixture.h"
#include "formats.h"

#include <float.h>
#include <math.h>

/* ---- helpers ---------------------------------------------------------------------------- */

/* A random float32 pattern. Mixture: 1/4 uniform over all 2^32 patterns; 3/4 with a biased
 * exponent in [emin, emax] and a random sign, half of those with the low mantissa bits
 * cleared so that exact ties and exactly representable values occur often. */
static float rand_f32(uint64_t *s, uint32_t emin, uint32_t emax)
{
    uint64_t r = rng_next(s);
    if ((r & 3) == 0) return float_of((uint32_t)(r >> 32));
    uint32_t mant = (uint32_t)(r >> 8) & 0x7FFFFF;
    if (r & 4) {
        unsigned keep = (unsigned)((r >> 40) % 24); /* keep only the top `keep` mantissa bits */
        mant &= ~((UINT32_C(1) << (23 - keep)) - 1);
    }
    uint32_t sign = (uint32_t)(r >> 63) << 31;
    uint32_t e = emin + (uint32_t)((r >> 44) % (emax - emin + 1));
    return float_of(sign | (e << 23) | mant);
}

/* sign bit as 0/1 (signbit() may return any non-zero value, differently per type) */
#define SB(x) (signbit(x) != 0)

#define RANDOM_SAMPLES (1u << 22)

/* ---- FP16 ------------------------------------------------------------------------------- */

/* Independent value of an FP16 pattern. */
static double f16_formula(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? nan("") : HUGE_VAL;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Reference float32 -> FP16 for non-NaN input: double arithmetic, RNE via nearbyint. */
static uint16_t f16_reference(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isinf(a)) return sign | 0x7C00;
    if (a == 0.0) return sign;
    int e2;
    (void)frexp(a, &e2);          /* a = f * 2^e2, f in [0.5, 1) */
    int E = e2 - 1;               /* floor(log2 a) */
    if (E < -14) E = -14;         /* subnormal quantum 2^-24 */
    double q = nearbyint(ldexp(a, 10 - E)); /* a / 2^(E-10), exact scaling, then RNE */
    uint32_t b;
    if (q < 1024.0) b = (uint32_t)q;                         /* subnormal (E == -14) */
    else b = ((uint32_t)(E + 15) << 10) + ((uint32_t)q - 1024); /* q == 2048 carries */
    if (b >= 0x7C00) b = 0x7C00;
    return (uint16_t)(sign | b);
}

static void f16_all_patterns_decode_to_formula(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = td_f16_to_f32((uint16_t)h);
        double want = f16_formula((uint16_t)h);
        if (isnan(want)) {
            uint32_t exp_bits = ((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13);
            if (bits_of(got) != exp_bits)
                fail_msg("f16 0x%04X: got bits 0x%08X, want NaN 0x%08X", h, bits_of(got), exp_bits);
        } else if ((double)got != want || SB(got) != SB(want)) {
            fail_msg("f16 0x%04X: got %a, want %a", h, (double)got, want);
        }
    }
}

static void f16_all_patterns_reencode_to_self(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = td_f32_to_f16(td_f16_to_f32((uint16_t)h));
        bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        /* a NaN comes back as a NaN with the same sign and payload, quiet bit set */
        uint16_t want = is_nan ? (uint16_t)(h | 0x0200) : (uint16_t)h;
        if (back != want) fail_msg("f16 0x%04X re-encodes to 0x%04X, want 0x%04X", h, back, want);
    }
}

static void f16_decision_points_round_to_nearest_even(void **state)
{
    (void)state;
    /* Every positive finite value, every midpoint to its upper neighbour (the last one is the
     * overflow midpoint 65520 between 65504 and 2^16 = "inf"), and one float32 ULP either
     * side; mirrored for negatives. This covers 2^-25 (tie to 0), the subnormal/normal
     * boundary and every binade edge. */
    for (uint32_t h = 0; h < 0x7C00; h++) {
        double lo = f16_formula((uint16_t)h);
        double hi = (h + 1 == 0x7C00) ? 65536.0 : f16_formula((uint16_t)(h + 1));
        float flo = (float)lo;
        if (td_f32_to_f16(flo) != h || td_f32_to_f16(-flo) != (h | 0x8000))
            fail_msg("f16 value 0x%04X (%a) does not encode to itself", h, lo);
        double mid = (lo + hi) / 2;
        float fm = (float)mid;
        assert_true((double)fm == mid);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        float below = nextafterf(fm, 0.0f), above = nextafterf(fm, INFINITY);
        uint16_t g_mid = td_f32_to_f16(fm), g_below = td_f32_to_f16(below),
                 g_above = td_f32_to_f16(above);
        if (g_mid != even || g_below != h || g_above != h + 1)
            fail_msg("f16 midpoint %a of 0x%04X/0x%04X: got mid 0x%04X below 0x%04X above 0x%04X",
                     mid, h, h + 1, g_mid, g_below, g_above);
        if (td_f32_to_f16(-fm) != (even | 0x8000) || td_f32_to_f16(-below) != (h | 0x8000) ||
            td_f32_to_f16(-above) != ((h + 1) | 0x8000))
            fail_msg("f16 negative midpoint %a of 0x%04X wrong", mid, h);
    }
}

static void f16_special_values_encode_as_documented(void **state)
{
    (void)state;
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3F800000, 0x3C00},  /* 1.0 */
        {0x3DCCCCCD, 0x2E66},  /* 0.1f */
        {0x3EAAAAAB, 0x3555},  /* 1/3 */
        {0x477FE000, 0x7BFF},  /* 65504 = max finite */
        {0x477FEFFF, 0x7BFF},  /* just below the overflow midpoint */
        {0x477FF000, 0x7C00},  /* 65520: tie, 0x7BFF is odd -> inf */
        {0x7F7FFFFF, 0x7C00},  /* FLT_MAX */
        {0x7F800000, 0x7C00},  /* +inf */
        {0xFF800000, 0xFC00},  /* -inf */
        {0x80000000, 0x8000},  /* -0 */
        {0x38800000, 0x0400},  /* 2^-14: smallest normal */
        {0x387FC000, 0x03FF},  /* largest subnormal */
        {0x387FE000, 0x0400},  /* midpoint largest subnormal / smallest normal: even -> 0x400 */
        {0x33800000, 0x0001},  /* 2^-24: smallest subnormal */
        {0x33000000, 0x0000},  /* 2^-25: tie -> 0 */
        {0x33000001, 0x0001},  /* just above 2^-25 */
        {0x33C00000, 0x0002},  /* 1.5 * 2^-24: tie -> 2 (even) */
        {0xB3000000, 0x8000},  /* -2^-25 -> -0 */
        {0x00000001, 0x0000},  /* smallest float32 subnormal */
        {0x7FC00000, 0x7E00},  /* qNaN */
        {0xFFC00000, 0xFE00},  /* -qNaN: sign kept */
        {0x7F800001, 0x7E00},  /* sNaN with a low payload: quieted, payload bits lost */
        {0x7FA00000, 0x7F00},  /* sNaN payload bit 21 -> FP16 payload bit 8, quiet bit set */
        {0x7FFFFFFF, 0x7FFF},  /* all payload bits */
        {0xFF812345, 0xFE09},  /* -NaN, payload 0x012345 >> 13 = 0x09 */
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        uint16_t got = td_f32_to_f16(float_of(cases[i].in));
        if (got != cases[i].out)
            fail_msg("f16(0x%08X) = 0x%04X, want 0x%04X", cases[i].in, got, cases[i].out);
    }
}

static void f16_random_patterns_match_reference(void **state)
{
    (void)state;
    uint64_t s = 0x1234ABCD;
    for (uint32_t i = 0; i < RANDOM_SAMPLES; i++) {
        float x = rand_f32(&s, 127 - 27, 127 + 17);
        uint16_t got = td_f32_to_f16(x), want;
        if (isnan(x)) {
            uint32_t u = bits_of(x);
            want = (uint16_t)(((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF));
        } else {
            want = f16_reference(x);
        }
        if (got != want) fail_msg("f16(%a = 0x%08X) = 0x%04X, reference 0x%04X", (double)x,
                                  bits_of(x), got, want);
    }
}

/* ---- BF16 ------------------------------------------------------------------------------- */

static double bf16_formula(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
    double v;
    if (e == 255) v = m ? nan("") : HUGE_VAL;
    else if (e == 0) v = ldexp(m, -133);
    else v = ldexp(128 + m, e - 134);
    return s ? -v : v;
}

static uint16_t bf16_reference(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isinf(a)) return sign | 0x7F80;
    if (a == 0.0) return sign;
    int e2;
    (void)frexp(a, &e2);
    int E = e2 - 1;
    if (E < -126) E = -126;
    double q = nearbyint(ldexp(a, 7 - E));
    uint32_t b;
    if (q < 128.0) b = (uint32_t)q;
    else b = ((uint32_t)(E + 127) << 7) + ((uint32_t)q - 128);
    if (b >= 0x7F80) b = 0x7F80;
    return (uint16_t)(sign | b);
}

static void bf16_all_patterns_decode_to_formula(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = td_bf16_to_f32((uint16_t)h);
        double want = bf16_formula((uint16_t)h);
        if (isnan(want)) {
            if (bits_of(got) != h << 16)
                fail_msg("bf16 0x%04X: NaN decoded to bits 0x%08X", h, bits_of(got));
        } else if ((double)got != want || SB(got) != SB(want)) {
            fail_msg("bf16 0x%04X: got %a, want %a", h, (double)got, want);
        }
    }
}

static void bf16_all_patterns_reencode_to_self(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = td_f32_to_bf16(td_bf16_to_f32((uint16_t)h));
        bool is_nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
        uint16_t want = is_nan ? (uint16_t)(h | 0x0040) : (uint16_t)h;
        if (back != want) fail_msg("bf16 0x%04X re-encodes to 0x%04X, want 0x%04X", h, back, want);
    }
}

static void bf16_decision_points_round_to_nearest_even(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7F80; h++) {
        double lo = bf16_formula((uint16_t)h);
        double hi = (h + 1 == 0x7F80) ? ldexp(1.0, 128) : bf16_formula((uint16_t)(h + 1));
        float flo = (float)lo;
        if (td_f32_to_bf16(flo) != h || td_f32_to_bf16(-flo) != (h | 0x8000))
            fail_msg("bf16 value 0x%04X (%a) does not encode to itself", h, lo);
        double mid = (lo + hi) / 2;
        float fm = (float)mid;
        assert_true((double)fm == mid);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        float below = nextafterf(fm, 0.0f), above = nextafterf(fm, INFINITY);
        uint16_t g_mid = td_f32_to_bf16(fm), g_below = td_f32_to_bf16(below),
                 g_above = td_f32_to_bf16(above);
        if (g_mid != even || g_below != h || g_above != h + 1)
            fail_msg("bf16 midpoint %a of 0x%04X/0x%04X: got mid 0x%04X below 0x%04X above 0x%04X",
                     mid, h, h + 1, g_mid, g_below, g_above);
        if (td_f32_to_bf16(-fm) != (even | 0x8000) || td_f32_to_bf16(-below) != (h | 0x8000) ||
            td_f32_to_bf16(-above) != ((h + 1) | 0x8000))
            fail_msg("bf16 negative midpoint %a of 0x%04X wrong", mid, h);
    }
}

static void bf16_special_values_encode_as_documented(void **state)
{
    (void)state;
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3F800000, 0x3F80},  /* 1.0 */
        {0x3DCCCCCD, 0x3DCD},  /* 0.1f rounds up */
        {0x3F808000, 0x3F80},  /* tie, even mantissa kept */
        {0x3F818000, 0x3F82},  /* tie, odd mantissa rounds up */
        {0x3F808001, 0x3F81},  /* just above a tie */
        {0x7F7F7FFF, 0x7F7F},  /* just below the overflow midpoint */
        {0x7F7F8000, 0x7F80},  /* overflow midpoint: odd 0x7F7F -> inf */
        {0x7F7FFFFF, 0x7F80},  /* FLT_MAX -> inf */
        {0x7F800000, 0x7F80},
        {0xFF800000, 0xFF80},
        {0x80000000, 0x8000},
        {0x00008000, 0x0000},  /* float32 subnormal tie -> 0 */
        {0x00018000, 0x0002},  /* float32 subnormal tie -> even */
        {0x007FFFFF, 0x0080},  /* largest float32 subnormal rounds up to the smallest normal */
        {0x7FC00000, 0x7FC0},
        {0xFFC00001, 0xFFC0},  /* -NaN: sign kept, low payload dropped */
        {0x7F800001, 0x7FC0},  /* sNaN quieted, never inf */
        {0x7F810000, 0x7FC1},  /* payload bit 16 kept */
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        uint16_t got = td_f32_to_bf16(float_of(cases[i].in));
        if (got != cases[i].out)
            fail_msg("bf16(0x%08X) = 0x%04X, want 0x%04X", cases[i].in, got, cases[i].out);
    }
}

static void bf16_random_patterns_match_reference(void **state)
{
    (void)state;
    uint64_t s = 0xBF16BF16;
    for (uint32_t i = 0; i < RANDOM_SAMPLES; i++) {
        /* exponents near both ends of the range plus the middle */
        float x = rand_f32(&s, (i & 1) ? 0 : 100, (i & 1) ? 254 : 160);
        uint16_t got = td_f32_to_bf16(x), want;
        if (isnan(x)) want = (uint16_t)((bits_of(x) >> 16) | 0x0040);
        else want = bf16_reference(x);
        if (got != want) fail_msg("bf16(%a = 0x%08X) = 0x%04X, reference 0x%04X", (double)x,
                                  bits_of(x), got, want);
    }
}

/* ---- E4M3FN ----------------------------------------------------------------------------- */

/* NVFP4_SPEC.md §1.3, positive half (code = 8*E + m), transcribed from the spec's table. */
static const double e4m3_spec_table[128] = {
    0.0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875,
    0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375, 0.029296875,
    0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875, 0.05859375,
    0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875,
    0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375,
    0.25, 0.28125, 0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875,
    0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375,
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
    2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75,
    4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5,
    8, 9, 10, 11, 12, 13, 14, 15,
    16, 18, 20, 22, 24, 26, 28, 30,
    32, 36, 40, 44, 48, 52, 56, 60,
    64, 72, 80, 88, 96, 104, 112, 120,
    128, 144, 160, 176, 192, 208, 224, 240,
    256, 288, 320, 352, 384, 416, 448, -1.0 /* 0x7F is NaN */,
};

static const td_e4m3_mode all_modes[] = {TD_E4M3_TORCH, TD_E4M3_SATFINITE, TD_E4M3_NOSAT};

/* Independent value of an E4M3FN code (NaN for 0x7F/0xFF). */
static double e4m3_formula(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) v = nan("");
    else if (e == 0) v = ldexp(m, -9);
    else v = ldexp(8 + m, e - 10);
    return s ? -v : v;
}

/* Sorted non-negative values: the 127 finite codes plus a virtual code 0x7F = 480 (the next
 * value the exponent/mantissa pattern would have), so overflow rounding is a nearest search. */
static void e4m3_value_table(double table[128])
{
    for (int c = 0; c < 127; c++) table[c] = e4m3_formula((uint8_t)c);
    table[127] = 480.0;
}

/* Reference float32 -> E4M3FN: nearest search with ties to the even code, then the mode's
 * rules for values that land on (or beyond) the virtual code, inf and NaN (§1.4 table). */
static uint8_t e4m3_reference(const double table[128], float x, td_e4m3_mode mode)
{
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    uint8_t ovf = (mode == TD_E4M3_SATFINITE) ? 0x7E : 0x7F;
    if (isnan(x)) return mode == TD_E4M3_TORCH ? (uint8_t)(sign | 0x7F) : 0x7F;
    double a = fabs((double)x);
    if (a >= table[127]) return sign | ovf; /* also inf */
    int lo = 0, hi = 127;                     /* table[lo] <= a < table[hi] */
    while (hi - lo > 1) {
        int m = (lo + hi) / 2;
        if (table[m] <= a) lo = m; else hi = m;
    }
    double mid = (table[lo] + table[hi]) / 2;
    int c = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    if (c == 127) return sign | ovf;
    return (uint8_t)(sign | c);
}

static void e4m3_all_codes_decode_to_formula(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        float got = td_e4m3_to_f32((uint8_t)b);
        double want = e4m3_formula((uint8_t)b);
        double spec = e4m3_spec_table[b & 0x7F] * ((b & 0x80) ? -1.0 : 1.0);
        if (isnan(want)) {
            if (!isnan(got) || SB(got) != ((b & 0x80) != 0) || !td_e4m3_is_nan((uint8_t)b))
                fail_msg("e4m3 0x%02X: want NaN with sign %d, got %a", b, b >> 7, (double)got);
            continue;
        }
        if (td_e4m3_is_nan((uint8_t)b)) fail_msg("e4m3 0x%02X flagged as NaN", b);
        if ((double)got != want || SB(got) != SB(want) || (double)got != spec)
            fail_msg("e4m3 0x%02X: got %a, formula %a, spec table %a", b, (double)got, want, spec);
    }
}

static void e4m3_spec_measured_codes_decode(void **state)
{
    (void)state;
    /* §1.1 measured decode values and §1.2 constants */
    static const struct { uint8_t b; double v; } cases[] = {
        {0x00, 0.0}, {0x01, 0.001953125}, {0x07, 0.013671875}, {0x08, 0.015625},
        {0x38, 1.0}, {0x7E, 448.0}, {0x80, -0.0}, {0xFE, -448.0}, {0x78, 256.0},
        {0x20, 0.125}, {0x6D, 104.0}, {0x81, -0.001953125},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        float got = td_e4m3_to_f32(cases[i].b);
        if ((double)got != cases[i].v || SB(got) != SB(cases[i].v))
            fail_msg("e4m3 0x%02X = %a, want %a", cases[i].b, (double)got, cases[i].v);
    }
    assert_true(signbit(td_e4m3_to_f32(0x80)));
    assert_false(signbit(td_e4m3_to_f32(0x00)));
    assert_true(isnan(td_e4m3_to_f32(0x7F)) && !signbit(td_e4m3_to_f32(0x7F)));
    assert_true(isnan(td_e4m3_to_f32(0xFF)) && signbit(td_e4m3_to_f32(0xFF)));
    assert_int_equal(bits_of(td_e4m3_to_f32(0x7F)), 0x7FC00000);
    assert_int_equal(bits_of(td_e4m3_to_f32(0xFF)), 0xFFC00000);
}

static void e4m3_all_codes_roundtrip_each_mode(void **state)
{
    (void)state;
    for (size_t mi = 0; mi < TD_ARRAY_LEN(all_modes); mi++) {
        td_e4m3_mode mode = all_modes[mi];
        for (int b = 0; b < 256; b++) {
            uint8_t back = td_f32_to_e4m3(td_e4m3_to_f32((uint8_t)b), mode);
            uint8_t want = (uint8_t)b;
            if (b == 0xFF && mode != TD_E4M3_TORCH) want = 0x7F; /* CUDA drops the NaN sign */
            if (back != want)
                fail_msg("%s: e4m3 0x%02X round-trips to 0x%02X, want 0x%02X",
                         td_e4m3_mode_name(mode), b, back, want);
        }
    }
}

static void e4m3_decision_points_each_mode(void **state)
{
    (void)state;
    double table[128];
    e4m3_value_table(table);
    for (size_t mi = 0; mi < TD_ARRAY_LEN(all_modes); mi++) {
        td_e4m3_mode mode = all_modes[mi];
        uint8_t ovf = (mode == TD_E4M3_SATFINITE) ? 0x7E : 0x7F;
        for (int c = 0; c < 127; c++) {
            float v = (float)table[c];
            if (td_f32_to_e4m3(v, mode) != c || td_f32_to_e4m3(-v, mode) != (c | 0x80))
                fail_msg("%s: value of 0x%02X does not encode to itself", td_e4m3_mode_name(mode), c);
            /* midpoint to the upper neighbour; c = 0x7E pairs with the virtual 480 (mid 464) */
            double mid = (table[c] + table[c + 1]) / 2;
            float fm = (float)mid;
            assert_true((double)fm == mid);
            int even = (c & 1) ? c + 1 : c;
            int up = c + 1;
            uint8_t w_mid = (uint8_t)(even == 127 ? ovf : even);
            uint8_t w_up = (uint8_t)(up == 127 ? ovf : up);
            float below = nextafterf(fm, 0.0f), above = nextafterf(fm, INFINITY);
            uint8_t g_mid = td_f32_to_e4m3(fm, mode), g_below = td_f32_to_e4m3(below, mode),
                    g_above = td_f32_to_e4m3(above, mode);
            if (g_mid != w_mid || g_below != c || g_above != w_up)
                fail_msg("%s: midpoint %a after 0x%02X: got %02X/%02X/%02X want %02X/%02X/%02X",
                         td_e4m3_mode_name(mode), mid, c, g_below, g_mid, g_above, c, w_mid, w_up);
            if (td_f32_to_e4m3(-fm, mode) != (w_mid | 0x80) ||
                td_f32_to_e4m3(-below, mode) != (c | 0x80) ||
                td_f32_to_e4m3(-above, mode) != (w_up | 0x80))
                fail_msg("%s: negative midpoint %a after 0x%02X wrong", td_e4m3_mode_name(mode), mid,
                         c);
        }
    }
}

static void e4m3_spec_edge_list_each_mode(void **state)
{
    (void)state;
    /* NVFP4_SPEC.md §1.4 table and the measured edge list: {torch, satfinite, nosat} */
    static const struct { uint32_t in; uint8_t want[3]; } cases[] = {
        {0x43E00000, {0x7E, 0x7E, 0x7E}},   /* 448 */
        {0x43E80000, {0x7E, 0x7E, 0x7E}},   /* 464: tie, 448 has the even mantissa */
        {0x43E80001, {0x7F, 0x7E, 0x7F}},   /* 464.00003 */
        {0x43EFF333, {0x7F, 0x7E, 0x7F}},   /* 479.9 */
        {0x43F00000, {0x7F, 0x7E, 0x7F}},   /* 480 */
        {0x4E6E6B28, {0x7F, 0x7E, 0x7F}},   /* 1e9 */
        {0x7F7FFFFF, {0x7F, 0x7E, 0x7F}},   /* FLT_MAX */
        {0x7F800000, {0x7F, 0x7E, 0x7F}},   /* +inf */
        {0xFF800000, {0xFF, 0xFE, 0xFF}},   /* -inf */
        {0xC3E80001, {0xFF, 0xFE, 0xFF}},   /* -464.00003 */
        {0xCE6E6B28, {0xFF, 0xFE, 0xFF}},   /* -1e9 */
        {0x7FC00000, {0x7F, 0x7F, 0x7F}},   /* +NaN */
        {0xFFC00000, {0xFF, 0x7F, 0x7F}},   /* -NaN: torch keeps the sign, CUDA drops it */
        {0xFF800001, {0xFF, 0x7F, 0x7F}},   /* -sNaN */
        {0x80000000, {0x80, 0x80, 0x80}},   /* -0 */
        {0x3A800000, {0x00, 0x00, 0x00}},   /* 2^-10: tie -> 0 */
        {0xBA800000, {0x80, 0x80, 0x80}},   /* -2^-10 -> -0 */
        {0x3AC00000, {0x01, 0x01, 0x01}},   /* 1.5 * 2^-10 */
        {0x3A800001, {0x01, 0x01, 0x01}},   /* just above 2^-10 */
        {0x3B400000, {0x02, 0x02, 0x02}},   /* 1.5 * 2^-9: tie between 0x01 and 0x02 -> even */
        {0x3C700000, {0x08, 0x08, 0x08}},   /* 7.5 * 2^-9: tie 0x07/0x08 -> 0x08 (min normal) */
        {0x00000001, {0x00, 0x00, 0x00}},   /* float32 subnormal */
        {0x42D11110, {0x6D, 0x6D, 0x6D}},   /* 104.5333 (NVFP4_SPEC §8 s_raw) */
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        for (size_t mi = 0; mi < 3; mi++) {
            uint8_t got = td_f32_to_e4m3(float_of(cases[i].in), all_modes[mi]);
            if (got != cases[i].want[mi])
                fail_msg("%s: e4m3(0x%08X) = 0x%02X, want 0x%02X", td_e4m3_mode_name(all_modes[mi]),
                         cases[i].in, got, cases[i].want[mi]);
        }
    }
    /* the float constants above are the decimal values the spec names */
    assert_int_equal(bits_of(464.00003f), 0x43E80001);
    assert_int_equal(bits_of(479.9f), 0x43EFF333);
    assert_int_equal(bits_of(1e9f), 0x4E6E6B28);
    assert_int_equal(bits_of(104.5333251953125f), 0x42D11110);
}

static void e4m3_random_patterns_match_reference(void **state)
{
    (void)state;
    double table[128];
    e4m3_value_table(table);
    uint64_t s = 0xE4A3E4A3;
    for (uint32_t i = 0; i < RANDOM_SAMPLES; i++) {
        /* biased exponents 115..137 cover 2^-12 .. 2^10: underflow, subnormals, overflow */
        float x = rand_f32(&s, 115, 137);
        for (size_t mi = 0; mi < 3; mi++) {
            uint8_t got = td_f32_to_e4m3(x, all_modes[mi]);
            uint8_t want = e4m3_reference(table, x, all_modes[mi]);
            if (got != want)
                fail_msg("%s: e4m3(%a = 0x%08X) = 0x%02X, reference 0x%02X",
                         td_e4m3_mode_name(all_modes[mi]), (double)x, bits_of(x), got, want);
        }
    }
}

static void e4m3_mode_names_roundtrip(void **state)
{
    (void)state;
    assert_string_equal(td_e4m3_mode_name(TD_E4M3_TORCH), "torch");
    assert_string_equal(td_e4m3_mode_name(TD_E4M3_SATFINITE), "satfinite");
    assert_string_equal(td_e4m3_mode_name(TD_E4M3_NOSAT), "nosat");
    assert_string_equal(td_e4m3_mode_name((td_e4m3_mode)99), "unknown");
    for (size_t mi = 0; mi < 3; mi++) {
        td_e4m3_mode m = (td_e4m3_mode)77;
        td_err err;
        assert_int_equal(td_e4m3_mode_from_name(td_e4m3_mode_name(all_modes[mi]), &m, &err), TD_OK);
        assert_int_equal(m, all_modes[mi]);
    }
    td_e4m3_mode m = TD_E4M3_NOSAT;
    td_err err;
    assert_int_equal(td_e4m3_mode_from_name("saturate", &m, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "'saturate'"));
    assert_int_equal(m, TD_E4M3_NOSAT);
}

/* ---- E2M1 ------------------------------------------------------------------------------- */

static const double e2m1_values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
static const td_e2m1_sign both_rules[] = {TD_E2M1_SIGNBIT, TD_E2M1_NEGATIVE};

/* Reference float32 -> E2M1: nearest value, ties to the even code, saturation at 6. */
static uint8_t e2m1_reference(float y, td_e2m1_sign rule)
{
    double a = fabs((double)y);
    int c;
    if (a >= 6.0) {
        c = 7;
    } else {
        int lo = 0;
        while (e2m1_values[lo + 1] <= a) lo++;
        double mid = (e2m1_values[lo] + e2m1_values[lo + 1]) / 2;
        c = a < mid ? lo : a > mid ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    }
    bool neg = rule == TD_E2M1_NEGATIVE ? y < 0.0f : signbit(y) != 0;
    return (uint8_t)(c | (neg ? 8 : 0));
}

static void e2m1_all_codes_decode_to_formula(void **state)
{
    (void)state;
    /* §2.1 table: fp16 and bf16 bit patterns of each magnitude */
    static const uint16_t f16_bits[8] = {
        0x0000, 0x3800, 0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400, 0x4600,
    };
    static const uint16_t bf16_bits[8] = {
        0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
    };
    for (int c = 0; c < 16; c++) {
        int e = (c >> 1) & 3, m = c & 1;
        double want = e == 0 ? 0.5 * m : ldexp(1.0 + m / 2.0, e - 1);
        if (c & 8) want = -want;
        float got = td_e2m1_to_f32((uint8_t)c);
        if ((double)got != want || SB(got) != SB(want))
            fail_msg("e2m1 0x%X: got %a, want %a", c, (double)got, want);
        if ((double)got != e2m1_values[c & 7] * ((c & 8) ? -1 : 1))
            fail_msg("e2m1 0x%X disagrees with the value table", c);
        assert_int_equal(td_f32_to_f16(got), f16_bits[c & 7] | ((c & 8) ? 0x8000 : 0));
        assert_int_equal(td_f32_to_bf16(got), bf16_bits[c & 7] | ((c & 8) ? 0x8000 : 0));
        for (int hi = 1; hi < 16; hi++) /* upper bits are ignored */
            assert_int_equal(bits_of(td_e2m1_to_f32((uint8_t)(hi << 4 | c))), bits_of(got));
    }
}

static void e2m1_spec_thresholds_and_ties_round_to_even(void **state)
{
    (void)state;
    /* §2.2 measured list: 0,.25,.26,.75,1.25,1.75,2.5,3.5,5,5.1,6,7 -> 0,0,1,2,2,4,4,6,6,7,7,7 */
    static const struct { float y; uint8_t code; } measured[] = {
        {0.0f, 0}, {0.25f, 0}, {0.26f, 1}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},
        {3.5f, 6}, {5.0f, 6}, {5.1f, 7}, {6.0f, 7}, {7.0f, 7},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(measured); i++)
        for (size_t r = 0; r < 2; r++) {
            uint8_t c = 0xFF;
            assert_int_equal(td_f32_to_e2m1(measured[i].y, both_rules[r], &c, NULL), TD_OK);
            if (c != measured[i].code)
                fail_msg("e2m1(%g) = %u, want %u", (double)measured[i].y, c, measured[i].code);
            uint8_t neg = 0xFF;
            assert_int_equal(td_f32_to_e2m1(-measured[i].y, both_rules[r], &neg, NULL), TD_OK);
            /* -0.0 is the one input whose sign depends on the rule */
            uint8_t want_neg = measured[i].y == 0.0f && both_rules[r] == TD_E2M1_NEGATIVE
                                   ? 0 : (uint8_t)(measured[i].code | 8);
            if (neg != want_neg)
                fail_msg("e2m1(-%g) = 0x%X, want 0x%X", (double)measured[i].y, neg, want_neg);
        }
    /* Each threshold, and one float32 ULP either side: {threshold, code below, at, above} */
    static const struct { float t; uint8_t below, at, above; } th[] = {
        {0.25f, 0, 0, 1}, {0.75f, 1, 2, 2}, {1.25f, 2, 2, 3}, {1.75f, 3, 4, 4},
        {2.5f, 4, 4, 5},  {3.5f, 5, 6, 6},  {5.0f, 6, 6, 7},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(th); i++) {
        float t = th[i].t, lo = nextafterf(t, 0.0f), hi = nextafterf(t, INFINITY);
        uint8_t g_lo = td_e2m1_encode(lo, TD_E2M1_SIGNBIT), g_at = td_e2m1_encode(t, TD_E2M1_SIGNBIT),
                g_hi = td_e2m1_encode(hi, TD_E2M1_SIGNBIT);
        if (g_lo != th[i].below || g_at != th[i].at || g_hi != th[i].above)
            fail_msg("e2m1 around %g: got %u/%u/%u want %u/%u/%u", (double)t, g_lo, g_at, g_hi,
                     th[i].below, th[i].at, th[i].above);
        if (td_e2m1_encode(-lo, TD_E2M1_NEGATIVE) != (th[i].below | 8) ||
            td_e2m1_encode(-t, TD_E2M1_NEGATIVE) != (th[i].at | 8) ||
            td_e2m1_encode(-hi, TD_E2M1_NEGATIVE) != (th[i].above | 8))
            fail_msg("e2m1 around -%g wrong", (double)t);
    }
    /* every code value encodes to itself */
    for (int c = 0; c < 16; c++) {
        if (c == 8) continue;
        assert_int_equal(td_e2m1_encode(td_e2m1_to_f32((uint8_t)c), TD_E2M1_NEGATIVE), c);
        assert_int_equal(td_e2m1_encode(td_e2m1_to_f32((uint8_t)c), TD_E2M1_SIGNBIT), c);
    }
}

static void e2m1_saturation_and_infinity_give_max(void **state)
{
    (void)state;
    static const float big[] = {6.0f, 6.5f, 7.0f, 100.0f, 1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < TD_ARRAY_LEN(big); i++)
        for (size_t r = 0; r < 2; r++) {
            uint8_t c = 0xFF;
            assert_int_equal(td_f32_to_e2m1(big[i], both_rules[r], &c, NULL), TD_OK);
            assert_int_equal(c, 0x7);
            assert_int_equal(td_f32_to_e2m1(-big[i], both_rules[r], &c, NULL), TD_OK);
            assert_int_equal(c, 0xF);
        }
}

static void e2m1_negative_zero_follows_sign_rule(void **state)
{
    (void)state;
    uint8_t c;
    assert_int_equal(td_f32_to_e2m1(-0.0f, TD_E2M1_SIGNBIT, &c, NULL), TD_OK);
    assert_int_equal(c, 0x8);
    assert_int_equal(td_f32_to_e2m1(-0.0f, TD_E2M1_NEGATIVE, &c, NULL), TD_OK);
    assert_int_equal(c, 0x0);
    assert_int_equal(td_f32_to_e2m1(0.0f, TD_E2M1_SIGNBIT, &c, NULL), TD_OK);
    assert_int_equal(c, 0x0);
    assert_int_equal(td_f32_to_e2m1(0.0f, TD_E2M1_NEGATIVE, &c, NULL), TD_OK);
    assert_int_equal(c, 0x0);
    /* tiny negatives that round to zero keep the sign under both rules (§2.2 table) */
    static const float tiny_neg[] = {-1e-30f, -0.25f, -0x1p-149f, -0.1f};
    for (size_t i = 0; i < TD_ARRAY_LEN(tiny_neg); i++) {
        assert_int_equal(td_e2m1_encode(tiny_neg[i], TD_E2M1_SIGNBIT), 0x8);
        assert_int_equal(td_e2m1_encode(tiny_neg[i], TD_E2M1_NEGATIVE), 0x8);
    }
}

static void e2m1_nan_rejected_with_message(void **state)
{
    (void)state;
    static const uint32_t nans[] = {0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF};
    for (size_t i = 0; i < TD_ARRAY_LEN(nans); i++)
        for (size_t r = 0; r < 2; r++) {
            uint8_t c = 0xA5;
            td_err err;
            td_err_clear(&err);
            assert_int_equal(td_f32_to_e2m1(float_of(nans[i]), both_rules[r], &c, &err), TD_ERR_ARG);
            assert_int_equal(err.code, TD_ERR_ARG);
            assert_non_null(strstr(err.msg, "NaN"));
            assert_int_equal(c, 0xA5); /* untouched */
            /* the non-failing form maps any NaN to +6 (code 7), like PTX cvt and ModelOpt */
            assert_int_equal(td_e2m1_encode(float_of(nans[i]), both_rules[r]), 0x7);
        }
    uint8_t c = 0;
    assert_int_equal(td_f32_to_e2m1(NAN, TD_E2M1_SIGNBIT, &c, NULL), TD_ERR_ARG); /* NULL err ok */
}

static void e2m1_random_patterns_match_reference(void **state)
{
    (void)state;
    uint64_t s = 0xE2A1E2A1;
    for (uint32_t i = 0; i < RANDOM_SAMPLES; i++) {
        float y = rand_f32(&s, 122, 131); /* 2^-5 .. 2^4 plus uniform patterns */
        for (size_t r = 0; r < 2; r++) {
            uint8_t fast = td_e2m1_encode(y, both_rules[r]);
            uint8_t c = 0xEE;
            td_status st = td_f32_to_e2m1(y, both_rules[r], &c, NULL);
            if (isnan(y)) {
                if (st != TD_ERR_ARG || c != 0xEE || fast != 7)
                    fail_msg("e2m1 NaN 0x%08X: status %d code 0x%X fast 0x%X", bits_of(y), st, c, fast);
                continue;
            }
            uint8_t want = e2m1_reference(y, both_rules[r]);
            if (st != TD_OK || c != want || fast != want)
                fail_msg("e2m1(%a = 0x%08X, rule %zu) = 0x%X / fast 0x%X, reference 0x%X",
                         (double)y, bits_of(y), r, c, fast, want);
        }
    }
}

static void e2m1_pack_unpack_all_bytes_roundtrip(void **state)
{
    (void)state;
    uint8_t bytes[256], codes[512 + 8], back[256 + 8];
    for (int b = 0; b < 256; b++) bytes[b] = (uint8_t)b;
    memset(codes, 0xEE, sizeof codes);
    td_e2m1_unpack(bytes, 512, codes);
    for (int b = 0; b < 256; b++) {
        assert_int_equal(codes[2 * b], b & 0xF);      /* element 2j: low nibble */
        assert_int_equal(codes[2 * b + 1], b >> 4);   /* element 2j+1: high nibble */
    }
    for (int i = 512; i < 520; i++) assert_int_equal(codes[i], 0xEE); /* no overrun */
    memset(back, 0xEE, sizeof back);
    td_e2m1_pack(codes, 512, back);
    assert_memory_equal(back, bytes, 256);
    for (int i = 256; i < 264; i++) assert_int_equal(back[i], 0xEE);
}

static void e2m1_pack_nibble_order_low_is_even(void **state)
{
    (void)state;
    uint8_t out[4] = {0};
    const uint8_t c17[2] = {1, 7};
    td_e2m1_pack(c17, 2, out);
    assert_int_equal(out[0], 0x71);
    const uint8_t dirty[2] = {0xF1, 0x27}; /* upper bits of codes are ignored */
    td_e2m1_pack(dirty, 2, out);
    assert_int_equal(out[0], 0x71);
    /* odd n: the last byte's high nibble is 0 and the unpacker does not read it */
    const uint8_t c345[3] = {3, 4, 5};
    memset(out, 0xEE, sizeof out);
    td_e2m1_pack(c345, 3, out);
    assert_int_equal(out[0], 0x43);
    assert_int_equal(out[1], 0x05);
    assert_int_equal(out[2], 0xEE);
    const uint8_t in[2] = {0x43, 0xF5};
    uint8_t codes[4];
    memset(codes, 0xEE, sizeof codes);
    td_e2m1_unpack(in, 3, codes);
    assert_int_equal(codes[0], 3);
    assert_int_equal(codes[1], 4);
    assert_int_equal(codes[2], 5);
    assert_int_equal(codes[3], 0xEE);
    /* n == 0 touches nothing (NULL allowed) */
    td_e2m1_pack(NULL, 0, NULL);
    td_e2m1_unpack(NULL, 0, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_all_patterns_decode_to_formula),
        cmocka_unit_test(f16_all_patterns_reencode_to_self),
        cmocka_unit_test(f16_decision_points_round_to_nearest_even),
        cmocka_unit_test(f16_special_values_encode_as_documented),
        cmocka_unit_test(f16_random_patterns_match_reference),
        cmocka_unit_test(bf16_all_patterns_decode_to_formula),
        cmocka_unit_test(bf16_all_patterns_reencode_to_self),
        cmocka_unit_test(bf16_decision_points_round_to_nearest_even),
        cmocka_unit_test(bf16_special_values_encode_as_documented),
        cmocka_unit_test(bf16_random_patterns_match_reference),
        cmocka_unit_test(e4m3_all_codes_decode_to_formula),
        cmocka_unit_test(e4m3_spec_measured_codes_decode),
        cmocka_unit_test(e4m3_all_codes_roundtrip_each_mode),
        cmocka_unit_test(e4m3_decision_points_each_mode),
        cmocka_unit_test(e4m3_spec_edge_list_each_mode),
        cmocka_unit_test(e4m3_random_patterns_match_reference),
        cmocka_unit_test(e4m3_mode_names_roundtrip),
        cmocka_unit_test(e2m1_all_codes_decode_to_formula),
        cmocka_unit_test(e2m1_spec_thresholds_and_ties_round_to_even),
        cmocka_unit_test(e2m1_saturation_and_infinity_give_max),
        cmocka_unit_test(e2m1_negative_zero_follows_sign_rule),
        cmocka_unit_test(e2m1_nan_rejected_with_message),
        cmocka_unit_test(e2m1_random_patterns_match_reference),
        cmocka_unit_test(e2m1_pack_unpack_all_bytes_roundtrip),
        cmocka_unit_test(e2m1_pack_nibble_order_low_is_even),
    };
    return cmocka_run_group_tests_name("formats", tests, NULL, NULL);
}
