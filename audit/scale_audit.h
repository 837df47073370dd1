/* scale_audit.h — Part 2 of `tandem audit e4m3`: may a checkpoint's E4M3 block scales be kept
 * raw (one byte each, expanded in the kernel) instead of as prepared FP16 scales without
 * changing a single bit of what the SM70 kernels multiply? (NVFP4_SPEC.md §5.8,
 * SEED_AUDITS.md §2.)
 *
 * For every NVFP4 module of the checkpoint (core/layout.h inventory, core/quant.h schemes;
 * narrowed by layers and routed experts), td_scale_audit() reads the block scales
 * (weight_scale, F8_E4M3 [N, K/16]) and the global (weight_scale_2 / weight_global_scale) and
 * evaluates, for every element, the arithmetic of core/e4m3_recon.h:
 *   prepared  = FP16(FP32(e4m3) * g)         g = the decode multiplier (ModelOpt: the stored
 *                                            global; compressed-tensors: fl32(1 / global))
 *   raw       = E4M3_torch(f32(prepared) / g)
 *   strict    = strict expansion of raw       must equal prepared          (check "strict")
 *   fast      = fast expansion of raw         must equal prepared * 2^14   (check "fast")
 *   prepared and effective finite                                          (check "finite")
 *   effective a positive FP16 normal, g finite and > 0                     (check "range")
 * An element failing any check is rejected; a tensor is admitted when no element is. A
 * rejected tensor carries its first offending element (row-major) and the reason class of
 * core/e4m3_recon.h.
 *
 * Exhaustiveness and speed: every check is a pure function of (code, global), so the default
 * mode evaluates the 256 codes once per global and weighs the results with the tensor's code
 * histogram; `elementwise` evaluates every element instead (same results, slower; tests and
 * the bench assert the equality). Counts, first offenders and verdicts are those of the
 * element-by-element evaluation in both modes.
 *
 * Reasons: every rejected element has a reason class (core/e4m3_recon.h); a tensor's (or
 * slice's) reason is the highest-precedence class among its rejected elements (the code
 * classes come first: a tensor with subnormal codes is rejected for them even when a tiny
 * prepared scale underflows earlier in the tensor), reported with the first element of that
 * class; the first rejected element of any class and the count per class are kept too.
 *
 * Stages and TP: routed experts form two stages per layer, "w13" (gate + up of every expert,
 * per-half globals) and "w2" (down, one global), as the MoE loader admits them; every other
 * NVFP4 module is a stage of its own. With tp > 1 each tensor is also judged per rank slice
 * (column-parallel modules split the rows; down_proj/o_proj/out_proj split K, i.e. the scale
 * columns), and stages are judged per rank, since rank slices are what a kernel holds. A
 * stage slice is admitted when all its tensors' slices are (and, for w13, both global-slot
 * layouts agree); memory saved by raw storage is elements - 4 * globals bytes per admitted
 * stage slice (FP16 -> one code byte each, plus an FP32 global per expert and half).
 *
 * Global-slot layout (w13): for the non-interleaved and the interleaved ((col/32)%2) layout,
 * each prepared column's origin half (gate/up) is compared with the slot the expander reads;
 * where they differ and the two globals differ, the element is re-evaluated with the slot's
 * global and failures are counted as layout mismatches. Sibling modules (gate/up, q/k/v) whose
 * globals differ are findings: real engines that keep one global for the fused GEMM mis-scale
 * them, even though the SM70 path folds each half's own global.
 *
 * Contract
 * - Results are delivered one layer at a time through td_scale_sink (modules outside layers
 *   last, as layer -1); the arrays passed to a callback are valid during the call only. Memory
 *   stays bounded by one layer's results plus one block-scale tensor per worker thread: scale
 *   bytes and globals are read with pread() from the shard files (never through a memory map,
 *   whose fault-around would keep neighbouring weight pages resident), and packed weights are
 *   never read.
 * - Worker threads (opts.threads) split the tensors of a layer; every result is independent
 *   of the thread count.
 * - Fatal problems (unreadable config, quantization metadata or safetensors; a --layers or
 *   --experts value out of range) return an error naming the file or option. Problems of one
 *   tensor (missing, wrong dtype or shape, bad global tensor) are recorded on that tensor
 *   (status, error) and counted as input errors; the audit goes on.
 * - No global state; distinct audits may run concurrently.
 */
#ifndef TD_SCALE_AUDIT_H
#define TD_SCALE_AUDIT_H

#include "e4m3_recon.h"
#include "layout.h"
#include "nvfp4.h"

#define TD_SCALE_MAX_TP 16
#define TD_SCALE_MAX_THREADS 64

typedef struct td_scale_opts {
    const char *model;                /* checkpoint directory (required) */
    const int64_t *layers;            /* [n_layers] layer indices; NULL/0 = all (and the */
    size_t n_layers;                  /*   modules outside layers) */
    const int64_t *experts;           /* [n_experts] routed experts; NULL/0 = all */
    size_t n_experts;
    int tp;                           /* TP degree of the rank view, 1..TD_SCALE_MAX_TP */
    int threads;                      /* 0 = online CPUs (at most TD_SCALE_MAX_THREADS) */
    bool elementwise;                 /* evaluate every element instead of per-code tables */
    bool progress;                    /* progress bar on stderr (only on a terminal) */
    const td_codec *codec;            /* NULL = td_codec_tandem() */
    /* Test hook: the expander's W13 slot function (NULL = td_w13_slot). */
    int (*w13_slot)(td_w13_layout layout, int64_t col, int64_t n);
} td_scale_opts;

/* Defaults: tp 1, threads 0, everything else 0/NULL/false. */
void td_scale_opts_init(td_scale_opts *o);

/* The first rejected element of a tensor or slice, in row-major order of the checkpoint
 * tensor [rows, cols]. row = col = -1 when nothing was rejected. */
typedef struct td_scale_first {
    int64_t row, col;
    td_recon_eval ev;
} td_scale_first;

/* Per-check element counts over a tensor or one rank slice of it. */
typedef struct td_scale_counts {
    int64_t elements;
    int64_t strict_mismatch;          /* strict != prepared */
    int64_t fast_mismatch;            /* fast != effective */
    int64_t nonfinite;                /* prepared or effective not finite */
    int64_t out_of_range;             /* effective not a positive FP16 normal, or bad global */
    int64_t rejected;                 /* elements failing any of the four */
    int64_t by_reason[TD_SCALE_REASON_COUNT]; /* rejected elements by reason */
    td_scale_reason reason;           /* the verdict's reason: the highest-precedence reason
                                         (lowest enum value) among rejected elements; OK none */
    td_scale_first first;             /* first rejected element with that reason */
    td_scale_first first_any;         /* first rejected element of any reason */
} td_scale_counts;

/* Code and prepared-scale census of one tensor. */
typedef struct td_scale_census {
    int64_t hist[256];                /* elements per E4M3 code */
    int64_t zero, subnormal, negative, nan; /* 0x00; 0x01..0x07; sign bit (not NaN); NaN */
    int code_min, code_max;           /* smallest / largest code present; -1 when empty */
    int distinct;                     /* codes present */
    int64_t prep_zero, prep_subnormal, prep_inf, prep_nan; /* prepared FP16 classes */
    float prep_min, prep_max;         /* smallest / largest finite |prepared| != 0; NAN none */
} td_scale_census;

typedef struct td_scale_tensor {
    char module[160];                 /* e.g. model.layers.0.mlp.experts.3.gate_proj */
    char scale_name[224];             /* its block-scale tensor */
    char global_name[224];            /* its per-tensor global */
    int32_t layer;                    /* -1 outside layers */
    int32_t expert;                   /* routed expert, -1 otherwise */
    td_moe_proj proj;                 /* gate/up/down for routed experts */
    char stage[160];                  /* "w13", "w2", or the module name */
    bool row_parallel;                /* TP splits K (the scale columns) */
    td_nvfp4_conv conv;
    int64_t rows, cols;               /* block-scale shape [N, K/16] */
    float global;                     /* as stored */
    td_recon_global gl;               /* the decode multiplier g and its hi/lo split */
    td_scale_census census;
    td_scale_counts all;              /* the whole tensor */
    int n_ranks;                      /* tp, or 0 when the TP view does not divide it */
    td_scale_counts ranks[TD_SCALE_MAX_TP]; /* [n_ranks] */
    bool admit;                       /* status OK and nothing rejected */
    td_status status;                 /* not TD_OK: could not be audited (input error) */
    char error[320];
} td_scale_tensor;

/* The global-slot check of one w13 stage slice in one layout. */
typedef struct td_scale_layout_check {
    bool applicable;                  /* interleaved needs rows-per-rank % 32 == 0 */
    int64_t columns;                  /* prepared columns checked (all experts) */
    int64_t slot_mismatch;            /* columns whose slot differs from the origin half */
    int64_t rejected;                 /* elements that then fail (layout mismatches) */
    int32_t first_expert;             /* first failing element, -1 none */
    int64_t first_col, first_group;   /* prepared column and K group of it */
} td_scale_layout_check;

typedef struct td_scale_stage {
    char name[160];                   /* "w13", "w2" or the module name */
    int32_t layer;
    int32_t rank;                     /* 0..tp-1; -1 = whole tensors (TP view not divisible) */
    int64_t tensors, tensors_rejected;/* tensor slices in this stage slice */
    int64_t elements, rejected;       /* block-scale elements */
    int64_t globals;                  /* FP32 globals raw storage keeps */
    bool admit;
    int64_t saved_bytes;              /* elements - 4 * globals when admitted, else 0 */
    bool is_w13;
    td_scale_layout_check layout[TD_W13_LAYOUT_COUNT];
    char first_tensor[224];           /* first rejected tensor (module order), "" none */
    td_scale_reason first_reason;
} td_scale_stage;

typedef enum td_scale_finding_kind {
    TD_SCALE_FIND_SIBLING_GLOBALS = 0, /* gate/up or q/k/v globals differ (a failed check) */
    TD_SCALE_FIND_TP_NOT_DIVISIBLE,    /* the TP view does not apply to a module (note) */
    TD_SCALE_FIND_LAYOUT_NA,           /* interleaved layout not applicable (note) */
    TD_SCALE_FIND_FUSED_EXPERTS,       /* routed experts stored fused, not audited (note) */
    TD_SCALE_FIND_KIND_COUNT
} td_scale_finding_kind;

/* "sibling_globals", "tp_not_divisible", "layout_not_applicable", "fused_experts". */
const char *td_scale_finding_kind_name(td_scale_finding_kind k);

typedef struct td_scale_finding {
    td_scale_finding_kind kind;
    bool counts;                      /* a failed check (affects the exit status) */
    int32_t layer, expert;
    char module[160];                 /* the parent module of the siblings, or the module */
    float a, b;                       /* sibling globals: the first and the differing one */
    char msg[640];
} td_scale_finding;

typedef struct td_scale_layer_sum {
    int64_t tensors, admitted, rejected, input_errors;
    int64_t elements, rejected_elements;
    int64_t by_reason[TD_SCALE_REASON_COUNT]; /* rejected tensors by first-element reason */
    int64_t zero, subnormal, negative, nan;   /* code classes over all elements */
    int code_min, code_max;                   /* -1 when no element */
    int64_t prep_zero, prep_subnormal, prep_inf, prep_nan;
    float prep_min, prep_max;                 /* NAN when none */
    int64_t globals_distinct;                 /* distinct stored globals (bitwise) */
    float global_min, global_max;             /* over finite globals; NAN when none */
    int64_t stages, stages_admitted;          /* stage slices */
    int64_t saved_bytes;
    int64_t failed_findings, notes;
} td_scale_layer_sum;

typedef struct td_scale_layer {
    int32_t layer;                    /* -1 = modules outside layers */
    int tp;
    const td_scale_tensor *tensors;
    size_t n_tensors;
    const td_scale_stage *stages;
    size_t n_stages;
    const td_scale_finding *findings;
    size_t n_findings;
    td_scale_layer_sum sum;
} td_scale_layer;

/* What the audit is about to do (delivered once, before the first layer). */
typedef struct td_scale_info {
    const char *model;
    const char *family;               /* "qwen3_next", "qwen4_exp" */
    const char *model_type;
    const char *prefix;
    const char *quant_algo;
    const char *producer;
    int tp, threads;
    bool elementwise;
    int64_t tensors;                  /* NVFP4 tensors selected */
    int64_t layers;                   /* layer groups that will be delivered */
} td_scale_info;

typedef struct td_scale_summary {
    td_scale_layer_sum total;         /* globals_distinct over the whole selection */
    int64_t layers;
    int tp, threads;
    double seconds;
} td_scale_summary;

typedef struct td_scale_sink {
    void *ctx;
    td_status (*begin)(void *ctx, const td_scale_info *info, td_err *err);  /* may be NULL */
    td_status (*layer)(void *ctx, const td_scale_layer *layer, td_err *err); /* may be NULL */
} td_scale_sink;

/* Run the audit. A sink error stops the audit and is returned. sum may be NULL. */
td_status td_scale_audit(const td_scale_opts *o, const td_scale_sink *sink, td_scale_summary *sum,
                         td_err *err);

/* true when the summary has a failed check: a rejected tensor or stage or a counted finding. */
bool td_scale_summary_failed(const td_scale_summary *s);

#endif /* TD_SCALE_AUDIT_H */
