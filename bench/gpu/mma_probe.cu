/* mma_probe.cu — whether Hopper's warpgroup MMA (wgmma, A from registers, B from shared
 * memory through a matrix descriptor) gives the same bits as mma.sync m16n8k16 for the same
 * sequence of BF16 products accumulated in FP32 (docs/perf.md, "The BF16 GEMMs on wgmma").
 *
 * usage: mma_probe [--seed N]
 *
 * Each output element (r, n) of a 64 x N tile is the sequence d = 0; for every 16-wide block
 * b of K in order: d = A[r, b] . B[n, b] + d, i.e. one m16n8k16 per block on the element's
 * warp (mma.sync), or one m64nNk16 per block on a warpgroup (wgmma, N = 8, 64, 128), after
 * each of which the warpgroup waits. The engine's BF16 kernels (router and shared expert)
 * accumulate this way within a chunk, hi and lo products alternating. A is 64 x 2560, B is
 * N x 640 used four times (shared memory holds 640 columns), seeded random values in several
 * ranges: exponents within [-8, 8] and [-60, 60], few distinct values (exact cancellations),
 * subnormals and signed zeros, magnitudes that overflow FP32 (inf, inf - inf), and the
 * engine's own case: an FP16 input split into a BF16 hi and lo part, each block of A used
 * once for hi and once for lo. wgmma's B layout (8 x 8 core matrices, no swizzle; the
 * descriptor's leading offset between the two K halves, its stride offset between column
 * blocks) is checked against an FP64 sum (a wrong layout is far off it), then compared bit for
 * bit with mma.sync (outputs poisoned with different patterns, so an unwritten element
 * differs). Prints one line per case and N, and exits 1 when any bit differs or a layout
 * check fails.
 *
 * Then, as a measurement (it does not change the exit status), whether mma.sync's sum of 16
 * BF16 products depends on how the operands represent the same products: NVFP4 weights as
 * E2M1 x 2^-14 (normal BF16; the engine's decode with its multiplication by 2^112) by the input
 * x, against E2M1 x 2^-126 (the 0.5 code a BF16 subnormal; the decode without the
 * multiplication) by x x 2^112. Each product is the same value. Per case (inputs of moderate
 * exponents; the same with one input per 16 some hundred times larger; edge values) it counts
 * the sums whose bits differ, and how many of those have their largest product on a 0.5 code
 * (docs/cuda.md, Numerics).
 */
#include <cuda_runtime.h>

extern "C" {
#include "formats.h"
}
#include "gpu_timing.cuh"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define KB 40      /* 16-wide blocks of B in shared memory */
#define REP 4      /* A has REP * KB blocks; B's are used REP times */
#define NMAX 128
#define KA (REP * KB * 16)
#define KBB (KB * 16)
#include "wgmma.cuh"

__device__ __forceinline__ void a_frag(const uint16_t *A, int r0, int k0, int q, uint32_t a[4])
{
    const int r1 = r0 + 8;
    a[0] = A[(size_t)r0 * KA + k0 + 2 * q] | (uint32_t)A[(size_t)r0 * KA + k0 + 2 * q + 1] << 16;
    a[1] = A[(size_t)r1 * KA + k0 + 2 * q] | (uint32_t)A[(size_t)r1 * KA + k0 + 2 * q + 1] << 16;
    a[2] = A[(size_t)r0 * KA + k0 + 2 * q + 8] | (uint32_t)A[(size_t)r0 * KA + k0 + 2 * q + 9] << 16;
    a[3] = A[(size_t)r1 * KA + k0 + 2 * q + 8] | (uint32_t)A[(size_t)r1 * KA + k0 + 2 * q + 9] << 16;
}

/* d += a b: one mma.sync m16n8k16, BF16 into FP32 */
__device__ __forceinline__ void mma_bf16(const uint32_t a[4], uint32_t b0, uint32_t b1, float &d0, float &d1, float &d2,
                                         float &d3)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* mma.sync: warp w computes rows 16w..16w+15, every 8-column block of N in turn */
__global__ void k_sync(const uint16_t *A, const uint16_t *B, int N, float *out)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int r0 = 16 * w + g;
    for (int j = 0; j < N / 8; j++) {
        float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
        const int n = 8 * j + g;
        for (int rep = 0; rep < REP; rep++)
            for (int kb = 0; kb < KB; kb++) {
                uint32_t a[4];
                a_frag(A, r0, (rep * KB + kb) * 16, q, a);
                const uint16_t *bn = B + (size_t)n * KBB + kb * 16;
                const uint32_t b0 = bn[2 * q] | (uint32_t)bn[2 * q + 1] << 16;
                const uint32_t b1 = bn[2 * q + 8] | (uint32_t)bn[2 * q + 9] << 16;
                mma_bf16(a, b0, b1, d0, d1, d2, d3);
            }
        const int c = 8 * j + 2 * q;
        out[r0 * NMAX + c] = d0;
        out[r0 * NMAX + c + 1] = d1;
        out[(r0 + 8) * NMAX + c] = d2;
        out[(r0 + 8) * NMAX + c + 1] = d3;
    }
}

/* wgmma: B staged as 8 x 8 core matrices (8 columns n x 8 values of K, 16 bytes per n):
 * block kb at kb * N * 32 bytes, in it column block j at j * WG_SBO and K half h at h * WG_LBO. */
template <int N>
__global__ void k_wg(const uint16_t *A, const uint16_t *B, float *out)
{
    extern __shared__ uint4 bsh[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    for (int i = threadIdx.x; i < N * KB * 2; i += blockDim.x) {
        const int n = i / (KB * 2), kb = i / 2 % KB, h = i & 1;
        const uint4 v = *reinterpret_cast<const uint4 *>(B + (size_t)n * KBB + kb * 16 + h * 8);
        bsh[(kb * N * 32 + (n / 8) * WG_SBO + h * WG_LBO + (n % 8) * 16) / 16] = v;
    }
    fence_async_smem();
    __syncthreads();
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(bsh);
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) d[i] = 0.f;
    const int r0 = 16 * w + g;
    for (int rep = 0; rep < REP; rep++)
        for (int kb = 0; kb < KB; kb++) {
            uint32_t a[4];
            a_frag(A, r0, (rep * KB + kb) * 16, q, a);
            const uint32_t addr = base + (uint32_t)(kb * N * 32);
            const uint64_t desc = wg_desc(addr, WG_LBO, WG_SBO);
            wg_fence();
            if (N == 8) wg_mma_n8(*reinterpret_cast<float(*)[4]>(d), a, desc);
            if (N == 64) wg_mma_n64(*reinterpret_cast<float(*)[32]>(d), a, desc);
            if (N == 128) wg_mma_n128(*reinterpret_cast<float(*)[64]>(d), a, desc);
            wg_commit();
            wg_wait<0>();
        }
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
        const int c = 8 * j + 2 * q;
        out[r0 * NMAX + c] = d[4 * j];
        out[r0 * NMAX + c + 1] = d[4 * j + 1];
        out[(r0 + 8) * NMAX + c] = d[4 * j + 2];
        out[(r0 + 8) * NMAX + c + 1] = d[4 * j + 3];
    }
}


/* Timing: each block (one warpgroup) issues `iters` steps of C wgmma m64nNk16 into C
 * independent accumulators, one commit group per step, and waits for each step's completion
 * before the next: cycles per step on the block's SM, i.e. the latency of one wgmma (C = 1)
 * or of C independent ones issued back to back. */
template <int N, int C>
__global__ void k_wg_time(const uint16_t *A, int iters, float *sink, long long *cycles)
{
    extern __shared__ uint4 bsh[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, q = lane & 3;
    for (int i = threadIdx.x; i < N * 2 * 2; i += blockDim.x) bsh[i] = make_uint4(0x3f803f80u, 0, 0x3f803f80u, 0);
    fence_async_smem();
    __syncthreads();
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(bsh);
    uint32_t a[4];
    a_frag(A, 16 * w + (lane >> 2), 0, q, a);
    float d[C][N / 2];
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int i = 0; i < N / 2; i++) d[c][i] = 0.f;
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int i = 0; i < N / 2; i++) reg_fence(d[c][i]);
        wg_fence();
#pragma unroll
        for (int c = 0; c < C; c++) {
            const uint64_t desc = wg_desc(base, WG_LBO, WG_SBO);
            if (N == 64) wg_mma_n64(*reinterpret_cast<float(*)[32]>(d[c]), a, desc);
            if (N == 128) wg_mma_n128(*reinterpret_cast<float(*)[64]>(d[c]), a, desc);
            if (N == 256) wg_mma_n256(*reinterpret_cast<float(*)[128]>(d[c]), a, desc);
        }
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int i = 0; i < N / 2; i++) reg_fence(d[c][i]);
    }
    wg_wait<0>();
    const long long t1 = clock64();
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int i = 0; i < N / 2; i++) acc += d[c][i];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int N, int C>
static void time_wg(const uint16_t *dA, int blocks, float *sink, long long *dcyc)
{
    const int iters = 4096;
    k_wg_time<N, C><<<blocks, 128, (size_t)N * 64>>>(dA, iters, sink, dcyc); /* N x 2 x 2 uint4 of B */
    BENCH_CK(cudaGetLastError());
    std::vector<long long> cyc((size_t)blocks);
    BENCH_CK(cudaMemcpy(cyc.data(), dcyc, cyc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(cyc.begin(), cyc.end());
    const double per = (double)cyc[cyc.size() / 2] / iters;
    printf("  m64n%-3dk16 x %d chains, %3d blocks: %7.1f cycles per step, %6.1f per wgmma, %6.0f FMA per cycle per block\n",
           N, C, blocks, per, per / C, 64.0 * N * 16 * C / per);
}

/* One m16n8k16 per warp and tile, twice: fragments a[t][2][32][4] (the two A representations),
 * b[t][2][32][2] (the matching B), d[t][2][32][4]. */
__global__ void k_repr(const uint32_t *a, const uint32_t *b, int tiles, float *d)
{
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= tiles) return;
    for (int p = 0; p < 2; p++) {
        const uint32_t *ap = a + ((size_t)t * 2 + p) * 128 + lane * 4, *bp = b + ((size_t)t * 2 + p) * 64 + lane * 2;
        float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
        mma_bf16(ap, bp[0], bp[1], d0, d1, d2, d3);
        float *dp = d + ((size_t)t * 2 + p) * 128 + lane * 4;
        dp[0] = d0;
        dp[1] = d1;
        dp[2] = d2;
        dp[3] = d3;
    }
}

/* ---- host -------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float bf16_to_f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* BF16 round-to-nearest-even of a finite float */
static uint16_t f_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* a BF16 with a random sign and mantissa and an exponent in [e0, e1] (below -126: subnormal
 * encodings, the mantissa scaled; one in 16 values a signed zero when zeros is set) */
static uint16_t gen(uint64_t *s, int e0, int e1, bool zeros, bool few)
{
    const uint64_t r = rng_next(s);
    const uint16_t sign = (uint16_t)((r & 1) << 15);
    if (zeros && (r >> 1 & 15) == 0) return sign;
    const int e = e0 + (int)((r >> 8) % (uint64_t)(e1 - e0 + 1));
    uint16_t m = (uint16_t)(r >> 32 & 0x7f);
    if (few) m &= 0x40;
    if (e < -126) {
        const int sh = -126 - e; /* subnormal: 0.m x 2^-126 with the leading one shifted in */
        const uint16_t sm = (uint16_t)(((0x80 | m) >> (sh < 8 ? sh : 8)) & 0x7f);
        return (uint16_t)(sign | sm);
    }
    return (uint16_t)(sign | (uint16_t)(e + 127) << 7 | m);
}

static bool same_bits(float a, float b)
{
    if (isnan(a) && isnan(b)) return true;
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            const char *v = argv[++i];
            char *end;
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') {
                fprintf(stderr, "mma_probe: --seed: '%s' is not a non-negative integer\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: mma_probe [--seed N]\n");
            return 2;
        }
    }
    const char *names[] = {"exp [-8,8]", "exp [-60,60]", "cancel", "subnormal+zero", "overflow", "fp16 hi/lo"};
    const int ncase = 6;
    std::vector<uint16_t> hA((size_t)64 * KA), hB((size_t)NMAX * KBB);
    uint16_t *dA, *dB;
    float *dS, *dW;
    BENCH_CK(cudaMalloc(&dA, hA.size() * 2));
    BENCH_CK(cudaMalloc(&dB, hB.size() * 2));
    BENCH_CK(cudaMalloc(&dS, 64 * NMAX * 4));
    BENCH_CK(cudaMalloc(&dW, 64 * NMAX * 4));
    BENCH_CK(cudaFuncSetAttribute(k_wg<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * KB * 32));
    BENCH_CK(cudaFuncSetAttribute(k_wg<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * KB * 32));
    BENCH_CK(cudaFuncSetAttribute(k_wg<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 * KB * 32));
    std::vector<float> hS(64 * NMAX), hW(64 * NMAX);
    long long total_diff = 0, layout_wrong = 0;
    printf("seed %llu; A 64 x %d, B N x %d used %d times; per element %d products in blocks of 16\n",
           (unsigned long long)seed, KA, KBB, REP, KA);
    printf("%-16s %4s %10s %12s %14s\n", "case", "N", "layout", "bits differ", "of elements");
    for (int cs = 0; cs < ncase; cs++) {
        uint64_t s = seed * 1000003ull + (uint64_t)cs;
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < KA; k++) {
                uint16_t v;
                switch (cs) {
                case 0: v = gen(&s, -8, 8, false, false); break;
                case 1: v = gen(&s, -60, 60, false, false); break;
                case 2: v = gen(&s, 0, 2, true, true); break;
                case 3: v = gen(&s, -70, -55, true, false); break;
                case 4: v = gen(&s, 60, 127, false, false); break;
                default: v = gen(&s, -4, 4, false, false); break;
                }
                hA[(size_t)r * KA + k] = v;
            }
        if (cs == 5) /* block 2i + 1 repeats block 2i (hi, then lo) */
            for (int r = 0; r < 64; r++)
                for (int b = 1; b < KA / 16; b += 2)
                    memcpy(&hA[(size_t)r * KA + b * 16], &hA[(size_t)r * KA + (b - 1) * 16], 32);
        for (int n = 0; n < NMAX; n++)
            for (int k = 0; k < KBB; k++) {
                uint16_t v;
                switch (cs) {
                case 0: v = gen(&s, -8, 8, false, false); break;
                case 1: v = gen(&s, -60, 60, false, false); break;
                case 2: v = gen(&s, 0, 2, true, true); break;
                case 3: v = gen(&s, -80, -60, true, false); break;
                case 4: v = gen(&s, 60, 127, false, false); break;
                default: {
                    /* column n's FP16 input x at k % 16 of the block pair: hi = bf16(x), lo = bf16(x - hi) */
                    const int b = k / 16, kk = k % 16;
                    uint64_t t = seed * 7919ull + (uint64_t)(n * KBB + (b / 2) * 16 + kk);
                    const uint64_t r = rng_next(&t);
                    /* an FP16 value: 11 significant bits, exponent in [-10, 3] */
                    const float xh = (float)ldexp((r & 1 ? -1.0 : 1.0) * (1.0 + (double)(r >> 1 & 1023) / 1024.0),
                                                  -10 + (int)(r >> 11 & 0xffff) % 14);
                    const uint16_t hi = f_to_bf16(xh);
                    const uint16_t lo = f_to_bf16(xh - bf16_to_f(hi));
                    v = (b & 1) ? lo : hi;
                    break;
                }
                }
                hB[(size_t)n * KBB + k] = v;
            }
        BENCH_CK(cudaMemcpy(dA, hA.data(), hA.size() * 2, cudaMemcpyHostToDevice));
        BENCH_CK(cudaMemcpy(dB, hB.data(), hB.size() * 2, cudaMemcpyHostToDevice));
        const int Ns[3] = {8, 64, 128};
        for (int ni = 0; ni < 3; ni++) {
            const int N = Ns[ni];
            /* poisons that differ from each other (NaN here, -1.7e38 for wgmma), so that an
             * element either kernel leaves unwritten counts as differing, even where NaN is the
             * expected result */
            BENCH_CK(cudaMemset(dS, 0xff, 64 * NMAX * 4));
            k_sync<<<1, 128>>>(dA, dB, N, dS);
            BENCH_CK(cudaGetLastError());
            BENCH_CK(cudaMemcpy(hS.data(), dS, hS.size() * 4, cudaMemcpyDeviceToHost));
            /* FP64 sums and magnitudes for the layout check */
            std::vector<double> ref(64 * (size_t)N), mag(64 * (size_t)N);
            for (int r = 0; r < 64; r++)
                for (int n = 0; n < N; n++) {
                    double acc = 0, m = 0;
                    for (int k = 0; k < KA; k++) {
                        const double p = (double)bf16_to_f(hA[(size_t)r * KA + k]) *
                                         (double)bf16_to_f(hB[(size_t)n * KBB + k % KBB]);
                        acc += p;
                        m += fabs(p);
                    }
                    ref[(size_t)r * N + n] = acc;
                    mag[(size_t)r * N + n] = m;
                }
            BENCH_CK(cudaMemset(dW, 0xfe, 64 * NMAX * 4));
            if (N == 8) k_wg<8><<<1, 128, 8 * KB * 32>>>(dA, dB, dW);
            if (N == 64) k_wg<64><<<1, 128, 64 * KB * 32>>>(dA, dB, dW);
            if (N == 128) k_wg<128><<<1, 128, 128 * KB * 32>>>(dA, dB, dW);
            BENCH_CK(cudaGetLastError());
            BENCH_CK(cudaMemcpy(hW.data(), dW, hW.size() * 4, cudaMemcpyDeviceToHost));
            long long ok = 0, finite = 0, diff = 0, sync_ok = 0;
            for (int r = 0; r < 64; r++)
                for (int n = 0; n < N; n++) {
                    const double rf = ref[(size_t)r * N + n], m = mag[(size_t)r * N + n];
                    const float w = hW[(size_t)r * NMAX + n], y = hS[(size_t)r * NMAX + n];
                    if (!same_bits(w, y)) diff++;
                    if (!isfinite(rf) || fabs(rf) > 3e38 || m > 3e38) continue;
                    finite++;
                    const double tol = 1e-3 * m + 1e-40;
                    if (fabs((double)w - rf) <= tol) ok++;
                    if (fabs((double)y - rf) <= tol) sync_ok++;
                }
            const bool layout = finite == 0 || ok == finite;
            printf("%-16s %4d %10s %12lld %14d   (mma.sync near FP64: %lld of %lld)\n", names[cs], N,
                   finite == 0 ? "n/a" : layout ? "ok" : "WRONG", diff, 64 * N, sync_ok, finite);
            total_diff += diff;
            if (!layout) layout_wrong++;
        }
    }
    {
        /* the operands' representation (see the header): codes uniform over the 16 E2M1
         * codes; x per case; tiles of 16 x 16 codes by 16 x 8 inputs */
        const int T = 4096;
        const char *rnames[] = {"x exp [-3,3]", "one x 2^7..2^10 larger", "edge values"};
        std::vector<uint32_t> ha((size_t)T * 256), hb((size_t)T * 128);
        std::vector<float> hd((size_t)T * 256);
        std::vector<uint8_t> code(256);
        std::vector<uint16_t> xv(128);
        uint32_t *da, *db;
        float *dd;
        BENCH_CK(cudaMalloc(&da, ha.size() * 4));
        BENCH_CK(cudaMalloc(&db, hb.size() * 4));
        BENCH_CK(cudaMalloc(&dd, hd.size() * 4));
        printf("BF16 operands: E2M1 x 2^-14 by x against E2M1 x 2^-126 by x x 2^112 (the same products), "
               "%d tiles of 16 x 8 sums of 16 products:\n", T);
        printf("%-24s %12s %14s %22s\n", "inputs", "sums differ", "of sums", "largest product on 0.5");
        for (int cs = 0; cs < 3; cs++) {
            uint64_t s = seed * 7777ull + (uint64_t)cs;
            std::vector<std::vector<uint8_t>> codes(T);
            std::vector<std::vector<uint16_t>> xs(T);
            for (int t = 0; t < T; t++) {
                for (int i = 0; i < 256; i++) code[i] = (uint8_t)(rng_next(&s) & 15);
                for (int k = 0; k < 16; k++)
                    for (int n = 0; n < 8; n++) {
                        uint16_t v = gen(&s, -3, 3, false, false);
                        if (cs == 2) {
                            static const uint16_t edge[] = {0x0000, 0x8000, 0x0001, 0x8040, 0x0080, 0x477f, 0xc77f, 0x3f80};
                            const uint64_t r = rng_next(&s);
                            v = (r & 3) == 0 ? edge[(r >> 2) % 8] : gen(&s, -40, 15, true, false);
                        }
                        xv[k * 8 + n] = v;
                    }
                if (cs == 1) /* column n: input (t + n) % 16 2^7..2^10 times larger */
                    for (int n = 0; n < 8; n++) {
                        const int k = (t + n) % 16;
                        const float v = bf16_to_f(xv[k * 8 + n]) * (float)(1 << (7 + (int)(rng_next(&s) & 3)));
                        xv[k * 8 + n] = f_to_bf16(v);
                    }
                codes[t] = code;
                xs[t] = xv;
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, q = lane & 3;
                    for (int r = 0; r < 4; r++) {
                        const int m = g + 8 * (r & 1), k = 2 * q + 8 * (r >> 1);
                        for (int p = 0; p < 2; p++) {
                            const float sc = p ? 0x1p-126f : 0x1p-14f;
                            uint32_t w = 0;
                            for (int h = 0; h < 2; h++) {
                                const uint8_t c = code[m * 16 + k + h];
                                const float v = td_e2m1_to_f32(c) * sc;
                                /* E2M1 x 2^-126 of the 0.5 code is a subnormal float: its BF16
                                 * bits are its top half, as for every value here */
                                uint32_t u;
                                memcpy(&u, &v, 4);
                                w |= (u >> 16) << (16 * h);
                            }
                            ha[((size_t)t * 2 + p) * 128 + lane * 4 + r] = w;
                        }
                    }
                    for (int r = 0; r < 2; r++) {
                        const int k = 2 * q + 8 * r;
                        for (int p = 0; p < 2; p++) {
                            uint32_t w = 0;
                            for (int h = 0; h < 2; h++) {
                                const uint16_t x = xv[(k + h) * 8 + g];
                                w |= (uint32_t)(p ? f_to_bf16(bf16_to_f(x) * 0x1p112f) : x) << (16 * h);
                            }
                            hb[((size_t)t * 2 + p) * 64 + lane * 2 + r] = w;
                        }
                    }
                }
            }
            BENCH_CK(cudaMemcpy(da, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
            BENCH_CK(cudaMemcpy(db, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
            BENCH_CK(cudaMemset(dd, 0xff, hd.size() * 4));
            k_repr<<<T / 4, 128>>>(da, db, T, dd);
            BENCH_CK(cudaGetLastError());
            BENCH_CK(cudaMemcpy(hd.data(), dd, hd.size() * 4, cudaMemcpyDeviceToHost));
            long long diff = 0, on_half = 0;
            for (int t = 0; t < T; t++)
                for (int lane = 0; lane < 32; lane++)
                    for (int r = 0; r < 4; r++) {
                        const float d1 = hd[((size_t)t * 2) * 128 + lane * 4 + r], d2 = hd[((size_t)t * 2 + 1) * 128 + lane * 4 + r];
                        if (same_bits(d1, d2)) continue;
                        diff++;
                        const int m = (lane >> 2) + 8 * (r >> 1), n = 2 * (lane & 3) + (r & 1);
                        double best = -1;
                        int bc = 0;
                        for (int k = 0; k < 16; k++) {
                            const uint8_t c = codes[t][m * 16 + k];
                            const double pr = fabs((double)td_e2m1_to_f32(c) * bf16_to_f(xs[t][k * 8 + n]));
                            if (pr > best) best = pr, bc = c & 7;
                        }
                        if (bc == 1) on_half++;
                    }
            printf("%-24s %12lld %14d %22lld\n", rnames[cs], diff, T * 128, on_half);
        }
        BENCH_CK(cudaFree(da));
        BENCH_CK(cudaFree(db));
        BENCH_CK(cudaFree(dd));
    }
    {
        float *sink;
        long long *dcyc;
        BENCH_CK(cudaMalloc(&sink, 264 * 128 * 4));
        BENCH_CK(cudaMalloc(&dcyc, 264 * sizeof(long long)));
        printf("wgmma steps, each waited for (B from one shared-memory tile, A from registers):\n");
        for (int blocks = 132; blocks <= 264; blocks += 132) {
            time_wg<64, 1>(dA, blocks, sink, dcyc);
            time_wg<64, 2>(dA, blocks, sink, dcyc);
            time_wg<64, 4>(dA, blocks, sink, dcyc);
            time_wg<128, 1>(dA, blocks, sink, dcyc);
            time_wg<128, 2>(dA, blocks, sink, dcyc);
            time_wg<256, 1>(dA, blocks, sink, dcyc);
        }
        BENCH_CK(cudaFree(sink));
        BENCH_CK(cudaFree(dcyc));
    }
    if (layout_wrong)
        printf("LAYOUT WRONG in %lld case(s): wgmma's sums are not near the FP64 sums, the comparison is void\n",
               layout_wrong);
    printf("%s: %lld elements differ in at least one bit between wgmma and mma.sync\n",
           total_diff ? "DIFFERENT" : "IDENTICAL", total_diff);
    return total_diff || layout_wrong ? 1 : 0;
}
