/* common.cuh — shared pieces of the CUDA engine: error-check macros that turn a failing CUDA
 * call into a td_status, and the device view of one linear layer (cu_lin).
 *
 * Contract
 * - TD_CU_TRY(err, stmt) evaluates a CUDA runtime call; on failure it returns
 *   td_err_set(err, TD_ERR_INTERNAL, "file:line: statement: cudaGetErrorString") from the
 *   enclosing function (which must return td_status). Library code returns errors; it never
 *   exits (STYLE.md §5.1).
 * - TD_CU_LAUNCHED(err, what) checks cudaGetLastError() right after a kernel launch and returns
 *   the same kind of error naming the kernel `what`. Every launch in cuda/ is followed by it.
 * - cu_lin describes a linear layer W [rows, cols] (row = output, col = reduction index) of
 *   one or several experts stored back to back in device memory: NVFP4 (packed E2M1 bytes,
 *   element 2j in the low nibble of byte j, plus one prepared FP16 effective scale per
 *   16-element block, or with raw storage the E4M3 codes and a global per expert) or dense
 *   BF16/F16/F32. Expert e's row r starts at w + e*e_w + r*w_ld bytes (scales at
 *   s + e*e_s + r*s_ld). Plain data: it is passed to kernels by value and owns nothing.
 * - Programmatic dependent launch (PDL): cu_launch(kernel, grid, block, smem, stream, pdl,
 *   args...) launches with cudaLaunchKernelEx; with pdl the kernel may start while the kernel
 *   before it on the stream still runs. Every kernel launched that way calls cu_pdl_wait()
 *   before it touches memory that earlier work writes or reads, and calls cu_pdl_release()
 *   (which lets the next such kernel start) only after that wait, so a kernel that starts
 *   early may rely on everything before its predecessor being complete. Without pdl (or for
 *   a kernel launched with <<<>>>) both calls are no-ops.
 * - Every cu_launch asks for the SM's whole shared memory as the kernel's carveout (the
 *   preferred shared-memory / L1 split), whatever the kernel uses. An SM whose resident blocks
 *   run with a smaller carveout does not take a block that needs more shared memory until it
 *   has drained, so with carveouts left to the driver the blocks of the kernels that run side
 *   by side in the MoE block (router, shared expert, routing, the routed W13 and W2 launched
 *   early as programmatic dependents) kept SMs from the next kernel's blocks; with one
 *   carveout every SM with room can take them (docs/perf.md). A hint to the driver; no number
 *   changes. Kernels launched with <<<>>> (the first of a block, the generic CUDA-core path)
 *   keep the driver's choice.
 * - Bulk copies into shared memory on mbarriers (sm_90): cu_mbar_init / cu_mbar_init_fence,
 *   cu_mbar_expect + cu_bulk_copy (one thread), cu_mbar_wait (the readers; cu_mbar_wait_warp
 *   for a whole warp that reads the buffer after it: the wait, then __syncwarp), on
 *   shared-memory addresses from cu_smem_addr (the decode kernel's rings, bench/gpu/mem_probe).
 */
#ifndef TD_CUDA_COMMON_CUH
#define TD_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" {
#include "td.h"
}

#define TD_CU_TRY(err, stmt)                                                                      \
    do {                                                                                          \
        cudaError_t td_cu_e_ = (stmt);                                                            \
        if (td_cu_e_ != cudaSuccess)                                                              \
            return td_err_set((err), TD_ERR_INTERNAL, "%s:%d: %s: %s", __FILE__, __LINE__, #stmt, \
                              cudaGetErrorString(td_cu_e_));                                      \
    } while (0)

#define TD_CU_LAUNCHED(err, what)                                                                 \
    do {                                                                                          \
        cudaError_t td_cu_e_ = cudaGetLastError();                                                \
        if (td_cu_e_ != cudaSuccess)                                                              \
            return td_err_set((err), TD_ERR_INTERNAL, "%s:%d: launch of %s: %s", __FILE__,        \
                              __LINE__, (what), cudaGetErrorString(td_cu_e_));                    \
    } while (0)

typedef enum cu_wkind { CU_W_NVFP4 = 0, CU_W_BF16, CU_W_F16, CU_W_F32 } cu_wkind;

typedef struct cu_lin {
    int kind;              /* cu_wkind */
    int64_t rows, cols;    /* logical shape of one expert's matrix */
    const uint8_t *w;      /* packed E2M1 (NVFP4) or dense elements, expert 0 row 0 */
    const __half *s;       /* NVFP4 prepared: FP16 effective scales [rows, cols/16] */
    int raw;               /* NVFP4 raw storage: E4M3 codes `sr` (same index as s) and one
                              global per expert `gl`, decoded by cu_raw_eff() */
    int conv;              /* raw: 0 ModelOpt (code x g), 1 compressed-tensors (code / g) */
    const uint8_t *sr;
    const float *gl;
    int64_t w_ld;          /* bytes per row */
    int64_t s_ld;          /* halves per row (NVFP4) */
    int64_t e_w;           /* bytes per expert */
    int64_t e_s;           /* halves per expert (NVFP4) */
} cu_lin;

#ifdef __CUDACC__
#include <cuda_fp8.h>

__device__ __forceinline__ void cu_pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void cu_pdl_release(void) { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* Bulk copies into shared memory completing on an mbarrier (sm_90): one thread arms a buffer's
 * mbarrier with the expected byte count (cu_mbar_expect) and issues the copies
 * (cu_bulk_copy, or cu_bulk_copy_policy with an L2 cache policy); the threads that read the
 * buffer wait for the barrier's phase
 * (cu_mbar_wait). The issue and wait helpers take shared-memory addresses (cu_smem_addr). */
__device__ __forceinline__ uint32_t cu_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cu_mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(cu_smem_addr(bar)) : "memory");
}
/* An mbarrier whose phase completes after n arrivals (cu_mbar_arrive, or cu_mbar_expect,
 * which arrives once) and the bytes announced by cu_mbar_expect. */
__device__ __forceinline__ void cu_mbar_init_n(uint64_t *bar, uint32_t n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(cu_smem_addr(bar)), "r"(n) : "memory");
}
__device__ __forceinline__ void cu_mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cu_mbar_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void cu_mbar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cu_bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* An L2 cache policy under which every access it tags is the first to be evicted: for bytes
 * read once (cu_bulk_copy_policy, cu_ldg_policy), so that they do not displace what is read
 * again. */
__device__ __forceinline__ uint64_t cu_policy_evict_first(void)
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
/* cu_bulk_copy with an L2 cache policy (a hint: the bytes copied are the same). */
__device__ __forceinline__ void cu_bulk_copy_policy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar,
                                                    uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}
/* A read-only 16-byte load (as __ldg) with an L2 cache policy (a hint: the value is the same). */
__device__ __forceinline__ uint4 cu_ldg_policy(const uint4 *p, uint64_t policy)
{
    uint4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}
__device__ __forceinline__ void cu_mbar_wait(uint32_t bar, uint32_t phase)
{
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(phase)
                     : "memory");
    } while (!done);
}

/* cu_mbar_wait by every lane of a warp that then reads the buffer together, followed by
 * __syncwarp(): the lanes leave the wait's loop at different iterations, and the warp reads
 * the buffer joined again. Each lane's own wait already orders its reads after the copy;
 * compute-sanitizer's racecheck reported the reads of lanes that left the loop apart as
 * potential hazards ("invalid async operation synchronization") and reports none with the
 * join (docs/cuda.md, "The decode kernel"). */
__device__ __forceinline__ void cu_mbar_wait_warp(uint32_t bar, uint32_t phase)
{
    cu_mbar_wait(bar, phase);
    __syncwarp();
}

template <typename... P, typename... A>
static inline cudaError_t cu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                                    A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    at[0].val.sharedMemCarveout = cudaSharedmemCarveoutMaxShared;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Raw storage's effective scale, the strict arithmetic of the prepared scales:
 * FP16_rn(fl32(E4M3(code) x g)) (ModelOpt) or FP16_rn(fl32(E4M3(code) / g)) (compressed-tensors),
 * returned as float. */
__device__ __forceinline__ float cu_raw_eff(uint32_t code, float g, int conv)
{
    const __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3);
    const float sc = __half2float(__half(hr));
    const float p = conv ? __fdiv_rn(sc, g) : __fmul_rn(sc, g);
    return __half2float(__float2half_rn(p));
}
#endif

#endif /* TD_CUDA_COMMON_CUH */
