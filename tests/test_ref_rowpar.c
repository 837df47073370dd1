/* test_ref_rowpar.c — row-parallel linear with the rank-ordered reduction (ref/rowpar.h).
 *
 * What is asserted, on seeded F32 weights [rows, cols] and inputs at scales 1e-2, 1, 30 for
 * rows 1, 5, 17, cols 48 and 96, M = 1, 3 inputs with a row stride larger than cols:
 * - every rank's partial (tp_size 1, 2, 3, 4) and the tp_rank=all reduction bit for bit
 *   against a naive loop written here: per rank acc = +0, ascending shard columns,
 *   fl32(acc + fl32(w x)), rounded to act_dtype (fp32, fp16, bf16 with this file's own RNE
 *   rounding formulas); all = fl32 sums p0 + p1 + ... in rank order, rounded again;
 * - accuracy: tp_rank=all with fp32 against an exact double dot product: |y - exact| <=
 *   (cols + T) 2^-24 sum |w x|;
 * - outputs poisoned with NaN are fully written, and elements outside the output rows (the
 *   row stride's gap) are not touched;
 * - 1 and 3 threads give identical bits;
 * - errors: tp_size that does not divide cols (TD_ERR_RANGE naming tp_size), tp_rank out of
 *   range (TD_ERR_ARG), an NVFP4 weight whose shards are not 16-column blocks (TD_ERR_RANGE)
 *   — ref_rowpar_check refuses the same cases.
 */
#include "test_common.h"
#include "formats.h"
#include "rng.h"
#include "ref/rowpar.h"

#include <math.h>

/* RNE rounding to a float format with `mant` explicit mantissa bits and minimum normal
 * exponent emin, computed in double (overflow to infinity above `max`). */
static float t_round(float v, int mant, int emin, double max)
{
    if (!isfinite(v) || v == 0.0f) return v;
    const double a = fabs((double)v);
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
    int q = e - 1 - mant;
    if (e - 1 < emin) q = emin - mant;
    const double step = ldexp(1.0, q);
    double r = nearbyint(a / step) * step; /* default rounding mode: to nearest even */
    if (r > max) r = INFINITY;
    return (float)(v < 0 ? -r : r);
}

static float t_act(float v, td_act_dtype act)
{
    switch (act) {
    case TD_ACT_FP16: return t_round(v, 10, -14, 65504.0);
    case TD_ACT_BF16: return t_round(v, 7, -126, 3.3895313892515355e38);
    default: return v;
    }
}

static void naive(const float *W, int64_t rows, int64_t cols, const float *x, int64_t xs, int64_t m, int T,
                  int rank, td_act_dtype act, float *y, int64_t ys)
{
    const int64_t cl = cols / T;
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < rows; r++) {
            float sum = 0.0f;
            for (int k = 0; k < T; k++) {
                if (rank != TD_TP_RANK_ALL && k != rank) continue;
                float acc = 0.0f;
                for (int64_t c = k * cl; c < (k + 1) * cl; c++) acc = acc + W[r * cols + c] * x[i * xs + c];
                acc = t_act(acc, act);
                sum = (rank != TD_TP_RANK_ALL || k == 0) ? acc : sum + acc;
            }
            y[i * ys + r] = rank == TD_TP_RANK_ALL ? t_act(sum, act) : sum;
        }
}

static bool same(float a, float b)
{
    return (isnan(a) && isnan(b)) || td_f32_bits(a) == td_f32_bits(b);
}

static void rowpar_matches_naive(void **state)
{
    (void)state;
    ref_pool *p1 = NULL, *p3 = NULL;
    td_err err = {0};
    assert_int_equal(ref_pool_new(1, &p1, &err), TD_OK);
    assert_int_equal(ref_pool_new(3, &p3, &err), TD_OK);
    ref_mm_ws ws1 = {0}, ws3 = {0};
    const ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    static const int64_t rowss[] = {1, 5, 17}, colss[] = {48, 96}, ms[] = {1, 3};
    static const double scales[] = {1e-2, 1.0, 30.0};
    td_rng rng;
    td_rng_seed(&rng, 4242);
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t c = 0; c < 2; c++)
                for (size_t d = 0; d < 3; d++) {
                    const int64_t rows = rowss[a], cols = colss[b], m = ms[c], xs = cols + 5, ys = rows + 3;
                    float *W = malloc((size_t)(rows * cols) * sizeof *W), *x = malloc((size_t)(m * xs) * sizeof *x);
                    float *y = malloc((size_t)(m * ys) * sizeof *y), *y3 = malloc((size_t)(m * ys) * sizeof *y);
                    float *want = malloc((size_t)(m * ys) * sizeof *y), *part = malloc((size_t)(m * ys) * sizeof *y);
                    assert_true(W && x && y && y3 && want && part);
                    for (int64_t i = 0; i < rows * cols; i++) W[i] = td_rng_normal_f32(&rng) / sqrtf((float)cols);
                    for (int64_t i = 0; i < m * xs; i++) x[i] = (float)(scales[d] * td_rng_normal(&rng));
                    ref_linear l;
                    ref_linear_dense(&l, TD_F32, rows, cols, W);
                    assert_int_equal(ref_mm_reserve(&ws1, 1, m, cols, &err), TD_OK);
                    assert_int_equal(ref_mm_reserve(&ws3, 3, m, cols, &err), TD_OK);
                    for (int T = 1; T <= 4; T++)
                        for (int rank = -1; rank < T; rank++)
                            for (int act = 0; act < TD_ACT_COUNT; act++) {
                                const ref_rowpar rp = {T, rank < 0 ? TD_TP_RANK_ALL : rank, (td_act_dtype)act};
                                for (int64_t i = 0; i < m * ys; i++) y[i] = y3[i] = want[i] = NAN;
                                naive(W, rows, cols, x, xs, m, T, rp.tp_rank, rp.act, want, ys);
                                assert_int_equal(ref_mm_rowpar(&l, &nx, &rp, p1, &ws1, x, xs, m, y, ys, part, &err),
                                                 TD_OK);
                                assert_int_equal(ref_mm_rowpar(&l, &nx, &rp, p3, &ws3, x, xs, m, y3, ys, part, &err),
                                                 TD_OK);
                                for (int64_t i = 0; i < m; i++)
                                    for (int64_t r = 0; r < ys; r++) {
                                        const int64_t k = i * ys + r;
                                        if (r >= rows) {
                                            assert_true(isnan(y[k]) && isnan(y3[k]));
                                            continue;
                                        }
                                        assert_true(isfinite(y[k]));
                                        if (!same(y[k], want[k]) || !same(y3[k], want[k]))
                                            fail_msg("rows %lld cols %lld m %lld T %d rank %d act %d: %a %a want %a",
                                                     (long long)rows, (long long)cols, (long long)m, T, rank, act,
                                                     (double)y[k], (double)y3[k], (double)want[k]);
                                        if (rank < 0 && act == TD_ACT_FP32) {
                                            double ex = 0, ab = 0;
                                            for (int64_t cc = 0; cc < cols; cc++) {
                                                const double pr = (double)W[r * cols + cc] * (double)x[i * xs + cc];
                                                ex += pr;
                                                ab += fabs(pr);
                                            }
                                            assert_true(fabs((double)y[k] - ex) <=
                                                        (double)(cols + T) * ldexp(1.0, -24) * ab + 1e-30);
                                        }
                                    }
                            }
                    free(W);
                    free(x);
                    free(y);
                    free(y3);
                    free(want);
                    free(part);
                }
    ref_mm_free(&ws1);
    ref_mm_free(&ws3);
    ref_pool_free(p1);
    ref_pool_free(p3);
}

static void rowpar_errors(void **state)
{
    (void)state;
    float W[4 * 48] = {0}, x[48] = {0}, y[4];
    ref_linear l;
    ref_linear_dense(&l, TD_F32, 4, 48, W);
    ref_pool *p = NULL;
    td_err err = {0};
    assert_int_equal(ref_pool_new(1, &p, &err), TD_OK);
    ref_mm_ws ws = {0};
    assert_int_equal(ref_mm_reserve(&ws, 1, 1, 48, &err), TD_OK);
    const ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    ref_rowpar rp = {5, 0, TD_ACT_FP32};
    assert_int_equal(ref_rowpar_check(&l, &rp, &err), TD_ERR_RANGE);
    assert_int_equal(ref_mm_rowpar(&l, &nx, &rp, p, &ws, x, 48, 1, y, 4, NULL, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "tp_size 5"));
    rp = (ref_rowpar){2, 2, TD_ACT_FP32};
    assert_int_equal(ref_mm_rowpar(&l, &nx, &rp, p, &ws, x, 48, 1, y, 4, NULL, &err), TD_ERR_ARG);
    /* NVFP4: 48 columns in 3 blocks; tp_size 2 cuts a block */
    uint8_t packed[4 * 24] = {0}, sc[4 * 3] = {0};
    ref_linear q;
    ref_linear_nvfp4(&q, TD_NVFP4_MODELOPT, 4, 48, packed, sc, 1.0f);
    rp = (ref_rowpar){2, TD_TP_RANK_ALL, TD_ACT_FP32};
    assert_int_equal(ref_rowpar_check(&q, &rp, &err), TD_ERR_RANGE);
    rp.tp_size = 3;
    assert_int_equal(ref_rowpar_check(&q, &rp, &err), TD_OK);
    ref_mm_free(&ws);
    ref_pool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rowpar_matches_naive),
        cmocka_unit_test(rowpar_errors),
    };
    return cmocka_run_group_tests_name("ref_rowpar", tests, NULL, NULL);
}
