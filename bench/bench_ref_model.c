/* bench_ref_model.c — throughput of the reference engine's full qwen3_next model.
 *
 *   build/release/bench/bench_ref_model [--tiny] [--layer] [--flash] [--threads LIST] [--ctx N]
 *
 * --tiny   generates `qwen3-next-tiny` (NVFP4, 64 experts, 8 layers) in a scratch directory
 *          (TMPDIR or /tmp), then per thread count: prefill of 32 tokens (tokens/s) and 32
 *          greedy decode steps of one sequence (tokens/s), best of 3.
 * --layer  one layer of each kind at the real Qwen3-Next shape (hidden 2048; GDN 16/32 heads of
 *          128, kernel 4; attention 16 query / 2 KV heads of 256, rotary 64; MoE 512 experts
 *          x 512, top-10, shared expert 512), random weights in memory (BF16 projections,
 *          NVFP4 routed experts with scales in 73..126): time of one decode token per block
 *          (attention with a KV cache of --ctx tokens, default 1024), and of a 16-token
 *          prefill chunk per block, per thread count. A full layer = mixer + MoE.
 * --flash  one qwen4_exp (Qwen3.8-Flash-Next) layer at the release shape (hidden 2560, 4 HC
 *          streams of rank 320; GDN split layout 16/48 heads of 128, sigmoid gate; QSA 24/2 heads
 *          of 256, rotary 64, indexer 4 x 128, blocks of 4, 512 blocks kept, over a cache of --ctx
 *          random tokens; MoE 512 NVFP4 experts x 640, top-10, shared 640; the PLE block with
 *          16 heads x 160 and a small table), BF16 projections: ms per block for 1 and 16 tokens.
 * Default: --tiny --layer, threads 1,2. Results are checked identical across thread counts.
 */
#include "engine.h"
#include "formats.h"
#include "gen.h"
#include "rng.h"
#include "audit/engines.h"
#include "ref/attn.h"
#include "ref/gdn.h"
#include "ref/hc.h"
#include "ref/ple.h"
#include "ref/qsa.h"
#include "ref/moe.h"
#include "ref/pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const td_err *err)
{
    fprintf(stderr, "bench_ref_model: %s: %s\n", what, err ? err->msg : "failed");
    exit(2);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory", NULL);
    return p;
}

static uint16_t *bf16_rand(td_rng *r, int64_t n, float scale)
{
    uint16_t *w = xmalloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = td_f32_to_bf16(scale * td_rng_normal_f32(r));
    return w;
}

static float *f32_rand(td_rng *r, int64_t n, float scale, float off)
{
    float *w = xmalloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = off + scale * td_rng_normal_f32(r);
    return w;
}

static void bench_tiny(const int *threads, int nt)
{
    char dir[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/bench_ref_model.%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = "qwen3-next-tiny";
    o.force = true;
    td_gen_plan plan;
    td_err err = {0};
    td_gen_result res;
    if (td_gen_plan_build(&o, &plan, &err) || td_gen_write(&plan, &o, dir, &res, &err)) die("gen", &err);
    td_gen_plan_free(&plan);
    const int64_t V = 4096, N = 32;
    int32_t prompt[32];
    for (int i = 0; i < N; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    float *logits = xmalloc((size_t)V * sizeof *logits), *first = xmalloc((size_t)V * sizeof *first);
    printf("qwen3-next-tiny (NVFP4, 8 layers, 64 experts): prefill %lld tokens, %lld decode steps\n", (long long)N,
           (long long)N);
    printf("| threads | prefill tok/s | decode tok/s | decode ms/token |\n|---|---|---|---|\n");
    for (int ti = 0; ti < nt; ti++) {
        char vt[64];
        snprintf(vt, sizeof vt, "ref:threads=%d", threads[ti]);
        td_variant v;
        td_engine *e = NULL;
        if (td_variant_parse(vt, &v, &err) || td_engine_load(dir, &v, &e, &err)) die("load", &err);
        double bp = 1e30, bd = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            if (td_engine_prefill(e, 0, prompt, N, logits, &err)) die("prefill", &err);
            double t1 = now_s();
            int32_t tok = 1;
            for (int64_t s = 0; s < N; s++) {
                td_decode_item it = {0, tok};
                if (td_engine_decode(e, &it, 1, logits, &err)) die("decode", &err);
                int64_t best = 0;
                for (int64_t k = 1; k < V; k++)
                    if (logits[k] > logits[best]) best = k;
                tok = (int32_t)best;
            }
            double t2 = now_s();
            if (t1 - t0 < bp) bp = t1 - t0;
            if (t2 - t1 < bd) bd = t2 - t1;
        }
        if (ti == 0) memcpy(first, logits, (size_t)V * sizeof *first);
        else if (memcmp(first, logits, (size_t)V * sizeof *first)) die("thread counts disagree", NULL);
        printf("| %d | %.0f | %.1f | %.2f |\n", threads[ti], (double)N / bp, (double)N / bd, 1e3 * bd / (double)N);
        td_engine_free(e);
    }
    free(logits);
    free(first);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_ref_model: could not remove %s\n", dir);
}

/* A synthetic MoE layer: E NVFP4 experts of I x H (random codes, E4M3 scales 73..126, global
 * 1e-4), top-K, BF16 router, BF16 shared expert of I and its gate; synth_moe_free frees it. */
typedef struct synth_moe {
    ref_moe_weights w;
    uint8_t *packed, *scales;
    ref_expert *ex;
    uint16_t *wr, *sg, *su, *sd, *sgate;
} synth_moe;

static void synth_moe_make(td_rng *r, int64_t H, int64_t E, int64_t I, int64_t K, synth_moe *o)
{
    const int64_t pb = I * H / 2, sb = I * H / 16;
    uint8_t *packed = xmalloc((size_t)(E * 3 * pb)), *scales = xmalloc((size_t)(E * 3 * sb));
    for (int64_t i = 0; i < E * 3 * pb; i += 8) {
        const uint64_t u = td_rng_u64(r);
        memcpy(packed + i, &u, 8);
    }
    for (int64_t i = 0; i < E * 3 * sb; i++) scales[i] = (uint8_t)(73 + td_rng_below(r, 54));
    ref_expert *ex = xmalloc((size_t)E * sizeof *ex);
    for (int64_t e = 0; e < E; e++) {
        const int64_t b = e * 3;
        ref_linear_nvfp4(&ex[e].gate, TD_NVFP4_MODELOPT, I, H, packed + b * pb, scales + b * sb, 1e-4f);
        ref_linear_nvfp4(&ex[e].up, TD_NVFP4_MODELOPT, I, H, packed + (b + 1) * pb, scales + (b + 1) * sb, 1e-4f);
        ref_linear_nvfp4(&ex[e].down, TD_NVFP4_MODELOPT, H, I, packed + (b + 2) * pb, scales + (b + 2) * sb, 1e-4f);
    }
    uint16_t *wr = bf16_rand(r, E * H, 0.02f), *sg = bf16_rand(r, I * H, 0.02f), *su = bf16_rand(r, I * H, 0.02f);
    uint16_t *sd = bf16_rand(r, H * I, 0.02f), *sgate = bf16_rand(r, H, 0.02f);
    o->w = (ref_moe_weights){.hidden = H, .n_experts = E, .top_k = K, .inter = I, .shared_inter = I,
                             .norm_topk_prob = true, .has_router = true, .experts = ex, .has_shared = true};
    ref_linear_dense(&o->w.router, TD_BF16, E, H, wr);
    ref_linear_dense(&o->w.shared.gate, TD_BF16, I, H, sg);
    ref_linear_dense(&o->w.shared.up, TD_BF16, I, H, su);
    ref_linear_dense(&o->w.shared.down, TD_BF16, H, I, sd);
    ref_linear_dense(&o->w.shared_gate, TD_BF16, 1, H, sgate);
    o->packed = packed;
    o->scales = scales;
    o->ex = ex;
    o->wr = wr;
    o->sg = sg;
    o->su = su;
    o->sd = sd;
    o->sgate = sgate;
}

static void synth_moe_free(synth_moe *o)
{
    free(o->packed);
    free(o->scales);
    free(o->ex);
    free(o->wr);
    free(o->sg);
    free(o->su);
    free(o->sd);
    free(o->sgate);
}

static void bench_layer(const int *threads, int nt, int64_t ctx)
{
    td_rng r;
    td_rng_seed(&r, 5);
    const int64_t H = 2048, E = 512, I = 512, K = 10;
    const ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    /* GDN */
    ref_gdn_dims gd = {H, 16, 32, 128, 128, 4, 1e-6f, false, false};
    const int64_t C = ref_gdn_channels(&gd);
    uint16_t *wqkvz = bf16_rand(&r, 12288 * H, 0.02f), *wba = bf16_rand(&r, 64 * H, 0.02f);
    uint16_t *wout = bf16_rand(&r, H * 4096, 0.02f);
    float *conv = f32_rand(&r, C * 4, 0.5f, 0), *alog = f32_rand(&r, 32, 0.5f, 1), *dtb = f32_rand(&r, 32, 0.5f, 0);
    float *gnw = f32_rand(&r, 128, 0.1f, 1);
    ref_gdn_weights gw = {.conv_w = conv, .A_log = alog, .dt_bias = dtb, .norm_w = gnw};
    ref_linear_dense(&gw.qkvz, TD_BF16, 12288, H, wqkvz);
    ref_linear_dense(&gw.ba, TD_BF16, 64, H, wba);
    ref_linear_dense(&gw.out, TD_BF16, H, 4096, wout);
    /* attention */
    ref_attn_dims ad = {H, 16, 2, 256, 64, 5e6, 1e-6f};
    uint16_t *wq = bf16_rand(&r, 8192 * H, 0.02f), *wk = bf16_rand(&r, 512 * H, 0.02f);
    uint16_t *wv = bf16_rand(&r, 512 * H, 0.02f), *wo = bf16_rand(&r, H * 4096, 0.02f);
    float *qn = f32_rand(&r, 256, 0.1f, 0), *kn = f32_rand(&r, 256, 0.1f, 0);
    ref_attn_weights aw = {.q_norm = qn, .k_norm = kn};
    ref_linear_dense(&aw.q, TD_BF16, 8192, H, wq);
    ref_linear_dense(&aw.k, TD_BF16, 512, H, wk);
    ref_linear_dense(&aw.v, TD_BF16, 512, H, wv);
    ref_linear_dense(&aw.o, TD_BF16, H, 4096, wo);
    /* MoE */
    synth_moe sm;
    synth_moe_make(&r, H, E, I, K, &sm);
    ref_moe_weights mw = sm.w;
    const ref_moe_opts mo = {nx, TD_ACT_FP32, 1, 0};

    const int64_t M = 16;
    float *x = f32_rand(&r, (ctx + M) * H, 1.0f, 0), *y = xmalloc((size_t)((ctx + M) * H) * sizeof *y);
    printf("\nreal qwen3_next layer shape (hidden 2048, 512 experts x 512 top-10 + shared), ms per call, best of 3\n");
    printf("| threads | GDN 1 tok | attn 1 tok (ctx %lld) | MoE 1 tok | GDN 16 tok | attn 16 tok | MoE 16 tok | "
           "GDN+MoE layer tok/s | attn+MoE layer tok/s |\n|---|---|---|---|---|---|---|---|---|\n",
           (long long)ctx);
    for (int ti = 0; ti < nt; ti++) {
        ref_pool *pool;
        td_err err = {0};
        if (ref_pool_new(threads[ti], &pool, &err)) die("pool", &err);
        ref_gdn_ws gws = {0};
        ref_attn_ws aws = {0};
        ref_moe_ws mws = {0};
        if (ref_moe_ws_reserve(&mws, &mw, M, threads[ti], &err)) die("moe ws", &err);
        double best[6];
        for (int k = 0; k < 6; k++) best[k] = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            ref_gdn_state gs = {0};
            if (ref_gdn_state_init(&gs, &gd, &err)) die("gdn state", &err);
            ref_kv kv = {0};
            if (ref_attn_run(&aw, &ad, &nx, &REF_ROWPAR_PLAIN, pool, &aws, &kv, x, ctx, y, &err)) die("attn ctx", &err);
            const int64_t ms[2] = {1, M};
            for (int j = 0; j < 2; j++) {
                double t0 = now_s();
                if (ref_gdn_run(&gw, &gd, &nx, &REF_ROWPAR_PLAIN, pool, &gws, &gs, x, ms[j], y, &err)) die("gdn", &err);
                double t1 = now_s();
                kv.len = ctx;
                if (ref_attn_run(&aw, &ad, &nx, &REF_ROWPAR_PLAIN, pool, &aws, &kv, x, ms[j], y, &err)) die("attn", &err);
                double t2 = now_s();
                if (ref_moe_run(&mw, &mo, pool, &mws, x, ms[j], NULL, NULL, y, &err)) die("moe", &err);
                double t3 = now_s();
                best[3 * j] = fmin(best[3 * j], t1 - t0);
                best[3 * j + 1] = fmin(best[3 * j + 1], t2 - t1);
                best[3 * j + 2] = fmin(best[3 * j + 2], t3 - t2);
            }
            ref_gdn_state_free(&gs);
            ref_kv_free(&kv);
        }
        printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", threads[ti], 1e3 * best[0],
               1e3 * best[1], 1e3 * best[2], 1e3 * best[3], 1e3 * best[4], 1e3 * best[5], 1.0 / (best[0] + best[2]),
               1.0 / (best[1] + best[2]));
        ref_gdn_ws_free(&gws);
        ref_attn_ws_free(&aws);
        ref_moe_ws_free(&mws);
        ref_pool_free(pool);
    }
    free(wqkvz);
    free(wba);
    free(wout);
    free(conv);
    free(alog);
    free(dtb);
    free(gnw);
    free(wq);
    free(wk);
    free(wv);
    free(wo);
    free(qn);
    free(kn);
    synth_moe_free(&sm);
    free(x);
    free(y);
}

/* One Flash-Next (qwen4_exp) layer of each kind at the release shape, blocks timed separately. */
static void bench_flash(const int *threads, int nt, int64_t ctx)
{
    td_rng r;
    td_rng_seed(&r, 6);
    const int64_t H = 2560, S = 4, P = S * H, R = 320, E = 512, I = 640, K = 10, M = 16;
    const ref_numerics nx = {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE};
    /* HC mix (attention side; the MLP side has the same cost) */
    ref_hc_dims hd = {H, S, R, 1e-6f};
    uint16_t *hdn = bf16_rand(&r, R * P, 0.01f), *hup = bf16_rand(&r, P * R, 0.05f), *hin = bf16_rand(&r, S * P, 0.01f);
    float *hnorm = f32_rand(&r, P, 0.1f, 0);
    ref_hc_weights hw = {.norm = hnorm, .has_inject = true};
    ref_linear_dense(&hw.down, TD_BF16, R, P, hdn);
    ref_linear_dense(&hw.up, TD_BF16, P, R, hup);
    ref_linear_dense(&hw.inject, TD_BF16, S, P, hin);
    /* GDN, split layout, sigmoid gate: 16 key / 48 value heads of 128 */
    ref_gdn_dims gd = {.hidden = H, .nk = 16, .nv = 48, .dk = 128, .dv = 128, .kconv = 4, .eps = 1e-6f,
                       .split = true, .sigmoid_gate = true};
    const int64_t C = ref_gdn_channels(&gd);
    uint16_t *wqkv = bf16_rand(&r, C * H, 0.02f), *wz = bf16_rand(&r, 6144 * H, 0.02f);
    uint16_t *wb = bf16_rand(&r, 48 * H, 0.02f), *wa = bf16_rand(&r, 48 * H, 0.02f), *wout = bf16_rand(&r, H * 6144, 0.02f);
    float *conv = f32_rand(&r, C * 4, 0.5f, 0), *alog = f32_rand(&r, 48, 0.5f, 1), *dtb = f32_rand(&r, 48, 0.5f, 0);
    float *gnw = f32_rand(&r, 128, 0.1f, 1);
    ref_gdn_weights gw = {.conv_w = conv, .A_log = alog, .dt_bias = dtb, .norm_w = gnw};
    ref_linear_dense(&gw.qkv, TD_BF16, C, H, wqkv);
    ref_linear_dense(&gw.z, TD_BF16, 6144, H, wz);
    ref_linear_dense(&gw.b, TD_BF16, 48, H, wb);
    ref_linear_dense(&gw.a, TD_BF16, 48, H, wa);
    ref_linear_dense(&gw.out, TD_BF16, H, 6144, wout);
    /* QSA: 24 query / 2 KV heads of 256, rotary 64, indexer 4 x 128, blocks of 4, 512 blocks */
    ref_qsa_dims qd = {.a = {H, 24, 2, 256, 64, 1e7, 1e-6f}, .idx_heads = 4, .idx_dim = 128, .block = 4, .topk = 512};
    uint16_t *wq = bf16_rand(&r, 12288 * H, 0.02f), *wk = bf16_rand(&r, 512 * H, 0.02f);
    uint16_t *wv = bf16_rand(&r, 512 * H, 0.02f), *wo = bf16_rand(&r, H * 6144, 0.02f), *wi = bf16_rand(&r, 640 * H, 0.02f);
    float *qn = f32_rand(&r, 256, 0.1f, 0), *kn = f32_rand(&r, 256, 0.1f, 0);
    float *qln = f32_rand(&r, 128, 0.1f, 0), *kln = f32_rand(&r, 128, 0.1f, 0);
    ref_qsa_weights qw = {.a = {.q_norm = qn, .k_norm = kn}, .q_ln = qln, .k_ln = kln};
    ref_linear_dense(&qw.a.q, TD_BF16, 12288, H, wq);
    ref_linear_dense(&qw.a.k, TD_BF16, 512, H, wk);
    ref_linear_dense(&qw.a.v, TD_BF16, 512, H, wv);
    ref_linear_dense(&qw.a.o, TD_BF16, H, 6144, wo);
    ref_linear_dense(&qw.idx, TD_BF16, 640, H, wi);
    /* MoE: 512 NVFP4 experts x 640, top-10, BF16 router and shared expert 640 */
    synth_moe sm;
    synth_moe_make(&r, H, E, I, K, &sm);
    ref_moe_weights mw = sm.w;
    const ref_moe_opts mo = {nx, TD_ACT_FP32, 1, 0};
    /* PLE block (layer 1): 16 heads x 160, kernel 4 dilation 3; a small F32 table (the lookup is
     * one row per head and token, its size does not change the cost) */
    ref_ple_dims pd = {.hidden = H, .hc = S, .embed_dim = H, .ngram = 3, .heads_per_ngram = 8, .heads = 16,
                       .head_dim = 160, .kconv = 4, .dilation = 3, .eos = 248044, .vocab = 248320, .eps = 1e-6f};
    uint16_t *pk = bf16_rand(&r, P * H, 0.02f), *pv = bf16_rand(&r, H * H, 0.02f);
    float *pnk = f32_rand(&r, P, 0.1f, 0), *pnq = f32_rand(&r, P, 0.1f, 0), *pnc = f32_rand(&r, P, 0.1f, 0);
    float *pconv = f32_rand(&r, P * 4, 0.5f, 0);
    ref_ple_weights pw = {.norm_key = pnk, .norm_query = pnq, .norm_conv = pnc, .conv_w = pconv};
    ref_linear_dense(&pw.key, TD_BF16, P, H, pk);
    ref_linear_dense(&pw.value, TD_BF16, H, H, pv);
    ref_ple_multipliers(1234, 0, pd.vocab, pd.ngram, pw.mult);
    int64_t rows = 0;
    for (int h = 0; h < 16; h++) {
        pw.sizes[h] = 1009 + 4 * h;
        pw.offsets[h] = rows;
        rows += pw.sizes[h];
    }
    float *table = f32_rand(&r, rows * 160, 0.1f, 0);
    const uint8_t *shard = (const uint8_t *)table;
    pw.table = (ref_ple_table){1, rows, 160, TD_F32, &shard, 1.0f};

    float *X = f32_rand(&r, M * P, 1.0f, 0), *Xc = xmalloc((size_t)(M * P) * sizeof *Xc);
    float *x = f32_rand(&r, M * H, 1.0f, 0), *y = xmalloc((size_t)(M * P) * sizeof *y), *inj = xmalloc(M * S * sizeof *inj);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)td_rng_below(&r, 248320);
    float *kv_k = f32_rand(&r, ctx * 512, 1.0f, 0), *kv_v = f32_rand(&r, ctx * 512, 1.0f, 0);
    float *ki = f32_rand(&r, ctx * 128, 1.0f, 0), *kb = f32_rand(&r, (ctx / 4 + 1) * 128, 1.0f, 0);
    printf("\nreal qwen4_exp (Flash-Next) layer shape (hidden 2560, 4 HC streams, QSA ctx %lld = %lld blocks, "
           "512 experts x 640 top-10 + shared), ms per call, best of 3\n",
           (long long)ctx, (long long)(ctx / 4));
    printf("| threads | tokens | HC mix | HC combine | GDN | QSA | MoE | PLE | GDN layer | QSA layer |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    float *first = xmalloc((size_t)(M * P) * sizeof *first);
    for (int ti = 0; ti < nt; ti++) {
        ref_pool *pool;
        td_err err = {0};
        if (ref_pool_new(threads[ti], &pool, &err)) die("pool", &err);
        ref_hc_ws hws = {0};
        ref_gdn_ws gws = {0};
        ref_qsa_ws qws = {0};
        ref_moe_ws mws = {0};
        ref_ple_ws pws = {0};
        if (ref_moe_ws_reserve(&mws, &mw, M, threads[ti], &err)) die("moe ws", &err);
        const int64_t ms[2] = {1, M};
        for (int j = 0; j < 2; j++) {
            const int64_t m = ms[j];
            double best[6];
            for (int k = 0; k < 6; k++) best[k] = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                ref_gdn_state gs = {0};
                ref_ple_state ps = {0};
                if (ref_gdn_state_init(&gs, &gd, &err)) die("gdn state", &err);
                if (ref_ple_state_init(&ps, &pd, &err)) die("ple state", &err);
                /* a QSA cache of ctx random tokens (K/V, raw indexer keys, block keys) */
                ref_qsa_cache qc = {.len = ctx, .cap = ctx, .kw = 512, .nblocks = ctx / 4};
                qc.k = xmalloc((size_t)(ctx * 512) * sizeof(float));
                qc.v = xmalloc((size_t)(ctx * 512) * sizeof(float));
                qc.ki = xmalloc((size_t)(ctx * 128) * sizeof(float));
                qc.kb = xmalloc((size_t)((ctx / 4 + 1) * 128) * sizeof(float));
                memcpy(qc.k, kv_k, (size_t)(ctx * 512) * sizeof(float));
                memcpy(qc.v, kv_v, (size_t)(ctx * 512) * sizeof(float));
                memcpy(qc.ki, ki, (size_t)(ctx * 128) * sizeof(float));
                memcpy(qc.kb, kb, (size_t)((ctx / 4 + 1) * 128) * sizeof(float));
                memcpy(Xc, X, (size_t)(m * P) * sizeof *Xc);
                double t[7];
                t[0] = now_s();
                if (ref_hc_mix(&hw, &hd, &nx, pool, &hws, Xc, m, x, inj, &err)) die("hc mix", &err);
                t[1] = now_s();
                ref_hc_combine(&hd, Xc, x, inj, m);
                t[2] = now_s();
                if (ref_gdn_run(&gw, &gd, &nx, &REF_ROWPAR_PLAIN, pool, &gws, &gs, x, m, y, &err)) die("gdn", &err);
                t[3] = now_s();
                if (ref_qsa_run(&qw, &qd, &nx, pool, &qws, &qc, x, m, y, NULL, &err)) die("qsa", &err);
                t[4] = now_s();
                if (ref_moe_run(&mw, &mo, pool, &mws, x, m, NULL, NULL, y, &err)) die("moe", &err);
                t[5] = now_s();
                if (ref_ple_run(&pw, &pd, &nx, pool, &pws, &ps, Xc, tok, m, y, &err)) die("ple", &err);
                t[6] = now_s();
                for (int k = 0; k < 6; k++) best[k] = fmin(best[k], t[k + 1] - t[k]);
                ref_gdn_state_free(&gs);
                ref_ple_state_free(&ps);
                ref_qsa_cache_free(&qc);
            }
            if (j == 1) {
                if (ti == 0) memcpy(first, y, (size_t)(m * P) * sizeof *first);
                else if (memcmp(first, y, (size_t)(m * P) * sizeof *first)) die("thread counts disagree", NULL);
            }
            /* a layer = 2 HC mixes + 2 combines + mixer + MoE */
            const double hc = 2 * (best[0] + best[1]);
            printf("| %d | %lld | %.2f | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", threads[ti], (long long)m,
                   1e3 * best[0], 1e3 * best[1], 1e3 * best[2], 1e3 * best[3], 1e3 * best[4], 1e3 * best[5],
                   1e3 * (hc + best[2] + best[4]), 1e3 * (hc + best[3] + best[4]));
        }
        ref_hc_ws_free(&hws);
        ref_gdn_ws_free(&gws);
        ref_qsa_ws_free(&qws);
        ref_moe_ws_free(&mws);
        ref_ple_ws_free(&pws);
        ref_pool_free(pool);
    }
    free(first);
    free(hdn);
    free(hup);
    free(hin);
    free(hnorm);
    free(wqkv);
    free(wz);
    free(wb);
    free(wa);
    free(wout);
    free(conv);
    free(alog);
    free(dtb);
    free(gnw);
    free(wq);
    free(wk);
    free(wv);
    free(wo);
    free(wi);
    free(qn);
    free(kn);
    free(qln);
    free(kln);
    synth_moe_free(&sm);
    free(pk);
    free(pv);
    free(pnk);
    free(pnq);
    free(pnc);
    free(pconv);
    free(table);
    free(X);
    free(Xc);
    free(x);
    free(y);
    free(inj);
    free(kv_k);
    free(kv_v);
    free(ki);
    free(kb);
}

int main(int argc, char **argv)
{
    bool tiny = false, layer = false, flash = false;
    int threads[16] = {1, 2}, nt = 2;
    long ctx = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny")) tiny = true;
        else if (!strcmp(argv[i], "--layer")) layer = true;
        else if (!strcmp(argv[i], "--flash")) flash = true;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            ctx = strtol(argv[++i], NULL, 10);
            if (ctx < 1 || ctx > (1 << 20)) die("--ctx", NULL);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            nt = 0;
            for (char *s = argv[++i]; *s && nt < 16;) {
                char *end;
                long v = strtol(s, &end, 10);
                if (end == s || v < 1 || v > TD_ENGINE_MAX_THREADS) die("--threads", NULL);
                threads[nt++] = (int)v;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') die("--threads", NULL);
            }
        } else {
            fprintf(stderr, "usage: bench_ref_model [--tiny] [--layer] [--flash] [--threads LIST] [--ctx N]\n");
            return 2;
        }
    }
    if (!tiny && !layer && !flash) tiny = layer = true;
    if (tiny) bench_tiny(threads, nt);
    if (layer) bench_layer(threads, nt, (int64_t)ctx);
    if (flash) bench_flash(threads, nt, (int64_t)ctx);
    return 0;
}
