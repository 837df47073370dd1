/* bench_ref.c — throughput of the reference engine's NVFP4 linear and MoE block.
 *
 *   build/release/bench/bench_ref [--gemv] [--moe] [--threads LIST] [--tokens LIST]
 *                                 [--no-estimate]
 *
 * --gemv   scalar NVFP4 GEMV y = W x in the exact FP32 ascending-K order (accum=fp32,
 *          scale=exact) on W [2560, 2560] and the production W13 (TP1) / W2 (TP4 shard) shapes,
 *          M = 1, 4, 16 input vectors, for each thread count: GFLOP/s (2 * rows * cols * M per
 *          call) in total and per thread. Rows are split across threads in chunks of 16, as the
 *          engine does; results are checked identical for every thread count.
 * --moe    the MoE block at the production shape (hidden 2560, 512 experts x 640, top-10,
 *          shared expert 640; NVFP4 routed experts with random codes and scales in the
 *          observed range 73..126, BF16 router and shared expert, all in memory, 1.4 GiB) for
 *          each token count (default 1,4,8,16,784), TP4 rank 0 and TP1, each thread count:
 *          best-of time per block call and GFLOP/s (router + k experts + shared expert).
 *          Then the estimated wall time of the seed's documented layer audit (3 layers x
 *          ranks 0,3 x these token counts with the two default pairs: per row 4 block runs on
 *          2 threads and 2 on 1 thread) unless --no-estimate.
 * Default: --gemv --moe, threads 1,2.
 */
#include "engine.h"
#include "formats.h"
#include "rng.h"
#include "ref/linear.h"
#include "ref/moe.h"
#include "ref/pool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const td_err *err)
{
    fprintf(stderr, "bench_ref: %s: %s\n", what, err ? err->msg : "failed");
    exit(2);
}

static int parse_list(const char *s, long *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 1) return -1;
        out[n++] = v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

/* Random NVFP4 bytes: codes uniform, scales in 73..126 (SEED_AUDITS.md §2.7), global g. */
static void fill_nvfp4(td_rng *rng, uint8_t *packed, uint8_t *scales, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows * cols / 2; i++) packed[i] = (uint8_t)td_rng_u32(rng);
    for (int64_t i = 0; i < rows * cols / 16; i++) scales[i] = (uint8_t)(73 + td_rng_below(rng, 54));
}

static void fill_bf16(td_rng *rng, uint16_t *w, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) w[i] = td_f32_to_bf16(scale * td_rng_normal_f32(rng));
}

/* ==== GEMV =================================================================================== */

typedef struct gemv_job {
    const ref_linear *l;
    ref_numerics nx;
    const float *const *x;
    float *const *y;      /* [M] output rows (each [rows]) */
    float **yy;           /* [workers, M] per-worker pointer arrays */
    int64_t M;
    float *scratch;       /* [workers, REF_LINEAR_SCRATCH(cols)] */
} gemv_job;

#define GEMV_CHUNK 16

static void gemv_item(void *ctx, int64_t item, int worker)
{
    gemv_job *j = ctx;
    const int64_t r0 = item * GEMV_CHUNK, r1 = r0 + GEMV_CHUNK < j->l->rows ? r0 + GEMV_CHUNK : j->l->rows;
    float **yp = j->yy + worker * j->M;
    for (int64_t i = 0; i < j->M; i++) yp[i] = j->y[i] + r0;
    ref_linear_rows(j->l, &j->nx, r0, r1, j->x, yp, j->M, j->scratch + worker * REF_LINEAR_SCRATCH(j->l->cols));
}

static void bench_gemv(const long *threads, int n_threads)
{
    static const struct { const char *name; int64_t rows, cols; } shapes[] = {
        {"square 2560x2560", 2560, 2560},
        {"W13 TP1 1280x2560", 1280, 2560},
        {"W2 TP4 2560x160", 2560, 160},
    };
    static const int64_t Ms[] = {1, 4, 16};
    printf("== scalar NVFP4 GEMV, exact FP32 ascending-K order (accum=fp32, scale=exact)\n");
    printf("%-20s %4s %8s %10s %12s %14s\n", "shape", "M", "threads", "ms/call", "GFLOP/s", "GFLOP/s/thread");
    td_rng rng;
    td_rng_seed(&rng, 7);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t rows = shapes[s].rows, cols = shapes[s].cols;
        uint8_t *packed = malloc((size_t)(rows * cols / 2));  /* [rows, cols/2] */
        uint8_t *scales = malloc((size_t)(rows * cols / 16)); /* [rows, cols/16] */
        fill_nvfp4(&rng, packed, scales, rows, cols);
        ref_linear l;
        ref_linear_nvfp4(&l, TD_NVFP4_MODELOPT, rows, cols, packed, scales, 1e-4f);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int64_t M = Ms[mi];
            float *xs = malloc((size_t)(M * cols) * sizeof(float)); /* [M, cols] */
            float *ys = malloc((size_t)(M * rows) * sizeof(float)); /* [M, rows] */
            float *y1 = malloc((size_t)(M * rows) * sizeof(float)); /* first thread count's result */
            const float **xp = malloc((size_t)M * sizeof *xp);
            float **yp = malloc((size_t)M * sizeof *yp);
            for (int64_t i = 0; i < M * cols; i++) xs[i] = td_rng_normal_f32(&rng);
            for (int64_t i = 0; i < M; i++) {
                xp[i] = xs + i * cols;
                yp[i] = ys + i * rows;
            }
            for (int ti = 0; ti < n_threads; ti++) {
                ref_pool *pool;
                td_err err;
                if (ref_pool_new((int)threads[ti], &pool, &err)) die("pool", &err);
                gemv_job j = {&l, {TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, xp, yp, NULL, M, NULL};
                j.yy = malloc((size_t)(threads[ti] * M) * sizeof(float *));
                j.scratch = malloc((size_t)threads[ti] * REF_LINEAR_SCRATCH(cols) * sizeof(float));
                const int64_t items = (rows + GEMV_CHUNK - 1) / GEMV_CHUNK;
                ref_pool_run(pool, items, gemv_item, &j); /* warm-up */
                int reps = 0;
                double t0 = now_s(), t1;
                do {
                    ref_pool_run(pool, items, gemv_item, &j);
                    reps++;
                    t1 = now_s();
                } while (t1 - t0 < 0.5);
                const double per = (t1 - t0) / reps;
                const double gf = 2.0 * (double)rows * (double)cols * (double)M / per * 1e-9;
                printf("%-20s %4lld %8ld %10.3f %12.2f %14.2f\n", shapes[s].name, (long long)M, threads[ti],
                       per * 1e3, gf, gf / (double)threads[ti]);
                if (ti == 0) memcpy(y1, ys, (size_t)(M * rows) * sizeof(float));
                else if (memcmp(y1, ys, (size_t)(M * rows) * sizeof(float)))
                    printf("  !! results differ between %ld and %ld threads\n", threads[0], threads[ti]);
                free(j.yy);
                free(j.scratch);
                ref_pool_free(pool);
            }
            free(xs);
            free(ys);
            free(y1);
            free(xp);
            free(yp);
        }
        free(packed);
        free(scales);
    }
}

/* ==== MoE block ============================================================================== */

typedef struct moe_bufs {
    ref_expert *experts;        /* [E] */
    uint8_t *blob;              /* every expert's packed bytes and scales */
    uint16_t *router;           /* [E, H] BF16 */
    uint16_t *sh_gu, *sh_dn, *sh_g; /* shared expert BF16 */
} moe_bufs;

static void fill_u64(td_rng *rng, uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = td_rng_u64(rng);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)td_rng_u32(rng);
}

/* Production-shape weights in memory: NVFP4 experts (random codes, scales 73..126, global
 * 1e-4), BF16 router / shared expert. */
static void build_moe(int64_t H, int64_t E, int64_t I, int64_t Is, int64_t k, ref_moe_weights *w, moe_bufs *b)
{
    td_rng rng;
    td_rng_seed(&rng, 11);
    memset(b, 0, sizeof *b);
    const size_t pk = (size_t)(I * H / 2), sc = (size_t)(I * H / 16); /* per projection */
    b->experts = calloc((size_t)E, sizeof *b->experts);
    b->blob = malloc((size_t)E * 3 * (pk + sc));
    b->router = malloc((size_t)(E * H) * 2);
    b->sh_gu = malloc((size_t)(2 * Is * H) * 2);
    b->sh_dn = malloc((size_t)(H * Is) * 2);
    b->sh_g = malloc((size_t)H * 2);
    if (!b->experts || !b->blob || !b->router || !b->sh_gu || !b->sh_dn || !b->sh_g) die("out of memory", NULL);
    fill_u64(&rng, b->blob, (size_t)E * 3 * (pk + sc));
    for (int64_t e = 0; e < E; e++) {
        uint8_t *base = b->blob + (size_t)e * 3 * (pk + sc);
        for (int p = 0; p < 3; p++) {
            uint8_t *s = base + 3 * pk + (size_t)p * sc;
            for (size_t i = 0; i < sc; i++) s[i] = (uint8_t)(73 + s[i] % 54);
        }
        ref_linear_nvfp4(&b->experts[e].gate, TD_NVFP4_MODELOPT, I, H, base, base + 3 * pk, 1e-4f);
        ref_linear_nvfp4(&b->experts[e].up, TD_NVFP4_MODELOPT, I, H, base + pk, base + 3 * pk + sc, 1e-4f);
        ref_linear_nvfp4(&b->experts[e].down, TD_NVFP4_MODELOPT, H, I, base + 2 * pk, base + 3 * pk + 2 * sc, 1e-4f);
    }
    fill_bf16(&rng, b->router, E * H, 0.02f);
    fill_bf16(&rng, b->sh_gu, 2 * Is * H, 0.02f);
    fill_bf16(&rng, b->sh_dn, H * Is, 0.02f);
    fill_bf16(&rng, b->sh_g, H, 0.02f);
    memset(w, 0, sizeof *w);
    w->hidden = H;
    w->n_experts = E;
    w->top_k = k;
    w->inter = I;
    w->shared_inter = Is;
    w->norm_topk_prob = true;
    w->has_router = true;
    ref_linear_dense(&w->router, TD_BF16, E, H, b->router);
    w->experts = b->experts;
    w->has_shared = true;
    ref_linear_dense(&w->shared.gate, TD_BF16, Is, H, b->sh_gu);
    ref_linear_dense(&w->shared.up, TD_BF16, Is, H, b->sh_gu + Is * H);
    ref_linear_dense(&w->shared.down, TD_BF16, H, Is, b->sh_dn);
    ref_linear_dense(&w->shared_gate, TD_BF16, 1, H, b->sh_g);
}

static void free_moe(moe_bufs *b)
{
    free(b->experts);
    free(b->blob);
    free(b->router);
    free(b->sh_gu);
    free(b->sh_dn);
    free(b->sh_g);
}

/* FLOPs of one block call on one rank (router + k experts + shared expert + shared gate). */
static double moe_flops(const ref_moe_weights *w, int64_t M, int tp)
{
    const double H = (double)w->hidden, il = (double)w->inter / tp, isl = (double)w->shared_inter / tp;
    return (double)M * (2.0 * (double)w->n_experts * H + (double)w->top_k * 2.0 * 3.0 * il * H +
                        2.0 * 3.0 * isl * H + 2.0 * H);
}

static double time_block(const ref_moe_weights *w, ref_moe_opts *o, int threads, const float *x, int64_t M,
                         float *out, int *reps_out)
{
    ref_pool *pool;
    ref_moe_ws ws;
    td_err err;
    memset(&ws, 0, sizeof ws);
    if (ref_pool_new(threads, &pool, &err) || ref_moe_ws_reserve(&ws, w, M, threads, &err)) die("setup", &err);
    if (ref_moe_run(w, o, pool, &ws, x, M, NULL, NULL, out, &err)) die("moe", &err); /* warm-up */
    double best = 1e30;
    int reps = 0;
    const double t_end = now_s() + 1.0;
    do {
        double t0 = now_s();
        if (ref_moe_run(w, o, pool, &ws, x, M, NULL, NULL, out, &err)) die("moe", &err);
        double t = now_s() - t0;
        if (t < best) best = t;
        reps++;
    } while (reps < 3 || now_s() < t_end);
    ref_moe_ws_free(&ws);
    ref_pool_free(pool);
    *reps_out = reps;
    return best;
}

static void bench_moe(const long *threads, int n_threads, const long *tokens, int n_tokens, bool estimate)
{
    const int64_t H = 2560, E = 512, I = 640, Is = 640, k = 10;
    printf("\n== MoE block at the production shape: hidden %lld, %lld experts x %lld, top-%lld, shared %lld\n",
           (long long)H, (long long)E, (long long)I, (long long)k, (long long)Is);
    printf("   NVFP4 routed experts (synthetic, in memory), BF16 router and shared expert, act fp32, scale exact\n");
    ref_moe_weights w;
    moe_bufs b;
    double t0 = now_s();
    build_moe(H, E, I, Is, k, &w, &b);
    printf("   weights built in %.1f s\n", now_s() - t0);
    printf("%5s %8s %8s %12s %10s %14s %5s\n", "TP", "tokens", "threads", "ms/block", "GFLOP/s", "GFLOP/s/thread",
           "reps");
    long max_m = 1;
    for (int i = 0; i < n_tokens; i++) max_m = tokens[i] > max_m ? tokens[i] : max_m;
    float *x = malloc((size_t)(max_m * H) * sizeof(float)), *out = malloc((size_t)(max_m * H) * sizeof(float));
    float *first = malloc((size_t)(max_m * H) * sizeof(float));
    if (!x || !out || !first) die("out of memory", NULL);
    td_rng rng;
    td_rng_seed(&rng, 12);
    for (long i = 0; i < max_m * H; i++) x[i] = 0.1f * td_rng_normal_f32(&rng);
    double est = 0.0;      /* seconds of one (layer, rank) of the seed audit, default pairs */
    bool est_ok = estimate;
    static const int tps[2] = {4, 1};
    for (int ti = 0; ti < 2; ti++)
        for (int mi = 0; mi < n_tokens; mi++) {
            double t_by_threads[16] = {0};
            for (int th = 0; th < n_threads; th++) {
                ref_moe_opts o = {{TD_ACCUM_FP32, TD_SCALE_EXACT, TD_FAULT_NONE}, TD_ACT_FP32, tps[ti], 0};
                int reps;
                double t = time_block(&w, &o, (int)threads[th], x, tokens[mi], out, &reps);
                t_by_threads[th] = t;
                double gf = moe_flops(&w, tokens[mi], tps[ti]) / t * 1e-9;
                printf("%5d %8ld %8ld %12.2f %10.2f %14.2f %5d\n", tps[ti], tokens[mi], threads[th], t * 1e3, gf,
                       gf / (double)threads[th], reps);
                if (th == 0) memcpy(first, out, (size_t)(tokens[mi] * H) * sizeof(float));
                else if (memcmp(first, out, (size_t)(tokens[mi] * H) * sizeof(float)))
                    printf("  !! outputs differ between thread counts\n");
            }
            if (tps[ti] == 4 && estimate) {
                /* default pairs: ref (threads=N) x2, ref:scale=fp16 x2, ref:threads=1 x2 */
                double t1 = -1, tn = -1;
                for (int th = 0; th < n_threads; th++) {
                    if (threads[th] == 1) t1 = t_by_threads[th];
                    if (threads[th] == 2) tn = t_by_threads[th];
                }
                if (t1 < 0 || tn < 0) est_ok = false;
                else est += 4.0 * tn + 2.0 * t1;
            }
        }
    if (estimate) {
        if (est_ok)
            printf("\nseed audit estimate (3 layers x ranks 0,3 x tokens of --tokens, default pairs, 2 threads):\n"
                   "  per (layer, rank) %.1f s, 6 of them: %.1f s (plus checkpoint page-in)\n",
                   est, 6.0 * est);
        else
            printf("\nseed audit estimate needs --threads to include 1 and 2\n");
    }
    free(x);
    free(out);
    free(first);
    free_moe(&b);
}

int main(int argc, char **argv)
{
    long threads[16] = {1, 2}, tokens[16] = {1, 4, 8, 16, 784};
    int n_threads = 2, n_tokens = 5;
    bool gemv = false, moe = false, estimate = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gemv")) gemv = true;
        else if (!strcmp(argv[i], "--moe")) moe = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            n_threads = parse_list(argv[++i], threads, 16);
            if (n_threads < 1) {
                fprintf(stderr, "bench_ref: --threads: expected a list such as 1,2\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            n_tokens = parse_list(argv[++i], tokens, 16);
            if (n_tokens < 1) {
                fprintf(stderr, "bench_ref: --tokens: expected a list such as 1,4,8,16,784\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--no-estimate")) {
            estimate = false;
        } else {
            fprintf(stderr, "bench_ref: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!gemv && !moe) gemv = moe = true;
    if (gemv) bench_gemv(threads, n_threads);
    if (moe) bench_moe(threads, n_threads, tokens, n_tokens, estimate);
    return 0;
}
