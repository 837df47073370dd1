/* moe.cu — the MoE-block kernels and their launchers (see moe.cuh for the numerics).
 *
 * Layering: kernels (k_*) take plain device pointers and read threadIdx/blockIdx only at the
 * top; the device helpers below take the lane index as an argument; launchers (cu_moe_*)
 * choose the grid, launch on the caller's stream and check the launch.
 */
#include "moe.cuh"
#include "combine.cuh"
#include "timeline.cuh"

/* Warps per block of the dot-product kernels: 8 warps give every scheduler of an SM two
 * warps to switch between while one waits on a weight load. */
#define WARPS 8
#define THREADS (WARPS * 32)
/* Tokens per pass of cu_moe_linear: one weight row read serves this many dot products. */
#define LIN_TOKENS 8

__constant__ float c_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* ==== device helpers ========================================================================= */


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
    const cu_tl_guard tl_(CU_TL_ROUND);
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) xa[i] = cu_round_act(x[i], act);
}

__global__ void k_round16(const float *x, float *xa, uint16_t *x16, int64_t n, int act)
{
    const cu_tl_guard tl_(CU_TL_ROUND);
    cu_pdl_release(); /* the router may launch now; it waits for this kernel before reading */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = cu_round_act(x[i], act);
    if (xa) xa[i] = v;
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

#define ROUTE_THREADS 512
#define ROUTE_WARPS (ROUTE_THREADS / 32)
/* Experts per thread, at most (E <= ROUTE_THREADS * ROUTE_PER). */
#define ROUTE_PER 8
/* Largest k of the block-wide selection (route_select); larger k take the rounds. */
#define ROUTE_SELECT_K 1024

/* The best (under ranks_before) of a lane's offers across its warp; every lane ends with the
 * same winner (ranks_before is a strict total order on distinct indices; -1 = no offer). */
__device__ __forceinline__ void warp_best(float &v, int &i)
{
    for (int off = 16; off >= 1; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (oi >= 0 && (i < 0 || ranks_before(ov, oi, v, i))) {
            v = ov;
            i = oi;
        }
    }
}

/* The top-k of probabilities without NaN (all >= +0, so their bit patterns order like their
 * values), on the whole block: T = the k-th largest bit pattern, found by a radix selection
 * (four histogram passes); the experts above T and the lowest-index ones equal to T (as many
 * as needed) are the top-k; each finds its slot by counting the selected experts that
 * rank before it (ranks_before). Same result as k rounds of arg-best. */
__device__ void route_select(const float p[ROUTE_PER], int E, int k, bool renorm, int lane, int w, int64_t t,
                             float *sh, int32_t *ids, float *weights)
{
    __shared__ int n_sel, eq_cnt[ROUTE_PER][ROUTE_WARPS], hist[256], digit_s, need_s;
    __shared__ float sk_s;
    float *sel_v = sh;                                   /* [k] */
    int *sel_i = reinterpret_cast<int *>(sh + k);        /* [k] */
    float *out_v = sh + 2 * k;                           /* [k] */
    const int tid = threadIdx.x;
    uint32_t bits[ROUTE_PER];
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++) bits[j] = tid + j * ROUTE_THREADS < E ? __float_as_uint(p[j]) : 0u;
    /* T by radix selection, 8 bits at a time from bit 30 (bit 31, the sign, is 0): a histogram
     * of the next digit over the experts matching the digits so far, then the digit where
     * the count from the top reaches the number still needed */
    uint32_t T = 0, tmask = 0;
    int need = k;
    for (int pass = 0; pass < 4; pass++) {
        const int shift = pass < 3 ? 23 - 8 * pass : 0, width = pass < 3 ? 8 : 7;
        const uint32_t dmask = (1u << width) - 1u;
        for (int b = tid; b < 256; b += ROUTE_THREADS) hist[b] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ROUTE_PER; j++) {
            if (j * ROUTE_THREADS >= E) break; /* uniform */
            /* one atomic per distinct digit of the warp (probabilities share few exponents) */
            const bool in = tid + j * ROUTE_THREADS < E && (bits[j] & tmask) == T;
            const int d = in ? (int)((bits[j] >> shift) & dmask) : -1;
            const unsigned peers = __match_any_sync(0xffffffffu, d);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[d], __popc(peers));
        }
        __syncthreads();
        if (w == 0) {
            /* lane l holds digits 8l .. 8l+7; counts above each digit from the top */
            int c[8], tot = 0;
#pragma unroll
            for (int b = 7; b >= 0; b--) {
                c[b] = hist[8 * lane + b];
                tot += c[b];
            }
            int incl = tot; /* sum over lanes >= lane */
            for (int off = 1; off < 32; off <<= 1) {
                const int o = __shfl_down_sync(0xffffffffu, incl, off);
                if (lane + off < 32) incl += o;
            }
            int above_lane = incl - tot; /* lanes > lane */
#pragma unroll
            for (int b = 7; b >= 0; b--) {
                if (above_lane < need && above_lane + c[b] >= need) {
                    digit_s = 8 * lane + b;
                    need_s = need - above_lane;
                }
                above_lane += c[b];
            }
        }
        __syncthreads();
        T |= (uint32_t)digit_s << shift;
        tmask |= dmask << shift;
        need = need_s;
        __syncthreads(); /* digit_s and need_s are rewritten by the next pass */
    }
    const int need_eq = need; /* >= 1: the experts equal to T still to take */
    /* index order of the experts equal to T: j-major, then thread */
    if (tid == 0) n_sel = 0;
    unsigned eq_mask[ROUTE_PER];
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++) {
        eq_mask[j] = __ballot_sync(0xffffffffu, tid + j * ROUTE_THREADS < E && bits[j] == T);
        if (lane == 0) eq_cnt[j][w] = __popc(eq_mask[j]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++) {
        const int i = tid + j * ROUTE_THREADS;
        if (i >= E) continue;
        bool take = bits[j] > T;
        if (bits[j] == T) {
            int before = __popc(eq_mask[j] & ((1u << lane) - 1u));
            for (int jj = 0; jj <= j; jj++)
                for (int ww = 0; ww < (jj < j ? ROUTE_WARPS : w); ww++) before += eq_cnt[jj][ww];
            take = before < need_eq;
        }
        if (take) { /* the arrival order is free: the slots come from the ranks below */
            const int at = atomicAdd(&n_sel, 1);
            sel_v[at] = p[j];
            sel_i[at] = i;
        }
    }
    __syncthreads();
    for (int a = tid; a < k; a += ROUTE_THREADS) {
        const float va = sel_v[a];
        const int ia = sel_i[a];
        int r = 0;
        for (int b = 0; b < k; b++) r += ranks_before(sel_v[b], sel_i[b], va, ia);
        ids[t * k + r] = ia;
        out_v[r] = va;
    }
    __syncthreads();
    if (renorm && tid == 0) {
        float sk = 0.0f;
        for (int j = 0; j < k; j++) sk = __fadd_rn(sk, out_v[j]);
        sk_s = sk;
    }
    __syncthreads();
    for (int j = tid; j < k; j += ROUTE_THREADS)
        weights[t * k + j] = renorm ? __fdiv_rn(out_v[j], sk_s) : out_v[j];
}

/* The best (under ranks_before) of this thread's experts tid + 512 j not in `taken` (bit j);
 * bi = -1 when none is left. */
__device__ __forceinline__ void own_best(const float p[ROUTE_PER], unsigned taken, int tid, int E, float &bv, int &bi)
{
    bi = -1;
    bv = 0.0f;
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++) {
        const int q = tid + j * ROUTE_THREADS;
        if (q < E && !(taken >> j & 1u) && (bi < 0 || ranks_before(p[j], q, bv, bi))) {
            bv = p[j];
            bi = q;
        }
    }
}

/* One block of 512 threads per token; thread t owns experts t, t+512, ... (at most 8, kept in
 * registers). The max and the exponentials in parallel; their sum in a fixed order (thread t
 * adds its experts ascending, the lanes of a warp by a xor butterfly, then the 16 warp sums
 * by a xor butterfly: the reference adds ascending, so a probability can differ from it by
 * rounding). The top-k, in the order of ranks_before (the reference's): without NaN and for
 * k <= ROUTE_SELECT_K by route_select; otherwise in two stages: every warp lists its own
 * experts' best min(k, n) in order (k rounds of a warp-wide arg-best, the owner of each winner
 * offering its next best), then warp 0 merges the 16 lists (k rounds over the list heads). */
__global__ void __launch_bounds__(ROUTE_THREADS) k_route(const float *logits, int64_t ld, int E, int k, int lk,
                                                         bool renorm, int32_t *ids, float *weights)
{
    const cu_tl_guard tl_(CU_TL_ROUTE);
    extern __shared__ float route_sh[];          /* ROUTE_WARPS lists of lk (value, index) */
    float *lv = route_sh;
    int *li = reinterpret_cast<int *>(route_sh + ROUTE_WARPS * lk);
    __shared__ float red[ROUTE_WARPS];
    __shared__ float bcast;
    __shared__ int any_nan;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t t = blockIdx.x;
    const float *l = logits + t * ld;
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    float p[ROUTE_PER];
    float m = -INFINITY;
    int nan = 0;
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++) {
        const int i = tid + j * ROUTE_THREADS;
        p[j] = i < E ? l[i] : 0.0f;
        if (i < E) {
            if (isnan(p[j])) nan = 1;
            else m = fmaxf(m, p[j]);
        }
    }
    /* max: the reference's scan (m = l[0]; m = l[i] when l[i] > m or m is NaN) equals the
     * plain maximum when no logit is NaN; with a NaN anywhere thread 0 runs the scan itself. */
    if (tid == 0) any_nan = 0;
    for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) red[w] = m;
    __syncthreads();
    if (nan) any_nan = 1;
    if (w == 0) {
        float mm = lane < ROUTE_WARPS ? red[lane] : -INFINITY;
        for (int off = ROUTE_WARPS / 2; off >= 1; off >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, off));
        if (lane == 0) bcast = mm;
    }
    __syncthreads();
    if (any_nan && tid == 0) {
        float mm = l[0];
        for (int i = 1; i < E; i++)
            if (l[i] > mm || isnan(mm)) mm = l[i];
        bcast = mm;
    }
    __syncthreads();
    m = bcast;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++)
        if (tid + j * ROUTE_THREADS < E) {
            p[j] = (float)exp((double)__fsub_rn(p[j], m));
            part = __fadd_rn(part, p[j]);
        }
    for (int off = 16; off >= 1; off >>= 1) part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, off));
    __syncthreads(); /* everyone has read bcast */
    if (lane == 0) red[w] = part;
    __syncthreads();
    if (w == 0) { /* the 16 warp sums by a xor butterfly over lanes 0..15 */
        float sum = lane < ROUTE_WARPS ? red[lane] : 0.0f;
        for (int off = ROUTE_WARPS / 2; off >= 1; off >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
        if (lane == 0) bcast = sum;
    }
    __syncthreads();
    const float sum = bcast;
    /* probabilities */
    int pnan = 0;
#pragma unroll
    for (int j = 0; j < ROUTE_PER; j++)
        if (tid + j * ROUTE_THREADS < E) {
            p[j] = __fdiv_rn(p[j], sum);
            pnan |= isnan(p[j]);
        }
    if (!__syncthreads_or(pnan) && k <= ROUTE_SELECT_K) {
        route_select(p, E, k, renorm, lane, w, t, route_sh, ids, weights);
        return;
    }
    /* with a NaN probability (or k > ROUTE_SELECT_K): k rounds of arg-best; each thread's best
     * untaken expert */
    unsigned taken = 0;
    float bv;
    int bi;
    own_best(p, taken, tid, E, bv, bi);
    /* stage 1: this warp's list (lk = min(k, experts per warp) entries; -1 ends a short list) */
    for (int r = 0; r < lk; r++) {
        float v = bv;
        int i = bi;
        warp_best(v, i);
        if (lane == 0) {
            lv[w * lk + r] = v;
            li[w * lk + r] = i;
        }
        if (i >= 0 && i % ROUTE_THREADS == tid) {
            taken |= 1u << (i / ROUTE_THREADS);
            own_best(p, taken, tid, E, bv, bi);
        }
    }
    __syncthreads();
    if (w != 0) return;
    /* stage 2: warp 0 merges the lists; lane q < ROUTE_WARPS offers the head of list q */
    int h = 0;
    float hv = 0.0f;
    int hi = -1;
    if (lane < ROUTE_WARPS) {
        hv = lv[lane * lk];
        hi = li[lane * lk];
    }
    float sk = 0.0f;
    for (int j = 0; j < k; j++) {
        float v = hv;
        int i = hi;
        warp_best(v, i);
        if (lane == 0) {
            ids[t * k + j] = i;
            weights[t * k + j] = v;
            sk = __fadd_rn(sk, v);
        }
        if (lane < ROUTE_WARPS && i >= 0 && i == hi) {
            h++;
            hi = h < lk ? li[lane * lk + h] : -1;
            hv = h < lk ? lv[lane * lk + h] : 0.0f;
        }
    }
    if (renorm) {
        sk = __shfl_sync(0xffffffffu, sk, 0);
        __syncwarp();
        for (int j = lane; j < k; j += 32) weights[t * k + j] = __fdiv_rn(weights[t * k + j], sk);
    }
}

/* Candidates above which route_small's selection takes k rounds instead (many equal
 * probabilities: the ranking of n candidates costs n^2 / 32 comparisons per lane). */
#define RS_CAND_MAX 128

/* The best untaken expert of lane `lane`'s 16 (lane + 32 j, j ascending: the lowest index
 * wins a tie), as key = bit pattern + 1 (probabilities >= +0, not NaN: keys order like
 * values; 0: none left) and its j. */
__device__ __forceinline__ void lane_best(const uint32_t b[16], uint32_t taken, uint32_t &key, int &bj)
{
    key = 0;
    bj = 0;
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (!(taken >> j & 1u) && b[j] + 1u > key) {
            key = b[j] + 1u;
            bj = j;
        }
}

/* The top-k of one token on one warp, in the reference's order (larger first, lower index on
 * ties): lane l holds the bit patterns b[j] of experts l + 32 j (probabilities >= +0, no NaN;
 * bit j of `taken` set for the experts past E, whose b[j] is 0) and their largest, lmax. Lane
 * r < k ends with slot r's value mv and expert mi. T0 = the k-th largest of the 32 lane maxima
 * (a bitonic sort across the lanes); at least k experts are >= T0, so the top-k are among the
 * candidates >= T0, listed in cand; a candidate's slot is the number of candidates that rank
 * before it. With more than RS_CAND_MAX candidates (many equal probabilities) k rounds of a
 * warp arg-best instead. cand, slot_v, slot_i: this warp's shared memory. */
__device__ __forceinline__ void route_topk(uint32_t b[16], uint32_t taken, uint32_t lmax, int k, int lane, uint2 *cand,
                                           float *slot_v, int *slot_i, float &mv, int &mi)
{
    /* bitonic sort of the lane maxima, descending across lanes (a lane without experts
     * holds 0, which only lowers the bound) */
    uint32_t v = lmax;
    for (int size = 2; size <= 32; size <<= 1)
        for (int stride = size >> 1; stride >= 1; stride >>= 1) {
            const uint32_t o = __shfl_xor_sync(0xffffffffu, v, stride);
            const bool desc = (lane & size) == 0, lower = (lane & stride) == 0;
            v = (lower == desc) ? max(v, o) : min(v, o);
        }
    const uint32_t T0 = __shfl_sync(0xffffffffu, v, k - 1);
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (!(taken >> j & 1u) && b[j] >= T0) mine |= 1u << j;
    const int c = __popc(mine);
    int incl = c;
    for (int off = 1; off < 32; off <<= 1) {
        const int o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    const int n = __shfl_sync(0xffffffffu, incl, 31);
    if (n <= RS_CAND_MAX) {
        int at = incl - c;
#pragma unroll
        for (int j = 0; j < 16; j++)
            if (mine >> j & 1u) cand[at++] = make_uint2(b[j], (uint32_t)(lane + 32 * j));
        __syncwarp();
        for (int ci = lane; ci < n; ci += 32) {
            const uint2 me = cand[ci];
            int r = 0;
            for (int d = 0; d < n; d++) {
                const uint2 o = cand[d];
                r += o.x > me.x || (o.x == me.x && o.y < me.y);
            }
            if (r < k) {
                slot_v[r] = __uint_as_float(me.x);
                slot_i[r] = (int)me.y;
            }
        }
        __syncwarp();
        if (lane < k) {
            mv = slot_v[lane];
            mi = slot_i[lane];
        }
    } else {
        uint32_t key;
        int bj;
        lane_best(b, taken, key, bj);
        for (int r = 0; r < k; r++) {
            const uint32_t V = __reduce_max_sync(0xffffffffu, key);
            const uint32_t I = __reduce_min_sync(0xffffffffu, key == V ? (uint32_t)(lane + 32 * bj) : 0xffffffffu);
            if (lane == r) {
                mv = __uint_as_float(V - 1u);
                mi = (int)I;
            }
            if ((int)(I & 31u) == lane) {
                taken |= 1u << (I >> 5);
                lane_best(b, taken, key, bj);
            }
        }
    }
}

/* One token's routes from its warp: lane r < k holds slot r's probability mv and expert mi;
 * the k weights renormalized (renorm) by their sum taken in slot order from +0, as the
 * reference sums them. ids, weights: the token's k slots. */
__device__ __forceinline__ void route_store(float mv, int mi, int k, int lane, bool renorm, int32_t *ids,
                                            float *weights)
{
    float sk = 0.0f;
    for (int j = 0; j < k; j++) sk = __fadd_rn(sk, __shfl_sync(0xffffffffu, mv, j));
    if (lane < k) {
        ids[lane] = mi;
        weights[lane] = renorm ? __fdiv_rn(mv, sk) : mv;
    }
}

/* Routing for E <= 512 and k <= 32: one block of 512 threads per token, thread t owns expert
 * t. The softmax is k_route's, with the same bits (its sum order for one expert per thread:
 * the lanes of a warp by a xor butterfly, the 16 warp sums by the same xor tree, which every
 * thread evaluates from shared memory). The top-k, in the reference's order, by warp 0 alone
 * without sequential rounds (route_topk). With a NaN probability every probability is NaN (the
 * sum is NaN), and the reference's order (NaN last, lower index first) gives experts 0..k-1.
 * Calls of ROUTE_WARP_MIN tokens or more take k_route_warp (the same bits). */
__global__ void __launch_bounds__(ROUTE_THREADS) k_route_small(const float *logits, int64_t ld, int E, int k,
                                                               bool renorm, int32_t *ids, float *weights)
{
    const cu_tl_guard tl_(CU_TL_ROUTE);
    __shared__ float pv[ROUTE_THREADS];
    __shared__ float red[2][ROUTE_WARPS];
    __shared__ uint2 cand[RS_CAND_MAX];      /* (bit pattern, expert) */
    __shared__ float slot_v[32];
    __shared__ int slot_i[32];
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t t = blockIdx.x;
    const bool present = tid < E;
    const float x = present ? logits[t * ld + tid] : 0.0f;
    /* with a NaN logit the sum below is NaN, so the max's value does not matter */
    float m = present && !isnan(x) ? x : -INFINITY;
    for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    cu_tl_mark(CU_TL_ROUTE, 0); /* the logits loaded, the warp's max */
    if (lane == 0) red[0][w] = m;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ROUTE_WARPS; i++) m = fmaxf(m, red[0][i]);
    cu_tl_mark(CU_TL_ROUTE, 1); /* the max */
    const float e = present ? (float)exp((double)__fsub_rn(x, m)) : 0.0f;
    float part = __fadd_rn(0.0f, e);
    for (int off = 16; off >= 1; off >>= 1) part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, off));
    cu_tl_mark(CU_TL_ROUTE, 2); /* the exponential, the warp's sum */
    if (lane == 0) red[1][w] = part;
    __syncthreads();
    /* the xor butterfly over the 16 warp sums (offsets 8, 4, 2, 1) as a tree */
    float lvl[ROUTE_WARPS];
#pragma unroll
    for (int i = 0; i < ROUTE_WARPS; i++) lvl[i] = red[1][i];
#pragma unroll
    for (int off = ROUTE_WARPS / 2; off >= 1; off >>= 1)
#pragma unroll
        for (int i = 0; i < off; i++) lvl[i] = __fadd_rn(lvl[i], lvl[i + off]);
    const float sum = lvl[0];
    const float p = present ? __fdiv_rn(e, sum) : 0.0f;
    pv[tid] = p;
    const int pnan = __syncthreads_or(present && isnan(p));
    cu_tl_mark(CU_TL_ROUTE, 3); /* the probabilities */
    if (w != 0) return;
    float mv = 0.0f; /* slot `lane`: value, expert */
    int mi = 0;
    if (pnan) {
        mi = lane;
        mv = lane < E ? pv[lane] : 0.0f;
    } else {
        uint32_t b[16], taken = 0, lmax = 0;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int i = lane + 32 * j;
            b[j] = i < E ? __float_as_uint(pv[i]) : 0u;
            if (i < E) lmax = max(lmax, b[j]);
            else taken |= 1u << j;
        }
        route_topk(b, taken, lmax, k, lane, cand, slot_v, slot_i, mv, mi);
    }
    cu_tl_mark(CU_TL_ROUTE, 4); /* the top-k */
    route_store(mv, mi, k, lane, renorm, ids + t * k, weights + t * k);
}

/* Routing of prefill-sized calls (E <= 512, k <= 32, at least ROUTE_WARP_MIN tokens): one warp
 * per token, ROUTE_WARP_TOKENS tokens per block, no block barrier, so that a call's tokens fit
 * the GPU in one wave (k_route_small's blocks of 512 threads take three waves at 784 tokens).
 * The same bits as k_route_small: lane l holds experts l + 32 j (j = 0..15), the sum of the
 * exponentials is k_route_small's (for each j the xor butterfly over the lanes, then the xor
 * tree over the 16 values of j), and the top-k is route_topk on the same bit patterns. */
#define ROUTE_WARP_TOKENS 8
#define ROUTE_WARP_MIN 256
static_assert(ROUTE_WARPS == 16, "k_route_warp sums 16 values of j as k_route_small sums its 16 warps");
__global__ void __launch_bounds__(ROUTE_WARP_TOKENS * 32) k_route_warp(const float *logits, int64_t ld, int64_t M,
                                                                         int E, int k, bool renorm, int32_t *ids,
                                                                         float *weights)
{
    const cu_tl_guard tl_(CU_TL_ROUTE);
    __shared__ uint2 cand[ROUTE_WARP_TOKENS][RS_CAND_MAX];
    __shared__ float slot_v[ROUTE_WARP_TOKENS][32];
    __shared__ int slot_i[ROUTE_WARP_TOKENS][32];
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * ROUTE_WARP_TOKENS + w;
    if (t >= M) return;
    float x[16];
#pragma unroll
    for (int j = 0; j < 16; j++) x[j] = lane + 32 * j < E ? logits[t * ld + lane + 32 * j] : 0.0f;
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (lane + 32 * j < E && !isnan(x[j])) m = fmaxf(m, x[j]);
    for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float lvl[16]; /* x[j] becomes its exponential */
#pragma unroll
    for (int j = 0; j < 16; j++) {
        x[j] = lane + 32 * j < E ? (float)exp((double)__fsub_rn(x[j], m)) : 0.0f;
        lvl[j] = __fadd_rn(0.0f, x[j]);
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
#pragma unroll
        for (int j = 0; j < 16; j++) lvl[j] = __fadd_rn(lvl[j], __shfl_xor_sync(0xffffffffu, lvl[j], off));
    /* the xor tree over j (offsets 8, 4, 2, 1), each level a loop of constant extent */
#pragma unroll
    for (int j = 0; j < 8; j++) lvl[j] = __fadd_rn(lvl[j], lvl[j + 8]);
#pragma unroll
    for (int j = 0; j < 4; j++) lvl[j] = __fadd_rn(lvl[j], lvl[j + 4]);
#pragma unroll
    for (int j = 0; j < 2; j++) lvl[j] = __fadd_rn(lvl[j], lvl[j + 2]);
    const float sum = __fadd_rn(lvl[0], lvl[1]);
    uint32_t b[16], taken = 0, lmax = 0;
    bool nan_p = false;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const bool present = lane + 32 * j < E;
        const float p = present ? __fdiv_rn(x[j], sum) : 0.0f;
        nan_p |= present && isnan(p);
        b[j] = present ? __float_as_uint(p) : 0u;
        if (present) lmax = max(lmax, b[j]);
        else taken |= 1u << j;
    }
    float mv = 0.0f;
    int mi = 0;
    if (__any_sync(0xffffffffu, nan_p)) {
        mi = lane;
        mv = lane < E ? __uint_as_float(b[0]) : 0.0f;
    } else {
        route_topk(b, taken, lmax, k, lane, cand[w], slot_v[w], slot_i[w], mv, mi);
    }
    route_store(mv, mi, k, lane, renorm, ids + t * k, weights + t * k);
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
        out[s * il + c] = cu_round_act(__fmul_rn(silu, u[0]), act);
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
    if (lane == 0) y[s * H + h] = cu_round_act(acc[0], act);
}

/* The four values of an 8-byte load of 16-bit patterns, in address order. */
__device__ __forceinline__ void from16x4(uint2 v, int act, float f[4])
{
    f[0] = cu_from16(v.x & 0xffffu, act);
    f[1] = cu_from16(v.x >> 16, act);
    f[2] = cu_from16(v.y & 0xffffu, act);
    f[3] = cu_from16(v.y >> 16, act);
}

/* CPT values at index i (a multiple of CPT) of an array held as 16-bit act patterns (U16) or
 * as float, loaded (ld) apart from their conversion to float (cvt): the conversion of a 16-bit
 * pattern depends on act, and a branch on it between two loads would keep the compiler from
 * issuing the loads together. */
template <int CPT, bool U16> struct raw_n;
template <> struct raw_n<1, true> {
    uint32_t v;
    __device__ __forceinline__ void ld(const void *p, int64_t i) { v = __ldg((const uint16_t *)p + i); }
    __device__ __forceinline__ void cvt(int act, float y[1]) const { y[0] = cu_from16(v, act); }
};
template <> struct raw_n<4, true> {
    uint2 v;
    __device__ __forceinline__ void ld(const void *p, int64_t i) { v = __ldg((const uint2 *)((const uint16_t *)p + i)); }
    __device__ __forceinline__ void cvt(int act, float y[4]) const { from16x4(v, act, y); }
};
template <> struct raw_n<1, false> {
    float v;
    __device__ __forceinline__ void ld(const void *p, int64_t i) { v = __ldg((const float *)p + i); }
    __device__ __forceinline__ void cvt(int, float y[1]) const { y[0] = v; }
};
template <> struct raw_n<4, false> {
    float4 v;
    __device__ __forceinline__ void ld(const void *p, int64_t i) { v = __ldg((const float4 *)((const float *)p + i)); }
    __device__ __forceinline__ void cvt(int, float y[4]) const
    {
        y[0] = v.x;
        y[1] = v.y;
        y[2] = v.z;
        y[3] = v.w;
    }
};

/* From this many tokens on, the combine takes four columns per thread (blocks of 128 threads),
 * below one column (blocks of 256): at decode sizes the latency of one thread's loads counts,
 * at prefill sizes the number of requests. */
#define COMBINE_WIDE_M 64
/* Slots whose weights and outputs the combine loads before it adds any of them (the
 * production top-10 in one batch). */
#define COMBINE_BATCH 16

/* The combine (moe.cuh) with CPT adjacent columns per thread (H % CPT == 0), the expert outputs
 * as 16-bit patterns (E16) or float, the shared expert's likewise (S16). With one column per
 * thread (decode sizes) the loads of a batch of COMBINE_BATCH slots and the shared expert's
 * gate and output are issued before any value is converted or added, so that they are in
 * flight together: with the conversion (a branch on act) between them they went one after the
 * other (block 0.2-0.8 us slower at M = 1..16: docs/perf.md). With four columns (prefill sizes)
 * each slot's value is converted as it comes, eight slots unrolled: the batch there was 1%
 * slower at M = 784. The additions keep their order either way. */
template <int CPT, bool E16, bool S16>
__global__ void k_combine(const float *weights, const void *eout, int64_t k, const float *sgdot, int64_t sg_ld,
                          const void *sh_out, int64_t M, int64_t H, int act, int mode, float *out)
{
    const cu_tl_guard tl_(CU_TL_COMBINE);
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    const int64_t HC = H / CPT, q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= M * HC) return;
    const int64_t t = q / HC, h = (q % HC) * CPT;
    float acc[CPT];
#pragma unroll
    for (int i = 0; i < CPT; i++) acc[i] = 0.0f;
    float sgl = 0.0f;
    raw_n<CPT, S16> ys;
    if (CPT == 1) {
        if (sgdot) {
            sgl = __ldg(sgdot + t * sg_ld);
            ys.ld(sh_out, t * H + h);
        }
        for (int64_t j0 = 0; j0 < k; j0 += COMBINE_BATCH) {
            float w[COMBINE_BATCH];
            raw_n<CPT, E16> y[COMBINE_BATCH];
#pragma unroll
            for (int b = 0; b < COMBINE_BATCH; b++)
                if (j0 + b < k) {
                    w[b] = __ldg(weights + t * k + j0 + b);
                    y[b].ld(eout, (t * k + j0 + b) * H + h);
                }
#pragma unroll
            for (int b = 0; b < COMBINE_BATCH; b++)
                if (j0 + b < k) {
                    float v[CPT];
                    y[b].cvt(act, v);
#pragma unroll
                    for (int i = 0; i < CPT; i++) acc[i] = cu_combine_add(acc[i], w[b], v[i]);
                }
        }
    } else {
#pragma unroll 8
        for (int64_t j = 0; j < k; j++) {
            const float w = __ldg(weights + t * k + j);
            raw_n<CPT, E16> y;
            y.ld(eout, (t * k + j) * H + h);
            float v[CPT];
            y.cvt(act, v);
#pragma unroll
            for (int i = 0; i < CPT; i++) acc[i] = cu_combine_add(acc[i], w, v[i]);
        }
        if (sgdot) {
            sgl = sgdot[t * sg_ld];
            ys.ld(sh_out, t * H + h);
        }
    }
    if (sgdot) {
        const float sg = cu_combine_gate(sgl);
        float v[CPT];
        ys.cvt(act, v);
#pragma unroll
        for (int i = 0; i < CPT; i++) acc[i] = cu_combine_add(acc[i], sg, v[i]);
    }
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        const float v = cu_round_act(acc[i], act);
        float *o = out + t * H + h + i;
        *o = mode == 0 ? v : __fadd_rn(*o, v);
    }
}

typedef void (*combine_fn)(const float *, const void *, int64_t, const float *, int64_t, const void *, int64_t,
                           int64_t, int, int, float *);

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
                       float *weights, bool generic, bool pdl, cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    if (E < 1 || k < 1 || k > E || E > ROUTE_THREADS * ROUTE_PER || M > 0x7fffffff)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: routing %lld experts top-%lld is outside the kernel's range",
                          (long long)E, (long long)k);
    if (!generic && E <= ROUTE_THREADS && k <= 32 && M >= ROUTE_WARP_MIN) {
        const int64_t blocks = (M + ROUTE_WARP_TOKENS - 1) / ROUTE_WARP_TOKENS;
        TD_CU_TRY(err, cu_launch(k_route_warp, dim3((unsigned)blocks), dim3(ROUTE_WARP_TOKENS * 32), 0, s, pdl, logits,
                                 ld, M, (int)E, (int)k, renorm, ids, weights));
        TD_CU_LAUNCHED(err, "k_route_warp");
        return TD_OK;
    }
    if (!generic && E <= ROUTE_THREADS && k <= 32) {
        TD_CU_TRY(err, cu_launch(k_route_small, dim3((unsigned)M), dim3(ROUTE_THREADS), 0, s, pdl, logits, ld, (int)E,
                                 (int)k, renorm, ids, weights));
        TD_CU_LAUNCHED(err, "k_route_small");
        return TD_OK;
    }
    /* a warp's list: its best min(k, experts it owns) */
    const int64_t per_warp = ((E + ROUTE_THREADS - 1) / ROUTE_THREADS) * 32;
    const int lk = (int)(k < per_warp ? k : per_warp);
    const size_t lists = (size_t)ROUTE_WARPS * lk * (sizeof(float) + sizeof(int)); /* rounds (NaN) */
    const size_t select = k <= ROUTE_SELECT_K ? (size_t)k * 3 * sizeof(float) : 0; /* route_select */
    const size_t smem = lists > select ? lists : select;
    TD_CU_TRY(err, cu_launch(k_route, dim3((unsigned)M), dim3(ROUTE_THREADS), smem, s, pdl, logits, ld, (int)E, (int)k,
                             lk, renorm, ids, weights));
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

td_status cu_moe_combine(const float *weights, const float *eout, const uint16_t *eout16, int64_t k,
                         const float *sgdot, int64_t sg_ld, const float *sh_out, const uint16_t *sh_out16, int64_t M,
                         int64_t H, int act, int mode, float *out, bool pdl, cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    const bool b16 = eout16 || (sgdot && sh_out16);
    if (b16 && act != 1 && act != 2)
        return td_err_set(err, TD_ERR_ARG, "cuda moe: combine of 16-bit outputs needs act fp16/bf16 (act %d)", act);
    /* four columns per thread pay at prefill sizes only (measured: docs/perf.md) */
    const int cpt = M >= COMBINE_WIDE_M && H % 4 == 0 ? 4 : 1;
    const void *e = eout16 ? (const void *)eout16 : (const void *)eout;
    const void *so = sh_out16 ? (const void *)sh_out16 : (const void *)sh_out;
    const int kind = (eout16 ? 2 : 0) + (sh_out16 ? 1 : 0);
    static const combine_fn k4[4] = {k_combine<4, false, false>, k_combine<4, false, true>, k_combine<4, true, false>,
                                     k_combine<4, true, true>};
    static const combine_fn k1[4] = {k_combine<1, false, false>, k_combine<1, false, true>, k_combine<1, true, false>,
                                     k_combine<1, true, true>};
    const combine_fn kern = cpt == 4 ? k4[kind] : k1[kind];
    const int64_t n = M * (H / cpt);
    const unsigned threads = cpt == 4 ? 128 : 256;
    TD_CU_TRY(err, cu_launch(kern, dim3(blocks_for(n, threads)), dim3(threads), 0, s, pdl, weights, e, k, sgdot, sg_ld,
                             so, M, H, act, mode, out));
    TD_CU_LAUNCHED(err, "k_combine");
    return TD_OK;
}

#ifdef TD_TIMELINE
int cu_moe_timeline(uint64_t *out)
{
    return cu_tl_take(out);
}
#endif
