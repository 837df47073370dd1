/* test_db_schema.c — schema history and forward migrations (db/schema.c). */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>

/* What a tandem of schema v1 wrote: a finished run and two layer rows. */
static const char fill_v1[] =
    "INSERT INTO runs (uid, kind, status, started_at, ended_at, exit_code, tandem_version, git_commit, host) "
    "VALUES ('00000000-0000-4000-8000-000000000001', 'audit.layer', 'ok', '2026-01-01T00:00:00.000Z', "
    "'2026-01-01T00:00:05.000Z', 0, '0.0.1', 'abc', 'old-host');"
    "INSERT INTO layer_cmp (run_id, layer, rank, tokens, tap, variant_a, variant_b, expectation, exact, "
    "mismatches, max_abs, rel_l2, finite, verdict) VALUES "
    "(1, 0, 0, 1, 'L0.attn.out', 'ref', 'cuda', 'exact', 1, 0, 0.0, 0.0, 1, 'pass'),"
    "(1, 0, 0, 16, 'L0.attn.out', 'ref', 'cuda', 'bounded', 0, 3, 1e-6, 2e-7, 1, 'pass');";
/* and what v2 added */
static const char fill_v2[] =
    "INSERT INTO quality (run_id, suite, metric, value, higher_is_better, threshold, pass) "
    "VALUES (1, 'gsm8k', 'acc', 0.9, 1, 0.8, 1);"
    "INSERT INTO timings (run_id, bench, metric, value, unit) VALUES (1, 'moe', 'median', 1.5, 'ms');"
    "INSERT INTO completions (run_id, variant, batch, request, length, hash, reference, first_divergence, margin) "
    "VALUES (1, 'cuda', 1, 'r0', 4, 'abcd', 'ref', 2, 0.5);";

static void schema_every_older_version_migrates(void **state)
{
    (void)state;
    td_err err;
    for (int v = 0; v < TD_DB_SCHEMA_VERSION; v++) {
        char name[64];
        snprintf(name, sizeof name, "v%d.db", v);
        const char *p = td_test_path(name);
        if (v == 0) {
            td_test_write(p, "", 0); /* version 0: an empty file */
        } else {
            assert_int_equal(td_db_schema_create(p, v, &err), TD_OK);
            assert_int_equal(raw_int(p, "PRAGMA user_version"), v);
            assert_int_equal(td_db_raw_exec(p, fill_v1, &err), TD_OK);
            if (v >= 2) assert_int_equal(td_db_raw_exec(p, fill_v2, &err), TD_OK);
        }
        td_db *db;
        if (td_db_open(p, 0, &db, &err) != TD_OK) fail_msg("open v%d: %s", v, err.msg);
        assert_int_equal(td_db_schema_selfcheck(db, &err), TD_OK);
        cJSON *info;
        assert_int_equal(td_db_info(db, true, &info, &err), TD_OK);
        assert_int_equal(cJSON_GetObjectItem(info, "schema_version")->valuedouble, TD_DB_SCHEMA_VERSION);
        assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(info, "integrity_check"), 0)->valuestring, "ok");
        cJSON_Delete(info);
        if (v >= 1) {
            /* old data survived and works with what later versions added */
            int64_t id;
            assert_int_equal(td_db_run_resolve(db, "00000000", &id, &err), TD_OK);
            assert_int_equal(td_db_baseline_set(db, "old", id, &err), TD_OK);
            cJSON *j;
            assert_int_equal(td_db_run_show(db, id, &j, &err), TD_OK);
            assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "results"), "layer_cmp")->valuedouble, 2);
            assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "results"), "quality")->valuedouble,
                             v >= 2 ? 1 : 0);
            cJSON_Delete(j);
            int64_t nreg;
            td_db_regress_opts ro = {.baseline_run = id, .run = id};
            assert_int_equal(td_db_regress(db, &ro, &j, &nreg, &err), TD_OK);
            assert_int_equal(nreg, 0);
            cJSON_Delete(j);
            /* v4 added token_ids and reference_margin: older completions read back with them NULL */
            assert_int_equal(td_db_completions(db, id, false, &j, &err), TD_OK);
            assert_int_equal(cJSON_GetArraySize(j), v >= 2 ? 1 : 0);
            if (v >= 2) {
                const cJSON *c = cJSON_GetArrayItem(j, 0);
                assert_int_equal(cJSON_GetObjectItem(c, "first_divergence")->valuedouble, 2);
                assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "token_ids")));
                assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "reference_margin")));
            }
            cJSON_Delete(j);
        }
        td_db_run_info info2 = {.kind = "bench"};
        int64_t r;
        assert_int_equal(td_db_run_begin(db, &info2, &r, &err), TD_OK);
        td_db_census_row c = {.tensor = "w", .code = 64, .count = 10};
        assert_int_equal(td_db_put_census(db, r, &c, &err), TD_OK);
        static const int32_t ids[2] = {3, 4};
        td_db_completion_row cp = {.variant = "ref", .batch = 1, .request = "r0", .length = 2, .hash = "h",
                                   .first_divergence = -1, .margin = NAN, .tokens = ids, .reference_margin = NAN};
        assert_int_equal(td_db_put_completion(db, r, &cp, &err), TD_OK);
        assert_int_equal(td_db_run_end(db, r, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
        td_db_close(db);
        assert_int_equal(raw_int(p, "PRAGMA user_version"), TD_DB_SCHEMA_VERSION);
        assert_int_equal(raw_int(p, "PRAGMA application_id"), TD_DB_APPLICATION_ID);
    }
}

static void schema_descriptors_match_live_tables(void **state)
{
    (void)state;
    td_err err;
    td_db *db;
    assert_int_equal(td_db_open(td_test_path("fresh.db"), TD_DB_CREATE, &db, &err), TD_OK);
    if (td_db_schema_selfcheck(db, &err) != TD_OK) fail_msg("%s", err.msg);
    td_db_close(db);
}

static void schema_steps_listed_once(void **state)
{
    (void)state;
    assert_null(td_db_schema_step_sql(0));
    assert_null(td_db_schema_step_sql(TD_DB_SCHEMA_VERSION + 1));
    for (int v = 1; v <= TD_DB_SCHEMA_VERSION; v++) assert_non_null(td_db_schema_step_sql(v));
    td_err err;
    assert_int_equal(td_db_schema_create(td_test_path("x.db"), 0, &err), TD_ERR_ARG);
    assert_int_equal(td_db_schema_create(td_test_path("x.db"), TD_DB_SCHEMA_VERSION + 1, &err), TD_ERR_ARG);
}

/* Several processes creating the same new store at once: one schema, all succeed. */
static void schema_concurrent_first_open(void **state)
{
    (void)state;
    const char *p = td_test_path("race.db");
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            td_db *db;
            td_err e;
            if (td_db_open(p, TD_DB_CREATE, &db, &e) != TD_OK) {
                fprintf(stderr, "child %d: %s\n", i, e.msg);
                _exit(3);
            }
            td_db_close(db);
            _exit(0);
        }
    }
    for (int i = 0; i < 4; i++) {
        int st;
        assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    assert_int_equal(raw_int(p, "PRAGMA user_version"), TD_DB_SCHEMA_VERSION);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM sqlite_master WHERE name = 'runs'"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(schema_every_older_version_migrates),
        cmocka_unit_test(schema_descriptors_match_live_tables),
        cmocka_unit_test(schema_steps_listed_once),
        cmocka_unit_test(schema_concurrent_first_open),
    };
    return cmocka_run_group_tests_name("db_schema", tests, NULL, NULL);
}
