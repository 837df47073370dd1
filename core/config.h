/* config.h — model configuration (config.json) of the two supported families.
 *
 * Families (MODEL_SPEC.md): `qwen3_next` (Qwen3-Next, Part A) and `qwen4_exp` (Qwen3.8-Flash-
 * Next, Part B; text model only). The text config is read from the top level or from
 * "text_config" (when present it wins; model_type "qwen4_exp_text" is accepted there).
 *
 * Contract
 * - td_config_parse() fills a caller-owned td_config from a parsed config.json tree; nothing
 *   is allocated (fixed-size arrays, TD_CONFIG_MAX_LAYERS layers). td_config_load() reads a
 *   directory's config.json (bounded size) and parses it.
 * - Required keys: model_type (or architectures naming a family), hidden_size,
 *   num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size. Every other key
 *   of MODEL_SPEC.md A1/B1 is optional with the family's documented default (docs/checkpoints.md
 *   lists them). A key of the wrong type or out of range is an error naming the file and key.
 * - Layer types: from "layer_types" when present (strings containing "linear" → GDN;
 *   other strings containing "attention" ("full_attention", "qwen_sparse_attention",
 *   "deepseek_sparse_attention", ...) and "hybrid_indexed" → attention; anything else is an
 *   error), else derived from
 *   full_attention_interval: layer i is attention iff (i+1) % interval == 0.
 * - RoPE: "rope_parameters" (rope_theta, partial_rotary_factor, rope_type) takes precedence
 *   over top-level rope_theta / partial_rotary_factor.
 * - "tandem_layers_present" (tandem's own key, top level or text config): the checkpoint holds
 *   the tensors of these layers only (global tensors always); sorted, unique, in range.
 * - Consistency checks: positive dimensions; heads divisible by KV heads; linear value heads
 *   divisible by linear key heads; top-k <= experts; layer_types length = num_hidden_layers;
 *   rotary dim even and <= head_dim; PLE layer ids within 1..num_hidden_layers; for qwen4_exp
 *   hc_count >= 1 and ple_embed_dim divisible by the number of n-gram heads.
 * - Pure; thread-safe.
 */
#ifndef TD_CONFIG_H
#define TD_CONFIG_H

#include "td.h"
#include "json.h"

#include <stdbool.h>

#define TD_CONFIG_MAX_LAYERS 1024
#define TD_CONFIG_MAX_PLE 16

typedef enum td_family {
    TD_FAMILY_UNKNOWN = 0,
    TD_FAMILY_QWEN3_NEXT,
    TD_FAMILY_QWEN4_EXP,
    TD_FAMILY_COUNT
} td_family;

typedef enum td_layer_type {
    TD_LAYER_GDN = 0,       /* Gated DeltaNet ("linear_attention") */
    TD_LAYER_ATTENTION = 1, /* gated full attention (QSA in qwen4_exp) */
} td_layer_type;

typedef struct td_config {
    td_family family;
    char model_type[64];          /* as written ("qwen3_next", "qwen4_exp", "qwen4_exp_text") */
    char architecture[128];       /* first entry of "architectures", or "" */
    bool has_text_config;         /* dims came from "text_config" */

    /* shared dimensions */
    int64_t hidden_size, num_hidden_layers, vocab_size;
    int64_t num_attention_heads, num_key_value_heads, head_dim;
    double partial_rotary_factor, rope_theta;
    char rope_type[32];
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings, attention_bias;
    char hidden_act[16];
    int64_t bos_token_id, eos_token_id; /* -1 when absent; first id when a list */

    /* layer pattern */
    int64_t full_attention_interval;
    bool layer_types_given;
    td_layer_type layer_types[TD_CONFIG_MAX_LAYERS];

    /* Gated DeltaNet */
    int64_t linear_num_key_heads, linear_num_value_heads;
    int64_t linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim;
    char output_gate_type[16];    /* "silu" (qwen3_next) or "sigmoid" (qwen4_exp) */

    /* MoE */
    int64_t num_experts, num_experts_per_tok, moe_intermediate_size;
    int64_t shared_expert_intermediate_size, decoder_sparse_step, intermediate_size;
    bool norm_topk_prob;
    int64_t n_mlp_only_layers;
    int64_t mlp_only_layers[TD_CONFIG_MAX_LAYERS];

    /* Layer subset: a tandem extension key, "tandem_layers_present": [ids], written by
     * `tandem gen --layers` for production-shape checkpoints that hold only some layers of a
     * deep model. 0 = every layer is present. Sorted, unique, each < num_hidden_layers. */
    int64_t n_layers_present;
    int64_t layers_present[TD_CONFIG_MAX_LAYERS];

    /* MTP (speculative head; not part of plain decoding) */
    int64_t mtp_num_layers;

    /* qwen4_exp: hyper-connections, QSA indexer, PLE */
    int64_t hc_count, hc_lowrank;
    int64_t indexer_n_heads, indexer_kv_heads, indexer_head_dim;
    int64_t indexer_budget, indexer_compress_ratio;
    int64_t n_ple_layers;
    int64_t ple_layer_ids[TD_CONFIG_MAX_PLE]; /* 1-based as in the config */
    int64_t ple_embed_dim, ple_conv_kernel_size;
    int64_t ngram_size, heads_per_ngram, ngram_vocab_size_base;
    int64_t make_ngram_vocab_size_divisible_by, split_ngram_parts;
    int64_t seed;
} td_config;

/* Parse from a config.json tree; `what` names the file in messages. */
td_status td_config_parse(const cJSON *root, const char *what, td_config *cfg, td_err *err);
/* Read DIR/config.json and parse it. */
td_status td_config_load(const char *dir, td_config *cfg, td_err *err);

const char *td_family_name(td_family f);
const char *td_layer_type_name(td_layer_type t);

/* Rotary dimension = floor(head_dim * partial_rotary_factor). */
int64_t td_config_rotary_dim(const td_config *cfg);
/* true when layer l (0-based) has tensors in the checkpoint (see n_layers_present). */
bool td_config_layer_present(const td_config *cfg, int64_t layer);
/* true when layer l (0-based) has a MoE block (mlp_only_layers / decoder_sparse_step rule). */
bool td_config_layer_is_moe(const td_config *cfg, int64_t layer);
/* true when layer l (0-based) carries a PLE block (qwen4_exp). */
bool td_config_layer_has_ple(const td_config *cfg, int64_t layer);
/* Number of layers of each type. */
int64_t td_config_count_layers(const td_config *cfg, td_layer_type t);

#endif /* TD_CONFIG_H */
