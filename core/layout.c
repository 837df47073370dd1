/* layout.c — tensor inventory implied by a config (see layout.h). */
#include "layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"linear", "embedding", "norm", "conv", "param",
                                         "buffer", "table"};
_Static_assert(TD_ARRAY_LEN(kind_names) == TD_MOD_KIND_COUNT, "kind_names incomplete");

const char *td_mod_kind_name(td_mod_kind k)
{
    return (unsigned)k < TD_MOD_KIND_COUNT ? kind_names[k] : "?";
}

static const char lm_prefix[] = "model.language_model.";

const char *td_layout_detect_prefix(size_t n, const char *const *names)
{
    for (size_t i = 0; i < n; i++)
        if (!strncmp(names[i], lm_prefix, sizeof lm_prefix - 1)) return lm_prefix;
    return "model.";
}

const char *td_layout_set_prefix(const td_st_set *s)
{
    for (size_t i = 0; i < td_st_set_count(s); i++)
        if (!strncmp(td_st_set_name(s, i), lm_prefix, sizeof lm_prefix - 1)) return lm_prefix;
    return "model.";
}

typedef struct builder {
    td_layout *l;
    size_t cap;
    td_err *err;
    td_status st;
} builder;

static td_module *add(builder *b, td_mod_kind kind, int32_t layer, int ndim, int64_t d0,
                      int64_t d1, int64_t d2, const char *fmt, ...) TD_PRINTF(8, 9);

static td_module *add(builder *b, td_mod_kind kind, int32_t layer, int ndim, int64_t d0,
                      int64_t d1, int64_t d2, const char *fmt, ...)
{
    if (b->st) return NULL;
    if (b->l->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        td_module *m = realloc(b->l->mods, nc * sizeof *m);
        if (!m) {
            b->st = td_err_set(b->err, TD_ERR_NOMEM, "layout: out of memory");
            return NULL;
        }
        b->l->mods = m;
        b->cap = nc;
    }
    td_module *m = &b->l->mods[b->l->n++];
    memset(m, 0, sizeof *m);
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(m->name, sizeof m->name, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof m->name) {
        b->st = td_err_set(b->err, TD_ERR_RANGE, "layout: module name too long (prefix?)");
        return NULL;
    }
    m->kind = kind;
    m->layer = layer;
    m->expert = -1;
    m->ndim = ndim;
    m->shape[0] = d0;
    m->shape[1] = d1;
    m->shape[2] = d2;
    return m;
}

static bool is_prime(int64_t n)
{
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (int64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return false;
    return true;
}

td_status td_ple_table_dims(const td_config *c, int64_t ple_index, td_ple_dims *o, td_err *err)
{
    memset(o, 0, sizeof *o);
    o->heads = (c->ngram_size - 1) * c->heads_per_ngram;
    if (o->heads <= 0 || o->heads > TD_PLE_MAX_HEADS)
        return td_err_set(err, TD_ERR_RANGE, "config: %lld n-gram heads outside 1..%d",
                          (long long)o->heads, TD_PLE_MAX_HEADS);
    o->head_dim = c->ple_embed_dim / o->heads;
    /* the (ple_index*heads + h + 1)-th prime >= base */
    int64_t skip = ple_index * o->heads, cand = c->ngram_vocab_size_base, found = 0;
    if (cand > ((int64_t)1 << 40))
        return td_err_set(err, TD_ERR_RANGE, "config: ngram_vocab_size_base too large");
    while (found < skip + o->heads) {
        if (is_prime(cand)) {
            if (found >= skip) o->sizes[found - skip] = cand;
            found++;
        }
        cand++;
    }
    int64_t off = 0;
    for (int64_t h = 0; h < o->heads; h++) {
        o->offsets[h] = off;
        off += o->sizes[h];
    }
    int64_t div = c->make_ngram_vocab_size_divisible_by;
    o->rows = (off + div - 1) / div * div;
    o->parts = c->split_ngram_parts;
    if (o->rows % o->parts != 0)
        return td_err_set(err, TD_ERR_RANGE,
                          "config: n-gram table of %lld rows does not split into %lld equal parts",
                          (long long)o->rows, (long long)o->parts);
    o->rows_per_part = o->rows / o->parts;
    return TD_OK;
}

void td_layout_fused_experts(const td_config *c, const char *prefix, int64_t layer,
                             char gate_up[128], int64_t gu[3], char down[128], int64_t dn[3])
{
    snprintf(gate_up, 128, "%slayers.%lld.mlp.experts.gate_up_proj", prefix, (long long)layer);
    snprintf(down, 128, "%slayers.%lld.mlp.experts.down_proj", prefix, (long long)layer);
    gu[0] = c->num_experts;
    gu[1] = 2 * c->moe_intermediate_size;
    gu[2] = c->hidden_size;
    dn[0] = c->num_experts;
    dn[1] = c->hidden_size;
    dn[2] = c->moe_intermediate_size;
}

static void add_hc(builder *b, const td_config *c, int32_t layer, const char *base, bool inject)
{
    int64_t plane = c->hc_count * c->hidden_size;
    add(b, TD_MOD_NORM, layer, 1, plane, 0, 0, "%s.hc_norm", base);
    add(b, TD_MOD_LINEAR, layer, 2, c->hc_lowrank, plane, 0, "%s.input_mix_weight_down", base);
    add(b, TD_MOD_LINEAR, layer, 2, plane, c->hc_lowrank, 0, "%s.input_mix_weight_up", base);
    if (inject) add(b, TD_MOD_LINEAR, layer, 2, c->hc_count, plane, 0, "%s.block_inject_weight", base);
}

static void add_layer(builder *b, const td_config *c, const char *P, int64_t L64)
{
    int32_t L = (int32_t)L64;
    const bool q4 = c->family == TD_FAMILY_QWEN4_EXP;
    const int64_t H = c->hidden_size;
    char lp[96];
    snprintf(lp, sizeof lp, "%slayers.%d.", P, L);

    if (q4) {
        char base[128];
        snprintf(base, sizeof base, "%sattn_hyper_connection", lp);
        add_hc(b, c, L, base, true);
        snprintf(base, sizeof base, "%smlp_hyper_connection", lp);
        add_hc(b, c, L, base, true);
    } else {
        add(b, TD_MOD_NORM, L, 1, H, 0, 0, "%sinput_layernorm", lp);
        add(b, TD_MOD_NORM, L, 1, H, 0, 0, "%spost_attention_layernorm", lp);
    }

    if (c->layer_types[L] == TD_LAYER_GDN) {
        const int64_t nk = c->linear_num_key_heads, nv = c->linear_num_value_heads;
        const int64_t dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
        const int64_t conv = 2 * nk * dk + nv * dv;
        if (q4) {
            add(b, TD_MOD_LINEAR, L, 2, conv, H, 0, "%slinear_attn.in_proj_qkv", lp);
            add(b, TD_MOD_LINEAR, L, 2, nv * dv, H, 0, "%slinear_attn.in_proj_z", lp);
            add(b, TD_MOD_LINEAR, L, 2, nv, H, 0, "%slinear_attn.in_proj_b", lp);
            add(b, TD_MOD_LINEAR, L, 2, nv, H, 0, "%slinear_attn.in_proj_a", lp);
        } else {
            add(b, TD_MOD_LINEAR, L, 2, 2 * nk * dk + 2 * nv * dv, H, 0, "%slinear_attn.in_proj_qkvz", lp);
            add(b, TD_MOD_LINEAR, L, 2, 2 * nv, H, 0, "%slinear_attn.in_proj_ba", lp);
        }
        add(b, TD_MOD_CONV, L, 3, conv, 1, c->linear_conv_kernel_dim, "%slinear_attn.conv1d", lp);
        add(b, TD_MOD_PARAM, L, 1, nv, 0, 0, "%slinear_attn.dt_bias", lp);
        add(b, TD_MOD_PARAM, L, 1, nv, 0, 0, "%slinear_attn.A_log", lp);
        add(b, TD_MOD_NORM, L, 1, dv, 0, 0, "%slinear_attn.norm", lp);
        add(b, TD_MOD_LINEAR, L, 2, H, nv * dv, 0, "%slinear_attn.out_proj", lp);
    } else {
        const int64_t nh = c->num_attention_heads, kv = c->num_key_value_heads, hd = c->head_dim;
        add(b, TD_MOD_LINEAR, L, 2, 2 * nh * hd, H, 0, "%sself_attn.q_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, kv * hd, H, 0, "%sself_attn.k_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, kv * hd, H, 0, "%sself_attn.v_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, H, nh * hd, 0, "%sself_attn.o_proj", lp);
        add(b, TD_MOD_NORM, L, 1, hd, 0, 0, "%sself_attn.q_norm", lp);
        add(b, TD_MOD_NORM, L, 1, hd, 0, 0, "%sself_attn.k_norm", lp);
        if (q4) {
            const int64_t ih = c->indexer_n_heads, ikv = c->indexer_kv_heads, id = c->indexer_head_dim;
            add(b, TD_MOD_LINEAR, L, 2, (ih + ikv) * id, H, 0, "%sself_attn.indexer.index_qk_proj", lp);
            add(b, TD_MOD_NORM, L, 1, id, 0, 0, "%sself_attn.indexer.q_layernorm", lp);
            add(b, TD_MOD_NORM, L, 1, id, 0, 0, "%sself_attn.indexer.k_layernorm", lp);
        }
    }

    if (td_config_layer_is_moe(c, L)) {
        const int64_t E = c->num_experts, I = c->moe_intermediate_size;
        const int64_t Is = c->shared_expert_intermediate_size;
        add(b, TD_MOD_LINEAR, L, 2, E, H, 0, "%smlp.gate", lp);
        for (int64_t e = 0; e < E && !b->st; e++) {
            static const struct { td_moe_proj p; const char *n; } projs[] = {
                {TD_MOE_GATE, "gate_proj"}, {TD_MOE_UP, "up_proj"}, {TD_MOE_DOWN, "down_proj"}};
            for (size_t k = 0; k < 3; k++) {
                bool down = projs[k].p == TD_MOE_DOWN;
                td_module *m = add(b, TD_MOD_LINEAR, L, 2, down ? H : I, down ? I : H, 0,
                                   "%smlp.experts.%lld.%s", lp, (long long)e, projs[k].n);
                if (m) {
                    m->expert = (int32_t)e;
                    m->moe_proj = projs[k].p;
                }
            }
        }
        if (Is > 0) {
            add(b, TD_MOD_LINEAR, L, 2, Is, H, 0, "%smlp.shared_expert.gate_proj", lp);
            add(b, TD_MOD_LINEAR, L, 2, Is, H, 0, "%smlp.shared_expert.up_proj", lp);
            add(b, TD_MOD_LINEAR, L, 2, H, Is, 0, "%smlp.shared_expert.down_proj", lp);
            add(b, TD_MOD_LINEAR, L, 2, 1, H, 0, "%smlp.shared_expert_gate", lp);
        }
    } else {
        const int64_t I = c->intermediate_size;
        add(b, TD_MOD_LINEAR, L, 2, I, H, 0, "%smlp.gate_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, I, H, 0, "%smlp.up_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, H, I, 0, "%smlp.down_proj", lp);
    }

    if (td_config_layer_has_ple(c, L)) {
        int64_t idx = 0;
        for (int64_t i = 0; i < c->n_ple_layers; i++)
            if (c->ple_layer_ids[i] == L + 1) idx = i;
        td_ple_dims d;
        td_status st = td_ple_table_dims(c, idx, &d, b->err);
        if (st) {
            b->st = st;
            return;
        }
        const int64_t plane = c->hc_count * H, D = c->ple_embed_dim;
        add(b, TD_MOD_LINEAR, L, 2, plane, D, 0, "%sple.key_proj", lp);
        add(b, TD_MOD_LINEAR, L, 2, H, D, 0, "%sple.value_proj", lp);
        add(b, TD_MOD_NORM, L, 1, plane, 0, 0, "%sple.norm_key", lp);
        add(b, TD_MOD_NORM, L, 1, plane, 0, 0, "%sple.norm_query", lp);
        add(b, TD_MOD_NORM, L, 1, plane, 0, 0, "%sple.norm_conv", lp);
        add(b, TD_MOD_CONV, L, 3, plane, 1, c->ple_conv_kernel_size, "%sple.conv1d", lp);
        add(b, TD_MOD_BUFFER, L, 1, c->ngram_size, 0, 0, "%sple.ple_embedding.layer_multipliers", lp);
        add(b, TD_MOD_BUFFER, L, 1, d.heads, 0, 0, "%sple.ple_embedding.ngram_heads_offsets", lp);
        add(b, TD_MOD_BUFFER, L, 1, d.heads, 0, 0, "%sple.ple_embedding.ngram_heads_vocab_sizes", lp);
        td_module *t = add(b, TD_MOD_TABLE, L, 2, d.rows_per_part, d.head_dim, 0,
                           "%sple.ple_embedding.ngram_embedding", lp);
        if (t) t->parts = (int32_t)d.parts;
    }
}

td_status td_layout_build(const td_config *c, const char *P, td_layout *out, td_err *err)
{
    memset(out, 0, sizeof *out);
    if (strlen(P) >= sizeof out->prefix)
        return td_err_set(err, TD_ERR_ARG, "layout: prefix too long");
    snprintf(out->prefix, sizeof out->prefix, "%s", P);
    builder b = {out, 0, err, TD_OK};
    const int64_t H = c->hidden_size, V = c->vocab_size;
    add(&b, TD_MOD_EMBEDDING, -1, 2, V, H, 0, "%sembed_tokens", P);
    for (int64_t L = 0; L < c->num_hidden_layers && !b.st; L++)
        if (td_config_layer_present(c, L)) add_layer(&b, c, P, L);
    if (c->family == TD_FAMILY_QWEN4_EXP) {
        char base[128];
        snprintf(base, sizeof base, "%shyper_connection_mixer", P);
        add_hc(&b, c, -1, base, false);
    } else {
        add(&b, TD_MOD_NORM, -1, 1, H, 0, 0, "%snorm", P);
    }
    if (!c->tie_word_embeddings) add(&b, TD_MOD_LINEAR, -1, 2, V, H, 0, "lm_head");
    if (b.st) {
        td_layout_free(out);
        return b.st;
    }
    return TD_OK;
}

void td_layout_free(td_layout *l)
{
    if (!l) return;
    free(l->mods);
    l->mods = NULL;
    l->n = 0;
}
