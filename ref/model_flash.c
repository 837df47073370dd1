/* model_flash.c — qwen4_exp whole-model forward for the ref engine (see model_flash.h). */
#include "model_flash.h"
#include "gdn.h"
#include "hc.h"
#include "layout.h"
#include "ple.h"
#include "qsa.h"
#include "wload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct flayer {
    bool loaded;
    td_layer_type type;
    ref_hc_weights hca, hcm;
    ref_gdn_weights gdn;
    ref_qsa_weights qsa;
    bool has_ple;
    ref_ple_weights ple;
    const uint8_t **shards;
    float *vecs;
} flayer;

struct ref_flash_seq {
    ref_gdn_state *gdn;
    ref_qsa_cache *qsa;
    ref_ple_state *ple;
};

struct ref_flash {
    const td_config *cfg;
    td_st_set *set;
    const td_quant *quant;
    char prefix[64];
    const ref_numerics *nx;
    ref_pool *pool;
    bool globals;
    ref_linear embed, lm_head;
    ref_hc_weights mixer;
    float *mixer_norm;
    flayer *layers;
    ref_hc_dims hd;
    ref_gdn_dims gd;
    ref_qsa_dims qd;
    ref_ple_dims pd;
    ref_hc_ws hws;
    ref_gdn_ws gws;
    ref_qsa_ws qws;
    ref_ple_ws pws;
    ref_mm_ws mmws;
    float *X, *xin, *y, *inj, *pout;
    int64_t cap_X, cap_xin, cap_y, cap_inj, cap_pout, cap_sel;
    int32_t *sel;
};

td_status ref_flash_new(const td_config *c, td_st_set *set, const td_quant *quant, const char *prefix,
                        const ref_numerics *nx, ref_pool *pool, ref_flash **out, td_err *err)
{
    *out = NULL;
    if (c->family != TD_FAMILY_QWEN4_EXP)
        return td_err_set(err, TD_ERR_ARG, "ref flash: model_type %s is not qwen4_exp", td_family_name(c->family));
    if (c->indexer_kv_heads != 1)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ref flash: indexer_kv_heads %lld (only 1 is implemented)",
                          (long long)c->indexer_kv_heads);
    if (c->ngram_size > REF_PLE_MAX_NGRAM)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ref flash: ngram_size %lld > %d", (long long)c->ngram_size,
                          REF_PLE_MAX_NGRAM);
    if (c->indexer_budget % c->indexer_compress_ratio)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ref flash: indexer_budget %lld is not a multiple of the "
                          "compress ratio %lld", (long long)c->indexer_budget, (long long)c->indexer_compress_ratio);
    if (td_config_rotary_dim(c) > c->indexer_head_dim)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ref flash: rotary dim %lld exceeds indexer_head_dim %lld",
                          (long long)td_config_rotary_dim(c), (long long)c->indexer_head_dim);
    ref_flash *f = calloc(1, sizeof *f);
    if (!f) return td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory");
    f->layers = calloc((size_t)c->num_hidden_layers, sizeof *f->layers);
    if (!f->layers) {
        free(f);
        return td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory");
    }
    f->cfg = c;
    f->set = set;
    f->quant = quant;
    snprintf(f->prefix, sizeof f->prefix, "%s", prefix);
    f->nx = nx;
    f->pool = pool;
    const float eps = (float)c->rms_norm_eps;
    f->hd = (ref_hc_dims){c->hidden_size, c->hc_count, c->hc_lowrank, eps};
    f->gd = (ref_gdn_dims){.hidden = c->hidden_size, .nk = c->linear_num_key_heads, .nv = c->linear_num_value_heads,
                           .dk = c->linear_key_head_dim, .dv = c->linear_value_head_dim,
                           .kconv = c->linear_conv_kernel_dim, .eps = eps, .split = true,
                           .sigmoid_gate = !strcmp(c->output_gate_type, "sigmoid")};
    f->qd = (ref_qsa_dims){.a = {.hidden = c->hidden_size, .heads = c->num_attention_heads,
                                 .kv_heads = c->num_key_value_heads, .head_dim = c->head_dim,
                                 .rot = td_config_rotary_dim(c), .theta = c->rope_theta, .eps = eps},
                           .idx_heads = c->indexer_n_heads, .idx_dim = c->indexer_head_dim,
                           .block = c->indexer_compress_ratio,
                           .topk = c->indexer_budget / c->indexer_compress_ratio};
    const int64_t heads = (c->ngram_size - 1) * c->heads_per_ngram;
    f->pd = (ref_ple_dims){.hidden = c->hidden_size, .hc = c->hc_count, .embed_dim = c->ple_embed_dim,
                           .ngram = c->ngram_size, .heads_per_ngram = c->heads_per_ngram, .heads = heads,
                           .head_dim = c->ple_embed_dim / heads, .kconv = c->ple_conv_kernel_size,
                           .dilation = 3, .eos = c->eos_token_id, .vocab = c->vocab_size, .eps = eps};
    *out = f;
    return TD_OK;
}

void ref_flash_free(ref_flash *f)
{
    if (!f) return;
    for (int64_t L = 0; L < f->cfg->num_hidden_layers; L++) {
        free(f->layers[L].vecs);
        free((void *)f->layers[L].shards);
    }
    free(f->layers);
    free(f->mixer_norm);
    ref_hc_ws_free(&f->hws);
    ref_gdn_ws_free(&f->gws);
    ref_qsa_ws_free(&f->qws);
    ref_ple_ws_free(&f->pws);
    ref_mm_free(&f->mmws);
    free(f->X);
    free(f->xin);
    free(f->y);
    free(f->inj);
    free(f->pout);
    free(f->sel);
    free(f);
}

td_status ref_flash_seq_new(ref_flash *f, ref_flash_seq **out, td_err *err)
{
    const td_config *c = f->cfg;
    const int64_t NL = c->num_hidden_layers;
    ref_flash_seq *s = calloc(1, sizeof *s);
    if (s) {
        s->gdn = calloc((size_t)NL, sizeof *s->gdn);
        s->qsa = calloc((size_t)NL, sizeof *s->qsa);
        s->ple = calloc((size_t)NL, sizeof *s->ple);
    }
    *out = s;
    if (!s || !s->gdn || !s->qsa || !s->ple) {
        ref_flash_seq_free(f, s);
        *out = NULL;
        return td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory (sequence)");
    }
    td_status st = TD_OK;
    for (int64_t L = 0; L < NL && !st; L++) {
        if (c->layer_types[L] == TD_LAYER_GDN) st = ref_gdn_state_init(&s->gdn[L], &f->gd, err);
        if (!st && td_config_layer_has_ple(c, L)) st = ref_ple_state_init(&s->ple[L], &f->pd, err);
    }
    if (st) {
        ref_flash_seq_free(f, s);
        *out = NULL;
    }
    return st;
}

void ref_flash_seq_free(ref_flash *f, ref_flash_seq *s)
{
    if (!s) return;
    for (int64_t L = 0; L < f->cfg->num_hidden_layers; L++) {
        if (s->gdn) ref_gdn_state_free(&s->gdn[L]);
        if (s->qsa) ref_qsa_cache_free(&s->qsa[L]);
        if (s->ple) ref_ple_state_free(&s->ple[L]);
    }
    free(s->gdn);
    free(s->qsa);
    free(s->ple);
    free(s);
}

/* ==== loading ================================================================================ */

static td_status load_hc(ref_flash *f, const char *base, bool inject, ref_hc_weights *w, float *norm, td_err *err)
{
    const int64_t P = f->hd.hc * f->hd.hidden, r = f->hd.rank;
    char name[300];
    snprintf(name, sizeof name, "%s.hc_norm.weight", base);
    td_status st = ref_wload_vec(f->set, f->nx, name, P, norm, err);
    w->norm = norm;
    snprintf(name, sizeof name, "%s.input_mix_weight_down", base);
    if (!st) st = ref_wload_linear(f->set, f->quant, name, r, P, &w->down, err);
    snprintf(name, sizeof name, "%s.input_mix_weight_up", base);
    if (!st) st = ref_wload_linear(f->set, f->quant, name, P, r, &w->up, err);
    w->has_inject = inject;
    snprintf(name, sizeof name, "%s.block_inject_weight", base);
    if (!st && inject) st = ref_wload_linear(f->set, f->quant, name, f->hd.hc, P, &w->inject, err);
    return st;
}

static td_status load_globals(ref_flash *f, td_err *err)
{
    if (f->globals) return TD_OK;
    const td_config *c = f->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size, P = f->hd.hc * H;
    char name[256], wname[300], sname[300];
    snprintf(name, sizeof name, "%sembed_tokens", f->prefix);
    snprintf(wname, sizeof wname, "%s.weight", name);
    snprintf(sname, sizeof sname, "%s.weight_scale", name);
    td_status st = TD_OK;
    if (td_st_set_has(f->set, sname)) {
        st = ref_wload_linear(f->set, f->quant, name, V, H, &f->embed, err);
    } else {
        td_tensor t;
        st = td_st_set_tensor(f->set, wname, &t, err);
        if (!st && ((t.dtype != TD_BF16 && t.dtype != TD_F16 && t.dtype != TD_F32) || t.ndim != 2 ||
                    t.shape[0] != V || t.shape[1] != H))
            st = td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s, expected BF16/F16/F32 [%lld, %lld]", wname,
                            td_dtype_name(t.dtype), (long long)V, (long long)H);
        if (!st) ref_linear_dense(&f->embed, t.dtype, V, H, t.data);
    }
    if (!st && !f->mixer_norm) {
        f->mixer_norm = malloc((size_t)P * sizeof *f->mixer_norm);
        if (!f->mixer_norm) st = td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory");
    }
    snprintf(name, sizeof name, "%shyper_connection_mixer", f->prefix);
    if (!st) st = load_hc(f, name, false, &f->mixer, f->mixer_norm, err);
    if (!st) {
        if (c->tie_word_embeddings) f->lm_head = f->embed;
        else st = ref_wload_linear(f->set, f->quant, "lm_head", V, H, &f->lm_head, err);
    }
    if (st) return td_err_prefix(err, "engine ref: ");
    f->globals = true;
    return TD_OK;
}

static td_status check_buffer(ref_flash *f, const char *name, const int64_t *want, int64_t n, td_err *err)
{
    int64_t have[REF_PLE_MAX_HEADS];
    bool found;
    td_status st = ref_wload_i64(f->set, name, n, have, &found, err);
    if (st || !found) return st;
    for (int64_t i = 0; i < n; i++)
        if (have[i] != want[i])
            return td_err_set(err, TD_ERR_MISMATCH, "tensor %s: entry %lld is %lld, the config implies %lld", name,
                              (long long)i, (long long)have[i], (long long)want[i]);
    return TD_OK;
}

static td_status load_ple(ref_flash *f, int64_t L, flayer *ly, float *v, td_err *err)
{
    const td_config *c = f->cfg;
    const int64_t H = c->hidden_size, P = f->hd.hc * H, D = c->ple_embed_dim, K = c->ple_conv_kernel_size;
    int64_t idx = 0;
    for (int64_t i = 0; i < c->n_ple_layers; i++)
        if (c->ple_layer_ids[i] == L + 1) idx = i;
    td_ple_dims td;
    td_status st = td_ple_table_dims(c, idx, &td, err);
    if (st) return st;
    if (td.heads > REF_PLE_MAX_HEADS)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ref flash: %lld n-gram heads", (long long)td.heads);
    ref_ple_weights *w = &ly->ple;
    char base[200], name[300];
    snprintf(base, sizeof base, "%slayers.%lld.ple.", f->prefix, (long long)L);
    st = ref_wload_linear_at(f->set, f->quant, base, "key_proj", P, D, &w->key, st, err);
    st = ref_wload_linear_at(f->set, f->quant, base, "value_proj", H, D, &w->value, st, err);
    st = ref_wload_vec_at(f->set, f->nx, base, "norm_key.weight", P, &v, &w->norm_key, st, err);
    st = ref_wload_vec_at(f->set, f->nx, base, "norm_query.weight", P, &v, &w->norm_query, st, err);
    st = ref_wload_vec_at(f->set, f->nx, base, "norm_conv.weight", P, &v, &w->norm_conv, st, err);
    st = ref_wload_vec_at(f->set, f->nx, base, "conv1d.weight", P * K, &v, &w->conv_w, st, err);
    if (st) return st;
    /* constants from the config, checked against the stored buffers */
    ref_ple_multipliers(c->seed, idx, c->vocab_size, c->ngram_size, w->mult);
    int64_t mult[REF_PLE_MAX_NGRAM];
    for (int64_t i = 0; i < c->ngram_size; i++) mult[i] = (int64_t)w->mult[i];
    memcpy(w->sizes, td.sizes, sizeof w->sizes);
    memcpy(w->offsets, td.offsets, sizeof w->offsets);
    snprintf(name, sizeof name, "%sple_embedding.layer_multipliers", base);
    st = check_buffer(f, name, mult, c->ngram_size, err);
    snprintf(name, sizeof name, "%sple_embedding.ngram_heads_offsets", base);
    if (!st) st = check_buffer(f, name, td.offsets, td.heads, err);
    snprintf(name, sizeof name, "%sple_embedding.ngram_heads_vocab_sizes", base);
    if (!st) st = check_buffer(f, name, td.sizes, td.heads, err);
    if (st) return st;
    /* the table shards */
    ly->shards = calloc((size_t)td.parts, sizeof *ly->shards);
    if (!ly->shards) return td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory");
    ref_ple_table *tb = &w->table;
    *tb = (ref_ple_table){.parts = td.parts, .rows_per_part = td.rows_per_part, .dim = td.head_dim,
                          .shards = ly->shards, .scale = 1.0f};
    for (int64_t s = 0; s < td.parts; s++) {
        td_tensor t;
        snprintf(name, sizeof name, "%sple_embedding.ngram_embedding.shard_%lld.weight", base, (long long)s);
        st = td_st_set_tensor(f->set, name, &t, err);
        if (st) return st;
        if (s == 0) tb->dtype = t.dtype;
        if ((t.dtype != TD_F8_E4M3 && t.dtype != TD_BF16 && t.dtype != TD_F16 && t.dtype != TD_F32) ||
            t.dtype != tb->dtype || t.ndim != 2 || t.shape[0] != td.rows_per_part || t.shape[1] != td.head_dim)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: %s, expected F8_E4M3/BF16/F16/F32 [%lld, %lld] like "
                              "shard 0", name, td_dtype_name(t.dtype), (long long)td.rows_per_part,
                              (long long)td.head_dim);
        ly->shards[s] = t.data;
    }
    if (tb->dtype == TD_F8_E4M3) {
        td_tensor t;
        snprintf(name, sizeof name, "%sple_embedding.ngram_embedding.weight_scale", base);
        st = td_st_set_tensor(f->set, name, &t, err);
        if (st) return st;
        if (t.dtype != TD_F32 || td_tensor_numel(&t) != 1)
            return td_err_set(err, TD_ERR_FORMAT, "tensor %s: expected an F32 scalar", name);
        memcpy(&tb->scale, t.data, sizeof tb->scale);
    }
    if (td.offsets[td.heads - 1] + td.sizes[td.heads - 1] > td.rows)
        return td_err_set(err, TD_ERR_FORMAT, "ref flash: n-gram heads exceed the table rows");
    ly->has_ple = true;
    return TD_OK;
}

static td_status load_layer(ref_flash *f, int64_t L, td_err *err)
{
    flayer *ly = &f->layers[L];
    if (ly->loaded) return TD_OK;
    const td_config *c = f->cfg;
    const int64_t H = c->hidden_size, P = f->hd.hc * H;
    const int64_t C = ref_gdn_channels(&f->gd), K = f->gd.kconv, nv = f->gd.nv, dv = f->gd.dv, nk = f->gd.nk;
    const int64_t hd = f->qd.a.head_dim, di = f->qd.idx_dim;
    const bool ple = td_config_layer_has_ple(c, L);
    ly->type = c->layer_types[L];
    int64_t nvec = 2 * P + (ly->type == TD_LAYER_GDN ? C * K + 2 * nv + dv : 2 * hd + 2 * di);
    if (ple) nvec += 3 * P + P * c->ple_conv_kernel_size;
    free(ly->vecs);
    ly->vecs = malloc((size_t)nvec * sizeof *ly->vecs);
    if (!ly->vecs) return td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory (layer %lld)", (long long)L);
    float *v = ly->vecs;
    char base[200];
    snprintf(base, sizeof base, "%slayers.%lld.attn_hyper_connection", f->prefix, (long long)L);
    td_status st = load_hc(f, base, true, &ly->hca, v, err);
    v += P;
    snprintf(base, sizeof base, "%slayers.%lld.mlp_hyper_connection", f->prefix, (long long)L);
    if (!st) st = load_hc(f, base, true, &ly->hcm, v, err);
    v += P;
    if (ly->type == TD_LAYER_GDN) {
        ref_gdn_weights *g = &ly->gdn;
        snprintf(base, sizeof base, "%slayers.%lld.linear_attn.", f->prefix, (long long)L);
        st = ref_wload_linear_at(f->set, f->quant, base, "in_proj_qkv", C, H, &g->qkv, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "in_proj_z", nv * dv, H, &g->z, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "in_proj_b", nv, H, &g->b, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "in_proj_a", nv, H, &g->a, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "out_proj", H, nv * dv, &g->out, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "conv1d.weight", C * K, &v, &g->conv_w, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "A_log", nv, &v, &g->A_log, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "dt_bias", nv, &v, &g->dt_bias, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "norm.weight", dv, &v, &g->norm_w, st, err);
        (void)nk;
    } else {
        ref_qsa_weights *q = &ly->qsa;
        const int64_t nh = f->qd.a.heads, kvh = f->qd.a.kv_heads, ih = f->qd.idx_heads;
        snprintf(base, sizeof base, "%slayers.%lld.self_attn.", f->prefix, (long long)L);
        st = ref_wload_linear_at(f->set, f->quant, base, "q_proj", 2 * nh * hd, H, &q->a.q, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "k_proj", kvh * hd, H, &q->a.k, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "v_proj", kvh * hd, H, &q->a.v, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "o_proj", H, nh * hd, &q->a.o, st, err);
        st = ref_wload_linear_at(f->set, f->quant, base, "indexer.index_qk_proj", (ih + 1) * di, H, &q->idx, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "q_norm.weight", hd, &v, &q->a.q_norm, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "k_norm.weight", hd, &v, &q->a.k_norm, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "indexer.q_layernorm.weight", di, &v, &q->q_ln, st, err);
        st = ref_wload_vec_at(f->set, f->nx, base, "indexer.k_layernorm.weight", di, &v, &q->k_ln, st, err);
    }
    if (!st && ple) st = load_ple(f, L, ly, v, err);
    if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
    ly->loaded = true;
    return TD_OK;
}

/* ==== forward ================================================================================ */

static td_status tap(td_engine *e, int64_t L, const char *name, td_dtype dt, int64_t a, int64_t b,
                     const void *data, td_err *err)
{
    const int64_t sh[2] = {a, b};
    return td_engine_put_tap(e, L, name, dt, 2, sh, data, err);
}

td_status ref_flash_forward(ref_flash *f, td_engine *e, ref_flash_seq *s, const int32_t *tokens, int64_t m,
                            ref_flash_moe_fn moe, void *moe_ctx, float *logits, td_err *err)
{
    const td_config *c = f->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size, NL = c->num_hidden_layers, hc = f->hd.hc, P = hc * H;
    td_status st = load_globals(f, err);
    if (!st) st = ref_grow(&f->X, &f->cap_X, m * P, err);
    if (!st) st = ref_grow(&f->xin, &f->cap_xin, m * H, err);
    if (!st) st = ref_grow(&f->y, &f->cap_y, m * H, err);
    if (!st) st = ref_grow(&f->inj, &f->cap_inj, m * hc, err);
    if (!st) st = ref_grow(&f->pout, &f->cap_pout, m * P, err);
    if (!st) st = ref_mm_reserve(&f->mmws, ref_pool_threads(f->pool), 1, H, err);
    if (!st && m * f->qd.topk > f->cap_sel) {
        int32_t *p = realloc(f->sel, (size_t)(m * f->qd.topk) * sizeof *p);
        if (!p) st = td_err_set(err, TD_ERR_NOMEM, "ref flash: out of memory");
        else {
            f->sel = p;
            f->cap_sel = m * f->qd.topk;
        }
    }
    if (st) return st;
    for (int64_t t = 0; t < m; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return td_err_set(err, TD_ERR_RANGE, "engine ref: token %lld of the call is %d, outside the vocabulary "
                              "[0, %lld)", (long long)t, tokens[t], (long long)V);
        float *x = f->X + t * P;
        ref_linear_decode_row(&f->embed, f->nx, tokens[t], x);
        for (int64_t k = 1; k < hc; k++) memcpy(x + k * H, x, (size_t)H * sizeof *x);
    }
    for (int64_t L = 0; L < NL; L++) {
        st = load_layer(f, L, err);
        if (st) return st;
        const flayer *ly = &f->layers[L];
        if (ly->has_ple) {
            st = ref_ple_run(&ly->ple, &f->pd, f->nx, f->pool, &f->pws, &s->ple[L], f->X, tokens, m, f->pout, err);
            if (!st) st = tap(e, L, "ple.out", TD_F32, m, P, f->pout, err);
            if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
            for (int64_t i = 0; i < m * P; i++) f->X[i] = f->X[i] + f->pout[i];
        }
        st = ref_hc_mix(&ly->hca, &f->hd, f->nx, f->pool, &f->hws, f->X, m, f->xin, f->inj, err);
        if (!st) st = tap(e, L, "hc_attn.mix", TD_F32, m, H, f->xin, err);
        if (!st) st = tap(e, L, "hc_attn.inject", TD_F32, m, hc, f->inj, err);
        if (!st && ly->type == TD_LAYER_GDN) {
            st = ref_gdn_run(&ly->gdn, &f->gd, f->nx, &REF_ROWPAR_PLAIN, f->pool, &f->gws, &s->gdn[L], f->xin, m, f->y,
                             err);
            if (!st) st = tap(e, L, "gdn.out", TD_F32, m, H, f->y, err);
        } else if (!st) {
            st = ref_qsa_run(&ly->qsa, &f->qd, f->nx, f->pool, &f->qws, &s->qsa[L], f->xin, m, f->y, f->sel, err);
            if (!st) st = tap(e, L, "attn.out", TD_F32, m, H, f->y, err);
            if (!st) st = tap(e, L, "qsa.blocks", TD_I32, m, f->qd.topk, f->sel, err);
        }
        if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
        ref_hc_combine(&f->hd, f->X, f->y, f->inj, m);
        st = tap(e, L, "hc_attn.combine", TD_F32, m, P, f->X, err);
        if (!st) st = ref_hc_mix(&ly->hcm, &f->hd, f->nx, f->pool, &f->hws, f->X, m, f->xin, f->inj, err);
        if (!st) st = tap(e, L, "hc_mlp.mix", TD_F32, m, H, f->xin, err);
        if (!st) st = tap(e, L, "hc_mlp.inject", TD_F32, m, hc, f->inj, err);
        if (!st) st = moe(moe_ctx, L, f->xin, m, f->y, err);
        if (st) return td_err_prefix(err, "engine ref: layer %lld: ", (long long)L);
        ref_hc_combine(&f->hd, f->X, f->y, f->inj, m);
        st = tap(e, L, "hc_mlp.combine", TD_F32, m, P, f->X, err);
        if (!st) st = tap(e, L, "resid", TD_F32, m, P, f->X, err);
        if (st) return st;
    }
    st = ref_hc_mix(&f->mixer, &f->hd, f->nx, f->pool, &f->hws, f->X, m, f->xin, NULL, err);
    if (!st) st = tap(e, -1, "final.hidden", TD_F32, m, H, f->xin, err);
    if (st) return st;
    ref_mm(&f->lm_head, f->nx, f->pool, &f->mmws, f->xin + (m - 1) * H, H, 1, logits, V);
    return tap(e, -1, "logits", TD_F32, 1, V, logits, err);
}
