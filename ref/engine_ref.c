/* engine_ref.c — the reference engine `ref`: loads a checkpoint's layers lazily and runs the
 * MoE block and the router (engine.h contract; numerics in linear.h and moe.h), and the whole
 * qwen3_next model: prefill and decode with per-sequence state (docs/ref-model.md; the blocks
 * in norm.h, rope.h, attn.h, gdn.h, moe.h).
 *
 * Model (MODEL_SPEC.md A3.7): h = embed[token]; per layer h += mixer(RMSNorm_zc(h)) (GDN or
 * gated attention), h += MoE(RMSNorm_zc(h)) (residual adds in float32); logits = lm_head
 * RMSNorm_zc(h) for the last token of the call. lm_head may be BF16/F16/F32 or NVFP4 (as the
 * quantization metadata says); the embedding is NVFP4 only when its block scales exist. Per sequence the engine keeps a KV cache per
 * attention layer (grown by doubling) and a conv state and FP32 recurrent state per GDN layer;
 * prefill of an existing id restarts it. Decode batches are processed item by item in order.
 * prefill/decode need an unsharded result (tp_size 1 or tp_rank=all; the mixers' output
 * projections and the MoE block reduce the emulated ranks in rank order); act_dtype rounds the
 * embedding, the mixer inputs and outputs, the residual stream after each add, the MoE points
 * and the final-norm output (docs/ref-model.md). `accum` applies to every linear
 * (attention/GDN internals stay float32). Taps: L{l}.attn.out or L{l}.gdn.out, the MoE taps,
 * L{l}.resid, final.hidden, logits (of the last token).
 *
 * run_block: moe and router (any family); attn and gdn (qwen3_next) on normed activations from
 * a fresh state (an engine-owned scratch KV cache / GDN state, reset per call).
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
#include "attn.h"
#include "gdn.h"
#include "layout.h"
#include "model_flash.h"
#include "wload.h"
#include "moe.h"
#include "norm.h"
#include "quant.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_layer {
    bool loaded;
    ref_moe_weights w;
    ref_expert *experts;        /* [E] whole (TP1) views */
    /* the rest of the layer (loaded on the first prefill/decode that reaches it) */
    bool mixer_loaded;
    td_layer_type type;
    ref_attn_weights attn;
    ref_gdn_weights gdn;
    float *vecs;                /* owned: decoded norm weights, conv weights, A_log, dt_bias */
    const float *in_norm, *post_norm;
} ref_layer;

/* Decode state of one sequence (MODEL_SPEC.md A4). */
typedef struct ref_seq {
    int64_t id;
    bool used;
    ref_kv *kv;                 /* [layers] (attention layers) */
    ref_gdn_state *gdn;         /* [layers] (GDN layers) */
    ref_flash_seq *fs;          /* qwen4_exp: the whole state (model_flash.h) */
} ref_seq;

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
    /* full model */
    bool globals_loaded;
    ref_linear embed, lm_head;
    float *final_norm;
    ref_attn_dims ad;
    ref_gdn_dims gd;
    ref_attn_ws aws;
    ref_gdn_ws gws;
    ref_mm_ws mmws;
    ref_rowpar rp;              /* TP split and act_dtype of the mixers' output projections */
    ref_kv blk_kv;              /* run_block: the attention block's fresh cache (reset per call) */
    ref_gdn_state blk_gdn;      /* run_block: the GDN block's fresh state (zeroed per call) */
    bool blk_gdn_ready;
    ref_seq *seqs;
    int64_t n_seqs, cap_seqs;
    float *h, *xn, *tmp;
    int64_t cap_h, cap_xn, cap_tmp;
    ref_flash *flash;           /* qwen4_exp whole model (model_flash.h), NULL otherwise */
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

/* A linear module [rows, cols] under the scheme the metadata gives it (core/modview.h). */
static td_status load_linear(ref_engine *r, const char *module, int64_t rows, int64_t cols, ref_linear *out,
                             td_err *err)
{
    return ref_wload_linear(r->set, &r->quant, module, rows, cols, out, err);
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

static void seq_release(ref_engine *r, ref_seq *s);

/* ==== interface ============================================================================== */

static void ref_free(td_engine *base)
{
    ref_engine *r = (ref_engine *)base;
    for (int64_t i = 0; i < r->n_seqs; i++) seq_release(r, &r->seqs[i]);
    free(r->seqs);
    ref_flash_free(r->flash);
    if (r->layers) {
        for (int64_t l = 0; l < r->cfg.num_hidden_layers; l++) {
            free(r->layers[l].experts);
            free(r->layers[l].vecs);
        }
        free(r->layers);
    }
    free(r->final_norm);
    free(r->h);
    free(r->xn);
    free(r->tmp);
    ref_kv_free(&r->blk_kv);
    ref_gdn_state_free(&r->blk_gdn);
    ref_attn_ws_free(&r->aws);
    ref_gdn_ws_free(&r->gws);
    ref_mm_free(&r->mmws);
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
    snprintf(r->prefix, sizeof r->prefix, "%s", td_layout_set_prefix(r->set));
    const td_config *c = &r->cfg;
    r->layers = calloc((size_t)c->num_hidden_layers, sizeof *r->layers);
    if (!r->layers) {
        st = td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory");
        goto fail;
    }
    td_engine_model_from_config(c, &r->base.model);

    r->opts.nx.accum = v->accum;
    r->opts.nx.scale = v->scale;
    r->opts.nx.fault = v->fault;
    r->opts.act = v->act_dtype;
    r->opts.tp_size = v->tp_size;
    r->opts.tp_rank = v->tp_rank;
    r->rp = (ref_rowpar){.tp_size = v->tp_size, .tp_rank = v->tp_rank, .act = v->act_dtype};
    if ((st = td_engine_check_tp(c, v->tp_size, "ref", checkpoint, err))) goto fail;
    r->ad = (ref_attn_dims){.hidden = c->hidden_size, .heads = c->num_attention_heads,
                            .kv_heads = c->num_key_value_heads, .head_dim = c->head_dim,
                            .rot = td_config_rotary_dim(c), .theta = c->rope_theta, .eps = (float)c->rms_norm_eps};
    r->gd = (ref_gdn_dims){.hidden = c->hidden_size, .nk = c->linear_num_key_heads, .nv = c->linear_num_value_heads,
                           .dk = c->linear_key_head_dim, .dv = c->linear_value_head_dim,
                           .kconv = c->linear_conv_kernel_dim, .eps = (float)c->rms_norm_eps};
    st = ref_pool_new(v->threads, &r->pool, err);
    if (!st && c->family == TD_FAMILY_QWEN4_EXP)
        st = ref_flash_new(c, r->set, &r->quant, r->prefix, &r->opts.nx, r->pool, &r->flash, err);
    if (st) goto fail;
    *out = &r->base;
    return TD_OK;
fail:
    ref_free(&r->base);
    return st;
}

static td_status moe_taps(ref_engine *r, const td_block_call *c, td_err *err)
{
    td_engine *e = &r->base;
    const ref_moe_weights *w = &r->layers[c->layer].w;
    const int64_t M = c->n_tokens, L = c->layer, H = w->hidden, k = w->top_k;
    td_status st = TD_OK;
    const bool route_taps = r->opts.nx.fault != TD_FAULT_NO_ROUTE_TAPS;
    if (r->ws.router_ran && route_taps) {
        const int64_t s[2] = {M, w->n_experts};
        st = td_engine_put_tap(e, L, "moe.router_logits", TD_F32, 2, s, r->ws.logits, err);
    }
    const int64_t sk[2] = {M, k};
    if (!st && route_taps) st = td_engine_put_tap(e, L, "moe.topk", TD_I32, 2, sk, r->ws.ids, err);
    if (!st) st = td_engine_put_tap(e, L, "moe.topk_weights", TD_F32, 2, sk, r->ws.weights, err);
    if (r->opts.tp_rank != TD_TP_RANK_ALL) {
        const int64_t sa[3] = {M, k, w->inter / r->opts.tp_size}, so[3] = {M, k, H};
        if (!st) st = td_engine_put_tap(e, L, "moe.expert_act", TD_F32, 3, sa, r->ws.act, err);
        if (!st) st = td_engine_put_tap(e, L, "moe.expert_out", TD_F32, 3, so, r->ws.eout, err);
        const int64_t ss[2] = {M, H};
        if (!st && w->has_shared) st = td_engine_put_tap(e, L, "moe.shared_out", TD_F32, 2, ss, r->ws.sh_out, err);
    }
    const int64_t sh[2] = {M, H};
    if (!st) st = td_engine_put_tap(e, L, "moe.out", TD_F32, 2, sh, c->output, err);
    return st;
}

/* ==== the full model (qwen3_next) ============================================================ */

/* A BF16/F16/F32 tensor of `numel` elements decoded into dst (float32, exact). */
static td_status load_vec(ref_engine *r, const char *name, int64_t numel, float *dst, td_err *err)
{
    return ref_wload_vec(r->set, &r->opts.nx, name, numel, dst, err);
}

static td_status load_globals(ref_engine *r, td_err *err)
{
    if (r->globals_loaded) return TD_OK;
    const td_config *c = &r->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    char name[256];
    /* The embedding is an Embedding module, which quantization recipes leave in BF16 even when
     * their exclusion lists do not name it: it is NVFP4 only when its block scales exist. */
    char wname[300], sname[300];
    snprintf(name, sizeof name, "%sembed_tokens", r->prefix);
    snprintf(wname, sizeof wname, "%s.weight", name);
    snprintf(sname, sizeof sname, "%s.weight_scale", name);
    td_status st = TD_OK;
    if (td_st_set_has(r->set, sname)) {
        st = load_linear(r, name, V, H, &r->embed, err);
    } else {
        td_tensor t;
        st = get_tensor(r, wname, &t, err);
        if (!st && ((t.dtype != TD_BF16 && t.dtype != TD_F16 && t.dtype != TD_F32) || !shape_is(&t, 2, V, H, 0))) {
            char have[96];
            shape_text(&t, have, sizeof have);
            st = td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s %s, expected BF16/F16/F32 [%lld, %lld]", wname,
                            td_dtype_name(t.dtype), have, (long long)V, (long long)H);
        }
        if (!st) ref_linear_dense(&r->embed, t.dtype, V, H, t.data);
    }
    if (!st && !r->final_norm) {
        r->final_norm = malloc((size_t)H * sizeof *r->final_norm);
        if (!r->final_norm) st = td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory");
    }
    if (!st) {
        snprintf(name, sizeof name, "%snorm.weight", r->prefix);
        st = load_vec(r, name, H, r->final_norm, err);
    }
    if (!st) {
        if (c->tie_word_embeddings) r->lm_head = r->embed;
        else st = load_linear(r, "lm_head", V, H, &r->lm_head, err);
    }
    if (st) return td_err_prefix(err, "engine ref: ");
    r->globals_loaded = true;
    return TD_OK;
}

static td_status load_mixer(ref_engine *r, int64_t L, td_err *err)
{
    ref_layer *ly = &r->layers[L];
    if (ly->mixer_loaded) return TD_OK;
    const td_config *c = &r->cfg;
    const int64_t H = c->hidden_size;
    char mod[256];
    td_status st;
    ly->type = c->layer_types[L];
    const int64_t C = ref_gdn_channels(&r->gd), K = r->gd.kconv, nv = r->gd.nv, dv = r->gd.dv;
    const int64_t hd = r->ad.head_dim;
    const int64_t nvec = ly->type == TD_LAYER_GDN ? 2 * H + C * K + 2 * nv + dv : 2 * H + 2 * hd;
    free(ly->vecs);
    ly->vecs = malloc((size_t)nvec * sizeof *ly->vecs);
    if (!ly->vecs) return td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory (layer %lld)", (long long)L);
    float *v = ly->vecs;
    const td_quant *q = &r->quant;
    const ref_numerics *nx = &r->opts.nx;
    snprintf(mod, sizeof mod, "%slayers.%lld.", r->prefix, (long long)L);
    st = ref_wload_vec_at(r->set, nx, mod, "input_layernorm.weight", H, &v, &ly->in_norm, TD_OK, err);
    st = ref_wload_vec_at(r->set, nx, mod, "post_attention_layernorm.weight", H, &v, &ly->post_norm, st, err);
    if (ly->type == TD_LAYER_GDN) {
        ref_gdn_weights *g = &ly->gdn;
        const int64_t nk = r->gd.nk, dk = r->gd.dk;
        snprintf(mod, sizeof mod, "%slayers.%lld.linear_attn.", r->prefix, (long long)L);
        st = ref_wload_linear_at(r->set, q, mod, "in_proj_qkvz", 2 * nk * dk + 2 * nv * dv, H, &g->qkvz, st, err);
        st = ref_wload_linear_at(r->set, q, mod, "in_proj_ba", 2 * nv, H, &g->ba, st, err);
        st = ref_wload_linear_at(r->set, q, mod, "out_proj", H, nv * dv, &g->out, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "conv1d.weight", C * K, &v, &g->conv_w, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "A_log", nv, &v, &g->A_log, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "dt_bias", nv, &v, &g->dt_bias, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "norm.weight", dv, &v, &g->norm_w, st, err);
    } else {
        ref_attn_weights *a = &ly->attn;
        const int64_t nh = r->ad.heads, kvh = r->ad.kv_heads;
        snprintf(mod, sizeof mod, "%slayers.%lld.self_attn.", r->prefix, (long long)L);
        st = ref_wload_linear_at(r->set, q, mod, "q_proj", 2 * nh * hd, H, &a->q, st, err);
        st = ref_wload_linear_at(r->set, q, mod, "k_proj", kvh * hd, H, &a->k, st, err);
        st = ref_wload_linear_at(r->set, q, mod, "v_proj", kvh * hd, H, &a->v, st, err);
        st = ref_wload_linear_at(r->set, q, mod, "o_proj", H, nh * hd, &a->o, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "q_norm.weight", hd, &v, &a->q_norm, st, err);
        st = ref_wload_vec_at(r->set, nx, mod, "k_norm.weight", hd, &v, &a->k_norm, st, err);
    }
    if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
    ly->mixer_loaded = true;
    return TD_OK;
}

/* Why this engine cannot run the whole model (NULL when it can). */
static td_status model_supported(ref_engine *r, td_err *err)
{
    const td_config *c = &r->cfg;
    if (c->family != TD_FAMILY_QWEN3_NEXT && !r->flash)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: prefill/decode support model_types qwen3_next and "
                          "qwen4_exp only (%s is %s)", r->dir, td_family_name(c->family));
    if (r->flash && (r->opts.act != TD_ACT_FP32 || r->opts.tp_size > 1))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: qwen4_exp prefill/decode run with act_dtype=fp32 and "
                          "tp_size=1 only (this variant: act_dtype=%s, tp_size=%d)", td_act_dtype_name(r->opts.act),
                          r->opts.tp_size);
    if (c->n_layers_present > 0)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: %s holds a subset of the layers "
                          "(tandem_layers_present); prefill/decode need every layer", r->dir);
    if (r->opts.tp_size > 1 && r->opts.tp_rank != TD_TP_RANK_ALL)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: prefill/decode need tp_rank=all with tp_size %d "
                          "(tp_rank=%d is one rank's partial sums, not a model; run_block computes single ranks)",
                          r->opts.tp_size, r->opts.tp_rank);
    for (int64_t L = 0; L < c->num_hidden_layers; L++)
        if (!td_config_layer_is_moe(c, L) || c->num_experts < 1)
            return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: layer %lld has a dense MLP, which the "
                              "reference does not implement", (long long)L);
    return TD_OK;
}

static void seq_release(ref_engine *r, ref_seq *s)
{
    if (s->kv)
        for (int64_t L = 0; L < r->cfg.num_hidden_layers; L++) ref_kv_free(&s->kv[L]);
    if (s->gdn)
        for (int64_t L = 0; L < r->cfg.num_hidden_layers; L++) ref_gdn_state_free(&s->gdn[L]);
    free(s->kv);
    free(s->gdn);
    ref_flash_seq_free(r->flash, s->fs);
    *s = (ref_seq){0};
}

static ref_seq *seq_find(ref_engine *r, int64_t id)
{
    for (int64_t i = 0; i < r->n_seqs; i++)
        if (r->seqs[i].used && r->seqs[i].id == id) return &r->seqs[i];
    return NULL;
}

/* A fresh (zero) state for sequence `id`; an existing one of that id is replaced. */
static td_status seq_new(ref_engine *r, int64_t id, ref_seq **out, td_err *err)
{
    ref_seq *s = seq_find(r, id);
    if (s) seq_release(r, s);
    for (int64_t i = 0; !s && i < r->n_seqs; i++)
        if (!r->seqs[i].used) s = &r->seqs[i];
    if (!s) {
        if (r->n_seqs == r->cap_seqs) {
            int64_t cap = r->cap_seqs ? 2 * r->cap_seqs : 8;
            ref_seq *p = realloc(r->seqs, (size_t)cap * sizeof *p);
            if (!p) return td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory (sequences)");
            r->seqs = p;
            r->cap_seqs = cap;
        }
        s = &r->seqs[r->n_seqs++];
        *s = (ref_seq){0};
    }
    const int64_t NL = r->cfg.num_hidden_layers;
    if (r->flash) {
        td_status st = ref_flash_seq_new(r->flash, &s->fs, err);
        if (st) return st;
        s->id = id;
        s->used = true;
        *out = s;
        return TD_OK;
    }
    s->kv = calloc((size_t)NL, sizeof *s->kv);
    s->gdn = calloc((size_t)NL, sizeof *s->gdn);
    if (!s->kv || !s->gdn) {
        seq_release(r, s);
        return td_err_set(err, TD_ERR_NOMEM, "engine ref: out of memory (sequence %lld)", (long long)id);
    }
    for (int64_t L = 0; L < NL; L++)
        if (r->cfg.layer_types[L] == TD_LAYER_GDN) {
            td_status st = ref_gdn_state_init(&s->gdn[L], &r->gd, err);
            if (st) {
                seq_release(r, s);
                return st;
            }
        }
    s->id = id;
    s->used = true;
    *out = s;
    return TD_OK;
}

/* h = round_act(h + d): the residual add (rounding point: residual stream). */
static void add_rows(float *h, const float *d, int64_t n, td_act_dtype act)
{
    for (int64_t i = 0; i < n; i++) h[i] = ref_round_act(h[i] + d[i], act);
}

static void round_rows(float *x, int64_t n, td_act_dtype act)
{
    if (act == TD_ACT_FP32) return;
    for (int64_t i = 0; i < n; i++) x[i] = ref_round_act(x[i], act);
}

/* The MoE block of layer L on x [m, H] (qwen4_exp forward's callback). */
static td_status flash_moe(void *ctx, int64_t L, const float *x, int64_t m, float *out, td_err *err)
{
    ref_engine *r = ctx;
    td_status st = load_layer(r, L, err);
    if (st) return st;
    const ref_layer *ly = &r->layers[L];
    st = ref_moe_ws_reserve(&r->ws, &ly->w, m, ref_pool_threads(r->pool), err);
    if (!st) st = ref_moe_run(&ly->w, &r->opts, r->pool, &r->ws, x, m, NULL, NULL, out, err);
    if (!st && r->base.taps) {
        const td_block_call bc = {.layer = L, .block = TD_BLOCK_MOE, .n_tokens = m, .input = x, .output = out};
        st = moe_taps(r, &bc, err);
    }
    return st;
}

/* Run m tokens of sequence s through the model; logits [V] of the last token. */
static td_status forward(ref_engine *r, ref_seq *s, const int32_t *tokens, int64_t m, float *logits, td_err *err)
{
    td_engine *e = &r->base;
    if (r->flash) return ref_flash_forward(r->flash, e, s->fs, tokens, m, flash_moe, r, logits, err);
    const td_config *c = &r->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size, NL = c->num_hidden_layers;
    const float eps = (float)c->rms_norm_eps;
    td_status st = load_globals(r, err);
    if (!st) st = ref_grow(&r->h, &r->cap_h, m * H, err);
    if (!st) st = ref_grow(&r->xn, &r->cap_xn, m * H, err);
    if (!st) st = ref_grow(&r->tmp, &r->cap_tmp, m * H, err);
    if (!st) st = ref_mm_reserve(&r->mmws, ref_pool_threads(r->pool), 1, H, err);
    if (st) return st;
    for (int64_t t = 0; t < m; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return td_err_set(err, TD_ERR_RANGE, "engine ref: token %lld of the call is %d, outside the vocabulary "
                              "[0, %lld)", (long long)t, tokens[t], (long long)V);
        ref_linear_decode_row(&r->embed, &r->opts.nx, tokens[t], r->h + t * H);
    }
    const td_act_dtype act = r->opts.act;
    round_rows(r->h, m * H, act);
    const int64_t sh[2] = {m, H};
    for (int64_t L = 0; L < NL; L++) {
        st = load_mixer(r, L, err);
        if (!st) st = load_layer(r, L, err);
        if (st) return st;
        const ref_layer *ly = &r->layers[L];
        for (int64_t t = 0; t < m; t++) ref_rmsnorm_zc(r->h + t * H, H, ly->in_norm, eps, r->xn + t * H);
        round_rows(r->xn, m * H, act);
        if (ly->type == TD_LAYER_GDN) {
            st = ref_gdn_run(&ly->gdn, &r->gd, &r->opts.nx, &r->rp, r->pool, &r->gws, &s->gdn[L], r->xn, m, r->tmp,
                             err);
            if (!st) st = td_engine_put_tap(e, L, "gdn.out", TD_F32, 2, sh, r->tmp, err);
        } else {
            st = ref_attn_run(&ly->attn, &r->ad, &r->opts.nx, &r->rp, r->pool, &r->aws, &s->kv[L], r->xn, m, r->tmp,
                              err);
            if (!st) st = td_engine_put_tap(e, L, "attn.out", TD_F32, 2, sh, r->tmp, err);
        }
        if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
        add_rows(r->h, r->tmp, m * H, act);
        for (int64_t t = 0; t < m; t++) ref_rmsnorm_zc(r->h + t * H, H, ly->post_norm, eps, r->xn + t * H);
        st = ref_moe_ws_reserve(&r->ws, &ly->w, m, ref_pool_threads(r->pool), err);
        if (!st) st = ref_moe_run(&ly->w, &r->opts, r->pool, &r->ws, r->xn, m, NULL, NULL, r->tmp, err);
        if (!st && e->taps) {
            const td_block_call bc = {.layer = L, .block = TD_BLOCK_MOE, .n_tokens = m, .input = r->xn,
                                      .output = r->tmp};
            st = moe_taps(r, &bc, err);
        }
        if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
        add_rows(r->h, r->tmp, m * H, act);
        st = td_engine_put_tap(e, L, "resid", TD_F32, 2, sh, r->h, err);
        if (st) return st;
    }
    for (int64_t t = 0; t < m; t++) ref_rmsnorm_zc(r->h + t * H, H, r->final_norm, eps, r->xn + t * H);
    round_rows(r->xn, m * H, act);
    st = td_engine_put_tap(e, -1, "final.hidden", TD_F32, 2, sh, r->xn, err);
    if (st) return st;
    ref_mm(&r->lm_head, &r->opts.nx, r->pool, &r->mmws, r->xn + (m - 1) * H, H, 1, logits, V);
    const int64_t sl[2] = {1, V};
    return td_engine_put_tap(e, -1, "logits", TD_F32, 2, sl, logits, err);
}

/* A token-mixer block (attention or GDN) of one layer on caller-given normed activations, from
 * a fresh (empty) state: a prefill of n_tokens of a new sequence. */
static td_status mixer_block(ref_engine *r, const td_block_call *c, td_err *err)
{
    const td_config *cf = &r->cfg;
    const int64_t L = c->layer, M = c->n_tokens, H = cf->hidden_size;
    const bool want_gdn = c->block == TD_BLOCK_GDN;
    if (cf->family != TD_FAMILY_QWEN3_NEXT)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "engine ref: block '%s' is implemented for model_type qwen3_next "
                          "only (%s is %s)", td_block_name(c->block), r->dir, td_family_name(cf->family));
    const td_layer_type ty = cf->layer_types[L];
    if ((ty == TD_LAYER_GDN) != want_gdn)
        return td_err_set(err, TD_ERR_ARG, "engine ref: layer %lld is a %s layer: block '%s' needs a %s layer",
                          (long long)L, ty == TD_LAYER_GDN ? "linear_attention (GDN)" : "full_attention",
                          td_block_name(c->block), want_gdn ? "linear_attention (GDN)" : "full_attention");
    td_status st = load_mixer(r, L, err);
    if (!st) st = ref_grow(&r->xn, &r->cap_xn, M * H, err);
    if (st) return st;
    for (int64_t i = 0; i < M * H; i++) r->xn[i] = ref_round_act(c->input[i], r->opts.act);
    const ref_layer *ly = &r->layers[L];
    const int64_t sh[2] = {M, H};
    if (want_gdn) {
        if (!r->blk_gdn_ready) {
            st = ref_gdn_state_init(&r->blk_gdn, &r->gd, err);
            if (st) return st;
            r->blk_gdn_ready = true;
        } else {
            ref_gdn_state_reset(&r->blk_gdn, &r->gd);
        }
        st = ref_gdn_run(&ly->gdn, &r->gd, &r->opts.nx, &r->rp, r->pool, &r->gws, &r->blk_gdn, r->xn, M, c->output,
                         err);
        if (!st) st = td_engine_put_tap(&r->base, L, "gdn.out", TD_F32, 2, sh, c->output, err);
    } else {
        r->blk_kv.len = 0;
        st = ref_attn_run(&ly->attn, &r->ad, &r->opts.nx, &r->rp, r->pool, &r->aws, &r->blk_kv, r->xn, M, c->output,
                          err);
        if (!st) st = td_engine_put_tap(&r->base, L, "attn.out", TD_F32, 2, sh, c->output, err);
    }
    if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
    return TD_OK;
}

static td_status ref_run_block(td_engine *base, const td_block_call *c, td_err *err)
{
    ref_engine *r = (ref_engine *)base;
    if (c->block == TD_BLOCK_ATTN || c->block == TD_BLOCK_GDN) return mixer_block(r, c, err);
    if (c->block != TD_BLOCK_MOE && c->block != TD_BLOCK_ROUTER)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "engine ref: block '%s' is not implemented (qwen4_exp blocks arrive with its "
                          "full-model issue); implemented: moe, router, attn, gdn",
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
            st = td_engine_put_tap(base, c->layer, "moe.router_logits", TD_F32, 2, s, c->output, err);
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
    ref_engine *r = (ref_engine *)e;
    td_status st = model_supported(r, err);
    if (st) return st;
    ref_seq *s = NULL;
    st = seq_new(r, seq, &s, err);
    if (st) return st;
    st = forward(r, s, tokens, n, logits, err);
    if (st) {
        seq_release(r, s); /* a failed prefill leaves no half-built sequence */
        return td_err_prefix(err, "sequence %lld: ", (long long)seq);
    }
    return TD_OK;
}

static td_status ref_decode(td_engine *e, const td_decode_item *batch, int64_t n, float *logits, td_err *err)
{
    ref_engine *r = (ref_engine *)e;
    td_status st = model_supported(r, err);
    if (st) return st;
    const int64_t V = r->cfg.vocab_size;
    for (int64_t i = 0; i < n; i++) {
        ref_seq *s = seq_find(r, batch[i].seq);
        if (!s)
            return td_err_set(err, TD_ERR_ARG, "engine ref: decode item %lld: sequence %lld was never prefilled",
                              (long long)i, (long long)batch[i].seq);
        st = forward(r, s, &batch[i].token, 1, logits + i * V, err);
        if (st) return td_err_prefix(err, "decode item %lld (sequence %lld): ", (long long)i, (long long)batch[i].seq);
    }
    return TD_OK;
}

const td_engine_ops td_ref_engine_ops = {
    .name = "ref",
    .load = ref_load,
    .run_block = ref_run_block,
    .prefill = ref_prefill,
    .decode = ref_decode,
    .free = ref_free,
};
