/* rowpar.h — a row-parallel linear (an output projection) under emulated tensor parallelism,
 * with the block-output rounding of act_dtype.
 *
 * The token-mixer blocks (attention o_proj, Gated DeltaNet out_proj) end in a linear whose
 * input columns a TP engine splits across ranks: rank r holds columns [r C/T, (r+1) C/T) of
 * W [rows, C] and the matching slice of the input, computes a partial output, and the ranks'
 * partials are all-reduced. For M inputs x [M, C] (row stride xs) into y [M, rows] (stride ys):
 *   p_r = round_act(W[:, shard r] x[shard r])      (linear.h order over the shard's columns)
 *   tp_rank = r:                 y = p_r           (one rank's partial)
 *   tp_rank = TD_TP_RANK_ALL:    y = round_act(((p_0 + p_1) + p_2) + ...)   (float32 sums in
 *                                rank order for every accum, as the MoE block's reduction)
 * With tp_size 1 both give round_act(W x). round_act is ref_round_act (moe.h): the identity for
 * fp32, RNE to FP16/BF16 and back otherwise (rounding point 4: block output).
 *
 * Contract: tp_size >= 1 must divide C (TD_ERR_RANGE otherwise, naming tp_size); NVFP4 shards
 * must fall on 16-column blocks (TD_ERR_RANGE from linear.h). `partial` [M, rows] (row stride
 * ys) is caller-owned scratch, used only for tp_rank = all with tp_size > 1 (may be NULL
 * otherwise). The workspace must be reserved for M and C (mm.h). x, y and partial must not
 * overlap. Nothing is allocated; the thread count never changes a bit.
 */
#ifndef TD_REF_ROWPAR_H
#define TD_REF_ROWPAR_H

#include "mm.h"

typedef struct ref_rowpar {
    int tp_size;                /* 1..TD_TP_MAX */
    int tp_rank;                /* 0..tp_size-1 or TD_TP_RANK_ALL */
    td_act_dtype act;           /* block-output rounding */
} ref_rowpar;

/* tp_size 1, every rank, float32 activations: a plain linear. */
#define REF_ROWPAR_PLAIN ((ref_rowpar){1, TD_TP_RANK_ALL, TD_ACT_FP32})

/* Would ref_mm_rowpar accept this split of `l` (tp_rank, divisibility, NVFP4 shard alignment)?
 * Callers that update state before the projection check first. */
td_status ref_rowpar_check(const ref_linear *l, const ref_rowpar *rp, td_err *err);

td_status ref_mm_rowpar(const ref_linear *l, const ref_numerics *nx, const ref_rowpar *rp, ref_pool *pool,
                        ref_mm_ws *ws, const float *x, int64_t xs, int64_t m, float *y, int64_t ys,
                        float *partial, td_err *err);

#endif /* TD_REF_ROWPAR_H */
