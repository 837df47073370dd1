/* test_cuda_moe.c — the CUDA engine's MoE block against the reference engine (GPU tests).
 *
 * Checkpoints come from tests/moe_fixture.h (real NVFP4 experts: ModelOpt and
 * compressed-tensors conventions, BF16 shared experts, BF16 per-expert weights). Covered:
 * - cuda vs ref at several shapes and M = 1, 4, 16 and 300 (more than one workspace chunk),
 *   natural routes and imposed route patterns, TP slices (one rank and tp_rank=all), bounded
 *   by the act dtype (the measured relative L2 is printed):
 *     ref:scale=fp16 (FP32 act)        vs cuda:act_dtype=fp32   rel L2 <= 1e-5 (only the
 *                                         accumulation order differs)
 *     ref:scale=fp16,act_dtype=fp16    vs cuda:act_dtype=fp16   rel L2 <= 4e-3
 *     ref:scale=fp16,act_dtype=bf16    vs cuda:act_dtype=bf16   rel L2 <= 3e-2
 *     ref (exact scales, FP32)         vs cuda (default: FP32 act, prepared FP16 scales)
 *                                                               rel L2 <= 2e-3
 *   (fp16/bf16: an accumulation-order difference of one FP32 ulp can move an intermediate
 *   by one act-dtype ulp, 2^-11 resp. 2^-8 relative, and such steps add up in W2 and the
 *   combine; the bounds are a few times that.) The top-k ids of the natural routes must be
 *   identical.
 * - every output element is written (outputs poisoned with NaN before each run), guard
 *   canaries on both sides of the output stay untouched, repeated calls give identical bits;
 * - a bad imposed route id (one, or all of them) fails with TD_ERR_RANGE before anything is
 *   written;
 * - exact pairs (memcmp of the outputs): storage=prepared vs raw (fp32, fp16, bf16), direct vs
 *   grouped dispatch (fp16, bf16, raw, TP), graphs=off vs on over a sequence of calls with
 *   changed inputs, changed sizes and changed routes between replays;
 * - a sweep of M = 1..17, 32, 784 with route patterns arange, mod 10, mod 17, one expert,
 *   reversed, random and the router's own, and activation scales 0.001, 0.1, 1, 3 (fp16
 *   tensor-core path against ref:scale=fp16,act_dtype=fp16, grouped == direct bit for bit);
 * - raw storage refused at load (TD_ERR_RANGE, naming tensor, element, code and reason) when
 *   one block scale is NaN or negative; grouped dispatch refused with act_dtype=fp32;
 * - the NVFP4 placements against the kernels' decodes (host), and the BF16 decode with its
 *   multiplication by 2^112 on the GPU, every code pair;
 * - the decode kernel (k_dec, and with direct dispatch W2 with the combine fused in, k_w2c)
 *   against the general kernels (kernels=generic: k_mm, k_combine), bit for bit, for
 *   fp16/bf16, prepared/raw, direct/grouped, graphs, TP slices, on a shape where every routed
 *   projection takes it, and against ref; with BF16 inputs of 7e4 to 3e5 in some groups;
 * - the block's input rounded and laid out for k_wgp in one launch (cu_mm_round_split) against
 *   the host's conversions and the layout's formula, with edge values and canaries; and staged
 *   for k_mm's decode-sized calls (cu_mm_round_stage), against the staged row's formula and k_mm
 *   from that image against k_mm staging its rows itself, bit for bit;
 * - the routing taps of a call of two workspace chunks (1,030 tokens, two calls of other inputs)
 *   against ref's: logits, each side's top-k following its logits (audit/routes.h), ids and
 *   weights;
 * - the grouping kernels' arrays (cu_mm_group) against a host counting sort, outputs poisoned;
 * - prefill-sized calls (the BF16 router and shared expert on k_wgp, its inputs laid out by the
 *   round, FP16 split into hi and lo, BF16 as they are; the NVFP4 projections
 *   with one warp per row tile) against decode-sized calls of the same tokens, bit for bit,
 *   and against ref; kernels=generic (k_mm, which at hidden 2048 stages K in two halves)
 *   against the default kernels on every fixture (fp16, and bf16 on two TP ranks);
 * - the combine from the engine's own 16-bit intermediates (taps), bit for bit, the routed W2
 *   with the combine fused in (k_w2c: direct dispatch, W2 on the decode kernel) among them,
 *   and the CUDA-core path at a hidden size that is no multiple of 4;
 * - routing with 1,100 experts (three per thread of the routing kernel) against ref's top-k
 *   ids, and a token whose logits are all NaN (experts 0..k-1, as ref; its neighbours
 *   unaffected).
 * - the engine's load returns with its device work done: with every SM held by a spinning
 *   kernel (cuda/busy.h) the legacy stream is idle after td_engine_load (a cudaMemset queued
 *   the same way stays pending: the control), and the first calls equal an idle load's.
 * TD_TEST_FILTER (a CMocka pattern, e.g. "cuda_load*") runs only the tests it names.
 * Without a CUDA device every test skips with a message.
 */
#include "test_common.h"
#include "engine_test.h"
#include "moe_fixture.h"
#include "cuda/nvfp4_layout.h"
#include "cuda/busy.h"
#include "cuda/dec_split.h"
#include "cuda/group_pack.h"
#include "engine.h"
#include "audit/engines.h"
#include "formats.h"
#include "ref/moe.h"
#include "audit/routes.h"
#include "audit/layer_audit.h"

#include <math.h>
#include <time.h>

#define GUARD 64
#define CANARY 12345.0f

/* true (after printing why) when this machine has no usable CUDA device. */
static bool no_gpu(const char *dir)
{
    td_variant v;
    td_err err;
    td_engine *e = NULL;
    assert_int_equal(td_variant_parse("cuda", &v, &err), TD_OK);
    td_status st = td_engine_load(dir, &v, &e, &err);
    td_engine_free(e);
    if (st == TD_ERR_UNSUPPORTED && strstr(err.msg, "no CUDA device")) {
        print_message("[  SKIP    ] no GPU: %s\n", err.msg);
        return true;
    }
    if (st) fail_msg("load cuda: %s", err.msg);
    return false;
}

static const char *fixture(const char *name, const mf_opts *o, mf_model *m)
{
    mf_build(o, m);
    const char *dir = td_test_path(name);
    mf_write(m, dir);
    return dir;
}

/* Output buffer [n] with GUARD canaries before and after, the n elements poisoned with NaN. */
/* Defaults with the given shape and seed (one layer). */
/* Taps of every layer's top-k ids on a ref engine (*tr) and a cuda engine (*tc), so that a
 * test compares the routes the two chose; the caller frees both. */
static void topk_taps(td_engine *er, td_engine *ec, td_taps **tr, td_taps **tc)
{
    static const char *const tp[] = {"L*.moe.topk"};
    td_err err;
    assert_int_equal(td_taps_new(tp, 1, tr, &err), TD_OK);
    assert_int_equal(td_taps_new(tp, 1, tc, &err), TD_OK);
    td_engine_set_taps(er, *tr);
    td_engine_set_taps(ec, *tc);
}

static void shape(mf_opts *o, uint64_t seed, int64_t hidden, int64_t experts, int64_t top_k, int64_t inter,
                  int64_t shared)
{
    mf_defaults(o);
    o->seed = seed;
    o->hidden = hidden;
    o->experts = experts;
    o->top_k = top_k;
    o->inter = inter;
    o->shared_inter = shared;
    o->layers = 1;
}

/* Without a GPU (checked on checkpoint `dir`), free the model and skip the test. */
static void skip_without_gpu(const char *dir, mf_model *m)
{
    if (no_gpu(dir)) {
        mf_free(m);
        skip();
    }
}

/* Write fixture `name`; without a GPU, free the model and skip the test. */
static const char *fixture_or_skip(const char *name, const mf_opts *o, mf_model *m)
{
    const char *dir = fixture(name, o, m);
    skip_without_gpu(dir, m);
    return dir;
}

static float *guarded(size_t n)
{
    float *b = malloc((n + 2 * GUARD) * sizeof *b);
    assert_non_null(b);
    for (size_t i = 0; i < n + 2 * GUARD; i++) b[i] = CANARY;
    for (size_t i = 0; i < n; i++) b[GUARD + i] = NAN;
    return b;
}

static void check_guards(const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        if (b[i] != CANARY || b[GUARD + n + i] != CANARY) fail_msg("%s: a guard canary was overwritten", what);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

typedef struct pair_case {
    const char *ref, *cuda;
    double bound;
} pair_case;

/* Route pattern p for M tokens, k slots, E experts (weights positive, summing to 1). */
static void routes(int p, int64_t M, int64_t k, int64_t E, int32_t *ids, float *w)
{
    for (int64_t t = 0; t < M; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t id;
            switch (p) {
            case 0: id = (t * k + j) % E; break;            /* arange */
            case 1: id = ((t * k + j) % 10) % E; break;     /* mod 10 */
            case 2: id = 0; break;                          /* all one expert */
            case 3: id = (E - 1 - (t + j) % E + E) % E; break; /* reversed */
            case 4: id = ((t * k + j) % 17) % E; break;     /* mod 17 */
            default: {                                      /* random, distinct per token */
                uint64_t h = (uint64_t)(t * 1000003 + j * 7919 + 12345) * 0x9E3779B97F4A7C15ull;
                id = (int64_t)((h >> 33) % (uint64_t)E);
                for (int64_t i = 0; i < j; i++)
                    if (ids[t * k + i] == id) { id = (id + 1) % E; i = -1; }
            }
            }
            ids[t * k + j] = (int32_t)id;
            w[t * k + j] = (float)(j + 1) / (float)(k * (k + 1) / 2);
        }
}

static const char *pattern_name(int p)
{
    static const char *const n[] = {"arange", "mod10", "one", "rev", "mod17", "random"};
    return p < 0 ? "router" : p < 6 ? n[p] : "?";
}

/* Run `ref` and `cuda` on layer L for M seeded tokens (natural routes, or pattern p >= 0) and
 * check the bound, the poison, the canaries and repeat determinism of cuda. */
static void compare_s(const char *dir, const char *rv, const char *cv, double bound, int64_t L, int64_t M, int p,
                      float xs, const char *tag)
{
    td_engine *er = td_test_engine(dir, rv), *ec = td_test_engine(dir, cv);
    const td_engine_model *mi = td_engine_model_info(ec);
    const int64_t H = mi->hidden, k = mi->top_k, E = mi->num_experts;
    const size_t n = (size_t)(M * H);
    float *x = malloc(n * sizeof *x), *want = guarded(n), *got = guarded(n), *again = guarded(n);
    int32_t *ids = malloc((size_t)(M * k) * sizeof *ids);
    float *w = malloc((size_t)(M * k) * sizeof *w);
    assert_true(x && ids && w);
    td_rng rng;
    td_rng_seed(&rng, (uint64_t)(1000 + L * 31 + M));
    for (size_t i = 0; i < n; i++) x[i] = xs * td_rng_normal_f32(&rng);
    if (p >= 0) routes(p, M, k, E, ids, w);
    td_taps *tr = NULL, *tc = NULL;
    td_err err;
    topk_taps(er, ec, &tr, &tc);
    td_block_call cr = {L, TD_BLOCK_MOE, M, x, want + GUARD, p >= 0 ? ids : NULL, p >= 0 ? w : NULL};
    td_block_call cc = cr, c2 = cr;
    cc.output = got + GUARD;
    c2.output = again + GUARD;
    if (td_engine_run_block(er, &cr, &err)) fail_msg("%s: %s", rv, err.msg);
    if (td_engine_run_block(ec, &cc, &err)) fail_msg("%s: %s", cv, err.msg);
    if (td_engine_run_block(ec, &c2, &err)) fail_msg("%s (repeat): %s", cv, err.msg);
    check_guards(got, n, cv);
    check_guards(again, n, cv);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(got[GUARD + i])) fail_msg("%s %s M=%lld: output %zu not finite (unwritten?)", tag, cv, (long long)M, i);
    if (memcmp(got + GUARD, again + GUARD, n * sizeof(float)))
        fail_msg("%s %s M=%lld: repeated call differs", tag, cv, (long long)M);
    if (M <= 256) {
        char name[32];
        snprintf(name, sizeof name, "L%lld.moe.topk", (long long)L);
        const td_tap *a = td_taps_find(tr, name), *b = td_taps_find(tc, name);
        if (!a || !b) fail_msg("%s: topk tap missing", tag);
        if (memcmp(a->data, b->data, (size_t)(M * k) * sizeof(int32_t)))
            fail_msg("%s %s vs %s M=%lld: top-k ids differ", tag, rv, cv, (long long)M);
    }
    const double r = rel_l2(got + GUARD, want + GUARD, n);
    print_message("  %-10s L%lld M=%-3lld %-6s x%-5g %-40s vs %-32s rel_l2 %.3e (bound %.0e)\n", tag, (long long)L,
                  (long long)M, pattern_name(p), (double)xs, rv, cv, r, bound);
    if (!(r <= bound)) fail_msg("%s %s vs %s M=%lld: rel_l2 %.3e above %.0e", tag, rv, cv, (long long)M, r, bound);
    td_engine_free(er);
    td_engine_free(ec);
    td_taps_free(tr);
    td_taps_free(tc);
    free(x);
    free(want);
    free(got);
    free(again);
    free(ids);
    free(w);
}

static void compare(const char *dir, const char *rv, const char *cv, double bound, int64_t L, int64_t M, int p,
                    const char *tag)
{
    compare_s(dir, rv, cv, bound, L, M, p, 0.5f, tag);
}

/* Outputs of variants a and b on the same calls must be identical bits. The calls: for each
 * (M, pattern, seed) of `seq` in order, on engines kept loaded (so graphs are replayed with
 * new inputs and routes). big > 0: every 7th token (from token 3) gets one input of magnitude
 * big (signs alternating), beside inputs of 0.5 x normal; big < 0: every 5th token (from token
 * 0) has its inputs multiplied by -big instead. */
typedef struct exact_call {
    int64_t M;
    int p;
    uint64_t seed;
    float big;
} exact_call;

static void exact_seq(const char *dir, const char *va, const char *vb, int64_t L, const exact_call *seq, size_t n_seq,
                      const char *tag)
{
    td_engine *ea = td_test_engine(dir, va), *eb = td_test_engine(dir, vb);
    const td_engine_model *mi = td_engine_model_info(ea);
    const int64_t H = mi->hidden, k = mi->top_k, E = mi->num_experts;
    for (size_t si = 0; si < n_seq; si++) {
        const int64_t M = seq[si].M;
        const size_t n = (size_t)(M * H);
        float *x = malloc(n * sizeof *x), *oa = guarded(n), *ob = guarded(n);
        int32_t *ids = malloc((size_t)(M * k) * sizeof *ids);
        float *w = malloc((size_t)(M * k) * sizeof *w);
        assert_true(x && ids && w);
        td_rng rng;
        td_rng_seed(&rng, seq[si].seed);
        for (size_t i = 0; i < n; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
        if (seq[si].big > 0)
            for (int64_t t = 3; t < M; t += 7) x[t * H + (t * 131) % H] = (t / 7) % 2 ? -seq[si].big : seq[si].big;
        if (seq[si].big < 0)
            for (int64_t t = 0; t < M; t += 5)
                for (int64_t i = 0; i < H; i++) x[t * H + i] *= -seq[si].big;
        const int p = seq[si].p;
        if (p >= 0) routes(p, M, k, E, ids, w);
        td_block_call ca = {L, TD_BLOCK_MOE, M, x, oa + GUARD, p >= 0 ? ids : NULL, p >= 0 ? w : NULL};
        td_block_call cb = ca;
        cb.output = ob + GUARD;
        td_err err;
        if (td_engine_run_block(ea, &ca, &err)) fail_msg("%s: %s", va, err.msg);
        if (td_engine_run_block(eb, &cb, &err)) fail_msg("%s: %s", vb, err.msg);
        check_guards(oa, n, va);
        check_guards(ob, n, vb);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(oa[GUARD + i])) fail_msg("%s %s M=%lld: output %zu not finite", tag, va, (long long)M, i);
            diff += memcmp(&oa[GUARD + i], &ob[GUARD + i], sizeof(float)) != 0;
        }
        if (diff)
            fail_msg("%s %s vs %s M=%lld %s: %zu of %zu outputs differ (expected identical bits)", tag, va, vb,
                     (long long)M, pattern_name(p), diff, n);
        free(x);
        free(oa);
        free(ob);
        free(ids);
        free(w);
    }
    print_message("  %-10s L%lld %-46s == %-46s %zu calls identical\n", tag, (long long)L, va, vb, n_seq);
    td_engine_free(ea);
    td_engine_free(eb);
}

/* exact_seq of each variant against the same variant with kernels=generic (layer 0). */
static void exact_vs_generic(const char *dir, const char *const *vs, size_t nv, const exact_call *seq, size_t n_seq,
                             const char *tag)
{
    for (size_t i = 0; i < nv; i++) {
        char generic[128];
        snprintf(generic, sizeof generic, "%s,kernels=generic", vs[i]);
        exact_seq(dir, vs[i], generic, 0, seq, n_seq, tag);
    }
}

static const pair_case pairs[] = {
    {"ref:scale=fp16", "cuda:act_dtype=fp32", 1e-5},
    {"ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16", 4e-3},
    {"ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16", 3e-2},
    {"ref", "cuda", 2e-3},
    {"ref:scale=fp16,tp_size=2,tp_rank=1", "cuda:act_dtype=fp32,tp_size=2,tp_rank=1", 1e-5},
    {"ref:scale=fp16,act_dtype=fp16,tp_size=4,tp_rank=all", "cuda:act_dtype=fp16,tp_size=4,tp_rank=all", 4e-3},
};

static const exact_call seq_default[] = {
    {1, -1, 1, 0}, {4, -1, 2, 0}, {4, 5, 3, 0}, {16, -1, 4, 0}, {4, -1, 5, 0}, {16, 2, 6, 0},
    {300, -1, 7, 0}, {1, -1, 8, 0}, {1, 0, 9, 0}, {1030, -1, 10, 0}, {4, 3, 11, 0},
};

/* Variant pairs that must agree bit for bit. `nvfp4`: only for NVFP4 experts (raw storage). */
typedef struct exact_pair {
    const char *a, *b;
    bool nvfp4;
} exact_pair;

static const exact_pair exact_pairs[] = {
    {"cuda:act_dtype=fp32", "cuda:act_dtype=fp32,storage=raw", true},
    {"cuda:act_dtype=fp16", "cuda:act_dtype=fp16,storage=raw", true},
    {"cuda:act_dtype=bf16", "cuda:act_dtype=bf16,storage=raw", true},
    {"cuda:act_dtype=fp16", "cuda:act_dtype=fp16,moe_dispatch=grouped", false},
    {"cuda:act_dtype=bf16", "cuda:act_dtype=bf16,moe_dispatch=grouped", false},
    {"cuda:act_dtype=fp16,storage=raw", "cuda:act_dtype=fp16,storage=raw,moe_dispatch=grouped", true},
    {"cuda:act_dtype=fp16,tp_size=2,tp_rank=all", "cuda:act_dtype=fp16,tp_size=2,tp_rank=all,moe_dispatch=grouped",
     false},
    {"cuda:act_dtype=fp16", "cuda:act_dtype=fp16,graphs=on", false},
    {"cuda:act_dtype=bf16,moe_dispatch=grouped", "cuda:act_dtype=bf16,moe_dispatch=grouped,graphs=on", false},
    {"cuda:act_dtype=fp32", "cuda:act_dtype=fp32,graphs=on", false},
    /* prefill-sized BF16 router and shared expert on k_wgp against k_mm */
    {"cuda:act_dtype=fp16", "cuda:act_dtype=fp16,kernels=generic", false},
    {"cuda:act_dtype=bf16,tp_size=2,tp_rank=all", "cuda:act_dtype=bf16,tp_size=2,tp_rank=all,kernels=generic", false},
};

static void run_fixture(const char *name, const mf_opts *o)
{
    mf_model m;
    const char *dir = fixture_or_skip(name, o, &m);
    static const int64_t Ms[] = {1, 4, 16, 300};
    for (size_t pi = 0; pi < TD_ARRAY_LEN(pairs); pi++)
        for (size_t mi = 0; mi < TD_ARRAY_LEN(Ms); mi++)
            for (int64_t L = 0; L < o->layers; L++) compare(dir, pairs[pi].ref, pairs[pi].cuda, pairs[pi].bound, L, Ms[mi], -1, name);
    for (int p = 0; p < 6; p++) compare(dir, pairs[1].ref, pairs[1].cuda, pairs[1].bound, 0, 16, p, name);
    for (size_t i = 0; i < TD_ARRAY_LEN(exact_pairs); i++) {
        if (exact_pairs[i].nvfp4 && o->fmt == MF_BF16) continue;
        exact_seq(dir, exact_pairs[i].a, exact_pairs[i].b, o->layers - 1, seq_default, TD_ARRAY_LEN(seq_default), name);
    }
    mf_free(&m);
}

/* Every M in 1..17, 32 and 784, every route pattern and activation scales 0.001 .. 3 on the
 * fp16 tensor-core path; then the same calls direct vs grouped, bit for bit. */
static void cuda_sweep(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 25, 512, 64, 8, 128, 256);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_sweep", &o, &m);
    const char *rv = "ref:scale=fp16,act_dtype=fp16", *cv = "cuda:act_dtype=fp16,moe_dispatch=grouped";
    exact_call seq[64];
    size_t n = 0;
    for (int64_t M = 1; M <= 17; M++) {
        compare(dir, rv, cv, 4e-3, 0, M, M % 2 ? -1 : 5, "sweep");
        seq[n++] = (exact_call){M, M % 2 ? -1 : 5, (uint64_t)(100 + M), 0};
    }
    compare(dir, rv, cv, 4e-3, 0, 32, 5, "sweep");
    compare(dir, rv, cv, 4e-3, 0, 784, -1, "sweep");
    compare(dir, rv, cv, 4e-3, 0, 784, 5, "sweep");
    seq[n++] = (exact_call){32, 5, 132, 0};
    seq[n++] = (exact_call){784, -1, 784, 0};
    seq[n++] = (exact_call){784, 5, 785, 0};
    /* every pattern at 2, 3, 5 and 16 tokens (packs of 8, 4, 8, 8: an expert repeated within a
     * token, as in the all-one-expert pattern, is cut into several packs) */
    static const int64_t pM[] = {2, 3, 5, 16};
    for (int p = 0; p < 6; p++)
        for (size_t i = 0; i < TD_ARRAY_LEN(pM); i++) {
            compare(dir, rv, cv, 4e-3, 0, pM[i], p, "pattern");
            seq[n++] = (exact_call){pM[i], p, (uint64_t)(200 + 100 * i + (size_t)p), 0};
        }
    /* At x ~ 0.001 most FP16 intermediates (SwiGLU products ~1e-6) are FP16 subnormals, whose
     * spacing 2^-24 is a large fraction of their value: one accumulation-order step moves them
     * by a relative 1e-2 or more, so the bound there is wider. */
    static const float scales[] = {0.001f, 0.1f, 1.0f, 3.0f};
    static const double sbound[] = {3e-2, 4e-3, 4e-3, 4e-3};
    for (size_t i = 0; i < TD_ARRAY_LEN(scales); i++) {
        compare_s(dir, rv, cv, sbound[i], 0, 8, -1, scales[i], "scale");
        compare_s(dir, rv, cv, sbound[i], 0, 8, 5, scales[i], "scale");
    }
    exact_seq(dir, "cuda:act_dtype=fp16", cv, 0, seq, n, "sweep");
    exact_seq(dir, "cuda:act_dtype=bf16", "cuda:act_dtype=bf16,moe_dispatch=grouped,graphs=on", 0, seq, n, "sweep");
    mf_free(&m);
}

/* Grouped dispatch with many experts: at 3,000 experts and 784 tokens the grouping kernel's
 * per-segment counts do not fit one segment per warp, so it runs on fewer segments (16);
 * grouped must still match ref and give the same bits as direct. */
static void cuda_grouping_wide(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 33, 64, 3000, 8, 32, 32);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_group_wide", &o, &m);
    const char *rv = "ref:scale=fp16,act_dtype=fp16", *cv = "cuda:act_dtype=fp16,moe_dispatch=grouped";
    compare(dir, rv, cv, 4e-3, 0, 784, -1, "group");
    compare(dir, rv, cv, 4e-3, 0, 784, 5, "group");
    const exact_call seq[] = {{1, -1, 901, 0}, {40, 5, 902, 0}, {784, -1, 903, 0}, {784, 5, 904, 0}, {300, 4, 905, 0}};
    exact_seq(dir, "cuda:act_dtype=fp16", cv, 0, seq, TD_ARRAY_LEN(seq), "group");
    mf_free(&m);
}

/* Raw storage must be refused at load, naming the tensor, element, code and reason, when a
 * block scale cannot be kept raw bit-exactly; prepared storage still loads. */
static void cuda_raw_admission(void **state)
{
    (void)state;
    static const struct {
        uint8_t code;
        const char *reason;
    } bad[] = {{0x7F, "nan_code"}, {0xB8, "negative_code"}, {0x00, "zero_code"}, {0x03, "subnormal_code"}};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        mf_opts o;
        mf_defaults(&o);
        o.seed = 26;
        mf_model m;
        mf_build(&o, &m);
        m.layers[0].up[2].scales[5] = bad[i].code;
        const char *dir = td_test_path("gpu_rawbad");
        mf_write(&m, dir);
        skip_without_gpu(dir, &m);
        static const char *const vs[] = {"cuda:storage=raw", "cuda:storage=raw,act_dtype=fp16"};
        for (size_t j = 0; j < TD_ARRAY_LEN(vs); j++) {
            td_variant v;
            td_err err;
            td_engine *e = NULL;
            assert_int_equal(td_variant_parse(vs[j], &v, &err), TD_OK);
            assert_int_equal(td_engine_load(dir, &v, &e, &err), TD_ERR_RANGE);
            assert_null(e);
            print_message("  %s refused: %s\n", vs[j], err.msg);
            assert_non_null(strstr(err.msg, "experts.2.up_proj"));
            assert_non_null(strstr(err.msg, bad[i].reason));
            char at[32];
            snprintf(at, sizeof at, "[%lld, %lld]", (long long)(5 / (o.hidden / 16)), (long long)(5 % (o.hidden / 16)));
            assert_non_null(strstr(err.msg, at));
        }
        td_engine *e = td_test_engine(dir, "cuda:act_dtype=fp16");
        /* an audit stopped by the refusal still names the GPU of the engine that loaded first */
        static const int64_t zero[] = {0}, one[] = {1};
        static const double scale[] = {0.1};
        static const td_route_kind route[] = {TD_ROUTE_ROUTER};
        td_layer_pair pair;
        td_err err;
        assert_int_equal(td_layer_pair_parse("cuda:act_dtype=fp16,cuda:storage=raw,act_dtype=fp16", &pair, &err), TD_OK);
        td_layer_audit_opts ao;
        td_layer_audit_opts_init(&ao);
        ao.model = dir;
        ao.layers = ao.ranks = zero;
        ao.n_layers = ao.n_ranks = 1;
        ao.tokens = one;
        ao.n_tokens = 1;
        ao.scales = scale;
        ao.n_scales = 1;
        ao.routes = route;
        ao.n_routes = 1;
        ao.pairs = &pair;
        ao.n_pairs = 1;
        td_layer_summary sum;
        memset(&sum, 0x5a, sizeof sum);
        assert_int_equal(td_layer_audit_run(&ao, NULL, &sum, &err), TD_ERR_RANGE);
        assert_non_null(strstr(err.msg, bad[i].reason));
        assert_string_equal(sum.device.gpu_name, td_engine_device_info(e)->gpu_name);
        assert_string_equal(sum.device.gpu_driver, td_engine_device_info(e)->gpu_driver);
        assert_null(sum.groups);
        assert_int_equal(sum.checks, 0);
        td_layer_summary_free(&sum);
        td_engine_free(e);
        mf_free(&m);
    }
}

static void cuda_vs_ref_modelopt(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    o.seed = 21;
    run_fixture("gpu_mo", &o);
}

static void cuda_vs_ref_ct_bf16_shared(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    o.seed = 22;
    o.fmt = MF_CT;
    o.shared_bf16 = true;
    o.hidden = 128;
    o.experts = 16;
    o.top_k = 4;
    o.inter = 128;
    o.shared_inter = 64;
    run_fixture("gpu_ct", &o);
}

static void cuda_vs_ref_bf16_experts(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    o.seed = 23;
    o.fmt = MF_BF16;
    o.hidden = 96; /* not a multiple of 32 lanes x 16: exercises partial blocks */
    o.layers = 1;
    run_fixture("gpu_bf", &o);
}

static void cuda_vs_ref_wide(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 24, 1024, 64, 8, 256, 512);
    run_fixture("gpu_wide", &o);
}

/* The decode kernel (k_dec: NVFP4 calls with at most 16 slots per group whose K cut has
 * chunks of 10 or 5 steps; one or two 8-token tiles) against the general kernel, bit for bit,
 * and against the reference. The shape is chosen so that every routed projection qualifies:
 * hidden 640 (W13: 20 steps, 2 chunks of 10), inter 320 (W2: 10 steps, 1 chunk; 160 per rank
 * with tp_size=2: 5 steps), shared 160. */
static void cuda_decode_kernel(void **state)
{
    (void)state;
    mf_opts o;
    /* W13 (K = 640: two chunks of 10 steps, 5 items per slot) with direct dispatch has more
     * items than the decode kernel's grid from M = 14 on a 132-SM GPU (84 slots, 420 items on
     * 396 blocks), so the calls of M = 14 to 17, 32 and 784 below also take its last items by
     * chunks (cuda/moe_mma.cu, dec_tail_run), checked bit for bit against kernels=generic. */
    shape(&o, 27, 640, 32, 6, 320, 160);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_dec", &o, &m);
    exact_call seq[40];
    size_t n = 0;
    for (int64_t M = 1; M <= 17; M++) {
        seq[n++] = (exact_call){M, M % 3 == 0 ? 5 : -1, (uint64_t)(400 + M), 0};
        compare(dir, "ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16", 4e-3, 0, M, M % 2 ? -1 : 5, "dec");
    }
    for (int p = 0; p < 6; p++) seq[n++] = (exact_call){8, p, (uint64_t)(500 + p), 0};
    seq[n++] = (exact_call){32, -1, 532, 0};
    seq[n++] = (exact_call){1, -1, 533, 0};
    seq[n++] = (exact_call){300, -1, 534, 0}; /* grouped: packs of 16, two 8-token tiles */
    seq[n++] = (exact_call){784, 5, 535, 0};
    compare(dir, "ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16,moe_dispatch=grouped", 4e-3, 0, 784, -1, "dec");
    compare(dir, "ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16,storage=raw", 3e-2, 0, 4, -1, "dec");
    /* BF16 rows of 1e9 (staged times 2^97; W2's rows of about 1e18 times 2^67) against ref */
    compare_s(dir, "ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16", 3e-2, 0, 8, -1, 1e9f, "dec");
    compare_s(dir, "ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16,moe_dispatch=grouped", 3e-2, 0, 300, -1, 1e9f,
              "dec");
    compare(dir, "ref", "cuda:act_dtype=fp16,tp_size=2,tp_rank=all", 2e-3, 0, 16, -1, "dec");
    static const char *const vs[] = {
        "cuda:act_dtype=fp16",
        "cuda:act_dtype=bf16",
        "cuda:act_dtype=bf16,moe_dispatch=grouped",
        "cuda:act_dtype=fp16,storage=raw",
        "cuda:act_dtype=bf16,storage=raw,graphs=on",
        "cuda:act_dtype=fp16,moe_dispatch=grouped",
        "cuda:act_dtype=fp16,tp_size=2,tp_rank=all",
        "cuda:act_dtype=bf16,storage=raw,tp_size=2,tp_rank=1",
    };
    exact_vs_generic(dir, vs, TD_ARRAY_LEN(vs), seq, n, "dec");
    /* BF16 inputs of 7e4 to 1e15 (outlier channels; 2^16 and more, so that their rows are staged
     * times less than 2^112: bf16_row_shift), and tokens scaled to 1e-38 (BF16 subnormals among
     * normals, staged times 2^112): such tokens in some groups and not in others, in W13's input
     * and (through the SwiGLU) in W2's. */
    static const exact_call big[] = {{17, -1, 600, 3e5f},  {8, 5, 601, 7e4f},     {300, -1, 602, 3e5f},
                                     {784, 5, 603, 1e5f},  {5, -1, 604, 0},       {16, -1, 605, 1e15f},
                                     {1, -1, 606, -1e-38f}, {33, 5, 607, -1e-38f}, {784, -1, 608, -1e-38f}};
    static const char *const vb[] = {"cuda:act_dtype=bf16", "cuda:act_dtype=bf16,moe_dispatch=grouped",
                                     "cuda:act_dtype=bf16,storage=raw,moe_dispatch=grouped"};
    exact_vs_generic(dir, vb, TD_ARRAY_LEN(vb), big, TD_ARRAY_LEN(big), "big");
    mf_free(&m);
}

/* The routed W2 with the combine fused in (k_w2c) on rows longer than one round of its staging
 * loads: W2's K = inter = 1280 is 160 groups of 16 bytes per row, more than a warp's 4 x 32, so
 * w2c_stage applies a BF16 row's power of two in a second pass over the lane's own stores
 * instead of in registers (cuda/moe_mma.cu). Hidden 320 (W2's 20 row tiles), top-10, direct
 * dispatch: at M = 1, 2 and 4 td_w2c_pays takes k_w2c on a 132-SM GPU (4 chunk rounds, as
 * k_dec's). fp16 and bf16 bit for bit against kernels=generic (bf16 also with one input of 3e5
 * or 1e15 in token 3 and a token scaled to 1e-38), and against ref (bf16 also at inputs of 1e9). */
static void cuda_w2c_long_rows(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 35, 320, 32, 10, 1280, 160);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_w2c_long", &o, &m);
    compare(dir, "ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16", 4e-3, 0, 1, -1, "w2cl");
    compare(dir, "ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16", 3e-2, 0, 2, 5, "w2cl");
    /* random routes: with the router's, inputs of 1e9 make its weights one-hot and the output a
     * sum of BF16 values, which the accumulation order rarely reaches */
    compare_s(dir, "ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16", 3e-2, 0, 4, 5, 1e9f, "w2cl");
    static const exact_call seq16[] = {{1, -1, 700, 0}, {2, 5, 701, 0}, {4, -1, 702, 0}, {4, 5, 704, 0}};
    static const exact_call seq[] = {{1, -1, 700, 0},   {2, 5, 701, 0},      {4, -1, 702, 3e5f},
                                     {1, -1, 703, -1e-38f}, {4, 5, 704, 1e15f}, {4, -1, 705, -1e-38f}};
    static const char *const v16[] = {"cuda:act_dtype=fp16"}; /* (inputs past 65504 overflow FP16) */
    static const char *const vs[] = {"cuda:act_dtype=bf16", "cuda:act_dtype=bf16,graphs=on"};
    exact_vs_generic(dir, v16, TD_ARRAY_LEN(v16), seq16, TD_ARRAY_LEN(seq16), "w2cl");
    exact_vs_generic(dir, vs, TD_ARRAY_LEN(vs), seq, TD_ARRAY_LEN(seq), "w2cl");
    mf_free(&m);
}

/* The decode kernel's last items by chunks with grouped dispatch, where the host cannot know
 * whether a launch takes them (the groups are counted on the device: cuda/dec_split.h,
 * td_dec_tail_possible) and launches the kernel with the tail's code whenever it may. 128
 * experts, top-8, hidden 640 (W13: 2 chunks, 5 items per group), inter 320, random routes
 * (pattern 5, distinct per token): at 12 to 31 tokens the groups (an expert's slots in packs of
 * td_group_pack's 8) vary from about 70 to 110, so on a 132-SM GPU (grid 396)
 * some calls have fewer items than blocks, some a remainder by chunks and some one too large
 * for one round; the test counts them and needs each kind at least twice. Direct dispatch
 * takes the tail from M = 10 on (80 slots, 400 items). Every call bit for bit against
 * kernels=generic. */
static void cuda_decode_grouped_tail(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 28, 640, 128, 8, 320, 160);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_dec_wide", &o, &m);
    exact_call seq[24];
    size_t n = 0;
    int kinds[3] = {0, 0, 0}; /* fewer items than blocks, a tail, a remainder beyond one round */
    for (int64_t M = 12; M <= 31; M++) {
        enum { K = 8, E = 128, B = 132 * 3 };
        int32_t ids[31 * K];
        float w[31 * K];
        int count[E] = {0};
        routes(5, M, K, E, ids, w);
        for (int64_t i = 0; i < M * K; i++) count[ids[i]]++;
        const int P = (int)td_group_pack(M * K, M, 0); /* the engine's pack for this call */
        int groups = 0;
        for (int e = 0; e < E; e++) groups += (count[e] + P - 1) / P;
        td_dec_split sp;
        td_dec_split_of(groups * 5, 2, 8, B, 0, &sp);
        kinds[groups * 5 <= B ? 0 : sp.tail_n > 0 ? 1 : 2]++;
        seq[n++] = (exact_call){M, 5, (uint64_t)(700 + M), 0};
    }
    print_message("  grouped W13 calls on a 132-SM GPU: %d with fewer items than blocks, %d with a tail by "
                  "chunks, %d with a remainder beyond one round\n", kinds[0], kinds[1], kinds[2]);
    assert_true(kinds[0] >= 2 && kinds[1] >= 2 && kinds[2] >= 2);
    seq[n++] = (exact_call){17, -1, 731, 0};
    seq[n++] = (exact_call){4, -1, 732, 0};
    static const char *const vs[] = {
        "cuda:act_dtype=fp16,moe_dispatch=grouped",
        "cuda:act_dtype=bf16,storage=raw,moe_dispatch=grouped",
        "cuda:act_dtype=fp16",
    };
    exact_vs_generic(dir, vs, TD_ARRAY_LEN(vs), seq, n, "dectail");
    compare(dir, "ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16,moe_dispatch=grouped", 4e-3, 0, 20, 5, "dectail");
    mf_free(&m);
}

/* The decode kernel's narrow blocks (4 warps, 7 per SM: cuda/dec_split.h, td_dec_narrow_pays),
 * which the engine takes only where the 8-warp blocks leave warps idle or a row tile is one
 * chunk. 128 experts, top-10, hidden 640, inter 160: W13 has 20 row tiles (three items of 8, the
 * last with 4 warps idle) of 2 chunks, W2 40 row tiles of one chunk. On a 132-SM GPU (396 8-warp
 * blocks, 924 narrow) direct dispatch takes them for W13 at M = 14, 16 and 32 (3, 3 and 5 rounds
 * against 2, 2 and 4; at M = 8 2 either way) and, with raw storage (no fused W2), for W2 at
 * M = 8, 16 and 32 (2, 3 and 5 against 1, 2 and 4). Every call bit for bit against
 * kernels=generic (which has no narrow blocks) and against grouped dispatch (8-warp blocks), and
 * one against the reference. */
static void cuda_decode_narrow(void **state)
{
    (void)state;
    enum { B8 = 132 * 3, BN = 132 * TD_DEC_NARROW_BLOCKS };
    static const struct { int M, takes; } w13[] = {{8, 0}, {14, 1}, {16, 1}, {32, 1}};
    for (size_t i = 0; i < TD_ARRAY_LEN(w13); i++) {
        const int g = 10 * w13[i].M, n8 = g * 3, nn = g * 5;
        assert_int_equal(td_dec_narrow_pays(g, 20, 2, n8 < B8 ? n8 : B8, nn < BN ? nn : BN), w13[i].takes);
    }
    static const struct { int M, takes; } w2[] = {{8, 1}, {16, 1}, {32, 1}};
    for (size_t i = 0; i < TD_ARRAY_LEN(w2); i++) {
        const int g = 10 * w2[i].M, n8 = g * 5, nn = g * 10;
        assert_int_equal(td_dec_narrow_pays(g, 40, 1, n8 < B8 ? n8 : B8, nn < BN ? nn : BN), w2[i].takes);
    }
    mf_opts o;
    shape(&o, 29, 640, 128, 10, 160, 160);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_dec_narrow", &o, &m);
    static const exact_call seq[] = {
        {14, -1, 800, 0}, {16, -1, 801, 0}, {32, -1, 802, 0}, {8, -1, 803, 0}, {16, 5, 804, 0}, {1, -1, 805, 0},
    };
    static const char *const vs[] = {
        "cuda:act_dtype=fp16",
        "cuda:act_dtype=bf16,storage=raw",
        "cuda:act_dtype=fp16,storage=raw",
    };
    exact_vs_generic(dir, vs, TD_ARRAY_LEN(vs), seq, TD_ARRAY_LEN(seq), "narrow");
    exact_seq(dir, "cuda:act_dtype=fp16", "cuda:act_dtype=fp16,moe_dispatch=grouped", 0, seq, TD_ARRAY_LEN(seq),
              "narrow");
    exact_seq(dir, "cuda:act_dtype=bf16,storage=raw", "cuda:act_dtype=bf16,storage=raw,moe_dispatch=grouped", 0, seq,
              TD_ARRAY_LEN(seq), "narrow");
    compare(dir, "ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16", 4e-3, 0, 16, -1, "narrow");
    mf_free(&m);
}

/* Prefill-sized calls take other paths than decode-sized ones (the BF16 router and shared
 * expert on k_wgp, wgmma over 64 or 128 rows by 64 tokens per block, the inputs laid out by
 * the round (router, shared W13) or by k_wsplit (shared W2), FP16 inputs split into hi and
 * lo, BF16 inputs as they are, in a ring of stages; with
 * kernels=generic on k_mm, which with FP16 inputs at this K stages its rows in two halves of K,
 * one after the other; the NVFP4 experts with a row tile's chunks on one warp instead of
 * several), which by the numerics contract give the same bits. Hidden 2048 (64 steps in 8
 * chunks of 8: k_mm's staged rows of 16 tokens would take 133 KB, so they are staged in
 * halves), BF16 shared expert: a 300-token call against the ref bound; its first and last 5
 * tokens bit for bit (outputs and top-k ids) against calls of those 5 tokens alone; and
 * calls of 300, 37 and 1,600 tokens against kernels=generic (at 1,600 tokens the shared
 * expert's W2, 2,048 rows, has 400 blocks of 128 rows: k_wgp's two-warpgroup blocks on any GPU
 * of up to 444 SMs; the router and the shared W13 keep blocks of 64 rows). */
static void cuda_prefill_parts(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 29, 2048, 16, 4, 64, 128);
    o.shared_bf16 = true;
    mf_model m;
    const char *dir = fixture_or_skip("gpu_parts", &o, &m);
    static const char *const v = "cuda:act_dtype=fp16";
    compare(dir, "ref:scale=fp16,act_dtype=fp16", v, 4e-3, 0, 300, -1, "parts");
    static const exact_call seq[] = {{300, -1, 2901, 0}, {37, -1, 2902, 0}, {300, 5, 2903, 0}, {1600, -1, 2904, 0}};
    exact_seq(dir, v, "cuda:act_dtype=fp16,kernels=generic", 0, seq, TD_ARRAY_LEN(seq), "parts");
    exact_seq(dir, "cuda:act_dtype=bf16", "cuda:act_dtype=bf16,kernels=generic", 0, seq, TD_ARRAY_LEN(seq), "parts");
    const int64_t H = o.hidden, k = o.top_k, M = 300, m5 = 5;
    float *x = malloc((size_t)(M * H) * sizeof *x), *y = malloc((size_t)(M * H) * sizeof *y),
          *y5 = malloc((size_t)(m5 * H) * sizeof *y5);
    int32_t *ids = malloc((size_t)(M * k) * sizeof *ids);
    assert_true(x && y && y5 && ids);
    td_rng rng;
    td_rng_seed(&rng, 2903);
    for (int64_t i = 0; i < M * H; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
    td_engine *e = td_test_engine(dir, v);
    td_taps *t = NULL;
    td_err err;
    static const char *const tp[] = {"L*.moe.topk"};
    assert_int_equal(td_taps_new(tp, 1, &t, &err), TD_OK);
    td_engine_set_taps(e, t);
    td_block_call c = {0, TD_BLOCK_MOE, M, x, y, NULL, NULL};
    if (td_engine_run_block(e, &c, &err)) fail_msg("%s M=300: %s", v, err.msg);
    const td_tap *tk = td_taps_find(t, "L0.moe.topk");
    assert_non_null(tk);
    memcpy(ids, tk->data, (size_t)(M * k) * sizeof(int32_t));
    static const int64_t starts[2] = {0, 295};
    for (int i = 0; i < 2; i++) {
        const int64_t t0 = starts[i];
        td_block_call c5 = {0, TD_BLOCK_MOE, m5, x + t0 * H, y5, NULL, NULL};
        td_taps_reset(t);
        if (td_engine_run_block(e, &c5, &err)) fail_msg("%s M=5: %s", v, err.msg);
        tk = td_taps_find(t, "L0.moe.topk");
        assert_non_null(tk);
        assert_memory_equal(tk->data, ids + t0 * k, (size_t)(m5 * k) * sizeof(int32_t));
        assert_memory_equal(y5, y + t0 * H, (size_t)(m5 * H) * sizeof(float));
    }
    print_message("  parts      tokens 0-4 and 295-299 of a 300-token call == the same 5 tokens alone (bits, ids)\n");
    td_engine_free(e);
    td_taps_free(t);
    free(x);
    free(y);
    free(y5);
    free(ids);
    mf_free(&m);
}

/* One token's combine on the host from the engine's own taps, in the engine's order (slots
 * ascending, then the shared expert with gate sg), rounded to act: fl32 products and sums. */
static float host_combine(const float *w, const float *eout, int64_t k, int64_t H, int64_t h, float sg,
                          const float *sh, td_act_dtype act)
{
    float acc = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        const float p = w[j] * eout[j * H + h];
        acc = acc + p;
    }
    if (sh) {
        const float p = sg * sh[h];
        acc = acc + p;
    }
    return ref_round_act(acc, act);
}

/* true when v is exactly an FP16 (act fp16) or BF16 (act bf16) value */
static bool is_act16(float v, td_act_dtype act)
{
    const float r = act == TD_ACT_FP16 ? td_f16_to_f32(td_f32_to_f16(v)) : td_bf16_to_f32(td_f32_to_bf16(v));
    return memcmp(&r, &v, sizeof v) == 0;
}

/* The combine from the tensor-core path's 16-bit intermediates, bit for bit: the shared gate's
 * weights are zero, so its sigmoid is exactly 0.5, and every output element must equal the
 * host's combine (host_combine) of the engine's own top-k weights, expert outputs and shared
 * output (taps, which the engine holds as FP16 / BF16 patterns: each must be a value of the
 * act dtype). fp16 and bf16, direct and grouped, one rank of two; M = 1, 5, 16, 300. Without
 * the shared expert (a second fixture, intermediate 384 > hidden 256) the same without its
 * term; with top-20 routes (a third) the decode-sized combine loads its slots in two batches
 * (COMBINE_BATCH 16). With intermediate 320 (W2's K: one chunk of 10 steps, 5 on one rank of
 * two) W2 runs on the decode kernel, and with direct dispatch and top-k <= W2C_MAX_K (12) it
 * takes the combine fused in (k_w2c, cuda/moe_mma.cu) where td_w2c_pays says so: top-10 with
 * and top-12 without the shared expert at M = 1, 5 and 16 (one item per block); top-12 also at
 * M = 300 (its rounds equal k_dec's: on a 132-SM GPU 4,800 items on 264 blocks, some 18 per
 * block, the tokens changing inside blocks); top-13 just past the limit takes the separate
 * combine. */
static void combine_case(const char *name, int64_t inter, int64_t shared, int64_t top_k)
{
    mf_opts o;
    shape(&o, 31, 256, 24, top_k, inter, shared);
    mf_model m;
    mf_build(&o, &m);
    if (shared) memset(m.layers[0].sh_gw.bf16, 0, (size_t)o.hidden * sizeof(uint16_t));
    const char *dir = td_test_path(name);
    mf_write(&m, dir);
    skip_without_gpu(dir, &m);
    static const char *const vs[] = {
        "cuda:act_dtype=fp16", "cuda:act_dtype=bf16", "cuda:act_dtype=fp16,moe_dispatch=grouped",
        "cuda:act_dtype=bf16,storage=raw,moe_dispatch=grouped", "cuda:act_dtype=fp16,tp_size=2,tp_rank=1",
    };
    static const int64_t Ms[] = {1, 5, 16, 300};
    const int64_t H = o.hidden, k = o.top_k;
    for (size_t vi = 0; vi < TD_ARRAY_LEN(vs); vi++) {
        td_variant var;
        td_err err;
        assert_int_equal(td_variant_parse(vs[vi], &var, &err), TD_OK);
        const td_act_dtype act = var.act_dtype;
        td_engine *e = td_test_engine(dir, vs[vi]);
        td_taps *t = NULL;
        static const char *const tp[] = {"L0.moe.*"};
        assert_int_equal(td_taps_new(tp, 1, &t, &err), TD_OK);
        td_engine_set_taps(e, t);
        for (size_t mi = 0; mi < TD_ARRAY_LEN(Ms); mi++) {
            const int64_t M = Ms[mi];
            const size_t n = (size_t)(M * H);
            float *x = malloc(n * sizeof *x), *y = guarded(n);
            assert_non_null(x);
            td_rng rng;
            td_rng_seed(&rng, (uint64_t)(3100 + M));
            for (size_t i = 0; i < n; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
            td_taps_reset(t);
            td_block_call c = {0, TD_BLOCK_MOE, M, x, y + GUARD, NULL, NULL};
            if (td_engine_run_block(e, &c, &err)) fail_msg("%s M=%lld: %s", vs[vi], (long long)M, err.msg);
            check_guards(y, n, vs[vi]);
            const td_tap *tw = td_taps_find(t, "L0.moe.topk_weights"), *to = td_taps_find(t, "L0.moe.expert_out"),
                         *ta = td_taps_find(t, "L0.moe.expert_act"), *ts = td_taps_find(t, "L0.moe.shared_out");
            if (!tw || !to || !ta || (shared && !ts)) fail_msg("%s M=%lld: a tap is missing", vs[vi], (long long)M);
            const float *w = (const float *)tw->data, *eo = (const float *)to->data, *ea = (const float *)ta->data;
            const float *sh = shared ? (const float *)ts->data : NULL;
            const int64_t il = o.inter / var.tp_size;
            for (int64_t i = 0; i < M * k * il; i++)
                if (!is_act16(ea[i], act))
                    fail_msg("%s M=%lld: expert_act %lld = %a is no act value", vs[vi], (long long)M, (long long)i,
                             (double)ea[i]);
            for (int64_t i = 0; i < M * k * H; i++)
                if (!is_act16(eo[i], act))
                    fail_msg("%s M=%lld: expert_out %lld = %a is no act value", vs[vi], (long long)M, (long long)i,
                             (double)eo[i]);
            size_t diff = 0;
            for (int64_t tk = 0; tk < M; tk++)
                for (int64_t h = 0; h < H; h++) {
                    const float *s_t = sh ? sh + tk * H : NULL;
                    const float want = host_combine(w + tk * k, eo + tk * k * H, k, H, h, 0.5f, s_t, act);
                    const float got = y[GUARD + tk * H + h];
                    if (s_t && !is_act16(s_t[h], act))
                        fail_msg("%s M=%lld: shared_out %lld is no act value", vs[vi], (long long)M,
                                 (long long)(tk * H + h));
                    diff += memcmp(&want, &got, sizeof got) != 0;
                }
            if (diff)
                fail_msg("%s M=%lld: %zu of %zu outputs differ from the host combine of the taps", vs[vi], (long long)M,
                         diff, n);
            free(x);
            free(y);
        }
        print_message("  combine    %-52s top-%lld, M = 1, 5, 16, 300: output == host combine of the taps (bits)\n",
                      vs[vi], (long long)k);
        td_engine_free(e);
        td_taps_free(t);
    }
    mf_free(&m);
}

static void cuda_combine_taps(void **state)
{
    (void)state;
    combine_case("gpu_comb_sh", 128, 128, 5);
    combine_case("gpu_comb", 384, 0, 5); /* expert activations wider than hidden: the taps' staging */
    combine_case("gpu_comb_k20", 128, 128, 20); /* more slots than one batch of the combine's loads */
    combine_case("gpu_comb_w2c", 320, 128, 10); /* W2 on the decode kernel, the combine fused in */
    combine_case("gpu_comb_w2c12", 320, 0, 12); /* the most slots k_w2c takes, no shared expert */
    combine_case("gpu_comb_w2c13", 320, 128, 13); /* one slot more: the separate combine */
    combine_case("gpu_comb_w2c_long", 1280, 128, 10); /* k_w2c on rows of two rounds of staging loads */
}

/* The routing taps (moe.topk, moe.topk_weights, moe.router_logits) of a call of two workspace
 * chunks (1,030 tokens): every token's, from the chunk that computed it. Two calls with other
 * inputs, so that a chunk not copied would show the first call's routes; against ref's taps of
 * the same inputs (FP32 activations both: logits within 1e-5, each side's top-k following its
 * own logits, the ids equal but for near-ties, the weights of equal routes within 1e-5). */
static void cuda_route_taps_chunks(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 41, 64, 64, 6, 32, 32);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_route_taps", &o, &m);
    td_engine *er = td_test_engine(dir, "ref:scale=fp16"), *ec = td_test_engine(dir, "cuda:act_dtype=fp32");
    static const char *const tp[] = {"L*.moe.topk", "L*.moe.topk_weights", "L*.moe.router_logits"};
    td_taps *tr = NULL, *tc = NULL;
    td_err err;
    assert_int_equal(td_taps_new(tp, 3, &tr, &err), TD_OK);
    assert_int_equal(td_taps_new(tp, 3, &tc, &err), TD_OK);
    td_engine_set_taps(er, tr);
    td_engine_set_taps(ec, tc);
    const int64_t M = 1030, H = o.hidden, k = o.top_k, E = o.experts;
    float *x = malloc((size_t)(M * H) * sizeof *x), *yr = malloc((size_t)(M * H) * sizeof *yr),
          *yc = malloc((size_t)(M * H) * sizeof *yc);
    uint8_t *mask = malloc((size_t)M);
    assert_true(x && yr && yc && mask);
    for (int call = 0; call < 2; call++) {
        td_rng rng;
        td_rng_seed(&rng, 4100 + (uint64_t)call);
        for (int64_t i = 0; i < M * H; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
        td_block_call cr = {0, TD_BLOCK_MOE, M, x, yr, NULL, NULL};
        td_block_call cc = cr;
        cc.output = yc;
        if (td_engine_run_block(er, &cr, &err)) fail_msg("ref: %s", err.msg);
        if (td_engine_run_block(ec, &cc, &err)) fail_msg("cuda: %s", err.msg);
        const td_tap *ia = td_taps_find(tr, "L0.moe.topk"), *ib = td_taps_find(tc, "L0.moe.topk");
        const td_tap *wa = td_taps_find(tr, "L0.moe.topk_weights"), *wb = td_taps_find(tc, "L0.moe.topk_weights");
        const td_tap *la = td_taps_find(tr, "L0.moe.router_logits"), *lb = td_taps_find(tc, "L0.moe.router_logits");
        assert_true(ia && ib && wa && wb && la && lb);
        assert_int_equal(ib->numel, M * k);
        assert_int_equal(wb->numel, M * k);
        assert_int_equal(lb->numel, M * E);
        const double lr = rel_l2((const float *)lb->data, (const float *)la->data, (size_t)(M * E));
        td_route_cmp r;
        assert_int_equal(td_route_compare(ia->data, la->data, ib->data, lb->data, M, E, k, mask, &r, &err), TD_OK);
        print_message("  taps       M = %lld (two chunks), call %d: logits rel_l2 %.3e, %lld tokens routed "
                      "differently, %lld reordered\n",
                      (long long)M, call, lr, (long long)r.flipped, (long long)r.reordered);
        assert_true(lr <= 1e-5);
        assert_int_equal(r.side[0].unfollowed, 0);
        assert_int_equal(r.side[1].unfollowed, 0);
        assert_true(r.flipped + r.reordered <= M / 100);
        const float *pa = wa->data, *pb = wb->data;
        int64_t same = 0;
        for (int64_t t = 0; t < M; t++) {
            if (mask[t]) continue;
            same += t >= 1024; /* the second chunk's tokens are among those compared */
            for (int64_t j = 0; j < k; j++)
                if (!(fabsf(pa[t * k + j] - pb[t * k + j]) <= 1e-5f * fabsf(pa[t * k + j])))
                    fail_msg("call %d token %lld slot %lld: weight %.9g against ref's %.9g", call, (long long)t,
                             (long long)j, (double)pb[t * k + j], (double)pa[t * k + j]);
        }
        assert_true(same >= 5);
    }
    td_engine_set_taps(er, NULL);
    td_engine_set_taps(ec, NULL);
    td_taps_free(tr);
    td_taps_free(tc);
    td_engine_free(er);
    td_engine_free(ec);
    free(x);
    free(yr);
    free(yc);
    free(mask);
    mf_free(&m);
}

/* The CUDA-core path (act_dtype=fp32) at a hidden size that is no multiple of 4 (BF16 experts):
 * the combine's one-column kernel, against ref. */
static void cuda_odd_hidden(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 32, 90, 16, 4, 48, 32);
    o.fmt = MF_BF16;
    mf_model m;
    const char *dir = fixture_or_skip("gpu_odd", &o, &m);
    for (int64_t M = 1; M <= 301; M += 150)
        compare(dir, "ref:scale=fp16", "cuda:act_dtype=fp32", 1e-5, 0, M, -1, "odd");
    mf_free(&m);
}

/* Both routing kernels against ref: the block kernel beyond the production shape (more
 * experts than its 512 threads: three per thread, a count that is no power of two) and the
 * one-warp selection (E <= 512, k <= 32; 96 and 300 experts) against ref's top-k ids; a token
 * whose logits are all NaN (a NaN input element), which takes the NaN branch: the reference
 * ranks NaN last with lower index first, so that token's slots hold experts 0..k-1, and the
 * other tokens are unaffected; and a token of zeros, whose logits are all 0: every
 * probability ties, so its slots hold experts 0..k-1 too (96 experts: all of them are
 * candidates of the one-warp selection; 300: more than its 128, so it takes the rounds). */
static void routing_case(const char *name, int64_t experts)
{
    mf_opts o;
    shape(&o, 28, 64, experts, 12, 32, 32);
    mf_model m;
    const char *dir = fixture_or_skip(name, &o, &m);
    for (int64_t M = 1; M <= 65; M += 32) compare(dir, "ref:scale=fp16", "cuda:act_dtype=fp32", 1e-5, 0, M, -1, "route");
    /* NaN token and tied token, at a decode size and at a prefill size (the routing kernel
     * of one warp per token from 256 tokens on, where E <= 512) */
    td_engine *er = td_test_engine(dir, "ref:scale=fp16"), *ec = td_test_engine(dir, "cuda:act_dtype=fp32");
    static const int64_t sizes[] = {4, 260};
    for (size_t si = 0; si < TD_ARRAY_LEN(sizes); si++) {
        const int64_t H = o.hidden, k = o.top_k, M = sizes[si];
        float *x = malloc((size_t)(M * H) * sizeof *x), *yr = malloc((size_t)(M * H) * sizeof *yr),
              *yc = malloc((size_t)(M * H) * sizeof *yc);
        assert_true(x && yr && yc);
        td_rng rng;
        td_rng_seed(&rng, 2801);
        for (int64_t i = 0; i < M * H; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
        x[H + 5] = NAN;
        for (int64_t i = 0; i < H; i++) x[3 * H + i] = 0.0f; /* token 3: logits all 0 */
        td_taps *tr = NULL, *tc = NULL;
        td_err err;
        topk_taps(er, ec, &tr, &tc);
        td_block_call cr = {0, TD_BLOCK_MOE, M, x, yr, NULL, NULL};
        td_block_call cc = cr;
        cc.output = yc;
        if (td_engine_run_block(er, &cr, &err)) fail_msg("ref: %s", err.msg);
        if (td_engine_run_block(ec, &cc, &err)) fail_msg("cuda: %s", err.msg);
        const td_tap *a = td_taps_find(tr, "L0.moe.topk"), *b = td_taps_find(tc, "L0.moe.topk");
        assert_non_null(a);
        assert_non_null(b);
        const int32_t *ia = (const int32_t *)a->data, *ib = (const int32_t *)b->data;
        for (int64_t j = 0; j < k; j++) {
            assert_int_equal(ia[k + j], j); /* the NaN token: experts 0..k-1 */
            assert_int_equal(ib[k + j], j);
            assert_int_equal(ia[3 * k + j], j); /* the tied token: experts 0..k-1 */
            assert_int_equal(ib[3 * k + j], j);
        }
        assert_memory_equal(ia, ib, (size_t)(M * k) * sizeof(int32_t));
        for (int64_t t = 0; t < M; t += 2) { /* the tokens beside */
            const double r = rel_l2(yc + t * H, yr + t * H, (size_t)H);
            if (t < 4) print_message("  route      M = %lld, NaN token beside: token %lld rel_l2 %.3e\n", (long long)M,
                                     (long long)t, r);
            assert_true(r <= 1e-5);
        }
        td_engine_set_taps(er, NULL);
        td_engine_set_taps(ec, NULL);
        td_taps_free(tr);
        td_taps_free(tc);
        free(x);
        free(yr);
        free(yc);
    }
    td_engine_free(er);
    td_engine_free(ec);
    mf_free(&m);
}

static void cuda_routing(void **state)
{
    (void)state;
    routing_case("gpu_route", 1100);
    routing_case("gpu_route_warp", 96);
    routing_case("gpu_route_ties", 300);
}

/* The packer's NVFP4 bit placements against the kernels' integer decodes, on the host (no GPU
 * needed): every code pair of every A-fragment register decodes to the FP16 bits of
 * e2m1 x 2^-14 (FP16 placement) or the BF16 bits of e2m1 x 2^-126 (BF16 placement); and the
 * check run on a deliberately wrong decode (register 2's codes through register 3's) must
 * fail, for each placement. */
static void cuda_nvfp4_layout(void **state)
{
    (void)state;
    char msg[256];
    const int rc = td_cuda_nvfp4_layout_check(0, msg, sizeof msg);
    print_message("  NVFP4 word layout: %s\n", msg);
    assert_int_equal(rc, 0);
    assert_string_equal(msg, "ok");
    assert_int_equal(td_cuda_nvfp4_layout_check(1, msg, sizeof msg), 1);
    print_message("  a wrong decode is caught: %s\n", msg);
    assert_non_null(strstr(msg, "FP16 placement, register 2"));
    assert_int_equal(td_cuda_nvfp4_layout_check(2, msg, sizeof msg), 1);
    print_message("  a wrong decode is caught: %s\n", msg);
    assert_non_null(strstr(msg, "BF16 placement, register 2"));
}

/* A GPU check of cuda/nvfp4_layout.h (check(broken, msg, cap): 0 ok, 1 mismatch, -1 no device):
 * it must pass, and its broken variant must fail with a message containing `caught`. */
static void gpu_check(int (*check)(int, char *, size_t), const char *what, const char *caught)
{
    char msg[320];
    const int rc = check(0, msg, sizeof msg);
    if (rc < 0) {
        print_message("  skipped: %s\n", msg);
        skip();
    }
    print_message("  %s: %s\n", what, msg);
    assert_int_equal(rc, 0);
    assert_string_equal(msg, "ok");
    assert_int_equal(check(1, msg, sizeof msg), 1);
    print_message("  a wrong %s is caught: %s\n", what, msg);
    assert_non_null(strstr(msg, caught));
}

/* Another broken variant of a GPU check (after gpu_check passed): it must fail with a message
 * containing `caught`. */
static void gpu_check_broken(int (*check)(int, char *, size_t), int broken, const char *what, const char *caught)
{
    char msg[320];
    assert_int_equal(check(broken, msg, sizeof msg), 1);
    print_message("  a wrong %s is caught: %s\n", what, msg);
    assert_non_null(strstr(msg, caught));
}

/* The BF16 placement's decode on the GPU: every code pair of every register to the BF16 bits
 * of e2m1 x 2^-126; a wrong decode must fail. */
static void cuda_nvfp4_bf16_decode(void **state)
{
    (void)state;
    gpu_check(td_cuda_nvfp4_bf16_check, "BF16 decode", "register 2");
}

/* The staging's power of two for BF16 inputs on the GPU: the shift of every exponent field and
 * its epilogue factor, every BF16 pattern times 2^s exactly; a wrong product and a wrong shift
 * must both fail. */
static void cuda_bf16_row_scale(void **state)
{
    (void)state;
    gpu_check(td_cuda_bf16_row_scale_check, "BF16 row scale", "x 2^7");
    gpu_check_broken(td_cuda_bf16_row_scale_check, 2, "row shift", "row shift of exponent field 200");
}

/* The block's input rounded and laid out for k_wgp in one launch (cu_mm_round_split), on the
 * GPU, against the host's conversions and the layout's formula (cuda/nvfp4_layout.h); a
 * reference with the layout's roles swapped must fail. */
static void cuda_round_split(void **state)
{
    (void)state;
    gpu_check(td_cuda_round_split_check, "round + k_wgp layout", "expected");
}

/* The block's input rounded and staged for k_mm's decode-sized calls in one launch
 * (cu_mm_round_stage), on the GPU, against the host's conversions and the staged row's formula,
 * and k_mm from that image against k_mm staging its rows itself, bit for bit; a reference with
 * the formula's roles swapped and an image 16 words off must both fail. */
static void cuda_round_stage(void **state)
{
    (void)state;
    gpu_check(td_cuda_round_stage_check, "round + k_mm staged rows", "expected");
    gpu_check_broken(td_cuda_round_stage_check, 2, "image k_mm reads off by 16 words", "from the image");
}

/* cu_mm_group's arrays (both grouping kernels) against a host counting sort, element for
 * element with the outputs poisoned, over five route patterns, 1 to 10,240 slots and 8 to
 * 3,000 experts (cuda/nvfp4_layout.h); a reference with each expert's slots reversed must
 * fail. */
static void cuda_group_arrays(void **state)
{
    (void)state;
    gpu_check(td_cuda_group_check, "grouping", "perm[");
}

/* The first line nvidia-smi prints for a query (e.g. "name"), or "" without nvidia-smi. */
static void smi_query(const char *what, char *out, size_t cap)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "nvidia-smi --query-gpu=%s --format=csv,noheader 2>/dev/null", what);
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(out, (int)cap, p)) out[0] = '\0';
    pclose(p);
    out[strcspn(out, "\r\n")] = '\0';
}

/* The engine says which GPU it runs on (for the results store): the name and driver that
 * nvidia-smi reports, and the CUDA runtime's version as N.N. */
static void cuda_device_described(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_dev", &o, &m);
    td_engine *e = td_test_engine(dir, "cuda");
    const td_engine_device *d = td_engine_device_info(e);
    print_message("  GPU %s, driver %s, CUDA %s\n", d->gpu_name, d->gpu_driver, d->cuda_version);
    assert_true(d->gpu_name[0] != '\0');
    assert_true(d->gpu_driver[0] != '\0');
    int major = -1, minor = -1, used = -1;
    assert_int_equal(sscanf(d->cuda_version, "%d.%d%n", &major, &minor, &used), 2);
    assert_int_equal(d->cuda_version[used], '\0');
    assert_true(major >= 12 && minor >= 0);
    char smi[256];
    smi_query("name", smi, sizeof smi);
    if (smi[0]) assert_string_equal(d->gpu_name, smi);
    /* the kernel driver's version where /proc has it, else the CUDA driver API's */
    char proc[64];
    td_engine_read_driver_version(proc, sizeof proc);
    if (!proc[0]) {
        assert_non_null(strstr(d->gpu_driver, "CUDA driver API "));
    } else {
        assert_string_equal(d->gpu_driver, proc);
        smi_query("driver_version", smi, sizeof smi);
        if (smi[0]) assert_string_equal(d->gpu_driver, smi);
    }
    if (!smi[0]) print_message("  (no nvidia-smi: the name or the driver not cross-checked)\n");
    td_engine_free(e);
    mf_free(&m);
}

static void cuda_rejects(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_rej", &o, &m);
    static const char *const refused[] = {"cuda:moe_dispatch=grouped", "cuda:act_dtype=fp32,moe_dispatch=grouped"};
    for (size_t i = 0; i < TD_ARRAY_LEN(refused); i++) {
        td_variant v;
        td_err err;
        td_engine *e = NULL;
        assert_int_equal(td_variant_parse(refused[i], &v, &err), TD_OK);
        assert_int_equal(td_engine_load(dir, &v, &e, &err), TD_ERR_UNSUPPORTED);
        print_message("  %s refused: %s\n", refused[i], err.msg);
    }
    td_engine *e = td_test_engine(dir, "cuda");
    const int64_t M = 3, H = 64, k = 3;
    float x[3 * 64];
    for (int i = 0; i < M * H; i++) x[i] = 0.01f * (float)i;
    float *out = guarded((size_t)(M * H));
    int32_t ids[9] = {0, 1, 2, 3, 4, 5, 6, 8, 7};
    float w[9] = {0.2f, 0.3f, 0.5f, 0.2f, 0.3f, 0.5f, 0.2f, 0.3f, 0.5f};
    td_block_call c = {0, TD_BLOCK_MOE, M, x, out + GUARD, ids, w};
    td_err err;
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "token 2 slot 1"));
    for (int i = 0; i < M * H; i++) assert_true(isnan(out[GUARD + i]));
    check_guards(out, (size_t)(M * H), "rejected call");
    ids[7] = -1;
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_RANGE);
    for (int i = 0; i < 9; i++) ids[i] = 1000 + i; /* all invalid */
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "token 0 slot 0"));
    for (int i = 0; i < M * H; i++) assert_true(isnan(out[GUARD + i]));
    for (int i = 0; i < 9; i++) ids[i] = i < 8 ? i : 7;
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_OK);
    for (int i = 0; i < M * H; i++) assert_true(isfinite(out[GUARD + i]));
    check_guards(out, (size_t)(M * H), "imposed routes");
    (void)k;
    free(out);
    td_engine_free(e);
    mf_free(&m);
}

/* How long k_busy holds the GPU in cuda_load_completes: longer than the fixture's load. */
#define BUSY_MS 400

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* The engine's load leaves none of its device work unfinished. Its uploads and its workspace's
 * NaN poison run on the legacy default stream, which the block's non-blocking streams do not
 * wait for. With every SM held by k_busy (cuda/busy.h), a cudaMemset on the legacy stream stays
 * pending (the control: what the load's own poison did before the load ended with a device
 * synchronization), and td_engine_load must return with the legacy stream idle; the first calls
 * after it, enqueued at once, must equal those of an engine loaded on an idle GPU bit for bit
 * (fp16 and fp32, M = 1 and 4, natural routes), every output written, canaries untouched. */
static void cuda_load_completes(void **state)
{
    (void)state;
    mf_opts o;
    shape(&o, 31, 256, 32, 4, 128, 128);
    mf_model m;
    const char *dir = fixture_or_skip("gpu_busy", &o, &m);
    char msg[256];
    td_cuda_busy *b = NULL;
    void *p = NULL;
    if (td_cuda_busy_begin(BUSY_MS, &b, msg, sizeof msg)) fail_msg("td_cuda_busy_begin: %s", msg);
    print_message("  k_busy: %s\n", msg);
    if (td_cuda_legacy_memset((size_t)1 << 20, &p, msg, sizeof msg)) fail_msg("control: %s", msg);
    const int control = td_cuda_legacy_pending(msg, sizeof msg);
    if (td_cuda_busy_end(b, msg, sizeof msg)) fail_msg("td_cuda_busy_end: %s", msg);
    if (td_cuda_free(p, msg, sizeof msg)) fail_msg("control: %s", msg);
    if (control != 1)
        fail_msg("control: a cudaMemset queued behind k_busy is %s", control == 0 ? "already done" : msg);
    print_message("  control: a cudaMemset queued behind k_busy is pending\n");
    static const char *const variants[] = {"cuda:act_dtype=fp16", "cuda"};
    static const int64_t Ms[] = {1, 4};
    const int64_t H = o.hidden;
    float x[4 * 256];
    td_rng rng;
    td_rng_seed(&rng, 31);
    for (size_t i = 0; i < TD_ARRAY_LEN(x); i++) x[i] = td_rng_normal_f32(&rng);
    for (size_t vi = 0; vi < TD_ARRAY_LEN(variants); vi++) {
        const char *v = variants[vi];
        td_engine *idle = td_test_engine(dir, v);
        float *want[2], *got[2];
        td_err err;
        for (int j = 0; j < 2; j++) {
            want[j] = guarded((size_t)(Ms[j] * H));
            got[j] = guarded((size_t)(Ms[j] * H));
            td_block_call c = {0, TD_BLOCK_MOE, Ms[j], x, want[j] + GUARD, NULL, NULL};
            if (td_engine_run_block(idle, &c, &err)) fail_msg("%s (idle): %s", v, err.msg);
        }
        td_engine_free(idle);
        td_variant var;
        assert_int_equal(td_variant_parse(v, &var, &err), TD_OK);
        td_engine *e = NULL;
        if (td_cuda_busy_begin(BUSY_MS, &b, msg, sizeof msg)) fail_msg("td_cuda_busy_begin: %s", msg);
        const double t0 = now_ms();
        const td_status st = td_engine_load(dir, &var, &e, &err);
        const double t1 = now_ms();
        const int pending = td_cuda_legacy_pending(msg, sizeof msg);
        td_status sc = TD_OK;
        for (int j = 0; j < 2 && !st && !sc; j++) {
            td_block_call c = {0, TD_BLOCK_MOE, Ms[j], x, got[j] + GUARD, NULL, NULL};
            sc = td_engine_run_block(e, &c, &err);
        }
        if (td_cuda_busy_end(b, msg, sizeof msg)) fail_msg("td_cuda_busy_end: %s", msg);
        if (st) fail_msg("%s: load with the GPU busy: %s", v, err.msg);
        if (sc) fail_msg("%s: call with the GPU busy: %s", v, err.msg);
        print_message("  %-20s load with the GPU busy for %d ms: %.1f ms, legacy stream %s\n", v, BUSY_MS, t1 - t0,
                      pending == 0 ? "idle" : pending == 1 ? "still busy" : msg);
        if (pending != 0) fail_msg("%s: the load returned with work left on the legacy stream", v);
        for (int j = 0; j < 2; j++) {
            const size_t n = (size_t)(Ms[j] * H);
            check_guards(got[j], n, v);
            for (size_t i = 0; i < n; i++)
                if (!isfinite(got[j][GUARD + i])) fail_msg("%s M=%lld: output %zu not finite", v, (long long)Ms[j], i);
            if (memcmp(got[j] + GUARD, want[j] + GUARD, n * sizeof(float)))
                fail_msg("%s M=%lld: the first call after a busy load differs from an idle load's", v,
                         (long long)Ms[j]);
            free(want[j]);
            free(got[j]);
        }
        td_engine_free(e);
    }
    mf_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_nvfp4_layout),
        cmocka_unit_test(cuda_nvfp4_bf16_decode),
        cmocka_unit_test(cuda_bf16_row_scale),
        cmocka_unit_test(cuda_round_split),
        cmocka_unit_test(cuda_round_stage),
        cmocka_unit_test(cuda_group_arrays),
        cmocka_unit_test(cuda_rejects),
        cmocka_unit_test(cuda_device_described),
        cmocka_unit_test(cuda_load_completes),
        cmocka_unit_test(cuda_vs_ref_modelopt),
        cmocka_unit_test(cuda_vs_ref_ct_bf16_shared),
        cmocka_unit_test(cuda_vs_ref_bf16_experts),
        cmocka_unit_test(cuda_vs_ref_wide),
        cmocka_unit_test(cuda_raw_admission),
        cmocka_unit_test(cuda_sweep),
        cmocka_unit_test(cuda_decode_kernel),
        cmocka_unit_test(cuda_decode_grouped_tail),
        cmocka_unit_test(cuda_w2c_long_rows),
        cmocka_unit_test(cuda_decode_narrow),
        cmocka_unit_test(cuda_prefill_parts),
        cmocka_unit_test(cuda_routing),
        cmocka_unit_test(cuda_combine_taps),
        cmocka_unit_test(cuda_route_taps_chunks),
        cmocka_unit_test(cuda_odd_hidden),
        cmocka_unit_test(cuda_grouping_wide),
    };
    const char *filter = getenv("TD_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
