/* bench_db.c — results store throughput: ingest of layer comparisons, and the latency of
 * regress, trend, compare and open on a large store.
 *
 *   build/release/bench/bench_db [--db PATH] [--rows N] [--rows-per-run R] [--batch B]
 *                                [--repeat K] [--tandem PATH] [--store PATH] [--keep]
 *
 * Builds a fresh store of N layer rows (default 1,000,000) in runs of R rows (default 9,600:
 * 48 layers x 10 taps x 2 ranks x 5 token counts x 2 variant pairs; at most 6 pairs, 28,800
 * rows), written in batches of B rows, on one thread. Then times, K times each (default 5; median and max reported):
 * opening the store, `regress` of the newest run against a baseline set on the first,
 * `trend` of one metric with a tap filter, with a layer filter and over every row, and
 * `compare` of two runs. With --tandem it also times the CLI end to end. With --store the
 * numbers are written as a `bench` run into that results store. docs/perf.md has results.
 */
#include "db/db.h"
#include "db/query.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const td_err *err)
{
    fprintf(stderr, "bench_db: %s: %s\n", what, err ? err->msg : "");
    exit(2);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the synthetic audit ----------------------------------------------------------------- */

static const char *const tap_kinds[10] = {"hc_attn.mix", "attn.out", "gdn.out", "moe.router_logits", "moe.topk",
                                          "moe.out", "ple.out", "resid", "hc_ffn.mix", "ffn.out"};
static const int token_counts[5] = {1, 4, 8, 16, 784};
static const char *const pair_names[6] = {"cuda:storage=raw", "cuda:moe_dispatch=grouped", "cuda:graphs=on",
                                          "cuda:storage=prepared", "cuda:tp=2", "cuda:act_dtype=bf16"};

/* Deterministic pseudo-random in [0, 1). */
static double rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

/* Row i of a run: key from i, metrics noisy around a per-key level; `worse` scales errors. */
static td_db_layer_row make_row(int64_t i, char *tap, size_t cap, uint64_t *seed, double worse)
{
    int64_t k = i;
    int tok = token_counts[k % 5];
    k /= 5;
    int rank = (int)(k % 2);
    k /= 2;
    const char *kind = tap_kinds[k % 10];
    k /= 10;
    int layer = (int)(k % 48);
    int pair = (int)(k / 48); /* 4,800 rows per variant pair */
    snprintf(tap, cap, "L%d.%s", layer, kind);
    bool exact = (i % 3) == 0;
    double level = exact ? 0.0 : 1e-7 * (1.0 + (double)(i % 17)) * worse * (1.0 + 0.01 * rnd(seed));
    td_db_layer_row r = {
        .layer = layer, .rank = rank, .tokens = tok, .tap = tap, .variant_a = "ref",
        .variant_b = pair_names[pair % 6],
        .expectation = exact ? TD_DB_EXPECT_EXACT : TD_DB_EXPECT_BOUNDED, .dtype = "f32", .numel = 2560L * tok,
        .exact = exact, .mismatches = exact ? 0 : (int64_t)(i % 500), .max_abs = level * 8, .rel_l2 = level,
        .max_ulp = exact ? 0 : (int64_t)(i % 9), .nmse = level * level, .cosine = 1.0 - level * level / 2,
        .finite = true, .first_diff = exact ? -1 : (int64_t)(i % 2560), .verdict = TD_DB_PASS};
    return r;
}

/* ---- timing helpers ----------------------------------------------------------------------- */

typedef struct lat {
    double med_ms, max_ms;
} lat;

static lat summarize(double *ms, int n)
{
    qsort(ms, (size_t)n, sizeof *ms, cmp_d);
    lat l = {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms[n - 1]};
    return l;
}

typedef enum { Q_OPEN, Q_REGRESS, Q_TREND_TAP, Q_TREND_LAYER, Q_TREND_ALL, Q_COMPARE } query_kind;

/* One timed query on a freshly opened handle (what a CLI call does, minus process start). */
static double time_query(const char *path, query_kind q, int64_t base, int64_t cand)
{
    double t0 = now_s(CLOCK_MONOTONIC);
    td_db *db;
    td_err err;
    if (td_db_open(path, 0, &db, &err) != TD_OK) die("open", &err);
    cJSON *res = NULL;
    td_status s = TD_OK;
    int64_t nreg;
    switch (q) {
    case Q_OPEN: break;
    case Q_REGRESS: {
        td_db_regress_opts o = {.baseline_run = base, .run = cand};
        s = td_db_regress(db, &o, &res, &nreg, &err);
        break;
    }
    case Q_TREND_TAP: {
        const char *w[] = {"tap=L23.moe.out", "tokens=16"};
        td_db_trend_opts o = {.metric = "rel_l2", .where = w, .n_where = 2};
        s = td_db_trend(db, &o, &res, &err);
        break;
    }
    case Q_TREND_LAYER: {
        const char *w[] = {"layer=23"};
        td_db_trend_opts o = {.metric = "nmse", .where = w, .n_where = 1, .agg = "mean"};
        s = td_db_trend(db, &o, &res, &err);
        break;
    }
    case Q_TREND_ALL: {
        td_db_trend_opts o = {.metric = "max_abs"};
        s = td_db_trend(db, &o, &res, &err);
        break;
    }
    case Q_COMPARE: s = td_db_compare(db, base, cand, 20, &res, &err); break;
    }
    if (s != TD_OK) die("query", &err);
    cJSON_Delete(res);
    td_db_close(db);
    return 1e3 * (now_s(CLOCK_MONOTONIC) - t0);
}

static double time_cli(const char *cmd)
{
    double t0 = now_s(CLOCK_MONOTONIC);
    int rc = system(cmd);
    if (rc == -1 || (WIFEXITED(rc) && WEXITSTATUS(rc) > 1)) {
        fprintf(stderr, "bench_db: '%s' failed\n", cmd);
        exit(2);
    }
    return 1e3 * (now_s(CLOCK_MONOTONIC) - t0);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *path = "build/bench_db.sqlite", *tandem = NULL, *store = NULL;
    long long rows = 1000000, per_run = 9600, batch = 9600;
    int repeat = 5;
    bool keep = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--keep")) { keep = true; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: bench_db [--db PATH] [--rows N] [--rows-per-run R] [--batch B] [--repeat K]\n"
                   "                [--tandem PATH] [--store PATH] [--keep]\n");
            return 0;
        }
        if (!v) { fprintf(stderr, "bench_db: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--db")) path = v;
        else if (!strcmp(a, "--rows")) rows = atoll(v);
        else if (!strcmp(a, "--rows-per-run")) per_run = atoll(v);
        else if (!strcmp(a, "--batch")) batch = atoll(v);
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--tandem")) tandem = v;
        else if (!strcmp(a, "--store")) store = v;
        else { fprintf(stderr, "bench_db: unknown option %s\n", a); return 2; }
    }
    if (rows < 1 || per_run < 1 || batch < 1 || repeat < 1 || repeat > 100 || per_run > 6 * 4800) {
        fprintf(stderr, "bench_db: bad sizes (rows-per-run at most 28800)\n");
        return 2;
    }
    char side[4200];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);

    /* ---- ingest ---- */
    td_err err;
    td_db *db;
    if (td_db_open(path, TD_DB_CREATE, &db, &err) != TD_OK) die("create", &err);
    uint64_t seed = 20260905;
    char tap[64];
    int64_t n_runs = (rows + per_run - 1) / per_run, first = 0, last = 0, written = 0;
    double put_s = 0;
    double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int64_t r = 0; r < n_runs; r++) {
        const char *variants[] = {"ref", "cuda:storage=raw"};
        td_db_run_info info = {.kind = "audit.layer", .variants = variants, .n_variants = 2};
        int64_t run;
        if (td_db_run_begin(db, &info, &run, &err) != TD_OK) die("run_begin", &err);
        if (!first) first = run;
        last = run;
        int64_t n = rows - written < per_run ? rows - written : per_run;
        double worse = r == n_runs - 1 ? 1.5 : 1.0; /* the newest run regresses a little */
        double p0 = now_s(CLOCK_MONOTONIC);
        for (int64_t i = 0; i < n; i += batch) {
            if (td_db_batch_begin(db, &err) != TD_OK) die("batch", &err);
            for (int64_t k = i; k < i + batch && k < n; k++) {
                td_db_layer_row row = make_row(k, tap, sizeof tap, &seed, worse);
                if (td_db_put_layer(db, run, &row, &err) != TD_OK) die("put", &err);
            }
            if (td_db_batch_commit(db, &err) != TD_OK) die("commit", &err);
        }
        put_s += now_s(CLOCK_MONOTONIC) - p0;
        written += n;
        if (td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err) != TD_OK) die("run_end", &err);
    }
    double wall = now_s(CLOCK_MONOTONIC) - w0, cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (td_db_baseline_set(db, "bench", first, &err) != TD_OK) die("baseline", &err);
    td_db_close(db);
    struct stat sb;
    double mib = stat(path, &sb) == 0 ? (double)sb.st_size / 1048576.0 : 0;

    printf("bench_db: %lld layer rows in %lld runs of up to %lld, batches of %lld, one thread\n", rows,
           (long long)n_runs, per_run, batch);
    printf("store %s: %.0f MiB\n\n", path, mib);
    printf("%-44s %12s  %s\n", "measure", "value", "unit");
    double ingest_rate = (double)written / wall;
    printf("%-44s %12.0f  rows/s (wall, with run begin/end; cpu %.2f s of %.2f s)\n", "ingest", ingest_rate, cpu, wall);
    printf("%-44s %12.0f  rows/s (batch writes only)\n", "ingest, put+commit", (double)written / put_s);

    /* ---- queries ---- */
    static const struct { query_kind q; const char *name; } qs[] = {
        {Q_OPEN, "open (checks, sweep)"},
        {Q_REGRESS, "regress newest vs baseline"},
        {Q_TREND_TAP, "trend rel_l2, tap=L23.moe.out tokens=16"},
        {Q_TREND_LAYER, "trend mean nmse, layer=23"},
        {Q_TREND_ALL, "trend max_abs, no filter (every row)"},
        {Q_COMPARE, "compare first vs newest"},
    };
    lat results[TD_ARRAY_LEN(qs)];
    double ms[100];
    for (size_t k = 0; k < TD_ARRAY_LEN(qs); k++) {
        time_query(path, qs[k].q, first, last); /* warm the page cache */
        for (int i = 0; i < repeat; i++) ms[i] = time_query(path, qs[k].q, first, last);
        results[k] = summarize(ms, repeat);
        printf("%-44s %12.1f  ms median of %d (max %.1f)\n", qs[k].name, results[k].med_ms, repeat, results[k].max_ms);
    }
    lat cli_reg = {0, 0}, cli_trend = {0, 0};
    if (tandem) {
        char cmd[8800];
        snprintf(cmd, sizeof cmd, "%s db --db '%s' regress --baseline bench --run latest >/dev/null", tandem, path);
        time_cli(cmd);
        for (int i = 0; i < repeat; i++) ms[i] = time_cli(cmd);
        cli_reg = summarize(ms, repeat);
        printf("%-44s %12.1f  ms median of %d (max %.1f)\n", "CLI: tandem db regress", cli_reg.med_ms, repeat, cli_reg.max_ms);
        snprintf(cmd, sizeof cmd, "%s db --db '%s' trend --metric rel_l2 --where tap=L23.moe.out --where tokens=16 "
                                  ">/dev/null", tandem, path);
        time_cli(cmd);
        for (int i = 0; i < repeat; i++) ms[i] = time_cli(cmd);
        cli_trend = summarize(ms, repeat);
        printf("%-44s %12.1f  ms median of %d (max %.1f)\n", "CLI: tandem db trend (tap filter)", cli_trend.med_ms,
               repeat, cli_trend.max_ms);
    }

    /* ---- optionally record the numbers as a bench run ---- */
    if (store) {
        td_db *sdb;
        if (td_db_open(store, TD_DB_CREATE, &sdb, &err) != TD_OK) die("store", &err);
        td_db_run_info info = {.kind = "bench", .argc = argc, .argv = argv};
        int64_t run;
        if (td_db_run_begin(sdb, &info, &run, &err) != TD_OK) die("store run", &err);
        char shape[64];
        snprintf(shape, sizeof shape, "rows=%lld,per_run=%lld", rows, per_run);
        td_db_timing_row t = {.bench = "db.ingest", .shape = shape, .metric = "rows_per_s", .value = ingest_rate,
                              .unit = "rows/s", .n = 1, .stddev = NAN, .higher_is_better = true};
        if (td_db_put_timing(sdb, run, &t, &err) != TD_OK) die("store timing", &err);
        for (size_t k = 0; k < TD_ARRAY_LEN(qs); k++) {
            td_db_timing_row q = {.bench = qs[k].name, .shape = shape, .metric = "median", .value = results[k].med_ms,
                                  .unit = "ms", .n = repeat, .stddev = NAN};
            if (td_db_put_timing(sdb, run, &q, &err) != TD_OK) die("store timing", &err);
        }
        if (td_db_run_end(sdb, run, TD_DB_RUN_OK, 0, NULL, &err) != TD_OK) die("store end", &err);
        td_db_close(sdb);
        printf("\nrecorded as run %lld in %s\n", (long long)run, store);
    }
    if (!keep) {
        unlink(path);
        snprintf(side, sizeof side, "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", path);
        unlink(side);
    }
    return 0;
}
