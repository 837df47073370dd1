/* test_scale_audit.c — Part 2 of `tandem audit e4m3` (audit/scale_audit.c), its outputs
 * (audit/scale_report.c, audit/e4m3_db.c) and the CLI front end.
 *
 * Checkpoints are written by tests/scale_fixture.h with chosen scale bytes and globals: every
 * planted hazard must be rejected with the right reason and first element, and nothing else;
 * each of the four checks and the global-slot layout check must be able to fail. When
 * `tandem gen` is available, the `edge` preset's planted cases (tandem_gen.json) are checked the
 * same way.
 */
#include "test_common.h"
#include "scale_fixture.h"
#include "audit/scale_audit.h"
#include "audit/scale_report.h"
#include "json.h"

#include <sqlite3.h>

/* ---- capture sink ----------------------------------------------------------------------------- */

typedef struct capture {
    td_scale_info info;
    bool began;
    td_scale_tensor *t;
    size_t nt, capt;
    td_scale_stage *s;
    size_t ns, caps;
    td_scale_finding *f;
    size_t nf, capf;
    int32_t layers[64];
    size_t nl;
} capture;

static td_status cap_begin(void *ctx, const td_scale_info *info, td_err *err)
{
    (void)err;
    capture *c = ctx;
    c->info = *info;
    c->began = true;
    return TD_OK;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return p;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(p, n * elem);
    assert_non_null(q);
    *cap = n;
    return q;
}

static td_status cap_layer(void *ctx, const td_scale_layer *l, td_err *err)
{
    (void)err;
    capture *c = ctx;
    c->t = grow(c->t, &c->capt, c->nt + l->n_tensors, sizeof *c->t);
    if (l->n_tensors) memcpy(c->t + c->nt, l->tensors, l->n_tensors * sizeof *c->t);
    c->nt += l->n_tensors;
    c->s = grow(c->s, &c->caps, c->ns + l->n_stages, sizeof *c->s);
    if (l->n_stages) memcpy(c->s + c->ns, l->stages, l->n_stages * sizeof *c->s);
    c->ns += l->n_stages;
    c->f = grow(c->f, &c->capf, c->nf + l->n_findings, sizeof *c->f);
    if (l->n_findings) memcpy(c->f + c->nf, l->findings, l->n_findings * sizeof *c->f);
    c->nf += l->n_findings;
    assert_true(c->nl < 64);
    c->layers[c->nl++] = l->layer;
    /* the layer sum agrees with its tensors */
    int64_t el = 0;
    for (size_t i = 0; i < l->n_tensors; i++) el += l->tensors[i].all.elements;
    assert_int_equal(el, l->sum.elements);
    return TD_OK;
}

static void cap_free(capture *c)
{
    free(c->t);
    free(c->s);
    free(c->f);
    memset(c, 0, sizeof *c);
}

static td_scale_summary g_sum;

static void audit(const td_scale_opts *o, capture *c)
{
    memset(c, 0, sizeof *c);
    td_scale_sink sink = {c, cap_begin, cap_layer};
    td_err err;
    td_err_clear(&err);
    if (td_scale_audit(o, &sink, &g_sum, &err)) fail_msg("audit %s: %s", o->model, err.msg);
    assert_true(c->began);
}

static const td_scale_tensor *find_tensor(const capture *c, const char *scale_name)
{
    for (size_t i = 0; i < c->nt; i++)
        if (!strcmp(c->t[i].scale_name, scale_name)) return &c->t[i];
    fail_msg("no audited tensor %s", scale_name);
    return NULL;
}

static const td_scale_stage *find_stage(const capture *c, int layer, const char *name, int rank)
{
    for (size_t i = 0; i < c->ns; i++)
        if (c->s[i].layer == layer && !strcmp(c->s[i].name, name) && c->s[i].rank == rank) return &c->s[i];
    fail_msg("no stage L%d %s rank %d", layer, name, rank);
    return NULL;
}

static int count_findings(const capture *c, td_scale_finding_kind k)
{
    int n = 0;
    for (size_t i = 0; i < c->nf; i++) n += c->f[i].kind == k;
    return n;
}

#define EXP(l, e, p) "model.layers." #l ".mlp.experts." #e "." #p

/* ---- a clean checkpoint ------------------------------------------------------------------------ */

static const char *write_clean(const char *name)
{
    const char *dir = td_test_path(name);
    sf_spec s;
    sf_init(&s, SF_QWEN3_CONFIG, FX_QWEN3_QUANT, false);
    s.shards = 2;
    sf_write(dir, &s, NULL);
    return dir;
}

static void scale_audit_clean_checkpoint_admits_everything(void **state)
{
    (void)state;
    const char *dir = write_clean("clean");
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    capture c;
    audit(&o, &c);
    /* 4 layers x (4 experts x 3 + shared 3) + 3 GDN out_proj + 1 o_proj */
    assert_int_equal(c.nt, 4 * 15 + 3 + 1);
    assert_int_equal(c.info.tensors, (int64_t)c.nt);
    assert_string_equal(c.info.family, "qwen3_next");
    assert_int_equal(c.nl, 4);
    for (size_t i = 0; i < c.nt; i++) {
        const td_scale_tensor *t = &c.t[i];
        if (!t->admit) fail_msg("%s rejected: %s", t->scale_name, td_scale_reason_name(t->all.reason));
        assert_int_equal(t->status, TD_OK);
        int64_t sum = 0;
        for (int code = 0; code < 256; code++) sum += t->census.hist[code];
        assert_int_equal(sum, t->rows * t->cols);
        assert_int_equal(t->all.elements, t->rows * t->cols);
        assert_true(t->census.code_min >= 0x49 && t->census.code_max <= 0x7E);
        assert_int_equal(t->census.zero + t->census.subnormal + t->census.negative + t->census.nan, 0);
        assert_int_equal(t->all.first.row, -1);
        assert_true(t->census.prep_min > 0 && t->census.prep_max >= t->census.prep_min);
    }
    const td_scale_tensor *g = find_tensor(&c, EXP(0, 1, gate_proj.weight_scale));
    assert_int_equal(g->rows, 64);
    assert_int_equal(g->cols, 2);
    assert_int_equal(g->expert, 1);
    assert_int_equal(g->proj, TD_MOE_GATE);
    assert_string_equal(g->stage, "w13");
    const td_scale_tensor *d = find_tensor(&c, EXP(0, 1, down_proj.weight_scale));
    assert_true(d->row_parallel);
    assert_string_equal(d->stage, "w2");
    /* stages: w13 with both layouts applicable and consistent, w2, plus one per other module */
    const td_scale_stage *w13 = find_stage(&c, 2, "w13", 0);
    assert_true(w13->admit);
    assert_true(w13->is_w13);
    assert_int_equal(w13->tensors, 8);
    assert_int_equal(w13->globals, 8);
    assert_int_equal(w13->elements, 8 * 64 * 2);
    assert_int_equal(w13->saved_bytes, 8 * 64 * 2 - 4 * 8);
    for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++) {
        assert_true(w13->layout[l].applicable);
        assert_int_equal(w13->layout[l].columns, 4 * 128);
        assert_int_equal(w13->layout[l].slot_mismatch, 0);
        assert_int_equal(w13->layout[l].rejected, 0);
    }
    int64_t saved = 0;
    for (size_t i = 0; i < c.ns; i++) {
        assert_true(c.s[i].admit);
        saved += c.s[i].saved_bytes;
    }
    assert_int_equal(g_sum.total.saved_bytes, saved);
    assert_int_equal(g_sum.total.tensors, (int64_t)c.nt);
    assert_int_equal(g_sum.total.admitted, (int64_t)c.nt);
    assert_int_equal(c.nf, 0);
    assert_false(td_scale_summary_failed(&g_sum));
    assert_true(g_sum.total.globals_distinct > 1);
    cap_free(&c);
}

/* ---- planted hazards ------------------------------------------------------------------------------ */

static const float HILO_G = 0x1.e52002p-10f; /* hi + lo != g * 2^14 for codes with mantissa 0 */

static const char *write_planted(const char *name, sf_spec *s)
{
    const char *dir = td_test_path(name);
    sf_init(s, SF_QWEN3_CONFIG, FX_QWEN3_QUANT, false);
    /* gate [64, 2], up [64, 2], down [32, 4] per expert */
    sf_plant_byte(s, EXP(0, 0, gate_proj.weight_scale), 3 * 2 + 1, 0x00);   /* zero code [3,1] */
    sf_plant_byte(s, EXP(0, 1, up_proj.weight_scale), 40 * 2 + 0, 0x05);    /* subnormal [40,0] */
    sf_plant_byte(s, EXP(0, 1, up_proj.weight_scale), 50 * 2 + 1, 0x03);    /* subnormal [50,1] */
    sf_plant_byte(s, EXP(0, 2, down_proj.weight_scale), 5 * 4 + 3, 0xB8);   /* negative [5,3] */
    sf_plant_byte(s, EXP(1, 0, gate_proj.weight_scale), 0, 0x7F);           /* NaN [0,0] */
    sf_plant_byte(s, EXP(1, 0, gate_proj.weight_scale), 9, 0xFF);           /* NaN [4,1] */
    sf_plant_global(s, EXP(1, 2, down_proj.weight_scale_2), 1e-9f);         /* underflow */
    sf_plant_global(s, EXP(1, 3, down_proj.weight_scale_2), 200.0f);        /* overflow */
    sf_plant_global(s, EXP(2, 0, down_proj.weight_scale_2), HILO_G);        /* hi/lo inexact */
    sf_plant_byte(s, EXP(2, 0, down_proj.weight_scale), 7 * 4 + 2, 0x18);
    sf_plant_global(s, EXP(3, 2, down_proj.weight_scale_2), 0.0f);          /* bad global */
    sf_plant_global(s, "model.layers.3.mlp.shared_expert.down_proj.weight_scale_2", -0.001f);
    /* gate/up siblings with different globals (ratio 1.3: no exact power-of-two relation) */
    sf_plant_global(s, EXP(3, 1, gate_proj.weight_scale_2), 0.001f);
    sf_plant_global(s, EXP(3, 1, up_proj.weight_scale_2), 0.0013f);
    sf_write(dir, s, NULL);
    return dir;
}

typedef struct expect_rej {
    const char *tensor;
    td_scale_reason reason;
    int64_t row, col;      /* first element of that reason; -1: not checked */
} expect_rej;

static const expect_rej planted[] = {
    {EXP(0, 0, gate_proj.weight_scale), TD_SCALE_ZERO_CODE, 3, 1},
    {EXP(0, 1, up_proj.weight_scale), TD_SCALE_SUBNORMAL_CODE, 40, 0},
    {EXP(0, 2, down_proj.weight_scale), TD_SCALE_NEGATIVE_CODE, 5, 3},
    {EXP(1, 0, gate_proj.weight_scale), TD_SCALE_NAN_CODE, 0, 0},
    {EXP(1, 2, down_proj.weight_scale), TD_SCALE_UNDERFLOW, 0, 0},
    {EXP(1, 3, down_proj.weight_scale), TD_SCALE_OVERFLOW, 0, 0},
    {EXP(2, 0, down_proj.weight_scale), TD_SCALE_HILO_INEXACT, -1, -1},
    {EXP(3, 2, down_proj.weight_scale), TD_SCALE_BAD_GLOBAL, 0, 0},
    {"model.layers.3.mlp.shared_expert.down_proj.weight_scale", TD_SCALE_BAD_GLOBAL, 0, 0},
};

static void check_planted(const capture *c)
{
    size_t rejected = 0;
    for (size_t i = 0; i < c->nt; i++) {
        const td_scale_tensor *t = &c->t[i];
        const expect_rej *e = NULL;
        for (size_t k = 0; k < TD_ARRAY_LEN(planted); k++)
            if (!strcmp(planted[k].tensor, t->scale_name)) e = &planted[k];
        if (!e) {
            if (!t->admit) fail_msg("%s rejected (%s) but nothing was planted there", t->scale_name,
                                    td_scale_reason_name(t->all.reason));
            continue;
        }
        rejected++;
        if (t->admit) fail_msg("%s admitted despite its planted hazard", t->scale_name);
        if (t->all.reason != e->reason)
            fail_msg("%s: reason %s, want %s", t->scale_name, td_scale_reason_name(t->all.reason),
                     td_scale_reason_name(e->reason));
        assert_int_equal(t->all.first.ev.reason, e->reason);
        if (e->row >= 0) {
            assert_int_equal(t->all.first.row, e->row);
            assert_int_equal(t->all.first.col, e->col);
        }
        assert_true(t->all.by_reason[e->reason] > 0);
    }
    assert_int_equal(rejected, TD_ARRAY_LEN(planted));
}

static void scale_audit_reports_every_planted_hazard_and_nothing_else(void **state)
{
    (void)state;
    sf_spec s;
    const char *dir = write_planted("planted", &s);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    capture c;
    audit(&o, &c);
    check_planted(&c);
    /* details of a few */
    const td_scale_tensor *t = find_tensor(&c, EXP(0, 1, up_proj.weight_scale));
    assert_int_equal(t->all.rejected, 2);
    assert_int_equal(t->census.subnormal, 2);
    assert_int_equal(t->census.hist[0x05], 1);
    assert_int_equal(t->census.hist[0x03], 1);
    t = find_tensor(&c, EXP(1, 0, gate_proj.weight_scale));
    assert_int_equal(t->census.nan, 2);
    assert_int_equal(t->all.by_reason[TD_SCALE_NAN_CODE], 2);
    assert_int_equal(t->all.nonfinite, 2);
    t = find_tensor(&c, EXP(0, 2, down_proj.weight_scale));
    assert_int_equal(t->census.negative, 1);
    assert_int_equal(t->all.out_of_range, 1);   /* negative effective scale */
    t = find_tensor(&c, EXP(1, 3, down_proj.weight_scale));
    assert_int_equal(t->all.rejected, t->all.elements);
    assert_true(t->all.nonfinite > 0);          /* effective = inf on both sides */
    assert_true(t->all.strict_mismatch > 0);    /* prepared inf, raw code NaN, strict NaN */
    assert_true(t->census.prep_inf > 0);
    assert_int_equal(t->gl.hi, 0x7C00);
    t = find_tensor(&c, EXP(1, 2, down_proj.weight_scale));
    assert_true(t->census.prep_zero > 0);
    t = find_tensor(&c, EXP(2, 0, down_proj.weight_scale));
    assert_true(t->all.fast_mismatch > 0);
    assert_int_equal(t->all.strict_mismatch, 0);
    assert_int_equal(t->all.nonfinite + t->all.out_of_range, 0);
    assert_int_equal(t->all.by_reason[TD_SCALE_HILO_INEXACT], t->all.rejected);
    /* sibling globals: one finding, counted; both tensors admitted */
    assert_int_equal(count_findings(&c, TD_SCALE_FIND_SIBLING_GLOBALS), 1);
    for (size_t i = 0; i < c.nf; i++)
        if (c.f[i].kind == TD_SCALE_FIND_SIBLING_GLOBALS) {
            assert_string_equal(c.f[i].module, "model.layers.3.mlp.experts.1");
            assert_true(c.f[i].counts);
            assert_int_equal(c.f[i].layer, 3);
            assert_int_equal(c.f[i].expert, 1);
            assert_true(c.f[i].a == 0.001f && c.f[i].b == 0.0013f);
        }
    assert_true(find_tensor(&c, EXP(3, 1, gate_proj.weight_scale))->admit);
    assert_true(find_tensor(&c, EXP(3, 1, up_proj.weight_scale))->admit);
    /* stages: L0 w13 and w2 rejected, L3 w13 admitted (the SM70 path folds each half's global) */
    assert_false(find_stage(&c, 0, "w13", 0)->admit);
    assert_int_equal(find_stage(&c, 0, "w13", 0)->first_reason, TD_SCALE_ZERO_CODE);
    assert_false(find_stage(&c, 0, "w2", 0)->admit);
    assert_true(find_stage(&c, 3, "w13", 0)->admit);
    assert_int_equal(find_stage(&c, 0, "w13", 0)->saved_bytes, 0);
    assert_int_equal(g_sum.total.rejected, (int64_t)TD_ARRAY_LEN(planted));
    assert_int_equal(g_sum.total.by_reason[TD_SCALE_BAD_GLOBAL], 2);
    assert_int_equal(g_sum.total.failed_findings, 1);
    assert_true(td_scale_summary_failed(&g_sum));
    cap_free(&c);
}

/* ---- TP view ---------------------------------------------------------------------------------------- */

static void scale_audit_tp_view_attributes_hazards_to_rank_slices(void **state)
{
    (void)state;
    sf_spec s;
    const char *dir = write_planted("planted_tp", &s);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    o.tp = 2;
    capture c;
    audit(&o, &c);
    check_planted(&c); /* the whole-tensor verdicts do not change */
    /* gate [64, 2] is column-parallel: row 3 is on rank 0 */
    const td_scale_tensor *t = find_tensor(&c, EXP(0, 0, gate_proj.weight_scale));
    assert_int_equal(t->n_ranks, 2);
    assert_int_equal(t->ranks[0].rejected, 1);
    assert_int_equal(t->ranks[1].rejected, 0);
    assert_int_equal(t->ranks[0].elements + t->ranks[1].elements, t->all.elements);
    assert_int_equal(t->ranks[0].first.row, 3);
    assert_int_equal(t->ranks[1].first.row, -1);
    /* up [64, 2]: subnormal codes at rows 40 and 50 are on rank 1 */
    t = find_tensor(&c, EXP(0, 1, up_proj.weight_scale));
    assert_int_equal(t->ranks[0].rejected, 0);
    assert_int_equal(t->ranks[1].rejected, 2);
    assert_int_equal(t->ranks[1].reason, TD_SCALE_SUBNORMAL_CODE);
    /* down [32, 4] is row-parallel (K split): column 3 is on rank 1 */
    t = find_tensor(&c, EXP(0, 2, down_proj.weight_scale));
    assert_true(t->row_parallel);
    assert_int_equal(t->ranks[0].rejected, 0);
    assert_int_equal(t->ranks[1].rejected, 1);
    assert_int_equal(t->ranks[1].first.col, 3);
    /* NaN codes of L1 E0 gate at rows 0 and 4: rank 0 only */
    t = find_tensor(&c, EXP(1, 0, gate_proj.weight_scale));
    assert_int_equal(t->ranks[0].rejected, 2);
    assert_int_equal(t->ranks[1].rejected, 0);
    /* stage slices per rank */
    assert_false(find_stage(&c, 0, "w13", 0)->admit);
    assert_false(find_stage(&c, 0, "w13", 1)->admit);     /* up rows 40, 50 */
    assert_true(find_stage(&c, 0, "w2", 0)->admit);
    assert_false(find_stage(&c, 0, "w2", 1)->admit);
    assert_false(find_stage(&c, 1, "w13", 0)->admit);
    assert_true(find_stage(&c, 1, "w13", 1)->admit);
    const td_scale_stage *w = find_stage(&c, 1, "w13", 1);
    assert_int_equal(w->elements, 8 * 32 * 2);
    assert_int_equal(w->saved_bytes, 8 * 32 * 2 - 4 * 8);
    for (int l = 0; l < TD_W13_LAYOUT_COUNT; l++) {
        assert_true(w->layout[l].applicable);
        assert_int_equal(w->layout[l].columns, 4 * 64);
    }
    /* shared expert down [32, 1]: one scale column cannot be split in two */
    t = find_tensor(&c, "model.layers.0.mlp.shared_expert.down_proj.weight_scale");
    assert_int_equal(t->n_ranks, 0);
    assert_true(count_findings(&c, TD_SCALE_FIND_TP_NOT_DIVISIBLE) >= 4);
    cap_free(&c);
}

/* ---- selection --------------------------------------------------------------------------------------- */

static void scale_audit_layers_and_experts_narrow_the_selection(void **state)
{
    (void)state;
    sf_spec s;
    const char *dir = write_planted("planted_sel", &s);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    int64_t layers[] = {1, 3};
    int64_t experts[] = {2};
    o.layers = layers;
    o.n_layers = 2;
    o.experts = experts;
    o.n_experts = 1;
    capture c;
    audit(&o, &c);
    assert_int_equal(c.nl, 2);
    assert_int_equal(c.layers[0], 1);
    assert_int_equal(c.layers[1], 3);
    for (size_t i = 0; i < c.nt; i++) {
        assert_true(c.t[i].layer == 1 || c.t[i].layer == 3);
        assert_true(c.t[i].expert == -1 || c.t[i].expert == 2);
    }
    /* per layer: expert 2 x 3 + shared 3 + (layer 1: GDN out_proj; layer 3: attention o_proj) */
    assert_int_equal(c.nt, 2 * 7);
    assert_int_equal(g_sum.total.rejected, 3); /* L1 E2 down, L3 E2 down, L3 shared down */
    cap_free(&c);

    td_err err;
    int64_t bad_layer[] = {4};
    o.layers = bad_layer;
    o.n_layers = 1;
    o.experts = NULL;
    o.n_experts = 0;
    assert_int_equal(td_scale_audit(&o, NULL, NULL, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--layers"));
    o.n_layers = 0;
    int64_t bad_expert[] = {9};
    o.experts = bad_expert;
    o.n_experts = 1;
    assert_int_equal(td_scale_audit(&o, NULL, NULL, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--experts"));
    o.n_experts = 0;
    o.tp = 0;
    assert_int_equal(td_scale_audit(&o, NULL, NULL, &err), TD_ERR_ARG);
    o.tp = 1;
    o.model = td_test_path("no-such-checkpoint");
    assert_int_not_equal(td_scale_audit(&o, NULL, NULL, &err), TD_OK);
}

/* ---- modes and threads give identical results --------------------------------------------------------- */

static void same_results(const capture *a, const capture *b)
{
    assert_int_equal(a->nt, b->nt);
    assert_int_equal(a->ns, b->ns);
    assert_int_equal(a->nf, b->nf);
    for (size_t i = 0; i < a->nt; i++) {
        const td_scale_tensor *x = &a->t[i], *y = &b->t[i];
        assert_string_equal(x->scale_name, y->scale_name);
        assert_memory_equal(&x->census, &y->census, sizeof x->census);
        assert_memory_equal(&x->all, &y->all, sizeof x->all);
        assert_int_equal(x->n_ranks, y->n_ranks);
        for (int r = 0; r < x->n_ranks; r++) assert_memory_equal(&x->ranks[r], &y->ranks[r], sizeof x->ranks[r]);
        assert_int_equal(x->admit, y->admit);
    }
    for (size_t i = 0; i < a->ns; i++) assert_memory_equal(&a->s[i], &b->s[i], sizeof a->s[i]);
    for (size_t i = 0; i < a->nf; i++) assert_memory_equal(&a->f[i], &b->f[i], sizeof a->f[i]);
}

static void scale_audit_tables_elementwise_and_threads_agree(void **state)
{
    (void)state;
    sf_spec s;
    const char *dir = write_planted("planted_modes", &s);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    o.tp = 2;
    o.threads = 1;
    capture a, b, c;
    audit(&o, &a);
    o.elementwise = true;
    o.threads = 3;
    audit(&o, &b);
    same_results(&a, &b);
    o.elementwise = false;
    o.threads = 4;
    audit(&o, &c);
    same_results(&a, &c);
    cap_free(&a);
    cap_free(&b);
    cap_free(&c);
}

/* ---- the global-slot layout check can fail ------------------------------------------------------------- */

/* A buggy expander: the non-interleaved split is off by one column (the first up column reads
 * the gate's global), the interleaved one reads 16-column tiles. */
static int buggy_slot(td_w13_layout l, int64_t col, int64_t n)
{
    if (l == TD_W13_INTERLEAVED) return (int)((col >> 4) & 1);
    return col > n / 2 ? 1 : 0;
}

static void scale_audit_catches_a_global_slot_layout_bug(void **state)
{
    (void)state;
    sf_spec s;
    const char *dir = write_planted("planted_layout", &s);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    o.w13_slot = buggy_slot;
    capture c;
    audit(&o, &c);
    check_planted(&c); /* per-tensor verdicts do not depend on the slot */
    /* L3 has expert 1 with gate/up globals 0.001 / 0.0013: the buggy slots mis-scale it */
    const td_scale_stage *w = find_stage(&c, 3, "w13", 0);
    assert_false(w->admit);
    assert_int_equal(w->first_reason, TD_SCALE_LAYOUT_MISMATCH);
    const td_scale_layout_check *ni = &w->layout[TD_W13_NON_INTERLEAVED];
    const td_scale_layout_check *il = &w->layout[TD_W13_INTERLEAVED];
    assert_int_equal(ni->slot_mismatch, 4);           /* column 64 of each of the 4 experts */
    assert_true(ni->rejected > 0 && ni->rejected <= 2);
    assert_int_equal(ni->first_expert, 1);
    assert_int_equal(ni->first_col, 64);
    assert_true(il->rejected > 0);
    assert_int_equal(il->first_expert, 1);
    /* elsewhere gate and up share their global: the wrong slot reads the same bits */
    const td_scale_stage *w2 = find_stage(&c, 2, "w13", 0);
    assert_true(w2->admit);
    assert_int_equal(w2->layout[TD_W13_NON_INTERLEAVED].slot_mismatch, 4);
    assert_int_equal(w2->layout[TD_W13_NON_INTERLEAVED].rejected, 0);
    assert_true(g_sum.total.by_reason[TD_SCALE_LAYOUT_MISMATCH] >= 2);
    cap_free(&c);
}

/* ---- compressed-tensors convention ----------------------------------------------------------------------- */

static void scale_audit_compressed_tensors_uses_reciprocal_globals(void **state)
{
    (void)state;
    const char *dir = td_test_path("ct");
    sf_spec s;
    sf_init(&s, SF_QWEN3_CT_CONFIG, NULL, true);
    sf_plant_byte(&s, "model.layers.2.mlp.experts.3.up_proj.weight_scale", 7, 0x00);
    sf_write(dir, &s, NULL);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    capture c;
    audit(&o, &c);
    assert_int_equal(c.nt, 4 * 4 * 3); /* experts only */
    for (size_t i = 0; i < c.nt; i++) {
        const td_scale_tensor *t = &c.t[i];
        assert_int_equal(t->conv, TD_NVFP4_CT);
        assert_true(strstr(t->global_name, "weight_global_scale") != NULL);
        assert_true(t->gl.g == 1.0f / t->global);
        bool planted_here = !strcmp(t->scale_name, "model.layers.2.mlp.experts.3.up_proj.weight_scale");
        assert_int_equal(t->admit, !planted_here);
        if (planted_here) {
            assert_int_equal(t->all.reason, TD_SCALE_ZERO_CODE);
            assert_int_equal(t->all.first.row, 3);
            assert_int_equal(t->all.first.col, 1);
        }
    }
    cap_free(&c);
}

/* ---- unreadable tensors are input errors, the rest is still audited ------------------------------------------ */

static void mutate_break(fx_ckpt *c)
{
    fx_drop(c, EXP(0, 0, gate_proj.weight_scale));
    fx_find(c, EXP(0, 1, down_proj.weight_scale))->dt = TD_U8;
    fx_tensor *g = fx_find(c, EXP(0, 2, up_proj.weight_scale_2));
    g->nd = 1;
    g->shape[0] = 2;
    fx_find(c, EXP(1, 0, up_proj.weight_scale))->shape[1] = 3;
}

static void scale_audit_unreadable_tensors_are_input_errors(void **state)
{
    (void)state;
    const char *dir = td_test_path("broken");
    sf_spec s;
    sf_init(&s, SF_QWEN3_CONFIG, FX_QWEN3_QUANT, false);
    sf_write(dir, &s, mutate_break);
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.model = dir;
    capture c;
    audit(&o, &c);
    static const struct { const char *t; td_status st; const char *msg; } bad[] = {
        {EXP(0, 0, gate_proj.weight_scale), TD_ERR_NOTFOUND, "is missing"},
        {EXP(0, 1, down_proj.weight_scale), TD_ERR_FORMAT, "expected F8_E4M3"},
        {EXP(0, 2, up_proj.weight_scale), TD_ERR_FORMAT, "expected an F32 scalar"},
        {EXP(1, 0, up_proj.weight_scale), TD_ERR_FORMAT, "[64, 3]"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        const td_scale_tensor *t = find_tensor(&c, bad[i].t);
        assert_int_equal(t->status, bad[i].st);
        assert_false(t->admit);
        if (!strstr(t->error, bad[i].msg)) fail_msg("%s: message '%s' lacks '%s'", bad[i].t, t->error, bad[i].msg);
    }
    assert_int_equal(g_sum.total.input_errors, 4);
    assert_int_equal(g_sum.total.rejected, 0);
    assert_int_equal(g_sum.total.admitted, (int64_t)c.nt - 4);
    assert_false(find_stage(&c, 0, "w13", 0)->admit);
    cap_free(&c);
}

/* ---- CLI end to end: table, JSON, store, exit status ---------------------------------------------------------- */

static const char *tandem(void)
{
    const char *t = getenv("TD_TANDEM");
    return t && *t ? t : "build/release/tandem";
}

static void cli_audit_e4m3_exit_status_json_and_store(void **state)
{
    (void)state;
    const char *out = td_test_path("cli.out");
    /* usage */
    assert_int_equal(td_test_sh("%s audit e4m3 --help >%s 2>&1", tandem(), out), 0);
    char *txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "--experts LIST"));
    free(txt);
    assert_int_equal(td_test_sh("%s audit --help >/dev/null 2>&1", tandem()), 0);
    assert_int_equal(td_test_sh("%s audit >/dev/null 2>&1", tandem()), 2);
    assert_int_equal(td_test_sh("%s audit nope >/dev/null 2>&1", tandem()), 2);
    assert_int_equal(td_test_sh("%s audit e4m3 --bogus --no-db >/dev/null 2>&1", tandem()), 2);
    assert_int_equal(td_test_sh("%s audit e4m3 --tp 4 --no-db >/dev/null 2>&1", tandem()), 2);
    assert_int_equal(td_test_sh("%s audit e4m3 --model %s --no-db >%s 2>&1", tandem(),
                                td_test_path("nothing-here"), out), 2);
    /* Part 1 only */
    assert_int_equal(td_test_sh("%s audit e4m3 --no-db >%s 2>&1", tandem(), out), 0);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "Part 1: codec self-audit"));
    assert_non_null(strstr(txt, "prepared.all_codes"));
    assert_null(strstr(txt, "FAIL"));
    free(txt);

    /* a clean checkpoint: exit 0 */
    const char *clean = write_clean("cli_clean");
    assert_int_equal(td_test_sh("%s audit e4m3 --model %s --no-db --tp 2 >%s 2>&1", tandem(), clean, out), 0);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "64 of 64 tensors admitted"));
    free(txt);

    /* planted: exit 1, JSON with every tensor, rows in the store */
    sf_spec s;
    const char *dir = write_planted("cli_planted", &s);
    const char *json = td_test_path("cli.json"), *db = td_test_path("cli.db");
    assert_int_equal(td_test_sh("rm -f %s", db), 0);
    assert_int_equal(td_test_sh("%s audit e4m3 --model %s --json %s --db %s --tp 2 --layers 0-3 >%s 2>&1",
                                tandem(), dir, json, db, out), 1);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "rejected tensors (9)"));
    assert_non_null(strstr(txt, "zero_code"));
    assert_non_null(strstr(txt, "sibling_globals"));
    assert_non_null(strstr(txt, "results store:"));
    free(txt);
    size_t len = 0;
    char *js = td_test_slurp(json, &len);
    assert_non_null(js);
    cJSON *root = NULL;
    td_err err;
    if (td_json_parse(js, len, len + 1, json, &root, &err)) fail_msg("%s", err.msg);
    free(js);
    assert_int_equal(cJSON_GetObjectItem(root, "exit_status")->valueint, 1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "codec"), "passed")));
    cJSON *layers = cJSON_GetObjectItem(root, "layers");
    assert_int_equal(cJSON_GetArraySize(layers), 4);
    int tensors = 0, rejected = 0;
    cJSON *l;
    cJSON_ArrayForEach(l, layers) {
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(l, "tensors")) {
            tensors++;
            const char *v = cJSON_GetObjectItem(t, "verdict")->valuestring;
            if (strcmp(v, "admit")) rejected++;
            if (!strcmp(cJSON_GetObjectItem(t, "tensor")->valuestring, EXP(0, 0, gate_proj.weight_scale))) {
                assert_string_equal(cJSON_GetObjectItem(t, "reason")->valuestring, "zero_code");
                cJSON *f = cJSON_GetObjectItem(t, "first");
                assert_int_equal(cJSON_GetObjectItem(f, "row")->valueint, 3);
                assert_string_equal(cJSON_GetObjectItem(f, "code")->valuestring, "0x00");
                assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "ranks")), 2);
            }
        }
    }
    assert_int_equal(tensors, 64);
    assert_int_equal(rejected, 9);
    cJSON *sum = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "summary"), "total");
    assert_int_equal(cJSON_GetObjectItem(sum, "rejected")->valueint, 9);
    cJSON_Delete(root);

    sqlite3 *q;
    assert_int_equal(sqlite3_open_v2(db, &q, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    static const struct { const char *sql; long want; } counts[] = {
        {"SELECT count(*) FROM runs WHERE kind = 'audit.e4m3' AND status = 'ok'", 1},
        {"SELECT count(*) FROM encoding_checks WHERE check_name LIKE 'codec.%' AND verdict = 'pass'", 26},
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.verdict' AND variant = '' AND verdict = 'fail'", 9},
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.verdict' AND variant = 'tp2.rank1'", 64 - 4},
        /* (the shared experts' down_proj [32, 1] cannot be split in two: no rank rows) */
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.finding.sibling_globals' AND verdict = 'fail'", 1},
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.stage' AND stage = 'L0.w13' AND verdict = 'fail'", 2},
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.layout.interleaved' AND stage = 'L2.w13' AND verdict = 'pass'", 2},
        {"SELECT count(*) FROM encoding_checks WHERE check_name = 'scale.total' AND stage = 'tensors' AND mismatches = 9", 1},
        {"SELECT sum(count) FROM scale_census WHERE tensor = 'model.layers.0.mlp.experts.0.gate_proj.weight_scale'", 128},
        {"SELECT count FROM scale_census WHERE tensor = 'model.layers.0.mlp.experts.0.gate_proj.weight_scale' AND code = 0", 1},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(counts); i++) {
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(q, counts[i].sql, -1, &st, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        long got = (long)sqlite3_column_int64(st, 0);
        if (got != counts[i].want) fail_msg("%s: %ld, want %ld", counts[i].sql, got, counts[i].want);
        sqlite3_finalize(st);
    }
    sqlite3_close(q);

    /* --json - writes JSON to stdout and the table to stderr */
    assert_int_equal(td_test_sh("%s audit e4m3 --model %s --json - --no-db 2>/dev/null >%s", tandem(), dir, out), 1);
    js = td_test_slurp(out, &len);
    assert_int_equal(td_json_parse(js, len, len + 1, out, &root, &err), TD_OK);
    cJSON_Delete(root);
    free(js);

    /* unreadable tensor: exit 2, and the rest still reported */
    const char *broken = td_test_path("cli_broken");
    sf_spec sb;
    sf_init(&sb, SF_QWEN3_CONFIG, FX_QWEN3_QUANT, false);
    sf_write(broken, &sb, mutate_break);
    assert_int_equal(td_test_sh("%s audit e4m3 --model %s --no-db >%s 2>&1", tandem(), broken, out), 2);
    txt = td_test_slurp(out, NULL);
    assert_non_null(strstr(txt, "is missing"));
    free(txt);
}

/* ---- `tandem gen --preset edge`: every planted case, with the right reason, and nothing else -------------------- */

/* What the audit must say about each edge case of tandem_gen.json. */
static const struct {
    const char *name;
    td_scale_reason reason;   /* TD_SCALE_OK: the case is benign for raw storage (admitted) */
    bool sibling;             /* reported as a sibling-globals finding */
} edge_cases[] = {
    {"zero_blocks", TD_SCALE_OK, false},         /* all-zero blocks carry scale 1.0 */
    {"zero_scale_code", TD_SCALE_ZERO_CODE, false},
    {"subnormal_codes", TD_SCALE_SUBNORMAL_CODE, false},
    {"negative_codes", TD_SCALE_NEGATIVE_CODE, false},
    {"nan_code", TD_SCALE_NAN_CODE, false},
    {"tiny_global", TD_SCALE_UNDERFLOW, false},
    {"large_global", TD_SCALE_OVERFLOW, false},
    {"huge_global", TD_SCALE_OVERFLOW, false},
    {"unsynced_gate_up", TD_SCALE_OK, true},
    {"all_zero_tensor", TD_SCALE_OK, false},     /* global 1.0, scales 1.0: representable */
};

static void edge_preset_hazards_reported_with_the_right_reason(void **state)
{
    (void)state;
    const char *dir = td_test_path("edge");
    const char *log = td_test_path("edge.log");
    int rc = td_test_sh("%s gen --preset edge --out %s --seed 0 --force --no-progress >%s 2>&1", tandem(), dir, log);
    if (rc != 0) {
        char *t = td_test_slurp(log, NULL);
        bool absent = t && strstr(t, "unknown command");
        free(t);
        if (absent) skip();
        fail_msg("tandem gen --preset edge failed (exit %d), see %s", rc, log);
    }
    char p[900];
    snprintf(p, sizeof p, "%s/tandem_gen.json", dir);
    cJSON *root = NULL;
    td_err err;
    if (td_json_read_file(p, 1 << 24, &root, &err)) fail_msg("%s", err.msg);
    cJSON *cases = cJSON_GetObjectItem(root, "edge_cases");
    assert_true(cJSON_GetArraySize(cases) > 0);

    for (int tp = 1; tp <= 2; tp++) {
        td_scale_opts o;
        td_scale_opts_init(&o);
        o.model = dir;
        o.tp = tp;
        capture c;
        audit(&o, &c);
        size_t planted_rejects = 0, planted_siblings = 0;
        char sib_parents[8][256];
        bool *expected = calloc(c.nt, sizeof *expected);
        assert_non_null(expected);
        cJSON *e;
        cJSON_ArrayForEach(e, cases) {
            const char *name = cJSON_GetObjectItem(e, "case")->valuestring;
            char tensor[256];
            snprintf(tensor, sizeof tensor, "%s", cJSON_GetObjectItem(e, "tensor")->valuestring);
            size_t tl = strlen(tensor);
            if (tl > 2 && !strcmp(tensor + tl - 2, "_2")) tensor[tl - 2] = 0; /* global -> its scales */
            size_t k = 0;
            while (k < TD_ARRAY_LEN(edge_cases) && strcmp(edge_cases[k].name, name)) k++;
            if (k == TD_ARRAY_LEN(edge_cases)) fail_msg("edge case '%s' is new: say what the audit must report", name);
            const td_scale_tensor *t = find_tensor(&c, tensor);
            size_t ti = (size_t)(t - c.t);
            if (edge_cases[k].sibling) {
                char parent[256];
                snprintf(parent, sizeof parent, "%s", t->module);
                *strrchr(parent, '.') = 0;
                bool found = false;
                for (size_t i = 0; i < c.nf; i++)
                    found |= c.f[i].kind == TD_SCALE_FIND_SIBLING_GLOBALS && !strcmp(c.f[i].module, parent);
                if (!found) fail_msg("%s (%s): no sibling-globals finding", tensor, name);
                bool dup = false;
                for (size_t i = 0; i < planted_siblings; i++) dup |= !strcmp(sib_parents[i], parent);
                if (!dup) {
                    assert_true(planted_siblings < 8);
                    snprintf(sib_parents[planted_siblings++], sizeof sib_parents[0], "%s", parent);
                }
                continue;
            }
            if (edge_cases[k].reason == TD_SCALE_OK) continue;
            if (t->admit) fail_msg("%s (%s) admitted", tensor, name);
            if (t->all.reason != edge_cases[k].reason)
                fail_msg("%s (%s): reason %s, want %s", tensor, name, td_scale_reason_name(t->all.reason),
                         td_scale_reason_name(edge_cases[k].reason));
            cJSON *row = cJSON_GetObjectItem(e, "row"), *block = cJSON_GetObjectItem(e, "block");
            if (row && block) {
                assert_int_equal(t->all.first.row, row->valueint);
                assert_int_equal(t->all.first.col, block->valueint);
            }
            if (!expected[ti]) planted_rejects++;
            expected[ti] = true;
        }
        /* nothing else is rejected, and the only counted findings are the planted siblings */
        size_t rejected = 0;
        for (size_t i = 0; i < c.nt; i++) {
            assert_int_equal(c.t[i].status, TD_OK);
            if (c.t[i].admit) continue;
            rejected++;
            if (!expected[i]) fail_msg("%s rejected (%s) but not planted", c.t[i].scale_name,
                                       td_scale_reason_name(c.t[i].all.reason));
        }
        assert_int_equal(rejected, planted_rejects);
        size_t counted = 0;
        for (size_t i = 0; i < c.nf; i++) counted += c.f[i].counts;
        assert_int_equal(counted, planted_siblings);
        assert_true(planted_rejects >= 6);
        free(expected);
        cap_free(&c);
    }
    cJSON_Delete(root);
}

/* ---- `tandem gen --unquantized` + `tandem quantize`: the audit runs clean ---------------------------------------- */

static void quantized_checkpoint_audits_clean(void **state)
{
    (void)state;
    const char *src = td_test_path("q_src"), *log = td_test_path("q.log");
    int rc = td_test_sh("%s gen --preset flash-next-tiny --unquantized --fused-experts --experts 8 --out %s "
                        "--seed 5 --force --no-progress >%s 2>&1", tandem(), src, log);
    if (rc != 0) {
        char *t = td_test_slurp(log, NULL);
        bool absent = t && strstr(t, "unknown command");
        free(t);
        if (absent) skip();
        fail_msg("tandem gen --unquantized failed (exit %d), see %s", rc, log);
    }
    static const char *const formats[] = {"modelopt", "ct"};
    for (size_t f = 0; f < 2; f++) {
        char out[600];
        snprintf(out, sizeof out, "%s_%s", td_test_path("q_out"), formats[f]);
        rc = td_test_sh("%s quantize --in %s --out %s --format %s --force --no-progress >%s 2>&1", tandem(), src,
                        out, formats[f], log);
        if (rc != 0) fail_msg("tandem quantize --format %s failed (exit %d), see %s", formats[f], rc, log);
        td_scale_opts o;
        td_scale_opts_init(&o);
        o.model = out;
        o.tp = 2;
        capture c;
        audit(&o, &c);
        assert_true(c.nt > 0);
        for (size_t i = 0; i < c.nt; i++)
            if (!c.t[i].admit) fail_msg("%s (%s): %s rejected: %s", out, formats[f], c.t[i].scale_name,
                                        c.t[i].status ? c.t[i].error : td_scale_reason_name(c.t[i].all.reason));
        assert_false(td_scale_summary_failed(&g_sum));
        assert_int_equal(g_sum.total.input_errors, 0);
        assert_int_equal(c.t[0].conv, f ? TD_NVFP4_CT : TD_NVFP4_MODELOPT);
        cap_free(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scale_audit_clean_checkpoint_admits_everything),
        cmocka_unit_test(scale_audit_reports_every_planted_hazard_and_nothing_else),
        cmocka_unit_test(scale_audit_tp_view_attributes_hazards_to_rank_slices),
        cmocka_unit_test(scale_audit_layers_and_experts_narrow_the_selection),
        cmocka_unit_test(scale_audit_tables_elementwise_and_threads_agree),
        cmocka_unit_test(scale_audit_catches_a_global_slot_layout_bug),
        cmocka_unit_test(scale_audit_compressed_tensors_uses_reciprocal_globals),
        cmocka_unit_test(scale_audit_unreadable_tensors_are_input_errors),
        cmocka_unit_test(cli_audit_e4m3_exit_status_json_and_store),
        cmocka_unit_test(edge_preset_hazards_reported_with_the_right_reason),
        cmocka_unit_test(quantized_checkpoint_audits_clean),
    };
    return cmocka_run_group_tests_name("scale_audit", tests, NULL, NULL);
}
