/* test_db_cli.c — the `tandem db` front end (cli/cmd_db.c): help everywhere, errors that name
 * the culprit, tables by default and JSON with --json, exit statuses. */
#include "test_common.h"
#include "db/db.h"
#include "db/query.h"

#include <math.h>

static const char *tandem(void)
{
    const char *t = getenv("TD_TANDEM");
    return t;
}

/* Run `tandem db ARGS` with stdout and stderr captured; returns the exit status. */
static int run_db(char **out, const char *fmt, ...) TD_PRINTF(2, 3);
static int run_db(char **out, const char *fmt, ...)
{
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char log[768];
    snprintf(log, sizeof log, "%s", td_test_path("cli.log"));
    int rc = td_test_sh("%s db %s >%s 2>&1", tandem(), args, log);
    if (out) *out = td_test_slurp(log, NULL);
    return rc;
}

static void populate(const char *path, int n_runs)
{
    td_db *db;
    td_err err;
    assert_int_equal(td_db_open(path, TD_DB_CREATE, &db, &err), TD_OK);
    for (int k = 0; k < n_runs; k++) {
        const char *variants[] = {"ref", "cuda:storage=raw"};
        td_db_run_info info = {.kind = k % 2 ? "bench" : "audit.layer", .variants = variants, .n_variants = 2};
        int64_t run;
        assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
        for (int i = 0; i < 3; i++) {
            char tap[32];
            snprintf(tap, sizeof tap, "L%d.moe.out", i);
            td_db_layer_row r = {.layer = i, .tokens = 16, .tap = tap, .variant_a = "ref", .variant_b = "cuda:storage=raw",
                                 .expectation = TD_DB_EXPECT_EXACT, .numel = 10, .exact = true, .mismatches = 0,
                                 .max_abs = 0, .rel_l2 = 0, .max_ulp = 0, .nmse = 0, .cosine = 1, .finite = true,
                                 .first_diff = -1, .verdict = TD_DB_PASS};
            assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
        }
        if (k % 2) { /* a bench names its GPU */
            td_db_device dev = {.gpu_name = "NVIDIA H200", .gpu_driver = "580.159.04", .cuda_version = "13.0"};
            assert_int_equal(td_db_run_set_device(db, run, &dev, &err), TD_OK);
        }
        assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    }
    td_db_close(db);
}

static void cli_help_everywhere(void **state)
{
    (void)state;
    if (!tandem()) skip();
    char *out;
    assert_int_equal(run_db(&out, "--help"), 0);
    assert_non_null(strstr(out, "usage: tandem db"));
    free(out);
    static const char *const subs[] = {"runs", "show", "compare", "baseline", "regress", "trend",
                                       "export", "import", "merge", "info"};
    for (size_t i = 0; i < TD_ARRAY_LEN(subs); i++) {
        assert_int_equal(run_db(&out, "%s --help", subs[i]), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: tandem db %s", subs[i]);
        if (!strstr(out, want)) fail_msg("%s --help: %s", subs[i], out);
        free(out);
    }
    /* --help works without a store and before other errors are looked for */
    assert_int_equal(run_db(NULL, "--db /nonexistent/x.db regress --help"), 0);
    assert_int_equal(run_db(&out, "%s", ""), 2);
    assert_non_null(strstr(out, "usage"));
    free(out);
}

static void cli_errors_name_the_culprit(void **state)
{
    (void)state;
    if (!tandem()) skip();
    char db[768];
    snprintf(db, sizeof db, "%s", td_test_path("err.db"));
    populate(db, 2);
    struct { const char *args; const char *needle; } cases[] = {
        {"frobnicate", "unknown subcommand 'frobnicate'"},
        {"runs --bogus", "unknown option '--bogus'"},
        {"runs --limit", "option '--limit' needs a value"},
        {"runs --limit ten", "--limit 'ten'"},
        {"runs --status finished", "--status 'finished'"},
        {"runs --since yesterday", "--since 'yesterday'"},
        {"runs extra", "unexpected argument 'extra'"},
        {"show", "expected one run"},
        {"show 4242", "run '4242' not found"},
        {"compare 1", "expected two runs"},
        {"baseline set main", "usage: baseline set NAME RUN"},
        {"baseline frob", "unknown action 'frob'"},
        {"regress --run 1", "--baseline NAME and --run RUN are required"},
        {"trend", "--metric is required"},
        {"trend --metric bogus", "--metric 'bogus'"},
        {"trend --metric nmse --where nope=1", "--where 'nope=1'"},
        {"trend --metric nmse --by day", "--by 'day'"},
        {"export --run 1 --format xml", "--format 'xml'"},
        {"export", "--run RUN is required"},
        {"import", "expected one FILE.json"},
        {"info --json=yes", "unknown option '--json'"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        char *out;
        int rc = run_db(&out, "--db %s %s", db, cases[i].args);
        if (rc != 2 || !strstr(out, cases[i].needle) || !strstr(out, "tandem db"))
            fail_msg("'%s': exit %d, output: %s", cases[i].args, rc, out);
        free(out);
    }
    /* a missing store is named, and not created */
    char *out;
    assert_int_equal(run_db(&out, "--db %s runs", td_test_path("none.db")), 2);
    assert_non_null(strstr(out, "none.db"));
    assert_int_equal(access(td_test_path("none.db"), F_OK), -1);
    free(out);
    /* TANDEM_DB is honoured; --db wins over it */
    assert_int_equal(td_test_sh("TANDEM_DB=%s %s db runs >/dev/null 2>&1", db, tandem()), 0);
    assert_int_equal(td_test_sh("TANDEM_DB=/nonexistent/x.db %s db --db %s runs >/dev/null 2>&1", tandem(), db), 0);
}

static void cli_tables_and_json(void **state)
{
    (void)state;
    if (!tandem()) skip();
    char db[768];
    snprintf(db, sizeof db, "%s", td_test_path("out.db"));
    populate(db, 3);
    char *out;
    assert_int_equal(run_db(&out, "--db %s runs", db), 0);
    assert_non_null(strstr(out, "ID"));
    assert_non_null(strstr(out, "STATUS"));
    assert_non_null(strstr(out, "audit.layer"));
    assert_non_null(strstr(out, "ref cuda:storage=raw"));
    /* the GPU column: the bench's GPU, "-" for the runs that name none */
    assert_non_null(strstr(out, "  GPU  "));
    assert_non_null(strstr(out, "NVIDIA H200"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s runs --kind bench --json", db), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(j), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "gpu_name")->valuestring, "NVIDIA H200");
    cJSON_Delete(j);
    free(out);
    assert_int_equal(run_db(&out, "--db %s runs --gpu 'NVIDIA H2*' --json", db), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    free(out);
    assert_int_equal(run_db(&out, "--db %s runs --gpu 'NVIDIA A100'", db), 0);
    assert_non_null(strstr(out, "match the filters"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s show latest", db), 0);
    assert_non_null(strstr(out, "binary_sha256"));
    assert_non_null(strstr(out, "layer comparisons"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s compare 1 3", db), 0);
    assert_non_null(strstr(out, "3 matched"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s compare 1 3 --json --limit 1", db), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "layer_cmp")), 1);
    cJSON_Delete(j);
    free(out);
    assert_int_equal(run_db(&out, "--db %s trend --metric max_abs --where tap=L1.moe.out", db), 0);
    assert_non_null(strstr(out, "0 step(s)"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s info --check", db), 0);
    assert_non_null(strstr(out, "integrity check ok"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s baseline set nightly latest:audit.layer", db), 0);
    free(out);
    assert_int_equal(run_db(&out, "--db %s baseline list", db), 0);
    assert_non_null(strstr(out, "nightly"));
    free(out);
}

static void cli_export_import_merge_flow(void **state)
{
    (void)state;
    if (!tandem()) skip();
    char a[768], b[768], c[768], js[768], csv[768];
    snprintf(a, sizeof a, "%s", td_test_path("fa.db"));
    snprintf(b, sizeof b, "%s", td_test_path("fb.db"));
    snprintf(c, sizeof c, "%s", td_test_path("fc.db"));
    snprintf(js, sizeof js, "%s", td_test_path("runs.json"));
    snprintf(csv, sizeof csv, "%s", td_test_path("runs.csv"));
    populate(a, 2);
    char *out;
    assert_int_equal(run_db(&out, "--db %s export --run 1 --run 2 --out %s", a, js), 0);
    free(out);
    assert_int_equal(run_db(&out, "--db %s export --run 1 --format csv --out %s", a, csv), 0);
    free(out);
    char *t = td_test_slurp(csv, NULL);
    assert_true(!strncmp(t, "run_uid,", 8));
    free(t);
    assert_int_equal(run_db(&out, "--db %s import %s", b, js), 0);
    assert_non_null(strstr(out, "2 run(s) added"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s import %s --json", b, js), 0);
    cJSON *j = cJSON_Parse(out);
    assert_int_equal(cJSON_GetObjectItem(j, "runs_present")->valuedouble, 2);
    cJSON_Delete(j);
    free(out);
    populate(c, 1);
    assert_int_equal(run_db(&out, "--db %s merge %s", c, a), 0);
    assert_non_null(strstr(out, "2 run(s) added"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s merge %s", c, b), 0);
    assert_non_null(strstr(out, "0 run(s) added"));
    free(out);
    /* a corrupt store is refused and left as it was */
    char bad[768];
    snprintf(bad, sizeof bad, "%s", td_test_path("corrupt.db"));
    td_test_write_str(bad, "SQLite format 3 but not really");
    assert_int_equal(run_db(&out, "--db %s runs", bad), 2);
    assert_non_null(strstr(out, "refusing"));
    free(out);
    assert_int_equal(run_db(&out, "--db %s merge %s", c, bad), 2);
    assert_non_null(strstr(out, "merge source"));
    free(out);
    t = td_test_slurp(bad, NULL);
    assert_string_equal(t, "SQLite format 3 but not really");
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cli_help_everywhere),
        cmocka_unit_test(cli_errors_name_the_culprit),
        cmocka_unit_test(cli_tables_and_json),
        cmocka_unit_test(cli_export_import_merge_flow),
    };
    return cmocka_run_group_tests_name("db_cli", tests, NULL, NULL);
}
