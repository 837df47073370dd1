/* qsa.h — QSA sparse attention of Qwen3.8-Flash-Next (MODEL_SPEC.md B3.6) with its caches.
 *
 * Main attention = the gated attention of attn.h (q_proj with per-head query|gate blocks,
 * zero-centred q/k norms, partial RoPE, softmax scale fl32(1/sqrt(head_dim)), sigmoid gate,
 * o_proj; same float32 orders) except that query position t attends only to Sel(t).
 * Indexer, for the M tokens of one sequence at positions p = len + t:
 *   1. [qi (ih heads x di) | ki (di)] = index_qk_proj x (linear.h).
 *   2. qi_h <- RoPE(RMSNorm_zc(qi_h; q_layernorm), p) on the first `rot` dims (rope.h; the main
 *      attention's rotary dimension and theta). ki is cached raw.
 *   3. Block b (tokens [B b, B b + B - 1], B = compress ratio) gets its key when complete:
 *      mean_d = fl32(fl32(sum over its tokens ascending from +0) / B);
 *      kb = RoPE(RMSNorm_zc(mean; k_layernorm), B b). Block keys are cached.
 *   4. nb(t) = floor((p + 1) / B) complete blocks; score_b = fl32(acc * fl32(1/sqrt(di))),
 *      acc = sum over h ascending from +0 of relu(dot(qi_h, kb)) (dot ascending from +0).
 *   5. Selected = the min(topk, nb) best blocks, topk = budget / B, chosen by ref_topk_torch (topk.h):
 *      equal scores (ReLU makes exact zeros common) resolve as torch.topk on the CPU resolves
 *      them, a NaN score ranks above every number. Sel(t) = the tokens of the selected blocks
 *      plus the open tail B nb .. p, visited in ascending position order for the softmax and
 *      the weighted sum.
 * With nb <= topk every earlier token is selected and QSA is dense causal attention.
 * Work is split across tokens (prep, scoring) and (token, head) pairs (attention); results do
 * not depend on the thread count, and prefill(n) + decode(1) equals prefill(n + 1) bit for bit.
 *
 * Contract: caches and workspace grow only; sel_out (optional) receives [M, topk] selected block
 * ids in ascending order, -1 padded. x and out must not alias.
 */
#ifndef TD_REF_QSA_H
#define TD_REF_QSA_H

#include "attn.h"
#include "topk.h"

typedef struct ref_qsa_dims {
    ref_attn_dims a;
    int64_t idx_heads, idx_dim, block, topk;
} ref_qsa_dims;

typedef struct ref_qsa_weights {
    ref_attn_weights a;
    ref_linear idx;             /* [(idx_heads + 1) idx_dim, H] */
    const float *q_ln, *k_ln;   /* [idx_dim] zero-centred */
} ref_qsa_weights;

typedef struct ref_qsa_cache {
    int64_t len, cap;
    int64_t kw;                 /* kv_heads * head_dim */
    float *k, *v;               /* [cap, kw] (K after norm and RoPE) */
    float *ki;                  /* [cap, idx_dim] raw indexer keys */
    float *kb;                  /* [cap / block + 1, idx_dim] block keys */
    int64_t nblocks;            /* block keys computed */
} ref_qsa_cache;

typedef struct ref_qsa_ws {
    ref_mm_ws mm;
    float *qg, *q, *k, *v, *o, *iq, *iqn, *rope, *scores;
    int64_t cap_qg, cap_q, cap_k, cap_v, cap_o, cap_iq, cap_iqn, cap_rope, cap_scores;
    ref_topk_pair *pairs;       /* [workers, max blocks] */
    float *bscore;              /* [workers, max blocks] block scores */
    int64_t cap_pairs, cap_bscore;
    int32_t *sel;               /* [M, topk] */
    int64_t *nsel;              /* [M] */
    int64_t cap_sel, cap_nsel;
} ref_qsa_ws;

void ref_qsa_cache_free(ref_qsa_cache *c);
void ref_qsa_ws_free(ref_qsa_ws *ws);

td_status ref_qsa_run(const ref_qsa_weights *w, const ref_qsa_dims *d, const ref_numerics *nx, ref_pool *pool,
                      ref_qsa_ws *ws, ref_qsa_cache *cache, const float *x, int64_t m, float *out,
                      int32_t *sel_out, td_err *err);

#endif /* TD_REF_QSA_H */
