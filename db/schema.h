/* schema.h — the results store's schema history, and low-level hooks for tests.
 *
 * Contract
 * - The schema is a list of forward migrations; step v (1..TD_DB_SCHEMA_VERSION) takes a
 *   store from version v-1 to v. A store's version is PRAGMA user_version. Steps are never
 *   edited once released: a change is a new step.
 * - td_db_schema_create() writes a store exactly as a tandem of schema `version` would have
 *   created it; tests open it with td_db_open() to exercise the migrations.
 * - td_db_schema_selfcheck() compares the table descriptors that drive export, import and
 *   merge against the live schema of an open store.
 * - The td_db_raw_*() hooks open a file with no tandem checks at all and run static SQL; they
 *   exist for tests (building fixtures, inspecting results) and are not for tandem commands.
 * - None of these keep state; all are safe to call from any thread with distinct arguments.
 */
#ifndef TD_DB_SCHEMA_H
#define TD_DB_SCHEMA_H

#include "db.h"

/* SQL of migration step v (1-based); NULL when out of range. */
const char *td_db_schema_step_sql(int v);

/* Create a store at `path` (must not exist) with schema `version` (1..latest). */
td_status td_db_schema_create(const char *path, int version, td_err *err);

/* TD_OK when every descriptor column exists in the live tables with the declared type. */
td_status td_db_schema_selfcheck(td_db *db, td_err *err);

td_status td_db_raw_exec(const char *path, const char *sql, td_err *err);
/* First column of the first row; *out = 0 (or "") when the query returns no row. */
td_status td_db_raw_query_int(const char *path, const char *sql, int64_t *out, td_err *err);
td_status td_db_raw_query_text(const char *path, const char *sql, char *out, size_t cap,
                               td_err *err);

#endif /* TD_DB_SCHEMA_H */
