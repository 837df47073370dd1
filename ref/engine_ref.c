/* engine_ref.c — the reference engine `ref`: loads a checkpoint's MoE layers lazily and runs
 * the MoE block and the router (engine.h contract; numerics in linear.h and moe.h).
 *
 * Loading: config.json, the quantization metadata and the tensor namespace (td_st_set) are
 * read at load; the tensors of a layer are looked up, checked (dtype, shape, scalar globals,
 * NVFP4 block alignment of TP slices) and mapped on the layer's first run_block. Nothing is
 * copied: views point into the mapped shards. Per-expert tensors
 * (`mlp.experts.E.{gate,up,down}_proj.*`, any scheme core/quant.h resolves to BF16/F16/F32 or
 * NVFP4) and fused BF16 expert tensors (`mlp.experts.gate_up_proj` [E, 2I, H],
 * `mlp.experts.down_proj` [E, H, I]) are both understood.
 *
 * Memory: the MoE workspace is sized on the first call with a given token count (and grown
 * only when a larger one comes); the compute loops never allocate.
 */
#include "engine_ref.h"
#include "layout.h"
#include "moe.h"
#include "quant.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_layer {
    bool loaded;
    ref_moe_weights w;
    ref_expert *experts;        /* [E] whole (TP1) views */
} ref_layer;

typedef struct ref_engine {
    td_engine base;             /* first member: the interface's view */
    char dir[1024];
    td_config cfg;
    td_quant quant;
    td_st_set *set;
    char prefix[64];
    ref_layer *layers;          /* [num_hidden_layers] */
    ref_pool *pool;
    ref_moe_ws ws;
    ref_moe_opts opts;
} ref_engine;

/* ==== tensors ================================================================================ */

static td_status get_tensor(ref_engine *r, const char *name, td_tensor *t, td_err *err)
{
    return td_st_set_tensor(r->set, name, t, err);
}

static bool shape_is(const td_tensor *t, int ndim, int64_t a, int64_t b, int64_t c)
{
    if (t->ndim != ndim) return false;
    const int64_t want[3] = {a, b, c};
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return false;
    return true;
}

static void shape_text(const td_tensor *t, char *buf, size_t cap)
{
    td_shape_str(t->ndim, t->shape, buf, cap);
}

/* A linear module [rows, cols] under the scheme the metadata gives it. */
static td_status load_linear(ref_engine *r, const char *module, int64_t rows, int64_t cols, ref_linear *out,
                             td_err *err)
{
    td_quant_tensors q;
    td_status st = td_quant_resolve(&r->quant, module, true, &q, err);
    if (st) return st;
    td_tensor w, s, g;
    char have[96];
    switch (q.scheme) {
    case TD_SCHEME_NONE:
        st = get_tensor(r, q.weight, &w, err);
        if (st) return st;
        if (w.dtype != TD_BF16 && w.dtype != TD_F16 && w.dtype != TD_F32)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: dtype %s, expected BF16, F16 or F32 (unquantized module)",
                              q.weight, td_dtype_name(w.dtype));
        if (!shape_is(&w, 2, rows, cols, 0)) {
            shape_text(&w, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: shape %s, expected [%lld, %lld]", q.weight, have,
                              (long long)rows, (long long)cols);
        }
        ref_linear_dense(out, w.dtype, rows, cols, w.data);
        return TD_OK;
    case TD_SCHEME_NVFP4:
    case TD_SCHEME_NVFP4_CT:
        if (cols % TD_NVFP4_BLOCK)
            return td_err_set(err, TD_ERR_FORMAT, "module %s: %lld input features is not a multiple of 16 (NVFP4)",
                              module, (long long)cols);
        st = get_tensor(r, q.weight, &w, err);
        if (!st) st = get_tensor(r, q.scale, &s, err);
        if (!st) st = get_tensor(r, q.global, &g, err);
        if (st) return st;
        if (w.dtype != TD_U8 || !shape_is(&w, 2, rows, cols / 2, 0)) {
            shape_text(&w, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected U8 [%lld, %lld] (packed E2M1)",
                              q.weight, td_dtype_name(w.dtype), have, (long long)rows, (long long)(cols / 2));
        }
        if (s.dtype != TD_F8_E4M3 || !shape_is(&s, 2, rows, cols / TD_NVFP4_BLOCK, 0)) {
            shape_text(&s, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected F8_E4M3 [%lld, %lld] (block scales)",
                              q.scale, td_dtype_name(s.dtype), have, (long long)rows,
                              (long long)(cols / TD_NVFP4_BLOCK));
        }
        if (g.dtype != TD_F32 || td_tensor_numel(&g) != 1 || g.ndim > 1) {
            shape_text(&g, have, sizeof have);
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected an F32 scalar (global scale)",
                              q.global, td_dtype_name(g.dtype), have);
        }
        float gv;
        memcpy(&gv, g.data, sizeof gv);
        ref_linear_nvfp4(out, q.scheme == TD_SCHEME_NVFP4 ? TD_NVFP4_MODELOPT : TD_NVFP4_CT, rows, cols, w.data,
                         s.data, gv);
        return TD_OK;
    default:
        return td_err_set(err, TD_ERR_UNSUPPORTED, "module %s: scheme %s is not supported by the ref engine yet",
                          module, td_scheme_name(q.scheme));
    }
}

static td_status load_fused_experts(ref_engine *r, int64_t L, ref_layer *ly, td_err *err)
{
    const td_config *c = &r->cfg;
    char gu_name[128], dn_name[128];
    int64_t gu_shape[3], dn_shape[3];
    td_layout_fused_experts(c, r->prefix, L, gu_name, gu_shape, dn_name, dn_shape);
    td_tensor gu, dn;
    td_status st = get_tensor(r, gu_name, &gu, err);
    if (!st) st = get_tensor(r, dn_name, &dn, err);
    if (st) return st;
    char have[96];
    if ((gu.dtype != TD_BF16 && gu.dtype != TD_F16 && gu.dtype != TD_F32) ||
        !shape_is(&gu, 3, gu_shape[0], gu_shape[1], gu_shape[2])) {
        shape_text(&gu, have, sizeof have);
        return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected BF16/F16/F32 [%lld, %lld, %lld]", gu_name,
                          td_dtype_name(gu.dtype), have, (long long)gu_shape[0], (long long)gu_shape[1],
                          (long long)gu_shape[2]);
    }
    if (dn.dtype != gu.dtype || !shape_is(&dn, 3, dn_shape[0], dn_shape[1], dn_shape[2])) {
        shape_text(&dn, have, sizeof have);
        return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected %s [%lld, %lld, %lld]", dn_name,
                          td_dtype_name(dn.dtype), have, td_dtype_name(gu.dtype), (long long)dn_shape[0],
                          (long long)dn_shape[1], (long long)dn_shape[2]);
    }
    const int64_t E = c->num_experts, I = c->moe_intermediate_size, H = c->hidden_size;
    const int64_t es = gu.dtype == TD_F32 ? 4 : 2;
    const uint8_t *gub = gu.data, *dnb = dn.data;
    for (int64_t e = 0; e < E; e++) {
        const uint8_t *base = gub + e * 2 * I * H * es; /* [2I, H] of expert e: gate rows, then up */
        ref_linear_dense(&ly->experts[e].gate, gu.dtype, I, H, base);
        ref_linear_dense(&ly->experts[e].up, gu.dtype, I, H, base + I * H * es);
        ref_linear_dense(&ly->experts[e].down, dn.dtype, H, I, dnb + e * H * I * es);
    }
    return TD_OK;
}

static td_status load_layer(ref_engine *r, int64_t L, td_err *err)
{
    ref_layer *ly = &r->layers[L];
    if (ly->loaded) return TD_OK;
    const td_config *c = &r->cfg;
    if (!td_config_layer_is_moe(c, L) || c->num_experts < 1)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: layer %lld has no MoE block", r->dir, (long long)L);
    const int64_t E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    const int64_t Is = c->shared_expert_intermediate_size;
    ref_moe_weights *w = &ly->w;
    memset(w, 0, sizeof *w);
    w->hidden = H;
    w->n_experts = E;
    w->top_k = c->num_experts_per_tok;
    w->inter = I;
    w->norm_topk_prob = c->norm_topk_prob;
    if (!ly->experts) ly->experts = calloc((size_t)E, sizeof *ly->experts);
    if (!ly->experts) return td_err_set(err, TD_ERR_NOMEM, "ref: out of memory (layer %lld)", (long long)L);
    w->experts = ly->experts;
    char mod[256];
    td_status st;

    snprintf(mod, sizeof mod, "%slayers.%lld.mlp.gate", r->prefix, (long long)L);
    st = load_linear(r, mod, E, H, &w->router, err);
    if (st) goto fail;
    w->has_router = true;

    snprintf(mod, sizeof mod, "%slayers.%lld.mlp.experts.0.gate_proj", r->prefix, (long long)L);
    td_quant_tensors q0;
    st = td_quant_resolve(&r->quant, mod, true, &q0, err);
    if (st) goto fail;
    const char *probe = q0.weight;
    if (!td_st_set_has(r->set, probe)) {
        char gu_name[128], dn_name[128];
        int64_t s1[3], s2[3];
        td_layout_fused_experts(c, r->prefix, L, gu_name, s1, dn_name, s2);
        if (!td_st_set_has(r->set, gu_name)) {
            st = td_err_set(err, TD_ERR_NOTFOUND, "%s: layer %lld: neither %s nor %s is in the checkpoint", r->dir,
                            (long long)L, probe, gu_name);
            goto fail;
        }
        st = load_fused_experts(r, L, ly, err);
        if (st) goto fail;
    } else {
        static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int64_t e = 0; e < E; e++) {
            ref_linear *dst[3] = {&ly->experts[e].gate, &ly->experts[e].up, &ly->experts[e].down};
            for (int p = 0; p < 3; p++) {
                snprintf(mod, sizeof mod, "%slayers.%lld.mlp.experts.%lld.%s", r->prefix, (long long)L,
                         (long long)e, proj[p]);
                st = load_linear(r, mod, p < 2 ? I : H, p < 2 ? H : I, dst[p], err);
                if (st) goto fail;
            }
        }
    }

    if (Is > 0) {
        snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert_gate", r->prefix, (long long)L);
        st = load_linear(r, mod, 1, H, &w->shared_gate, err);
        static const char *const sproj[3] = {"gate_proj", "up_proj", "down_proj"};
        ref_linear *sdst[3] = {&w->shared.gate, &w->shared.up, &w->shared.down};
        for (int p = 0; p < 3 && !st; p++) {
            snprintf(mod, sizeof mod, "%slayers.%lld.mlp.shared_expert.%s", r->prefix, (long long)L, sproj[p]);
            st = load_linear(r, mod, p < 2 ? Is : H, p < 2 ? H : Is, sdst[p], err);
        }
        if (st) goto fail;
        w->has_shared = true;
        w->shared_inter = Is;
    }

    /* TP slices of this variant must be representable. */
    const int T = r->opts.tp_size;
    if (T > 1) {
        bool nv = ly->experts[0].down.kind == REF_W_NVFP4;
        if ((I / T) % TD_NVFP4_BLOCK && nv) {
            st = td_err_set(err, TD_ERR_RANGE,
                            "layer %lld: tp_size %d gives %lld intermediate columns per rank, not a multiple of "
                            "16 (NVFP4 blocks of the expert down projections)",
                            (long long)L, T, (long long)(I / T));
            goto fail;
        }
        if (w->has_shared && w->shared.down.kind == REF_W_NVFP4 && (Is / T) % TD_NVFP4_BLOCK) {
            st = td_err_set(err, TD_ERR_RANGE,
                            "layer %lld: tp_size %d gives %lld shared-expert columns per rank, not a multiple "
                            "of 16 (NVFP4 blocks of shared_expert.down_proj)",
                            (long long)L, T, (long long)(Is / T));
            goto fail;
        }
    }
    ly->loaded = true;
    return TD_OK;
fail:
    return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
}

/* ==== interface ============================================================================== */

static void ref_free(td_engine *base)
{
    ref_engine *r = (ref_engine *)base;
    if (r->layers) {
        for (int64_t l = 0; l < r->cfg.num_hidden_layers; l++) free(r->layers[l].experts);
        free(r->layers);
    }
    ref_moe_ws_free(&r->ws);
    ref_pool_free(r->pool);
    td_st_set_close(r->set);
    td_quant_free(&r->quant);
    free(r);
}

static td_status ref_load(const char *checkpoint, const td_variant *v, td_engine **out, td_err *err)
{
    *out = NULL;
    ref_engine *r = calloc(1, sizeof *r);
    if (!r) return td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory");
    snprintf(r->dir, sizeof r->dir, "%s", checkpoint);
    r->base.ops = &td_ref_engine_ops;
    td_status st = td_config_load(checkpoint, &r->cfg, err);
    if (!st) st = td_quant_load(checkpoint, &r->quant, err);
    if (!st) st = td_st_set_open(checkpoint, &r->set, err);
    if (st) goto fail;
    {
        size_t n = td_st_set_count(r->set);
        const char **names = malloc((n ? n : 1) * sizeof *names);
        if (!names) {
            st = td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < n; i++) names[i] = td_st_set_name(r->set, i);
        snprintf(r->prefix, sizeof r->prefix, "%s", td_layout_detect_prefix(n, names));
        free(names);
    }
    const td_config *c = &r->cfg;
    r->layers = calloc((size_t)c->num_hidden_layers, sizeof *r->layers);
    if (!r->layers) {
        st = td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory");
        goto fail;
    }
    td_engine_model *m = &r->base.model;
    m->family = c->family;
    m->hidden = c->hidden_size;
    m->layers = c->num_hidden_layers;
    m->num_experts = c->num_experts;
    m->top_k = c->num_experts_per_tok;
    m->moe_inter = c->moe_intermediate_size;
    m->shared_inter = c->shared_expert_intermediate_size;
    m->norm_topk_prob = c->norm_topk_prob;

    r->opts.nx.accum = v->accum;
    r->opts.nx.scale = v->scale;
    r->opts.nx.fault = v->fault;
    r->opts.act = v->act_dtype;
    r->opts.tp_size = v->tp_size;
    r->opts.tp_rank = v->tp_rank;
    if (v->tp_size > 1 && c->num_experts > 0 &&
        (c->moe_intermediate_size % v->tp_size || c->shared_expert_intermediate_size % v->tp_size)) {
        st = td_err_set(err, TD_ERR_ARG,
                        "engine ref: tp_size %d does not divide moe_intermediate_size %lld / "
                        "shared_expert_intermediate_size %lld of %s",
                        v->tp_size, (long long)c->moe_intermediate_size,
                        (long long)c->shared_expert_intermediate_size, checkpoint);
        goto fail;
    }
    st = ref_pool_new(v->threads, &r->pool, err);
    if (st) goto fail;
    *out = &r->base;
    return TD_OK;
fail:
    ref_free(&r->base);
    return st;
}

static td_status put_tap(td_engine *e, int64_t layer, const char *suffix, td_dtype dt, int ndim,
                         const int64_t *shape, const void *data, td_err *err)
{
    char name[TD_TAP_NAME_MAX];
    td_tap_name(name, sizeof name, layer, suffix);
    if (!td_taps_wants(e->taps, name)) return TD_OK;
    return td_taps_put(e->taps, name, dt, ndim, shape, data, err);
}

static td_status moe_taps(ref_engine *r, const td_block_call *c, td_err *err)
{
    td_engine *e = &r->base;
    const ref_moe_weights *w = &r->layers[c->layer].w;
    const int64_t M = c->n_tokens, L = c->layer, H = w->hidden, k = w->top_k;
    td_status st = TD_OK;
    if (r->ws.router_ran) {
        const int64_t s[2] = {M, w->n_experts};
        st = put_tap(e, L, "moe.router_logits", TD_F32, 2, s, r->ws.logits, err);
    }
    const int64_t sk[2] = {M, k};
    if (!st) st = put_tap(e, L, "moe.topk", TD_I32, 2, sk, r->ws.ids, err);
    if (!st) st = put_tap(e, L, "moe.topk_weights", TD_F32, 2, sk, r->ws.weights, err);
    if (r->opts.tp_rank != TD_TP_RANK_ALL) {
        const int64_t sa[3] = {M, k, w->inter / r->opts.tp_size}, so[3] = {M, k, H};
        if (!st) st = put_tap(e, L, "moe.expert_act", TD_F32, 3, sa, r->ws.act, err);
        if (!st) st = put_tap(e, L, "moe.expert_out", TD_F32, 3, so, r->ws.eout, err);
        const int64_t ss[2] = {M, H};
        if (!st && w->has_shared) st = put_tap(e, L, "moe.shared_out", TD_F32, 2, ss, r->ws.sh_out, err);
    }
    const int64_t sh[2] = {M, H};
    if (!st) st = put_tap(e, L, "moe.out", TD_F32, 2, sh, c->output, err);
    return st;
}

static td_status ref_run_block(td_engine *base, const td_block_call *c, td_err *err)
{
    ref_engine *r = (ref_engine *)base;
    if (c->block != TD_BLOCK_MOE && c->block != TD_BLOCK_ROUTER)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "engine ref: block '%s' is not implemented yet (it arrives with the full-model "
                          "reference); implemented: moe, router",
                          td_block_name(c->block));
    td_status st = load_layer(r, c->layer, err);
    if (st) return st;
    const ref_moe_weights *w = &r->layers[c->layer].w;
    st = ref_moe_ws_reserve(&r->ws, w, c->n_tokens, ref_pool_threads(r->pool), err);
    if (st) return st;
    if (c->block == TD_BLOCK_ROUTER) {
        st = ref_moe_router(w, &r->opts, r->pool, &r->ws, c->input, c->n_tokens, c->output, err);
        if (!st && base->taps) {
            const int64_t s[2] = {c->n_tokens, w->n_experts};
            st = put_tap(base, c->layer, "moe.router_logits", TD_F32, 2, s, c->output, err);
        }
    } else {
        st = ref_moe_run(w, &r->opts, r->pool, &r->ws, c->input, c->n_tokens, c->route_ids, c->route_weights,
                         c->output, err);
        if (!st && base->taps) st = moe_taps(r, c, err);
    }
    if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)c->layer);
    return TD_OK;
}

static td_status ref_prefill(td_engine *e, int64_t seq, const int32_t *tokens, int64_t n, float *logits,
                             td_err *err)
{
    (void)e;
    (void)seq;
    (void)tokens;
    (void)n;
    (void)logits;
    return td_err_set(err, TD_ERR_UNSUPPORTED,
                      "engine ref: prefill is not implemented yet (it arrives with the full-model reference); "
                      "per-layer audits use run_block");
}

static td_status ref_decode(td_engine *e, const td_decode_item *batch, int64_t n, float *logits, td_err *err)
{
    (void)e;
    (void)batch;
    (void)n;
    (void)logits;
    return td_err_set(err, TD_ERR_UNSUPPORTED,
                      "engine ref: decode is not implemented yet (it arrives with the full-model reference); "
                      "per-layer audits use run_block");
}

const td_engine_ops td_ref_engine_ops = {
    .name = "ref",
    .load = ref_load,
    .run_block = ref_run_block,
    .prefill = ref_prefill,
    .decode = ref_decode,
    .free = ref_free,
};
