/* test_ref_attn.c — reference gated full attention (ref/attn.h).
 *
 * What is asserted, for two shapes (4 query heads / 2 KV heads / head_dim 16 / rotary 8, and
 * an odd one: 3 query heads / 1 KV head / head_dim 12 / rotary 4), F32 weights:
 * - against a naive double-precision version written here (interleaved query/gate rows per
 *   head, zero-centred q/k norms, half-split partial RoPE, GQA head h -> h / group, causal
 *   softmax with 1/sqrt(head_dim), sigmoid output gate, o_proj), inputs at scales 1e-2, 1,
 *   30: max |y - exact| <= 2e-5 * max |exact|;
 * - outputs poisoned with NaN beforehand are fully written;
 * - prefill of n tokens then one more token through the cache equals, bit for bit, the last
 *   row of a prefill of n + 1 tokens, and the caches hold identical bits;
 * - 1 and 4 threads give identical bits.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/attn.h"

#include <math.h>

typedef struct shape {
    int64_t H, nh, kvh, hd, rot;
} shape;

typedef struct fix {
    shape s;
    float *wq, *wk, *wv, *wo, *qn, *kn;
    ref_attn_weights w;
    ref_attn_dims d;
} fix;

static float *rnd(td_rng *r, int64_t n, float sc)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = td_rng_normal_f32(r) * sc;
    return p;
}

static void fix_init(fix *f, shape s, uint64_t seed)
{
    td_rng r;
    td_rng_seed(&r, seed);
    f->s = s;
    const float ws = 1.0f / sqrtf((float)s.H);
    f->wq = rnd(&r, 2 * s.nh * s.hd * s.H, ws);
    f->wk = rnd(&r, s.kvh * s.hd * s.H, ws);
    f->wv = rnd(&r, s.kvh * s.hd * s.H, ws);
    f->wo = rnd(&r, s.H * s.nh * s.hd, 1.0f / sqrtf((float)(s.nh * s.hd)));
    f->qn = rnd(&r, s.hd, 0.2f);
    f->kn = rnd(&r, s.hd, 0.2f);
    ref_linear_dense(&f->w.q, TD_F32, 2 * s.nh * s.hd, s.H, f->wq);
    ref_linear_dense(&f->w.k, TD_F32, s.kvh * s.hd, s.H, f->wk);
    ref_linear_dense(&f->w.v, TD_F32, s.kvh * s.hd, s.H, f->wv);
    ref_linear_dense(&f->w.o, TD_F32, s.H, s.nh * s.hd, f->wo);
    f->w.q_norm = f->qn;
    f->w.k_norm = f->kn;
    f->d = (ref_attn_dims){s.H, s.nh, s.kvh, s.hd, s.rot, 1e4, 1e-6f};
}

static void fix_free(fix *f)
{
    free(f->wq);
    free(f->wk);
    free(f->wv);
    free(f->wo);
    free(f->qn);
    free(f->kn);
}

static void dmv(const float *W, int64_t rows, int64_t cols, const double *x, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double a = 0;
        for (int64_t c = 0; c < cols; c++) a += (double)W[r * cols + c] * x[c];
        y[r] = a;
    }
}

static void dnorm(double *x, int64_t n, const float *w)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / (double)n + 1e-6);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * inv * (1.0 + (double)w[i]);
}

static void drope(double *x, int64_t rot, int64_t p, double theta)
{
    const int64_t h = rot / 2;
    for (int64_t i = 0; i < h; i++) {
        const double a = (double)p * pow(theta, -2.0 * (double)i / (double)rot);
        const double x0 = x[i], x1 = x[i + h];
        x[i] = x0 * cos(a) - x1 * sin(a);
        x[i + h] = x1 * cos(a) + x0 * sin(a);
    }
}

/* Naive double attention over M tokens from position 0. */
static void naive(const fix *f, const float *x, int64_t M, double *out)
{
    const shape s = f->s;
    const int64_t Q = s.nh * s.hd, W = s.kvh * s.hd;
    double *xd = calloc((size_t)s.H, sizeof *xd), *qg = calloc((size_t)(M * 2 * Q), sizeof *qg);
    double *K = calloc((size_t)(M * W), sizeof *K), *Vv = calloc((size_t)(M * W), sizeof *Vv);
    double *o = calloc((size_t)Q, sizeof *o), *p = calloc((size_t)M, sizeof *p);
    for (int64_t t = 0; t < M; t++) {
        for (int64_t i = 0; i < s.H; i++) xd[i] = (double)x[t * s.H + i];
        dmv(f->wq, 2 * Q, s.H, xd, qg + t * 2 * Q);
        dmv(f->wk, W, s.H, xd, K + t * W);
        dmv(f->wv, W, s.H, xd, Vv + t * W);
        for (int64_t h = 0; h < s.nh; h++) {
            dnorm(qg + t * 2 * Q + h * 2 * s.hd, s.hd, f->qn);
            drope(qg + t * 2 * Q + h * 2 * s.hd, s.rot, t, 1e4);
        }
        for (int64_t j = 0; j < s.kvh; j++) {
            dnorm(K + t * W + j * s.hd, s.hd, f->kn);
            drope(K + t * W + j * s.hd, s.rot, t, 1e4);
        }
    }
    for (int64_t t = 0; t < M; t++) {
        for (int64_t h = 0; h < s.nh; h++) {
            const double *q = qg + t * 2 * Q + h * 2 * s.hd, *g = q + s.hd;
            const int64_t kv = h / (s.nh / s.kvh);
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= t; j++) {
                double a = 0;
                for (int64_t e = 0; e < s.hd; e++) a += q[e] * K[j * W + kv * s.hd + e];
                p[j] = a / sqrt((double)s.hd);
                mx = fmax(mx, p[j]);
            }
            for (int64_t j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t e = 0; e < s.hd; e++) {
                double a = 0;
                for (int64_t j = 0; j <= t; j++) a += p[j] / sum * Vv[j * W + kv * s.hd + e];
                o[h * s.hd + e] = a / (1.0 + exp(-g[e]));
            }
        }
        for (int64_t r = 0; r < s.H; r++) {
            double a = 0;
            for (int64_t c = 0; c < Q; c++) a += (double)f->wo[r * Q + c] * o[c];
            out[t * s.H + r] = a;
        }
    }
    free(xd);
    free(qg);
    free(K);
    free(Vv);
    free(o);
    free(p);
}

static const shape shapes[2] = {{48, 4, 2, 16, 8}, {36, 3, 1, 12, 4}};

static void run(const fix *f, ref_pool *pool, ref_kv *kv, const float *x, int64_t M, float *y)
{
    ref_attn_ws ws = {0};
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    td_err err = {0};
    assert_int_equal(ref_attn_run(&f->w, &f->d, &nx, &REF_ROWPAR_PLAIN, pool, &ws, kv, x, M, y, &err), TD_OK);
    ref_attn_ws_free(&ws);
}

static void attn_seeded_inputs_match_double(void **state)
{
    (void)state;
    static const float scales[3] = {1e-2f, 1.0f, 30.0f};
    ref_pool *pool;
    td_err err = {0};
    assert_int_equal(ref_pool_new(3, &pool, &err), TD_OK);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            fix f;
            fix_init(&f, shapes[a], 100 + (uint64_t)a);
            td_rng r;
            td_rng_seed(&r, 7 + (uint64_t)b);
            const int64_t M = 9, H = f.s.H;
            float *x = rnd(&r, M * H, scales[b]), *y = malloc((size_t)(M * H) * sizeof *y);
            for (int64_t i = 0; i < M * H; i++) y[i] = NAN;
            double *ex = malloc((size_t)(M * H) * sizeof *ex);
            ref_kv kv = {0};
            run(&f, pool, &kv, x, M, y);
            naive(&f, x, M, ex);
            double mx = 0, md = 0;
            for (int64_t i = 0; i < M * H; i++) {
                assert_true(isfinite(y[i]));
                mx = fmax(mx, fabs(ex[i]));
                md = fmax(md, fabs((double)y[i] - ex[i]));
            }
            if (!(md <= 2e-5 * mx)) fprintf(stderr, "shape %d scale %g: max diff %.3g of %.3g\n", a, (double)scales[b], md, mx);
            assert_true(md <= 2e-5 * mx);
            ref_kv_free(&kv);
            free(x);
            free(y);
            free(ex);
            fix_free(&f);
        }
    ref_pool_free(pool);
}

static void attn_cache_steps_and_threads_bitwise(void **state)
{
    (void)state;
    ref_pool *p1, *p4;
    td_err err = {0};
    assert_int_equal(ref_pool_new(1, &p1, &err), TD_OK);
    assert_int_equal(ref_pool_new(4, &p4, &err), TD_OK);
    for (int a = 0; a < 2; a++) {
        fix f;
        fix_init(&f, shapes[a], 200 + (uint64_t)a);
        td_rng r;
        td_rng_seed(&r, 9);
        const int64_t M = 7, H = f.s.H;
        float *x = rnd(&r, M * H, 1.0f), *y1 = malloc((size_t)(M * H) * sizeof *y1);
        float *y4 = malloc((size_t)(M * H) * sizeof *y4), *ys = malloc((size_t)(M * H) * sizeof *ys);
        ref_kv k1 = {0}, k4 = {0}, ks = {0};
        run(&f, p1, &k1, x, M, y1);
        run(&f, p4, &k4, x, M, y4);
        assert_memory_equal(y1, y4, (size_t)(M * H) * sizeof *y1);
        /* n = M - 2 tokens, then two single-token steps */
        run(&f, p4, &ks, x, M - 2, ys);
        run(&f, p1, &ks, x + (M - 2) * H, 1, ys + (M - 2) * H);
        run(&f, p4, &ks, x + (M - 1) * H, 1, ys + (M - 1) * H);
        assert_memory_equal(y1, ys, (size_t)(M * H) * sizeof *y1);
        assert_int_equal(ks.len, M);
        assert_memory_equal(k1.k, ks.k, (size_t)(M * k1.width) * sizeof(float));
        assert_memory_equal(k1.v, ks.v, (size_t)(M * k1.width) * sizeof(float));
        ref_kv_free(&k1);
        ref_kv_free(&k4);
        ref_kv_free(&ks);
        free(x);
        free(y1);
        free(y4);
        free(ys);
        fix_free(&f);
    }
    ref_pool_free(p1);
    ref_pool_free(p4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attn_seeded_inputs_match_double),
        cmocka_unit_test(attn_cache_steps_and_threads_bitwise),
    };
    return cmocka_run_group_tests_name("ref_attn", tests, NULL, NULL);
}
