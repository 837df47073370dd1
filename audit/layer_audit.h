/* layer_audit.h — the per-layer MoE audit (`tandem audit layer`, SEED_AUDITS.md §1), and the
 * same audit of a layer's token mixer (block attn or gdn).
 *
 * For every (layer, rank, tokens, scale, route) of the requested grid, the audit builds
 * synthetic activations, runs every distinct engine variant of the requested pairs on them
 * twice (the second run is the determinism repeat), compares the block output (and the taps
 * asked for) of each pair and of each repeat, and judges every comparison against its
 * expectation. docs/audit-layer.md is the user documentation (CLI, JSON row schema).
 *
 * Inputs of a row (replayable alone: they depend only on the seed and the row's own
 * coordinates, never on the rest of the grid):
 * - The row generator is td_rng_seed(seed) split successively by layer, rank, tokens and
 *   the bit pattern of the scale (td_rng_split). Sub-streams: 1 = activations, 2 = outliers,
 *   3 = random route scores, 4 = synthetic route weights.
 * - Activations x [tokens, hidden]: x = fl32(scale * N(0,1)) (td_rng_normal, row-major).
 *   With outliers (frac > 0): each element is multiplied by `mag` with probability frac
 *   (uniform < frac, one draw per element, sub-stream 2).
 * - Routes: router = the checkpoint's router on x (the engines compute it); random = scores
 *   N(0,1) [tokens, E] (sub-stream 3), the top-k by score (lowest index on ties), weights =
 *   float32 softmax of the k selected scores (the seed's routing); same-expert = expert 0 in
 *   every slot; mod17 = expert (t*k + j) mod 17 (then mod E when E < 17); invalid = ids -1,
 *   E + j and valid ones mixed, which every engine must reject with an error (never read out
 *   of bounds). same-expert and mod17 weights are the float32 softmax of k N(0,1) draws
 *   (sub-stream 4).
 * Variants of a row: a variant that does not set tp_size gets the audit's tp; one that does
 * not set tp_rank gets the row's rank. Equal variants (after that and threads=auto resolved)
 * run once per row, plus their repeat, whichever pairs they appear in.
 * Blocks: moe (default), or the token mixer attn (full_attention layers) or gdn
 * (linear_attention layers), each from a fresh state (core/engine.h); a layer of the other
 * type is an engine error naming it. Routes apply to moe only (attn/gdn: `router` alone).
 * Checks of a row (each judged, td_metrics):
 * - "pair":   a vs b of each pair, on the block output `L{l}.moe.out` (`L{l}.attn.out`,
 *             `L{l}.gdn.out`) and on every requested
 *             tap both sides captured with the same size; expectation of the pair.
 * - "repeat": each distinct variant against its own second run; expectation exact.
 * - "reject": (route invalid) each distinct variant must fail with TD_ERR_RANGE.
 * Under a bounded pair, integer taps (moe.topk) are recorded but not judged (verdict skip).
 * Routes that differ (bounded pairs of the moe block with route router; audit/routes.h): the
 * audit captures each side's moe.topk and moe.router_logits (asked for or not; only taps asked
 * for are compared) and adds the check "pair" on `L{l}.moe.routes`: numel = tokens,
 * mismatches = tokens whose ids differ (other experts, or the same in another order),
 * first_diff = the first such token, exact = none, max_abs = the largest router-logit gap (side
 * A's logits) between an expert only A chose and one only B chose; rel_l2, nmse, cosine,
 * max_ulp and finite are those of the router logits. It passes when both sides' top-k follow
 * their own logits (routes.h) and, if any token differs, the logits are finite and within the
 * pair's bound (the differences are near-ties). When it passes with tokens differing, the
 * route-dependent tensors (the block output: tokens with other experts; moe.topk_weights,
 * moe.expert_act, moe.expert_out: tokens with any difference) are judged on the other tokens
 * (tokens_excluded, rel_l2_all and the message say what was left out); when it fails they are
 * judged on every token.
 * The dtype a pair is compared in is the variants' common act_dtype (F32 when they differ).
 *
 * Pair expectations (td_layer_pair_parse): written `A,B`, `A,B@exact`, `A,B@bounded` or
 * `A,B@bounded=X`. Without a suffix: exact when A and B use the same engine and differ only in
 * numerically neutral options (td_opt_is_neutral: storage, graphs, threads, fault), bounded
 * otherwise. The bound of a bounded pair is X, or td_metrics_bound() of the lowest precision
 * either side uses (act_dtype), and at least FP16's when one side uses FP16 effective scales
 * and the other exact ones (ref's scale=fp16 and the cuda engine use FP16 scales).
 *
 * Contract
 * - td_layer_audit_run() calls sink->row once per row in grid order (layer, rank, tokens,
 *   scale, route) and fills *sum (free with td_layer_summary_free). A row whose checks fail is
 *   a finding, not an error: the function still returns TD_OK. Errors (checkpoint, variants,
 *   engine failures other than the expected rejection, sink errors) stop the audit and name
 *   the variant, layer and row. On an error *sum holds only .device (the GPU of the engines
 *   that loaded before it; empty: none), so that a failed run can still name its GPU.
 * - The row passed to the sink is valid during the call only.
 * - Single-threaded API (the engines use their own worker threads). No global state.
 */
#ifndef TD_AUDIT_LAYER_AUDIT_H
#define TD_AUDIT_LAYER_AUDIT_H

#include "engine.h"
#include "metrics.h"

#include <stdio.h>
#include <cjson/cJSON.h>

struct td_db;

typedef enum td_route_kind {
    TD_ROUTE_ROUTER = 0,
    TD_ROUTE_RANDOM,
    TD_ROUTE_SAME_EXPERT,
    TD_ROUTE_INVALID,
    TD_ROUTE_MOD17,
    TD_ROUTE_COUNT
} td_route_kind;

/* "router", "random", "same-expert", "invalid", "mod17"; NULL for an invalid value. */
const char *td_route_kind_name(td_route_kind r);
td_status td_route_kind_parse(const char *s, td_route_kind *r, td_err *err);

typedef struct td_layer_pair {
    td_variant a, b;              /* as parsed (TP options per row are filled in later) */
    char a_text[TD_VARIANT_TEXT_MAX];
    char b_text[TD_VARIANT_TEXT_MAX];
    td_expect expect;
    double bound;                 /* relative bound when bounded */
    bool expect_given;            /* @exact / @bounded written by the user */
} td_layer_pair;

td_status td_layer_pair_parse(const char *text, td_layer_pair *p, td_err *err);

/* Default tap suffixes the audit knows (for --taps all). */
extern const char *const td_layer_tap_suffixes[];
extern const size_t td_layer_tap_suffix_count;

typedef struct td_layer_audit_opts {
    const char *model;             /* checkpoint directory */
    const int64_t *layers;         /* [n_layers] */
    size_t n_layers;
    const int64_t *ranks;          /* [n_ranks] */
    size_t n_ranks;
    int tp;                        /* emulated TP size of the rows (ranks < tp) */
    const int64_t *tokens;         /* [n_tokens] */
    size_t n_tokens;
    const double *scales;          /* [n_scales] activation scales */
    size_t n_scales;
    const td_route_kind *routes;   /* [n_routes] */
    size_t n_routes;
    const td_layer_pair *pairs;    /* [n_pairs] */
    size_t n_pairs;
    uint64_t seed;
    double outlier_frac;           /* 0 = no outliers */
    double outlier_mag;            /* outlier multiplier */
    const char *const *taps;       /* [n_taps] tap suffixes or globs ("moe.router_logits", "moe.*") */
    size_t n_taps;
    bool progress;                 /* progress bar on stderr (when it is a terminal) */
    td_block block;                /* TD_BLOCK_MOE (default), TD_BLOCK_ATTN or TD_BLOCK_GDN */
} td_layer_audit_opts;

/* Defaults: tp 4, seed 20260905 (the seed audit's), outlier_mag 100, everything else empty. */
void td_layer_audit_opts_init(td_layer_audit_opts *o);

typedef struct td_layer_check {
    char kind[8];                  /* "pair", "repeat", "reject" */
    int pair;                      /* pair index for "pair", -1 otherwise */
    char a[TD_VARIANT_TEXT_MAX];   /* variant texts of the sides (repeat: b = a) */
    char b[TD_VARIANT_TEXT_MAX];
    char tap[TD_TAP_NAME_MAX];     /* "L0.moe.out", ... */
    td_expect expect;
    double bound;                  /* NaN for exact */
    bool judged;                   /* false: recorded only (verdict skip) */
    bool pass;
    td_metrics m;                  /* moe.routes: see "Routes that differ" below */
    int64_t tokens_excluded;       /* tokens left out of m because their routes differ (0: none) */
    double rel_l2_all;             /* rel_l2 over every token when tokens_excluded > 0, else NaN */
    char message[256];             /* reject: the engine's message; otherwise a note or "" */
} td_layer_check;

typedef struct td_layer_row {
    int64_t layer, rank, tokens;
    int tp;
    double scale;
    td_route_kind route;
    uint64_t seed;
    bool outliers;
    double seconds;                /* wall time of the row */
    const td_layer_check *checks;  /* [n_checks] */
    size_t n_checks;
    bool pass;                     /* every judged check passed */
} td_layer_row;

typedef struct td_layer_sink {
    void *ctx;
    td_status (*row)(void *ctx, const td_layer_row *row, td_err *err);
} td_layer_sink;

/* Aggregates per (check kind, pair or variant, tap suffix). */
typedef struct td_layer_group {
    char kind[8];
    char a[TD_VARIANT_TEXT_MAX], b[TD_VARIANT_TEXT_MAX];
    char tap[TD_TAP_NAME_MAX];     /* tap suffix, e.g. "moe.out" */
    td_expect expect;
    double bound;
    int64_t checks, passed, failed, skipped, exact;
    double worst_rel_l2, worst_max_abs;
    int64_t worst_layer, worst_rank, worst_tokens; /* row of worst_rel_l2 (or first failure) */
    int64_t worst_first_diff;
    int64_t tokens_excluded, checks_excluding; /* tokens left out (routes differ), over so many checks */
} td_layer_group;

typedef struct td_layer_summary {
    int64_t rows, rows_failed, checks, passed, failed, skipped;
    double seconds;
    td_layer_group *groups;        /* [n_groups] */
    size_t n_groups;
    td_engine_device device;       /* the GPU of the first engine that runs on one; empty: none */
} td_layer_summary;

void td_layer_summary_free(td_layer_summary *s);

td_status td_layer_audit_run(const td_layer_audit_opts *o, const td_layer_sink *sink, td_layer_summary *sum,
                             td_err *err);

/* ---- output helpers --------------------------------------------------------------------------- */

/* The JSON object of one row (docs/audit-layer.md schema); NULL when out of memory. */
cJSON *td_layer_row_json(const td_layer_row *row);
/* The summary as a JSON object. */
cJSON *td_layer_summary_json(const td_layer_summary *s);
/* The summary table (human). */
void td_layer_summary_print(const td_layer_summary *s, FILE *f);
/* The db key of a check's tap: the tap name, qualified with "#scale=X" when the scale is not
 * 0.1, "#route=R" when the route is not router, "#outliers" with outliers. */
void td_layer_tap_key(const td_layer_row *row, const td_layer_check *c, char *buf, size_t cap);
/* Write every check of a row as layer_cmp rows of run `run_id` (one transaction). */
td_status td_layer_row_db(struct td_db *db, int64_t run_id, const td_layer_row *row, td_err *err);

#endif /* TD_AUDIT_LAYER_AUDIT_H */
