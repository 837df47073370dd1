/* nvfp4_layout.h — checks of the tensor-core path's layouts (cuda/moe_mma.cu): the NVFP4 word
 * placements (host; the BF16 one's multiplication on the GPU), the input layout of
 * cu_mm_round_split (GPU) and the group arrays of cu_mm_group (GPU).
 *
 * Contract: td_cuda_nvfp4_layout_check() packs codes with the packer's bit placements (FP16
 * and BF16, moe_mma.cuh) and decodes them with the kernels' own integer decodes (the same
 * inline functions, run on the host): the eight placements of a word must tile its 32 bits,
 * and each A-fragment register must decode every pair of its codes, under several contents of
 * the other six codes, to the FP16 bits of e2m1 x 2^-14 (FP16 placement) or the BF16 bits of
 * e2m1 x 2^-126 (BF16 placement), compared as floats with the E2M1 table of core/formats.h,
 * signed zero included. Returns 0 and writes "ok" into msg, or 1 and describes the first
 * mismatch (cap bytes at most, NUL-terminated). broken = 1 (FP16) or 2 (BF16) checks a
 * deliberately wrong decode instead (register 2's codes through register 3's decode), which
 * must fail: the check's own test. No GPU is needed; it is built with the CUDA objects.
 */
#ifndef TD_CUDA_NVFP4_LAYOUT_H
#define TD_CUDA_NVFP4_LAYOUT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int td_cuda_nvfp4_layout_check(int broken, char *msg, size_t cap);

/* The BF16 placement's decode on the GPU (cuda/moe_mma.cu, e2m1x2_act for BF16: the integer
 * decode to E2M1 x 2^-126, taken as it is): every code pair of every register, under the same
 * backgrounds as the host check, must give the BF16 bits of E2M1 x 2^-126 (core/formats.h's
 * conversion of td_e2m1_to_f32's value; signed zero and the 0.5 code's subnormal included).
 * Returns 0 ("ok"), 1 and the first mismatch, or -1 without a CUDA device. broken = 1 decodes
 * register 2's words with register 3's decode, which must fail. */
int td_cuda_nvfp4_bf16_check(int broken, char *msg, size_t cap);

/* The staging of BF16 inputs for NVFP4 weights on the GPU (cuda/moe_mma.cu, bf16_row_shift,
 * bf16x2_pow2, bf16_row_unscale): the shift of every exponent field (the largest s <= 112 with
 * e + s <= 254, 0 for infinities and NaNs) and its epilogue factor 2^(126 - s), and every BF16
 * pattern times 2^s for s in {0, 1, 7, 8, 64, 111, 112} wherever the product is finite, against
 * the host's exact products (subnormals, signed zeros and infinities included; a NaN any NaN).
 * Returns as td_cuda_nvfp4_bf16_check; broken = 1 expects 2^8 for the shift 7 and broken = 2 a
 * shift one too large for field 200, both of which must fail. */
int td_cuda_bf16_row_scale_check(int broken, char *msg, size_t cap);

/* Check of cu_mm_round_split (cuda/moe_mma.cuh) on the GPU: seeded inputs with edge values
 * (signed zeros, FP16 / BF16 subnormals and overflow, infinities, NaN, rounding ties) at
 * several shapes (1 to 300 tokens, columns padded to the stages or not), FP16 and BF16;
 * outputs poisoned, with canaries past them. x16 and xa must be the host's RNE conversions
 * (core/formats.h; NaNs of any payload), and every 2 bytes of the k_wgp layout the input's
 * BF16 hi / lo split (FP16) or its bits (BF16) at the offset the layout's formula gives, zeros
 * for padding, nothing past it. Returns 0 ("ok"), 1 and the first mismatch, or -1 without a
 * CUDA device. broken = 1 computes the reference offsets with the piece's two roles swapped,
 * which must fail: the check's own test. */
int td_cuda_round_split_check(int broken, char *msg, size_t cap);

/* Check of cu_mm_round_stage (cuda/moe_mma.cuh) on the GPU: the inputs of the check above at 1
 * to 255 tokens and 64 to 2,560 columns (padded to the staged row or not), FP16 and BF16,
 * outputs poisoned: x16 and xa the host's RNE conversions, every word of the image's planes the
 * input's BF16 hi / lo split (FP16) or its bits (BF16) at the word the staged-row formula gives,
 * zeros past H, nothing past the image; then k_mm on a BF16 matrix with F32 outputs, once
 * staging its rows itself and once copying them from the image (cu_mm_call::xst): the same
 * bits, every output written and nothing past them. broken = 1 takes the formula with two of
 * its roles swapped, broken = 2 gives k_mm an image 16 words off; both must fail. */
int td_cuda_round_stage_check(int broken, char *msg, size_t cap);

/* Check of cu_mm_group (grouped dispatch's arrays; cuda/moe_mma.cuh) on the GPU: seeded routes
 * of five patterns (distinct top-10 experts per token; few experts with repeats and ids outside
 * [0, E); all on one expert; descending experts; s mod 17), 1 to 10,240 slots, 8, 512 and
 * 3,000 experts, the engine's packs (td_group_pack), with the small-call kernel and with the
 * general one (`generic`). Every output poisoned first: n_groups, g_mat, g_start, g_count and
 * perm must equal a host counting sort (experts ascending, each expert's slots in ascending
 * slot order, packs of P) element for element, and nothing past the groups and the valid
 * slots may be written. Returns 0 ("ok"), 1 and the first mismatch, or -1 without a CUDA
 * device. broken = 1 takes each expert's slots in descending order in the reference, which
 * must fail: the check's own test. */
int td_cuda_group_check(int broken, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
