/* combine.cuh — the arithmetic of the MoE block's combine, shared by the combine kernel
 * (k_combine, cuda/moe.cu) and the routed W2 with the combine fused in (k_w2c,
 * cuda/moe_mma.cu), so that both give the same bits by construction.
 *
 * Contract (device code only; no state)
 * - cu_from16(u, act): a 16-bit act value (FP16 bits for act 1, BF16 bits for act 2) as float,
 *   exactly.
 * - cu_combine_gate(sgl): the shared expert's gate sigmoid(sgl), computed in double and rounded
 *   once to float.
 * - cu_combine_add(acc, w, y): acc + fl32(w * y), both steps rounded to nearest (no FMA).
 * - cu_round_act(v, act): v rounded to nearest even in act (1 FP16, 2 BF16) and back to float;
 *   act 0 (fp32): v itself. The block's rounding points use it (cuda/moe.cu), the combine's
 *   output among them.
 * The combine of token t, column h: acc = +0; acc = cu_combine_add(acc, w_j, y_j) for the slots
 * j = 0..k-1 in order; then, with a shared expert, acc = cu_combine_add(acc, sg, y_s); the output
 * is acc rounded to act_dtype (cuda/moe.cuh, Numerics).
 */
#ifndef TD_CUDA_COMBINE_CUH
#define TD_CUDA_COMBINE_CUH

#include "common.cuh"

#ifdef __CUDACC__
__device__ __forceinline__ float cu_from16(uint32_t u, int act)
{
    return act == 1 ? __half2float(__ushort_as_half((unsigned short)u)) : __uint_as_float(u << 16);
}

__device__ __forceinline__ float cu_combine_gate(float sgl) { return (float)(1.0 / (1.0 + exp(-(double)sgl))); }

__device__ __forceinline__ float cu_combine_add(float acc, float w, float y) { return __fadd_rn(acc, __fmul_rn(w, y)); }

__device__ __forceinline__ float cu_round_act(float v, int act)
{
    if (act == 1) return __half2float(__float2half_rn(v));
    if (act == 2) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}
#endif

#endif /* TD_CUDA_COMBINE_CUH */
