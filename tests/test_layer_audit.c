/* test_layer_audit.c — the per-layer MoE audit (audit/layer_audit) and `tandem audit layer`.
 *
 * What is asserted:
 * - pair parsing: the comma that starts the second variant, default expectations (exact for
 *   neutral differences, bounded with the bound of the lowest precision), @exact /
 *   @bounded[=X] suffixes, errors;
 * - a grid of rows on a numeric fixture checkpoint (2 layers x ranks 0,3 of TP4 x 3 token
 *   counts x all five route patterns) with the default pairs: every expectation met, the row
 *   and check counts, reject checks for invalid routes, the order of the rows;
 * - the JSON rows (with and without taps, passing and failing) validate against the JSON
 *   Schema of docs/audit-layer.md, read from the document itself; every field the rows carry
 *   is documented there;
 * - a row replayed alone reproduces its metrics bit for bit (inputs depend only on the row);
 * - planted bugs are caught: for each fault (wrong nibble order, reciprocal global, gate/up
 *   swapped, missing renormalization, wrong TP slice) the pair `ref,ref:fault=X` fails its
 *   exact expectation and `ref:accum=fp64,ref:fault=X` fails its bounded one, on the block
 *   output, while `ref,ref:accum=fp64` passes and the repeats stay exact;
 * - db rows: one layer_cmp row per check with the documented keys and verdicts;
 * - the token-mixer blocks (--block gdn / attn) on a qwen3_next checkpoint: pairs on
 *   `L{l}.gdn.out` / `L{l}.attn.out` judged (fp16 bounded, threads exact, TP reduction
 *   bounded), repeats exact; a block of the other layer type fails naming the layer; a route
 *   other than `router`, or a block other than moe/attn/gdn, is TD_ERR_ARG;
 * - the CLI front end: --help, usage errors (exit 2 with a message naming the option),
 *   a passing run (exit 0) whose --out file validates, a planted-bug pair (exit 1), an
 *   unbuilt engine (exit 2), --json output; and, when the `tandem` binary dispatches
 *   `audit layer`, the same end to end.
 */
#include "test_common.h"
#include "moe_fixture.h"
#include "gen_fixture.h"
#include "audit/layer_audit.h"
#include "db/db.h"

/* The front end, to call cmd_audit_layer() without the `tandem audit` dispatcher. */
#include "cli/args.c"
#include "cli/cmd_audit_layer.c"

#include <sqlite3.h>

static const char *fixture_dir(void)
{
    static char dir[768];
    if (dir[0]) return dir;
    mf_opts o;
    mf_defaults(&o);
    mf_model m;
    mf_build(&o, &m);
    snprintf(dir, sizeof dir, "%s", td_test_path("la_fixture"));
    mf_write(&m, dir);
    mf_free(&m);
    return dir;
}

/* ---- a tiny JSON Schema validator (type, enum, minimum, required, properties, items) ------------ */

static bool type_is(const cJSON *v, const char *t)
{
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    fail_msg("schema uses unknown type %s", t);
    return false;
}

static void validate(const cJSON *s, const cJSON *v, const char *path)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(t) && !type_is(v, t->valuestring)) fail_msg("%s: not of type %s", path, t->valuestring);
    if (cJSON_IsArray(t)) {
        bool ok = false;
        const cJSON *x;
        cJSON_ArrayForEach(x, t) ok = ok || type_is(v, x->valuestring);
        if (!ok) fail_msg("%s: none of the allowed types", path);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        bool ok = false;
        const cJSON *x;
        cJSON_ArrayForEach(x, en) ok = ok || (cJSON_IsString(x) && cJSON_IsString(v) && !strcmp(x->valuestring, v->valuestring));
        if (!ok) fail_msg("%s: '%s' is not in the enum", path, cJSON_IsString(v) ? v->valuestring : "?");
    }
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    if (mn && cJSON_IsNumber(v) && v->valuedouble < mn->valuedouble) fail_msg("%s: below the minimum", path);
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *x;
    if (req)
        cJSON_ArrayForEach(x, req) if (!cJSON_GetObjectItemCaseSensitive(v, x->valuestring))
            fail_msg("%s: required field '%s' missing", path, x->valuestring);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    if (props && cJSON_IsObject(v)) {
        cJSON_ArrayForEach(x, v) {
            const cJSON *ps = cJSON_GetObjectItemCaseSensitive(props, x->string);
            if (!ps) fail_msg("%s: field '%s' is not documented in the schema", path, x->string);
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", path, x->string);
            validate(ps, x, sub);
        }
    }
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (items && cJSON_IsArray(v)) {
        int i = 0;
        cJSON_ArrayForEach(x, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%d]", path, i++);
            validate(items, x, sub);
        }
    }
}

/* The schema block of docs/audit-layer.md (tests run from the repository root). */
static cJSON *doc_schema(void)
{
    char *doc = td_test_slurp("docs/audit-layer.md", NULL);
    assert_non_null(doc);
    char *start = strstr(doc, "```json\n{\n  \"$schema\"");
    assert_non_null(start);
    start += 8;
    char *end = strstr(start, "\n```");
    assert_non_null(end);
    *end = 0;
    cJSON *s = cJSON_Parse(start);
    free(doc);
    assert_non_null(s);
    return s;
}

/* ---- running the audit ------------------------------------------------------------------------ */

typedef struct collect {
    cJSON *rows;
    td_db *db;
    int64_t run;
    int64_t checks;
} collect;

static td_status collect_row(void *ctx, const td_layer_row *row, td_err *err)
{
    collect *c = ctx;
    c->checks += (int64_t)row->n_checks;
    if (c->rows) cJSON_AddItemToArray(c->rows, td_layer_row_json(row));
    if (c->db) return td_layer_row_db(c->db, c->run, row, err);
    return TD_OK;
}

typedef struct grid {
    int64_t layers[4], ranks[4], tokens[8];
    size_t nl, nr, nt;
    double scales[4];
    size_t ns;
    td_route_kind routes[TD_ROUTE_COUNT];
    size_t nu;
    td_layer_pair pairs[4];
    size_t np;
    const char *taps[8];
    size_t ntaps;
    const char *model; /* NULL: the shared fixture */
} grid;

static void grid_default(grid *g)
{
    memset(g, 0, sizeof *g);
    g->layers[0] = 0;
    g->nl = 1;
    g->ranks[0] = 0;
    g->nr = 1;
    g->tokens[0] = 1;
    g->tokens[1] = 4;
    g->nt = 2;
    g->scales[0] = 0.1;
    g->ns = 1;
    g->routes[0] = TD_ROUTE_ROUTER;
    g->nu = 1;
}

static void add_pair(grid *g, const char *text)
{
    td_err err;
    if (td_layer_pair_parse(text, &g->pairs[g->np], &err)) fail_msg("%s", err.msg);
    g->np++;
}

/* Audit options of the grid on the shared fixture. */
static void grid_opts(const grid *g, td_layer_audit_opts *o)
{
    td_layer_audit_opts_init(o);
    o->model = g->model ? g->model : fixture_dir();
    o->layers = g->layers;
    o->n_layers = g->nl;
    o->ranks = g->ranks;
    o->n_ranks = g->nr;
    o->tokens = g->tokens;
    o->n_tokens = g->nt;
    o->scales = g->scales;
    o->n_scales = g->ns;
    o->routes = g->routes;
    o->n_routes = g->nu;
    o->pairs = g->pairs;
    o->n_pairs = g->np;
    o->taps = g->taps;
    o->n_taps = g->ntaps;
}

static void run_grid(const grid *g, collect *c, td_layer_summary *sum)
{
    td_layer_audit_opts o;
    grid_opts(g, &o);
    td_layer_sink sink = {c, collect_row};
    td_err err;
    if (td_layer_audit_run(&o, &sink, sum, &err)) fail_msg("audit: %s", err.msg);
}

/* ---- tests -------------------------------------------------------------------------------------- */

static void pair_parsing(void **state)
{
    (void)state;
    td_layer_pair p;
    td_err err;
    assert_int_equal(td_layer_pair_parse("ref:scale=exact,ref:scale=fp16", &p, &err), TD_OK);
    assert_string_equal(p.a_text, "ref");
    assert_string_equal(p.b_text, "ref:scale=fp16");
    assert_int_equal(p.expect, TD_EXPECT_BOUNDED);
    assert_true(p.bound == 2e-3);
    assert_int_equal(td_layer_pair_parse("ref:threads=1,ref:threads=2", &p, &err), TD_OK);
    assert_int_equal(p.expect, TD_EXPECT_EXACT);
    assert_true(isnan(p.bound));
    assert_int_equal(td_layer_pair_parse("ref:tp_size=4,tp_rank=all,threads=2,ref:accum=fp64", &p, &err), TD_OK);
    assert_string_equal(p.a_text, "ref:tp_size=4,tp_rank=all,threads=2");
    assert_int_equal(p.expect, TD_EXPECT_BOUNDED);
    assert_true(p.bound == 1e-5);
    assert_int_equal(td_layer_pair_parse("ref,ref:act_dtype=bf16", &p, &err), TD_OK);
    assert_true(p.bound == 1e-2);
    assert_int_equal(td_layer_pair_parse("ref,ref:fault=nibble_order", &p, &err), TD_OK);
    assert_int_equal(p.expect, TD_EXPECT_EXACT);
    assert_int_equal(td_layer_pair_parse("ref,ref:scale=fp16@exact", &p, &err), TD_OK);
    assert_int_equal(p.expect, TD_EXPECT_EXACT);
    assert_true(p.expect_given);
    assert_int_equal(td_layer_pair_parse("ref,ref@bounded=3e-4", &p, &err), TD_OK);
    assert_int_equal(p.expect, TD_EXPECT_BOUNDED);
    assert_true(p.bound == 3e-4);
    assert_int_equal(td_layer_pair_parse("ref,ref:act_dtype=fp16@bounded", &p, &err), TD_OK);
    assert_true(p.bound == 2e-3);
    assert_int_equal(td_layer_pair_parse("ref,cuda:storage=raw", &p, &err), TD_OK);
    assert_int_equal(p.expect, TD_EXPECT_BOUNDED);
    assert_true(p.bound == 2e-3); /* cuda's NVFP4 weights use FP16 effective scales */
    /* both sides on FP16 scales, FP32 activations: only the summation order differs */
    assert_int_equal(td_layer_pair_parse("ref:scale=fp16,cuda:act_dtype=fp32", &p, &err), TD_OK);
    assert_true(p.bound == 1e-5);
    assert_int_equal(td_layer_pair_parse("ref:scale=fp16,ref:scale=fp16,accum=fp64", &p, &err), TD_OK);
    assert_true(p.bound == 1e-5);
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"ref", "exactly two variants"},
        {"ref,ref,ref", "exactly two variants"},
        {"threads=2,ref", "exactly two variants"},
        {"ref,ref@fast", "'@fast'"},
        {"ref,ref@bounded=-1", "bound '-1'"},
        {"ref,ref:scale=fp8", "pair 'ref,ref:scale=fp8': variant 'ref:scale=fp8'"},
        {"", "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_err_clear(&err);
        if (td_layer_pair_parse(bad[i].text, &p, &err) != TD_ERR_ARG || !strstr(err.msg, bad[i].needle))
            fail_msg("'%s': '%s' (want '%s')", bad[i].text, err.msg, bad[i].needle);
    }
    td_route_kind r;
    assert_int_equal(td_route_kind_parse("same-expert", &r, &err), TD_OK);
    assert_int_equal(r, TD_ROUTE_SAME_EXPERT);
    assert_int_equal(td_route_kind_parse("mod13", &r, &err), TD_ERR_ARG);
    assert_string_equal(td_route_kind_name(TD_ROUTE_MOD17), "mod17");
}

static void grid_default_pairs_all_pass(void **state)
{
    (void)state;
    grid g;
    grid_default(&g);
    g.layers[1] = 1;
    g.nl = 2;
    g.ranks[1] = 3;
    g.nr = 2;
    g.tokens[2] = 9;
    g.nt = 3;
    for (int r = 0; r < TD_ROUTE_COUNT; r++) g.routes[r] = (td_route_kind)r;
    g.nu = TD_ROUTE_COUNT;
    add_pair(&g, "ref:scale=exact,ref:scale=fp16");
    add_pair(&g, "ref:threads=1,ref:threads=3");
    collect c = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary sum;
    run_grid(&g, &c, &sum);
    assert_int_equal(sum.rows, 2 * 2 * 3 * TD_ROUTE_COUNT);
    assert_int_equal(sum.failed, 0);
    assert_int_equal(sum.rows_failed, 0);
    assert_int_equal(sum.checks, c.checks);
    /* per non-invalid row: 2 pair checks + 4 repeats (4 distinct variants); invalid rows: 4
     * rejects; router rows: the bounded pair's routes check too */
    assert_int_equal(sum.checks, 2 * 2 * 3 * ((TD_ROUTE_COUNT - 1) * 6 + 4 + 1));
    /* rows in grid order, and the reject checks */
    const cJSON *row = cJSON_GetArrayItem(c.rows, 0);
    assert_int_equal(cJSON_GetObjectItem(row, "layer")->valueint, 0);
    assert_string_equal(cJSON_GetObjectItem(row, "route")->valuestring, "router");
    row = cJSON_GetArrayItem(c.rows, TD_ROUTE_INVALID);
    assert_string_equal(cJSON_GetObjectItem(row, "route")->valuestring, "invalid");
    const cJSON *chk = cJSON_GetArrayItem(cJSON_GetObjectItem(row, "checks"), 0);
    assert_string_equal(cJSON_GetObjectItem(chk, "check")->valuestring, "reject");
    assert_string_equal(cJSON_GetObjectItem(chk, "verdict")->valuestring, "pass");
    assert_non_null(strstr(cJSON_GetObjectItem(chk, "message")->valuestring, "is outside [0, 8)"));
    row = cJSON_GetArrayItem(c.rows, (int)(sum.rows - 1));
    assert_int_equal(cJSON_GetObjectItem(row, "layer")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(row, "rank")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(row, "tokens")->valueint, 9);
    /* the scale pair is not exact but within its bound; the thread pair is exact */
    bool saw_bounded = false;
    for (size_t i = 0; i < sum.n_groups; i++) {
        const td_layer_group *gr = &sum.groups[i];
        if (!strcmp(gr->kind, "pair") && gr->expect == TD_EXPECT_BOUNDED && !strcmp(gr->tap, "moe.routes")) {
            /* the router is BF16: the scales change no logit, so no route */
            assert_int_equal(gr->exact, gr->checks);
            assert_int_equal(gr->failed, 0);
        } else if (!strcmp(gr->kind, "pair") && gr->expect == TD_EXPECT_BOUNDED) {
            saw_bounded = true;
            assert_true(gr->worst_rel_l2 > 0.0 && gr->worst_rel_l2 < 2e-3);
        }
        if (!strcmp(gr->kind, "repeat")) assert_int_equal(gr->exact, gr->checks);
    }
    assert_true(saw_bounded);
    cJSON *schema = doc_schema();
    validate(schema, c.rows, "rows");
    cJSON *sj = td_layer_summary_json(&sum);
    assert_int_equal(cJSON_GetObjectItem(sj, "failed")->valueint, 0);
    /* ref engines run on the CPU: no GPU in the summary */
    assert_int_equal(sum.device.gpu_name[0], '\0');
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(sj, "device")));
    cJSON_Delete(sj);
    /* a summary that names a GPU says so in its JSON and its last line */
    snprintf(sum.device.gpu_name, sizeof sum.device.gpu_name, "NVIDIA Test GPU");
    snprintf(sum.device.cuda_version, sizeof sum.device.cuda_version, "13.0");
    sj = td_layer_summary_json(&sum);
    const cJSON *dev = cJSON_GetObjectItem(sj, "device");
    assert_string_equal(cJSON_GetObjectItem(dev, "gpu_name")->valuestring, "NVIDIA Test GPU");
    assert_string_equal(cJSON_GetObjectItem(dev, "gpu_driver")->valuestring, "");
    assert_string_equal(cJSON_GetObjectItem(dev, "cuda_version")->valuestring, "13.0");
    cJSON_Delete(sj);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    td_layer_summary_print(&sum, f);
    fclose(f);
    assert_non_null(strstr(text, "\nGPU: NVIDIA Test GPU (driver unknown, CUDA 13.0)\n"));
    free(text);
    cJSON_Delete(schema);
    cJSON_Delete(c.rows);
    td_layer_summary_free(&sum);
}

static void taps_rows_validate(void **state)
{
    (void)state;
    grid g;
    grid_default(&g);
    g.ranks[0] = 2;
    g.routes[1] = TD_ROUTE_RANDOM;
    g.nu = 2;
    add_pair(&g, "ref,ref:act_dtype=bf16");
    for (size_t i = 0; i < td_layer_tap_suffix_count; i++) g.taps[i] = td_layer_tap_suffixes[i];
    g.ntaps = td_layer_tap_suffix_count;
    collect c = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary sum;
    run_grid(&g, &c, &sum);
    assert_int_equal(sum.failed, 0);
    assert_true(sum.skipped > 0); /* moe.topk under a bounded pair */
    cJSON *schema = doc_schema();
    validate(schema, c.rows, "rows");
    /* every tap of the list was compared in the router row */
    const cJSON *checks = cJSON_GetObjectItem(cJSON_GetArrayItem(c.rows, 0), "checks");
    for (size_t i = 0; i < td_layer_tap_suffix_count; i++) {
        char name[64];
        snprintf(name, sizeof name, "L0.%s", td_layer_tap_suffixes[i]);
        bool found = false;
        const cJSON *x;
        cJSON_ArrayForEach(x, checks) found = found || !strcmp(cJSON_GetObjectItem(x, "tap")->valuestring, name);
        if (!found) fail_msg("no check of tap %s", name);
    }
    cJSON_Delete(schema);
    cJSON_Delete(c.rows);
    td_layer_summary_free(&sum);
}

static void row_replays_alone(void **state)
{
    (void)state;
    grid g;
    grid_default(&g);
    g.layers[1] = 1;
    g.nl = 2;
    g.tokens[2] = 6;
    g.nt = 3;
    g.scales[1] = 3.0;
    g.ns = 2;
    g.routes[1] = TD_ROUTE_RANDOM;
    g.nu = 2;
    add_pair(&g, "ref:accum=fp64,ref:act_dtype=fp16");
    collect big = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary s1;
    run_grid(&g, &big, &s1);
    grid one = g;
    one.layers[0] = 1;
    one.nl = 1;
    one.tokens[0] = 6;
    one.nt = 1;
    one.scales[0] = 3.0;
    one.ns = 1;
    one.routes[0] = TD_ROUTE_RANDOM;
    one.nu = 1;
    collect alone = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary s2;
    run_grid(&one, &alone, &s2);
    /* the last row of the grid is (layer 1, tokens 6, scale 3, random) */
    cJSON *a = cJSON_GetObjectItem(cJSON_GetArrayItem(big.rows, (int)(s1.rows - 1)), "checks");
    cJSON *b = cJSON_GetObjectItem(cJSON_GetArrayItem(alone.rows, 0), "checks");
    assert_int_equal(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < cJSON_GetArraySize(a); i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i), *y = cJSON_GetArrayItem(b, i);
        static const char *const keys[] = {"mismatches", "max_abs", "relative_l2", "nmse", "max_ulp", "first_diff"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const cJSON *u = cJSON_GetObjectItem(x, keys[k]), *v = cJSON_GetObjectItem(y, keys[k]);
            assert_true(cJSON_IsNull(u) == cJSON_IsNull(v));
            if (cJSON_IsNumber(u)) assert_true(u->valuedouble == v->valuedouble);
        }
    }
    assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "relative_l2")->valuedouble > 0.0);
    cJSON_Delete(big.rows);
    cJSON_Delete(alone.rows);
    td_layer_summary_free(&s1);
    td_layer_summary_free(&s2);
}

static void planted_bugs_are_caught(void **state)
{
    (void)state;
    static const char *const faults[] = {"nibble_order", "reciprocal_global", "gate_up_swap",
                                         "no_renorm",    "tp_slice",          "topk_skip"};
    cJSON *schema = doc_schema();
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        grid g;
        grid_default(&g);
        g.ranks[0] = 1; /* TP4 rank 1: the tp_slice fault needs tp > 1 */
        char p1[96], p2[96];
        snprintf(p1, sizeof p1, "ref,ref:fault=%s", faults[f]);
        snprintf(p2, sizeof p2, "ref:accum=fp64,ref:fault=%s", faults[f]);
        add_pair(&g, p1);
        add_pair(&g, p2);
        add_pair(&g, "ref,ref:accum=fp64"); /* the bounded pair itself is fine */
        collect c = {cJSON_CreateArray(), NULL, 0, 0};
        td_layer_summary sum;
        run_grid(&g, &c, &sum);
        int64_t exact_fail = 0, bounded_fail = 0, routes_fail = -1;
        const bool selection = !strcmp(faults[f], "topk_skip");
        for (size_t i = 0; i < sum.n_groups; i++) {
            const td_layer_group *gr = &sum.groups[i];
            if (!strcmp(gr->kind, "repeat") || !strcmp(gr->b, "ref:accum=fp64")) {
                if (gr->failed) fail_msg("fault %s: group %s %s / %s failed", faults[f], gr->kind, gr->a, gr->b);
                continue;
            }
            if (!strcmp(gr->tap, "moe.routes")) { /* the bounded pair's: fails for a selection bug only */
                assert_int_equal(gr->expect, TD_EXPECT_BOUNDED);
                routes_fail = gr->failed;
                continue;
            }
            assert_string_equal(gr->tap, "moe.out");
            if (gr->expect == TD_EXPECT_EXACT) exact_fail += gr->failed;
            else bounded_fail += gr->failed;
        }
        if (exact_fail != (int64_t)g.nt || bounded_fail != (int64_t)g.nt)
            fail_msg("fault %s: %lld exact and %lld bounded failures (want %zu each)", faults[f],
                     (long long)exact_fail, (long long)bounded_fail, g.nt);
        if (routes_fail != (selection ? (int64_t)g.nt : 0))
            fail_msg("fault %s: %lld routes failures (want %zu)", faults[f], (long long)routes_fail,
                     selection ? g.nt : (size_t)0);
        assert_int_equal(sum.rows_failed, sum.rows);
        validate(schema, c.rows, "rows");
        cJSON_Delete(c.rows);
        td_layer_summary_free(&sum);
    }
    cJSON_Delete(schema);
}

/* Routes that differ under a bounded pair (docs/audit-layer.md, "Routes that differ"). */
static const cJSON *check_of(const cJSON *row, const char *tap, const char *a, const char *b)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(row, "checks")) {
        if (!strcmp(cJSON_GetObjectItem(x, "tap")->valuestring, tap) &&
            !strcmp(cJSON_GetObjectItem(x, "check")->valuestring, "pair") &&
            !strcmp(cJSON_GetObjectItem(x, "a")->valuestring, a) && !strcmp(cJSON_GetObjectItem(x, "b")->valuestring, b))
            return x;
    }
    fail_msg("no pair check of %s: %s vs %s", tap, a, b);
    return NULL;
}

static void routes_that_differ(void **state)
{
    (void)state;
    /* qwen3-next-tiny (64 experts, top-4): BF16 inputs flip a few near-tied routes at these
     * token counts, where the fixture's 8 experts flip none */
    char dir[768];
    td_test_gen("qwen3-next-tiny", 1, false, 0, "la_q3n_routes", dir, sizeof dir);
    grid g;
    grid_default(&g);
    g.model = dir;
    g.tokens[0] = 64;
    g.tokens[1] = 512;
    g.nt = 2;
    add_pair(&g, "ref,ref:act_dtype=bf16");
    add_pair(&g, "ref,ref:act_dtype=bf16,fault=topk_skip");
    add_pair(&g, "ref:threads=1,ref:act_dtype=bf16@bounded=1e-6");
    add_pair(&g, "ref,ref:act_dtype=bf16,fault=no_route_taps");
    collect c = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary sum;
    run_grid(&g, &c, &sum);
    cJSON *schema = doc_schema();
    validate(schema, c.rows, "rows");
    cJSON_Delete(schema);
    int64_t excluded = 0;
    for (int r = 0; r < cJSON_GetArraySize(c.rows); r++) {
        const cJSON *row = cJSON_GetArrayItem(c.rows, r);
        const int64_t M = cJSON_GetObjectItem(row, "tokens")->valueint;
        char out[32], routes[32];
        snprintf(out, sizeof out, "L0.moe.out");
        snprintf(routes, sizeof routes, "L0.moe.routes");
        /* bf16: near-ties, judged apart; the block output passes on the other tokens */
        const cJSON *rt = check_of(row, routes, "ref", "ref:act_dtype=bf16");
        const cJSON *o = check_of(row, out, "ref", "ref:act_dtype=bf16");
        assert_non_null(rt);
        assert_non_null(o);
        assert_string_equal(cJSON_GetObjectItem(rt, "verdict")->valuestring, "pass");
        assert_int_equal(cJSON_GetObjectItem(rt, "numel")->valueint, M);
        const int64_t differ = cJSON_GetObjectItem(rt, "mismatches")->valueint;
        const int64_t ex = cJSON_GetObjectItem(o, "tokens_excluded")->valueint;
        assert_true(ex <= differ);
        assert_string_equal(cJSON_GetObjectItem(o, "verdict")->valuestring, "pass");
        const cJSON *whole = check_of(row, out, "ref", "ref:act_dtype=bf16,fault=topk_skip"); /* every token judged */
        const int64_t H = cJSON_GetObjectItem(whole, "numel")->valueint / M;
        if (ex > 0) {
            excluded += ex;
            assert_int_equal(cJSON_GetObjectItem(o, "numel")->valueint, (M - ex) * H);
            assert_non_null(strstr(cJSON_GetObjectItem(o, "message")->valuestring, "route differently"));
            assert_non_null(strstr(cJSON_GetObjectItem(rt, "message")->valuestring, "near-ties"));
            /* all tokens together: the flips' whole experts dominate */
            assert_true(cJSON_GetObjectItem(o, "relative_l2_all")->valuedouble >
                        cJSON_GetObjectItem(o, "relative_l2")->valuedouble);
            assert_true(cJSON_GetObjectItem(rt, "max_abs")->valuedouble > 0.0);
        }
        /* the planted selection bug: blamed on its side, the output judged on every token */
        rt = check_of(row, routes, "ref", "ref:act_dtype=bf16,fault=topk_skip");
        o = check_of(row, out, "ref", "ref:act_dtype=bf16,fault=topk_skip");
        assert_string_equal(cJSON_GetObjectItem(rt, "verdict")->valuestring, "fail");
        assert_non_null(strstr(cJSON_GetObjectItem(rt, "message")->valuestring,
                               "ref:act_dtype=bf16,fault=topk_skip's top-k does not follow its router logits"));
        assert_int_equal(cJSON_GetObjectItem(o, "tokens_excluded")->valueint, 0);
        assert_string_equal(cJSON_GetObjectItem(o, "verdict")->valuestring, "fail");
        /* logits beyond the pair's bound: differing routes are not near-ties */
        rt = check_of(row, routes, "ref:threads=1", "ref:act_dtype=bf16");
        assert_true(cJSON_GetObjectItem(rt, "mismatches")->valueint > 0);
        assert_string_equal(cJSON_GetObjectItem(rt, "verdict")->valuestring, "fail");
        assert_non_null(strstr(cJSON_GetObjectItem(rt, "message")->valuestring, "not near-ties"));
        o = check_of(row, out, "ref:threads=1", "ref:act_dtype=bf16");
        assert_int_equal(cJSON_GetObjectItem(o, "tokens_excluded")->valueint, 0);
        assert_string_equal(cJSON_GetObjectItem(o, "verdict")->valuestring, "fail");
        /* a side without routing taps: the routes are recorded, not judged, and the block output
         * (the same numbers as the plain bf16 side's) is judged on every token */
        rt = check_of(row, routes, "ref", "ref:act_dtype=bf16,fault=no_route_taps");
        assert_string_equal(cJSON_GetObjectItem(rt, "verdict")->valuestring, "skip");
        assert_non_null(strstr(cJSON_GetObjectItem(rt, "message")->valuestring,
                               "routes not compared: ref:act_dtype=bf16,fault=no_route_taps did not capture"));
        o = check_of(row, out, "ref", "ref:act_dtype=bf16,fault=no_route_taps");
        assert_int_equal(cJSON_GetObjectItem(o, "tokens_excluded")->valueint, 0);
        assert_int_equal(cJSON_GetObjectItem(o, "numel")->valueint, M * H);
        const cJSON *plain = check_of(row, out, "ref", "ref:act_dtype=bf16");
        const double all = ex > 0 ? cJSON_GetObjectItem(plain, "relative_l2_all")->valuedouble
                                  : cJSON_GetObjectItem(plain, "relative_l2")->valuedouble;
        assert_true(cJSON_GetObjectItem(o, "relative_l2")->valuedouble == all);
        assert_string_equal(cJSON_GetObjectItem(o, "verdict")->valuestring,
                            all <= cJSON_GetObjectItem(o, "bound")->valuedouble ? "pass" : "fail");
    }
    if (excluded == 0) fail_msg("no token routed to other experts: the fixture no longer exercises the rule");
    /* the summary counts what was judged apart */
    bool saw = false;
    for (size_t i = 0; i < sum.n_groups; i++)
        if (!strcmp(sum.groups[i].kind, "pair") && !strcmp(sum.groups[i].tap, "moe.out") &&
            !strcmp(sum.groups[i].a, "ref") && !strcmp(sum.groups[i].b, "ref:act_dtype=bf16")) {
            assert_int_equal(sum.groups[i].tokens_excluded, excluded);
            assert_int_equal(sum.groups[i].failed, 0);
            saw = true;
        }
    assert_true(saw);
    cJSON_Delete(c.rows);
    td_layer_summary_free(&sum);
}

static void db_rows(void **state)
{
    (void)state;
    const char *path = td_test_path("la.db");
    remove(path);
    td_db *db;
    td_err err;
    assert_int_equal(td_db_open(path, TD_DB_CREATE, &db, &err), TD_OK);
    td_db_run_info info;
    memset(&info, 0, sizeof info);
    info.kind = "audit.layer";
    int64_t run;
    assert_int_equal(td_db_run_begin(db, &info, &run, &err), TD_OK);
    grid g;
    grid_default(&g);
    g.scales[1] = 1.0;
    g.ns = 2;
    g.routes[1] = TD_ROUTE_INVALID;
    g.nu = 2;
    add_pair(&g, "ref,ref:scale=fp16");
    add_pair(&g, "ref,ref:fault=gate_up_swap");
    collect c = {NULL, db, run, 0};
    td_layer_summary sum;
    run_grid(&g, &c, &sum);
    assert_int_equal(td_db_run_end(db, run, TD_DB_RUN_OK, 1, NULL, &err), TD_OK);
    td_db_close(db);
    sqlite3 *s;
    assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(s,
                                        "SELECT count(*), sum(verdict = 'fail'), "
                                        "sum(tap = 'L0.moe.out#scale=1' AND variant_b = 'ref:scale=fp16'), "
                                        "sum(variant_b = 'ref#repeat'), sum(tap LIKE '%#route=invalid'), "
                                        "sum(expectation = 'bounded'), sum(tap LIKE 'L0.moe.routes%') FROM layer_cmp",
                                        -1, &q, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(q, 0), c.checks);
    assert_int_equal(sqlite3_column_int64(q, 1), sum.failed);
    assert_int_equal(sqlite3_column_int64(q, 2), 2);     /* tokens 1 and 4 */
    assert_int_equal(sqlite3_column_int64(q, 3), 2 * 2); /* 2 token counts x 2 scales (router route) */
    assert_true(sqlite3_column_int64(q, 4) > 0);
    /* the scale pair: 2 tokens x 2 scales, block output and routes (router rows) */
    assert_int_equal(sqlite3_column_int64(q, 5), 2 * 2 * 2);
    assert_int_equal(sqlite3_column_int64(q, 6), 2 * 2);
    sqlite3_finalize(q);
    sqlite3_close(s);
    assert_true(sum.failed > 0);
    td_layer_summary_free(&sum);
}

/* ---- the CLI ----------------------------------------------------------------------------------- */

/* One audit of block `b` on the qwen3_next checkpoint `dir`; returns the status (summary in *sum). */
static td_status mixer_audit(const char *dir, td_block b, const int64_t *layers, size_t nl, td_route_kind route,
                             const td_layer_pair *pairs, size_t np, td_layer_summary *sum, td_err *err)
{
    static const int64_t ranks[] = {0}, tokens[] = {1, 5};
    static const double scales[] = {0.5};
    td_layer_audit_opts o;
    td_layer_audit_opts_init(&o);
    o.model = dir;
    o.block = b;
    o.tp = 2;
    o.layers = layers;
    o.n_layers = nl;
    o.ranks = ranks;
    o.n_ranks = 1;
    o.tokens = tokens;
    o.n_tokens = 2;
    o.scales = scales;
    o.n_scales = 1;
    o.routes = &route;
    o.n_routes = 1;
    o.pairs = pairs;
    o.n_pairs = np;
    collect c = {0};
    td_layer_sink sink = {&c, collect_row};
    return td_layer_audit_run(&o, &sink, sum, err);
}

static void mixer_blocks(void **state)
{
    (void)state;
    char dir[768];
    td_test_gen("qwen3-next-tiny", 5, false, 8, "la_q3n", dir, sizeof dir);
    grid g;
    grid_default(&g);
    add_pair(&g, "ref,ref:act_dtype=fp16");
    add_pair(&g, "ref:threads=1,ref:threads=2");
    add_pair(&g, "ref:tp_size=1,ref:tp_size=2,tp_rank=all");
    static const int64_t gdn_layers[] = {0, 1}, attn_layers[] = {3, 7};
    const struct {
        td_block b;
        const int64_t *layers;
        const char *tap;
    } cases[] = {{TD_BLOCK_GDN, gdn_layers, "gdn.out"}, {TD_BLOCK_ATTN, attn_layers, "attn.out"}};
    for (size_t i = 0; i < 2; i++) {
        td_layer_summary sum;
        td_err err;
        if (mixer_audit(dir, cases[i].b, cases[i].layers, 2, TD_ROUTE_ROUTER, g.pairs, g.np, &sum, &err))
            fail_msg("%s: %s", cases[i].tap, err.msg);
        assert_int_equal(sum.rows, 4);
        assert_int_equal(sum.checks, 4 * (3 + 5)); /* 3 pairs + 5 distinct variants' repeats */
        assert_int_equal(sum.failed, 0);
        assert_int_equal(sum.passed, sum.checks);
        for (size_t j = 0; j < sum.n_groups; j++) {
            const td_layer_group *gr = &sum.groups[j];
            assert_string_equal(gr->tap, cases[i].tap);
            print_message("  %-5s %-7s %-26s %-40s exact %lld / %lld  worst rel_l2 %.3e\n", cases[i].tap, gr->kind,
                          gr->a, gr->b, (long long)gr->exact, (long long)gr->checks, gr->worst_rel_l2);
            if (!strcmp(gr->kind, "repeat") || strstr(gr->b, "threads=2")) assert_int_equal(gr->exact, gr->checks);
            else assert_true(gr->worst_rel_l2 > 0.0); /* a real difference, within its bound */
        }
        td_layer_summary_free(&sum);
    }
    /* the other layer type, a route, a block the audit does not run */
    td_layer_summary sum;
    td_err err;
    static const int64_t l0[] = {0};
    assert_int_not_equal(mixer_audit(dir, TD_BLOCK_ATTN, l0, 1, TD_ROUTE_ROUTER, g.pairs, 1, &sum, &err), TD_OK);
    assert_non_null(strstr(err.msg, "needs a full_attention layer"));
    assert_int_equal(mixer_audit(dir, TD_BLOCK_GDN, l0, 1, TD_ROUTE_RANDOM, g.pairs, 1, &sum, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "applies to the moe block only"));
    assert_int_equal(mixer_audit(dir, TD_BLOCK_ROUTER, l0, 1, TD_ROUTE_ROUTER, g.pairs, 1, &sum, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "expected moe, attn or gdn"));
}

static int cli(const char *const *args, int n)
{
    char *argv[64];
    argv[0] = (char *)"layer";
    for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    argv[n + 1] = NULL;
    fflush(stdout);
    return cmd_audit_layer(n + 1, argv);
}

/* A pair whose sides compute different quantities (a rank's partial sum against the full
 * output, or slices of different tp sizes or ranks) is refused before anything runs, naming
 * both sides and what each computes; same-slice and full-vs-full pairs run. */
static void pair_sides_must_match(void **state)
{
    (void)state;
    static const struct {
        const char *pair, *needle;
    } bad[] = {
        {"ref,ref:tp_size=2,tp_rank=all", "compares rank 0's partial sum of tp_size 4 with the full output"},
        {"ref:tp_size=1,ref", "compares the full output with rank 0's partial sum of tp_size 4"},
        {"ref:tp_size=2,tp_rank=1,ref", "rank 1's partial sum of tp_size 2 with rank 0's partial sum of tp_size 4"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        grid g;
        grid_default(&g);
        g.nt = 1;
        add_pair(&g, bad[i].pair);
        td_layer_audit_opts o;
        grid_opts(&g, &o);
        collect c = {cJSON_CreateArray(), NULL, 0, 0};
        td_layer_sink sink = {&c, collect_row};
        td_layer_summary sum;
        td_err err;
        assert_int_equal(td_layer_audit_run(&o, &sink, &sum, &err), TD_ERR_ARG);
        if (!strstr(err.msg, bad[i].needle) || !strstr(err.msg, g.pairs[0].a_text))
            fail_msg("pair '%s': message '%s' lacks '%s'", bad[i].pair, err.msg, bad[i].needle);
        assert_int_equal(cJSON_GetArraySize(c.rows), 0);
        cJSON_Delete(c.rows);
    }
    /* the same slice on both sides, and full against full, run */
    grid g;
    grid_default(&g);
    g.nt = 1;
    add_pair(&g, "ref,ref:threads=2");
    add_pair(&g, "ref:tp_size=2,tp_rank=1,ref:tp_size=2,tp_rank=1,threads=2");
    add_pair(&g, "ref:tp_size=1,ref:tp_size=4,tp_rank=all");
    collect c = {cJSON_CreateArray(), NULL, 0, 0};
    td_layer_summary sum;
    run_grid(&g, &c, &sum);
    assert_int_equal(sum.rows, 1);
    assert_int_equal(sum.failed, 0);
    cJSON_Delete(c.rows);
    td_layer_summary_free(&sum);
}

static void cli_usage_and_errors(void **state)
{
    (void)state;
    const char *dir = fixture_dir();
    const char *help[] = {"--help"};
    assert_int_equal(cli(help, 1), 0);
    const char *const *cases[] = {
        (const char *const[]){"--layers", "0", NULL},
        (const char *const[]){"--model", "X", "--bogus", NULL},
        (const char *const[]){"--model", "X", "--layers", "0,,1", NULL},
        (const char *const[]){"--model", "X", "--ranks", "4", NULL},
        (const char *const[]){"--model", "X", "--tp", "0", NULL},
        (const char *const[]){"--model", "X", "--tokens", "0", NULL},
        (const char *const[]){"--model", "X", "--pair", "ref", NULL},
        (const char *const[]){"--model", "X", "--routes", "sometimes", NULL},
        (const char *const[]){"--model", "X", "--scales", "-1", NULL},
        (const char *const[]){"--model", "X", "--taps", "moe.nothing", NULL},
        (const char *const[]){"--model", "X", "--outliers", "2", NULL},
        (const char *const[]){"--model", "X", "--db", "a.db", "--no-db", NULL},
        (const char *const[]){"--model", "X", "--pair", "ref,ref", "--threads", "2", NULL},
        (const char *const[]){"--model", "X", "--seed", NULL},
        (const char *const[]){"--model", "/nonexistent/dir", "--no-db", "--tokens", "1", NULL},
        (const char *const[]){"--model", "X", "--block", "router", NULL},
        (const char *const[]){"--model", "X", "--block", NULL},
        (const char *const[]){"--model", dir, "--no-db", "--tokens", "1", "--block", "gdn", "--routes", "random", NULL},
        (const char *const[]){"--model", dir, "--no-db", "--tokens", "1", "--pair", "ref,ref:tp_size=2,tp_rank=all", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = 0;
        while (cases[i][n]) n++;
        int rc = cli(cases[i], n);
        if (rc != 2) fail_msg("case %zu: exit %d, want 2", i, rc);
    }
    (void)dir;
}

static void cli_runs(void **state)
{
    (void)state;
    const char *dir = fixture_dir();
    const char *out = td_test_path("la_out.json");
    remove(out);
    const char *ok[] = {"--model", dir, "--layers", "0-1", "--ranks", "0,3", "--tokens", "1,3", "--no-db",
                        "--no-progress", "--out", out, "--routes", "router,mod17", "--taps", "moe.topk*"};
    assert_int_equal(cli(ok, 16), 0);
    char *text = td_test_slurp(out, NULL);
    assert_non_null(text);
    cJSON *rows = cJSON_Parse(text);
    free(text);
    assert_non_null(rows);
    assert_int_equal(cJSON_GetArraySize(rows), 2 * 2 * 2 * 2);
    cJSON *schema = doc_schema();
    validate(schema, rows, "out");
    cJSON_Delete(rows);

    const char *bug[] = {"--model", dir, "--tokens", "2", "--no-db", "--no-progress",
                         "--pair", "ref,ref:fault=reciprocal_global", "--out", out};
    assert_int_equal(cli(bug, 10), 1);
    text = td_test_slurp(out, NULL);
    rows = cJSON_Parse(text);
    free(text);
    validate(schema, rows, "bug");
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 0), "pass")));
    cJSON_Delete(rows);
    cJSON_Delete(schema);

    const char *cuda[] = {"--model", dir, "--tokens", "1", "--no-db", "--pair", "ref,cuda:storage=raw"};
#ifndef TD_HAVE_CUDA
    assert_int_equal(cli(cuda, 7), 2);
#else
    (void)cuda;
#endif
    const char *db = td_test_path("la_cli.db");
    remove(db);
    const char *js[] = {"--model", dir, "--tokens", "1", "--db", db, "--json", "--no-progress", "--threads", "2"};
    assert_int_equal(cli(js, 10), 0);
    td_db *h;
    td_err err;
    assert_int_equal(td_db_open(db, TD_DB_READONLY, &h, &err), TD_OK);
    td_db_close(h);
}

static void cli_end_to_end(void **state)
{
    (void)state;
    const char *tandem = getenv("TD_TANDEM");
    if (!tandem || access(tandem, X_OK) != 0) skip();
    if (td_test_sh("%s audit layer --help >/dev/null 2>&1", tandem) != 0) skip(); /* not dispatched yet */
    const char *dir = fixture_dir();
    const char *out = td_test_path("la_e2e.json");
    assert_int_equal(td_test_sh("%s audit layer --model %s --tokens 1,2 --no-db --no-progress --out %s >/dev/null",
                                tandem, dir, out),
                     0);
    assert_int_equal(td_test_sh("%s audit layer --model %s --tokens 1 --no-db --no-progress "
                                "--pair ref,ref:fault=no_renorm >/dev/null 2>&1",
                                tandem, dir),
                     1);
    assert_int_equal(td_test_sh("%s audit layer --model %s --ranks 9 >/dev/null 2>&1", tandem, dir), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pair_parsing),
        cmocka_unit_test(grid_default_pairs_all_pass),
        cmocka_unit_test(taps_rows_validate),
        cmocka_unit_test(row_replays_alone),
        cmocka_unit_test(planted_bugs_are_caught),
        cmocka_unit_test(routes_that_differ),
        cmocka_unit_test(db_rows),
        cmocka_unit_test(mixer_blocks),
        cmocka_unit_test(pair_sides_must_match),
        cmocka_unit_test(cli_usage_and_errors),
        cmocka_unit_test(cli_runs),
        cmocka_unit_test(cli_end_to_end),
    };
    return cmocka_run_group_tests_name("layer_audit", tests, NULL, NULL);
}
