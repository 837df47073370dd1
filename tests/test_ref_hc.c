/* test_ref_hc.c — hyper-connection mix / combine and the grouped norm (ref/hc.h).
 *
 * What is asserted, for shapes (hidden 8, 4 streams, rank 3), (hidden 33, 4 streams, rank 5)
 * and (hidden 16, 2 streams, rank 7), F32 weights, inputs at scales 1e-2, 1 and 30:
 * - ref_hc_mix against a naive double version written here from MODEL_SPEC.md B3.2 (grouped
 *   zero-centred norm, silu(down Xn / hc), sigmoid(up d), mean over streams of gate * Xn,
 *   2 sigmoid(inject Xn / hc)): max |err| <= 1e-5 * max |exact| (+1e-30) for xin and inj;
 * - the final-mixer form (no inject weight) gives the same xin and leaves inj untouched;
 * - outputs poisoned with NaN are fully written; 1 and 3 threads give identical bits;
 * - ref_hc_combine against X + inj_s * y in double (<= 2e-7 (|X| + |inj_s y|), two roundings);
 * - the grouped norm normalises each group on its own: scaling one group by 1000 leaves the
 *   other groups' outputs bit-identical.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/hc.h"

#include <math.h>

typedef struct shape {
    int64_t H, hc, r;
} shape;

static float *rnd(td_rng *r, int64_t n, float sc)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = td_rng_normal_f32(r) * sc;
    return p;
}

static double dsig(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

static void naive(shape s, const float *nw, const float *wd, const float *wu, const float *wi, const float *X,
                  double *xin, double *inj)
{
    const int64_t P = s.hc * s.H;
    double *xn = malloc((size_t)P * sizeof *xn), *d = malloc((size_t)s.r * sizeof *d);
    assert_non_null(xn);
    assert_non_null(d);
    for (int64_t g = 0; g < s.hc; g++) {
        double ss = 0;
        for (int64_t i = 0; i < s.H; i++) ss += (double)X[g * s.H + i] * (double)X[g * s.H + i];
        const double inv = 1.0 / sqrt(ss / (double)s.H + 1e-6);
        for (int64_t i = 0; i < s.H; i++) xn[g * s.H + i] = (double)X[g * s.H + i] * inv * (1.0 + (double)nw[g * s.H + i]);
    }
    for (int64_t j = 0; j < s.r; j++) {
        double a = 0;
        for (int64_t c = 0; c < P; c++) a += (double)wd[j * P + c] * xn[c];
        a /= (double)s.hc;
        d[j] = a * dsig(a);
    }
    for (int64_t i = 0; i < s.H; i++) {
        double acc = 0;
        for (int64_t g = 0; g < s.hc; g++) {
            double u = 0;
            for (int64_t j = 0; j < s.r; j++) u += (double)wu[(g * s.H + i) * s.r + j] * d[j];
            acc += dsig(u) * xn[g * s.H + i];
        }
        xin[i] = acc / (double)s.hc;
    }
    for (int64_t g = 0; g < s.hc; g++) {
        double a = 0;
        for (int64_t c = 0; c < P; c++) a += (double)wi[g * P + c] * xn[c];
        inj[g] = 2.0 * dsig(a / (double)s.hc);
    }
    free(xn);
    free(d);
}

static void check(const float *got, const double *want, int64_t n, double tol)
{
    double mx = 1e-30, err = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(got[i]));
        mx = fmax(mx, fabs(want[i]));
        err = fmax(err, fabs((double)got[i] - want[i]));
    }
    if (err > tol * mx) fprintf(stderr, "err %g max %g\n", err, mx);
    assert_true(err <= tol * mx);
}

static void hc_mix_vs_double(void **state)
{
    (void)state;
    static const shape shapes[3] = {{8, 4, 3}, {33, 4, 5}, {16, 2, 7}};
    static const float scales[3] = {1e-2f, 1.0f, 30.0f};
    td_err err = {0};
    ref_pool *p1 = NULL, *p3 = NULL;
    assert_int_equal(ref_pool_new(1, &p1, &err), TD_OK);
    assert_int_equal(ref_pool_new(3, &p3, &err), TD_OK);
    const ref_numerics nx = {0};
    for (int si = 0; si < 3; si++) {
        const shape s = shapes[si];
        const int64_t P = s.hc * s.H, M = 5;
        td_rng r;
        td_rng_seed(&r, 100 + (uint64_t)si);
        float *nw = rnd(&r, P, 0.2f), *wd = rnd(&r, s.r * P, 1.0f / sqrtf((float)P));
        float *wu = rnd(&r, P * s.r, 1.0f / sqrtf((float)s.r)), *wi = rnd(&r, s.hc * P, 1.0f / sqrtf((float)P));
        ref_hc_weights w = {.norm = nw, .has_inject = true};
        ref_linear_dense(&w.down, TD_F32, s.r, P, wd);
        ref_linear_dense(&w.up, TD_F32, P, s.r, wu);
        ref_linear_dense(&w.inject, TD_F32, s.hc, P, wi);
        const ref_hc_dims d = {s.H, s.hc, s.r, 1e-6f};
        for (int sc = 0; sc < 3; sc++) {
            float *X = rnd(&r, M * P, scales[sc]);
            float *xin = malloc((size_t)(M * s.H) * sizeof *xin), *inj = malloc((size_t)(M * s.hc) * sizeof *inj);
            float *xin3 = malloc((size_t)(M * s.H) * sizeof *xin3), *inj3 = malloc((size_t)(M * s.hc) * sizeof *inj3);
            for (int64_t i = 0; i < M * s.H; i++) xin[i] = xin3[i] = NAN;
            for (int64_t i = 0; i < M * s.hc; i++) inj[i] = inj3[i] = NAN;
            ref_hc_ws ws = {0};
            assert_int_equal(ref_hc_mix(&w, &d, &nx, p1, &ws, X, M, xin, inj, &err), TD_OK);
            assert_int_equal(ref_hc_mix(&w, &d, &nx, p3, &ws, X, M, xin3, inj3, &err), TD_OK);
            assert_memory_equal(xin, xin3, (size_t)(M * s.H) * sizeof *xin);
            assert_memory_equal(inj, inj3, (size_t)(M * s.hc) * sizeof *inj);
            double *dx = malloc((size_t)s.H * sizeof *dx), di[8];
            for (int64_t t = 0; t < M; t++) {
                naive(s, nw, wd, wu, wi, X + t * P, dx, di);
                check(xin + t * s.H, dx, s.H, 1e-5);
                check(inj + t * s.hc, di, s.hc, 1e-5);
            }
            /* the final-mixer form: same xin, inj untouched */
            ref_hc_weights wf = w;
            wf.has_inject = false;
            for (int64_t i = 0; i < M * s.H; i++) xin3[i] = NAN;
            for (int64_t i = 0; i < M * s.hc; i++) inj3[i] = -7.0f;
            assert_int_equal(ref_hc_mix(&wf, &d, &nx, p3, &ws, X, M, xin3, inj3, &err), TD_OK);
            assert_memory_equal(xin, xin3, (size_t)(M * s.H) * sizeof *xin);
            for (int64_t i = 0; i < M * s.hc; i++) assert_true(inj3[i] == -7.0f);
            /* combine */
            float *y = rnd(&r, M * s.H, 1.0f), *Xc = malloc((size_t)(M * P) * sizeof *Xc);
            memcpy(Xc, X, (size_t)(M * P) * sizeof *Xc);
            ref_hc_combine(&d, Xc, y, inj, M);
            for (int64_t t = 0; t < M; t++)
                for (int64_t g = 0; g < s.hc; g++)
                    for (int64_t i = 0; i < s.H; i++) {
                        const double want = (double)X[t * P + g * s.H + i] + (double)inj[t * s.hc + g] * (double)y[t * s.H + i];
                        const double mag = fabs((double)X[t * P + g * s.H + i]) +
                                           fabs((double)inj[t * s.hc + g] * (double)y[t * s.H + i]);
                        assert_true(fabs((double)Xc[t * P + g * s.H + i] - want) <= 2e-7 * mag + 1e-30);
                    }
            free(y);
            free(Xc);
            free(dx);
            ref_hc_ws_free(&ws);
            free(X);
            free(xin);
            free(inj);
            free(xin3);
            free(inj3);
        }
        free(nw);
        free(wd);
        free(wu);
        free(wi);
    }
    ref_pool_free(p1);
    ref_pool_free(p3);
}

static void grouped_norm_groups_independent(void **state)
{
    (void)state;
    td_rng r;
    td_rng_seed(&r, 5);
    float *x = rnd(&r, 4 * 10, 1.0f), *w = rnd(&r, 40, 0.1f), y1[40], y2[40];
    ref_rmsnorm_zc_grouped(x, 4, 10, w, 1e-6f, y1);
    for (int i = 10; i < 20; i++) x[i] *= 1000.0f;
    ref_rmsnorm_zc_grouped(x, 4, 10, w, 1e-6f, y2);
    assert_memory_equal(y1, y2, 10 * sizeof *y1);
    assert_memory_equal(y1 + 20, y2 + 20, 20 * sizeof *y1);
    for (int i = 10; i < 20; i++) assert_true(fabsf(y1[i] - y2[i]) <= 1e-5f * fabsf(y1[i]) + 1e-6f);
    free(x);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hc_mix_vs_double),
        cmocka_unit_test(grouped_norm_groups_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
