/* transfer.c — export (JSON, CSV), import (JSON) and merge (another store) (query.h).
 * All three are driven by the table descriptors in schema.c. */
#include "db_int.h"
#include "json.h"
#include "query.h"
#include "sha256.h"
#include "version.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT_FORMAT "tandem-results"
#define EXPORT_FORMAT_VERSION 1
#define IMPORT_MAX_BYTES ((size_t)1 << 31) /* 2 GiB of JSON */

static td_status nomem(td_err *err) { return td_err_set(err, TD_ERR_NOMEM, "out of memory"); }

/* ==== SQL from descriptors =================================================================== */

/* "c1, c2, ..." with an optional prefix per column ("s."). */
static bool col_list(char *out, size_t cap, const td_db_col *cols, size_t n, const char *prefix)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        int k = snprintf(out + o, cap - o, "%s%s%s", i ? ", " : "", prefix, cols[i].name);
        if (k < 0 || (size_t)k >= cap - o) return false;
        o += (size_t)k;
    }
    return true;
}

/* ==== JSON and CSV writers =================================================================== */

static bool is_json_text_col(const char *name)
{
    return !strcmp(name, "command_line") || !strcmp(name, "env") || !strcmp(name, "variants") ||
           !strcmp(name, "seeds");
}

/* Column i of the current row as a JSON value. JSON-text columns are embedded as JSON. */
static void json_value(FILE *f, sqlite3_stmt *st, int i, bool embed_json)
{
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_INTEGER: fprintf(f, "%lld", (long long)sqlite3_column_int64(st, i)); break;
    case SQLITE_FLOAT: {
        double v = sqlite3_column_double(st, i);
        if (isfinite(v)) fprintf(f, "%.17g", v);
        else fputs("null", f);
        break;
    }
    case SQLITE_TEXT: {
        const char *t = (const char *)sqlite3_column_text(st, i);
        cJSON *j = embed_json ? cJSON_Parse(t) : NULL;
        if (j && (cJSON_IsArray(j) || cJSON_IsObject(j))) {
            char *p = cJSON_PrintUnformatted(j);
            if (p) fputs(p, f);
            else td_json_fput_str(f, t);
            cJSON_free(p);
        } else {
            td_json_fput_str(f, t);
        }
        cJSON_Delete(j);
        break;
    }
    default: fputs("null", f); break;
    }
}

static void csv_field(FILE *f, sqlite3_stmt *st, int i)
{
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_INTEGER: fprintf(f, "%lld", (long long)sqlite3_column_int64(st, i)); break;
    case SQLITE_FLOAT: fprintf(f, "%.17g", sqlite3_column_double(st, i)); break;
    case SQLITE_TEXT: {
        const char *t = (const char *)sqlite3_column_text(st, i);
        if (!strpbrk(t, ",\"\r\n")) {
            fputs(t, f);
            break;
        }
        fputc('"', f);
        for (; *t; t++) {
            if (*t == '"') fputc('"', f);
            fputc(*t, f);
        }
        fputc('"', f);
        break;
    }
    default: break; /* NULL: empty field */
    }
}

static td_status write_check(FILE *f, td_err *err)
{
    if (ferror(f)) return td_err_set(err, TD_ERR_IO, "write error during export: %s", strerror(errno));
    return TD_OK;
}

/* ==== export ================================================================================= */

td_status td_db_export_json(td_db *db, const int64_t *runs, size_t n_runs, FILE *f, td_err *err)
{
    char cols[2048], sql[4096], now[TD_PROV_TIME_LEN + 1];
    if (!col_list(cols, sizeof cols, td_db_run_cols, td_db_n_run_cols, ""))
        return td_err_set(err, TD_ERR_INTERNAL, "run columns too long");
    snprintf(sql, sizeof sql, "SELECT %s FROM runs WHERE id = ?1", cols);
    sqlite3_stmt *rs;
    td_status s = td_db_prepare(db, sql, &rs, err);
    if (s != TD_OK) return s;
    sqlite3_stmt *ts[TD_DB_T_COUNT] = {0};
    for (size_t t = 0; t < TD_DB_T_COUNT && s == TD_OK; t++) {
        if (!col_list(cols, sizeof cols, td_db_tables[t].cols, td_db_tables[t].n_cols, "")) {
            s = td_err_set(err, TD_ERR_INTERNAL, "columns too long");
            break;
        }
        /* key order: the primary key's own order, so the scan needs no sort */
        char keys[512];
        col_list(keys, sizeof keys, td_db_tables[t].cols, td_db_tables[t].n_key, "");
        snprintf(sql, sizeof sql, "SELECT %s FROM %s WHERE run_id = ?1 ORDER BY %s", cols, td_db_tables[t].name, keys);
        s = td_db_prepare(db, sql, &ts[t], err);
    }
    td_prov_now_iso(now);
    if (s == TD_OK)
        fprintf(f, "{\"format\": \"%s\", \"format_version\": %d, \"schema_version\": %d, "
                   "\"exported_at\": \"%s\", \"tandem_version\": \"%s\", \"runs\": [",
                EXPORT_FORMAT, EXPORT_FORMAT_VERSION, TD_DB_SCHEMA_VERSION, now, td_version());
    for (size_t r = 0; r < n_runs && s == TD_OK; r++) {
        sqlite3_bind_int64(rs, 1, runs[r]);
        int rc = sqlite3_step(rs);
        if (rc != SQLITE_ROW) {
            s = rc == SQLITE_DONE ? td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)runs[r])
                                  : td_db_sqlerr(db->h, rc, err, db->path);
            break;
        }
        fputs(r ? ",\n{" : "\n{", f);
        for (int i = 0; i < (int)td_db_n_run_cols; i++) {
            fprintf(f, "%s\"%s\": ", i ? ", " : "", td_db_run_cols[i].name);
            json_value(f, rs, i, is_json_text_col(td_db_run_cols[i].name));
        }
        sqlite3_reset(rs);
        fputs(", \"results\": {", f);
        for (size_t t = 0; t < TD_DB_T_COUNT && s == TD_OK; t++) {
            const td_db_table *tb = &td_db_tables[t];
            fprintf(f, "%s\n  \"%s\": [", t ? "," : "", tb->name);
            sqlite3_bind_int64(ts[t], 1, runs[r]);
            int k = 0;
            while ((rc = sqlite3_step(ts[t])) == SQLITE_ROW) {
                fputs(k++ ? ",\n    {" : "\n    {", f);
                for (int i = 0; i < (int)tb->n_cols; i++) {
                    fprintf(f, "%s\"%s\": ", i ? ", " : "", tb->cols[i].name);
                    json_value(f, ts[t], i, false);
                }
                fputc('}', f);
            }
            if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
            sqlite3_reset(ts[t]);
            fputc(']', f);
        }
        fputs("}}", f);
        if (s == TD_OK) s = write_check(f, err);
    }
    if (s == TD_OK) {
        fputs("\n]}\n", f);
        s = write_check(f, err);
    }
    sqlite3_finalize(rs);
    for (size_t t = 0; t < TD_DB_T_COUNT; t++) sqlite3_finalize(ts[t]);
    return s;
}

td_status td_db_export_csv(td_db *db, const int64_t *runs, size_t n_runs, const char *table, FILE *f,
                           td_err *err)
{
    const td_db_table *tb = table ? td_db_table_find(table) : &td_db_tables[TD_DB_T_LAYER];
    if (!tb) {
        char list[256] = "";
        for (size_t i = 0; i < TD_DB_T_COUNT; i++) {
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, td_db_tables[i].name, sizeof list - strlen(list) - 1);
        }
        return td_err_set(err, TD_ERR_ARG, "--table '%s': one of %s", table, list);
    }
    char cols[2048], sql[4096];
    if (!col_list(cols, sizeof cols, tb->cols, tb->n_cols, "t."))
        return td_err_set(err, TD_ERR_INTERNAL, "columns too long");
    char keys[512];
    col_list(keys, sizeof keys, tb->cols, tb->n_key, "t.");
    snprintf(sql, sizeof sql, "SELECT r.uid, %s FROM %s t JOIN runs r ON r.id = t.run_id WHERE t.run_id = ?1 "
                              "ORDER BY %s", cols, tb->name, keys);
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, sql, &st, err);
    if (s != TD_OK) return s;
    fputs("run_uid", f);
    for (size_t i = 0; i < tb->n_cols; i++) fprintf(f, ",%s", tb->cols[i].name);
    fputc('\n', f);
    for (size_t r = 0; r < n_runs && s == TD_OK; r++) {
        int64_t exists;
        s = td_db_query_int(db, "SELECT count(*) FROM runs WHERE id = ?1", runs[r], &exists, err);
        if (s == TD_OK && !exists)
            s = td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)runs[r]);
        if (s != TD_OK) break;
        sqlite3_bind_int64(st, 1, runs[r]);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            for (int i = 0; i <= (int)tb->n_cols; i++) {
                if (i) fputc(',', f);
                csv_field(f, st, i);
            }
            fputc('\n', f);
        }
        if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (s == TD_OK) s = write_check(f, err);
    return s;
}

/* ==== import ================================================================================= */

/* Bind JSON member `c` of `obj` to parameter i according to the column's type. */
static td_status bind_json(sqlite3_stmt *st, int i, const cJSON *obj, const td_db_col *c, const char *where,
                           td_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, c->name);
    if (!v || cJSON_IsNull(v)) {
        if (c->required) return td_err_set(err, TD_ERR_FORMAT, "%s: missing \"%s\"", where, c->name);
        sqlite3_bind_null(st, i);
        return TD_OK;
    }
    switch (c->type) {
    case TD_DB_COL_INT: {
        int64_t x;
        if (cJSON_IsBool(v)) x = cJSON_IsTrue(v);
        else if (td_json_as_int(v, where, &x, err) != TD_OK)
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be an integer", where, c->name);
        sqlite3_bind_int64(st, i, x);
        return TD_OK;
    }
    case TD_DB_COL_REAL:
        if (!cJSON_IsNumber(v)) return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a number", where, c->name);
        sqlite3_bind_double(st, i, v->valuedouble);
        return TD_OK;
    case TD_DB_COL_TEXT:
        if (cJSON_IsString(v)) {
            sqlite3_bind_text(st, i, v->valuestring, -1, SQLITE_TRANSIENT);
            return TD_OK;
        }
        if (is_json_text_col(c->name) && (cJSON_IsArray(v) || cJSON_IsObject(v))) {
            char *p = cJSON_PrintUnformatted(v);
            if (!p) return nomem(err);
            sqlite3_bind_text(st, i, p, -1, SQLITE_TRANSIENT);
            cJSON_free(p);
            return TD_OK;
        }
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a string", where, c->name);
    }
    return TD_ERR_INTERNAL;
}

/* A uid for a run object that has none: SHA-256 of its JSON text (so re-importing the same
 * file finds the same uid). */
static td_status derived_uid(const cJSON *run, char out[37], td_err *err)
{
    char *txt = cJSON_PrintUnformatted(run);
    if (!txt) return nomem(err);
    uint8_t d[32];
    td_sha256(txt, strlen(txt), d);
    cJSON_free(txt);
    static const char hexd[] = "0123456789abcdef";
    size_t o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
        out[o++] = hexd[d[i] >> 4];
        out[o++] = hexd[d[i] & 15];
    }
    out[o] = '\0';
    return TD_OK;
}

static bool uid_valid(const char *u)
{
    size_t n = strlen(u);
    if (n < 8 || n > 64) return false;
    for (const char *p = u; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '-'))
            return false;
    return true;
}

static bool table_col_known(const td_db_table *tb, const char *name)
{
    for (size_t i = 0; i < tb->n_cols; i++)
        if (!strcmp(tb->cols[i].name, name)) return true;
    return false;
}

static td_status import_run(td_db *db, const cJSON *run, const char *where, const char *origin,
                            sqlite3_stmt *ins_run, sqlite3_stmt *const *ins, td_db_transfer_stats *stats,
                            td_err *err)
{
    if (!cJSON_IsObject(run)) return td_err_set(err, TD_ERR_FORMAT, "%s: a run must be an object", where);
    for (const cJSON *k = run->child; k; k = k->next) {
        bool known = !strcmp(k->string, "results");
        for (size_t i = 0; i < td_db_n_run_cols && !known; i++) known = !strcmp(k->string, td_db_run_cols[i].name);
        if (!known) return td_err_set(err, TD_ERR_FORMAT, "%s: unknown run field \"%s\"", where, k->string);
    }
    char uid[65];
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(run, "uid");
    if (u && !cJSON_IsNull(u)) {
        if (!cJSON_IsString(u) || !uid_valid(u->valuestring))
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"uid\" must be 8..64 characters [A-Za-z0-9-]", where);
        snprintf(uid, sizeof uid, "%s", u->valuestring);
    } else {
        td_status s = derived_uid(run, uid, err);
        if (s != TD_OK) return s;
    }
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(run, "status");
    if (cJSON_IsString(status) && !strcmp(status->valuestring, "running")) {
        stats->runs_running++;
        return TD_OK;
    }
    sqlite3_stmt *q;
    td_status s = td_db_prepare(db, "SELECT id FROM runs WHERE uid = ?1", &q, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(q, 1, uid, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_finalize(q);
    if (rc == SQLITE_ROW) {
        stats->runs_present++;
        return TD_OK;
    }
    /* run row: uid from above, origin defaulted, three provenance fields defaulted */
    for (size_t i = 0; i < td_db_n_run_cols; i++) {
        const td_db_col *c = &td_db_run_cols[i];
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(run, c->name);
        int pi = (int)i + 1;
        if (!strcmp(c->name, "uid")) {
            sqlite3_bind_text(ins_run, pi, uid, -1, SQLITE_TRANSIENT);
        } else if (!strcmp(c->name, "origin") && (!v || cJSON_IsNull(v))) {
            sqlite3_bind_text(ins_run, pi, origin, -1, SQLITE_TRANSIENT);
        } else if ((!v || cJSON_IsNull(v)) && (!strcmp(c->name, "tandem_version") || !strcmp(c->name, "git_commit") ||
                                              !strcmp(c->name, "host"))) {
            sqlite3_bind_text(ins_run, pi, "unknown", -1, SQLITE_STATIC);
        } else if ((!v || cJSON_IsNull(v)) && is_json_text_col(c->name)) {
            sqlite3_bind_text(ins_run, pi, !strcmp(c->name, "env") ? "{}" : "[]", -1, SQLITE_STATIC);
        } else {
            s = bind_json(ins_run, pi, run, c, where, err);
            if (s != TD_OK) break;
        }
    }
    if (s == TD_OK) {
        rc = sqlite3_step(ins_run);
        if (rc != SQLITE_DONE) {
            char ctx[300];
            snprintf(ctx, sizeof ctx, "%s", where);
            s = td_db_sqlerr(db->h, rc, err, ctx);
        }
    }
    sqlite3_reset(ins_run);
    sqlite3_clear_bindings(ins_run);
    if (s != TD_OK) return s;
    int64_t run_id = sqlite3_last_insert_rowid(db->h);
    stats->runs_added++;

    const cJSON *results = cJSON_GetObjectItemCaseSensitive(run, "results");
    if (!results || cJSON_IsNull(results)) return TD_OK;
    if (!cJSON_IsObject(results)) return td_err_set(err, TD_ERR_FORMAT, "%s: \"results\" must be an object", where);
    for (const cJSON *tj = results->child; tj && s == TD_OK; tj = tj->next) {
        const td_db_table *tb = td_db_table_find(tj->string);
        if (!tb) return td_err_set(err, TD_ERR_FORMAT, "%s: unknown result table \"%s\"", where, tj->string);
        if (!cJSON_IsArray(tj)) return td_err_set(err, TD_ERR_FORMAT, "%s.%s: must be an array", where, tj->string);
        sqlite3_stmt *st = ins[tb - td_db_tables];
        int idx = 0;
        for (const cJSON *row = tj->child; row && s == TD_OK; row = row->next, idx++) {
            char rwhere[400];
            snprintf(rwhere, sizeof rwhere, "%s.%s[%d]", where, tb->name, idx);
            if (!cJSON_IsObject(row)) return td_err_set(err, TD_ERR_FORMAT, "%s: must be an object", rwhere);
            for (const cJSON *k = row->child; k; k = k->next)
                if (!table_col_known(tb, k->string))
                    return td_err_set(err, TD_ERR_FORMAT, "%s: unknown field \"%s\"", rwhere, k->string);
            sqlite3_bind_int64(st, 1, run_id);
            for (size_t c = 0; c < tb->n_cols && s == TD_OK; c++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(row, tb->cols[c].name);
                if ((!v || cJSON_IsNull(v)) && !tb->cols[c].required) {
                    /* absent optional text keys use the column default '' where one exists */
                    if (tb->cols[c].type == TD_DB_COL_TEXT &&
                        (!strcmp(tb->cols[c].name, "stage") || !strcmp(tb->cols[c].name, "variant") ||
                         !strcmp(tb->cols[c].name, "shape") || !strcmp(tb->cols[c].name, "dtype")))
                        sqlite3_bind_text(st, (int)c + 2, "", 0, SQLITE_STATIC);
                    else if (!strcmp(tb->cols[c].name, "rep") || !strcmp(tb->cols[c].name, "higher_is_better"))
                        sqlite3_bind_int(st, (int)c + 2, 0);
                    else sqlite3_bind_null(st, (int)c + 2);
                    continue;
                }
                s = bind_json(st, (int)c + 2, row, &tb->cols[c], rwhere, err);
            }
            if (s == TD_OK) {
                rc = sqlite3_step(st);
                if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, rwhere);
                else stats->rows_added++;
            }
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
        }
    }
    return s;
}

/* Prepare the INSERT of `runs` (all descriptor columns) and of each result table. */
static td_status prepare_inserts(td_db *db, sqlite3_stmt **ins_run, sqlite3_stmt **ins, td_err *err)
{
    char cols[2048], sql[4096];
    size_t o;
    col_list(cols, sizeof cols, td_db_run_cols, td_db_n_run_cols, "");
    o = (size_t)snprintf(sql, sizeof sql, "INSERT INTO runs (%s) VALUES (", cols);
    for (size_t i = 0; i < td_db_n_run_cols; i++)
        o += (size_t)snprintf(sql + o, sizeof sql - o, "%s?%zu", i ? ", " : "", i + 1);
    snprintf(sql + o, sizeof sql - o, ")");
    td_status s = td_db_prepare(db, sql, ins_run, err);
    for (size_t t = 0; t < TD_DB_T_COUNT && s == TD_OK; t++) {
        const td_db_table *tb = &td_db_tables[t];
        col_list(cols, sizeof cols, tb->cols, tb->n_cols, "");
        o = (size_t)snprintf(sql, sizeof sql, "INSERT INTO %s (run_id, %s) VALUES (?1", tb->name, cols);
        for (size_t i = 0; i < tb->n_cols; i++) o += (size_t)snprintf(sql + o, sizeof sql - o, ", ?%zu", i + 2);
        snprintf(sql + o, sizeof sql - o, ")");
        s = td_db_prepare(db, sql, &ins[t], err);
    }
    return s;
}

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

td_status td_db_import_json(td_db *db, const char *path, td_db_transfer_stats *stats, td_err *err)
{
    memset(stats, 0, sizeof *stats);
    cJSON *doc;
    td_status s = td_json_read_file(path, IMPORT_MAX_BYTES, &doc, err);
    if (s != TD_OK) return s;
    const char *fmt = NULL;
    int64_t ver = 0;
    if (!cJSON_IsObject(doc) || td_json_get_str(doc, "format", path, &fmt, err) != TD_OK ||
        strcmp(fmt, EXPORT_FORMAT)) {
        cJSON_Delete(doc);
        return td_err_set(err, TD_ERR_FORMAT, "%s: not a tandem results export (\"format\": \"%s\" expected)", path,
                          EXPORT_FORMAT);
    }
    if (td_json_get_int(doc, "format_version", path, &ver, err) != TD_OK || ver != EXPORT_FORMAT_VERSION) {
        cJSON_Delete(doc);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: export format version %lld; this tandem reads version %d",
                          path, (long long)ver, EXPORT_FORMAT_VERSION);
    }
    const cJSON *runs = cJSON_GetObjectItemCaseSensitive(doc, "runs");
    if (!cJSON_IsArray(runs)) {
        cJSON_Delete(doc);
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"runs\" must be an array", path);
    }
    char origin[300];
    snprintf(origin, sizeof origin, "import:%s", base_name(path));
    sqlite3_stmt *ins_run = NULL, *ins[TD_DB_T_COUNT] = {0};
    s = prepare_inserts(db, &ins_run, ins, err);
    bool owned = false;
    if (s == TD_OK) s = td_db_tx_begin(db, &owned, err);
    int idx = 0;
    for (const cJSON *r = runs->child; r && s == TD_OK; r = r->next, idx++) {
        char where[300];
        snprintf(where, sizeof where, "%s: runs[%d]", path, idx);
        s = import_run(db, r, where, origin, ins_run, ins, stats, err);
    }
    if (s == TD_OK) s = td_db_tx_commit(db, owned, err);
    else td_db_tx_rollback(db, owned);
    sqlite3_finalize(ins_run);
    for (size_t t = 0; t < TD_DB_T_COUNT; t++) sqlite3_finalize(ins[t]);
    cJSON_Delete(doc);
    if (s != TD_OK) {
        int64_t keep = stats->runs_running;
        memset(stats, 0, sizeof *stats);
        stats->runs_running = keep;
    }
    return s;
}

/* ==== merge ================================================================================== */

/* "file:" URI for a path, percent-encoding what URIs reserve; read-only. */
static bool path_uri(const char *path, char *out, size_t cap)
{
    static const char hexd[] = "0123456789ABCDEF";
    size_t o = 0;
    int k = snprintf(out, cap, "file:");
    if (k < 0 || (size_t)k >= cap) return false;
    o = (size_t)k;
    if (path[0] == '/' && path[1] == '/') { /* keep "//" from reading as an authority */
        while (path[1] == '/') path++;
    }
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                     strchr("/-_.~", *p);
        if (o + 4 >= cap) return false;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hexd[*p >> 4];
            out[o++] = hexd[*p & 15];
        }
    }
    k = snprintf(out + o, cap - o, "?mode=ro");
    return k > 0 && (size_t)k < cap - o;
}

static td_status merge_exec(td_db *db, const char *sql, td_err *err)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) return td_db_sqlerr(db->h, rc, err, db->path);
    return TD_OK;
}

td_status td_db_merge(td_db *db, const char *other_path, td_db_transfer_stats *stats, td_err *err)
{
    memset(stats, 0, sizeof *stats);
    /* the source must be a sound tandem store of this schema version: open it read-only
     * with every check, then let go of it */
    td_db *other;
    td_status s = td_db_open(other_path, TD_DB_READONLY, &other, err);
    if (s != TD_OK) return td_err_prefix(err, "merge source: ");
    td_db_close(other);
    struct stat a, b;
    if (stat(db->path, &a) == 0 && stat(other_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return td_err_set(err, TD_ERR_ARG, "%s: cannot merge a store into itself", other_path);

    char uri[8192];
    if (!path_uri(other_path, uri, sizeof uri)) return td_err_set(err, TD_ERR_ARG, "%s: path too long", other_path);
    sqlite3_stmt *st;
    s = td_db_prepare(db, "ATTACH DATABASE ?1 AS src", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 1, uri, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return td_db_sqlerr(db->h, rc, err, other_path);

    bool owned = false;
    s = td_db_tx_begin(db, &owned, err);
    if (s == TD_OK)
        s = merge_exec(db,
                       "CREATE TEMP TABLE IF NOT EXISTS merge_map (src_id INTEGER PRIMARY KEY, dst_id INTEGER);"
                       "DELETE FROM temp.merge_map;"
                       "INSERT INTO temp.merge_map (src_id) SELECT s.id FROM src.runs s WHERE s.status <> 'running' "
                       "AND NOT EXISTS (SELECT 1 FROM main.runs m WHERE m.uid = s.uid) ORDER BY s.id;", err);
    if (s == TD_OK)
        s = td_db_query_int(db, "SELECT count(*) FROM src.runs s WHERE s.status = 'running' AND NOT EXISTS "
                                "(SELECT 1 FROM main.runs m WHERE m.uid = s.uid)", 0, &stats->runs_running, err);
    if (s == TD_OK)
        s = td_db_query_int(db, "SELECT count(*) FROM src.runs s WHERE EXISTS "
                                "(SELECT 1 FROM main.runs m WHERE m.uid = s.uid)", 0, &stats->runs_present, err);
    if (s == TD_OK) s = td_db_query_int(db, "SELECT count(*) FROM temp.merge_map", 0, &stats->runs_added, err);
    char cols[2048], pcols[2048], sql[8192];
    if (s == TD_OK) {
        col_list(cols, sizeof cols, td_db_run_cols, td_db_n_run_cols, "");
        col_list(pcols, sizeof pcols, td_db_run_cols, td_db_n_run_cols, "s.");
        /* merged runs say where they came from unless they already do */
        char *o = strstr(pcols, "s.origin");
        TD_ASSERT(o && !strcmp(o, "s.origin"));
        snprintf(o, sizeof pcols - (size_t)(o - pcols), "coalesce(s.origin, 'merge:' || s.host)");
        snprintf(sql, sizeof sql,
                 "INSERT INTO main.runs (%s) SELECT %s FROM src.runs s JOIN temp.merge_map mm ON mm.src_id = s.id "
                 "ORDER BY s.id;"
                 "UPDATE temp.merge_map SET dst_id = (SELECT m.id FROM main.runs m JOIN src.runs s ON s.uid = m.uid "
                 "WHERE s.id = temp.merge_map.src_id);", cols, pcols);
        s = merge_exec(db, sql, err);
    }
    for (size_t t = 0; t < TD_DB_T_COUNT && s == TD_OK; t++) {
        const td_db_table *tb = &td_db_tables[t];
        col_list(cols, sizeof cols, tb->cols, tb->n_cols, "");
        col_list(pcols, sizeof pcols, tb->cols, tb->n_cols, "s.");
        snprintf(sql, sizeof sql,
                 "INSERT INTO main.%s (run_id, %s) SELECT mm.dst_id, %s FROM src.%s s JOIN temp.merge_map mm "
                 "ON mm.src_id = s.run_id", tb->name, cols, pcols, tb->name);
        s = merge_exec(db, sql, err);
        if (s == TD_OK) stats->rows_added += sqlite3_changes(db->h);
    }
    if (s == TD_OK)
        s = td_db_query_int(db, "SELECT count(*) FROM src.baselines sb JOIN main.baselines b ON b.name = sb.name "
                                "WHERE b.run_uid <> sb.run_uid", 0, &stats->baselines_conflicting, err);
    if (s == TD_OK) {
        s = merge_exec(db,
                       "INSERT INTO main.baselines (name, run_uid, set_at) SELECT sb.name, sb.run_uid, sb.set_at "
                       "FROM src.baselines sb WHERE NOT EXISTS (SELECT 1 FROM main.baselines b "
                       "WHERE b.name = sb.name) AND EXISTS (SELECT 1 FROM main.runs m WHERE m.uid = sb.run_uid)",
                       err);
        if (s == TD_OK) stats->baselines_added = sqlite3_changes(db->h);
    }
    if (s == TD_OK) s = merge_exec(db, "DROP TABLE temp.merge_map", err);
    if (s == TD_OK) s = td_db_tx_commit(db, owned, err);
    else td_db_tx_rollback(db, owned);
    sqlite3_exec(db->h, "DETACH DATABASE src", NULL, NULL, NULL);
    if (s != TD_OK) memset(stats, 0, sizeof *stats);
    return s;
}
