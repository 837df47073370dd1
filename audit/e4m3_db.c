/* e4m3_db.c — `tandem audit e4m3` results into the results store (see e4m3_db.h). */
#include "e4m3_db.h"
#include "db/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct td_e4m3_db {
    td_db *db;
    int64_t run;
    bool ended;
    /* per-check totals over every tensor written */
    int64_t elements, strict, fast, finite, range, rejected_elements;
    int64_t tensors, tensors_rejected, stages, stages_rejected;
};

td_status td_e4m3_db_open(const char *path, int argc, char *const *argv, const char *checkpoint,
                          uint64_t seed, td_e4m3_db **out, td_err *err)
{
    td_e4m3_db *d = calloc(1, sizeof *d);
    if (!d) return td_err_set(err, TD_ERR_NOMEM, "audit e4m3: out of memory");
    const char *p = td_db_path_resolve(path);
    td_status st = td_db_open(p, TD_DB_CREATE, &d->db, err);
    if (st) {
        free(d);
        return st;
    }
    td_db_run_info info;
    memset(&info, 0, sizeof info);
    info.kind = "audit.e4m3";
    info.argc = argc;
    info.argv = argv;
    info.checkpoint = checkpoint;
    info.seeds = &seed;
    info.n_seeds = 1;
    st = td_db_run_begin(d->db, &info, &d->run, err);
    if (st) {
        td_db_close(d->db);
        free(d);
        return st;
    }
    *out = d;
    return TD_OK;
}

int64_t td_e4m3_db_run_id(const td_e4m3_db *d)
{
    return d->run;
}

const char *td_e4m3_db_path(const td_e4m3_db *d)
{
    return td_db_path(d->db);
}

static td_status put(td_e4m3_db *d, const char *check, const char *stage, const char *variant,
                     int64_t elements, int64_t mismatches, int64_t nan_mismatches, int64_t first,
                     td_db_verdict verdict, const char *detail, td_err *err)
{
    td_db_encoding_row r;
    memset(&r, 0, sizeof r);
    r.check_name = check;
    r.stage = stage;
    r.variant = variant;
    r.elements = elements;
    r.mismatches = mismatches;
    r.nan_mismatches = nan_mismatches;
    r.first_diff = first;
    r.exact = mismatches == 0;
    r.verdict = verdict;
    r.detail = detail;
    return td_db_put_encoding(d->db, d->run, &r, err);
}

td_status td_e4m3_db_codec(td_e4m3_db *d, const td_codec_report *rep, td_err *err)
{
    td_status st = td_db_batch_begin(d->db, err);
    for (size_t i = 0; i < rep->n && !st; i++) {
        const td_codec_check *k = &rep->checks[i];
        char name[64];
        snprintf(name, sizeof name, "codec.%s", k->name);
        st = put(d, name, NULL, NULL, k->elements, k->mismatches - k->nan_mismatches, k->nan_mismatches,
                 k->first_index, k->passed ? TD_DB_PASS : TD_DB_FAIL, k->first[0] ? k->first : NULL, err);
    }
    if (st) {
        td_db_batch_rollback(d->db);
        return st;
    }
    return td_db_batch_commit(d->db, err);
}

static void describe(const td_scale_counts *c, char *buf, size_t cap)
{
    if (!c->rejected) {
        snprintf(buf, cap, "admit");
        return;
    }
    const td_recon_eval *e = &c->first.ev;
    snprintf(buf, cap, "reject: %s, %lld element(s); first at [%lld, %lld] code 0x%02X raw 0x%02X "
             "prepared 0x%04X strict 0x%04X effective 0x%04X fast 0x%04X",
             td_scale_reason_name(c->reason), (long long)c->rejected, (long long)c->first.row,
             (long long)c->first.col, e->code, e->raw, e->prepared, e->strict, e->effective, e->fast);
}

static int64_t flat(const td_scale_tensor *t, const td_scale_counts *c)
{
    return c->first.row < 0 ? -1 : c->first.row * t->cols + c->first.col;
}

static void rank_variant(int tp, int rank, char *buf, size_t cap)
{
    if (rank < 0) snprintf(buf, cap, "tp%d.whole", tp);
    else if (tp > 1) snprintf(buf, cap, "tp%d.rank%d", tp, rank);
    else buf[0] = 0;
}

static td_status put_tensor(td_e4m3_db *d, const td_scale_tensor *t, int tp, td_err *err)
{
    char detail[512], var[32];
    d->tensors++;
    if (t->status) {
        d->tensors_rejected++;
        snprintf(detail, sizeof detail, "error: %s", t->error);
        return put(d, "scale.verdict", t->scale_name, NULL, -1, -1, -1, -1, TD_DB_FAIL, detail, err);
    }
    const td_scale_counts *c = &t->all;
    d->elements += c->elements;
    d->strict += c->strict_mismatch;
    d->fast += c->fast_mismatch;
    d->finite += c->nonfinite;
    d->range += c->out_of_range;
    d->rejected_elements += c->rejected;
    if (!t->admit) d->tensors_rejected++;
    static const char *const names[4] = {"scale.strict", "scale.fast", "scale.finite", "scale.range"};
    const int64_t mm[4] = {c->strict_mismatch, c->fast_mismatch, c->nonfinite, c->out_of_range};
    td_status st = TD_OK;
    for (int k = 0; k < 4 && !st; k++)
        st = put(d, names[k], t->scale_name, NULL, c->elements, mm[k], -1, -1,
                 mm[k] ? TD_DB_FAIL : TD_DB_PASS, NULL, err);
    describe(c, detail, sizeof detail);
    if (!st)
        st = put(d, "scale.verdict", t->scale_name, NULL, c->elements, c->rejected, -1, flat(t, c),
                 t->admit ? TD_DB_PASS : TD_DB_FAIL, detail, err);
    for (int r = 0; tp > 1 && r < t->n_ranks && !st; r++) {
        const td_scale_counts *rc = &t->ranks[r];
        describe(rc, detail, sizeof detail);
        rank_variant(tp, r, var, sizeof var);
        st = put(d, "scale.verdict", t->scale_name, var, rc->elements, rc->rejected, -1, flat(t, rc),
                 rc->rejected ? TD_DB_FAIL : TD_DB_PASS, detail, err);
    }
    for (int code = 0; code < 256 && !st; code++) {
        if (!t->census.hist[code]) continue;
        td_db_census_row row;
        row.tensor = t->scale_name;
        row.code = code;
        row.count = t->census.hist[code];
        st = td_db_put_census(d->db, d->run, &row, err);
    }
    return st;
}

static td_status put_stage(td_e4m3_db *d, const td_scale_stage *s, int tp, td_err *err)
{
    char stage[192], var[32], detail[512];
    if (s->layer >= 0 && (!strcmp(s->name, "w13") || !strcmp(s->name, "w2")))
        snprintf(stage, sizeof stage, "L%d.%s", (int)s->layer, s->name);
    else snprintf(stage, sizeof stage, "%s", s->name);
    rank_variant(tp, s->rank, var, sizeof var);
    d->stages++;
    if (!s->admit) d->stages_rejected++;
    if (s->admit) snprintf(detail, sizeof detail, "admit: %lld tensors, saves %lld bytes", (long long)s->tensors,
                           (long long)s->saved_bytes);
    else snprintf(detail, sizeof detail, "reject: %lld of %lld tensors; first %s (%s)",
                  (long long)s->tensors_rejected, (long long)s->tensors, s->first_tensor,
                  td_scale_reason_name(s->first_reason));
    td_status st = put(d, "scale.stage", stage, var, s->elements, s->rejected, -1, -1,
                       s->admit ? TD_DB_PASS : TD_DB_FAIL, detail, err);
    for (int l = 0; s->is_w13 && l < TD_W13_LAYOUT_COUNT && !st; l++) {
        const td_scale_layout_check *c = &s->layout[l];
        char name[64];
        snprintf(name, sizeof name, "scale.layout.%s", td_w13_layout_name((td_w13_layout)l));
        if (c->first_expert >= 0)
            snprintf(detail, sizeof detail, "%lld slot-mismatched columns; first failing element: expert %d "
                     "column %lld group %lld", (long long)c->slot_mismatch, (int)c->first_expert,
                     (long long)c->first_col, (long long)c->first_group);
        else snprintf(detail, sizeof detail, "%lld slot-mismatched columns", (long long)c->slot_mismatch);
        st = put(d, name, stage, var, c->columns, c->rejected, -1, -1,
                 !c->applicable ? TD_DB_SKIP : c->rejected ? TD_DB_FAIL : TD_DB_PASS,
                 c->applicable ? detail : "not applicable", err);
    }
    return st;
}

td_status td_e4m3_db_layer(td_e4m3_db *d, const td_scale_layer *l, td_err *err)
{
    td_status st = td_db_batch_begin(d->db, err);
    for (size_t i = 0; i < l->n_tensors && !st; i++) st = put_tensor(d, &l->tensors[i], l->tp, err);
    for (size_t i = 0; i < l->n_stages && !st; i++) st = put_stage(d, &l->stages[i], l->tp, err);
    for (size_t i = 0; i < l->n_findings && !st; i++) {
        const td_scale_finding *f = &l->findings[i];
        char name[64], stage[192];
        snprintf(name, sizeof name, "scale.finding.%s", td_scale_finding_kind_name(f->kind));
        if (f->kind == TD_SCALE_FIND_FUSED_EXPERTS || f->kind == TD_SCALE_FIND_LAYOUT_NA ||
            f->kind == TD_SCALE_FIND_TP_NOT_DIVISIBLE)
            snprintf(stage, sizeof stage, "L%d.%s", (int)f->layer, f->module);
        else snprintf(stage, sizeof stage, "%s", f->module);
        st = put(d, name, stage, NULL, -1, f->counts ? 1 : 0, -1, -1, f->counts ? TD_DB_FAIL : TD_DB_SKIP,
                 f->msg, err);
    }
    if (st) {
        td_db_batch_rollback(d->db);
        return st;
    }
    return td_db_batch_commit(d->db, err);
}

td_status td_e4m3_db_summary(td_e4m3_db *d, const td_scale_summary *sum, td_err *err)
{
    (void)sum;
    static const char *const stages[6] = {"strict", "fast", "finite", "range", "tensors", "stages"};
    const int64_t el[6] = {d->elements, d->elements, d->elements, d->elements, d->tensors, d->stages};
    const int64_t mm[6] = {d->strict, d->fast, d->finite, d->range, d->tensors_rejected, d->stages_rejected};
    td_status st = td_db_batch_begin(d->db, err);
    for (int i = 0; i < 6 && !st; i++)
        st = put(d, "scale.total", stages[i], NULL, el[i], mm[i], -1, -1, mm[i] ? TD_DB_FAIL : TD_DB_PASS,
                 NULL, err);
    if (st) {
        td_db_batch_rollback(d->db);
        return st;
    }
    return td_db_batch_commit(d->db, err);
}

td_status td_e4m3_db_end(td_e4m3_db *d, bool completed, int exit_status, const char *message, td_err *err)
{
    d->ended = true;
    return td_db_run_end(d->db, d->run, completed ? TD_DB_RUN_OK : TD_DB_RUN_FAILED, exit_status, message, err);
}

void td_e4m3_db_free(td_e4m3_db *d)
{
    if (!d) return;
    if (!d->ended) (void)td_db_run_end(d->db, d->run, TD_DB_RUN_FAILED, 2, "interrupted", NULL);
    td_db_close(d->db);
    free(d);
}
