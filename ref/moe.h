/* moe.h — the reference MoE block (MODEL_SPEC.md A3.6 / B3.7) with TP emulation.
 *
 * Math, for each token t with block input x_t (hidden H):
 *   1. x_t is rounded to act_dtype (rounding point 1: block input).
 *   2. Router (unless routes are imposed): logits = W_gate x_t ([E], a linear), then an FP32
 *      softmax over all E experts: m = max logits; e_i = fl32(exp(l_i - m)) (l_i - m in
 *      float32, exp evaluated in double and rounded once, so no C library's expf rounding
 *      enters); s = sum of e_i in ascending i (float32, or double with accum=fp64);
 *      p_i = fl32(e_i / s).
 *   3. Top-k: the k largest p_i in descending order; among equal probabilities the lowest
 *      expert index wins (a NaN ranks below every number). Slot j holds the j-th largest.
 *   4. Renormalization when norm_topk_prob: w_j = fl32(p_j / s_k) with s_k the sum of the k
 *      selected p_j in slot order (float32 or double). Otherwise w_j = p_j.
 *   5. Routed experts, per slot j with expert e = id_j, on this rank's shard:
 *        g = gate_e x_t, u = up_e x_t             (linears, ascending K)
 *        h = fl32(silu(g) * u)                    silu(g) = fl32(g / (1 + exp(-g))) in double
 *        h -> act_dtype                           (rounding point 2: SwiGLU intermediate)
 *        y_j = down_e h  -> act_dtype             (rounding point 3: per-expert output)
 *   6. Shared expert (when present): the same SwiGLU MLP on x_t, its output y_s rounded to
 *      act_dtype (point 3), gated by sg = fl32(sigmoid(shared_expert_gate . x_t)) (sigmoid in
 *      double, rounded once; the dot in ascending K).
 *   7. out_t = sum over slots j = 0 .. k-1 in order of fl32(w_j * y_j), then + fl32(sg * y_s),
 *      accumulated in float32 from +0 (or in double with accum=fp64, rounded once), then
 *      rounded to act_dtype (rounding point 4: block output).
 * TP emulation (SEED_AUDITS.md §1.2, MODEL_SPEC.md A5/B5): with tp_size T the intermediate
 * dimension I of every expert (and Is of the shared expert) is split in T equal parts; rank
 * r uses gate/up rows [r*I/T, (r+1)*I/T) and down columns [r*I/T, (r+1)*I/T) (for NVFP4 the
 * packed bytes [r*I/(2T), ...) and scale columns [r*I/(16T), ...)), so its output is that
 * rank's partial sum (router, top-k, weights and shared gate are replicated). tp_rank = all
 * computes every rank's partial (each rounded at point 4) and sums them in rank order in
 * float32 ((p0 + p1) + p2 ..., for every accum), then rounds to act_dtype again: the
 * all-reduced output.
 * I (and Is) must be divisible by T, and for NVFP4 down projections I/T by 16.
 *
 * Contract
 * - ref_moe_run() computes out [M, H]. Imposed routes (ids, weights [M, k]) replace steps
 *   2-4; an id outside [0, E) fails with TD_ERR_RANGE naming token, slot and id before any
 *   expert is touched. The workspace must have been reserved for at least M tokens with
 *   these weights' dimensions (ref_moe_ws_reserve, which allocates; ref_moe_run does not).
 * - Parallel across work items of the pool (router rows, expert row chunks, tokens): each
 *   output element is computed by one thread in the order above, so the result does not
 *   depend on the thread count.
 * - Errors name what is wrong (shape that cannot be sliced, bad route id). The workspace
 *   owns its buffers; ref_moe_ws_free is NULL-safe.
 */
#ifndef TD_REF_MOE_H
#define TD_REF_MOE_H

#include "linear.h"
#include "pool.h"

typedef struct ref_expert {
    ref_linear gate;      /* [I, H] */
    ref_linear up;        /* [I, H] */
    ref_linear down;      /* [H, I] */
} ref_expert;

typedef struct ref_moe_weights {
    int64_t hidden;             /* H */
    int64_t n_experts;          /* E */
    int64_t top_k;              /* k */
    int64_t inter;              /* I (whole, before TP) */
    int64_t shared_inter;       /* Is (0 = no shared expert) */
    bool norm_topk_prob;
    bool has_router;
    ref_linear router;          /* [E, H] */
    const ref_expert *experts;  /* [E] whole (TP1) views */
    bool has_shared;
    ref_expert shared;          /* gate/up [Is, H], down [H, Is] */
    ref_linear shared_gate;     /* [1, H] */
} ref_moe_weights;

typedef struct ref_moe_opts {
    ref_numerics nx;
    td_act_dtype act;
    int tp_size;                /* >= 1 */
    int tp_rank;                /* 0..tp_size-1 or TD_TP_RANK_ALL */
} ref_moe_opts;

/* Workspace: every buffer the block needs, sized by ref_moe_ws_reserve. */
typedef struct ref_moe_ws {
    int64_t cap_tokens;         /* M reserved */
    int64_t hidden, n_experts, top_k, inter, shared_inter, max_cols;
    int workers;
    float *x;                   /* [M, H] block input rounded to act_dtype */
    float *logits;              /* [M, E] router logits */
    float *probs;               /* [M, E] softmax */
    int32_t *ids;               /* [M, k] expert of each slot */
    float *weights;             /* [M, k] combine weight of each slot */
    int64_t *offset;            /* [E + 1] start of each expert's slots in `slots` */
    int64_t *cursor;            /* [E] fill position per expert while grouping */
    int64_t *slots;             /* [M * k] slot indices (t * k + j) grouped by expert, ascending */
    int32_t *active;            /* [E] experts with at least one slot, ascending */
    float *act;                 /* [M * k, I] SwiGLU intermediates per slot (this rank: I/T used) */
    float *eout;                /* [M * k, H] per-slot expert outputs */
    float *sh_act;              /* [M, Is] shared-expert intermediates */
    float *sh_out;              /* [M, H] shared-expert outputs (before the gate) */
    float *sh_gate;             /* [M] sigmoid gate per token */
    float *sh_gate_w;           /* [H] decoded shared_expert_gate row */
    float *partial;             /* [M, H] one rank's output (tp_rank = all) */
    float *scratch;             /* [workers, REF_LINEAR_SCRATCH(max_cols)] decoded rows */
    float *tmp;                 /* [workers, 2, M * k, REF_MOE_CHUNK] gate/up results */
    const float **xp;           /* [workers, M * k] input pointers of one linear call */
    float **yp;                 /* [workers, 2, M * k] output pointers of one linear call */
    bool router_ran;            /* the last run computed logits/probs (routes not imposed) */
} ref_moe_ws;

/* Intermediate rows of gate/up computed per work item. */
#define REF_MOE_CHUNK 16

/* Make `ws` hold M tokens of a block with w's dimensions for `workers` threads (grows only;
 * keeps larger buffers). */
td_status ref_moe_ws_reserve(ref_moe_ws *ws, const ref_moe_weights *w, int64_t tokens, int workers,
                             td_err *err);
void ref_moe_ws_free(ref_moe_ws *ws);

/* The block (see above). x [M, H] float32; out [M, H]. ids/weights: imposed routes or NULL. */
td_status ref_moe_run(const ref_moe_weights *w, const ref_moe_opts *o, ref_pool *pool,
                      ref_moe_ws *ws, const float *x, int64_t M, const int32_t *ids,
                      const float *weights, float *out, td_err *err);

/* Router logits only: out [M, E] (x rounded to act_dtype first). */
td_status ref_moe_router(const ref_moe_weights *w, const ref_moe_opts *o, ref_pool *pool,
                         ref_moe_ws *ws, const float *x, int64_t M, float *out, td_err *err);

/* ---- the pieces, exposed for tests ---------------------------------------------------------- */

/* Round a float32 to act_dtype (RNE) and back; fp32 is the identity. */
float ref_round_act(float v, td_act_dtype a);
/* fl32(g / (1 + exp(-g))) with the quotient evaluated in double. */
float ref_silu(float g);
/* fl32(1 / (1 + exp(-v))) evaluated in double. */
float ref_sigmoid(float v);
/* p [n] = softmax(logits [n]) as in step 2. */
void ref_softmax(const float *logits, int64_t n, float *p, td_accum accum);
/* ids/vals [k] = the k largest of p [n] (step 3). k <= n. */
void ref_topk(const float *p, int64_t n, int64_t k, int32_t *ids, float *vals);
/* w [k] /= sum of w in slot order (step 4). */
void ref_renorm(float *w, int64_t k, td_accum accum);
/* Rank `rank`'s shard of an expert whose intermediate size is `inter` (see TP emulation).
 * fault tp_slice pairs the W13 rows of `rank` with the W2 columns of (rank + 1) % tp. */
td_status ref_expert_shard(const ref_expert *whole, int64_t inter, int tp_size, int rank,
                           td_fault fault, ref_expert *out, td_err *err);

#endif /* TD_REF_MOE_H */
