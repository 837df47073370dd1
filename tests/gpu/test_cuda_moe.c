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
 * - a bad imposed route id fails with TD_ERR_RANGE before anything is written;
 * - storage=raw, moe_dispatch=grouped and graphs=on are refused with TD_ERR_UNSUPPORTED.
 * Without a CUDA device every test skips with a message.
 */
#include "test_common.h"
#include "moe_fixture.h"
#include "engine.h"
#include "audit/engines.h"

#include <math.h>

#define GUARD 64
#define CANARY 12345.0f

static td_engine *load(const char *dir, const char *variant)
{
    td_variant v;
    td_err err;
    if (td_variant_parse(variant, &v, &err)) fail_msg("%s", err.msg);
    td_engine *e = NULL;
    if (td_engine_load(dir, &v, &e, &err)) fail_msg("load %s: %s", variant, err.msg);
    return e;
}

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
            default: id = (E - 1 - (t + j) % E + E) % E;    /* reversed */
            }
            ids[t * k + j] = (int32_t)id;
            w[t * k + j] = (float)(j + 1) / (float)(k * (k + 1) / 2);
        }
}

/* Run `ref` and `cuda` on layer L for M seeded tokens (natural routes, or pattern p >= 0) and
 * check the bound, the poison, the canaries and repeat determinism of cuda. */
static void compare(const char *dir, const char *rv, const char *cv, double bound, int64_t L, int64_t M, int p,
                    const char *tag)
{
    td_engine *er = load(dir, rv), *ec = load(dir, cv);
    const td_engine_model *mi = td_engine_model_info(ec);
    const int64_t H = mi->hidden, k = mi->top_k, E = mi->num_experts;
    const size_t n = (size_t)(M * H);
    float *x = malloc(n * sizeof *x), *want = guarded(n), *got = guarded(n), *again = guarded(n);
    int32_t *ids = malloc((size_t)(M * k) * sizeof *ids);
    float *w = malloc((size_t)(M * k) * sizeof *w);
    assert_true(x && ids && w);
    td_rng rng;
    td_rng_seed(&rng, (uint64_t)(1000 + L * 31 + M));
    for (size_t i = 0; i < n; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
    if (p >= 0) routes(p, M, k, E, ids, w);
    td_taps *tr = NULL, *tc = NULL;
    td_err err;
    static const char *const tp[] = {"L*.moe.topk"};
    assert_int_equal(td_taps_new(tp, 1, &tr, &err), TD_OK);
    assert_int_equal(td_taps_new(tp, 1, &tc, &err), TD_OK);
    td_engine_set_taps(er, tr);
    td_engine_set_taps(ec, tc);
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
    print_message("  %-10s L%lld M=%-3lld %-6s %-40s vs %-32s rel_l2 %.3e (bound %.0e)\n", tag, (long long)L,
                  (long long)M, p < 0 ? "router" : p == 0 ? "arange" : p == 1 ? "mod10" : p == 2 ? "one" : "rev", rv,
                  cv, r, bound);
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

static const pair_case pairs[] = {
    {"ref:scale=fp16", "cuda:act_dtype=fp32", 1e-5},
    {"ref:scale=fp16,act_dtype=fp16", "cuda:act_dtype=fp16", 4e-3},
    {"ref:scale=fp16,act_dtype=bf16", "cuda:act_dtype=bf16", 3e-2},
    {"ref", "cuda", 2e-3},
    {"ref:scale=fp16,tp_size=2,tp_rank=1", "cuda:act_dtype=fp32,tp_size=2,tp_rank=1", 1e-5},
    {"ref:scale=fp16,act_dtype=fp16,tp_size=4,tp_rank=all", "cuda:act_dtype=fp16,tp_size=4,tp_rank=all", 4e-3},
};

static void run_fixture(const char *name, const mf_opts *o)
{
    mf_model m;
    const char *dir = fixture(name, o, &m);
    if (no_gpu(dir)) {
        mf_free(&m);
        skip();
    }
    static const int64_t Ms[] = {1, 4, 16, 300};
    for (size_t pi = 0; pi < TD_ARRAY_LEN(pairs); pi++)
        for (size_t mi = 0; mi < TD_ARRAY_LEN(Ms); mi++)
            for (int64_t L = 0; L < o->layers; L++) compare(dir, pairs[pi].ref, pairs[pi].cuda, pairs[pi].bound, L, Ms[mi], -1, name);
    for (int p = 0; p < 4; p++) compare(dir, pairs[1].ref, pairs[1].cuda, pairs[1].bound, 0, 16, p, name);
    mf_free(&m);
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
    mf_defaults(&o);
    o.seed = 24;
    o.hidden = 1024;
    o.experts = 64;
    o.top_k = 8;
    o.inter = 256;
    o.shared_inter = 512;
    o.layers = 1;
    run_fixture("gpu_wide", &o);
}

static void cuda_rejects(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = fixture("gpu_rej", &o, &m);
    if (no_gpu(dir)) {
        mf_free(&m);
        skip();
    }
    static const char *const refused[] = {"cuda:storage=raw", "cuda:moe_dispatch=grouped", "cuda:graphs=on"};
    for (size_t i = 0; i < TD_ARRAY_LEN(refused); i++) {
        td_variant v;
        td_err err;
        td_engine *e = NULL;
        assert_int_equal(td_variant_parse(refused[i], &v, &err), TD_OK);
        assert_int_equal(td_engine_load(dir, &v, &e, &err), TD_ERR_UNSUPPORTED);
        print_message("  %s refused: %s\n", refused[i], err.msg);
    }
    td_engine *e = load(dir, "cuda");
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
    ids[7] = 7;
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_OK);
    for (int i = 0; i < M * H; i++) assert_true(isfinite(out[GUARD + i]));
    check_guards(out, (size_t)(M * H), "imposed routes");
    (void)k;
    free(out);
    td_engine_free(e);
    mf_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_rejects),
        cmocka_unit_test(cuda_vs_ref_modelopt),
        cmocka_unit_test(cuda_vs_ref_ct_bf16_shared),
        cmocka_unit_test(cuda_vs_ref_bf16_experts),
        cmocka_unit_test(cuda_vs_ref_wide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
