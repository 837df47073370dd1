/* test_db.c — opening the results store, refusing foreign files, run lifecycle, provenance
 * capture and the aborted-run sweep (db/db.c). */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>
#include <signal.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* File contents must be byte-identical to `before` (len bytes). */
static void assert_unchanged(const char *path, const char *before, size_t len)
{
    size_t n2 = 0;
    char *after = td_test_slurp(path, &n2);
    assert_non_null(after);
    assert_int_equal(n2, len);
    assert_memory_equal(before, after, len);
    free(after);
}

static cJSON *show(td_db *db, int64_t id)
{
    cJSON *j;
    td_err err;
    if (td_db_run_show(db, id, &j, &err) != TD_OK) fail_msg("show: %s", err.msg);
    return j;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool is_hex64(const char *s)
{
    if (!s || strlen(s) != 64) return false;
    for (; *s; s++)
        if (!strchr("0123456789abcdef", *s)) return false;
    return true;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void db_open_missing_without_create_refused(void **state)
{
    (void)state;
    const char *p = td_test_path("missing.db");
    td_db *db = (td_db *)1;
    td_err err;
    assert_int_equal(td_db_open(p, 0, &db, &err), TD_ERR_NOTFOUND);
    assert_null(db);
    assert_non_null(strstr(err.msg, "missing.db"));
    assert_int_equal(access(p, F_OK), -1); /* not created */
    assert_int_equal(td_db_open(p, TD_DB_READONLY | TD_DB_CREATE, &db, &err), TD_ERR_NOTFOUND);
}

static void db_open_creates_wal_store_with_pragmas(void **state)
{
    (void)state;
    const char *p = td_test_path("new.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    cJSON *info;
    td_err err;
    assert_int_equal(td_db_info(db, true, &info, &err), TD_OK);
    assert_string_equal(jstr(info, "journal_mode"), "wal");
    assert_int_equal(cJSON_GetObjectItem(info, "foreign_keys")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(info, "schema_version")->valuedouble, TD_DB_SCHEMA_VERSION);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(info, "integrity_check"), 0)->valuestring, "ok");
    cJSON_Delete(info);
    td_db_close(db);
    assert_int_equal(raw_int(p, "PRAGMA application_id"), TD_DB_APPLICATION_ID);
    assert_int_equal(raw_int(p, "PRAGMA user_version"), TD_DB_SCHEMA_VERSION);
    /* an existing empty file is a fresh store too */
    const char *e = td_test_path("empty-file.db");
    td_test_write(e, "", 0);
    db = open_ok(e, 0);
    td_db_close(db);
    assert_int_equal(raw_int(e, "PRAGMA user_version"), TD_DB_SCHEMA_VERSION);
    td_db_close(NULL); /* no-op */
}

static void db_foreign_or_corrupt_files_refused_unchanged(void **state)
{
    (void)state;
    td_err err;
    /* a tandem store to damage in several ways */
    const char *good = td_test_path("good.db");
    td_db *db = open_ok(good, TD_DB_CREATE);
    int64_t run = begin_run(db, "test");
    td_db_layer_row row = {.layer = 0, .tokens = 1, .tap = "L0.attn.out", .variant_a = "ref", .variant_b = "cuda",
                           .exact = true, .finite = true, .mismatches = 0, .numel = 4, .max_ulp = 0, .first_diff = -1};
    assert_int_equal(td_db_put_layer(db, run, &row, &err), TD_OK);
    td_db_close(db);
    /* the last connection's close checkpointed the WAL: the file holds everything */
    size_t glen = 0;
    char *gbytes = td_test_slurp(good, &glen);
    assert_non_null(gbytes);
    assert_true(glen >= 4096);

    struct { const char *name; size_t len; int kind; td_status code; const char *needle; } cases[] = {
        {"text.db", 0, 0, TD_ERR_FORMAT, "not an SQLite database"},
        {"random.db", 0, 1, TD_ERR_FORMAT, "not an SQLite database"},
        {"truncated.db", 0, 2, TD_ERR_FORMAT, "truncated"},
        {"badheader.db", 0, 3, TD_ERR_FORMAT, "corrupt SQLite header"},
        {"foreign.db", 0, 4, TD_ERR_FORMAT, "not a tandem results store"},
        {"newer.db", 0, 5, TD_ERR_UNSUPPORTED, "newer"},
        {"garbage-pages.db", 0, 6, TD_ERR_FORMAT, "corrupt"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        const char *p = td_test_path(cases[i].name);
        switch (cases[i].kind) {
        case 0: td_test_write_str(p, "this is a text file, not a database\n"); break;
        case 1: {
            char buf[8192];
            for (size_t k = 0; k < sizeof buf; k++) buf[k] = (char)(k * 2654435761u >> 13);
            td_test_write(p, buf, sizeof buf);
            break;
        }
        case 2: td_test_write(p, gbytes, glen / 2); break;
        case 3: {
            char *b = malloc(glen);
            memcpy(b, gbytes, glen);
            b[21] = 99; /* max embedded payload fraction must be 64 */
            td_test_write(p, b, glen);
            free(b);
            break;
        }
        case 4: assert_int_equal(td_db_raw_exec(p, "CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('mine');", &err), TD_OK); break;
        case 5:
            td_test_write(p, gbytes, glen);
            assert_int_equal(td_db_raw_exec(p, "PRAGMA user_version = 99;", &err), TD_OK);
            break;
        case 6: {
            /* page 1 intact, every other page overwritten: the schema cannot be read */
            char *b = malloc(glen);
            memcpy(b, gbytes, glen);
            for (size_t k = 4096; k < glen; k++) b[k] = (char)0xA5;
            td_test_write(p, b, glen);
            free(b);
            break;
        }
        }
        size_t len;
        char *before = td_test_slurp(p, &len);
        assert_non_null(before);
        td_db *h = (td_db *)1;
        td_status s = td_db_open(p, TD_DB_CREATE, &h, &err);
        if (s != cases[i].code || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, cases[i].name))
            fail_msg("%s: status %d, message '%s'", cases[i].name, s, err.msg);
        assert_null(h);
        assert_unchanged(p, before, len);
        free(before);
    }
    free(gbytes);
}

static void db_run_lifecycle_records_provenance(void **state)
{
    (void)state;
    td_err err;
    /* a minimal checkpoint directory */
    const char *ck = td_test_path("ckpt");
    mkdir(ck, 0777);
    char f[700];
    snprintf(f, sizeof f, "%s/config.json", ck);
    td_test_write_str(f, "{\"model_type\": \"qwen3_next\"}");
    snprintf(f, sizeof f, "%s/model.safetensors", ck);
    td_test_write_str(f, "0123456789");
    setenv("TANDEM_TEST_MARKER", "marker-value", 1);
    setenv("TANDEM_TEST_API_TOKEN", "do-not-store", 1);

    td_db *db = open_ok(td_test_path("life.db"), TD_DB_CREATE);
    char *argv[] = {"tandem", "audit", "layer", "--seed", "7"};
    const char *variants[] = {"ref", "cuda:storage=raw"};
    uint64_t seeds[] = {7, UINT64_MAX};
    td_db_run_info info = {.kind = "audit.layer", .argc = 5, .argv = argv, .checkpoint = ck,
                           .variants = variants, .n_variants = 2, .seeds = seeds, .n_seeds = 2};
    int64_t run;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    cJSON *j = show(db, run);
    assert_string_equal(jstr(j, "status"), "running");
    assert_string_equal(jstr(j, "kind"), "audit.layer");
    assert_int_equal(strlen(jstr(j, "uid")), TD_DB_UID_LEN);
    assert_true(is_hex64(jstr(j, "binary_sha256")));
    assert_true(is_hex64(jstr(j, "checkpoint_fingerprint")));
    assert_non_null(jstr(j, "host"));
    assert_non_null(jstr(j, "cpu"));
    assert_non_null(jstr(j, "git_commit"));
    assert_non_null(jstr(j, "tandem_version"));
    assert_non_null(strstr(jstr(j, "checkpoint_path"), "ckpt"));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "gpu_name")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "ended_at")));
    cJSON *env = cJSON_GetObjectItem(j, "env");
    assert_string_equal(jstr(env, "TANDEM_TEST_MARKER"), "marker-value");
    assert_string_equal(jstr(env, "TANDEM_TEST_API_TOKEN"), "<redacted>");
    assert_null(cJSON_GetObjectItem(env, "HOME"));
    cJSON *cmd = cJSON_GetObjectItem(j, "command_line");
    assert_int_equal(cJSON_GetArraySize(cmd), 5);
    assert_string_equal(cJSON_GetArrayItem(cmd, 4)->valuestring, "7");
    cJSON *sd = cJSON_GetObjectItem(j, "seeds");
    assert_int_equal(cJSON_GetArrayItem(sd, 0)->valuedouble, 7);
    assert_string_equal(cJSON_GetArrayItem(sd, 1)->valuestring, "18446744073709551615");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "variants"), 1)->valuestring, "cuda:storage=raw");
    cJSON_Delete(j);

    td_db_device dev = {.gpu_name = "NVIDIA H200", .gpu_driver = "580.1", .cuda_version = "13.0",
                        .cuda_module_path = f};
    assert_int_equal(td_db_run_set_device(db, run, &dev, &err), TD_OK);
    assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    j = show(db, run);
    assert_string_equal(jstr(j, "status"), "ok");
    assert_string_equal(jstr(j, "gpu_name"), "NVIDIA H200");
    assert_true(is_hex64(jstr(j, "cuda_module_sha256")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "nccl_version")));
    assert_non_null(jstr(j, "ended_at"));
    assert_int_equal(cJSON_GetObjectItem(j, "exit_code")->valuedouble, 0);
    cJSON_Delete(j);
    /* a run ends once; results cannot be added afterwards */
    assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_FAILED, 2, "again", &err), TD_ERR_ARG);
    td_db_timing_row t = {.bench = "b", .metric = "m", .unit = "ms", .value = 1, .n = -1, .stddev = NAN};
    assert_int_equal(td_db_put_timing(db, run, &t, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "is ok"));
    assert_int_equal(td_db_put_timing(db, 9999, &t, &err), TD_ERR_NOTFOUND);
    /* failing runs keep their message; bad kinds and a missing checkpoint are refused */
    int64_t r2 = begin_run(db, "bench");
    assert_int_equal(td_db_run_end(db, r2, TD_DB_RUN_FAILED, 2, "model.safetensors: bad header", &err), TD_OK);
    j = show(db, r2);
    assert_string_equal(jstr(j, "status"), "failed");
    assert_string_equal(jstr(j, "message"), "model.safetensors: bad header");
    cJSON_Delete(j);
    td_db_run_info bad = {.kind = "Audit Layer"};
    assert_int_equal(td_db_run_begin(db, &bad, &run, &err), TD_ERR_ARG);
    td_db_run_info nock = {.kind = "audit.layer", .checkpoint = td_test_path("no-such-ckpt")};
    assert_int_equal(td_db_run_begin(db, &nock, &run, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "no-such-ckpt"));
    td_db_close(db);
    unsetenv("TANDEM_TEST_MARKER");
    unsetenv("TANDEM_TEST_API_TOKEN");
}

static void db_dead_owner_run_marked_aborted(void **state)
{
    (void)state;
    const char *p = td_test_path("abort.db");
    td_db_close(open_ok(p, TD_DB_CREATE));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* child: open a run and vanish without closing it */
        td_db *c;
        td_err e;
        if (td_db_open(p, 0, &c, &e) != TD_OK) _exit(3);
        td_db_run_info info = {.kind = "audit.layer"};
        int64_t id;
        if (td_db_run_begin(c, &info, &id, &e) != TD_OK) _exit(4);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    /* runs elsewhere are not ours to judge; our own live run must stay running */
    td_err err;
    assert_int_equal(td_db_raw_exec(p,
                     "INSERT INTO runs (uid, kind, status, started_at, tandem_version, git_commit, host, pid, "
                     "proc_start) VALUES ('other-host-run-0001', 'bench', 'running', '2026-01-01T00:00:00.000Z', "
                     "'0', 'x', 'some-other-host', 1, 1)", &err), TD_OK);
    td_db *db = open_ok(p, 0);
    assert_int_equal(td_db_aborted_at_open(db), 1);
    int64_t mine = begin_run(db, "bench");
    td_db *db2 = open_ok(p, 0); /* a second process-like open while `mine` is live */
    assert_int_equal(td_db_aborted_at_open(db2), 0);
    td_db_close(db2);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE status = 'aborted'"), 1);
    assert_non_null(strstr(raw_text(p, "SELECT message FROM runs WHERE status = 'aborted'"), "ended without closing"));
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE status = 'running'"), 2);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT status = 'running' FROM runs WHERE id = %lld", (long long)mine);
    assert_int_equal(raw_int(p, sql), 1);

    /* pid reuse: same pid, different start time -> the owner is gone */
    snprintf(sql, sizeof sql, "UPDATE runs SET proc_start = proc_start + 1 WHERE id = %lld", (long long)mine);
    assert_int_equal(td_db_raw_exec(p, sql, &err), TD_OK);
    db = open_ok(p, 0);
    assert_int_equal(td_db_aborted_at_open(db), 1);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE status = 'aborted'"), 2);
    /* another boot of this host: gone as well */
    db = open_ok(p, 0);
    int64_t r3 = begin_run(db, "bench");
    td_db_close(db);
    snprintf(sql, sizeof sql, "UPDATE runs SET boot_id = 'another-boot' WHERE id = %lld", (long long)r3);
    assert_int_equal(td_db_raw_exec(p, sql, &err), TD_OK);
    db = open_ok(p, 0);
    assert_int_equal(td_db_aborted_at_open(db), 1);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE host = 'some-other-host' AND status = 'running'"), 1);
}

static void db_readonly_open_never_writes(void **state)
{
    (void)state;
    td_err err;
    const char *p = td_test_path("ro.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t r = begin_run(db, "bench");
    assert_int_equal(td_db_run_end(db, r, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    td_db_close(db);
    db = open_ok(p, TD_DB_READONLY);
    td_db_run_info info = {.kind = "bench"};
    int64_t id;
    assert_int_equal(td_db_run_begin(db, &info, &id, &err), TD_ERR_ARG);
    cJSON *j;
    td_db_runs_filter f = {0};
    assert_int_equal(td_db_runs_list(db, &f, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    td_db_close(db);
    /* an older store is not migrated by a read-only open */
    const char *old = td_test_path("ro-old.db");
    assert_int_equal(td_db_schema_create(old, 1, &err), TD_OK);
    assert_int_equal(td_db_open(old, TD_DB_READONLY, &db, &err), TD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "needs migrating"));
    assert_int_equal(raw_int(old, "PRAGMA user_version"), 1);
}

static void db_path_resolution_order(void **state)
{
    (void)state;
    unsetenv("TANDEM_DB");
    assert_string_equal(td_db_path_resolve(NULL), "tandem.db");
    setenv("TANDEM_DB", "/x/env.db", 1);
    assert_string_equal(td_db_path_resolve(NULL), "/x/env.db");
    assert_string_equal(td_db_path_resolve(""), "/x/env.db");
    assert_string_equal(td_db_path_resolve("opt.db"), "opt.db");
    unsetenv("TANDEM_DB");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(db_open_missing_without_create_refused),
        cmocka_unit_test(db_open_creates_wal_store_with_pragmas),
        cmocka_unit_test(db_foreign_or_corrupt_files_refused_unchanged),
        cmocka_unit_test(db_run_lifecycle_records_provenance),
        cmocka_unit_test(db_dead_owner_run_marked_aborted),
        cmocka_unit_test(db_readonly_open_never_writes),
        cmocka_unit_test(db_path_resolution_order),
    };
    return cmocka_run_group_tests_name("db", tests, NULL, NULL);
}
