/* e4m3.c — Part 1 of `tandem audit e4m3`: the codec self-audit (see e4m3.h).
 *
 * Oracles, all independent of core/formats.c:
 * - E4M3/E2M1 values from the format formulas evaluated with ldexp in double;
 * - encoders as a nearest-value search (binary search over the sorted non-negative values,
 *   exact double midpoints, ties to the code whose mantissa bit is even), with the overflow,
 *   infinity and NaN rules of each semantics applied around it;
 * - FP16/BF16 bit patterns of exactly representable values built from frexp;
 * - FP32 rounding of exact products by the C conversion double -> float (round to nearest),
 *   FP16 rounding by td_f16_round() (core/e4m3_recon.c).
 */
#include "e4m3.h"
#include "rng.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---- small helpers ------------------------------------------------------------------------ */

static uint32_t bits_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static td_codec_check *chk_begin(td_codec_report *rep, const char *name)
{
    TD_ASSERT(rep->n < TD_CODEC_MAX_CHECKS);
    td_codec_check *k = &rep->checks[rep->n++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->first_index = -1;
    return k;
}

/* Record one tested element; on a mismatch, count it and describe the first one. */
static void chk_item(td_codec_check *k, bool ok, bool nan_mismatch, const char *fmt, ...) TD_PRINTF(4, 5);
static void chk_item(td_codec_check *k, bool ok, bool nan_mismatch, const char *fmt, ...)
{
    int64_t idx = k->elements++;
    if (ok) return;
    k->mismatches++;
    if (nan_mismatch) k->nan_mismatches++;
    if (k->first_index >= 0) return;
    k->first_index = idx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->first, sizeof k->first, fmt, ap);
    va_end(ap);
}

static void chk_end(td_codec_report *rep, td_codec_check *k)
{
    k->passed = k->mismatches == 0 && k->elements > 0;
    if (!k->passed) rep->failed++;
}

/* ---- E4M3 oracle --------------------------------------------------------------------------- */

/* Value of an E4M3FN code from the format's definition: NaN at S.1111.111, exponent 0 gives
 * m * 2^-9, otherwise (1 + m/8) * 2^(e-7) = (8 + m) * 2^(e-10). */
static double ref_e4m3_value(unsigned code)
{
    unsigned e = (code >> 3) & 0xF, m = code & 7;
    double v;
    if ((code & 0x7F) == 0x7F) return (code & 0x80) ? -(double)NAN : (double)NAN;
    if (e == 0) v = ldexp((double)m, -9);
    else v = ldexp((double)(8 + m), (int)e - 10);
    return (code & 0x80) ? -v : v;
}

/* Non-negative finite values in code order (0x00..0x7E, ascending), plus the would-be next
 * value 480 as entry 127 so that 464 is the midpoint above 448. */
typedef struct e4m3_table {
    double v[128];
} e4m3_table;

static void e4m3_table_init(e4m3_table *t)
{
    for (unsigned c = 0; c < 127; c++) t->v[c] = ref_e4m3_value(c);
    t->v[127] = 480.0;
}

/* Reference float32 -> E4M3FN under `mode` (NVFP4_SPEC.md §1.4 table). */
static uint8_t ref_e4m3_encode(const e4m3_table *t, float x, td_e4m3_mode mode)
{
    uint32_t u = bits_f32(x);
    uint8_t sign = (u >> 31) ? 0x80 : 0x00;
    uint8_t over = (mode == TD_E4M3_SATFINITE) ? 0x7E : 0x7F;
    if (isnan(x)) return mode == TD_E4M3_TORCH ? (uint8_t)(sign | 0x7F) : (uint8_t)0x7F;
    double a = fabs((double)x);
    if (isinf(a)) return (uint8_t)(sign | over);
    if (a > 464.0) return (uint8_t)(sign | over);
    if (a >= 448.0) return (uint8_t)(sign | 0x7E);  /* (448, 464]: 464 is a tie to the even 448 */
    unsigned lo = 0, hi = 126;                      /* v[lo] <= a < v[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (t->v[mid] <= a) lo = mid;
        else hi = mid;
    }
    double m = (t->v[lo] + t->v[hi]) / 2;           /* exact: <= 6 significant bits */
    unsigned c;
    if (a < m) c = lo;
    else if (a > m) c = hi;
    else c = (lo & 1) ? hi : lo;                     /* tie: the even mantissa */
    return (uint8_t)(sign | c);
}

/* ---- E2M1 oracle --------------------------------------------------------------------------- */

static double ref_e2m1_value(unsigned code)
{
    unsigned e = (code >> 1) & 3, m = code & 1;
    double v = (e == 0) ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return (code & 8) ? -v : v;
}

static uint8_t ref_e2m1_encode(float y, td_e2m1_sign rule)
{
    if (isnan(y)) return 0x7;
    double a = fabs((double)y);
    unsigned c = 7;
    if (a <= 6.0) {
        unsigned lo = 0, hi = 7;
        if (a >= 6.0) lo = 7;
        else {
            while (hi - lo > 1) {
                unsigned mid = (lo + hi) / 2;
                if (ref_e2m1_value(mid) <= a) lo = mid;
                else hi = mid;
            }
        }
        if (lo == 7) c = 7;
        else {
            double m = (ref_e2m1_value(lo) + ref_e2m1_value(hi)) / 2;
            if (a < m) c = lo;
            else if (a > m) c = hi;
            else c = (lo & 1) ? hi : lo;
        }
    }
    bool neg = (rule == TD_E2M1_NEGATIVE) ? (y < 0.0f) : (signbit(y) != 0);
    return (uint8_t)(c | (neg ? 8u : 0u));
}

/* ---- FP16 / BF16 exact patterns ------------------------------------------------------------- */

/* Bit pattern of an exactly representable value in a binary format with `mbits` mantissa bits
 * and exponent bias `bias` (FP16: 10, 15; BF16: 7, 127). NaN -> quiet NaN with the sign. */
static uint16_t exact_bits(double v, int mbits, int bias)
{
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    uint16_t expmask = (uint16_t)(0x7FFF & ~((1u << mbits) - 1));
    if (isnan(v)) return (uint16_t)(sign | expmask | (1u << (mbits - 1)));
    double a = fabs(v);
    if (isinf(a)) return (uint16_t)(sign | expmask);
    if (a == 0) return sign;
    int ex;
    (void)frexp(a, &ex);
    int e2 = ex - 1;
    int emin = 1 - bias;
    if (e2 < emin) /* subnormal: a / 2^(emin - mbits) is an integer */
        return (uint16_t)(sign | (uint16_t)ldexp(a, mbits - emin));
    uint32_t mant = (uint32_t)ldexp(a, mbits - e2) - (1u << mbits);
    return (uint16_t)(sign | ((uint32_t)(e2 + bias) << mbits) | mant);
}

static bool same_bits_or_nan(uint16_t a, uint16_t b, bool a_nan, bool b_nan)
{
    return a == b || (a_nan && b_nan);
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7FFF) > 0x7F80; }

/* ---- the checks ----------------------------------------------------------------------------- */

static void check_e4m3_decode(const td_codec *c, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, "e4m3.decode");
    for (unsigned code = 0; code < 256; code++) {
        double want = ref_e4m3_value(code);
        float got = c->e4m3_to_f32((uint8_t)code);
        bool ok;
        if (isnan(want)) ok = isnan(got);
        else ok = !isnan(got) && (double)got == want && !signbit(got) == !signbit(want);
        chk_item(k, ok, isnan(want) != isnan(got), "code 0x%02X: got %.9g, want %.9g", code,
                 (double)got, want);
    }
    chk_end(rep, k);
}

static void check_e4m3_constants(const td_codec *c, td_codec_report *rep)
{
    /* NVFP4_SPEC.md §1.2 and the measured torch decodes of §1.1. */
    static const struct { uint8_t code; double value; } tab[] = {
        {0x00, 0.0}, {0x01, 0.001953125}, {0x07, 0.013671875}, {0x08, 0.015625},
        {0x38, 1.0}, {0x7E, 448.0}, {0xFE, -448.0}, {0x78, 256.0}, {0x40, 2.0},
        {0x6D, 104.0}, {0x20, 0.125},
    };
    td_codec_check *k = chk_begin(rep, "e4m3.constants");
    for (size_t i = 0; i < TD_ARRAY_LEN(tab); i++) {
        float got = c->e4m3_to_f32(tab[i].code);
        chk_item(k, (double)got == tab[i].value, false, "code 0x%02X: got %.9g, want %.9g",
                 tab[i].code, (double)got, tab[i].value);
    }
    float nz = c->e4m3_to_f32(0x80);
    chk_item(k, nz == 0.0f && signbit(nz), false, "code 0x80: got %.9g, want -0", (double)nz);
    float n1 = c->e4m3_to_f32(0x7F), n2 = c->e4m3_to_f32(0xFF);
    chk_item(k, isnan(n1), !isnan(n1), "code 0x7F: got %.9g, want NaN", (double)n1);
    chk_item(k, isnan(n2), !isnan(n2), "code 0xFF: got %.9g, want NaN", (double)n2);
    chk_end(rep, k);
}

static void e4m3_encode_one(td_codec_check *k, const td_codec *c, const e4m3_table *t, float x,
                            td_e4m3_mode mode)
{
    uint8_t want = ref_e4m3_encode(t, x, mode);
    uint8_t got = c->f32_to_e4m3(x, mode);
    chk_item(k, got == want, td_e4m3_is_nan(got) != td_e4m3_is_nan(want),
             "%s: input 0x%08X (%.9g): got 0x%02X, want 0x%02X", td_e4m3_mode_name(mode),
             (unsigned)bits_f32(x), (double)x, got, want);
}

static void check_e4m3_encode_points(const td_codec *c, const e4m3_table *t, td_e4m3_mode mode,
                                     td_codec_report *rep)
{
    char name[48];
    snprintf(name, sizeof name, "e4m3.encode.%s", td_e4m3_mode_name(mode));
    td_codec_check *k = chk_begin(rep, name);
    static const uint32_t specials[] = {
        0x00000000u, /* 0 */
        0x3A800000u, /* 2^-10: tie between 0 and 2^-9 -> 0 */
        0x3AC00000u, /* 1.5 * 2^-10 -> 0x01 */
        0x00000001u, /* smallest float32 subnormal */
        0x00800000u, /* FLT_MIN */
        0x3C700000u, /* 15 * 2^-10: midpoint of 7*2^-9 (subnormal, odd) and 2^-6 -> 0x08 */
        0x43E00000u, /* 448 */
        0x43E80000u, /* 464 */
        0x43E80001u, /* 464.00003 */
        0x43EFFF33u, /* 479.9 */
        0x43F00000u, /* 480 */
        0x44000000u, /* 512 */
        0x4E6E6B28u, /* 1e9 */
        0x7F7FFFFFu, /* FLT_MAX */
        0x7F800000u, /* inf */
        0x7FC00000u, /* quiet NaN */
        0x7F800001u, /* signalling NaN */
        0x7FFFFFFFu, /* NaN, all payload bits */
    };
    for (int s = 0; s < 2; s++) {
        uint32_t sb = s ? 0x80000000u : 0u;
        for (size_t i = 0; i < TD_ARRAY_LEN(specials); i++)
            e4m3_encode_one(k, c, t, f32_bits(specials[i] | sb), mode);
        for (unsigned code = 0; code < 127; code++) {
            float v = (float)t->v[code];
            float m = (float)((t->v[code] + t->v[code + 1]) / 2); /* exact in float32 */
            float pts[6] = {v, nextafterf(v, -INFINITY), nextafterf(v, INFINITY),
                            m, nextafterf(m, -INFINITY), nextafterf(m, INFINITY)};
            for (int j = 0; j < 6; j++) e4m3_encode_one(k, c, t, s ? -pts[j] : pts[j], mode);
        }
    }
    chk_end(rep, k);
}

/* Random float32: 1/4 any pattern; 3/4 a biased exponent in [emin, emax] with a random sign,
 * half of them with the low 16 mantissa bits cleared so that exact ties occur often. */
static float rand_f32(td_rng *r, uint32_t emin, uint32_t emax)
{
    uint64_t x = td_rng_u64(r);
    if ((x & 3) == 0) return f32_bits((uint32_t)(x >> 32));
    uint32_t mant = (uint32_t)(x >> 8) & 0x7FFFFFu;
    if (x & 4) mant &= 0x7F0000u;
    uint32_t e = emin + (uint32_t)td_rng_below(r, emax - emin + 1);
    uint32_t sign = (x & 8) ? 0x80000000u : 0u;
    return f32_bits(sign | (e << 23) | mant);
}

static void check_e4m3_sweep(const td_codec *c, const e4m3_table *t, td_e4m3_mode mode,
                             uint64_t seed, td_codec_report *rep)
{
    char name[48];
    snprintf(name, sizeof name, "e4m3.sweep.%s", td_e4m3_mode_name(mode));
    td_codec_check *k = chk_begin(rep, name);
    td_rng r;
    td_rng_seed(&r, seed ^ (0x4E34u + (uint64_t)mode));
    for (int i = 0; i < TD_CODEC_SWEEP; i++)
        e4m3_encode_one(k, c, t, rand_f32(&r, 127 - 12, 127 + 10), mode);
    chk_end(rep, k);
}

static void check_e4m3_roundtrip(const td_codec *c, const e4m3_table *t, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, "e4m3.roundtrip");
    for (int mode = 0; mode < TD_E4M3_MODE_COUNT; mode++) {
        for (unsigned code = 0; code < 256; code++) {
            float v = c->e4m3_to_f32((uint8_t)code);
            uint8_t got = c->f32_to_e4m3(v, (td_e4m3_mode)mode);
            uint8_t want = td_e4m3_is_nan((uint8_t)code) ? ref_e4m3_encode(t, v, (td_e4m3_mode)mode)
                                                          : (uint8_t)code;
            chk_item(k, got == want, false, "%s: code 0x%02X -> %.9g -> 0x%02X, want 0x%02X",
                     td_e4m3_mode_name((td_e4m3_mode)mode), code, (double)v, got, want);
        }
    }
    chk_end(rep, k);
}

static void check_e2m1_decode(const td_codec *c, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, "e2m1.decode");
    for (unsigned code = 0; code < 16; code++) {
        double want = ref_e2m1_value(code);
        float got = c->e2m1_to_f32((uint8_t)code);
        chk_item(k, (double)got == want && !signbit(got) == !signbit(want), false,
                 "code 0x%X: got %.9g, want %.9g", code, (double)got, want);
    }
    chk_end(rep, k);
}

static void e2m1_encode_one(td_codec_check *k, const td_codec *c, float y, td_e2m1_sign rule)
{
    uint8_t want = ref_e2m1_encode(y, rule);
    uint8_t got = c->e2m1_encode(y, rule);
    chk_item(k, got == want, false, "%s: input 0x%08X (%.9g): got 0x%X, want 0x%X",
             rule == TD_E2M1_NEGATIVE ? "negative" : "signbit", (unsigned)bits_f32(y), (double)y,
             got, want);
}

static void check_e2m1_encode(const td_codec *c, td_e2m1_sign rule, uint64_t seed,
                              td_codec_report *rep)
{
    const char *rn = rule == TD_E2M1_NEGATIVE ? "negative" : "signbit";
    char name[48];
    snprintf(name, sizeof name, "e2m1.encode.%s", rn);
    td_codec_check *k = chk_begin(rep, name);
    static const float specials[] = {0.0f, 0.1f, 5.5f, 6.0f, 7.0f, 1e9f, FLT_MAX, INFINITY,
                                     FLT_MIN, 1e-45f};
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < TD_ARRAY_LEN(specials); i++)
            e2m1_encode_one(k, c, s ? -specials[i] : specials[i], rule);
        for (unsigned code = 0; code < 8; code++) {
            float v = (float)ref_e2m1_value(code);
            float pts[3] = {v, nextafterf(v, -INFINITY), nextafterf(v, INFINITY)};
            for (int j = 0; j < 3; j++) e2m1_encode_one(k, c, s ? -pts[j] : pts[j], rule);
            if (code == 7) continue;
            float m = (float)((ref_e2m1_value(code) + ref_e2m1_value(code + 1)) / 2);
            float mp[3] = {m, nextafterf(m, -INFINITY), nextafterf(m, INFINITY)};
            for (int j = 0; j < 3; j++) e2m1_encode_one(k, c, s ? -mp[j] : mp[j], rule);
        }
    }
    chk_end(rep, k);

    snprintf(name, sizeof name, "e2m1.sweep.%s", rn);
    k = chk_begin(rep, name);
    td_rng r;
    td_rng_seed(&r, seed ^ (0xE2A1u + (uint64_t)rule));
    for (int i = 0; i < TD_CODEC_SWEEP / 4; i++) {
        float y = rand_f32(&r, 127 - 4, 127 + 3);
        if (isnan(y)) continue;
        e2m1_encode_one(k, c, y, rule);
    }
    chk_end(rep, k);
}

static void check_e2m1_nan(const td_codec *c, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, "e2m1.nan");
    static const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu};
    for (size_t i = 0; i < TD_ARRAY_LEN(nans); i++) {
        float y = f32_bits(nans[i]);
        for (int rule = 0; rule < TD_E2M1_SIGN_COUNT; rule++) {
            uint8_t got = c->e2m1_encode(y, (td_e2m1_sign)rule);
            chk_item(k, got == 0x7, false, "non-failing encode of NaN 0x%08X: got 0x%X, want 0x7",
                     (unsigned)nans[i], got);
            uint8_t code = 0xAA;
            td_err err;
            td_err_clear(&err);
            td_status st = c->f32_to_e2m1(y, (td_e2m1_sign)rule, &code, &err);
            chk_item(k, st == TD_ERR_ARG && code == 0xAA, false,
                     "checked encode of NaN 0x%08X: status %d, code 0x%X (want an argument error, "
                     "code untouched)", (unsigned)nans[i], (int)st, code);
        }
    }
    uint8_t code = 0xAA;
    td_status st = c->f32_to_e2m1(1.0f, TD_E2M1_SIGNBIT, &code, NULL);
    chk_item(k, st == TD_OK && code == 0x2, false, "checked encode of 1.0: status %d, code 0x%X",
             (int)st, code);
    chk_end(rep, k);
}

static void check_e4m3_to_half(const td_codec *c, bool bf16, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, bf16 ? "e4m3.to_bf16" : "e4m3.to_f16");
    for (unsigned code = 0; code < 256; code++) {
        double ref = ref_e4m3_value(code);
        float v = c->e4m3_to_f32((uint8_t)code);
        uint16_t want = bf16 ? exact_bits(ref, 7, 127) : exact_bits(ref, 10, 15);
        uint16_t got = bf16 ? c->f32_to_bf16(v) : c->f32_to_f16(v);
        bool want_nan = isnan(ref);
        bool got_nan = bf16 ? bf16_is_nan(got) : td_f16_is_nan(got);
        bool ok = same_bits_or_nan(got, want, got_nan, want_nan) &&
                  (!want_nan || (got & 0x8000) == (want & 0x8000));
        float back = bf16 ? c->bf16_to_f32(got) : c->f16_to_f32(got);
        bool back_ok = want_nan ? isnan(back) : bits_f32(back) == bits_f32(v);
        chk_item(k, ok && back_ok, got_nan != want_nan,
                 "code 0x%02X (%.9g): got 0x%04X back %.9g, want 0x%04X", code, ref, got,
                 (double)back, want);
    }
    chk_end(rep, k);
}

/* The seed's global set plus globals that hit every FP16 regime of the product. */
static const uint32_t prepared_globals[] = {
    0x00000000u, /* 0 */
    0x33800000u, /* 2^-24: FP16 underflow */
    0x3A800000u, /* 2^-10 */
    0x3D800000u, /* 2^-4 */
    0x3F800000u, /* 1 */
    0x40000000u, /* 2 */
    0xBF800000u, /* -1 */
    0x43800000u, /* 256: 448 * 256 overflows FP16 */
    0x80000000u, /* -0 */
    0x38800000u, /* 2^-14 */
    0x35800000u, /* 2^-20 */
    0x3A924925u, /* 3/2688, a ModelOpt g_dec */
    0x3AF29001u, /* 0x1.e52002p-10: a global whose hi/lo split is inexact */
    0x3B124925u, /* 1/448 */
    0x40800000u, /* 4 */
    0x431236DBu, /* 146.214..., 448 * g just below 65504 */
    0x00800000u, /* FLT_MIN */
    0x7F000000u, /* 2^127: float32 overflow of the product */
    0x7F800000u, /* inf */
    0x7FC00000u, /* NaN */
};

static void check_prepared(const td_codec *c, td_codec_report *rep)
{
    td_codec_check *k = chk_begin(rep, "prepared.all_codes");
    for (size_t gi = 0; gi < TD_ARRAY_LEN(prepared_globals); gi++) {
        float g = f32_bits(prepared_globals[gi]);
        for (unsigned code = 0; code < 256; code++) {
            double p = ref_e4m3_value(code) * (double)g;   /* exact: 4 x 24 significant bits */
            float p32 = (float)p;                          /* FP32 rounding of the product */
            uint16_t want = td_f16_round((double)p32, 0.0);
            uint16_t got = td_recon_prepared(c, (uint8_t)code, g);
            chk_item(k, td_f16_same(got, want), td_f16_is_nan(got) != td_f16_is_nan(want),
                     "code 0x%02X x global %.9g: got 0x%04X, want 0x%04X", code, (double)g, got,
                     want);
        }
    }
    chk_end(rep, k);
}

/* Reference per-column slot, written from the seed test's description. */
static int ref_slot(int stage, int64_t col, int64_t n)
{
    if (stage == 2) return 0;                  /* W2: one slot */
    if (stage == 1) return (int)((col / 32) % 2);
    return col >= n / 2 ? 1 : 0;
}

/* The seed's test_raw_scale_strict_expansion_all_e4m3_codes, with 16 experts instead of 512:
 * codes arange(256) tiled over [E, rows, cols], globals of the seed's set tiled over [E, slots],
 * every strict expansion bitwise equal to FP16(FP32(e4m3) * global[e, slot(col)]). */
static void check_strict_stage(const td_codec *c, int stage, td_codec_report *rep)
{
    static const char *const names[3] = {"strict.w13_non_interleaved", "strict.w13_interleaved",
                                         "strict.w2"};
    static const uint32_t seed_globals[8] = {0x00000000u, 0x33800000u, 0x3A800000u, 0x3D800000u,
                                             0x3F800000u, 0x40000000u, 0xBF800000u, 0x43800000u};
    td_codec_check *k = chk_begin(rep, names[stage]);
    const int64_t experts = 16;
    const int64_t rows = stage == 2 ? 10 : 160, cols = stage == 2 ? 2560 : 320;
    const int slots = stage == 2 ? 1 : 2;
    td_w13_layout layout = stage == 1 ? TD_W13_INTERLEAVED : TD_W13_NON_INTERLEAVED;
    for (int64_t e = 0; e < experts; e++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t col = 0; col < cols; col++) {
                int64_t flat = (e * rows + r) * cols + col;
                uint8_t code = (uint8_t)(flat & 0xFF);
                int want_slot = ref_slot(stage, col, cols);
                int got_slot = stage == 2 ? 0 : td_w13_slot(layout, col, cols);
                float g_want = f32_bits(seed_globals[(e * slots + want_slot) % 8]);
                float g_got = f32_bits(seed_globals[(e * slots + got_slot) % 8]);
                double p = ref_e4m3_value(code) * (double)g_want;
                uint16_t want = td_f16_round((double)(float)p, 0.0);
                uint16_t got = td_recon_strict(c, code, g_got);
                chk_item(k, td_f16_same(got, want), td_f16_is_nan(got) != td_f16_is_nan(want),
                         "expert %lld row %lld col %lld code 0x%02X: got 0x%04X, want 0x%04X",
                         (long long)e, (long long)r, (long long)col, code, got, want);
            }
    chk_end(rep, k);
}

static void eval_simple(const td_codec *c, uint8_t code, float g, td_recon_eval *ev)
{
    td_recon_global gl;
    td_recon_global_init(c, g, &gl);
    td_recon_eval_code(c, code, &gl, &gl, ev);
}

static void check_admission(const td_codec *c, td_codec_report *rep)
{
    /* The seed's test_raw_scale_admission_rejects_unsupported_fast_encodings. */
    static const struct { uint8_t code; td_scale_reason reason; } bad[] = {
        {0x00, TD_SCALE_ZERO_CODE}, {0x01, TD_SCALE_SUBNORMAL_CODE},
        {0x07, TD_SCALE_SUBNORMAL_CODE}, {0x80, TD_SCALE_NEGATIVE_CODE},
        {0x81, TD_SCALE_NEGATIVE_CODE}, {0xFF, TD_SCALE_NAN_CODE},
    };
    td_codec_check *k = chk_begin(rep, "admission.unsupported");
    td_recon_eval ev;
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        eval_simple(c, bad[i].code, 0x1p-10f, &ev);
        chk_item(k, !ev.admit && ev.reason == bad[i].reason, false,
                 "code 0x%02X at 2^-10: %s (%s), want reject (%s)", bad[i].code,
                 ev.admit ? "admitted" : "rejected", td_scale_reason_name(ev.reason),
                 td_scale_reason_name(bad[i].reason));
    }
    chk_end(rep, k);

    /* The seed's test_raw_scale_admission_checks_effective_hmma_scale: code 64 (2.0) with
     * global 2^-10 gives prepared 2^-9 and effective 32 (FP16 0x5000). */
    k = chk_begin(rep, "admission.effective");
    eval_simple(c, 64, 0x1p-10f, &ev);
    chk_item(k, ev.admit && ev.prepared == 0x1800 && ev.strict == 0x1800 &&
                    ev.effective == 0x5000 && ev.fast == 0x5000, false,
             "code 0x40 at 2^-10: admit %d prepared 0x%04X strict 0x%04X effective 0x%04X "
             "fast 0x%04X, want admitted 0x1800/0x1800/0x5000/0x5000",
             ev.admit, ev.prepared, ev.strict, ev.effective, ev.fast);
    chk_end(rep, k);

    /* One vector per remaining reason class. */
    static const struct { uint8_t code; uint32_t g; td_scale_reason reason; } cls[] = {
        {0x7E, 0x3C800000u, TD_SCALE_OVERFLOW},     /* 448 * 2^-6 * 2^14 > 65504 */
        {0x38, 0x40A00000u, TD_SCALE_OVERFLOW},     /* g = 5: hi = FP16(5 * 2^14) = inf */
        {0x08, 0x30800000u, TD_SCALE_UNDERFLOW},    /* 2^-6 * 2^-30: prepared is 0 */
        {0x38, 0x00000000u, TD_SCALE_BAD_GLOBAL},
        {0x38, 0xBF800000u, TD_SCALE_BAD_GLOBAL},
        {0x38, 0x7FC00000u, TD_SCALE_BAD_GLOBAL},
        {0x38, 0x7F800000u, TD_SCALE_BAD_GLOBAL},
        {0x18, 0x3AF29001u, TD_SCALE_HILO_INEXACT}, /* hi + lo != g * 2^14 at this code */
        {0x49, 0x3A924925u, TD_SCALE_OK},
    };
    k = chk_begin(rep, "admission.classes");
    for (size_t i = 0; i < TD_ARRAY_LEN(cls); i++) {
        float g = f32_bits(cls[i].g);
        eval_simple(c, cls[i].code, g, &ev);
        chk_item(k, ev.reason == cls[i].reason && ev.admit == (cls[i].reason == TD_SCALE_OK), false,
                 "code 0x%02X at global %a: %s, want %s", cls[i].code, (double)g,
                 td_scale_reason_name(ev.reason), td_scale_reason_name(cls[i].reason));
    }
    chk_end(rep, k);

    /* Power-of-two globals have lo == 0, so the fast path is one exact product: every positive
     * normal code must be admitted for every g = 2^k whose products stay in range. */
    k = chk_begin(rep, "fast.pow2_globals");
    for (int e = -15; e <= -7; e++) {
        float g = ldexpf(1.0f, e);
        for (unsigned code = 8; code < 127; code++) {
            eval_simple(c, (uint8_t)code, g, &ev);
            chk_item(k, ev.admit, false, "code 0x%02X at 2^%d: %s (fast 0x%04X, effective 0x%04X)",
                     code, e, td_scale_reason_name(ev.reason), ev.fast, ev.effective);
        }
    }
    chk_end(rep, k);
}

/* Pinned FP16 fused multiply-add vectors: exact results from integer arithmetic
 * (tests/test_e4m3_audit.c recomputes every one with a 128-bit integer reference). The
 * first two are cases where rounding the product to FP16 first gives another answer. */
static void check_fma(td_codec_report *rep)
{
    static const struct { uint16_t a, b, c, want; } v[] = {
        {0x3EE7, 0x3116, 0xA8A8, 0x339D}, /* two roundings give 0x339C */
        {0x3565, 0x3BC3, 0x92C7, 0x3538}, /* two roundings give 0x3539 */
        {0x3C01, 0x3C01, 0x0000, 0x3C02}, /* (1+2^-10)^2 = 1 + 2^-9 + 2^-20 -> 1 + 2^-9 */
        {0x3C01, 0x3C01, 0x9400, 0x3C01}, /* ... - 2^-10 = 1 + 2^-10 + 2^-20 -> 1 + 2^-10 */
        {0x7BFF, 0x3C00, 0x4C00, 0x7C00}, /* 65504 + 16 = 65520: the tie rounds to even, inf */
        {0x7BFF, 0x3C00, 0x4BFF, 0x7BFF}, /* 65504 + 15.99 stays finite */
        {0x7C00, 0x0000, 0x3C00, 0x7E00}, /* inf * 0 = NaN */
        {0x0001, 0x0001, 0x0000, 0x0000}, /* 2^-48 -> +0 */
        {0x0001, 0x3800, 0x0001, 0x0002}, /* 2^-25 + 2^-24 = 1.5 * 2^-24: tie -> even 2^-23 */
        {0x4F95, 0x2C00, 0x0000, 0x3F95}, /* 30.328125 * 2^-4, exact */
    };
    td_codec_check *k = chk_begin(rep, "fp16.fma");
    for (size_t i = 0; i < TD_ARRAY_LEN(v); i++) {
        uint16_t got = td_f16_fma(v[i].a, v[i].b, v[i].c);
        chk_item(k, td_f16_same(got, v[i].want), td_f16_is_nan(got) != td_f16_is_nan(v[i].want),
                 "fma(0x%04X, 0x%04X, 0x%04X): got 0x%04X, want 0x%04X", v[i].a, v[i].b, v[i].c,
                 got, v[i].want);
    }
    chk_end(rep, k);
}

/* ---- entry ---------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void td_codec_audit(const td_codec *c, uint64_t seed, td_codec_report *rep)
{
    TD_ASSERT(c && rep);
    double t0 = now_s();
    memset(rep, 0, sizeof *rep);
    snprintf(rep->codec, sizeof rep->codec, "%s", c->name ? c->name : "?");
    rep->seed = seed;
    e4m3_table t;
    e4m3_table_init(&t);

    check_e4m3_decode(c, rep);
    check_e4m3_constants(c, rep);
    for (int m = 0; m < TD_E4M3_MODE_COUNT; m++) check_e4m3_encode_points(c, &t, (td_e4m3_mode)m, rep);
    for (int m = 0; m < TD_E4M3_MODE_COUNT; m++) check_e4m3_sweep(c, &t, (td_e4m3_mode)m, seed, rep);
    check_e4m3_roundtrip(c, &t, rep);
    check_e2m1_decode(c, rep);
    check_e2m1_encode(c, TD_E2M1_SIGNBIT, seed, rep);
    check_e2m1_encode(c, TD_E2M1_NEGATIVE, seed, rep);
    check_e2m1_nan(c, rep);
    check_e4m3_to_half(c, false, rep);
    check_e4m3_to_half(c, true, rep);
    check_prepared(c, rep);
    for (int s = 0; s < 3; s++) check_strict_stage(c, s, rep);
    check_admission(c, rep);
    check_fma(rep);
    rep->seconds = now_s() - t0;
}

const td_codec_check *td_codec_report_find(const td_codec_report *rep, const char *name)
{
    for (size_t i = 0; i < rep->n; i++)
        if (!strcmp(rep->checks[i].name, name)) return &rep->checks[i];
    return NULL;
}
