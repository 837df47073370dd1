/* query.c — run references, run listing, show, info and compare (query.h). */
#include "db_int.h"
#include "json.h"
#include "query.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ==== shared helpers ========================================================================= */

void td_db_row_json(sqlite3_stmt *st, int first, cJSON *obj)
{
    int n = sqlite3_column_count(st);
    for (int i = first; i < n; i++) {
        const char *name = sqlite3_column_name(st, i);
        switch (sqlite3_column_type(st, i)) {
        case SQLITE_INTEGER: cJSON_AddNumberToObject(obj, name, (double)sqlite3_column_int64(st, i)); break;
        case SQLITE_FLOAT: cJSON_AddNumberToObject(obj, name, sqlite3_column_double(st, i)); break;
        case SQLITE_TEXT: cJSON_AddStringToObject(obj, name, (const char *)sqlite3_column_text(st, i)); break;
        default: cJSON_AddNullToObject(obj, name); break;
        }
    }
}

static td_status nomem(td_err *err) { return td_err_set(err, TD_ERR_NOMEM, "out of memory"); }

/* ==== run references ========================================================================= */

static bool all_digits(const char *s)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return false;
    return true;
}

td_status td_db_run_resolve(td_db *db, const char *ref, int64_t *run_id, td_err *err)
{
    *run_id = 0;
    if (!ref || !*ref) return td_err_set(err, TD_ERR_ARG, "empty run reference");
    sqlite3_stmt *st;
    td_status s;
    if (!strcmp(ref, "latest") || !strncmp(ref, "latest:", 7)) {
        const char *kind = ref[6] ? ref + 7 : NULL;
        s = td_db_prepare(db, "SELECT id FROM runs WHERE (?1 IS NULL OR kind GLOB ?1) "
                              "ORDER BY started_at DESC, id DESC LIMIT 1", &st, err);
        if (s != TD_OK) return s;
        td_db_bind_text(st, 1, kind);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *run_id = sqlite3_column_int64(st, 0);
        else if (rc == SQLITE_DONE)
            s = td_err_set(err, TD_ERR_NOTFOUND, "run '%s': no runs%s%s in %s", ref, kind ? " of kind " : "",
                           kind ? kind : "", db->path);
        else s = td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_finalize(st);
        return s;
    }
    if (all_digits(ref) && strlen(ref) < 16) {
        s = td_db_prepare(db, "SELECT id FROM runs WHERE id = ?1", &st, err);
        if (s != TD_OK) return s;
        sqlite3_bind_int64(st, 1, strtoll(ref, NULL, 10));
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *run_id = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (*run_id) return TD_OK;
        /* fall through: all-digit uid prefixes are possible */
    }
    size_t len = strlen(ref);
    bool hexish = len >= 4 && len <= TD_DB_UID_LEN;
    for (const char *p = ref; hexish && *p; p++)
        hexish = isxdigit((unsigned char)*p) || *p == '-';
    if (!hexish)
        return td_err_set(err, TD_ERR_NOTFOUND,
                          "run '%s' not found in %s (give a run id, a uid or uid prefix of >= 4 "
                          "characters, 'latest' or 'latest:KIND')", ref, db->path);
    s = td_db_prepare(db, "SELECT id FROM runs WHERE substr(uid, 1, length(?1)) = lower(?1) LIMIT 2",
                      &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, ref, -1, SQLITE_STATIC);
    int n = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        *run_id = sqlite3_column_int64(st, 0);
        n++;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return td_db_sqlerr(db->h, rc, err, db->path);
    if (n == 1) return TD_OK;
    *run_id = 0;
    if (n == 0) return td_err_set(err, TD_ERR_NOTFOUND, "run '%s' not found in %s", ref, db->path);
    return td_err_set(err, TD_ERR_ARG, "run '%s' is ambiguous in %s: give more of the uid", ref, db->path);
}

/* ==== --since ================================================================================ */

td_status td_db_since_parse(const char *since, char out[32], td_err *err)
{
    out[0] = '\0';
    size_t n = since ? strlen(since) : 0;
    if (n >= 2 && n < 12) {
        /* relative: digits followed by one unit letter */
        char unit = since[n - 1];
        char num[16];
        memcpy(num, since, n - 1);
        num[n - 1] = '\0';
        if (all_digits(num) && strchr("mhdw", unit)) {
            long long v = strtoll(num, NULL, 10);
            long long mult = unit == 'm' ? 60 : unit == 'h' ? 3600 : unit == 'd' ? 86400 : 604800;
            if (v > 200LL * 366 * 86400 / mult)
                return td_err_set(err, TD_ERR_ARG, "--since %s: more than 200 years back", since);
            td_prov_time_iso((int64_t)time(NULL) - v * mult, 0, out);
            return TD_OK;
        }
    }
    /* absolute: YYYY-MM-DD, optionally [T ]HH:MM[:SS] */
    static const char pat[] = "dddd-dd-dd";
    bool ok = n >= 10;
    for (size_t i = 0; ok && i < 10; i++)
        ok = pat[i] == 'd' ? isdigit((unsigned char)since[i]) != 0 : since[i] == pat[i];
    if (ok && n > 10) {
        static const char tpat[] = "?dd:dd:dd";
        ok = (n == 16 || n == 19) && (since[10] == 'T' || since[10] == ' ');
        for (size_t i = 11; ok && i < n; i++)
            ok = tpat[i - 10] == 'd' ? isdigit((unsigned char)since[i]) != 0 : since[i] == tpat[i - 10];
    }
    if (!ok)
        return td_err_set(err, TD_ERR_ARG,
                          "--since '%s': expected YYYY-MM-DD[THH:MM[:SS]] (UTC) or an age like 30m, "
                          "12h, 7d, 2w", since ? since : "");
    snprintf(out, 32, "%s", since);
    if (n > 10) out[10] = 'T';
    return TD_OK;
}

/* ==== runs =================================================================================== */

td_status td_db_runs_list(td_db *db, const td_db_runs_filter *f, cJSON **out, td_err *err)
{
    *out = NULL;
    char since[32] = "";
    if (f->since) {
        td_status s = td_db_since_parse(f->since, since, err);
        if (s != TD_OK) return s;
    }
    if (f->status) {
        bool ok = false;
        for (int i = 0; i < TD_DB_RUN_STATUS_COUNT; i++)
            ok |= !strcmp(f->status, td_db_run_status_name((td_db_run_status)i));
        if (!ok) return td_err_set(err, TD_ERR_ARG, "--status '%s': one of running, ok, failed, aborted", f->status);
    }
    sqlite3_stmt *st;
    td_status s = td_db_prepare(
        db,
        "SELECT id, uid, kind, status, started_at, ended_at, "
        "round((julianday(ended_at) - julianday(started_at)) * 86400.0, 3) AS duration_s, exit_code, "
        "git_commit, tandem_version, host, gpu_name, checkpoint_path, checkpoint_fingerprint, variants, "
        "origin FROM runs "
        "WHERE (?1 IS NULL OR kind GLOB ?1) AND (?2 IS NULL OR status = ?2) "
        "AND (?3 IS NULL OR substr(checkpoint_fingerprint, 1, length(?3)) = lower(?3) "
        "     OR instr(checkpoint_path, ?3) > 0) "
        "AND (?4 IS NULL OR started_at >= ?4) AND (?5 IS NULL OR host = ?5) "
        "AND (?6 IS NULL OR substr(git_commit, 1, length(?6)) = ?6) "
        "AND (?8 IS NULL OR gpu_name GLOB ?8) "
        "ORDER BY started_at DESC, id DESC LIMIT ?7", &st, err);
    if (s != TD_OK) return s;
    td_db_bind_text(st, 1, f->kind);
    td_db_bind_text(st, 2, f->status);
    td_db_bind_text(st, 3, f->checkpoint);
    td_db_bind_text(st, 4, since[0] ? since : NULL);
    td_db_bind_text(st, 5, f->host);
    td_db_bind_text(st, 6, f->commit);
    td_db_bind_text(st, 8, f->gpu);
    sqlite3_bind_int64(st, 7, f->limit > 0 ? f->limit : -1);
    cJSON *arr = cJSON_CreateArray();
    if (!arr) { sqlite3_finalize(st); return nomem(err); }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        cJSON *o = cJSON_CreateObject();
        if (!o) { rc = SQLITE_NOMEM; break; }
        td_db_row_json(st, 0, o);
        /* variants is JSON text: give it back as an array */
        cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "variants");
        if (cJSON_IsString(v)) {
            cJSON *parsed = cJSON_Parse(v->valuestring);
            if (parsed) cJSON_ReplaceItemInObjectCaseSensitive(o, "variants", parsed);
        }
        cJSON_AddItemToArray(arr, o);
    }
    if (rc != SQLITE_DONE) {
        s = td_db_sqlerr(db->h, rc, err, db->path);
        cJSON_Delete(arr);
        arr = NULL;
    }
    sqlite3_finalize(st);
    *out = arr;
    return s;
}

static td_status add_count(td_db *db, cJSON *obj, const char *name, const char *sql, int64_t bind,
                           td_err *err)
{
    int64_t v;
    td_status s = td_db_query_int(db, sql, bind, &v, err);
    if (s == TD_OK) cJSON_AddNumberToObject(obj, name, (double)v);
    return s;
}

/* SELECT count(*) FROM <table> WHERE run_id = ?1, for a descriptor table. */
static void count_sql(const td_db_table *t, char *sql, size_t cap)
{
    snprintf(sql, cap, "SELECT count(*) FROM %s WHERE run_id = ?1", t->name);
}

td_status td_db_run_show(td_db *db, int64_t run_id, cJSON **out, td_err *err)
{
    *out = NULL;
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db,
                                "SELECT *, round((julianday(ended_at) - julianday(started_at)) * "
                                "86400.0, 3) AS duration_s FROM runs WHERE id = ?1", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, run_id);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        s = rc == SQLITE_DONE ? td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)run_id)
                              : td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_finalize(st);
        return s;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) { sqlite3_finalize(st); return nomem(err); }
    td_db_row_json(st, 0, o);
    sqlite3_finalize(st);
    static const char *const json_cols[] = {"command_line", "env", "variants", "seeds"};
    for (size_t i = 0; i < TD_ARRAY_LEN(json_cols); i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(o, json_cols[i]);
        if (!cJSON_IsString(v)) continue;
        cJSON *parsed = cJSON_Parse(v->valuestring);
        if (parsed) cJSON_ReplaceItemInObjectCaseSensitive(o, json_cols[i], parsed);
    }
    cJSON *counts = cJSON_AddObjectToObject(o, "results");
    for (size_t i = 0; i < TD_DB_T_COUNT && s == TD_OK; i++) {
        char sql[128];
        count_sql(&td_db_tables[i], sql, sizeof sql);
        s = add_count(db, counts, td_db_tables[i].name, sql, run_id, err);
    }
    cJSON *lay = cJSON_AddObjectToObject(o, "layer_summary");
    static const struct { const char *name, *sql; } summary[] = {
        {"pass", "SELECT count(*) FROM layer_cmp WHERE run_id = ?1 AND verdict = 'pass'"},
        {"fail", "SELECT count(*) FROM layer_cmp WHERE run_id = ?1 AND verdict = 'fail'"},
        {"skip", "SELECT count(*) FROM layer_cmp WHERE run_id = ?1 AND verdict = 'skip'"},
        {"exact", "SELECT count(*) FROM layer_cmp WHERE run_id = ?1 AND exact = 1"},
        {"not_finite", "SELECT count(*) FROM layer_cmp WHERE run_id = ?1 AND finite = 0"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(summary) && s == TD_OK; i++)
        s = add_count(db, lay, summary[i].name, summary[i].sql, run_id, err);
    /* first failing comparisons, in layer order */
    cJSON *fails = cJSON_AddArrayToObject(o, "failures");
    if (s == TD_OK) s = td_db_prepare(db,
                                      "SELECT layer, rank, tokens, tap, variant_a, variant_b, expectation, "
                                      "exact, max_abs, rel_l2, max_ulp, first_diff FROM layer_cmp "
                                      "WHERE run_id = ?1 AND verdict = 'fail' "
                                      "ORDER BY layer, tap, rank, tokens LIMIT 20", &st, err);
    if (s == TD_OK) {
        sqlite3_bind_int64(st, 1, run_id);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            cJSON *r = cJSON_CreateObject();
            td_db_row_json(st, 0, r);
            cJSON_AddItemToArray(fails, r);
        }
        if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_finalize(st);
    }
    cJSON *bl = cJSON_AddArrayToObject(o, "baselines");
    if (s == TD_OK) s = td_db_prepare(db,
                                      "SELECT b.name FROM baselines b JOIN runs r ON r.uid = b.run_uid "
                                      "WHERE r.id = ?1 ORDER BY b.name", &st, err);
    if (s == TD_OK) {
        sqlite3_bind_int64(st, 1, run_id);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW)
            cJSON_AddItemToArray(bl, cJSON_CreateString((const char *)sqlite3_column_text(st, 0)));
        if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_finalize(st);
    }
    if (s != TD_OK) { cJSON_Delete(o); return s; }
    *out = o;
    return TD_OK;
}

td_status td_db_completions(td_db *db, int64_t run_id, bool diverged_only, cJSON **out, td_err *err)
{
    *out = NULL;
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db,
                                diverged_only
                                    ? "SELECT variant, batch, request, rep, length, hash, reference, "
                                      "first_divergence, margin, reference_margin, token_ids FROM completions "
                                      "WHERE run_id = ?1 AND first_divergence IS NOT NULL "
                                      "ORDER BY variant, batch, request, rep"
                                    : "SELECT variant, batch, request, rep, length, hash, reference, "
                                      "first_divergence, margin, reference_margin, token_ids FROM completions "
                                      "WHERE run_id = ?1 ORDER BY variant, batch, request, rep",
                                &st, err);
    if (s != TD_OK) return s;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) { sqlite3_finalize(st); return nomem(err); }
    sqlite3_bind_int64(st, 1, run_id);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        cJSON *r = cJSON_CreateObject();
        if (!r) { rc = SQLITE_NOMEM; break; }
        cJSON_AddItemToArray(arr, r);
        td_db_row_json(st, 0, r);
        /* token ids are stored as JSON text; hand them out as an array (text kept if foreign) */
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "token_ids");
        if (cJSON_IsString(t)) {
            cJSON *parsed = cJSON_Parse(t->valuestring);
            if (cJSON_IsArray(parsed)) cJSON_ReplaceItemInObjectCaseSensitive(r, "token_ids", parsed);
            else cJSON_Delete(parsed);
        }
    }
    if (rc != SQLITE_DONE) s = rc == SQLITE_NOMEM ? nomem(err) : td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    if (s != TD_OK) { cJSON_Delete(arr); return s; }
    *out = arr;
    return TD_OK;
}

td_status td_db_info(td_db *db, bool check, cJSON **out, td_err *err)
{
    *out = NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return nomem(err);
    cJSON_AddStringToObject(o, "path", db->path);
    td_status s = add_count(db, o, "schema_version", "PRAGMA user_version", 0, err);
    if (s == TD_OK) cJSON_AddNumberToObject(o, "schema_version_supported", TD_DB_SCHEMA_VERSION);
    cJSON_AddStringToObject(o, "sqlite_version", sqlite3_libversion());
    sqlite3_stmt *jm;
    if (s == TD_OK && td_db_prepare(db, "PRAGMA journal_mode", &jm, err) == TD_OK) {
        if (sqlite3_step(jm) == SQLITE_ROW)
            cJSON_AddStringToObject(o, "journal_mode", (const char *)sqlite3_column_text(jm, 0));
        sqlite3_finalize(jm);
    }
    if (s == TD_OK) s = add_count(db, o, "foreign_keys", "PRAGMA foreign_keys", 0, err);
    int64_t pages = 0, psize = 0;
    if (s == TD_OK) s = td_db_query_int(db, "PRAGMA page_count", 0, &pages, err);
    if (s == TD_OK) s = td_db_query_int(db, "PRAGMA page_size", 0, &psize, err);
    if (s == TD_OK) cJSON_AddNumberToObject(o, "size_bytes", (double)(pages * psize));
    if (s == TD_OK) s = add_count(db, o, "runs", "SELECT count(*) FROM runs", 0, err);
    cJSON *by = cJSON_AddObjectToObject(o, "runs_by_status");
    for (int i = 0; i < TD_DB_RUN_STATUS_COUNT && s == TD_OK; i++) {
        sqlite3_stmt *st;
        s = td_db_prepare(db, "SELECT count(*) FROM runs WHERE status = ?1", &st, err);
        if (s != TD_OK) break;
        sqlite3_bind_text(st, 1, td_db_run_status_name((td_db_run_status)i), -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW)
            cJSON_AddNumberToObject(by, td_db_run_status_name((td_db_run_status)i),
                                    (double)sqlite3_column_int64(st, 0));
        sqlite3_finalize(st);
    }
    cJSON *rows = cJSON_AddObjectToObject(o, "rows");
    for (size_t i = 0; i < TD_DB_T_COUNT && s == TD_OK; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", td_db_tables[i].name);
        s = add_count(db, rows, td_db_tables[i].name, sql, 0, err);
    }
    if (s == TD_OK) s = add_count(db, o, "baselines", "SELECT count(*) FROM baselines", 0, err);
    if (s == TD_OK && check) {
        sqlite3_stmt *st;
        s = td_db_prepare(db, "PRAGMA integrity_check", &st, err);
        if (s == TD_OK) {
            cJSON *ic = cJSON_AddArrayToObject(o, "integrity_check");
            int rc;
            while ((rc = sqlite3_step(st)) == SQLITE_ROW)
                cJSON_AddItemToArray(ic, cJSON_CreateString((const char *)sqlite3_column_text(st, 0)));
            if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
            sqlite3_finalize(st);
        }
        if (s == TD_OK) s = td_db_schema_selfcheck(db, err);
    }
    if (s != TD_OK) { cJSON_Delete(o); return s; }
    *out = o;
    return TD_OK;
}

/* ==== layer pairs ============================================================================ */

static const char lpair_sql[] =
    "SELECT a.tap, a.layer, a.rank, a.tokens, a.variant_a, a.variant_b, "
    "a.expectation, a.exact, a.finite, a.verdict, a.max_abs, a.rel_l2, a.nmse, a.max_ulp, "
    "a.mismatches, a.cosine, a.first_diff, "
    "b.expectation, b.exact, b.finite, b.verdict, b.max_abs, b.rel_l2, b.nmse, b.max_ulp, "
    "b.mismatches, b.cosine, b.first_diff, b.run_id IS NOT NULL "
    "FROM layer_cmp a LEFT JOIN layer_cmp b ON b.run_id = ?2 AND b.tap = a.tap AND b.rank = a.rank "
    "AND b.tokens = a.tokens AND b.variant_a = a.variant_a AND b.variant_b = a.variant_b "
    "WHERE a.run_id = ?1";

static const char lpair_only_b_sql[] =
    "SELECT b.tap, b.layer, b.rank, b.tokens, b.variant_a, b.variant_b, "
    "b.expectation, b.exact, b.finite, b.verdict, b.max_abs, b.rel_l2, b.nmse, b.max_ulp, "
    "b.mismatches, b.cosine, b.first_diff FROM layer_cmp b WHERE b.run_id = ?2 AND NOT EXISTS "
    "(SELECT 1 FROM layer_cmp a WHERE a.run_id = ?1 AND a.tap = b.tap AND a.rank = b.rank "
    "AND a.tokens = b.tokens AND a.variant_a = b.variant_a AND a.variant_b = b.variant_b)";

/* Read side columns starting at column c (expectation, exact, finite, verdict, 6 metrics,
 * first_diff). */
static void read_side(sqlite3_stmt *st, int c, td_db_lside *s)
{
    s->present = true;
    const char *ex = (const char *)sqlite3_column_text(st, c);
    s->expect_exact = ex && !strcmp(ex, "exact");
    s->exact = sqlite3_column_int(st, c + 1) != 0;
    s->finite = sqlite3_column_int(st, c + 2) != 0;
    const char *vd = (const char *)sqlite3_column_text(st, c + 3);
    s->verdict = vd ? vd[0] : '?';
    for (int m = 0; m < 6; m++) {
        s->has[m] = sqlite3_column_type(st, c + 4 + m) != SQLITE_NULL;
        s->m[m] = s->has[m] ? sqlite3_column_double(st, c + 4 + m) : (double)NAN;
    }
    s->first_diff = sqlite3_column_type(st, c + 10) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, c + 10);
}

td_status td_db_layer_pairs(td_db *db, int64_t run_a, int64_t run_b,
                            td_status (*fn)(void *ctx, const td_db_lpair *p, td_err *err), void *ctx,
                            td_err *err)
{
    for (int pass = 0; pass < 2; pass++) {
        sqlite3_stmt *st;
        td_status s = td_db_prepare(db, pass == 0 ? lpair_sql : lpair_only_b_sql, &st, err);
        if (s != TD_OK) return s;
        sqlite3_bind_int64(st, 1, run_a);
        sqlite3_bind_int64(st, 2, run_b);
        int rc;
        while (s == TD_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            td_db_lpair p;
            memset(&p, 0, sizeof p);
            p.tap = (const char *)sqlite3_column_text(st, 0);
            p.layer = sqlite3_column_int64(st, 1);
            p.rank = sqlite3_column_int64(st, 2);
            p.tokens = sqlite3_column_int64(st, 3);
            p.variant_a = (const char *)sqlite3_column_text(st, 4);
            p.variant_b = (const char *)sqlite3_column_text(st, 5);
            if (pass == 0) {
                read_side(st, 6, &p.a);
                if (sqlite3_column_int(st, 28)) read_side(st, 17, &p.b);
            } else {
                read_side(st, 6, &p.b);
            }
            s = fn(ctx, &p, err);
        }
        if (s == TD_OK && rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_finalize(st);
        if (s != TD_OK) return s;
    }
    return TD_OK;
}

void td_db_lpair_key(const td_db_lpair *p, char *out, size_t cap)
{
    snprintf(out, cap, "%s r%lld t%lld %s>%s", p->tap, (long long)p->rank, (long long)p->tokens,
             p->variant_a, p->variant_b);
}

/* ==== compare ================================================================================ */

static const char *const metric_cols[6] = {"max_abs", "rel_l2", "nmse", "max_ulp", "mismatches", "cosine"};

typedef struct cmp_row {
    td_db_lpair p;  /* strings owned by the row (strdup) */
    int tier;       /* 3 exact lost, 2 finite lost, 1 verdict lost, 0 otherwise, -1 only in one run */
    double growth;  /* worse_log10 */
} cmp_row;

typedef struct cmp_ctx {
    cmp_row *rows;
    size_t n, cap;
    int64_t both, only_a, only_b, exact_lost, exact_gained, worse, better, same;
} cmp_ctx;

static double log_growth(double a, double b)
{
    const double tiny = 1e-30; /* lets 0 -> x count as growth */
    return log10((fabs(b) + tiny) / (fabs(a) + tiny));
}

static void side_json(cJSON *o, const char *name, const td_db_lside *s)
{
    cJSON *j = cJSON_AddObjectToObject(o, name);
    cJSON_AddBoolToObject(j, "exact", s->exact);
    cJSON_AddBoolToObject(j, "finite", s->finite);
    cJSON_AddStringToObject(j, "verdict", s->verdict == 'p' ? "pass" : s->verdict == 'f' ? "fail" : "skip");
    for (int m = 0; m < 6; m++) {
        if (s->has[m]) cJSON_AddNumberToObject(j, metric_cols[m], s->m[m]);
        else cJSON_AddNullToObject(j, metric_cols[m]);
    }
    if (s->first_diff >= 0) cJSON_AddNumberToObject(j, "first_diff", (double)s->first_diff);
    else cJSON_AddNullToObject(j, "first_diff");
}

/* worse_log10: the largest log10 growth of the error amplitude among max_abs, rel_l2,
 * sqrt(nmse) and sqrt(1 - cosine); metrics that are 0 in both runs do not count. */
static double growth_of(const td_db_lside *a, const td_db_lside *b)
{
    bool any = false;
    double g = 0.0;
    static const int ms[4] = {TD_DB_M_MAX_ABS, TD_DB_M_REL_L2, TD_DB_M_NMSE, TD_DB_M_COSINE};
    for (int k = 0; k < 4; k++) {
        int m = ms[k];
        if (!(a->has[m] && b->has[m])) continue;
        double va = m == TD_DB_M_COSINE ? 1.0 - a->m[m] : a->m[m];
        double vb = m == TD_DB_M_COSINE ? 1.0 - b->m[m] : b->m[m];
        if (va == 0.0 && vb == 0.0) continue;
        double gm = log_growth(va, vb);
        if (m == TD_DB_M_NMSE || m == TD_DB_M_COSINE) gm *= 0.5; /* squared errors: amplitude growth */
        if (!any || gm > g) g = gm;
        any = true;
    }
    return g;
}

static td_status cmp_cb(void *vctx, const td_db_lpair *p, td_err *err)
{
    cmp_ctx *c = vctx;
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 256;
        cmp_row *nr = realloc(c->rows, nc * sizeof *nr);
        if (!nr) return nomem(err);
        c->rows = nr;
        c->cap = nc;
    }
    cmp_row *r = &c->rows[c->n];
    r->p = *p;
    r->p.tap = strdup(p->tap);
    r->p.variant_a = strdup(p->variant_a);
    r->p.variant_b = strdup(p->variant_b);
    c->n++;
    if (!r->p.tap || !r->p.variant_a || !r->p.variant_b) return nomem(err);
    r->tier = -1;
    r->growth = 0;
    if (!p->b.present || !p->a.present) {
        if (p->a.present) c->only_a++;
        else c->only_b++;
        return TD_OK;
    }
    c->both++;
    const td_db_lside *a = &p->a, *b = &p->b;
    r->tier = (a->exact && !b->exact) ? 3 : (a->finite && !b->finite) ? 2
              : (a->verdict == 'p' && b->verdict == 'f') ? 1 : 0;
    if (a->exact && !b->exact) c->exact_lost++;
    if (!a->exact && b->exact) c->exact_gained++;
    r->growth = growth_of(a, b);
    if (r->tier > 0 || r->growth > 1e-9) c->worse++;
    else if (r->growth < -1e-9 || (!a->exact && b->exact)) c->better++;
    else c->same++;
    return TD_OK;
}

static cJSON *cmp_row_json(const cmp_row *r)
{
    const td_db_lpair *p = &r->p;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "tap", p->tap);
    cJSON_AddNumberToObject(o, "layer", (double)p->layer);
    cJSON_AddNumberToObject(o, "rank", (double)p->rank);
    cJSON_AddNumberToObject(o, "tokens", (double)p->tokens);
    cJSON_AddStringToObject(o, "variant_a", p->variant_a);
    cJSON_AddStringToObject(o, "variant_b", p->variant_b);
    if (!p->a.present || !p->b.present) {
        cJSON_AddStringToObject(o, "only_in", p->a.present ? "a" : "b");
        side_json(o, p->a.present ? "a" : "b", p->a.present ? &p->a : &p->b);
        return o;
    }
    side_json(o, "a", &p->a);
    side_json(o, "b", &p->b);
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    for (int m = 0; m < 6; m++) {
        if (p->a.has[m] && p->b.has[m]) cJSON_AddNumberToObject(d, metric_cols[m], p->b.m[m] - p->a.m[m]);
        else cJSON_AddNullToObject(d, metric_cols[m]);
    }
    cJSON_AddNumberToObject(o, "worse_log10", r->growth);
    return o;
}

static int cmp_rows(const void *x, const void *y)
{
    const cmp_row *a = x, *b = y;
    if (a->tier != b->tier) return b->tier - a->tier;
    if (a->growth != b->growth) return a->growth < b->growth ? 1 : -1;
    return 0;
}

/* Matched scalar results of another table (quality, timings): key text, a, b, delta. */
static td_status compare_values(td_db *db, int64_t run_a, int64_t run_b, const char *sql, cJSON *arr,
                                td_err *err)
{
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, sql, &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, run_a);
    sqlite3_bind_int64(st, 2, run_b);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        cJSON *o = cJSON_CreateObject();
        td_db_row_json(st, 0, o);
        cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "a"), *b = cJSON_GetObjectItemCaseSensitive(o, "b");
        if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
            cJSON_AddNumberToObject(o, "delta", b->valuedouble - a->valuedouble);
        else cJSON_AddNullToObject(o, "delta");
        cJSON_AddItemToArray(arr, o);
    }
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

td_status td_db_compare(td_db *db, int64_t run_a, int64_t run_b, size_t limit, cJSON **out, td_err *err)
{
    *out = NULL;
    cmp_ctx c;
    memset(&c, 0, sizeof c);
    td_status s = td_db_layer_pairs(db, run_a, run_b, cmp_cb, &c, err);
    cJSON *o = NULL;
    if (s == TD_OK) {
        qsort(c.rows, c.n, sizeof *c.rows, cmp_rows);
        o = cJSON_CreateObject();
        if (!o) s = nomem(err);
    }
    if (s == TD_OK) {
        char ua[TD_DB_UID_LEN + 1], ub[TD_DB_UID_LEN + 1];
        s = td_db_run_uid(db, run_a, ua, err);
        if (s == TD_OK) s = td_db_run_uid(db, run_b, ub, err);
        cJSON *ra = cJSON_AddObjectToObject(o, "a"), *rb = cJSON_AddObjectToObject(o, "b");
        cJSON_AddNumberToObject(ra, "id", (double)run_a);
        cJSON_AddStringToObject(ra, "uid", ua);
        cJSON_AddNumberToObject(rb, "id", (double)run_b);
        cJSON_AddStringToObject(rb, "uid", ub);
        cJSON *sum = cJSON_AddObjectToObject(o, "summary");
        cJSON_AddNumberToObject(sum, "matched", (double)c.both);
        cJSON_AddNumberToObject(sum, "only_a", (double)c.only_a);
        cJSON_AddNumberToObject(sum, "only_b", (double)c.only_b);
        cJSON_AddNumberToObject(sum, "worse", (double)c.worse);
        cJSON_AddNumberToObject(sum, "better", (double)c.better);
        cJSON_AddNumberToObject(sum, "same", (double)c.same);
        cJSON_AddNumberToObject(sum, "exact_lost", (double)c.exact_lost);
        cJSON_AddNumberToObject(sum, "exact_gained", (double)c.exact_gained);
        cJSON *arr = cJSON_AddArrayToObject(o, "layer_cmp");
        size_t n = limit && limit < c.n ? limit : c.n;
        for (size_t i = 0; i < n && s == TD_OK; i++) {
            cJSON *row = cmp_row_json(&c.rows[i]);
            if (!row) s = nomem(err);
            else cJSON_AddItemToArray(arr, row);
        }
    }
    if (s == TD_OK)
        s = compare_values(db, run_a, run_b,
                           "SELECT a.suite, a.metric, a.variant, a.value AS a, b.value AS b, "
                           "a.pass AS pass_a, b.pass AS pass_b FROM quality a JOIN quality b "
                           "ON b.run_id = ?2 AND b.suite = a.suite AND b.metric = a.metric "
                           "AND b.variant = a.variant WHERE a.run_id = ?1 ORDER BY a.suite, a.metric",
                           cJSON_AddArrayToObject(o, "quality"), err);
    if (s == TD_OK)
        s = compare_values(db, run_a, run_b,
                           "SELECT a.bench, a.shape, a.metric, a.variant, a.unit, a.value AS a, "
                           "b.value AS b FROM timings a JOIN timings b ON b.run_id = ?2 "
                           "AND b.bench = a.bench AND b.shape = a.shape AND b.metric = a.metric "
                           "AND b.variant = a.variant WHERE a.run_id = ?1 ORDER BY a.bench, a.shape",
                           cJSON_AddArrayToObject(o, "timings"), err);
    for (size_t i = 0; i < c.n; i++) {
        free((char *)c.rows[i].p.tap);
        free((char *)c.rows[i].p.variant_a);
        free((char *)c.rows[i].p.variant_b);
    }
    free(c.rows);
    if (s != TD_OK) { cJSON_Delete(o); return s; }
    *out = o;
    return TD_OK;
}
