/* moe_block.cuh — one MoE block on the device: the sequence of launches (cuda/moe.cuh,
 * cuda/moe_mma.cuh) that the engine runs for a chunk of tokens and that bench/gpu/moe_decode
 * times, so that the bench measures exactly the engine's path.
 *
 * The sequence (on ws->s; the shared expert on ws->s2 between a fork after the round and a
 * join before the combine, or before W2 where W2 takes the combine, so it overlaps the router,
 * the routing and the routed experts):
 *   round x to act (plus the 16-bit copy on the tensor-core path; at decode sizes, with
 *     sh->stage_img and ws->sp_x, also the rows staged for the router's and the shared W13's
 *     k_mm blocks, cu_mm_round_stage)
 *   router logits and the shared-gate dot (one BF16 matrix of E + 1 rows on the tensor-core
 *     path; CUDA-core dot products otherwise) into logits [M, lg_ld] (gate at column E)
 *   routing (unless routes are imposed), grouping (moe_dispatch=grouped)
 *   per TP rank: shared expert (W13 + SwiGLU, W2), routed experts (W13 + SwiGLU, W2), combine
 *   (rank outputs added in rank order; rounded once more for tp_rank=all; the shared expert
 *   of a later rank forks after the previous rank's combine). With one rank, direct dispatch
 *   and W2 on the decode kernel, W2 takes the combine (cu_mm_w2c) where td_w2c_pays says its
 *   rounds of chunk transfers are no more than the separate W2's (cuda/dec_split.h: M = 1 at
 *   the production shape, M <= 8 on its TP4 slice): one launch fewer, the same bits.
 * At prefill sizes the BF16 GEMMs (router, shared W13 and W2) run on k_wgp when ws->sp_x and
 * ws->sp_sh are given (cu_mm_call::split_ws): the round writes the input in k_wgp's layout into
 * sp_x for the router and the shared W13 (cu_mm_round_split), the shared W2's input is laid out
 * into sp_sh before it (FP16 inputs split into BF16 hi / lo, BF16 inputs as they are).
 * Every kernel launched on ws->s after the first is a programmatic dependent launch
 * (common.cuh): it may start while its predecessor runs and waits for it before any access.
 * CU_BLOCK_ROUTER stops after the logits; CU_BLOCK_ROUTED runs only grouping and the routed
 * experts of the first rank (the bench's routed-part timing; output in eout16, and in ws->out
 * where W2 takes the combine as in the block).
 *
 * Contract: plain data in, launches out; nothing is allocated, nothing synchronizes, nothing
 * reads host memory (the whole sequence can be captured into a graph). Errors name the
 * launch at fault. cu_describe_device (outside any graph: device queries and a /proc read)
 * says which GPU the block runs on, for the results store.
 */
#ifndef TD_CUDA_MOE_BLOCK_CUH
#define TD_CUDA_MOE_BLOCK_CUH

extern "C" {
#include "engine.h"
}
#include "moe.cuh"
#include "moe_mma.cuh"

/* One layer's weights on the device. */
typedef struct cu_block_w {
    cu_lin router;              /* [E, H], CUDA-core path */
    bool router_mm;             /* router (+ shared gate as row E) on the tensor-core path */
    cu_qmat router_q;
    bool mm;                    /* routed experts on the tensor-core path */
    cu_lin gate, up, down;      /* CUDA-core path: every routed expert back to back */
    cu_qmat w13, w2;            /* tensor-core path: matrix e * nr + rank index */
    bool has_shared, sh_mm;
    cu_lin sh_gate, sh_up, sh_down, sh_gw;
    cu_qmat sh13, sh2;          /* tensor-core path: matrix = rank index */
} cu_block_w;

/* Shape and variant of a block. */
typedef struct cu_block_shape {
    int64_t H, E, k, I, Is;     /* I, Is: full (all ranks) intermediate sizes */
    bool renorm;
    int act;                    /* 0 fp32, 1 fp16, 2 bf16 */
    int tp_size, tp_rank;       /* tp_rank -1: every rank, summed in rank order */
    int rank0, nr;              /* ranks stored on the tensor-core path */
    bool grouped;
    bool generic;               /* every projection on the general kernel (kernels=generic) */
    bool separate_combine;      /* never fuse the combine into the routed W2 (the bench's A/B) */
    bool dec_narrow;            /* the routed experts' one-tile decode-kernel calls may run on
                                   the narrow blocks of 4 warps where td_dec_narrow_pays takes
                                   them (cu_mm_call::dec_narrow; the same bits); on in the
                                   engine, off with moe_decode --no-dec-narrow (its A/B) */
    bool stage_img;             /* at decode sizes (M < 256) the round stages the input for
                                   the router's and the shared W13's k_mm blocks into ws->sp_x
                                   (cu_mm_round_stage, cu_mm_call::xst; the same bits); on in
                                   the engine, off with moe_decode --no-stage-img (its A/B) */
} cu_block_shape;

/* Workspace for up to C tokens (sizes in brackets). The intermediates of an expert on the
 * tensor-core path (w->mm: the routed experts; w->sh_mm: the shared expert) are written only
 * as 16-bit patterns (act16, eout16; sh_act16, sh_out16), those of the CUDA-core path only as
 * float (act, eout; sh_act, sh_out): both hold the same act-rounded values. */
typedef struct cu_block_ws {
    float *x, *xa;              /* [C, H] */
    float *logits;              /* [C, lg_ld], lg_ld >= E + 1 */
    int64_t lg_ld;
    float *wts;                 /* [C, k] */
    int32_t *ids;               /* [C, k] */
    float *act;                 /* [C*k, I/tp] */
    float *eout;                /* [C*k, H] */
    float *sh_act;              /* [C, Is/tp] */
    float *sh_out, *out;        /* [C, H] */
    uint16_t *xa16;             /* [C, H] */
    uint16_t *act16;            /* [C*k, I/tp] */
    uint16_t *eout16;           /* [C*k, H] */
    uint16_t *sh_act16;         /* [C, Is/tp] */
    uint16_t *sh_out16;         /* [C, H] */
    int32_t *n_groups;          /* [1] */
    int32_t *g_mat, *g_start, *g_count; /* [cu_mm_group_ws(C, k, E)] */
    int32_t *perm;              /* [C*k] */
    uint8_t *sp_x, *sp_sh;      /* optional (NULL: unused): k_wgp's laid-out inputs
                                   (cu_mm_call::split_ws) of the router and the shared W13, or
                                   at decode sizes their staged input (cu_mm_call::xst),
                                   [cu_mm_input_ws_bytes(C, H)], and of the shared W2 (or of the
                                   shared W13 too when the round did not lay x out),
                                   [cu_mm_split_bytes(C, max(H, Is/tp))] */
    int32_t *ids_discard;       /* [C, k], optional: with imposed routes, the routing kernel */
    float *wts_discard;         /* still runs at its place and writes here (the bench's timing) */
    cudaStream_t s, s2;
    cudaEvent_t ev_fork, ev_join;
} cu_block_ws;

typedef enum cu_block_part { CU_BLOCK_MOE = 0, CU_BLOCK_ROUTER, CU_BLOCK_ROUTED } cu_block_part;

/* Enqueue the block for Mc tokens whose input is in ws->x (and, with `routed`, whose routes
 * are in ws->ids / ws->wts). Output in ws->out (CU_BLOCK_MOE), ws->logits (ROUTER) or
 * ws->eout (ROUTED). */
td_status cu_moe_block(const cu_block_shape *sh, const cu_block_w *w, const cu_block_ws *ws, cu_block_part part,
                       bool routed, int64_t Mc, td_err *err);

/* What the block runs on, for the results store (the engine's td_engine_device, the bench's
 * run): the current device's name, the kernel driver's version (the CUDA driver API's when
 * /proc has none), the CUDA runtime's version as N.N. A query that fails leaves its field
 * empty; *d is cleared first. */
void cu_describe_device(td_engine_device *d);

#endif /* TD_CUDA_MOE_BLOCK_CUH */
