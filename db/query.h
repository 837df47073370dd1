/* query.h — the read side of the results store and its maintenance: run listing, compare,
 * baselines, regression checks, trends, export, import and merge. `tandem db` is a thin
 * front end over these functions.
 *
 * Contract
 * - Results come back as cJSON trees the caller frees with cJSON_Delete(); their shape is the
 *   `--json` output documented in docs/db.md. Numbers that are SQL NULL (unknown or NaN)
 *   are JSON null.
 * - A run reference (td_db_run_resolve) is a run id ("42"), a uid or a unique uid prefix of
 *   at least 4 characters, "latest" (newest run) or "latest:KIND" (newest run of a kind).
 * - Filters and keys given by users are only ever bound as SQL parameters; the SQL text is
 *   assembled from static fragments chosen by name from fixed tables.
 * - Regression rules (td_db_regress), per result matched by key between the baseline run
 *   and the candidate run:
 *     layer_cmp:  `exact` held in the baseline and fails in the candidate while the candidate
 *                 still expects exact; `finite` held and fails; verdict went pass -> fail; or a
 *                 gated metric m grew: cand - base > max(abs_m, rel_m * |base|) (cosine is
 *                 compared as 1 - cosine).
 *     encoding_checks: exact or verdict pass -> not.
 *     completions: matched its reference (first_divergence NULL) and now diverges.
 *     quality:    the candidate fails its gate (pass = 0) and the baseline passed it (or had
 *                 no such score).
 *     timings:    only when a "timing" threshold is given: the value moved in the bad
 *                 direction by more than max(abs, rel * |base|).
 *   A candidate run whose status is not `ok` is itself a regression. Results missing from the
 *   candidate are counted (and are regressions only with require_all).
 * - Change detection (td_db_trend): a point is a step when it differs from the median of the
 *   preceding window (at most `window` points since the last step, and at least
 *   `min_history` of them) by more than that window's spread (max - min), and by more than
 *   1e-12 relative. A step starts a new window.
 * - Import and merge are idempotent: runs are identified by uid and never duplicated; runs
 *   still `running` at the source are skipped (merge again once they end). The source of a
 *   merge is opened read-only and never modified.
 * - Handles are single-threaded (see db.h).
 */
#ifndef TD_DB_QUERY_H
#define TD_DB_QUERY_H

#include "db.h"

#include <stdio.h>
#include <cjson/cJSON.h>

td_status td_db_run_resolve(td_db *db, const char *ref, int64_t *run_id, td_err *err);

/* ---- runs ---------------------------------------------------------------------------------- */

typedef struct td_db_runs_filter {
    const char *kind;       /* exact kind, or a GLOB such as "audit.*" */
    const char *status;     /* running|ok|failed|aborted */
    const char *checkpoint; /* fingerprint prefix, or a substring of the checkpoint path */
    const char *since;      /* "YYYY-MM-DD[THH:MM[:SS]]" (UTC) or a relative age "30m", "12h", "7d", "2w" */
    const char *host;
    const char *commit;     /* git commit prefix */
    int64_t limit;          /* newest first; <= 0: no limit */
    const char *gpu;        /* gpu_name, or a GLOB such as "NVIDIA H200*" */
} td_db_runs_filter;

/* Normalise a --since value to an ISO-8601 UTC prefix usable in comparisons. */
td_status td_db_since_parse(const char *since, char out[32], td_err *err);

td_status td_db_runs_list(td_db *db, const td_db_runs_filter *f, cJSON **out, td_err *err);
/* Everything about one run: all provenance columns, result counts per table, layer verdict
 * summary, baselines pointing at it. */
td_status td_db_run_show(td_db *db, int64_t run_id, cJSON **out, td_err *err);
/* The completions of one run (ordered by variant, batch, request, rep): every column of the
 * completions table, token_ids as a JSON array (null when not stored). With `diverged_only`,
 * only those that differ from their reference (first_divergence not NULL). */
td_status td_db_completions(td_db *db, int64_t run_id, bool diverged_only, cJSON **out, td_err *err);
/* Path, schema version, row counts; with `check`, PRAGMA integrity_check. */
td_status td_db_info(td_db *db, bool check, cJSON **out, td_err *err);

/* ---- compare ------------------------------------------------------------------------------- */

/* Per (layer, rank, tokens, tap, pair): metrics of A and B and B - A, sorted by how much worse
 * B is: lost exactness, lost finiteness, pass -> fail, then `worse_log10`, the largest log10
 * growth of the error amplitude among max_abs, rel_l2, sqrt(nmse) and sqrt(1 - cosine)
 * (metrics that are 0 in both runs do not count). Rows present on one side only come last;
 * quality scores and timings present in both runs are listed with their deltas. `limit` > 0
 * keeps only that many layer rows (the summary always counts all). */
td_status td_db_compare(td_db *db, int64_t run_a, int64_t run_b, size_t limit, cJSON **out, td_err *err);

/* ---- baselines and regressions -------------------------------------------------------------- */

/* Names are [A-Za-z0-9._-]{1,64}. Setting an existing name moves it. */
td_status td_db_baseline_set(td_db *db, const char *name, int64_t run_id, td_err *err);
td_status td_db_baseline_get(td_db *db, const char *name, int64_t *run_id, td_err *err);
td_status td_db_baseline_remove(td_db *db, const char *name, td_err *err);
td_status td_db_baseline_list(td_db *db, cJSON **out, td_err *err);

typedef enum td_db_metric {
    TD_DB_M_MAX_ABS = 0,
    TD_DB_M_REL_L2,
    TD_DB_M_NMSE,
    TD_DB_M_MAX_ULP,
    TD_DB_M_MISMATCHES,
    TD_DB_M_COSINE,
    TD_DB_M_TIMING,
    TD_DB_M_COUNT
} td_db_metric;

typedef struct td_db_threshold {
    bool gated;   /* checked at all */
    double rel;   /* allowed growth relative to the baseline value */
    double abs;   /* allowed absolute growth */
} td_db_threshold;

typedef struct td_db_thresholds {
    td_db_threshold m[TD_DB_M_COUNT];
} td_db_thresholds;

const char *td_db_metric_name(td_db_metric m);
/* The documented defaults (docs/db.md). */
void td_db_thresholds_default(td_db_thresholds *t);
/* Apply one "metric=SPEC" override. SPEC: comma-separated parts, each "rel:X", "abs:X",
 * "X%" (relative), a bare number X (relative), or "off". Example: "rel_l2=rel:0.1,abs:1e-7". */
td_status td_db_threshold_parse(td_db_thresholds *t, const char *arg, td_err *err);

typedef struct td_db_regress_opts {
    int64_t baseline_run;
    int64_t run;
    const td_db_thresholds *thresholds; /* NULL: defaults */
    bool require_all;                   /* a result missing from the candidate regresses */
    const char *baseline_name;          /* for the report only, may be NULL */
} td_db_regress_opts;

/* *n_regressions > 0 means the candidate regressed (the CLI exits 1). */
td_status td_db_regress(td_db *db, const td_db_regress_opts *o, cJSON **out, int64_t *n_regressions,
                        td_err *err);

/* ---- trend --------------------------------------------------------------------------------- */

typedef struct td_db_trend_opts {
    const char *metric;         /* [TABLE.]COLUMN, e.g. "nmse", "layer.max_abs", "quality.value",
                                 * "timing.value", "completion.first_divergence" */
    const char *const *where;   /* "key=value" filters (value may be a GLOB for text keys) */
    size_t n_where;
    const char *agg;            /* max (default) | min | mean | sum | count */
    bool by_commit;             /* one point per git commit, in order of first appearance */
    int window;                 /* change detection window (default 8) */
    int min_history;            /* points needed before a step can be called (default 3) */
    const char *status;         /* runs considered: a status, or "any" (default "ok") */
} td_db_trend_opts;

td_status td_db_trend(td_db *db, const td_db_trend_opts *o, cJSON **out, td_err *err);

/* ---- export, import, merge ------------------------------------------------------------------ */

/* JSON: {"format": "tandem-results", "format_version": 1, "schema_version": N, "runs": [
 * {run columns..., "results": {"layer_cmp": [...], ...}}]}. Streams; never builds the tree. */
td_status td_db_export_json(td_db *db, const int64_t *runs, size_t n_runs, FILE *f, td_err *err);
/* CSV of one result table (`table`: a table name, or NULL for layer_cmp), first column run_uid. */
td_status td_db_export_csv(td_db *db, const int64_t *runs, size_t n_runs, const char *table, FILE *f,
                           td_err *err);

typedef struct td_db_transfer_stats {
    int64_t runs_added;
    int64_t runs_present;  /* already in this store (same uid): skipped */
    int64_t runs_running;  /* still running at the source: skipped */
    int64_t rows_added;
    int64_t baselines_added;
    int64_t baselines_conflicting; /* same name, different run: kept ours */
} td_db_transfer_stats;

td_status td_db_import_json(td_db *db, const char *path, td_db_transfer_stats *st, td_err *err);
td_status td_db_merge(td_db *db, const char *other_path, td_db_transfer_stats *st, td_err *err);

#endif /* TD_DB_QUERY_H */
