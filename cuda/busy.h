/* busy.h — a GPU kept busy on purpose, for tests of the device work a call leaves unfinished
 * (cuda/busy.cu; tests/gpu/test_cuda_moe.c, cuda_load_completes).
 *
 * Contract:
 * - td_cuda_busy_begin(ms, &b, msg, cap) launches, on a non-blocking stream of its own, a
 *   kernel of two blocks of 1,024 threads per SM that spin on the GPU's global timer for ms
 *   milliseconds: while they run no other block fits an SM (2,048 threads per SM on sm_90), so
 *   kernels queued meanwhile on any stream wait for them. Returns 0, -1 without a CUDA device,
 *   1 on a CUDA error; msg (cap bytes, NUL-terminated) says which. *b is the caller's, to give to
 *   td_cuda_busy_end, which waits for the spin, frees what begin made and returns 0 or 1 (msg
 *   as above). b may be NULL there (nothing to do).
 * - td_cuda_legacy_pending(msg, cap): 1 when the legacy default stream still has work queued or
 *   running, 0 when it is idle, -1 on a CUDA error.
 * - td_cuda_legacy_memset(bytes, &p, msg, cap): a cudaMemset of a fresh device buffer of that
 *   many bytes on the legacy stream, not waited for (the check's control: behind a busy GPU it
 *   must be pending). Returns 0 or 1; td_cuda_free(p, msg, cap) frees
 *   the buffer after the spin ends (0, or 1 and msg).
 */
#ifndef TD_CUDA_BUSY_H
#define TD_CUDA_BUSY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_cuda_busy td_cuda_busy;

int td_cuda_busy_begin(int ms, td_cuda_busy **b, char *msg, size_t cap);
int td_cuda_busy_end(td_cuda_busy *b, char *msg, size_t cap);
int td_cuda_legacy_pending(char *msg, size_t cap);
int td_cuda_legacy_memset(size_t bytes, void **p, char *msg, size_t cap);
int td_cuda_free(void *p, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
