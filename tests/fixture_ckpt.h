/* fixture_ckpt.h — tiny, structurally complete checkpoints for tests.
 *
 * fx_build() writes config.json (and hf_quant_config.json when given), derives the tensor
 * inventory with the library's own config/quant/layout code, lets the caller mutate the list
 * (drop, reshape, retype, poison, add), and writes it as one file or as N shards plus
 * model.safetensors.index.json. Tensor bytes are 0x3C everywhere (finite, positive in every
 * float format: BF16 0x3C3C, F32 0x3C3C3C3C, E4M3 0x3C = 1.5) unless poisoned.
 * These checkpoints exercise structure, not numerics.
 */
#ifndef TD_FIXTURE_CKPT_H
#define TD_FIXTURE_CKPT_H

#include "test_common.h"
#include "config.h"
#include "layout.h"
#include "quant.h"
#include "safetensors.h"

#define FX_MAX_TENSORS 4096

typedef struct fx_tensor {
    char name[200];
    td_dtype dt;
    int nd;
    int64_t shape[3];
    int64_t poison_at;   /* byte index set to poison_byte, -1 = none */
    uint8_t poison_byte;
} fx_tensor;

typedef struct fx_ckpt {
    fx_tensor t[FX_MAX_TENSORS];
    size_t n;
} fx_ckpt;

/* qwen3_next: hidden 32, 4 layers (GDN x3 + attention), 4 experts top-2, NVFP4 (ModelOpt). */
static const char FX_QWEN3_CONFIG[] =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":32,"
    "\"num_hidden_layers\":4,\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"head_dim\":8,\"partial_rotary_factor\":0.25,\"rope_theta\":10000,\"linear_num_key_heads\":2,"
    "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
    "\"linear_conv_kernel_dim\":4,\"num_experts\":4,\"num_experts_per_tok\":2,"
    "\"moe_intermediate_size\":16,\"shared_expert_intermediate_size\":16,\"full_attention_interval\":4,"
    "\"eos_token_id\":1,\"tie_word_embeddings\":false}";
static const char FX_QWEN3_QUANT[] =
    "{\"producer\":{\"name\":\"modelopt\",\"version\":\"test\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
    "\"kv_cache_quant_algo\":null,\"group_size\":16,\"exclude_modules\":[\"lm_head\",\"*mlp.gate\","
    "\"*shared_expert_gate\",\"*linear_attn.in_proj*\",\"*self_attn.q_proj\",\"*self_attn.k_proj\","
    "\"*self_attn.v_proj\"]}}";

/* qwen4_exp: HC 4 streams, PLE at layer index 1 (FP8 table in 2 shards), experts NVFP4 via
 * MIXED_PRECISION in config.json. */
static const char FX_FLASH_CONFIG[] =
    "{\"architectures\":[\"Qwen4ExpForConditionalGeneration\"],\"model_type\":\"qwen4_exp\","
    "\"text_config\":{\"model_type\":\"qwen4_exp_text\",\"hidden_size\":32,\"num_hidden_layers\":4,"
    "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_attention\"],"
    "\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":8,"
    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.25},"
    "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,\"linear_key_head_dim\":8,"
    "\"linear_value_head_dim\":8,\"linear_conv_kernel_dim\":4,\"output_gate_type\":\"sigmoid\","
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":16,"
    "\"shared_expert_intermediate_size\":16,\"hc_count\":4,\"hc_lowrank\":8,\"indexer_n_heads\":2,"
    "\"indexer_kv_heads\":1,\"indexer_head_dim\":8,\"indexer_budget\":16,\"indexer_compress_ratio\":4,"
    "\"ple_layer_ids\":[2],\"ple_embed_dim\":32,\"ple_conv_kernel_size\":4,\"ngram_size\":3,"
    "\"heads_per_ngram\":8,\"ngram_vocab_size_base\":50,\"make_ngram_vocab_size_divisible_by\":8,"
    "\"split_ngram_parts\":2,\"eos_token_id\":1},"
    "\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"MIXED_PRECISION\","
    "\"quantized_layers\":{"
    "\"model.language_model.layers.0.mlp.experts\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
    "\"model.language_model.layers.1.mlp.experts\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
    "\"model.language_model.layers.2.mlp.experts\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
    "\"model.language_model.layers.3.mlp.experts\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
    "\"model.language_model.layers.1.ple.ple_embedding.ngram_embedding\":{\"quant_algo\":\"FP8\"}},"
    "\"ignore\":[\"lm_head\"]}}";

static void fx_add(fx_ckpt *c, const char *name, td_dtype dt, int nd, int64_t a, int64_t b, int64_t d)
{
    assert_true(c->n < FX_MAX_TENSORS);
    fx_tensor *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dt = dt;
    t->nd = nd;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = d;
    t->poison_at = -1;
}

static fx_tensor *fx_find(fx_ckpt *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    fail_msg("fixture has no tensor %s", name);
    return NULL;
}

static void fx_drop(fx_ckpt *c, const char *name)
{
    fx_tensor *t = fx_find(c, name);
    *t = c->t[--c->n];
}

static void fx_add_quantized(fx_ckpt *c, const td_quant_tensors *q, int64_t out, int64_t in)
{
    switch (q->scheme) {
    case TD_SCHEME_NVFP4:
    case TD_SCHEME_NVFP4_CT:
        fx_add(c, q->weight, TD_U8, 2, out, in / 2, 0);
        fx_add(c, q->scale, TD_F8_E4M3, 2, out, in / 16, 0);
        fx_add(c, q->global, TD_F32, 0, 0, 0, 0);
        if (q->input_scale[0]) fx_add(c, q->input_scale, TD_F32, 0, 0, 0, 0);
        break;
    default:
        fx_add(c, q->weight, TD_BF16, 2, out, in, 0);
        break;
    }
}

/* Inventory of the checkpoint a config + quantization metadata imply. */
static void fx_inventory(const char *dir, fx_ckpt *c)
{
    td_config *cfg = malloc(sizeof *cfg);
    td_quant q;
    td_err err;
    assert_non_null(cfg);
    if (td_config_load(dir, cfg, &err)) fail_msg("%s", err.msg);
    if (td_quant_load(dir, &q, &err)) fail_msg("%s", err.msg);
    td_layout l;
    const char *prefix = cfg->family == TD_FAMILY_QWEN4_EXP ? "model.language_model." : "model.";
    if (td_layout_build(cfg, prefix, &l, &err)) fail_msg("%s", err.msg);
    c->n = 0;
    char name[260];
    for (size_t i = 0; i < l.n; i++) {
        const td_module *m = &l.mods[i];
        td_quant_tensors qt;
        switch (m->kind) {
        case TD_MOD_LINEAR:
        case TD_MOD_EMBEDDING:
            assert_int_equal(td_quant_resolve(&q, m->name, m->kind == TD_MOD_LINEAR, &qt, &err), TD_OK);
            fx_add_quantized(c, &qt, m->shape[0], m->shape[1]);
            break;
        case TD_MOD_TABLE:
            assert_int_equal(td_quant_resolve(&q, m->name, false, &qt, &err), TD_OK);
            for (int p = 0; p < m->parts; p++) {
                snprintf(name, sizeof name, "%s.shard_%d.weight", m->name, p);
                fx_add(c, name, qt.scheme == TD_SCHEME_FP8 ? TD_F8_E4M3 : TD_BF16, 2, m->shape[0], m->shape[1], 0);
            }
            if (qt.scheme == TD_SCHEME_FP8) {
                snprintf(name, sizeof name, "%s.weight_scale", m->name);
                fx_add(c, name, TD_F32, 0, 0, 0, 0);
            }
            break;
        case TD_MOD_PARAM:
            fx_add(c, m->name, TD_F32, m->ndim, m->shape[0], m->shape[1], m->shape[2]);
            break;
        case TD_MOD_BUFFER:
            fx_add(c, m->name, TD_I64, m->ndim, m->shape[0], m->shape[1], m->shape[2]);
            break;
        default:
            snprintf(name, sizeof name, "%s.weight", m->name);
            fx_add(c, name, TD_BF16, m->ndim, m->shape[0], m->shape[1], m->shape[2]);
            break;
        }
    }
    td_layout_free(&l);
    td_quant_free(&q);
    free(cfg);
}

/* Write config (+ quant file), then the inventory after `mutate` (may be NULL). */
static void fx_write_meta(const char *dir, const char *config, const char *hf_quant)
{
    char p[900];
    td_test_sh("rm -rf '%s'", dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    td_test_write_str(p, config);
    if (hf_quant) {
        snprintf(p, sizeof p, "%s/hf_quant_config.json", dir);
        td_test_write_str(p, hf_quant);
    }
}

static void fx_write_tensors(const char *dir, const fx_ckpt *c, int shards)
{
    char p[900];
    td_err err;
    FILE *idx = NULL;
    if (shards > 1) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        idx = fopen(p, "w");
        assert_non_null(idx);
        fprintf(idx, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    }
    bool first = true;
    for (int s = 0; s < shards; s++) {
        char fname[128];
        if (shards > 1) snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, shards);
        else snprintf(fname, sizeof fname, "model.safetensors");
        snprintf(p, sizeof p, "%s/%s", dir, fname);
        td_st_writer *w = NULL;
        if (td_st_writer_init(p, &w, &err)) fail_msg("%s", err.msg);
        if (td_st_writer_meta(w, "format", "pt", &err)) fail_msg("%s", err.msg);
        for (size_t i = (size_t)s; i < c->n; i += (size_t)shards) {
            const fx_tensor *t = &c->t[i];
            if (td_st_writer_declare(w, t->name, t->dt, t->nd, t->shape, &err)) fail_msg("%s", err.msg);
            if (idx) {
                fprintf(idx, "%s\"%s\":\"%s\"", first ? "" : ",", t->name, fname);
                first = false;
            }
        }
        if (td_st_writer_begin(w, &err)) fail_msg("%s", err.msg);
        for (size_t i = (size_t)s; i < c->n; i += (size_t)shards) {
            const fx_tensor *t = &c->t[i];
            int64_t numel, nb;
            assert_int_equal(td_shape_numel(t->nd, t->shape, &numel, &err), TD_OK);
            assert_int_equal(td_dtype_nbytes(t->dt, numel, &nb, &err), TD_OK);
            uint8_t *buf = malloc((size_t)nb + 1);
            assert_non_null(buf);
            memset(buf, 0x3C, (size_t)nb + 1);
            if (t->poison_at >= 0 && t->poison_at < nb) buf[t->poison_at] = t->poison_byte;
            if (td_st_writer_write(w, t->name, buf, (size_t)nb, &err)) fail_msg("%s", err.msg);
            free(buf);
        }
        if (td_st_writer_finish(w, &err)) fail_msg("%s", err.msg);
        td_st_writer_free(w);
    }
    if (idx) {
        fprintf(idx, "}}");
        assert_int_equal(fclose(idx), 0);
    }
}

#endif
