/* moe_decode.cu — time of the CUDA engine's MoE block at the production shape, against the
 * byte floor and a cuBLAS BF16 baseline measured in the same run (docs/perf.md).
 *
 * usage: moe_decode [--hidden 2560] [--experts 512] [--inter 640] [--topk 10] [--shared 640]
 *                   [--tp 1] [--act fp16|bf16] [--storage prepared|raw] [--dispatch direct|grouped]
 *                   [--kernels fast|generic] [--prio main|shared|off]
 *                   [--M 1,2,4,8,16,784] [--iters 200] [--sets 16] [--dense 8] [--seed 1] [--big V]
 *                   [--cublas LIB] [--no-cublas] [--no-presplit] [--separate-combine] [--no-dec-narrow]
 *                   [--no-stage-img] [--check-narrow] [--check-stage] [--db PATH] [--json]
 *
 * Weights are synthetic (seeded hash of the index; E4M3 codes 0x38..0x5f, globals 2^-7) in the
 * engine's device layout for one TP rank: every expert's W13 and W2 NVFP4 matrices, a BF16
 * router [E, H], a BF16 shared expert and its gate. The kernels are the engine's own
 * launchers (cuda/moe.cuh, cuda/moe_mma.cuh). Routes are imposed: `--sets` random route sets
 * (distinct experts per token) rotate between calls, so consecutive calls touch different
 * experts and the 50 MB L2 cannot hold the weights of the next call. --dense N: N copies of the
 * router and shared-expert weights (12 MB at the production shape; the cuBLAS baseline's BF16
 * copies likewise), route set i's call taking copy i mod N, so that L2 does not hold those
 * between calls either, as in a model whose layers each have their own (default 8; --dense 1:
 * one copy, as the benches before this option, which let the block keep some of them in L2).
 * At most --sets copies are made (more would never be used); the shapes stored to --db get
 * ".denseN" for the copies made, N > 1.
 *
 * Per M, one CUDA graph per route set is captured and the graphs are replayed in rotation;
 * each call is bracketed by events and the median over `--iters` calls is reported (and,
 * "chained", one graph holding the calls of all route sets back to back, as consecutive layers
 * sit in one graph of a model forward: its median replay time over the number of sets, the
 * time per call without a graph launch per call):
 *   block   round, router GEMV, routing, [grouping,] shared gate, W13+SwiGLU, W2, shared
 *           expert, combine: the whole MoE block (the router's routes are computed and
 *           discarded so that the imposed ones drive the experts)
 *   routed  [grouping,] W13+SwiGLU, W2 only (with the combine fused in where the block has it:
 *           direct dispatch on the decode kernel, cu_mm_w2c)
 *   cublas  the same block with the weights dequantized to BF16 and cuBLAS (GemmEx for the
 *           router and the shared expert, GemmBatchedEx over the slots for the routed
 *           experts, pointer arrays prepared per route set) plus the engine's routing and
 *           combine kernels and a SwiGLU kernel; the shared expert on a second stream from
 *           the rounded input on, as in the engine
 * --big V: every 7th token (from token 3) gets one input of magnitude V beside inputs uniform
 * in [-0.3, 0.3] (an outlier channel; no kernel takes another path for it). The shapes stored
 * to --db get ".bigV".
 * --no-presplit: no split workspace (cu_mm_call::split_ws): the prefill-sized BF16 GEMMs
 * (router, shared expert) run on k_gemm instead of k_wgp, and the block's input is rounded
 * without being laid out for k_wgp (the same bits).
 * --separate-combine: the combine as its own launch after W2 everywhere (the block before W2
 * took it in), for an A/B in one binary; the variant stored to --db gets " +separate-combine".
 * --no-dec-narrow: the routed experts' one-tile decode-kernel calls always on the 8-warp
 * blocks (cu_block_shape::dec_narrow off; the engine, like the bench by default, lets them run
 * on the narrow blocks of 4 warps, 7 per SM, where td_dec_narrow_pays takes them), for an A/B
 * in one binary; the variant gets " +no-dec-narrow". --check-narrow: before timing each M, the
 * block of route set 0 with the narrow blocks off and on, outputs and intermediates poisoned:
 * bit-identical or exit 1.
 * --no-stage-img: at decode sizes the router's and the shared W13's k_mm blocks stage the
 * block's input themselves (cu_block_shape::stage_img off; the engine, like the bench by
 * default, has the round stage it once: cu_mm_round_stage), for an A/B in one binary; the
 * variant gets " +no-stage-img". --check-stage: as --check-narrow, with the staged input off and
 * on (the router's logits and the shared expert's output compared too).
 * --prio: the block's main stream (router, routing, routed experts, combine) or its
 * shared-expert stream created at the device's greatest priority, the other at its least, and
 * every graph instantiated with cudaGraphInstantiateFlagUseNodePriority (kernel nodes take
 * the priority of the stream they were captured from); default off (both at priority 0).
 * --timeline N (a build with -DTD_TIMELINE only: `make gpu TIMELINE=1`, cuda/timeline.cuh): after
 * timing each M, N replays of every route set's block graph, one at a time, each kernel
 * stamping the global timer at its first block's start and its last warp's end; printed per
 * role (round, router, shared W13 / W2, routing, grouping, W13, W2, combine): the medians of
 * start, of the first and the last block's return from the wait for its predecessor ("waited",
 * "last w"; a kernel that waits at all), and of end, relative to the call's first start, and of
 * the call's span; then per role the points its kernels mark (cu_tl_mark: when the last block
 * passed each; k_mm and the routing kernel).
 * Byte floors: bytes the call must read at least (routed: the distinct experts of the call's
 * routes x this storage's W13+W2 bytes incl. scales, plus the input and output activations;
 * block: plus the router and the shared expert) over the copy bandwidth measured here
 * (cudaMemcpy device to device of 1 GiB, read + write bytes over time, median of 10).
 * --db PATH: a run of kind "bench" in that results store, begun once the copy bandwidth is
 * measured and naming the GPU, its driver and CUDA version (cu_describe_device); at the end
 * one timing per (bench, shape, variant): moe_decode.block, .routed, .router, .route,
 * .cublas_bf16, .routed_floor, .block_floor, .chain_* (µs, medians) and
 * moe_decode.copy_bandwidth (GB/s).
 */
extern "C" {
#include "db.h"
#include "engines.h"
#include "td.h"
}
#include "moe_block.cuh"
#include "gpu_timing.cuh"
#include "timeline.cuh"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

static void die_td(const char *what, const td_err *e)
{
    fprintf(stderr, "moe_decode: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}
#define TRYE(call, er)                                                                            \
    do {                                                                                          \
        if ((call) != TD_OK) die_td(#call, &(er));                                                \
    } while (0)

/* ---- synthetic data ------------------------------------------------------------------------- */

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void k_fill_bytes(uint8_t *p, size_t n, uint64_t seed, int lo, int span)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0x632BE59BD9B4E019ull));
        p[i] = span ? (uint8_t)(lo + (int)(h % (uint64_t)span)) : (uint8_t)h;
    }
}

/* FP16 effective scales from codes 0x38..0x5f and global g. */
__global__ void k_fill_eff(uint16_t *p, size_t n, uint64_t seed, float g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0x632BE59BD9B4E019ull));
        const float v = cu_raw_eff(0x38u + (uint32_t)(h % 40u), g, 0);
        p[i] = __half_as_ushort(__float2half_rn(v));
    }
}

/* BF16 values uniform in [-a, a]. */
__global__ void k_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0x632BE59BD9B4E019ull));
        const float u = (float)(h >> 40) / (float)(1ull << 24) * 2.0f - 1.0f;
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(a * u));
    }
}

__global__ void k_fill_f32(float *p, size_t n, uint64_t seed, float a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0x632BE59BD9B4E019ull));
        p[i] = a * ((float)(h >> 40) / (float)(1ull << 24) * 2.0f - 1.0f);
    }
}

/* --big: input (t, (t * 131) % H) of every 7th token t (from 3) set to +-v, signs alternating */
__global__ void k_set_big(float *x, int64_t tokens, int64_t H, float v)
{
    const int64_t t = 3 + 7 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (t < tokens) x[t * H + (t * 131) % H] = (t / 7) % 2 ? -v : v;
}

/* NVFP4 -> BF16 dequantization of the baseline's weights, row-major [rows, cols] per matrix,
 * from the synthetic generator's values (same distribution, not the same layout). */
__global__ void k_dequant_like(uint16_t *out, size_t n, uint64_t seed)
{
    static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed ^ (i * 0x632BE59BD9B4E019ull));
        const float v = e2m1[h & 15] * cu_raw_eff(0x38u + (uint32_t)((h >> 8) % 40u), 1.0f / 128.0f, 0);
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

__global__ void k_to_bf16(const float *x, uint16_t *y, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

/* h [slots, 2*il] (gate | up, FP32) -> a [slots, il] BF16 */
__global__ void k_swiglu_bf16(const float *h, uint16_t *a, int64_t slots, int64_t il)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= slots * il) return;
    const int64_t s = i / il, c = i % il;
    const float g = h[s * 2 * il + c], u = h[s * 2 * il + il + c];
    a[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + __expf(-g)) * u));
}

static void fill_bytes(void *p, size_t n, uint64_t seed, int lo, int span)
{
    k_fill_bytes<<<1024, 256>>>((uint8_t *)p, n, seed, lo, span);
    BENCH_CK(cudaGetLastError());
}

/* ---- cuBLAS through dlopen -------------------------------------------------------------------- */

typedef struct blas {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                   const void *, const void *const *, cudaDataType, int, const void *const *,
                                   cudaDataType, int, const void *, void *const *, cudaDataType, int, int,
                                   cublasComputeType_t, cublasGemmAlgo_t);
    cublasHandle_t h, h2; /* h on the main stream, h2 on the second (the shared expert) */
} blas;

static bool blas_open(blas *b, const char *path, cudaStream_t s, cudaStream_t s2)
{
    memset(b, 0, sizeof *b);
    const char *cands[] = {path, "libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < 4 && !b->lib; i++)
        if (cands[i]) b->lib = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
    if (!b->lib) return false;
    b->create = (decltype(b->create))dlsym(b->lib, "cublasCreate_v2");
    b->destroy = (decltype(b->destroy))dlsym(b->lib, "cublasDestroy_v2");
    b->set_stream = (decltype(b->set_stream))dlsym(b->lib, "cublasSetStream_v2");
    b->gemm = (decltype(b->gemm))dlsym(b->lib, "cublasGemmEx");
    b->gemm_batched = (decltype(b->gemm_batched))dlsym(b->lib, "cublasGemmBatchedEx");
    if (!b->create || !b->destroy || !b->set_stream || !b->gemm || !b->gemm_batched) return false;
    if (b->create(&b->h) != CUBLAS_STATUS_SUCCESS) return false;
    if (b->create(&b->h2) != CUBLAS_STATUS_SUCCESS) return false;
    return b->set_stream(b->h, s) == CUBLAS_STATUS_SUCCESS && b->set_stream(b->h2, s2) == CUBLAS_STATUS_SUCCESS;
}

#define BL(x)                                                                                     \
    do {                                                                                          \
        cublasStatus_t s_ = (x);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "moe_decode: %s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x,  \
                    (int)s_);                                                                     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* y [M, N] (row-major, FP32) = x [M, K] (BF16) . W [N, K]^T (BF16). */
static void gemm_rowmajor(cublasHandle_t h, blas *b, const void *W, const void *x, float *y, int N, int M, int K)
{
    const float one = 1.0f, zero = 0.0f;
    BL(b->gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &zero, y,
               CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* ---- options ------------------------------------------------------------------------------------ */

typedef struct opts {
    int64_t H, E, I, k, Is, tp;
    int act;            /* 1 fp16, 2 bf16 */
    bool raw, grouped, json, no_cublas, generic, no_presplit, separate_combine, dec_narrow, check_narrow;
    bool stage_img, check_stage;
    int prio;           /* 0 off, 1 main stream high, 2 shared-expert stream high */
    std::vector<int64_t> Ms;
    int iters, sets, dense, timeline;
    uint64_t seed;
    int64_t big;        /* --big: 0 none */
    const char *cublas, *db;
} opts;

static void usage(void)
{
    fprintf(stderr, "usage: moe_decode [--hidden N] [--experts N] [--inter N] [--topk N] [--shared N] [--tp N]\n"
                    "                  [--act fp16|bf16] [--storage prepared|raw] [--dispatch direct|grouped]\n"
                    "                  [--kernels fast|generic] [--prio main|shared|off]\n"
                    "                  [--M 1,2,4,8,16,784] [--iters N] [--sets N] [--dense N] [--seed N] [--big V]\n"
                    "                  [--cublas LIB] [--db PATH] [--json] [--no-cublas] [--no-presplit] [--separate-combine]\n"
                    "                  [--no-dec-narrow] [--no-stage-img] [--check-narrow] [--check-stage]\n"
                    "                  [--timeline N]\n");
    exit(2);
}

static int64_t num(const char *opt, const char *v)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*end || x < 1) {
        fprintf(stderr, "moe_decode: %s: '%s' is not a positive integer\n", opt, v);
        exit(2);
    }
    return x;
}

static void parse(int argc, char **argv, opts *o)
{
    o->H = 2560, o->E = 512, o->I = 640, o->k = 10, o->Is = 640, o->tp = 1;
    o->act = 1, o->raw = false, o->grouped = false, o->json = false, o->no_cublas = false, o->generic = false;
    o->no_presplit = false;
    o->separate_combine = false;
    o->dec_narrow = true;
    o->check_narrow = false;
    o->stage_img = true;
    o->check_stage = false;
    o->prio = 0;
    o->Ms = {1, 2, 4, 8, 16, 784};
    o->iters = 200, o->sets = 16, o->dense = 8, o->timeline = 0, o->seed = 1, o->big = 0, o->cublas = NULL, o->db = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* the options without a value: each sets its flag */
        const struct { const char *name; bool *flag; bool value; } flags[] = {
            {"--json", &o->json, true},
            {"--no-cublas", &o->no_cublas, true},
            {"--no-presplit", &o->no_presplit, true},
            {"--separate-combine", &o->separate_combine, true},
            {"--no-dec-narrow", &o->dec_narrow, false},
            {"--check-narrow", &o->check_narrow, true},
            {"--no-stage-img", &o->stage_img, false},
            {"--check-stage", &o->check_stage, true},
        };
        bool is_flag = false;
        for (const auto &f : flags)
            if (!strcmp(a, f.name)) {
                *f.flag = f.value;
                is_flag = true;
            }
        if (is_flag) continue;
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--hidden")) o->H = num(a, v);
        else if (!strcmp(a, "--experts")) o->E = num(a, v);
        else if (!strcmp(a, "--inter")) o->I = num(a, v);
        else if (!strcmp(a, "--topk")) o->k = num(a, v);
        else if (!strcmp(a, "--shared")) o->Is = num(a, v);
        else if (!strcmp(a, "--tp")) o->tp = num(a, v);
        else if (!strcmp(a, "--iters")) o->iters = (int)num(a, v);
        else if (!strcmp(a, "--sets")) o->sets = (int)num(a, v);
        else if (!strcmp(a, "--dense")) o->dense = (int)num(a, v);
        else if (!strcmp(a, "--timeline")) {
#ifdef TD_TIMELINE
            o->timeline = (int)num(a, v);
#else
            fprintf(stderr, "moe_decode: --timeline needs a build with -DTD_TIMELINE (make gpu TIMELINE=1)\n");
            exit(2);
#endif
        }
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)num(a, v);
        else if (!strcmp(a, "--big")) o->big = num(a, v);
        else if (!strcmp(a, "--cublas")) o->cublas = v;
        else if (!strcmp(a, "--db")) o->db = v;
        else if (!strcmp(a, "--act")) {
            if (!strcmp(v, "fp16")) o->act = 1;
            else if (!strcmp(v, "bf16")) o->act = 2;
            else usage();
        } else if (!strcmp(a, "--storage")) {
            if (!strcmp(v, "raw")) o->raw = true;
            else if (strcmp(v, "prepared")) usage();
        } else if (!strcmp(a, "--kernels")) {
            if (!strcmp(v, "generic")) o->generic = true;
            else if (strcmp(v, "fast")) usage();
        } else if (!strcmp(a, "--prio")) {
            if (!strcmp(v, "main")) o->prio = 1;
            else if (!strcmp(v, "shared")) o->prio = 2;
            else if (strcmp(v, "off")) usage();
        } else if (!strcmp(a, "--dispatch")) {
            if (!strcmp(v, "grouped")) o->grouped = true;
            else if (strcmp(v, "direct")) usage();
        } else if (!strcmp(a, "--M")) {
            o->Ms.clear();
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) o->Ms.push_back(num(a, t));
        } else {
            usage();
        }
    }
    if (o->I % o->tp || (o->I / o->tp) % 16 || o->Is % o->tp || o->H % 32 || o->k > o->E) {
        fprintf(stderr, "moe_decode: inconsistent shape (inter/tp and hidden must be multiples of 16 / 32)\n");
        exit(2);
    }
}

/* ---- --check-narrow, --check-stage ----------------------------------------------------------- */

/* One switch of the block that must change no bit (a member of cu_block_shape), its option and
 * the names of its two sides. */
typedef bool cu_block_shape::*shape_flag;
struct flag_check {
    shape_flag flag;
    const char *option, *off, *on;
};

#ifdef TD_TIMELINE
/* --timeline: n replays of each block graph, one at a time, every kernel's first start and last
 * end per role (cuda/timeline.cuh), medians relative to the call's first start */
static void timeline(const std::vector<cudaGraphExec_t> &gb, int n, int64_t M, cudaStream_t s)
{
    static const char *const names[CU_TL_N] = {"round", "router + gate", "shared W13", "shared W2", "routing",
                                               "grouping", "W13", "W2", "combine"};
    std::vector<double> st[CU_TL_N], en[CU_TL_N], w0[CU_TL_N], w1[CU_TL_N], span;
    const int C = CU_TL_COLS; /* start, end, first and last wait */
    const int MK = CU_TL_COLS * CU_TL_N; /* the marks after the columns */
    uint64_t a[CU_TL_COLS * CU_TL_N + CU_TL_MARKS * CU_TL_N], b[CU_TL_COLS * CU_TL_N + CU_TL_MARKS * CU_TL_N];
    std::vector<double> mk[CU_TL_N][CU_TL_MARKS];
    BENCH_CK(cudaDeviceSynchronize());
    BENCH_CK((cudaError_t)cu_moe_timeline(a));
    BENCH_CK((cudaError_t)cu_mm_timeline(b));
    for (int r = 0; r < n; r++)
        for (cudaGraphExec_t g : gb) {
            BENCH_CK(cudaGraphLaunch(g, s));
            BENCH_CK(cudaStreamSynchronize(s));
            BENCH_CK((cudaError_t)cu_moe_timeline(a));
            BENCH_CK((cudaError_t)cu_mm_timeline(b));
            uint64_t t0 = ~0ull, t1 = 0;
            for (int i = 0; i < CU_TL_N; i++) {
                /* a role in both tables (the round) keeps the earlier start and the later end */
                uint64_t *x = a + C * i, *y = b + C * i;
                x[0] = std::min(x[0], y[0]), x[1] = std::max(x[1], y[1]);
                x[2] = std::min(x[2], y[2]), x[3] = std::max(x[3], y[3]);
                if (x[0] != ~0ull) t0 = std::min(t0, x[0]), t1 = std::max(t1, x[1]);
                for (int j = 0; j < CU_TL_MARKS; j++)
                    a[MK + CU_TL_MARKS * i + j] = std::max(a[MK + CU_TL_MARKS * i + j], b[MK + CU_TL_MARKS * i + j]);
            }
            for (int i = 0; i < CU_TL_N; i++) {
                const uint64_t *x = a + C * i;
                if (x[0] == ~0ull) continue;
                st[i].push_back((double)(x[0] - t0) * 1e-3);
                en[i].push_back((double)(x[1] - t0) * 1e-3);
                if (x[2] != ~0ull) { /* the kernel waited for its predecessor */
                    w0[i].push_back((double)(x[2] - t0) * 1e-3);
                    w1[i].push_back((double)(x[3] - t0) * 1e-3);
                }
                for (int j = 0; j < CU_TL_MARKS; j++) {
                    const uint64_t m = a[MK + CU_TL_MARKS * i + j];
                    if (m) mk[i][j].push_back((double)(m - t0) * 1e-3);
                }
            }
            span.push_back((double)(t1 - t0) * 1e-3);
        }
    auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? NAN : v[v.size() / 2];
    };
    printf("timeline M=%lld (us from the call's first kernel start; medians of %zu calls): span %.2f\n",
           (long long)M, span.size(), med(span));
    printf("  %-14s %8s %8s %8s %8s %8s\n", "role", "start", "waited", "last w", "end", "length");
    for (int i = 0; i < CU_TL_N; i++)
        if (!st[i].empty())
            printf("  %-14s %8.2f %8.2f %8.2f %8.2f %8.2f\n", names[i], med(st[i]), med(w0[i]), med(w1[i]), med(en[i]),
                   med(en[i]) - med(st[i]));
    for (int i = 0; i < CU_TL_N; i++) { /* the marked points: when the last block passed each */
        bool any = false;
        for (int j = 0; j < CU_TL_MARKS; j++) any |= !mk[i][j].empty();
        if (!any) continue;
        printf("  %-14s marks", names[i]);
        for (int j = 0; j < CU_TL_MARKS; j++)
            if (!mk[i][j].empty()) printf("  %d: %.2f", j, med(mk[i][j]));
        printf("\n");
    }
}
#endif

/* The block of route set 0 run twice, with the switch off and on, every output and intermediate
 * poisoned before each run (all-ones bit patterns: NaN in FP16, BF16 and FP32): the router's
 * logits and shared gate [M, E + 1], the shared expert's output [M, H], the W13 intermediates
 * [M k, il], the expert outputs [M k, H] and the block output [M, H] must be bit-identical, and
 * neither run may leave a poisoned element. Exits 1 naming the first difference. */
template <typename F>
static void switch_check(const flag_check &fc, int64_t M, int64_t k, int64_t il, int64_t H, int64_t E,
                         cu_block_shape &shape, const cu_block_ws &ws, F run)
{
    const size_t na = (size_t)(M * k * il), ne = (size_t)(M * k * H), no = (size_t)(M * H);
    const size_t nl = (size_t)(M * ws.lg_ld);
    std::vector<uint16_t> a[2], e[2], sh[2];
    std::vector<uint32_t> out[2], lg[2];
    const bool keep = shape.*fc.flag;
    for (int v = 0; v < 2; v++) {
        BENCH_CK(cudaMemset(ws.act16, 0xff, na * 2));
        BENCH_CK(cudaMemset(ws.eout16, 0xff, ne * 2));
        BENCH_CK(cudaMemset(ws.out, 0xff, no * 4));
        BENCH_CK(cudaMemset(ws.logits, 0xff, nl * 4));
        BENCH_CK(cudaMemset(ws.sh_out16, 0xff, no * 2));
        BENCH_CK(cudaDeviceSynchronize());
        shape.*fc.flag = v == 1;
        run();
        BENCH_CK(cudaDeviceSynchronize()); /* both streams */
        a[v].resize(na);
        e[v].resize(ne);
        out[v].resize(no);
        lg[v].resize(nl);
        sh[v].resize(no);
        BENCH_CK(cudaMemcpy(a[v].data(), ws.act16, na * 2, cudaMemcpyDeviceToHost));
        BENCH_CK(cudaMemcpy(e[v].data(), ws.eout16, ne * 2, cudaMemcpyDeviceToHost));
        BENCH_CK(cudaMemcpy(out[v].data(), ws.out, no * 4, cudaMemcpyDeviceToHost));
        BENCH_CK(cudaMemcpy(lg[v].data(), ws.logits, nl * 4, cudaMemcpyDeviceToHost));
        BENCH_CK(cudaMemcpy(sh[v].data(), ws.sh_out16, no * 2, cudaMemcpyDeviceToHost));
    }
    shape.*fc.flag = keep;
    struct { const char *name; const void *p0, *p1; size_t n, size, ld, cols; } parts[] = {
        {"router logits", lg[0].data(), lg[1].data(), nl, 4, (size_t)ws.lg_ld, (size_t)E + 1},
        {"shared expert output", sh[0].data(), sh[1].data(), no, 2, 1, 1},
        {"W13 intermediate", a[0].data(), a[1].data(), na, 2, 1, 1},
        {"expert output", e[0].data(), e[1].data(), ne, 2, 1, 1},
        {"block output", out[0].data(), out[1].data(), no, 4, 1, 1},
    };
    for (const auto &p : parts)
        for (size_t i = 0; i < p.n; i++) {
            if (i % p.ld >= p.cols) continue; /* a row's padding */
            uint32_t x0 = 0, x1 = 0;
            memcpy(&x0, (const char *)p.p0 + i * p.size, p.size);
            memcpy(&x1, (const char *)p.p1 + i * p.size, p.size);
            const uint32_t poison = p.size == 2 ? 0xffffu : 0xffffffffu;
            if (x0 != x1 || x0 == poison) {
                fprintf(stderr, "moe_decode: %s M=%lld: %s [%zu] = 0x%x with %s, 0x%x with %s%s\n", fc.option,
                        (long long)M, p.name, i, x0, fc.off, x1, fc.on, x0 == poison ? " (never written)" : "");
                exit(1);
            }
        }
    fprintf(stderr, "moe_decode: %s M=%lld: identical (%zu + %zu + %zu + %zu + %zu values)\n", fc.option, (long long)M,
            nl, no, na, ne, no);
}

/* ---- main ------------------------------------------------------------------------------------- */

typedef struct row {
    int64_t M, distinct;
    double block, routed, cublas, floor_routed, floor_block, router, route;
    double chain_block, chain_routed, chain_cublas; /* per call, all route sets in one graph */
} row;

int main(int argc, char **argv)
{
    opts o;
    parse(argc, argv, &o);
    td_err err;
    TRYE(cu_mm_init(&err), err);
    int prio_lo = 0, prio_hi = 0;
    BENCH_CK(cudaDeviceGetStreamPriorityRange(&prio_lo, &prio_hi));
    /* --prio: the main stream's and the shared-expert stream's priorities */
    const int prio_main = o.prio == 1 ? prio_hi : o.prio == 2 ? prio_lo : 0;
    const int prio_shared = o.prio == 1 ? prio_lo : o.prio == 2 ? prio_hi : 0;
    cudaStream_t s;
    BENCH_CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, prio_main));
    const unsigned long long gflags = o.prio ? cudaGraphInstantiateFlagUseNodePriority : 0;
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    const int64_t H = o.H, E = o.E, k = o.k, il = o.I / o.tp, isl = o.Is / o.tp;
    const int64_t Mmax = *std::max_element(o.Ms.begin(), o.Ms.end());
    const double copy_bw = bench_copy_bandwidth(s);
    /* the results store's run begins here, with the GPU it runs on; its timings are written
     * when the bench ends (a bench that stops before leaves the run unfinished) */
    td_db *db = NULL;
    int64_t run = 0;
    if (o.db) {
        TRYE(td_db_open(o.db, TD_DB_CREATE, &db, &err), err);
        td_db_run_info info;
        memset(&info, 0, sizeof info);
        info.kind = "bench";
        info.argc = argc;
        info.argv = argv;
        TRYE(td_db_run_begin(db, &info, &run, &err), err);
        td_engine_device dev;
        cu_describe_device(&dev);
        TRYE(td_engine_device_record(db, run, &dev, &err), err);
    }

    /* ---- the engine's layout, one rank ---- */
    int64_t R13, K13, w13b, s13p, s13r, R2, K2, w2b, s2p, s2r;
    cu_qmat_geometry(CU_W_NVFP4, 16 * ((il + 7) / 8), H, &R13, &K13, &w13b, &s13p, &s13r);
    cu_qmat_geometry(CU_W_NVFP4, H, il, &R2, &K2, &w2b, &s2p, &s2r);
    cu_block_w bw;
    memset(&bw, 0, sizeof bw);
    cu_qmat &w13 = bw.w13, &w2 = bw.w2;
    w13.kind = CU_W_NVFP4;
    w13.raw = o.raw;
    w13.bf16_words = o.act == 2; /* the random words read as either placement */
    w13.rows = 16 * ((il + 7) / 8);
    w13.cols = H;
    w13.R = R13;
    w13.K = K13;
    w13.mat_w = w13b;
    w13.mat_s = o.raw ? s13r : s13p;
    w2 = w13;
    w2.rows = H;
    w2.cols = il;
    w2.R = R2;
    w2.K = K2;
    w2.mat_w = w2b;
    w2.mat_s = o.raw ? s2r : s2p;
    const float g = 1.0f / 128.0f;
    void *p;
    BENCH_CK(cudaMalloc(&p, (size_t)(E * w13b)));
    fill_bytes(p, (size_t)(E * w13b), o.seed * 11 + 1, 0, 0);
    w13.w = (const uint8_t *)p;
    BENCH_CK(cudaMalloc(&p, (size_t)(E * w2b)));
    fill_bytes(p, (size_t)(E * w2b), o.seed * 11 + 2, 0, 0);
    w2.w = (const uint8_t *)p;
    for (int j = 0; j < 2; j++) {
        cu_qmat &q = j ? w2 : w13;
        const size_t n = (size_t)(E * q.mat_s);
        BENCH_CK(cudaMalloc(&p, n));
        if (o.raw) {
            fill_bytes(p, n, o.seed * 11 + 3 + j, 0x38, 40);
            std::vector<float2> gl((size_t)E, make_float2(g, g));
            void *dg;
            BENCH_CK(cudaMalloc(&dg, gl.size() * sizeof(float2)));
            BENCH_CK(cudaMemcpy(dg, gl.data(), gl.size() * sizeof(float2), cudaMemcpyHostToDevice));
            q.g = (const float2 *)dg;
        } else {
            k_fill_eff<<<1024, 256>>>((uint16_t *)p, n / 2, o.seed * 11 + 3 + j, g);
            BENCH_CK(cudaGetLastError());
        }
        q.s = (const uint8_t *)p;
    }
    bw.mm = true;
    /* shared expert (BF16) and router + shared gate (one BF16 matrix of E + 1 rows) */
    int64_t Rs13, Ks13, ws13, d0, d1, Rs2, Ks2, ws2, Rr, Kr, wr;
    cu_qmat_geometry(CU_W_BF16, 16 * ((isl + 7) / 8), H, &Rs13, &Ks13, &ws13, &d0, &d1);
    cu_qmat_geometry(CU_W_BF16, H, isl, &Rs2, &Ks2, &ws2, &d0, &d1);
    cu_qmat_geometry(CU_W_BF16, E + 1, H, &Rr, &Kr, &wr, &d0, &d1);
    cu_qmat &sh13 = bw.sh13, &sh2 = bw.sh2, &rq = bw.router_q;
    sh13.kind = CU_W_BF16;
    sh13.rows = 16 * ((isl + 7) / 8);
    sh13.cols = H;
    sh13.R = Rs13;
    sh13.K = Ks13;
    sh13.mat_w = ws13;
    sh2 = sh13;
    sh2.rows = H;
    sh2.cols = isl;
    sh2.R = Rs2;
    sh2.K = Ks2;
    sh2.mat_w = ws2;
    rq = sh13;
    rq.rows = E + 1;
    rq.cols = H;
    rq.R = Rr;
    rq.K = Kr;
    rq.mat_w = wr;
    bw.sh_mm = true;
    bw.has_shared = true;
    bw.router_mm = true;
    /* --dense copies of the router and the shared expert (the same values in each); no more
     * than the route sets, as set i takes copy i mod the count */
    const int ndense = std::min(o.dense, o.sets);
    std::vector<cu_block_w> bws((size_t)ndense, bw);
    for (cu_block_w &b : bws) {
        BENCH_CK(cudaMalloc(&p, (size_t)ws13));
        k_fill_bf16<<<1024, 256>>>((uint16_t *)p, (size_t)ws13 / 2, o.seed * 11 + 5, 0.03f);
        b.sh13.w = (const uint8_t *)p;
        BENCH_CK(cudaMalloc(&p, (size_t)ws2));
        k_fill_bf16<<<1024, 256>>>((uint16_t *)p, (size_t)ws2 / 2, o.seed * 11 + 6, 0.03f);
        b.sh2.w = (const uint8_t *)p;
        BENCH_CK(cudaMalloc(&p, (size_t)wr));
        k_fill_bf16<<<1024, 256>>>((uint16_t *)p, (size_t)wr / 2, o.seed * 11 + 7, 0.03f);
        b.router_q.w = (const uint8_t *)p;
    }
    BENCH_CK(cudaGetLastError());
    cu_block_shape shape;
    memset(&shape, 0, sizeof shape);
    shape.H = H;
    shape.E = E;
    shape.k = k;
    shape.I = il; /* one rank's slice, stored as a TP-1 model */
    shape.Is = isl;
    shape.renorm = true;
    shape.act = o.act;
    shape.tp_size = 1;
    shape.tp_rank = 0;
    shape.rank0 = 0;
    shape.nr = 1;
    shape.grouped = o.grouped;
    shape.generic = o.generic;
    shape.separate_combine = o.separate_combine;
    shape.dec_narrow = o.dec_narrow;
    shape.stage_img = o.stage_img;

    /* ---- workspace ---- */
    const int64_t C = Mmax, S = C * k;
    const int64_t G = cu_mm_group_ws(C, k, E);
    cu_block_ws ws;
    memset(&ws, 0, sizeof ws);
    ws.lg_ld = E + 1;
    BENCH_CK(cudaMalloc(&ws.x, (size_t)(C * H) * 4));
    BENCH_CK(cudaMalloc(&ws.xa, (size_t)(C * H) * 4));
    BENCH_CK(cudaMalloc(&ws.logits, (size_t)(C * (E + 1)) * 4));
    BENCH_CK(cudaMalloc(&ws.wts, (size_t)S * 4));
    BENCH_CK(cudaMalloc(&ws.ids, (size_t)S * 4));
    BENCH_CK(cudaMalloc(&ws.act, (size_t)(S * il) * 4));
    BENCH_CK(cudaMalloc(&ws.eout, (size_t)(S * H) * 4));
    BENCH_CK(cudaMalloc(&ws.sh_act, (size_t)(C * isl) * 4));
    BENCH_CK(cudaMalloc(&ws.sh_out, (size_t)(C * H) * 4));
    BENCH_CK(cudaMalloc(&ws.out, (size_t)(C * H) * 4));
    BENCH_CK(cudaMalloc(&ws.xa16, (size_t)(C * H) * 2));
    BENCH_CK(cudaMalloc(&ws.act16, (size_t)(S * il) * 2));
    BENCH_CK(cudaMalloc(&ws.sh_act16, (size_t)(C * isl) * 2));
    BENCH_CK(cudaMalloc(&ws.eout16, (size_t)(S * H) * 2));
    BENCH_CK(cudaMalloc(&ws.sh_out16, (size_t)(C * H) * 2));
    BENCH_CK(cudaMalloc(&ws.n_groups, 4));
    BENCH_CK(cudaMalloc(&ws.g_mat, (size_t)G * 4));
    BENCH_CK(cudaMalloc(&ws.g_start, (size_t)G * 4));
    BENCH_CK(cudaMalloc(&ws.g_count, (size_t)G * 4));
    BENCH_CK(cudaMalloc(&ws.perm, (size_t)S * 4));
    if (!o.no_presplit) {
        BENCH_CK(cudaMalloc(&ws.sp_x, (size_t)cu_mm_input_ws_bytes(C, H)));
        BENCH_CK(cudaMalloc(&ws.sp_sh, (size_t)cu_mm_split_bytes(C, isl > H ? isl : H)));
    }
    ws.s = s;
    BENCH_CK(cudaStreamCreateWithPriority(&ws.s2, cudaStreamNonBlocking, prio_shared));
    BENCH_CK(cudaEventCreateWithFlags(&ws.ev_fork, cudaEventDisableTiming));
    BENCH_CK(cudaEventCreateWithFlags(&ws.ev_join, cudaEventDisableTiming));
    float *sgb;
    BENCH_CK(cudaMalloc(&sgb, (size_t)C * 4));
    k_fill_f32<<<1024, 256>>>(ws.x, (size_t)(C * H), o.seed * 11 + 9, 0.3f);
    BENCH_CK(cudaGetLastError());
    if (o.big) {
        k_set_big<<<(unsigned)((C / 7 + 256) / 256), 256>>>(ws.x, C, H, (float)o.big);
        BENCH_CK(cudaGetLastError());
    }
    std::vector<float> hw((size_t)S);
    for (int64_t i = 0; i < S; i++) hw[(size_t)i] = 1.0f / (float)k;
    BENCH_CK(cudaMemcpy(ws.wts, hw.data(), (size_t)S * 4, cudaMemcpyHostToDevice));

    /* ---- route sets: distinct experts per token, from a seeded LCG ---- */
    std::vector<int32_t *> sets((size_t)o.sets);
    std::vector<std::vector<int32_t>> hsets((size_t)o.sets);
    uint64_t lcg = o.seed * 0x9E3779B97F4A7C15ull + 1;
    for (int si = 0; si < o.sets; si++) {
        std::vector<int32_t> &h = hsets[(size_t)si];
        h.resize((size_t)S);
        for (int64_t t = 0; t < C; t++)
            for (int64_t j = 0; j < k; j++) {
                int32_t id;
                bool dup;
                do {
                    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                    id = (int32_t)((lcg >> 33) % (uint64_t)E);
                    dup = false;
                    for (int64_t i = 0; i < j; i++) dup |= h[(size_t)(t * k + i)] == id;
                } while (dup);
                h[(size_t)(t * k + j)] = id;
            }
        BENCH_CK(cudaMalloc(&sets[(size_t)si], (size_t)S * 4));
        BENCH_CK(cudaMemcpy(sets[(size_t)si], h.data(), (size_t)S * 4, cudaMemcpyHostToDevice));
    }

    /* ---- cuBLAS baseline data ---- */
    blas bl;
    const bool have_blas = !o.no_cublas && blas_open(&bl, o.cublas, s, ws.s2);
    uint16_t *bw13 = NULL, *bw2 = NULL, *xb = NULL, *ab = NULL, *shab = NULL;
    std::vector<uint16_t *> brouter((size_t)ndense), bsh13((size_t)ndense), bsh2((size_t)ndense);
    float *h13 = NULL, *shh = NULL;
    std::vector<void **> parr_w13((size_t)o.sets), parr_x((size_t)o.sets), parr_h((size_t)o.sets),
        parr_w2((size_t)o.sets), parr_a((size_t)o.sets), parr_y((size_t)o.sets);
    const int64_t Mb = std::min<int64_t>(Mmax, 16);
    if (have_blas) {
        BENCH_CK(cudaMalloc(&bw13, (size_t)(E * 2 * il * H) * 2));
        BENCH_CK(cudaMalloc(&bw2, (size_t)(E * H * il) * 2));
        k_dequant_like<<<2048, 256>>>(bw13, (size_t)(E * 2 * il * H), o.seed * 13 + 1);
        k_dequant_like<<<2048, 256>>>(bw2, (size_t)(E * H * il), o.seed * 13 + 2);
        for (int d = 0; d < ndense; d++) {
            BENCH_CK(cudaMalloc(&brouter[(size_t)d], (size_t)((E + 1) * H) * 2));
            k_fill_bf16<<<1024, 256>>>(brouter[(size_t)d], (size_t)((E + 1) * H), 5, 0.03f);
            BENCH_CK(cudaMalloc(&bsh13[(size_t)d], (size_t)(2 * isl * H) * 2));
            BENCH_CK(cudaMalloc(&bsh2[(size_t)d], (size_t)(H * isl) * 2));
            k_fill_bf16<<<1024, 256>>>(bsh13[(size_t)d], (size_t)(2 * isl * H), 3, 0.03f);
            k_fill_bf16<<<1024, 256>>>(bsh2[(size_t)d], (size_t)(H * isl), 4, 0.03f);
        }
        BENCH_CK(cudaMalloc(&xb, (size_t)(C * H) * 2));
        BENCH_CK(cudaMalloc(&h13, (size_t)(Mb * k * 2 * il) * 4));
        BENCH_CK(cudaMalloc(&ab, (size_t)(Mb * k * il) * 2));
        BENCH_CK(cudaMalloc(&shh, (size_t)(Mb * 2 * isl) * 4));
        BENCH_CK(cudaMalloc(&shab, (size_t)(Mb * isl) * 2));
        BENCH_CK(cudaGetLastError());
        for (int si = 0; si < o.sets; si++) {
            const int64_t n = Mb * k;
            std::vector<void *> a(n), b(n), c(n), d(n), e(n), f(n);
            for (int64_t sl = 0; sl < n; sl++) {
                const int32_t ex = hsets[(size_t)si][(size_t)sl];
                a[sl] = bw13 + (size_t)ex * 2 * il * H;
                b[sl] = xb + (size_t)(sl / k) * H;
                c[sl] = h13 + (size_t)sl * 2 * il;
                d[sl] = bw2 + (size_t)ex * H * il;
                e[sl] = ab + (size_t)sl * il;
                f[sl] = ws.eout + (size_t)sl * H;
            }
            std::vector<void *> *src[6] = {&a, &b, &c, &d, &e, &f};
            std::vector<void **> *dst[6] = {&parr_w13, &parr_x, &parr_h, &parr_w2, &parr_a, &parr_y};
            for (int j = 0; j < 6; j++) {
                void **dp;
                BENCH_CK(cudaMalloc(&dp, (size_t)n * sizeof(void *)));
                BENCH_CK(cudaMemcpy(dp, src[j]->data(), (size_t)n * sizeof(void *), cudaMemcpyHostToDevice));
                (*dst[j])[(size_t)si] = dp;
            }
        }
    } else if (!o.no_cublas) {
        fprintf(stderr, "moe_decode: cuBLAS not found (pass --cublas PATH): no baseline column\n");
    }
    BENCH_CK(cudaDeviceSynchronize());

    const double e13 = (double)(w13b + w13.mat_s), e2 = (double)(w2b + w2.mat_s);
    const double router_b = (double)wr, shared_b = (double)(ws13 + ws2);
    int32_t *ids_scratch;
    float *wts_scratch;
    BENCH_CK(cudaMalloc(&ids_scratch, (size_t)S * 4));
    BENCH_CK(cudaMalloc(&wts_scratch, (size_t)S * 4));
    std::vector<row> rows;
    for (int64_t M : o.Ms) {
        std::vector<cudaGraphExec_t> gb, gr, gc, gq, gt;
        int64_t distinct_sum = 0;
        auto enqueue = [&](int part, int si) {
            cu_block_ws wsi = ws;
            wsi.ids = sets[(size_t)si];
            const size_t dc = (size_t)(si % ndense); /* this call's router and shared expert */
            const cu_block_w &bwd = bws[dc];
            if (part == 0) {
                /* the engine's block with these routes; the routing kernel still runs at
                 * its place on the router's logits (its routes discarded), so that its
                 * cost is counted */
                wsi.ids_discard = ids_scratch;
                wsi.wts_discard = wts_scratch;
                TRYE(cu_moe_block(&shape, &bwd, &wsi, CU_BLOCK_MOE, true, M, &err), err);
            } else if (part == 1) {
                TRYE(cu_moe_block(&shape, &bwd, &wsi, CU_BLOCK_ROUTED, true, M, &err), err);
            } else if (part == 3) {
                TRYE(cu_moe_block(&shape, &bwd, &wsi, CU_BLOCK_ROUTER, false, M, &err), err);
            } else if (part == 4) {
                TRYE(cu_moe_route(ws.logits, ws.lg_ld, M, E, k, true, ids_scratch, wts_scratch, o.generic, false, s, &err), err);
            } else {
                /* cuBLAS baseline: BF16 weights; routed experts batched over the slots */
                const float one = 1.0f, zero = 0.0f;
                const int n = (int)(M * k);
                TRYE(cu_moe_round(ws.x, ws.xa, M * H, o.act, s, &err), err);
                k_to_bf16<<<(unsigned)((M * H + 255) / 256), 256, 0, s>>>(ws.xa, xb, M * H);
                /* the shared expert on the second stream from here on, as in the engine */
                BENCH_CK(cudaEventRecord(ws.ev_fork, s));
                BENCH_CK(cudaStreamWaitEvent(ws.s2, ws.ev_fork, 0));
                gemm_rowmajor(bl.h2, &bl, bsh13[dc], xb, shh, (int)(2 * isl), (int)M, (int)H);
                k_swiglu_bf16<<<(unsigned)((M * isl + 255) / 256), 256, 0, ws.s2>>>(shh, shab, M, isl);
                gemm_rowmajor(bl.h2, &bl, bsh2[dc], shab, ws.sh_out, (int)H, (int)M, (int)isl);
                BENCH_CK(cudaEventRecord(ws.ev_join, ws.s2));
                gemm_rowmajor(bl.h, &bl, brouter[dc], xb, ws.logits, (int)(E + 1), (int)M, (int)H);
                TRYE(cu_moe_route(ws.logits, ws.lg_ld, M, E, k, true, ids_scratch, wts_scratch, o.generic, false, s, &err), err);
                BL(bl.gemm_batched(bl.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(2 * il), 1, (int)H, &one,
                                   (const void *const *)parr_w13[(size_t)si], CUDA_R_16BF, (int)H,
                                   (const void *const *)parr_x[(size_t)si], CUDA_R_16BF, (int)H, &zero,
                                   parr_h[(size_t)si], CUDA_R_32F, (int)(2 * il), n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
                k_swiglu_bf16<<<(unsigned)((n * il + 255) / 256), 256, 0, s>>>(h13, ab, n, il);
                BL(bl.gemm_batched(bl.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)H, 1, (int)il, &one,
                                   (const void *const *)parr_w2[(size_t)si], CUDA_R_16BF, (int)il,
                                   (const void *const *)parr_a[(size_t)si], CUDA_R_16BF, (int)il, &zero,
                                   parr_y[(size_t)si], CUDA_R_32F, (int)H, n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
                BENCH_CK(cudaStreamWaitEvent(s, ws.ev_join, 0));
                TRYE(cu_moe_combine(ws.wts, ws.eout, NULL, k, ws.logits + E, ws.lg_ld, ws.sh_out, NULL, M, H, o.act, 0,
                                    ws.out, false, s, &err),
                     err);
            }
        };
        const flag_check narrow = {&cu_block_shape::dec_narrow, "--check-narrow", "the 8-warp blocks", "the narrow ones"};
        const flag_check staged = {&cu_block_shape::stage_img, "--check-stage", "the blocks staging", "the staged image"};
        if (o.check_narrow) switch_check(narrow, M, k, il, H, E, shape, ws, [&](void) { enqueue(0, 0); });
        if (o.check_stage) switch_check(staged, M, k, il, H, E, shape, ws, [&](void) { enqueue(0, 0); });
        for (int si = 0; si < o.sets; si++) {
            std::vector<char> seen((size_t)E, 0);
            for (int64_t sl = 0; sl < M * k; sl++)
                if (!seen[(size_t)hsets[(size_t)si][(size_t)sl]]) seen[(size_t)hsets[(size_t)si][(size_t)sl]] = 1, distinct_sum++;
            for (int part = 0; part < 3; part++) {
                if (part == 2 && (!have_blas || M > Mb)) continue;
                cudaGraph_t graph;
                BENCH_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                enqueue(part, si);
                BENCH_CK(cudaStreamEndCapture(s, &graph));
                cudaGraphExec_t ex;
                BENCH_CK(cudaGraphInstantiate(&ex, graph, gflags));
                BENCH_CK(cudaGraphDestroy(graph));
                (part == 0 ? gb : part == 1 ? gr : gc).push_back(ex);
            }
        }
        /* chains: every route set's call back to back in one graph (as the layers of a model
         * forward follow each other in one graph): the time per call without one graph launch
         * per call */
        std::vector<cudaGraphExec_t> cb, cr, cc;
        for (int part = 0; part < 5; part++) {
            if (part == 2 && (!have_blas || M > Mb)) continue;
            cudaGraph_t graph;
            BENCH_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int si = 0; si < o.sets; si++) enqueue(part, si);
            BENCH_CK(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t ex;
            BENCH_CK(cudaGraphInstantiate(&ex, graph, gflags));
            BENCH_CK(cudaGraphDestroy(graph));
            (part == 0 ? cb : part == 1 ? cr : part == 2 ? cc : part == 3 ? gq : gt).push_back(ex);
        }
        row r;
        memset(&r, 0, sizeof r);
        r.M = M;
        r.distinct = distinct_sum / o.sets;
        r.block = bench_time_graphs(gb, o.iters, s);
        r.routed = bench_time_graphs(gr, o.iters, s);
        r.cublas = gc.empty() ? NAN : bench_time_graphs(gc, o.iters, s);
        const int chain_iters = std::max(10, o.iters / o.sets);
        r.router = bench_time_graphs(gq, chain_iters, s) / o.sets;
        r.route = bench_time_graphs(gt, chain_iters, s) / o.sets;
        r.chain_block = bench_time_graphs(cb, chain_iters, s) / o.sets;
        r.chain_routed = bench_time_graphs(cr, chain_iters, s) / o.sets;
        r.chain_cublas = cc.empty() ? NAN : bench_time_graphs(cc, chain_iters, s) / o.sets;
        const double act_b = 2.0 * (double)(M * H) * 4.0;
        const double dist = (double)distinct_sum / o.sets;
        r.floor_routed = (dist * (e13 + e2) + act_b) / copy_bw * 1e6;
        r.floor_block = (dist * (e13 + e2) + act_b + router_b + shared_b) / copy_bw * 1e6;
        rows.push_back(r);
#ifdef TD_TIMELINE
        if (o.timeline && !o.json) timeline(gb, o.timeline, M, s);
#endif
        for (auto *v : {&gb, &gr, &gc, &gq, &gt, &cb, &cr, &cc})
            for (auto e : *v) BENCH_CK(cudaGraphExecDestroy(e));
        if (!o.json)
            fprintf(stderr, "M=%lld done\n", (long long)M);
    }

    const char *act_name = o.act == 1 ? "fp16" : "bf16";
    char variant[192];
    snprintf(variant, sizeof variant, "cuda:act_dtype=%s,storage=%s,moe_dispatch=%s,tp_size=%lld%s%s%s%s", act_name,
             o.raw ? "raw" : "prepared", o.grouped ? "grouped" : "direct", (long long)o.tp,
             o.generic ? ",kernels=generic" : "", o.separate_combine ? " +separate-combine" : "",
             o.dec_narrow ? "" : " +no-dec-narrow", o.stage_img ? "" : " +no-stage-img");
    if (o.json) {
        printf("{\"gpu\": \"%s\", \"copy_bw_GBps\": %.1f, \"variant\": \"%s\", \"hidden\": %lld, \"experts\": %lld, "
               "\"inter_per_rank\": %lld, \"topk\": %lld, \"rows\": [",
               prop.name, copy_bw * 1e-9, variant, (long long)H, (long long)E, (long long)il, (long long)k);
        for (size_t i = 0; i < rows.size(); i++) {
            const row &r = rows[i];
            printf("%s{\"M\": %lld, \"experts\": %lld, \"block_us\": %.2f, \"routed_us\": %.2f, "
                   "\"routed_floor_us\": %.2f, \"block_floor_us\": %.2f, \"cublas_us\": %s%.2f%s, "
                   "\"chain_block_us\": %.2f, \"chain_routed_us\": %.2f, \"chain_cublas_us\": %s%.2f%s}",
                   i ? ", " : "", (long long)r.M, (long long)r.distinct, r.block, r.routed, r.floor_routed,
                   r.floor_block, isnan(r.cublas) ? "\"" : "", isnan(r.cublas) ? 0.0 : r.cublas,
                   isnan(r.cublas) ? "\"" : "", r.chain_block, r.chain_routed, isnan(r.chain_cublas) ? "\"" : "",
                   isnan(r.chain_cublas) ? 0.0 : r.chain_cublas, isnan(r.chain_cublas) ? "\"" : "");
        }
        printf("]}\n");
    } else {
        printf("GPU %s, copy bandwidth %.1f GB/s (read+write), %s\n", prop.name, copy_bw * 1e-9, variant);
        printf("hidden %lld, %lld experts x %lld per rank, top-%lld, shared %lld per rank; median of %d calls, %d "
               "route sets\n",
               (long long)H, (long long)E, (long long)il, (long long)k, (long long)isl, o.iters, o.sets);
        printf("%5s %7s %10s %10s %11s %9s %11s %9s %10s %8s\n", "M", "experts", "block_us", "routed_us",
               "rt_floor_us", "rt_%bw", "blk_floor", "blk_%bw", "cublas_us", "speedup");
        for (const row &r : rows)
            printf("%5lld %7lld %10.2f %10.2f %11.2f %8.1f%% %11.2f %8.1f%% %10.2f %7.2fx\n", (long long)r.M,
                   (long long)r.distinct, r.block, r.routed, r.floor_routed, 100.0 * r.floor_routed / r.routed,
                   r.floor_block, 100.0 * r.floor_block / r.block, r.cublas, r.cublas / r.block);
        printf("parts (us per call, chained): M, round + router + gate, routing kernel\n");
        for (const row &r : rows) printf("  %5lld %10.2f %10.2f\n", (long long)r.M, r.router, r.route);
        printf("chained (us per call, the %d route sets back to back in one graph):\n", o.sets);
        printf("%5s %10s %10s %9s %9s %10s %8s\n", "M", "block_us", "routed_us", "rt_%bw", "blk_%bw", "cublas_us",
               "speedup");
        for (const row &r : rows)
            printf("%5lld %10.2f %10.2f %8.1f%% %8.1f%% %10.2f %7.2fx\n", (long long)r.M, r.chain_block,
                   r.chain_routed, 100.0 * r.floor_routed / r.chain_routed, 100.0 * r.floor_block / r.chain_block,
                   r.chain_cublas, r.chain_cublas / r.chain_block);
    }
    if (db) {
        {
            td_db_timing_row tr;
            memset(&tr, 0, sizeof tr);
            tr.bench = "moe_decode.copy_bandwidth";
            tr.shape = "";
            tr.metric = "median";
            tr.variant = variant;
            tr.value = copy_bw * 1e-9;
            tr.unit = "GB/s";
            tr.n = 10; /* bench_copy_bandwidth's median of 10 copies */
            tr.stddev = NAN;
            tr.higher_is_better = true;
            TRYE(td_db_put_timing(db, run, &tr, &err), err);
        }
        for (const row &r : rows) {
            char shape[128], bigs[32] = "", dense[32] = "";
            if (o.big) snprintf(bigs, sizeof bigs, ".big%lld", (long long)o.big);
            if (ndense > 1) snprintf(dense, sizeof dense, ".dense%d", ndense);
            snprintf(shape, sizeof shape, "M%lld.h%lld.e%lld.i%lld.k%lld%s%s", (long long)r.M, (long long)H,
                     (long long)E, (long long)il, (long long)k, bigs, dense);
            const struct {
                const char *bench;
                double v;
            } t[] = {{"moe_decode.block", r.block},     {"moe_decode.routed", r.routed},
                     {"moe_decode.router", r.router},   {"moe_decode.route", r.route},
                     {"moe_decode.cublas_bf16", r.cublas}, {"moe_decode.routed_floor", r.floor_routed},
                     {"moe_decode.block_floor", r.floor_block}, {"moe_decode.chain_block", r.chain_block},
                     {"moe_decode.chain_routed", r.chain_routed}, {"moe_decode.chain_cublas_bf16", r.chain_cublas}};
            for (const auto &x : t) {
                if (isnan(x.v)) continue;
                td_db_timing_row tr;
                memset(&tr, 0, sizeof tr);
                tr.bench = x.bench;
                tr.shape = shape;
                tr.metric = "median";
                tr.variant = variant;
                tr.value = x.v;
                tr.unit = "us";
                tr.n = o.iters;
                tr.stddev = NAN;
                TRYE(td_db_put_timing(db, run, &tr, &err), err);
            }
        }
        TRYE(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), err);
        td_db_close(db);
        if (!o.json) printf("stored as run %lld in %s\n", (long long)run, o.db);
    }
    return 0;
}
