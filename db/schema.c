/* schema.c — the store's schema: migration steps, table descriptors, test hooks (schema.h).
 *
 * Result tables are WITHOUT ROWID tables keyed by (run_id, key columns...): a run's results
 * are contiguous in one B-tree, so writing a row is one B-tree insert, reading a run is one
 * range scan, and matching a result across two runs is one primary-key probe. Key columns
 * ("the same result across runs") are listed first in each descriptor. docs/db.md documents
 * every column.
 */
#include "db_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ==== migration steps ======================================================================== */

/* v1: runs with provenance, and layer comparisons. */
static const char schema_v1[] =
    "CREATE TABLE runs (\n"
    "  id                     INTEGER PRIMARY KEY,\n"
    "  uid                    TEXT NOT NULL UNIQUE,\n"
    "  kind                   TEXT NOT NULL,\n"
    "  status                 TEXT NOT NULL\n"
    "                         CHECK (status IN ('running','ok','failed','aborted')),\n"
    "  started_at             TEXT NOT NULL,\n"
    "  ended_at               TEXT,\n"
    "  exit_code              INTEGER,\n"
    "  message                TEXT,\n"
    "  tandem_version         TEXT NOT NULL,\n"
    "  git_commit             TEXT NOT NULL,\n"
    "  binary_sha256          TEXT,\n"
    "  cuda_module_sha256     TEXT,\n"
    "  host                   TEXT NOT NULL,\n"
    "  machine_id             TEXT,\n"
    "  boot_id                TEXT,\n"
    "  pid                    INTEGER,\n"
    "  proc_start             INTEGER,\n"
    "  cpu                    TEXT,\n"
    "  gpu_name               TEXT,\n"
    "  gpu_driver             TEXT,\n"
    "  cuda_version           TEXT,\n"
    "  nccl_version           TEXT,\n"
    "  checkpoint_path        TEXT,\n"
    "  checkpoint_fingerprint TEXT,\n"
    "  checkpoint_full        INTEGER,\n"
    "  command_line           TEXT NOT NULL DEFAULT '[]',\n"
    "  env                    TEXT NOT NULL DEFAULT '{}',\n"
    "  variants               TEXT NOT NULL DEFAULT '[]',\n"
    "  seeds                  TEXT NOT NULL DEFAULT '[]',\n"
    "  origin                 TEXT\n"
    ");\n"
    "CREATE TABLE layer_cmp (\n"
    "  run_id      INTEGER NOT NULL REFERENCES runs(id),\n"
    "  layer       INTEGER NOT NULL,\n"
    "  rank        INTEGER NOT NULL,\n"
    "  tokens      INTEGER NOT NULL,\n"
    "  tap         TEXT NOT NULL,\n"
    "  variant_a   TEXT NOT NULL,\n"
    "  variant_b   TEXT NOT NULL,\n"
    "  expectation TEXT NOT NULL CHECK (expectation IN ('exact','bounded')),\n"
    "  dtype       TEXT NOT NULL DEFAULT '',\n"
    "  numel       INTEGER,\n"
    "  exact       INTEGER NOT NULL CHECK (exact IN (0,1)),\n"
    "  mismatches  INTEGER,\n"
    "  max_abs     REAL,\n"
    "  rel_l2      REAL,\n"
    "  max_ulp     INTEGER,\n"
    "  nmse        REAL,\n"
    "  cosine      REAL,\n"
    "  finite      INTEGER NOT NULL CHECK (finite IN (0,1)),\n"
    "  first_diff  INTEGER,\n"
    "  verdict     TEXT NOT NULL CHECK (verdict IN ('pass','fail','skip')),\n"
    "  PRIMARY KEY (run_id, tap, rank, tokens, variant_a, variant_b)\n"
    ") WITHOUT ROWID;\n";

/* v2: the other result families. */
static const char schema_v2[] =
    "CREATE TABLE encoding_checks (\n"
    "  run_id         INTEGER NOT NULL REFERENCES runs(id),\n"
    "  check_name     TEXT NOT NULL,\n"
    "  stage          TEXT NOT NULL DEFAULT '',\n"
    "  variant        TEXT NOT NULL DEFAULT '',\n"
    "  elements       INTEGER,\n"
    "  mismatches     INTEGER,\n"
    "  nan_mismatches INTEGER,\n"
    "  first_diff     INTEGER,\n"
    "  exact          INTEGER NOT NULL CHECK (exact IN (0,1)),\n"
    "  verdict        TEXT NOT NULL CHECK (verdict IN ('pass','fail','skip')),\n"
    "  detail         TEXT,\n"
    "  PRIMARY KEY (run_id, check_name, stage, variant)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE scale_census (\n"
    "  run_id  INTEGER NOT NULL REFERENCES runs(id),\n"
    "  tensor  TEXT NOT NULL,\n"
    "  code    INTEGER NOT NULL CHECK (code BETWEEN 0 AND 255),\n"
    "  count   INTEGER NOT NULL CHECK (count >= 0),\n"
    "  PRIMARY KEY (run_id, tensor, code)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE completions (\n"
    "  run_id           INTEGER NOT NULL REFERENCES runs(id),\n"
    "  variant          TEXT NOT NULL,\n"
    "  batch            INTEGER NOT NULL,\n"
    "  request          TEXT NOT NULL,\n"
    "  rep              INTEGER NOT NULL DEFAULT 0,\n"
    "  length           INTEGER NOT NULL,\n"
    "  hash             TEXT NOT NULL,\n"
    "  reference        TEXT,\n"
    "  first_divergence INTEGER,\n"
    "  margin           REAL,\n"
    "  PRIMARY KEY (run_id, variant, batch, request, rep)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE quality (\n"
    "  run_id           INTEGER NOT NULL REFERENCES runs(id),\n"
    "  suite            TEXT NOT NULL,\n"
    "  metric           TEXT NOT NULL,\n"
    "  variant          TEXT NOT NULL DEFAULT '',\n"
    "  value            REAL,\n"
    "  stderr           REAL,\n"
    "  n                INTEGER,\n"
    "  threshold        REAL,\n"
    "  higher_is_better INTEGER NOT NULL CHECK (higher_is_better IN (0,1)),\n"
    "  pass             INTEGER CHECK (pass IN (0,1)),\n"
    "  PRIMARY KEY (run_id, suite, metric, variant)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE timings (\n"
    "  run_id           INTEGER NOT NULL REFERENCES runs(id),\n"
    "  bench            TEXT NOT NULL,\n"
    "  shape            TEXT NOT NULL DEFAULT '',\n"
    "  metric           TEXT NOT NULL,\n"
    "  variant          TEXT NOT NULL DEFAULT '',\n"
    "  value            REAL,\n"
    "  unit             TEXT NOT NULL,\n"
    "  n                INTEGER,\n"
    "  stddev           REAL,\n"
    "  higher_is_better INTEGER NOT NULL DEFAULT 0 CHECK (higher_is_better IN (0,1)),\n"
    "  PRIMARY KEY (run_id, bench, shape, metric, variant)\n"
    ") WITHOUT ROWID;\n";

/* v3: named baselines, indexes for the run listing, a convenience view. */
static const char schema_v3[] =
    "CREATE TABLE baselines (\n"
    "  name     TEXT PRIMARY KEY,\n"
    "  run_uid  TEXT NOT NULL REFERENCES runs(uid),\n"
    "  set_at   TEXT NOT NULL\n"
    ");\n"
    "CREATE INDEX runs_started ON runs(started_at);\n"
    "CREATE INDEX runs_status ON runs(status);\n"
    "CREATE INDEX runs_kind ON runs(kind, started_at);\n"
    "CREATE VIEW layer_cmp_runs AS\n"
    "  SELECT r.uid AS run_uid, r.kind, r.status, r.started_at, r.git_commit, r.host,\n"
    "         r.checkpoint_fingerprint, c.*\n"
    "  FROM layer_cmp c JOIN runs r ON r.id = c.run_id;\n";

/* v4: completions keep their token ids and the reference's margin at the divergence. */
static const char schema_v4[] =
    "ALTER TABLE completions ADD COLUMN token_ids TEXT;\n"
    "ALTER TABLE completions ADD COLUMN reference_margin REAL;\n";

static const char *const schema_steps[] = {schema_v1, schema_v2, schema_v3, schema_v4};
_Static_assert(TD_ARRAY_LEN(schema_steps) == TD_DB_SCHEMA_VERSION,
               "one migration step per schema version");

const char *td_db_schema_step_sql(int v)
{
    if (v < 1 || v > TD_DB_SCHEMA_VERSION) return NULL;
    return schema_steps[v - 1];
}

/* ==== table descriptors ====================================================================== */

#define COL(n, t, r) {n, TD_DB_COL_##t, r}

const td_db_col td_db_run_cols[] = {
    COL("uid", TEXT, true),           COL("kind", TEXT, true),
    COL("status", TEXT, true),        COL("started_at", TEXT, true),
    COL("ended_at", TEXT, false),     COL("exit_code", INT, false),
    COL("message", TEXT, false),      COL("tandem_version", TEXT, true),
    COL("git_commit", TEXT, true),    COL("binary_sha256", TEXT, false),
    COL("cuda_module_sha256", TEXT, false),
    COL("host", TEXT, true),          COL("machine_id", TEXT, false),
    COL("boot_id", TEXT, false),      COL("pid", INT, false),
    COL("proc_start", INT, false),    COL("cpu", TEXT, false),
    COL("gpu_name", TEXT, false),     COL("gpu_driver", TEXT, false),
    COL("cuda_version", TEXT, false), COL("nccl_version", TEXT, false),
    COL("checkpoint_path", TEXT, false),
    COL("checkpoint_fingerprint", TEXT, false),
    COL("checkpoint_full", INT, false),
    COL("command_line", TEXT, false), COL("env", TEXT, false),
    COL("variants", TEXT, false),     COL("seeds", TEXT, false),
    COL("origin", TEXT, false),
};
const size_t td_db_n_run_cols = TD_ARRAY_LEN(td_db_run_cols);

static const td_db_col layer_cols[] = {
    COL("tap", TEXT, true),          COL("rank", INT, true),        COL("tokens", INT, true),
    COL("variant_a", TEXT, true),    COL("variant_b", TEXT, true),  COL("layer", INT, true),
    COL("expectation", TEXT, true),  COL("dtype", TEXT, false),     COL("numel", INT, false),
    COL("exact", INT, true),         COL("mismatches", INT, false), COL("max_abs", REAL, false),
    COL("rel_l2", REAL, false),      COL("max_ulp", INT, false),    COL("nmse", REAL, false),
    COL("cosine", REAL, false),      COL("finite", INT, true),      COL("first_diff", INT, false),
    COL("verdict", TEXT, true),
};
static const td_db_col encoding_cols[] = {
    COL("check_name", TEXT, true), COL("stage", TEXT, false),       COL("variant", TEXT, false),
    COL("elements", INT, false),   COL("mismatches", INT, false),   COL("nan_mismatches", INT, false),
    COL("first_diff", INT, false), COL("exact", INT, true),         COL("verdict", TEXT, true),
    COL("detail", TEXT, false),
};
static const td_db_col census_cols[] = {
    COL("tensor", TEXT, true), COL("code", INT, true), COL("count", INT, true),
};
static const td_db_col completion_cols[] = {
    COL("variant", TEXT, true),   COL("batch", INT, true),           COL("request", TEXT, true),
    COL("rep", INT, false),       COL("length", INT, true),          COL("hash", TEXT, true),
    COL("reference", TEXT, false), COL("first_divergence", INT, false), COL("margin", REAL, false),
    COL("token_ids", TEXT, false), COL("reference_margin", REAL, false),
};
static const td_db_col quality_cols[] = {
    COL("suite", TEXT, true),     COL("metric", TEXT, true),  COL("variant", TEXT, false),
    COL("value", REAL, false),    COL("stderr", REAL, false), COL("n", INT, false),
    COL("threshold", REAL, false), COL("higher_is_better", INT, true), COL("pass", INT, false),
};
static const td_db_col timing_cols[] = {
    COL("bench", TEXT, true),  COL("shape", TEXT, false), COL("metric", TEXT, true),
    COL("variant", TEXT, false), COL("value", REAL, false), COL("unit", TEXT, true),
    COL("n", INT, false),      COL("stddev", REAL, false), COL("higher_is_better", INT, false),
};

#define TABLE(n, c, k) {n, c, TD_ARRAY_LEN(c), k}
const td_db_table td_db_tables[TD_DB_T_COUNT] = {
    [TD_DB_T_LAYER] = TABLE("layer_cmp", layer_cols, 5),
    [TD_DB_T_ENCODING] = TABLE("encoding_checks", encoding_cols, 3),
    [TD_DB_T_CENSUS] = TABLE("scale_census", census_cols, 2),
    [TD_DB_T_COMPLETION] = TABLE("completions", completion_cols, 4),
    [TD_DB_T_QUALITY] = TABLE("quality", quality_cols, 3),
    [TD_DB_T_TIMING] = TABLE("timings", timing_cols, 4),
};

const td_db_table *td_db_table_find(const char *name)
{
    for (size_t i = 0; i < TD_DB_T_COUNT; i++)
        if (name && !strcmp(td_db_tables[i].name, name)) return &td_db_tables[i];
    return NULL;
}

/* ==== migration ============================================================================== */

td_status td_db_schema_migrate(sqlite3 *h, int from, int to, td_err *err)
{
    TD_ASSERT(from >= 0 && from < to && to <= TD_DB_SCHEMA_VERSION);
    char *msg = NULL;
    if (from == 0) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA application_id = %d;", (int)TD_DB_APPLICATION_ID);
        int rc = sqlite3_exec(h, sql, NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            td_status st = td_db_sqlerr(h, rc, err, "setting the application id");
            sqlite3_free(msg);
            return st;
        }
    }
    for (int v = from + 1; v <= to; v++) {
        int rc = sqlite3_exec(h, schema_steps[v - 1], NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            td_status st = td_err_set(err, rc == SQLITE_BUSY ? TD_ERR_IO : TD_ERR_INTERNAL,
                                      "migrating the results store to schema version %d: %s", v,
                                      msg ? msg : sqlite3_errstr(rc));
            sqlite3_free(msg);
            return st;
        }
        /* user_version cannot be a bound parameter; v is a loop counter, not input. */
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d;", v);
        rc = sqlite3_exec(h, sql, NULL, NULL, &msg);
        if (rc != SQLITE_OK) {
            td_status st = td_db_sqlerr(h, rc, err, "setting the schema version");
            sqlite3_free(msg);
            return st;
        }
    }
    return TD_OK;
}

/* ==== self check ============================================================================= */

static const char *coltype_sql(td_db_coltype t)
{
    switch (t) {
    case TD_DB_COL_INT: return "INTEGER";
    case TD_DB_COL_REAL: return "REAL";
    case TD_DB_COL_TEXT: return "TEXT";
    }
    return "?";
}

static td_status selfcheck_table(td_db *db, const char *table, const td_db_col *cols, size_t n,
                                 td_err *err)
{
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, "SELECT type FROM pragma_table_info(?1) WHERE name = ?2", &st, err);
    if (s != TD_OK) return s;
    for (size_t i = 0; i < n && s == TD_OK; i++) {
        sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, cols[i].name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc != SQLITE_ROW)
            s = td_err_set(err, TD_ERR_MISMATCH, "schema: %s has no column %s", table, cols[i].name);
        else if (strcmp((const char *)sqlite3_column_text(st, 0), coltype_sql(cols[i].type)))
            s = td_err_set(err, TD_ERR_MISMATCH, "schema: %s.%s is %s, descriptor says %s", table,
                           cols[i].name, (const char *)sqlite3_column_text(st, 0),
                           coltype_sql(cols[i].type));
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (s != TD_OK) return s;
    /* and nothing undescribed: table columns = descriptor + id (runs) or run_id (results) */
    int64_t ncols = 0;
    s = td_db_prepare(db, "SELECT count(*) FROM pragma_table_info(?1)", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) ncols = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    size_t expect = n + 1;
    if ((size_t)ncols != expect)
        return td_err_set(err, TD_ERR_MISMATCH, "schema: %s has %lld columns, descriptors say %zu",
                          table, (long long)ncols, expect);
    return TD_OK;
}

td_status td_db_schema_selfcheck(td_db *db, td_err *err)
{
    td_status s = selfcheck_table(db, "runs", td_db_run_cols, td_db_n_run_cols, err);
    for (size_t i = 0; i < TD_DB_T_COUNT && s == TD_OK; i++)
        s = selfcheck_table(db, td_db_tables[i].name, td_db_tables[i].cols, td_db_tables[i].n_cols, err);
    return s;
}

/* ==== raw hooks for tests ==================================================================== */

static td_status raw_open(const char *path, sqlite3 **h, td_err *err)
{
    int rc = sqlite3_open_v2(path, h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        td_status s = td_err_set(err, TD_ERR_IO, "%s: %s", path, sqlite3_errstr(rc));
        sqlite3_close(*h);
        *h = NULL;
        return s;
    }
    sqlite3_busy_timeout(*h, TD_DB_BUSY_TIMEOUT_MS);
    return TD_OK;
}

td_status td_db_raw_exec(const char *path, const char *sql, td_err *err)
{
    sqlite3 *h;
    td_status s = raw_open(path, &h, err);
    if (s != TD_OK) return s;
    char *msg = NULL;
    int rc = sqlite3_exec(h, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) s = td_err_set(err, TD_ERR_INTERNAL, "%s: %s", path, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    sqlite3_close(h);
    return s;
}

static td_status raw_query(const char *path, const char *sql, int64_t *iout, char *tout, size_t cap,
                           td_err *err)
{
    sqlite3 *h;
    td_status s = raw_open(path, &h, err);
    if (s != TD_OK) return s;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(h, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (iout) *iout = 0;
    if (tout && cap) tout[0] = '\0';
    if (rc == SQLITE_ROW) {
        if (iout) *iout = sqlite3_column_int64(st, 0);
        if (tout && cap) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            snprintf(tout, cap, "%s", t ? (const char *)t : "");
        }
    } else if (rc != SQLITE_DONE) {
        s = td_err_set(err, TD_ERR_INTERNAL, "%s: %s", path, sqlite3_errmsg(h));
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    return s;
}

td_status td_db_raw_query_int(const char *path, const char *sql, int64_t *out, td_err *err)
{
    return raw_query(path, sql, out, NULL, 0, err);
}

td_status td_db_raw_query_text(const char *path, const char *sql, char *out, size_t cap, td_err *err)
{
    return raw_query(path, sql, NULL, out, cap, err);
}

td_status td_db_schema_create(const char *path, int version, td_err *err)
{
    if (version < 1 || version > TD_DB_SCHEMA_VERSION)
        return td_err_set(err, TD_ERR_ARG, "schema version %d out of range 1..%d", version,
                          TD_DB_SCHEMA_VERSION);
    struct stat sb;
    if (stat(path, &sb) == 0) return td_err_set(err, TD_ERR_ARG, "%s: already exists", path);
    sqlite3 *h;
    td_status s = raw_open(path, &h, err);
    if (s != TD_OK) return s;
    char *msg = NULL;
    int rc = sqlite3_exec(h, "PRAGMA journal_mode=WAL; BEGIN IMMEDIATE;", NULL, NULL, &msg);
    if (rc != SQLITE_OK) s = td_err_set(err, TD_ERR_INTERNAL, "%s: %s", path, msg ? msg : "?");
    sqlite3_free(msg);
    msg = NULL;
    if (s == TD_OK) s = td_db_schema_migrate(h, 0, version, err);
    if (s == TD_OK) {
        rc = sqlite3_exec(h, "COMMIT;", NULL, NULL, &msg);
        if (rc != SQLITE_OK) s = td_err_set(err, TD_ERR_INTERNAL, "%s: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
    }
    sqlite3_close(h);
    return s;
}
