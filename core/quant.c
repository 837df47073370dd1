/* quant.c — quantization metadata and module scheme resolution (see quant.h). */
#include "quant.h"

#include <fnmatch.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define QUANT_MAX_BYTES (64u << 20)

static const char *const scheme_names[] = {"unquantized", "NVFP4", "NVFP4-CT", "FP8", "FP8-BLOCK"};
_Static_assert(TD_ARRAY_LEN(scheme_names) == TD_SCHEME_COUNT, "scheme_names incomplete");

const char *td_scheme_name(td_scheme s)
{
    return (unsigned)s < TD_SCHEME_COUNT ? scheme_names[s] : "?";
}

void td_quant_free(td_quant *q)
{
    if (!q) return;
    for (size_t i = 0; i < q->n_exclude; i++) free(q->exclude[i]);
    for (size_t i = 0; i < q->n_targets; i++) free(q->targets[i]);
    for (size_t i = 0; i < q->n_layers; i++) free(q->layers[i].module);
    if (q->re) {
        for (size_t i = 0; i < q->n_exclude + q->n_targets; i++) {
            if (q->re[i]) regfree(q->re[i]);
            free(q->re[i]);
        }
        free(q->re);
    }
    free(q->exclude);
    free(q->targets);
    free(q->layers);
    memset(q, 0, sizeof *q);
}

/* quant_algo (case-insensitive) → scheme and whether an activation scale is expected. */
static td_status algo_scheme(const char *algo, const char *what, td_scheme *s, bool *input,
                             td_err *err)
{
    char up[32];
    size_t n = strlen(algo);
    if (n >= sizeof up)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: quant_algo \"%.40s...\" is not supported", what, algo);
    for (size_t i = 0; i <= n; i++)
        up[i] = (char)((algo[i] >= 'a' && algo[i] <= 'z') ? algo[i] - 32 : algo[i]);
    *input = false;
    if (!strcmp(up, "NVFP4") || !strcmp(up, "NVFP4_AWQ") || !strcmp(up, "NVFP4_SVD")) {
        *s = TD_SCHEME_NVFP4;
        *input = true;
    } else if (!strcmp(up, "W4A16_NVFP4") || !strcmp(up, "W4A8_NVFP4_FP8")) {
        *s = TD_SCHEME_NVFP4;
        *input = !strcmp(up, "W4A8_NVFP4_FP8");
    } else if (!strcmp(up, "FP8")) {
        *s = TD_SCHEME_FP8;
        *input = true;
    } else if (!strcmp(up, "FP8_BLOCK_SCALES") || !strcmp(up, "FP8_PB_WO")) {
        *s = TD_SCHEME_FP8_BLOCK;
    } else {
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: quant_algo \"%s\" is not supported", what, algo);
    }
    return TD_OK;
}

static td_status str_list(const cJSON *arr, const char *key, const char *what, char ***out,
                          size_t *n, td_err *err)
{
    if (!arr || cJSON_IsNull(arr)) return TD_OK;
    if (!cJSON_IsArray(arr))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a list of strings", what, key);
    size_t cnt = (size_t)cJSON_GetArraySize(arr);
    char **v = calloc(cnt ? cnt : 1, sizeof *v);
    if (!v) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
    size_t k = 0;
    for (const cJSON *e = arr->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring) {
            for (size_t i = 0; i < k; i++) free(v[i]);
            free(v);
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\"[%zu] must be a string", what, key, k);
        }
        v[k] = strdup(e->valuestring);
        if (!v[k]) {
            for (size_t i = 0; i < k; i++) free(v[i]);
            free(v);
            return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
        }
        k++;
    }
    *out = v;
    *n = k;
    return TD_OK;
}

static td_status parse_quantized_layers(const cJSON *ql, const char *what, td_quant *q,
                                        td_err *err)
{
    if (!cJSON_IsObject(ql))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"quantized_layers\" must be an object", what);
    size_t cnt = (size_t)cJSON_GetArraySize(ql);
    q->layers = calloc(cnt ? cnt : 1, sizeof *q->layers);
    if (!q->layers) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
    for (const cJSON *e = ql->child; e; e = e->next) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s: quantized_layers[\"%.200s\"]", what, e->string ? e->string : "");
        const char *algo = NULL;
        td_status st = td_json_get_str(e, "quant_algo", ctx, &algo, err);
        if (st) return st;
        td_quant_layer *l = &q->layers[q->n_layers];
        bool input;
        st = algo_scheme(algo, ctx, &l->scheme, &input, err);
        if (st) return st;
        l->group_size = 16;
        st = td_json_opt_int(e, "group_size", ctx, &l->group_size, err);
        if (st) return st;
        l->module = strdup(e->string ? e->string : "");
        if (!l->module) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", what);
        q->n_layers++;
    }
    return TD_OK;
}

static void copy_str(char *dst, size_t cap, const char *s)
{
    snprintf(dst, cap, "%s", s ? s : "");
}

td_status td_quant_parse_hf(const cJSON *root, const char *what, td_quant *q, td_err *err)
{
    memset(q, 0, sizeof *q);
    if (!cJSON_IsObject(root))
        return td_err_set(err, TD_ERR_FORMAT, "%s: top level must be an object", what);
    q->source = TD_QUANT_SRC_HF_QUANT_CONFIG;
    const cJSON *prod = cJSON_GetObjectItemCaseSensitive(root, "producer");
    const char *pname = NULL;
    if (cJSON_IsObject(prod)) {
        td_status st = td_json_opt_str(prod, "name", what, &pname, err);
        if (st) return st;
    }
    copy_str(q->producer, sizeof q->producer, pname ? pname : "modelopt");
    const cJSON *qz = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!cJSON_IsObject(qz))
        return td_err_set(err, TD_ERR_FORMAT, "%s: missing object \"quantization\"", what);
    char where[400];
    snprintf(where, sizeof where, "%s: quantization", what);
    const char *algo = NULL;
    td_status st = td_json_get_str(qz, "quant_algo", where, &algo, err);
    if (st) goto fail;
    copy_str(q->quant_algo, sizeof q->quant_algo, algo);
    q->group_size = 16;
    st = td_json_opt_int(qz, "group_size", where, &q->group_size, err);
    if (st) goto fail;
    const char *kv = NULL;
    st = td_json_opt_str(qz, "kv_cache_quant_algo", where, &kv, err);
    if (st) goto fail;
    copy_str(q->kv_cache_quant_algo, sizeof q->kv_cache_quant_algo, kv);
    if (!strcmp(algo, "MIXED_PRECISION")) {
        q->mixed = true;
        const cJSON *ql = cJSON_GetObjectItemCaseSensitive(qz, "quantized_layers");
        if (!ql) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: MIXED_PRECISION needs \"quantized_layers\"", where);
            goto fail;
        }
        st = parse_quantized_layers(ql, where, q, err);
        if (st) goto fail;
    } else {
        st = algo_scheme(algo, where, &q->scheme, &q->has_input_scale, err);
        if (st) goto fail;
    }
    st = str_list(cJSON_GetObjectItemCaseSensitive(qz, "exclude_modules"), "exclude_modules",
                  where, &q->exclude, &q->n_exclude, err);
    if (st) goto fail;
    if (q->group_size != 16 && !q->mixed && (q->scheme == TD_SCHEME_NVFP4)) {
        st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: NVFP4 group_size %lld (only 16 exists)",
                        where, (long long)q->group_size);
        goto fail;
    }
    return TD_OK;
fail:
    td_quant_free(q);
    return st;
}

/* compressed-tensors NVFP4 weight args check (NVFP4_SPEC.md §4.3). */
static td_status ct_group(const cJSON *g, const char *what, td_quant *q, td_err *err)
{
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
    if (!cJSON_IsObject(w))
        return td_err_set(err, TD_ERR_FORMAT, "%s: config group needs a \"weights\" object", what);
    int64_t bits = 0, gs = 0;
    const char *type = NULL, *strategy = NULL;
    td_status st;
    if ((st = td_json_get_int(w, "num_bits", what, &bits, err))) return st;
    if ((st = td_json_get_str(w, "type", what, &type, err))) return st;
    if ((st = td_json_opt_str(w, "strategy", what, &strategy, err))) return st;
    if ((st = td_json_opt_int(w, "group_size", what, &gs, err))) return st;
    if (bits != 4 || strcmp(type, "float") || (strategy && strcmp(strategy, "tensor_group")) || gs != 16)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "%s: weights {num_bits %lld, type %s, strategy %s, group_size %lld} is not NVFP4",
                          what, (long long)bits, type, strategy ? strategy : "?", (long long)gs);
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
    q->has_input_scale = ia && cJSON_IsObject(ia);
    q->group_size = 16;
    return str_list(cJSON_GetObjectItemCaseSensitive(g, "targets"), "targets", what, &q->targets,
                    &q->n_targets, err);
}

/* Refuse regex forms that make the POSIX compiler's automaton explode: over-long patterns,
 * bounded repetition and a quantifier right after another ("a++++", "a*?"). */
static bool regex_safe(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > TD_QUANT_RE_MAX) return false;
    bool prev_quant = false;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\\') {
            if (++i >= n) return false;
            prev_quant = false;
            continue;
        }
        if (ch == '{' || ch == '}') return false;
        bool quant = ch == '*' || ch == '+' || ch == '?';
        if (quant && (prev_quant || i == 0)) return false;
        prev_quant = quant;
    }
    return true;
}

/* Compile pattern p anchored as ^(p)$ into *out (malloc'd). */
static td_status compile_entry(const char *p, regex_t **out)
{
    if (!regex_safe(p)) return TD_ERR_UNSUPPORTED;
    char anch[TD_QUANT_RE_MAX + 8];
    snprintf(anch, sizeof anch, "^(%s)$", p);
    regex_t *re = malloc(sizeof *re);
    if (!re) return TD_ERR_NOMEM;
    if (regcomp(re, anch, REG_EXTENDED | REG_NOSUB) != 0) {
        free(re);
        return TD_ERR_FORMAT;
    }
    *out = re;
    return TD_OK;
}

td_status td_quant_parse_config(const cJSON *qc, const char *what, td_quant *q, td_err *err)
{
    memset(q, 0, sizeof *q);
    if (!cJSON_IsObject(qc))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"quantization_config\" must be an object", what);
    char where[400];
    snprintf(where, sizeof where, "%s: quantization_config", what);
    const char *method = NULL;
    td_status st = td_json_get_str(qc, "quant_method", where, &method, err);
    if (st) return st;
    if (!strcmp(method, "modelopt")) {
        q->source = TD_QUANT_SRC_MODELOPT_CONFIG;
        copy_str(q->producer, sizeof q->producer, "modelopt");
        const char *algo = NULL;
        if ((st = td_json_get_str(qc, "quant_algo", where, &algo, err))) goto fail;
        copy_str(q->quant_algo, sizeof q->quant_algo, algo);
        q->group_size = 16;
        if (!strcmp(algo, "MIXED_PRECISION")) {
            q->mixed = true;
            const cJSON *ql = cJSON_GetObjectItemCaseSensitive(qc, "quantized_layers");
            if (!ql) {
                st = td_err_set(err, TD_ERR_FORMAT, "%s: MIXED_PRECISION needs \"quantized_layers\"", where);
                goto fail;
            }
            if ((st = parse_quantized_layers(ql, where, q, err))) goto fail;
        } else if ((st = algo_scheme(algo, where, &q->scheme, &q->has_input_scale, err))) {
            goto fail;
        }
        /* W4A16 exports omit input_activations in their config group. */
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
        if (!q->mixed && cJSON_IsObject(groups) && groups->child &&
            cJSON_IsObject(groups->child)) {
            const cJSON *ia = cJSON_GetObjectItemCaseSensitive(groups->child, "input_activations");
            if (!ia || cJSON_IsNull(ia)) q->has_input_scale = false;
        }
    } else if (!strcmp(method, "compressed-tensors")) {
        q->source = TD_QUANT_SRC_CT_CONFIG;
        copy_str(q->producer, sizeof q->producer, "compressed-tensors");
        const char *format = NULL;
        if ((st = td_json_opt_str(qc, "format", where, &format, err))) goto fail;
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
        if (!cJSON_IsObject(groups) || !groups->child) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: needs a non-empty \"config_groups\" object", where);
            goto fail;
        }
        if (groups->child->next) {
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: more than one config group is not supported", where);
            goto fail;
        }
        const char *gfmt = NULL;
        if ((st = td_json_opt_str(groups->child, "format", where, &gfmt, err))) goto fail;
        const char *fmt = gfmt ? gfmt : format;
        if (!fmt || strcmp(fmt, "nvfp4-pack-quantized")) {
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: format \"%s\" is not supported (expected nvfp4-pack-quantized)",
                            where, fmt ? fmt : "(missing)");
            goto fail;
        }
        char gw[500];
        snprintf(gw, sizeof gw, "%s: config_groups.%s", where, groups->child->string ? groups->child->string : "?");
        if ((st = ct_group(groups->child, gw, q, err))) goto fail;
        q->scheme = TD_SCHEME_NVFP4_CT;
        copy_str(q->quant_algo, sizeof q->quant_algo, q->has_input_scale ? "NVFP4" : "NVFP4A16");
    } else {
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: quant_method \"%s\" is not supported", where, method);
    }
    st = str_list(cJSON_GetObjectItemCaseSensitive(qc, "ignore"), "ignore", where, &q->exclude,
                  &q->n_exclude, err);
    if (st) goto fail;
    /* compile "re:" entries once; a bad or hostile pattern is a format error now */
    q->re = calloc(q->n_exclude + q->n_targets + 1, sizeof *q->re);
    if (!q->re) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", where);
        goto fail;
    }
    for (size_t i = 0; i < q->n_exclude + q->n_targets; i++) {
        const char *p = i < q->n_exclude ? q->exclude[i] : q->targets[i - q->n_exclude];
        if (strncmp(p, "re:", 3)) continue;
        if ((st = compile_entry(p + 3, &q->re[i]))) {
            st = td_err_set(err, st, "%s: regular expression \"%.80s\" %s", where, p,
                            st == TD_ERR_NOMEM ? "could not be compiled (out of memory)"
                            : st == TD_ERR_UNSUPPORTED
                                ? "uses a form tandem refuses (longer than 256 bytes, {m,n} or stacked quantifiers)"
                                : "is not a valid POSIX extended regular expression");
            goto fail;
        }
    }
    return TD_OK;
fail:
    td_quant_free(q);
    return st;
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

td_status td_quant_load(const char *dir, td_quant *q, td_err *err)
{
    memset(q, 0, sizeof *q);
    char hf[4096], cfg[4096];
    snprintf(hf, sizeof hf, "%s/hf_quant_config.json", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    cJSON *croot = NULL;
    td_quant from_cfg;
    memset(&from_cfg, 0, sizeof from_cfg);
    bool have_cfg = false;
    if (file_exists(cfg)) {
        td_status st = td_json_read_file(cfg, 16u << 20, &croot, err);
        if (st) return st;
        const cJSON *qc = cJSON_GetObjectItemCaseSensitive(croot, "quantization_config");
        if (!qc) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(croot, "text_config");
            if (cJSON_IsObject(tc)) qc = cJSON_GetObjectItemCaseSensitive(tc, "quantization_config");
        }
        if (qc && !cJSON_IsNull(qc)) {
            st = td_quant_parse_config(qc, cfg, &from_cfg, err);
            if (st) {
                cJSON_Delete(croot);
                return st;
            }
            have_cfg = true;
        }
        cJSON_Delete(croot);
    }
    if (file_exists(hf)) {
        cJSON *root = NULL;
        td_status st = td_json_read_file(hf, QUANT_MAX_BYTES, &root, err);
        if (!st) st = td_quant_parse_hf(root, hf, q, err);
        cJSON_Delete(root);
        if (st) {
            td_quant_free(&from_cfg);
            return st;
        }
        if (have_cfg && (strcmp(from_cfg.quant_algo, q->quant_algo) ||
                         from_cfg.n_exclude != q->n_exclude || from_cfg.scheme != q->scheme))
            snprintf(q->note, sizeof q->note,
                     "hf_quant_config.json (%s, %zu exclusions) and config.json quantization_config "
                     "(%s, %zu exclusions) disagree; hf_quant_config.json is used",
                     q->quant_algo, q->n_exclude, from_cfg.quant_algo, from_cfg.n_exclude);
        td_quant_free(&from_cfg);
        return TD_OK;
    }
    if (have_cfg) *q = from_cfg;
    return TD_OK;
}

/* ---- resolution ---- */

/* Does entry `pat` (compiled as `re` when it is a "re:" entry) match `module`? */
static bool pattern_matches(const char *pat, const regex_t *re, const char *module)
{
    if (re) return regexec(re, module, 0, NULL, 0) == 0;
    if (!strncmp(pat, "re:", 3)) return false; /* never compiled: cannot match */
    if (!strcmp(pat, module)) return true;
    if (fnmatch(pat, module, 0) == 0) return true;
    /* vLLM strips "language_model." for checkpoints exported before the prefix existed */
    static const char lm[] = "model.language_model.";
    if (!strncmp(module, lm, sizeof lm - 1)) {
        char alt[1024];
        snprintf(alt, sizeof alt, "model.%s", module + sizeof lm - 1);
        if (!strcmp(pat, alt) || fnmatch(pat, alt, 0) == 0) return true;
    }
    return false;
}

static bool excluded(const td_quant *q, const char *module)
{
    for (size_t i = 0; i < q->n_exclude; i++)
        if (pattern_matches(q->exclude[i], q->re ? q->re[i] : NULL, module)) return true;
    return false;
}

static void fill_names(td_quant_tensors *t, td_scheme s, const char *m, bool input)
{
    memset(t, 0, sizeof *t);
    t->scheme = s;
    switch (s) {
    case TD_SCHEME_NONE:
        snprintf(t->weight, sizeof t->weight, "%s.weight", m);
        break;
    case TD_SCHEME_NVFP4:
        snprintf(t->weight, sizeof t->weight, "%s.weight", m);
        snprintf(t->scale, sizeof t->scale, "%s.weight_scale", m);
        snprintf(t->global, sizeof t->global, "%s.weight_scale_2", m);
        if (input) snprintf(t->input_scale, sizeof t->input_scale, "%s.input_scale", m);
        break;
    case TD_SCHEME_NVFP4_CT:
        snprintf(t->weight, sizeof t->weight, "%s.weight_packed", m);
        snprintf(t->scale, sizeof t->scale, "%s.weight_scale", m);
        snprintf(t->global, sizeof t->global, "%s.weight_global_scale", m);
        if (input) snprintf(t->input_scale, sizeof t->input_scale, "%s.input_global_scale", m);
        break;
    case TD_SCHEME_FP8:
        snprintf(t->weight, sizeof t->weight, "%s.weight", m);
        snprintf(t->scale, sizeof t->scale, "%s.weight_scale", m);
        break;
    case TD_SCHEME_FP8_BLOCK:
        snprintf(t->weight, sizeof t->weight, "%s.weight", m);
        snprintf(t->scale, sizeof t->scale, "%s.weight_scale_inv", m);
        break;
    default:
        break;
    }
}

td_status td_quant_resolve(const td_quant *q, const char *module, bool is_linear,
                           td_quant_tensors *out, td_err *err)
{
    if (strlen(module) > 400)
        return td_err_set(err, TD_ERR_ARG, "module name too long: %.60s...", module);
    if (!q || q->source == TD_QUANT_SRC_NONE) {
        fill_names(out, TD_SCHEME_NONE, module, false);
        return TD_OK;
    }
    if (q->mixed) {
        for (size_t i = 0; i < q->n_layers; i++) {
            const char *key = q->layers[i].module;
            size_t kl = strlen(key);
            if (!strcmp(module, key) || (!strncmp(module, key, kl) && module[kl] == '.') ||
                pattern_matches(key, NULL, module)) {
                td_scheme s = q->layers[i].scheme;
                fill_names(out, s, module, s == TD_SCHEME_NVFP4 || (s == TD_SCHEME_FP8 && is_linear));
                return TD_OK;
            }
        }
        fill_names(out, TD_SCHEME_NONE, module, false);
        return TD_OK;
    }
    if (!is_linear || excluded(q, module)) {
        fill_names(out, TD_SCHEME_NONE, module, false);
        return TD_OK;
    }
    if (q->n_targets > 0) {
        bool hit = false;
        for (size_t i = 0; i < q->n_targets && !hit; i++)
            hit = !strcmp(q->targets[i], "Linear") ||
                  pattern_matches(q->targets[i], q->re ? q->re[q->n_exclude + i] : NULL, module);
        if (!hit) {
            fill_names(out, TD_SCHEME_NONE, module, false);
            return TD_OK;
        }
    }
    fill_names(out, q->scheme, module, q->has_input_scale);
    return TD_OK;
}
