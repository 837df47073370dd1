/* busy.cu — a GPU kept busy on purpose (see busy.h for the contract).
 *
 * Layering: kernel k_busy, launcher and entries below; every CUDA call checked.
 */
#include "busy.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BUSY_THREADS 1024
#define BUSY_BLOCKS_PER_SM 2

struct td_cuda_busy {
    cudaStream_t s;
};

static __device__ __forceinline__ uint64_t busy_now(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Every thread spins until the global timer (ns) has moved ns past its first read (the reads
 * are volatile, so the loop stays). */
__global__ void __launch_bounds__(BUSY_THREADS, BUSY_BLOCKS_PER_SM) k_busy(uint64_t ns)
{
    const uint64_t t0 = busy_now();
    while (busy_now() - t0 < ns) {
    }
}

static int fail(char *msg, size_t cap, const char *what, cudaError_t ce)
{
    snprintf(msg, cap, "%s: %s", what, cudaGetErrorString(ce));
    return 1;
}

extern "C" int td_cuda_busy_begin(int ms, td_cuda_busy **b, char *msg, size_t cap)
{
    *b = NULL;
    int n = 0, sms = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        snprintf(msg, cap, "no CUDA device");
        return -1;
    }
    cudaError_t ce = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (ce != cudaSuccess) return fail(msg, cap, "cudaDeviceGetAttribute", ce);
    td_cuda_busy *h = (td_cuda_busy *)calloc(1, sizeof *h);
    if (!h) {
        snprintf(msg, cap, "out of memory");
        return 1;
    }
    ce = cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        free(h);
        return fail(msg, cap, "cudaStreamCreateWithFlags", ce);
    }
    k_busy<<<sms * BUSY_BLOCKS_PER_SM, BUSY_THREADS, 0, h->s>>>((uint64_t)ms * 1000000u);
    ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        cudaStreamDestroy(h->s);
        free(h);
        return fail(msg, cap, "launching k_busy", ce);
    }
    *b = h;
    snprintf(msg, cap, "%d blocks of %d threads for %d ms", sms * BUSY_BLOCKS_PER_SM, BUSY_THREADS, ms);
    return 0;
}

extern "C" int td_cuda_busy_end(td_cuda_busy *b, char *msg, size_t cap)
{
    if (!b) return 0;
    cudaError_t ce = cudaStreamSynchronize(b->s);
    const cudaError_t cd = cudaStreamDestroy(b->s);
    free(b);
    if (ce != cudaSuccess) return fail(msg, cap, "waiting for k_busy", ce);
    if (cd != cudaSuccess) return fail(msg, cap, "cudaStreamDestroy", cd);
    snprintf(msg, cap, "ok");
    return 0;
}

extern "C" int td_cuda_legacy_pending(char *msg, size_t cap)
{
    const cudaError_t ce = cudaStreamQuery(cudaStreamLegacy);
    if (ce == cudaSuccess) return 0;
    if (ce == cudaErrorNotReady) return 1;
    fail(msg, cap, "cudaStreamQuery", ce);
    return -1;
}

extern "C" int td_cuda_legacy_memset(size_t bytes, void **p, char *msg, size_t cap)
{
    *p = NULL;
    cudaError_t ce = cudaMalloc(p, bytes);
    if (ce != cudaSuccess) {
        *p = NULL;
        return fail(msg, cap, "cudaMalloc", ce);
    }
    ce = cudaMemset(*p, 0xFF, bytes);
    if (ce != cudaSuccess) return fail(msg, cap, "cudaMemset", ce);
    return 0;
}

extern "C" int td_cuda_free(void *p, char *msg, size_t cap)
{
    if (!p) return 0;
    const cudaError_t ce = cudaFree(p);
    return ce != cudaSuccess ? fail(msg, cap, "cudaFree", ce) : 0;
}
