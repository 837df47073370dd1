/* ple.h — hashed n-gram per-layer embedding (PLE) of Qwen3.8-Flash-Next (MODEL_SPEC.md B3.4).
 *
 * Constants (from the config; checked against the checkpoint's stored buffers by the loader):
 * - ref_splitmix64(v): v += 0x9E3779B97F4A7C15; v = (v ^ v>>30) * 0xBF58476D1CE4E5B9;
 *   v = (v ^ v>>27) * 0x94D049BB133111EB; v ^= v>>31 (mod 2^64).
 * - multiplier n (n = 0 .. ngram_size-1) of PLE module l: half = ((2^63 - 1) / V) / 2,
 *   m_n = 2 * (splitmix64(seed + 10007 l + 0x9E3779B97F4A7C15 (n + 1)) mod half) + 1.
 * - head sizes / offsets: td_ple_table_dims (core/layout.h).
 * Hash (ref_ple_hash), per token position p, over the history = the n-1 context tokens carried
 * from earlier calls (initially all EOS) + this call's tokens: t_0 = token[p]; for s >= 1
 * t_s = EOS when any of token[p-s .. p-1] is EOS, else token[p-s] (EOS segmentation). For
 * order o = 2 .. ngram_size: mix = XOR over s < o of (t_s * m_s) (uint64; the products do not
 * overflow since t < V), and head h of that order (heads_per_ngram per order, order 2 first):
 * id_h = mix mod P_h + offset_h. The context is updated to the last n-1 tokens of the history.
 * Block (ref_ple_run), input the 4-stream state X [M, hc H] and the tokens:
 *   e   = concat_h table[id_h]       [D]; FP8 rows are fl32(e4m3 * scale), BF16/F32 exact
 *   K   = grouped norm(key_proj e; norm_key), v = value_proj e   (linear.h, hc.h)
 *   Qn  = grouped norm(X; norm_query)
 *   a_s = fl32(dot_s / fl32(sqrt(H))), dot_s = sum over i ascending of fl32(K_si * Qn_si) from +0
 *   a_s = sign(a_s) fl32(sqrt(max(|a_s|, 1e-6)))  (sign(0) = 0; sqrt in double, rounded once)
 *   G   = fl32(sigmoid(a_s) * v_i) per stream, Gn = grouped norm(G; norm_conv)
 *   C[c, t] = silu(acc), acc = +0, for j = 0 .. K-1 ascending
 *             acc = fl32(acc + fl32(w[c, j] * Gn[c, t - dil (K-1-j)])) (zeros before the start,
 *             earlier values from the conv state: the last dil (K-1) Gn rows, oldest first)
 *   out = fl32(G + C)   (the caller adds it to X)
 * Work is split across tokens and channel chunks; every value is computed by one thread in
 * this order, so results do not depend on the thread count, and prefill(n) + decode(1) is bit
 * identical to prefill(n + 1).
 *
 * Contract: state/workspace grow only; ref_ple_state_init allocates; weights are views.
 */
#ifndef TD_REF_PLE_H
#define TD_REF_PLE_H

#include "mm.h"
#include "tensor.h"

#define REF_PLE_MAX_NGRAM 8
#define REF_PLE_MAX_HEADS 64

typedef struct ref_ple_dims {
    int64_t hidden, hc, embed_dim;     /* H, streams, D (table row concat width) */
    int64_t ngram, heads_per_ngram, heads, head_dim;
    int64_t kconv, dilation;
    int64_t eos, vocab;
    float eps;
} ref_ple_dims;

typedef struct ref_ple_table {
    int64_t parts, rows_per_part, dim;
    td_dtype dtype;                    /* TD_F8_E4M3 (with scale), TD_BF16, TD_F32 */
    const uint8_t *const *shards;      /* [parts] row 0 of each shard (not owned) */
    float scale;                       /* FP8 per-tensor scale (1 otherwise) */
} ref_ple_table;

typedef struct ref_ple_weights {
    ref_linear key, value;             /* [hc H, D], [H, D] */
    const float *norm_key, *norm_query, *norm_conv; /* [hc H] zero-centred */
    const float *conv_w;               /* [hc H, K] */
    ref_ple_table table;
    uint64_t mult[REF_PLE_MAX_NGRAM];
    int64_t sizes[REF_PLE_MAX_HEADS], offsets[REF_PLE_MAX_HEADS];
} ref_ple_weights;

typedef struct ref_ple_state {
    int32_t ctx[REF_PLE_MAX_NGRAM];    /* last ngram-1 tokens, oldest first */
    float *conv;                       /* [hc H, dil (K-1)] oldest first */
} ref_ple_state;

typedef struct ref_ple_ws {
    ref_mm_ws mm;
    int64_t *ids;                      /* [M, heads] */
    float *e, *k, *v, *q, *g, *gn;     /* [M, D], [M, P], [M, H], [M, P] x3 */
    float *a;                          /* [M, hc] gate logits after the signed sqrt */
    int64_t cap_ids, cap_e, cap_k, cap_v, cap_q, cap_g, cap_gn, cap_a;
} ref_ple_ws;

uint64_t ref_splitmix64(uint64_t v);
void ref_ple_multipliers(int64_t seed, int64_t ple_index, int64_t vocab, int64_t n, uint64_t *out);

td_status ref_ple_state_init(ref_ple_state *s, const ref_ple_dims *d, td_err *err);
void ref_ple_state_free(ref_ple_state *s);
void ref_ple_ws_free(ref_ple_ws *ws);

/* Row ids [M, heads] for M tokens; updates ctx. */
void ref_ple_hash(const ref_ple_dims *d, const uint64_t *mult, const int64_t *sizes, const int64_t *offsets,
                  int32_t *ctx, const int32_t *tokens, int64_t m, int64_t *ids);
/* One table row [dim] as float32. */
void ref_ple_table_row(const ref_ple_table *t, int64_t id, float *out);

/* out [M, hc H] = PLE(X); ids_out (optional) receives the row ids [M, heads]. */
td_status ref_ple_run(const ref_ple_weights *w, const ref_ple_dims *d, const ref_numerics *nx, ref_pool *pool,
                      ref_ple_ws *ws, ref_ple_state *s, const float *X, const int32_t *tokens, int64_t m,
                      float *out, td_err *err);

#endif /* TD_REF_PLE_H */
