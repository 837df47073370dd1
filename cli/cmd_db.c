/* cmd_db.c — `tandem db`: query and maintain the results store (front end over db/query.h).
 *
 * Parses options, opens the store, calls one library function and renders its cJSON result
 * as a table (default) or as JSON (--json). Exit status: 0 ok, 1 a check found a problem
 * (regression, failed integrity check, a step with --fail-on-step), 2 usage or input error.
 */
#include "cli.h"
#include "db/db.h"
#include "db/query.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== option parsing ========================================================================= */

#define MAX_OPTS 16
#define MAX_MULTI 64
#define MAX_POS 4

typedef struct opt_spec {
    const char *name;  /* long name without "--" */
    bool arg;          /* takes a value */
    bool multi;        /* may repeat */
} opt_spec;

typedef struct opts {
    const char *sub;                     /* subcommand name, for messages */
    const opt_spec *spec;
    size_t n_spec;
    const char *val[MAX_OPTS];           /* last value (or "1" for flags) */
    const char *multi[MAX_OPTS][MAX_MULTI];
    int n_multi[MAX_OPTS];
    const char *pos[MAX_POS];
    int n_pos;
    const char *db;                      /* --db */
    bool json, help;
} opts;

static void errf(const char *sub, const char *fmt, ...) TD_PRINTF(2, 3);
static void errf(const char *sub, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tandem db%s%s: ", sub ? " " : "", sub ? sub : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Returns 0, or 2 after printing a message. Options may come anywhere; "--" ends them. */
static int opts_parse(opts *o, int argc, char **argv, int max_pos)
{
    bool only_pos = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || !a[1]) {
            if (o->n_pos >= max_pos || o->n_pos >= MAX_POS) {
                errf(o->sub, "unexpected argument '%s' (see 'tandem db %s --help')", a, o->sub);
                return 2;
            }
            o->pos[o->n_pos++] = a;
            continue;
        }
        if (!strcmp(a, "--")) { only_pos = true; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { o->help = true; continue; }
        if (strncmp(a, "--", 2)) {
            errf(o->sub, "unknown option '%s' (see 'tandem db %s --help')", a, o->sub);
            return 2;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const char *value = eq ? eq + 1 : NULL;
        if (nlen == 4 && !strncmp(name, "json", 4) && !eq) { o->json = true; continue; }
        bool is_db = nlen == 2 && !strncmp(name, "db", 2);
        int k = -1;
        for (size_t j = 0; j < o->n_spec && !is_db; j++)
            if (strlen(o->spec[j].name) == nlen && !strncmp(o->spec[j].name, name, nlen)) k = (int)j;
        if (k < 0 && !is_db) {
            errf(o->sub, "unknown option '--%.*s' (see 'tandem db %s --help')", (int)nlen, name, o->sub);
            return 2;
        }
        bool takes = is_db || o->spec[k].arg;
        if (takes && !value) {
            if (i + 1 >= argc) {
                errf(o->sub, "option '--%.*s' needs a value", (int)nlen, name);
                return 2;
            }
            value = argv[++i];
        }
        if (!takes && value) {
            errf(o->sub, "option '--%.*s' takes no value", (int)nlen, name);
            return 2;
        }
        if (is_db) { o->db = value; continue; }
        if (o->spec[k].multi) {
            if (o->n_multi[k] >= MAX_MULTI) {
                errf(o->sub, "option '--%s' given too often (%d at most)", o->spec[k].name, MAX_MULTI);
                return 2;
            }
            o->multi[k][o->n_multi[k]++] = value;
        }
        o->val[k] = takes ? value : "1";
    }
    return 0;
}

static const char *opt_get(const opts *o, const char *name)
{
    for (size_t j = 0; j < o->n_spec; j++)
        if (!strcmp(o->spec[j].name, name)) return o->val[j];
    return NULL;
}

static int opt_multi(const opts *o, const char *name, const char *const **vals)
{
    for (size_t j = 0; j < o->n_spec; j++)
        if (!strcmp(o->spec[j].name, name)) {
            *vals = o->multi[j];
            return o->n_multi[j];
        }
    *vals = NULL;
    return 0;
}

/* Non-negative integer option; returns false (after a message) when malformed. */
static bool opt_int(const opts *o, const char *name, long long def, long long *out)
{
    const char *v = opt_get(o, name);
    *out = def;
    if (!v) return true;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < 0) {
        errf(o->sub, "--%s '%s': expected a non-negative integer", name, v);
        return false;
    }
    *out = x;
    return true;
}

/* ==== output helpers ========================================================================= */

static void print_json(const cJSON *j)
{
    char *t = cJSON_Print(j);
    if (t) puts(t);
    cJSON_free(t);
}

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jnum(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return false;
    *out = v->valuedouble;
    return true;
}

static double jnum_or(const cJSON *o, const char *key, double def)
{
    double v;
    return jnum(o, key, &v) ? v : def;
}

typedef enum cell_kind { CELL_STR, CELL_NUM, CELL_UID, CELL_TIME, CELL_BASE, CELL_SHORT } cell_kind;

typedef struct table_col {
    const char *header;
    const char *key;
    cell_kind kind;
} table_col;

#define CELL 96

static void cell_text(const cJSON *row, const table_col *c, char *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, c->key);
    out[0] = '\0';
    if (!v || cJSON_IsNull(v)) { snprintf(out, CELL, "%s", c->header[0] ? "-" : ""); return; }
    if (cJSON_IsBool(v)) { snprintf(out, CELL, "%s", cJSON_IsTrue(v) ? "yes" : "no"); return; }
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e15) snprintf(out, CELL, "%lld", (long long)d);
        else snprintf(out, CELL, "%.4g", d);
        return;
    }
    if (cJSON_IsArray(v)) { /* variants: "ref,cuda:storage=raw" */
        size_t o = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e)) continue;
            int k = snprintf(out + o, CELL - o, "%s%s", o ? " " : "", e->valuestring);
            if (k < 0 || (size_t)k >= CELL - o) break;
            o += (size_t)k;
        }
        if (!o) snprintf(out, CELL, "-");
        return;
    }
    if (!cJSON_IsString(v)) return;
    const char *s = v->valuestring;
    switch (c->kind) {
    case CELL_UID: snprintf(out, CELL, "%.8s", s); break;
    case CELL_SHORT: snprintf(out, CELL, "%.12s", s); break;
    case CELL_TIME: /* 2026-09-05T12:34:56.789Z -> 2026-09-05 12:34:56 */
        snprintf(out, CELL, "%.19s", s);
        if (strlen(out) > 10 && out[10] == 'T') out[10] = ' ';
        break;
    case CELL_BASE: {
        const char *b = strrchr(s, '/');
        snprintf(out, CELL, "%s", b && b[1] ? b + 1 : s);
        break;
    }
    default:
        snprintf(out, CELL, "%s", s);
        if (strlen(s) >= CELL) memcpy(out + CELL - 4, "...", 4);
    }
}

/* Print rows (an array of objects) as aligned columns; at most `limit` rows (0: all). */
static void print_table(const cJSON *rows, const table_col *cols, size_t ncols, size_t limit)
{
    size_t n = (size_t)cJSON_GetArraySize(rows);
    if (limit && n > limit) n = limit;
    char(*cells)[CELL] = calloc((n + 1) * ncols, CELL);
    size_t width[16] = {0};
    if (!cells || ncols > 16) { free(cells); return; }
    for (size_t c = 0; c < ncols; c++) {
        snprintf(cells[c], CELL, "%s", cols[c].header);
        width[c] = strlen(cols[c].header);
    }
    size_t r = 1;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        if (r > n) break;
        for (size_t c = 0; c < ncols; c++) {
            cell_text(row, &cols[c], cells[r * ncols + c]);
            size_t w = strlen(cells[r * ncols + c]);
            if (w > width[c]) width[c] = w;
        }
        r++;
    }
    char line[16 * (CELL + 2) + 1];
    for (size_t i = 0; i < r; i++) {
        size_t o = 0;
        for (size_t c = 0; c < ncols; c++) {
            const char *t = cells[i * ncols + c];
            int k = c + 1 == ncols ? snprintf(line + o, sizeof line - o, "%s", t)
                                   : snprintf(line + o, sizeof line - o, "%-*s  ", (int)width[c], t);
            if (k > 0) o += (size_t)k < sizeof line - o ? (size_t)k : sizeof line - o - 1;
        }
        while (o && line[o - 1] == ' ') line[--o] = '\0'; /* no trailing blanks */
        puts(line);
    }
    free(cells);
}

/* ==== store access =========================================================================== */

static int open_store(const opts *o, bool create, td_db **db)
{
    const char *path = td_db_path_resolve(o->db);
    td_err err;
    td_status s = td_db_open(path, create ? TD_DB_CREATE : 0, db, &err);
    if (s == TD_ERR_IO && access(path, R_OK) == 0 && access(path, W_OK) != 0) {
        /* a store we may read but not write: queries still work */
        s = td_db_open(path, TD_DB_READONLY, db, &err);
    }
    if (s != TD_OK) {
        errf(o->sub, "%s", err.msg);
        return 2;
    }
    if (td_db_aborted_at_open(*db) > 0)
        fprintf(stderr, "tandem db: marked %d run(s) aborted (their process ended without closing them)\n",
                td_db_aborted_at_open(*db));
    return 0;
}

static int resolve(const opts *o, td_db *db, const char *ref, int64_t *id)
{
    td_err err;
    if (td_db_run_resolve(db, ref, id, &err) != TD_OK) {
        errf(o->sub, "%s", err.msg);
        return 2;
    }
    return 0;
}

static int fail(const opts *o, td_db *db, const td_err *err)
{
    errf(o->sub, "%s", err->msg);
    td_db_close(db);
    return 2;
}

/* ==== subcommands ============================================================================ */

typedef struct subcmd {
    const char *name;
    int (*fn)(opts *o);
    const opt_spec *spec;
    size_t n_spec;
    int max_pos;
    const char *summary;
    const char *help;
} subcmd;

/* ---- runs ---- */

static const opt_spec runs_spec[] = {
    {"kind", true, false}, {"status", true, false}, {"checkpoint", true, false}, {"since", true, false},
    {"host", true, false}, {"commit", true, false}, {"limit", true, false}, {"gpu", true, false},
};

static int db_runs(opts *o)
{
    long long limit;
    if (!opt_int(o, "limit", 50, &limit)) return 2;
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    td_db_runs_filter f = {opt_get(o, "kind"), opt_get(o, "status"), opt_get(o, "checkpoint"), opt_get(o, "since"),
                           opt_get(o, "host"), opt_get(o, "commit"), (int64_t)limit, opt_get(o, "gpu")};
    cJSON *res;
    td_err err;
    if (td_db_runs_list(db, &f, &res, &err) != TD_OK) return fail(o, db, &err);
    if (o->json) {
        print_json(res);
    } else if (cJSON_GetArraySize(res) == 0) {
        printf("no runs in %s%s\n", td_db_path(db),
               f.kind || f.status || f.checkpoint || f.since || f.host || f.commit || f.gpu ? " match the filters" : "");
    } else {
        static const table_col cols[] = {
            {"ID", "id", CELL_NUM},           {"UID", "uid", CELL_UID},
            {"KIND", "kind", CELL_STR},       {"STATUS", "status", CELL_STR},
            {"STARTED (UTC)", "started_at", CELL_TIME}, {"SECONDS", "duration_s", CELL_NUM},
            {"COMMIT", "git_commit", CELL_SHORT}, {"HOST", "host", CELL_STR},
            {"GPU", "gpu_name", CELL_STR},    {"CHECKPOINT", "checkpoint_path", CELL_BASE},
            {"VARIANTS", "variants", CELL_STR},
        };
        print_table(res, cols, TD_ARRAY_LEN(cols), 0);
    }
    cJSON_Delete(res);
    td_db_close(db);
    return 0;
}

/* ---- show ---- */

/* The one run named by the subcommand's single argument, in the store opened read-only. */
static int open_one_run(opts *o, td_db **db, int64_t *id)
{
    if (o->n_pos != 1) {
        errf(o->sub, "expected one run (see 'tandem db %s --help')", o->sub);
        return 2;
    }
    int rc = open_store(o, false, db);
    if (rc) return rc;
    if ((rc = resolve(o, *db, o->pos[0], id))) td_db_close(*db);
    return rc;
}

static int db_show(opts *o)
{
    td_db *db;
    int64_t id;
    int rc = open_one_run(o, &db, &id);
    if (rc) return rc;
    cJSON *res;
    td_err err;
    if (td_db_run_show(db, id, &res, &err) != TD_OK) return fail(o, db, &err);
    if (o->json) {
        print_json(res);
    } else {
        static const char *const keys[] = {
            "id", "uid", "kind", "status", "started_at", "ended_at", "duration_s", "exit_code", "message",
            "tandem_version", "git_commit", "binary_sha256", "cuda_module_sha256", "host", "cpu", "gpu_name",
            "gpu_driver", "cuda_version", "nccl_version", "checkpoint_path", "checkpoint_fingerprint",
            "checkpoint_full", "origin", "pid"};
        for (size_t i = 0; i < TD_ARRAY_LEN(keys); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(res, keys[i]);
            if (!v || cJSON_IsNull(v)) continue;
            char cell[CELL];
            table_col c = {keys[i], keys[i], CELL_STR};
            cell_text(res, &c, cell);
            printf("%-24s %s\n", keys[i], cell);
        }
        static const char *const jkeys[] = {"variants", "seeds", "command_line", "env"};
        for (size_t i = 0; i < TD_ARRAY_LEN(jkeys); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(res, jkeys[i]);
            char *t = v ? cJSON_PrintUnformatted(v) : NULL;
            if (t) printf("%-24s %s\n", jkeys[i], t);
            cJSON_free(t);
        }
        const cJSON *counts = cJSON_GetObjectItemCaseSensitive(res, "results"), *e;
        printf("results                 ");
        cJSON_ArrayForEach(e, counts) printf(" %s=%lld", e->string, (long long)e->valuedouble);
        putchar('\n');
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(res, "layer_summary");
        printf("layer comparisons        pass=%lld fail=%lld skip=%lld exact=%lld not_finite=%lld\n",
               (long long)jnum_or(ls, "pass", 0), (long long)jnum_or(ls, "fail", 0),
               (long long)jnum_or(ls, "skip", 0), (long long)jnum_or(ls, "exact", 0),
               (long long)jnum_or(ls, "not_finite", 0));
        const cJSON *bl = cJSON_GetObjectItemCaseSensitive(res, "baselines");
        if (cJSON_GetArraySize(bl) > 0) {
            printf("baseline for            ");
            cJSON_ArrayForEach(e, bl) printf(" %s", e->valuestring);
            putchar('\n');
        }
        const cJSON *fails = cJSON_GetObjectItemCaseSensitive(res, "failures");
        if (cJSON_GetArraySize(fails) > 0) {
            printf("\nfailing comparisons (first %d):\n", cJSON_GetArraySize(fails));
            static const table_col cols[] = {
                {"LAYER", "layer", CELL_NUM}, {"TAP", "tap", CELL_STR}, {"RANK", "rank", CELL_NUM},
                {"TOKENS", "tokens", CELL_NUM}, {"A", "variant_a", CELL_STR}, {"B", "variant_b", CELL_STR},
                {"EXPECT", "expectation", CELL_STR}, {"MAX_ABS", "max_abs", CELL_NUM},
                {"REL_L2", "rel_l2", CELL_NUM}, {"FIRST_DIFF", "first_diff", CELL_NUM},
            };
            print_table(fails, cols, TD_ARRAY_LEN(cols), 0);
        }
    }
    cJSON_Delete(res);
    td_db_close(db);
    return 0;
}

/* ---- completions ---- */

static const opt_spec completions_spec[] = {{"diverged", false, false}, {"tokens", false, false}};

static int db_completions(opts *o)
{
    td_db *db;
    int64_t id;
    int rc = open_one_run(o, &db, &id);
    if (rc) return rc;
    cJSON *res;
    td_err err;
    if (td_db_completions(db, id, opt_get(o, "diverged") != NULL, &res, &err) != TD_OK) return fail(o, db, &err);
    if (o->json) {
        print_json(res);
    } else {
        static const table_col cols[] = {
            {"VARIANT", "variant", CELL_STR},   {"BATCH", "batch", CELL_NUM},
            {"REQUEST", "request", CELL_STR},   {"TOKENS", "length", CELL_NUM},
            {"HASH", "hash", CELL_SHORT},       {"REFERENCE", "reference", CELL_STR},
            {"DIVERGES", "first_divergence", CELL_NUM}, {"MARGIN", "margin", CELL_NUM},
            {"REF MARGIN", "reference_margin", CELL_NUM},
        };
        print_table(res, cols, TD_ARRAY_LEN(cols), 0);
        if (opt_get(o, "tokens")) {
            const cJSON *r;
            cJSON_ArrayForEach(r, res) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "token_ids");
                char *txt = t && !cJSON_IsNull(t) ? cJSON_PrintUnformatted(t) : NULL;
                const char *v = jstr(r, "variant"), *q = jstr(r, "request");
                printf("%s b%lld %s: %s\n", v ? v : "", (long long)jnum_or(r, "batch", 0), q ? q : "",
                       txt ? txt : "(not stored)");
                cJSON_free(txt);
            }
        }
    }
    cJSON_Delete(res);
    td_db_close(db);
    return 0;
}

/* ---- compare ---- */

static const opt_spec compare_spec[] = {{"limit", true, false}};

static void flatten_cmp(cJSON *rows)
{
    /* lift a.x / b.x into "x_a" / "x_b" for the table */
    static const char *const m[] = {"exact", "rel_l2", "max_abs", "max_ulp", "verdict"};
    cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        for (int side = 0; side < 2; side++) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(r, side ? "b" : "a");
            for (size_t i = 0; i < TD_ARRAY_LEN(m); i++) {
                char k[32];
                snprintf(k, sizeof k, "%s_%c", m[i], side ? 'b' : 'a');
                const cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, m[i]) : NULL;
                cJSON_AddItemToObject(r, k, v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
            }
        }
    }
}

static int db_compare(opts *o)
{
    if (o->n_pos != 2) {
        errf(o->sub, "expected two runs: RUN_A RUN_B (see 'tandem db compare --help')");
        return 2;
    }
    long long limit;
    if (!opt_int(o, "limit", o->json ? 0 : 20, &limit)) return 2;
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    int64_t a, b;
    if ((rc = resolve(o, db, o->pos[0], &a)) || (rc = resolve(o, db, o->pos[1], &b))) { td_db_close(db); return rc; }
    cJSON *res;
    td_err err;
    if (td_db_compare(db, a, b, (size_t)limit, &res, &err) != TD_OK) return fail(o, db, &err);
    cJSON *rows = cJSON_GetObjectItemCaseSensitive(res, "layer_cmp");
    if (o->json) {
        print_json(res);
    } else {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(res, "summary");
        printf("compare run %lld (A) with run %lld (B): %lld matched, %lld worse, %lld better, %lld same; "
               "exact lost %lld, gained %lld; only in A %lld, only in B %lld\n",
               (long long)a, (long long)b, (long long)jnum_or(s, "matched", 0), (long long)jnum_or(s, "worse", 0),
               (long long)jnum_or(s, "better", 0), (long long)jnum_or(s, "same", 0),
               (long long)jnum_or(s, "exact_lost", 0), (long long)jnum_or(s, "exact_gained", 0),
               (long long)jnum_or(s, "only_a", 0), (long long)jnum_or(s, "only_b", 0));
        if (cJSON_GetArraySize(rows) > 0) {
            flatten_cmp(rows);
            printf("\nworst first%s:\n", limit > 0 ? " (--limit to see more)" : "");
            static const table_col cols[] = {
                {"TAP", "tap", CELL_STR},         {"RANK", "rank", CELL_NUM},
                {"TOKENS", "tokens", CELL_NUM},   {"A", "variant_a", CELL_STR},
                {"B", "variant_b", CELL_STR},     {"ONLY", "only_in", CELL_STR},
                {"EXACT A", "exact_a", CELL_STR}, {"EXACT B", "exact_b", CELL_STR},
                {"REL_L2 A", "rel_l2_a", CELL_NUM}, {"REL_L2 B", "rel_l2_b", CELL_NUM},
                {"MAX_ABS A", "max_abs_a", CELL_NUM}, {"MAX_ABS B", "max_abs_b", CELL_NUM},
                {"WORSE(log10)", "worse_log10", CELL_NUM},
            };
            print_table(rows, cols, TD_ARRAY_LEN(cols), 0);
        }
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(res, "quality");
        if (cJSON_GetArraySize(q) > 0) {
            printf("\nquality:\n");
            static const table_col cols[] = {
                {"SUITE", "suite", CELL_STR}, {"METRIC", "metric", CELL_STR}, {"VARIANT", "variant", CELL_STR},
                {"A", "a", CELL_NUM}, {"B", "b", CELL_NUM}, {"DELTA", "delta", CELL_NUM}};
            print_table(q, cols, TD_ARRAY_LEN(cols), 0);
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(res, "timings");
        if (cJSON_GetArraySize(t) > 0) {
            printf("\ntimings:\n");
            static const table_col cols[] = {
                {"BENCH", "bench", CELL_STR}, {"SHAPE", "shape", CELL_STR}, {"METRIC", "metric", CELL_STR},
                {"VARIANT", "variant", CELL_STR}, {"UNIT", "unit", CELL_STR}, {"A", "a", CELL_NUM},
                {"B", "b", CELL_NUM}, {"DELTA", "delta", CELL_NUM}};
            print_table(t, cols, TD_ARRAY_LEN(cols), 0);
        }
    }
    cJSON_Delete(res);
    td_db_close(db);
    return 0;
}

/* ---- baseline ---- */

static int db_baseline(opts *o)
{
    const char *action = o->n_pos > 0 ? o->pos[0] : NULL;
    if (!action) {
        errf(o->sub, "expected an action: set NAME RUN, list or rm NAME (see 'tandem db baseline --help')");
        return 2;
    }
    bool set = !strcmp(action, "set"), list = !strcmp(action, "list"), rm = !strcmp(action, "rm");
    if (!set && !list && !rm) {
        errf(o->sub, "unknown action '%s': set NAME RUN, list or rm NAME", action);
        return 2;
    }
    if ((set && o->n_pos != 3) || (list && o->n_pos != 1) || (rm && o->n_pos != 2)) {
        errf(o->sub, "usage: baseline set NAME RUN | baseline list | baseline rm NAME");
        return 2;
    }
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    td_err err;
    if (set) {
        int64_t id;
        if ((rc = resolve(o, db, o->pos[2], &id))) { td_db_close(db); return rc; }
        if (td_db_baseline_set(db, o->pos[1], id, &err) != TD_OK) return fail(o, db, &err);
        if (o->json) printf("{\"name\": \"%s\", \"run\": %lld}\n", o->pos[1], (long long)id);
        else printf("baseline '%s' -> run %lld\n", o->pos[1], (long long)id);
    } else if (rm) {
        if (td_db_baseline_remove(db, o->pos[1], &err) != TD_OK) return fail(o, db, &err);
        if (!o->json) printf("baseline '%s' removed\n", o->pos[1]);
        else printf("{\"removed\": \"%s\"}\n", o->pos[1]);
    } else {
        cJSON *res;
        if (td_db_baseline_list(db, &res, &err) != TD_OK) return fail(o, db, &err);
        if (o->json) print_json(res);
        else if (cJSON_GetArraySize(res) == 0) printf("no baselines in %s\n", td_db_path(db));
        else {
            static const table_col cols[] = {
                {"NAME", "name", CELL_STR}, {"RUN", "run", CELL_NUM}, {"UID", "run_uid", CELL_UID},
                {"KIND", "kind", CELL_STR}, {"STATUS", "status", CELL_STR}, {"COMMIT", "git_commit", CELL_SHORT},
                {"SET AT (UTC)", "set_at", CELL_TIME}};
            print_table(res, cols, TD_ARRAY_LEN(cols), 0);
        }
        cJSON_Delete(res);
    }
    td_db_close(db);
    return 0;
}

/* ---- regress ---- */

static const opt_spec regress_spec[] = {
    {"baseline", true, false}, {"run", true, false}, {"threshold", true, true},
    {"require-all", false, false}, {"limit", true, false},
};

static int db_regress(opts *o)
{
    const char *bname = opt_get(o, "baseline"), *run = opt_get(o, "run");
    if (!bname || !run) {
        errf(o->sub, "--baseline NAME and --run RUN are required (see 'tandem db regress --help')");
        return 2;
    }
    long long limit;
    if (!opt_int(o, "limit", 50, &limit)) return 2;
    td_db_thresholds th;
    td_db_thresholds_default(&th);
    const char *const *tv;
    int nt = opt_multi(o, "threshold", &tv);
    td_err err;
    for (int i = 0; i < nt; i++)
        if (td_db_threshold_parse(&th, tv[i], &err) != TD_OK) {
            errf(o->sub, "%s", err.msg);
            return 2;
        }
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    td_db_regress_opts ro = {0, 0, &th, opt_get(o, "require-all") != NULL, bname};
    if (td_db_baseline_get(db, bname, &ro.baseline_run, &err) != TD_OK) return fail(o, db, &err);
    if ((rc = resolve(o, db, run, &ro.run))) { td_db_close(db); return rc; }
    cJSON *res;
    int64_t nreg;
    if (td_db_regress(db, &ro, &res, &nreg, &err) != TD_OK) return fail(o, db, &err);
    if (o->json) {
        print_json(res);
    } else {
        printf("regress: run %lld against baseline '%s' (run %lld): %lld results compared, %lld missing, %lld new\n",
               (long long)ro.run, bname, (long long)ro.baseline_run, (long long)jnum_or(res, "compared", 0),
               (long long)jnum_or(res, "missing", 0), (long long)jnum_or(res, "new", 0));
        if (nreg == 0) {
            printf("OK: no regressions\n");
        } else {
            printf("REGRESSED: %lld result(s)%s\n", (long long)nreg,
                   limit && nreg > limit ? " (--limit to see more)" : "");
            const cJSON *f, *rows = cJSON_GetObjectItemCaseSensitive(res, "regressions");
            long long shown = 0;
            cJSON_ArrayForEach(f, rows) { /* the result, then one indented line per reason */
                if (limit && shown++ >= limit) break;
                printf("  %s  %s\n", jstr(f, "table"), jstr(f, "key"));
                const cJSON *r;
                cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(f, "reasons"))
                    printf("      %s\n", r->valuestring);
            }
        }
    }
    cJSON_Delete(res);
    td_db_close(db);
    return nreg > 0 ? 1 : 0;
}

/* ---- trend ---- */

static const opt_spec trend_spec[] = {
    {"metric", true, false}, {"where", true, true},        {"agg", true, false},
    {"by", true, false},     {"window", true, false},      {"min-history", true, false},
    {"status", true, false}, {"fail-on-step", false, false},
};

static int db_trend(opts *o)
{
    const char *by = opt_get(o, "by");
    if (by && strcmp(by, "time") && strcmp(by, "commit")) {
        errf(o->sub, "--by '%s': time or commit", by);
        return 2;
    }
    if (!opt_get(o, "metric")) {
        errf(o->sub, "--metric is required (see 'tandem db trend --help')");
        return 2;
    }
    long long window, minh;
    if (!opt_int(o, "window", 8, &window) || !opt_int(o, "min-history", 3, &minh)) return 2;
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    const char *const *where;
    int nw = opt_multi(o, "where", &where);
    td_db_trend_opts to = {opt_get(o, "metric"), where, (size_t)nw, opt_get(o, "agg"),
                           by && !strcmp(by, "commit"), (int)window, (int)minh, opt_get(o, "status")};
    cJSON *res;
    td_err err;
    if (td_db_trend(db, &to, &res, &err) != TD_OK) return fail(o, db, &err);
    const cJSON *pts = cJSON_GetObjectItemCaseSensitive(res, "points");
    int np = cJSON_GetArraySize(pts);
    const cJSON *last = np ? cJSON_GetArrayItem(pts, np - 1) : NULL;
    bool last_step = last && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(last, "step"));
    if (o->json) {
        print_json(res);
    } else if (np == 0) {
        printf("no runs have %s for these filters\n", to.metric);
    } else {
        printf("%s(%s) over %d %s, change detection: window %lld, min history %lld\n",
               jstr(res, "agg"), jstr(res, "metric"), np, to.by_commit ? "commits" : "runs", window, minh);
        cJSON *p;
        cJSON_ArrayForEach(p, (cJSON *)pts) {
            double d;
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "step")) && jnum(p, "value", &d)) {
                char note[128];
                snprintf(note, sizeof note, "<- step from %.4g (spread %.3g)", jnum_or(p, "median_before", 0),
                         jnum_or(p, "spread_before", 0));
                cJSON_AddStringToObject(p, "note", note);
            }
        }
        static const table_col cols[] = {
            {"RUN", "run", CELL_NUM}, {"UID", "uid", CELL_UID}, {"STARTED (UTC)", "started_at", CELL_TIME},
            {"COMMIT", "commit", CELL_SHORT}, {"VALUE", "value", CELL_NUM}, {"ROWS", "rows", CELL_NUM},
            {"", "note", CELL_STR}};
        print_table(pts, cols, TD_ARRAY_LEN(cols), 0);
        printf("%d step(s)\n", (int)jnum_or(res, "n_steps", 0));
    }
    cJSON_Delete(res);
    td_db_close(db);
    return opt_get(o, "fail-on-step") && last_step ? 1 : 0;
}

/* ---- export / import / merge ---- */

static const opt_spec export_spec[] = {
    {"run", true, true}, {"format", true, false}, {"table", true, false}, {"out", true, false},
};

static int db_export(opts *o)
{
    const char *const *refs;
    int nr = opt_multi(o, "run", &refs);
    const char *fmt = opt_get(o, "format") ? opt_get(o, "format") : "json";
    if (nr == 0) {
        errf(o->sub, "--run RUN is required (repeat it for several runs)");
        return 2;
    }
    if (strcmp(fmt, "json") && strcmp(fmt, "csv")) {
        errf(o->sub, "--format '%s': json or csv", fmt);
        return 2;
    }
    if (opt_get(o, "table") && strcmp(fmt, "csv")) {
        errf(o->sub, "--table applies to --format csv only");
        return 2;
    }
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    int64_t ids[MAX_MULTI];
    for (int i = 0; i < nr; i++)
        if ((rc = resolve(o, db, refs[i], &ids[i]))) { td_db_close(db); return rc; }
    const char *out = opt_get(o, "out");
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        errf(o->sub, "%s: %s", out, strerror(errno));
        td_db_close(db);
        return 2;
    }
    td_err err;
    td_status s = !strcmp(fmt, "json") ? td_db_export_json(db, ids, (size_t)nr, f, &err)
                                       : td_db_export_csv(db, ids, (size_t)nr, opt_get(o, "table"), f, &err);
    if (out && fclose(f) != 0 && s == TD_OK) s = td_err_set(&err, TD_ERR_IO, "%s: %s", out, strerror(errno));
    if (s != TD_OK) {
        if (out) unlink(out);
        return fail(o, db, &err);
    }
    if (out) fprintf(stderr, "exported %d run(s) to %s\n", nr, out);
    td_db_close(db);
    return 0;
}

static void print_stats(const opts *o, const char *verb, const char *src, const td_db_transfer_stats *st)
{
    if (o->json) {
        printf("{\"runs_added\": %lld, \"runs_present\": %lld, \"runs_running\": %lld, \"rows_added\": %lld, "
               "\"baselines_added\": %lld, \"baselines_conflicting\": %lld}\n",
               (long long)st->runs_added, (long long)st->runs_present, (long long)st->runs_running,
               (long long)st->rows_added, (long long)st->baselines_added, (long long)st->baselines_conflicting);
        return;
    }
    printf("%s %s: %lld run(s) added with %lld result row(s); %lld already present; %lld still running "
           "(skipped)", verb, src, (long long)st->runs_added, (long long)st->rows_added,
           (long long)st->runs_present, (long long)st->runs_running);
    if (st->baselines_added || st->baselines_conflicting)
        printf("; baselines: %lld added, %lld kept (name taken)", (long long)st->baselines_added,
               (long long)st->baselines_conflicting);
    putchar('\n');
}

/* import and merge: one source argument, transferred into the store by `transfer`. */
typedef td_status (*transfer_fn)(td_db *db, const char *src, td_db_transfer_stats *st, td_err *err);

static int db_transfer(opts *o, const char *what, const char *verb, transfer_fn transfer)
{
    if (o->n_pos != 1) {
        errf(o->sub, "expected one %s (see 'tandem db %s --help')", what, o->sub);
        return 2;
    }
    td_db *db;
    int rc = open_store(o, true, &db);
    if (rc) return rc;
    td_db_transfer_stats st;
    td_err err;
    if (transfer(db, o->pos[0], &st, &err) != TD_OK) return fail(o, db, &err);
    print_stats(o, verb, o->pos[0], &st);
    td_db_close(db);
    return 0;
}

static int db_import(opts *o) { return db_transfer(o, "FILE.json", "imported", td_db_import_json); }

static int db_merge(opts *o) { return db_transfer(o, "OTHER.db", "merged", td_db_merge); }

/* ---- info ---- */

static const opt_spec info_spec[] = {{"check", false, false}};

static int db_info(opts *o)
{
    td_db *db;
    int rc = open_store(o, false, &db);
    if (rc) return rc;
    bool check = opt_get(o, "check") != NULL;
    cJSON *res;
    td_err err;
    td_status s = td_db_info(db, check, &res, &err);
    if (s == TD_ERR_MISMATCH || s == TD_ERR_FORMAT) { /* the check itself failed */
        errf(o->sub, "%s", err.msg);
        td_db_close(db);
        return 1;
    }
    if (s != TD_OK) return fail(o, db, &err);
    const cJSON *ic = cJSON_GetObjectItemCaseSensitive(res, "integrity_check");
    bool ok = !check || (cJSON_GetArraySize(ic) == 1 && !strcmp(cJSON_GetArrayItem(ic, 0)->valuestring, "ok"));
    if (o->json) {
        print_json(res);
    } else {
        printf("store           %s\n", jstr(res, "path"));
        printf("schema version  %lld (this tandem: %lld)\n", (long long)jnum_or(res, "schema_version", 0),
               (long long)jnum_or(res, "schema_version_supported", 0));
        printf("size            %.1f MiB (SQLite %s, journal mode %s)\n", jnum_or(res, "size_bytes", 0) / 1048576.0,
               jstr(res, "sqlite_version"), jstr(res, "journal_mode") ? jstr(res, "journal_mode") : "?");
        printf("runs            %lld:", (long long)jnum_or(res, "runs", 0));
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(res, "runs_by_status"))
            printf(" %s=%lld", e->string, (long long)e->valuedouble);
        printf("\nrows           ");
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(res, "rows"))
            printf(" %s=%lld", e->string, (long long)e->valuedouble);
        printf("\nbaselines       %lld\n", (long long)jnum_or(res, "baselines", 0));
        if (check) {
            printf("integrity check ");
            cJSON_ArrayForEach(e, ic) printf("%s\n%s", e->valuestring, e->next ? "                " : "");
        }
    }
    cJSON_Delete(res);
    td_db_close(db);
    return ok ? 0 : 1;
}

/* ==== dispatch =============================================================================== */

static const subcmd subcmds[] = {
    {"runs", db_runs, runs_spec, TD_ARRAY_LEN(runs_spec), 0, "list runs, newest first",
     "usage: tandem db runs [--kind KIND] [--status STATUS] [--checkpoint FP|PATH] [--since WHEN]\n"
     "                      [--host HOST] [--commit PREFIX] [--gpu GPU] [--limit N] [--json]\n\n"
     "  --kind KIND        run kind, or a glob such as 'audit.*'\n"
     "  --status STATUS    running, ok, failed or aborted\n"
     "  --checkpoint X     checkpoint fingerprint prefix, or part of its path\n"
     "  --since WHEN       YYYY-MM-DD[THH:MM[:SS]] (UTC) or an age: 30m, 12h, 7d, 2w\n"
     "  --host HOST        runs of one host\n"
     "  --commit PREFIX    runs built from a git commit\n"
     "  --gpu GPU          runs on a GPU of that name, or a glob such as 'NVIDIA H200*'\n"
     "  --limit N          at most N runs (default 50; 0: all)\n"},
    {"show", db_show, NULL, 0, 1, "everything about one run",
     "usage: tandem db show RUN [--json]\n\n"
     "RUN is a run id, a uid or uid prefix (>= 4 characters), 'latest' or 'latest:KIND'.\n"
     "Shows provenance, result counts, the layer verdict summary, the first failing\n"
     "comparisons and the baselines that point at the run.\n"},
    {"completions", db_completions, completions_spec, TD_ARRAY_LEN(completions_spec), 1,
     "the completions of a `tandem run`: hashes, divergences, margins, token ids",
     "usage: tandem db completions RUN [--diverged] [--tokens] [--json]\n\n"
     "One row per completion (variant, batch width, request): length, hash, the variant it was\n"
     "compared with, the first position where it differs (empty when equal) and the top-1\n"
     "minus top-2 logit margin of this variant and of the reference there.\n\n"
     "  --diverged   only completions that differ from their reference\n"
     "  --tokens     also print each completion's token ids (stored from schema version 4)\n"},
    {"compare", db_compare, compare_spec, TD_ARRAY_LEN(compare_spec), 2, "metric deltas between two runs",
     "usage: tandem db compare RUN_A RUN_B [--limit N] [--json]\n\n"
     "Matches layer comparisons by (tap, rank, tokens, variant pair) and lists A's and B's\n"
     "metrics, sorted by how much worse B is: lost exactness first, then lost finiteness,\n"
     "a pass turned fail, then WORSE: the largest log10 growth of the error amplitude among\n"
     "max_abs, rel_l2, sqrt(nmse) and sqrt(1 - cosine) (1 = ten times worse).\n"
     "Quality scores and timings present in both runs are listed with their deltas.\n\n"
     "  --limit N   rows to show (default 20; 0: all; with --json default all)\n"},
    {"baseline", db_baseline, NULL, 0, 3, "name a run as a baseline; list or remove names",
     "usage: tandem db baseline set NAME RUN\n"
     "       tandem db baseline list [--json]\n"
     "       tandem db baseline rm NAME\n\n"
     "NAME is [A-Za-z0-9._-]{1,64}; setting an existing name moves it to RUN.\n"},
    {"regress", db_regress, regress_spec, TD_ARRAY_LEN(regress_spec), 0,
     "check a run against a baseline (exit 1 on regression)",
     "usage: tandem db regress --baseline NAME --run RUN [--threshold METRIC=SPEC]...\n"
     "                         [--require-all] [--limit N] [--json]\n\n"
     "Exits 1 when the run regressed against the baseline, 0 when not, 2 on errors.\n"
     "A result regresses when\n"
     "  - an exact expectation that held in the baseline now fails, a finite result turns\n"
     "    non-finite, or a verdict goes pass -> fail;\n"
     "  - a gated metric grows: run - baseline > max(abs, rel * |baseline|)\n"
     "    (cosine is compared as 1 - cosine);\n"
     "  - an encoding check loses exactness, a completion that matched its reference now\n"
     "    diverges, a quality score fails its gate that the baseline passed;\n"
     "  - timings, only with --threshold timing=...: a move in the bad direction.\n"
     "A run that did not end 'ok' is itself a regression.\n\n"
     "  --threshold METRIC=SPEC   override a default; METRIC is max_abs, rel_l2, nmse, max_ulp,\n"
     "                            mismatches, cosine or timing; SPEC is comma-separated parts\n"
     "                            rel:X, abs:X, X% (relative), X (relative) or off.\n"
     "                            Defaults: max_abs rel 0.5 abs 1e-6; rel_l2 rel 0.25 abs 1e-7;\n"
     "                            nmse rel 0.5 abs 1e-14; max_ulp rel 0.5 abs 2; cosine rel 0.5\n"
     "                            abs 1e-9; mismatches and timing off (timing=X: rel 0.05).\n"
     "  --require-all             results of the baseline missing from the run regress too\n"
     "  --limit N                 findings to print (default 50; 0: all)\n"},
    {"trend", db_trend, trend_spec, TD_ARRAY_LEN(trend_spec), 0, "one metric over runs, with change detection",
     "usage: tandem db trend --metric [TABLE.]COLUMN [--where KEY=VALUE]... [--agg max|min|mean|sum|count]\n"
     "                       [--by time|commit] [--window N] [--min-history N] [--status S|any]\n"
     "                       [--fail-on-step] [--json]\n\n"
     "One value per run (or per commit with --by commit): the aggregate (default max) of the\n"
     "metric over the run's rows that match the filters. TABLE is layer (default), encoding,\n"
     "census, completion, quality or timing; COLUMN one of its numeric columns, e.g. nmse,\n"
     "rel_l2, max_abs, max_ulp, mismatches, quality.value, timing.value.\n"
     "KEY is a column of that table (tap, layer, rank, tokens, variant_a, variant_b, dtype,\n"
     "suite, metric, bench, shape, ...) or of the run (kind, host, commit, checkpoint,\n"
     "gpu_name, tandem_version); text values may be globs ('L*.moe.out').\n"
     "A point is a step when it differs from the median of the preceding points of its regime\n"
     "(at most --window, default 8, at least --min-history, default 3) by more than their\n"
     "spread (max - min). Only runs with status ok count unless --status says otherwise.\n\n"
     "  --fail-on-step   exit 1 when the newest point is a step\n"},
    {"export", db_export, export_spec, TD_ARRAY_LEN(export_spec), 0, "write runs as JSON or CSV",
     "usage: tandem db export --run RUN [--run RUN]... [--format json|csv] [--table TABLE] [--out FILE]\n\n"
     "JSON (default) holds the runs with all provenance and every result table and is what\n"
     "'tandem db import' reads. CSV holds one result table (--table: layer_cmp (default),\n"
     "encoding_checks, scale_census, completions, quality, timings) with a run_uid column.\n"},
    {"import", db_import, NULL, 0, 1, "add runs from a JSON export",
     "usage: tandem db import FILE.json [--json]\n\n"
     "Adds the runs of a 'tandem db export' file (for example from another machine). Runs\n"
     "already present (same uid) and runs still running are skipped, so importing twice\n"
     "changes nothing. The whole file is one transaction.\n"},
    {"merge", db_merge, NULL, 0, 1, "add the runs of another store",
     "usage: tandem db merge OTHER.db [--json]\n\n"
     "Copies the runs (with all results) of OTHER.db that this store lacks, matched by uid,\n"
     "and baselines whose names are free here. OTHER.db is opened read-only and never\n"
     "changed; runs still running there are skipped; merging again changes nothing.\n"},
    {"info", db_info, info_spec, TD_ARRAY_LEN(info_spec), 0, "store path, schema version, sizes",
     "usage: tandem db info [--check] [--json]\n\n"
     "  --check   run SQLite's integrity check and verify the schema (exit 1 on a problem)\n"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tandem db [--db PATH] <subcommand> [options]\n\n"
               "Query and maintain the results store: one SQLite file (--db PATH, else $TANDEM_DB,\n"
               "else ./tandem.db) with every run, its provenance and its results.\n\nsubcommands:\n");
    for (size_t i = 0; i < TD_ARRAY_LEN(subcmds); i++)
        fprintf(f, "  %-10s %s\n", subcmds[i].name, subcmds[i].summary);
    fprintf(f, "\nEvery subcommand takes --db PATH, --json (machine output) and --help.\n"
               "Exit status: 0 ok, 1 a check found a problem (regression, integrity), 2 usage or input error.\n"
               "docs/db.md describes the schema.\n");
}

int cmd_db(int argc, char **argv)
{
    /* global options before the subcommand: --db PATH, --json, --help */
    const char *db_path = NULL;
    bool json = false;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        if (!strcmp(argv[i], "--json")) { json = true; continue; }
        if (!strcmp(argv[i], "--db")) {
            if (i + 1 >= argc) { errf(NULL, "option '--db' needs a value"); return 2; }
            db_path = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], "--db=", 5)) { db_path = argv[i] + 5; continue; }
        if (argv[i][0] == '-') { errf(NULL, "unknown option '%s' (see 'tandem db --help')", argv[i]); return 2; }
        break;
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const subcmd *sc = NULL;
    for (size_t k = 0; k < TD_ARRAY_LEN(subcmds); k++)
        if (!strcmp(argv[i], subcmds[k].name)) sc = &subcmds[k];
    if (!sc) {
        errf(NULL, "unknown subcommand '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    opts *o = calloc(1, sizeof *o);
    if (!o) { errf(sc->name, "out of memory"); return 2; }
    o->sub = sc->name;
    o->spec = sc->spec;
    o->n_spec = sc->n_spec;
    o->db = db_path;
    o->json = json;
    TD_ASSERT(sc->n_spec <= MAX_OPTS);
    int rc = opts_parse(o, argc - i - 1, argv + i + 1, sc->max_pos);
    if (rc == 0 && o->help) {
        printf("%s\n%s", sc->summary, sc->help);
        printf("\nCommon options: --db PATH (default $TANDEM_DB, else ./tandem.db), --json, --help.\n");
    } else if (rc == 0) {
        rc = sc->fn(o);
    }
    free(o);
    return rc;
}
