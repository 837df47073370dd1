/* gpu_timing.cuh — the GPU benches' shared timing (bench/gpu/moe_decode.cu, mem_probe.cu):
 * the median time of graph replays bracketed by events, and the device's copy bandwidth.
 * A failing CUDA call prints the call and its error and exits (benches only). */
#ifndef TD_BENCH_GPU_TIMING_CUH
#define TD_BENCH_GPU_TIMING_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define BENCH_CK(x)                                                                               \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "bench: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* Median time (us) of `iters` calls after 10 warm-up calls, call i replaying g[i % size],
 * each bracketed by events on s. */
static inline double bench_time_graphs(std::vector<cudaGraphExec_t> &g, int iters, cudaStream_t s)
{
    std::vector<cudaEvent_t> ev((size_t)iters + 1);
    for (auto &e : ev) BENCH_CK(cudaEventCreate(&e));
    for (int w = 0; w < 10; w++) BENCH_CK(cudaGraphLaunch(g[(size_t)w % g.size()], s));
    BENCH_CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < iters; i++) {
        BENCH_CK(cudaGraphLaunch(g[(size_t)i % g.size()], s));
        BENCH_CK(cudaEventRecord(ev[(size_t)i + 1], s));
    }
    BENCH_CK(cudaStreamSynchronize(s));
    std::vector<double> t((size_t)iters);
    for (int i = 0; i < iters; i++) {
        float ms;
        BENCH_CK(cudaEventElapsedTime(&ms, ev[(size_t)i], ev[(size_t)i + 1]));
        t[(size_t)i] = ms * 1e3;
    }
    for (auto &e : ev) BENCH_CK(cudaEventDestroy(e));
    std::sort(t.begin(), t.end());
    return iters % 2 ? t[(size_t)iters / 2] : 0.5 * (t[(size_t)iters / 2 - 1] + t[(size_t)iters / 2]);
}

/* Copy bandwidth in bytes/s (read + write): cudaMemcpy device to device of 1 GiB, median of
 * 10 after 2 warm-up copies. */
static inline double bench_copy_bandwidth(cudaStream_t s)
{
    const size_t n = (size_t)1 << 30;
    void *a, *b;
    BENCH_CK(cudaMalloc(&a, n));
    BENCH_CK(cudaMalloc(&b, n));
    BENCH_CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    BENCH_CK(cudaEventCreate(&e0));
    BENCH_CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int i = 0; i < 12; i++) {
        BENCH_CK(cudaEventRecord(e0, s));
        BENCH_CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
        BENCH_CK(cudaEventRecord(e1, s));
        BENCH_CK(cudaEventSynchronize(e1));
        float ms;
        BENCH_CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 2) t.push_back(ms * 1e-3);
    }
    std::sort(t.begin(), t.end());
    BENCH_CK(cudaFree(a));
    BENCH_CK(cudaFree(b));
    BENCH_CK(cudaEventDestroy(e0));
    BENCH_CK(cudaEventDestroy(e1));
    return 2.0 * (double)n / (0.5 * (t[4] + t[5]));
}

#endif /* TD_BENCH_GPU_TIMING_CUH */
