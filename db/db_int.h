/* db_int.h — internals shared by the db/ sources (not API).
 *
 * Contract
 * - Only the db/ sources include this header: it brings in sqlite3.h, which nothing outside db/ sees.
 *   Tests reach the schema machinery through db/schema.h, which has no SQLite types.
 * - The table descriptors below are the single list of result tables and their columns;
 *   export, import, merge and CSV output are driven by them, and a test checks them against
 *   the live schema. SQL assembled from descriptors uses only these static names; values
 *   are always bound parameters.
 */
#ifndef TD_DB_INT_H
#define TD_DB_INT_H

#include "db.h"
#include "provenance.h"
#include "schema.h"

#include <sqlite3.h>
#include <cjson/cJSON.h>

/* ---- table descriptors --------------------------------------------------------------------- */

typedef enum td_db_coltype { TD_DB_COL_INT, TD_DB_COL_REAL, TD_DB_COL_TEXT } td_db_coltype;

typedef struct td_db_col {
    const char *name;
    td_db_coltype type;
    bool required;          /* NOT NULL without a default: import requires it */
} td_db_col;

typedef struct td_db_table {
    const char *name;       /* SQL table name, also the JSON key in exports */
    const td_db_col *cols;  /* result columns, excluding id and run_id */
    size_t n_cols;
    size_t n_key;           /* the first n_key columns identify a row within a run */
} td_db_table;

typedef enum td_db_table_id {
    TD_DB_T_LAYER = 0,
    TD_DB_T_ENCODING,
    TD_DB_T_CENSUS,
    TD_DB_T_COMPLETION,
    TD_DB_T_QUALITY,
    TD_DB_T_TIMING,
    TD_DB_T_COUNT
} td_db_table_id;

extern const td_db_table td_db_tables[TD_DB_T_COUNT];
/* Columns of `runs` other than id, in schema order. */
extern const td_db_col td_db_run_cols[];
extern const size_t td_db_n_run_cols;

/* Descriptor of a result table by SQL name, or NULL. */
const td_db_table *td_db_table_find(const char *name);

/* ---- the handle ---------------------------------------------------------------------------- */

typedef enum td_db_put_id {
    TD_DB_PUT_LAYER = 0,
    TD_DB_PUT_ENCODING,
    TD_DB_PUT_CENSUS,
    TD_DB_PUT_COMPLETION,
    TD_DB_PUT_QUALITY,
    TD_DB_PUT_TIMING,
    TD_DB_PUT_RUN_CHECK,
    TD_DB_PUT_COUNT
} td_db_put_id;

struct td_db {
    sqlite3 *h;
    char *path;
    unsigned flags;
    bool in_batch;
    int aborted_at_open;
    int64_t checked_run;               /* run verified `running` in the current transaction */
    sqlite3_stmt *put[TD_DB_PUT_COUNT]; /* cached prepared statements, created on first use */
    bool host_ready;
    td_prov_host host;                 /* this process's identity, filled on first use */
    char binary_sha256[65];            /* "" until computed */
};

/* ---- schema (schema.c) --------------------------------------------------------------------- */

/* Apply the migrations that take a store from version `from` to `to` (0 <= from < to <=
 * TD_DB_SCHEMA_VERSION). Runs inside the caller's transaction; sets user_version and, from
 * version 0, the application id. */
td_status td_db_schema_migrate(sqlite3 *h, int from, int to, td_err *err);

/* ---- helpers (db.c) ------------------------------------------------------------------------ */

/* Map an SQLite result code to a td_status and set a message "what: <sqlite message>". */
td_status td_db_sqlerr(sqlite3 *h, int rc, td_err *err, const char *what);
/* Prepare a statement (never from user input). */
td_status td_db_prepare(td_db *db, const char *sql, sqlite3_stmt **st, td_err *err);
/* Run SQL without results (static text only). */
td_status td_db_exec(td_db *db, const char *sql, td_err *err);
/* Bind helpers: NULL string, NaN double or negative count bind SQL NULL. */
int td_db_bind_text(sqlite3_stmt *st, int i, const char *s);
int td_db_bind_real(sqlite3_stmt *st, int i, double v);
int td_db_bind_count(sqlite3_stmt *st, int i, int64_t v);
/* Host identity of this process (cached in the handle). */
const td_prov_host *td_db_host(td_db *db);
/* Single-value query helper: first column of the first row as int64 (0 when no row). */
td_status td_db_query_int(td_db *db, const char *sql, int64_t bind1, int64_t *out, td_err *err);

/* BEGIN IMMEDIATE / COMMIT / ROLLBACK that respect an open batch (nest as no-ops). */
td_status td_db_tx_begin(td_db *db, bool *owned, td_err *err);
td_status td_db_tx_commit(td_db *db, bool owned, td_err *err);
void td_db_tx_rollback(td_db *db, bool owned);

/* ---- shared by the query modules (query.c) ------------------------------------------------ */

/* Add every column of the current row to obj under its column name (from column `first`):
 * INTEGER/REAL as numbers, TEXT as strings, NULL as null. */
void td_db_row_json(sqlite3_stmt *st, int first, cJSON *obj);

/* One side of a layer comparison matched by key across two runs. Metrics are indexed by
 * td_db_metric (TD_DB_M_MAX_ABS .. TD_DB_M_COSINE); has[m] is false for SQL NULL. */
typedef struct td_db_lside {
    bool present;
    bool exact, finite, expect_exact;
    char verdict;           /* 'p', 'f', 's' */
    double m[6];
    bool has[6];
    int64_t first_diff;     /* -1 none */
} td_db_lside;

typedef struct td_db_lpair {
    const char *tap, *variant_a, *variant_b;
    int64_t layer, rank, tokens;
    td_db_lside a, b;
} td_db_lpair;

/* Call fn for every layer result of run a (with its match in run b, or b.present = false),
 * then for every result only in b (a.present = false). Strings live until fn returns. */
td_status td_db_layer_pairs(td_db *db, int64_t run_a, int64_t run_b,
                            td_status (*fn)(void *ctx, const td_db_lpair *p, td_err *err), void *ctx,
                            td_err *err);

/* Key of a layer pair as display text: "L3.moe.out r0 t16 ref>cuda:storage=raw". */
void td_db_lpair_key(const td_db_lpair *p, char *out, size_t cap);

#endif /* TD_DB_INT_H */
