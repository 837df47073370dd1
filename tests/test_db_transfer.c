/* test_db_transfer.c — export (JSON, CSV), import and merge between stores (db/transfer.c). */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>

/* A finished run with `n` layer rows and one row of every other family. */
static int64_t add_run(td_db *db, const char *kind, int n, bool finish)
{
    td_db_run_info info = {.kind = kind};
    int64_t run;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    for (int i = 0; i < n; i++) {
        char tap[32];
        snprintf(tap, sizeof tap, "L%d.moe.out", i);
        td_db_layer_row r = {.layer = i, .rank = 0, .tokens = 8, .tap = tap, .variant_a = "ref",
                             .variant_b = "cuda:moe_dispatch=grouped,graphs=on", .expectation = TD_DB_EXPECT_BOUNDED,
                             .dtype = "bf16", .numel = 2560, .exact = false, .mismatches = i, .max_abs = 0.1 / 3 * i,
                             .rel_l2 = 1e-3 / 7, .max_ulp = 2, .nmse = NAN, .cosine = 0.9999999,
                             .finite = true, .first_diff = -1, .verdict = TD_DB_PASS};
        assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    }
    td_db_encoding_row e = {.check_name = "expand", .elements = 256, .mismatches = 0, .nan_mismatches = -1,
                            .first_diff = -1, .exact = true, .verdict = TD_DB_PASS, .detail = "a \"quoted\", note\n"};
    td_db_census_row c = {.tensor = "w2.scale", .code = 64, .count = 1000};
    td_db_completion_row cp = {.variant = "cuda", .batch = 1, .request = "r0", .length = 3, .hash = "ff",
                               .first_divergence = -1, .margin = NAN};
    td_db_quality_row q = {.suite = "gsm8k", .metric = "acc", .value = 0.9375, .stderr_ = 0.06, .n = 16,
                           .threshold = 0.8, .higher_is_better = true};
    td_db_timing_row t = {.bench = "moe", .metric = "median", .value = 1.25, .unit = "ms", .n = 5, .stddev = NAN};
    assert_int_equal(td_db_put_encoding(db, run, &e, &err), TD_OK);
    assert_int_equal(td_db_put_census(db, run, &c, &err), TD_OK);
    assert_int_equal(td_db_put_completion(db, run, &cp, &err), TD_OK);
    assert_int_equal(td_db_put_quality(db, run, &q, &err), TD_OK);
    assert_int_equal(td_db_put_timing(db, run, &t, &err), TD_OK);
    assert_int_equal(td_db_batch_commit(db, &err), TD_OK);
    if (finish) assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    return run;
}

static char *export_json(td_db *db, int64_t *runs, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    td_err err;
    if (td_db_export_json(db, runs, n, f, &err) != TD_OK) fail_msg("export: %s", err.msg);
    fclose(f);
    return buf;
}

/* The export of a run with the volatile parts (export time, origin) removed. */
static char *canonical_run(td_db *db, int64_t run)
{
    char *txt = export_json(db, &run, 1);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "runs"), 0);
    cJSON_DeleteItemFromObject(r, "origin");
    char *out = cJSON_PrintUnformatted(r);
    cJSON_Delete(j);
    return out;
}

static void transfer_export_import_round_trip(void **state)
{
    (void)state;
    td_err err;
    td_db *a = open_ok(td_test_path("a.db"), TD_DB_CREATE);
    int64_t r1 = add_run(a, "audit.layer", 5, true), r2 = add_run(a, "bench", 0, true);
    int64_t runs[2] = {r1, r2};
    char *txt = export_json(a, runs, 2);
    const char *file = td_test_path("export.json");
    td_test_write_str(file, txt);
    cJSON *j = cJSON_Parse(txt);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "format")->valuestring, "tandem-results");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "runs")), 2);
    cJSON_Delete(j);
    free(txt);

    td_db *b = open_ok(td_test_path("b.db"), TD_DB_CREATE);
    td_db_transfer_stats st;
    assert_int_equal(td_db_import_json(b, file, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 2);
    assert_int_equal(st.rows_added, 5 + 5 + 5);
    /* same content, same uid, origin says where it came from */
    char uid[TD_DB_UID_LEN + 1];
    assert_int_equal(td_db_run_uid(a, r1, uid, &err), TD_OK);
    int64_t b1;
    assert_int_equal(td_db_run_resolve(b, uid, &b1, &err), TD_OK);
    char *ca = canonical_run(a, r1), *cb = canonical_run(b, b1);
    assert_string_equal(ca, cb);
    free(ca);
    free(cb);
    cJSON *show;
    assert_int_equal(td_db_run_show(b, b1, &show, &err), TD_OK);
    assert_string_equal(cJSON_GetObjectItem(show, "origin")->valuestring, "import:export.json");
    cJSON_Delete(show);
    /* importing again changes nothing */
    assert_int_equal(td_db_import_json(b, file, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 0);
    assert_int_equal(st.runs_present, 2);
    td_db_close(a);
    td_db_close(b);
    assert_int_equal(raw_int(td_test_path("b.db"), "SELECT count(*) FROM runs"), 2);
}

static void transfer_import_rejects_bad_files_atomically(void **state)
{
    (void)state;
    td_err err;
    char p[768]; /* td_test_path() buffers rotate: keep a copy */
    snprintf(p, sizeof p, "%s", td_test_path("imp.db"));
    td_db *db = open_ok(p, TD_DB_CREATE);
    static const char good_run[] =
        "{\"uid\": \"11111111-2222-4333-8444-555555555555\", \"kind\": \"bench\", \"status\": \"ok\", "
        "\"started_at\": \"2026-01-01T00:00:00.000Z\", \"results\": {}}";
    struct { const char *body; td_status code; const char *needle; } cases[] = {
        {"not json", TD_ERR_FORMAT, "syntax"},
        {"{\"format\": \"other\", \"format_version\": 1, \"runs\": []}", TD_ERR_FORMAT, "not a tandem results export"},
        {"{\"format\": \"tandem-results\", \"format_version\": 9, \"runs\": []}", TD_ERR_UNSUPPORTED, "version 9"},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": {}}", TD_ERR_FORMAT, "\"runs\""},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [%s, {\"kind\": \"bench\", "
         "\"status\": \"ok\", \"started_at\": \"x\", \"colour\": 1}]}", TD_ERR_FORMAT, "runs[1]: unknown run field \"colour\""},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [%s, {\"kind\": \"bench\", "
         "\"status\": \"ok\", \"started_at\": \"x\", \"results\": {\"layer_cmp\": [{\"tap\": \"t\", \"rank\": 0, "
         "\"tokens\": 1, \"variant_a\": \"a\", \"variant_b\": \"b\", \"layer\": 0, \"exact\": 1, \"finite\": 1, "
         "\"verdict\": \"pass\"}]}}]}", TD_ERR_FORMAT, "layer_cmp[0]: missing \"expectation\""},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [{\"kind\": \"bench\", "
         "\"status\": \"ok\", \"started_at\": \"x\", \"pid\": \"twelve\"}]}", TD_ERR_FORMAT, "\"pid\" must be an integer"},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [{\"kind\": \"bench\", "
         "\"status\": \"weird\", \"started_at\": \"x\"}]}", TD_ERR_ARG, "CHECK constraint"},
        {"{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [{\"kind\": \"bench\", "
         "\"status\": \"ok\", \"started_at\": \"x\", \"results\": {\"secrets\": []}}]}", TD_ERR_FORMAT, "unknown result table"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        char body[2048];
        snprintf(body, sizeof body, cases[i].body, good_run);
        const char *f = td_test_path("bad.json");
        td_test_write_str(f, body);
        td_db_transfer_stats st;
        td_status s = td_db_import_json(db, f, &st, &err);
        if (s != cases[i].code || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, "bad.json"))
            fail_msg("case %zu: %d '%s'", i, s, err.msg);
        assert_int_equal(st.runs_added, 0);
    }
    td_db_close(db);
    /* the good first run of a bad file was not kept */
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs"), 0);
}

static void transfer_import_without_uid_is_idempotent(void **state)
{
    (void)state;
    td_err err;
    td_db *db = open_ok(td_test_path("nouid.db"), TD_DB_CREATE);
    const char *f = td_test_path("hand.json");
    td_test_write_str(f, "{\"format\": \"tandem-results\", \"format_version\": 1, \"runs\": [{\"kind\": \"quality.tasks\", "
                         "\"status\": \"ok\", \"started_at\": \"2026-02-02T00:00:00.000Z\", \"host\": \"gpu-7\", "
                         "\"results\": {\"quality\": [{\"suite\": \"humaneval\", \"metric\": \"pass@1\", "
                         "\"value\": 0.61, \"higher_is_better\": true, \"threshold\": 0.6}]}}, "
                         "{\"kind\": \"run\", \"status\": \"running\", \"started_at\": \"2026-02-02T00:00:00.000Z\"}]}");
    td_db_transfer_stats st;
    assert_int_equal(td_db_import_json(db, f, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 1);
    assert_int_equal(st.runs_running, 1);
    assert_int_equal(td_db_import_json(db, f, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 0);
    assert_int_equal(st.runs_present, 1);
    cJSON *j;
    td_db_runs_filter fl = {0};
    assert_int_equal(td_db_runs_list(db, &fl, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "host")->valuestring, "gpu-7");
    cJSON_Delete(j);
    td_db_close(db);
}

static void transfer_merge_is_idempotent_and_leaves_source_alone(void **state)
{
    (void)state;
    td_err err;
    char pa[768], pb[768];
    snprintf(pa, sizeof pa, "%s", td_test_path("ma.db"));
    snprintf(pb, sizeof pb, "%s", td_test_path("mb.db"));
    td_db *a = open_ok(pa, TD_DB_CREATE);
    int64_t a1 = add_run(a, "audit.layer", 4, true);
    add_run(a, "bench", 1, true);
    assert_int_equal(td_db_baseline_set(a, "main", a1, &err), TD_OK);
    td_db_close(a);
    td_db *b = open_ok(pb, TD_DB_CREATE);
    int64_t b1 = add_run(b, "audit.layer", 3, true);
    add_run(b, "run", 2, false); /* still running in b */
    assert_int_equal(td_db_baseline_set(b, "main", b1, &err), TD_OK);     /* name taken in a */
    assert_int_equal(td_db_baseline_set(b, "gpu-box", b1, &err), TD_OK);  /* new name */
    td_db_close(b);

    /* the source is never written: its bytes stay the same */
    size_t blen;
    char *bbytes = td_test_slurp(pb, &blen);
    a = open_ok(pa, 0);
    td_db_transfer_stats st;
    assert_int_equal(td_db_merge(a, pb, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 1);
    assert_int_equal(st.runs_running, 1);
    assert_int_equal(st.rows_added, 3 + 5);
    assert_int_equal(st.baselines_added, 1);
    assert_int_equal(st.baselines_conflicting, 1);
    assert_int_equal(td_db_merge(a, pb, &st, &err), TD_OK); /* again: nothing new */
    assert_int_equal(st.runs_added, 0);
    assert_int_equal(st.runs_present, 1);
    assert_int_equal(st.rows_added, 0);
    assert_int_equal(td_db_merge(a, pa, &st, &err), TD_ERR_ARG); /* itself */
    td_db_close(a);
    size_t blen2;
    char *bbytes2 = td_test_slurp(pb, &blen2);
    assert_int_equal(blen, blen2);
    assert_memory_equal(bbytes, bbytes2, blen);
    free(bbytes);
    free(bbytes2);
    assert_int_equal(raw_int(pa, "SELECT count(*) FROM runs"), 3);
    assert_int_equal(raw_int(pa, "SELECT count(*) FROM layer_cmp"), 4 + 1 + 3);
    assert_int_equal(raw_int(pa, "SELECT count(*) FROM runs WHERE origin LIKE 'merge:%'"), 1);
    assert_int_equal(raw_int(pa, "SELECT count(*) FROM baselines"), 2);
    /* results hang off the right runs after the id remapping */
    assert_int_equal(raw_int(pa, "SELECT count(*) FROM layer_cmp c JOIN runs r ON r.id = c.run_id "
                                 "WHERE r.origin LIKE 'merge:%'"), 3);
    /* the other direction gives the same set of runs */
    b = open_ok(pb, 0);
    assert_int_equal(td_db_merge(b, pa, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 2);
    td_db_close(b);
    assert_int_equal(raw_int(pb, "SELECT count(*) FROM runs WHERE status <> 'running'"), 3);
}

static void transfer_merge_refuses_bad_sources(void **state)
{
    (void)state;
    td_err err;
    const char *pa = td_test_path("mr.db");
    td_db *a = open_ok(pa, TD_DB_CREATE);
    const char *foreign = td_test_path("foreign.sqlite");
    assert_int_equal(td_db_raw_exec(foreign, "CREATE TABLE runs (id INTEGER PRIMARY KEY, uid TEXT);", &err), TD_OK);
    td_db_transfer_stats st;
    assert_int_equal(td_db_merge(a, foreign, &st, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "merge source"));
    assert_non_null(strstr(err.msg, "not a tandem results store"));
    assert_int_equal(td_db_merge(a, td_test_path("absent.db"), &st, &err), TD_ERR_NOTFOUND);
    const char *old = td_test_path("old.db");
    assert_int_equal(td_db_schema_create(old, 1, &err), TD_OK);
    assert_int_equal(td_db_merge(a, old, &st, &err), TD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "needs migrating"));
    /* a path with URI-special characters still names the right file */
    const char *odd = td_test_path("odd name?#%.db");
    td_db *o = open_ok(odd, TD_DB_CREATE);
    add_run(o, "bench", 1, true);
    td_db_close(o);
    assert_int_equal(td_db_merge(a, odd, &st, &err), TD_OK);
    assert_int_equal(st.runs_added, 1);
    td_db_close(a);
}

static void transfer_csv_quotes_and_selects_tables(void **state)
{
    (void)state;
    td_err err;
    td_db *db = open_ok(td_test_path("csv.db"), TD_DB_CREATE);
    int64_t r = add_run(db, "audit.e4m3", 2, true);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(td_db_export_csv(db, &r, 1, NULL, f, &err), TD_OK);
    fclose(f);
    assert_true(!strncmp(buf, "run_uid,tap,rank,tokens,variant_a,variant_b,layer,", 50));
    assert_non_null(strstr(buf, ",\"cuda:moe_dispatch=grouped,graphs=on\","));
    int lines = 0;
    for (char *c = buf; *c; c++) lines += *c == '\n';
    assert_int_equal(lines, 3);
    free(buf);
    f = open_memstream(&buf, &len);
    assert_int_equal(td_db_export_csv(db, &r, 1, "encoding_checks", f, &err), TD_OK);
    fclose(f);
    assert_non_null(strstr(buf, "\"a \"\"quoted\"\", note\n\""));
    free(buf);
    f = open_memstream(&buf, &len);
    assert_int_equal(td_db_export_csv(db, &r, 1, "nope", f, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "layer_cmp"));
    fclose(f);
    free(buf);
    td_db_close(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(transfer_export_import_round_trip),
        cmocka_unit_test(transfer_import_rejects_bad_files_atomically),
        cmocka_unit_test(transfer_import_without_uid_is_idempotent),
        cmocka_unit_test(transfer_merge_is_idempotent_and_leaves_source_alone),
        cmocka_unit_test(transfer_merge_refuses_bad_sources),
        cmocka_unit_test(transfer_csv_quotes_and_selects_tables),
    };
    return cmocka_run_group_tests_name("db_transfer", tests, NULL, NULL);
}
