/* test_engine.c — the engine contract (core/engine) and the reference engine (ref/engine_ref).
 *
 * What is asserted:
 * - variant parsing: every option and value, canonical text (defaults dropped, fixed order),
 *   `all`/`auto`, and clear TD_ERR_ARG errors naming the variant and option for unknown
 *   engines/options, options an engine does not support, duplicates, bad values (with the
 *   choices listed), malformed text, tp_rank >= tp_size; diff/equal/resolve; neutral options;
 * - the registry: `ref` is built; `cuda` is registered, its variants parse, and on a CPU build
 *   loading it fails with TD_ERR_UNSUPPORTED "not built";
 * - tap sets: exact and glob patterns, capture, replace, reset, find, dtype checks; the list
 *   of stable tap names;
 * - the ref engine on checkpoints written by tests/moe_fixture.h (NVFP4 ModelOpt, NVFP4
 *   compressed-tensors, BF16 per-expert and fused): run_block(moe) equals ref_moe_run on the
 *   same weights held in memory, bit for bit, so loading finds the right tensors and
 *   conventions; the router block equals the moe.router_logits tap; taps have the documented
 *   names and shapes; threads=1 and threads=3 agree bit for bit;
 * - argument checks of run_block (NULL buffers, token counts, layer range, half-given routes,
 *   routes on the router block), attn on a GDN layer (TD_ERR_ARG), gdn on a checkpoint without
 *   the mixer's tensors (TD_ERR_NOTFOUND naming it), unimplemented blocks give TD_ERR_UNSUPPORTED with a
 *   message, never a silent no-op; prefill on a MoE-only checkpoint names the missing
 *   embedding tensor and decode of a sequence never prefilled is TD_ERR_ARG;
 * - load errors name the file, tensor or option: missing directory, a tensor of the wrong
 *   shape, a missing tensor, tp_size that does not divide the intermediate size or that cuts
 *   NVFP4 blocks.
 */
#include "test_common.h"
#include "engine_test.h"
#include "engine.h"
#include "audit/engines.h"
#include "db/query.h"
#include "db_fixture.h"
#include "ref/engine_ref.h"
#include "moe_fixture.h"
#include "ref/moe.h"

/* ---- variants --------------------------------------------------------------------------------- */

static void variant_parse_valid(void **state)
{
    (void)state;
    td_variant v;
    td_err err;
    char buf[TD_VARIANT_TEXT_MAX];
    assert_int_equal(td_variant_parse("ref", &v, &err), TD_OK);
    assert_string_equal(v.engine, "ref");
    assert_int_equal(v.set, 0);
    assert_int_equal(v.tp_size, 1);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf), "ref");

    assert_int_equal(td_variant_parse("ref:threads=2,fault=tp_slice,tp_rank=3,tp_size=4,scale=fp16,accum=fp64,"
                                      "act_dtype=bf16",
                                      &v, &err),
                     TD_OK);
    assert_int_equal(v.act_dtype, TD_ACT_BF16);
    assert_int_equal(v.accum, TD_ACCUM_FP64);
    assert_int_equal(v.scale, TD_SCALE_FP16);
    assert_int_equal(v.tp_size, 4);
    assert_int_equal(v.tp_rank, 3);
    assert_int_equal(v.threads, 2);
    assert_int_equal(v.fault, TD_FAULT_TP_SLICE);
    /* canonical: fixed option order */
    assert_string_equal(td_variant_format(&v, buf, sizeof buf),
                        "ref:act_dtype=bf16,accum=fp64,scale=fp16,tp_size=4,tp_rank=3,threads=2,fault=tp_slice");
    td_variant w;
    assert_int_equal(td_variant_parse(buf, &w, &err), TD_OK);
    assert_true(td_variant_equal(&v, &w));

    /* defaults written explicitly are dropped from the canonical text */
    assert_int_equal(td_variant_parse("ref:scale=exact,act_dtype=fp32,threads=auto", &v, &err), TD_OK);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf), "ref");
    assert_true(v.set & TD_OPT_BIT(TD_OPT_SCALE));
    assert_int_equal(td_variant_parse("ref:tp_size=4,tp_rank=all", &v, &err), TD_OK);
    assert_int_equal(v.tp_rank, TD_TP_RANK_ALL);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf), "ref:tp_size=4,tp_rank=all");

    /* cuda variants parse on every build */
    assert_int_equal(td_variant_parse("cuda:storage=raw,moe_dispatch=grouped,graphs=on,act_dtype=fp16", &v, &err),
                     TD_OK);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf),
                        "cuda:storage=raw,moe_dispatch=grouped,act_dtype=fp16,graphs=on");
    assert_int_equal(td_variant_parse("cuda:kernels=generic,act_dtype=bf16", &v, &err), TD_OK);
    assert_true(v.generic);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf), "cuda:act_dtype=bf16,kernels=generic");
    assert_int_equal(td_variant_parse("cuda:kernels=fast", &v, &err), TD_OK);
    assert_false(v.generic);
    assert_string_equal(td_variant_format(&v, buf, sizeof buf), "cuda");
}

static void variant_parse_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"", "empty"},
        {"gpu", "unknown engine 'gpu' (engines: ref, cuda)"},
        {"Ref", "unknown engine"},
        {"ref:", "no option after ':'"},
        {"ref:scale", "'scale' is not an option=value pair"},
        {"ref:scale=", "not an option=value pair"},
        {"ref:=fp16", "not an option=value pair"},
        {"ref:scale=fp16,", "not an option=value pair"},
        {"ref:speed=fast", "unknown option 'speed'"},
        {"ref:storage=raw", "option 'storage' is not supported by engine 'ref'"},
        {"ref:graphs=on", "option 'graphs' is not supported by engine 'ref'"},
        {"cuda:accum=fp64", "option 'accum' is not supported by engine 'cuda'"},
        {"ref:scale=fp16,scale=exact", "option 'scale' is given twice"},
        {"ref:scale=fp8", "scale 'fp8': expected exact|fp16"},
        {"ref:act_dtype=fp64", "expected fp32|fp16|bf16"},
        {"ref:fault=yes", "expected none|nibble_order|reciprocal_global|gate_up_swap|no_renorm|tp_slice|topk_skip|no_route_taps"},
        {"ref:tp_size=0", "tp_size '0'"},
        {"ref:tp_size=65", "tp_size '65'"},
        {"ref:tp_size=04", "tp_size '04'"},
        {"ref:threads=-1", "threads '-1'"},
        {"ref:threads=1x", "threads '1x'"},
        {"ref:tp_rank=4,tp_size=4", "tp_rank 4 is not below tp_size 4"},
        {"ref:tp_rank=1", "tp_rank 1 is not below tp_size 1"},
        {"cuda:graphs=maybe", "expected off|on"},
        {"cuda:kernels=slow", "expected fast|generic"},
        {"ref:kernels=generic", "option 'kernels' is not supported by engine 'ref'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_variant v;
        td_err err;
        td_err_clear(&err);
        td_status st = td_variant_parse(cases[i].text, &v, &err);
        if (st != TD_ERR_ARG || !strstr(err.msg, cases[i].needle))
            fail_msg("'%s': status %d, message '%s' (want '%s')", cases[i].text, st, err.msg, cases[i].needle);
    }
    char longtext[400];
    memset(longtext, 'a', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = 0;
    td_variant v;
    td_err err;
    assert_int_equal(td_variant_parse(longtext, &v, &err), TD_ERR_ARG);
    assert_int_equal(td_variant_parse(NULL, &v, &err), TD_ERR_ARG);
}

static void variant_diff_and_neutral(void **state)
{
    (void)state;
    td_variant a, b;
    td_err err;
    assert_int_equal(td_variant_parse("ref:scale=fp16,threads=1", &a, &err), TD_OK);
    assert_int_equal(td_variant_parse("ref:threads=2", &b, &err), TD_OK);
    assert_int_equal(td_variant_diff(&a, &b), TD_OPT_BIT(TD_OPT_SCALE) | TD_OPT_BIT(TD_OPT_THREADS));
    assert_false(td_variant_equal(&a, &b));
    assert_true(td_opt_is_neutral(TD_OPT_THREADS));
    assert_true(td_opt_is_neutral(TD_OPT_STORAGE));
    assert_true(td_opt_is_neutral(TD_OPT_GRAPHS));
    assert_true(td_opt_is_neutral(TD_OPT_FAULT));
    assert_true(td_opt_is_neutral(TD_OPT_KERNELS));
    assert_false(td_opt_is_neutral(TD_OPT_SCALE));
    assert_false(td_opt_is_neutral(TD_OPT_MOE_DISPATCH));
    assert_false(td_opt_is_neutral(TD_OPT_TP_RANK));
    assert_false(td_opt_is_neutral(TD_OPT_COUNT));
    /* auto threads resolve to the online CPUs */
    assert_int_equal(td_variant_parse("ref", &a, &err), TD_OK);
    td_variant_resolve(&a);
    assert_true(a.threads >= 1);
    char buf[64];
    snprintf(buf, sizeof buf, "ref:threads=%d", a.threads);
    assert_int_equal(td_variant_parse(buf, &b, &err), TD_OK);
    assert_true(td_variant_equal(&a, &b));
    assert_string_equal(td_opt_name(TD_OPT_MOE_DISPATCH), "moe_dispatch");
    assert_null(td_opt_name(TD_OPT_COUNT));
    assert_int_equal(td_act_dtype_tensor(TD_ACT_BF16), TD_BF16);
    assert_string_equal(td_fault_name(TD_FAULT_NO_RENORM), "no_renorm");
    assert_string_equal(td_block_name(TD_BLOCK_ROUTER), "router");
    assert_null(td_block_name(TD_BLOCK_COUNT));
}

static void registry_cuda_not_built(void **state)
{
    (void)state;
    assert_true(td_engine_count() >= 2);
    const td_engine_entry *r = td_engine_find("ref");
    assert_non_null(r);
    const char *why = "unset";
    assert_ptr_equal(td_engine_impl("ref", &why), &td_ref_engine_ops);
    assert_null(why);
    const td_engine_entry *c = td_engine_find("cuda");
    assert_non_null(c);
    assert_null(td_engine_find("nope"));
#ifndef TD_HAVE_CUDA
    assert_null(td_engine_impl("cuda", &why));
    assert_non_null(strstr(why, "no CUDA engine"));
    assert_null(td_engine_impl("nope", &why));
    assert_string_equal(why, "unknown engine");
    td_variant v;
    td_err err;
    assert_int_equal(td_variant_parse("cuda:storage=raw", &v, &err), TD_OK);
    td_engine *e = (td_engine *)1;
    assert_int_equal(td_engine_load("/nonexistent", &v, &e, &err), TD_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(err.msg, "engine 'cuda' is not built"));
#endif
}

/* ---- taps ---------------------------------------------------------------------------------------- */

static void taps_capture(void **state)
{
    (void)state;
    const char *pats[] = {"L3.moe.out", "L*.moe.topk*"};
    td_taps *t;
    td_err err;
    assert_int_equal(td_taps_new(pats, 2, &t, &err), TD_OK);
    assert_true(td_taps_wants(t, "L3.moe.out"));
    assert_false(td_taps_wants(t, "L4.moe.out"));
    assert_true(td_taps_wants(t, "L12.moe.topk"));
    assert_true(td_taps_wants(t, "L0.moe.topk_weights"));
    assert_false(td_taps_wants(t, "L0.moe.router_logits"));
    assert_false(td_taps_wants(NULL, "L3.moe.out"));
    const float a[6] = {1, 2, 3, 4, 5, 6};
    const int32_t ids[2] = {7, 9};
    const int64_t s23[2] = {2, 3}, s2[1] = {2};
    assert_int_equal(td_taps_put(t, "L3.moe.out", TD_F32, 2, s23, a, &err), TD_OK);
    assert_int_equal(td_taps_put(t, "L3.moe.topk", TD_I32, 1, s2, ids, &err), TD_OK);
    assert_int_equal(td_taps_count(t), 2);
    const td_tap *x = td_taps_find(t, "L3.moe.out");
    assert_non_null(x);
    assert_int_equal(x->numel, 6);
    assert_int_equal(x->shape[1], 3);
    assert_memory_equal(x->data, a, sizeof a);
    assert_string_equal(td_taps_at(t, 1)->name, "L3.moe.topk");
    /* a put of the same name replaces it and keeps the order */
    const float b[2] = {8, 9};
    assert_int_equal(td_taps_put(t, "L3.moe.out", TD_F32, 1, s2, b, &err), TD_OK);
    assert_int_equal(td_taps_count(t), 2);
    assert_string_equal(td_taps_at(t, 0)->name, "L3.moe.out");
    assert_int_equal(td_taps_at(t, 0)->numel, 2);
    td_taps_reset(t);
    assert_int_equal(td_taps_count(t), 0);
    assert_null(td_taps_find(t, "L3.moe.out"));
    assert_int_equal(td_taps_put(t, "L3.moe.topk", TD_I32, 1, s2, ids, &err), TD_OK);
    assert_int_equal(td_taps_count(t), 1);
    assert_int_equal(td_taps_put(t, "x", TD_F16, 1, s2, ids, &err), TD_ERR_ARG);
    td_taps_free(t);
    td_taps_free(NULL);
    const char *bad[] = {""};
    assert_int_equal(td_taps_new(bad, 1, &t, &err), TD_ERR_ARG);
    assert_null(t);
}

static void taps_known_names(void **state)
{
    (void)state;
    assert_true(td_tap_known("L0.moe.out"));
    assert_true(td_tap_known("L47.moe.router_logits"));
    assert_true(td_tap_known("L3.hc_attn.mix"));
    assert_true(td_tap_known("L1.qsa.blocks"));
    assert_true(td_tap_known("L2.hc_mlp.combine"));
    assert_true(td_tap_known("final.hidden"));
    assert_true(td_tap_known("logits"));
    assert_false(td_tap_known("L.moe.out"));
    assert_false(td_tap_known("L01.moe.out"));
    assert_false(td_tap_known("L0.moe.unknown"));
    assert_false(td_tap_known("moe.out"));
    char buf[64];
    assert_string_equal(td_tap_name(buf, sizeof buf, 23, "moe.topk"), "L23.moe.topk");
    assert_string_equal(td_tap_name(buf, sizeof buf, -1, "logits"), "logits");
}

/* ---- the ref engine on checkpoints ------------------------------------------------------------- */

static const char *write_fixture(const char *name, const mf_opts *o, mf_model *m)
{
    mf_build(o, m);
    const char *dir = td_test_path(name);
    mf_write(m, dir);
    return dir;
}

static void engine_matches_in_memory(void **state)
{
    (void)state;
    for (int fx = 0; fx < 4; fx++) {
        mf_opts o;
        mf_defaults(&o);
        o.seed = 10 + (uint64_t)fx;
        if (fx == 1) {
            o.fmt = MF_CT;
            o.shared_bf16 = true;
        }
        if (fx >= 2) o.fmt = MF_BF16;
        if (fx == 3) o.fused = true;
        char name[32];
        snprintf(name, sizeof name, "eng%d", fx);
        mf_model m;
        const char *dir = write_fixture(name, &o, &m);
        static const char *const variants[] = {"ref", "ref:act_dtype=fp16,scale=fp16", "ref:tp_size=4,tp_rank=2",
                                               "ref:tp_size=2,tp_rank=all,accum=fp64"};
        for (size_t vi = 0; vi < 4; vi++) {
            td_engine *e = td_test_engine(dir, variants[vi]);
            const td_engine_model *mi = td_engine_model_info(e);
            assert_int_equal(mi->hidden, 64);
            assert_int_equal(mi->num_experts, 8);
            assert_int_equal(mi->top_k, 3);
            assert_int_equal(mi->layers, 2);
            const td_variant *v = td_engine_variant(e);
            for (int64_t L = 0; L < 2; L++) {
                const int64_t M = 5;
                float x[5 * 64], got[5 * 64], want[5 * 64];
                td_rng rng;
                td_rng_seed(&rng, (uint64_t)(100 + L));
                for (int i = 0; i < M * 64; i++) x[i] = 0.5f * td_rng_normal_f32(&rng);
                td_block_call c = {L, TD_BLOCK_MOE, M, x, got, NULL, NULL};
                td_err err;
                for (int i = 0; i < M * 64; i++) got[i] = NAN;
                if (td_engine_run_block(e, &c, &err)) fail_msg("%s: %s", variants[vi], err.msg);
                ref_moe_weights w;
                mf_views(&m, L, &w);
                ref_moe_opts ro = {{v->accum, v->scale, v->fault}, v->act_dtype, v->tp_size, v->tp_rank};
                ref_pool *pool;
                ref_moe_ws ws;
                memset(&ws, 0, sizeof ws);
                assert_int_equal(ref_pool_new(1, &pool, &err), TD_OK);
                assert_int_equal(ref_moe_ws_reserve(&ws, &w, M, 1, &err), TD_OK);
                assert_int_equal(ref_moe_run(&w, &ro, pool, &ws, x, M, NULL, NULL, want, &err), TD_OK);
                if (memcmp(got, want, sizeof got))
                    fail_msg("fixture %d variant %s layer %lld: engine differs from in-memory block", fx,
                             variants[vi], (long long)L);
                ref_moe_ws_free(&ws);
                ref_pool_free(pool);
            }
            td_engine_free(e);
        }
        mf_free(&m);
    }
}

static void engine_taps_router_threads(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = write_fixture("engtaps", &o, &m);
    td_engine *e1 = td_test_engine(dir, "ref:threads=1,tp_size=2,tp_rank=1");
    td_engine *e3 = td_test_engine(dir, "ref:threads=3,tp_size=2,tp_rank=1");
    const char *pats[] = {"L*.moe.*"};
    td_taps *t1, *t3;
    td_err err;
    assert_int_equal(td_taps_new(pats, 1, &t1, &err), TD_OK);
    assert_int_equal(td_taps_new(pats, 1, &t3, &err), TD_OK);
    td_engine_set_taps(e1, t1);
    td_engine_set_taps(e3, t3);
    const int64_t M = 7;
    float x[7 * 64], y1[7 * 64], y3[7 * 64], lg[7 * 8];
    td_rng rng;
    td_rng_seed(&rng, 5);
    for (int i = 0; i < M * 64; i++) x[i] = td_rng_normal_f32(&rng);
    td_block_call c = {1, TD_BLOCK_MOE, M, x, y1, NULL, NULL};
    assert_int_equal(td_engine_run_block(e1, &c, &err), TD_OK);
    c.output = y3;
    assert_int_equal(td_engine_run_block(e3, &c, &err), TD_OK);
    assert_memory_equal(y1, y3, sizeof y1);
    static const struct {
        const char *name;
        int ndim;
        int64_t s0, s1, s2;
    } want[] = {
        {"L1.moe.router_logits", 2, 7, 8, 0}, {"L1.moe.topk", 2, 7, 3, 0},       {"L1.moe.topk_weights", 2, 7, 3, 0},
        {"L1.moe.expert_act", 3, 7, 3, 32},   {"L1.moe.expert_out", 3, 7, 3, 64}, {"L1.moe.shared_out", 2, 7, 64, 0},
        {"L1.moe.out", 2, 7, 64, 0},
    };
    assert_int_equal(td_taps_count(t1), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const td_tap *a = td_taps_find(t1, want[i].name), *b = td_taps_find(t3, want[i].name);
        if (!a || !b) fail_msg("tap %s missing", want[i].name);
        assert_true(td_tap_known(a->name));
        assert_int_equal(a->ndim, want[i].ndim);
        assert_int_equal(a->shape[0], want[i].s0);
        assert_int_equal(a->shape[1], want[i].s1);
        if (want[i].ndim == 3) assert_int_equal(a->shape[2], want[i].s2);
        assert_int_equal(a->dtype, strcmp(want[i].name, "L1.moe.topk") ? TD_F32 : TD_I32);
        assert_memory_equal(a->data, b->data, (size_t)a->numel * 4);
    }
    assert_memory_equal(td_taps_find(t1, "L1.moe.out")->data, y1, sizeof y1);
    /* the router block gives the logits of the tap */
    td_block_call r = {1, TD_BLOCK_ROUTER, M, x, lg, NULL, NULL};
    assert_int_equal(td_engine_run_block(e1, &r, &err), TD_OK);
    assert_memory_equal(lg, td_taps_find(t1, "L1.moe.router_logits")->data, sizeof lg);
    /* imposed routes: no router tap this time */
    td_taps_reset(t1);
    int32_t ids[21];
    float wts[21];
    for (int i = 0; i < 21; i++) {
        ids[i] = i % 8;
        wts[i] = 0.25f;
    }
    td_block_call ci = {0, TD_BLOCK_MOE, M, x, y1, ids, wts};
    assert_int_equal(td_engine_run_block(e1, &ci, &err), TD_OK);
    assert_null(td_taps_find(t1, "L0.moe.router_logits"));
    assert_memory_equal(td_taps_find(t1, "L0.moe.topk")->data, ids, sizeof ids);
    /* taps off: nothing captured */
    td_engine_set_taps(e1, NULL);
    td_taps_reset(t1);
    assert_int_equal(td_engine_run_block(e1, &ci, &err), TD_OK);
    assert_int_equal(td_taps_count(t1), 0);
    td_engine_free(e1);
    td_engine_free(e3);
    td_taps_free(t1);
    td_taps_free(t3);
    mf_free(&m);
}

static void engine_call_checks(void **state)
{
    (void)state;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = write_fixture("engcalls", &o, &m);
    td_engine *e = td_test_engine(dir, "ref");
    static float x[64], y[64], w[3] = {1, 0, 0};
    static int32_t ids[3] = {0, 1, 2};
    td_err err;
    const struct {
        td_block_call c;
        td_status st;
        const char *needle;
    } cases[] = {
        {{0, TD_BLOCK_MOE, 1, NULL, y, NULL, NULL}, TD_ERR_ARG, "input and output buffers"},
        {{0, TD_BLOCK_MOE, 1, x, NULL, NULL, NULL}, TD_ERR_ARG, "input and output buffers"},
        {{0, TD_BLOCK_MOE, 0, x, y, NULL, NULL}, TD_ERR_RANGE, "0 tokens"},
        {{0, TD_BLOCK_MOE, TD_ENGINE_MAX_TOKENS + 1, x, y, NULL, NULL}, TD_ERR_RANGE, "tokens"},
        {{2, TD_BLOCK_MOE, 1, x, y, NULL, NULL}, TD_ERR_RANGE, "layer 2 is outside the model (2 layers)"},
        {{-1, TD_BLOCK_MOE, 1, x, y, NULL, NULL}, TD_ERR_RANGE, "layer -1"},
        {{0, TD_BLOCK_MOE, 1, x, y, ids, NULL}, TD_ERR_ARG, "route_ids and route_weights go together"},
        {{0, TD_BLOCK_ROUTER, 1, x, y, ids, w}, TD_ERR_ARG, "only apply to the moe block"},
        {{0, TD_BLOCK_ATTN, 1, x, y, NULL, NULL}, TD_ERR_ARG, "block 'attn' needs a full_attention layer"},
        /* a MoE-only checkpoint: the GDN block names the first missing tensor */
        {{0, TD_BLOCK_GDN, 1, x, y, NULL, NULL}, TD_ERR_NOTFOUND, "layers.0.input_layernorm"},
        {{0, TD_BLOCK_PLE, 1, x, y, NULL, NULL}, TD_ERR_UNSUPPORTED, "block 'ple'"},
        {{0, TD_BLOCK_COUNT, 1, x, y, NULL, NULL}, TD_ERR_ARG, "invalid block"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_err_clear(&err);
        td_status st = td_engine_run_block(e, &cases[i].c, &err);
        if (st != cases[i].st || !strstr(err.msg, cases[i].needle))
            fail_msg("case %zu: status %d message '%s' (want %d '%s')", i, st, err.msg, cases[i].st, cases[i].needle);
    }
    int32_t tok[2] = {1, 2};
    float logits[64];
    /* a MoE-only checkpoint has no embeddings: prefill names the missing tensor */
    assert_int_equal(td_engine_prefill(e, 0, tok, 2, logits, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "embed_tokens"));
    td_decode_item b = {0, 1};
    assert_int_equal(td_engine_decode(e, &b, 1, logits, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "never prefilled"));
    td_engine_free(e);
    td_engine_free(NULL);
    mf_free(&m);
}

static void engine_load_errors(void **state)
{
    (void)state;
    td_variant v;
    td_err err;
    td_engine *e = NULL;
    assert_int_equal(td_variant_parse("ref", &v, &err), TD_OK);
    td_status st = td_engine_load(td_test_path("no-such-dir"), &v, &e, &err);
    assert_true(st == TD_ERR_IO || st == TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "no-such-dir"));
    assert_null(e);

    mf_opts o;
    mf_defaults(&o);
    o.fmt = MF_BF16;
    o.shared_inter = 0;
    mf_model m;
    const char *dir = write_fixture("engerr", &o, &m);
    char path[1024], cfg[2048];
    float x[64] = {0}, y[64];
    td_block_call c = {0, TD_BLOCK_MOE, 1, x, y, NULL, NULL};

    /* config says 9 experts: the router tensor has the wrong shape */
    mf_model m9 = m;
    m9.o.experts = 9;
    mf_config(&m9, dir);
    e = td_test_engine(dir, "ref");
    td_err_clear(&err);
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.gate.weight: shape [8, 64], expected [9, 64]"));
    assert_non_null(strstr(err.msg, "layer 0"));
    td_engine_free(e);

    /* config announces a shared expert the file does not have */
    mf_model ms = m;
    ms.o.shared_inter = 64;
    mf_config(&ms, dir);
    e = td_test_engine(dir, "ref");
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.shared_expert_gate.weight"));
    td_engine_free(e);

    /* tp_size that does not divide the intermediate size */
    mf_config(&m, dir);
    assert_int_equal(td_variant_parse("ref:tp_size=3", &v, &err), TD_OK);
    assert_int_equal(td_engine_load(dir, &v, &e, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "tp_size 3 does not divide moe_intermediate_size 64"));
    mf_free(&m);

    /* NVFP4 down projections cut off the 16-element grid by tp_size 8 (8 columns per rank) */
    mf_defaults(&o);
    dir = write_fixture("engerr2", &o, &m);
    assert_int_equal(td_variant_parse("ref:tp_size=8", &v, &err), TD_OK);
    assert_int_equal(td_engine_load(dir, &v, &e, &err), TD_OK);
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "not a multiple of 16"));
    td_engine_free(e);
    /* an unsupported expert dtype is named */
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    remove(path); /* now the NVFP4 tensors are read as an unquantized module: U8 is not a float */
    e = td_test_engine(dir, "ref");
    assert_int_equal(td_engine_run_block(e, &c, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "model.layers.0.mlp.experts.0.gate_proj.weight: dtype U8"));
    td_engine_free(e);
    (void)cfg;
    mf_free(&m);
}

/* td_engine_model_from_config copies every field from its config key (distinct values, so
 * a swapped field shows). */
static void engine_model_from_config_copies_every_field(void **state)
{
    (void)state;
    td_config c;
    memset(&c, 0, sizeof c);
    c.family = TD_FAMILY_QWEN4_EXP;
    c.hidden_size = 2560;
    c.num_hidden_layers = 48;
    c.num_experts = 512;
    c.num_experts_per_tok = 10;
    c.moe_intermediate_size = 640;
    c.shared_expert_intermediate_size = 320;
    c.norm_topk_prob = true;
    td_engine_model m;
    memset(&m, 0xA5, sizeof m);
    td_engine_model_from_config(&c, &m);
    assert_int_equal(m.family, TD_FAMILY_QWEN4_EXP);
    assert_int_equal(m.hidden, 2560);
    assert_int_equal(m.layers, 48);
    assert_int_equal(m.num_experts, 512);
    assert_int_equal(m.top_k, 10);
    assert_int_equal(m.moe_inter, 640);
    assert_int_equal(m.shared_inter, 320);
    assert_true(m.norm_topk_prob);
    c.norm_topk_prob = false;
    td_engine_model_from_config(&c, &m);
    assert_false(m.norm_topk_prob);
}

/* td_engine_check_tp: every tp_size that divides both intermediate sizes passes, every other
 * one fails naming the engine, both sizes and the checkpoint; a model without MoE passes. */
static void engine_check_tp(void **state)
{
    (void)state;
    td_config c;
    memset(&c, 0, sizeof c);
    c.num_experts = 8;
    c.moe_intermediate_size = 96;
    c.shared_expert_intermediate_size = 64;
    td_err err;
    for (int tp = 1; tp <= 40; tp++) {
        td_err_clear(&err);
        const bool divides = 96 % tp == 0 && 64 % tp == 0;
        const td_status st = td_engine_check_tp(&c, tp, "cuda", "CKPT", &err);
        if (divides) {
            assert_int_equal(st, TD_OK);
            assert_string_equal(err.msg, "");
        } else {
            assert_int_equal(st, TD_ERR_ARG);
            char want[160];
            snprintf(want, sizeof want,
                     "engine cuda: tp_size %d does not divide moe_intermediate_size 96 / "
                     "shared_expert_intermediate_size 64 of CKPT",
                     tp);
            assert_non_null(strstr(err.msg, want));
        }
    }
    td_err_clear(&err);
    assert_int_equal(td_engine_check_tp(&c, 3, "ref", "CKPT", &err), TD_ERR_ARG); /* divides 96 only */
    assert_non_null(strstr(err.msg, "engine ref: tp_size 3 "));
    c.shared_expert_intermediate_size = 0; /* no shared expert: only the routed size counts */
    assert_int_equal(td_engine_check_tp(&c, 3, "ref", "CKPT", &err), TD_OK);
    c.num_experts = 0; /* a dense model: nothing to slice */
    c.moe_intermediate_size = 0;
    assert_int_equal(td_engine_check_tp(&c, 7, "ref", "CKPT", &err), TD_OK);
}

/* driver_version(TEXT) with out poisoned and a cap of `cap`; the text is copied into a buffer
 * of exactly its length (no NUL after it) so that a read past it is caught under ASan. */
static const char *driver_version(const char *text, size_t cap)
{
    static char out[64];
    memset(out, 'X', sizeof out);
    size_t n = strlen(text);
    char *t = malloc(n ? n : 1);
    assert_non_null(t);
    memcpy(t, text, n);
    td_engine_driver_version(t, n, out, cap);
    free(t);
    assert_true(memchr(out, '\0', cap) != NULL);
    return out;
}

static void engine_driver_version(void **state)
{
    (void)state;
    /* the proprietary and the open kernel modules' first lines */
    assert_string_equal(driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Wed Oct  1 "
                                       "00:00:00 UTC 2026\nGCC version:  gcc version 13.3.0\n", 64),
                        "580.159.04");
    assert_string_equal(driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
                                       "Release Build  (dvs-builder@U16)  Tue Sep 30 2026\n", 64),
                        "580.95.05");
    /* the key on a later line; no newline at the end */
    assert_string_equal(driver_version("junk line 1.2\nNVRM version: NVIDIA 575.51.03", 64), "575.51.03");
    /* nothing to take: empty, no key, a key with no version, versions only on other lines,
     * tokens with no dot, ending or starting with a dot, with letters */
    const char *none[] = {"",
                          "\n\n",
                          "NVRM version:",
                          "NVRM version:   \n580.1.2",
                          "GCC version: 13.3.0\n",
                          "NVRM version: NVIDIA 580 x86_64\n",
                          "NVRM version: 580.\n",
                          "NVRM version: .580\n",
                          "NVRM version: 580.1a.2 v1.2b\n",
                          "nvrm version: 580.1.2\n",
                          "NVRM version 580.1.2\n"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) assert_string_equal(driver_version(none[i], 64), "");
    /* a version that does not fit the output gives "", one that just fits is copied */
    assert_string_equal(driver_version("NVRM version: 580.159.04\n", 10), "");
    assert_string_equal(driver_version("NVRM version: 580.159.04\n", 11), "580.159.04");
    /* NULL text or a zero capacity write nothing past the buffer */
    char out[4] = "abc";
    td_engine_driver_version(NULL, 5, out, sizeof out);
    assert_string_equal(out, "");
    memcpy(out, "abc", 4);
    td_engine_driver_version("NVRM version: 1.2", 17, out, 0);
    assert_string_equal(out, "abc");
    /* seeded random bytes around the key never read or write out of bounds (ASan) */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < 2000; t++) {
        char buf[96];
        size_t n = 0;
        if (t & 1) {
            memcpy(buf, "NVRM version:", 13);
            n = 13;
        }
        size_t extra = (size_t)(t % 80);
        for (size_t j = 0; j < extra && n < sizeof buf - 1; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char alphabet[] = "0123456789.. \t\nNVa";
            buf[n++] = alphabet[x % (sizeof alphabet - 1)];
        }
        buf[n] = '\0';
        const char *v = driver_version(buf, 16);
        for (const char *c = v; *c; c++) assert_true((*c >= '0' && *c <= '9') || *c == '.');
    }
}

static const char *run_str(td_db *db, int64_t run, const char *key, char *buf, size_t cap)
{
    cJSON *j;
    td_err err;
    assert_int_equal(td_db_run_show(db, run, &j, &err), TD_OK);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    const char *r = NULL;
    if (cJSON_IsString(v)) {
        snprintf(buf, cap, "%s", v->valuestring);
        r = buf;
    } else {
        assert_true(cJSON_IsNull(v));
    }
    cJSON_Delete(j);
    return r;
}

static void engine_device_record(void **state)
{
    (void)state;
    /* the ref engine runs on the CPU: its device names no GPU */
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    const char *dir = write_fixture("engdev", &o, &m);
    td_engine *e = td_test_engine(dir, "ref");
    const td_engine_device *d = td_engine_device_info(e);
    assert_string_equal(d->gpu_name, "");
    assert_string_equal(d->gpu_driver, "");
    assert_string_equal(d->cuda_version, "");
    /* recorded into a run: nothing for a CPU engine; a GPU's name, driver and CUDA version,
     * empty fields left as they were */
    const char *path = td_test_path("engdev.db");
    remove(path);
    td_db *db = open_ok(path, TD_DB_CREATE);
    const int64_t run = begin_run(db, "audit.layer");
    td_err err;
    char buf[256];
    assert_int_equal(td_engine_device_record(db, run, d, &err), TD_OK);
    assert_null(run_str(db, run, "gpu_name", buf, sizeof buf));
    td_engine_device g;
    memset(&g, 0, sizeof g);
    snprintf(g.gpu_name, sizeof g.gpu_name, "NVIDIA Test GPU");
    snprintf(g.gpu_driver, sizeof g.gpu_driver, "580.159.04");
    snprintf(g.cuda_version, sizeof g.cuda_version, "13.0");
    assert_int_equal(td_engine_device_record(db, run, &g, &err), TD_OK);
    assert_string_equal(run_str(db, run, "gpu_name", buf, sizeof buf), "NVIDIA Test GPU");
    assert_string_equal(run_str(db, run, "gpu_driver", buf, sizeof buf), "580.159.04");
    assert_string_equal(run_str(db, run, "cuda_version", buf, sizeof buf), "13.0");
    snprintf(g.gpu_name, sizeof g.gpu_name, "NVIDIA Other GPU");
    g.gpu_driver[0] = '\0';
    assert_int_equal(td_engine_device_record(db, run, &g, &err), TD_OK);
    assert_string_equal(run_str(db, run, "gpu_name", buf, sizeof buf), "NVIDIA Other GPU");
    assert_string_equal(run_str(db, run, "gpu_driver", buf, sizeof buf), "580.159.04");
    /* no store, no device: nothing to do */
    assert_int_equal(td_engine_device_record(NULL, run, &g, &err), TD_OK);
    assert_int_equal(td_engine_device_record(db, run, NULL, &err), TD_OK);
    td_db_close(db);
    td_engine_free(e);
    mf_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_driver_version),
        cmocka_unit_test(engine_device_record),
        cmocka_unit_test(engine_model_from_config_copies_every_field),
        cmocka_unit_test(engine_check_tp),
        cmocka_unit_test(variant_parse_valid),
        cmocka_unit_test(variant_parse_errors),
        cmocka_unit_test(variant_diff_and_neutral),
        cmocka_unit_test(registry_cuda_not_built),
        cmocka_unit_test(taps_capture),
        cmocka_unit_test(taps_known_names),
        cmocka_unit_test(engine_matches_in_memory),
        cmocka_unit_test(engine_taps_router_threads),
        cmocka_unit_test(engine_call_checks),
        cmocka_unit_test(engine_load_errors),
    };
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
