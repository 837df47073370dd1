/* quantize.c — BF16/F16/F32 checkpoint → NVFP4 (see quantize.h).
 *
 * Layout of this file:
 *   1. units: what happens to each input tensor (copy, quantize, split a fused tensor)
 *   2. selection, gate/up siblings, output tensors and shards
 *   3. metadata: exclusion list, ModelOpt / compressed-tensors JSON, self-check
 *   4. processing one unit (convert, quantize, manifest)
 *   5. the driver: write shards, copy files, commit
 */
#include "quantize.h"

#include "config.h"
#include "formats.h"
#include "gen.h"
#include "json.h"
#include "layout.h"
#include "progress.h"
#include "quant.h"
#include "safetensors.h"
#include "sha256.h"
#include "version.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *const default_globs[] = {
    "*.mlp.experts.*",
    "*.mlp.shared_expert.*",
    "*.self_attn.o_proj",
    "*.linear_attn.out_proj",
};

size_t td_quantize_default_glob_count(void)
{
    return TD_ARRAY_LEN(default_globs);
}

const char *td_quantize_default_glob(size_t i)
{
    TD_ASSERT(i < TD_ARRAY_LEN(default_globs));
    return default_globs[i];
}

void td_quantize_opts_init(td_quantize_opts *o)
{
    memset(o, 0, sizeof *o);
    o->conv = TD_NVFP4_MODELOPT;
}

td_status td_quantize_format_from_name(const char *name, td_nvfp4_conv *conv, td_err *err)
{
    if (!strcmp(name, "modelopt")) *conv = TD_NVFP4_MODELOPT;
    else if (!strcmp(name, "ct") || !strcmp(name, "compressed-tensors")) *conv = TD_NVFP4_CT;
    else
        return td_err_set(err, TD_ERR_ARG,
                          "--format '%s' is not a format (modelopt, ct)", name);
    return TD_OK;
}

/* ============================================================================================
 * 1. Units
 * ========================================================================================== */

#define Q_NAME 240

typedef struct q_unit {
    char module[Q_NAME];     /* module name (linear-like) or tensor name (other copies) */
    const char *src;         /* input tensor name (owned by the set) */
    int64_t src_off;         /* first element in src (fused slices) */
    int64_t rows, cols;      /* 2-D view of the module */
    td_dtype dtype;          /* source dtype */
    int ndim;                /* output shape for whole-tensor copies */
    int64_t shape[TD_MAX_DIMS];
    int64_t src_bytes;       /* bytes read from the input */
    bool candidate;          /* a linear module of the inventory */
    bool linear_like;        /* belongs in the exclusion list when not selected */
    bool selected;
    bool slice;              /* cut out of a fused 3-D tensor */
    bool output;             /* produces output tensors (false: exclusion bookkeeping only) */
    int32_t sibling;         /* selected gate/up partner sharing amax, or -1 */
    int32_t shard_in;        /* input shard */
    int32_t shard;           /* output shard */
    int32_t out0, n_out;     /* output tensors */
    float amax;
    bool amax_known;
} q_unit;

typedef struct q_out {
    char name[Q_NAME + 24];
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    int64_t nbytes;
} q_out;

typedef struct q_ctx {
    const td_quantize_opts *o;
    td_err *err;
    td_config cfg;
    char prefix[32];
    td_st_set *set;
    q_unit *u;
    size_t n, cap;
    q_out *out;
    size_t n_out, cap_out;
    char **shard_names;      /* [n_shards] output shard file names */
    size_t n_shards;
    char **excl;             /* exclusion list written */
    size_t n_excl, cap_excl;
} q_ctx;

static q_unit *unit_new(q_ctx *c)
{
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 1024;
        q_unit *u = realloc(c->u, nc * sizeof *u);
        if (!u) return NULL;
        c->u = u;
        c->cap = nc;
    }
    q_unit *u = &c->u[c->n++];
    memset(u, 0, sizeof *u);
    u->sibling = -1;
    u->output = true;
    return u;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static bool float_dtype(td_dtype d)
{
    return d == TD_BF16 || d == TD_F16 || d == TD_F32;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool in_sorted(const char *const *v, size_t n, const char *s)
{
    return bsearch(&s, v, n, sizeof *v, cmp_str) != NULL;
}

/* Selection of one candidate module; marks the globs that matched. */
static bool select_module(const td_quantize_opts *o, const char *module, bool *only_used,
                          bool *excl_used)
{
    bool sel = false;
    if (o->n_only) {
        for (size_t i = 0; i < o->n_only; i++)
            if (fnmatch(o->only[i], module, 0) == 0) {
                sel = true;
                only_used[i] = true;
            }
    } else {
        for (size_t i = 0; i < TD_ARRAY_LEN(default_globs) && !sel; i++)
            sel = fnmatch(default_globs[i], module, 0) == 0;
    }
    for (size_t i = 0; i < o->n_exclude; i++)
        if (fnmatch(o->exclude[i], module, 0) == 0) {
            excl_used[i] = true;
            sel = false;
        }
    return sel;
}

typedef struct fused_layer {
    const char *gu, *dn;       /* input names (owned by the set) or NULL */
    int32_t gu_shard, dn_shard;
    td_dtype gu_dt, dn_dt;
} fused_layer;

/* Build every unit from the input tensor list. */
static td_status build_units(q_ctx *c, bool *only_used, bool *excl_used)
{
    td_err *err = c->err;
    td_layout lay;
    td_status st = td_layout_build(&c->cfg, c->prefix, &lay, err);
    if (st) return st;
    const char **lin = malloc((lay.n ? lay.n : 1) * sizeof *lin);
    fused_layer *fl = calloc((size_t)c->cfg.num_hidden_layers + 1, sizeof *fl);
    if (!lin || !fl) {
        st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    /* linear modules (candidates) and the other weight-carrying modules of the inventory
     * (embeddings, norms, convs, table shards: never quantized, never excluded by name) */
    size_t n_lin = 0, n_other = 0;
    for (size_t i = 0; i < lay.n; i++)
        if (lay.mods[i].kind == TD_MOD_LINEAR) lin[n_lin++] = lay.mods[i].name;
    for (size_t i = 0; i < lay.n; i++)
        if (lay.mods[i].kind == TD_MOD_EMBEDDING || lay.mods[i].kind == TD_MOD_TABLE)
            lin[n_lin + n_other++] = lay.mods[i].name;
    const char **other = lin + n_lin;
    qsort(lin, n_lin, sizeof *lin, cmp_str);
    qsort(other, n_other, sizeof *other, cmp_str);

    /* fused expert tensor names per MoE layer */
    size_t n_layers = (size_t)c->cfg.num_hidden_layers;
    char (*gun)[128] = calloc(n_layers + 1, sizeof *gun);
    char (*dnn)[128] = calloc(n_layers + 1, sizeof *dnn);
    int64_t (*gus)[3] = calloc(n_layers + 1, sizeof *gus);
    int64_t (*dns)[3] = calloc(n_layers + 1, sizeof *dns);
    if (!gun || !dnn || !gus || !dns) {
        st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
        goto done2;
    }
    for (size_t l = 0; l < n_layers; l++)
        if (td_config_layer_is_moe(&c->cfg, (int64_t)l))
            td_layout_fused_experts(&c->cfg, c->prefix, (int64_t)l, gun[l], gus[l], dnn[l], dns[l]);

    size_t count = td_st_set_count(c->set);
    size_t nsh = td_st_set_shard_count(c->set);
    for (size_t i = 0; i < count; i++) {
        const char *name = td_st_set_name(c->set, i);
        const td_st_info *info;
        const char *shard;
        st = td_st_set_info(c->set, name, &info, &shard, err);
        if (st) goto done2;
        int32_t sidx = 0;
        for (size_t s = 0; s < nsh; s++)
            if (!strcmp(td_st_set_shard_name(c->set, s), shard)) sidx = (int32_t)s;
        int64_t nbytes = (int64_t)(info->end - info->begin);

        /* fused routed experts: decided per layer once both halves are known */
        bool fused = false;
        for (size_t l = 0; l < n_layers && !fused; l++) {
            if (!gun[l][0]) continue;
            bool is_gu = !strcmp(name, gun[l]), is_dn = !strcmp(name, dnn[l]);
            if (!is_gu && !is_dn) continue;
            const int64_t *want = is_gu ? gus[l] : dns[l];
            if (info->ndim != 3 || info->shape[0] != want[0] || info->shape[1] != want[1] ||
                info->shape[2] != want[2]) {
                st = td_err_set(err, TD_ERR_UNSUPPORTED,
                                "%s: fused expert tensor of shape [%lld, %lld, %lld]; expected [%lld, %lld, %lld] "
                                "(transformers layout: gate_up_proj [E, 2I, H] with gate rows first, "
                                "down_proj [E, H, I])", name, (long long)info->shape[0],
                                (long long)info->shape[1], (long long)info->shape[2], (long long)want[0],
                                (long long)want[1], (long long)want[2]);
                goto done2;
            }
            if (is_gu) {
                fl[l].gu = name;
                fl[l].gu_shard = sidx;
                fl[l].gu_dt = info->dtype;
            } else {
                fl[l].dn = name;
                fl[l].dn_shard = sidx;
                fl[l].dn_dt = info->dtype;
            }
            fused = true;
        }
        if (fused) continue;

        q_unit *u = unit_new(c);
        if (!u) {
            st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
            goto done2;
        }
        u->src = name;
        u->dtype = info->dtype;
        u->ndim = info->ndim;
        memcpy(u->shape, info->shape, sizeof u->shape);
        u->shard_in = sidx;
        u->src_bytes = nbytes;
        size_t nl = strlen(name);
        if (nl >= Q_NAME) {
            st = td_err_set(err, TD_ERR_RANGE, "quantize: tensor name too long: %.80s...", name);
            goto done2;
        }
        snprintf(u->module, sizeof u->module, "%s", name);
        if (ends_with(name, ".weight")) {
            u->module[nl - 7] = '\0';
            u->candidate = in_sorted(lin, n_lin, u->module);
            /* "X.shard_I" of a table module X */
            char owner[Q_NAME];
            snprintf(owner, sizeof owner, "%s", u->module);
            char *dot = strrchr(owner, '.');
            if (dot && !strncmp(dot, ".shard_", 7)) *dot = '\0';
            bool known_other = in_sorted(other, n_other, u->module) || in_sorted(other, n_other, owner);
            u->linear_like = u->candidate ||
                             (!known_other && info->ndim == 2 && float_dtype(info->dtype));
            if (u->candidate) {
                u->selected = select_module(c->o, u->module, only_used, excl_used);
                u->rows = info->ndim == 2 ? info->shape[0] : 0;
                u->cols = info->ndim == 2 ? info->shape[1] : 0;
            }
        }
        if (!u->linear_like) snprintf(u->module, sizeof u->module, "%s", name);
    }

    /* fused layers: split when any expert is selected, else copy whole */
    static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
    for (size_t l = 0; l < n_layers; l++) {
        if (!fl[l].gu && !fl[l].dn) continue;
        if (!fl[l].gu || !fl[l].dn) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: fused experts of layer %zu are incomplete "
                            "(%s is missing)", c->o->in_dir, l, fl[l].gu ? dnn[l] : gun[l]);
            goto done2;
        }
        const int64_t E = c->cfg.num_experts, I = c->cfg.moe_intermediate_size, H = c->cfg.hidden_size;
        char mod[Q_NAME];
        bool any = false;
        for (int64_t e = 0; e < E; e++)
            for (int k = 0; k < 3; k++) {
                snprintf(mod, sizeof mod, "%slayers.%zu.mlp.experts.%lld.%s", c->prefix, l, (long long)e, projs[k]);
                bool s = select_module(c->o, mod, only_used, excl_used);
                any = any || s;
            }
        for (int half = 0; half < 2; half++) {
            const char *src = half ? fl[l].dn : fl[l].gu;
            td_dtype dt = half ? fl[l].dn_dt : fl[l].gu_dt;
            int32_t sh = half ? fl[l].dn_shard : fl[l].gu_shard;
            const int64_t *shape = half ? dns[l] : gus[l];
            int64_t esz = td_dtype_bits(dt) / 8;
            if (!any) {
                /* copied whole; its expert modules still go into the exclusion list */
                q_unit *u = unit_new(c);
                if (!u) goto oom;
                u->src = src;
                u->dtype = dt;
                u->ndim = 3;
                u->shape[0] = shape[0];
                u->shape[1] = shape[1];
                u->shape[2] = shape[2];
                u->shard_in = sh;
                u->src_bytes = shape[0] * shape[1] * shape[2] * esz;
                snprintf(u->module, sizeof u->module, "%s", src);
                for (int64_t e = 0; e < E; e++)
                    for (int k = half ? 2 : 0; k < (half ? 3 : 2); k++) {
                        q_unit *v = unit_new(c);
                        if (!v) goto oom;
                        snprintf(v->module, sizeof v->module, "%slayers.%zu.mlp.experts.%lld.%s",
                                 c->prefix, l, (long long)e, projs[k]);
                        v->linear_like = true;
                        v->output = false;
                    }
                continue;
            }
            if (!float_dtype(dt)) {
                st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: dtype %s cannot be quantized (BF16, F16 or F32)",
                                src, td_dtype_name(dt));
                goto done2;
            }
            for (int64_t e = 0; e < E; e++)
                for (int k = half ? 2 : 0; k < (half ? 3 : 2); k++) {
                    q_unit *u = unit_new(c);
                    if (!u) goto oom;
                    snprintf(u->module, sizeof u->module, "%slayers.%zu.mlp.experts.%lld.%s", c->prefix,
                             l, (long long)e, projs[k]);
                    u->src = src;
                    u->dtype = dt;
                    u->slice = true;
                    u->candidate = true;
                    u->linear_like = true;
                    u->selected = select_module(c->o, u->module, only_used, excl_used);
                    u->shard_in = sh;
                    u->rows = k == 2 ? H : I;
                    u->cols = k == 2 ? I : H;
                    u->src_off = k == 2 ? e * H * I : (2 * e + k) * I * H;
                    u->src_bytes = u->rows * u->cols * esz;
                    u->ndim = 2;
                    u->shape[0] = u->rows;
                    u->shape[1] = u->cols;
                }
        }
    }
    st = TD_OK;
    goto done2;
oom:
    st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
done2:
    free(gun);
    free(dnn);
    free(gus);
    free(dns);
done:
    free(lin);
    free(fl);
    td_layout_free(&lay);
    return st;
}

/* ============================================================================================
 * 2. Selection checks, siblings, outputs, shards
 * ========================================================================================== */

typedef struct name_ix {
    const char *name;
    int32_t unit;
} name_ix;

static int cmp_name_ix(const void *a, const void *b)
{
    return strcmp(((const name_ix *)a)->name, ((const name_ix *)b)->name);
}

static td_status link_siblings(q_ctx *c)
{
    name_ix *ix = malloc((c->n ? c->n : 1) * sizeof *ix);
    if (!ix) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->u[i].selected) ix[k++] = (name_ix){c->u[i].module, (int32_t)i};
    qsort(ix, k, sizeof *ix, cmp_name_ix);
    char want[Q_NAME];
    for (size_t i = 0; i < c->n; i++) {
        q_unit *u = &c->u[i];
        if (!u->selected || !ends_with(u->module, ".gate_proj")) continue;
        size_t base = strlen(u->module) - strlen("gate_proj");
        snprintf(want, sizeof want, "%.*sup_proj", (int)base, u->module);
        name_ix key = {want, -1};
        const name_ix *hit = bsearch(&key, ix, k, sizeof *ix, cmp_name_ix);
        if (!hit) continue;
        q_unit *v = &c->u[hit->unit];
        if (v->rows != u->rows || v->cols != u->cols) continue;
        u->sibling = hit->unit;
        v->sibling = (int32_t)i;
    }
    free(ix);
    return TD_OK;
}

static td_status out_add(q_ctx *c, q_unit *u, const char *name, td_dtype dt, int nd,
                         const int64_t *shape)
{
    if (c->n_out == c->cap_out) {
        size_t nc = c->cap_out ? c->cap_out * 2 : 1024;
        q_out *o = realloc(c->out, nc * sizeof *o);
        if (!o) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        c->out = o;
        c->cap_out = nc;
    }
    q_out *o = &c->out[c->n_out];
    memset(o, 0, sizeof *o);
    if (strlen(name) >= sizeof o->name)
        return td_err_set(c->err, TD_ERR_RANGE, "quantize: tensor name too long: %.80s...", name);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dtype = dt;
    o->ndim = nd;
    for (int i = 0; i < nd; i++) o->shape[i] = shape[i];
    int64_t numel;
    td_status st = td_shape_numel(nd, o->shape, &numel, c->err);
    if (!st) st = td_dtype_nbytes(dt, numel, &o->nbytes, c->err);
    if (st) return st;
    if (u->n_out == 0) u->out0 = (int32_t)c->n_out;
    u->n_out++;
    c->n_out++;
    return TD_OK;
}

static td_status plan_outputs(q_ctx *c)
{
    const bool ct = c->o->conv == TD_NVFP4_CT;
    char name[Q_NAME + 24];
    for (size_t i = 0; i < c->n; i++) {
        q_unit *u = &c->u[i];
        if (!u->output) continue;
        td_status st;
        if (u->selected) {
            if (u->rows <= 0 || u->cols <= 0 || u->ndim != 2)
                return td_err_set(c->err, TD_ERR_UNSUPPORTED, "%s: selected for NVFP4 but not a 2-D "
                                  "weight", u->src);
            if (u->cols % TD_NVFP4_BLOCK)
                return td_err_set(c->err, TD_ERR_UNSUPPORTED,
                                  "%s: input dimension %lld is not a multiple of 16; exclude it "
                                  "(--exclude '%s')", u->module, (long long)u->cols, u->module);
            if (!float_dtype(u->dtype))
                return td_err_set(c->err, TD_ERR_UNSUPPORTED,
                                  "%s: dtype %s cannot be quantized (BF16, F16 or F32)", u->src,
                                  td_dtype_name(u->dtype));
            int64_t sp[2] = {u->rows, u->cols / 2}, ss[2] = {u->rows, u->cols / TD_NVFP4_BLOCK};
            int64_t one[1] = {1};
            snprintf(name, sizeof name, "%s.%s", u->module, ct ? "weight_packed" : "weight");
            if ((st = out_add(c, u, name, TD_U8, 2, sp))) return st;
            snprintf(name, sizeof name, "%s.weight_scale", u->module);
            if ((st = out_add(c, u, name, TD_F8_E4M3, 2, ss))) return st;
            snprintf(name, sizeof name, "%s.%s", u->module, ct ? "weight_global_scale" : "weight_scale_2");
            if ((st = out_add(c, u, name, TD_F32, ct ? 1 : 0, one))) return st;
        } else if (u->slice) {
            snprintf(name, sizeof name, "%s.weight", u->module);
            if ((st = out_add(c, u, name, u->dtype, 2, u->shape))) return st;
        } else {
            if ((st = out_add(c, u, u->src, u->dtype, u->ndim, u->shape))) return st;
        }
    }
    return TD_OK;
}

static td_status plan_shards(q_ctx *c)
{
    if (c->o->shard_bytes <= 0) {
        c->n_shards = td_st_set_shard_count(c->set);
        c->shard_names = calloc(c->n_shards, sizeof *c->shard_names);
        if (!c->shard_names) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        for (size_t s = 0; s < c->n_shards; s++) {
            c->shard_names[s] = strdup(td_st_set_shard_name(c->set, s));
            if (!c->shard_names[s]) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        }
        for (size_t i = 0; i < c->n; i++) c->u[i].shard = c->u[i].shard_in;
        return TD_OK;
    }
    int64_t cur = 0;
    int32_t shard = 0;
    for (size_t i = 0; i < c->n; i++) {
        q_unit *u = &c->u[i];
        if (!u->output) continue;
        int64_t b = 0;
        for (int32_t t = 0; t < u->n_out; t++) b += c->out[u->out0 + t].nbytes;
        if (cur > 0 && cur + b > c->o->shard_bytes) {
            shard++;
            cur = 0;
        }
        cur += b;
        u->shard = shard;
    }
    c->n_shards = (size_t)shard + 1;
    c->shard_names = calloc(c->n_shards, sizeof *c->shard_names);
    if (!c->shard_names) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    for (size_t s = 0; s < c->n_shards; s++) {
        c->shard_names[s] = malloc(64);
        if (!c->shard_names[s]) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        if (c->n_shards == 1) snprintf(c->shard_names[s], 64, "model.safetensors");
        else snprintf(c->shard_names[s], 64, "model-%05zu-of-%05zu.safetensors", s + 1, c->n_shards);
    }
    return TD_OK;
}

/* ============================================================================================
 * 3. Metadata
 * ========================================================================================== */

/* Does an exclusion pattern match a module under the resolver's rules (core/quant.c)? */
static bool pattern_hits(const char *pat, const char *module)
{
    if (!strcmp(pat, module) || fnmatch(pat, module, 0) == 0) return true;
    static const char lm[] = "model.language_model.";
    if (!strncmp(module, lm, sizeof lm - 1)) {
        char alt[Q_NAME + 8];
        snprintf(alt, sizeof alt, "model.%s", module + sizeof lm - 1);
        if (!strcmp(pat, alt) || fnmatch(pat, alt, 0) == 0) return true;
    }
    return false;
}

/* Replace all (first_only: the first) dot-separated all-digit components with '*'. */
static void generalize(const char *in, char *out, size_t cap, bool first_only)
{
    size_t o = 0;
    bool done = false;
    for (const char *p = in; *p && o + 2 < cap;) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        bool digits = len > 0 && !done;
        for (size_t i = 0; i < len && digits; i++) digits = p[i] >= '0' && p[i] <= '9';
        if (digits) {
            out[o++] = '*';
            if (first_only) done = true;
        } else {
            for (size_t i = 0; i < len && o + 2 < cap; i++) out[o++] = p[i];
        }
        if (!e) break;
        out[o++] = '.';
        p = e + 1;
    }
    out[o] = '\0';
}

static td_status excl_add(q_ctx *c, const char *pat)
{
    for (size_t i = 0; i < c->n_excl; i++)
        if (!strcmp(c->excl[i], pat)) return TD_OK;
    if (c->n_excl == c->cap_excl) {
        size_t nc = c->cap_excl ? c->cap_excl * 2 : 64;
        char **v = realloc(c->excl, nc * sizeof *v);
        if (!v) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        c->excl = v;
        c->cap_excl = nc;
    }
    c->excl[c->n_excl] = strdup(pat);
    if (!c->excl[c->n_excl]) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    c->n_excl++;
    return TD_OK;
}

/* The exclusion list: every unselected linear-like module, generalized as far as possible
 * without matching a selected module. */
static td_status build_exclusions(q_ctx *c)
{
    const char **sel = malloc((c->n ? c->n : 1) * sizeof *sel);
    if (!sel) return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    size_t ns = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->u[i].selected) sel[ns++] = c->u[i].module;
    char pat[3][Q_NAME];
    td_status st = TD_OK;
    const char *last = NULL;
    for (size_t i = 0; i < c->n && !st; i++) {
        const q_unit *u = &c->u[i];
        if (!u->linear_like || u->selected) continue;
        if (last) {
            bool covered = false;
            /* cheap skip: the previous pattern already covers this module */
            covered = pattern_hits(last, u->module);
            if (covered) continue;
        }
        generalize(u->module, pat[0], sizeof pat[0], false);
        generalize(u->module, pat[1], sizeof pat[1], true);
        snprintf(pat[2], sizeof pat[2], "%s", u->module);
        int pick = 2;
        for (int k = 0; k < 2; k++) {
            bool clash = false;
            for (size_t s = 0; s < ns && !clash; s++) clash = pattern_hits(pat[k], sel[s]);
            if (!clash) {
                pick = k;
                break;
            }
        }
        st = excl_add(c, pat[pick]);
        last = c->excl[c->n_excl - 1];
        for (size_t k = 0; k < c->n_excl; k++)
            if (!strcmp(c->excl[k], pat[pick])) last = c->excl[k];
    }
    free(sel);
    return st;
}

/* fnmatch-style pattern with '*' only in whole numeric components → anchored ERE. */
static void to_regex(const char *pat, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = pat; *p && o + 8 < cap; p++) {
        if (*p == '*') {
            memcpy(out + o, "[0-9]+", 6);
            o += 6;
        } else if (strchr(".[]()+?^$|\\{}", *p)) {
            out[o++] = '\\';
            out[o++] = *p;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

typedef struct qjb {
    bool oom;
} qjb;

static cJSON *qj_add(qjb *b, cJSON *o, const char *k, cJSON *v)
{
    if (!v || !o || !cJSON_AddItemToObject(o, k, v)) {
        cJSON_Delete(v);
        b->oom = true;
        return NULL;
    }
    return v;
}

static cJSON *producer_json(qjb *b)
{
    cJSON *p = cJSON_CreateObject();
    qj_add(b, p, "name", cJSON_CreateString("tandem"));
    qj_add(b, p, "version", cJSON_CreateString(td_version()));
    return p;
}

static cJSON *str_array(qjb *b, char *const *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    if (!a) b->oom = true;
    for (size_t i = 0; i < n && a; i++) {
        cJSON *s = cJSON_CreateString(v[i]);
        if (!s || !cJSON_AddItemToArray(a, s)) {
            cJSON_Delete(s);
            b->oom = true;
        }
    }
    return a;
}

/* ModelOpt: hf_quant_config.json and the config.json quantization_config. */
static void modelopt_json(q_ctx *c, qjb *b, cJSON **hf, cJSON **qc)
{
    *hf = cJSON_CreateObject();
    qj_add(b, *hf, "producer", producer_json(b));
    cJSON *q = qj_add(b, *hf, "quantization", cJSON_CreateObject());
    qj_add(b, q, "quant_algo", cJSON_CreateString("W4A16_NVFP4"));
    qj_add(b, q, "kv_cache_quant_algo", cJSON_CreateNull());
    qj_add(b, q, "group_size", cJSON_CreateNumber(16));
    qj_add(b, q, "exclude_modules", str_array(b, c->excl, c->n_excl));

    *qc = cJSON_CreateObject();
    cJSON *g = qj_add(b, qj_add(b, *qc, "config_groups", cJSON_CreateObject()), "group_0",
                      cJSON_CreateObject());
    cJSON *w = qj_add(b, g, "weights", cJSON_CreateObject());
    qj_add(b, w, "dynamic", cJSON_CreateFalse());
    qj_add(b, w, "num_bits", cJSON_CreateNumber(4));
    qj_add(b, w, "type", cJSON_CreateString("float"));
    qj_add(b, w, "group_size", cJSON_CreateNumber(16));
    cJSON *t = qj_add(b, g, "targets", cJSON_CreateArray());
    if (t && !cJSON_AddItemToArray(t, cJSON_CreateString("Linear"))) b->oom = true;
    qj_add(b, *qc, "ignore", str_array(b, c->excl, c->n_excl));
    qj_add(b, *qc, "quant_algo", cJSON_CreateString("W4A16_NVFP4"));
    qj_add(b, *qc, "kv_cache_scheme", cJSON_CreateNull());
    qj_add(b, *qc, "producer", producer_json(b));
    qj_add(b, *qc, "quant_method", cJSON_CreateString("modelopt"));
}

/* compressed-tensors: config.json quantization_config (NVFP4_SPEC.md §4.3), weight-only. */
static void ct_json(q_ctx *c, qjb *b, cJSON **qc)
{
    char **ig = calloc(c->n_excl ? c->n_excl : 1, sizeof *ig);
    if (!ig) {
        b->oom = true;
        return;
    }
    for (size_t i = 0; i < c->n_excl; i++) {
        const char *p = c->excl[i];
        char re[2 * Q_NAME + 16];
        if (strchr(p, '*')) {
            char body[2 * Q_NAME];
            to_regex(p, body, sizeof body);
            snprintf(re, sizeof re, "re:%s", body);
        } else {
            snprintf(re, sizeof re, "%s", p);
        }
        ig[i] = strdup(re);
        if (!ig[i]) b->oom = true;
    }
    *qc = cJSON_CreateObject();
    qj_add(b, *qc, "quant_method", cJSON_CreateString("compressed-tensors"));
    qj_add(b, *qc, "format", cJSON_CreateString("nvfp4-pack-quantized"));
    qj_add(b, *qc, "quantization_status", cJSON_CreateString("compressed"));
    cJSON *g = qj_add(b, qj_add(b, *qc, "config_groups", cJSON_CreateObject()), "group_0",
                      cJSON_CreateObject());
    cJSON *t = qj_add(b, g, "targets", cJSON_CreateArray());
    if (t && !cJSON_AddItemToArray(t, cJSON_CreateString("Linear"))) b->oom = true;
    qj_add(b, g, "format", cJSON_CreateString("nvfp4-pack-quantized"));
    cJSON *w = qj_add(b, g, "weights", cJSON_CreateObject());
    qj_add(b, w, "num_bits", cJSON_CreateNumber(4));
    qj_add(b, w, "type", cJSON_CreateString("float"));
    qj_add(b, w, "strategy", cJSON_CreateString("tensor_group"));
    qj_add(b, w, "group_size", cJSON_CreateNumber(16));
    qj_add(b, w, "symmetric", cJSON_CreateTrue());
    qj_add(b, w, "dynamic", cJSON_CreateFalse());
    qj_add(b, w, "observer", cJSON_CreateString("minmax"));
    qj_add(b, w, "actorder", cJSON_CreateNull());
    qj_add(b, w, "block_structure", cJSON_CreateNull());
    qj_add(b, g, "input_activations", cJSON_CreateNull());
    qj_add(b, g, "output_activations", cJSON_CreateNull());
    qj_add(b, *qc, "ignore", str_array(b, ig, c->n_excl));
    qj_add(b, *qc, "kv_cache_scheme", cJSON_CreateNull());
    qj_add(b, *qc, "global_compression_ratio", cJSON_CreateNull());
    for (size_t i = 0; i < c->n_excl; i++) free(ig[i]);
    free(ig);
}

/* Resolve every linear-like module with the metadata about to be written: the result must
 * be exactly the selection (otherwise `inspect` of the output would disagree). */
static td_status self_check(q_ctx *c, const cJSON *hf, const cJSON *qc)
{
    td_quant q;
    td_status st = hf ? td_quant_parse_hf(hf, "hf_quant_config.json", &q, c->err)
                      : td_quant_parse_config(qc, "config.json", &q, c->err);
    if (st) return td_err_prefix(c->err, "quantize: metadata self-check: ");
    td_scheme want_q = c->o->conv == TD_NVFP4_CT ? TD_SCHEME_NVFP4_CT : TD_SCHEME_NVFP4;
    for (size_t i = 0; i < c->n && !st; i++) {
        const q_unit *u = &c->u[i];
        if (!u->linear_like) continue;
        td_quant_tensors qt;
        st = td_quant_resolve(&q, u->module, true, &qt, c->err);
        if (st) break;
        td_scheme want = u->selected ? want_q : TD_SCHEME_NONE;
        if (qt.scheme != want || qt.input_scale[0])
            st = td_err_set(c->err, TD_ERR_INTERNAL,
                            "quantize: metadata self-check: %s resolves to %s, expected %s", u->module,
                            td_scheme_name(qt.scheme), td_scheme_name(want));
    }
    td_quant_free(&q);
    return st;
}

/* ============================================================================================
 * 4. Processing a unit
 * ========================================================================================== */

static inline float load_elem(const uint8_t *p, td_dtype dt, int64_t i)
{
    switch (dt) {
    case TD_BF16:
        return td_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    case TD_F16:
        return td_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    default: {
        uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                     (uint32_t)p[4 * i + 3] << 24;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

/* Widen n elements of a BF16/F16/F32 little-endian buffer to float32 (exact). */
static void load_f32(const uint8_t *p, td_dtype dt, int64_t n, float *out)
{
    if (dt == TD_BF16) {
        /* BF16 is the top half of a float32 (td_bf16_to_f32: bits << 16), inlined here
         * because this loop runs over every quantized weight */
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &u, 4);
        }
    } else if (dt == TD_F16) {
        for (int64_t i = 0; i < n; i++) out[i] = td_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = load_elem(p, TD_F32, i);
    }
}

static td_status unit_source(q_ctx *c, const q_unit *u, const uint8_t **data)
{
    td_tensor v;
    td_status st = td_st_set_tensor(c->set, u->src, &v, c->err);
    if (st) return st;
    int64_t esz = td_dtype_bits(u->dtype) / 8;
    *data = v.data ? (const uint8_t *)v.data + (u->slice ? u->src_off * esz : 0) : NULL;
    return TD_OK;
}

/* max|w| of a unit; a non-finite element is an error naming its position. */
static td_status unit_amax(q_ctx *c, q_unit *u, float *amax)
{
    if (u->amax_known) {
        *amax = u->amax;
        return TD_OK;
    }
    const uint8_t *p;
    td_status st = unit_source(c, u, &p);
    if (st) return st;
    float m = 0.0f;
    int64_t n = u->rows * u->cols;
    if (u->dtype == TD_BF16) {
        /* max |w| on the bit patterns: for BF16 the magnitude order is the integer order of
         * bits & 0x7FFF; 0x7F80 and above are inf/NaN */
        uint16_t mb = 0;
        int64_t bad = -1;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)((p[2 * i] | (p[2 * i + 1] << 8)) & 0x7FFF);
            if (h >= 0x7F80 && bad < 0) bad = i;
            if (h > mb) mb = h;
        }
        if (bad >= 0) {
            float v = load_elem(p, u->dtype, bad);
            return td_err_set(c->err, TD_ERR_ARG, "%s: element [%lld, %lld] is %s; NVFP4 needs finite "
                              "weights", u->module, (long long)(bad / u->cols), (long long)(bad % u->cols),
                              isnan(v) ? "NaN" : "infinite");
        }
        m = td_bf16_to_f32(mb);
        u->amax = m;
        u->amax_known = true;
        *amax = m;
        return TD_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = load_elem(p, u->dtype, i);
        if (!isfinite(v))
            return td_err_set(c->err, TD_ERR_ARG, "%s: element [%lld, %lld] is %s; NVFP4 needs finite "
                              "weights", u->module, (long long)(i / u->cols), (long long)(i % u->cols),
                              isnan(v) ? "NaN" : "infinite");
        m = fmaxf(m, fabsf(v));
    }
    u->amax = m;
    u->amax_known = true;
    *amax = m;
    return TD_OK;
}

static void hex_f32(float f, char out[11])
{
    uint32_t u;
    memcpy(&u, &f, 4);
    snprintf(out, 11, "0x%08x", u);
}

typedef struct q_bufs {
    float *w;          /* [max numel] */
    uint8_t *packed;   /* [max numel / 2] */
    uint8_t *scales;   /* [max numel / 16] */
    float *deq;        /* [chunk] dequant rows for the manifest */
    size_t deq_cap;
} q_bufs;

/* Manifest entry: SHA-256 of the dequantized float32 (LE, row-major), packed and scale bytes. */
static td_status manifest_entry(q_ctx *c, const q_unit *u, const q_bufs *b, float g, cJSON *arr)
{
    const int64_t rows = u->rows, cols = u->cols;
    int64_t chunk = (int64_t)b->deq_cap / cols;
    if (chunk < 1) chunk = 1;
    td_sha256_ctx sh;
    td_sha256_init(&sh);
    uint8_t le[4096];
    char first[8][11];
    int nfirst = 0;
    double max_err = 0.0;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        td_status st = td_nvfp4_dequantize(b->packed + r0 * (cols / 2), b->scales + r0 * (cols / 16),
                                           g, c->o->conv, nr, cols, b->deq, c->err);
        if (st) return td_err_prefix(c->err, "%s: ", u->module);
        int64_t n = nr * cols;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)b->deq[i] - (double)b->w[r0 * cols + i]);
            if (e > max_err) max_err = e;
        }
        for (int64_t i = 0; i < n;) {
            size_t k = 0;
            for (; k + 4 <= sizeof le && i < n; i++, k += 4) {
                uint32_t v;
                memcpy(&v, &b->deq[i], 4);
                le[k] = (uint8_t)v;
                le[k + 1] = (uint8_t)(v >> 8);
                le[k + 2] = (uint8_t)(v >> 16);
                le[k + 3] = (uint8_t)(v >> 24);
            }
            td_sha256_update(&sh, le, k);
        }
        for (int64_t i = 0; i < n && nfirst < 8; i++) hex_f32(b->deq[i], first[nfirst++]);
    }
    uint8_t dg[TD_SHA256_DIGEST_LEN];
    char hex[TD_SHA256_HEX_LEN], gh[11];
    td_sha256_final(&sh, dg);
    td_sha256_hex(dg, hex);
    qjb jb = {false};
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(arr, e)) {
        cJSON_Delete(e);
        return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    }
    const q_out *o = &c->out[u->out0];
    qj_add(&jb, e, "module", cJSON_CreateString(u->module));
    qj_add(&jb, e, "shard", cJSON_CreateString(c->shard_names[u->shard]));
    qj_add(&jb, e, "weight", cJSON_CreateString(o[0].name));
    qj_add(&jb, e, "scale", cJSON_CreateString(o[1].name));
    qj_add(&jb, e, "global", cJSON_CreateString(o[2].name));
    cJSON *shape = qj_add(&jb, e, "shape", cJSON_CreateArray());
    if (shape) {
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)rows));
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)cols));
    }
    hex_f32(g, gh);
    qj_add(&jb, e, "global_bits", cJSON_CreateString(gh));
    qj_add(&jb, e, "sha256_dequant_f32le", cJSON_CreateString(hex));
    td_sha256(b->packed, (size_t)(rows * cols / 2), dg);
    td_sha256_hex(dg, hex);
    qj_add(&jb, e, "sha256_packed", cJSON_CreateString(hex));
    td_sha256(b->scales, (size_t)(rows * cols / 16), dg);
    td_sha256_hex(dg, hex);
    qj_add(&jb, e, "sha256_scale", cJSON_CreateString(hex));
    cJSON *fa = qj_add(&jb, e, "first_f32_bits", cJSON_CreateArray());
    for (int i = 0; i < nfirst && fa; i++) cJSON_AddItemToArray(fa, cJSON_CreateString(first[i]));
    qj_add(&jb, e, "max_abs_error", cJSON_CreateNumber(max_err));
    return jb.oom ? td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory") : TD_OK;
}

/* Produce and write the output tensors of one unit. */
static td_status process_unit(q_ctx *c, q_unit *u, td_st_writer *w, q_bufs *b, cJSON *manifest)
{
    const q_out *o = &c->out[u->out0];
    const uint8_t *src;
    td_status st = unit_source(c, u, &src);
    if (st) return st;
    if (!u->selected) /* whole tensor or a fused slice, bytes unchanged */
        return td_st_writer_write(w, o[0].name, src, (size_t)o[0].nbytes, c->err);

    const int64_t n = u->rows * u->cols;
    load_f32(src, u->dtype, n, b->w);
    float amax = NAN;
    if (u->sibling >= 0 && !u->amax_known) {
        /* own amax from the widened copy (the quantizer rejects non-finite values itself) */
        float m = 0.0f;
        for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(b->w[i]));
        u->amax = m;
        u->amax_known = true;
    }
    if (u->sibling >= 0) {
        float a, s;
        st = unit_amax(c, u, &a);
        if (!st) st = unit_amax(c, &c->u[u->sibling], &s);
        if (st) return st;
        amax = fmaxf(a, s);
    }
    float g;
    st = td_nvfp4_quantize(b->w, u->rows, u->cols, c->o->conv, amax, b->packed, b->scales, &g, c->err);
    if (st) return td_err_prefix(c->err, "%s: ", u->module);
    uint8_t gb[4];
    uint32_t gu;
    memcpy(&gu, &g, 4);
    for (int i = 0; i < 4; i++) gb[i] = (uint8_t)(gu >> (8 * i));
    st = td_st_writer_write(w, o[0].name, b->packed, (size_t)o[0].nbytes, c->err);
    if (!st) st = td_st_writer_write(w, o[1].name, b->scales, (size_t)o[1].nbytes, c->err);
    if (!st) st = td_st_writer_write(w, o[2].name, gb, 4, c->err);
    if (!st && manifest) st = manifest_entry(c, u, b, g, manifest);
    return st;
}

/* ============================================================================================
 * 5. Driver
 * ========================================================================================== */

static td_status copy_file(const char *from, const char *to, td_err *err)
{
    FILE *in = fopen(from, "rb");
    if (!in) return td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return td_err_set(err, TD_ERR_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t k;
    bool ok = true;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, k, out) != k) {
            ok = false;
            break;
        }
    ok = ok && !ferror(in);
    fclose(in);
    ok = (fclose(out) == 0) && ok;
    return ok ? TD_OK : td_err_set(err, TD_ERR_IO, "%s: copy to %s failed", from, to);
}

static bool skip_file(const char *name)
{
    return name[0] == '.' || ends_with(name, ".safetensors") ||
           !strcmp(name, "model.safetensors.index.json") || !strcmp(name, "config.json") ||
           !strcmp(name, "hf_quant_config.json") || !strcmp(name, "tandem_gen.json") ||
           !strcmp(name, "tandem_quantize.json");
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Copy the other regular top-level files (tokenizer, generation_config.json, ...). */
static td_status copy_other_files(q_ctx *c, const td_gen_outdir *od, int64_t *copied)
{
    DIR *d = opendir(c->o->in_dir);
    if (!d) return td_err_set(c->err, TD_ERR_IO, "%s: cannot list: %s", c->o->in_dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    td_status st = TD_OK;
    struct dirent *e;
    char from[4096], to[4200];
    while ((e = readdir(d)) != NULL && !st) {
        if (skip_file(e->d_name)) continue;
        if (snprintf(from, sizeof from, "%s/%s", c->o->in_dir, e->d_name) >= (int)sizeof from) continue;
        struct stat sb;
        if (stat(from, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **v = realloc(names, cap * sizeof *v);
            if (!v) {
                st = td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
                break;
            }
            names = v;
        }
        names[n] = strdup(e->d_name);
        if (!names[n]) st = td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
        else n++;
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, cmp_cstr);
    for (size_t i = 0; i < n && !st; i++) {
        snprintf(from, sizeof from, "%s/%s", c->o->in_dir, names[i]);
        st = td_gen_outdir_path(od, names[i], to, sizeof to, c->err);
        if (!st) st = copy_file(from, to, c->err);
        if (!st) (*copied)++;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

static int cmp_out_name(const void *a, const void *b)
{
    return strcmp((*(const q_out *const *)a)->name, (*(const q_out *const *)b)->name);
}

static td_status write_index(q_ctx *c, const char *path)
{
    /* weight_map sorted by tensor name */
    const q_out **ord = malloc((c->n_out ? c->n_out : 1) * sizeof *ord);
    int32_t *shard_of = malloc((c->n_out ? c->n_out : 1) * sizeof *shard_of);
    if (!ord || !shard_of) {
        free(ord);
        free(shard_of);
        return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    }
    for (size_t i = 0; i < c->n; i++)
        for (int32_t t = 0; t < c->u[i].n_out; t++) shard_of[c->u[i].out0 + t] = c->u[i].shard;
    int64_t total = 0;
    for (size_t i = 0; i < c->n_out; i++) {
        ord[i] = &c->out[i];
        total += c->out[i].nbytes;
    }
    qsort(ord, c->n_out, sizeof *ord, cmp_out_name);
    qjb b = {false};
    cJSON *o = cJSON_CreateObject();
    cJSON *md = qj_add(&b, o, "metadata", cJSON_CreateObject());
    qj_add(&b, md, "total_size", cJSON_CreateNumber((double)total));
    cJSON *wm = qj_add(&b, o, "weight_map", cJSON_CreateObject());
    for (size_t i = 0; i < c->n_out && !b.oom; i++)
        qj_add(&b, wm, ord[i]->name, cJSON_CreateString(c->shard_names[shard_of[ord[i] - c->out]]));
    td_status st = b.oom ? td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory")
                         : td_gen_write_json(path, o, c->err);
    cJSON_Delete(o);
    free(ord);
    free(shard_of);
    return st;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void ctx_free(q_ctx *c)
{
    td_st_set_close(c->set);
    free(c->u);
    free(c->out);
    for (size_t s = 0; s < c->n_shards; s++) free(c->shard_names ? c->shard_names[s] : NULL);
    free(c->shard_names);
    for (size_t i = 0; i < c->n_excl; i++) free(c->excl[i]);
    free(c->excl);
}

/* config.json of the output: the input's, with the new quantization_config. */
static td_status output_config(q_ctx *c, cJSON *qc, const char *path)
{
    char in[4096];
    snprintf(in, sizeof in, "%s/config.json", c->o->in_dir);
    cJSON *root = NULL;
    td_status st = td_json_read_file(in, 16u << 20, &root, c->err);
    if (st) return st;
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(tc)) cJSON_DeleteItemFromObjectCaseSensitive(tc, "quantization_config");
    cJSON *dup = cJSON_Duplicate(qc, true);
    if (!dup || !cJSON_AddItemToObject(root, "quantization_config", dup)) {
        cJSON_Delete(dup);
        cJSON_Delete(root);
        return td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory");
    }
    st = td_gen_write_json(path, root, c->err);
    cJSON_Delete(root);
    return st;
}

static td_status provenance_json(q_ctx *c, const td_quantize_result *r, const char *path)
{
    qjb b = {false};
    cJSON *o = cJSON_CreateObject();
    qj_add(&b, o, "tool", cJSON_CreateString("tandem quantize"));
    qj_add(&b, o, "version", cJSON_CreateString(td_version()));
    qj_add(&b, o, "format", cJSON_CreateString(c->o->conv == TD_NVFP4_CT ? "compressed-tensors" : "modelopt"));
    qj_add(&b, o, "quant_algo", cJSON_CreateString(c->o->conv == TD_NVFP4_CT ? "NVFP4A16" : "W4A16_NVFP4"));
    qj_add(&b, o, "algorithm", cJSON_CreateString(
        "td_nvfp4_quantize (NVFP4_SPEC.md 3.3): amax-derived global, per-16 block scale rounded to "
        "E4M3, values divided by the rounded scale, RNE to E2M1; gate/up share amax"));
    cJSON *sel = qj_add(&b, o, "selection", cJSON_CreateArray());
    if (c->o->n_only)
        for (size_t i = 0; i < c->o->n_only && sel; i++) cJSON_AddItemToArray(sel, cJSON_CreateString(c->o->only[i]));
    else
        for (size_t i = 0; i < TD_ARRAY_LEN(default_globs) && sel; i++)
            cJSON_AddItemToArray(sel, cJSON_CreateString(default_globs[i]));
    cJSON *ex = qj_add(&b, o, "exclude", cJSON_CreateArray());
    for (size_t i = 0; i < c->o->n_exclude && ex; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(c->o->exclude[i]));
    qj_add(&b, o, "modules_quantized", cJSON_CreateNumber((double)r->modules_quantized));
    qj_add(&b, o, "modules_split_from_fused", cJSON_CreateNumber((double)r->modules_split));
    qj_add(&b, o, "tensors", cJSON_CreateNumber((double)r->tensors_out));
    /* where the weights came from: the input's own provenance, when it has one */
    char in[4096];
    snprintf(in, sizeof in, "%s/tandem_gen.json", c->o->in_dir);
    struct stat sb;
    if (stat(in, &sb) == 0) {
        cJSON *src = NULL;
        if (td_json_read_file(in, 1u << 20, &src, NULL) == TD_OK) qj_add(&b, o, "source_tandem_gen", src);
    }
    td_status st = b.oom ? td_err_set(c->err, TD_ERR_NOMEM, "quantize: out of memory")
                         : td_gen_write_json(path, o, c->err);
    cJSON_Delete(o);
    return st;
}

td_status td_quantize(const td_quantize_opts *o, td_quantize_result *res, td_err *err)
{
    double t0 = now_s();
    td_quantize_result r;
    memset(&r, 0, sizeof r);
    if (!o->in_dir || !*o->in_dir) return td_err_set(err, TD_ERR_ARG, "quantize: no input directory");
    if (!o->out_dir || !*o->out_dir) return td_err_set(err, TD_ERR_ARG, "quantize: no output directory");
    if ((unsigned)o->conv >= TD_NVFP4_CONV_COUNT) return td_err_set(err, TD_ERR_ARG, "quantize: bad format");

    q_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.err = err;
    bool *only_used = calloc(o->n_only + 1, 1), *excl_used = calloc(o->n_exclude + 1, 1);
    q_bufs b;
    memset(&b, 0, sizeof b);
    td_gen_outdir od;
    memset(&od, 0, sizeof od);
    td_st_writer *w = NULL;
    cJSON *hf = NULL, *qc = NULL, *manifest = NULL, *mroot = NULL;
    td_status st = TD_OK;
    if (!only_used || !excl_used) {
        st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }

    /* input: an unquantized checkpoint of a supported family */
    st = td_config_load(o->in_dir, &c.cfg, err);
    if (st) goto done;
    td_quant q_in;
    st = td_quant_load(o->in_dir, &q_in, err);
    if (st) goto done;
    bool quantized = q_in.source != TD_QUANT_SRC_NONE;
    char algo[32];
    snprintf(algo, sizeof algo, "%s", q_in.quant_algo);
    td_quant_free(&q_in);
    if (quantized) {
        st = td_err_set(err, TD_ERR_ARG, "%s is already quantized (quant_algo %s); tandem quantize "
                        "takes BF16/F16/F32 checkpoints", o->in_dir, algo[0] ? algo : "?");
        goto done;
    }
    st = td_st_set_open(o->in_dir, &c.set, err);
    if (!st) st = td_st_set_validate(c.set, err);
    if (st) goto done;
    snprintf(c.prefix, sizeof c.prefix, "%s",
             c.cfg.family == TD_FAMILY_QWEN4_EXP ? td_layout_set_prefix(c.set) : "model.");

    st = build_units(&c, only_used, excl_used);
    if (st) goto done;
    for (size_t i = 0; i < o->n_only; i++)
        if (!only_used[i]) {
            st = td_err_set(err, TD_ERR_ARG, "--only '%s' matches no linear module of %s (globs match "
                            "module names such as %slayers.0.mlp.experts.0.gate_proj)", o->only[i],
                            o->in_dir, c.prefix);
            goto done;
        }
    for (size_t i = 0; i < o->n_exclude; i++)
        if (!excl_used[i]) {
            st = td_err_set(err, TD_ERR_ARG, "--exclude '%s' matches no linear module of %s", o->exclude[i],
                            o->in_dir);
            goto done;
        }
    int64_t n_sel = 0;
    for (size_t i = 0; i < c.n; i++) n_sel += c.u[i].selected;
    if (n_sel == 0) {
        st = td_err_set(err, TD_ERR_ARG, "%s: nothing to quantize (no linear module is selected)", o->in_dir);
        goto done;
    }
    st = link_siblings(&c);
    if (!st) st = plan_outputs(&c);
    if (!st) st = plan_shards(&c);
    if (!st) st = build_exclusions(&c);
    if (st) goto done;

    qjb jb = {false};
    if (o->conv == TD_NVFP4_CT) ct_json(&c, &jb, &qc);
    else modelopt_json(&c, &jb, &hf, &qc);
    if (jb.oom) {
        st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
        goto done;
    }
    st = self_check(&c, hf, qc);
    if (st) goto done;

    /* buffers sized by the largest selected module */
    int64_t max_n = 0;
    for (size_t i = 0; i < c.n; i++)
        if (c.u[i].selected && c.u[i].rows * c.u[i].cols > max_n) max_n = c.u[i].rows * c.u[i].cols;
    b.w = malloc((size_t)max_n * sizeof *b.w);
    b.packed = malloc((size_t)max_n / 2);
    b.scales = malloc((size_t)max_n / 16);
    b.deq_cap = 1 << 16;
    b.deq = o->dequant_manifest ? malloc(b.deq_cap * sizeof *b.deq) : NULL;
    if (!b.w || !b.packed || !b.scales || (o->dequant_manifest && !b.deq)) {
        st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory (largest module %lld elements)",
                        (long long)max_n);
        goto done;
    }
    if (o->dequant_manifest) {
        mroot = cJSON_CreateObject();
        qjb mb = {false};
        qj_add(&mb, mroot, "format", cJSON_CreateString(o->conv == TD_NVFP4_CT ? "compressed-tensors" : "modelopt"));
        qj_add(&mb, mroot, "dequantization", cJSON_CreateString(
            o->conv == TD_NVFP4_CT ? "w = e2m1(code) * fl32(fl32(e4m3(S)) / weight_global_scale)"
                                   : "w = e2m1(code) * fl32(fl32(e4m3(S)) * weight_scale_2)"));
        qj_add(&mb, mroot, "layout", cJSON_CreateString(
            "float32 little-endian, row-major [out, in]; code 2j in the low nibble of byte j"));
        qj_add(&mb, mroot, "checkpoint", cJSON_CreateString(o->out_dir));
        manifest = qj_add(&mb, mroot, "tensors", cJSON_CreateArray());
        if (mb.oom) {
            st = td_err_set(err, TD_ERR_NOMEM, "quantize: out of memory");
            goto done;
        }
    }

    st = td_gen_outdir_begin(&od, o->out_dir, o->force, err);
    if (st) goto done;

    int64_t total = 0;
    for (size_t i = 0; i < c.n; i++) total += c.u[i].output ? c.u[i].src_bytes : 0;
    td_progress prog;
    td_progress_init_ex(&prog, stderr, "quantize", (uint64_t)total, o->progress ? -1 : 0, NULL, NULL);
    int64_t done_bytes = 0;
    char path[4200];
    for (size_t s = 0; s < c.n_shards && !st; s++) {
        st = td_gen_outdir_path(&od, c.shard_names[s], path, sizeof path, err);
        if (!st) st = td_st_writer_init(path, &w, err);
        if (!st) st = td_st_writer_meta(w, "format", "pt", err);
        if (!st) st = td_st_writer_meta(w, "tandem_quantize_format",
                                        o->conv == TD_NVFP4_CT ? "compressed-tensors" : "modelopt", err);
        for (size_t i = 0; i < c.n && !st; i++) {
            const q_unit *u = &c.u[i];
            if (!u->output || u->shard != (int32_t)s) continue;
            for (int32_t t = 0; t < u->n_out && !st; t++) {
                const q_out *qo = &c.out[u->out0 + t];
                st = td_st_writer_declare(w, qo->name, qo->dtype, qo->ndim, qo->shape, err);
            }
        }
        if (!st) st = td_st_writer_begin(w, err);
        for (size_t i = 0; i < c.n && !st; i++) {
            q_unit *u = &c.u[i];
            if (!u->output || u->shard != (int32_t)s) continue;
            st = process_unit(&c, u, w, &b, manifest);
            if (st) break;
            r.tensors_out += u->n_out;
            r.bytes_in += u->src_bytes;
            if (u->selected) {
                r.modules_quantized++;
                r.bytes_quantized_in += u->src_bytes;
            } else {
                r.tensors_copied++;
            }
            if (u->slice) r.modules_split++;
            for (int32_t t = 0; t < u->n_out; t++) r.bytes_out += c.out[u->out0 + t].nbytes;
            done_bytes += u->src_bytes;
            td_progress_update(&prog, (uint64_t)done_bytes);
        }
        if (!st) st = td_st_writer_finish(w, err);
        td_st_writer_free(w);
        w = NULL;
    }
    if (st) goto done;
    td_progress_done(&prog);
    r.tensors_in = (int64_t)td_st_set_count(c.set);
    r.shards_out = (int64_t)c.n_shards;
    r.n_exclusions = c.n_excl;

    /* metadata and the other files */
    /* an index whenever the tensors are not in one model.safetensors (a one-shard input
     * named model-00001-of-00001.safetensors keeps its name and its index) */
    if (c.n_shards > 1 || strcmp(c.shard_names[0], "model.safetensors")) {
        st = td_gen_outdir_path(&od, "model.safetensors.index.json", path, sizeof path, err);
        if (!st) st = write_index(&c, path);
    }
    if (!st) st = td_gen_outdir_path(&od, "config.json", path, sizeof path, err);
    if (!st) st = output_config(&c, qc, path);
    if (!st && hf) {
        st = td_gen_outdir_path(&od, "hf_quant_config.json", path, sizeof path, err);
        if (!st) st = td_gen_write_json(path, hf, err);
    }
    if (!st) st = copy_other_files(&c, &od, &r.files_copied);
    if (!st) st = td_gen_outdir_path(&od, "tandem_quantize.json", path, sizeof path, err);
    if (!st) st = provenance_json(&c, &r, path);
    if (!st) st = td_gen_outdir_commit(&od, err);
    if (st) goto done;
    if (mroot) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", o->dequant_manifest);
        st = td_gen_write_json(tmp, mroot, err);
        if (!st && rename(tmp, o->dequant_manifest) != 0)
            st = td_err_set(err, TD_ERR_IO, "%s: cannot rename into place: %s", o->dequant_manifest,
                            strerror(errno));
        if (st) {
            remove(tmp);
            goto done;
        }
    }
    r.seconds = now_s() - t0;
    if (res) *res = r;
done:
    td_st_writer_free(w);
    if (st) td_gen_outdir_abort(&od);
    cJSON_Delete(hf);
    cJSON_Delete(qc);
    cJSON_Delete(mroot);
    free(b.w);
    free(b.packed);
    free(b.scales);
    free(b.deq);
    free(only_used);
    free(excl_used);
    ctx_free(&c);
    return st;
}
