/* cmd_run.c — `tandem run`: greedy generation with one or more engine variants, completion
 * hashes, divergence positions and margins (docs/ref-model.md), stored in the results db.
 *
 * Prompts file: JSON lines; each non-blank line is one request, either an array of token ids
 * `[1, 2, 3]` or an object `{"id": "name", "tokens": [1, 2, 3]}` (id defaults to the line
 * number). The file is untrusted: lines over 1 MiB, more than 100000 requests, non-integer or
 * out-of-vocabulary ids, empty prompts, duplicate ids and bad JSON are errors naming the file
 * and line.
 */
#include "cli.h"
#include "args.h"
#include "audit/completion.h"
#include "audit/engines.h"
#include "config.h"
#include "db/db.h"
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "tandem run: "
#define RUN_MAX_LINE (1 << 20)
#define RUN_MAX_PROMPTS 100000
#define RUN_MAX_VARIANTS 16

typedef struct run_prompt {
    char id[64];
    int32_t *tokens;
    int64_t n;
} run_prompt;

static void usage(FILE *f)
{
    fprintf(f, "usage: tandem run --model DIR --prompts FILE --engines V[,V...] --max-new N\n"
               "                  [--batch 1,4,...] [--seed S] [--ignore-eos] [--json] [--db PATH | --no-db]\n\n"
               "Greedy generation (temperature 0) of every prompt with every engine variant and decode batch\n"
               "width; prints each completion's SHA-256 hash (little-endian int32 token ids) and, against the\n"
               "first variant at the first batch width, the first differing position and the top-1 minus\n"
               "top-2 logit margins of both there. Prompts: JSON lines of token-id arrays, or objects\n"
               "{\"id\": ..., \"tokens\": [...]}. Variants are comma-separated; an option after a variant\n"
               "continues it (ref:accum=fp64,threads=2,ref is two variants).\n"
               "Exit status: 0 done, 2 usage or input error.\n");
}

static void prompts_free(run_prompt *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) free(p[i].tokens);
    free(p);
}

static int read_prompts(const char *path, int64_t vocab, run_prompt **out, int64_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, PREFIX "%s: %s\n", path, strerror(errno));
        return 2;
    }
    char *line = malloc(RUN_MAX_LINE + 2);
    run_prompt *p = NULL;
    int64_t n = 0, cap = 0, lineno = 0;
    int rc = 0;
    if (!line) {
        fprintf(stderr, PREFIX "out of memory\n");
        rc = 2;
        goto end;
    }
    while (fgets(line, RUN_MAX_LINE + 2, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len > RUN_MAX_LINE || (len == RUN_MAX_LINE + 1 && line[len - 1] != '\n')) {
            fprintf(stderr, PREFIX "%s:%lld: line longer than %d bytes\n", path, (long long)lineno, RUN_MAX_LINE);
            rc = 2;
            goto end;
        }
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\n')) k++;
        if (k == len) continue;
        char what[600];
        snprintf(what, sizeof what, "%s:%lld", path, (long long)lineno);
        cJSON *j = NULL;
        td_err err = {0};
        if (td_json_parse(line, len, RUN_MAX_LINE, what, &j, &err)) {
            fprintf(stderr, PREFIX "%s\n", err.msg);
            rc = 2;
            goto end;
        }
        const cJSON *arr = j;
        const char *id = NULL;
        if (cJSON_IsObject(j)) {
            arr = cJSON_GetObjectItemCaseSensitive(j, "tokens");
            const cJSON *jid = cJSON_GetObjectItemCaseSensitive(j, "id");
            if (jid && !cJSON_IsString(jid)) {
                fprintf(stderr, PREFIX "%s: \"id\" must be a string\n", what);
                rc = 2;
            }
            if (jid && cJSON_IsString(jid)) id = jid->valuestring;
        }
        int64_t nt = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
        if (!rc && nt < 1) {
            fprintf(stderr, PREFIX "%s: expected a non-empty array of token ids (or {\"tokens\": [...]})\n", what);
            rc = 2;
        }
        if (!rc && n >= RUN_MAX_PROMPTS) {
            fprintf(stderr, PREFIX "%s: more than %d prompts\n", what, RUN_MAX_PROMPTS);
            rc = 2;
        }
        if (!rc && id && strlen(id) >= sizeof p->id) {
            fprintf(stderr, PREFIX "%s: id longer than %zu bytes\n", what, sizeof p->id - 1);
            rc = 2;
        }
        if (!rc && n == cap) {
            int64_t nc = cap ? 2 * cap : 16;
            run_prompt *q = realloc(p, (size_t)nc * sizeof *q);
            if (!q) {
                fprintf(stderr, PREFIX "out of memory\n");
                rc = 2;
            } else {
                p = q;
                cap = nc;
            }
        }
        if (!rc) {
            run_prompt *r = &p[n];
            *r = (run_prompt){0};
            if (id) snprintf(r->id, sizeof r->id, "%s", id);
            else snprintf(r->id, sizeof r->id, "line%lld", (long long)lineno);
            for (int64_t i = 0; i < n; i++)
                if (!strcmp(p[i].id, r->id)) {
                    fprintf(stderr, PREFIX "%s: duplicate id \"%s\"\n", what, r->id);
                    rc = 2;
                }
            r->tokens = rc ? NULL : malloc((size_t)nt * sizeof *r->tokens);
            if (!rc && !r->tokens) {
                fprintf(stderr, PREFIX "out of memory\n");
                rc = 2;
            }
            int64_t i = 0;
            const cJSON *el;
            cJSON_ArrayForEach(el, arr)
            {
                if (rc) break;
                int64_t v;
                char where[700];
                snprintf(where, sizeof where, "%s: token %lld", what, (long long)i);
                if (td_json_as_int(el, where, &v, &err)) {
                    fprintf(stderr, PREFIX "%s\n", err.msg);
                    rc = 2;
                } else if (v < 0 || v >= vocab) {
                    fprintf(stderr, PREFIX "%s: token id %lld outside the vocabulary [0, %lld)\n", where,
                            (long long)v, (long long)vocab);
                    rc = 2;
                } else {
                    r->tokens[i++] = (int32_t)v;
                }
            }
            r->n = i;
            if (r->tokens) n++;
        }
        cJSON_Delete(j);
        if (rc) goto end;
    }
    if (ferror(f)) {
        fprintf(stderr, PREFIX "%s: read error\n", path);
        rc = 2;
    } else if (n == 0) {
        fprintf(stderr, PREFIX "%s: no prompts\n", path);
        rc = 2;
    }
end:
    free(line);
    fclose(f);
    if (rc) {
        prompts_free(p, n);
        return rc;
    }
    *out = p;
    *n_out = n;
    return 0;
}

/* Split "a:x=1,y=2,b" into variants: a piece with '=' and no ':' continues the previous one. */
static int split_variants(const char *s, char out[][TD_VARIANT_TEXT_MAX], int *n)
{
    *n = 0;
    char buf[TD_VARIANT_TEXT_MAX * RUN_MAX_VARIANTS];
    if (strlen(s) >= sizeof buf || !*s) return -1;
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const bool cont = strchr(tok, '=') && !strchr(tok, ':');
        if (cont) {
            if (*n == 0 || !strchr(out[*n - 1], ':')) return -1;
            size_t l = strlen(out[*n - 1]);
            if (l + 1 + strlen(tok) >= TD_VARIANT_TEXT_MAX) return -1;
            snprintf(out[*n - 1] + l, TD_VARIANT_TEXT_MAX - l, ",%s", tok);
        } else {
            if (*n == RUN_MAX_VARIANTS || strlen(tok) >= TD_VARIANT_TEXT_MAX) return -1;
            snprintf(out[(*n)++], TD_VARIANT_TEXT_MAX, "%s", tok);
        }
    }
    return *n ? 0 : -1;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) return false;
    *v = x;
    return true;
}

int cmd_run(int argc, char **argv)
{
    const char *model = NULL, *prompts_path = NULL, *engines = NULL, *db_path = NULL, *batch_s = "1";
    int64_t max_new = -1, seed = 0;
    bool ignore_eos = false, json = false, no_db = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--no-db")) no_db = true;
        else if (i + 1 < argc && !strcmp(a, "--model")) model = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--prompts")) prompts_path = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--engines")) engines = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--db")) db_path = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--batch")) batch_s = argv[++i];
        else if (i + 1 < argc && !strcmp(a, "--max-new")) {
            if (!parse_i64(argv[++i], 0, 1 << 20, &max_new)) {
                fprintf(stderr, PREFIX "--max-new: '%s' is not an integer in [0, %d]\n", argv[i], 1 << 20);
                return 2;
            }
        } else if (i + 1 < argc && !strcmp(a, "--seed")) {
            if (!parse_i64(argv[++i], 0, INT64_MAX, &seed)) {
                fprintf(stderr, PREFIX "--seed: '%s' is not a non-negative integer\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, PREFIX "unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !prompts_path || !engines || max_new < 0) {
        fprintf(stderr, PREFIX "--model, --prompts, --engines and --max-new are required\n");
        usage(stderr);
        return 2;
    }
    if (no_db && db_path) {
        fprintf(stderr, PREFIX "--db and --no-db exclude each other\n");
        return 2;
    }
    int64_t *batches = NULL;
    size_t n_batches = 0;
    if (cli_int_list(batch_s, 1, 4096, &batches, &n_batches)) {
        fprintf(stderr, PREFIX "--batch: '%s' is not a list of widths in [1, 4096]\n", batch_s);
        return 2;
    }
    char vtext[RUN_MAX_VARIANTS][TD_VARIANT_TEXT_MAX];
    int nv = 0;
    if (split_variants(engines, vtext, &nv)) {
        fprintf(stderr, PREFIX "--engines: '%s' is not a list of at most %d variants\n", engines, RUN_MAX_VARIANTS);
        free(batches);
        return 2;
    }
    td_err err = {0};
    td_variant vars[RUN_MAX_VARIANTS];
    for (int v = 0; v < nv; v++)
        if (td_variant_parse(vtext[v], &vars[v], &err)) {
            fprintf(stderr, PREFIX "--engines: %s\n", err.msg);
            free(batches);
            return 2;
        }
    td_config cfg;
    if (td_config_load(model, &cfg, &err)) {
        fprintf(stderr, PREFIX "%s\n", err.msg);
        free(batches);
        return 2;
    }
    run_prompt *pr = NULL;
    int64_t np = 0;
    int rc = read_prompts(prompts_path, cfg.vocab_size, &pr, &np);
    if (rc) {
        free(batches);
        return rc;
    }
    td_prompt *tp = malloc((size_t)np * sizeof *tp);
    const size_t n_runs = (size_t)nv * n_batches;
    td_completion *res = calloc(n_runs * (size_t)np, sizeof *res);
    char **cmdline = calloc((size_t)argc + 2, sizeof *cmdline);
    td_db *db = NULL;
    int64_t run_id = 0;
    if (!tp || !res || !cmdline) {
        fprintf(stderr, PREFIX "out of memory\n");
        rc = 2;
        goto out;
    }
    for (int64_t i = 0; i < np; i++) tp[i] = (td_prompt){pr[i].tokens, pr[i].n};
    if (!no_db) {
        const char *vp[RUN_MAX_VARIANTS];
        for (int v = 0; v < nv; v++) vp[v] = vtext[v];
        cmdline[0] = (char *)"tandem";
        cmdline[1] = (char *)"run";
        for (int i = 1; i < argc; i++) cmdline[i + 1] = argv[i];
        uint64_t sd = (uint64_t)seed;
        td_db_run_info info = {.kind = "run", .argc = argc + 1, .argv = cmdline, .checkpoint = model,
                               .variants = vp, .n_variants = (size_t)nv, .seeds = &sd, .n_seeds = 1};
        if (td_db_open(td_db_path_resolve(db_path), TD_DB_CREATE, &db, &err) ||
            td_db_run_begin(db, &info, &run_id, &err)) {
            fprintf(stderr, PREFIX "%s\n", err.msg);
            rc = 2;
            goto out;
        }
    }
    /* greedy decoding is deterministic: the seed is recorded, not used */
    const td_gen_params gp0 = {.max_new = max_new, .eos = (int32_t)cfg.eos_token_id, .ignore_eos = ignore_eos};
    for (int v = 0; v < nv && !rc; v++) {
        td_engine *e = NULL;
        if (td_engine_load(model, &vars[v], &e, &err) ||
            (db && td_engine_device_record(db, run_id, td_engine_device_info(e), &err))) {
            fprintf(stderr, PREFIX "%s\n", err.msg);
            td_engine_free(e);
            rc = 2;
            break;
        }
        for (size_t b = 0; b < n_batches && !rc; b++) {
            td_gen_params gp = gp0;
            gp.batch = batches[b];
            if (td_generate(e, cfg.vocab_size, tp, np, &gp, res + ((size_t)v * n_batches + b) * (size_t)np, &err)) {
                fprintf(stderr, PREFIX "%s: %s\n", vtext[v], err.msg);
                rc = 2;
            }
        }
        td_engine_free(e);
    }
    if (rc) {
        if (db) (void)td_db_run_end(db, run_id, TD_DB_RUN_FAILED, rc, err.msg, &err);
        goto out;
    }
    cJSON *doc = json ? cJSON_CreateArray() : NULL;
    if (!json)
        printf("%-28s %5s %-12s %6s %-16s %8s %12s %12s\n", "variant", "batch", "request", "tokens", "hash",
               "diverges", "margin", "ref margin");
    int64_t n_equal = 0, n_total = 0;
    for (int v = 0; v < nv; v++)
        for (size_t b = 0; b < n_batches; b++)
            for (int64_t i = 0; i < np; i++) {
                const td_completion *c = &res[((size_t)v * n_batches + b) * (size_t)np + (size_t)i];
                const td_completion *ref = &res[(size_t)i];
                const bool is_ref = v == 0 && b == 0;
                const td_divergence d = td_completion_compare(c, ref);
                n_total++;
                if (d.pos < 0) n_equal++;
                if (db) {
                    const td_db_completion_row row = {
                        .variant = vtext[v], .batch = (int32_t)batches[b], .request = pr[i].id, .rep = 0,
                        .length = c->n, .hash = c->hash, .reference = is_ref ? NULL : vtext[0],
                        .first_divergence = is_ref ? -1 : d.pos, .margin = d.pos < 0 ? (double)NAN : d.margin_a,
                        .tokens = c->tokens, .reference_margin = d.pos < 0 ? (double)NAN : d.margin_b};
                    if (td_db_put_completion(db, run_id, &row, &err)) {
                        fprintf(stderr, PREFIX "%s\n", err.msg);
                        rc = 2;
                    }
                }
                if (json && doc) {
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddStringToObject(o, "variant", vtext[v]);
                    cJSON_AddNumberToObject(o, "batch", (double)batches[b]);
                    cJSON_AddStringToObject(o, "request", pr[i].id);
                    cJSON *toks = cJSON_CreateArray();
                    for (int64_t t = 0; t < c->n; t++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(c->tokens[t]));
                    cJSON_AddItemToObject(o, "tokens", toks);
                    cJSON_AddStringToObject(o, "hash", c->hash);
                    cJSON_AddStringToObject(o, "reference", vtext[0]);
                    cJSON_AddNumberToObject(o, "reference_batch", (double)batches[0]);
                    cJSON_AddBoolToObject(o, "equal", d.pos < 0);
                    cJSON_AddNumberToObject(o, "first_divergence", (double)d.pos);
                    if (d.pos >= 0 && isfinite(d.margin_a)) cJSON_AddNumberToObject(o, "margin", d.margin_a);
                    else cJSON_AddNullToObject(o, "margin");
                    if (d.pos >= 0 && isfinite(d.margin_b)) cJSON_AddNumberToObject(o, "reference_margin", d.margin_b);
                    else cJSON_AddNullToObject(o, "reference_margin");
                    cJSON_AddItemToArray(doc, o);
                } else if (!json) {
                    char dv[24] = "-", ma[24] = "-", mb[24] = "-";
                    if (d.pos >= 0) {
                        snprintf(dv, sizeof dv, "%lld", (long long)d.pos);
                        snprintf(ma, sizeof ma, "%.6g", d.margin_a);
                        snprintf(mb, sizeof mb, "%.6g", d.margin_b);
                    }
                    printf("%-28s %5lld %-12s %6lld %.16s %8s %12s %12s\n", vtext[v], (long long)batches[b], pr[i].id,
                           (long long)c->n, c->hash, dv, ma, mb);
                }
            }
    if (json && doc) {
        char *text = cJSON_Print(doc);
        if (text) printf("%s\n", text);
        free(text);
        cJSON_Delete(doc);
    } else if (!json) {
        printf("%lld of %lld completions equal to %s at batch %lld\n", (long long)n_equal, (long long)n_total, vtext[0],
               (long long)batches[0]);
    }
    if (db) {
        if (td_db_run_end(db, run_id, rc ? TD_DB_RUN_FAILED : TD_DB_RUN_OK, rc, NULL, &err)) {
            fprintf(stderr, PREFIX "%s\n", err.msg);
            rc = 2;
        } else if (!json) {
            printf("results store: %s, run %lld\n", td_db_path(db), (long long)run_id);
        }
    }
out:
    if (res)
        for (size_t i = 0; i < n_runs * (size_t)np; i++) td_completion_free(&res[i]);
    free(res);
    free(tp);
    free(cmdline);
    td_db_close(db);
    prompts_free(pr, np);
    free(batches);
    return rc;
}
