/* cmd_audit.c — `tandem audit`: audits with one subcommand each (`e4m3`, `layer`). */
#include "cli.h"
#include "cmd_audit_layer.h"
#include "args.h"
#include "audit/e4m3.h"
#include "audit/e4m3_db.h"
#include "audit/scale_audit.h"
#include "audit/scale_report.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmd_audit_e4m3(int argc, char **argv);

/* Subcommands of `tandem audit`: one entry each (argv[0] is the subcommand name). */
static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} audits[] = {
    {"e4m3", cmd_audit_e4m3, "E4M3 codec self-audit, and the raw-vs-prepared scale-storage audit of a\n"
                             "          checkpoint (--model)"},
    {"layer", cmd_audit_layer, "per-layer MoE block audit: pairs of engine variants on seeded activations,\n"
                               "          every metric and verdict against the pair's expectation"},
};

static void audit_usage(FILE *f)
{
    fprintf(f, "usage: tandem audit <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < sizeof audits / sizeof audits[0]; i++)
        fprintf(f, "  %-7s %s\n", audits[i].name, audits[i].summary);
    fprintf(f, "\n'tandem audit <subcommand> --help' describes one.\n");
}

static void e4m3_usage(FILE *f)
{
    fprintf(f,
            "usage: tandem audit e4m3 [--model DIR] [--layers LIST] [--experts LIST] [--tp N]\n"
            "                         [--json FILE] [--db PATH | --no-db] [options]\n"
            "\n"
            "Part 1 (always): self-audit of tandem's E4M3, E2M1, FP16 and BF16 conversions and of the\n"
            "prepared/strict/fast scale arithmetic against independent oracles: all 256 E4M3 codes,\n"
            "every rounding decision point of the three float32->E4M3 semantics (torch, satfinite,\n"
            "nosat) and of E2M1, seeded random sweeps, and every code x a global set covering zero,\n"
            "negative, FP16-underflow and FP16-overflow globals.\n"
            "\n"
            "Part 2 (--model): for every NVFP4 tensor of the checkpoint, may its E4M3 block scales be\n"
            "stored raw (one byte, expanded in the SM70 kernel) instead of as prepared FP16 scales\n"
            "without changing a bit of what the kernel multiplies? Census of codes, globals and\n"
            "prepared scales; strict (prefill) and fast (decode) reconstructions compared bit for bit;\n"
            "finiteness and FP16 range; W13 global-slot layouts (interleaved and not); sibling\n"
            "(gate/up, q/k/v) globals; per TP rank slice with --tp. Each tensor is admitted or\n"
            "rejected with its first offending element and reason (zero_code, subnormal_code,\n"
            "negative_code, nan_code, bad_global, overflow, underflow, hilo_inexact, mismatch,\n"
            "layout_mismatch); memory saved by raw storage per layer and in total.\n"
            "\n"
            "options:\n"
            "  --model DIR       checkpoint directory (config.json + safetensors)\n"
            "  --layers LIST     layers to audit, e.g. 0,23,47 or 0-3 (default: all, and the\n"
            "                    NVFP4 modules outside layers)\n"
            "  --experts LIST    routed experts to audit (default: all); other modules are kept\n"
            "  --tp N            also judge every tensor and stage per TP rank slice (default 1)\n"
            "  --threads N       worker threads (default: online CPUs); results do not depend on it\n"
            "  --json FILE       write every result as JSON to FILE ('-': stdout; the table then goes\n"
            "                    to stderr)\n"
            "  --db PATH         results store (default $TANDEM_DB, else ./tandem.db; created if absent)\n"
            "  --no-db           do not write to the results store\n"
            "  --seed N          seed of the Part 1 random sweeps (default 1)\n"
            "  --elementwise     evaluate every element instead of once per (code, global); same\n"
            "                    results, slower (a cross-check of the fast mode)\n"
            "  --max-list N      rejections and findings listed in the table (default 20)\n"
            "  --verbose         list every tensor and every stage slice\n"
            "  --no-progress     never draw the progress bar (drawn only when stderr is a terminal)\n"
            "  -h, --help        this text\n"
            "\n"
            "exit status: 0 every check passed (every tensor admitted), 1 a check that was expected\n"
            "             to pass failed (a codec check, a rejected tensor or stage slice, differing\n"
            "             sibling globals), 2 usage error or input that cannot be read.\n");
}

/* "0,3,5-7" -> sorted unique list. */
static int parse_list(const char *opt, const char *s, int64_t **out, size_t *n)
{
    if (cli_int_list(s, 0, INT32_MAX, out, n)) {
        fprintf(stderr, "tandem audit e4m3: %s '%s': expected a list such as 0,23,47 or 0-3\n", opt, s);
        return -1;
    }
    return 0;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tandem audit e4m3: %s '%s': expected an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct sink_ctx {
    td_e4m3_text *text;
    td_e4m3_json *json;
    td_e4m3_db *db;
} sink_ctx;

static td_status on_begin(void *ctx, const td_scale_info *info, td_err *err)
{
    sink_ctx *c = ctx;
    td_status st = td_e4m3_text_begin(c->text, info, err);
    if (!st && c->json) st = td_e4m3_json_begin(c->json, info, err);
    return st;
}

static td_status on_layer(void *ctx, const td_scale_layer *layer, td_err *err)
{
    sink_ctx *c = ctx;
    td_status st = td_e4m3_text_layer(c->text, layer, err);
    if (!st && c->json) st = td_e4m3_json_layer(c->json, layer, err);
    if (!st && c->db) st = td_e4m3_db_layer(c->db, layer, err);
    return st;
}

static int cmd_audit_e4m3(int argc, char **argv)
{
    td_scale_opts o;
    td_scale_opts_init(&o);
    o.progress = true;
    const char *json_path = NULL, *db_path = NULL;
    bool no_db = false, verbose = false;
    long max_list = 20, seed = 1;
    int64_t *layers = NULL, *experts = NULL;
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            e4m3_usage(stdout);
            rc = 0;
            goto out;
        }
        static const char *const with_value[] = {"--model", "--layers", "--experts", "--tp", "--threads",
                                                 "--json", "--db", "--seed", "--max-list"};
        const char *name = a;
        char namebuf[32];
        const char *eq = strchr(a, '=');
        if (eq && eq - a < (long)sizeof namebuf && !strncmp(a, "--", 2)) {
            memcpy(namebuf, a, (size_t)(eq - a));
            namebuf[eq - a] = 0;
            name = namebuf;
            val = eq + 1;
        }
        bool takes = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            if (!strcmp(name, with_value[k])) takes = true;
        if (takes && !val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tandem audit e4m3: option '%s' needs a value (see --help)\n", name);
                goto out;
            }
            val = argv[++i];
        } else if (!takes && val) {
            fprintf(stderr, "tandem audit e4m3: option '%s' takes no value\n", name);
            goto out;
        }
        long v;
        if (!strcmp(name, "--model")) o.model = val;
        else if (!strcmp(name, "--layers")) {
            free(layers);
            layers = NULL;
            if (parse_list(name, val, &layers, &o.n_layers)) goto out;
        } else if (!strcmp(name, "--experts")) {
            free(experts);
            experts = NULL;
            if (parse_list(name, val, &experts, &o.n_experts)) goto out;
        } else if (!strcmp(name, "--tp")) {
            if (parse_int(name, val, 1, TD_SCALE_MAX_TP, &v)) goto out;
            o.tp = (int)v;
        } else if (!strcmp(name, "--threads")) {
            if (parse_int(name, val, 0, TD_SCALE_MAX_THREADS, &v)) goto out;
            o.threads = (int)v;
        } else if (!strcmp(name, "--json")) json_path = val;
        else if (!strcmp(name, "--db")) db_path = val;
        else if (!strcmp(name, "--seed")) {
            if (parse_int(name, val, 0, LONG_MAX, &v)) goto out;
            seed = v;
        } else if (!strcmp(name, "--max-list")) {
            if (parse_int(name, val, 0, 1000000, &v)) goto out;
            max_list = v;
        } else if (!strcmp(name, "--no-db")) no_db = true;
        else if (!strcmp(name, "--elementwise")) o.elementwise = true;
        else if (!strcmp(name, "--verbose")) verbose = true;
        else if (!strcmp(name, "--no-progress")) o.progress = false;
        else {
            fprintf(stderr, "tandem audit e4m3: unknown option '%s' (see --help)\n", a);
            goto out;
        }
    }
    if (no_db && db_path) {
        fprintf(stderr, "tandem audit e4m3: --db and --no-db exclude each other\n");
        goto out;
    }
    if (!o.model && (o.n_layers || o.n_experts || o.tp != 1 || o.elementwise)) {
        fprintf(stderr, "tandem audit e4m3: --layers, --experts, --tp and --elementwise need --model DIR\n");
        goto out;
    }
    o.layers = layers;
    o.experts = experts;

    td_err err;
    td_err_clear(&err);
    sink_ctx sc;
    memset(&sc, 0, sizeof sc);
    td_codec_report *rep = calloc(1, sizeof *rep);
    td_status st = rep ? td_e4m3_text_new((int)max_list, verbose, &sc.text, &err)
                       : td_err_set(&err, TD_ERR_NOMEM, "out of memory");
    if (!st && !no_db) st = td_e4m3_db_open(db_path, argc + 2, argv - 2, o.model, (uint64_t)seed, &sc.db, &err);
    if (!st && json_path) st = td_e4m3_json_open(json_path, &sc.json, &err);
    if (st) goto fail;

    td_codec_audit(td_codec_tandem(), (uint64_t)seed, rep);
    if (sc.json) st = td_e4m3_json_codec(sc.json, rep, &err);
    if (!st && sc.db) st = td_e4m3_db_codec(sc.db, rep, &err);
    if (st) goto fail;

    td_scale_summary sum;
    bool part2 = o.model != NULL;
    if (part2) {
        td_scale_sink sink = {&sc, on_begin, on_layer};
        st = td_scale_audit(&o, &sink, &sum, &err);
        if (st) goto fail;
    }
    rc = 0;
    if (rep->failed || (part2 && td_scale_summary_failed(&sum))) rc = 1;
    if (part2 && sum.total.input_errors) rc = 2;
    FILE *human = json_path && !strcmp(json_path, "-") ? stderr : stdout;
    td_e4m3_text_print(sc.text, rep, part2 ? &sum : NULL, human);
    if (sc.db) {
        if (part2) st = td_e4m3_db_summary(sc.db, &sum, &err);
        if (!st) st = td_e4m3_db_end(sc.db, true, rc, NULL, &err);
        if (!st) fprintf(human, "results store: %s, run %lld\n", td_e4m3_db_path(sc.db),
                         (long long)td_e4m3_db_run_id(sc.db));
    }
    if (!st && sc.json) {
        st = td_e4m3_json_close(sc.json, part2 ? &sum : NULL, rc, &err);
        sc.json = NULL;
    }
    if (st) goto fail;
    goto cleanup;
fail:
    cli_error("audit e4m3", err.msg);
    rc = 2;
    if (sc.db) {
        td_err e2;
        (void)td_e4m3_db_end(sc.db, false, 2, err.msg, &e2);
    }
cleanup:
    td_e4m3_json_free(sc.json);
    td_e4m3_db_free(sc.db);
    td_e4m3_text_free(sc.text);
    free(rep);
out:
    free(layers);
    free(experts);
    return rc;
}

int cmd_audit(int argc, char **argv)
{
    if (argc < 2) {
        audit_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        audit_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof audits / sizeof audits[0]; i++)
        if (!strcmp(argv[1], audits[i].name)) return audits[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tandem audit: unknown subcommand '%s'\n\n", argv[1]);
    audit_usage(stderr);
    return 2;
}
