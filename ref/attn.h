/* attn.h — reference gated full attention of Qwen3-Next (MODEL_SPEC.md A3.4) with a KV cache.
 *
 * For the M tokens of one sequence at positions p = kv->len + t (t < M), input x [M, hidden]
 * (already input-normed):
 *   1. qg = q_proj x ([heads, 2 * head_dim] per token: query block then gate block per head),
 *      k = k_proj x, v = v_proj x (linears, linear.h numerics).
 *   2. q_h <- RMSNorm_zc(q_h; q_norm), k_j <- RMSNorm_zc(k_j; k_norm) (norm.h), then RoPE
 *      (rope.h) on the first `rot` dimensions of each head at position p. K (after norm and
 *      RoPE) and V are appended to the cache.
 *   3. Query head h uses KV head h / (heads / kv_heads). Scores for j = 0 .. p:
 *      s_j = fl32(fl32(q . k_j) * scale), scale = fl32(1 / sqrt(head_dim)), the dot from +0
 *      in ascending dimension order; causal softmax in float32 as ref_softmax (moe.h);
 *      o[d] = sum over j ascending of fl32(p_j * v_j[d]) from +0.
 *   4. o_h[d] <- fl32(o_h[d] * sigmoid(g_h[d])) (ref_sigmoid), out = o_proj concat_h(o_h),
 *      computed as a row-parallel linear under `rp` (rowpar.h): with tp_size T (which must
 *      divide heads, so a rank holds whole heads) rank r's partial uses the o_proj columns of
 *      heads [r heads/T, (r+1) heads/T); tp_rank = all reduces the ranks in rank order; the
 *      output is rounded to rp->act. Steps 1-3 do not depend on TP (every head is computed
 *      alone), so only this projection is split.
 * The dots and sums of steps 2-3 are float32 for every accum (accum concerns the linears).
 * Work is split across tokens (steps 2) and (token, head) pairs (step 3); every value is
 * computed by one thread in the order above, so results do not depend on the thread count,
 * and a token's result does not depend on how many tokens share the call (prefill of n
 * tokens then one decode step gives bit for bit the prefill of n + 1 at the last position).
 *
 * Contract: the cache and workspace grow only (reserve functions allocate; nothing else does).
 * x and out must not alias. The weights' shapes are checked by the loader.
 */
#ifndef TD_REF_ATTN_H
#define TD_REF_ATTN_H

#include "rowpar.h"

typedef struct ref_attn_dims {
    int64_t hidden, heads, kv_heads, head_dim, rot;
    double theta;
    float eps;
} ref_attn_dims;

typedef struct ref_attn_weights {
    ref_linear q, k, v, o;      /* [heads*2*hd, H], [kvh*hd, H] x2, [H, heads*hd] */
    const float *q_norm;        /* [head_dim] zero-centred */
    const float *k_norm;        /* [head_dim] zero-centred */
} ref_attn_weights;

typedef struct ref_kv {
    int64_t len, cap, width;    /* width = kv_heads * head_dim */
    float *k, *v;               /* [cap, width] */
} ref_kv;

typedef struct ref_attn_ws {
    ref_mm_ws mm;
    float *qg;                  /* [M, heads, 2 * head_dim] q_proj output (query, gate per head) */
    float *q;                   /* [M, heads, head_dim] normed and rotated queries */
    float *k, *v;               /* [M, kv_heads * head_dim] k_proj / v_proj outputs */
    float *o;                   /* [M, heads * head_dim] gated attention output (o_proj input) */
    float *rope;                /* [M, rot] cos [rot/2] then sin [rot/2] per token */
    float *scores;              /* [workers, 2, len] scores then probabilities per worker */
    float *partial;             /* [M, hidden] one TP rank's o_proj partial (rowpar.h) */
    int64_t cap_qg, cap_q, cap_k, cap_v, cap_o, cap_rope, cap_scores, cap_partial; /* floats allocated */
} ref_attn_ws;

void ref_kv_free(ref_kv *kv);
void ref_attn_ws_free(ref_attn_ws *ws);

td_status ref_attn_run(const ref_attn_weights *w, const ref_attn_dims *d, const ref_numerics *nx,
                       const ref_rowpar *rp, ref_pool *pool, ref_attn_ws *ws, ref_kv *kv, const float *x, int64_t m,
                       float *out, td_err *err);

#endif /* TD_REF_ATTN_H */
