/* nvfp4_layout.h — host check of the tensor-core path's NVFP4 word layout (cuda/moe_mma.cu).
 *
 * Contract: td_cuda_nvfp4_layout_check() packs codes with the packer's bit placement and
 * decodes them with the kernels' own decode (the same inline function, run on the host): the
 * eight placements of a word must tile its 32 bits, and each A-fragment register must decode
 * every pair of its codes, under several contents of the other six codes, to the FP16 bits of
 * e2m1 x 2^-14 (compared as floats with the E2M1 table of core/formats.h, signed zero
 * included). Returns 0 and writes "ok" into msg, or 1 and describes the first mismatch (cap
 * bytes at most, NUL-terminated). broken = 1 checks a deliberately wrong decode instead
 * (register 2's codes through register 3's decode), which must fail: the check's own test.
 * No GPU is needed; it is built with the CUDA objects.
 */
#ifndef TD_CUDA_NVFP4_LAYOUT_H
#define TD_CUDA_NVFP4_LAYOUT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int td_cuda_nvfp4_layout_check(int broken, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
