/* model_flash.h — the whole qwen4_exp (Qwen3.8-Flash-Next text) model in the ref engine.
 *
 * Forward (MODEL_SPEC.md B3.3, B3.8) for the m tokens of one sequence:
 *   X_s = embed[token] for every stream s (hc streams, [m, hc H]);
 *   per layer L: if L carries PLE, X = fl32(X + PLE(X, tokens)) (ple.h);
 *     (xin, inj) = attn_hc.mix(X) (hc.h); y = GDN(xin) (gdn.h, split layout, sigmoid gate) or
 *     QSA(xin) (qsa.h); X = combine(X, y, inj);
 *     (xin, inj) = mlp_hc.mix(X); y = MoE(xin) (through the caller's moe callback, which runs
 *     the engine's MoE block); X = combine(X, y, inj);
 *   final mixer (the mix without inject) -> xin of the last token -> lm_head. No final norm.
 * Per sequence (ref_flash_seq): GDN conv + recurrent state, QSA KV / raw indexer key / block-key
 * caches, PLE conv state and n-gram context.
 * Taps (td_engine_put_tap, free when off): L{l}.ple.out [m, hc H], L{l}.hc_attn.mix [m, H],
 * L{l}.hc_attn.inject [m, hc], L{l}.hc_attn.combine [m, hc H], L{l}.attn.out / L{l}.gdn.out
 * [m, H], L{l}.qsa.blocks I32 [m, topk] (selected block ids, ascending, -1 padded),
 * L{l}.hc_mlp.mix, L{l}.hc_mlp.inject, L{l}.hc_mlp.combine (= L{l}.resid), the MoE taps (by the
 * callback), final.hidden [m, H] (final mixer output), logits [1, V].
 * Loading: weights are looked up lazily on the first forward (wload.h); the PLE constants are
 * computed from the config and compared with the checkpoint's I64 buffers when present (a
 * mismatch is an error naming the buffer); the n-gram table is FP8 (per-tensor
 * `ngram_embedding.weight_scale`) or BF16/F16/F32, in split_ngram_parts shards.
 *
 * Contract: ref_flash_new borrows cfg, set, quant, nx and pool (they must outlive it);
 * everything else is owned. One forward at a time.
 */
#ifndef TD_REF_MODEL_FLASH_H
#define TD_REF_MODEL_FLASH_H

#include "config.h"
#include "engine.h"
#include "linear.h"
#include "pool.h"
#include "quant.h"
#include "safetensors.h"

typedef struct ref_flash ref_flash;
typedef struct ref_flash_seq ref_flash_seq;

/* Runs layer L's MoE block on x [m, H] into out [m, H] (and its taps). */
typedef td_status (*ref_flash_moe_fn)(void *ctx, int64_t layer, const float *x, int64_t m, float *out,
                                      td_err *err);

td_status ref_flash_new(const td_config *cfg, td_st_set *set, const td_quant *quant, const char *prefix,
                        const ref_numerics *nx, ref_pool *pool, ref_flash **out, td_err *err);
void ref_flash_free(ref_flash *f);

td_status ref_flash_seq_new(ref_flash *f, ref_flash_seq **out, td_err *err);
void ref_flash_seq_free(ref_flash *f, ref_flash_seq *s);

td_status ref_flash_forward(ref_flash *f, td_engine *e, ref_flash_seq *s, const int32_t *tokens, int64_t m,
                            ref_flash_moe_fn moe, void *moe_ctx, float *logits, td_err *err);

#endif /* TD_REF_MODEL_FLASH_H */
