/* inspect.c — checkpoint description and consistency checks (see inspect.h). */
#include "inspect.h"

#include "layout.h"
#include "progress.h"
#include "safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const finding_names[] = {"missing", "shape", "dtype", "nan_scale",
                                            "negative_scale", "bad_global", "unexpected", "note"};
_Static_assert(TD_ARRAY_LEN(finding_names) == TD_FIND_KIND_COUNT, "finding_names incomplete");

const char *td_finding_kind_name(td_finding_kind k)
{
    return (unsigned)k < TD_FIND_KIND_COUNT ? finding_names[k] : "?";
}

typedef struct ctx {
    td_inspect_report *r;
    td_st_set *set;
    bool *claimed;          /* [count] tensors accounted for by the inventory */
    size_t count;
    td_err *err;
} ctx;

static void finding(ctx *c, td_severity sev, td_finding_kind kind, const char *tensor,
                    const char *fmt, ...) TD_PRINTF(5, 6);

static void finding(ctx *c, td_severity sev, td_finding_kind kind, const char *tensor,
                    const char *fmt, ...)
{
    td_inspect_report *r = c->r;
    r->counts[kind]++;
    if (sev == TD_SEV_ERROR) r->n_errors++;
    if (sev == TD_SEV_WARN) r->n_warnings++;
    if (r->n_findings >= TD_INSPECT_MAX_FINDINGS) return;
    td_finding *f = &r->findings[r->n_findings++];
    f->sev = sev;
    f->kind = kind;
    snprintf(f->tensor, sizeof f->tensor, "%s", tensor ? tensor : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
}

/* Index of name in the sorted set, or -1. */
static long find_index(const ctx *c, const char *name)
{
    size_t lo = 0, hi = c->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(td_st_set_name(c->set, mid), name);
        if (cmp == 0) return (long)mid;
        if (cmp < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static bool shape_eq(int nd, const int64_t *a, int nd2, const int64_t *b)
{
    if (nd != nd2) return false;
    for (int i = 0; i < nd; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static bool is_scalar_like(const td_st_info *in)
{
    return in->ndim == 0 || (in->ndim == 1 && in->shape[0] == 1);
}

/* Look a tensor up; on success marks it claimed and accounts its bytes under `scheme`.
 * Returns NULL (and records a finding when required) if absent. Fatal errors → c->err. */
static const td_st_info *take(ctx *c, const char *name, td_scheme scheme, bool required,
                              const char *why, td_status *fatal)
{
    long i = find_index(c, name);
    if (i < 0) {
        if (required)
            finding(c, TD_SEV_ERROR, TD_FIND_MISSING, name, "missing (%s)", why);
        return NULL;
    }
    const td_st_info *info = NULL;
    const char *shard = NULL;
    td_status st = td_st_set_info(c->set, name, &info, &shard, c->err);
    if (st) {
        *fatal = st;
        return NULL;
    }
    if (!c->claimed[i]) {
        c->claimed[i] = true;
        c->r->schemes[scheme].tensors++;
        c->r->schemes[scheme].bytes += (int64_t)(info->end - info->begin);
    }
    return info;
}

static void check_shape(ctx *c, const char *name, const td_st_info *in, int nd,
                        const int64_t *want, const char *what)
{
    if (shape_eq(in->ndim, in->shape, nd, want)) return;
    char got[96], exp[96];
    td_shape_str(in->ndim, in->shape, got, sizeof got);
    td_shape_str(nd, want, exp, sizeof exp);
    finding(c, TD_SEV_ERROR, TD_FIND_SHAPE, name, "shape %s, the config implies %s (%s)", got, exp,
            what);
}

static bool float_dtype(td_dtype d)
{
    return d == TD_BF16 || d == TD_F16 || d == TD_F32;
}

static void check_float(ctx *c, const char *name, const td_st_info *in, const char *what)
{
    if (float_dtype(in->dtype)) return;
    finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, name,
            "dtype %s but %s expects BF16/F16/F32", td_dtype_name(in->dtype), what);
}

static float read_f32_scalar(const td_tensor *t)
{
    float v;
    if (t->dtype == TD_F32) {
        memcpy(&v, t->data, 4);
    } else if (t->dtype == TD_BF16) {
        uint16_t h;
        memcpy(&h, t->data, 2);
        uint32_t u = (uint32_t)h << 16;
        memcpy(&v, &u, 4);
    } else {
        v = NAN;
    }
    return v;
}

/* A global or input scale: F32, [] or [1], finite and > 0. */
static td_status check_global(ctx *c, const char *name, const td_st_info *in, const char *what)
{
    if (in->dtype != TD_F32)
        finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, name, "dtype %s but %s expects F32",
                td_dtype_name(in->dtype), what);
    if (!is_scalar_like(in)) {
        char got[96];
        td_shape_str(in->ndim, in->shape, got, sizeof got);
        finding(c, TD_SEV_ERROR, TD_FIND_SHAPE, name, "shape %s but %s is a scalar ([] or [1])",
                got, what);
        return TD_OK;
    }
    if (in->dtype != TD_F32) return TD_OK;
    td_tensor t;
    td_status st = td_st_set_tensor(c->set, name, &t, c->err);
    if (st) return st;
    float v = read_f32_scalar(&t);
    if (!isfinite(v) || v <= 0.0f)
        finding(c, TD_SEV_ERROR, TD_FIND_BAD_GLOBAL, name, "%s is %g (must be finite and > 0)",
                what, (double)v);
    return TD_OK;
}

/* Count NaN (0x7F/0xFF) and negative (sign bit, non-zero) E4M3 codes. */
static td_status scan_scales(ctx *c, const char *name)
{
    td_tensor t;
    td_status st = td_st_set_tensor(c->set, name, &t, c->err);
    if (st) return st;
    const uint8_t *p = t.data;
    int64_t n = td_tensor_numel(&t), nan = 0, neg = 0, first_nan = -1;
    for (int64_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if ((b & 0x7F) == 0x7F) {
            if (first_nan < 0) first_nan = i;
            nan++;
        } else if ((b & 0x80) && b != 0x80) {
            neg++;
        }
    }
    c->r->nvfp4_scale_bytes_scanned += n;
    if (nan)
        finding(c, TD_SEV_ERROR, TD_FIND_NAN_SCALE, name,
                "%lld NaN block-scale code(s) (0x7F/0xFF), first at flat index %lld",
                (long long)nan, (long long)first_nan);
    if (neg)
        finding(c, TD_SEV_WARN, TD_FIND_NEG_SCALE, name,
                "%lld block-scale code(s) with the sign bit set", (long long)neg);
    return TD_OK;
}

static td_status check_quantized(ctx *c, const td_module *m, const td_quant_tensors *qt)
{
    td_status fatal = TD_OK;
    const td_scheme s = qt->scheme;
    const char *sn = td_scheme_name(s);
    const int64_t out = m->shape[0], in = m->shape[1];
    char why[64];
    snprintf(why, sizeof why, "%s %s", sn, td_mod_kind_name(m->kind));
    const td_st_info *w = take(c, qt->weight, s, true, why, &fatal);
    const td_st_info *sc = take(c, qt->scale, s, true, why, &fatal);
    const td_st_info *g = qt->global[0] ? take(c, qt->global, s, true, why, &fatal) : NULL;
    const td_st_info *is = qt->input_scale[0] ? take(c, qt->input_scale, s, true,
                                                     "activation scale of a W4A4/W8A8 scheme", &fatal)
                                              : NULL;
    if (fatal) return fatal;
    if (s == TD_SCHEME_NVFP4 || s == TD_SCHEME_NVFP4_CT) {
        if (in % 16 != 0)
            finding(c, TD_SEV_ERROR, TD_FIND_SHAPE, qt->weight,
                    "input dimension %lld is not a multiple of the NVFP4 block (16)", (long long)in);
        if (w) {
            if (w->dtype != TD_U8)
                finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, qt->weight,
                        "dtype %s but the quantization map says %s (packed U8 [out, in/2])",
                        td_dtype_name(w->dtype), sn);
            int64_t want[2] = {out, in / 2};
            check_shape(c, qt->weight, w, 2, want, "packed E2M1 [out, in/2]");
        }
        if (sc) {
            if (sc->dtype != TD_F8_E4M3)
                finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, qt->scale,
                        "dtype %s but NVFP4 block scales are F8_E4M3", td_dtype_name(sc->dtype));
            int64_t want[2] = {out, in / 16};
            check_shape(c, qt->scale, sc, 2, want, "E4M3 block scales [out, in/16]");
            if (sc->dtype == TD_F8_E4M3 && shape_eq(sc->ndim, sc->shape, 2, want)) {
                td_status st = scan_scales(c, qt->scale);
                if (st) return st;
            }
        }
        if (g) {
            td_status st = check_global(c, qt->global, g, "the NVFP4 global scale");
            if (st) return st;
        }
    } else { /* FP8 / FP8_BLOCK */
        if (w) {
            if (w->dtype != TD_F8_E4M3)
                finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, qt->weight,
                        "dtype %s but the quantization map says %s (F8_E4M3)",
                        td_dtype_name(w->dtype), sn);
            int64_t want[2] = {out, in};
            if (m->kind == TD_MOD_LINEAR || m->kind == TD_MOD_EMBEDDING)
                check_shape(c, qt->weight, w, 2, want, "FP8 weight [out, in]");
        }
        if (sc && s == TD_SCHEME_FP8_BLOCK) {
            int64_t want[2] = {(out + 127) / 128, (in + 127) / 128};
            check_shape(c, qt->scale, sc, 2, want, "128x128 block scales");
        } else if (sc && !(is_scalar_like(sc) || (sc->ndim == 1 && sc->shape[0] == out))) {
            char got[96];
            td_shape_str(sc->ndim, sc->shape, got, sizeof got);
            finding(c, TD_SEV_ERROR, TD_FIND_SHAPE, qt->scale,
                    "shape %s but an FP8 scale is a scalar or per-row [%lld]", got, (long long)out);
        }
    }
    if (is) {
        td_status st = check_global(c, qt->input_scale, is, "the activation scale");
        if (st) return st;
    }
    return TD_OK;
}

static td_status check_module(ctx *c, const td_module *m)
{
    td_inspect_report *r = c->r;
    td_status fatal = TD_OK;
    char name[200];
    bool linear = m->kind == TD_MOD_LINEAR;

    if (m->kind == TD_MOD_LINEAR || m->kind == TD_MOD_EMBEDDING) {
        td_quant_tensors qt;
        td_status st = td_quant_resolve(&r->quant, m->name, linear, &qt, c->err);
        if (st) return st;
        r->schemes[qt.scheme].modules++;
        if (qt.scheme != TD_SCHEME_NONE) return check_quantized(c, m, &qt);
        const td_st_info *w = take(c, qt.weight, TD_SCHEME_NONE, true,
                                   linear ? "unquantized linear" : "embedding", &fatal);
        if (fatal) return fatal;
        if (!w) return TD_OK;
        if (w->dtype == TD_U8 || w->dtype == TD_F8_E4M3)
            finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, qt.weight,
                    "dtype %s but the quantization map says unquantized (is this module missing "
                    "from the quantization metadata?)", td_dtype_name(w->dtype));
        else
            check_float(c, qt.weight, w, "an unquantized weight");
        check_shape(c, qt.weight, w, m->ndim, m->shape, linear ? "linear [out, in]" : "embedding");
        return TD_OK;
    }

    if (m->kind == TD_MOD_TABLE) {
        td_quant_tensors qt;
        td_status st = td_quant_resolve(&r->quant, m->name, false, &qt, c->err);
        if (st) return st;
        r->schemes[qt.scheme].modules++;
        for (int32_t i = 0; i < m->parts; i++) {
            snprintf(name, sizeof name, "%s.shard_%d.weight", m->name, i);
            const td_st_info *w = take(c, name, qt.scheme, true, "n-gram table shard", &fatal);
            if (fatal) return fatal;
            if (!w) continue;
            if (qt.scheme == TD_SCHEME_FP8 && w->dtype != TD_F8_E4M3)
                finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, name,
                        "dtype %s but the quantization map says FP8 (F8_E4M3)", td_dtype_name(w->dtype));
            else if (qt.scheme == TD_SCHEME_NONE)
                check_float(c, name, w, "an unquantized table");
            check_shape(c, name, w, m->ndim, m->shape, "table shard [rows/parts, dim]");
        }
        if (qt.scheme == TD_SCHEME_FP8) {
            snprintf(name, sizeof name, "%s.weight_scale", m->name);
            const td_st_info *s = take(c, name, qt.scheme, true, "FP8 table scale", &fatal);
            if (fatal) return fatal;
            if (s && !is_scalar_like(s))
                finding(c, TD_SEV_ERROR, TD_FIND_SHAPE, name, "the FP8 table scale must be a scalar");
        }
        return TD_OK;
    }

    r->schemes[TD_SCHEME_NONE].modules++;
    if (m->kind == TD_MOD_PARAM || m->kind == TD_MOD_BUFFER)
        snprintf(name, sizeof name, "%s", m->name);
    else
        snprintf(name, sizeof name, "%s.weight", m->name);
    const td_st_info *t = take(c, name, TD_SCHEME_NONE, m->kind != TD_MOD_BUFFER,
                               td_mod_kind_name(m->kind), &fatal);
    if (fatal) return fatal;
    if (!t) return TD_OK;
    if (m->kind == TD_MOD_BUFFER) {
        if (t->dtype != TD_I64)
            finding(c, TD_SEV_ERROR, TD_FIND_DTYPE, name, "dtype %s but this buffer is I64",
                    td_dtype_name(t->dtype));
    } else {
        check_float(c, name, t, td_mod_kind_name(m->kind));
    }
    check_shape(c, name, t, m->ndim, m->shape, td_mod_kind_name(m->kind));
    return TD_OK;
}

/* Fused 3-D expert tensors of one layer (BF16 releases). */
static td_status check_fused_experts(ctx *c, int64_t layer)
{
    char gu[128], dn[128];
    int64_t gus[3], dns[3];
    td_layout_fused_experts(&c->r->cfg, c->r->prefix, layer, gu, gus, dn, dns);
    td_status fatal = TD_OK;
    const td_st_info *a = take(c, gu, TD_SCHEME_NONE, true, "fused routed experts", &fatal);
    const td_st_info *b = take(c, dn, TD_SCHEME_NONE, true, "fused routed experts", &fatal);
    if (fatal) return fatal;
    if (a) {
        check_float(c, gu, a, "fused experts");
        check_shape(c, gu, a, 3, gus, "fused gate_up [E, 2I, H]");
    }
    if (b) {
        check_float(c, dn, b, "fused experts");
        check_shape(c, dn, b, 3, dns, "fused down [E, H, I]");
    }
    c->r->schemes[TD_SCHEME_NONE].modules += 2;
    return TD_OK;
}

static bool is_other(const char *name)
{
    return !strncmp(name, "mtp.", 4) || strstr(name, "visual.") != NULL ||
           strstr(name, ".mtp.") != NULL;
}

static bool is_kv_scale(const char *name)
{
    size_t n = strlen(name);
    return (n > 8 && (!strcmp(name + n - 8, ".k_scale") || !strcmp(name + n - 8, ".v_scale")));
}

td_status td_inspect(const char *dir, bool progress, td_inspect_report *r, td_err *err)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    td_status st = td_config_load(dir, &r->cfg, err);
    if (st) return st;
    st = td_quant_load(dir, &r->quant, err);
    if (st) return st;
    r->findings = calloc(TD_INSPECT_MAX_FINDINGS, sizeof *r->findings);
    if (!r->findings) return td_err_set(err, TD_ERR_NOMEM, "inspect: out of memory");

    ctx c = {r, NULL, NULL, 0, err};
    td_layout lay = {0};
    st = td_st_set_open(dir, &c.set, err);
    if (st) goto done;
    c.count = td_st_set_count(c.set);
    c.claimed = calloc(c.count ? c.count : 1, sizeof *c.claimed);
    if (!c.claimed) {
        st = td_err_set(err, TD_ERR_NOMEM, "inspect: out of memory");
        goto done;
    }
    snprintf(r->prefix, sizeof r->prefix, "%s",
             r->cfg.family == TD_FAMILY_QWEN4_EXP ? td_layout_set_prefix(c.set) : "model.");

    /* whole-file facts; opens every shard so that a broken one is a clear fatal error */
    st = td_st_set_validate(c.set, err);
    if (st) goto done;
    r->n_tensors = (int64_t)c.count;
    r->n_shards = (int64_t)td_st_set_shard_count(c.set);
    r->shards = calloc((size_t)r->n_shards + 1, sizeof *r->shards);
    if (!r->shards) {
        st = td_err_set(err, TD_ERR_NOMEM, "inspect: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < r->n_shards; i++) {
        r->shards[i] = strdup(td_st_set_shard_name(c.set, (size_t)i));
        if (!r->shards[i]) {
            st = td_err_set(err, TD_ERR_NOMEM, "inspect: out of memory");
            goto done;
        }
    }
    for (size_t i = 0; i < c.count; i++) {
        const td_st_info *info;
        const char *shard;
        st = td_st_set_info(c.set, td_st_set_name(c.set, i), &info, &shard, err);
        if (st) goto done;
        r->total_bytes += (int64_t)(info->end - info->begin);
    }

    st = td_layout_build(&r->cfg, r->prefix, &lay, err);
    if (st) goto done;
    r->n_modules = (int64_t)lay.n;
    if (r->quant.note[0]) finding(&c, TD_SEV_INFO, TD_FIND_NOTE, "", "%s", r->quant.note);

    td_progress prog;
    td_progress_init_ex(&prog, stderr, "inspect", lay.n, progress ? -1 : 0, NULL, NULL);
    int64_t fused_layer = -1;
    for (size_t i = 0; i < lay.n; i++) {
        const td_module *m = &lay.mods[i];
        if (m->expert >= 0) {
            if (m->layer != fused_layer && m->expert == 0 && m->moe_proj == TD_MOE_GATE) {
                char gu[128], dn[128];
                int64_t s1[3], s2[3];
                td_layout_fused_experts(&r->cfg, r->prefix, m->layer, gu, s1, dn, s2);
                if (find_index(&c, gu) >= 0 || find_index(&c, dn) >= 0) {
                    fused_layer = m->layer;
                    r->fused_experts = true;
                    st = check_fused_experts(&c, m->layer);
                    if (st) goto done;
                }
            }
            if (m->layer == fused_layer) continue;
        }
        st = check_module(&c, m);
        if (st) goto done;
        if ((i & 255) == 0) td_progress_update(&prog, i);
    }
    td_progress_done(&prog);

    for (size_t i = 0; i < c.count; i++) {
        if (c.claimed[i]) continue;
        const char *name = td_st_set_name(c.set, i);
        const td_st_info *info;
        const char *shard;
        st = td_st_set_info(c.set, name, &info, &shard, err);
        if (st) goto done;
        if (is_other(name)) {
            r->other_tensors++;
            r->other_bytes += (int64_t)(info->end - info->begin);
        } else if (is_kv_scale(name) && r->quant.kv_cache_quant_algo[0]) {
            r->schemes[TD_SCHEME_NONE].tensors++;
            r->schemes[TD_SCHEME_NONE].bytes += (int64_t)(info->end - info->begin);
        } else {
            finding(&c, TD_SEV_WARN, TD_FIND_UNEXPECTED, name,
                    "not implied by the config (%s, %s) in shard %s", td_dtype_name(info->dtype),
                    td_family_name(r->cfg.family), shard);
        }
    }
    st = TD_OK;
done:
    td_layout_free(&lay);
    free(c.claimed);
    td_st_set_close(c.set);
    if (st) td_inspect_report_free(r);
    return st;
}

void td_inspect_report_free(td_inspect_report *r)
{
    if (!r) return;
    td_quant_free(&r->quant);
    if (r->shards)
        for (int64_t i = 0; i < r->n_shards; i++) free(r->shards[i]);
    free(r->shards);
    free(r->findings);
    r->shards = NULL;
    r->findings = NULL;
    r->n_findings = 0;
}

/* ---- output ---- */

static void human_bytes(int64_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int k = 0;
    while (v >= 1024.0 && k < 4) {
        v /= 1024.0;
        k++;
    }
    if (k == 0) snprintf(buf, cap, "%lld B", (long long)b);
    else snprintf(buf, cap, "%.2f %s", v, u[k]);
}

static void layer_pattern(const td_config *cfg, char *buf, size_t cap)
{
    size_t n = (size_t)cfg->num_hidden_layers;
    if (n + 1 > cap) n = cap - 4;
    for (size_t i = 0; i < n; i++) {
        char ch = cfg->layer_types[i] == TD_LAYER_GDN ? 'G' : 'A';
        if (td_config_layer_has_ple(cfg, (int64_t)i)) ch = (char)(ch + ('a' - 'A'));
        buf[i] = ch;
    }
    buf[n] = '\0';
    if (n < (size_t)cfg->num_hidden_layers) strcat(buf, "...");
}

static const char *sev_name(td_severity s)
{
    return s == TD_SEV_ERROR ? "error" : s == TD_SEV_WARN ? "warning" : "note";
}

void td_inspect_print(const td_inspect_report *r, FILE *o)
{
    const td_config *c = &r->cfg;
    char b1[32], pat[TD_CONFIG_MAX_LAYERS + 8];
    fprintf(o, "checkpoint   %s\n", r->dir);
    fprintf(o, "family       %s (model_type %s%s%s)\n", td_family_name(c->family), c->model_type,
            c->architecture[0] ? ", " : "", c->architecture);
    fprintf(o, "dimensions   hidden %lld, layers %lld, vocab %lld, heads %lld/%lld x %lld (rotary %lld)\n",
            (long long)c->hidden_size, (long long)c->num_hidden_layers, (long long)c->vocab_size,
            (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
            (long long)c->head_dim, (long long)td_config_rotary_dim(c));
    fprintf(o, "gdn          key heads %lld, value heads %lld, dims %lld/%lld, conv %lld, gate %s\n",
            (long long)c->linear_num_key_heads, (long long)c->linear_num_value_heads,
            (long long)c->linear_key_head_dim, (long long)c->linear_value_head_dim,
            (long long)c->linear_conv_kernel_dim, c->output_gate_type);
    fprintf(o, "moe          %lld experts, top-%lld, intermediate %lld, shared %lld%s\n",
            (long long)c->num_experts, (long long)c->num_experts_per_tok,
            (long long)c->moe_intermediate_size, (long long)c->shared_expert_intermediate_size,
            r->fused_experts ? " (fused 3-D expert tensors)" : "");
    if (c->family == TD_FAMILY_QWEN4_EXP) {
        fprintf(o, "hc           %lld streams, low rank %lld\n", (long long)c->hc_count,
                (long long)c->hc_lowrank);
        fprintf(o, "qsa indexer  %lld heads x %lld, budget %lld, compress ratio %lld\n",
                (long long)c->indexer_n_heads, (long long)c->indexer_head_dim,
                (long long)c->indexer_budget, (long long)c->indexer_compress_ratio);
        fprintf(o, "ple          layer ids");
        for (int64_t i = 0; i < c->n_ple_layers; i++) fprintf(o, " %lld", (long long)c->ple_layer_ids[i]);
        fprintf(o, " (1-based), dim %lld, n-gram %lld x %lld heads, base %lld\n",
                (long long)c->ple_embed_dim, (long long)c->ngram_size, (long long)c->heads_per_ngram,
                (long long)c->ngram_vocab_size_base);
    }
    layer_pattern(c, pat, sizeof pat);
    fprintf(o, "layers       %lld GDN + %lld attention: %s%s\n",
            (long long)td_config_count_layers(c, TD_LAYER_GDN),
            (long long)td_config_count_layers(c, TD_LAYER_ATTENTION), pat,
            c->family == TD_FAMILY_QWEN4_EXP ? "  (G=GDN A=attention, lower case = PLE)" : "  (G=GDN A=attention)");
    if (c->n_layers_present) {
        fprintf(o, "present      %lld of %lld layers hold tensors (tandem_layers_present):",
                (long long)c->n_layers_present, (long long)c->num_hidden_layers);
        for (int64_t i = 0; i < c->n_layers_present; i++)
            fprintf(o, "%s%lld", i ? "," : " ", (long long)c->layers_present[i]);
        fprintf(o, "\n");
    }
    const td_quant *q = &r->quant;
    static const char *const src[] = {"none (unquantized)", "hf_quant_config.json",
                                      "config.json quantization_config (modelopt)",
                                      "config.json quantization_config (compressed-tensors)"};
    fprintf(o, "quantization %s%s%s, %zu exclusion pattern(s)%s\n", src[q->source],
            q->quant_algo[0] ? ", algo " : "", q->quant_algo, q->n_exclude,
            q->mixed ? ", per-layer map" : "");
    fprintf(o, "  %-12s %10s %10s %14s\n", "scheme", "modules", "tensors", "bytes");
    for (int s = 0; s < TD_SCHEME_COUNT; s++) {
        const td_scheme_stat *st = &r->schemes[s];
        if (!st->modules && !st->tensors) continue;
        human_bytes(st->bytes, b1, sizeof b1);
        fprintf(o, "  %-12s %10lld %10lld %14s\n", td_scheme_name((td_scheme)s),
                (long long)st->modules, (long long)st->tensors, b1);
    }
    if (r->other_tensors) {
        human_bytes(r->other_bytes, b1, sizeof b1);
        fprintf(o, "  %-12s %10s %10lld %14s\n", "mtp/vision", "-", (long long)r->other_tensors, b1);
    }
    human_bytes(r->total_bytes, b1, sizeof b1);
    fprintf(o, "tensors      %lld, %s in %lld shard(s)", (long long)r->n_tensors, b1,
            (long long)r->n_shards);
    for (int64_t i = 0; i < r->n_shards && i < 4; i++) fprintf(o, "%s%s", i ? ", " : ": ", r->shards[i]);
    if (r->n_shards > 4) fprintf(o, ", ...");
    fprintf(o, "\n");
    if (r->nvfp4_scale_bytes_scanned)
        fprintf(o, "scales       %lld NVFP4 block-scale bytes scanned\n",
                (long long)r->nvfp4_scale_bytes_scanned);
    int64_t total = 0;
    for (int k = 0; k < TD_FIND_KIND_COUNT; k++) total += r->counts[k];
    if (total == 0) {
        fprintf(o, "consistency  ok: no inconsistency found\n");
        return;
    }
    fprintf(o, "consistency  %lld error(s), %lld warning(s):", (long long)r->n_errors,
            (long long)r->n_warnings);
    for (int k = 0; k < TD_FIND_KIND_COUNT; k++)
        if (r->counts[k]) fprintf(o, " %s %lld", td_finding_kind_name((td_finding_kind)k), (long long)r->counts[k]);
    fprintf(o, "\n");
    for (size_t i = 0; i < r->n_findings; i++) {
        const td_finding *f = &r->findings[i];
        fprintf(o, "  %s: %s%s%s\n", sev_name(f->sev), f->tensor, f->tensor[0] ? ": " : "", f->msg);
    }
    if ((int64_t)r->n_findings < total)
        fprintf(o, "  ... %lld more (counts above are complete)\n", (long long)(total - (int64_t)r->n_findings));
}

char *td_inspect_json(const td_inspect_report *r)
{
    const td_config *c = &r->cfg;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "checkpoint", r->dir);
    cJSON *m = cJSON_AddObjectToObject(j, "model");
    cJSON_AddStringToObject(m, "family", td_family_name(c->family));
    cJSON_AddStringToObject(m, "model_type", c->model_type);
    cJSON_AddStringToObject(m, "architecture", c->architecture);
    cJSON_AddStringToObject(m, "prefix", r->prefix);
    cJSON_AddNumberToObject(m, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(m, "num_hidden_layers", (double)c->num_hidden_layers);
    cJSON_AddNumberToObject(m, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(m, "num_attention_heads", (double)c->num_attention_heads);
    cJSON_AddNumberToObject(m, "num_key_value_heads", (double)c->num_key_value_heads);
    cJSON_AddNumberToObject(m, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(m, "rotary_dim", (double)td_config_rotary_dim(c));
    cJSON_AddNumberToObject(m, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(m, "linear_num_key_heads", (double)c->linear_num_key_heads);
    cJSON_AddNumberToObject(m, "linear_num_value_heads", (double)c->linear_num_value_heads);
    cJSON_AddNumberToObject(m, "num_experts", (double)c->num_experts);
    cJSON_AddNumberToObject(m, "num_experts_per_tok", (double)c->num_experts_per_tok);
    cJSON_AddNumberToObject(m, "moe_intermediate_size", (double)c->moe_intermediate_size);
    cJSON_AddNumberToObject(m, "shared_expert_intermediate_size", (double)c->shared_expert_intermediate_size);
    cJSON_AddStringToObject(m, "output_gate_type", c->output_gate_type);
    cJSON_AddBoolToObject(m, "fused_experts", r->fused_experts);
    if (c->family == TD_FAMILY_QWEN4_EXP) {
        cJSON_AddNumberToObject(m, "hc_count", (double)c->hc_count);
        cJSON_AddNumberToObject(m, "hc_lowrank", (double)c->hc_lowrank);
        cJSON_AddNumberToObject(m, "indexer_budget", (double)c->indexer_budget);
        cJSON *ple = cJSON_AddArrayToObject(m, "ple_layer_ids");
        for (int64_t i = 0; i < c->n_ple_layers; i++)
            cJSON_AddItemToArray(ple, cJSON_CreateNumber((double)c->ple_layer_ids[i]));
    }
    if (c->n_layers_present) {
        cJSON *lp = cJSON_AddArrayToObject(m, "layers_present");
        for (int64_t i = 0; i < c->n_layers_present; i++)
            cJSON_AddItemToArray(lp, cJSON_CreateNumber((double)c->layers_present[i]));
    }
    cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(td_layer_type_name(c->layer_types[i])));
    cJSON *qj = cJSON_AddObjectToObject(j, "quantization");
    static const char *const src[] = {"none", "hf_quant_config.json", "config.json:modelopt",
                                      "config.json:compressed-tensors"};
    cJSON_AddStringToObject(qj, "source", src[r->quant.source]);
    cJSON_AddStringToObject(qj, "quant_algo", r->quant.quant_algo);
    cJSON_AddBoolToObject(qj, "mixed_precision", r->quant.mixed);
    cJSON_AddNumberToObject(qj, "exclusions", (double)r->quant.n_exclude);
    cJSON *sch = cJSON_AddArrayToObject(qj, "schemes");
    for (int s = 0; s < TD_SCHEME_COUNT; s++) {
        const td_scheme_stat *st = &r->schemes[s];
        if (!st->modules && !st->tensors) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "scheme", td_scheme_name((td_scheme)s));
        cJSON_AddNumberToObject(e, "modules", (double)st->modules);
        cJSON_AddNumberToObject(e, "tensors", (double)st->tensors);
        cJSON_AddNumberToObject(e, "bytes", (double)st->bytes);
        cJSON_AddItemToArray(sch, e);
    }
    cJSON_AddNumberToObject(j, "tensor_count", (double)r->n_tensors);
    cJSON_AddNumberToObject(j, "total_bytes", (double)r->total_bytes);
    cJSON_AddNumberToObject(j, "other_tensors", (double)r->other_tensors);
    cJSON *sh = cJSON_AddArrayToObject(j, "shards");
    for (int64_t i = 0; i < r->n_shards; i++) cJSON_AddItemToArray(sh, cJSON_CreateString(r->shards[i]));
    cJSON_AddNumberToObject(j, "nvfp4_scale_bytes_scanned", (double)r->nvfp4_scale_bytes_scanned);
    cJSON *cons = cJSON_AddObjectToObject(j, "consistency");
    cJSON_AddBoolToObject(cons, "ok", r->n_errors == 0);
    cJSON_AddNumberToObject(cons, "errors", (double)r->n_errors);
    cJSON_AddNumberToObject(cons, "warnings", (double)r->n_warnings);
    cJSON *cnt = cJSON_AddObjectToObject(cons, "counts");
    for (int k = 0; k < TD_FIND_KIND_COUNT; k++)
        cJSON_AddNumberToObject(cnt, td_finding_kind_name((td_finding_kind)k), (double)r->counts[k]);
    cJSON *fs = cJSON_AddArrayToObject(cons, "findings");
    for (size_t i = 0; i < r->n_findings; i++) {
        const td_finding *f = &r->findings[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "severity", sev_name(f->sev));
        cJSON_AddStringToObject(e, "kind", td_finding_kind_name(f->kind));
        cJSON_AddStringToObject(e, "tensor", f->tensor);
        cJSON_AddStringToObject(e, "message", f->msg);
        cJSON_AddItemToArray(fs, e);
    }
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}
