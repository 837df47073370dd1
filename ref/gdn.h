/* gdn.h — reference Gated DeltaNet of Qwen3-Next (MODEL_SPEC.md A3.5) with decode state.
 *
 * Dims: nk key heads, nv value heads (r = nv / nk per key head), dk, dv, conv kernel K;
 * conv channels C = 2 nk dk + nv dv. For the M tokens of one sequence, input x [M, hidden]:
 *   1. P = in_proj_qkvz x, Q = in_proj_ba x (linears). Interleaved split per key-head group g
 *      (G = 2 dk + 2 r dv columns): q_g = P[g, 0:dk], k_g = P[g, dk:2dk], v (value heads
 *      r g .. r g + r - 1) = P[g, 2dk : 2dk + r dv], z (same heads) = the next r dv;
 *      Q per group (2 r columns): b = Q[g, 0:r], a = Q[g, r:2r].
 *   2. mixed = [q (nk dk) | k (nk dk) | v (nv dv)]; causal depthwise conv, per channel c and
 *      token t: acc = +0, for j = 0 .. K-1 ascending acc = fl32(acc + fl32(W[c, j] *
 *      in_{t-K+1+j}[c])), where inputs before the sequence start are 0 and earlier inputs come
 *      from the conv state (the last K-1 pre-conv inputs, oldest first); u = silu(acc)
 *      (ref_silu). The state keeps the last K-1 inputs afterwards.
 *   3. q, k per key head: L2-normalised (norm.h, eps 1e-6 inside the sqrt), then
 *      q <- fl32(q * fl32(1 / sqrt(dk))).
 *   4. Per value head j (key head j / r): beta = sigmoid(b_j) (ref_sigmoid);
 *      g = fl32(-fl32(exp(A_log_j)) * softplus(fl32(a_j + dt_bias_j))); decay = fl32(exp(g)).
 *   5. Recurrence, FP32 state S [dk, dv] per value head, token-serial, in this order:
 *        S[k][v] = fl32(S[k][v] * decay)                       (decay)
 *        m[v]  = sum over k ascending of fl32(S[k][v] * k[k])   (S^T k, from +0)
 *        d[v]  = fl32(fl32(v[v] - m[v]) * beta)                 (delta)
 *        S[k][v] = fl32(S[k][v] + fl32(k[k] * d[v]))            (rank-1 update)
 *        o[v]  = sum over k ascending of fl32(S[k][v] * q[k])   (S^T q, from +0)
 *   6. y_j = gated RMSNorm(o_j, z_j; norm weight, eps) (norm.h), out = out_proj concat_j y_j,
 *      a row-parallel linear under `rp` (rowpar.h): with tp_size T (which must divide nk, so a
 *      rank holds whole key-head groups with their value heads) rank r's partial uses the
 *      out_proj columns of value heads [r nv/T, (r+1) nv/T); tp_rank = all reduces the ranks in
 *      rank order; the output is rounded to rp->act. Steps 1-5 are per channel / head and do
 *      not depend on TP, so only this projection is split.
 * Split layout (dims.split, qwen4_exp, MODEL_SPEC.md B3.5): step 1 is instead mixed = in_proj_qkv
 * x (already q | k | v), z = in_proj_z x, b = in_proj_b x, a = in_proj_a x; value head j still
 * uses key head j / r. dims.sigmoid_gate replaces silu(z) by sigmoid(z) in step 6
 * (ref_rmsnorm_gated_sigmoid). Everything else is unchanged.
 * exp/sigmoid/silu/softplus: double, rounded once (norm.h). Work is split across channels
 * (conv), tokens (norms) and value heads (recurrence), so results do not depend on the
 * thread count, and the token-serial recurrence makes prefill(n) + decode bit-identical to
 * prefill(n + 1). The linears follow linear.h (accum applies to them only).
 *
 * Contract: state and workspace grow only; ref_gdn_state_init allocates (zeroed state),
 * ref_gdn_state_reset zeroes it again without allocating.
 */
#ifndef TD_REF_GDN_H
#define TD_REF_GDN_H

#include "rowpar.h"

#include <stdbool.h>

typedef struct ref_gdn_dims {
    int64_t hidden, nk, nv, dk, dv, kconv;
    float eps;                  /* gated RMSNorm eps (rms_norm_eps) */
    bool split;                 /* qwen4_exp (B3.5): separate in_proj_qkv / z / b / a, contiguous
                                   q | k | v rows (no per-group interleave) */
    bool sigmoid_gate;          /* output gate sigmoid(z) instead of silu(z) (output_gate_type) */
} ref_gdn_dims;

typedef struct ref_gdn_weights {
    ref_linear qkvz;            /* [nk (2 dk + 2 r dv), H] (interleaved layout) */
    ref_linear ba;              /* [2 nv, H] (interleaved layout) */
    ref_linear qkv, z, b, a;    /* split layout: [C, H], [nv dv, H], [nv, H], [nv, H] */
    ref_linear out;             /* [H, nv dv] */
    const float *conv_w;        /* [C, K] */
    const float *A_log;         /* [nv] */
    const float *dt_bias;       /* [nv] */
    const float *norm_w;        /* [dv] plain multiplier */
} ref_gdn_weights;

typedef struct ref_gdn_state {
    float *conv;                /* [C, K - 1] oldest first */
    float *S;                   /* [nv, dk, dv] */
} ref_gdn_state;

typedef struct ref_gdn_ws {
    ref_mm_ws mm;
    float *P;                   /* [M, nk * G] in_proj_qkvz output (interleaved groups; z read here) */
    float *Q;                   /* [M, 2 nv] in_proj_ba output */
    float *mixed;               /* [M, C] pre-conv q | k | v */
    float *u;                   /* [M, C] post-conv (SiLU), q/k then L2-normalized in place */
    float *y;                   /* [M, nv * dv] gated-normed head outputs (out_proj input) */
    float *partial;             /* [M, hidden] one TP rank's out_proj partial (rowpar.h) */
    int64_t cap_P, cap_Q, cap_mixed, cap_u, cap_y, cap_partial; /* floats allocated */
} ref_gdn_ws;

int64_t ref_gdn_channels(const ref_gdn_dims *d);
td_status ref_gdn_state_init(ref_gdn_state *s, const ref_gdn_dims *d, td_err *err);
/* Back to the zero state of a new sequence (s initialised with the same dims). */
void ref_gdn_state_reset(ref_gdn_state *s, const ref_gdn_dims *d);
void ref_gdn_state_free(ref_gdn_state *s);
void ref_gdn_ws_free(ref_gdn_ws *ws);

td_status ref_gdn_run(const ref_gdn_weights *w, const ref_gdn_dims *d, const ref_numerics *nx,
                      const ref_rowpar *rp, ref_pool *pool, ref_gdn_ws *ws, ref_gdn_state *s, const float *x, int64_t m,
                      float *out, td_err *err);

#endif /* TD_REF_GDN_H */
