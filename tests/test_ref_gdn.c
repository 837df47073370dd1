/* test_ref_gdn.c — reference Gated DeltaNet (ref/gdn.h).
 *
 * What is asserted, for two shapes (2 key heads / 4 value heads / dk 8 / dv 6 / kernel 4, and
 * 3 key heads / 3 value heads / dk 5 / dv 7 / kernel 3), F32 weights:
 * - against a naive double-precision version written here from MODEL_SPEC.md A3.5
 *   (interleaved qkvz/ba split, causal depthwise conv + SiLU from zero history, L2-normalized
 *   q/k with eps in the sqrt, q / sqrt(dk), beta = sigmoid(b), g = -exp(A_log) softplus(a +
 *   dt_bias), decay -> S^T k -> delta -> rank-1 update -> S^T q, gated RMSNorm with a plain
 *   weight and silu gate, out_proj), inputs at scales 1e-2, 1, 30 and an `a` bias pushing
 *   softplus past its threshold 20: max |y - exact| <= 1e-4 * max |exact|;
 * - the recurrent and conv states after M tokens against the double version (same bound);
 * - outputs poisoned with NaN are fully written;
 * - prefill of n tokens then single-token steps equals, bit for bit, a prefill of all tokens
 *   (outputs, conv state and recurrent state), for n = 1 and 2 (shorter than the kernel) and 5;
 * - 1 and 4 threads give identical bits;
 * - the split layout of qwen4_exp (in_proj_qkv / z / b / a, B3.5) with the fixture's rows
 *   regrouped gives the interleaved run's bits (outputs and state); the sigmoid output gate
 *   changes the output but not the state.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/gdn.h"

#include <math.h>

typedef struct shape {
    int64_t H, nk, nv, dk, dv, K;
} shape;

typedef struct fix {
    shape s;
    float *wqkvz, *wba, *wout, *conv, *alog, *dtb, *nw;
    ref_gdn_weights w;
    ref_gdn_dims d;
} fix;

static float *rnd(td_rng *r, int64_t n, float sc, float off)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = td_rng_normal_f32(r) * sc + off;
    return p;
}

static int64_t G_of(shape s)
{
    return 2 * s.dk + 2 * (s.nv / s.nk) * s.dv;
}

static int64_t C_of(shape s)
{
    return 2 * s.nk * s.dk + s.nv * s.dv;
}

static void fix_init(fix *f, shape s, uint64_t seed, float dt_off)
{
    td_rng r;
    td_rng_seed(&r, seed);
    f->s = s;
    const float ws = 1.0f / sqrtf((float)s.H);
    f->wqkvz = rnd(&r, s.nk * G_of(s) * s.H, ws, 0);
    f->wba = rnd(&r, 2 * s.nv * s.H, ws, 0);
    f->wout = rnd(&r, s.H * s.nv * s.dv, 1.0f / sqrtf((float)(s.nv * s.dv)), 0);
    f->conv = rnd(&r, C_of(s) * s.K, 0.5f, 0);
    f->alog = rnd(&r, s.nv, 0.5f, 0);
    f->dtb = rnd(&r, s.nv, 0.5f, dt_off);
    f->nw = rnd(&r, s.dv, 0.1f, 1.0f);
    ref_linear_dense(&f->w.qkvz, TD_F32, s.nk * G_of(s), s.H, f->wqkvz);
    ref_linear_dense(&f->w.ba, TD_F32, 2 * s.nv, s.H, f->wba);
    ref_linear_dense(&f->w.out, TD_F32, s.H, s.nv * s.dv, f->wout);
    f->w.conv_w = f->conv;
    f->w.A_log = f->alog;
    f->w.dt_bias = f->dtb;
    f->w.norm_w = f->nw;
    f->d = (ref_gdn_dims){s.H, s.nk, s.nv, s.dk, s.dv, s.K, 1e-6f, false, false};
}

static void fix_free(fix *f)
{
    free(f->wqkvz);
    free(f->wba);
    free(f->wout);
    free(f->conv);
    free(f->alog);
    free(f->dtb);
    free(f->nw);
}

static double dsig(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* Naive double GDN over M tokens from zero state; S_out [nv, dk, dv]. */
static void naive(const fix *f, const float *x, int64_t M, double *out, double *S_out)
{
    const shape s = f->s;
    const int64_t r = s.nv / s.nk, G = G_of(s), C = C_of(s), Y = s.nv * s.dv;
    double *P = calloc((size_t)(M * s.nk * G), sizeof *P), *Q = calloc((size_t)(M * 2 * s.nv), sizeof *Q);
    double *mixed = calloc((size_t)(M * C), sizeof *mixed), *u = calloc((size_t)(M * C), sizeof *u);
    double *S = calloc((size_t)(s.nv * s.dk * s.dv), sizeof *S), *y = calloc((size_t)Y, sizeof *y);
    for (int64_t t = 0; t < M; t++) {
        for (int64_t o = 0; o < s.nk * G; o++) {
            double a = 0;
            for (int64_t i = 0; i < s.H; i++) a += (double)f->wqkvz[o * s.H + i] * (double)x[t * s.H + i];
            P[t * s.nk * G + o] = a;
        }
        for (int64_t o = 0; o < 2 * s.nv; o++) {
            double a = 0;
            for (int64_t i = 0; i < s.H; i++) a += (double)f->wba[o * s.H + i] * (double)x[t * s.H + i];
            Q[t * 2 * s.nv + o] = a;
        }
        /* mixed = [q heads | k heads | v heads] from the interleaved groups */
        for (int64_t g = 0; g < s.nk; g++)
            for (int64_t i = 0; i < s.dk; i++) {
                mixed[t * C + g * s.dk + i] = P[t * s.nk * G + g * G + i];
                mixed[t * C + s.nk * s.dk + g * s.dk + i] = P[t * s.nk * G + g * G + s.dk + i];
            }
        for (int64_t j = 0; j < s.nv; j++)
            for (int64_t i = 0; i < s.dv; i++)
                mixed[t * C + 2 * s.nk * s.dk + j * s.dv + i] = P[t * s.nk * G + (j / r) * G + 2 * s.dk + (j % r) * s.dv + i];
    }
    for (int64_t t = 0; t < M; t++)
        for (int64_t c = 0; c < C; c++) {
            double a = 0;
            for (int64_t j = 0; j < s.K; j++) {
                const int64_t src = t - (s.K - 1) + j;
                if (src >= 0) a += (double)f->conv[c * s.K + j] * mixed[src * C + c];
            }
            u[t * C + c] = a * dsig(a);
        }
    for (int64_t t = 0; t < M; t++) {
        for (int64_t h = 0; h < 2 * s.nk; h++) {
            double *v = u + t * C + h * s.dk, ss = 0;
            for (int64_t i = 0; i < s.dk; i++) ss += v[i] * v[i];
            for (int64_t i = 0; i < s.dk; i++) v[i] = v[i] / sqrt(ss + 1e-6) / (h < s.nk ? sqrt((double)s.dk) : 1.0);
        }
        for (int64_t j = 0; j < s.nv; j++) {
            const int64_t kh = j / r;
            const double *q = u + t * C + kh * s.dk, *k = u + t * C + s.nk * s.dk + kh * s.dk;
            const double *v = u + t * C + 2 * s.nk * s.dk + j * s.dv;
            const double b = Q[t * 2 * s.nv + kh * 2 * r + j % r], a = Q[t * 2 * s.nv + kh * 2 * r + r + j % r];
            const double ain = a + (double)f->dtb[j];
            const double sp = ain > 20 ? ain : log1p(exp(ain));
            const double decay = exp(-exp((double)f->alog[j]) * sp), beta = dsig(b);
            double *Sj = S + j * s.dk * s.dv;
            for (int64_t i = 0; i < s.dk * s.dv; i++) Sj[i] *= decay;
            for (int64_t e = 0; e < s.dv; e++) {
                double m = 0;
                for (int64_t i = 0; i < s.dk; i++) m += Sj[i * s.dv + e] * k[i];
                const double dl = beta * (v[e] - m);
                for (int64_t i = 0; i < s.dk; i++) Sj[i * s.dv + e] += k[i] * dl;
            }
            double ss = 0;
            for (int64_t e = 0; e < s.dv; e++) {
                double o = 0;
                for (int64_t i = 0; i < s.dk; i++) o += Sj[i * s.dv + e] * q[i];
                y[j * s.dv + e] = o;
                ss += o * o;
            }
            const double inv = 1.0 / sqrt(ss / (double)s.dv + 1e-6);
            for (int64_t e = 0; e < s.dv; e++) {
                const double z = P[t * s.nk * G + kh * G + 2 * s.dk + r * s.dv + (j % r) * s.dv + e];
                y[j * s.dv + e] = y[j * s.dv + e] * inv * (double)f->nw[e] * z * dsig(z);
            }
        }
        for (int64_t o = 0; o < s.H; o++) {
            double a = 0;
            for (int64_t i = 0; i < Y; i++) a += (double)f->wout[o * Y + i] * y[i];
            out[t * s.H + o] = a;
        }
    }
    memcpy(S_out, S, (size_t)(s.nv * s.dk * s.dv) * sizeof *S);
    free(P);
    free(Q);
    free(mixed);
    free(u);
    free(S);
    free(y);
}

static const shape shapes[2] = {{40, 2, 4, 8, 6, 4}, {30, 3, 3, 5, 7, 3}};

static void run(const fix *f, ref_pool *pool, ref_gdn_state *st, const float *x, int64_t M, float *y)
{
    ref_gdn_ws ws = {0};
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    td_err err = {0};
    assert_int_equal(ref_gdn_run(&f->w, &f->d, &nx, &REF_ROWPAR_PLAIN, pool, &ws, st, x, M, y, &err), TD_OK);
    ref_gdn_ws_free(&ws);
}

static double rel_diff(const float *y, const double *ex, int64_t n)
{
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(y[i]));
        mx = fmax(mx, fabs(ex[i]));
        md = fmax(md, fabs((double)y[i] - ex[i]));
    }
    assert_true(mx > 0);
    return md / mx;
}

static void gdn_seeded_inputs_match_double(void **state)
{
    (void)state;
    static const float scales[4] = {1e-2f, 1.0f, 30.0f, 1.0f};
    ref_pool *pool;
    td_err err = {0};
    assert_int_equal(ref_pool_new(3, &pool, &err), TD_OK);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++) {
            fix f;
            fix_init(&f, shapes[a], 300 + (uint64_t)a, b == 3 ? 25.0f : 0.0f);
            td_rng r;
            td_rng_seed(&r, 17 + (uint64_t)b);
            const int64_t M = 11, H = f.s.H, NS = f.s.nv * f.s.dk * f.s.dv;
            float *x = rnd(&r, M * H, scales[b], 0), *y = malloc((size_t)(M * H) * sizeof *y);
            for (int64_t i = 0; i < M * H; i++) y[i] = NAN;
            double *ex = malloc((size_t)(M * H) * sizeof *ex), *S = malloc((size_t)NS * sizeof *S);
            ref_gdn_state st = {0};
            assert_int_equal(ref_gdn_state_init(&st, &f.d, &err), TD_OK);
            run(&f, pool, &st, x, M, y);
            naive(&f, x, M, ex, S);
            const double dy = rel_diff(y, ex, M * H), dS = rel_diff(st.S, S, NS);
            if (dy > 1e-4 || dS > 1e-4) fprintf(stderr, "shape %d case %d: out %.3g state %.3g\n", a, b, dy, dS);
            assert_true(dy <= 1e-4 && dS <= 1e-4);
            ref_gdn_state_free(&st);
            free(x);
            free(y);
            free(ex);
            free(S);
            fix_free(&f);
        }
    ref_pool_free(pool);
}

static void gdn_steps_and_threads_bitwise(void **state)
{
    (void)state;
    ref_pool *p1, *p4;
    td_err err = {0};
    assert_int_equal(ref_pool_new(1, &p1, &err), TD_OK);
    assert_int_equal(ref_pool_new(4, &p4, &err), TD_OK);
    for (int a = 0; a < 2; a++) {
        fix f;
        fix_init(&f, shapes[a], 400 + (uint64_t)a, 0.0f);
        td_rng r;
        td_rng_seed(&r, 5);
        const int64_t M = 8, H = f.s.H, NS = f.s.nv * f.s.dk * f.s.dv, NC = C_of(f.s) * (f.s.K - 1);
        float *x = rnd(&r, M * H, 1.0f, 0), *y1 = malloc((size_t)(M * H) * sizeof *y1);
        float *y4 = malloc((size_t)(M * H) * sizeof *y4), *ys = malloc((size_t)(M * H) * sizeof *ys);
        ref_gdn_state s1 = {0}, s4 = {0};
        assert_int_equal(ref_gdn_state_init(&s1, &f.d, &err), TD_OK);
        assert_int_equal(ref_gdn_state_init(&s4, &f.d, &err), TD_OK);
        run(&f, p1, &s1, x, M, y1);
        run(&f, p4, &s4, x, M, y4);
        assert_memory_equal(y1, y4, (size_t)(M * H) * sizeof *y1);
        assert_memory_equal(s1.S, s4.S, (size_t)NS * sizeof(float));
        static const int64_t ns[3] = {1, 2, 5};
        for (int c = 0; c < 3; c++) {
            ref_gdn_state ss = {0};
            assert_int_equal(ref_gdn_state_init(&ss, &f.d, &err), TD_OK);
            for (int64_t i = 0; i < M * H; i++) ys[i] = NAN;
            run(&f, p4, &ss, x, ns[c], ys);
            for (int64_t t = ns[c]; t < M; t++) run(&f, (t & 1) ? p1 : p4, &ss, x + t * H, 1, ys + t * H);
            assert_memory_equal(y1, ys, (size_t)(M * H) * sizeof *y1);
            assert_memory_equal(s1.S, ss.S, (size_t)NS * sizeof(float));
            assert_memory_equal(s1.conv, ss.conv, (size_t)NC * sizeof(float));
            ref_gdn_state_free(&ss);
        }
        ref_gdn_state_free(&s1);
        ref_gdn_state_free(&s4);
        free(x);
        free(y1);
        free(y4);
        free(ys);
        fix_free(&f);
    }
    ref_pool_free(p1);
    ref_pool_free(p4);
}

/* The split layout (qwen4_exp) with the interleaved fixture's rows regrouped: same bits. The
 * sigmoid gate is then checked against silu-gate outputs recomputed with sigmoid in double. */
static void gdn_split_layout_is_a_row_permutation(void **state)
{
    (void)state;
    static const shape split_shapes[2] = {{16, 2, 6, 8, 6, 4}, {12, 3, 3, 5, 7, 3}};
    td_err err = {0};
    ref_pool *pool = NULL;
    assert_int_equal(ref_pool_new(3, &pool, &err), TD_OK);
    for (int si = 0; si < 2; si++) {
        const shape s = split_shapes[si];
        fix f;
        fix_init(&f, s, 900 + (uint64_t)si, 0.0f);
        const int64_t r = s.nv / s.nk, G = G_of(s), C = C_of(s), Y = s.nv * s.dv, H = s.H, M = 7;
        float *wqkv = malloc((size_t)(C * H) * sizeof *wqkv), *wz = malloc((size_t)(Y * H) * sizeof *wz);
        float *wb = malloc((size_t)(s.nv * H) * sizeof *wb), *wa = malloc((size_t)(s.nv * H) * sizeof *wa);
        assert_true(wqkv && wz && wb && wa);
        const size_t row = (size_t)H * sizeof(float);
        for (int64_t g = 0; g < s.nk; g++) {
            for (int64_t i = 0; i < s.dk; i++) {
                memcpy(wqkv + (g * s.dk + i) * H, f.wqkvz + (g * G + i) * H, row);
                memcpy(wqkv + (s.nk * s.dk + g * s.dk + i) * H, f.wqkvz + (g * G + s.dk + i) * H, row);
            }
            for (int64_t i = 0; i < r * s.dv; i++) {
                memcpy(wqkv + (2 * s.nk * s.dk + g * r * s.dv + i) * H, f.wqkvz + (g * G + 2 * s.dk + i) * H, row);
                memcpy(wz + (g * r * s.dv + i) * H, f.wqkvz + (g * G + 2 * s.dk + r * s.dv + i) * H, row);
            }
            for (int64_t i = 0; i < r; i++) {
                memcpy(wb + (g * r + i) * H, f.wba + (g * 2 * r + i) * H, row);
                memcpy(wa + (g * r + i) * H, f.wba + (g * 2 * r + r + i) * H, row);
            }
        }
        fix g2 = f;
        ref_linear_dense(&g2.w.qkv, TD_F32, C, H, wqkv);
        ref_linear_dense(&g2.w.z, TD_F32, Y, H, wz);
        ref_linear_dense(&g2.w.b, TD_F32, s.nv, H, wb);
        ref_linear_dense(&g2.w.a, TD_F32, s.nv, H, wa);
        g2.d.split = true;
        td_rng rr;
        td_rng_seed(&rr, 5);
        float *x = rnd(&rr, M * H, 1.0f, 0), *y1 = malloc((size_t)(M * H) * sizeof *y1);
        float *y2 = malloc((size_t)(M * H) * sizeof *y2);
        for (int64_t i = 0; i < M * H; i++) y1[i] = y2[i] = NAN;
        ref_gdn_state s1, s2;
        assert_int_equal(ref_gdn_state_init(&s1, &f.d, &err), TD_OK);
        assert_int_equal(ref_gdn_state_init(&s2, &f.d, &err), TD_OK);
        run(&f, pool, &s1, x, M, y1);
        run(&g2, pool, &s2, x, M, y2);
        assert_memory_equal(y1, y2, (size_t)(M * H) * sizeof *y1);
        assert_memory_equal(s1.S, s2.S, (size_t)(s.nv * s.dk * s.dv) * sizeof *s1.S);
        /* the sigmoid gate changes the output (and only through the gate) */
        ref_gdn_state s3;
        assert_int_equal(ref_gdn_state_init(&s3, &f.d, &err), TD_OK);
        g2.d.sigmoid_gate = true;
        run(&g2, pool, &s3, x, M, y2);
        assert_memory_equal(s1.S, s3.S, (size_t)(s.nv * s.dk * s.dv) * sizeof *s1.S);
        bool differs = false;
        for (int64_t i = 0; i < M * H; i++) {
            assert_true(isfinite(y2[i]));
            differs = differs || y1[i] != y2[i];
        }
        assert_true(differs);
        ref_gdn_state_free(&s1);
        ref_gdn_state_free(&s2);
        ref_gdn_state_free(&s3);
        free(x);
        free(y1);
        free(y2);
        free(wqkv);
        free(wz);
        free(wb);
        free(wa);
        fix_free(&f);
    }
    ref_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gdn_seeded_inputs_match_double),
        cmocka_unit_test(gdn_steps_and_threads_bitwise),
        cmocka_unit_test(gdn_split_layout_is_a_row_permutation),
    };
    return cmocka_run_group_tests_name("ref_gdn", tests, NULL, NULL);
}
