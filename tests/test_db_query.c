/* test_db_query.c — run references, run listing and filters, show, info, compare and completions
 * (db/query.c). */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>

/* A finished run of `kind`, started at `when` (ISO text, NULL: now), with commit `commit`. */
static int64_t add_run(const char *path, const char *kind, const char *when, const char *commit)
{
    td_db *db = open_ok(path, TD_DB_CREATE);
    td_db_run_info info = {.kind = kind};
    int64_t id;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &id, &err), TD_OK);
    assert_int_equal(td_db_run_end(db, id, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    td_db_close(db);
    char sql[256];
    if (when) {
        snprintf(sql, sizeof sql, "UPDATE runs SET started_at = '%s', ended_at = '%s' WHERE id = %lld", when, when,
                 (long long)id);
        raw_exec(path, sql);
    }
    if (commit) {
        snprintf(sql, sizeof sql, "UPDATE runs SET git_commit = '%s' WHERE id = %lld", commit, (long long)id);
        raw_exec(path, sql);
    }
    return id;
}

static cJSON *list(td_db *db, td_db_runs_filter f)
{
    cJSON *j;
    td_err err;
    if (td_db_runs_list(db, &f, &j, &err) != TD_OK) fail_msg("runs_list: %s", err.msg);
    return j;
}

static int64_t id_at(const cJSON *arr, int i)
{
    return (int64_t)cJSON_GetObjectItem(cJSON_GetArrayItem(arr, i), "id")->valuedouble;
}

static void query_run_references_resolve(void **state)
{
    (void)state;
    const char *p = td_test_path("refs.db");
    int64_t a = add_run(p, "audit.layer", "2026-01-01T00:00:00.000Z", NULL);
    int64_t b = add_run(p, "bench", "2026-01-02T00:00:00.000Z", NULL);
    int64_t c = add_run(p, "audit.layer", "2026-01-03T00:00:00.000Z", NULL);
    raw_exec(p, "UPDATE runs SET uid = 'abcd1111-0000-4000-8000-000000000001' WHERE id = 1;"
                "UPDATE runs SET uid = 'abcd2222-0000-4000-8000-000000000002' WHERE id = 2;"
                "UPDATE runs SET uid = '12340000-0000-4000-8000-000000000003' WHERE id = 3;");
    td_db *db = open_ok(p, 0);
    td_err err;
    int64_t id;
    assert_int_equal(td_db_run_resolve(db, "2", &id, &err), TD_OK);
    assert_int_equal(id, b);
    assert_int_equal(td_db_run_resolve(db, "latest", &id, &err), TD_OK);
    assert_int_equal(id, c);
    assert_int_equal(td_db_run_resolve(db, "latest:bench", &id, &err), TD_OK);
    assert_int_equal(id, b);
    assert_int_equal(td_db_run_resolve(db, "latest:audit.*", &id, &err), TD_OK);
    assert_int_equal(id, c);
    assert_int_equal(td_db_run_resolve(db, "abcd1", &id, &err), TD_OK);
    assert_int_equal(id, a);
    assert_int_equal(td_db_run_resolve(db, "ABCD2222-0000-4000-8000-000000000002", &id, &err), TD_OK);
    assert_int_equal(id, b);
    assert_int_equal(td_db_run_resolve(db, "1234", &id, &err), TD_OK); /* not a run id: a uid prefix */
    assert_int_equal(id, c);
    assert_int_equal(td_db_run_resolve(db, "abcd", &id, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "ambiguous"));
    assert_int_equal(td_db_run_resolve(db, "99", &id, &err), TD_ERR_NOTFOUND);
    assert_int_equal(td_db_run_resolve(db, "ffff", &id, &err), TD_ERR_NOTFOUND);
    assert_int_equal(td_db_run_resolve(db, "x'; --", &id, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "x'; --"));
    assert_int_equal(td_db_run_resolve(db, "latest:nothing", &id, &err), TD_ERR_NOTFOUND);
    assert_int_equal(td_db_run_resolve(db, "", &id, &err), TD_ERR_ARG);
    td_db_close(db);
}

static void query_since_forms(void **state)
{
    (void)state;
    char out[32];
    td_err err;
    assert_int_equal(td_db_since_parse("2026-09-05", out, &err), TD_OK);
    assert_string_equal(out, "2026-09-05");
    assert_int_equal(td_db_since_parse("2026-09-05 12:30", out, &err), TD_OK);
    assert_string_equal(out, "2026-09-05T12:30");
    assert_int_equal(td_db_since_parse("2026-09-05T12:30:15", out, &err), TD_OK);
    assert_int_equal(td_db_since_parse("7d", out, &err), TD_OK);
    assert_int_equal(strlen(out), 24);
    assert_int_equal(td_db_since_parse("90m", out, &err), TD_OK);
    static const char *const bad[] = {"yesterday", "2026-9-5", "7x", "d", "2026-09-05T1", "99999999999w", ""};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        if (td_db_since_parse(bad[i], out, &err) != TD_ERR_ARG) fail_msg("'%s' accepted", bad[i]);
    }
}

static void query_runs_filters_and_order(void **state)
{
    (void)state;
    const char *p = td_test_path("list.db");
    add_run(p, "audit.layer", "2025-06-01T00:00:00.000Z", "aaaa1111");
    add_run(p, "audit.e4m3", "2025-07-01T00:00:00.000Z", "aaaa1111");
    add_run(p, "bench", NULL, "bbbb2222"); /* now */
    int64_t last = add_run(p, "audit.layer", NULL, "bbbb2222");
    raw_exec(p, "UPDATE runs SET status = 'failed' WHERE kind = 'bench';"
                "UPDATE runs SET checkpoint_fingerprint = 'f00d' || hex(randomblob(30)), "
                "checkpoint_path = '/models/tiny-next' WHERE id = 4;");
    td_db *db = open_ok(p, 0);
    cJSON *j = list(db, (td_db_runs_filter){0});
    assert_int_equal(cJSON_GetArraySize(j), 4);
    assert_int_equal(id_at(j, 0), last); /* newest first */
    assert_int_equal(id_at(j, 3), 1);
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "variants")));
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.kind = "audit.*"});
    assert_int_equal(cJSON_GetArraySize(j), 3);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.kind = "audit.layer", .limit = 1});
    assert_int_equal(cJSON_GetArraySize(j), 1);
    assert_int_equal(id_at(j, 0), last);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.status = "failed"});
    assert_int_equal(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.since = "2025-06-15"});
    assert_int_equal(cJSON_GetArraySize(j), 3);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.since = "1d"});
    assert_int_equal(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.commit = "aaaa"});
    assert_int_equal(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.checkpoint = "F00D"});
    assert_int_equal(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.checkpoint = "tiny-next"});
    assert_int_equal(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.host = "no-such-host"});
    assert_int_equal(cJSON_GetArraySize(j), 0);
    cJSON_Delete(j);
    /* by GPU: a name or a glob; runs that name none never match */
    raw_exec(p, "UPDATE runs SET gpu_name = 'NVIDIA H200' WHERE id = 3;"
                "UPDATE runs SET gpu_name = 'NVIDIA H100 80GB HBM3' WHERE id = 4;");
    j = list(db, (td_db_runs_filter){.gpu = "NVIDIA H200"});
    assert_int_equal(cJSON_GetArraySize(j), 1);
    assert_int_equal(id_at(j, 0), 3);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.gpu = "NVIDIA H*"});
    assert_int_equal(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    j = list(db, (td_db_runs_filter){.gpu = "*A100*"});
    assert_int_equal(cJSON_GetArraySize(j), 0);
    cJSON_Delete(j);
    td_err err;
    td_db_runs_filter bad = {.status = "done"};
    assert_int_equal(td_db_runs_list(db, &bad, &j, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "done"));
    bad = (td_db_runs_filter){.since = "last week"};
    assert_int_equal(td_db_runs_list(db, &bad, &j, &err), TD_ERR_ARG);
    td_db_close(db);
}

static td_db_layer_row lrow(const char *tap, int tokens, bool exact, double rel_l2, double max_abs)
{
    td_db_layer_row r = {.layer = 3, .rank = 0, .tokens = tokens, .tap = tap, .variant_a = "ref",
                         .variant_b = "cuda", .expectation = exact ? TD_DB_EXPECT_EXACT : TD_DB_EXPECT_BOUNDED,
                         .numel = 100, .exact = exact, .mismatches = exact ? 0 : 10, .max_abs = max_abs,
                         .rel_l2 = rel_l2, .max_ulp = exact ? 0 : 4, .nmse = rel_l2 * rel_l2, .cosine = 1.0,
                         .finite = true, .first_diff = exact ? -1 : 0, .verdict = TD_DB_PASS};
    return r;
}

static int64_t run_with(td_db *db, const td_db_layer_row *rows, size_t n)
{
    td_db_run_info info = {.kind = "audit.layer"};
    int64_t id;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &id, &err), TD_OK);
    if (td_db_put_layers(db, id, rows, n, &err) != TD_OK) fail_msg("%s", err.msg);
    assert_int_equal(td_db_run_end(db, id, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    return id;
}

static void query_compare_worst_first(void **state)
{
    (void)state;
    td_db *db = open_ok(td_test_path("cmp.db"), TD_DB_CREATE);
    td_db_layer_row a[] = {
        lrow("L3.moe.out", 1, true, 0, 0),           /* exact -> not exact: first */
        lrow("L3.attn.out", 1, false, 1e-7, 1e-6),   /* 10x worse: second */
        lrow("L3.gdn.out", 1, false, 1e-6, 1e-5),    /* 2x better: last of the matched */
        lrow("L3.resid", 1, false, 1e-7, 1e-6),      /* unchanged */
        lrow("L3.ple.out", 1, false, 1e-7, 1e-6),    /* only in A */
    };
    td_db_layer_row b[] = {
        lrow("L3.moe.out", 1, false, 1e-8, 1e-8),
        lrow("L3.attn.out", 1, false, 1e-6, 1e-5),
        lrow("L3.gdn.out", 1, false, 5e-7, 5e-6),
        lrow("L3.resid", 1, false, 1e-7, 1e-6),
        lrow("L3.hc_attn.mix", 1, true, 0, 0),       /* only in B */
    };
    b[0].expectation = TD_DB_EXPECT_EXACT;
    int64_t ra = run_with(db, a, 5), rb = run_with(db, b, 5);
    td_db_quality_row qa = {.suite = "gsm8k", .metric = "acc", .value = 0.9, .stderr_ = NAN, .n = -1, .threshold = NAN,
                            .higher_is_better = true};
    (void)qa;
    cJSON *j;
    td_err err;
    assert_int_equal(td_db_compare(db, ra, rb, 0, &j, &err), TD_OK);
    cJSON *s = cJSON_GetObjectItem(j, "summary");
    assert_int_equal(cJSON_GetObjectItem(s, "matched")->valuedouble, 4);
    assert_int_equal(cJSON_GetObjectItem(s, "only_a")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(s, "only_b")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(s, "exact_lost")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(s, "worse")->valuedouble, 2);
    assert_int_equal(cJSON_GetObjectItem(s, "better")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(s, "same")->valuedouble, 1);
    cJSON *rows = cJSON_GetObjectItem(j, "layer_cmp");
    assert_int_equal(cJSON_GetArraySize(rows), 6);
    static const char *const order[] = {"L3.moe.out", "L3.attn.out", "L3.resid", "L3.gdn.out"};
    for (int i = 0; i < 4; i++)
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, i), "tap")->valuestring, order[i]);
    cJSON *r1 = cJSON_GetArrayItem(rows, 1);
    double d = cJSON_GetObjectItem(cJSON_GetObjectItem(r1, "delta"), "rel_l2")->valuedouble;
    assert_true(fabs(d - 9e-7) < 1e-12);
    assert_true(fabs(cJSON_GetObjectItem(r1, "worse_log10")->valuedouble - 1.0) < 1e-9);
    /* one-sided rows come last and say which side has them */
    const char *only4 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 4), "only_in")->valuestring;
    const char *only5 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 5), "only_in")->valuestring;
    assert_true((!strcmp(only4, "a") && !strcmp(only5, "b")) || (!strcmp(only4, "b") && !strcmp(only5, "a")));
    cJSON_Delete(j);
    td_db_close(db);
}

static void query_show_and_info(void **state)
{
    (void)state;
    const char *p = td_test_path("show.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    td_db_layer_row rows[] = {lrow("L3.moe.out", 1, true, 0, 0), lrow("L3.attn.out", 4, false, 1e-3, 1e-2)};
    rows[1].verdict = TD_DB_FAIL;
    rows[1].finite = false;
    int64_t id = run_with(db, rows, 2);
    td_err err;
    assert_int_equal(td_db_baseline_set(db, "main", id, &err), TD_OK);
    cJSON *j;
    assert_int_equal(td_db_run_show(db, id, &j, &err), TD_OK);
    cJSON *res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(cJSON_GetObjectItem(res, "layer_cmp")->valuedouble, 2);
    assert_int_equal(cJSON_GetObjectItem(res, "quality")->valuedouble, 0);
    cJSON *ls = cJSON_GetObjectItem(j, "layer_summary");
    assert_int_equal(cJSON_GetObjectItem(ls, "pass")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(ls, "fail")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(ls, "exact")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(ls, "not_finite")->valuedouble, 1);
    cJSON *fails = cJSON_GetObjectItem(j, "failures");
    assert_int_equal(cJSON_GetArraySize(fails), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(fails, 0), "tap")->valuestring, "L3.attn.out");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "baselines"), 0)->valuestring, "main");
    assert_true(cJSON_IsObject(cJSON_GetObjectItem(j, "env")));
    assert_true(cJSON_GetObjectItem(j, "duration_s")->valuedouble >= 0);
    cJSON_Delete(j);
    assert_int_equal(td_db_run_show(db, 77, &j, &err), TD_ERR_NOTFOUND);
    assert_int_equal(td_db_info(db, true, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetObjectItem(j, "runs")->valuedouble, 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "rows"), "layer_cmp")->valuedouble, 2);
    assert_int_equal(cJSON_GetObjectItem(j, "baselines")->valuedouble, 1);
    cJSON_Delete(j);
    td_db_close(db);
}

/* completions of a run: every column, token ids as an array, the diverged filter */
static void query_completions(void **state)
{
    (void)state;
    const char *p = td_test_path("completions.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    td_db_run_info info = {.kind = "run"};
    int64_t run;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    static const int32_t a[3] = {7, 8, 9}, b[3] = {7, 8, 1};
    td_db_completion_row r0 = {.variant = "ref", .batch = 1, .request = "q", .length = 3, .hash = "h0",
                               .first_divergence = -1, .margin = NAN, .tokens = a, .reference_margin = NAN};
    td_db_completion_row r1 = {.variant = "ref:accum=fp64", .batch = 1, .request = "q", .length = 3, .hash = "h1",
                               .reference = "ref", .first_divergence = 2, .margin = 0.25, .tokens = b,
                               .reference_margin = 0.5};
    td_db_completion_row r2 = {.variant = "ref:accum=fp64", .batch = 4, .request = "q", .length = 3, .hash = "h0",
                               .reference = "ref", .first_divergence = -1, .margin = NAN, .tokens = NULL,
                               .reference_margin = NAN};
    assert_int_equal(td_db_put_completion(db, run, &r2, &err), TD_OK);
    assert_int_equal(td_db_put_completion(db, run, &r1, &err), TD_OK);
    assert_int_equal(td_db_put_completion(db, run, &r0, &err), TD_OK);
    assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    cJSON *j;
    assert_int_equal(td_db_completions(db, run, false, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 3);
    const cJSON *x = cJSON_GetArrayItem(j, 0); /* ordered by variant, batch */
    assert_string_equal(cJSON_GetObjectItem(x, "hash")->valuestring, "h0");
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(x, "token_ids")));
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(x, "token_ids"), 2)->valuedouble, 9);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(x, "first_divergence")));
    x = cJSON_GetArrayItem(j, 1);
    assert_string_equal(cJSON_GetObjectItem(x, "hash")->valuestring, "h1");
    assert_int_equal(cJSON_GetObjectItem(x, "first_divergence")->valuedouble, 2);
    assert_true(cJSON_GetObjectItem(x, "margin")->valuedouble == 0.25);
    assert_true(cJSON_GetObjectItem(x, "reference_margin")->valuedouble == 0.5);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(x, "token_ids"), 2)->valuedouble, 1);
    x = cJSON_GetArrayItem(j, 2);
    assert_int_equal(cJSON_GetObjectItem(x, "batch")->valuedouble, 4);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(x, "token_ids")));
    cJSON_Delete(j);
    assert_int_equal(td_db_completions(db, run, true, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "hash")->valuestring, "h1");
    cJSON_Delete(j);
    /* a run without completions gives an empty array */
    assert_int_equal(td_db_completions(db, run + 1, false, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 0);
    cJSON_Delete(j);
    td_db_close(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(query_run_references_resolve),
        cmocka_unit_test(query_since_forms),
        cmocka_unit_test(query_runs_filters_and_order),
        cmocka_unit_test(query_compare_worst_first),
        cmocka_unit_test(query_show_and_info),
        cmocka_unit_test(query_completions),
    };
    return cmocka_run_group_tests_name("db_query", tests, NULL, NULL);
}
