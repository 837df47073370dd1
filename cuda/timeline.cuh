/* timeline.cuh — a diagnostic build's per-kernel timeline of one MoE block call.
 *
 * Contract
 * - Only with -DTD_TIMELINE (`make gpu TIMELINE=1`, objects in build/gpu-tl/; never the
 *   engine's default build, which compiles every stamp away): each kernel of the block opens
 *   a cu_tl_guard at its top with its role (cu_tl_role). The guard's constructor takes the
 *   %globaltimer value on thread 0 of every block and keeps the least over the launch's blocks
 *   (atomicMin: the first block's start); its destructor, on every return path, takes it on
 *   lane 0 of every warp and keeps the greatest (atomicMax: the last warp's end). Integer
 *   atomics on a table of the translation unit; no number the kernels compute changes.
 * - cu_tl_waited(role), right after a kernel's wait for its predecessor (cu_pdl_wait), takes
 *   the timer on thread 0 of every block and keeps the least and the greatest: when the first
 *   and the last block were let through. A kernel that never calls it reads wait = ~0.
 * - cu_tl_mark(role, i), i < CU_TL_MARKS, on thread 0 of each block that reaches it, keeps the
 *   greatest timer value: when the last block's first warp passed point i of the kernel (the
 *   phases of k_mm and of the routing kernel; 0 where nothing marked it). Every stamp is an
 *   atomic on one address per role and column, so stamps themselves take time: the build's
 *   spans are longer than the default build's (docs/perf.md).
 * - The table is per translation unit (cuda/moe.cu and cuda/moe_mma.cu each have one): its
 *   host accessor in each (cu_moe_timeline, cu_mm_timeline) copies it out and resets it (start
 *   to all ones, end to 0) for the next call. A role that no kernel of the call took reads
 *   start = ~0. One call's kernels must not share a role with another call run concurrently.
 * - Times are nanoseconds of the GPU's global timer; bench/gpu/moe_decode --timeline prints
 *   them relative to the first start of the call.
 */
#ifndef TD_CUDA_TIMELINE_CUH
#define TD_CUDA_TIMELINE_CUH

#include <stdint.h>

/* the block's launches by role (the routed W13 and W2 on k_dec, k_w2c or k_mm alike) */
enum cu_tl_role {
    CU_TL_ROUND = 0, /* k_round16, k_round_split, k_round_stage */
    CU_TL_ROUTER,    /* the router + gate GEMM */
    CU_TL_SH13,      /* the shared expert's W13 + SwiGLU */
    CU_TL_SH2,       /* the shared expert's W2 */
    CU_TL_ROUTE,     /* the routing kernels */
    CU_TL_GROUP,     /* the grouping kernels */
    CU_TL_W13,       /* the routed W13 + SwiGLU */
    CU_TL_W2,        /* the routed W2 (with the combine fused in: k_w2c) */
    CU_TL_COMBINE,   /* k_combine */
    CU_TL_N
};

#ifdef TD_TIMELINE
/* per role: first start, last end, first and last return from the predecessor wait */
#define CU_TL_COLS 4
static __device__ unsigned long long cu_tl_tab[CU_TL_N][CU_TL_COLS];
#define CU_TL_MARKS 8
static __device__ unsigned long long cu_tl_mk[CU_TL_N][CU_TL_MARKS];

__device__ __forceinline__ unsigned long long cu_tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void cu_tl_waited(int role)
{
    if (threadIdx.x == 0) {
        const unsigned long long t = cu_tl_now();
        atomicMin(&cu_tl_tab[role][2], t);
        atomicMax(&cu_tl_tab[role][3], t);
    }
}

__device__ __forceinline__ void cu_tl_mark(int role, int i)
{
    if (threadIdx.x == 0) atomicMax(&cu_tl_mk[role][i], cu_tl_now());
}

struct cu_tl_guard {
    int role;
    __device__ explicit cu_tl_guard(int r) : role(r)
    {
        if (threadIdx.x == 0) atomicMin(&cu_tl_tab[role][0], cu_tl_now());
    }
    __device__ void waited() const { cu_tl_waited(role); }
    __device__ ~cu_tl_guard()
    {
        if ((threadIdx.x & 31u) == 0) atomicMax(&cu_tl_tab[role][1], cu_tl_now());
    }
};

/* copy the tables out (out: CU_TL_N x {start, end, first wait, last wait}, then CU_TL_N x
 * CU_TL_MARKS marks) and reset them (starts and first waits to all ones, the rest to 0);
 * returns a cudaError_t */
static inline int cu_tl_take(uint64_t *out)
{
    unsigned long long h[CU_TL_N][CU_TL_COLS], init[CU_TL_N][CU_TL_COLS], mk[CU_TL_N][CU_TL_MARKS], z[CU_TL_N][CU_TL_MARKS];
    for (int i = 0; i < CU_TL_N; i++) init[i][0] = init[i][2] = ~0ull, init[i][1] = init[i][3] = 0;
    for (int i = 0; i < CU_TL_N; i++)
        for (int j = 0; j < CU_TL_MARKS; j++) z[i][j] = 0;
    int e = (int)cudaMemcpyFromSymbol(h, cu_tl_tab, sizeof h);
    if (!e) e = (int)cudaMemcpyToSymbol(cu_tl_tab, init, sizeof init);
    if (!e) e = (int)cudaMemcpyFromSymbol(mk, cu_tl_mk, sizeof mk);
    if (!e) e = (int)cudaMemcpyToSymbol(cu_tl_mk, z, sizeof z);
    for (int i = 0; i < CU_TL_N; i++)
        for (int j = 0; j < CU_TL_COLS; j++) out[CU_TL_COLS * i + j] = h[i][j];
    for (int i = 0; i < CU_TL_N; i++)
        for (int j = 0; j < CU_TL_MARKS; j++) out[CU_TL_COLS * CU_TL_N + CU_TL_MARKS * i + j] = mk[i][j];
    return e;
}

/* each translation unit's table (cu_tl_take on it) */
int cu_moe_timeline(uint64_t *out); /* cuda/moe.cu: round, routing, combine; out: CU_TL_N x (CU_TL_COLS + CU_TL_MARKS) */
int cu_mm_timeline(uint64_t *out);  /* cuda/moe_mma.cu: the GEMMs, grouping, the staged round */
#else
#define CU_TL_COLS 4
#define CU_TL_MARKS 8
__device__ __forceinline__ void cu_tl_waited(int) {}
__device__ __forceinline__ void cu_tl_mark(int, int) {}
struct cu_tl_guard {
    __device__ explicit cu_tl_guard(int) {}
    __device__ void waited() const {}
};
#endif

#endif /* TD_CUDA_TIMELINE_CUH */
