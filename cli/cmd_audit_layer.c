/* cmd_audit_layer.c — `tandem audit layer`: options in, audit/layer_audit.c does the work. */
#include "cmd_audit_layer.h"
#include "args.h"
#include "audit/engines.h"
#include "audit/layer_audit.h"
#include "db/db.h"

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREFIX "tandem audit layer: "

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem audit layer --model DIR [--layers LIST] [--ranks LIST] [--tp N]\n"
            "                          [--tokens LIST] [--pair A,B[@exact|@bounded[=X]]]...\n"
            "                          [--scales LIST] [--routes LIST] [--seed N]\n"
            "                          [--outliers FRAC[:MAG]] [--taps LIST] [--threads N]\n"
            "                          [--block moe|attn|gdn] [--out FILE] [--json]\n"
            "                          [--db PATH | --no-db] [--no-progress]\n"
            "\n"
            "The single-layer MoE audit: for every layer x TP rank x token count x activation scale x\n"
            "route pattern, build seeded synthetic activations, run both engine variants of every pair\n"
            "on the layer's MoE block (all experts of the checkpoint), each twice, and compare the block\n"
            "output (plus requested taps) of each pair and of each repeat. Every comparison records\n"
            "exact, mismatches, max_abs, relative_l2, max_ulp, nmse, cosine, finite and the first\n"
            "differing index, and is judged against its expectation: exact (bitwise and finite) or\n"
            "bounded (finite and relative_l2 <= bound: FP32 1e-5, FP16 2e-3, BF16 1e-2).\n"
            "A bounded pair on the router's own routes also gets the check moe.routes: tokens\n"
            "routed differently must be near-ties (each side's top-k follows its own router\n"
            "logits, and the logits are within the bound); the block output is then judged\n"
            "without those tokens (tokens_excluded in the rows; docs/audit-layer.md).\n"
            "\n"
            "options:\n"
            "  --model DIR         checkpoint directory (config.json + safetensors)\n"
            "  --block B           the block audited: moe (default), or the layer's token mixer,\n"
            "                      attn (full_attention layers) or gdn (linear_attention layers),\n"
            "                      each from a fresh state; routes apply to moe only\n"
            "  --layers LIST       layers, e.g. 0,23,47 or 0-3 (default 0)\n"
            "  --ranks LIST        emulated TP ranks (default 0); each below --tp\n"
            "  --tp N              emulated tensor-parallel size of the rows (default 4, as the seed);\n"
            "                      rank r computes its shard: W13 rows and W2 columns r*I/N..(r+1)*I/N\n"
            "  --tokens LIST       token counts M (default 1,3,4,7,8,16,32,128,784)\n"
            "  --pair A,B          an ordered pair of engine variants (repeatable). Variants are\n"
            "                      'engine[:option=value,...]' (docs/engine.md). The expectation is\n"
            "                      exact when A and B differ only in neutral options (threads,\n"
            "                      storage, graphs, fault, kernels), bounded otherwise; force it\n"
            "                      with @exact, @bounded or @bounded=X. A side that sets neither\n"
            "                      tp_size nor tp_rank runs --tp and the row's rank; both sides\n"
            "                      must compute the same quantity (the full output, or the same\n"
            "                      rank's slice), else the pair is refused. Default pairs (CPU):\n"
            "                        ref:scale=exact,ref:scale=fp16   (what prepared FP16 scale\n"
            "                                                          storage changes; bounded)\n"
            "                        ref:threads=1,ref:threads=N       (thread count; exact)\n"
            "  --scales LIST       activation scales: x = scale * N(0,1) (default 0.1, the seed's)\n"
            "  --routes LIST       router (the checkpoint's router on x, default), random (top-k of\n"
            "                      N(0,1) scores, softmax weights: the seed's routing), same-expert\n"
            "                      (expert 0 everywhere), mod17 (expert (t*k+j) mod 17), invalid (bad\n"
            "                      ids that every engine must reject with an error)\n"
            "  --seed N            seed of the activations and synthetic routes (0..2^53, default\n"
            "                      20260905); a row depends only on (seed, layer, rank, tokens, scale)\n"
            "  --outliers FRAC[:MAG]  multiply a fraction FRAC of the activations by MAG (default 100)\n"
            "  --taps LIST         also compare these intermediate tensors: moe.router_logits,\n"
            "                      moe.topk, moe.topk_weights, moe.expert_act, moe.expert_out,\n"
            "                      moe.shared_out, globs such as 'moe.*', or 'all'\n"
            "  --threads N         N of the default thread pair (default: online CPUs, at least 2)\n"
            "  --out FILE          write the rows as a JSON array to FILE (docs/audit-layer.md schema)\n"
            "  --json              print {\"summary\", \"rows\"} as JSON on stdout instead of the table\n"
            "  --db PATH           results store (default $TANDEM_DB, else ./tandem.db; created if absent)\n"
            "  --no-db             do not write to the results store\n"
            "  --no-progress       never draw the progress bar (drawn only when stderr is a terminal)\n"
            "  -h, --help          this text\n"
            "\n"
            "exit status: 0 every expectation met, 1 an expectation failed (a finding), 2 usage\n"
            "             error, input that cannot be read, or an engine error.\n");
}

/* ---- option values --------------------------------------------------------------------------- */

/* "0,3,5-7" -> list (order kept, duplicates removed); replaces *out. */
static int parse_ints(const char *opt, const char *s, int64_t lo, int64_t hi, const char *example, int64_t **out,
                      size_t *n)
{
    int64_t *v;
    size_t k;
    if (cli_int_list(s, lo, hi, &v, &k)) {
        fprintf(stderr, PREFIX "%s '%s': expected a list of at most %d integers in [%lld, %lld] such as %s\n", opt,
                s, CLI_LIST_MAX, (long long)lo, (long long)hi, example);
        return -1;
    }
    free(*out);
    *out = v;
    *n = k;
    return 0;
}

static int parse_scales(const char *s, double **out, size_t *n)
{
    size_t cap = 8, k = 0;
    double *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        double d = strtod(p, &end);
        if (end == p || errno || !isfinite(d) || d < 0.0) goto bad;
        if (k == cap) {
            cap *= 2;
            double *q = realloc(v, cap * sizeof *q);
            if (!q) goto bad;
            v = q;
        }
        v[k++] = d;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p) goto bad;
        } else if (*p) {
            goto bad;
        }
    }
    if (!k) goto bad;
    free(*out);
    *out = v;
    *n = k;
    return 0;
bad:
    fprintf(stderr, PREFIX "--scales '%s': expected non-negative numbers such as 0.001,0.1,1,3\n", s);
    free(v);
    return -1;
}

static int parse_routes(const char *s, td_route_kind *out, size_t *n)
{
    char buf[256];
    if (strlen(s) >= sizeof buf || !*s) {
        fprintf(stderr, PREFIX "--routes '%s': expected router,random,same-expert,invalid,mod17\n", s);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", s);
    size_t k = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        td_route_kind r;
        td_err err;
        if (td_route_kind_parse(tok, &r, &err)) {
            fprintf(stderr, PREFIX "--routes: %s\n", err.msg);
            return -1;
        }
        bool dup = false;
        for (size_t i = 0; i < k; i++) dup = dup || out[i] == r;
        if (!dup) out[k++] = r;
    }
    if (!k) {
        fprintf(stderr, PREFIX "--routes '%s': empty\n", s);
        return -1;
    }
    *n = k;
    return 0;
}

/* --taps: "all", or suffixes/globs each matching at least one known tap. */
static int parse_taps(const char *s, char ***out, size_t *n)
{
    char buf[1024];
    if (!*s || strlen(s) >= sizeof buf) {
        fprintf(stderr, PREFIX "--taps '%.60s': expected a list such as moe.router_logits,moe.topk or all\n", s);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", s);
    char **v = calloc(td_layer_tap_suffix_count + 64, sizeof *v);
    size_t k = 0;
    if (!v) return -1;
    for (char *tok = strtok(buf, ","); tok && k < td_layer_tap_suffix_count + 64; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "all")) {
            for (size_t i = 0; i < td_layer_tap_suffix_count; i++) v[k++] = strdup(td_layer_tap_suffixes[i]);
            continue;
        }
        bool hit = false;
        for (size_t i = 0; i < td_layer_tap_suffix_count && !hit; i++)
            hit = !strcmp(tok, td_layer_tap_suffixes[i]) || fnmatch(tok, td_layer_tap_suffixes[i], 0) == 0;
        if (!hit) {
            fprintf(stderr, PREFIX "--taps: '%s' matches no tap (taps:", tok);
            for (size_t i = 0; i < td_layer_tap_suffix_count; i++) fprintf(stderr, " %s", td_layer_tap_suffixes[i]);
            fprintf(stderr, ")\n");
            for (size_t i = 0; i < k; i++) free(v[i]);
            free(v);
            return -1;
        }
        v[k++] = strdup(tok);
    }
    for (size_t i = 0; i < k; i++)
        if (!v[i]) {
            for (size_t j = 0; j < k; j++) free(v[j]);
            free(v);
            return -1;
        }
    *out = v;
    *n = k;
    return 0;
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, PREFIX "%s '%s': expected an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- sinks ----------------------------------------------------------------------------------- */

typedef struct sink_ctx {
    cJSON *rows;        /* JSON rows (for --out / --json), or NULL */
    td_db *db;
    int64_t run;
} sink_ctx;

static td_status on_row(void *ctx, const td_layer_row *row, td_err *err)
{
    sink_ctx *c = ctx;
    if (c->rows) {
        cJSON *j = td_layer_row_json(row);
        if (!j) return td_err_set(err, TD_ERR_NOMEM, "out of memory (JSON rows)");
        cJSON_AddItemToArray(c->rows, j);
    }
    if (c->db) return td_layer_row_db(c->db, c->run, row, err);
    return TD_OK;
}

static td_status write_json_file(const char *path, const cJSON *j, td_err *err)
{
    char *s = cJSON_Print(j);
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "out of memory (JSON)");
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(s);
        return td_err_set(err, TD_ERR_ARG, "--out: path too long");
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(s);
        return td_err_set(err, TD_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    bool ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(s);
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return td_err_set(err, TD_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return TD_OK;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_audit_layer(int argc, char **argv)
{
    td_layer_audit_opts o;
    td_layer_audit_opts_init(&o);
    o.progress = true;
    int64_t *layers = NULL, *ranks = NULL, *tokens = NULL;
    double *scales = NULL;
    td_route_kind routes[TD_ROUTE_COUNT];
    size_t n_routes = 0;
    char **taps = NULL;
    size_t n_taps = 0;
    const char *pair_text[64];
    size_t n_pair_text = 0;
    const char *out_path = NULL, *db_path = NULL;
    bool json = false, no_db = false;
    long threads = 0, tp = 4;
    td_layer_pair *pairs = NULL;
    int rc = 2;
    cJSON *rows_json = NULL;
    char **cmdline = NULL;
    sink_ctx sc;
    memset(&sc, 0, sizeof sc);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto out;
        }
        static const char *const with_value[] = {"--model", "--layers", "--ranks", "--tp", "--tokens", "--pair",
                                                 "--scales", "--routes", "--seed", "--outliers", "--taps",
                                                 "--threads", "--out", "--db", "--block"};
        char name[32];
        snprintf(name, sizeof name, "%s", a);
        const char *eq = strchr(a, '=');
        if (eq && !strncmp(a, "--", 2) && (size_t)(eq - a) < sizeof name) {
            name[eq - a] = 0;
            val = eq + 1;
        }
        bool takes = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) takes = takes || !strcmp(name, with_value[k]);
        if (takes && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, PREFIX "option '%s' needs a value (see --help)\n", name);
                goto out;
            }
            val = argv[++i];
        } else if (!takes && val) {
            fprintf(stderr, PREFIX "option '%s' takes no value\n", name);
            goto out;
        }
        long v;
        if (!strcmp(name, "--model")) o.model = val;
        else if (!strcmp(name, "--layers")) {
            if (parse_ints(name, val, 0, 100000, "0,23,47 or 0-3", &layers, &o.n_layers)) goto out;
        } else if (!strcmp(name, "--ranks")) {
            if (parse_ints(name, val, 0, TD_TP_MAX - 1, "0,3 or 0-3", &ranks, &o.n_ranks)) goto out;
        } else if (!strcmp(name, "--tp")) {
            if (parse_long(name, val, 1, TD_TP_MAX, &tp)) goto out;
        } else if (!strcmp(name, "--tokens")) {
            if (parse_ints(name, val, 1, TD_ENGINE_MAX_TOKENS, "1,4,8,16,784", &tokens, &o.n_tokens)) goto out;
        } else if (!strcmp(name, "--pair")) {
            if (n_pair_text == 64) {
                fprintf(stderr, PREFIX "at most 64 --pair options\n");
                goto out;
            }
            pair_text[n_pair_text++] = val;
        } else if (!strcmp(name, "--scales")) {
            if (parse_scales(val, &scales, &o.n_scales)) goto out;
        } else if (!strcmp(name, "--routes")) {
            if (parse_routes(val, routes, &n_routes)) goto out;
        } else if (!strcmp(name, "--seed")) {
            if (parse_long(name, val, 0, 9007199254740992L, &v)) goto out; /* 2^53: exact in JSON */
            o.seed = (uint64_t)v;
        } else if (!strcmp(name, "--outliers")) {
            char *end;
            errno = 0;
            double f = strtod(val, &end), mag = 100.0;
            bool ok = end != val && !errno && f >= 0.0 && f <= 1.0;
            if (ok && *end == ':') {
                const char *m = end + 1;
                mag = strtod(m, &end);
                ok = end != m && isfinite(mag);
            }
            if (!ok || *end) {
                fprintf(stderr, PREFIX "--outliers '%s': expected FRAC in [0, 1], optionally :MAG (e.g. 0.001:100)\n", val);
                goto out;
            }
            o.outlier_frac = f;
            o.outlier_mag = mag;
        } else if (!strcmp(name, "--taps")) {
            if (taps) {
                fprintf(stderr, PREFIX "--taps is given twice\n");
                goto out;
            }
            if (parse_taps(val, &taps, &n_taps)) goto out;
        } else if (!strcmp(name, "--threads")) {
            if (parse_long(name, val, 1, TD_ENGINE_MAX_THREADS, &threads)) goto out;
        } else if (!strcmp(name, "--block")) {
            if (!strcmp(val, "moe")) o.block = TD_BLOCK_MOE;
            else if (!strcmp(val, "attn")) o.block = TD_BLOCK_ATTN;
            else if (!strcmp(val, "gdn")) o.block = TD_BLOCK_GDN;
            else {
                fprintf(stderr, PREFIX "--block '%s': expected moe, attn or gdn\n", val);
                goto out;
            }
        } else if (!strcmp(name, "--out")) out_path = val;
        else if (!strcmp(name, "--db")) db_path = val;
        else if (!strcmp(name, "--json")) json = true;
        else if (!strcmp(name, "--no-db")) no_db = true;
        else if (!strcmp(name, "--no-progress")) o.progress = false;
        else {
            fprintf(stderr, PREFIX "unknown option '%s' (see --help)\n", a);
            goto out;
        }
    }
    if (!o.model) {
        fprintf(stderr, PREFIX "--model DIR is required (see --help)\n");
        goto out;
    }
    if (no_db && db_path) {
        fprintf(stderr, PREFIX "--db and --no-db exclude each other\n");
        goto out;
    }
    o.tp = (int)tp;
    static const int64_t def_layer = 0, def_rank = 0;
    static const int64_t def_tokens[] = {1, 3, 4, 7, 8, 16, 32, 128, 784};
    static const double def_scale = 0.1;
    static const td_route_kind def_route = TD_ROUTE_ROUTER;
    o.layers = layers ? layers : &def_layer;
    if (!layers) o.n_layers = 1;
    o.ranks = ranks ? ranks : &def_rank;
    if (!ranks) o.n_ranks = 1;
    o.tokens = tokens ? tokens : def_tokens;
    if (!tokens) o.n_tokens = TD_ARRAY_LEN(def_tokens);
    o.scales = scales ? scales : &def_scale;
    if (!scales) o.n_scales = 1;
    o.routes = n_routes ? routes : &def_route;
    o.n_routes = n_routes ? n_routes : 1;
    o.taps = (const char *const *)taps;
    o.n_taps = n_taps;
    for (size_t i = 0; i < o.n_ranks; i++)
        if (o.ranks[i] >= o.tp) {
            fprintf(stderr, PREFIX "--ranks: rank %lld is not below --tp %d\n", (long long)o.ranks[i], o.tp);
            goto out;
        }

    /* pairs: given, or the two CPU defaults */
    char def_pairs[2][128];
    if (!n_pair_text) {
        if (!threads) {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            threads = n < 2 ? 2 : n > TD_ENGINE_MAX_THREADS ? TD_ENGINE_MAX_THREADS : n;
        }
        snprintf(def_pairs[0], sizeof def_pairs[0], "ref:scale=exact,ref:scale=fp16");
        snprintf(def_pairs[1], sizeof def_pairs[1], "ref:threads=1,ref:threads=%ld", threads);
        pair_text[0] = def_pairs[0];
        pair_text[1] = def_pairs[1];
        n_pair_text = 2;
    } else if (threads) {
        fprintf(stderr, PREFIX "--threads sets the default thread pair; with --pair write threads= in the variants\n");
        goto out;
    }
    pairs = calloc(n_pair_text, sizeof *pairs);
    if (!pairs) goto out;
    td_err err;
    td_err_clear(&err);
    for (size_t i = 0; i < n_pair_text; i++) {
        if (td_layer_pair_parse(pair_text[i], &pairs[o.n_pairs], &err)) {
            fprintf(stderr, PREFIX "--pair: %s\n", err.msg);
            goto out;
        }
        bool dup = false;
        for (size_t j = 0; j < o.n_pairs; j++)
            dup = dup || (!strcmp(pairs[j].a_text, pairs[o.n_pairs].a_text) &&
                          !strcmp(pairs[j].b_text, pairs[o.n_pairs].b_text));
        if (!dup) o.n_pairs++;
    }
    o.pairs = pairs;

    if (out_path || json) {
        rows_json = cJSON_CreateArray();
        if (!rows_json) goto out;
        sc.rows = rows_json;
    }
    td_status st = TD_OK;
    if (!no_db) {
        st = td_db_open(td_db_path_resolve(db_path), TD_DB_CREATE, &sc.db, &err);
        if (!st) {
            const char *vars[128];
            size_t nv = 0;
            for (size_t i = 0; i < o.n_pairs; i++) {
                const char *ab[2] = {pairs[i].a_text, pairs[i].b_text};
                for (int s = 0; s < 2; s++) {
                    bool seen = false;
                    for (size_t j = 0; j < nv; j++) seen = seen || !strcmp(vars[j], ab[s]);
                    if (!seen) vars[nv++] = ab[s];
                }
            }
            /* the command line as typed: tandem audit layer ... */
            cmdline = calloc((size_t)argc + 2, sizeof *cmdline);
            if (!cmdline) {
                fprintf(stderr, PREFIX "out of memory\n");
                goto out;
            }
            cmdline[0] = (char *)"tandem";
            cmdline[1] = (char *)"audit";
            for (int i = 0; i < argc; i++) cmdline[i + 2] = argv[i];
            td_db_run_info info;
            memset(&info, 0, sizeof info);
            info.kind = "audit.layer";
            info.argc = argc + 2;
            info.argv = cmdline;
            info.checkpoint = o.model;
            info.variants = vars;
            info.n_variants = nv;
            info.seeds = &o.seed;
            info.n_seeds = 1;
            st = td_db_run_begin(sc.db, &info, &sc.run, &err);
        }
        if (st) {
            cli_error("audit layer", err.msg);
            goto out;
        }
    }

    td_layer_sink sink = {&sc, on_row};
    td_layer_summary sum;
    st = td_layer_audit_run(&o, &sink, &sum, &err);
    if (sc.db) {
        /* the GPU of the engines that loaded, a failed run's too (there a failure to record it
         * does not replace the audit's own error) */
        td_err e2;
        const td_status ds = td_engine_device_record(sc.db, sc.run, &sum.device, &e2);
        if (!st && ds) {
            st = ds;
            err = e2;
        }
    }
    if (st) {
        cli_error("audit layer", err.msg);
        if (sc.db) {
            td_err e2;
            (void)td_db_run_end(sc.db, sc.run, TD_DB_RUN_FAILED, 2, err.msg, &e2);
        }
        td_layer_summary_free(&sum); /* the audit's own failure has freed it already */
        goto out;
    }
    rc = sum.failed ? 1 : 0;
    if (out_path) {
        st = write_json_file(out_path, rows_json, &err);
        if (st) {
            cli_error("audit layer", err.msg);
            rc = 2;
        }
    }
    if (json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON *s = td_layer_summary_json(&sum);
        if (doc && s) {
            cJSON_AddItemToObject(doc, "summary", s);
            cJSON_AddItemReferenceToObject(doc, "rows", rows_json);
            char *text = cJSON_Print(doc);
            if (text) printf("%s\n", text);
            free(text);
        } else {
            cJSON_Delete(s);
        }
        cJSON_Delete(doc);
    } else {
        td_layer_summary_print(&sum, stdout);
        if (out_path && rc != 2) printf("rows written to %s\n", out_path);
    }
    if (sc.db) {
        const char *msg = rc == 1 ? "an expectation failed" : rc == 2 ? "could not write --out" : NULL;
        st = td_db_run_end(sc.db, sc.run, rc == 2 ? TD_DB_RUN_FAILED : TD_DB_RUN_OK, rc, msg, &err);
        if (st) {
            cli_error("audit layer", err.msg);
            rc = 2;
        } else if (!json) {
            printf("results store: %s, run %lld\n", td_db_path(sc.db), (long long)sc.run);
        }
    }
    fflush(stdout);
    if (rc == 1) fprintf(stderr, PREFIX "%lld check(s) missed their expectation\n", (long long)sum.failed);
    td_layer_summary_free(&sum);
out:
    free(cmdline);
    cJSON_Delete(rows_json);
    td_db_close(sc.db);
    free(pairs);
    free(layers);
    free(ranks);
    free(tokens);
    free(scales);
    if (taps)
        for (size_t i = 0; i < n_taps; i++) free(taps[i]);
    free(taps);
    return rc;
}
