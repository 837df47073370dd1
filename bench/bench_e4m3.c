/* bench_e4m3.c — `tandem audit e4m3` at production shape: Part 1 time, and the Part 2 audit
 * of one production-shape MoE layer (512 experts x gate/up/down, hidden 2560, intermediate
 * 640: 1536 NVFP4 tensors, 157,286,400 block scales) per thread count, cold and warm page cache,
 * with the TP4 view, with the results store, and element by element.
 *
 *   build/release/bench/bench_e4m3 [--model DIR] [--threads LIST] [--elementwise] [--repeat K]
 *                                  [--store PATH]
 *
 * Without --model it writes (once, then reuses) `tandem gen --preset flash-next-moe-layer
 * --seed 0` into build/bench_e4m3/moe-layer (about 1.5 GiB). Every measurement runs in a forked
 * child so that its peak resident memory (ru_maxrss) is its own. "cold" drops the checkpoint's
 * pages from the page cache first (posix_fadvise DONTNEED on every shard), "warm" reads it
 * again right after. Each configuration is run K times (default 3); the table shows the
 * median wall time and the largest peak RSS. The verdict counts are checked to be identical
 * across configurations. With --store the medians are written as a `bench` run. docs/perf.md
 * has results.
 */
#include "audit/e4m3.h"
#include "audit/e4m3_db.h"
#include "audit/scale_audit.h"
#include "db/db.h"
#include "gen.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const td_err *err)
{
    fprintf(stderr, "bench_e4m3: %s: %s\n", what, err ? err->msg : "");
    exit(2);
}

/* Current resident set in KiB (/proc/self/statm), 0 when unknown. */
static long rss_now_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = 0;
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Drop every *.safetensors page of dir from the page cache. */
static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY);
        if (fd < 0) continue;
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}

typedef struct result {
    double seconds;
    long maxrss_kb;
    long start_rss_kb;     /* resident at the start of the child (inherited from the parent) */
    int64_t tensors, admitted, rejected, input_errors, stages, stages_admitted, saved, elements;
    int rc;
} result;

typedef struct config {
    const char *label;
    int threads;
    int tp;
    bool elementwise;
    bool cold;
    bool db;
} config;

static td_status count_layer(void *ctx, const td_scale_layer *l, td_err *err)
{
    td_e4m3_db *db = ctx;
    return db ? td_e4m3_db_layer(db, l, err) : TD_OK;
}

/* One audit in a forked child; the parent gets its time, peak RSS and verdict counts. */
static result run_child(const char *model, const config *c, const char *store)
{
    int fds[2];
    if (pipe(fds)) die("pipe", NULL);
    if (c->cold) drop_cache(model);
    pid_t pid = fork();
    if (pid < 0) die("fork", NULL);
    if (pid == 0) {
        close(fds[0]);
        result r;
        memset(&r, 0, sizeof r);
        r.start_rss_kb = rss_now_kb();
        td_scale_opts o;
        td_scale_opts_init(&o);
        o.model = model;
        o.threads = c->threads;
        o.tp = c->tp;
        o.elementwise = c->elementwise;
        td_err err;
        td_e4m3_db *db = NULL;
        double t0 = now_s();
        if (c->db) {
            unlink(store);
            char *argv[] = {(char *)"bench_e4m3", NULL};
            if (td_e4m3_db_open(store, 1, argv, model, 1, &db, &err)) die("store", &err);
        }
        td_scale_sink sink = {db, NULL, count_layer};
        td_scale_summary s;
        r.rc = td_scale_audit(&o, &sink, &s, &err) ? 2 : 0;
        if (r.rc) fprintf(stderr, "bench_e4m3: %s\n", err.msg);
        if (db) {
            if (td_e4m3_db_summary(db, &s, &err) || td_e4m3_db_end(db, true, 0, NULL, &err)) die("store", &err);
            td_e4m3_db_free(db);
        }
        r.seconds = now_s() - t0;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        r.maxrss_kb = ru.ru_maxrss;
        r.tensors = s.total.tensors;
        r.admitted = s.total.admitted;
        r.rejected = s.total.rejected;
        r.input_errors = s.total.input_errors;
        r.stages = s.total.stages;
        r.stages_admitted = s.total.stages_admitted;
        r.saved = s.total.saved_bytes;
        r.elements = s.total.elements;
        if (write(fds[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(3);
        _exit(0);
    }
    close(fds[1]);
    result r;
    memset(&r, 0, sizeof r);
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    if (got != (ssize_t)sizeof r || !WIFEXITED(st) || WEXITSTATUS(st)) die("child audit failed", NULL);
    return r;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *store = NULL, *threads_list = "1,2";
    bool elementwise = false;
    int repeat = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: bench_e4m3 [--model DIR] [--threads LIST] [--elementwise] [--repeat K] [--store PATH]\n");
            return 0;
        }
        if (!strcmp(a, "--elementwise")) { elementwise = true; continue; }
        if (!v) { fprintf(stderr, "bench_e4m3: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--threads")) threads_list = v;
        else if (!strcmp(a, "--repeat")) repeat = atoi(v);
        else if (!strcmp(a, "--store")) store = v;
        else { fprintf(stderr, "bench_e4m3: unknown option %s\n", a); return 2; }
    }
    if (repeat < 1 || repeat > 50) { fprintf(stderr, "bench_e4m3: --repeat 1..50\n"); return 2; }
    td_err err;
    char gen_dir[] = "build/bench_e4m3/moe-layer";
    if (!model) {
        model = gen_dir;
        char p[256];
        snprintf(p, sizeof p, "%s/tandem_gen.json", gen_dir);
        struct stat sb;
        if (stat(p, &sb) != 0) {
            /* in a child, so that the generator's memory never shows in the audits' peak RSS */
            pid_t pid = fork();
            if (pid < 0) die("fork", NULL);
            if (pid == 0) {
                td_gen_opts o;
                td_gen_opts_init(&o);
                o.preset = "flash-next-moe-layer";
                o.seed = 0;
                o.force = true;
                td_gen_result gr;
                double t0 = now_s();
                if (td_gen(&o, gen_dir, &gr, &err)) die("tandem gen flash-next-moe-layer", &err);
                printf("generated %s: %lld tensors, %.1f MiB in %.1f s\n", gen_dir, (long long)gr.tensors,
                       (double)gr.bytes / (1 << 20), now_s() - t0);
                fflush(stdout);
                _exit(0);
            }
            int st;
            waitpid(pid, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st)) die("generating the checkpoint failed", NULL);
        }
    }

    /* Part 1 */
    static td_codec_report rep;
    double t0 = now_s();
    td_codec_audit(td_codec_tandem(), 1, &rep);
    double part1 = now_s() - t0;
    printf("Part 1 (codec self-audit): %zu checks, %lld failed, %.3f s\n", rep.n, (long long)rep.failed, part1);

    config cfgs[32];
    int nc = 0;
    char labels[32][64];
    for (const char *p = threads_list; *p && nc < 24;) {
        int t = atoi(p);
        if (t < 1) { fprintf(stderr, "bench_e4m3: bad --threads\n"); return 2; }
        snprintf(labels[nc], sizeof labels[nc], "tables, %d thread(s), cold", t);
        cfgs[nc] = (config){labels[nc], t, 1, false, true, false};
        nc++;
        snprintf(labels[nc], sizeof labels[nc], "tables, %d thread(s), warm", t);
        cfgs[nc] = (config){labels[nc], t, 1, false, false, false};
        nc++;
        snprintf(labels[nc], sizeof labels[nc], "tables, %d thread(s), warm, --tp 4", t);
        cfgs[nc] = (config){labels[nc], t, 4, false, false, false};
        nc++;
        snprintf(labels[nc], sizeof labels[nc], "tables, %d thread(s), warm, + store", t);
        cfgs[nc] = (config){labels[nc], t, 1, false, false, true};
        nc++;
        if (elementwise) {
            snprintf(labels[nc], sizeof labels[nc], "element by element, %d thread(s), warm", t);
            cfgs[nc] = (config){labels[nc], t, 1, true, false, false};
            nc++;
        }
        const char *comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    const char *tmp_store = "build/bench_e4m3/store.sqlite";
    mkdir("build", 0777);
    mkdir("build/bench_e4m3", 0777);
    printf("\nPart 2 on %s (median of %d; peak RSS of the audit process)\n", model, repeat);
    printf("  %-44s %8s %8s %12s %12s %10s\n", "configuration", "wall s", "min s", "peak RSS",
           "at start", "admitted");
    double medians[32];
    result first;
    memset(&first, 0, sizeof first);
    for (int i = 0; i < nc; i++) {
        double s[50];
        long rss = 0, start = 0;
        result r;
        for (int k = 0; k < repeat; k++) {
            r = run_child(model, &cfgs[i], tmp_store);
            s[k] = r.seconds;
            if (r.maxrss_kb > rss) rss = r.maxrss_kb;
            if (r.start_rss_kb > start) start = r.start_rss_kb;
        }
        qsort(s, (size_t)repeat, sizeof s[0], cmp_d);
        medians[i] = s[repeat / 2];
        char adm[64];
        snprintf(adm, sizeof adm, "%lld/%lld", (long long)r.admitted, (long long)r.tensors);
        printf("  %-44s %8.3f %8.3f %8.1f MiB %8.1f MiB %10s\n", cfgs[i].label, medians[i], s[0],
               (double)rss / 1024, (double)start / 1024, adm);
        if (i == 0) first = r;
        else if (r.tensors != first.tensors || r.admitted != first.admitted || r.rejected != first.rejected ||
                 r.elements != first.elements)
            die("verdicts differ between configurations", NULL);
    }
    printf("\n%lld tensors, %lld block scales, %lld admitted, %lld rejected, %lld input errors; "
           "raw storage saves %.2f MiB (tp 1)\n", (long long)first.tensors, (long long)first.elements,
           (long long)first.admitted, (long long)first.rejected, (long long)first.input_errors,
           (double)first.saved / (1 << 20));
    unlink(tmp_store);
    if (store) {
        td_db *db;
        if (td_db_open(store, TD_DB_CREATE, &db, &err)) die("store", &err);
        td_db_run_info info;
        memset(&info, 0, sizeof info);
        info.kind = "bench";
        info.argc = argc;
        info.argv = argv;
        info.checkpoint = model;
        int64_t run;
        if (td_db_run_begin(db, &info, &run, &err)) die("store", &err);
        td_db_timing_row row;
        memset(&row, 0, sizeof row);
        row.bench = "audit.e4m3.part1";
        row.metric = "wall";
        row.value = part1;
        row.unit = "s";
        row.n = 1;
        row.stddev = NAN;
        if (td_db_put_timing(db, run, &row, &err)) die("store", &err);
        for (int i = 0; i < nc; i++) {
            row.bench = "audit.e4m3.part2";
            row.shape = "moe-layer-512x640";
            row.variant = cfgs[i].label;
            row.value = medians[i];
            row.n = repeat;
            if (td_db_put_timing(db, run, &row, &err)) die("store", &err);
        }
        if (td_db_run_end(db, run, TD_DB_RUN_OK, 0, NULL, &err)) die("store", &err);
        td_db_close(db);
        printf("stored as run %lld in %s\n", (long long)run, store);
    }
    return first.rejected || first.input_errors || rep.failed ? 1 : 0;
}
