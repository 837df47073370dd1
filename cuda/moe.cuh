/* moe.cuh — launchers of the MoE-block kernels (cuda/moe.cu): router, routing (softmax, top-k,
 * renormalization), fused W13 + SwiGLU, W2, and the weighted combine.
 *
 * Numerics (every reduction in a fixed order; no floating-point atomics; each launcher gives
 * the same bits on every call for the same inputs)
 * - Dot products (cu_moe_linear, W13, W2): one warp per output element (or per output row for
 *   a tile of tokens). The reduction index K is cut in 16-element blocks; lane l accumulates
 *   blocks l, l+32, l+64, ... in ascending order, and inside a block the 16 elements in
 *   ascending k, acc = fl32(acc + fl32(w * x)) from +0 (explicit __fmul_rn/__fadd_rn: no FMA
 *   contraction). The 32 lane sums are then added by a xor butterfly (offsets 16, 8, 4, 2,
 *   1); addition is commutative, so every lane ends with the same bits.
 *   NVFP4 weights: w = fl32(e2m1(code) * eff), eff the prepared FP16 effective scale.
 * - Routing (cu_moe_route): one block of 512 threads per token, the reference's arithmetic
 *   (ref/moe.h steps 2-4) except the order of one sum: the max (a block maximum, which equals
 *   the reference's scan unless a logit is NaN, in which case one thread runs the scan),
 *   e_i = fl32(exp(l_i - m)) with exp in double, their sum in a fixed order (thread t adds
 *   experts t, t+512, ... ascending, the lanes of a warp by a xor butterfly, then the 16 warp
 *   sums by a xor butterfly: the reference adds ascending, so the sum and the probabilities can differ from
 *   it by rounding), p_i = e_i / sum, then the top-k in the order "larger first, NaN last,
 *   lower index on ties" (the reference's): slot j holds the j-th best. For E <= 512 and
 *   k <= 32 (the production shape) the top-k is found by one warp without sequential rounds:
 *   a bound T0 (the k-th largest of the 32 lane maxima) leaves a few candidates, and each
 *   candidate's slot is the number of candidates that rank before it (k rounds of arg-best
 *   when more than 128 probabilities tie above T0); from 256 tokens on, one warp per token
 *   does the whole routing (the same sums and the same selection, so the same bits) and the
 *   call's tokens fit the GPU in one wave. Otherwise, without NaN (and k <= 1024),
 *   by selection: the k-th largest bit pattern by a radix selection with block-wide
 *   histograms, then each selected expert's slot by counting those that rank before it; with
 *   NaN by k rounds of arg-best. Both kernels give the same bits. Renormalization adds the k
 *   weights in slot order and divides. At most 4096 experts.
 * - SwiGLU: h = fl32(silu(g) * u), silu in double rounded once, then rounded to act_dtype.
 * - Combine (cu_moe_combine; the arithmetic in combine.cuh, which the routed W2 with the
 *   combine fused in, cu_mm_w2c, shares): per (token, column): sum over slots j = 0..k-1 in
 *   order of fl32(w_j * y_j), then + fl32(sg * y_s), from +0, rounded to act_dtype; with several TP
 *   ranks on one device the rank outputs are added in rank order. The expert outputs y_j (and
 *   the shared expert's y_s) are read as float32 or, from the tensor-core path, as the FP16 /
 *   BF16 bit patterns of the same act-rounded values (exact: the same sums, the same bits);
 *   when H % 4 == 0 a thread takes 4 adjacent columns.
 * Activations are held as float32 values already rounded to act_dtype.
 *
 * Contract
 * - Every launcher enqueues on `stream`, checks the launch (TD_CU_LAUNCHED) and returns a
 *   td_status; none allocates or synchronizes. Pointers are device pointers sized as stated.
 * - `generic` (routing): always the general kernel k_route (kernels=generic), which the
 *   one-warp selection must match bit for bit.
 * - `pdl` (routing, combine): a programmatic dependent launch (common.cuh): the kernel may
 *   start while the previous kernel on the stream runs and waits for it before any access.
 * - `act` is the activation dtype code: 0 fp32, 1 fp16, 2 bf16 (td_act_dtype's values).
 */
#ifndef TD_CUDA_MOE_CUH
#define TD_CUDA_MOE_CUH

#include "common.cuh"

/* x [n] -> xa [n] rounded to act. */
td_status cu_moe_round(const float *x, float *xa, int64_t n, int act, cudaStream_t s, td_err *err);
/* The same, plus x16 [n]: the rounded values as FP16 (act 1) or BF16 (act 2) bit patterns; xa
 * may be NULL (not written). */
td_status cu_moe_round16(const float *x, float *xa, uint16_t *x16, int64_t n, int act, cudaStream_t s, td_err *err);

/* y[t*y_ld + (r - r0)] = W[r] . x[t*x_ld ...] for rows r in [r0, r0 + nrows) of expert 0 and
 * tokens t < M (unrounded dot products: router logits, shared-expert gate). */
td_status cu_moe_linear(cu_lin W, int64_t r0, int64_t nrows, const float *x, int64_t x_ld, int64_t M,
                        float *y, int64_t y_ld, cudaStream_t s, td_err *err);

/* logits [M, ld] (first E columns) -> ids [M, k], weights [M, k] (softmax, top-k, optional
 * renormalization). */
td_status cu_moe_route(const float *logits, int64_t ld, int64_t M, int64_t E, int64_t k, bool renorm, int32_t *ids,
                       float *weights, bool generic, bool pdl, cudaStream_t s, td_err *err);

/* For every slot s < nslots (token s / k, expert ids[s], or expert 0 when ids is NULL):
 * act[s*il + c] = act_dtype(fl32(silu(gate[r0 + c] . x_t) * (up[r0 + c] . x_t))), c < il. */
td_status cu_moe_w13(cu_lin gate, cu_lin up, int64_t r0, int64_t il, const int32_t *ids, int64_t k,
                     int64_t nslots, const float *xa, int64_t H, int act, float *out, cudaStream_t s,
                     td_err *err);

/* For every slot s < nslots: y[s*H + h] = act_dtype(down[h, c0 .. c0+il) . act[s*il ...]). */
td_status cu_moe_w2(cu_lin down, int64_t c0, int64_t il, const int32_t *ids, int64_t nslots, const float *a,
                    int64_t H, int act, float *y, cudaStream_t s, td_err *err);

/* out[t*H + h] (mode 0: =, mode 1: += in rank order) of the combine above; sgdot[t * sg_ld]
 * holds the shared-gate dot product of token t (NULL when there is no shared expert, then
 * the shared outputs are unused). Expert outputs [M*k, H]: eout16 (16-bit patterns of act 1
 * or 2) when not NULL, else eout; shared outputs [M, H]: sh_out16 when not NULL, else sh_out.
 * 16-bit outputs need H % 4 == 0 (TD_ERR_ARG otherwise). */
td_status cu_moe_combine(const float *weights, const float *eout, const uint16_t *eout16, int64_t k,
                         const float *sgdot, int64_t sg_ld, const float *sh_out, const uint16_t *sh_out16, int64_t M,
                         int64_t H, int act, int mode, float *out, bool pdl, cudaStream_t s, td_err *err);

#endif /* TD_CUDA_MOE_CUH */
