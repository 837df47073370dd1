/* test_rng.c — seeded generator: reference outputs, golden values, distributions (core/rng). */
#include "test_common.h"
#include "rng.h"

#include <inttypes.h>
#include <math.h>

/* Distance in ulps between two finite doubles of the same sign. */
static uint64_t ulp_distance(double a, double b)
{
    int64_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    return ia > ib ? (uint64_t)ia - (uint64_t)ib : (uint64_t)ib - (uint64_t)ia;
}

/* Multiplicative inverse of an odd number mod 2^64 (Newton: each step doubles the bits). */
static uint64_t inverse_mod_2_64(uint64_t x)
{
    uint64_t inv = x; /* correct to 3 bits for odd x */
    for (int i = 0; i < 6; i++) inv *= 2u - x * inv;
    return inv;
}

/* ---- reference outputs of the published algorithms ----------------------------------- */

static void rng_xoshiro_state_1234_matches_reference_outputs(void **state)
{
    (void)state;
    /* Outputs of the xoshiro256** reference implementation from the state {1, 2, 3, 4}. */
    static const uint64_t want[10] = {
        UINT64_C(11520),
        UINT64_C(0),
        UINT64_C(1509978240),
        UINT64_C(1215971899390074240),
        UINT64_C(1216172134540287360),
        UINT64_C(607988272756665600),
        UINT64_C(16172922978634559625),
        UINT64_C(8476171486693032832),
        UINT64_C(10595114339597558777),
        UINT64_C(2904607092377533576),
    };
    td_rng r = {{1, 2, 3, 4}};
    for (size_t i = 0; i < TD_ARRAY_LEN(want); i++) {
        uint64_t got = td_rng_u64(&r);
        if (got != want[i]) fail_msg("output %zu: %" PRIu64 " != %" PRIu64, i, got, want[i]);
    }
}

static void rng_seed_fills_state_with_splitmix64_outputs(void **state)
{
    (void)state;
    /* First outputs of the splitmix64 reference generator for seeds 1234567 and 0. */
    td_rng r;
    td_rng_seed(&r, 1234567);
    assert_true(r.s[0] == UINT64_C(6457827717110365317));
    assert_true(r.s[1] == UINT64_C(3203168211198807973));
    assert_true(r.s[2] == UINT64_C(9817491932198370423));
    assert_true(r.s[3] == UINT64_C(4593380528125082431));
    td_rng_seed(&r, 0);
    assert_true(r.s[0] == UINT64_C(0xe220a8397b1dcdaf));
    assert_true(r.s[1] == UINT64_C(0x6e789e6aa1b965f4));
    assert_true(r.s[2] == UINT64_C(0x06c45d188009454f));
    assert_true(r.s[3] == UINT64_C(0xf88bb8a8724c81ec));
}

/* ---- golden values (a change here changes every seeded tensor) ----------------------- */

static void rng_seed42_u64_matches_golden(void **state)
{
    (void)state;
    /* The first three also agree with independent splitmix64 + xoshiro256** implementations. */
    static const uint64_t want[6] = {
        UINT64_C(1546998764402558742),  UINT64_C(6990951692964543102),
        UINT64_C(12544586762248559009), UINT64_C(17057574109182124193),
        UINT64_C(18295552978065317476), UINT64_C(14199186830065750584),
    };
    td_rng r;
    td_rng_seed(&r, 42);
    for (size_t i = 0; i < TD_ARRAY_LEN(want); i++) {
        uint64_t got = td_rng_u64(&r);
        if (got != want[i]) fail_msg("output %zu: %" PRIu64 " != %" PRIu64, i, got, want[i]);
    }
}

static void rng_seed42_normals_match_golden_bits(void **state)
{
    (void)state;
    static const double want[8] = {
        -0x1.73d2feb0fb377p-1, 0x1.c5e21f7812a4cp-3, 0x1.db514bfac5b4ep-2, 0x1.79eb7c13cfccdp+0,
        0x1.02007c2380aeap+0,  0x1.06f74c2a8e101p+0, 0x1.7bb262180f952p-2, 0x1.61ec2cfebd724p-2,
    };
    td_rng r;
    td_rng_seed(&r, 42);
    for (size_t i = 0; i < TD_ARRAY_LEN(want); i++) {
        double got = td_rng_normal(&r);
        if (memcmp(&got, &want[i], sizeof got) != 0)
            fail_msg("normal %zu: %a != %a", i, got, want[i]);
    }
    static const float want_f32[4] = {
        -0x1.73d2fep-1f, 0x1.c5e22p-3f, 0x1.db514cp-2f, 0x1.79eb7cp+0f,
    };
    td_rng_seed(&r, 42);
    for (size_t i = 0; i < TD_ARRAY_LEN(want_f32); i++) {
        float got = td_rng_normal_f32(&r);
        if (memcmp(&got, &want_f32[i], sizeof got) != 0)
            fail_msg("normal_f32 %zu: %a != %a", i, (double)got, (double)want_f32[i]);
    }
}

/* FNV-1a over 64-bit words: a fingerprint of a long stream of output bits. */
static uint64_t fold_bits(uint64_t h, uint64_t bits)
{
    return (h ^ bits) * UINT64_C(0x100000001b3);
}

static void rng_seed42_normal_stream_fingerprint_matches_golden(void **state)
{
    (void)state;
    /* Every bit of 200000 normals. A last-bit difference in any one of them (for instance
     * from computing the logarithm with libm's log, which differs in about 3% of these
     * draws on glibc) changes the fingerprint. */
    const int n = 200000;
    td_rng r;
    td_rng_seed(&r, 42);
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < n; i++) {
        double x = td_rng_normal(&r);
        uint64_t bits;
        memcpy(&bits, &x, sizeof bits);
        h = fold_bits(h, bits);
    }
    if (h != UINT64_C(0xa86714c752da0ef0)) fail_msg("double fingerprint 0x%016" PRIx64, h);

    td_rng_seed(&r, 42);
    h = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < n; i++) {
        float x = td_rng_normal_f32(&r);
        uint32_t bits;
        memcpy(&bits, &x, sizeof bits);
        h = fold_bits(h, bits);
    }
    if (h != UINT64_C(0x2dcfa57a98c9ddcd)) fail_msg("float fingerprint 0x%016" PRIx64, h);
}

static void rng_seed42_uniform_below_split_match_golden(void **state)
{
    (void)state;
    td_rng r;
    td_rng_seed(&r, 42);
    static const double uni[4] = {0x1.5780b2e0c2ecp-4, 0x1.84136619b444ep-2, 0x1.5c2ea66473c93p-1,
                                  0x1.d9715a8e0766cp-1};
    for (size_t i = 0; i < TD_ARRAY_LEN(uni); i++) {
        double got = td_rng_uniform(&r);
        if (memcmp(&got, &uni[i], sizeof got) != 0)
            fail_msg("uniform %zu: %a != %a", i, got, uni[i]);
    }
    td_rng_seed(&r, 42);
    static const uint64_t below[6] = {742, 102, 9, 193, 476, 584};
    for (size_t i = 0; i < TD_ARRAY_LEN(below); i++)
        assert_true(td_rng_below(&r, 1000) == below[i]);

    td_rng child;
    td_rng_seed(&r, 42);
    td_rng_split(&r, 7, &child);
    assert_true(td_rng_u64(&child) == UINT64_C(1071371876527367257));
    assert_true(td_rng_u64(&child) == UINT64_C(7653600051278717753));
    assert_true(td_rng_u64(&child) == UINT64_C(9147580030583645987));
}

/* ---- derived outputs ------------------------------------------------------------------ */

static void rng_u32_and_uniform_derive_from_u64(void **state)
{
    (void)state;
    td_rng a, b;
    td_rng_seed(&a, 99);
    b = a; /* a copy forks an identical stream */
    for (int i = 0; i < 1000; i++) {
        uint64_t x = td_rng_u64(&a);
        assert_int_equal(td_rng_u32(&b), (uint32_t)(x >> 32));
        x = td_rng_u64(&a);
        double u = td_rng_uniform(&b);
        assert_true(u == (double)(x >> 11) * 0x1.0p-53);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u * 0x1.0p53 == floor(u * 0x1.0p53)); /* on the 2^-53 grid */
    }
}

static void rng_uniform_of_all_ones_output_stays_below_one(void **state)
{
    (void)state;
    /* Choose s[1] so the next output is 2^64 - 1: out = rotl(s1 * 5, 7) * 9. */
    uint64_t y = UINT64_MAX * inverse_mod_2_64(9);  /* rotl(s1 * 5, 7) */
    uint64_t s1x5 = (y >> 7) | (y << 57);            /* undo the rotation */
    td_rng r = {{3, s1x5 * inverse_mod_2_64(5), 5, 7}};
    td_rng twin = r;
    assert_true(td_rng_u64(&twin) == UINT64_MAX);
    double u = td_rng_uniform(&r);
    assert_true(u == 1.0 - 0x1.0p-53);
    assert_true(u < 1.0);
}

static void rng_normal_f32_is_the_rounded_double(void **state)
{
    (void)state;
    td_rng a, b;
    td_rng_seed(&a, 5);
    td_rng_seed(&b, 5);
    for (int i = 0; i < 10000; i++) {
        double d = td_rng_normal(&a);
        float f = td_rng_normal_f32(&b);
        assert_true(f == (float)d);
    }
    assert_memory_equal(&a, &b, sizeof a);
}

/* ---- deterministic logarithm --------------------------------------------------------- */

static void rng_log_special_values_exact(void **state)
{
    (void)state;
    double z = td_rng_log(1.0);
    assert_true(z == 0.0 && !signbit(z));
    assert_true(td_rng_log(0.0) == -HUGE_VAL);
    assert_true(td_rng_log(-0.0) == -HUGE_VAL);
    assert_true(isnan(td_rng_log(-1.0)));
    assert_true(isnan(td_rng_log(-HUGE_VAL)));
    assert_true(isnan(td_rng_log((double)NAN)));
    assert_true(td_rng_log(HUGE_VAL) == HUGE_VAL);
    /* Sign and monotonicity around 1. */
    assert_true(td_rng_log(nextafter(1.0, 2.0)) > 0.0);
    assert_true(td_rng_log(nextafter(1.0, 0.0)) < 0.0);
}

static void rng_log_matches_libm_within_two_ulps(void **state)
{
    (void)state;
    /* libm's log is itself only faithful (< 1 ulp) on most C libraries, so allow 2. */
    const uint64_t tol = 2;
    uint64_t worst = 0;
    double worst_x = 0.0;
    td_rng r;
    td_rng_seed(&r, 2024);
    for (int i = 0; i < 300000; i++) {
        double x;
        switch (i % 4) {
        case 0: x = 0.25 + 3.75 * td_rng_uniform(&r); break;               /* around 1 */
        case 1: x = ldexp(1.0 + td_rng_uniform(&r), (int)td_rng_below(&r, 2046) - 1022); break;
        case 2: x = 1.0 + ldexp((double)(i / 4 % 1000) - 500.0, -52); break; /* 1 +- k ulp */
        default: x = ldexp(0.5 + 0.5 * td_rng_uniform(&r), -1030 - (int)td_rng_below(&r, 40));
                 break;                                                    /* subnormal */
        }
        if (x == 1.0 || x <= 0.0) continue;
        double got = td_rng_log(x), want = log(x);
        if (signbit(got) != signbit(want)) fail_msg("log(%a): sign %a vs libm %a", x, got, want);
        uint64_t d = ulp_distance(got, want);
        if (d > worst) { worst = d; worst_x = x; }
    }
    /* Powers of two: log(2^k) comes from the ln 2 split alone. */
    for (int k = -1074; k <= 1023; k++) {
        if (k == 0) continue;
        double x = ldexp(1.0, k);
        uint64_t d = ulp_distance(td_rng_log(x), log(x));
        if (d > worst) { worst = d; worst_x = x; }
    }
    if (worst > tol) fail_msg("log(%a) is %" PRIu64 " ulps from libm", worst_x, worst);
}

/* ---- distributions (fixed seeds: the checks are deterministic, bounds are 5 sigma) --- */

static void rng_normal_moments_within_five_sigma(void **state)
{
    (void)state;
    const int n = 1000000;
    td_rng r;
    td_rng_seed(&r, 12345);
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    long in1 = 0, in2 = 0;
    for (int i = 0; i < n; i++) {
        double x = td_rng_normal(&r);
        assert_true(isfinite(x));
        double x2 = x * x;
        s1 += x;
        s2 += x2;
        s3 += x2 * x;
        s4 += x2 * x2;
        in1 += fabs(x) <= 1.0;
        in2 += fabs(x) <= 2.0;
    }
    double dn = (double)n;
    double mean = s1 / dn;
    double var = s2 / dn - mean * mean;
    /* Standard errors for N(0,1): mean 1/sqrt(n), E[x^2] sqrt(2/n), E[x^3] sqrt(15/n),
     * E[x^4] sqrt(96/n). */
    double se = 1.0 / sqrt(dn);
    if (fabs(mean) > 5 * se) fail_msg("mean %.6f", mean);
    if (fabs(var - 1.0) > 5 * sqrt(2.0) * se) fail_msg("variance %.6f", var);
    if (fabs(s3 / dn) > 5 * sqrt(15.0) * se) fail_msg("third moment %.6f", s3 / dn);
    if (fabs(s4 / dn - 3.0) > 5 * sqrt(96.0) * se) fail_msg("fourth moment %.6f", s4 / dn);
    /* P(|x| <= 1) = erf(1/sqrt 2), P(|x| <= 2) = erf(sqrt 2). */
    const double p1 = 0.6826894921370859, p2 = 0.9544997361036416;
    double f1 = (double)in1 / dn, f2 = (double)in2 / dn;
    if (fabs(f1 - p1) > 5 * sqrt(p1 * (1 - p1) / dn)) fail_msg("within 1 sigma: %.6f", f1);
    if (fabs(f2 - p2) > 5 * sqrt(p2 * (1 - p2) / dn)) fail_msg("within 2 sigma: %.6f", f2);
}

static void rng_uniform_buckets_pass_chi_square(void **state)
{
    (void)state;
    enum { BUCKETS = 100, N = 1000000 };
    long count[BUCKETS] = {0};
    double sum = 0;
    td_rng r;
    td_rng_seed(&r, 777);
    for (int i = 0; i < N; i++) {
        double u = td_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
        sum += u;
        count[(int)(u * BUCKETS)]++;
    }
    double expect = (double)N / BUCKETS, chi2 = 0;
    for (int b = 0; b < BUCKETS; b++) chi2 += (count[b] - expect) * (count[b] - expect) / expect;
    /* 99 degrees of freedom: mean 99, sd 14.1. Too small is as suspicious as too large. */
    if (chi2 < 50.0 || chi2 > 170.0) fail_msg("chi-square %.2f outside [50, 170]", chi2);
    double mean = sum / N;
    if (fabs(mean - 0.5) > 5 * sqrt(1.0 / 12.0 / N)) fail_msg("mean %.6f", mean);
}

/* ---- bounded integers ---------------------------------------------------------------- */

static void rng_below_never_reaches_n_and_covers_small_n(void **state)
{
    (void)state;
    td_rng r;
    td_rng_seed(&r, 31337);
    for (uint64_t n = 1; n <= 64; n++) {
        unsigned char seen[64] = {0};
        for (int i = 0; i < 2000; i++) {
            uint64_t x = td_rng_below(&r, n);
            if (x >= n) fail_msg("below(%" PRIu64 ") returned %" PRIu64, n, x);
            seen[x] = 1;
        }
        for (uint64_t v = 0; v < n; v++)
            if (!seen[v]) fail_msg("below(%" PRIu64 ") never returned %" PRIu64, n, v);
    }
    static const uint64_t big[] = {
        UINT64_C(1) << 32, (UINT64_C(1) << 63) + 1, UINT64_MAX - 1, UINT64_MAX,
    };
    for (size_t k = 0; k < TD_ARRAY_LEN(big); k++)
        for (int i = 0; i < 10000; i++) assert_true(td_rng_below(&r, big[k]) < big[k]);
}

static void rng_below_is_unbiased_where_modulo_is_not(void **state)
{
    (void)state;
    /* n ~ 2/3 * 2^64: plain x % n would return values below n/2 with probability 2/3.
     * The rejection method gives 1/2. */
    const uint64_t n = UINT64_C(0xaaaaaaaaaaaaaaaa);
    const int draws = 20000;
    td_rng r;
    td_rng_seed(&r, 8);
    int low = 0;
    for (int i = 0; i < draws; i++) {
        uint64_t x = td_rng_below(&r, n);
        assert_true(x < n);
        low += x < n / 2;
    }
    double frac = (double)low / draws;
    if (fabs(frac - 0.5) > 5 * sqrt(0.25 / draws)) fail_msg("fraction below n/2 = %.4f", frac);

    /* Small n: a die, chi-square with 5 degrees of freedom (P(chi2 > 30) < 2e-5). */
    long count[6] = {0};
    for (int i = 0; i < 60000; i++) count[td_rng_below(&r, 6)]++;
    double chi2 = 0;
    for (int b = 0; b < 6; b++) chi2 += (count[b] - 10000.0) * (count[b] - 10000.0) / 10000.0;
    if (chi2 > 30.0) fail_msg("die chi-square %.2f", chi2);
}

/* ---- seeding and streams ------------------------------------------------------------- */

static void rng_same_seed_gives_same_sequence(void **state)
{
    (void)state;
    td_rng a, b;
    td_rng_seed(&a, 0xdeadbeef);
    td_rng_seed(&b, 0xdeadbeef);
    for (int i = 0; i < 1000; i++) assert_true(td_rng_u64(&a) == td_rng_u64(&b));
    for (int i = 0; i < 1000; i++) {
        double x = td_rng_normal(&a), y = td_rng_normal(&b);
        assert_memory_equal(&x, &y, sizeof x);
    }
}

static void rng_different_seeds_give_different_sequences(void **state)
{
    (void)state;
    static const uint64_t seeds[] = {0, 1, 2, 42, UINT64_C(0x9e3779b97f4a7c15), UINT64_MAX};
    enum { N = 1000 };
    enum { S = sizeof seeds / sizeof seeds[0] };
    uint64_t out[S][N];
    for (size_t k = 0; k < S; k++) {
        td_rng r;
        td_rng_seed(&r, seeds[k]);
        assert_false(r.s[0] == 0 && r.s[1] == 0 && r.s[2] == 0 && r.s[3] == 0);
        for (int i = 0; i < N; i++) out[k][i] = td_rng_u64(&r);
    }
    for (size_t a = 0; a < S; a++) {
        for (size_t b = a + 1; b < S; b++) {
            int equal = 0;
            for (int i = 0; i < N; i++) equal += out[a][i] == out[b][i];
            if (equal > 0) fail_msg("seeds %zu and %zu agree at %d positions", a, b, equal);
        }
    }
}

static void rng_split_is_deterministic_and_streams_differ(void **state)
{
    (void)state;
    td_rng parent;
    td_rng_seed(&parent, 42);
    td_rng before = parent;
    enum { STREAMS = 100 };
    uint64_t first[STREAMS];
    for (uint64_t k = 0; k < STREAMS; k++) {
        td_rng c1, c2;
        td_rng_split(&parent, k, &c1);
        td_rng_split(&parent, k, &c2);
        assert_memory_equal(&c1, &c2, sizeof c1);
        first[k] = td_rng_u64(&c1);
    }
    assert_memory_equal(&parent, &before, sizeof parent); /* the parent does not advance */
    uint64_t parent_next = td_rng_u64(&parent);
    for (int a = 0; a < STREAMS; a++) {
        assert_true(first[a] != parent_next);
        for (int b = a + 1; b < STREAMS; b++)
            if (first[a] == first[b]) fail_msg("streams %d and %d start alike", a, b);
    }
    /* Splitting in place equals splitting into another generator. */
    td_rng x, y;
    td_rng_seed(&x, 9);
    td_rng_split(&x, 3, &y);
    td_rng_split(&x, 3, &x);
    assert_memory_equal(&x, &y, sizeof x);
    /* Different parents, same stream: different children. */
    td_rng p2, c_a, c_b;
    td_rng_seed(&p2, 43);
    td_rng_seed(&parent, 42);
    td_rng_split(&parent, 1, &c_a);
    td_rng_split(&p2, 1, &c_b);
    assert_true(td_rng_u64(&c_a) != td_rng_u64(&c_b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rng_xoshiro_state_1234_matches_reference_outputs),
        cmocka_unit_test(rng_seed_fills_state_with_splitmix64_outputs),
        cmocka_unit_test(rng_seed42_u64_matches_golden),
        cmocka_unit_test(rng_seed42_normals_match_golden_bits),
        cmocka_unit_test(rng_seed42_normal_stream_fingerprint_matches_golden),
        cmocka_unit_test(rng_seed42_uniform_below_split_match_golden),
        cmocka_unit_test(rng_u32_and_uniform_derive_from_u64),
        cmocka_unit_test(rng_uniform_of_all_ones_output_stays_below_one),
        cmocka_unit_test(rng_normal_f32_is_the_rounded_double),
        cmocka_unit_test(rng_log_special_values_exact),
        cmocka_unit_test(rng_log_matches_libm_within_two_ulps),
        cmocka_unit_test(rng_normal_moments_within_five_sigma),
        cmocka_unit_test(rng_uniform_buckets_pass_chi_square),
        cmocka_unit_test(rng_below_never_reaches_n_and_covers_small_n),
        cmocka_unit_test(rng_below_is_unbiased_where_modulo_is_not),
        cmocka_unit_test(rng_same_seed_gives_same_sequence),
        cmocka_unit_test(rng_different_seeds_give_different_sequences),
        cmocka_unit_test(rng_split_is_deterministic_and_streams_differ),
    };
    return cmocka_run_group_tests_name("rng", tests, NULL, NULL);
}
