/* test_metrics.c — comparison metrics and verdicts (audit/metrics).
 *
 * What is asserted:
 * - identical tensors: exact, 0 mismatches, max_abs/rel_l2/nmse 0, cosine 1, max_ulp 0,
 *   first_diff -1; empty tensors are exact;
 * - hand-computed single differences: max_abs, rel_l2, nmse, ULP distance (1 ULP via the next
 *   float, FP16 2^-10 and BF16 2^-7 steps), first_diff and the values there;
 * - signed zero: +0 vs -0 is a mismatch (not bitwise equal) at 0 ULP and 0 max_abs;
 * - NaN is never equal or close: a NaN on either side (even with identical bits) is a
 *   mismatch, non-finite, max_ulp unknown (-1), rel_l2 +inf, and fails both expectations;
 *   the same infinity on both sides is equal but not finite (fails); inf vs a number gives
 *   max_abs +inf;
 * - ULP distance across zero and up to infinity;
 * - rel_l2 floors at ||b|| = 1e-12; cosine of orthogonal, opposite and zero vectors;
 * - on seeded random tensors at several scales, rel_l2, nmse, cosine and max_abs equal an
 *   independent double-precision computation written here;
 * - verdicts: exact needs bitwise + finite; bounded passes at the bound and fails above it;
 *   the dtype bounds 1e-5 / 2e-3 / 1e-2;
 * - int32 comparisons (route ids).
 */
#include "test_common.h"
#include "audit/metrics.h"
#include "formats.h"
#include "rng.h"

#include <float.h>
#include <math.h>

static void metrics_identical(void **state)
{
    (void)state;
    float a[5] = {1.0f, -2.0f, 0.0f, 3.5e-40f, 1e30f};
    td_metrics m;
    td_metrics_f32(a, a, 5, TD_F32, &m);
    assert_true(m.exact && m.finite && m.finite_a && m.finite_b);
    assert_int_equal(m.mismatches, 0);
    assert_int_equal(m.first_diff, -1);
    assert_true(m.max_abs == 0.0 && m.rel_l2 == 0.0 && m.nmse == 0.0);
    assert_true(fabs(m.cosine - 1.0) < 1e-15);
    assert_int_equal(m.max_ulp, 0);
    assert_true(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
    td_metrics_f32(NULL, NULL, 0, TD_F32, &m);
    assert_true(m.exact && m.finite);
    assert_true(m.cosine == 1.0);
}

static void metrics_single_difference(void **state)
{
    (void)state;
    float a[4] = {3.0f, 4.0f, 0.0f, 1.0f}, b[4] = {3.0f, 4.0f, 0.0f, 1.0f};
    a[3] = nextafterf(1.0f, 2.0f); /* 1 + 2^-23 */
    td_metrics m;
    td_metrics_f32(a, b, 4, TD_F32, &m);
    assert_false(m.exact);
    assert_int_equal(m.mismatches, 1);
    assert_int_equal(m.first_diff, 3);
    assert_true(m.first_a == (double)a[3] && m.first_b == 1.0);
    assert_true(m.max_abs == 0x1p-23);
    assert_int_equal(m.max_ulp, 1);
    /* ||b|| = sqrt(9 + 16 + 1) */
    assert_true(fabs(m.rel_l2 - 0x1p-23 / sqrt(26.0)) < 1e-22);
    assert_true(fabs(m.nmse - 0x1p-46 / 26.0) < 1e-30);
    assert_true(m.finite);
    assert_false(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
    assert_true(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e-5));

    /* the same pair judged in FP16 and BF16: one step of those formats */
    float c = 1.0f + 0x1p-10f, d = 1.0f + 0x1p-7f, one = 1.0f;
    td_metrics_f32(&c, &one, 1, TD_F16, &m);
    assert_int_equal(m.max_ulp, 1);
    td_metrics_f32(&d, &one, 1, TD_BF16, &m);
    assert_int_equal(m.max_ulp, 1);
    td_metrics_f32(&c, &one, 1, TD_F32, &m);
    assert_int_equal(m.max_ulp, 1 << 13);
}

static void metrics_signed_zero(void **state)
{
    (void)state;
    float a = 0.0f, b = -0.0f;
    td_metrics m;
    td_metrics_f32(&a, &b, 1, TD_F32, &m);
    assert_false(m.exact);
    assert_int_equal(m.mismatches, 1);
    assert_int_equal(m.max_ulp, 0);
    assert_true(m.max_abs == 0.0);
    assert_true(m.finite);
    assert_false(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
    assert_true(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e-5));
}

static void metrics_nan_never_close(void **state)
{
    (void)state;
    float a[3] = {1.0f, NAN, 2.0f}, b[3] = {1.0f, NAN, 2.0f};
    td_metrics m;
    /* identical bits, still never equal */
    td_metrics_f32(a, b, 3, TD_F32, &m);
    assert_false(m.exact);
    assert_int_equal(m.mismatches, 1);
    assert_int_equal(m.first_diff, 1);
    assert_false(m.finite);
    assert_false(m.finite_a);
    assert_int_equal(m.nan_a, 1);
    assert_int_equal(m.nan_b, 1);
    assert_int_equal(m.max_ulp, -1);
    assert_true(isinf(m.rel_l2) && isinf(m.max_abs) && isinf(m.nmse));
    assert_true(isnan(m.cosine));
    assert_false(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
    assert_false(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e30));
    /* NaN on one side only */
    b[1] = 5.0f;
    td_metrics_f32(a, b, 3, TD_BF16, &m);
    assert_false(m.finite_a);
    assert_true(m.finite_b);
    assert_int_equal(m.max_ulp, -1);
    assert_false(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e30));
}

static void metrics_infinities(void **state)
{
    (void)state;
    float a[2] = {INFINITY, 1.0f}, b[2] = {INFINITY, 1.0f};
    td_metrics m;
    td_metrics_f32(a, b, 2, TD_F32, &m);
    assert_true(m.exact);            /* same bits, no NaN */
    assert_false(m.finite);
    assert_int_equal(m.inf_a, 1);
    assert_true(m.max_abs == 0.0);
    assert_false(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN)); /* exact but not finite */
    b[0] = FLT_MAX;
    td_metrics_f32(a, b, 2, TD_F32, &m);
    assert_true(isinf(m.max_abs) && isinf(m.rel_l2));
    assert_int_equal(m.max_ulp, 1); /* inf is one step beyond FLT_MAX */
    assert_int_equal(td_ulp_distance(INFINITY, -INFINITY, TD_F32), 2 * (int64_t)0x7F800000);
}

static void metrics_ulp_across_zero(void **state)
{
    (void)state;
    assert_int_equal(td_ulp_distance(0x1p-149f, -0x1p-149f, TD_F32), 2);
    assert_int_equal(td_ulp_distance(0.0f, -0.0f, TD_F32), 0);
    assert_int_equal(td_ulp_distance(0x1p-24f, -0x1p-24f, TD_F16), 2);
    assert_int_equal(td_ulp_distance(65504.0f, INFINITY, TD_F16), 1);
    assert_int_equal(td_ulp_distance(1.0f, 2.0f, TD_BF16), 128);
    assert_int_equal(td_ulp_distance(NAN, 1.0f, TD_F32), -1);
}

static void metrics_floors_and_cosine(void **state)
{
    (void)state;
    float a[2] = {1e-6f, 0.0f}, z[2] = {0.0f, 0.0f};
    td_metrics m;
    td_metrics_f32(a, z, 2, TD_F32, &m);
    assert_true(fabs(m.rel_l2 - (double)1e-6f / 1e-12) < 1e-3);
    assert_true(m.cosine == 0.0);
    td_metrics_f32(z, z, 2, TD_F32, &m);
    assert_true(m.cosine == 1.0);
    float x[2] = {1.0f, 0.0f}, y[2] = {0.0f, 1.0f}, nx[2] = {-1.0f, -0.0f};
    td_metrics_f32(x, y, 2, TD_F32, &m);
    assert_true(fabs(m.cosine) < 1e-15);
    td_metrics_f32(x, nx, 2, TD_F32, &m);
    assert_true(fabs(m.cosine + 1.0) < 1e-15);
    assert_true(m.max_abs == 2.0);
}

static void metrics_random_vs_double(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 21);
    static const double scales[] = {1e-6, 1e-2, 1.0, 1e4};
    enum { N = 3001 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    assert_true(a && b);
    for (size_t s = 0; s < 4; s++) {
        for (int i = 0; i < N; i++) {
            b[i] = (float)(scales[s] * td_rng_normal(&rng));
            a[i] = td_rng_below(&rng, 3) ? b[i] : (float)((double)b[i] * (1.0 + 1e-4 * td_rng_normal(&rng)));
        }
        double d2 = 0, b2 = 0, a2 = 0, ab = 0, mx = 0;
        int64_t mism = 0, first = -1;
        for (int i = 0; i < N; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            if (td_f32_bits(a[i]) != td_f32_bits(b[i])) {
                if (first < 0) first = i;
                mism++;
            }
            d2 += d * d;
            b2 += (double)b[i] * (double)b[i];
            a2 += (double)a[i] * (double)a[i];
            ab += (double)a[i] * (double)b[i];
            if (d > mx) mx = d;
        }
        td_metrics m;
        td_metrics_f32(a, b, N, TD_F32, &m);
        assert_int_equal(m.mismatches, mism);
        assert_int_equal(m.first_diff, first);
        assert_true(m.max_abs == mx);
        assert_true(fabs(m.rel_l2 - sqrt(d2) / sqrt(b2)) <= 1e-12 * m.rel_l2);
        assert_true(fabs(m.nmse - d2 / b2) <= 1e-12 * m.nmse);
        assert_true(fabs(m.cosine - ab / (sqrt(a2) * sqrt(b2))) < 1e-12);
        assert_true(m.rel_l2 < 2e-4 && m.rel_l2 > 1e-6);
        assert_true(td_metrics_pass(&m, TD_EXPECT_BOUNDED, td_metrics_bound(TD_F16)));
        assert_false(td_metrics_pass(&m, TD_EXPECT_BOUNDED, td_metrics_bound(TD_F32)));
    }
    free(a);
    free(b);
}

static void metrics_verdicts_and_bounds(void **state)
{
    (void)state;
    assert_true(td_metrics_bound(TD_F32) == 1e-5);
    assert_true(td_metrics_bound(TD_F16) == 2e-3);
    assert_true(td_metrics_bound(TD_BF16) == 1e-2);
    assert_string_equal(td_expect_name(TD_EXPECT_EXACT), "exact");
    assert_string_equal(td_expect_name(TD_EXPECT_BOUNDED), "bounded");
    assert_null(td_expect_name(TD_EXPECT_COUNT));
    td_metrics m;
    memset(&m, 0, sizeof m);
    m.finite = true;
    m.rel_l2 = 1e-5;
    assert_true(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e-5));  /* at the bound */
    m.rel_l2 = nextafter(1e-5, 1.0);
    assert_false(td_metrics_pass(&m, TD_EXPECT_BOUNDED, 1e-5)); /* above it */
    m.exact = true;
    m.rel_l2 = 0.0;
    assert_true(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
    m.finite = false;
    assert_false(td_metrics_pass(&m, TD_EXPECT_EXACT, NAN));
}

static void metrics_int32(void **state)
{
    (void)state;
    int32_t a[4] = {5, 1, 7, 9}, b[4] = {5, 1, 9, 9};
    td_metrics m;
    td_metrics_i32(a, b, 4, &m);
    assert_int_equal(m.dtype, TD_I32);
    assert_false(m.exact);
    assert_int_equal(m.mismatches, 1);
    assert_int_equal(m.first_diff, 2);
    assert_int_equal(m.max_ulp, 2);
    assert_true(m.max_abs == 2.0);
    assert_true(m.finite);
    td_metrics_i32(a, a, 4, &m);
    assert_true(m.exact && m.max_ulp == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(metrics_identical),
        cmocka_unit_test(metrics_single_difference),
        cmocka_unit_test(metrics_signed_zero),
        cmocka_unit_test(metrics_nan_never_close),
        cmocka_unit_test(metrics_infinities),
        cmocka_unit_test(metrics_ulp_across_zero),
        cmocka_unit_test(metrics_floors_and_cosine),
        cmocka_unit_test(metrics_random_vs_double),
        cmocka_unit_test(metrics_verdicts_and_bounds),
        cmocka_unit_test(metrics_int32),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
