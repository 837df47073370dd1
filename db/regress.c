/* regress.c — baselines, regression checks against a baseline, and metric trends with change
 * detection (query.h). */
#include "db_int.h"
#include "query.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_status nomem(td_err *err) { return td_err_set(err, TD_ERR_NOMEM, "out of memory"); }

/* ==== baselines ============================================================================== */

static bool name_valid(const char *n)
{
    if (!n || !*n || strlen(n) > 64) return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

td_status td_db_baseline_set(td_db *db, const char *name, int64_t run_id, td_err *err)
{
    if (!name_valid(name))
        return td_err_set(err, TD_ERR_ARG, "baseline name '%s' is not [A-Za-z0-9._-]{1,64}", name ? name : "");
    char uid[TD_DB_UID_LEN + 1], now[TD_PROV_TIME_LEN + 1];
    td_status s = td_db_run_uid(db, run_id, uid, err);
    if (s != TD_OK) return s;
    td_prov_now_iso(now);
    sqlite3_stmt *st;
    s = td_db_prepare(db,
                      "INSERT INTO baselines (name, run_uid, set_at) VALUES (?1, ?2, ?3) "
                      "ON CONFLICT (name) DO UPDATE SET run_uid = excluded.run_uid, set_at = excluded.set_at",
                      &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, now, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

td_status td_db_baseline_get(td_db *db, const char *name, int64_t *run_id, td_err *err)
{
    *run_id = 0;
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, "SELECT r.id FROM baselines b JOIN runs r ON r.uid = b.run_uid "
                                    "WHERE b.name = ?1", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *run_id = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        s = td_err_set(err, TD_ERR_NOTFOUND, "no baseline named '%s' in %s ('tandem db baseline list')",
                       name, db->path);
    else s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

td_status td_db_baseline_remove(td_db *db, const char *name, td_err *err)
{
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, "DELETE FROM baselines WHERE name = ?1", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    else if (sqlite3_changes(db->h) == 0)
        s = td_err_set(err, TD_ERR_NOTFOUND, "no baseline named '%s' in %s", name, db->path);
    sqlite3_finalize(st);
    return s;
}

td_status td_db_baseline_list(td_db *db, cJSON **out, td_err *err)
{
    *out = NULL;
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db,
                                "SELECT b.name, r.id AS run, b.run_uid, b.set_at, r.kind, r.status, "
                                "r.started_at, r.git_commit FROM baselines b JOIN runs r ON "
                                "r.uid = b.run_uid ORDER BY b.name", &st, err);
    if (s != TD_OK) return s;
    cJSON *arr = cJSON_CreateArray();
    int rc;
    while (arr && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        cJSON *o = cJSON_CreateObject();
        td_db_row_json(st, 0, o);
        cJSON_AddItemToArray(arr, o);
    }
    if (!arr) s = nomem(err);
    else if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    if (s != TD_OK) { cJSON_Delete(arr); return s; }
    *out = arr;
    return TD_OK;
}

/* ==== thresholds ============================================================================= */

static const struct {
    const char *name;
    td_db_threshold def;
} metric_defs[TD_DB_M_COUNT] = {
    [TD_DB_M_MAX_ABS] = {"max_abs", {true, 0.5, 1e-6}},
    [TD_DB_M_REL_L2] = {"rel_l2", {true, 0.25, 1e-7}},
    [TD_DB_M_NMSE] = {"nmse", {true, 0.5, 1e-14}},
    [TD_DB_M_MAX_ULP] = {"max_ulp", {true, 0.5, 2.0}},
    [TD_DB_M_MISMATCHES] = {"mismatches", {false, 0.0, 0.0}},
    [TD_DB_M_COSINE] = {"cosine", {true, 0.5, 1e-9}},
    [TD_DB_M_TIMING] = {"timing", {false, 0.05, 0.0}},
};

const char *td_db_metric_name(td_db_metric m)
{
    return (unsigned)m < TD_DB_M_COUNT ? metric_defs[m].name : NULL;
}

void td_db_thresholds_default(td_db_thresholds *t)
{
    for (int m = 0; m < TD_DB_M_COUNT; m++) t->m[m] = metric_defs[m].def;
}

static bool parse_num(const char *s, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || *end || !isfinite(v) || v < 0) return false;
    *out = v;
    return true;
}

td_status td_db_threshold_parse(td_db_thresholds *t, const char *arg, td_err *err)
{
    const char *eq = arg ? strchr(arg, '=') : NULL;
    if (!eq)
        return td_err_set(err, TD_ERR_ARG, "--threshold '%s': expected METRIC=SPEC, e.g. rel_l2=rel:0.1,abs:1e-7",
                          arg ? arg : "");
    int m = -1;
    for (int i = 0; i < TD_DB_M_COUNT; i++)
        if ((size_t)(eq - arg) == strlen(metric_defs[i].name) && !strncmp(arg, metric_defs[i].name, (size_t)(eq - arg)))
            m = i;
    if (m < 0)
        return td_err_set(err, TD_ERR_ARG,
                          "--threshold '%s': unknown metric (one of max_abs, rel_l2, nmse, max_ulp, "
                          "mismatches, cosine, timing)", arg);
    td_db_threshold th = t->m[m];
    th.gated = true;
    const char *p = eq + 1;
    if (!*p) return td_err_set(err, TD_ERR_ARG, "--threshold '%s': empty SPEC", arg);
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        double v;
        if (len == 3 && !strncmp(p, "off", 3)) {
            th.gated = false;
        } else if (len > 4 && !strncmp(p, "rel:", 4) && parse_num(p + 4, len - 4, &v)) {
            th.rel = v;
        } else if (len > 4 && !strncmp(p, "abs:", 4) && parse_num(p + 4, len - 4, &v)) {
            th.abs = v;
        } else if (len > 1 && p[len - 1] == '%' && parse_num(p, len - 1, &v)) {
            th.rel = v / 100.0;
        } else if (parse_num(p, len, &v)) {
            th.rel = v;
        } else {
            return td_err_set(err, TD_ERR_ARG,
                              "--threshold '%s': bad part '%.*s' (use rel:X, abs:X, X%%, X or off; X >= 0)",
                              arg, (int)len, p);
        }
        p += len;
        if (*p == ',') p++;
    }
    t->m[m] = th;
    return TD_OK;
}

/* ==== regress ================================================================================ */

typedef struct reg_ctx {
    const td_db_thresholds *th;
    cJSON *findings;
    int64_t compared, missing, added, n_reg;
    bool require_all;
} reg_ctx;

static cJSON *finding(reg_ctx *c, const char *table, const char *key)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "table", table);
    cJSON_AddStringToObject(f, "key", key);
    cJSON_AddArrayToObject(f, "reasons");
    cJSON_AddItemToArray(c->findings, f);
    c->n_reg++;
    return f;
}

static void reason(cJSON *f, const char *fmt, ...) TD_PRINTF(2, 3);
static void reason(cJSON *f, const char *fmt, ...)
{
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(f, "reasons"), cJSON_CreateString(b));
}

/* Growth test: cand - base > max(abs, rel * |base|) for a higher-is-worse quantity. */
static bool grew(const td_db_threshold *t, double base, double cand)
{
    double allowed = fmax(t->abs, t->rel * fabs(base));
    return cand - base > allowed;
}

static td_status reg_layer_cb(void *vctx, const td_db_lpair *p, td_err *err)
{
    (void)err;
    reg_ctx *c = vctx;
    if (!p->a.present) { c->added++; return TD_OK; }
    char key[512];
    td_db_lpair_key(p, key, sizeof key);
    if (!p->b.present) {
        c->missing++;
        if (c->require_all) reason(finding(c, "layer_cmp", key), "missing from the run");
        return TD_OK;
    }
    c->compared++;
    const td_db_lside *a = &p->a, *b = &p->b;
    cJSON *f = NULL;
#define FIND() (f ? f : (f = finding(c, "layer_cmp", key)))
    if (a->exact && !b->exact && b->expect_exact)
        reason(FIND(), "exact expectation held and now fails (first difference at %lld)", (long long)b->first_diff);
    if (a->finite && !b->finite) reason(FIND(), "was finite, now has non-finite values");
    if (a->verdict == 'p' && b->verdict == 'f') reason(FIND(), "verdict pass -> fail");
    for (int m = 0; m < 6; m++) {
        const td_db_threshold *t = &c->th->m[m];
        if (!t->gated || !a->has[m] || !b->has[m]) continue;
        double base = a->m[m], cand = b->m[m];
        if (m == TD_DB_M_COSINE) { base = 1.0 - base; cand = 1.0 - cand; }
        if (grew(t, base, cand)) {
            char pct[32] = "";
            if (base != 0) snprintf(pct, sizeof pct, "+%.0f%%; ", 100.0 * (cand - base) / fabs(base));
            reason(FIND(), "%s%s %.4g -> %.4g (%sallowed +max(%.3g, %.3g%%))", m == TD_DB_M_COSINE ? "1 - " : "",
                   td_db_metric_name((td_db_metric)m), base, cand, pct, t->abs, 100.0 * t->rel);
        }
    }
#undef FIND
    return TD_OK;
}

/* Count baseline rows of table t that have no match in the candidate. */
static td_status count_missing(td_db *db, const td_db_table *t, int64_t base, int64_t cand, int64_t *n,
                               td_err *err)
{
    char sql[1024];
    size_t o = (size_t)snprintf(sql, sizeof sql,
                                "SELECT count(*) FROM %s a WHERE a.run_id = ?1 AND NOT EXISTS (SELECT 1 "
                                "FROM %s b WHERE b.run_id = ?2", t->name, t->name);
    for (size_t k = 0; k < t->n_key && o < sizeof sql; k++)
        o += (size_t)snprintf(sql + o, sizeof sql - o, " AND b.%s = a.%s", t->cols[k].name, t->cols[k].name);
    if (o + 2 >= sizeof sql) return td_err_set(err, TD_ERR_INTERNAL, "query too long");
    strcat(sql, ")");
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, sql, &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, base);
    sqlite3_bind_int64(st, 2, cand);
    int rc = sqlite3_step(st);
    *n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    if (rc != SQLITE_ROW) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

/* Run one joined query over baseline (?1) and candidate (?2) rows; each row: key text,
 * then the values the rule needs; `rule` decides and writes reasons. */
typedef void (*row_rule)(reg_ctx *c, sqlite3_stmt *st);

static td_status reg_query(td_db *db, reg_ctx *c, const char *sql, int64_t base, int64_t cand, row_rule rule,
                           td_err *err)
{
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, sql, &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, base);
    sqlite3_bind_int64(st, 2, cand);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        c->compared++;
        rule(c, st);
    }
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

static const char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

static void rule_encoding(reg_ctx *c, sqlite3_stmt *st)
{
    /* key, base exact, cand exact, base verdict, cand verdict */
    bool be = sqlite3_column_int(st, 1), ce = sqlite3_column_int(st, 2);
    const char *bv = col_text(st, 3), *cv = col_text(st, 4);
    if ((be && !ce) || (!strcmp(bv, "pass") && !strcmp(cv, "fail"))) {
        cJSON *f = finding(c, "encoding_checks", col_text(st, 0));
        if (be && !ce) reason(f, "was exact, now %lld mismatches", (long long)sqlite3_column_int64(st, 5));
        if (!strcmp(bv, "pass") && !strcmp(cv, "fail")) reason(f, "verdict pass -> fail");
    }
}

static void rule_completion(reg_ctx *c, sqlite3_stmt *st)
{
    /* key, base first_divergence (NULL = matched), cand first_divergence, cand reference */
    if (sqlite3_column_type(st, 1) == SQLITE_NULL && sqlite3_column_type(st, 2) != SQLITE_NULL) {
        cJSON *f = finding(c, "completions", col_text(st, 0));
        reason(f, "matched %s, now diverges at token %lld", col_text(st, 3),
               (long long)sqlite3_column_int64(st, 2));
    }
}

static void rule_quality(reg_ctx *c, sqlite3_stmt *st)
{
    /* key, base pass (NULL: none/no gate), cand pass, cand value, threshold, higher_is_better */
    bool base_failed = sqlite3_column_type(st, 1) != SQLITE_NULL && sqlite3_column_int(st, 1) == 0;
    if (sqlite3_column_type(st, 2) != SQLITE_NULL && sqlite3_column_int(st, 2) == 0 && !base_failed) {
        cJSON *f = finding(c, "quality", col_text(st, 0));
        reason(f, "%.4g fails its gate (%s %.4g)", sqlite3_column_double(st, 3),
               sqlite3_column_int(st, 5) ? ">=" : "<=", sqlite3_column_double(st, 4));
    }
}

static void rule_timing(reg_ctx *c, sqlite3_stmt *st)
{
    /* key, base value, cand value, higher_is_better, unit */
    if (sqlite3_column_type(st, 1) == SQLITE_NULL || sqlite3_column_type(st, 2) == SQLITE_NULL) return;
    double b = sqlite3_column_double(st, 1), v = sqlite3_column_double(st, 2);
    bool hib = sqlite3_column_int(st, 3) != 0;
    const td_db_threshold *t = &c->th->m[TD_DB_M_TIMING];
    if (hib ? grew(t, -b, -v) : grew(t, b, v)) {
        cJSON *f = finding(c, "timings", col_text(st, 0));
        reason(f, "%.4g -> %.4g %s (%s is better; allowed change max(%.3g, %.3g%%))", b, v, col_text(st, 4),
               hib ? "higher" : "lower", t->abs, 100.0 * t->rel);
    }
}

td_status td_db_regress(td_db *db, const td_db_regress_opts *o, cJSON **out, int64_t *n_regressions,
                        td_err *err)
{
    *out = NULL;
    *n_regressions = 0;
    td_db_thresholds defaults;
    td_db_thresholds_default(&defaults);
    reg_ctx c;
    memset(&c, 0, sizeof c);
    c.th = o->thresholds ? o->thresholds : &defaults;
    c.require_all = o->require_all;

    cJSON *res = cJSON_CreateObject();
    if (!res) return nomem(err);
    c.findings = cJSON_CreateArray();
    td_status s = TD_OK;

    /* both runs: statuses and identities */
    cJSON *runs[2] = {cJSON_AddObjectToObject(res, "baseline"), cJSON_AddObjectToObject(res, "run")};
    int64_t ids[2] = {o->baseline_run, o->run};
    char cand_status[16] = "", gpu[2][256] = {"", ""};
    for (int i = 0; i < 2 && s == TD_OK; i++) {
        sqlite3_stmt *st;
        s = td_db_prepare(db, "SELECT id, uid, kind, status, started_at, git_commit, gpu_name FROM runs WHERE id = ?1",
                          &st, err);
        if (s != TD_OK) break;
        sqlite3_bind_int64(st, 1, ids[i]);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            td_db_row_json(st, 0, runs[i]);
            if (i == 1) snprintf(cand_status, sizeof cand_status, "%s", col_text(st, 3));
            snprintf(gpu[i], sizeof gpu[i], "%s", col_text(st, 6));
        } else {
            s = rc == SQLITE_DONE ? td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)ids[i])
                                  : td_db_sqlerr(db->h, rc, err, db->path);
        }
        sqlite3_finalize(st);
    }
    if (s == TD_OK && o->baseline_name) cJSON_AddStringToObject(runs[0], "name", o->baseline_name);
    if (s == TD_OK && !strcmp(cand_status, "running"))
        s = td_err_set(err, TD_ERR_ARG, "run %lld is still running; check it once it has ended", (long long)o->run);
    if (s == TD_OK && strcmp(cand_status, "ok"))
        reason(finding(&c, "runs", "status"), "the run ended '%s', not 'ok'", cand_status);
    /* timings of two GPUs are not one series: gated, they would regress (or pass) by the
     * hardware, so they are not compared and that is the finding; runs that name no GPU (CPU
     * runs, stores before GPUs were recorded) are compared as before */
    const bool other_gpu = gpu[0][0] && gpu[1][0] && strcmp(gpu[0], gpu[1]);
    if (s == TD_OK && c.th->m[TD_DB_M_TIMING].gated && other_gpu)
        reason(finding(&c, "runs", "gpu_name"),
               "timings are gated, but the baseline ran on '%s' and the run on '%s': their timings are not "
               "comparable",
               gpu[0], gpu[1]);

    /* thresholds used */
    cJSON *th = cJSON_AddObjectToObject(res, "thresholds");
    for (int m = 0; m < TD_DB_M_COUNT; m++) {
        cJSON *t = cJSON_AddObjectToObject(th, td_db_metric_name((td_db_metric)m));
        cJSON_AddBoolToObject(t, "gated", c.th->m[m].gated);
        cJSON_AddNumberToObject(t, "rel", c.th->m[m].rel);
        cJSON_AddNumberToObject(t, "abs", c.th->m[m].abs);
    }

    if (s == TD_OK) s = td_db_layer_pairs(db, o->baseline_run, o->run, reg_layer_cb, &c, err);
    if (s == TD_OK)
        s = reg_query(db, &c,
                      "SELECT a.check_name || ' ' || a.stage || ' ' || a.variant, a.exact, b.exact, a.verdict, "
                      "b.verdict, b.mismatches FROM encoding_checks a JOIN encoding_checks b ON b.run_id = ?2 "
                      "AND b.check_name = a.check_name AND b.stage = a.stage AND b.variant = a.variant "
                      "WHERE a.run_id = ?1", o->baseline_run, o->run, rule_encoding, err);
    if (s == TD_OK)
        s = reg_query(db, &c,
                      "SELECT a.variant || ' b' || a.batch || ' ' || a.request || ' #' || a.rep, "
                      "a.first_divergence, b.first_divergence, coalesce(b.reference, 'its reference') "
                      "FROM completions a JOIN completions b ON b.run_id = ?2 AND b.variant = a.variant "
                      "AND b.batch = a.batch AND b.request = a.request AND b.rep = a.rep "
                      "WHERE a.run_id = ?1 AND a.reference IS NOT NULL", o->baseline_run, o->run,
                      rule_completion, err);
    if (s == TD_OK)
        s = reg_query(db, &c,
                      "SELECT b.suite || '/' || b.metric || CASE WHEN b.variant = '' THEN '' ELSE ' ' || "
                      "b.variant END, a.pass, b.pass, b.value, b.threshold, b.higher_is_better "
                      "FROM quality b LEFT JOIN quality a ON a.run_id = ?1 AND a.suite = b.suite "
                      "AND a.metric = b.metric AND a.variant = b.variant WHERE b.run_id = ?2",
                      o->baseline_run, o->run, rule_quality, err);
    if (s == TD_OK && c.th->m[TD_DB_M_TIMING].gated && !other_gpu)
        s = reg_query(db, &c,
                      "SELECT a.bench || ' ' || a.shape || ' ' || a.metric || ' ' || a.variant, a.value, "
                      "b.value, b.higher_is_better, b.unit FROM timings a JOIN timings b ON b.run_id = ?2 "
                      "AND b.bench = a.bench AND b.shape = a.shape AND b.metric = a.metric "
                      "AND b.variant = a.variant WHERE a.run_id = ?1", o->baseline_run, o->run,
                      rule_timing, err);
    /* missing results of the other tables */
    for (size_t i = 1; i < TD_DB_T_COUNT && s == TD_OK; i++) {
        int64_t n;
        s = count_missing(db, &td_db_tables[i], o->baseline_run, o->run, &n, err);
        if (s == TD_OK && n > 0) {
            c.missing += n;
            if (c.require_all)
                reason(finding(&c, td_db_tables[i].name, "missing"), "%lld results of the baseline are missing",
                       (long long)n);
        }
    }
    if (s != TD_OK) {
        cJSON_Delete(c.findings);
        cJSON_Delete(res);
        return s;
    }
    cJSON_AddNumberToObject(res, "compared", (double)c.compared);
    cJSON_AddNumberToObject(res, "missing", (double)c.missing);
    cJSON_AddNumberToObject(res, "new", (double)c.added);
    cJSON_AddNumberToObject(res, "n_regressions", (double)c.n_reg);
    cJSON_AddBoolToObject(res, "regressed", c.n_reg > 0);
    cJSON_AddItemToObject(res, "regressions", c.findings);
    *n_regressions = c.n_reg;
    *out = res;
    return TD_OK;
}

/* ==== trend ================================================================================== */

static const struct {
    const char *alias;
    td_db_table_id table;
} table_aliases[] = {
    {"layer", TD_DB_T_LAYER},           {"layer_cmp", TD_DB_T_LAYER},
    {"encoding", TD_DB_T_ENCODING},     {"encoding_checks", TD_DB_T_ENCODING},
    {"census", TD_DB_T_CENSUS},         {"scale_census", TD_DB_T_CENSUS},
    {"completion", TD_DB_T_COMPLETION}, {"completions", TD_DB_T_COMPLETION},
    {"quality", TD_DB_T_QUALITY},       {"timing", TD_DB_T_TIMING},
    {"timings", TD_DB_T_TIMING},
};

/* Run columns usable in --where: name given by the user, SQL column, prefix match. */
static const struct {
    const char *key;
    const char *col;
    bool prefix;
} run_keys[] = {
    {"kind", "kind", false},           {"host", "host", false},
    {"commit", "git_commit", true},    {"git_commit", "git_commit", true},
    {"checkpoint", "checkpoint_fingerprint", true},
    {"gpu_name", "gpu_name", false},   {"tandem_version", "tandem_version", false},
};

static const td_db_col *table_col(const td_db_table *t, const char *name, size_t len)
{
    for (size_t i = 0; i < t->n_cols; i++)
        if (strlen(t->cols[i].name) == len && !strncmp(t->cols[i].name, name, len)) return &t->cols[i];
    return NULL;
}

static bool has_glob(const char *v) { return strpbrk(v, "*?[") != NULL; }

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: n <= window */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct sql_buf {
    char s[4096];
    size_t n;
    bool overflow;
} sql_buf;

static void sql_add(sql_buf *b, const char *fmt, ...) TD_PRINTF(2, 3);
static void sql_add(sql_buf *b, const char *fmt, ...)
{
    if (b->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, sizeof b->s - b->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof b->s - b->n) b->overflow = true;
    else b->n += (size_t)k;
}

/* One point of a trend: a run, or (by commit) the runs of one commit combined. */
typedef struct tpoint {
    int64_t run, rows, runs;
    size_t order;          /* position in time order (first appearance for a commit) */
    char uid[40], started[32], commit[64];
    bool has;              /* some row had a value */
    double part;           /* partial aggregate: max, min, sum (also for mean) or count */
    double value;
} tpoint;

static int cmp_commit(const void *a, const void *b)
{
    const tpoint *x = a, *y = b;
    int c = strcmp(x->commit, y->commit);
    if (c) return c;
    return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_order(const void *a, const void *b)
{
    const tpoint *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Combine the points of each commit into its first point; returns the new count. */
static size_t combine_commits(tpoint *pt, size_t n, const char *agg_sql)
{
    if (n == 0) return 0;
    qsort(pt, n, sizeof *pt, cmp_commit);
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (out > 0 && !strcmp(pt[out - 1].commit, pt[i].commit)) {
            tpoint *g = &pt[out - 1];
            const tpoint *p = &pt[i];
            if (p->has) {
                if (!g->has) g->part = p->part;
                else if (!strcmp(agg_sql, "max")) g->part = fmax(g->part, p->part);
                else if (!strcmp(agg_sql, "min")) g->part = fmin(g->part, p->part);
                else g->part += p->part; /* sum, count */
                g->has = true;
            }
            g->rows += p->rows;
            g->runs += p->runs;
            continue;
        }
        pt[out++] = pt[i];
    }
    qsort(pt, out, sizeof *pt, cmp_order);
    return out;
}

td_status td_db_trend(td_db *db, const td_db_trend_opts *o, cJSON **out, td_err *err)
{
    *out = NULL;
    if (!o->metric || !*o->metric) return td_err_set(err, TD_ERR_ARG, "--metric is required");
    /* metric: [TABLE.]COLUMN */
    const td_db_table *t = &td_db_tables[TD_DB_T_LAYER];
    const char *col_name = o->metric;
    const char *dot = strchr(o->metric, '.');
    if (dot) {
        t = NULL;
        for (size_t i = 0; i < TD_ARRAY_LEN(table_aliases); i++)
            if (strlen(table_aliases[i].alias) == (size_t)(dot - o->metric) &&
                !strncmp(table_aliases[i].alias, o->metric, (size_t)(dot - o->metric)))
                t = &td_db_tables[table_aliases[i].table];
        if (!t)
            return td_err_set(err, TD_ERR_ARG,
                              "--metric '%s': unknown table (layer, encoding, census, completion, quality, timing)",
                              o->metric);
        col_name = dot + 1;
    }
    const td_db_col *mc = table_col(t, col_name, strlen(col_name));
    if (!mc || mc->type == TD_DB_COL_TEXT) {
        char list[512] = "";
        for (size_t i = 0; i < t->n_cols; i++)
            if (t->cols[i].type != TD_DB_COL_TEXT) {
                strncat(list, list[0] ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, t->cols[i].name, sizeof list - strlen(list) - 1);
            }
        return td_err_set(err, TD_ERR_ARG, "--metric '%s': not a numeric column of %s (one of: %s)", o->metric,
                          t->name, list);
    }
    /* per run, SQL computes one partial aggregate and the count; `mean` is sum / count, and
     * points of one commit combine the partials (so no SQL sort over many rows is needed) */
    static const struct { const char *name, *sql; } aggs[] = {
        {"max", "max"}, {"min", "min"}, {"mean", "sum"}, {"sum", "sum"}, {"count", "count"}};
    const char *agg = NULL, *agg_name = o->agg ? o->agg : "max";
    for (size_t i = 0; i < TD_ARRAY_LEN(aggs); i++)
        if (!strcmp(agg_name, aggs[i].name)) agg = aggs[i].sql;
    if (!agg) return td_err_set(err, TD_ERR_ARG, "--agg '%s': one of max, min, mean, sum, count", agg_name);
    int window = o->window > 0 ? o->window : 8;
    int min_hist = o->min_history > 0 ? o->min_history : 3;
    if (window > 1000) window = 1000;
    if (min_hist > window) min_hist = window;

    /* runs drive the join (CROSS JOIN keeps them the outer loop, scanned in id order, with
     * `+` keeping run filters off the runs indexes): each run's rows are then one primary-key
     * range of the result table, and GROUP BY r.id needs no sorter */
    sql_buf q = {.n = 0};
    sql_add(&q, "SELECT r.id, r.uid, r.started_at, r.git_commit, %s(x.%s), count(x.%s) "
                "FROM runs r CROSS JOIN %s x ON x.run_id = r.id WHERE 1",
            agg, mc->name, mc->name, t->name);
    const char *status = o->status ? o->status : "ok";
    bool status_ok = !strcmp(status, "any");
    for (int i = 0; i < TD_DB_RUN_STATUS_COUNT; i++)
        status_ok |= !strcmp(status, td_db_run_status_name((td_db_run_status)i));
    if (!status_ok)
        return td_err_set(err, TD_ERR_ARG, "--status '%s': running, ok, failed, aborted or any", status);
    int nbind = 0;
    const char *binds[40];
    bool bind_num[40];
    double nums[40];
    if (strcmp(status, "any")) {
        sql_add(&q, " AND +r.status = ?%d", ++nbind);
        binds[nbind - 1] = status;
        bind_num[nbind - 1] = false;
    }
    if (o->n_where > 32) return td_err_set(err, TD_ERR_ARG, "too many --where filters (32 at most)");
    for (size_t i = 0; i < o->n_where; i++) {
        const char *w = o->where[i];
        const char *eq = strchr(w, '=');
        if (!eq || eq == w)
            return td_err_set(err, TD_ERR_ARG, "--where '%s': expected KEY=VALUE", w);
        const char *val = eq + 1;
        size_t klen = (size_t)(eq - w);
        const td_db_col *wc = table_col(t, w, klen);
        int idx = nbind++;
        binds[idx] = val;
        bind_num[idx] = false;
        if (wc) {
            if (wc->type == TD_DB_COL_TEXT) {
                sql_add(&q, " AND x.%s %s ?%d", wc->name, has_glob(val) ? "GLOB" : "=", idx + 1);
            } else {
                char *end;
                errno = 0;
                nums[idx] = strtod(val, &end);
                if (!*val || *end || errno)
                    return td_err_set(err, TD_ERR_ARG, "--where '%s': %s takes a number", w, wc->name);
                bind_num[idx] = true;
                sql_add(&q, " AND x.%s = ?%d", wc->name, idx + 1);
            }
            continue;
        }
        bool found = false;
        for (size_t k = 0; k < TD_ARRAY_LEN(run_keys) && !found; k++) {
            if (strlen(run_keys[k].key) != klen || strncmp(run_keys[k].key, w, klen)) continue;
            found = true;
            if (run_keys[k].prefix)
                sql_add(&q, " AND substr(r.%s, 1, length(?%d)) = ?%d", run_keys[k].col, idx + 1, idx + 1);
            else
                sql_add(&q, " AND +r.%s %s ?%d", run_keys[k].col, has_glob(val) ? "GLOB" : "=", idx + 1);
        }
        if (!found) {
            char list[768] = "";
            for (size_t k = 0; k < t->n_cols; k++) {
                strncat(list, list[0] ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, t->cols[k].name, sizeof list - strlen(list) - 1);
            }
            for (size_t k = 0; k < TD_ARRAY_LEN(run_keys); k++) {
                strncat(list, ", ", sizeof list - strlen(list) - 1);
                strncat(list, run_keys[k].key, sizeof list - strlen(list) - 1);
            }
            return td_err_set(err, TD_ERR_ARG, "--where '%s': unknown key for %s (one of: %s)", w, t->name, list);
        }
    }
    sql_add(&q, " GROUP BY r.id ORDER BY r.started_at, r.id");
    if (q.overflow) return td_err_set(err, TD_ERR_ARG, "trend query too long");

    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, q.s, &st, err);
    if (s != TD_OK) return s;
    for (int i = 0; i < nbind; i++) {
        if (bind_num[i] && nums[i] == floor(nums[i]) && fabs(nums[i]) < 9e15)
            sqlite3_bind_int64(st, i + 1, (int64_t)nums[i]); /* integer columns compare as integers */
        else if (bind_num[i]) sqlite3_bind_double(st, i + 1, nums[i]);
        else sqlite3_bind_text(st, i + 1, binds[i], -1, SQLITE_TRANSIENT);
    }
    cJSON *res = cJSON_CreateObject();
    cJSON_AddStringToObject(res, "metric", o->metric);
    cJSON_AddStringToObject(res, "table", t->name);
    cJSON_AddStringToObject(res, "column", mc->name);
    cJSON_AddStringToObject(res, "agg", agg_name);
    cJSON_AddStringToObject(res, "order", o->by_commit ? "commit" : "time");
    cJSON_AddNumberToObject(res, "window", window);
    cJSON_AddNumberToObject(res, "min_history", min_hist);
    cJSON *pts = cJSON_AddArrayToObject(res, "points");
    cJSON *steps = cJSON_AddArrayToObject(res, "steps");

    /* collect one partial per run, in time order */
    tpoint *pt = NULL;
    size_t np = 0, cap = 0;
    int rc = SQLITE_DONE;
    while (s == TD_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (np == cap) {
            size_t nc = cap ? cap * 2 : 64;
            tpoint *n2 = realloc(pt, nc * sizeof *n2);
            if (!n2) { s = nomem(err); break; }
            pt = n2;
            cap = nc;
        }
        tpoint *p = &pt[np];
        memset(p, 0, sizeof *p);
        p->run = sqlite3_column_int64(st, 0);
        snprintf(p->uid, sizeof p->uid, "%s", col_text(st, 1));
        snprintf(p->started, sizeof p->started, "%s", col_text(st, 2));
        snprintf(p->commit, sizeof p->commit, "%s", col_text(st, 3));
        p->has = sqlite3_column_type(st, 4) != SQLITE_NULL;
        p->part = sqlite3_column_double(st, 4);
        p->rows = sqlite3_column_int64(st, 5);
        p->runs = 1;
        p->order = np;
        np++;
    }
    if (s == TD_OK && rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    if (s == TD_OK && o->by_commit) np = combine_commits(pt, np, agg);
    for (size_t i = 0; i < np; i++) {
        tpoint *p = &pt[i];
        if (!strcmp(agg_name, "mean")) {
            p->has = p->has && p->rows > 0;
            p->value = p->has ? p->part / (double)p->rows : 0;
        } else {
            p->value = p->part;
        }
    }
    double *hist = malloc((size_t)window * sizeof *hist); /* ring of the current regime's values */
    double *tmp = malloc((size_t)window * sizeof *tmp);
    if (s == TD_OK && (!hist || !tmp || !res)) s = nomem(err);
    int nh = 0, head = 0;
    for (size_t i = 0; s == TD_OK && i < np; i++) {
        const tpoint *q0 = &pt[i];
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "run", (double)q0->run);
        cJSON_AddStringToObject(p, "uid", q0->uid);
        cJSON_AddStringToObject(p, "started_at", q0->started);
        cJSON_AddStringToObject(p, "commit", q0->commit);
        cJSON_AddNumberToObject(p, "rows", (double)q0->rows);
        if (o->by_commit) cJSON_AddNumberToObject(p, "runs", (double)q0->runs);
        cJSON_AddItemToArray(pts, p);
        if (!q0->has) {
            cJSON_AddNullToObject(p, "value");
            continue;
        }
        double x = q0->value;
        cJSON_AddNumberToObject(p, "value", x);
        bool step = false;
        if (nh >= min_hist) {
            double lo = INFINITY, hi = -INFINITY;
            for (int k = 0; k < nh; k++) {
                tmp[k] = hist[k];
                lo = fmin(lo, hist[k]);
                hi = fmax(hi, hist[k]);
            }
            double med = median(tmp, nh), spread = hi - lo, d = x - med;
            step = fabs(d) > spread && fabs(d) > 1e-12 * fmax(fabs(med), fabs(x));
            cJSON_AddNumberToObject(p, "median_before", med);
            cJSON_AddNumberToObject(p, "spread_before", spread);
            if (step) {
                cJSON *sp = cJSON_CreateObject();
                cJSON_AddNumberToObject(sp, "run", (double)q0->run);
                cJSON_AddStringToObject(sp, "uid", q0->uid);
                cJSON_AddStringToObject(sp, "commit", q0->commit);
                cJSON_AddStringToObject(sp, "started_at", q0->started);
                cJSON_AddNumberToObject(sp, "from", med);
                cJSON_AddNumberToObject(sp, "to", x);
                cJSON_AddNumberToObject(sp, "delta", d);
                cJSON_AddNumberToObject(sp, "spread_before", spread);
                cJSON_AddItemToArray(steps, sp);
                nh = 0; /* a new regime starts at this point */
                head = 0;
            }
        }
        cJSON_AddBoolToObject(p, "step", step);
        hist[head] = x;
        head = (head + 1) % window;
        if (nh < window) nh++;
    }
    free(pt);
    free(hist);
    free(tmp);
    if (s != TD_OK) { cJSON_Delete(res); return s; }
    cJSON_AddNumberToObject(res, "n_steps", cJSON_GetArraySize(steps));
    *out = res;
    return TD_OK;
}
