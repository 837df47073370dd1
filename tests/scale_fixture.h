/* scale_fixture.h — tiny NVFP4 checkpoints with chosen block-scale bytes and globals, for the
 * scale-storage audit tests.
 *
 * sf_write() derives the tensor inventory from a config (+ quantization metadata) with
 * tests/fixture_ckpt.h, then fills every tensor deterministically:
 * - NVFP4 block scales (F8_E4M3 "*.weight_scale"): positive normal codes 0x49..0x7E (4.5..448,
 *   the range real checkpoints show), from a hash of the tensor name and the byte index;
 * - NVFP4 globals (F32 "*.weight_scale_2" / "*.weight_global_scale"): g = fl32(a / 2688) with
 *   a bf16 amax a in [0.5, 8) hashed from the *parent* module name, so gate/up siblings share
 *   their global (as synchronized exports do). Such globals never hit a hi/lo-inexact pair
 *   with a normal code (checked exhaustively by the tests); compressed-tensors checkpoints
 *   store 1/g instead (fl32(2688 / a));
 * - everything else 0x3C bytes (finite, positive in every float format).
 * Then it applies the plants: single scale bytes and whole globals, by tensor name.
 */
#ifndef TD_SCALE_FIXTURE_H
#define TD_SCALE_FIXTURE_H

#include "fixture_ckpt.h"

#include <math.h>

/* qwen3_next, hidden 32, 4 layers, 4 experts top-2, moe_intermediate 64 (so a TP2 rank holds
 * 32 rows of gate and of up, enough for the interleaved W13 layout), shared expert 16. */
static const char SF_QWEN3_CONFIG[] =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":32,"
    "\"num_hidden_layers\":4,\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"head_dim\":8,\"partial_rotary_factor\":0.25,\"rope_theta\":10000,\"linear_num_key_heads\":2,"
    "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
    "\"linear_conv_kernel_dim\":4,\"num_experts\":4,\"num_experts_per_tok\":2,"
    "\"moe_intermediate_size\":64,\"shared_expert_intermediate_size\":16,\"full_attention_interval\":4,"
    "\"eos_token_id\":1,\"tie_word_embeddings\":false}";

/* The same model as compressed-tensors nvfp4-pack-quantized (experts only). */
static const char SF_QWEN3_CT_CONFIG[] =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":32,"
    "\"num_hidden_layers\":4,\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"head_dim\":8,\"partial_rotary_factor\":0.25,\"rope_theta\":10000,\"linear_num_key_heads\":2,"
    "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
    "\"linear_conv_kernel_dim\":4,\"num_experts\":4,\"num_experts_per_tok\":2,"
    "\"moe_intermediate_size\":64,\"shared_expert_intermediate_size\":16,\"full_attention_interval\":4,"
    "\"eos_token_id\":1,\"tie_word_embeddings\":false,"
    "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
    "\"config_groups\":{\"group_0\":{\"targets\":[\"re:.*mlp\\\\.experts\\\\.[0-9]+\\\\.(gate|up|down)_proj$\"],"
    "\"weights\":{\"num_bits\":4,\"type\":\"float\",\"strategy\":\"tensor_group\",\"group_size\":16,"
    "\"symmetric\":true,\"dynamic\":false}}},\"ignore\":[\"lm_head\"]}}";

#define SF_MAX_PLANTS 64

typedef struct sf_plant {
    char tensor[200];
    int64_t index;       /* scale byte index (flat), or -1 for a global */
    uint8_t byte;
    float global;
} sf_plant;

typedef struct sf_spec {
    const char *config;
    const char *hf_quant;      /* hf_quant_config.json or NULL */
    bool ct;                   /* globals stored as g_enc = 1/g */
    int shards;
    sf_plant plants[SF_MAX_PLANTS];
    size_t n_plants;
} sf_spec;

static void sf_init(sf_spec *s, const char *config, const char *hf_quant, bool ct)
{
    memset(s, 0, sizeof *s);
    s->config = config;
    s->hf_quant = hf_quant;
    s->ct = ct;
    s->shards = 1;
}

static void sf_plant_byte(sf_spec *s, const char *tensor, int64_t index, uint8_t byte)
{
    assert_true(s->n_plants < SF_MAX_PLANTS);
    sf_plant *p = &s->plants[s->n_plants++];
    snprintf(p->tensor, sizeof p->tensor, "%s", tensor);
    p->index = index;
    p->byte = byte;
}

static void sf_plant_global(sf_spec *s, const char *tensor, float g)
{
    assert_true(s->n_plants < SF_MAX_PLANTS);
    sf_plant *p = &s->plants[s->n_plants++];
    snprintf(p->tensor, sizeof p->tensor, "%s", tensor);
    p->index = -1;
    p->global = g;
}

static uint64_t sf_hash(const char *s, uint64_t x)
{
    uint64_t h = 1469598103934665603ull ^ x;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static bool sf_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* The default decode multiplier of a module's NVFP4 tensors: fl32(bf16 a / 2688). */
static float sf_default_g(const char *global_tensor)
{
    char parent[200];
    snprintf(parent, sizeof parent, "%s", global_tensor);
    char *d = strrchr(parent, '.'); /* drop ".weight_scale_2" */
    if (d) *d = 0;
    d = strrchr(parent, '.');       /* drop ".gate_proj" etc.: siblings share */
    if (d) *d = 0;
    uint64_t h = sf_hash(parent, 7);
    /* bf16 values in [0.5, 8): exponent -1..2, 7 mantissa bits */
    uint32_t bits = ((uint32_t)(126 + (h % 4)) << 23) | ((uint32_t)((h >> 8) & 0x7F) << 16);
    float a;
    memcpy(&a, &bits, sizeof a);
    return a / 2688.0f;
}

static void sf_fill(const sf_spec *s, const fx_tensor *t, uint8_t *buf, size_t nb)
{
    memset(buf, 0x3C, nb);
    if (t->dt == TD_F8_E4M3 && sf_ends_with(t->name, ".weight_scale")) {
        for (size_t i = 0; i < nb; i++) buf[i] = (uint8_t)(0x49 + sf_hash(t->name, i) % (0x7E - 0x49 + 1));
    } else if (t->dt == TD_F32 && nb == 4 &&
               (sf_ends_with(t->name, ".weight_scale_2") || sf_ends_with(t->name, ".weight_global_scale"))) {
        float g = sf_default_g(t->name);
        if (s->ct) g = 1.0f / g;
        memcpy(buf, &g, 4);
    }
    for (size_t i = 0; i < s->n_plants; i++) {
        const sf_plant *p = &s->plants[i];
        if (strcmp(p->tensor, t->name)) continue;
        if (p->index < 0) {
            assert_int_equal(nb, 4);
            memcpy(buf, &p->global, 4);
        } else {
            assert_true((size_t)p->index < nb);
            buf[p->index] = p->byte;
        }
    }
}

/* Write the checkpoint; `mutate` (may be NULL) may drop or retype tensors of the inventory. */
static void sf_write(const char *dir, const sf_spec *s, void (*mutate)(fx_ckpt *c))
{
    static fx_ckpt c; /* large */
    (void)fx_write_tensors; /* replaced here by a writer that fills chosen bytes */
    fx_write_meta(dir, s->config, s->hf_quant);
    fx_inventory(dir, &c);
    if (mutate) mutate(&c);
    for (size_t i = 0; i < s->n_plants; i++) (void)fx_find(&c, s->plants[i].tensor);
    char p[900];
    td_err err;
    FILE *idx = NULL;
    int shards = s->shards < 1 ? 1 : s->shards;
    if (shards > 1) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        idx = fopen(p, "w");
        assert_non_null(idx);
        fprintf(idx, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    }
    bool first = true;
    for (int sh = 0; sh < shards; sh++) {
        char fname[128];
        if (shards > 1) snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, shards);
        else snprintf(fname, sizeof fname, "model.safetensors");
        snprintf(p, sizeof p, "%s/%s", dir, fname);
        td_st_writer *w = NULL;
        if (td_st_writer_init(p, &w, &err)) fail_msg("%s", err.msg);
        for (size_t i = (size_t)sh; i < c.n; i += (size_t)shards) {
            const fx_tensor *t = &c.t[i];
            if (td_st_writer_declare(w, t->name, t->dt, t->nd, t->shape, &err)) fail_msg("%s", err.msg);
            if (idx) {
                fprintf(idx, "%s\"%s\":\"%s\"", first ? "" : ",", t->name, fname);
                first = false;
            }
        }
        if (td_st_writer_begin(w, &err)) fail_msg("%s", err.msg);
        for (size_t i = (size_t)sh; i < c.n; i += (size_t)shards) {
            const fx_tensor *t = &c.t[i];
            int64_t numel, nb;
            assert_int_equal(td_shape_numel(t->nd, t->shape, &numel, &err), TD_OK);
            assert_int_equal(td_dtype_nbytes(t->dt, numel, &nb, &err), TD_OK);
            uint8_t *buf = malloc((size_t)nb + 1);
            assert_non_null(buf);
            sf_fill(s, t, buf, (size_t)nb);
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

#endif /* TD_SCALE_FIXTURE_H */
