/* test_ref_qsa.c — QSA sparse attention with its indexer (ref/qsa.h).
 *
 * Shape: hidden 24, 4 query heads / 2 KV heads / head_dim 16 / rotary 8, indexer 3 heads x 12,
 * blocks of 4, F32 weights. What is asserted:
 * - with a budget covering every block, QSA equals the dense gated attention of attn.h bit for
 *   bit (same orders), and every complete block is reported selected;
 * - with topk 2 over 30 tokens (up to 7 complete blocks) the output matches a naive double
 *   version written here from MODEL_SPEC.md B3.6 (indexer norm + RoPE, block means of raw keys,
 *   normed and rotated at the block start, ReLU scores, top-2 blocks + open tail, softmax over
 *   the selected tokens): max |err| <= 2e-5 * max |exact|, and the selected ids agree;
 * - prefill of n tokens then single-token steps equals one call bit for bit (n = 1, 5, 8);
 *   1 and 3 threads give identical bits; outputs poisoned with NaN are fully written.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/qsa.h"

#include <math.h>

#define M 30
#define HID 24

typedef struct qfix {
    float *wq, *wk, *wv, *wo, *qn, *kn, *wi, *qln, *kln;
    ref_qsa_weights w;
    ref_qsa_dims d;
} qfix;

static float *rnd(td_rng *r, int64_t n, float sc)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = td_rng_normal_f32(r) * sc;
    return p;
}

static void qfix_init(qfix *f, int64_t topk)
{
    td_rng r;
    td_rng_seed(&r, 31);
    const float ws = 1.0f / sqrtf((float)HID);
    f->wq = rnd(&r, 2 * 4 * 16 * HID, ws);
    f->wk = rnd(&r, 2 * 16 * HID, ws);
    f->wv = rnd(&r, 2 * 16 * HID, ws);
    f->wo = rnd(&r, HID * 64, 0.125f);
    f->qn = rnd(&r, 16, 0.2f);
    f->kn = rnd(&r, 16, 0.2f);
    f->wi = rnd(&r, 4 * 12 * HID, ws);
    f->qln = rnd(&r, 12, 0.2f);
    f->kln = rnd(&r, 12, 0.2f);
    memset(&f->w, 0, sizeof f->w);
    ref_linear_dense(&f->w.a.q, TD_F32, 128, HID, f->wq);
    ref_linear_dense(&f->w.a.k, TD_F32, 32, HID, f->wk);
    ref_linear_dense(&f->w.a.v, TD_F32, 32, HID, f->wv);
    ref_linear_dense(&f->w.a.o, TD_F32, HID, 64, f->wo);
    ref_linear_dense(&f->w.idx, TD_F32, 48, HID, f->wi);
    f->w.a.q_norm = f->qn;
    f->w.a.k_norm = f->kn;
    f->w.q_ln = f->qln;
    f->w.k_ln = f->kln;
    f->d = (ref_qsa_dims){.a = {HID, 4, 2, 16, 8, 1e4, 1e-6f}, .idx_heads = 3, .idx_dim = 12, .block = 4, .topk = topk};
}

static void qfix_free(qfix *f)
{
    free(f->wq);
    free(f->wk);
    free(f->wv);
    free(f->wo);
    free(f->qn);
    free(f->kn);
    free(f->wi);
    free(f->qln);
    free(f->kln);
}

static void dmv(const float *W, int64_t rows, int64_t cols, const float *x, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double a = 0;
        for (int64_t c = 0; c < cols; c++) a += (double)W[r * cols + c] * (double)x[c];
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

static void drope(double *x, int64_t rot, int64_t p)
{
    for (int64_t i = 0; i < rot / 2; i++) {
        const double a = (double)p * pow(1e4, -2.0 * (double)i / (double)rot);
        const double x0 = x[i], x1 = x[i + rot / 2];
        x[i] = x0 * cos(a) - x1 * sin(a);
        x[i + rot / 2] = x1 * cos(a) + x0 * sin(a);
    }
}

/* naive double QSA over M tokens from position 0; sel [M, topk] ascending, -1 padded */
static void naive(const qfix *f, const float *x, double *out, int32_t *sel)
{
    const int64_t tk = f->d.topk;
    static double qg[M][128], K[M][32], Vv[M][32], iq[M][48], kb[M / 4][12], o[64];
    for (int64_t t = 0; t < M; t++) {
        dmv(f->wq, 128, HID, x + t * HID, qg[t]);
        dmv(f->wk, 32, HID, x + t * HID, K[t]);
        dmv(f->wv, 32, HID, x + t * HID, Vv[t]);
        dmv(f->wi, 48, HID, x + t * HID, iq[t]);
        for (int h = 0; h < 4; h++) {
            dnorm(qg[t] + h * 32, 16, f->qn);
            drope(qg[t] + h * 32, 8, t);
        }
        for (int j = 0; j < 2; j++) {
            dnorm(K[t] + j * 16, 16, f->kn);
            drope(K[t] + j * 16, 8, t);
        }
        for (int h = 0; h < 3; h++) {
            dnorm(iq[t] + h * 12, 12, f->qln);
            drope(iq[t] + h * 12, 8, t);
        }
    }
    for (int64_t b = 0; b < M / 4; b++) {
        for (int e = 0; e < 12; e++) kb[b][e] = (iq[4 * b][36 + e] + iq[4 * b + 1][36 + e] + iq[4 * b + 2][36 + e] +
                                                 iq[4 * b + 3][36 + e]) / 4.0;
        dnorm(kb[b], 12, f->kln);
        drope(kb[b], 8, 4 * b);
    }
    for (int64_t t = 0; t < M; t++) {
        const int64_t nb = (t + 1) / 4;
        bool chosen[M / 4] = {0};
        double sc[M / 4];
        for (int64_t b = 0; b < nb; b++) {
            sc[b] = 0;
            for (int h = 0; h < 3; h++) {
                double dd = 0;
                for (int e = 0; e < 12; e++) dd += iq[t][h * 12 + e] * kb[b][e];
                sc[b] += dd > 0 ? dd : 0;
            }
        }
        for (int64_t k = 0; k < tk && k < nb; k++) {
            int64_t best = -1;
            for (int64_t b = 0; b < nb; b++)
                if (!chosen[b] && (best < 0 || sc[b] > sc[best])) best = b;
            chosen[best] = true;
        }
        int64_t ns = 0;
        for (int64_t b = 0; b < nb; b++)
            if (chosen[b]) sel[t * tk + ns++] = (int32_t)b;
        for (; ns < tk; ns++) sel[t * tk + ns] = -1;
        for (int h = 0; h < 4; h++) {
            const int kv = h / 2;
            double s[M], mx = -1e300, z = 0;
            for (int64_t j = 0; j <= t; j++) {
                if (j < 4 * nb && !chosen[j / 4]) continue;
                double a = 0;
                for (int e = 0; e < 16; e++) a += qg[t][h * 32 + e] * K[j][kv * 16 + e];
                s[j] = a / 4.0;
                mx = fmax(mx, s[j]);
            }
            for (int e = 0; e < 16; e++) o[h * 16 + e] = 0;
            for (int64_t j = 0; j <= t; j++) {
                if (j < 4 * nb && !chosen[j / 4]) continue;
                const double p = exp(s[j] - mx);
                z += p;
                for (int e = 0; e < 16; e++) o[h * 16 + e] += p * Vv[j][kv * 16 + e];
            }
            for (int e = 0; e < 16; e++) o[h * 16 + e] = o[h * 16 + e] / z / (1.0 + exp(-qg[t][h * 32 + 16 + e]));
        }
        for (int r = 0; r < HID; r++) {
            double a = 0;
            for (int c = 0; c < 64; c++) a += (double)f->wo[r * 64 + c] * o[c];
            out[t * HID + r] = a;
        }
    }
}

static float *nanbuf(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void qsa_dense_equals_attention(void **state)
{
    (void)state;
    td_err err = {0};
    ref_pool *p = NULL;
    assert_int_equal(ref_pool_new(3, &p, &err), TD_OK);
    const ref_numerics nx = {0};
    qfix f;
    qfix_init(&f, 8);
    td_rng r;
    td_rng_seed(&r, 3);
    float *x = rnd(&r, M * HID, 1.0f), *a = nanbuf(M * HID), *b = nanbuf(M * HID);
    int32_t sel[M * 8];
    ref_qsa_cache c = {0};
    ref_qsa_ws ws = {0};
    assert_int_equal(ref_qsa_run(&f.w, &f.d, &nx, p, &ws, &c, x, M, a, sel, &err), TD_OK);
    ref_kv kv = {0};
    ref_attn_ws aws = {0};
    assert_int_equal(ref_attn_run(&f.w.a, &f.d.a, &nx, &REF_ROWPAR_PLAIN, p, &aws, &kv, x, M, b, &err), TD_OK);
    assert_memory_equal(a, b, M * HID * sizeof *a);
    for (int t = 0; t < M; t++)
        for (int i = 0; i < 8; i++) assert_int_equal(sel[t * 8 + i], i < (t + 1) / 4 ? i : -1);
    ref_kv_free(&kv);
    ref_attn_ws_free(&aws);
    ref_qsa_cache_free(&c);
    ref_qsa_ws_free(&ws);
    free(x);
    free(a);
    free(b);
    qfix_free(&f);
    ref_pool_free(p);
}

static void qsa_sparse_vs_double_and_split(void **state)
{
    (void)state;
    td_err err = {0};
    ref_pool *p1 = NULL, *p3 = NULL;
    assert_int_equal(ref_pool_new(1, &p1, &err), TD_OK);
    assert_int_equal(ref_pool_new(3, &p3, &err), TD_OK);
    const ref_numerics nx = {0};
    qfix f;
    qfix_init(&f, 2);
    td_rng r;
    td_rng_seed(&r, 4);
    float *x = rnd(&r, M * HID, 1.0f), *a = nanbuf(M * HID), *b = nanbuf(M * HID), *s = nanbuf(M * HID);
    int32_t sel[M * 2], sel3[M * 2], wsel[M * 2], ssel[M * 2];
    static double want[M * HID];
    ref_qsa_cache c1 = {0}, c3 = {0};
    ref_qsa_ws ws = {0};
    assert_int_equal(ref_qsa_run(&f.w, &f.d, &nx, p1, &ws, &c1, x, M, a, sel, &err), TD_OK);
    assert_int_equal(ref_qsa_run(&f.w, &f.d, &nx, p3, &ws, &c3, x, M, b, sel3, &err), TD_OK);
    assert_memory_equal(a, b, M * HID * sizeof *a);
    assert_memory_equal(sel, sel3, sizeof sel);
    naive(&f, x, want, wsel);
    assert_memory_equal(sel, wsel, sizeof sel);
    double mx = 0, e = 0;
    for (int64_t i = 0; i < M * HID; i++) {
        assert_true(isfinite(a[i]));
        mx = fmax(mx, fabs(want[i]));
        e = fmax(e, fabs((double)a[i] - want[i]));
    }
    assert_true(e <= 2e-5 * mx);
    static const int64_t ns[3] = {1, 5, 8};
    for (int k = 0; k < 3; k++) {
        ref_qsa_cache cs = {0};
        assert_int_equal(ref_qsa_run(&f.w, &f.d, &nx, p3, &ws, &cs, x, ns[k], s, ssel, &err), TD_OK);
        for (int64_t t = ns[k]; t < M; t++)
            assert_int_equal(ref_qsa_run(&f.w, &f.d, &nx, p3, &ws, &cs, x + t * HID, 1, s + t * HID, ssel + t * 2, &err),
                             TD_OK);
        assert_memory_equal(a, s, M * HID * sizeof *a);
        assert_memory_equal(sel, ssel, sizeof sel);
        ref_qsa_cache_free(&cs);
    }
    ref_qsa_cache_free(&c1);
    ref_qsa_cache_free(&c3);
    ref_qsa_ws_free(&ws);
    free(x);
    free(a);
    free(b);
    free(s);
    qfix_free(&f);
    ref_pool_free(p1);
    ref_pool_free(p3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qsa_dense_equals_attention),
        cmocka_unit_test(qsa_sparse_vs_double_and_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
