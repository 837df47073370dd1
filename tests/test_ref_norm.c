/* test_ref_norm.c — reference normalizations (ref/norm.h).
 *
 * What is asserted:
 * - zero-centred RMSNorm, gated RMSNorm (silu gate, plain weight) and L2 normalization against
 *   naive double-precision versions written here, on seeded inputs at scales 1e-3, 1 and 1e3
 *   and lengths 1, 7, 128, 2048: |y - exact| <= 1e-5 * max |exact| + tiny;
 * - bit-exact agreement with this file's float32 transcription of the documented order;
 * - edge values: all-zero input gives 0 (eps keeps the result finite), zero weight gives
 *   x / rms for the zero-centred norm and 0 for the gated one, NaN propagates, in-place works;
 * - eps placement: RMSNorm adds eps to the mean, L2 adds it to the sum (checked on a constant
 *   vector where the two differ);
 * - softplus threshold 20: softplus(20.5) == 20.5 exactly, softplus(20) = log1p(exp(20)),
 *   softplus(-100) = exp(-100) rounded, softplus(0) = log 2.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/norm.h"

#include <float.h>
#include <math.h>

static double d_silu(double z)
{
    return z / (1.0 + exp(-z));
}

static void fill(td_rng *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = td_rng_normal_f32(r) * scale;
}

static void check_close(const float *y, const double *ex, int64_t n)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ex[i]));
    for (int64_t i = 0; i < n; i++) {
        if (!(fabs((double)y[i] - ex[i]) <= 1e-5 * mx + 1e-30)) {
            fprintf(stderr, "i=%lld y=%.9g exact=%.9g max=%.3g\n", (long long)i, (double)y[i], ex[i], mx);
            fail();
        }
    }
}

static void norm_seeded_inputs_match_double(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 11);
    static const int64_t ns[4] = {1, 7, 128, 2048};
    static const float scales[3] = {1e-3f, 1.0f, 1e3f};
    float *x = malloc(2048 * sizeof *x), *z = malloc(2048 * sizeof *z), *w = malloc(2048 * sizeof *w);
    float *y = malloc(2048 * sizeof *y);
    double *ex = malloc(2048 * sizeof *ex);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++) {
            const int64_t n = ns[a];
            fill(&rng, x, n, scales[b]);
            fill(&rng, z, n, 2.0f);
            fill(&rng, w, n, 0.1f);
            const float eps = 1e-6f;
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
            const double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
            for (int64_t i = 0; i < n; i++) y[i] = NAN;
            ref_rmsnorm_zc(x, n, w, eps, y);
            for (int64_t i = 0; i < n; i++) ex[i] = (double)x[i] * inv * (1.0 + (double)w[i]);
            check_close(y, ex, n);
            /* float32 transcription of the documented order: bit for bit */
            float fs = 0.0f;
            for (int64_t i = 0; i < n; i++) fs = fs + x[i] * x[i];
            const float finv = (float)(1.0 / sqrt((double)(fs / (float)n + eps)));
            for (int64_t i = 0; i < n; i++) assert_true(y[i] == (x[i] * finv) * (1.0f + w[i]));

            for (int64_t i = 0; i < n; i++) y[i] = NAN;
            ref_rmsnorm_gated(x, z, n, w, eps, y);
            for (int64_t i = 0; i < n; i++) ex[i] = (double)x[i] * inv * (double)w[i] * d_silu((double)z[i]);
            check_close(y, ex, n);

            for (int64_t i = 0; i < n; i++) y[i] = NAN;
            ref_l2norm(x, n, eps, y);
            const double linv = 1.0 / sqrt(ss + (double)eps);
            for (int64_t i = 0; i < n; i++) ex[i] = (double)x[i] * linv;
            check_close(y, ex, n);
            /* in place gives the same */
            memcpy(z, x, (size_t)n * sizeof *x);
            ref_l2norm(z, n, eps, z);
            assert_memory_equal(z, y, (size_t)n * sizeof *y);
        }
    free(x);
    free(z);
    free(w);
    free(y);
    free(ex);
}

static void norm_edge_values_exact(void **state)
{
    (void)state;
    float x[4] = {0, 0, 0, 0}, w[4] = {0, 0, 0, 0}, z[4] = {1, 1, 1, 1}, y[4];
    ref_rmsnorm_zc(x, 4, w, 1e-6f, y);
    for (int i = 0; i < 4; i++) assert_true(y[i] == 0.0f);
    ref_l2norm(x, 4, 1e-6f, y);
    for (int i = 0; i < 4; i++) assert_true(y[i] == 0.0f);
    /* constant vector c: RMS norm gives c / sqrt(c^2 + eps), L2 gives c / sqrt(4 c^2 + eps) */
    const float c = 1e-3f;
    for (int i = 0; i < 4; i++) x[i] = c;
    ref_rmsnorm_zc(x, 4, w, 1e-6f, y);
    assert_true(fabs((double)y[0] - (double)c / sqrt((double)c * (double)c + 1e-6)) < 1e-6);
    ref_l2norm(x, 4, 1e-6f, y);
    assert_true(fabs((double)y[0] - (double)c / sqrt(4.0 * (double)c * (double)c + 1e-6)) < 1e-6);
    ref_rmsnorm_gated(x, z, 4, w, 1e-6f, y); /* weight 0: output 0 (plain multiplier) */
    for (int i = 0; i < 4; i++) assert_true(y[i] == 0.0f);
    x[2] = NAN;
    ref_rmsnorm_zc(x, 4, w, 1e-6f, y);
    assert_true(isnan(y[0]) && isnan(y[3]));
    /* huge values: the double sqrt keeps FLT_MAX-scale inputs finite only when ss is finite */
    float big[2] = {1e18f, -1e18f};
    float wb[2] = {0, 0}, yb[2];
    ref_rmsnorm_zc(big, 2, wb, 1e-6f, yb);
    assert_true(fabs((double)yb[0] - 1.0) < 1e-6 && fabs((double)yb[1] + 1.0) < 1e-6);
}

static void softplus_threshold_20(void **state)
{
    (void)state;
    assert_true(ref_softplus(20.5f) == 20.5f);
    assert_true(ref_softplus(1e30f) == 1e30f);
    assert_true(ref_softplus(20.0f) == (float)log1p(exp(20.0)));
    assert_true(ref_softplus(-100.0f) == (float)exp(-100.0));
    assert_true(ref_softplus(0.0f) == (float)log(2.0));
    assert_true(ref_softplus(-1e30f) == 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(norm_seeded_inputs_match_double),
        cmocka_unit_test(norm_edge_values_exact),
        cmocka_unit_test(softplus_threshold_20),
    };
    return cmocka_run_group_tests_name("ref_norm", tests, NULL, NULL);
}
