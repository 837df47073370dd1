/* quant.h — quantization metadata of a checkpoint and the per-module scheme resolver.
 *
 * Sources (NVFP4_SPEC.md §4):
 * - hf_quant_config.json (ModelOpt legacy file): producer, quantization.{quant_algo,
 *   group_size, exclude_modules (fnmatch globs), kv_cache_quant_algo}; for MIXED_PRECISION,
 *   quantization.quantized_layers maps module → {quant_algo, group_size}.
 * - config.json "quantization_config" with quant_method "modelopt" (quant_algo, ignore,
 *   quantized_layers for MIXED_PRECISION) or "compressed-tensors" (format
 *   "nvfp4-pack-quantized", config_groups with targets and weights args, ignore).
 * When both files are present, hf_quant_config.json is used and config.json's copy is compared
 * (an algorithm or exclusion-count disagreement is reported as a note, not an error).
 * No metadata at all means an unquantized checkpoint.
 *
 * Contract
 * - td_quant_load() fills a td_quant that owns its strings; free with td_quant_free
 *   (NULL-safe, idempotent). td_quant_parse_*() parse from JSON trees (fuzzable).
 * - td_quant_resolve(q, module) says, for a *linear or embedding module name* (no ".weight"
 *   suffix), which scheme applies and which tensor names hold it. Matching rules:
 *   ModelOpt exclude/ignore entries match by fnmatch(3) wildcard, by exact name, or with the
 *   "model.language_model." prefix rewritten to "model." (as vLLM does); compressed-tensors
 *   ignore entries are exact names or "re:" POSIX extended regexes (anchored full match;
 *   compiled once at parse time; at most TD_QUANT_RE_MAX bytes, no bounded repetition "{m,n}"
 *   and no quantifier directly after another, so a hostile pattern cannot blow up the
 *   compiler — such a pattern is a format error naming it);
 *   targets "Linear" matches every linear module. MIXED_PRECISION: a module is quantized only
 *   when it (or its parent for expert submodules "...experts.E.proj") is listed in
 *   quantized_layers. `is_linear` false (embeddings, tables) means only MIXED_PRECISION entries
 *   can quantize it.
 * - Errors (bad JSON types, unsupported quant_algo/format, bad regex) name the file and key.
 */
#ifndef TD_QUANT_H
#define TD_QUANT_H

#include "td.h"
#include "json.h"

#include <regex.h>
#include <stdbool.h>

typedef enum td_scheme {
    TD_SCHEME_NONE = 0,    /* unquantized: BF16/F16/F32 weight */
    TD_SCHEME_NVFP4,       /* ModelOpt NVFP4: weight U8, weight_scale F8_E4M3, weight_scale_2 F32 */
    TD_SCHEME_NVFP4_CT,    /* compressed-tensors: weight_packed, weight_scale, weight_global_scale */
    TD_SCHEME_FP8,         /* per-tensor FP8: weight F8_E4M3 + weight_scale */
    TD_SCHEME_FP8_BLOCK,   /* 128x128 block FP8: weight F8_E4M3 + weight_scale_inv */
    TD_SCHEME_COUNT
} td_scheme;

typedef enum td_quant_source {
    TD_QUANT_SRC_NONE = 0,
    TD_QUANT_SRC_HF_QUANT_CONFIG,  /* hf_quant_config.json */
    TD_QUANT_SRC_MODELOPT_CONFIG,  /* config.json quantization_config, quant_method modelopt */
    TD_QUANT_SRC_CT_CONFIG,        /* config.json quantization_config, compressed-tensors */
} td_quant_source;

typedef struct td_quant_layer {
    char *module;                  /* quantized_layers key */
    td_scheme scheme;
    int64_t group_size;
} td_quant_layer;

typedef struct td_quant {
    td_quant_source source;
    char producer[64];             /* "modelopt", "compressed-tensors", "" */
    char quant_algo[32];           /* "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION", "" */
    td_scheme scheme;              /* scheme of non-excluded linears (not MIXED_PRECISION) */
    bool mixed;                    /* MIXED_PRECISION */
    bool has_input_scale;          /* W4A4: activations quantized too (input_scale expected) */
    int64_t group_size;
    char kv_cache_quant_algo[16];
    char **exclude;                /* exclude_modules / ignore entries */
    size_t n_exclude;
    char **targets;                /* compressed-tensors targets ("Linear", names, re:) */
    size_t n_targets;
    regex_t **re;                  /* [n_exclude + n_targets]: compiled "re:" entries (anchored),
                                      NULL for the others; owned */
    td_quant_layer *layers;        /* MIXED_PRECISION quantized_layers */
    size_t n_layers;
    char note[512];                /* informational remark (e.g. two sources disagree) */
} td_quant;

/* Tensor names of one module under its scheme. Unused slots are "". */
typedef struct td_quant_tensors {
    td_scheme scheme;
    char weight[512];              /* packed or plain weight */
    char scale[512];               /* block scale / FP8 scale; "" for NONE */
    char global[512];              /* NVFP4 per-tensor global; "" otherwise */
    char input_scale[512];         /* W4A4 activation global; "" when not expected */
} td_quant_tensors;

#define TD_QUANT_RE_MAX 256

/* "unquantized" (BF16, F16 or F32 weights), "NVFP4", "NVFP4-CT", "FP8", "FP8-BLOCK"; "?" out of range. */
const char *td_scheme_name(td_scheme s);

td_status td_quant_load(const char *dir, td_quant *q, td_err *err);
td_status td_quant_parse_hf(const cJSON *root, const char *what, td_quant *q, td_err *err);
td_status td_quant_parse_config(const cJSON *quantization_config, const char *what, td_quant *q,
                                td_err *err);
void td_quant_free(td_quant *q);

/* Scheme of a module and its tensor names. */
td_status td_quant_resolve(const td_quant *q, const char *module, bool is_linear,
                           td_quant_tensors *out, td_err *err);

#endif /* TD_QUANT_H */
