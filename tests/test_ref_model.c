/* test_ref_model.c — the reference engine's full qwen3_next model (prefill / decode, state).
 *
 * Checkpoints: `qwen3-next-tiny` generated with td_gen (8 layers: 6 Gated DeltaNet + 2 gated
 * attention, hidden 256, vocab 4096) with 8 experts, once unquantized (BF16) and once NVFP4.
 * What is asserted:
 * - prefill of n tokens followed by decode steps gives, bit for bit, the logits of a prefill of
 *   the longer prompt at its last position (the reference's token-serial recurrences and
 *   per-token linears make this exact: tolerance 0), for n = 1, 5, 9 and both checkpoints;
 * - logits are finite and the whole output is written (poisoned with NaN beforehand);
 * - 1 and 3 worker threads give identical bits;
 * - a batch of two sequences decoded together equals each decoded alone (state is per
 *   sequence), and re-prefilling a sequence id restarts it from zero state;
 * - accum=fp64 differs from accum=fp32 only by rounding (relative max difference < 1e-3);
 * - errors: decode of an unknown sequence (TD_ERR_ARG), token outside the vocabulary
 *   (TD_ERR_RANGE), a single TP rank (tp_rank=1 of 2: TD_ERR_UNSUPPORTED naming tp_rank); taps
 *   L3.attn.out, L0.gdn.out, final.hidden and logits are captured with the documented shapes.
 * Blocks (run_block attn / gdn, both checkpoints):
 * - for every layer L >= 1, the block on the zero-centred norm of the prefill's L{L-1}.resid tap
 *   (computed here with the layer's input_layernorm weight) equals the prefill's own
 *   L{L}.attn.out / L{L}.gdn.out tap bit for bit; the same call again, with 1 thread, and on
 *   the first 3 tokens gives the same bits (a fresh state per call); the block's tap is
 *   captured; attn on a GDN layer and gdn on an attention layer are TD_ERR_ARG, ple
 *   TD_ERR_UNSUPPORTED;
 * - tp_size=2: tp_rank=all equals round_act(p0 + p1) of the ranks' outputs bit for bit (fp32
 *   and fp16), each partial is representable in act_dtype, and tp_rank=all differs from tp_size
 *   1 by less than 1e-5 (fp32) / 4e-3 (fp16) of max |y|; tp_size 8 (cuts the 4 heads) is
 *   TD_ERR_RANGE.
 * act_dtype and TP for the whole model (both checkpoints, 12-token prompt):
 * - max |dlogit| / max |logit| against fp32 TP1: fp16 < 1e-2, bf16 < 0.25, tp_size=2,tp_rank=all
 *   < 2e-5 (and > 0), tp2 + bf16 < 0.25; every L*.resid and final.hidden value is representable
 *   in act_dtype; threads=1 prefill of 12 equals threads=3 prefill of 9 + 3 decode steps bit
 *   for bit.
 * Generation (audit/completion.h) and `tandem run`:
 * - the completion hash of [1, 2, -1] is SHA-256 of the 12 bytes 01 00 00 00 02 00 00 00
 *   ff ff ff ff; the empty completion hashes the empty string;
 * - greedy pick: lowest id among equal maxima, NaN never wins, margin top-1 minus top-2;
 * - td_generate with batch widths 1 and 3 gives identical completions; compare reports -1 for
 *   equal completions and the first differing position with both margins otherwise;
 * - `tandem run` with two identical variants reports identical hashes (exit 0) and writes
 *   the db, where `tandem db completions` finds every completion with its 4 token ids and
 *   --diverged none; hostile prompt files (bad JSON, empty array, non-integer, out-of-vocabulary id,
 *   duplicate id) exit 2 with a message naming file and line.
 */
#include "test_common.h"
#include "engine_test.h"
#include "gen_fixture.h"
#include "audit/completion.h"
#include "audit/engines.h"
#include <cjson/cJSON.h>
#include "engine.h"
#include "formats.h"
#include "gen.h"
#include "ref/moe.h"
#include "ref/norm.h"
#include "safetensors.h"
#include "sha256.h"

#include <math.h>

#define V 4096
static char g_dir[2][600];

static void make_ckpt(int i, bool unquantized)
{
    td_test_gen("qwen3-next-tiny", 7, unquantized, 8, unquantized ? "tiny_bf16" : "tiny_nvfp4", g_dir[i], sizeof g_dir[i]);
}

static int setup(void **state)
{
    (void)state;
    make_ckpt(0, true);
    make_ckpt(1, false);
    return 0;
}

static td_engine *load(int ck, const char *variant) { return td_test_engine(g_dir[ck], variant); }

static const int32_t prompt[12] = {1, 77, 4095, 3, 1000, 2048, 5, 5, 5, 17, 0, 999};

static void assert_finite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) assert_true(isfinite(x[i]));
}

static void model_prefill_then_decode_bitwise(void **state)
{
    (void)state;
    for (int ck = 0; ck < 2; ck++) {
        td_engine *e = load(ck, "ref:threads=2");
        td_err err = {0};
        const int64_t total = 12;
        float *full = td_test_poisoned(V), *step = td_test_poisoned(V);
        static const int64_t ns[3] = {1, 5, 9};
        for (int a = 0; a < 3; a++) {
            const int64_t n = ns[a];
            assert_int_equal(td_engine_prefill(e, 0, prompt, n, step, &err), TD_OK);
            for (int64_t t = n; t < total; t++) {
                const td_decode_item it = {0, prompt[t]};
                assert_int_equal(td_engine_decode(e, &it, 1, step, &err), TD_OK);
            }
            assert_int_equal(td_engine_prefill(e, 1, prompt, total, full, &err), TD_OK);
            assert_finite(full, V);
            assert_memory_equal(full, step, V * sizeof *full);
        }
        free(full);
        free(step);
        td_engine_free(e);
    }
}

static void model_threads_and_batch_bitwise(void **state)
{
    (void)state;
    td_engine *e1 = load(1, "ref:threads=1"), *e3 = load(1, "ref:threads=3");
    td_err err = {0};
    float *a = td_test_poisoned(2 * V), *b = td_test_poisoned(2 * V), *c = td_test_poisoned(V);
    assert_int_equal(td_engine_prefill(e1, 5, prompt, 4, a, &err), TD_OK);
    assert_int_equal(td_engine_prefill(e3, 5, prompt, 4, b, &err), TD_OK);
    assert_memory_equal(a, b, V * sizeof *a);
    /* two sequences in one decode batch on e3; alone on e1 */
    assert_int_equal(td_engine_prefill(e3, 9, prompt + 4, 3, b, &err), TD_OK);
    const td_decode_item batch[2] = {{5, 11}, {9, 12}};
    assert_int_equal(td_engine_decode(e3, batch, 2, b, &err), TD_OK);
    assert_int_equal(td_engine_decode(e1, &batch[0], 1, a, &err), TD_OK);
    assert_memory_equal(a, b, V * sizeof *a);
    assert_int_equal(td_engine_prefill(e1, 9, prompt + 4, 3, c, &err), TD_OK);
    assert_int_equal(td_engine_decode(e1, &batch[1], 1, a, &err), TD_OK);
    assert_memory_equal(a, b + V, V * sizeof *a);
    /* re-prefill restarts from zero state */
    assert_int_equal(td_engine_prefill(e1, 5, prompt, 4, c, &err), TD_OK);
    assert_int_equal(td_engine_prefill(e1, 6, prompt, 4, a, &err), TD_OK);
    assert_memory_equal(a, c, V * sizeof *a);
    free(a);
    free(b);
    free(c);
    td_engine_free(e1);
    td_engine_free(e3);
}

static void model_fp64_accum_close(void **state)
{
    (void)state;
    td_engine *e = load(0, "ref"), *f = load(0, "ref:accum=fp64");
    td_err err = {0};
    float *a = td_test_poisoned(V), *b = td_test_poisoned(V);
    assert_int_equal(td_engine_prefill(e, 0, prompt, 12, a, &err), TD_OK);
    assert_int_equal(td_engine_prefill(f, 0, prompt, 12, b, &err), TD_OK);
    double mx = 0, md = 0;
    for (int i = 0; i < V; i++) {
        mx = fmax(mx, fabs((double)a[i]));
        md = fmax(md, fabs((double)a[i] - (double)b[i]));
    }
    assert_true(mx > 0);
    assert_true(md / mx < 1e-3);
    free(a);
    free(b);
    td_engine_free(e);
    td_engine_free(f);
}

static void model_errors_and_taps(void **state)
{
    (void)state;
    td_engine *e = load(0, "ref");
    td_err err = {0};
    float *a = td_test_poisoned(V);
    const td_decode_item it = {42, 1};
    assert_int_equal(td_engine_decode(e, &it, 1, a, &err), TD_ERR_ARG);
    const int32_t bad[2] = {1, V};
    assert_int_equal(td_engine_prefill(e, 0, bad, 2, a, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "vocabulary"));
    static const char *const pats[] = {"L3.attn.out", "L0.gdn.out", "final.hidden", "logits", "L7.resid"};
    td_taps *t = NULL;
    assert_int_equal(td_taps_new(pats, 5, &t, &err), TD_OK);
    td_engine_set_taps(e, t);
    assert_int_equal(td_engine_prefill(e, 0, prompt, 3, a, &err), TD_OK);
    assert_int_equal(td_taps_count(t), 5);
    const td_tap *tp = td_taps_find(t, "L3.attn.out");
    assert_non_null(tp);
    assert_int_equal(tp->shape[0], 3);
    assert_int_equal(tp->shape[1], 256);
    tp = td_taps_find(t, "logits");
    assert_non_null(tp);
    assert_memory_equal(tp->data, a, V * sizeof *a);
    td_engine_set_taps(e, NULL);
    td_taps_free(t);
    td_engine_free(e);
    td_engine *b = load(0, "ref:tp_size=2,tp_rank=1");
    assert_int_equal(td_engine_prefill(b, 0, prompt, 2, a, &err), TD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "tp_rank"));
    td_engine_free(b);
    free(a);
}

/* ---- blocks: attention and GDN on caller-given activations ------------------------------------ */

#define H 256
#define NL 8
static bool is_attn_layer(int64_t L)
{
    return L % 4 == 3; /* qwen3-next-tiny: GDN x3 + attention */
}

/* input_layernorm weight of layer L, decoded to float32. */
static void in_norm(int ck, int64_t L, float *w)
{
    td_st_set *set = NULL;
    td_err err = {0};
    assert_int_equal(td_st_set_open(g_dir[ck], &set, &err), TD_OK);
    char name[128];
    snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)L);
    td_tensor t;
    assert_int_equal(td_st_set_tensor(set, name, &t, &err), TD_OK);
    for (int64_t i = 0; i < H; i++) {
        if (t.dtype == TD_BF16) {
            uint16_t u;
            memcpy(&u, (const uint8_t *)t.data + 2 * i, 2);
            w[i] = td_bf16_to_f32(u);
        } else {
            assert_int_equal(t.dtype, TD_F32);
            memcpy(&w[i], (const uint8_t *)t.data + 4 * i, 4);
        }
    }
    td_st_set_close(set);
}

/* The mixer block input of layer L >= 1 for a prefill captured in `t`: the zero-centred norm
 * of L{L-1}.resid, rounded to act. */
static void block_input(int ck, const td_taps *t, int64_t L, int64_t m, td_act_dtype act, float *x)
{
    char name[32];
    snprintf(name, sizeof name, "L%lld.resid", (long long)(L - 1));
    const td_tap *r = td_taps_find(t, name);
    assert_non_null(r);
    assert_int_equal(r->numel, m * H);
    float w[H];
    in_norm(ck, L, w);
    for (int64_t i = 0; i < m; i++) ref_rmsnorm_zc((const float *)r->data + i * H, H, w, 1e-6f, x + i * H);
    for (int64_t i = 0; i < m * H; i++) x[i] = ref_round_act(x[i], act);
}

static td_status mixer(td_engine *e, int64_t L, int64_t m, const float *x, float *y, td_err *err)
{
    for (int64_t i = 0; i < m * H; i++) y[i] = NAN;
    const td_block_call c = {L, is_attn_layer(L) ? TD_BLOCK_ATTN : TD_BLOCK_GDN, m, x, y, NULL, NULL};
    return td_engine_run_block(e, &c, err);
}

static const td_tap *mixer_tap(const td_taps *t, int64_t L)
{
    char name[32];
    snprintf(name, sizeof name, "L%lld.%s", (long long)L, is_attn_layer(L) ? "attn.out" : "gdn.out");
    return td_taps_find(t, name);
}

/* Prefill `m` tokens with taps on every resid and mixer output; returns the tap set. */
static td_taps *prefill_taps(td_engine *e, int64_t m)
{
    static const char *const pats[] = {"L*.resid", "L*.attn.out", "L*.gdn.out"};
    td_taps *t = NULL;
    td_err err = {0};
    assert_int_equal(td_taps_new(pats, 3, &t, &err), TD_OK);
    float *lg = td_test_poisoned(V);
    td_engine_set_taps(e, t);
    assert_int_equal(td_engine_prefill(e, 0, prompt, m, lg, &err), TD_OK);
    td_engine_set_taps(e, NULL);
    free(lg);
    return t;
}

static void block_mixers_equal_prefill_taps(void **state)
{
    (void)state;
    const int64_t m = 7;
    float *x = td_test_poisoned(m * H), *y = td_test_poisoned(m * H), *y2 = td_test_poisoned(m * H);
    for (int ck = 0; ck < 2; ck++) {
        td_engine *e = load(ck, "ref:threads=2"), *e1 = load(ck, "ref:threads=1");
        td_taps *t = prefill_taps(e, m);
        td_err err = {0};
        for (int64_t L = 1; L < NL; L++) {
            block_input(ck, t, L, m, TD_ACT_FP32, x);
            const td_tap *want = mixer_tap(t, L);
            assert_non_null(want);
            assert_int_equal(mixer(e, L, m, x, y, &err), TD_OK);
            assert_memory_equal(y, want->data, (size_t)(m * H) * sizeof *y);
            /* a fresh state per call: the same call again, another thread count, a prefix */
            assert_int_equal(mixer(e1, L, m, x, y2, &err), TD_OK);
            assert_memory_equal(y, y2, (size_t)(m * H) * sizeof *y);
            assert_int_equal(mixer(e, L, 3, x, y2, &err), TD_OK);
            assert_memory_equal(y, y2, (size_t)(3 * H) * sizeof *y);
            assert_int_equal(mixer(e, L, m, x, y2, &err), TD_OK);
            assert_memory_equal(y, y2, (size_t)(m * H) * sizeof *y);
        }
        /* the block tap, and the wrong block for a layer's type */
        static const char *const pats[] = {"L*.attn.out", "L*.gdn.out"};
        td_taps *bt = NULL;
        assert_int_equal(td_taps_new(pats, 2, &bt, &err), TD_OK);
        td_engine_set_taps(e, bt);
        assert_int_equal(mixer(e, 3, 2, x, y, &err), TD_OK);
        const td_tap *tp = td_taps_find(bt, "L3.attn.out");
        assert_non_null(tp);
        assert_int_equal(tp->shape[0], 2);
        assert_memory_equal(tp->data, y, 2 * H * sizeof *y);
        td_engine_set_taps(e, NULL);
        td_taps_free(bt);
        td_block_call c = {3, TD_BLOCK_GDN, 1, x, y, NULL, NULL};
        assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_ARG);
        assert_non_null(strstr(err.msg, "full_attention"));
        c = (td_block_call){0, TD_BLOCK_ATTN, 1, x, y, NULL, NULL};
        assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_ARG);
        c = (td_block_call){0, TD_BLOCK_PLE, 1, x, y, NULL, NULL};
        assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_UNSUPPORTED);
        td_taps_free(t);
        td_engine_free(e);
        td_engine_free(e1);
    }
    free(x);
    free(y);
    free(y2);
}

/* tp_size=2: each rank's partial, and tp_rank=all = round(round(p0) + round(p1)) in rank order. */
static void block_tp_ranks_reduce(void **state)
{
    (void)state;
    const int64_t m = 5;
    float *x = td_test_poisoned(m * H), *p0 = td_test_poisoned(m * H), *p1 = td_test_poisoned(m * H), *all = td_test_poisoned(m * H);
    float *one = td_test_poisoned(m * H);
    static const char *const acts[2] = {"", ",act_dtype=fp16"};
    for (int ck = 0; ck < 2; ck++)
        for (int a = 0; a < 2; a++) {
            const td_act_dtype act = a ? TD_ACT_FP16 : TD_ACT_FP32;
            char v[4][96];
            snprintf(v[0], sizeof v[0], "ref:tp_size=2,tp_rank=0%s", acts[a]);
            snprintf(v[1], sizeof v[1], "ref:tp_size=2,tp_rank=1%s", acts[a]);
            snprintf(v[2], sizeof v[2], "ref:tp_size=2,tp_rank=all%s", acts[a]);
            snprintf(v[3], sizeof v[3], "%s", a ? "ref:act_dtype=fp16" : "ref");
            td_engine *e[4];
            for (int i = 0; i < 4; i++) e[i] = load(ck, v[i]);
            td_taps *t = prefill_taps(e[3], m);
            td_err err = {0};
            for (int64_t L = 2; L <= 3; L++) { /* a GDN layer and an attention layer */
                block_input(ck, t, L, m, act, x);
                assert_int_equal(mixer(e[0], L, m, x, p0, &err), TD_OK);
                assert_int_equal(mixer(e[1], L, m, x, p1, &err), TD_OK);
                assert_int_equal(mixer(e[2], L, m, x, all, &err), TD_OK);
                assert_int_equal(mixer(e[3], L, m, x, one, &err), TD_OK);
                double mx = 0, md = 0;
                for (int64_t i = 0; i < m * H; i++) {
                    assert_true(ref_round_act(p0[i], act) == p0[i] && ref_round_act(p1[i], act) == p1[i]);
                    const float want = ref_round_act(p0[i] + p1[i], act);
                    assert_true(td_f32_bits(want) == td_f32_bits(all[i]));
                    mx = fmax(mx, fabs((double)one[i]));
                    md = fmax(md, fabs((double)one[i] - (double)all[i]));
                }
                /* the split changes the summation order only (and the extra roundings of fp16) */
                assert_true(mx > 0 && md / mx < (a ? 4e-3 : 1e-5));
            }
            td_taps_free(t);
            for (int i = 0; i < 4; i++) td_engine_free(e[i]);
        }
    /* a split that cuts a head is refused */
    td_engine *b = load(0, "ref:tp_size=8,tp_rank=0");
    td_err err = {0};
    assert_int_equal(mixer(b, 3, 1, x, p0, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "tp_size 8"));
    td_engine_free(b);
    free(x);
    free(p0);
    free(p1);
    free(all);
    free(one);
}

static double rel_max_diff(const float *a, const float *b, int64_t n)
{
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)a[i]));
        md = fmax(md, fabs((double)a[i] - (double)b[i]));
    }
    assert_true(mx > 0);
    return md / mx;
}

/* act_dtype=fp16/bf16 and tp_size=2,tp_rank=all run the whole model: bounded differences from
 * the FP32 / TP1 model, activations representable in act_dtype, same bits for any thread
 * count, prefill + decode = prefill. */
static void model_act_dtype_and_tp(void **state)
{
    (void)state;
    static const struct { const char *v; double bound; td_act_dtype act; } cases[] = {
        {"ref:act_dtype=fp16", 1e-2, TD_ACT_FP16},
        {"ref:act_dtype=bf16", 0.25, TD_ACT_BF16},
        {"ref:tp_size=2,tp_rank=all", 2e-5, TD_ACT_FP32},
        {"ref:tp_size=2,tp_rank=all,act_dtype=bf16", 0.25, TD_ACT_BF16},
    };
    float *base = td_test_poisoned(V), *a = td_test_poisoned(V), *b = td_test_poisoned(V);
    for (int ck = 0; ck < 2; ck++) {
        td_engine *e0 = load(ck, "ref");
        td_err err = {0};
        assert_int_equal(td_engine_prefill(e0, 0, prompt, 12, base, &err), TD_OK);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char v1[128], v3[128];
            snprintf(v1, sizeof v1, "%s,threads=1", cases[i].v);
            snprintf(v3, sizeof v3, "%s,threads=3", cases[i].v);
            td_engine *e1 = load(ck, v1), *e3 = load(ck, v3);
            static const char *const pats[] = {"L*.resid", "final.hidden"};
            td_taps *t = NULL;
            assert_int_equal(td_taps_new(pats, 2, &t, &err), TD_OK);
            td_engine_set_taps(e1, t);
            assert_int_equal(td_engine_prefill(e1, 0, prompt, 12, a, &err), TD_OK);
            td_engine_set_taps(e1, NULL);
            assert_finite(a, V);
            const double d = rel_max_diff(base, a, V);
            if (getenv("TD_TEST_VERBOSE")) fprintf(stderr, "ck %d %s: %g\n", ck, cases[i].v, d);
            if (!(d > 0 && d < cases[i].bound)) fail_msg("%s: max |dlogit| / max |logit| = %g", cases[i].v, d);
            for (size_t k = 0; k < td_taps_count(t); k++) {
                const td_tap *tp = td_taps_at(t, k);
                const float *f = tp->data;
                for (int64_t j = 0; j < tp->numel; j++) assert_true(ref_round_act(f[j], cases[i].act) == f[j]);
            }
            td_taps_free(t);
            /* threads: prefill 9 then decode 3 on e3 equals the prefill of 12 on e1 */
            assert_int_equal(td_engine_prefill(e3, 4, prompt, 9, b, &err), TD_OK);
            for (int64_t k = 9; k < 12; k++) {
                const td_decode_item it = {4, prompt[k]};
                assert_int_equal(td_engine_decode(e3, &it, 1, b, &err), TD_OK);
            }
            assert_memory_equal(a, b, V * sizeof *a);
            td_engine_free(e1);
            td_engine_free(e3);
        }
        td_engine_free(e0);
    }
    free(base);
    free(a);
    free(b);
}

static void completion_hash_and_pick(void **state)
{
    (void)state;
    const int32_t ids[3] = {1, 2, -1};
    const uint8_t bytes[12] = {1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    uint8_t d[TD_SHA256_DIGEST_LEN];
    char want[TD_SHA256_HEX_LEN], got[TD_SHA256_HEX_LEN];
    td_sha256(bytes, sizeof bytes, d);
    td_sha256_hex(d, want);
    td_completion_hash(ids, 3, got);
    assert_string_equal(got, want);
    td_completion_hash(ids, 0, got);
    assert_string_equal(got, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const float l[5] = {1.0f, NAN, 3.0f, 3.0f, 2.5f};
    double m;
    assert_int_equal(td_greedy_pick(l, 5, &m), 2);
    assert_true(m == 0.0);
    const float l2[3] = {NAN, -1.0f, 0.5f};
    assert_int_equal(td_greedy_pick(l2, 3, &m), 2);
    assert_true(m == 1.5);
}

static void completion_batches_agree(void **state)
{
    (void)state;
    td_engine *e = load(1, "ref:threads=2");
    td_err err = {0};
    const td_prompt pr[4] = {{prompt, 3}, {prompt + 3, 5}, {prompt + 1, 1}, {prompt, 12}};
    td_completion a[4], b[4];
    td_gen_params p = {.max_new = 6, .batch = 1, .eos = -1};
    assert_int_equal(td_generate(e, V, pr, 4, &p, a, &err), TD_OK);
    p.batch = 3;
    assert_int_equal(td_generate(e, V, pr, 4, &p, b, &err), TD_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(a[i].n, 6);
        assert_memory_equal(a[i].tokens, b[i].tokens, 6 * sizeof(int32_t));
        assert_string_equal(a[i].hash, b[i].hash);
        assert_int_equal(td_completion_compare(&a[i], &b[i]).pos, -1);
    }
    /* an eos stops generation right after it */
    p.eos = a[0].tokens[2];
    td_completion c[1];
    assert_int_equal(td_generate(e, V, pr, 1, &p, c, &err), TD_OK);
    assert_int_equal(c[0].n, 3);
    td_divergence dv = td_completion_compare(&c[0], &a[0]);
    assert_int_equal(dv.pos, 3);
    assert_true(isnan(dv.margin_a) && dv.margin_b == a[0].margins[3]);
    b[1].tokens[4] ^= 1;
    dv = td_completion_compare(&a[1], &b[1]);
    assert_int_equal(dv.pos, 4);
    assert_true(dv.margin_a == a[1].margins[4] && dv.margin_a >= 0);
    for (int i = 0; i < 4; i++) {
        td_completion_free(&a[i]);
        td_completion_free(&b[i]);
    }
    td_completion_free(&c[0]);
    td_engine_free(e);
}

static int run_cli(const char *prompts_text, const char *extra, char **out)
{
    const char *t = getenv("TD_TANDEM");
    if (!t) t = "build/release/tandem";
    const char *pp = td_test_path("prompts.jsonl"), *log = td_test_path("run.log");
    td_test_write_str(pp, prompts_text);
    int rc = td_test_sh("%s run --model %s --prompts %s --max-new 4 %s > %s 2>&1", t, g_dir[0], pp, extra, log);
    *out = td_test_slurp(log, NULL);
    assert_non_null(*out);
    return rc;
}

static void run_cli_hashes_and_hostile_prompts(void **state)
{
    (void)state;
    char *out;
    char extra[900];
    snprintf(extra, sizeof extra, "--engines ref,ref:threads=1 --batch 1,2 --db %s", td_test_path("run.db"));
    assert_int_equal(run_cli("[1, 2, 3]\n{\"id\": \"b\", \"tokens\": [7]}\n", extra, &out), 0);
    assert_non_null(strstr(out, "8 of 8 completions equal"));
    free(out);
    /* the store keeps the token ids; identical variants have no divergence */
    const char *t = getenv("TD_TANDEM");
    if (!t) t = "build/release/tandem";
    const char *jl = td_test_path("completions.json");
    assert_int_equal(td_test_sh("%s db completions latest --db %s --json > %s", t, td_test_path("run.db"), jl), 0);
    char *js = td_test_slurp(jl, NULL);
    assert_non_null(js);
    cJSON *arr = cJSON_Parse(js);
    free(js);
    assert_int_equal(cJSON_GetArraySize(arr), 8);
    const cJSON *row;
    cJSON_ArrayForEach(row, arr) {
        const cJSON *ids = cJSON_GetObjectItem(row, "token_ids");
        assert_int_equal(cJSON_GetArraySize(ids), 4);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(row, "first_divergence")));
    }
    cJSON_Delete(arr);
    assert_int_equal(td_test_sh("%s db completions latest --db %s --diverged --json > %s", t, td_test_path("run.db"),
                                jl), 0);
    js = td_test_slurp(jl, NULL);
    assert_non_null(js);
    arr = cJSON_Parse(js);
    free(js);
    assert_true(cJSON_IsArray(arr));
    assert_int_equal(cJSON_GetArraySize(arr), 0);
    cJSON_Delete(arr);
    static const struct { const char *text, *needle; } bad[] = {
        {"[1, 2\n", ":1"},
        {"[1]\n[]\n", ":2: expected a non-empty array"},
        {"[1]\n\n[1.5]\n", ":3"},
        {"[4096]\n", "outside the vocabulary"},
        {"{\"id\": \"x\", \"tokens\": [1]}\n{\"id\": \"x\", \"tokens\": [2]}\n", ":2: duplicate id"},
        {"\n\n", "no prompts"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int rc = run_cli(bad[i].text, "--engines ref --no-db", &out);
        if (rc != 2 || !strstr(out, bad[i].needle) || !strstr(out, "prompts.jsonl"))
            fail_msg("case %zu: rc %d output '%s'", i, rc, out);
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(model_prefill_then_decode_bitwise),
        cmocka_unit_test(model_threads_and_batch_bitwise),
        cmocka_unit_test(model_fp64_accum_close),
        cmocka_unit_test(model_errors_and_taps),
        cmocka_unit_test(block_mixers_equal_prefill_taps),
        cmocka_unit_test(block_tp_ranks_reduce),
        cmocka_unit_test(model_act_dtype_and_tp),
        cmocka_unit_test(completion_hash_and_pick),
        cmocka_unit_test(completion_batches_agree),
        cmocka_unit_test(run_cli_hashes_and_hostile_prompts),
    };
    return cmocka_run_group_tests_name("ref_model", tests, setup, NULL);
}
