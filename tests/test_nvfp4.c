/* test_nvfp4.c — NVFP4 block quantization and dequantization (core/nvfp4).
 *
 * What is asserted:
 * - the worked test vector of NVFP4_SPEC.md §8, byte for byte, for both conventions;
 * - bit-exactness of the quantizer against a replay of the §3.3 operation orders written in
 *   this file with its own E4M3 and E2M1 rounding (nearest-value search over value tables);
 * - the quantize -> dequantize error bound of docs/numeric-formats.md on seeded random
 *   tensors (normal, heavy-tailed with outliers, tiny blocks with subnormal or underflowed
 *   scales, all-zero blocks) at several magnitudes, for both conventions;
 * - the ModelOpt / compressed-tensors relation on the same tensor;
 * - the dequantization operation orders of §3.4 (two roundings, CT divides by g_enc);
 * - error handling (k % 16, non-finite input, bad amax, bad global) with messages that name
 *   the culprit, and that nothing is written on error;
 * - that every output element is written and nothing past the end (two poison patterns and
 *   guard bytes).
 */
#include "test_common.h"
#include "bits_fixture.h"
#include "formats.h"
#include "nvfp4.h"

#include <float.h>
#include <math.h>

/* ---- helpers ---------------------------------------------------------------------------- */

/* uniform in (0, 1) */
static double rng_unit(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) * 0x1p-53;
}

static double rng_normal(uint64_t *s)
{
    double u1 = rng_unit(s), u2 = rng_unit(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Test-local E4M3 value (formula) and encoder (nearest search, ties to the even code). Only
 * finite non-negative inputs <= 448 reach the encoder here (both quantizers clamp first). */
static double e4m3_value(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    double v = (e == 15 && m == 7) ? nan("") : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

static void e4m3_table(double tbl[127])
{
    for (int c = 0; c < 127; c++) tbl[c] = e4m3_value((uint8_t)c);
}

static uint8_t e4m3_nearest(const double tbl[127], float x)
{
    double a = (double)x;
    TD_ASSERT(a >= 0.0 && a <= 448.0);
    int best = 0;
    for (int c = 1; c < 127; c++) {
        double dc = fabs(tbl[c] - a), db = fabs(tbl[best] - a);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)best;
}

static const double e2m1_mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

static uint8_t e2m1_nearest(float y, bool negative)
{
    double a = fabs((double)y);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double dc = fabs(e2m1_mag[c] - a), db = fabs(e2m1_mag[best] - a);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best | (negative ? 8 : 0));
}

static double e2m1_value(uint8_t c)
{
    return (c & 8) ? -e2m1_mag[c & 7] : e2m1_mag[c & 7];
}

/* Replay of NVFP4_SPEC.md §3.3 in float32, written independently of core/nvfp4.c. */

/* Block scale byte from the block amax `ab` and the global `g`. */
static uint8_t replay_scale(const double tbl[127], float ab, float g, td_nvfp4_conv conv)
{
    uint8_t S;
    if (conv == TD_NVFP4_MODELOPT) {
        float six_g = 6.0f * g;
        float s = ab / six_g;
        if (s == 0.0f) s = 1.0f;
        s = fminf(fmaxf(s, 0x1p-9f), 448.0f);
        S = e4m3_nearest(tbl, s);
    } else {
        float ab6 = ab / 6.0f;
        float s = g * ab6;
        s = fminf(fmaxf(s, -448.0f), 448.0f);
        S = e4m3_nearest(tbl, s);
        if (e4m3_value(S) == 0.0) S = 0x20;
    }
    return S;
}

/* Per-block divisor: ModelOpt fl(f32(S) * g_dec), CT eff = fl(f32(S) / g_enc). */
static float replay_divisor(uint8_t S, float g, td_nvfp4_conv conv)
{
    return conv == TD_NVFP4_MODELOPT ? (float)e4m3_value(S) * g : (float)e4m3_value(S) / g;
}

static uint8_t replay_code(float x, float d, td_nvfp4_conv conv)
{
    float y = x / d;
    if (conv == TD_NVFP4_MODELOPT) return e2m1_nearest(y, y < 0.0f);
    y = fminf(fmaxf(y, -6.0f), 6.0f);
    return e2m1_nearest(y, signbit(y) != 0);
}

static void replay_quantize(const float *w, int64_t rows, int64_t k, td_nvfp4_conv conv,
                            float amax, uint8_t *packed, uint8_t *scales, float *global)
{
    if (isnan(amax)) {
        amax = 0.0f;
        for (int64_t i = 0; i < rows * k; i++) amax = fmaxf(amax, fabsf(w[i]));
    }
    float g = amax == 0.0f ? 1.0f : conv == TD_NVFP4_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
    *global = g;
    double tbl[127];
    e4m3_table(tbl);
    int64_t nb = k / 16;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *x = w + r * k + b * 16;
            float ab = 0.0f;
            for (int i = 0; i < 16; i++) ab = fmaxf(ab, fabsf(x[i]));
            uint8_t S = replay_scale(tbl, ab, g, conv), codes[16];
            float d = replay_divisor(S, g, conv);
            for (int i = 0; i < 16; i++) codes[i] = replay_code(x[i], d, conv);
            scales[r * nb + b] = S;
            for (int j = 0; j < 8; j++)
                packed[r * (k / 2) + b * 8 + j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
        }
}

/* Step a positive float by n ULPs (n may be negative). */
static float ulp_step(float x, int n)
{
    return float_of((uint32_t)((int64_t)bits_of(x) + n));
}

/* ---- test data ---------------------------------------------------------------------------- */

enum dist { DIST_NORMAL, DIST_HEAVY, DIST_TINY, DIST_ZERO_BLOCKS, DIST_COUNT };
static const char *const dist_names[DIST_COUNT] = {
    "normal", "heavy-tailed", "tiny-blocks", "zero-blocks",
};
static const float magnitudes[] = {1e-30f, 1e-3f, 1.0f, 1e3f, 1e30f};
static const td_nvfp4_conv both_convs[] = {TD_NVFP4_MODELOPT, TD_NVFP4_CT};

/* Fill w [rows, k] with distribution `d` times `mag`. */
static void fill(float *w, int64_t rows, int64_t k, enum dist d, float mag, uint64_t seed)
{
    uint64_t s = seed;
    int64_t n = rows * k;
    for (int64_t i = 0; i < n; i++) {
        double v = rng_normal(&s);
        switch (d) {
        case DIST_NORMAL:
            break;
        case DIST_HEAVY: /* normal / sqrt(uniform): heavy tails; plus 0.5% outliers x50 */
            v /= sqrt(rng_unit(&s));
            if (rng_next(&s) % 200 == 0) v *= 50.0;
            break;
        case DIST_TINY: { /* block magnitude 10^-7 .. 10^-2 relative to the outlier below */
            int64_t blk = i / 16;
            double e = -7.0 + (double)(blk % 11) * 0.5;
            v *= pow(10.0, e);
            break;
        }
        case DIST_ZERO_BLOCKS: { /* every 3rd block all zero (some -0.0), every 5th has one non-zero */
            int64_t blk = i / 16;
            if (blk % 3 == 0) v = (rng_next(&s) & 1) ? 0.0 : -0.0;
            else if (blk % 5 == 0 && i % 16 != 7) v = 0.0;
            break;
        }
        default:
            TD_ASSERT(0);
        }
        w[i] = (float)(v * (double)mag);
    }
    if (d == DIST_TINY) w[n / 2] = mag; /* the tensor amax: tiny blocks get subnormal scales */
}

/* Half the E2M1 spacing around t = |w|/d (the rounding error bound in units of d). */
static double half_spacing(double t)
{
    return t < 2.0 ? 0.25 : t < 4.0 ? 0.5 : 1.0;
}

struct bound_stats {
    double worst_ratio;   /* max over elements of err / (half_spacing * d), t <= 6 */
    int64_t saturated;    /* elements with t > 6 */
    int64_t subnormal_blocks, zero_blocks, normal_blocks, underflow_blocks;
};

/* The documented quantize -> dequantize bound (docs/numeric-formats.md, "Error bound"):
 * with d the block's decode factor and t = |w|/d,
 *   t <= 6: |w - w'| <= half_spacing(t) * d      (E2M1 rounding; half spacing 0.25/0.5/1)
 *   t > 6:  w' = ±fl(6d) and |w - w'| <= (t - 6) d, with t <= 6*17/16 for normal scales and
 *           t <= 6*1.5 for subnormal ones (E4M3 rounding of the block scale)
 *   normal-scale blocks: max |w - w'| <= d <= (3/17) * amax_blk (S rounds s_raw up by at most 18/17).
 * Each with a relative slack of 2^-18 for the float32 roundings of y and of e2m1*d. */
static void check_bound(const float *w, const float *out, const uint8_t *scales, float global,
                        td_nvfp4_conv conv, int64_t rows, int64_t k, const char *what,
                        struct bound_stats *st)
{
    const double slack = 1.0 + 0x1p-18;
    int64_t nb = k / 16;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t S = scales[r * nb + b];
            if (td_e4m3_is_nan(S) || (S & 0x80))
                fail_msg("%s: block [%lld,%lld] scale byte 0x%02X is NaN or negative", what,
                         (long long)r, (long long)b, S);
            float sf = (float)e4m3_value(S);
            float d = conv == TD_NVFP4_MODELOPT ? sf * global : sf / global;
            assert_true(d > 0.0f && isfinite(d));
            bool normal = S >= 0x08;
            double ab0 = 0.0;
            for (int i = 0; i < 16; i++) ab0 = fmax(ab0, fabs((double)w[r * k + b * 16 + i]));
            /* CT replaces an underflowed scale (s_raw <= 2^-10) by 0.125: every code is 0 */
            bool underflow = conv == TD_NVFP4_CT && ab0 > 0.0 &&
                             ab0 * (double)global / 6.0 <= 0x1p-10 * (1.0 + 0x1p-18);
            double t_max = (normal ? 6.0 * 17.0 / 16.0 : 6.0 * 1.5) * slack;
            double ab = 0.0, worst = 0.0;
            for (int i = 0; i < 16; i++) {
                int64_t at = r * k + b * 16 + i;
                double x = (double)w[at], o = (double)out[at];
                ab = fmax(ab, fabs(x));
                double t = fabs(x) / (double)d, err = fabs(x - o);
                worst = fmax(worst, err);
                if (x * o < 0.0)
                    fail_msg("%s: w[%lld] = %a dequantized to %a (sign flip)", what, (long long)at, x,
                             o);
                if (t <= 6.0) {
                    double hs = half_spacing(t);
                    if (err > hs * (double)d * slack + 0x1p-149)
                        fail_msg("%s: w[%lld] = %a -> %a, error %a > %g * d (d = %a)", what,
                                 (long long)at, x, o, err, hs, (double)d);
                    st->worst_ratio = fmax(st->worst_ratio, err / (hs * (double)d));
                } else {
                    st->saturated++;
                    if (fabsf(out[at]) != 6.0f * d)
                        fail_msg("%s: w[%lld] = %a (t = %g) did not saturate to 6d: %a", what,
                                 (long long)at, x, t, o);
                    if (t > t_max)
                        fail_msg("%s: w[%lld] t = %g exceeds %g for scale 0x%02X", what,
                                 (long long)at, t, t_max, S);
                    if (err > (t - 6.0) * (double)d * slack + 6.0 * (double)d * 0x1p-23)
                        fail_msg("%s: w[%lld] saturation error %a too large", what, (long long)at, err);
                }
            }
            if (underflow) {
                st->underflow_blocks++;
                if (S != 0x20) fail_msg("%s: underflowed block [%lld,%lld] has scale 0x%02X", what,
                                        (long long)r, (long long)b, S);
                for (int i = 0; i < 16; i++)
                    if (out[r * k + b * 16 + i] != 0.0f)
                        fail_msg("%s: underflowed block [%lld,%lld] has a non-zero output", what,
                                 (long long)r, (long long)b);
            } else if (ab == 0.0) {
                st->zero_blocks++;
                if (worst != 0.0) fail_msg("%s: zero block [%lld,%lld] not exact", what, (long long)r,
                                           (long long)b);
            } else if (normal) {
                st->normal_blocks++;
                if (worst > 3.0 / 17.0 * ab * slack)
                    fail_msg("%s: block [%lld,%lld] error %a > 3/17 * amax_blk %a", what,
                             (long long)r, (long long)b, worst, ab);
            } else {
                st->subnormal_blocks++;
            }
        }
}

/* ---- worked test vector (NVFP4_SPEC.md §8) ---------------------------------------------- */

static const float spec_block[16] = {
    0.0f, 0.01f, -0.02f, 0.05f, 0.1f, -0.125f, 0.2f, 0.21f,
    0.3f, -0.33f, 0.4f, 0.45f, 0.5f, -0.55f, 0.6f, 0.7f,
};
static const uint8_t spec_packed[8] = {0x00, 0x18, 0xA2, 0x43, 0xD5, 0x65, 0xE6, 0x77};

static void nvfp4_spec_vector_modelopt_bytes_exact(void **state)
{
    (void)state;
    uint8_t packed[8], scale;
    float global = 0.0f;
    td_err err;
    assert_int_equal(td_nvfp4_quantize(spec_block, 1, 16, TD_NVFP4_MODELOPT, 3.0f, packed, &scale,
                                       &global, &err), TD_OK);
    assert_int_equal(bits_of(global), 0x3A924925);            /* fl32(3/2688) */
    assert_int_equal(scale, 0x6D);                            /* 104.0 */
    assert_memory_equal(packed, spec_packed, 8);
    /* -0.02 -> code 0x8 (y < 0 rule), element 0 (+0) -> 0x0 */
    assert_int_equal(packed[1] & 0xF, 0x8);
    /* dequantize: e2m1 * fl(104 * g_dec), fl(104 * g_dec) = 0.1160714328289032 */
    float out[16];
    assert_int_equal(td_nvfp4_dequantize(packed, &scale, global, TD_NVFP4_MODELOPT, 1, 16, out, &err),
                     TD_OK);
    float d = td_nvfp4_block_factor(scale, global, TD_NVFP4_MODELOPT);
    assert_int_equal(bits_of(d), 0x3DEDB6DC);
    assert_true(out[15] == 6.0f * d && out[13] == -4.0f * d && out[9] == -3.0f * d);
    assert_true(out[2] == 0.0f && signbit(out[2]));
}

static void nvfp4_spec_vector_ct_bytes_exact(void **state)
{
    (void)state;
    /* compressed-tensors arithmetic on the same block: g_enc = 2688/3 = 896 exactly,
     * s_raw = 896 * fl(0.7/6) = 104.53333 -> 0x6D, eff = fl(104/896) = 0x3DEDB6DB: one ULP
     * below ModelOpt's divisor, and the same codes. */
    uint8_t packed[8], scale;
    float global = 0.0f;
    td_err err;
    assert_int_equal(td_nvfp4_quantize(spec_block, 1, 16, TD_NVFP4_CT, 3.0f, packed, &scale,
                                       &global, &err), TD_OK);
    assert_true(global == 896.0f);
    assert_int_equal(scale, 0x6D);
    assert_memory_equal(packed, spec_packed, 8);
    assert_int_equal(bits_of(td_nvfp4_block_factor(scale, global, TD_NVFP4_CT)), 0x3DEDB6DB);
    /* with amax computed from the block (0.7) the global changes and so do the bytes */
    assert_int_equal(td_nvfp4_quantize(spec_block, 1, 16, TD_NVFP4_CT, NAN, packed, &scale,
                                       &global, &err), TD_OK);
    assert_true(global == 2688.0f / 0.7f);
    assert_int_equal(scale, 0x7E); /* block amax == tensor amax -> 448 */
}

/* ---- bit-exact replay and error bound on random tensors ----------------------------------- */

static void nvfp4_random_tensors_match_spec_replay(void **state)
{
    (void)state;
    const int64_t rows = 24, k = 256;
    float *w = malloc(sizeof(float) * (size_t)(rows * k));
    uint8_t *p1 = malloc((size_t)(rows * k / 2)), *p2 = malloc((size_t)(rows * k / 2));
    uint8_t *s1 = malloc((size_t)(rows * k / 16)), *s2 = malloc((size_t)(rows * k / 16));
    assert_true(w && p1 && p2 && s1 && s2);
    for (int d = 0; d < DIST_COUNT; d++)
        for (size_t m = 0; m < TD_ARRAY_LEN(magnitudes); m++)
            for (size_t c = 0; c < 2; c++)
                for (int shared = 0; shared < 2; shared++) {
                    fill(w, rows, k, (enum dist)d, magnitudes[m], 1000 + (uint64_t)(d * 10 + (int)m));
                    /* shared: a sibling's larger amax (gate/up), else computed from w */
                    float amax = shared ? 1.75f * magnitudes[m] * 8.0f : NAN;
                    float g1 = -1.0f, g2 = -2.0f;
                    td_err err;
                    assert_int_equal(td_nvfp4_quantize(w, rows, k, both_convs[c], amax, p1, s1, &g1,
                                                       &err), TD_OK);
                    replay_quantize(w, rows, k, both_convs[c], amax, p2, s2, &g2);
                    if (bits_of(g1) != bits_of(g2) || memcmp(s1, s2, (size_t)(rows * k / 16)) ||
                        memcmp(p1, p2, (size_t)(rows * k / 2)))
                        fail_msg("%s %s mag %g shared %d: quantizer differs from the §3.3 replay",
                                 td_nvfp4_conv_name(both_convs[c]), dist_names[d],
                                 (double)magnitudes[m], shared);
                }
    free(w); free(p1); free(p2); free(s1); free(s2);
}

static void nvfp4_adversarial_blocks_match_spec_replay(void **state)
{
    (void)state;
    /* Random data rarely lands where the operation order matters. Here every block is built
     * so that its raw scale lies within a few ULPs of an E4M3 midpoint (every code 1..125)
     * and its elements lie within one ULP of an E2M1 threshold times the block divisor.
     * The data must distinguish the §3.3 order from the obvious rewrites (checked below);
     * the quantizer must then match the replay byte for byte. */
    const float amax = 3.0f;
    const int64_t k = 128, per_row = k / 16;
    const int64_t nblocks = 1 + 125 * 7;
    const int64_t rows = (nblocks + per_row - 1) / per_row;
    size_t n = (size_t)(rows * k);
    float *w = calloc(n, sizeof(float));
    uint8_t *p1 = malloc(n / 2), *p2 = malloc(n / 2), *s1 = malloc(n / 16), *s2 = malloc(n / 16);
    assert_true(w && p1 && p2 && s1 && s2);
    static const float th[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    double tbl[127];
    e4m3_table(tbl);
    for (size_t c = 0; c < 2; c++) {
        td_nvfp4_conv conv = both_convs[c];
        float g = conv == TD_NVFP4_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
        memset(w, 0, n * sizeof(float));
        w[0] = amax; /* block 0 carries the tensor amax */
        uint64_t s = 99 + c;
        int64_t scale_order_matters = 0, code_order_matters = 0;
        for (int64_t bi = 1; bi < nblocks; bi++) {
            int code = 1 + (int)((bi - 1) / 7), delta = (int)((bi - 1) % 7) - 3;
            double mid = (tbl[code] + tbl[code + 1]) / 2;
            double target = conv == TD_NVFP4_MODELOPT ? mid * 6.0 * (double)g : mid * 6.0 / (double)g;
            float ab = ulp_step((float)target, delta);
            float *x = w + bi * 16;
            x[0] = (rng_next(&s) & 1) ? ab : -ab;
            /* the obvious rewrites of the scale formula */
            float alt = conv == TD_NVFP4_MODELOPT ? (ab / 6.0f) / g : (g * ab) / 6.0f;
            if (alt <= 448.0f && e4m3_nearest(tbl, alt) != replay_scale(tbl, ab, g, conv))
                scale_order_matters++;
            uint8_t S = replay_scale(tbl, ab, g, conv);
            float d = replay_divisor(S, g, conv);
            for (int i = 1; i < 16; i++) {
                float t = th[rng_next(&s) % 7];
                float v = ulp_step(t * d, (int)(rng_next(&s) % 3) - 1);
                if (fabsf(v) >= ab) v = 0.0f;
                x[i] = (rng_next(&s) & 1) ? v : -v;
                /* rewrites of the element formula: divide twice, or multiply by g first */
                float y_alt = conv == TD_NVFP4_MODELOPT ? (x[i] / (float)e4m3_value(S)) / g
                                                        : (x[i] * g) / (float)e4m3_value(S);
                if ((e2m1_nearest(y_alt, false) & 7) != (replay_code(x[i], d, conv) & 7))
                    code_order_matters++;
            }
        }
        if (scale_order_matters == 0 || code_order_matters == 0)
            fail_msg("%s: adversarial data does not distinguish operation orders (%lld, %lld)",
                     td_nvfp4_conv_name(conv), (long long)scale_order_matters,
                     (long long)code_order_matters);
        float g1 = 0.0f, g2 = 0.0f;
        td_err err;
        assert_int_equal(td_nvfp4_quantize(w, rows, k, conv, NAN, p1, s1, &g1, &err), TD_OK);
        replay_quantize(w, rows, k, conv, NAN, p2, s2, &g2);
        assert_int_equal(bits_of(g1), bits_of(g2));
        for (size_t i = 0; i < n / 16; i++)
            if (s1[i] != s2[i]) fail_msg("%s: block %zu scale 0x%02X, replay 0x%02X",
                                         td_nvfp4_conv_name(conv), i, s1[i], s2[i]);
        for (size_t i = 0; i < n / 2; i++)
            if (p1[i] != p2[i]) fail_msg("%s: byte %zu = 0x%02X, replay 0x%02X",
                                         td_nvfp4_conv_name(conv), i, p1[i], p2[i]);
    }
    free(w); free(p1); free(p2); free(s1); free(s2);
}

static void run_bound_case(td_nvfp4_conv conv)
{
    const int64_t rows = 32, k = 512;
    size_t n = (size_t)(rows * k);
    float *w = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
    uint8_t *packed = malloc(n / 2), *scales = malloc(n / 16);
    assert_true(w && out && packed && scales);
    struct bound_stats total = {0};
    for (int d = 0; d < DIST_COUNT; d++)
        for (size_t m = 0; m < TD_ARRAY_LEN(magnitudes); m++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s x%g", td_nvfp4_conv_name(conv), dist_names[d],
                     (double)magnitudes[m]);
            fill(w, rows, k, (enum dist)d, magnitudes[m], 77 + (uint64_t)(d * 10 + (int)m));
            float global;
            td_err err;
            assert_int_equal(td_nvfp4_quantize(w, rows, k, conv, NAN, packed, scales, &global, &err),
                             TD_OK);
            assert_int_equal(td_nvfp4_dequantize(packed, scales, global, conv, rows, k, out, &err),
                             TD_OK);
            struct bound_stats st = {0};
            check_bound(w, out, scales, global, conv, rows, k, what, &st);
            /* the bound is tight: some element of a normal tensor sits close to a midpoint */
            if (d == DIST_NORMAL && st.worst_ratio < 0.9)
                fail_msg("%s: worst error only %.3f of the bound", what, st.worst_ratio);
            total.saturated += st.saturated;
            total.subnormal_blocks += st.subnormal_blocks;
            total.zero_blocks += st.zero_blocks;
            total.underflow_blocks += st.underflow_blocks;
            total.normal_blocks += st.normal_blocks;
        }
    /* the data exercised every regime */
    assert_true(total.saturated > 0);
    assert_true(total.subnormal_blocks > 0);
    assert_true(total.zero_blocks > 0);
    assert_true(total.normal_blocks > 0);
    if (conv == TD_NVFP4_CT) assert_true(total.underflow_blocks > 0);
    free(w); free(out); free(packed); free(scales);
}

static void nvfp4_roundtrip_modelopt_error_within_bound(void **state)
{
    (void)state;
    run_bound_case(TD_NVFP4_MODELOPT);
}

static void nvfp4_roundtrip_ct_error_within_bound(void **state)
{
    (void)state;
    run_bound_case(TD_NVFP4_CT);
}

/* E2M1 decision thresholds on |y|. */
static bool near_threshold(double y)
{
    static const double th[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
    for (size_t i = 0; i < TD_ARRAY_LEN(th); i++)
        if (fabs(fabs(y) - th[i]) <= th[i] * 0x1p-19) return true;
    return false;
}

static void nvfp4_modelopt_and_ct_dequantize_close(void **state)
{
    (void)state;
    /* Relation asserted (docs/numeric-formats.md): both conventions compute the same ideal
     * scale 448*amax_blk/amax with different float32 roundings, so
     *  (a) scale bytes are equal or adjacent codes, except for blocks whose ideal scale
     *      underflows (<= 2^-10: ModelOpt clamps to 0x01, CT substitutes 0x20);
     *  (b) in blocks with equal bytes, codes differ only where y is within 2^-19 (relative)
     *      of an E2M1 threshold, and equal codes dequantize within 2^-21 relative;
     *  (c) everywhere, |w'_MO - w'_CT| <= bound_MO + bound_CT (both within the error bound);
     *  (d) at least 90% of the non-zero blocks get identical scale bytes. */
    const int64_t rows = 32, k = 512;
    size_t n = (size_t)(rows * k);
    float *w = malloc(sizeof(float) * n), *o_mo = malloc(sizeof(float) * n),
          *o_ct = malloc(sizeof(float) * n);
    uint8_t *p_mo = malloc(n / 2), *p_ct = malloc(n / 2), *s_mo = malloc(n / 16),
            *s_ct = malloc(n / 16);
    assert_true(w && o_mo && o_ct && p_mo && p_ct && s_mo && s_ct);
    int64_t blocks = 0, equal_blocks = 0, code_diffs = 0;
    for (int d = 0; d < DIST_COUNT; d++)
        for (size_t m = 0; m < TD_ARRAY_LEN(magnitudes); m++) {
            fill(w, rows, k, (enum dist)d, magnitudes[m], 4242 + (uint64_t)(d * 10 + (int)m));
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(w[i]));
            float g_dec, g_enc;
            td_err err;
            assert_int_equal(td_nvfp4_quantize(w, rows, k, TD_NVFP4_MODELOPT, NAN, p_mo, s_mo, &g_dec,
                                               &err), TD_OK);
            assert_int_equal(td_nvfp4_quantize(w, rows, k, TD_NVFP4_CT, NAN, p_ct, s_ct, &g_enc, &err),
                             TD_OK);
            assert_int_equal(td_nvfp4_dequantize(p_mo, s_mo, g_dec, TD_NVFP4_MODELOPT, rows, k, o_mo,
                                                 &err), TD_OK);
            assert_int_equal(td_nvfp4_dequantize(p_ct, s_ct, g_enc, TD_NVFP4_CT, rows, k, o_ct, &err),
                             TD_OK);
            /* the globals are reciprocal up to float32 rounding */
            assert_true(fabs((double)g_dec * (double)g_enc - 1.0) <= 0x1p-22);
            for (int64_t bi = 0; bi < (int64_t)(n / 16); bi++) {
                double ab = 0.0;
                for (int i = 0; i < 16; i++) ab = fmax(ab, fabs((double)w[bi * 16 + i]));
                if (ab == 0.0) continue;
                double ideal = 448.0 * ab / (double)amax;
                uint8_t a = s_mo[bi], b = s_ct[bi];
                if (ideal <= 0x1p-10 * (1.0 + 0x1p-18)) continue; /* underflow: policies differ */
                blocks++;
                if (abs((int)a - (int)b) > 1)
                    fail_msg("block %lld: scale bytes 0x%02X (MO) vs 0x%02X (CT), ideal %g",
                             (long long)bi, a, b, ideal);
                if (a != b) continue;
                equal_blocks++;
                float dmo = td_nvfp4_block_factor(a, g_dec, TD_NVFP4_MODELOPT);
                for (int i = 0; i < 16; i++) {
                    int64_t at = bi * 16 + i;
                    uint8_t cm = (uint8_t)((p_mo[at / 2] >> (4 * (at & 1))) & 0xF);
                    uint8_t cc = (uint8_t)((p_ct[at / 2] >> (4 * (at & 1))) & 0xF);
                    if ((cm & 7) != (cc & 7)) {
                        code_diffs++;
                        if (!near_threshold((double)w[at] / (double)dmo))
                            fail_msg("element %lld: codes 0x%X / 0x%X differ away from a threshold "
                                     "(y = %a)", (long long)at, cm, cc, (double)w[at] / (double)dmo);
                    } else if (fabs((double)o_mo[at] - (double)o_ct[at]) >
                               fabs((double)o_mo[at]) * 0x1p-21) {
                        fail_msg("element %lld: same code, values %a vs %a", (long long)at,
                                 (double)o_mo[at], (double)o_ct[at]);
                    }
                }
            }
            /* (c): both sides satisfy the bound, hence their difference is bounded too */
            struct bound_stats st = {0};
            check_bound(w, o_mo, s_mo, g_dec, TD_NVFP4_MODELOPT, rows, k, "close/MO", &st);
            check_bound(w, o_ct, s_ct, g_enc, TD_NVFP4_CT, rows, k, "close/CT", &st);
        }
    assert_true(blocks > 0);
    if ((double)equal_blocks < 0.9 * (double)blocks)
        fail_msg("only %lld of %lld blocks have equal scale bytes", (long long)equal_blocks,
                 (long long)blocks);
    (void)code_diffs;
    free(w); free(o_mo); free(o_ct); free(p_mo); free(p_ct); free(s_mo); free(s_ct);
}

/* ---- policies: zero tensor, amax, shared amax ------------------------------------------- */

static void nvfp4_zero_tensor_uses_unit_global(void **state)
{
    (void)state;
    float w[2 * 32] = {0};
    w[3] = -0.0f;
    w[40] = -0.0f;
    uint8_t packed[32], scales[4];
    float out[64];
    for (size_t c = 0; c < 2; c++) {
        float global = -5.0f;
        td_err err;
        memset(packed, 0xA5, sizeof packed);
        memset(scales, 0xA5, sizeof scales);
        assert_int_equal(td_nvfp4_quantize(w, 2, 32, both_convs[c], NAN, packed, scales, &global,
                                           &err), TD_OK);
        assert_true(global == 1.0f);
        uint8_t zero_scale = both_convs[c] == TD_NVFP4_MODELOPT ? 0x38 : 0x20;
        for (int i = 0; i < 4; i++) assert_int_equal(scales[i], zero_scale);
        for (int i = 0; i < 32; i++) {
            /* -0.0 -> 0x8 under CT's signbit rule, 0x0 under ModelOpt's y < 0 rule */
            uint8_t want_lo = 0, want_hi = 0;
            if (both_convs[c] == TD_NVFP4_CT) {
                if (2 * i == 40) want_lo = 8;
                if (2 * i + 1 == 3) want_hi = 8;
            }
            assert_int_equal(packed[i], want_lo | want_hi << 4);
        }
        assert_int_equal(td_nvfp4_dequantize(packed, scales, global, both_convs[c], 2, 32, out, &err),
                         TD_OK);
        for (int i = 0; i < 64; i++) assert_true(out[i] == 0.0f);
        /* an explicit amax of 0 behaves the same */
        uint8_t p2[32], s2[4];
        float g2;
        assert_int_equal(td_nvfp4_quantize(w, 2, 32, both_convs[c], 0.0f, p2, s2, &g2, &err), TD_OK);
        assert_memory_equal(p2, packed, 32);
        assert_memory_equal(s2, scales, 4);
        assert_true(g2 == 1.0f);
    }
    /* empty tensors succeed and still set the global */
    float g = 0.0f;
    assert_int_equal(td_nvfp4_quantize(NULL, 0, 32, TD_NVFP4_CT, NAN, NULL, NULL, &g, NULL), TD_OK);
    assert_true(g == 1.0f);
    assert_int_equal(td_nvfp4_quantize(NULL, 7, 0, TD_NVFP4_MODELOPT, 2688.0f, NULL, NULL, &g, NULL),
                     TD_OK);
    assert_true(g == 1.0f);
}

static void nvfp4_amax_nan_equals_explicit_max(void **state)
{
    (void)state;
    float w[4 * 64];
    fill(w, 4, 64, DIST_HEAVY, 0.03f, 5);
    float amax = 0.0f;
    for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(w[i]));
    for (size_t c = 0; c < 2; c++) {
        uint8_t p1[128], p2[128], s1[16], s2[16];
        float g1, g2;
        assert_int_equal(td_nvfp4_quantize(w, 4, 64, both_convs[c], NAN, p1, s1, &g1, NULL), TD_OK);
        assert_int_equal(td_nvfp4_quantize(w, 4, 64, both_convs[c], amax, p2, s2, &g2, NULL), TD_OK);
        assert_memory_equal(p1, p2, 128);
        assert_memory_equal(s1, s2, 16);
        assert_int_equal(bits_of(g1), bits_of(g2));
        float want = both_convs[c] == TD_NVFP4_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
        assert_int_equal(bits_of(g1), bits_of(want));
    }
}

static void nvfp4_shared_amax_sets_global_and_clamps(void **state)
{
    (void)state;
    float w[32];
    for (int i = 0; i < 32; i++) w[i] = (float)(i - 16) / 16.0f; /* max |w| = 1.0 at i = 0 */
    uint8_t packed[16], scales[2];
    float g;
    td_err err;
    /* a larger sibling amax: the global comes from it, not from w */
    assert_int_equal(td_nvfp4_quantize(w, 1, 32, TD_NVFP4_MODELOPT, 3.5f, packed, scales, &g, &err),
                     TD_OK);
    assert_int_equal(bits_of(g), bits_of(3.5f / 2688.0f));
    assert_int_equal(td_nvfp4_quantize(w, 1, 32, TD_NVFP4_CT, 3.5f, packed, scales, &g, &err), TD_OK);
    assert_int_equal(bits_of(g), bits_of(2688.0f / 3.5f));
    /* a smaller amax (static calibration): the scale clamps to 448 (never NaN) and the codes
     * of large elements saturate at ±6 */
    for (size_t c = 0; c < 2; c++) {
        assert_int_equal(td_nvfp4_quantize(w, 1, 32, both_convs[c], 0.25f, packed, scales, &g, &err),
                         TD_OK);
        assert_int_equal(scales[0], 0x7E);
        assert_int_equal(packed[0] & 0xF, 0xF);      /* w[0] = -1.0 -> -6 */
        assert_false(td_e4m3_is_nan(scales[1]));
    }
}

/* ---- errors --------------------------------------------------------------------------------- */

#define POISON 0xA5

static void nvfp4_k_not_multiple_of_16_rejected(void **state)
{
    (void)state;
    float w[64] = {0}, out[64];
    uint8_t packed[32], scales[4];
    static const int64_t bad_k[] = {24, 8, 17, 1};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad_k); i++)
        for (size_t c = 0; c < 2; c++) {
            memset(packed, POISON, sizeof packed);
            memset(scales, POISON, sizeof scales);
            float g = -7.0f;
            td_err err;
            assert_int_equal(td_nvfp4_quantize(w, 1, bad_k[i], both_convs[c], NAN, packed, scales, &g,
                                               &err), TD_ERR_ARG);
            char needle[32];
            snprintf(needle, sizeof needle, "k = %lld", (long long)bad_k[i]);
            assert_non_null(strstr(err.msg, needle));
            assert_non_null(strstr(err.msg, "16"));
            assert_true(g == -7.0f);
            for (size_t j = 0; j < sizeof packed; j++) assert_int_equal(packed[j], POISON);
            for (size_t j = 0; j < sizeof scales; j++) assert_int_equal(scales[j], POISON);
            memset(out, POISON, sizeof out);
            assert_int_equal(td_nvfp4_dequantize(packed, scales, 1.0f, both_convs[c], 1, bad_k[i], out,
                                                 &err), TD_ERR_ARG);
            assert_non_null(strstr(err.msg, needle));
            for (size_t j = 0; j < 64; j++) assert_int_equal(bits_of(out[j]), 0xA5A5A5A5);
        }
    td_err err;
    float g;
    assert_int_equal(td_nvfp4_quantize(w, -1, 16, TD_NVFP4_CT, NAN, packed, scales, &g, &err),
                     TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "negative"));
    assert_int_equal(td_nvfp4_quantize(w, (int64_t)1 << 60, 64, TD_NVFP4_CT, NAN, packed, scales, &g,
                                       &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "too many"));
    assert_int_equal(td_nvfp4_dequantize(packed, scales, 1.0f, TD_NVFP4_CT, 2, -16, out, &err),
                     TD_ERR_ARG);
}

static void nvfp4_nonfinite_input_rejected_names_element(void **state)
{
    (void)state;
    static const struct { int64_t row, col; uint32_t bits; const char *word; } cases[] = {
        {2, 37, 0x7FC00000, "NaN"}, {3, 0, 0xFF800000, "-inf"}, {0, 63, 0x7F800000, "+inf"},
        {1, 16, 0xFFC00001, "NaN"},
    };
    float w[4 * 64];
    fill(w, 4, 64, DIST_NORMAL, 1.0f, 9);
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++)
        for (size_t c = 0; c < 2; c++) {
            float saved = w[cases[i].row * 64 + cases[i].col];
            w[cases[i].row * 64 + cases[i].col] = float_of(cases[i].bits);
            uint8_t packed[128], scales[16];
            memset(packed, POISON, sizeof packed);
            memset(scales, POISON, sizeof scales);
            float g = -7.0f;
            td_err err;
            /* also with an explicit amax: the scan happens regardless */
            float amax = (c == 0) ? NAN : 4.0f;
            assert_int_equal(td_nvfp4_quantize(w, 4, 64, both_convs[c], amax, packed, scales, &g,
                                               &err), TD_ERR_ARG);
            char needle[32];
            snprintf(needle, sizeof needle, "w[%lld, %lld]", (long long)cases[i].row,
                     (long long)cases[i].col);
            if (!strstr(err.msg, needle) || !strstr(err.msg, cases[i].word))
                fail_msg("message '%s' lacks '%s' / '%s'", err.msg, needle, cases[i].word);
            assert_true(g == -7.0f);
            for (size_t j = 0; j < sizeof packed; j++) assert_int_equal(packed[j], POISON);
            for (size_t j = 0; j < sizeof scales; j++) assert_int_equal(scales[j], POISON);
            w[cases[i].row * 64 + cases[i].col] = saved;
        }
}

static void nvfp4_bad_amax_rejected(void **state)
{
    (void)state;
    float w[2 * 16];
    for (int i = 0; i < 32; i++) w[i] = 0.01f * (float)i;
    uint8_t packed[16], scales[2];
    float g = -7.0f;
    td_err err;
    static const float bad[] = {-1.0f, -0.001f, INFINITY, -INFINITY, 1e-36f, 0x1p-149f};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        assert_int_equal(td_nvfp4_quantize(w, 2, 16, TD_NVFP4_MODELOPT, bad[i], packed, scales, &g,
                                           &err), TD_ERR_RANGE);
        assert_non_null(strstr(err.msg, "amax"));
        assert_true(g == -7.0f);
    }
    /* amax == 0 for a tensor that is not all zero names the first largest element */
    assert_int_equal(td_nvfp4_quantize(w, 2, 16, TD_NVFP4_CT, 0.0f, packed, scales, &g, &err),
                     TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "w[1, 15]"));
    /* a computed amax below the minimum (tensor of denormal-scale values) is rejected too */
    float tiny[16] = {0};
    tiny[4] = 1e-36f;
    assert_int_equal(td_nvfp4_quantize(tiny, 1, 16, TD_NVFP4_CT, NAN, packed, scales, &g, &err),
                     TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "below"));
    /* the minimum itself is accepted and gives a normal g_dec of exactly 2^-126 */
    tiny[4] = TD_NVFP4_AMAX_MIN;
    assert_int_equal(td_nvfp4_quantize(tiny, 1, 16, TD_NVFP4_MODELOPT, NAN, packed, scales, &g, &err),
                     TD_OK);
    assert_true(g == 0x1p-126f);
    assert_int_equal(td_nvfp4_quantize(tiny, 1, 16, TD_NVFP4_CT, NAN, packed, scales, &g, &err), TD_OK);
    assert_true(isfinite(g) && g == 0x1p126f);
}

static void nvfp4_dequantize_bad_global_rejected(void **state)
{
    (void)state;
    uint8_t packed[8] = {0x12}, scales[1] = {0x38};
    float out[16];
    static const float bad[] = {0.0f, -0.0f, -1.0f, INFINITY, NAN};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        td_err err;
        memset(out, POISON, sizeof out);
        assert_int_equal(td_nvfp4_dequantize(packed, scales, bad[i], TD_NVFP4_MODELOPT, 1, 16, out,
                                             &err), TD_ERR_RANGE);
        assert_non_null(strstr(err.msg, "weight_scale_2"));
        assert_int_equal(td_nvfp4_dequantize(packed, scales, bad[i], TD_NVFP4_CT, 1, 16, out, &err),
                         TD_ERR_RANGE);
        assert_non_null(strstr(err.msg, "weight_global_scale"));
        for (int j = 0; j < 16; j++) assert_int_equal(bits_of(out[j]), 0xA5A5A5A5);
    }
}

/* ---- dequantization orders and scale-byte semantics ------------------------------------ */

static void nvfp4_dequantize_nan_and_negative_scales_pass_through(void **state)
{
    (void)state;
    uint8_t packed[32];
    for (int i = 0; i < 32; i++) packed[i] = (uint8_t)(i * 37 + 11); /* all codes incl. 0 and 8 */
    const uint8_t scales[4] = {0x38, 0x7F, 0xFF, 0xB8}; /* 1.0, NaN, -NaN, -1.0 */
    float out[64];
    for (size_t c = 0; c < 2; c++) {
        td_err err;
        assert_int_equal(td_nvfp4_dequantize(packed, scales, 0.5f, both_convs[c], 1, 64, out, &err),
                         TD_OK);
        float f = both_convs[c] == TD_NVFP4_MODELOPT ? 0.5f : 2.0f; /* 1.0*0.5 or 1.0/0.5 */
        for (int i = 0; i < 64; i++) {
            uint8_t code = (uint8_t)((packed[i / 2] >> (4 * (i & 1))) & 0xF);
            double v = e2m1_value(code);
            int blk = i / 16;
            if (blk == 1 || blk == 2) {
                if (!isnan(out[i])) fail_msg("element %d of a NaN-scale block is %a", i,
                                             (double)out[i]);
            } else {
                double want = v * (double)f * (blk == 3 ? -1.0 : 1.0);
                if ((double)out[i] != want) fail_msg("element %d = %a, want %a", i, (double)out[i],
                                                     want);
            }
        }
    }
}

static void nvfp4_dequantize_follows_producer_orders(void **state)
{
    (void)state;
    /* ModelOpt: e2m1 * fl(f32(S) * g_dec), two roundings, not fl(e2m1 * S * g_dec).
     * CT: e2m1 * fl(f32(S) / g_enc), not e2m1 * fl(S * fl(1/g_enc)).
     * Search seeded globals where the alternatives differ and check which one is produced. */
    uint64_t s = 31337;
    int found_mo = 0, found_ct = 0;
    const uint8_t scale = 0x6D; /* 104 */
    uint8_t packed[8];
    memset(packed, 0x53, sizeof packed); /* codes 3 (1.5) and 5 (3.0): products need rounding */
    for (int iter = 0; iter < 100000 && (found_mo < 20 || found_ct < 20); iter++) {
        float g = float_of(0x3A000000u + (uint32_t)(rng_next(&s) & 0x00FFFFFF)); /* ~2^-11..2^-10 */
        float out[16];
        double sv = e4m3_value(scale);
        /* ModelOpt */
        float two = 1.5f * ((float)sv * g);
        float one = (float)(1.5 * sv * (double)g); /* exact product in double, one rounding */
        if (bits_of(two) != bits_of(one) && found_mo < 20) {
            assert_int_equal(td_nvfp4_dequantize(packed, &scale, g, TD_NVFP4_MODELOPT, 1, 16, out,
                                                 NULL), TD_OK);
            assert_int_equal(bits_of(out[0]), bits_of(two));
            found_mo++;
        }
        /* CT */
        float g_enc = 1.0f / g;
        float div = 3.0f * ((float)sv / g_enc);
        float rcp = 3.0f * ((float)sv * (1.0f / g_enc));
        if (bits_of(div) != bits_of(rcp) && found_ct < 20) {
            assert_int_equal(td_nvfp4_dequantize(packed, &scale, g_enc, TD_NVFP4_CT, 1, 16, out, NULL),
                             TD_OK);
            assert_int_equal(bits_of(out[1]), bits_of(div));
            found_ct++;
        }
    }
    assert_int_equal(found_mo, 20);
    assert_int_equal(found_ct, 20);
}

static void nvfp4_g_dec_and_names(void **state)
{
    (void)state;
    assert_true(td_nvfp4_g_dec(0.25f, TD_NVFP4_MODELOPT) == 0.25f);
    assert_true(td_nvfp4_g_dec(896.0f, TD_NVFP4_CT) == 1.0f / 896.0f);
    /* P1 counter-example: block scale 0.5 with global 100 is 50 under ModelOpt, 0.005 under CT */
    assert_true(td_nvfp4_block_factor(0x30, 100.0f, TD_NVFP4_MODELOPT) == 50.0f);
    assert_true(td_nvfp4_block_factor(0x30, 100.0f, TD_NVFP4_CT) == 0.5f / 100.0f);
    assert_string_equal(td_nvfp4_conv_name(TD_NVFP4_MODELOPT), "modelopt");
    assert_string_equal(td_nvfp4_conv_name(TD_NVFP4_CT), "compressed-tensors");
    assert_string_equal(td_nvfp4_conv_name((td_nvfp4_conv)9), "unknown");
}

/* ---- every output written, nothing past the end ------------------------------------------ */

#define GUARD 64

static void nvfp4_outputs_fully_written_and_guarded(void **state)
{
    (void)state;
    static const int64_t shapes[][2] = {{5, 48}, {1, 16}, {3, 160}, {7, 32}};
    for (size_t si = 0; si < TD_ARRAY_LEN(shapes); si++)
        for (size_t c = 0; c < 2; c++) {
            int64_t rows = shapes[si][0], k = shapes[si][1];
            size_t n = (size_t)(rows * k), np = n / 2, ns = n / 16;
            float *w = malloc(sizeof(float) * n);
            uint8_t *pk[2], *sc[2];
            float *out[2];
            float g[2];
            fill(w, rows, k, DIST_ZERO_BLOCKS, 2.0f, 11 + si);
            static const uint8_t poison[2] = {0xA5, 0x5A};
            for (int run = 0; run < 2; run++) {
                pk[run] = malloc(np + GUARD);
                sc[run] = malloc(ns + GUARD);
                out[run] = malloc(sizeof(float) * (n + GUARD));
                memset(pk[run], poison[run], np + GUARD);
                memset(sc[run], poison[run], ns + GUARD);
                memset(out[run], poison[run], sizeof(float) * (n + GUARD));
                g[run] = run ? -1.0f : -2.0f;
                td_err err;
                assert_int_equal(td_nvfp4_quantize(w, rows, k, both_convs[c], NAN, pk[run], sc[run],
                                                   &g[run], &err), TD_OK);
                assert_int_equal(td_nvfp4_dequantize(pk[run], sc[run], g[run], both_convs[c], rows, k,
                                                     out[run], &err), TD_OK);
                for (size_t j = 0; j < GUARD; j++) {
                    assert_int_equal(pk[run][np + j], poison[run]);
                    assert_int_equal(sc[run][ns + j], poison[run]);
                }
                const uint8_t *ob = (const uint8_t *)(out[run] + n);
                for (size_t j = 0; j < sizeof(float) * GUARD; j++) assert_int_equal(ob[j], poison[run]);
            }
            /* any element left unwritten would still hold its (different) poison */
            assert_memory_equal(pk[0], pk[1], np);
            assert_memory_equal(sc[0], sc[1], ns);
            assert_memory_equal(out[0], out[1], sizeof(float) * n);
            assert_int_equal(bits_of(g[0]), bits_of(g[1]));
            for (int run = 0; run < 2; run++) { free(pk[run]); free(sc[run]); free(out[run]); }
            free(w);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nvfp4_spec_vector_modelopt_bytes_exact),
        cmocka_unit_test(nvfp4_spec_vector_ct_bytes_exact),
        cmocka_unit_test(nvfp4_random_tensors_match_spec_replay),
        cmocka_unit_test(nvfp4_adversarial_blocks_match_spec_replay),
        cmocka_unit_test(nvfp4_roundtrip_modelopt_error_within_bound),
        cmocka_unit_test(nvfp4_roundtrip_ct_error_within_bound),
        cmocka_unit_test(nvfp4_modelopt_and_ct_dequantize_close),
        cmocka_unit_test(nvfp4_zero_tensor_uses_unit_global),
        cmocka_unit_test(nvfp4_amax_nan_equals_explicit_max),
        cmocka_unit_test(nvfp4_shared_amax_sets_global_and_clamps),
        cmocka_unit_test(nvfp4_k_not_multiple_of_16_rejected),
        cmocka_unit_test(nvfp4_nonfinite_input_rejected_names_element),
        cmocka_unit_test(nvfp4_bad_amax_rejected),
        cmocka_unit_test(nvfp4_dequantize_bad_global_rejected),
        cmocka_unit_test(nvfp4_dequantize_nan_and_negative_scales_pass_through),
        cmocka_unit_test(nvfp4_dequantize_follows_producer_orders),
        cmocka_unit_test(nvfp4_g_dec_and_names),
        cmocka_unit_test(nvfp4_outputs_fully_written_and_guarded),
    };
    return cmocka_run_group_tests_name("nvfp4", tests, NULL, NULL);
}
