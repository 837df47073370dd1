/* test_ref_model_flash.c — the reference engine's whole qwen4_exp model (ref/model_flash.h).
 *
 * Checkpoint: `flash-next-tiny` generated with td_gen (8 layers: 6 split-layout GDN + 2 QSA,
 * hidden 256, 4 HC streams, PLE at layer index 1 with an FP8 n-gram table, QSA budget 128 =
 * 32 blocks of 4, NVFP4 routed experts) with 8 experts, and the same unquantized (BF16 table).
 * What is asserted:
 * - prefill of n tokens followed by decode steps gives, bit for bit, the logits of a prefill
 *   of the whole 150-token prompt (which contains EOS tokens, so the PLE hash segments, and is
 *   long enough that QSA selects 32 of up to 37 blocks), for n = 1, 6 (mid-block), 8 (block
 *   boundary) and 141 — tolerance 0: every recurrence, cache and hash context is token-serial;
 * - 1 and 3 worker threads give identical bits; logits are finite and fully written;
 * - taps: L3.qsa.blocks holds, at the last position, 32 distinct ascending block ids below 37
 *   (37 complete blocks there: the selection is sparse), -1 at position 0; L1.ple.out [m, 1024],
 *   L0.hc_attn.mix [m, 256], L0.hc_attn.inject [m, 4] with values in (0, 2), L7.resid
 *   [m, 1024], final.hidden [m, 256], and the logits tap equals the returned logits;
 * - accum=fp64 differs from fp32 only by rounding (relative max difference < 1e-3).
 */
#include "test_common.h"
#include "engine_test.h"
#include "gen_fixture.h"
#include "audit/engines.h"
#include "engine.h"
#include "gen.h"

#include <math.h>

#define V 4096
#define T 150
static char g_dir[2][600];
static int32_t g_prompt[T];

static void make_ckpt(int i, bool unquantized)
{
    td_test_gen("flash-next-tiny", 11, unquantized, 8, unquantized ? "flash_bf16" : "flash_nvfp4", g_dir[i], sizeof g_dir[i]);
}

static int setup(void **state)
{
    (void)state;
    make_ckpt(0, false);
    make_ckpt(1, true);
    uint64_t x = 12345;
    for (int i = 0; i < T; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        g_prompt[i] = (int32_t)((x >> 33) % V);
    }
    /* EOS (id 2 in the preset) inside the prompt: alone, twice in a row, right at the start */
    g_prompt[0] = 2;
    g_prompt[7] = 2;
    g_prompt[40] = 2;
    g_prompt[41] = 2;
    g_prompt[140] = 2;
    return 0;
}

static td_engine *load(int ck, const char *variant) { return td_test_engine(g_dir[ck], variant); }

static void flash_prefill_then_decode_bitwise(void **state)
{
    (void)state;
    for (int ck = 0; ck < 2; ck++) {
        td_engine *e = load(ck, "ref:threads=2");
        td_err err = {0};
        float *full = td_test_poisoned(V), *step = td_test_poisoned(V);
        td_status st = td_engine_prefill(e, 1, g_prompt, T, full, &err);
        if (st) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(st, TD_OK);
        for (int64_t i = 0; i < V; i++) assert_true(isfinite(full[i]));
        static const int64_t ns[4] = {1, 6, 8, 141};
        for (int a = 0; a < 4; a++) {
            assert_int_equal(td_engine_prefill(e, 0, g_prompt, ns[a], step, &err), TD_OK);
            for (int64_t t = ns[a]; t < T; t++) {
                const td_decode_item it = {0, g_prompt[t]};
                assert_int_equal(td_engine_decode(e, &it, 1, step, &err), TD_OK);
            }
            assert_memory_equal(full, step, V * sizeof *full);
        }
        free(full);
        free(step);
        td_engine_free(e);
    }
}

static void flash_threads_bitwise(void **state)
{
    (void)state;
    float *a = td_test_poisoned(V), *b = td_test_poisoned(V);
    td_err err = {0};
    td_engine *e1 = load(0, "ref:threads=1"), *e3 = load(0, "ref:threads=3");
    assert_int_equal(td_engine_prefill(e1, 0, g_prompt, 60, a, &err), TD_OK);
    assert_int_equal(td_engine_prefill(e3, 0, g_prompt, 60, b, &err), TD_OK);
    assert_memory_equal(a, b, V * sizeof *a);
    const td_decode_item it = {0, 9};
    assert_int_equal(td_engine_decode(e1, &it, 1, a, &err), TD_OK);
    assert_int_equal(td_engine_decode(e3, &it, 1, b, &err), TD_OK);
    assert_memory_equal(a, b, V * sizeof *a);
    td_engine_free(e1);
    td_engine_free(e3);
    td_engine *e64 = load(0, "ref:accum=fp64");
    assert_int_equal(td_engine_prefill(e64, 0, g_prompt, 60, b, &err), TD_OK);
    td_engine *e1b = load(0, "ref");
    assert_int_equal(td_engine_prefill(e1b, 0, g_prompt, 60, a, &err), TD_OK);
    double num = 0, den = 0;
    for (int64_t i = 0; i < V; i++) {
        num = fmax(num, fabs((double)a[i] - (double)b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    assert_true(num > 0 || den > 0);
    assert_true(num / den < 1e-3);
    td_engine_free(e64);
    td_engine_free(e1b);
    free(a);
    free(b);
}

/* qwen4_exp prefill runs with FP32 activations and no TP emulation: other variants are refused
 * by name, never run with other numerics. */
static void flash_refuses_act_dtype_and_tp(void **state)
{
    (void)state;
    static const char *const vs[] = {"ref:act_dtype=fp16", "ref:act_dtype=bf16", "ref:tp_size=2,tp_rank=all"};
    float *lg = malloc(V * sizeof *lg);
    assert_non_null(lg);
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        td_engine *e = load(0, vs[i]);
        td_err err = {0};
        assert_int_equal(td_engine_prefill(e, 1, g_prompt, 4, lg, &err), TD_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "qwen4_exp"));
        td_engine_free(e);
    }
    free(lg);
}

static void flash_taps(void **state)
{
    (void)state;
    td_engine *e = load(0, "ref:threads=2");
    td_err err = {0};
    float *a = td_test_poisoned(V);
    static const char *const pats[] = {"L3.qsa.blocks", "L1.ple.out", "L0.hc_attn.mix", "L0.hc_attn.inject",
                                       "L7.resid", "final.hidden", "logits"};
    td_taps *t = NULL;
    assert_int_equal(td_taps_new(pats, 7, &t, &err), TD_OK);
    td_engine_set_taps(e, t);
    assert_int_equal(td_engine_prefill(e, 0, g_prompt, T, a, &err), TD_OK);
    assert_int_equal(td_taps_count(t), 7);
    const td_tap *tp = td_taps_find(t, "L3.qsa.blocks");
    assert_non_null(tp);
    assert_int_equal(tp->dtype, TD_I32);
    assert_int_equal(tp->shape[0], T);
    assert_int_equal(tp->shape[1], 32);
    const int32_t *ids = (const int32_t *)tp->data + (T - 1) * 32;
    for (int i = 0; i < 32; i++) {
        assert_true(ids[i] >= 0 && ids[i] < T / 4);
        if (i) assert_true(ids[i] > ids[i - 1]);
    }
    const int32_t *first = (const int32_t *)tp->data; /* position 0: no complete block */
    for (int i = 0; i < 32; i++) assert_int_equal(first[i], -1);
    tp = td_taps_find(t, "L1.ple.out");
    assert_non_null(tp);
    assert_int_equal(tp->shape[1], 1024);
    tp = td_taps_find(t, "L0.hc_attn.mix");
    assert_int_equal(tp->shape[1], 256);
    tp = td_taps_find(t, "L0.hc_attn.inject");
    assert_int_equal(tp->shape[1], 4);
    for (int64_t i = 0; i < tp->numel; i++) {
        const float g = ((const float *)tp->data)[i];
        assert_true(g > 0.0f && g < 2.0f);
    }
    tp = td_taps_find(t, "L7.resid");
    assert_int_equal(tp->shape[1], 1024);
    tp = td_taps_find(t, "final.hidden");
    assert_int_equal(tp->shape[1], 256);
    tp = td_taps_find(t, "logits");
    assert_memory_equal(tp->data, a, V * sizeof *a);
    td_engine_set_taps(e, NULL);
    td_taps_free(t);
    td_engine_free(e);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flash_prefill_then_decode_bitwise),
        cmocka_unit_test(flash_threads_bitwise),
        cmocka_unit_test(flash_taps),
        cmocka_unit_test(flash_refuses_act_dtype_and_tp),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
