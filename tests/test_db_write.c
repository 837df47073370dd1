/* test_db_write.c — batches and typed result writers (db/write.c): atomic batches, every
 * result family, validation, a writer killed mid-batch, concurrent writer processes. */
#include "test_common.h"
#include "db_fixture.h"
#include "db/db.h"
#include "db/query.h"
#include "db/schema.h"

#include <math.h>
#include <signal.h>
#include <time.h>

/* Layer row i of a synthetic audit: every i has its own key (tap, rank, tokens). */
static td_db_layer_row layer_row(int i, char *tap, size_t cap)
{
    static const char *const kinds[8] = {"attn.out", "gdn.out", "moe.out", "moe.router_logits",
                                         "moe.topk", "ple.out", "resid", "hc_attn.mix"};
    static const int toks[5] = {1, 4, 8, 16, 784};
    int layer = i / 160, rest = i % 160;
    snprintf(tap, cap, "L%d.%s", layer, kinds[rest % 8]);
    td_db_layer_row r = {
        .layer = layer, .rank = (rest / 8) % 4, .tokens = toks[(rest / 32) % 5], .tap = tap,
        .variant_a = "ref", .variant_b = "cuda:storage=raw", .expectation = TD_DB_EXPECT_BOUNDED,
        .dtype = "f32", .numel = 2560, .exact = false, .mismatches = 17, .max_abs = 1e-6 * (i % 7 + 1),
        .rel_l2 = 1e-7 * (i % 5 + 1), .max_ulp = 3, .nmse = 1e-14, .cosine = 1.0, .finite = true,
        .first_diff = 5, .verdict = TD_DB_PASS};
    return r;
}

static void write_batch_commit_visible_rollback_invisible(void **state)
{
    (void)state;
    td_err err;
    const char *p = td_test_path("batch.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t run = begin_run(db, "audit.layer");
    char tap[64];
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    for (int i = 0; i < 1000; i++) {
        td_db_layer_row r = layer_row(i, tap, sizeof tap);
        assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    }
    /* another connection sees nothing until the commit */
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 0);
    assert_int_equal(td_db_batch_commit(db, &err), TD_OK);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 1000);
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    for (int i = 1000; i < 1500; i++) {
        td_db_layer_row r = layer_row(i, tap, sizeof tap);
        assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    }
    td_db_batch_rollback(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 1000);
    /* closing with an open batch rolls it back */
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    td_db_layer_row r = layer_row(2000, tap, sizeof tap);
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 1000);
    /* the array form is one transaction too */
    db = open_ok(p, 0);
    run = begin_run(db, "audit.layer");
    td_db_layer_row rows[3];
    char taps[3][64];
    for (int i = 0; i < 3; i++) rows[i] = layer_row(i, taps[i], sizeof taps[i]);
    rows[2].tap = rows[0].tap; /* duplicate key: the whole call fails */
    rows[2].rank = rows[0].rank;
    rows[2].tokens = rows[0].tokens;
    assert_int_equal(td_db_put_layers(db, run, rows, 3, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "UNIQUE"));
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 1000);
    assert_int_equal(td_db_put_layers(db, run, rows, 2, &err), TD_OK);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 1002);
    td_db_close(db);
}

static void write_every_family_round_trips(void **state)
{
    (void)state;
    td_err err;
    const char *p = td_test_path("families.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t run = begin_run(db, "audit.e4m3");
    td_db_layer_row l = {.layer = -1, .rank = 0, .tokens = 4, .tap = "logits", .variant_a = "ref",
                         .variant_b = "cuda", .expectation = TD_DB_EXPECT_EXACT, .dtype = NULL, .numel = -1,
                         .exact = false, .mismatches = -1, .max_abs = NAN, .rel_l2 = INFINITY, .max_ulp = -1,
                         .nmse = NAN, .cosine = NAN, .finite = false, .first_diff = 12, .verdict = TD_DB_FAIL};
    td_db_encoding_row e = {.check_name = "expand.all_codes", .stage = "w13.interleaved", .variant = "strict",
                            .elements = 256, .mismatches = 0, .nan_mismatches = 0, .first_diff = -1, .exact = true,
                            .verdict = TD_DB_PASS, .detail = "all 256 codes"};
    td_db_census_row c = {.tensor = "L0.w13.weight_scale", .code = 255, .count = 3};
    td_db_completion_row cp = {.variant = "cuda", .batch = 8, .request = "req-3", .rep = 1, .length = 256,
                               .hash = "ab12", .reference = "ref", .first_divergence = 12, .margin = 0.25,
                               .reference_margin = NAN};
    td_db_quality_row q1 = {.suite = "gsm8k", .metric = "acc", .value = 0.75, .stderr_ = 0.02, .n = 16,
                            .threshold = 0.8, .higher_is_better = true};
    td_db_quality_row q2 = {.suite = "ppl.wiki", .metric = "ppl", .variant = "cuda", .value = 7.5, .stderr_ = NAN,
                            .n = -1, .threshold = 8.0, .higher_is_better = false};
    td_db_quality_row q3 = {.suite = "kld", .metric = "mean", .value = NAN, .stderr_ = NAN, .n = -1, .threshold = NAN};
    td_db_timing_row t = {.bench = "moe.w13", .shape = "M16", .metric = "median", .value = 5.583, .unit = "ms",
                          .n = 5, .stddev = 0.01, .higher_is_better = false};
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    assert_int_equal(td_db_put_layer(db, run, &l, &err), TD_OK);
    assert_int_equal(td_db_put_encoding(db, run, &e, &err), TD_OK);
    assert_int_equal(td_db_put_census(db, run, &c, &err), TD_OK);
    assert_int_equal(td_db_put_completion(db, run, &cp, &err), TD_OK);
    /* token ids (extreme values) and both margins; an equal completion stores no reference margin */
    static const int32_t ids[4] = {0, -1, INT32_MAX, INT32_MIN};
    td_db_completion_row cp2 = {.variant = "cuda", .batch = 8, .request = "req-4", .length = 4, .hash = "cd",
                                .reference = "ref", .first_divergence = 2, .margin = 0.125, .tokens = ids,
                                .reference_margin = 0.5};
    td_db_completion_row cp3 = {.variant = "cuda", .batch = 8, .request = "req-5", .length = 0, .hash = "e3",
                                .reference = "ref", .first_divergence = -1, .margin = NAN, .tokens = ids,
                                .reference_margin = 0.75};
    assert_int_equal(td_db_put_completion(db, run, &cp2, &err), TD_OK);
    assert_int_equal(td_db_put_completion(db, run, &cp3, &err), TD_OK);
    assert_int_equal(td_db_put_quality(db, run, &q1, &err), TD_OK);
    assert_int_equal(td_db_put_quality(db, run, &q2, &err), TD_OK);
    assert_int_equal(td_db_put_quality(db, run, &q3, &err), TD_OK);
    assert_int_equal(td_db_put_timing(db, run, &t, &err), TD_OK);
    assert_int_equal(td_db_batch_commit(db, &err), TD_OK);
    td_db_close(db);
    /* unknown metrics read back as NULL; infinities stay infinities */
    assert_string_equal(raw_text(p, "SELECT quote(max_abs) || ',' || quote(nmse) || ',' || quote(mismatches) || ',' "
                                    "|| quote(max_ulp) || ',' || quote(numel) || ',' || dtype || ',' || layer "
                                    "FROM layer_cmp"), "NULL,NULL,NULL,NULL,NULL,,-1");
    assert_int_equal(raw_int(p, "SELECT rel_l2 > 1e308 FROM layer_cmp"), 1);
    assert_int_equal(raw_int(p, "SELECT first_diff FROM layer_cmp"), 12);
    assert_string_equal(raw_text(p, "SELECT check_name || '|' || stage || '|' || variant || '|' || detail || '|' || "
                                    "quote(first_diff) FROM encoding_checks"),
                        "expand.all_codes|w13.interleaved|strict|all 256 codes|NULL");
    assert_int_equal(raw_int(p, "SELECT count FROM scale_census WHERE code = 255"), 3);
    assert_string_equal(raw_text(p, "SELECT variant || '|' || batch || '|' || request || '|' || rep || '|' || length "
                                    "|| '|' || hash || '|' || reference || '|' || first_divergence || '|' || margin "
                                    "FROM completions WHERE request = 'req-3'"), "cuda|8|req-3|1|256|ab12|ref|12|0.25");
    assert_string_equal(raw_text(p, "SELECT group_concat(request || ':' || quote(token_ids) || ':' || "
                                    "quote(reference_margin) || ':' || quote(margin), ' ') FROM "
                                    "(SELECT * FROM completions ORDER BY request)"),
                        "req-3:NULL:NULL:0.25 req-4:'[0,-1,2147483647,-2147483648]':0.5:0.125 req-5:'[]':NULL:NULL");
    /* the quality gate is evaluated on write, in the metric's direction */
    assert_string_equal(raw_text(p, "SELECT group_concat(suite || ':' || quote(pass), ' ') FROM "
                                    "(SELECT * FROM quality ORDER BY suite)"), "gsm8k:0 kld:NULL ppl.wiki:1");
    assert_string_equal(raw_text(p, "SELECT bench || '|' || shape || '|' || value || '|' || unit || '|' || n "
                                    "FROM timings"), "moe.w13|M16|5.583|ms|5");
}

static void write_rejects_bad_rows_and_keeps_the_batch(void **state)
{
    (void)state;
    td_err err;
    const char *p = td_test_path("bad.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t run = begin_run(db, "audit.layer");
    char tap[64];
    td_db_layer_row ok = layer_row(0, tap, sizeof tap);
    assert_int_equal(td_db_batch_begin(db, &err), TD_OK);
    assert_int_equal(td_db_put_layer(db, run, &ok, &err), TD_OK);
    td_db_layer_row r = ok;
    r.tap = NULL;
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "tap"));
    r = ok;
    r.expectation = (td_db_expect)7;
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_ERR_ARG);
    r = ok;
    r.tokens = -3;
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_ERR_ARG);
    assert_int_equal(td_db_put_layer(db, run, &ok, &err), TD_ERR_ARG); /* same key twice */
    assert_non_null(strstr(err.msg, "UNIQUE"));
    td_db_census_row c = {.tensor = "w", .code = 256, .count = 1};
    assert_int_equal(td_db_put_census(db, run, &c, &err), TD_ERR_ARG);
    td_db_completion_row cp = {.variant = "cuda", .batch = 0, .request = "r", .hash = "h"};
    assert_int_equal(td_db_put_completion(db, run, &cp, &err), TD_ERR_ARG);
    td_db_timing_row t = {.bench = "b", .metric = "m", .unit = NULL};
    assert_int_equal(td_db_put_timing(db, run, &t, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "unit"));
    /* the failed puts did not poison the batch */
    td_db_layer_row r2 = layer_row(1, tap, sizeof tap);
    assert_int_equal(td_db_put_layer(db, run, &r2, &err), TD_OK);
    assert_int_equal(td_db_batch_commit(db, &err), TD_OK);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"), 2);
}

static void write_hostile_strings_stored_verbatim(void **state)
{
    (void)state;
    td_err err;
    const char *p = td_test_path("inject.db");
    td_db *db = open_ok(p, TD_DB_CREATE);
    int64_t run = begin_run(db, "audit.layer");
    const char *evil = "L0'); DROP TABLE runs; --\"%s\n";
    td_db_layer_row r = {.tap = evil, .variant_a = "ref' OR 1=1 --", .variant_b = "cuda", .finite = true,
                         .numel = -1, .mismatches = -1, .max_ulp = -1, .first_diff = -1, .max_abs = NAN,
                         .rel_l2 = NAN, .nmse = NAN, .cosine = NAN};
    assert_int_equal(td_db_put_layer(db, run, &r, &err), TD_OK);
    int64_t id;
    assert_int_equal(td_db_run_resolve(db, "latest", &id, &err), TD_OK);
    cJSON *j;
    const char *where[] = {"tap=L0'); DROP TABLE runs; --\"%s\n"};
    td_db_trend_opts to = {.metric = "tokens", .where = where, .n_where = 1, .status = "any"};
    assert_int_equal(td_db_trend(db, &to, &j, &err), TD_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "points")), 1);
    cJSON_Delete(j);
    td_db_close(db);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs"), 1);
    assert_string_equal(raw_text(p, "SELECT tap FROM layer_cmp"), evil);
}

/* ---- a writer killed in the middle of a large batch ----------------------------------------- */

#define KILL_BATCH 20000

/* Fork a writer that appends KILL_BATCH-row batches to a new run until it is killed; kill it
 * `delay_ms` after it reports being a third into its second batch. */
static void kill_writer(const char *p, long delay_ms)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        td_db *db;
        td_err e;
        if (td_db_open(p, 0, &db, &e) != TD_OK) _exit(3);
        td_db_run_info info = {.kind = "audit.layer"};
        int64_t run;
        if (td_db_run_begin(db, &info, &run, &e) != TD_OK) _exit(4);
        char tap[64];
        for (int b = 0;; b++) { /* batches until killed */
            if (td_db_batch_begin(db, &e) != TD_OK) _exit(5);
            for (int i = 0; i < KILL_BATCH; i++) {
                td_db_layer_row r = layer_row(i, tap, sizeof tap);
                r.rank += 4 * b; /* distinct keys per batch; rank / 4 is the batch */
                if (td_db_put_layer(db, run, &r, &e) != TD_OK) _exit(6);
                if (i == KILL_BATCH / 3 && write(fds[1], "x", 1) != 1) _exit(7);
            }
            if (td_db_batch_commit(db, &e) != TD_OK) _exit(8);
        }
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    assert_int_equal(read(fds[0], &c, 1), 1);
    struct timespec ts = {0, delay_ms * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(fds[0]);
}

static void write_sigkill_mid_batch_leaves_consistent_store(void **state)
{
    (void)state;
    const char *p = td_test_path("kill.db");
    td_db_close(open_ok(p, TD_DB_CREATE));
    static const long delays_ms[] = {0, 5, 25};
    for (size_t k = 0; k < TD_ARRAY_LEN(delays_ms); k++) {
        kill_writer(p, delays_ms[k]);
        td_db *db = open_ok(p, 0);
        assert_int_equal(td_db_aborted_at_open(db), 1);
        cJSON *info;
        td_err err;
        assert_int_equal(td_db_info(db, true, &info, &err), TD_OK);
        assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(info, "integrity_check"), 0)->valuestring, "ok");
        cJSON_Delete(info);
        td_db_close(db);
        assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE status = 'aborted'"), (int64_t)k + 1);
    }
    /* whole batches only: each run has its first batch and never a part of another */
    assert_int_equal(raw_int(p, "SELECT count(*) FROM (SELECT run_id, rank / 4 AS batch, count(*) AS n "
                                "FROM layer_cmp GROUP BY run_id, batch) WHERE n <> 20000"), 0);
    assert_int_equal(raw_int(p, "SELECT count(DISTINCT run_id) FROM layer_cmp"), 3);
}

/* ---- concurrent writers ------------------------------------------------------------------- */

#define WRITERS 4
#define RUNS_PER_WRITER 3
#define BATCHES_PER_RUN 4
#define ROWS_PER_BATCH 500

static void write_four_processes_lose_no_rows(void **state)
{
    (void)state;
    const char *p = td_test_path("concurrent.db");
    td_db_close(open_ok(p, TD_DB_CREATE));
    pid_t kids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        kids[w] = fork();
        assert_true(kids[w] >= 0);
        if (kids[w] == 0) {
            td_db *db;
            td_err e;
            if (td_db_open(p, 0, &db, &e) != TD_OK) { fprintf(stderr, "open: %s\n", e.msg); _exit(3); }
            char tap[64];
            for (int r = 0; r < RUNS_PER_WRITER; r++) {
                td_db_run_info info = {.kind = "audit.layer"};
                int64_t run;
                if (td_db_run_begin(db, &info, &run, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(4); }
                for (int b = 0; b < BATCHES_PER_RUN; b++) {
                    if (td_db_batch_begin(db, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(5); }
                    for (int i = 0; i < ROWS_PER_BATCH; i++) {
                        td_db_layer_row row = layer_row(b * ROWS_PER_BATCH + i, tap, sizeof tap);
                        if (td_db_put_layer(db, run, &row, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(6); }
                    }
                    if (td_db_batch_commit(db, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(7); }
                }
                td_db_timing_row t = {.bench = "writer", .metric = "id", .value = w, .unit = "1", .n = -1,
                                      .stddev = NAN};
                if (td_db_put_timing(db, run, &t, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(8); }
                if (td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &e) != TD_OK) { fprintf(stderr, "%s\n", e.msg); _exit(9); }
            }
            td_db_close(db);
            _exit(0);
        }
    }
    for (int w = 0; w < WRITERS; w++) {
        int st;
        assert_int_equal(waitpid(kids[w], &st, 0), kids[w]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    assert_int_equal(raw_int(p, "SELECT count(*) FROM runs WHERE status = 'ok'"), WRITERS * RUNS_PER_WRITER);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM layer_cmp"),
                     WRITERS * RUNS_PER_WRITER * BATCHES_PER_RUN * ROWS_PER_BATCH);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM timings"), WRITERS * RUNS_PER_WRITER);
    assert_int_equal(raw_int(p, "SELECT count(*) FROM (SELECT run_id FROM layer_cmp GROUP BY run_id "
                                "HAVING count(*) = 2000)"), WRITERS * RUNS_PER_WRITER);
    assert_int_equal(raw_int(p, "SELECT count(DISTINCT value) FROM timings"), WRITERS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_batch_commit_visible_rollback_invisible),
        cmocka_unit_test(write_every_family_round_trips),
        cmocka_unit_test(write_rejects_bad_rows_and_keeps_the_batch),
        cmocka_unit_test(write_hostile_strings_stored_verbatim),
        cmocka_unit_test(write_sigkill_mid_batch_leaves_consistent_store),
        cmocka_unit_test(write_four_processes_lose_no_rows),
    };
    return cmocka_run_group_tests_name("db_write", tests, NULL, NULL);
}
