/* write.c — batches and typed result writers (db.h). One cached prepared statement per
 * result table; a batch is one BEGIN IMMEDIATE ... COMMIT transaction. */
#include "db_int.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const put_sql[TD_DB_PUT_COUNT] = {
    [TD_DB_PUT_LAYER] =
        "INSERT INTO layer_cmp (run_id, layer, rank, tokens, tap, variant_a, variant_b, expectation, "
        "dtype, numel, exact, mismatches, max_abs, rel_l2, max_ulp, nmse, cosine, finite, first_diff, "
        "verdict) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
        "?18, ?19, ?20)",
    [TD_DB_PUT_ENCODING] =
        "INSERT INTO encoding_checks (run_id, check_name, stage, variant, elements, mismatches, "
        "nan_mismatches, first_diff, exact, verdict, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
        "?9, ?10, ?11)",
    [TD_DB_PUT_CENSUS] =
        "INSERT INTO scale_census (run_id, tensor, code, count) VALUES (?1, ?2, ?3, ?4)",
    [TD_DB_PUT_COMPLETION] =
        "INSERT INTO completions (run_id, variant, batch, request, rep, length, hash, reference, "
        "first_divergence, margin, token_ids, reference_margin) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
        "?9, ?10, ?11, ?12)",
    [TD_DB_PUT_QUALITY] =
        "INSERT INTO quality (run_id, suite, metric, variant, value, stderr, n, threshold, "
        "higher_is_better, pass) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [TD_DB_PUT_TIMING] =
        "INSERT INTO timings (run_id, bench, shape, metric, variant, value, unit, n, stddev, "
        "higher_is_better) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [TD_DB_PUT_RUN_CHECK] = "SELECT status FROM runs WHERE id = ?1",
};

static td_status put_stmt(td_db *db, td_db_put_id id, sqlite3_stmt **st, td_err *err)
{
    if (!db->put[id]) {
        int rc = sqlite3_prepare_v3(db->h, put_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &db->put[id], NULL);
        if (rc != SQLITE_OK) {
            db->put[id] = NULL;
            return td_db_sqlerr(db->h, rc, err, db->path);
        }
    }
    *st = db->put[id];
    return TD_OK;
}

/* ==== batches ================================================================================ */

td_status td_db_batch_begin(td_db *db, td_err *err)
{
    TD_ASSERT(db && !db->in_batch);
    if (db->flags & TD_DB_READONLY) return td_err_set(err, TD_ERR_ARG, "%s: opened read-only", db->path);
    td_status s = td_db_exec(db, "BEGIN IMMEDIATE", err);
    if (s != TD_OK) return s;
    db->in_batch = true;
    db->checked_run = 0;
    return TD_OK;
}

td_status td_db_batch_commit(td_db *db, td_err *err)
{
    TD_ASSERT(db && db->in_batch);
    td_status s = td_db_exec(db, "COMMIT", err);
    db->in_batch = false;
    db->checked_run = 0;
    if (s != TD_OK && !sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

void td_db_batch_rollback(td_db *db)
{
    if (!db || !db->in_batch) return;
    if (!sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    db->in_batch = false;
    db->checked_run = 0;
}

/* ==== validation helpers ===================================================================== */

/* Results may only be added to a running run; checked once per run and transaction. */
static td_status check_run(td_db *db, int64_t run_id, td_err *err)
{
    if (db->checked_run == run_id && db->in_batch) return TD_OK;
    sqlite3_stmt *st;
    td_status s = put_stmt(db, TD_DB_PUT_RUN_CHECK, &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, run_id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const char *status = (const char *)sqlite3_column_text(st, 0);
        if (strcmp(status, "running"))
            s = td_err_set(err, TD_ERR_ARG, "%s: run %lld is %s; results can only be added to a running run",
                           db->path, (long long)run_id, status);
    } else if (rc == SQLITE_DONE) {
        s = td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)run_id);
    } else {
        s = td_db_sqlerr(db->h, rc, err, db->path);
    }
    sqlite3_reset(st);
    if (s == TD_OK) db->checked_run = run_id;
    return s;
}

static td_status need_str(const char *v, const char *what, const char *field, td_err *err)
{
    if (!v || !*v) return td_err_set(err, TD_ERR_ARG, "%s: field '%s' is required", what, field);
    return TD_OK;
}

/* Execute a bound insert inside the batch, or as its own transaction. */
static td_status put_exec(td_db *db, sqlite3_stmt *st, const char *what, td_err *err)
{
    int rc = sqlite3_step(st);
    td_status s = TD_OK;
    if (rc != SQLITE_DONE) {
        char ctx[256];
        snprintf(ctx, sizeof ctx, "%s: %s", db->path, what);
        s = td_db_sqlerr(db->h, rc, err, ctx);
    }
    /* every put binds every parameter, so stale bindings are never read: no clear needed */
    sqlite3_reset(st);
    return s;
}

typedef td_status (*bind_fn)(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *row, td_err *err);

static td_status put_row(td_db *db, td_db_put_id id, const char *what, int64_t run_id, const void *row,
                         bind_fn bind, td_err *err)
{
    TD_ASSERT(db && row);
    if (db->flags & TD_DB_READONLY) return td_err_set(err, TD_ERR_ARG, "%s: opened read-only", db->path);
    sqlite3_stmt *st;
    td_status s = put_stmt(db, id, &st, err);
    if (s != TD_OK) return s;
    bool owned;
    s = td_db_tx_begin(db, &owned, err);
    if (s != TD_OK) return s;
    s = check_run(db, run_id, err);
    if (s == TD_OK) {
        sqlite3_bind_int64(st, 1, run_id);
        s = bind(db, st, run_id, row, err);
        if (s == TD_OK) s = put_exec(db, st, what, err);
        else {
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
        }
    }
    if (s == TD_OK) return td_db_tx_commit(db, owned, err);
    td_db_tx_rollback(db, owned);
    return s;
}

/* ==== typed writers ========================================================================== */

static td_status bind_layer(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_layer_row *r = p;
    td_status s = need_str(r->tap, "layer result", "tap", err);
    if (s == TD_OK) s = need_str(r->variant_a, "layer result", "variant_a", err);
    if (s == TD_OK) s = need_str(r->variant_b, "layer result", "variant_b", err);
    if (s != TD_OK) return s;
    const char *ex = td_db_expect_name(r->expectation), *vd = td_db_verdict_name(r->verdict);
    if (!ex || !vd) return td_err_set(err, TD_ERR_ARG, "layer result %s: invalid expectation or verdict", r->tap);
    if (r->tokens < 0 || r->rank < 0 || r->layer < -1)
        return td_err_set(err, TD_ERR_ARG, "layer result %s: negative layer/rank/tokens", r->tap);
    sqlite3_bind_int(st, 2, r->layer);
    sqlite3_bind_int(st, 3, r->rank);
    sqlite3_bind_int(st, 4, r->tokens);
    sqlite3_bind_text(st, 5, r->tap, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, r->variant_a, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, r->variant_b, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, ex, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, r->dtype ? r->dtype : "", -1, SQLITE_STATIC);
    td_db_bind_count(st, 10, r->numel);
    sqlite3_bind_int(st, 11, r->exact ? 1 : 0);
    td_db_bind_count(st, 12, r->mismatches);
    td_db_bind_real(st, 13, r->max_abs);
    td_db_bind_real(st, 14, r->rel_l2);
    td_db_bind_count(st, 15, r->max_ulp);
    td_db_bind_real(st, 16, r->nmse);
    td_db_bind_real(st, 17, r->cosine);
    sqlite3_bind_int(st, 18, r->finite ? 1 : 0);
    td_db_bind_count(st, 19, r->first_diff);
    sqlite3_bind_text(st, 20, vd, -1, SQLITE_STATIC);
    return TD_OK;
}

td_status td_db_put_layer(td_db *db, int64_t run_id, const td_db_layer_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_LAYER, "layer result", run_id, row, bind_layer, err);
}

td_status td_db_put_layers(td_db *db, int64_t run_id, const td_db_layer_row *rows, size_t n, td_err *err)
{
    bool owned;
    td_status s = td_db_tx_begin(db, &owned, err);
    if (s != TD_OK) return s;
    bool was = db->in_batch;
    db->in_batch = true; /* rows join this transaction */
    for (size_t i = 0; i < n && s == TD_OK; i++) s = td_db_put_layer(db, run_id, &rows[i], err);
    db->in_batch = was;
    if (s == TD_OK) return td_db_tx_commit(db, owned, err);
    td_db_tx_rollback(db, owned);
    return s;
}

static td_status bind_encoding(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_encoding_row *r = p;
    td_status s = need_str(r->check_name, "encoding check", "check_name", err);
    if (s != TD_OK) return s;
    const char *vd = td_db_verdict_name(r->verdict);
    if (!vd) return td_err_set(err, TD_ERR_ARG, "encoding check %s: invalid verdict", r->check_name);
    sqlite3_bind_text(st, 2, r->check_name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->stage ? r->stage : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->variant ? r->variant : "", -1, SQLITE_STATIC);
    td_db_bind_count(st, 5, r->elements);
    td_db_bind_count(st, 6, r->mismatches);
    td_db_bind_count(st, 7, r->nan_mismatches);
    td_db_bind_count(st, 8, r->first_diff);
    sqlite3_bind_int(st, 9, r->exact ? 1 : 0);
    sqlite3_bind_text(st, 10, vd, -1, SQLITE_STATIC);
    td_db_bind_text(st, 11, r->detail);
    return TD_OK;
}

td_status td_db_put_encoding(td_db *db, int64_t run_id, const td_db_encoding_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_ENCODING, "encoding check", run_id, row, bind_encoding, err);
}

static td_status bind_census(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_census_row *r = p;
    td_status s = need_str(r->tensor, "scale census", "tensor", err);
    if (s != TD_OK) return s;
    if (r->code < 0 || r->code > 255 || r->count < 0)
        return td_err_set(err, TD_ERR_ARG, "scale census %s: code %d / count %lld out of range", r->tensor,
                          r->code, (long long)r->count);
    sqlite3_bind_text(st, 2, r->tensor, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, r->code);
    sqlite3_bind_int64(st, 4, r->count);
    return TD_OK;
}

td_status td_db_put_census(td_db *db, int64_t run_id, const td_db_census_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_CENSUS, "scale census", run_id, row, bind_census, err);
}

static td_status bind_completion(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_completion_row *r = p;
    td_status s = need_str(r->variant, "completion", "variant", err);
    if (s == TD_OK) s = need_str(r->request, "completion", "request", err);
    if (s == TD_OK) s = need_str(r->hash, "completion", "hash", err);
    if (s != TD_OK) return s;
    if (r->batch < 1 || r->rep < 0 || r->length < 0)
        return td_err_set(err, TD_ERR_ARG, "completion %s: batch must be >= 1, rep and length >= 0", r->request);
    sqlite3_bind_text(st, 2, r->variant, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, r->batch);
    sqlite3_bind_text(st, 4, r->request, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, r->rep);
    sqlite3_bind_int64(st, 6, r->length);
    sqlite3_bind_text(st, 7, r->hash, -1, SQLITE_STATIC);
    td_db_bind_text(st, 8, r->reference);
    td_db_bind_count(st, 9, r->first_divergence);
    td_db_bind_real(st, 10, r->margin);
    if (r->tokens) {
        /* "[" + up to 12 characters per id ("-2147483648,") + "]" */
        if (r->length > (INT32_MAX - 3) / 12)
            return td_err_set(err, TD_ERR_ARG, "completion %s: %lld tokens is too long", r->request,
                              (long long)r->length);
        const size_t cap = (size_t)r->length * 12 + 3;
        char *txt = malloc(cap);
        if (!txt) return td_err_set(err, TD_ERR_NOMEM, "completion %s: out of memory (token ids)", r->request);
        size_t o = 0;
        txt[o++] = '[';
        for (int64_t i = 0; i < r->length; i++)
            o += (size_t)snprintf(txt + o, cap - o, "%s%d", i ? "," : "", (int)r->tokens[i]);
        txt[o++] = ']';
        txt[o] = 0;
        sqlite3_bind_text(st, 11, txt, (int)o, free);
    } else {
        sqlite3_bind_null(st, 11);
    }
    td_db_bind_real(st, 12, r->first_divergence >= 0 ? r->reference_margin : (double)NAN);
    return TD_OK;
}

td_status td_db_put_completion(td_db *db, int64_t run_id, const td_db_completion_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_COMPLETION, "completion", run_id, row, bind_completion, err);
}

static td_status bind_quality(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_quality_row *r = p;
    td_status s = need_str(r->suite, "quality score", "suite", err);
    if (s == TD_OK) s = need_str(r->metric, "quality score", "metric", err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 2, r->suite, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->metric, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->variant ? r->variant : "", -1, SQLITE_STATIC);
    td_db_bind_real(st, 5, r->value);
    td_db_bind_real(st, 6, r->stderr_);
    td_db_bind_count(st, 7, r->n);
    td_db_bind_real(st, 8, r->threshold);
    sqlite3_bind_int(st, 9, r->higher_is_better ? 1 : 0);
    if (isnan(r->threshold)) {
        sqlite3_bind_null(st, 10);
    } else {
        /* a NaN value never passes a gate */
        bool pass = !isnan(r->value) &&
                    (r->higher_is_better ? r->value >= r->threshold : r->value <= r->threshold);
        sqlite3_bind_int(st, 10, pass ? 1 : 0);
    }
    return TD_OK;
}

td_status td_db_put_quality(td_db *db, int64_t run_id, const td_db_quality_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_QUALITY, "quality score", run_id, row, bind_quality, err);
}

static td_status bind_timing(td_db *db, sqlite3_stmt *st, int64_t run_id, const void *p, td_err *err)
{
    (void)db;
    (void)run_id;
    const td_db_timing_row *r = p;
    td_status s = need_str(r->bench, "timing", "bench", err);
    if (s == TD_OK) s = need_str(r->metric, "timing", "metric", err);
    if (s == TD_OK) s = need_str(r->unit, "timing", "unit", err);
    if (s != TD_OK) return s;
    sqlite3_bind_text(st, 2, r->bench, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->shape ? r->shape : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->metric, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, r->variant ? r->variant : "", -1, SQLITE_STATIC);
    td_db_bind_real(st, 6, r->value);
    sqlite3_bind_text(st, 7, r->unit, -1, SQLITE_STATIC);
    td_db_bind_count(st, 8, r->n);
    td_db_bind_real(st, 9, r->stddev);
    sqlite3_bind_int(st, 10, r->higher_is_better ? 1 : 0);
    return TD_OK;
}

td_status td_db_put_timing(td_db *db, int64_t run_id, const td_db_timing_row *row, td_err *err)
{
    return put_row(db, TD_DB_PUT_TIMING, "timing", run_id, row, bind_timing, err);
}
