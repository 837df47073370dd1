/* engine.h — the engine contract: variants, the engine interface (load, run_block,
 * prefill/decode, taps, free) and the registry of engines.
 *
 * tandem runs engines side by side on one checkpoint and compares them. Every engine (the
 * scalar reference `ref`, the CUDA engine `cuda`, a later third one) implements td_engine_ops,
 * so audits never know which engine they drive. docs/engine.md describes the contract for
 * users; this header is the API.
 *
 * Variants
 * - A variant is written `engine` or `engine:option=value,option=value,...`, e.g. `ref`,
 *   `ref:scale=fp16`, `cuda:storage=raw,graphs=on`. td_variant_parse() checks it completely:
 *   the engine must be registered (a registered engine that this build lacks still parses, so
 *   `cuda:...` can be validated on a CPU build; loading it fails), every option must be known,
 *   supported by that engine, given at most once and have a valid value, and tp_rank must be
 *   below tp_size. Errors are TD_ERR_ARG naming the variant text and the option at fault.
 * - Options (defaults first): storage=prepared|raw, moe_dispatch=direct|grouped,
 *   act_dtype=fp32|fp16|bf16, accum=fp32|fp64, scale=exact|fp16, tp_size=N (1..64),
 *   tp_rank=R|all (0..tp_size-1; `all` = every rank, reduced), graphs=off|on,
 *   threads=N|auto (auto = every online CPU), fault=none|nibble_order|reciprocal_global|
 *   gate_up_swap|no_renorm|tp_slice|topk_skip|no_route_taps (a planted bug for audit self-tests;
 *   never for results),
 *   kernels=fast|generic (generic: an engine's specialised fast kernels are replaced by the
 *   general ones they must match bit for bit; the cuda engine's decode and routing kernels).
 *   td_engine_find(name)->options says which options an engine accepts.
 * - td_variant_format() writes the canonical text: the engine, then every option that differs
 *   from its default, in the order above. Two variants with the same canonical text compute
 *   the same thing, except that threads=auto is not resolved (td_variant_resolve does that).
 * - Options are either numerically neutral (storage, graphs, threads, fault, kernels: a
 *   correct engine gives the same bits; a fault is a bug pretending to be neutral) or numeric
 *   (moe_dispatch, act_dtype, accum, scale, tp_size, tp_rank). td_opt_is_neutral() tells which; audits derive
 *   a pair's default expectation from it.
 *
 * Engines
 * - td_engine_load() (declared in audit/engines.h, which binds the registry's names to the
 *   implementations built into this binary, so that core/ depends on no engine) finds the
 *   variant's engine and calls its load; the engine keeps a resolved copy of the variant and
 *   describes the model (td_engine_model). Loading is cheap: engines map tensors lazily (a
 *   layer is read on its first use). An engine that this build lacks fails with
 *   TD_ERR_UNSUPPORTED ("engine 'cuda' is not built: ...").
 * - td_engine_run_block() runs one block of one layer on caller-given activations:
 *     TD_BLOCK_MOE     input [n_tokens, hidden] -> output [n_tokens, hidden] (the MoE block
 *                      output: routed experts plus the gated shared expert; with tp_size > 1
 *                      one rank's partial sum, or the rank-ordered reduction for tp_rank=all)
 *     TD_BLOCK_ROUTER  input [n_tokens, hidden] -> output [n_tokens, num_experts] (logits)
 *     TD_BLOCK_ATTN    input [n_tokens, hidden] (after the layer's input_layernorm) -> output
 *     TD_BLOCK_GDN     [n_tokens, hidden] (the token mixer's output before the residual add:
 *                      gated attention of a full_attention layer / Gated DeltaNet of a
 *                      linear_attention layer), computed from a fresh state on every call
 *                      (empty KV cache, zero conv and recurrent state: the prefill of n_tokens
 *                      of a new sequence), so a call is self-contained; with tp_size > 1 one
 *                      rank's output-projection partial, or the rank-ordered reduction for
 *                      tp_rank=all. The wrong block for the layer's type is TD_ERR_ARG.
 *   Activations are float32 in both directions; values are representable in act_dtype where
 *   the engine rounds (docs/engine.md lists the rounding points). For TD_BLOCK_MOE the caller
 *   may impose routes (route_ids and route_weights, [n_tokens, top_k] each) instead of the
 *   checkpoint's router; an id outside [0, num_experts) fails with TD_ERR_RANGE naming the
 *   token, slot and id, and nothing is read out of bounds. Blocks an engine does not implement
 *   (HC, PLE until the qwen4_exp model; every block on engines without it) and models without
 *   prefill/decode are TD_ERR_UNSUPPORTED: never a silent no-op.
 * - The common checks (non-NULL buffers, 1 <= n_tokens <= TD_ENGINE_MAX_TOKENS, layer within
 *   the model, route arrays given together) are done here before the engine is called.
 *
 * Taps
 * - A td_taps set holds the names (exact names or fnmatch globs such as "L*.moe.*") a caller
 *   wants captured. td_engine_set_taps() lends it to an engine; while running, the engine asks
 *   td_taps_wants(name) before building a tap and copies it with td_taps_put(). With no tap
 *   set (the default) nothing is built or copied: a tap costs one NULL test when off.
 * - Tap names are stable (they are the keys of the results store): per layer
 *   `L{l}.hc_attn.mix`, `L{l}.attn.out`, `L{l}.gdn.out`, `L{l}.moe.router_logits`,
 *   `L{l}.moe.topk`, `L{l}.moe.topk_weights`, `L{l}.moe.expert_act`, `L{l}.moe.expert_out`,
 *   `L{l}.moe.shared_out`, `L{l}.moe.out`, `L{l}.ple.out`, `L{l}.resid`; qwen4_exp also
 *   `L{l}.hc_attn.inject`, `L{l}.hc_attn.combine`, `L{l}.hc_mlp.mix`, `L{l}.hc_mlp.inject`,
 *   `L{l}.hc_mlp.combine`, `L{l}.qsa.blocks` (I32 selected block ids); global
 *   `final.hidden`, `logits`. td_tap_known() checks a name against this list.
 * - td_taps_put() copies the data into a buffer owned by the set (grown when needed, reused
 *   across calls); a later put of the same name replaces it. td_taps_reset() forgets what was
 *   captured but keeps the buffers. Captured views stay valid until the next put of that name,
 *   reset or free.
 *
 * Ownership, errors, threads
 * - td_engine_free(), td_taps_free() are NULL-safe. The engine owns everything it allocates;
 *   the caller owns call buffers and the tap set (which must outlive its use by the engine).
 * - Errors are returned as td_status with a message naming the engine, variant, layer, tensor
 *   or option at fault.
 * - An engine and a tap set are used by one thread at a time (engines may use worker threads
 *   internally). Variant parsing and the registry are pure and thread-safe; no global
 *   mutable state.
 */
#ifndef TD_ENGINE_H
#define TD_ENGINE_H

#include "config.h"
#include "tensor.h"
#include "td.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- variants ------------------------------------------------------------------------------ */

typedef enum td_storage { TD_STORAGE_PREPARED = 0, TD_STORAGE_RAW, TD_STORAGE_COUNT } td_storage;
typedef enum td_moe_dispatch {
    TD_DISPATCH_DIRECT = 0,
    TD_DISPATCH_GROUPED,
    TD_DISPATCH_COUNT
} td_moe_dispatch;
typedef enum td_act_dtype { TD_ACT_FP32 = 0, TD_ACT_FP16, TD_ACT_BF16, TD_ACT_COUNT } td_act_dtype;
typedef enum td_accum { TD_ACCUM_FP32 = 0, TD_ACCUM_FP64, TD_ACCUM_COUNT } td_accum;
typedef enum td_scale_mode { TD_SCALE_EXACT = 0, TD_SCALE_FP16, TD_SCALE_COUNT } td_scale_mode;

/* Planted bugs for audit self-tests (docs/engine.md): each makes the engine wrong in one
 * well-known way while claiming to be equivalent to the default. */
typedef enum td_fault {
    TD_FAULT_NONE = 0,
    TD_FAULT_NIBBLE_ORDER,      /* E2M1 element 2j read from the high nibble */
    TD_FAULT_RECIPROCAL_GLOBAL, /* the ModelOpt global used as a divisor (CT: as a multiplier) */
    TD_FAULT_GATE_UP_SWAP,      /* SwiGLU computed as silu(up) * gate */
    TD_FAULT_NO_RENORM,         /* top-k probabilities not renormalized (norm_topk_prob ignored) */
    TD_FAULT_TP_SLICE,          /* W2 columns of rank (r+1) % tp_size paired with W13 rows of r */
    TD_FAULT_TOPK_SKIP,         /* the k-th expert of the top-k replaced by the (k+1)-th */
    TD_FAULT_NO_ROUTE_TAPS,     /* moe.topk and moe.router_logits not captured (an engine without
                                 * routing taps; the numbers are the default's) */
    TD_FAULT_COUNT
} td_fault;

typedef enum td_opt {
    TD_OPT_STORAGE = 0,
    TD_OPT_MOE_DISPATCH,
    TD_OPT_ACT_DTYPE,
    TD_OPT_ACCUM,
    TD_OPT_SCALE,
    TD_OPT_TP_SIZE,
    TD_OPT_TP_RANK,
    TD_OPT_GRAPHS,
    TD_OPT_THREADS,
    TD_OPT_FAULT,
    TD_OPT_KERNELS,
    TD_OPT_COUNT
} td_opt;

#define TD_OPT_BIT(o) (1u << (unsigned)(o))
#define TD_OPT_ALL ((1u << TD_OPT_COUNT) - 1u)

#define TD_ENGINE_NAME_MAX 16
#define TD_VARIANT_TEXT_MAX 256
#define TD_TP_RANK_ALL (-1)
#define TD_TP_MAX 64
#define TD_ENGINE_MAX_THREADS 256
#define TD_ENGINE_MAX_TOKENS (1 << 20)

typedef struct td_variant {
    char engine[TD_ENGINE_NAME_MAX]; /* registered engine name */
    td_storage storage;
    td_moe_dispatch moe_dispatch;
    td_act_dtype act_dtype;
    td_accum accum;
    td_scale_mode scale;
    int tp_size;                     /* 1..TD_TP_MAX */
    int tp_rank;                     /* 0..tp_size-1, or TD_TP_RANK_ALL */
    bool graphs;
    int threads;                     /* 0 = auto (every online CPU) */
    td_fault fault;
    bool generic;                    /* kernels=generic */
    unsigned set;                    /* TD_OPT_BIT(o) for every option given explicitly */
} td_variant;

/* Defaults for `engine` (no option set). The name is copied (truncated to fit). */
void td_variant_init(td_variant *v, const char *engine);

/* Parse `text` (see the contract above). On error *v is left in an unspecified state. */
td_status td_variant_parse(const char *text, td_variant *v, td_err *err);

/* Canonical text into buf (always NUL-terminated); returns buf. */
char *td_variant_format(const td_variant *v, char *buf, size_t cap);

/* Resolve threads=auto to the number of online CPUs (at most TD_ENGINE_MAX_THREADS). */
void td_variant_resolve(td_variant *v);

/* true when a and b have the same engine and the same value for every option (the `set`
 * bits are ignored; threads compared as stored, so resolve both first to compare effective
 * configurations). */
bool td_variant_equal(const td_variant *a, const td_variant *b);

/* Bitmask of the options whose values differ between a and b. */
unsigned td_variant_diff(const td_variant *a, const td_variant *b);

/* Option names ("storage", ...) and neutrality (see the contract). NULL / false for an
 * invalid value. */
const char *td_opt_name(td_opt o);
bool td_opt_is_neutral(td_opt o);

const char *td_act_dtype_name(td_act_dtype a);   /* "fp32", "fp16", "bf16" */
const char *td_accum_name(td_accum a);           /* "fp32", "fp64" */
const char *td_scale_mode_name(td_scale_mode s); /* "exact", "fp16" */
const char *td_storage_name(td_storage s);       /* "prepared", "raw" */
const char *td_moe_dispatch_name(td_moe_dispatch d); /* "direct", "grouped" */
const char *td_fault_name(td_fault f);           /* "none", "nibble_order", ... */
/* The safetensors-style dtype an activation dtype rounds to: TD_F32, TD_F16, TD_BF16. */
td_dtype td_act_dtype_tensor(td_act_dtype a);

/* ---- blocks -------------------------------------------------------------------------------- */

typedef enum td_block {
    TD_BLOCK_MOE = 0,      /* MoE block (router, top-k, routed experts, gated shared expert) */
    TD_BLOCK_ROUTER,       /* router logits only */
    TD_BLOCK_ATTN,         /* gated attention (ref: qwen3_next); QSA with the qwen4_exp model */
    TD_BLOCK_GDN,          /* Gated DeltaNet */
    TD_BLOCK_HC_MIX,       /* hyper-connection mix (full-model issues) */
    TD_BLOCK_HC_COMBINE,   /* hyper-connection combine (full-model issues) */
    TD_BLOCK_PLE,          /* per-layer n-gram embedding (full-model issues) */
    TD_BLOCK_COUNT
} td_block;

/* "moe", "router", "attn", "gdn", "hc_mix", "hc_combine", "ple"; NULL for an invalid value. */
const char *td_block_name(td_block b);

typedef struct td_block_call {
    int64_t layer;               /* 0-based layer index */
    td_block block;
    int64_t n_tokens;            /* M, 1..TD_ENGINE_MAX_TOKENS */
    const float *input;          /* [n_tokens, hidden] */
    float *output;               /* MOE, ATTN, GDN: [n_tokens, hidden]; ROUTER: [n_tokens, num_experts] */
    const int32_t *route_ids;    /* MOE, optional: [n_tokens, top_k] imposed routes */
    const float *route_weights;  /* with route_ids: [n_tokens, top_k] combine weights */
} td_block_call;

/* What an engine tells about the model it loaded. */
typedef struct td_engine_model {
    td_family family;
    int64_t hidden;              /* hidden_size */
    int64_t layers;              /* num_hidden_layers */
    int64_t num_experts;         /* routed experts (0 when the model has no MoE) */
    int64_t top_k;               /* num_experts_per_tok */
    int64_t moe_inter;           /* moe_intermediate_size (global, before TP) */
    int64_t shared_inter;        /* shared_expert_intermediate_size (0 = none) */
    bool norm_topk_prob;
} td_engine_model;

/* The description of the model a config gives (every field from its config.json key). */
void td_engine_model_from_config(const td_config *c, td_engine_model *m);

/* TD_OK when tp_size (>= 1) divides the config's routed and shared expert intermediate sizes
 * (always for a model without MoE); TD_ERR_ARG otherwise, the message naming the engine, both
 * sizes and the checkpoint. */
td_status td_engine_check_tp(const td_config *c, int tp_size, const char *engine, const char *checkpoint,
                             td_err *err);

/* ---- taps ---------------------------------------------------------------------------------- */

#define TD_TAP_NAME_MAX 64
#define TD_TAP_MAX_DIMS 4

typedef struct td_tap {
    char name[TD_TAP_NAME_MAX];
    td_dtype dtype;                 /* TD_F32 or TD_I32 */
    int ndim;
    int64_t shape[TD_TAP_MAX_DIMS];
    int64_t numel;
    const void *data;               /* owned by the tap set */
} td_tap;

typedef struct td_taps td_taps;

/* A tap set for `n` patterns (copied). n == 0 gives a set that wants nothing. Patterns longer
 * than TD_TAP_NAME_MAX - 1 fail with TD_ERR_ARG. */
td_status td_taps_new(const char *const *patterns, size_t n, td_taps **out, td_err *err);
void td_taps_free(td_taps *t);
/* Does the set want `name`? false for a NULL set. */
bool td_taps_wants(const td_taps *t, const char *name);
/* Capture a copy of `data` (dtype TD_F32 or TD_I32, row-major `shape`) under `name`. */
td_status td_taps_put(td_taps *t, const char *name, td_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, td_err *err);
/* Forget every captured tap (buffers are kept for reuse). */
void td_taps_reset(td_taps *t);
size_t td_taps_count(const td_taps *t);
/* i < td_taps_count(t), in capture order. */
const td_tap *td_taps_at(const td_taps *t, size_t i);
/* Captured tap by name, or NULL. */
const td_tap *td_taps_find(const td_taps *t, const char *name);

/* "L{layer}.{suffix}" into buf (or "{suffix}" when layer < 0); returns buf. */
char *td_tap_name(char *buf, size_t cap, int64_t layer, const char *suffix);
/* true when `name` is one of the stable tap names listed in the contract. */
bool td_tap_known(const char *name);

/* ---- engines ------------------------------------------------------------------------------- */

typedef struct td_engine td_engine;

typedef struct td_decode_item {
    int64_t seq;                 /* sequence id */
    int32_t token;               /* next token of that sequence */
} td_decode_item;

typedef struct td_engine_ops {
    const char *name;
    td_status (*load)(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err);
    td_status (*run_block)(td_engine *e, const td_block_call *call, td_err *err);
    /* logits [n_vocab] of the last token of a new sequence `seq` after `n` tokens. */
    td_status (*prefill)(td_engine *e, int64_t seq, const int32_t *tokens, int64_t n,
                         float *logits, td_err *err);
    /* logits [n, n_vocab]: one decode step for each (seq, token) of the batch. */
    td_status (*decode)(td_engine *e, const td_decode_item *batch, int64_t n, float *logits,
                        td_err *err);
    void (*free)(td_engine *e);
} td_engine_ops;

/* What an engine runs on, for the results store (runs.gpu_name, gpu_driver, cuda_version):
 * empty strings for engines on the host's CPU (the store records the CPU itself). */
typedef struct td_engine_device {
    char gpu_name[256];          /* e.g. "NVIDIA H100 80GB HBM3" (cudaDeviceProp.name's size) */
    char gpu_driver[64];         /* the kernel driver's version, e.g. "580.159.04" */
    char cuda_version[32];       /* the CUDA runtime the engine was built with, e.g. "13.0" */
} td_engine_device;

/* The part of every engine the interface sees; engines embed it as their first member. */
struct td_engine {
    const td_engine_ops *ops;
    td_variant variant;          /* resolved copy (threads=auto resolved) */
    td_engine_model model;
    td_engine_device device;     /* filled by the engine's load; all empty for CPU engines */
    td_taps *taps;               /* borrowed; NULL = taps off */
};

td_status td_engine_run_block(td_engine *e, const td_block_call *call, td_err *err);
td_status td_engine_prefill(td_engine *e, int64_t seq, const int32_t *tokens, int64_t n,
                            float *logits, td_err *err);
td_status td_engine_decode(td_engine *e, const td_decode_item *batch, int64_t n, float *logits,
                           td_err *err);
/* Lend a tap set (NULL turns taps off). */
void td_engine_set_taps(td_engine *e, td_taps *taps);
/* For engines: capture tap "L{layer}.{suffix}" ("{suffix}" when layer < 0) into the engine's
 * tap set when the set wants it; TD_OK and nothing copied when taps are off. */
td_status td_engine_put_tap(td_engine *e, int64_t layer, const char *suffix, td_dtype dtype, int ndim,
                            const int64_t *shape, const void *data, td_err *err);
const td_variant *td_engine_variant(const td_engine *e);
const td_engine_model *td_engine_model_info(const td_engine *e);
const td_engine_device *td_engine_device_info(const td_engine *e);
/* The NVIDIA kernel driver's version from the text of /proc/driver/nvidia/version (len bytes,
 * not NUL-terminated, hostile): the first token of its "NVRM version:" line made of digits
 * and dots with at least one dot ("580.159.04"), copied into out (cap bytes); "" when there is
 * none or it does not fit. */
void td_engine_driver_version(const char *text, size_t len, char *out, size_t cap);
/* The same from this host's /proc/driver/nvidia/version (its first 4 KB); "" when the file
 * is missing or holds no version. */
void td_engine_read_driver_version(char *out, size_t cap);
void td_engine_free(td_engine *e);

/* ---- registry ------------------------------------------------------------------------------ */

typedef struct td_engine_entry {
    const char *name;            /* "ref", "cuda" */
    const char *summary;         /* one line */
    unsigned options;            /* TD_OPT_BIT of every option it accepts */
} td_engine_entry;

size_t td_engine_count(void);
/* i < td_engine_count(). */
const td_engine_entry *td_engine_at(size_t i);
/* Entry by name, or NULL. */
const td_engine_entry *td_engine_find(const char *name);

#endif /* TD_ENGINE_H */
