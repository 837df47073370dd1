/* db.h — the results store: one SQLite file holding every run, its provenance and its typed
 * results. This header is the write side, used by every audit, run, quality and bench
 * command; the read side (listing, compare, regress, trend, export, import, merge) is
 * db/query.h. docs/db.md describes the schema.
 *
 * Contract
 * - td_db_open() opens (or, with TD_DB_CREATE, creates) the store at `path`. Before anything
 *   is written it checks that the file is an SQLite database (header magic, page size, size
 *   consistent with the header) and that it is a tandem store (PRAGMA application_id, known
 *   schema version) — or an empty file / empty database, which it initialises. A corrupt or
 *   foreign file is refused with TD_ERR_FORMAT and a message naming the path; such a file is
 *   never modified. A store of a newer schema than this build knows is refused too
 *   (TD_ERR_UNSUPPORTED); a missing file without TD_DB_CREATE is TD_ERR_NOTFOUND. The handle
 *   belongs to the caller and is released with td_db_close().
 * - A read-write open sets WAL mode, synchronous=NORMAL, foreign keys on and a busy timeout
 *   (TD_DB_BUSY_TIMEOUT_MS), applies forward migrations up to TD_DB_SCHEMA_VERSION in one
 *   transaction, and then marks `aborted` every run still `running` whose owning process
 *   (same host, same boot, same pid and process start time) is gone. TD_DB_READONLY opens
 *   without any of these writes and refuses a store that would need a migration.
 * - A run is opened with td_db_run_begin() (status `running`, provenance captured here: see
 *   db/provenance.h) and closed with td_db_run_end() (`ok`: the command ran to completion,
 *   possibly finding problems; `failed`: it stopped on an error). A run never closed by a live
 *   process becomes `aborted` on a later open. Ending a run while a batch is open is a
 *   programmer error (TD_ASSERT).
 * - Results go through td_db_put_*(). Between td_db_batch_begin() and td_db_batch_commit()
 *   they form one transaction: a reader or a later process sees all of a batch or none of it,
 *   also when the writer is killed. Outside a batch each put is its own transaction (correct,
 *   but slow: batch large writes). td_db_batch_rollback() discards the open batch. Rows may
 *   only be added to a run that is `running`.
 * - Optional metrics are passed as NAN (doubles) or -1 (counts, indices) and stored as SQL
 *   NULL; SQLite stores NaN as NULL too, so a NaN metric reads back as "not available" and the
 *   `finite` column carries the fact that the compared tensors were not finite.
 * - Every SQL statement uses bound parameters. Row structs and run info may point at caller
 *   buffers: nothing is kept after a call returns.
 * - A td_db handle is used by one thread at a time. Several processes (and handles) may write
 *   the same store concurrently; writers queue on the busy timeout and lose nothing.
 * - td_db_close(NULL) is a no-op; closing with an open batch rolls it back.
 */
#ifndef TD_DB_H
#define TD_DB_H

#include "td.h"

#include <stdbool.h>
#include <stdint.h>

#define TD_DB_SCHEMA_VERSION 4          /* PRAGMA user_version of a current store */
#define TD_DB_APPLICATION_ID 0x54444442 /* PRAGMA application_id: "TDDB" */
#define TD_DB_DEFAULT_PATH "tandem.db"  /* when neither --db nor TANDEM_DB is given */
#define TD_DB_BUSY_TIMEOUT_MS 30000     /* long enough for a peer's large batch to commit */
#define TD_DB_UID_LEN 36                /* run uid: 8-4-4-4-12 lowercase hex */

typedef struct td_db td_db;

enum td_db_open_flags {
    TD_DB_CREATE = 1u << 0,   /* create the file when it does not exist */
    TD_DB_READONLY = 1u << 1, /* no migration, no aborted sweep, no writes */
};

/* The store path: `opt` when non-NULL and non-empty, else $TANDEM_DB, else "tandem.db". */
const char *td_db_path_resolve(const char *opt);

td_status td_db_open(const char *path, unsigned flags, td_db **out, td_err *err);
void td_db_close(td_db *db);

/* Path the handle was opened with. */
const char *td_db_path(const td_db *db);
/* Runs this open marked `aborted` (their process was gone). */
int td_db_aborted_at_open(const td_db *db);
/* Override the busy timeout (milliseconds, >= 0). */
void td_db_set_busy_timeout(td_db *db, int ms);

/* ---- runs --------------------------------------------------------------------------------- */

typedef enum td_db_run_status {
    TD_DB_RUN_RUNNING = 0,
    TD_DB_RUN_OK,
    TD_DB_RUN_FAILED,
    TD_DB_RUN_ABORTED,
    TD_DB_RUN_STATUS_COUNT
} td_db_run_status;

/* "running", "ok", "failed", "aborted"; NULL for an invalid value. */
const char *td_db_run_status_name(td_db_run_status s);

/* What a command tells the store about itself; everything else (time, host, CPU, binary
 * hash, version, commit, environment) is captured by td_db_run_begin(). */
typedef struct td_db_run_info {
    const char *kind;              /* required: [a-z0-9._-]+, e.g. "audit.layer", "bench" */
    int argc;                      /* command line (argv[0..argc)); may be 0 */
    char *const *argv;
    const char *checkpoint;        /* checkpoint directory, or NULL */
    bool checkpoint_full_hash;     /* fingerprint hashes every byte (slow on real models) */
    const char *const *variants;   /* engine variants, e.g. "ref", "cuda:storage=raw" */
    size_t n_variants;
    const uint64_t *seeds;         /* seeds used by the command */
    size_t n_seeds;
} td_db_run_info;

/* Device facts known only once an engine is up; NULL fields are left unchanged. */
typedef struct td_db_device {
    const char *gpu_name;
    const char *gpu_driver;
    const char *cuda_version;
    const char *nccl_version;
    const char *cuda_module_path;  /* hashed (SHA-256) into cuda_module_sha256 */
} td_db_device;

td_status td_db_run_begin(td_db *db, const td_db_run_info *info, int64_t *run_id, td_err *err);
td_status td_db_run_set_device(td_db *db, int64_t run_id, const td_db_device *dev, td_err *err);
/* status is TD_DB_RUN_OK or TD_DB_RUN_FAILED; message (may be NULL) says why it failed. */
td_status td_db_run_end(td_db *db, int64_t run_id, td_db_run_status status, int exit_code,
                        const char *message, td_err *err);
/* The run's globally unique id (stable across export, import and merge). */
td_status td_db_run_uid(td_db *db, int64_t run_id, char uid[TD_DB_UID_LEN + 1], td_err *err);

/* ---- results ------------------------------------------------------------------------------ */

typedef enum td_db_expect { TD_DB_EXPECT_EXACT = 0, TD_DB_EXPECT_BOUNDED, TD_DB_EXPECT_COUNT } td_db_expect;
typedef enum td_db_verdict { TD_DB_PASS = 0, TD_DB_FAIL, TD_DB_SKIP, TD_DB_VERDICT_COUNT } td_db_verdict;

const char *td_db_expect_name(td_db_expect e);   /* "exact", "bounded"; NULL if invalid */
const char *td_db_verdict_name(td_db_verdict v); /* "pass", "fail", "skip"; NULL if invalid */

/* One compared tensor of a layer audit. Key within a run: (tap, rank, tokens, variant_a,
 * variant_b). */
typedef struct td_db_layer_row {
    int32_t layer;          /* layer index, -1 for taps outside layers (final.hidden, logits) */
    int32_t rank;           /* TP rank (0 without TP) */
    int32_t tokens;         /* tokens in the block input (M) */
    const char *tap;        /* tap name, e.g. "L3.moe.out" */
    const char *variant_a;  /* reference side of the pair, e.g. "ref" */
    const char *variant_b;  /* candidate side, e.g. "cuda:storage=raw" */
    td_db_expect expectation;
    const char *dtype;      /* dtype the tensors were compared in ("f32", "f16", "bf16"), or NULL */
    int64_t numel;          /* elements compared, -1 unknown */
    bool exact;             /* bitwise equal */
    int64_t mismatches;     /* elements that differ, -1 unknown */
    double max_abs;         /* max |a - b| */
    double rel_l2;          /* ||a - b||_2 / max(||b||_2, 1e-12) */
    int64_t max_ulp;        /* max ULP distance in dtype, -1 unknown */
    double nmse;
    double cosine;
    bool finite;            /* both sides finite everywhere */
    int64_t first_diff;     /* first differing flat index, -1 when none */
    td_db_verdict verdict;  /* did the pair meet its expectation */
} td_db_layer_row;

/* One encoding / scale-reconstruction check (e4m3 audit). Key: (check_name, stage, variant). */
typedef struct td_db_encoding_row {
    const char *check_name; /* e.g. "expand.all_codes" */
    const char *stage;      /* e.g. "w13.interleaved", or NULL */
    const char *variant;    /* e.g. "strict", "fast", or NULL */
    int64_t elements;       /* elements checked, -1 unknown */
    int64_t mismatches;     /* bit-pattern mismatches (NaN positions excluded), -1 unknown */
    int64_t nan_mismatches; /* positions where exactly one side is NaN, -1 unknown */
    int64_t first_diff;     /* -1 when none */
    bool exact;
    td_db_verdict verdict;
    const char *detail;     /* free text, or NULL */
} td_db_encoding_row;

/* Scale census: how often E4M3 code `code` occurs in `tensor`. Key: (tensor, code). */
typedef struct td_db_census_row {
    const char *tensor;
    int32_t code;           /* 0..255 */
    int64_t count;          /* >= 0 */
} td_db_census_row;

/* One generated completion. Key: (variant, batch, request, rep). */
typedef struct td_db_completion_row {
    const char *variant;
    int32_t batch;          /* decode batch width it ran in */
    const char *request;    /* request id within the prompt set */
    int32_t rep;            /* repeat index, 0 for the first */
    int64_t length;         /* generated tokens */
    const char *hash;       /* SHA-256 hex of the token ids */
    const char *reference;  /* variant it was compared with, or NULL */
    int64_t first_divergence; /* first differing token index vs reference, -1 when equal */
    double margin;          /* top-1 logit margin at the divergence, NAN when none */
    const int32_t *tokens;  /* [length] generated token ids, or NULL (token_ids stored NULL);
                             * stored as a JSON array text "[1,2,3]" */
    double reference_margin; /* the reference's margin at the divergence; stored only when
                              * first_divergence >= 0 and the value is not NAN */
} td_db_completion_row;

/* One quality score. Key: (suite, metric, variant). The gate is `value >= threshold` when
 * higher_is_better, else `value <= threshold`; NAN threshold = no gate (pass stored NULL). */
typedef struct td_db_quality_row {
    const char *suite;      /* e.g. "gsm8k", "ppl.wiki" */
    const char *metric;     /* e.g. "acc", "ppl", "kld.mean" */
    const char *variant;    /* candidate variant, or NULL */
    double value;
    double stderr_;         /* standard error, NAN unknown */
    int64_t n;              /* sample count, -1 unknown */
    double threshold;       /* gate, NAN none */
    bool higher_is_better;
} td_db_quality_row;

/* One timing. Key: (bench, shape, metric, variant). */
typedef struct td_db_timing_row {
    const char *bench;      /* e.g. "moe.w13" */
    const char *shape;      /* e.g. "M16", or NULL */
    const char *metric;     /* e.g. "median", "tok_per_s" */
    const char *variant;    /* or NULL */
    double value;
    const char *unit;       /* "ms", "us", "tok/s", "rows/s", ... */
    int64_t n;              /* samples, -1 unknown */
    double stddev;          /* NAN unknown */
    bool higher_is_better;  /* throughput-like metrics */
} td_db_timing_row;

td_status td_db_batch_begin(td_db *db, td_err *err);
td_status td_db_batch_commit(td_db *db, td_err *err);
void td_db_batch_rollback(td_db *db);

td_status td_db_put_layer(td_db *db, int64_t run_id, const td_db_layer_row *row, td_err *err);
td_status td_db_put_encoding(td_db *db, int64_t run_id, const td_db_encoding_row *row, td_err *err);
td_status td_db_put_census(td_db *db, int64_t run_id, const td_db_census_row *row, td_err *err);
td_status td_db_put_completion(td_db *db, int64_t run_id, const td_db_completion_row *row, td_err *err);
td_status td_db_put_quality(td_db *db, int64_t run_id, const td_db_quality_row *row, td_err *err);
td_status td_db_put_timing(td_db *db, int64_t run_id, const td_db_timing_row *row, td_err *err);

/* Convenience: write n layer rows as one batch (begins and commits its own transaction
 * unless a batch is already open). */
td_status td_db_put_layers(td_db *db, int64_t run_id, const td_db_layer_row *rows, size_t n,
                           td_err *err);

#endif /* TD_DB_H */
