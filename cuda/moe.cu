/* moe.cu — the MoE-block kernels and their launchers (see moe.cuh for the numerics).
 *
 * Layering: kernels (k_*) take plain device pointers and read threadIdx/blockIdx only at the
 * top; the device helpers below take the lane index as an argument; launchers (cu_moe_*)
 * choose the grid, launch on the caller's stream and check the launch.
 */
#include "moe.cuh"

/* Warps per block of the dot-product kernels: 8 warps give every scheduler of an SM two
 * warps to switch between while one waits on a weight load. */
#define WARPS 8
#define THREADS (WARPS * 32)
/* Tokens per pass of cu_moe_linear: one weight row read serves this many dot products. */
#define LIN_TOKENS 8

__constant__ float c_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* ==== device helpers ========================================================================= */

__device__ __forceinline__ float round_act(float v, int act)
{
    if (act == 1) return __half2float(__float2half_rn(v));
    if (act == 2) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

/* Decode the 16-element block of row `wrow` starting at column c (nv <= 16 valid elements). */
__device__ __forceinline__ void decode_block(const cu_lin &W, int64_t e, const uint8_t *wrow, const __half *srow,
                                             const uint8_t *rrow, int64_t c, int nv, float wv[16])
{
    if (W.kind == CU_W_NVFP4) {
        const uint2 p = *reinterpret_cast<const uint2 *>(wrow + c / 2);
        const float eff = W.raw ? cu_raw_eff(rrow[c / 16], W.gl[e], W.conv) : __half2float(srow[c / 16]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const unsigned b = ((j < 4 ? p.x : p.y) >> (8 * (j & 3))) & 0xffu;
            wv[2 * j] = __fmul_rn(c_e2m1[b & 15u], eff);      /* element 2j: low nibble */
            wv[2 * j + 1] = __fmul_rn(c_e2m1[b >> 4], eff);   /* element 2j+1: high nibble */
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float v = 0.0f;
        if (i < nv) {
            if (W.kind == CU_W_BF16) {
                const uint16_t u = reinterpret_cast<const uint16_t *>(wrow)[c + i];
                v = __uint_as_float((unsigned)u << 16);
            } else if (W.kind == CU_W_F16) {
                v = __half2float(reinterpret_cast<const __half *>(wrow)[c + i]);
            } else {
                v = reinterpret_cast<const float *>(wrow)[c + i];
            }
        }
        wv[i] = v;
    }
}

/* acc[t] (t < nt) = row `row` of expert e, columns [c0, c0 + n), dotted with x + t*x_ld
 * (x indexed from 0), in the documented order; every lane returns the same bits. */
template <int MT>
__device__ void warp_dot(const cu_lin &W, int64_t e, int64_t row, int64_t c0, int64_t n, const float *x,
                         int64_t x_ld, int nt, int lane, float acc[MT])
{
#pragma unroll
    for (int t = 0; t < MT; t++) acc[t] = 0.0f;
    const uint8_t *wrow = W.w + e * W.e_w + row * W.w_ld;
    const bool q4 = W.kind == CU_W_NVFP4;
    const __half *srow = q4 && !W.raw ? W.s + e * W.e_s + row * W.s_ld : nullptr;
    const uint8_t *rrow = q4 && W.raw ? W.sr + e * W.e_s + row * W.s_ld : nullptr;
    const int64_t nb = (n + 15) / 16;
    for (int64_t b = lane; b < nb; b += 32) {
        const int nv = n - 16 * b < 16 ? (int)(n - 16 * b) : 16;
        float wv[16];
        decode_block(W, e, wrow, srow, rrow, c0 + 16 * b, nv, wv);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t >= nt) break;
            const float *xt = x + t * x_ld + 16 * b;
            for (int i = 0; i < nv; i++) acc[t] = __fadd_rn(acc[t], __fmul_rn(wv[i], xt[i]));
        }
    }
#pragma unroll
    for (int t = 0; t < MT; t++)
        for (int off = 16; off >= 1; off >>= 1)
            acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], off));
}

/* a (index ia) ranks before b (index ib): larger first, NaN last, lower index on ties. */
__device__ __forceinline__ bool ranks_before(float a, int64_t ia, float b, int64_t ib)
{
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b)) return true;
    if (a != b) return a > b;
    return ia < ib;
}

/* ==== kernels ================================================================================ */

__global__ void k_round(const float *x, float *xa, int64_t n, int act)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) xa[i] = round_act(x[i], act);
}

__global__ void k_round16(const float *x, float *xa, uint16_t *x16, int64_t n, int act)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = round_act(x[i], act);
    xa[i] = v;
    x16[i] = act == 1 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__global__ void k_linear(cu_lin W, int64_t r0, int64_t nrows, const float *x, int64_t x_ld, int64_t M, float *y,
                         int64_t y_ld)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= nrows) return; /* whole warp leaves together */
    for (int64_t t0 = 0; t0 < M; t0 += LIN_TOKENS) {
        const int nt = M - t0 < LIN_TOKENS ? (int)(M - t0) : LIN_TOKENS;
        float acc[LIN_TOKENS];
        warp_dot<LIN_TOKENS>(W, 0, r0 + r, 0, W.cols, x + t0 * x_ld, x_ld, nt, lane, acc);
        if (lane == 0)
            for (int t = 0; t < nt; t++) y[(t0 + t) * y_ld + r] = acc[t];
    }
}

#define ROUTE_THREADS 256
#define ROUTE_WARPS (ROUTE_THREADS / 32)

/* One block per token: the max and the exponentials in parallel, their sum in a fixed tree
 * order (not the reference's ascending order: a probability can differ from the reference's
 * by rounding), then a bitonic sort of (p_i, i) in the total order of ranks_before (the
 * reference's top-k order: larger first, NaN last, lower index on ties; padding entries last),
 * whose first k entries are the top-k. */
__global__ void __launch_bounds__(ROUTE_THREADS) k_route(const float *logits, int64_t ld, int64_t E, int64_t N,
                                                         int64_t k, bool renorm, int32_t *ids, float *weights)
{
    /* shared: kv [N] probabilities (the sort keys), ki [N] expert ids (-1 for padding) */
    extern __shared__ float kv[];
    int32_t *ki = reinterpret_cast<int32_t *>(kv + N);
    __shared__ float sv[ROUTE_WARPS];
    __shared__ float m_s, s_s;
    const int tid = threadIdx.x;
    const int64_t t = blockIdx.x;
    const float *l = logits + t * ld;
    /* max: the reference's scan (m = l[0]; m = l[i] when l[i] > m or m is NaN) equals the
     * plain maximum when no logit is NaN; with a NaN anywhere thread 0 runs the scan itself. */
    float m = -INFINITY;
    int nan = 0;
    for (int64_t i = tid; i < E; i += ROUTE_THREADS) {
        const float v = l[i];
        if (isnan(v)) nan = 1;
        else m = fmaxf(m, v);
    }
    nan = __syncthreads_or(nan);
    for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((tid & 31) == 0) sv[tid >> 5] = m;
    __syncthreads();
    if (tid == 0) {
        float mm = sv[0];
        for (int w = 1; w < ROUTE_WARPS; w++) mm = fmaxf(mm, sv[w]);
        if (nan) {
            mm = l[0];
            for (int64_t i = 1; i < E; i++)
                if (l[i] > mm || isnan(mm)) mm = l[i];
        }
        m_s = mm;
    }
    __syncthreads();
    m = m_s;
    /* exponentials, and their sum in a fixed tree order: each thread adds its experts
     * ascending, then the lanes of a warp by a xor butterfly, then the warps in order */
    float part = 0.0f;
    for (int64_t i = tid; i < N; i += ROUTE_THREADS) {
        if (i < E) {
            const float e = (float)exp((double)__fsub_rn(l[i], m));
            kv[i] = e;
            ki[i] = (int32_t)i;
            part = __fadd_rn(part, e);
        } else {
            kv[i] = NAN;
            ki[i] = -1;
        }
    }
    for (int off = 16; off >= 1; off >>= 1) part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, off));
    if ((tid & 31) == 0) sv[tid >> 5] = part;
    __syncthreads();
    if (tid == 0) {
        float sum = sv[0];
        for (int w = 1; w < ROUTE_WARPS; w++) sum = __fadd_rn(sum, sv[w]);
        s_s = sum;
    }
    __syncthreads();
    const float s = s_s;
    for (int64_t i = tid; i < E; i += ROUTE_THREADS) kv[i] = __fdiv_rn(kv[i], s);
    __syncthreads();
    /* bitonic sort, ranks_before order ascending ("first" = best) */
    for (int64_t size = 2; size <= N; size <<= 1) {
        for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
            for (int64_t q = tid; q < N / 2; q += ROUTE_THREADS) {
                const int64_t i = 2 * q - (q & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0;
                const float va = kv[i], vb = kv[j];
                const int32_t ia = ki[i], ib = ki[j];
                const bool a_first = ia >= 0 && (ib < 0 || ranks_before(va, ia, vb, ib));
                const bool b_first = ib >= 0 && (ia < 0 || ranks_before(vb, ib, va, ia));
                if (up ? b_first : a_first) {
                    kv[i] = vb;
                    kv[j] = va;
                    ki[i] = ib;
                    ki[j] = ia;
                }
            }
            __syncthreads();
        }
    }
    if (tid == 0 && renorm) {
        float sk = 0.0f;
        for (int64_t j = 0; j < k; j++) sk = __fadd_rn(sk, kv[j]);
        for (int64_t j = 0; j < k; j++) kv[j] = __fdiv_rn(kv[j], sk);
    }
    __syncthreads();
    for (int64_t j = tid; j < k; j += ROUTE_THREADS) {
        ids[t * k + j] = ki[j];
        weights[t * k + j] = kv[j];
    }
}

__global__ void k_w13(cu_lin gate, cu_lin up, int64_t r0, int64_t il, const int32_t *ids, int64_t k,
                      const float *xa, int64_t H, int act, float *out)
{
    const int lane = threadIdx.x & 31;
    const int64_t c = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t s = blockIdx.y;
    if (c >= il) return;
    const int64_t e = ids ? ids[s] : 0;
    const float *x = xa + (s / k) * H;
    float g[1], u[1];
    warp_dot<1>(gate, e, r0 + c, 0, H, x, H, 1, lane, g);
    warp_dot<1>(up, e, r0 + c, 0, H, x, H, 1, lane, u);
    if (lane == 0) {
        const double d = (double)g[0];
        const float silu = (float)(d / (1.0 + exp(-d)));
        out[s * il + c] = round_act(__fmul_rn(silu, u[0]), act);
    }
}

__global__ void k_w2(cu_lin down, int64_t c0, int64_t il, const int32_t *ids, const float *a, int64_t H, int act,
                     float *y)
{
    const int lane = threadIdx.x & 31;
    const int64_t h = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int64_t s = blockIdx.y;
    if (h >= H) return;
    const int64_t e = ids ? ids[s] : 0;
    float acc[1];
    warp_dot<1>(down, e, h, c0, il, a + s * il, il, 1, lane, acc);
    if (lane == 0) y[s * H + h] = round_act(acc[0], act);
}

__global__ void k_combine(const float *weights, const float *eout, int64_t k, const float *sgdot, int64_t sg_ld,
                          const float *sh_out, int64_t M, int64_t H, int act, int mode, float *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * H) return;
    const int64_t t = i / H, h = i % H;
    float acc = 0.0f;
#pragma unroll 8
    for (int64_t j = 0; j < k; j++)
        acc = __fadd_rn(acc, __fmul_rn(__ldg(weights + t * k + j), __ldg(eout + (t * k + j) * H + h)));
    if (sgdot) {
        const float sg = (float)(1.0 / (1.0 + exp(-(double)sgdot[t * sg_ld])));
        acc = __fadd_rn(acc, __fmul_rn(sg, sh_out[t * H + h]));
    }
    const float v = round_act(acc, act);
    out[i] = mode == 0 ? v : __fadd_rn(out[i], v);
}

/* ==== launchers ============================================================================== */

static unsigned blocks_for(int64_t n, int64_t per) { return (unsigned)((n + per - 1) / per); }

td_status cu_moe_round(const float *x, float *xa, int64_t n, int act, cudaStream_t s, td_err *err)
{
    if (n <= 0) return TD_OK;
    k_round<<<blocks_for(n, 256), 256, 0, s>>>(x, xa, n, act);
    TD_CU_LAUNCHED(err, "k_round");
    return TD_OK;
}

td_status cu_moe_round16(const float *x, float *xa, uint16_t *x16, int64_t n, int act, cudaStream_t s, td_err *err)
{
    if (n <= 0) return TD_OK;
    if (act != 1 && act != 2) return td_err_set(err, TD_ERR_ARG, "cuda moe: 16-bit copy of a non-16-bit act dtype");
    k_round16<<<blocks_for(n, 256), 256, 0, s>>>(x, xa, x16, n, act);
    TD_CU_LAUNCHED(err, "k_round16");
    return TD_OK;
}

td_status cu_moe_linear(cu_lin W, int64_t r0, int64_t nrows, const float *x, int64_t x_ld, int64_t M,
                        float *y, int64_t y_ld, cudaStream_t s, td_err *err)
{
    if (nrows <= 0 || M <= 0) return TD_OK;
    k_linear<<<blocks_for(nrows, WARPS), THREADS, 0, s>>>(W, r0, nrows, x, x_ld, M, y, y_ld);
    TD_CU_LAUNCHED(err, "k_linear");
    return TD_OK;
}

td_status cu_moe_route(const float *logits, int64_t ld, int64_t M, int64_t E, int64_t k, bool renorm, int32_t *ids,
                       float *weights, cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    if (E < 1 || k < 1 || k > E || E > 4096)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: routing %lld experts top-%lld is outside the kernel's range",
                          (long long)E, (long long)k);
    int64_t N = 2;
    while (N < E) N <<= 1;
    const size_t smem = (size_t)N * (sizeof(float) + sizeof(int32_t));
    k_route<<<(unsigned)M, ROUTE_THREADS, smem, s>>>(logits, ld, E, N, k, renorm, ids, weights);
    TD_CU_LAUNCHED(err, "k_route");
    return TD_OK;
}

td_status cu_moe_w13(cu_lin gate, cu_lin up, int64_t r0, int64_t il, const int32_t *ids, int64_t k,
                     int64_t nslots, const float *xa, int64_t H, int act, float *out, cudaStream_t s,
                     td_err *err)
{
    if (nslots <= 0 || il <= 0) return TD_OK;
    if (nslots > 65535) return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld slots in one launch", (long long)nslots);
    dim3 grid(blocks_for(il, WARPS), (unsigned)nslots);
    k_w13<<<grid, THREADS, 0, s>>>(gate, up, r0, il, ids, k, xa, H, act, out);
    TD_CU_LAUNCHED(err, "k_w13");
    return TD_OK;
}

td_status cu_moe_w2(cu_lin down, int64_t c0, int64_t il, const int32_t *ids, int64_t nslots, const float *a,
                    int64_t H, int act, float *y, cudaStream_t s, td_err *err)
{
    if (nslots <= 0) return TD_OK;
    if (nslots > 65535) return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld slots in one launch", (long long)nslots);
    dim3 grid(blocks_for(H, WARPS), (unsigned)nslots);
    k_w2<<<grid, THREADS, 0, s>>>(down, c0, il, ids, a, H, act, y);
    TD_CU_LAUNCHED(err, "k_w2");
    return TD_OK;
}

td_status cu_moe_combine(const float *weights, const float *eout, int64_t k, const float *sgdot, int64_t sg_ld,
                         const float *sh_out, int64_t M, int64_t H, int act, int mode, float *out,
                         cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    k_combine<<<blocks_for(M * H, 256), 256, 0, s>>>(weights, eout, k, sgdot, sg_ld, sh_out, M, H, act, mode, out);
    TD_CU_LAUNCHED(err, "k_combine");
    return TD_OK;
}
