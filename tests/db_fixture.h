/* db_fixture.h — small helpers shared by the results-store tests (tests/test_db*.c): open a
 * store, begin a run, run raw SQL on the file; every failure fails the calling test with the
 * library's message. */
#ifndef TD_TEST_DB_FIXTURE_H
#define TD_TEST_DB_FIXTURE_H

#include "test_common.h"
#include "db/db.h"
#include "db/schema.h"

static inline td_db *open_ok(const char *path, unsigned flags)
{
    td_db *db = NULL;
    td_err err;
    if (td_db_open(path, flags, &db, &err) != TD_OK) fail_msg("open %s: %s", path, err.msg);
    return db;
}

static inline int64_t begin_run(td_db *db, const char *kind)
{
    td_db_run_info info = {.kind = kind};
    int64_t id;
    td_err err;
    if (td_db_run_begin(db, &info, &id, &err) != TD_OK) fail_msg("run_begin: %s", err.msg);
    return id;
}

static inline int64_t raw_int(const char *path, const char *sql)
{
    int64_t v;
    td_err err;
    if (td_db_raw_query_int(path, sql, &v, &err) != TD_OK) fail_msg("%s: %s", sql, err.msg);
    return v;
}

static inline const char *raw_text(const char *path, const char *sql)
{
    static char buf[4096];
    td_err err;
    if (td_db_raw_query_text(path, sql, buf, sizeof buf, &err) != TD_OK) fail_msg("%s: %s", sql, err.msg);
    return buf;
}

static inline void raw_exec(const char *path, const char *sql)
{
    td_err err;
    if (td_db_raw_exec(path, sql, &err) != TD_OK) fail_msg("%s: %s", sql, err.msg);
}

#endif /* TD_TEST_DB_FIXTURE_H */
