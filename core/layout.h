/* layout.h — the tensor inventory a config implies (names, kinds, logical shapes).
 *
 * From a td_config and a name prefix ("model." for qwen3_next, "model.language_model." for
 * the qwen4_exp release; td_layout_detect_prefix picks it from the tensor names present),
 * td_layout_build() lists every module the forward pass of MODEL_SPEC.md Parts A/B reads:
 * embeddings, norms, linears (logical weight shape [out, in], before any quantization),
 * GDN conv and gate parameters, routed experts one module per (layer, expert, projection),
 * shared experts, HC mixers, the PLE block with its hashed n-gram table shards and buffers.
 * Layers absent from a layer-subset checkpoint (config "tandem_layers_present") are skipped.
 * MTP (`mtp.*`) and vision (`*.visual.*`) tensors are not part of the inventory.
 *
 * Contract
 * - td_layout_build() allocates the module array; free with td_layout_free (NULL-safe).
 * - Module names have no ".weight" suffix for LINEAR/EMBEDDING/NORM/CONV/TABLE kinds (the
 *   tensor is NAME.weight, or NAME.shard_I.weight for TABLE); PARAM and BUFFER names are the
 *   full tensor names.
 * - Routed experts carry `expert` >= 0 and `moe_proj` (gate/up/down); checkpoints may instead
 *   store them fused per layer (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
 *   [E, H, I]); td_layout_fused_experts gives those names and shapes.
 * - td_ple_table_dims computes the hashed n-gram table geometry (MODEL_SPEC.md B3.4): per head
 *   the (l*heads + h + 1)-th prime >= ngram_vocab_size_base, offsets as prefix sums, total
 *   padded to make_ngram_vocab_size_divisible_by, split into split_ngram_parts shards.
 * - Pure functions otherwise; thread-safe.
 */
#ifndef TD_LAYOUT_H
#define TD_LAYOUT_H

#include "config.h"
#include "safetensors.h"

typedef enum td_mod_kind {
    TD_MOD_LINEAR = 0,   /* NAME.weight [out, in] (quantizable) */
    TD_MOD_EMBEDDING,    /* NAME.weight [rows, dim] */
    TD_MOD_NORM,         /* NAME.weight [n] */
    TD_MOD_CONV,         /* NAME.weight [channels, 1, kernel] */
    TD_MOD_PARAM,        /* full tensor name, float [n] */
    TD_MOD_BUFFER,       /* full tensor name, I64 [n]; optional in checkpoints */
    TD_MOD_TABLE,        /* NAME.shard_I.weight [rows/parts, dim], I = 0..parts-1 */
    TD_MOD_KIND_COUNT
} td_mod_kind;

typedef enum td_moe_proj { TD_MOE_NONE = 0, TD_MOE_GATE, TD_MOE_UP, TD_MOE_DOWN } td_moe_proj;

typedef struct td_module {
    char name[128];
    td_mod_kind kind;
    int ndim;
    int64_t shape[3];
    int32_t layer;       /* -1 for global modules */
    int32_t expert;      /* routed expert index, -1 otherwise */
    td_moe_proj moe_proj;
    int32_t parts;       /* TD_MOD_TABLE: number of shards */
} td_module;

typedef struct td_layout {
    td_module *mods;
    size_t n;
    char prefix[64];
} td_layout;

const char *td_mod_kind_name(td_mod_kind k);

/* "model.language_model." if any name starts with it, else "model.". */
const char *td_layout_detect_prefix(size_t n_names, const char *const *names);
/* The same over every tensor name of a checkpoint (opens no shard). */
const char *td_layout_set_prefix(const td_st_set *s);

td_status td_layout_build(const td_config *cfg, const char *prefix, td_layout *out, td_err *err);
void td_layout_free(td_layout *l);

/* Names and shapes of the fused expert tensors of layer L. */
void td_layout_fused_experts(const td_config *cfg, const char *prefix, int64_t layer,
                             char gate_up[128], int64_t gate_up_shape[3], char down[128],
                             int64_t down_shape[3]);

#define TD_PLE_MAX_HEADS 64
typedef struct td_ple_dims {
    int64_t heads;                       /* (ngram_size - 1) * heads_per_ngram */
    int64_t head_dim;                    /* ple_embed_dim / heads */
    int64_t sizes[TD_PLE_MAX_HEADS];     /* prime table size per head */
    int64_t offsets[TD_PLE_MAX_HEADS];   /* first row of each head */
    int64_t rows;                        /* padded total rows */
    int64_t parts;                       /* shards */
    int64_t rows_per_part;
} td_ple_dims;

/* Geometry of PLE module `ple_index` (its position in ple_layer_ids). */
td_status td_ple_table_dims(const td_config *cfg, int64_t ple_index, td_ple_dims *out, td_err *err);

#endif /* TD_LAYOUT_H */
