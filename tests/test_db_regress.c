/* test_db_regress.c — baselines, thresholds, regression rules (also through `tandem db
 * regress` and its exit status) and trends with change detection (db/regress.c). */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>

/* ---- a synthetic audit: 3 layers x 2 taps x 2 token counts, plus the other families ------ */

typedef struct audit {
    double rel_l2_scale;  /* multiplies every bounded error */
    bool lose_exact;      /* L0.moe.out t1 stops being exact */
    bool lose_finite;     /* L1.attn.out t4 has non-finite values */
    bool diverge;         /* completion req-1 diverges from its reference */
    double quality;       /* gsm8k acc (gate 0.8) */
    double timing_ms;
    bool drop_last;       /* L2 rows missing */
    td_db_run_status end;
} audit;

static const audit NORMAL = {1.0, false, false, false, 0.9, 5.0, false, TD_DB_RUN_OK};

static int64_t write_audit(td_db *db, const audit *a)
{
    td_db_run_info info = {.kind = "audit.layer"};
    int64_t run;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    static const char *const taps[2] = {"moe.out", "attn.out"};
    for (int layer = 0; layer < 3; layer++) {
        if (a->drop_last && layer == 2) continue;
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < 2; k++) {
                char tap[32];
                snprintf(tap, sizeof tap, "L%d.%s", layer, taps[t]);
                int tokens = k ? 4 : 1;
                bool exact = t == 0 && k == 0 && !(a->lose_exact && layer == 0);
                double rel = exact ? 0 : 2e-7 * a->rel_l2_scale * (layer + 1);
                bool finite = !(a->lose_finite && layer == 1 && t == 1 && k == 1);
                td_db_layer_row r = {
                    .layer = layer, .rank = 0, .tokens = tokens, .tap = tap, .variant_a = "ref",
                    .variant_b = "cuda", .expectation = (t == 0 && k == 0) ? TD_DB_EXPECT_EXACT : TD_DB_EXPECT_BOUNDED,
                    .dtype = "f32", .numel = 2560, .exact = exact, .mismatches = exact ? 0 : 100,
                    .max_abs = finite ? rel * 10 : (double)INFINITY, .rel_l2 = finite ? rel : (double)NAN, .max_ulp = exact ? 0 : 3,
                    .nmse = rel * rel, .cosine = 1.0 - rel * rel / 2, .finite = finite,
                    .first_diff = exact ? -1 : 7,
                    .verdict = (exact || !(t == 0 && k == 0)) && finite ? TD_DB_PASS : TD_DB_FAIL};
                assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
            }
    }
    td_db_encoding_row e = {.check_name = "expand", .stage = "w2", .variant = "fast", .elements = 256,
                            .mismatches = 0, .nan_mismatches = 0, .first_diff = -1, .exact = true, .verdict = TD_DB_PASS};
    assert_int_equal(td_db_put_encoding(db, run, &e, &err), TD_OK);
    td_db_completion_row c = {.variant = "cuda", .batch = 4, .request = "req-1", .length = 64, .hash = "h1",
                              .reference = "ref", .first_divergence = a->diverge ? 12 : -1,
                              .margin = a->diverge ? 0.1 : (double)NAN};
    assert_int_equal(td_db_put_completion(db, run, &c, &err), TD_OK);
    td_db_quality_row q = {.suite = "gsm8k", .metric = "acc", .value = a->quality, .stderr_ = 0.05, .n = 16,
                           .threshold = 0.8, .higher_is_better = true};
    assert_int_equal(td_db_put_quality(db, run, &q, &err), TD_OK);
    td_db_timing_row t = {.bench = "moe.w13", .shape = "M16", .metric = "median", .value = a->timing_ms,
                          .unit = "ms", .n = 5, .stddev = 0.01};
    assert_int_equal(td_db_put_timing(db, run, &t, &err), TD_OK);
    assert_int_equal(td_db_batch_commit(db, &err), TD_OK);
    assert_int_equal(td_db_run_end(db, run, a->end, a->end == TD_DB_RUN_OK ? 0 : 2, NULL, &err), TD_OK);
    return run;
}

static cJSON *regress(td_db *db, int64_t base, int64_t run, const td_db_thresholds *th, bool all, int64_t *n)
{
    td_db_regress_opts o = {.baseline_run = base, .run = run, .thresholds = th, .require_all = all};
    cJSON *j;
    td_err err;
    if (td_db_regress(db, &o, &j, n, &err) != TD_OK) fail_msg("regress: %s", err.msg);
    return j;
}

/* True when some finding of `table` has a reason containing `needle`. */
static bool has_reason(const cJSON *res, const char *table, const char *needle)
{
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(res, "regressions")) {
        if (strcmp(cJSON_GetObjectItem(f, "table")->valuestring, table)) continue;
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(f, "reasons"))
            if (strstr(r->valuestring, needle)) return true;
    }
    return false;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void regress_threshold_parsing(void **state)
{
    (void)state;
    td_db_thresholds t;
    td_db_thresholds_default(&t);
    assert_true(t.m[TD_DB_M_REL_L2].gated);
    assert_false(t.m[TD_DB_M_TIMING].gated);
    assert_false(t.m[TD_DB_M_MISMATCHES].gated);
    td_err err;
    assert_int_equal(td_db_threshold_parse(&t, "rel_l2=rel:0.1,abs:1e-8", &err), TD_OK);
    assert_true(t.m[TD_DB_M_REL_L2].rel == 0.1 && t.m[TD_DB_M_REL_L2].abs == 1e-8);
    assert_int_equal(td_db_threshold_parse(&t, "max_abs=50%", &err), TD_OK);
    assert_true(t.m[TD_DB_M_MAX_ABS].rel == 0.5 && t.m[TD_DB_M_MAX_ABS].abs == 1e-6); /* abs kept */
    assert_int_equal(td_db_threshold_parse(&t, "timing=0.02", &err), TD_OK);
    assert_true(t.m[TD_DB_M_TIMING].gated && t.m[TD_DB_M_TIMING].rel == 0.02);
    assert_int_equal(td_db_threshold_parse(&t, "nmse=off", &err), TD_OK);
    assert_false(t.m[TD_DB_M_NMSE].gated);
    static const char *const bad[] = {"rel_l2", "bogus=0.1", "rel_l2=", "rel_l2=rel:", "rel_l2=-1",
                                      "rel_l2=abs:x", "rel_l2=rel:0.1,,", "max_abs=nan"};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++)
        if (td_db_threshold_parse(&t, bad[i], &err) != TD_ERR_ARG) fail_msg("'%s' accepted", bad[i]);
    assert_int_equal(td_db_threshold_parse(&t, "bogus=0.1", &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "unknown metric"));
}

static void regress_identical_rerun_is_clean(void **state)
{
    (void)state;
    td_db *db = open_ok(td_test_path("same.db"), TD_DB_CREATE);
    int64_t base = write_audit(db, &NORMAL), again = write_audit(db, &NORMAL);
    int64_t n;
    cJSON *j = regress(db, base, again, NULL, true, &n);
    assert_int_equal(n, 0);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(j, "regressed")));
    assert_int_equal(cJSON_GetObjectItem(j, "compared")->valuedouble, 12 + 1 + 1 + 1);
    assert_int_equal(cJSON_GetObjectItem(j, "missing")->valuedouble, 0);
    cJSON_Delete(j);
    /* small growth within the thresholds is not a regression */
    audit a = NORMAL;
    a.rel_l2_scale = 1.1;
    int64_t r = write_audit(db, &a);
    j = regress(db, base, r, NULL, false, &n);
    assert_int_equal(n, 0);
    cJSON_Delete(j);
    td_db_close(db);
}

static void regress_each_rule_fires(void **state)
{
    (void)state;
    td_db *db = open_ok(td_test_path("rules.db"), TD_DB_CREATE);
    int64_t base = write_audit(db, &NORMAL), n;
    struct {
        audit a;
        const char *table, *needle;
    } cases[] = {
        {{1.0, true, false, false, 0.9, 5.0, false, TD_DB_RUN_OK}, "layer_cmp", "exact expectation held"},
        {{1.0, false, true, false, 0.9, 5.0, false, TD_DB_RUN_OK}, "layer_cmp", "non-finite"},
        {{3.0, false, false, false, 0.9, 5.0, false, TD_DB_RUN_OK}, "layer_cmp", "rel_l2"},
        {{1.0, false, false, true, 0.9, 5.0, false, TD_DB_RUN_OK}, "completions", "now diverges at token 12"},
        {{1.0, false, false, false, 0.7, 5.0, false, TD_DB_RUN_OK}, "quality", "fails its gate"},
        {{1.0, false, false, false, 0.9, 5.0, false, TD_DB_RUN_FAILED}, "runs", "ended 'failed'"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        int64_t r = write_audit(db, &cases[i].a);
        cJSON *j = regress(db, base, r, NULL, false, &n);
        if (n < 1 || !has_reason(j, cases[i].table, cases[i].needle)) {
            char *t = cJSON_Print(j);
            fail_msg("case %zu: %lld regressions: %s", i, (long long)n, t);
        }
        cJSON_Delete(j);
    }
    /* the lost exact row also shows its verdict flip and metric growth on one finding */
    audit lx = NORMAL;
    lx.lose_exact = true;
    int64_t r = write_audit(db, &lx);
    cJSON *j = regress(db, base, r, NULL, false, &n);
    assert_true(has_reason(j, "layer_cmp", "verdict pass -> fail"));
    assert_true(has_reason(j, "layer_cmp", "first difference at 7"));
    cJSON_Delete(j);
    /* growth under a loosened threshold passes; under a tightened one it fails */
    audit g = NORMAL;
    g.rel_l2_scale = 1.2;
    r = write_audit(db, &g);
    td_db_thresholds th;
    td_db_thresholds_default(&th);
    td_err err;
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 0);
    cJSON_Delete(j);
    assert_int_equal(td_db_threshold_parse(&th, "rel_l2=rel:0.1,abs:0", &err), TD_OK);
    j = regress(db, base, r, &th, false, &n);
    assert_true(n > 0);
    assert_true(has_reason(j, "layer_cmp", "rel_l2"));
    cJSON_Delete(j);
    /* timings are checked only when asked, in the metric's direction */
    audit slow = NORMAL;
    slow.timing_ms = 6.0;
    r = write_audit(db, &slow);
    td_db_thresholds_default(&th);
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 0);
    cJSON_Delete(j);
    assert_int_equal(td_db_threshold_parse(&th, "timing=5%", &err), TD_OK);
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 1);
    assert_true(has_reason(j, "timings", "lower is better"));
    cJSON_Delete(j);
    /* gated timings of two GPUs are not compared: the other GPU is the finding; one run
     * naming no GPU, or both the same, compares them as before */
    td_db_device h200 = {.gpu_name = "NVIDIA H200"}, h100 = {.gpu_name = "NVIDIA H100 80GB HBM3"};
    assert_int_equal(td_db_run_set_device(db, base, &h200, &err), TD_OK);
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 1);
    assert_true(has_reason(j, "timings", "lower is better"));
    cJSON_Delete(j);
    assert_int_equal(td_db_run_set_device(db, r, &h100, &err), TD_OK);
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 1);
    assert_true(has_reason(j, "runs", "baseline ran on 'NVIDIA H200' and the run on 'NVIDIA H100 80GB HBM3'"));
    assert_false(has_reason(j, "timings", "lower is better"));
    cJSON_Delete(j);
    td_db_thresholds_default(&th); /* not gated: the GPUs do not matter */
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 0);
    cJSON_Delete(j);
    assert_int_equal(td_db_threshold_parse(&th, "timing=5%", &err), TD_OK);
    assert_int_equal(td_db_run_set_device(db, r, &h200, &err), TD_OK);
    j = regress(db, base, r, &th, false, &n);
    assert_int_equal(n, 1);
    assert_true(has_reason(j, "timings", "lower is better"));
    cJSON_Delete(j);
    /* missing results count, and regress only with require_all */
    audit part = NORMAL;
    part.drop_last = true;
    r = write_audit(db, &part);
    j = regress(db, base, r, NULL, false, &n);
    assert_int_equal(n, 0);
    assert_int_equal(cJSON_GetObjectItem(j, "missing")->valuedouble, 4);
    cJSON_Delete(j);
    j = regress(db, base, r, NULL, true, &n);
    assert_int_equal(n, 4);
    assert_true(has_reason(j, "layer_cmp", "missing"));
    cJSON_Delete(j);
    /* a still-running candidate cannot be judged */
    td_db_run_info info = {.kind = "audit.layer"};
    int64_t running;
    assert_int_equal(td_db_run_begin(db, &info, &running, &err), TD_OK);
    td_db_regress_opts o = {.baseline_run = base, .run = running};
    assert_int_equal(td_db_regress(db, &o, &j, &n, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "still running"));
    td_db_close(db);
}

static void regress_baselines_set_move_list_remove(void **state)
{
    (void)state;
    td_db *db = open_ok(td_test_path("bl.db"), TD_DB_CREATE);
    int64_t a = write_audit(db, &NORMAL), b = write_audit(db, &NORMAL), id;
    td_err err;
    assert_int_equal(td_db_baseline_set(db, "main", a, &err), TD_OK);
    assert_int_equal(td_db_baseline_get(db, "main", &id, &err), TD_OK);
    assert_int_equal(id, a);
    assert_int_equal(td_db_baseline_set(db, "main", b, &err), TD_OK);
    assert_int_equal(td_db_baseline_get(db, "main", &id, &err), TD_OK);
    assert_int_equal(id, b);
    assert_int_equal(td_db_baseline_set(db, "nightly.v2", a, &err), TD_OK);
    cJSON *j;
    assert_int_equal(td_db_baseline_list(db, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(j), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "name")->valuestring, "main");
    cJSON_Delete(j);
    assert_int_equal(td_db_baseline_set(db, "bad name", a, &err), TD_ERR_ARG);
    assert_int_equal(td_db_baseline_set(db, "x'--", a, &err), TD_ERR_ARG);
    assert_int_equal(td_db_baseline_set(db, "ghost", 999, &err), TD_ERR_NOTFOUND);
    assert_int_equal(td_db_baseline_remove(db, "main", &err), TD_OK);
    assert_int_equal(td_db_baseline_get(db, "main", &id, &err), TD_ERR_NOTFOUND);
    assert_non_null(strstr(err.msg, "main"));
    assert_int_equal(td_db_baseline_remove(db, "main", &err), TD_ERR_NOTFOUND);
    td_db_close(db);
}

/* The CI contract, end to end: exit 0 on an identical rerun, 1 on an injected regression. */
static void regress_cli_exit_status(void **state)
{
    (void)state;
    const char *tandem = getenv("TD_TANDEM");
    if (!tandem) skip();
    const char *p = td_test_path("ci.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t base = write_audit(db, &NORMAL), same = write_audit(db, &NORMAL);
    audit bad = NORMAL;
    bad.lose_exact = true;
    int64_t worse = write_audit(db, &bad);
    td_db_close(db);
    const char *out = td_test_path("ci.out");
    assert_int_equal(td_test_sh("%s db --db %s baseline set main %lld >%s 2>&1", tandem, p, (long long)base, out), 0);
    assert_int_equal(td_test_sh("%s db --db %s regress --baseline main --run %lld >%s 2>&1", tandem, p,
                                (long long)same, out), 0);
    char *txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "OK: no regressions"));
    free(txt);
    assert_int_equal(td_test_sh("%s db --db %s regress --baseline main --run %lld >%s 2>&1", tandem, p,
                                (long long)worse, out), 1);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "REGRESSED"));
    assert_non_null(strstr(txt, "L0.moe.out r0 t1 ref>cuda"));
    free(txt);
    assert_int_equal(td_test_sh("%s db --db %s regress --baseline main --run latest --json >%s 2>&1", tandem, p, out), 1);
    txt = td_test_slurp(out, NULL);
    cJSON *j = cJSON_Parse(txt);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "regressed")));
    cJSON_Delete(j);
    free(txt);
    /* usage errors are 2, not 1 */
    assert_int_equal(td_test_sh("%s db --db %s regress --baseline nope --run %lld >%s 2>&1", tandem, p,
                                (long long)same, out), 2);
    assert_int_equal(td_test_sh("%s db --db %s regress --baseline main --run %lld --threshold rel_l2=lots >%s 2>&1",
                                tandem, p, (long long)same, out), 2);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "lots"));
    free(txt);
}

/* ---- trends ------------------------------------------------------------------------------- */

/* One finished run whose single layer row has rel_l2 = v, on commit `commit`. */
static void trend_point(const char *path, double v, const char *commit, const char *tap, int seq)
{
    td_db *db = open_ok(path, TD_DB_CREATE);
    td_db_run_info info = {.kind = "audit.layer"};
    int64_t run;
    td_err err;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    td_db_layer_row r = {.layer = 5, .rank = 0, .tokens = 16, .tap = tap, .variant_a = "ref", .variant_b = "cuda",
                         .expectation = TD_DB_EXPECT_BOUNDED, .numel = 10, .mismatches = 1, .max_abs = v,
                         .rel_l2 = v, .max_ulp = 1, .nmse = v * v, .cosine = 1, .finite = true, .first_diff = 0};
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    r.tap = "L9.other";
    r.layer = 9;
    r.rel_l2 = 1.0; /* filtered out below */
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err), TD_OK);
    td_db_close(db);
    char sql[200];
    snprintf(sql, sizeof sql, "UPDATE runs SET git_commit = '%s', started_at = '2026-03-%02dT00:00:00.000Z' "
                              "WHERE id = %lld", commit, seq + 1, (long long)run);
    raw_exec(path, sql);
}

static cJSON *trend(const char *path, td_db_trend_opts o)
{
    td_db *db = open_ok(path, 0);
    cJSON *j;
    td_err err;
    if (td_db_trend(db, &o, &j, &err) != TD_OK) fail_msg("trend: %s", err.msg);
    td_db_close(db);
    return j;
}

static void trend_detects_a_step_not_noise(void **state)
{
    (void)state;
    const char *p = td_test_path("trend.db");
    /* deterministic error for 4 runs, then a jump at run 5 that stays */
    static const double vals[] = {1e-6, 1e-6, 1e-6, 1e-6, 4e-6, 4e-6, 4e-6};
    static const char *const commits[] = {"c1", "c1", "c2", "c2", "c3", "c3", "c4"};
    for (int i = 0; i < 7; i++) trend_point(p, vals[i], commits[i], "L5.moe.out", i);
    const char *w[] = {"tap=L5.*", "layer=5"};
    cJSON *j = trend(p, (td_db_trend_opts){.metric = "rel_l2", .where = w, .n_where = 2});
    cJSON *pts = cJSON_GetObjectItem(j, "points");
    assert_int_equal(cJSON_GetArraySize(pts), 7);
    assert_int_equal(cJSON_GetObjectItem(j, "n_steps")->valuedouble, 1);
    for (int i = 0; i < 7; i++) {
        cJSON *pt = cJSON_GetArrayItem(pts, i);
        assert_true(cJSON_GetObjectItem(pt, "value")->valuedouble == vals[i]);
        cJSON *st = cJSON_GetObjectItem(pt, "step");
        assert_int_equal(cJSON_IsTrue(st), i == 4);
    }
    cJSON *step = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "steps"), 0);
    assert_string_equal(cJSON_GetObjectItem(step, "commit")->valuestring, "c3");
    assert_true(cJSON_GetObjectItem(step, "from")->valuedouble == 1e-6);
    cJSON_Delete(j);
    /* by commit: 4 points, the step at c3 */
    j = trend(p, (td_db_trend_opts){.metric = "layer.rel_l2", .where = w, .n_where = 1, .by_commit = true, .min_history = 1});
    pts = cJSON_GetObjectItem(j, "points");
    assert_int_equal(cJSON_GetArraySize(pts), 4);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(pts, 0), "runs")->valuedouble, 2);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(pts, 2), "step")));
    cJSON_Delete(j);
    /* without the filter the max is the unfiltered row */
    j = trend(p, (td_db_trend_opts){.metric = "rel_l2"});
    assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "points"), 0), "value")->valuedouble == 1.0);
    cJSON_Delete(j);
    j = trend(p, (td_db_trend_opts){.metric = "rel_l2", .agg = "count"});
    assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "points"), 0), "value")->valuedouble == 2);
    cJSON_Delete(j);
    const char *wk[] = {"kind=bench"};
    j = trend(p, (td_db_trend_opts){.metric = "rel_l2", .where = wk, .n_where = 1});
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "points")), 0);
    cJSON_Delete(j);

    /* noisy but level series: no step */
    const char *q = td_test_path("noise.db");
    static const double noise[] = {1.00, 1.10, 0.90, 1.05, 0.95, 1.02, 0.97, 1.08};
    for (int i = 0; i < 8; i++) trend_point(q, noise[i] * 1e-6, "c", "L5.moe.out", i);
    j = trend(q, (td_db_trend_opts){.metric = "rel_l2", .where = w, .n_where = 1});
    assert_int_equal(cJSON_GetObjectItem(j, "n_steps")->valuedouble, 0);
    cJSON_Delete(j);
}

static void trend_rejects_unknown_names(void **state)
{
    (void)state;
    const char *p = td_test_path("trend-bad.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    td_err err;
    cJSON *j;
    struct { td_db_trend_opts o; const char *needle; } cases[] = {
        {{.metric = "speed"}, "not a numeric column"},
        {{.metric = "tap"}, "not a numeric column"},
        {{.metric = "bogus.value"}, "unknown table"},
        {{.metric = "rel_l2", .agg = "median"}, "median"},
        {{.metric = NULL}, "--metric"},
        {{.metric = "rel_l2", .where = (const char *[]){"colour=red"}, .n_where = 1}, "unknown key"},
        {{.metric = "rel_l2", .where = (const char *[]){"layer=three"}, .n_where = 1}, "takes a number"},
        {{.metric = "rel_l2", .where = (const char *[]){"tap"}, .n_where = 1}, "KEY=VALUE"},
        {{.metric = "rel_l2", .status = "done"}, "--status 'done'"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        td_status s = td_db_trend(db, &cases[i].o, &j, &err);
        if (s != TD_ERR_ARG || !strstr(err.msg, cases[i].needle)) fail_msg("case %zu: %d '%s'", i, s, err.msg);
    }
    /* other tables work */
    j = NULL;
    const char *w[] = {"suite=gsm8k"};
    td_db_trend_opts o = {.metric = "quality.value", .where = w, .n_where = 1};
    assert_int_equal(td_db_trend(db, &o, &j, &err), TD_OK);
    cJSON_Delete(j);
    td_db_close(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(regress_threshold_parsing),
        cmocka_unit_test(regress_identical_rerun_is_clean),
        cmocka_unit_test(regress_each_rule_fires),
        cmocka_unit_test(regress_baselines_set_move_list_remove),
        cmocka_unit_test(regress_cli_exit_status),
        cmocka_unit_test(trend_detects_a_step_not_noise),
        cmocka_unit_test(trend_rejects_unknown_names),
    };
    return cmocka_run_group_tests_name("db_regress", tests, NULL, NULL);
}
