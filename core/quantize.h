/* quantize.h — quantize a BF16/F16/F32 checkpoint to NVFP4 (`tandem quantize`).
 *
 * td_quantize() reads an unquantized qwen3_next / qwen4_exp checkpoint directory, selects the
 * linear modules to quantize, and writes a new checkpoint directory in which every selected
 * module is NVFP4 and everything else is copied byte for byte.
 *
 * Contract
 * - Algorithm: exactly td_nvfp4_quantize() (core/nvfp4.h, NVFP4_SPEC.md §3.3) in the chosen
 *   convention: ModelOpt (weight / weight_scale / weight_scale_2 = amax/2688, scalar []) or
 *   compressed-tensors (weight_packed / weight_scale / weight_global_scale = 2688/amax, [1]).
 *   BF16/F16 inputs are widened to float32 exactly. A module `P.gate_proj` and its sibling
 *   `P.up_proj` that are both selected share one amax (the max of the two), so they get one
 *   global scale (§3.7); everything else uses its own max|w|. All-zero blocks and tensors
 *   follow the convention (ModelOpt scale 1.0, CT 0.125; an all-zero tensor gets global 1.0).
 *   Weight-only: no activation scales are invented, so the metadata says W4A16_NVFP4
 *   (ModelOpt) or NVFP4A16 (compressed-tensors, input_activations null).
 * - Selection: candidates are the linear modules of the config's inventory (core/layout.h),
 *   named without ".weight". Default globs (the ModelOpt NVFP4 recipe, MODEL_SPEC.md A6):
 *   "*.mlp.experts.*", "*.mlp.shared_expert.*", "*.self_attn.o_proj",
 *   "*.linear_attn.out_proj". `only` globs replace the default set; `exclude` globs remove
 *   modules from it (fnmatch(3) on module names). A glob that matches no candidate is an error
 *   (TD_ERR_ARG naming it), as is a selected module whose input dimension is not a multiple of
 *   16 or whose tensor is not BF16/F16/F32. Embeddings, norms, convs, the PLE table, MTP and
 *   vision tensors are never quantized.
 * - Fused experts: 3-D `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows first) and
 *   `mlp.experts.down_proj` [E, H, I], as transformers writes them in memory, are split into
 *   the per-expert modules of the real NVFP4 releases (`mlp.experts.E.gate_proj` etc.) when
 *   any expert of the layer is selected (unselected experts become per-expert slices in the
 *   input dtype); otherwise they are copied whole. Any other shape is refused.
 * - Metadata: ModelOpt writes hf_quant_config.json and config.json quantization_config
 *   (quant_method "modelopt") with the same exclusion list; CT writes config.json
 *   quantization_config (quant_method "compressed-tensors", format "nvfp4-pack-quantized",
 *   targets ["Linear"]) with an ignore list of exact names and "re:" regexes. The lists cover
 *   every unselected linear-like module (numeric path components generalized to wildcards
 *   where that matches no selected module), and are verified before writing: every candidate
 *   resolves (core/quant.h) to exactly the scheme written, so `tandem inspect` of the output
 *   is clean. Other top-level files (tokenizer, generation_config.json, ...) are copied;
 *   tandem_quantize.json records the options and the input's provenance.
 * - Output: same sharding as the input (same file names) by default, or shards of at most
 *   shard_bytes. Written into OUT.tmp and renamed at the end (core/gen.h td_gen_outdir_*);
 *   an existing OUT is refused unless force. An input that already carries quantization
 *   metadata is refused. On any failure OUT is left untouched.
 * - Streaming: one module at a time from the memory-mapped input; memory is bounded by the
 *   largest selected module (float32 copy plus its packed bytes and scales), not the model.
 * - Dequant manifest (optional): for every NVFP4 module, the SHA-256 of its dequantization
 *   (td_nvfp4_dequantize(), float32 little-endian, row-major [out, in]) and of its packed and
 *   scale bytes, the global's bits and the first values, as JSON — what
 *   scripts/quantize_crosscheck.py compares against an independent torch dequantization.
 * - Errors name the file, tensor, module or option. Single-threaded; no global state.
 */
#ifndef TD_QUANTIZE_H
#define TD_QUANTIZE_H

#include "nvfp4.h"
#include "td.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_quantize_opts {
    const char *in_dir;
    const char *out_dir;
    td_nvfp4_conv conv;             /* TD_NVFP4_MODELOPT (default) or TD_NVFP4_CT */
    const char *const *only;        /* [n_only] globs replacing the default selection */
    size_t n_only;
    const char *const *exclude;     /* [n_exclude] globs removed from the selection */
    size_t n_exclude;
    int64_t shard_bytes;            /* 0 = same shards as the input; > 0 = by size */
    bool force;                     /* replace an existing OUT */
    bool progress;                  /* progress bar on stderr when it is a terminal */
    const char *dequant_manifest;   /* path of the dequant manifest to write, or NULL */
} td_quantize_opts;

typedef struct td_quantize_result {
    int64_t modules_quantized;      /* NVFP4 modules written */
    int64_t modules_split;          /* per-expert modules cut out of fused 3-D tensors */
    int64_t tensors_in, tensors_out, tensors_copied;
    int64_t bytes_in, bytes_out;    /* tensor bytes */
    int64_t bytes_quantized_in;     /* input bytes of the quantized modules */
    int64_t files_copied;           /* non-tensor files copied */
    int64_t shards_out;
    size_t n_exclusions;            /* entries in the written exclusion/ignore list */
    double seconds;
} td_quantize_result;

/* Defaults: ModelOpt, same sharding, no globs, everything else 0/NULL/false. */
void td_quantize_opts_init(td_quantize_opts *o);

/* The default selection globs (the ModelOpt NVFP4 recipe). */
size_t td_quantize_default_glob_count(void);
const char *td_quantize_default_glob(size_t i);

/* "modelopt" / "ct" (also "compressed-tensors") → convention; TD_ERR_ARG otherwise. */
td_status td_quantize_format_from_name(const char *name, td_nvfp4_conv *conv, td_err *err);

/* Quantize o->in_dir into o->out_dir. res may be NULL. */
td_status td_quantize(const td_quantize_opts *o, td_quantize_result *res, td_err *err);

#endif /* TD_QUANTIZE_H */
