/* test_ref_moe.c — the reference MoE block and its pieces (ref/moe, ref/pool).
 *
 * What is asserted:
 * - pieces against hand-computed values and this file's own formulas: activation rounding
 *   (FP16/BF16 RNE incl. ties, subnormals, overflow to inf, NaN), silu and sigmoid, the FP32
 *   softmax, top-k (descending, lowest index wins ties, NaN last), renormalization
 *   (0.2, 0.3 -> 0.4, 0.6), TP shards (W13 rows / W2 columns of rank r; the tp_slice fault);
 * - the whole block bit for bit against a naive implementation written here in the documented
 *   order (moe.h: rounding points 1-4, FP32 or FP64 sums, softmax/top-k/renorm, SwiGLU,
 *   gated shared expert, slot-order combine, rank-ordered TP reduction), for act_dtype
 *   fp32/fp16/bf16 x accum fp32/fp64 x scale exact/fp16, three weight formats (NVFP4 ModelOpt
 *   with NVFP4 shared expert, NVFP4 compressed-tensors with BF16 shared expert, BF16 without
 *   shared expert and without norm_topk_prob), TP sizes 1, 2, 4 with every rank and `all`,
 *   router routes and imposed routes (duplicate experts, zero weights), and edge inputs
 *   (signed zeros with all-equal probabilities, subnormals, NaN, FP16 overflow at the input);
 * - accuracy against a double-precision MoE written here (exact weights, double everywhere):
 *   same top-k sets and relative L2 error below 1e-5 at activation scales 1e-3 .. 4;
 * - TP: the reduced output of 4 ranks is within 1e-5 of the TP1 output;
 * - results are bitwise identical for 1, 2, 3 and 4 threads;
 * - every output element is written (poisoned NaN buffer), route ids outside [0, E) are
 *   rejected with TD_ERR_RANGE naming token, slot and id while the output stays untouched;
 * - each planted fault changes the output.
 */
#include "test_common.h"
#include "moe_fixture.h"
#include "ref/moe.h"
#include "ref/pool.h"

#include <float.h>

/* ---- pieces -------------------------------------------------------------------------------------- */

static void moe_round_act(void **state)
{
    (void)state;
    static const float edge[] = {0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f,
                                 1.0f + 3 * 0x1p-8f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 0x1p-24f, 0x1p-25f,
                                 0x1.8p-25f, 0x1p-149f, FLT_MAX, INFINITY, -INFINITY, 3.0e38f, 0x1.fffffep-127f};
    td_rng rng;
    td_rng_seed(&rng, 5);
    for (int i = 0; i < 20000; i++) {
        float x = i < (int)(sizeof edge / sizeof edge[0]) ? edge[i] : td_f32_from_bits(td_rng_u32(&rng));
        if (isnan(x)) {
            assert_true(isnan(ref_round_act(x, TD_ACT_FP16)) && isnan(ref_round_act(x, TD_ACT_BF16)));
            continue;
        }
        assert_true(td_f32_bits(ref_round_act(x, TD_ACT_FP32)) == td_f32_bits(x));
        float h = (float)mf_round_f16((double)x), b = (float)mf_round_bf16((double)x);
        if (td_f32_bits(ref_round_act(x, TD_ACT_FP16)) != td_f32_bits(h))
            fail_msg("fp16 round of %a: %a, want %a", (double)x, (double)ref_round_act(x, TD_ACT_FP16), (double)h);
        if (td_f32_bits(ref_round_act(x, TD_ACT_BF16)) != td_f32_bits(b))
            fail_msg("bf16 round of %a: %a, want %a", (double)x, (double)ref_round_act(x, TD_ACT_BF16), (double)b);
    }
    assert_true(ref_round_act(1.0f + 0x1p-11f, TD_ACT_FP16) == 1.0f);              /* tie to even */
    assert_true(ref_round_act(1.0f + 3 * 0x1p-11f, TD_ACT_FP16) == 1.0f + 0x1p-9f); /* tie to even */
    assert_true(isinf(ref_round_act(65520.0f, TD_ACT_FP16)));
    assert_true(ref_round_act(65519.0f, TD_ACT_FP16) == 65504.0f);
    assert_true(isnan(ref_round_act(NAN, TD_ACT_BF16)));
}

static void moe_silu_sigmoid(void **state)
{
    (void)state;
    assert_true(ref_silu(0.0f) == 0.0f);
    assert_true(ref_sigmoid(0.0f) == 0.5f);
    assert_true(ref_silu(1.0f) == (float)(1.0 / (1.0 + exp(-1.0))));
    assert_true(ref_silu(100.0f) == 100.0f);
    assert_true(ref_sigmoid(-200.0f) == 0.0f);                       /* e^-200 underflows float */
    assert_true(ref_silu(-200.0f) == 0.0f && signbit(ref_silu(-200.0f))); /* -0 */
    assert_true(ref_sigmoid(-20.0f) == (float)(1.0 / (1.0 + exp(20.0))));
    assert_true(ref_sigmoid(50.0f) == 1.0f);
    td_rng rng;
    td_rng_seed(&rng, 6);
    for (int i = 0; i < 1000; i++) {
        float g = (float)(8.0 * td_rng_normal(&rng));
        assert_true(ref_silu(g) == (float)((double)g / (1.0 + exp(-(double)g))));
        assert_true(ref_sigmoid(g) == (float)(1.0 / (1.0 + exp(-(double)g))));
    }
}

static void moe_softmax(void **state)
{
    (void)state;
    float l[4] = {0, 0, 0, 0}, p[4];
    ref_softmax(l, 4, p, TD_ACCUM_FP32);
    for (int i = 0; i < 4; i++) assert_true(p[i] == 0.25f);
    float l2[2] = {0.0f, -INFINITY};
    ref_softmax(l2, 2, p, TD_ACCUM_FP32);
    assert_true(p[0] == 1.0f && p[1] == 0.0f);
    float l3[3] = {1.0f, NAN, 0.0f};
    ref_softmax(l3, 3, p, TD_ACCUM_FP32);
    assert_true(isnan(p[0]) && isnan(p[1]) && isnan(p[2]));
    /* random logits: the documented FP32 formula, and within 4 ulp of a double softmax */
    td_rng rng;
    td_rng_seed(&rng, 7);
    enum { N = 512 };
    float lg[N], pf[N], pd[N];
    for (int acc = 0; acc < 2; acc++)
        for (int rep = 0; rep < 10; rep++) {
            for (int i = 0; i < N; i++) lg[i] = (float)(3.0 * td_rng_normal(&rng));
            ref_softmax(lg, N, pf, (td_accum)acc);
            float m = lg[0];
            for (int i = 1; i < N; i++) m = lg[i] > m ? lg[i] : m;
            double sd = 0.0;
            float sf = 0.0f, e[N];
            for (int i = 0; i < N; i++) {
                e[i] = (float)exp((double)(lg[i] - m));
                sf = sf + e[i];
                sd += exp((double)lg[i] - (double)m);
            }
            for (int i = 0; i < N; i++) {
                double exact = exp((double)lg[i] - (double)m) / sd;
                pd[i] = acc ? (float)exact : e[i] / sf;
                assert_true(td_f32_bits(pf[i]) == td_f32_bits(pd[i]));
                /* rounding of l - m (|l - m| ulps through exp), of e_i, of the sum and the quotient */
                const double bound = (fabs((double)lg[i] - (double)m) + (acc ? 2.0 : N + 4.0)) * 0x1p-24;
                assert_true(fabs((double)pf[i] - exact) <= bound * exact + 1e-45);
            }
        }
}

static void moe_topk_ties_and_nan(void **state)
{
    (void)state;
    const float p[5] = {0.1f, 0.3f, 0.3f, 0.2f, 0.1f};
    int32_t ids[5];
    float v[5];
    ref_topk(p, 5, 3, ids, v);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 3);
    assert_true(v[0] == 0.3f && v[2] == 0.2f);
    ref_topk(p, 5, 5, ids, v);
    const int32_t want5[5] = {1, 2, 3, 0, 4};
    assert_memory_equal(ids, want5, sizeof want5);
    const float q[4] = {NAN, 0.5f, NAN, 0.2f};
    ref_topk(q, 4, 3, ids, v);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 0);
    const float same[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    ref_topk(same, 6, 4, ids, v);
    for (int j = 0; j < 4; j++) assert_int_equal(ids[j], j);
    const float neg[3] = {-0.0f, 0.0f, -1.0f}; /* -0 == +0: lower index first */
    ref_topk(neg, 3, 2, ids, v);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
}

static void moe_renorm(void **state)
{
    (void)state;
    float w[2] = {0.2f, 0.3f};
    ref_renorm(w, 2, TD_ACCUM_FP32);
    assert_true(w[0] == 0.4f && w[1] == 0.6f);
    float z[3] = {1.0f, 1.0f, 2.0f};
    ref_renorm(z, 3, TD_ACCUM_FP64);
    assert_true(z[0] == 0.25f && z[2] == 0.5f);
}

static void moe_expert_shard(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    o.layers = 1;
    mf_model m;
    mf_build(&o, &m);
    ref_moe_weights w;
    mf_views(&m, 0, &w);
    ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    float a[64], b[64];
    td_err err;
    for (int T = 1; T <= 4; T *= 2)
        for (int r = 0; r < T; r++)
            for (int f = 0; f < 2; f++) {
                ref_expert sh;
                td_fault fault = f ? TD_FAULT_TP_SLICE : TD_FAULT_NONE;
                assert_int_equal(ref_expert_shard(&w.experts[2], 64, T, r, fault, &sh, &err), TD_OK);
                const int64_t il = 64 / T, dr = f ? (r + 1) % T : r;
                assert_int_equal(sh.gate.rows, il);
                assert_int_equal(sh.down.cols, il);
                for (int64_t i = 0; i < il; i++) {
                    ref_linear_decode_row(&w.experts[2].up, &nx, r * il + i, a);
                    ref_linear_decode_row(&sh.up, &nx, i, b);
                    assert_memory_equal(a, b, sizeof a);
                }
                for (int64_t h = 0; h < 64; h++) {
                    ref_linear_decode_row(&w.experts[2].down, &nx, h, a);
                    ref_linear_decode_row(&sh.down, &nx, h, b);
                    assert_memory_equal(a + dr * il, b, (size_t)il * sizeof(float));
                }
            }
    ref_expert sh;
    assert_int_equal(ref_expert_shard(&w.experts[0], 64, 8, 0, TD_FAULT_NONE, &sh, &err), TD_ERR_RANGE); /* 8 cols */
    assert_int_equal(ref_expert_shard(&w.experts[0], 64, 3, 0, TD_FAULT_NONE, &sh, &err), TD_ERR_RANGE); /* 64 % 3 */
    mf_free(&m);
}

/* ---- the naive block (documented order) ---------------------------------------------------------- */

typedef struct naive_opts {
    td_act_dtype act;
    td_accum accum;
    bool fp16_scale;
    int tp, rank; /* rank -1: all */
} naive_opts;

static float rnd(float v, td_act_dtype a)
{
    if (a == TD_ACT_FP16) return (float)mf_round_f16((double)v);
    if (a == TD_ACT_BF16) return (float)mf_round_bf16((double)v);
    return v;
}

/* Dot of row r of l (columns [c0, c0 + n)) with x, in the documented order. */
static float ndot(const mf_linear *l, int64_t r, int64_t c0, int64_t n, const float *x, const naive_opts *o)
{
    if (o->accum == TD_ACCUM_FP64) {
        double acc = 0.0;
        for (int64_t k = 0; k < n; k++) acc = acc + mf_weight_mode(l, r, c0 + k, o->fp16_scale) * (double)x[k];
        return (float)acc;
    }
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++) acc = acc + (float)mf_weight_mode(l, r, c0 + k, o->fp16_scale) * x[k];
    return acc;
}

static float nsilu(float g) { return (float)((double)g / (1.0 + exp(-(double)g))); }

/* One SwiGLU expert shard on xr: y [H] (rounded at points 2 and 3). */
static void nexpert(const mf_linear *g, const mf_linear *u, const mf_linear *d, int64_t inter, const float *xr,
                    int64_t H, int rank, const naive_opts *o, float *y)
{
    const int64_t il = inter / o->tp;
    float h[256];
    for (int64_t i = 0; i < il; i++) {
        float gv = ndot(g, rank * il + i, 0, H, xr, o), uv = ndot(u, rank * il + i, 0, H, xr, o);
        h[i] = rnd(nsilu(gv) * uv, o->act);
    }
    for (int64_t r = 0; r < H; r++) y[r] = rnd(ndot(d, r, rank * il, il, h, o), o->act);
}

/* out [M, H]. ids/wts NULL: router routes. */
static void naive_block(const mf_model *m, int64_t L, const naive_opts *o, const float *x, int64_t M,
                        const int32_t *ids_in, const float *wts_in, float *out)
{
    const mf_layer *ly = &m->layers[L];
    const int64_t H = m->o.hidden, E = m->o.experts, k = m->o.top_k;
    float xr[256], logits[64], p[64], y[256], ys[256], acc_out[256];
    int32_t ids[16];
    float wts[16];
    for (int64_t t = 0; t < M; t++) {
        for (int64_t i = 0; i < H; i++) xr[i] = rnd(x[t * H + i], o->act);
        if (ids_in) {
            memcpy(ids, ids_in + t * k, (size_t)k * sizeof(int32_t));
            memcpy(wts, wts_in + t * k, (size_t)k * sizeof(float));
        } else {
            for (int64_t e = 0; e < E; e++) logits[e] = ndot(&ly->router, e, 0, H, xr, o);
            float mx = logits[0];
            for (int64_t e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
            if (o->accum == TD_ACCUM_FP64) {
                double s = 0.0;
                for (int64_t e = 0; e < E; e++) s += exp((double)logits[e] - (double)mx);
                for (int64_t e = 0; e < E; e++) p[e] = (float)(exp((double)logits[e] - (double)mx) / s);
            } else {
                float s = 0.0f;
                for (int64_t e = 0; e < E; e++) {
                    p[e] = (float)exp((double)(logits[e] - mx));
                    s = s + p[e];
                }
                for (int64_t e = 0; e < E; e++) p[e] = p[e] / s;
            }
            bool taken[64] = {false};
            for (int64_t j = 0; j < k; j++) {
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
                taken[best] = true;
                ids[j] = (int32_t)best;
                wts[j] = p[best];
            }
            if (m->o.norm_topk_prob) {
                if (o->accum == TD_ACCUM_FP64) {
                    double s = 0.0;
                    for (int64_t j = 0; j < k; j++) s += (double)wts[j];
                    for (int64_t j = 0; j < k; j++) wts[j] = (float)((double)wts[j] / s);
                } else {
                    float s = 0.0f;
                    for (int64_t j = 0; j < k; j++) s = s + wts[j];
                    for (int64_t j = 0; j < k; j++) wts[j] = wts[j] / s;
                }
            }
        }
        float sg = 0.0f;
        const bool shared = m->o.shared_inter > 0;
        if (shared) {
            naive_opts o32 = *o;
            sg = (float)(1.0 / (1.0 + exp(-(double)ndot(&ly->sh_gw, 0, 0, H, xr, &o32))));
        }
        const int r0 = o->rank < 0 ? 0 : o->rank, r1 = o->rank < 0 ? o->tp : o->rank + 1;
        for (int rank = r0; rank < r1; rank++) {
            double accd[256];
            float accf[256];
            for (int64_t h = 0; h < H; h++) {
                accd[h] = 0.0;
                accf[h] = 0.0f;
            }
            for (int64_t j = 0; j < k; j++) {
                nexpert(&ly->gate[ids[j]], &ly->up[ids[j]], &ly->down[ids[j]], m->o.inter, xr, H, rank, o, y);
                for (int64_t h = 0; h < H; h++) {
                    accd[h] = accd[h] + (double)wts[j] * (double)y[h];
                    accf[h] = accf[h] + wts[j] * y[h];
                }
            }
            if (shared) {
                nexpert(&ly->sh_gate, &ly->sh_up, &ly->sh_down, m->o.shared_inter, xr, H, rank, o, ys);
                for (int64_t h = 0; h < H; h++) {
                    accd[h] = accd[h] + (double)sg * (double)ys[h];
                    accf[h] = accf[h] + sg * ys[h];
                }
            }
            for (int64_t h = 0; h < H; h++) {
                float v = rnd(o->accum == TD_ACCUM_FP64 ? (float)accd[h] : accf[h], o->act);
                acc_out[h] = rank == r0 ? v : acc_out[h] + v;
            }
        }
        for (int64_t h = 0; h < H; h++) out[t * H + h] = o->rank < 0 ? rnd(acc_out[h], o->act) : acc_out[h];
    }
}

/* ---- running the block ----------------------------------------------------------------------------- */

typedef struct runner {
    ref_pool *pool;
    ref_moe_ws ws;
} runner;

static void runner_init(runner *r, int threads)
{
    memset(r, 0, sizeof *r);
    td_err err;
    assert_int_equal(ref_pool_new(threads, &r->pool, &err), TD_OK);
}

static void runner_free(runner *r)
{
    ref_moe_ws_free(&r->ws);
    ref_pool_free(r->pool);
}

static td_status run_block(runner *r, const ref_moe_weights *w, const ref_moe_opts *o, const float *x, int64_t M,
                           const int32_t *ids, const float *wts, float *out, td_err *err)
{
    td_status st = ref_moe_ws_reserve(&r->ws, w, M, ref_pool_threads(r->pool), err);
    if (st) return st;
    return ref_moe_run(w, o, r->pool, &r->ws, x, M, ids, wts, out, err);
}

static void fill_x(td_rng *rng, float *x, int64_t n, double scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(scale * td_rng_normal(rng));
}

static void fixture_opts(int which, mf_opts *o);

/* Fixture `which` built, its layer-0 views and a 2-thread runner (close_fixture frees them). */
static void open_fixture(int which, int threads, mf_opts *mo, mf_model *m, ref_moe_weights *w, runner *rn)
{
    fixture_opts(which, mo);
    mf_build(mo, m);
    mf_views(m, 0, w);
    runner_init(rn, threads);
}

static void fixture_opts(int which, mf_opts *o)
{
    mf_defaults(o);
    o->layers = 1;
    if (which == 1) {
        o->fmt = MF_CT;
        o->shared_bf16 = true;
        o->seed = 2;
    } else if (which == 2) {
        o->fmt = MF_BF16;
        o->shared_inter = 0;
        o->norm_topk_prob = false;
        o->seed = 3;
    }
}


static void expect_same(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (td_f32_bits(got[i]) != td_f32_bits(want[i]) && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s: element %lld: %a, naive %a", what, (long long)i, (double)got[i], (double)want[i]);
}

static void moe_block_matches_naive_numerics(void **state)
{
    (void)state;
    for (int fx = 0; fx < 3; fx++) {
        mf_opts mo;
        mf_model m;
        ref_moe_weights w;
        runner rn;
        open_fixture(fx, 2, &mo, &m, &w, &rn);
        td_rng rng;
        td_rng_seed(&rng, 40 + (uint64_t)fx);
        const int64_t M = 5, H = mo.hidden;
        float x[5 * 64], out[5 * 64], want[5 * 64];
        fill_x(&rng, x, M * H, 0.5);
        for (int act = 0; act < 3; act++)
            for (int acc = 0; acc < 2; acc++)
                for (int sc = 0; sc < 2; sc++) {
                    ref_moe_opts o = {{(td_accum)acc, (td_scale_mode)sc, TD_FAULT_NONE}, (td_act_dtype)act, 1, 0};
                    naive_opts no = {(td_act_dtype)act, (td_accum)acc, sc == 1, 1, 0};
                    td_err err;
                    for (int64_t i = 0; i < M * H; i++) out[i] = NAN;
                    assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
                    naive_block(&m, 0, &no, x, M, NULL, NULL, want);
                    char what[96];
                    snprintf(what, sizeof what, "fixture %d act %d accum %d scale %d", fx, act, acc, sc);
                    expect_same(out, want, M * H, what);
                    for (int64_t i = 0; i < M * H; i++) assert_false(isnan(out[i]));
                }
        runner_free(&rn);
        mf_free(&m);
    }
}

static void moe_block_matches_naive_tp(void **state)
{
    (void)state;
    for (int fx = 0; fx < 3; fx++) {
        mf_opts mo;
        mf_model m;
        ref_moe_weights w;
        runner rn;
        open_fixture(fx, 3, &mo, &m, &w, &rn);
        td_rng rng;
        td_rng_seed(&rng, 50 + (uint64_t)fx);
        const int64_t H = mo.hidden;
        static const int64_t Ms[] = {1, 7};
        float x[7 * 64], out[7 * 64], want[7 * 64];
        for (size_t mi = 0; mi < 2; mi++) {
            const int64_t M = Ms[mi];
            fill_x(&rng, x, M * H, 1.0);
            for (int T = 2; T <= 4; T += 2)
                for (int r = -1; r < T; r++) {
                    const int act = (r + 1) % 3, acc = (T / 2 + r) & 1;
                    ref_moe_opts o = {{(td_accum)acc, TD_SCALE_EXACT, TD_FAULT_NONE}, (td_act_dtype)act, T,
                                      r < 0 ? TD_TP_RANK_ALL : r};
                    naive_opts no = {(td_act_dtype)act, (td_accum)acc, false, T, r};
                    td_err err;
                    assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
                    naive_block(&m, 0, &no, x, M, NULL, NULL, want);
                    char what[96];
                    snprintf(what, sizeof what, "fixture %d M %lld tp %d rank %d", fx, (long long)M, T, r);
                    expect_same(out, want, M * H, what);
                }
        }
        runner_free(&rn);
        mf_free(&m);
    }
}

/* Signed zeros (all-equal router probabilities: the lowest indices win), subnormals, a NaN
 * (NaN logits and weights propagate), and values that overflow FP16 at the block input. */
static void moe_block_edge_inputs(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(0, 2, &mo, &m, &w, &rn);
    const int64_t M = 4, H = mo.hidden;
    float x[4 * 64], out[4 * 64], want[4 * 64];
    for (int64_t i = 0; i < H; i++) {
        x[i] = (i & 1) ? -0.0f : 0.0f;
        x[H + i] = 0x1p-149f * (float)(i % 7) * ((i & 2) ? -1.0f : 1.0f);
        x[2 * H + i] = 0.01f * (float)i;
        x[3 * H + i] = (i % 5 == 0) ? 1e5f : -0.5f;
    }
    x[2 * H + 17] = NAN;
    for (int act = 0; act < 2; act++) {
        ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, (td_act_dtype)act, 1, 0};
        naive_opts no = {(td_act_dtype)act, TD_ACCUM_FP32, false, 1, 0};
        td_err err;
        for (int64_t i = 0; i < M * H; i++) out[i] = 12345.0f;
        assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
        naive_block(&m, 0, &no, x, M, NULL, NULL, want);
        expect_same(out, want, M * H, act ? "edge inputs, act fp16" : "edge inputs, act fp32");
        /* token 0: zero input, equal probabilities: experts 0, 1, 2 */
        assert_int_equal(rn.ws.ids[0], 0);
        assert_int_equal(rn.ws.ids[1], 1);
        assert_int_equal(rn.ws.ids[2], 2);
        /* token 2: the NaN reaches every output element */
        for (int64_t i = 0; i < H; i++) assert_true(isnan(out[2 * H + i]));
        for (int64_t i = 0; i < H; i++) assert_false(isnan(out[i]) || isnan(out[H + i]));
    }
    runner_free(&rn);
    mf_free(&m);
}

static void moe_block_imposed_routes(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(0, 2, &mo, &m, &w, &rn);
    td_rng rng;
    td_rng_seed(&rng, 60);
    const int64_t M = 9, H = mo.hidden, k = mo.top_k;
    float x[9 * 64], out[9 * 64], want[9 * 64], wts[27];
    int32_t ids[27];
    fill_x(&rng, x, M * H, 0.3);
    for (int64_t s = 0; s < M * k; s++) {
        ids[s] = (int32_t)(s % 4 == 0 ? 5 : td_rng_below(&rng, (uint64_t)mo.experts)); /* duplicates */
        wts[s] = s % 7 == 0 ? 0.0f : (float)td_rng_uniform(&rng);
    }
    ids[0] = ids[1] = ids[2] = 3; /* one token with the same expert in every slot */
    for (int tp = 1; tp <= 4; tp *= 4) {
        ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_FP16, TD_FAULT_NONE}, TD_ACT_FP16, tp, tp == 1 ? 0 : TD_TP_RANK_ALL};
        naive_opts no = {TD_ACT_FP16, TD_ACCUM_FP32, true, tp, tp == 1 ? 0 : -1};
        td_err err;
        assert_int_equal(run_block(&rn, &w, &o, x, M, ids, wts, out, &err), TD_OK);
        naive_block(&m, 0, &no, x, M, ids, wts, want);
        expect_same(out, want, M * H, "imposed routes");
        assert_false(rn.ws.router_ran);
    }
    runner_free(&rn);
    mf_free(&m);
}

/* ---- accuracy against double precision --------------------------------------------------------------- */

/* Exact double MoE of layer 0 (weights decoded exactly, no rounding anywhere): out, ids. */
static void double_block(const mf_model *m, const float *x, int64_t M, double *out, int32_t *ids_out)
{
    const mf_layer *ly = &m->layers[0];
    const int64_t H = m->o.hidden, E = m->o.experts, k = m->o.top_k, I = m->o.inter, Is = m->o.shared_inter;
    for (int64_t t = 0; t < M; t++) {
        const float *xt = x + t * H;
        double lg[64], p[64], s = 0.0, mx = -HUGE_VAL;
        for (int64_t e = 0; e < E; e++) {
            lg[e] = 0.0;
            for (int64_t c = 0; c < H; c++) lg[e] += mf_weight(&ly->router, e, c) * (double)xt[c];
            mx = lg[e] > mx ? lg[e] : mx;
        }
        for (int64_t e = 0; e < E; e++) s += exp(lg[e] - mx);
        for (int64_t e = 0; e < E; e++) p[e] = exp(lg[e] - mx) / s;
        bool taken[64] = {false};
        double wts[16], ws = 0.0;
        for (int64_t j = 0; j < k; j++) {
            int64_t b = -1;
            for (int64_t e = 0; e < E; e++)
                if (!taken[e] && (b < 0 || p[e] > p[b])) b = e;
            taken[b] = true;
            ids_out[t * k + j] = (int32_t)b;
            wts[j] = p[b];
            ws += p[b];
        }
        double o[256] = {0};
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids_out[t * k + j];
            const double wj = m->o.norm_topk_prob ? wts[j] / ws : wts[j];
            double h[256];
            for (int64_t i = 0; i < I; i++) {
                double g = 0.0, u = 0.0;
                for (int64_t c = 0; c < H; c++) {
                    g += mf_weight(&ly->gate[e], i, c) * (double)xt[c];
                    u += mf_weight(&ly->up[e], i, c) * (double)xt[c];
                }
                h[i] = g / (1.0 + exp(-g)) * u;
            }
            for (int64_t r = 0; r < H; r++) {
                double y = 0.0;
                for (int64_t i = 0; i < I; i++) y += mf_weight(&ly->down[e], r, i) * h[i];
                o[r] += wj * y;
            }
        }
        if (Is > 0) {
            double gz = 0.0, h[256];
            for (int64_t c = 0; c < H; c++) gz += mf_weight(&ly->sh_gw, 0, c) * (double)xt[c];
            const double sg = 1.0 / (1.0 + exp(-gz));
            for (int64_t i = 0; i < Is; i++) {
                double g = 0.0, u = 0.0;
                for (int64_t c = 0; c < H; c++) {
                    g += mf_weight(&ly->sh_gate, i, c) * (double)xt[c];
                    u += mf_weight(&ly->sh_up, i, c) * (double)xt[c];
                }
                h[i] = g / (1.0 + exp(-g)) * u;
            }
            for (int64_t r = 0; r < H; r++) {
                double y = 0.0;
                for (int64_t i = 0; i < Is; i++) y += mf_weight(&ly->sh_down, r, i) * h[i];
                o[r] += sg * y;
            }
        }
        for (int64_t r = 0; r < H; r++) out[t * H + r] = o[r];
    }
}

static void moe_block_accuracy_vs_double(void **state)
{
    (void)state;
    /* (much larger scales make FP32 probabilities underflow to exact ties at 0, where the
     * lowest-index rule and a double softmax legitimately pick different experts) */
    static const double scales[] = {1e-3, 0.1, 1.0, 4.0};
    for (int fx = 0; fx < 3; fx++) {
        mf_opts mo;
        mf_model m;
        ref_moe_weights w;
        runner rn;
        open_fixture(fx, 2, &mo, &m, &w, &rn);
        td_rng rng;
        td_rng_seed(&rng, 70 + (uint64_t)fx);
        const int64_t M = 6, H = mo.hidden, k = mo.top_k;
        float x[6 * 64], out[6 * 64];
        double ref[6 * 64];
        int32_t ids[18];
        for (size_t si = 0; si < 4; si++) {
            fill_x(&rng, x, M * H, scales[si]);
            double_block(&m, x, M, ref, ids);
            for (int acc = 0; acc < 2; acc++) {
                ref_moe_opts o = {{(td_accum)acc, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_FP32, 1, 0};
                td_err err;
                assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
                if (memcmp(rn.ws.ids, ids, sizeof ids)) {
                    for (int q = 0; q < 18; q++) fprintf(stderr, "%d/%d ", rn.ws.ids[q], ids[q]);
                    for (int q = 0; q < 8; q++) fprintf(stderr, "\n p %d %.9g", q, (double)rn.ws.probs[2 * 8 + q]);
                    fail_msg("fixture %d scale %g accum %d: selected experts differ", fx, scales[si], acc);
                }
                double d2 = 0.0, r2 = 0.0;
                for (int64_t i = 0; i < M * H; i++) {
                    d2 += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
                    r2 += ref[i] * ref[i];
                }
                const double rel = sqrt(d2) / sqrt(r2);
                if (!(rel < 1e-5)) fail_msg("fixture %d scale %g accum %d: rel_l2 %g", fx, scales[si], acc, rel);
                (void)k;
            }
        }
        runner_free(&rn);
        mf_free(&m);
    }
}

static void moe_tp_reduced_close_to_tp1(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(0, 2, &mo, &m, &w, &rn);
    td_rng rng;
    td_rng_seed(&rng, 80);
    const int64_t M = 8, H = mo.hidden;
    float x[8 * 64], a[8 * 64], b[8 * 64];
    fill_x(&rng, x, M * H, 0.2);
    ref_moe_opts o1 = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_FP32, 1, 0};
    ref_moe_opts o4 = o1;
    o4.tp_size = 4;
    o4.tp_rank = TD_TP_RANK_ALL;
    td_err err;
    assert_int_equal(run_block(&rn, &w, &o1, x, M, NULL, NULL, a, &err), TD_OK);
    assert_int_equal(run_block(&rn, &w, &o4, x, M, NULL, NULL, b, &err), TD_OK);
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < M * H; i++) {
        d2 += ((double)b[i] - (double)a[i]) * ((double)b[i] - (double)a[i]);
        r2 += (double)a[i] * (double)a[i];
    }
    assert_true(sqrt(d2) / sqrt(r2) < 1e-5);
    assert_true(d2 > 0.0); /* a different summation order, so not bitwise */
    runner_free(&rn);
    mf_free(&m);
}

static void moe_threads_bitwise_identical(void **state)
{
    (void)state;
    mf_opts mo;
    fixture_opts(0, &mo);
    mo.experts = 16;
    mo.top_k = 4;
    mf_model m;
    mf_build(&mo, &m);
    ref_moe_weights w;
    mf_views(&m, 0, &w);
    td_rng rng;
    td_rng_seed(&rng, 90);
    const int64_t H = mo.hidden;
    static const int64_t Ms[] = {1, 5, 17};
    float x[17 * 64], out1[17 * 64], outn[17 * 64];
    for (size_t mi = 0; mi < 3; mi++) {
        const int64_t M = Ms[mi];
        fill_x(&rng, x, M * H, 1.0);
        for (int tpi = 0; tpi < 2; tpi++) {
            ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_BF16, tpi ? 2 : 1,
                              tpi ? TD_TP_RANK_ALL : 0};
            for (int th = 1; th <= 4; th++) {
                runner rn;
                runner_init(&rn, th);
                td_err err;
                assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, th == 1 ? out1 : outn, &err), TD_OK);
                if (th > 1) assert_memory_equal(out1, outn, (size_t)(M * H) * sizeof(float));
                runner_free(&rn);
            }
        }
    }
    mf_free(&m);
}

static void moe_invalid_ids_rejected(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(0, 2, &mo, &m, &w, &rn);
    const int64_t M = 2, H = mo.hidden;
    float x[2 * 64], out[2 * 64], wts[6] = {0.5f, 0.3f, 0.2f, 0.5f, 0.3f, 0.2f};
    for (int64_t i = 0; i < M * H; i++) x[i] = 0.01f * (float)i;
    static const int32_t bad[] = {-1, 8, 1000000, INT32_MIN};
    for (size_t b = 0; b < 4; b++) {
        int32_t ids[6] = {0, 1, 2, 3, 4, 5};
        ids[4] = bad[b];
        for (int64_t i = 0; i < M * H; i++) out[i] = NAN;
        ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_FP32, 1, 0};
        td_err err;
        td_err_clear(&err);
        assert_int_equal(run_block(&rn, &w, &o, x, M, ids, wts, out, &err), TD_ERR_RANGE);
        char needle[64];
        snprintf(needle, sizeof needle, "route id %d of token 1 slot 1", (int)bad[b]);
        if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
        for (int64_t i = 0; i < M * H; i++) assert_true(isnan(out[i]));
    }
    runner_free(&rn);
    mf_free(&m);
}

static void moe_faults_change_output(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(0, 2, &mo, &m, &w, &rn);
    td_rng rng;
    td_rng_seed(&rng, 100);
    const int64_t M = 4, H = mo.hidden;
    float x[4 * 64], base[4 * 64], out[4 * 64];
    fill_x(&rng, x, M * H, 0.3);
    td_err err;
    for (int f = 1; f < TD_FAULT_COUNT; f++) {
        ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_FP32, 4, 1};
        assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, base, &err), TD_OK);
        o.nx.fault = (td_fault)f;
        assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
        /* no_route_taps drops two taps and must leave every number as it is */
        const bool numbers = f != TD_FAULT_NO_ROUTE_TAPS;
        if (numbers && !memcmp(base, out, sizeof out)) fail_msg("fault %d leaves the output unchanged", f);
        if (!numbers && memcmp(base, out, sizeof out)) fail_msg("fault %d changes the output", f);
    }
    runner_free(&rn);
    mf_free(&m);
}

static void moe_router_only(void **state)
{
    (void)state;
    mf_opts mo;
    mf_model m;
    ref_moe_weights w;
    runner rn;
    open_fixture(1, 2, &mo, &m, &w, &rn);
    const int64_t M = 3, H = mo.hidden, E = mo.experts;
    float x[3 * 64], lg[3 * 8], out[3 * 64];
    td_rng rng;
    td_rng_seed(&rng, 110);
    fill_x(&rng, x, M * H, 1.0);
    ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_BF16, 1, 0};
    td_err err;
    assert_int_equal(ref_moe_ws_reserve(&rn.ws, &w, M, 2, &err), TD_OK);
    assert_int_equal(ref_moe_router(&w, &o, rn.pool, &rn.ws, x, M, lg, &err), TD_OK);
    naive_opts no = {TD_ACT_BF16, TD_ACCUM_FP32, false, 1, 0};
    for (int64_t t = 0; t < M; t++) {
        float xr[64];
        for (int64_t i = 0; i < H; i++) xr[i] = rnd(x[t * H + i], TD_ACT_BF16);
        for (int64_t e = 0; e < E; e++) assert_true(lg[t * E + e] == ndot(&m.layers[0].router, e, 0, H, xr, &no));
    }
    /* the block's logits are the same numbers */
    assert_int_equal(run_block(&rn, &w, &o, x, M, NULL, NULL, out, &err), TD_OK);
    assert_memory_equal(rn.ws.logits, lg, sizeof lg);
    /* a workspace that is too small is refused */
    assert_int_equal(ref_moe_router(&w, &o, rn.pool, &rn.ws, x, 1000, lg, &err), TD_ERR_INTERNAL);
    runner_free(&rn);
    mf_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(moe_round_act),
        cmocka_unit_test(moe_silu_sigmoid),
        cmocka_unit_test(moe_softmax),
        cmocka_unit_test(moe_topk_ties_and_nan),
        cmocka_unit_test(moe_renorm),
        cmocka_unit_test(moe_expert_shard),
        cmocka_unit_test(moe_block_matches_naive_numerics),
        cmocka_unit_test(moe_block_matches_naive_tp),
        cmocka_unit_test(moe_block_edge_inputs),
        cmocka_unit_test(moe_block_imposed_routes),
        cmocka_unit_test(moe_block_accuracy_vs_double),
        cmocka_unit_test(moe_tp_reduced_close_to_tp1),
        cmocka_unit_test(moe_threads_bitwise_identical),
        cmocka_unit_test(moe_invalid_ids_rejected),
        cmocka_unit_test(moe_faults_change_output),
        cmocka_unit_test(moe_router_only),
    };
    return cmocka_run_group_tests_name("ref_moe", tests, NULL, NULL);
}
