/* gen.c — synthetic checkpoints: presets, weight distributions, writing (see gen.h).
 *
 * Layout of this file:
 *   1. portable arithmetic (hashing, exp, the heavy-tail mixing table)
 *   2. presets: config.json and quantization metadata as JSON trees
 *   3. the plan: config -> layout -> scheme -> jobs and tensors -> shards
 *   4. value generation (the distributions of docs/gen-quantize.md)
 *   5. jobs: generate, quantize, inject the edge cases
 *   6. writing: worker threads, safetensors writers, metadata files
 *   7. the staged output directory
 *
 * Everything that reaches a file is computed with integer hashing and IEEE-754 +, -, *, /,
 * sqrt, floor and ldexp (correctly rounded everywhere), plus td_rng_log from core/rng.c,
 * which is built from the same operations. No libm function whose last bit differs between
 * C libraries (exp, log, pow) is used, so the bytes are identical on every platform.
 */
#include "gen.h"

#include "formats.h"
#include "json.h"
#include "layout.h"
#include "nvfp4.h"
#include "progress.h"
#include "rng.h"
#include "safetensors.h"
#include "version.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ============================================================================================
 * 1. Portable arithmetic
 * ========================================================================================== */

#define GEN_GOLDEN UINT64_C(0x9e3779b97f4a7c15)

/* splitmix64 output function (a bijection). */
static inline uint64_t gen_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* FNV-1a over a string: the stream key of a module comes from its name. */
static uint64_t gen_fnv1a(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* Stream key of a named tensor/module under a seed. */
static uint64_t gen_key(uint64_t seed, const char *name)
{
    return gen_mix64(gen_mix64(seed + GEN_GOLDEN) ^ gen_fnv1a(name));
}

/* exp(x) from +, -, *, /, floor and ldexp only: x = k*ln2 + r with |r| <= ln2/2 (ln2 split
 * into a high part with trailing zero bits and a low part, so k*ln2_hi is exact), then a
 * Taylor polynomial of degree 18 (remainder < 1e-19 relative). Bitwise identical on every
 * IEEE-754 binary64 platform; within ~2 ulp of the true value. */
static double gen_exp(double x)
{
    if (x > 700.0) x = 700.0;
    if (x < -700.0) x = -700.0;
    double k = floor(x * 1.4426950408889634 + 0.5);
    double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double term = 1.0, sum = 1.0;
    for (int i = 1; i <= 18; i++) {
        term = term * r / (double)i;
        sum += term;
    }
    return ldexp(sum, (int)k);
}

/* expm1 for 0 <= x <= 0.2 by its Taylor series (no cancellation). */
static double gen_expm1_small(double x)
{
    double term = x, sum = x;
    for (int i = 2; i <= 14; i++) {
        term = term * x / (double)i;
        sum += term;
    }
    return sum;
}

/* Round a finite float to the nearest BF16 value (ties to even), returned as float. */
static inline float gen_bf16_round(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&v, &u, 4);
    return v;
}

#define GEN_MIX_BITS 12
#define GEN_MIX_N (1 << GEN_MIX_BITS)

/* Scale-mixture table of a Student-t with 4 degrees of freedom: X = Z * sqrt(nu / W) with
 * W ~ chi^2_4 has the t_4 law; entry k holds sqrt(2 / w_k) where w_k is the (k + 1/2)/N
 * quantile of chi^2_4 (so E[entry^2] = 1 and Z * entry has unit variance). The quantile
 * solves log(1 + w/2) - w/2 = log(1 - p) (the chi^2_4 CDF is 1 - e^{-w/2}(1 + w/2)) by
 * bisection with td_rng_log. Entries range from ~8 (p = 1/8192) down to ~0.28. */
static void gen_mix_table(float *t)
{
    for (int k = 0; k < GEN_MIX_N; k++) {
        double p = ((double)k + 0.5) / (double)GEN_MIX_N;
        double target = td_rng_log(1.0 - p);
        double lo = 0.0, hi = 1.0;
        while (td_rng_log(1.0 + hi / 2.0) - hi / 2.0 > target) hi *= 2.0;
        for (int it = 0; it < 64; it++) {
            double mid = (lo + hi) / 2.0;
            if (td_rng_log(1.0 + mid / 2.0) - mid / 2.0 > target) lo = mid;
            else hi = mid;
        }
        double w = (lo + hi) / 2.0;
        t[k] = (float)sqrt(2.0 / w);
    }
}

/* ============================================================================================
 * 2. Presets
 * ========================================================================================== */

/* Edge cases injected by the `edge` preset (flags per module). */
enum {
    EDGE_ZERO_BLOCKS = 1u << 0,  /* rows 0-1 all zero, every 3rd block of row 2 zero */
    EDGE_ZERO_SCALE = 1u << 1,   /* block (0,0) (a zero block) gets scale byte 0x00 */
    EDGE_SUBNORMAL = 1u << 2,    /* rows 3..6: block amax ladders down past the E4M3 range */
    EDGE_NEG_CODES = 1u << 3,    /* 5 blocks: scale sign bit set, nibble signs flipped */
    EDGE_NAN_CODE = 1u << 4,     /* block (0,1) gets scale byte 0x7F (NaN) */
    EDGE_TINY = 1u << 5,         /* weights x 2^-100: tiny global scale */
    EDGE_LARGE = 1u << 6,        /* weights x 2^8: global above the SM70 FP16 decode limit */
    EDGE_HUGE = 1u << 7,         /* weights x 2^96: huge global scale */
    EDGE_UNSYNCED = 1u << 8,     /* gate/up quantized with their own amax, g_up in [4, 8) g_gate */
    EDGE_ALL_ZERO = 1u << 9,     /* every weight zero: global 1.0, all scales 1.0 */
};

typedef struct edge_spec {
    const char *module; /* name after the prefix */
    uint32_t flags;
} edge_spec;

static const edge_spec edge_modules[] = {
    {"layers.0.mlp.experts.0.gate_proj", EDGE_ZERO_BLOCKS | EDGE_ZERO_SCALE},
    {"layers.0.mlp.experts.1.gate_proj", EDGE_SUBNORMAL},
    {"layers.0.mlp.experts.1.up_proj", EDGE_SUBNORMAL},
    {"layers.1.mlp.experts.2.down_proj", EDGE_NEG_CODES},
    {"layers.1.mlp.experts.4.gate_proj", EDGE_TINY},
    {"layers.1.mlp.experts.4.up_proj", EDGE_TINY},
    {"layers.1.mlp.experts.4.down_proj", EDGE_TINY},
    {"layers.2.mlp.experts.3.up_proj", EDGE_NAN_CODE},
    {"layers.2.mlp.experts.5.down_proj", EDGE_LARGE},
    {"layers.2.mlp.experts.6.down_proj", EDGE_HUGE},
    {"layers.3.mlp.experts.6.gate_proj", EDGE_UNSYNCED},
    {"layers.3.mlp.experts.6.up_proj", EDGE_UNSYNCED},
    {"layers.3.mlp.experts.7.down_proj", EDGE_ALL_ZERO},
};

/* JSON building with one out-of-memory flag instead of a check per call. */
typedef struct jb {
    bool oom;
} jb;

static void j_num(jb *b, cJSON *o, const char *k, double v)
{
    if (!cJSON_AddNumberToObject(o, k, v)) b->oom = true;
}
static void j_str(jb *b, cJSON *o, const char *k, const char *v)
{
    if (!cJSON_AddStringToObject(o, k, v)) b->oom = true;
}
static void j_bool(jb *b, cJSON *o, const char *k, bool v)
{
    if (!cJSON_AddBoolToObject(o, k, v)) b->oom = true;
}
static void j_null(jb *b, cJSON *o, const char *k)
{
    if (!cJSON_AddNullToObject(o, k)) b->oom = true;
}
static cJSON *j_obj(jb *b, cJSON *o, const char *k)
{
    cJSON *c = cJSON_AddObjectToObject(o, k);
    if (!c) b->oom = true;
    return c;
}
static cJSON *j_arr(jb *b, cJSON *o, const char *k)
{
    cJSON *c = cJSON_AddArrayToObject(o, k);
    if (!c) b->oom = true;
    return c;
}
static void j_push_str(jb *b, cJSON *arr, const char *s)
{
    cJSON *v = cJSON_CreateString(s);
    if (!v || !cJSON_AddItemToArray(arr, v)) {
        cJSON_Delete(v);
        b->oom = true;
    }
}
static void j_push_num(jb *b, cJSON *arr, double x)
{
    cJSON *v = cJSON_CreateNumber(x);
    if (!v || !cJSON_AddItemToArray(arr, v)) {
        cJSON_Delete(v);
        b->oom = true;
    }
}

typedef struct preset_ctx {
    const td_gen_opts *o;
    jb b;
    cJSON *config;     /* config.json */
    cJSON *hf;         /* hf_quant_config.json or NULL */
    int64_t experts;   /* resolved expert count */
    int64_t shard_bytes_default;
    const edge_spec *edges;
    size_t n_edges;
} preset_ctx;

/* Dimensions of a qwen3_next preset. */
typedef struct q3_dims {
    int64_t hidden, layers, vocab, heads, kv_heads, head_dim;
    int64_t lin_k, lin_v, lin_dk, lin_dv, experts, topk, inter, shared, max_pos;
} q3_dims;

/* Dimensions of a qwen4_exp preset (text config). */
typedef struct q4_dims {
    int64_t hidden, layers, vocab, heads, kv_heads, head_dim;
    int64_t lin_k, lin_v, lin_dk, lin_dv, experts, topk, inter, shared, max_pos;
    int64_t hc_count, hc_lowrank, idx_heads, idx_dim, idx_budget;
    int64_t ple_layer;   /* 1-based PLE layer id, 0 = none */
    int64_t ngram_base, ngram_div, ngram_parts;
} q4_dims;

static const char *const q3_excludes[] = {
    /* NVIDIA's qwen3next NVFP4 recipe (MODEL_SPEC.md A6): everything but routed experts,
     * shared experts, self_attn.o_proj and linear_attn.out_proj stays BF16. */
    "lm_head",
    "model.embed_tokens",
    "model.layers.*.linear_attn.in_proj_qkvz",
    "model.layers.*.linear_attn.in_proj_ba",
    "model.layers.*.linear_attn.conv1d",
    "model.layers.*.self_attn.q_proj",
    "model.layers.*.self_attn.k_proj",
    "model.layers.*.self_attn.v_proj",
    "model.layers.*.mlp.gate",
    "model.layers.*.mlp.shared_expert_gate",
    "mtp.*",
};

static void producer(preset_ctx *c, cJSON *o)
{
    cJSON *p = j_obj(&c->b, o, "producer");
    j_str(&c->b, p, "name", "tandem");
    j_str(&c->b, p, "version", td_version());
}

static void nvfp4_args(preset_ctx *c, cJSON *o, const char *key)
{
    cJSON *a = j_obj(&c->b, o, key);
    j_bool(&c->b, a, "dynamic", false);
    j_num(&c->b, a, "num_bits", 4);
    j_str(&c->b, a, "type", "float");
    j_num(&c->b, a, "group_size", 16);
}

/* ModelOpt NVFP4 (W4A4): hf_quant_config.json plus the converted config.json form, with the
 * same exclusion list in both (NVFP4_SPEC.md §4.1, §4.2). */
static void modelopt_nvfp4(preset_ctx *c, const char *const *excl, size_t n_excl)
{
    jb *b = &c->b;
    c->hf = cJSON_CreateObject();
    if (!c->hf) {
        b->oom = true;
        return;
    }
    producer(c, c->hf);
    cJSON *q = j_obj(b, c->hf, "quantization");
    j_str(b, q, "quant_algo", "NVFP4");
    j_null(b, q, "kv_cache_quant_algo");
    j_num(b, q, "group_size", 16);
    cJSON *ex = j_arr(b, q, "exclude_modules");
    for (size_t i = 0; i < n_excl; i++) j_push_str(b, ex, excl[i]);

    cJSON *qc = j_obj(b, c->config, "quantization_config");
    cJSON *g = j_obj(b, j_obj(b, qc, "config_groups"), "group_0");
    nvfp4_args(c, g, "input_activations");
    nvfp4_args(c, g, "weights");
    j_push_str(b, j_arr(b, g, "targets"), "Linear");
    cJSON *ig = j_arr(b, qc, "ignore");
    for (size_t i = 0; i < n_excl; i++) j_push_str(b, ig, excl[i]);
    j_str(b, qc, "quant_algo", "NVFP4");
    j_null(b, qc, "kv_cache_scheme");
    producer(c, qc);
    j_str(b, qc, "quant_method", "modelopt");
}

/* ModelOpt MIXED_PRECISION in config.json (the nvidia Flash-Next release form, MODEL_SPEC.md
 * B6): routed experts of every layer NVFP4, the PLE n-gram table FP8, everything else BF16. */
static void modelopt_mixed(preset_ctx *c, const char *prefix, int64_t layers, int64_t ple_layer)
{
    jb *b = &c->b;
    char name[160];
    cJSON *qc = j_obj(b, c->config, "quantization_config");
    cJSON *groups = j_obj(b, qc, "config_groups");
    cJSON *g0 = j_obj(b, groups, "group_0");
    nvfp4_args(c, g0, "input_activations");
    nvfp4_args(c, g0, "weights");
    cJSON *t0 = j_arr(b, g0, "targets");
    for (int64_t l = 0; l < layers; l++) {
        snprintf(name, sizeof name, "%slayers.%lld.mlp.experts", prefix, (long long)l);
        j_push_str(b, t0, name);
    }
    if (ple_layer > 0) {
        cJSON *g1 = j_obj(b, groups, "group_1");
        cJSON *w = j_obj(b, g1, "weights");
        j_bool(b, w, "dynamic", false);
        j_num(b, w, "num_bits", 8);
        j_str(b, w, "type", "float");
        snprintf(name, sizeof name, "%slayers.%lld.ple.ple_embedding.ngram_embedding", prefix,
                 (long long)(ple_layer - 1));
        j_push_str(b, j_arr(b, g1, "targets"), name);
    }
    cJSON *ig = j_arr(b, qc, "ignore");
    static const char *const ignore[] = {
        "lm_head", "*embed_tokens", "*.self_attn.*", "*.linear_attn.*", "*.mlp.gate",
        "*.mlp.shared_expert.*", "*.mlp.shared_expert_gate", "*hyper_connection*",
        "*.ple.key_proj", "*.ple.value_proj", "mtp.*",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(ignore); i++) j_push_str(b, ig, ignore[i]);
    j_null(b, qc, "kv_cache_scheme");
    producer(c, qc);
    j_str(b, qc, "quant_algo", "MIXED_PRECISION");
    j_str(b, qc, "quant_method", "modelopt");
    cJSON *ql = j_obj(b, qc, "quantized_layers");
    for (int64_t l = 0; l < layers; l++) {
        snprintf(name, sizeof name, "%slayers.%lld.mlp.experts", prefix, (long long)l);
        cJSON *e = j_obj(b, ql, name);
        j_str(b, e, "quant_algo", "NVFP4");
        j_num(b, e, "group_size", 16);
    }
    if (ple_layer > 0) {
        snprintf(name, sizeof name, "%slayers.%lld.ple.ple_embedding.ngram_embedding", prefix,
                 (long long)(ple_layer - 1));
        j_str(b, j_obj(b, ql, name), "quant_algo", "FP8");
    }
}

static void layer_types(preset_ctx *c, cJSON *o, int64_t layers, const char *attn_name,
                        const int64_t *attn_layers, size_t n_attn)
{
    cJSON *lt = j_arr(&c->b, o, "layer_types");
    for (int64_t l = 0; l < layers; l++) {
        bool attn = false;
        for (size_t i = 0; i < n_attn; i++) attn = attn || attn_layers[i] == l;
        j_push_str(&c->b, lt, attn ? attn_name : "linear_attention");
    }
}

/* Depth with --layers: at least the preset's, deep enough for every listed id. */
static int64_t pick_layers(const preset_ctx *c, int64_t def)
{
    for (size_t i = 0; i < c->o->n_layer_ids; i++)
        if (c->o->layer_ids[i] + 1 > def) def = c->o->layer_ids[i] + 1;
    return def;
}

/* Record the --layers subset in the (text) config. */
static void layers_present(preset_ctx *c, cJSON *obj)
{
    if (c->o->n_layer_ids == 0) return;
    cJSON *a = j_arr(&c->b, obj, "tandem_layers_present");
    for (size_t i = 0; i < c->o->n_layer_ids; i++) j_push_num(&c->b, a, (double)c->o->layer_ids[i]);
}

static void q3_config(preset_ctx *c, const q3_dims *d)
{
    jb *b = &c->b;
    cJSON *o = c->config;
    j_push_str(b, j_arr(b, o, "architectures"), "Qwen3NextForCausalLM");
    j_str(b, o, "model_type", "qwen3_next");
    j_bool(b, o, "attention_bias", false);
    j_num(b, o, "attention_dropout", 0.0);
    j_num(b, o, "bos_token_id", 1);
    j_num(b, o, "eos_token_id", 2);
    j_num(b, o, "decoder_sparse_step", 1);
    j_str(b, o, "dtype", "bfloat16");
    j_num(b, o, "full_attention_interval", 4);
    j_num(b, o, "head_dim", (double)d->head_dim);
    j_str(b, o, "hidden_act", "silu");
    j_num(b, o, "hidden_size", (double)d->hidden);
    j_num(b, o, "initializer_range", 0.02);
    j_num(b, o, "intermediate_size", (double)(4 * d->hidden));
    int64_t attn[TD_CONFIG_MAX_LAYERS / 4];
    size_t n_attn = 0;
    for (int64_t l = 3; l < d->layers; l += 4) attn[n_attn++] = l;
    layer_types(c, o, d->layers, "full_attention", attn, n_attn);
    j_num(b, o, "linear_conv_kernel_dim", 4);
    j_num(b, o, "linear_key_head_dim", (double)d->lin_dk);
    j_num(b, o, "linear_num_key_heads", (double)d->lin_k);
    j_num(b, o, "linear_num_value_heads", (double)d->lin_v);
    j_num(b, o, "linear_value_head_dim", (double)d->lin_dv);
    j_num(b, o, "max_position_embeddings", (double)d->max_pos);
    j_arr(b, o, "mlp_only_layers");
    j_num(b, o, "moe_intermediate_size", (double)d->inter);
    j_bool(b, o, "norm_topk_prob", true);
    j_num(b, o, "num_attention_heads", (double)d->heads);
    j_num(b, o, "num_experts", (double)d->experts);
    j_num(b, o, "num_experts_per_tok", (double)d->topk);
    j_num(b, o, "num_hidden_layers", (double)d->layers);
    layers_present(c, o);
    j_num(b, o, "num_key_value_heads", (double)d->kv_heads);
    j_num(b, o, "partial_rotary_factor", 0.25);
    j_num(b, o, "rms_norm_eps", 1e-6);
    cJSON *rp = j_obj(b, o, "rope_parameters");
    j_num(b, rp, "partial_rotary_factor", 0.25);
    j_num(b, rp, "rope_theta", 5000000.0);
    j_str(b, rp, "rope_type", "default");
    j_num(b, o, "shared_expert_intermediate_size", (double)d->shared);
    j_bool(b, o, "tie_word_embeddings", false);
    j_bool(b, o, "use_cache", true);
    j_num(b, o, "vocab_size", (double)d->vocab);
}

static void q4_config(preset_ctx *c, const q4_dims *d)
{
    jb *b = &c->b;
    cJSON *o = c->config;
    j_push_str(b, j_arr(b, o, "architectures"), "Qwen4ExpForConditionalGeneration");
    j_str(b, o, "model_type", "qwen4_exp");
    j_num(b, o, "bos_token_id", 1);
    j_num(b, o, "eos_token_id", 2);
    j_bool(b, o, "tie_word_embeddings", false);
    cJSON *t = j_obj(b, o, "text_config");
    j_str(b, t, "model_type", "qwen4_exp_text");
    j_bool(b, t, "attention_bias", false);
    j_num(b, t, "bos_token_id", 1);
    j_num(b, t, "eos_token_id", 2);
    j_str(b, t, "dtype", "bfloat16");
    j_num(b, t, "hc_count", (double)d->hc_count);
    j_num(b, t, "hc_lowrank", (double)d->hc_lowrank);
    j_num(b, t, "head_dim", (double)d->head_dim);
    j_num(b, t, "heads_per_ngram", 8);
    j_str(b, t, "hidden_act", "silu");
    j_num(b, t, "hidden_size", (double)d->hidden);
    j_num(b, t, "indexer_budget", (double)d->idx_budget);
    j_num(b, t, "indexer_compress_ratio", 4);
    j_num(b, t, "indexer_head_dim", (double)d->idx_dim);
    j_num(b, t, "indexer_kv_heads", 1);
    j_num(b, t, "indexer_n_heads", (double)d->idx_heads);
    j_num(b, t, "initializer_range", 0.02);
    int64_t attn[TD_CONFIG_MAX_LAYERS / 4];
    size_t n_attn = 0;
    for (int64_t l = 3; l < d->layers; l += 4) attn[n_attn++] = l;
    layer_types(c, t, d->layers, "full_attention", attn, n_attn);
    j_num(b, t, "linear_conv_kernel_dim", 4);
    j_num(b, t, "linear_key_head_dim", (double)d->lin_dk);
    j_num(b, t, "linear_num_key_heads", (double)d->lin_k);
    j_num(b, t, "linear_num_value_heads", (double)d->lin_v);
    j_num(b, t, "linear_value_head_dim", (double)d->lin_dv);
    j_num(b, t, "make_ngram_vocab_size_divisible_by", (double)d->ngram_div);
    j_num(b, t, "max_position_embeddings", (double)d->max_pos);
    j_num(b, t, "moe_intermediate_size", (double)d->inter);
    j_num(b, t, "ngram_size", 3);
    j_num(b, t, "ngram_vocab_size_base", (double)d->ngram_base);
    j_bool(b, t, "norm_topk_prob", true);
    j_num(b, t, "num_attention_heads", (double)d->heads);
    j_num(b, t, "num_experts", (double)d->experts);
    j_num(b, t, "num_experts_per_tok", (double)d->topk);
    j_num(b, t, "num_hidden_layers", (double)d->layers);
    layers_present(c, t);
    j_num(b, t, "num_key_value_heads", (double)d->kv_heads);
    j_str(b, t, "output_gate_type", "sigmoid");
    j_num(b, t, "ple_conv_kernel_size", 4);
    j_num(b, t, "ple_embed_dim", (double)d->hidden);
    cJSON *pl = j_arr(b, t, "ple_layer_ids");
    if (d->ple_layer > 0) j_push_num(b, pl, (double)d->ple_layer);
    j_num(b, t, "rms_norm_eps", 1e-6);
    cJSON *rp = j_obj(b, t, "rope_parameters");
    j_num(b, rp, "partial_rotary_factor", 0.25);
    j_num(b, rp, "rope_theta", 10000000.0);
    j_str(b, rp, "rope_type", "default");
    j_num(b, t, "seed", 1234);
    j_num(b, t, "shared_expert_intermediate_size", (double)d->shared);
    j_num(b, t, "split_ngram_parts", (double)d->ngram_parts);
    j_bool(b, t, "tie_word_embeddings", false);
    j_bool(b, t, "use_cache", true);
    j_num(b, t, "vocab_size", (double)d->vocab);
}

static int64_t pick_experts(const preset_ctx *c, int64_t def)
{
    return c->o->num_experts > 0 ? c->o->num_experts : def;
}

static void preset_qwen3_next_tiny(preset_ctx *c)
{
    q3_dims d = {.hidden = 256, .layers = 8, .vocab = 4096, .heads = 4, .kv_heads = 2,
                 .head_dim = 64, .lin_k = 4, .lin_v = 8, .lin_dk = 32, .lin_dv = 32,
                 .experts = pick_experts(c, 64), .topk = 4, .inter = 64, .shared = 64,
                 .max_pos = 4096};
    if (d.topk > d.experts) d.topk = d.experts;
    d.layers = pick_layers(c, d.layers);
    c->experts = d.experts;
    c->shard_bytes_default = 0;
    q3_config(c, &d);
    if (!c->o->unquantized) modelopt_nvfp4(c, q3_excludes, TD_ARRAY_LEN(q3_excludes));
}

static void preset_flash_next_tiny(preset_ctx *c)
{
    q4_dims d = {.hidden = 256, .layers = 8, .vocab = 4096, .heads = 4, .kv_heads = 2,
                 .head_dim = 64, .lin_k = 4, .lin_v = 12, .lin_dk = 32, .lin_dv = 32,
                 .experts = pick_experts(c, 64), .topk = 4, .inter = 64, .shared = 64,
                 .max_pos = 4096, .hc_count = 4, .hc_lowrank = 32, .idx_heads = 4,
                 .idx_dim = 32, .idx_budget = 128, .ple_layer = 2, .ngram_base = 1000,
                 .ngram_div = 128, .ngram_parts = 8};
    if (d.topk > d.experts) d.topk = d.experts;
    d.layers = pick_layers(c, d.layers);
    c->experts = d.experts;
    c->shard_bytes_default = 8 << 20;
    q4_config(c, &d);
    if (!c->o->unquantized) modelopt_mixed(c, "model.language_model.", d.layers, d.ple_layer);
}

static void preset_flash_next_moe_layer(preset_ctx *c)
{
    q4_dims d = {.hidden = 2560, .layers = 1, .vocab = 1024, .heads = 24, .kv_heads = 2,
                 .head_dim = 256, .lin_k = 16, .lin_v = 48, .lin_dk = 128, .lin_dv = 128,
                 .experts = pick_experts(c, 512), .topk = 10, .inter = 640, .shared = 640,
                 .max_pos = 262144, .hc_count = 4, .hc_lowrank = 320, .idx_heads = 4,
                 .idx_dim = 128, .idx_budget = 2048, .ple_layer = 0,
                 .ngram_base = 20000000, .ngram_div = 128, .ngram_parts = 128};
    if (d.topk > d.experts) d.topk = d.experts;
    d.layers = pick_layers(c, d.layers);
    c->experts = d.experts;
    c->shard_bytes_default = (int64_t)512 << 20;
    q4_config(c, &d);
    if (!c->o->unquantized) modelopt_mixed(c, "model.language_model.", d.layers, 0);
}

static void preset_edge(preset_ctx *c)
{
    q3_dims d = {.hidden = 128, .layers = 4, .vocab = 512, .heads = 2, .kv_heads = 1,
                 .head_dim = 64, .lin_k = 2, .lin_v = 4, .lin_dk = 32, .lin_dv = 32,
                 .experts = 8, .topk = 2, .inter = 64, .shared = 64, .max_pos = 4096};
    d.layers = pick_layers(c, d.layers);
    c->experts = d.experts;
    c->shard_bytes_default = 0;
    c->edges = edge_modules;
    c->n_edges = TD_ARRAY_LEN(edge_modules);
    q3_config(c, &d);
    if (!c->o->unquantized) modelopt_nvfp4(c, q3_excludes, TD_ARRAY_LEN(q3_excludes));
}

typedef struct preset_def {
    td_gen_preset_info info;
    void (*build)(preset_ctx *c);
    bool fixed_experts;  /* --experts cannot change it */
} preset_def;

static const preset_def presets[] = {
    {{"qwen3-next-tiny",
      "qwen3_next, hidden 256, 8 layers (GDN x3 + attention), 64 experts top-4 + shared; "
      "NVFP4 (ModelOpt recipe: experts, shared experts, o_proj, out_proj), BF16 elsewhere"},
     preset_qwen3_next_tiny, false},
    {{"flash-next-tiny",
      "qwen4_exp (text_config), hidden 256, 8 layers, HC x4, PLE at layer 1 (FP8 n-gram table), "
      "QSA budget 128, 64 experts top-4 + shared; NVFP4 routed experts (MIXED_PRECISION)"},
     preset_flash_next_tiny, false},
    {{"flash-next-moe-layer",
      "qwen4_exp, one GDN + MoE layer at production shape: hidden 2560, 512 experts x 640, "
      "top-10, shared 640; per-expert NVFP4 tensors as in the release (~1.5 GiB)"},
     preset_flash_next_moe_layer, false},
    {{"edge",
      "qwen3_next, hidden 128, 4 layers, 8 experts; NVFP4 scales with the hard cases: zero "
      "blocks, zero/subnormal/negative/NaN E4M3 codes, tiny/large/huge globals, unsynced gate/up"},
     preset_edge, true},
};

size_t td_gen_preset_count(void)
{
    return TD_ARRAY_LEN(presets);
}

const td_gen_preset_info *td_gen_preset_at(size_t i)
{
    TD_ASSERT(i < TD_ARRAY_LEN(presets));
    return &presets[i].info;
}

void td_gen_opts_init(td_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->shard_bytes = -1;
}

/* ============================================================================================
 * 3. The plan
 * ========================================================================================== */

typedef enum job_kind {
    JOB_DENSE = 0,       /* one BF16/F32 tensor from a distribution */
    JOB_NVFP4,           /* 1 module, or a gate/up pair sharing amax */
    JOB_FUSED_GATE_UP,   /* [E, 2I, H] BF16 from the per-expert gate/up streams */
    JOB_FUSED_DOWN,      /* [E, H, I] BF16 from the per-expert down streams */
    JOB_TABLE_FP8,       /* one n-gram table shard as E4M3 codes */
    JOB_SCALAR_F32,      /* a fixed F32 scalar */
    JOB_I64,             /* fixed I64 values */
} job_kind;

typedef enum gen_dist {
    DIST_LINEAR = 0,  /* heavy-tailed, per-row and per-column scaled */
    DIST_EMBED,       /* embedding rows */
    DIST_NORM_ZC,     /* zero-centred norm weights (used as 1 + w) */
    DIST_NORM_ONE,    /* plain multiplier norm weights (around 1) */
    DIST_CONV,        /* depthwise conv kernels */
    DIST_A_LOG,       /* GDN A_log = log(A), A ~ U[1, 16) */
    DIST_DT_BIAS,     /* GDN dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] */
    DIST_TABLE,       /* PLE n-gram table rows */
} gen_dist;

#define JOB_MAX_MOD 2
#define JOB_MAX_I64 TD_PLE_MAX_HEADS

struct td_gen_job {
    job_kind kind;
    gen_dist dist;
    td_dtype dtype;             /* JOB_DENSE output dtype */
    int32_t tensor0, n_tensors; /* its tensors in plan order */
    int n_mod;                  /* JOB_NVFP4 modules */
    char key[JOB_MAX_MOD][192]; /* stream keys: module (or tensor) names */
    uint32_t edge[JOB_MAX_MOD];
    int64_t rows, cols;         /* per module / tensor, 2-D view of the values */
    td_nvfp4_conv conv;
    bool input_scale;           /* W4A4: write input_scale */
    int64_t experts, inter, hidden; /* fused expert jobs */
    char fused_base[160];       /* "PREFIXlayers.L.mlp.experts" */
    float value;                /* JOB_SCALAR_F32 */
    float table_scale;          /* JOB_TABLE_FP8: code = e4m3(v / table_scale) */
    int64_t i64[JOB_MAX_I64];
    int n_i64;
    int64_t work;               /* elements (progress units) */
};

/* Distribution constants (documented in docs/gen-quantize.md and tandem_gen.json). */
#define GEN_ROW_SPREAD 0.15    /* per-row log-normal scale, sigma of log */
#define GEN_COL_SPREAD 0.1     /* per-input-channel log-normal scale */
#define GEN_TENSOR_SPREAD 0.3  /* per-tensor log-normal scale */
#define GEN_HOT_FRAC 0.0078125 /* 1/128 of the input channels are "hot" */
#define GEN_HOT_GAIN 1.5       /* ... and scaled by this */
#define GEN_OUTLIER_EVERY 65536 /* one outlier per this many elements (at least one) */
#define GEN_OUTLIER_MIN 10.0   /* outlier magnitude in units of the element scale */
#define GEN_OUTLIER_MAX 20.0
#define GEN_EMBED_SIGMA 0.02
#define GEN_NORM_SIGMA 0.1
#define GEN_TABLE_SIGMA 0.05
#define GEN_TABLE_CLIP 8.0     /* FP8 table scale = clip * sigma / 448 */

typedef struct plan_builder {
    td_gen_plan *p;
    size_t cap_t, cap_j;
    td_err *err;
    td_status st;
} plan_builder;

static struct td_gen_job *new_job(plan_builder *b, job_kind kind)
{
    if (b->st) return NULL;
    td_gen_plan *p = b->p;
    if (p->n_jobs == b->cap_j) {
        size_t nc = b->cap_j ? b->cap_j * 2 : 256;
        struct td_gen_job *j = realloc(p->jobs, nc * sizeof *j);
        if (!j) {
            b->st = td_err_set(b->err, TD_ERR_NOMEM, "gen: out of memory");
            return NULL;
        }
        p->jobs = j;
        b->cap_j = nc;
    }
    struct td_gen_job *j = &p->jobs[p->n_jobs++];
    memset(j, 0, sizeof *j);
    j->kind = kind;
    j->tensor0 = (int32_t)p->n_tensors;
    return j;
}

static void add_tensor(plan_builder *b, struct td_gen_job *j, const char *name, td_dtype dt,
                       int nd, int64_t d0, int64_t d1, int64_t d2)
{
    if (b->st || !j) return;
    td_gen_plan *p = b->p;
    if (p->n_tensors == b->cap_t) {
        size_t nc = b->cap_t ? b->cap_t * 2 : 1024;
        td_gen_tensor *t = realloc(p->tensors, nc * sizeof *t);
        if (!t) {
            b->st = td_err_set(b->err, TD_ERR_NOMEM, "gen: out of memory");
            return;
        }
        p->tensors = t;
        b->cap_t = nc;
    }
    td_gen_tensor *t = &p->tensors[p->n_tensors];
    memset(t, 0, sizeof *t);
    if (strlen(name) >= sizeof t->name) {
        b->st = td_err_set(b->err, TD_ERR_RANGE, "gen: tensor name too long: %.80s...", name);
        return;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = nd;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    int64_t numel;
    td_status st = td_shape_numel(nd, t->shape, &numel, b->err);
    if (!st) st = td_dtype_nbytes(dt, numel, &t->nbytes, b->err);
    if (st) {
        b->st = st;
        return;
    }
    t->job = (int32_t)(j - p->jobs);
    p->n_tensors++;
    j->n_tensors++;
    p->total_bytes += t->nbytes;
}

static void set_key(plan_builder *b, struct td_gen_job *j, int k, const char *name)
{
    if (!j) return;
    if (strlen(name) >= sizeof j->key[k]) {
        b->st = td_err_set(b->err, TD_ERR_RANGE, "gen: module name too long: %.80s...", name);
        return;
    }
    snprintf(j->key[k], sizeof j->key[k], "%s", name);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static uint32_t edge_flags(const preset_ctx *c, const char *prefix, const char *module)
{
    size_t pl = strlen(prefix);
    if (strncmp(module, prefix, pl)) return 0;
    for (size_t i = 0; i < c->n_edges; i++)
        if (!strcmp(module + pl, c->edges[i].module)) return c->edges[i].flags;
    return 0;
}

/* Activation amax behind a W4A4 input_scale: log-normal around 8 (deterministic per key). */
static float input_scale_for(uint64_t seed, const char *key)
{
    td_rng r;
    td_rng_seed(&r, gen_key(seed, key) ^ UINT64_C(0x696e707574));
    double amax = gen_exp(td_rng_log(8.0) + 0.5 * td_rng_normal(&r));
    float a = gen_bf16_round((float)amax);
    return a / TD_NVFP4_AMAX_SCALE;
}

/* The I64 buffers of the PLE embedding (MODEL_SPEC.md B3.4). */
static void ple_buffers(const td_config *cfg, int64_t ple_index, const td_ple_dims *d,
                        const char *name, struct td_gen_job *j)
{
    if (ends_with(name, "layer_multipliers")) {
        uint64_t half = (uint64_t)(INT64_MAX / cfg->vocab_size) / 2;
        for (int64_t n = 0; n < cfg->ngram_size && n < JOB_MAX_I64; n++) {
            uint64_t v = (uint64_t)cfg->seed + UINT64_C(10007) * (uint64_t)ple_index +
                         GEN_GOLDEN * (uint64_t)(n + 1);
            j->i64[n] = (int64_t)(2 * (gen_mix64(v + GEN_GOLDEN) % half) + 1);
        }
        j->n_i64 = (int)(cfg->ngram_size < JOB_MAX_I64 ? cfg->ngram_size : JOB_MAX_I64);
    } else {
        bool off = ends_with(name, "ngram_heads_offsets");
        for (int64_t h = 0; h < d->heads; h++) j->i64[h] = off ? d->offsets[h] : d->sizes[h];
        j->n_i64 = (int)d->heads;
    }
}

/* One inventory module → jobs and tensors. *skip is set when the next module was consumed. */
static void plan_module(plan_builder *b, const preset_ctx *c, const td_layout *lay, size_t i,
                        bool *skip)
{
    td_gen_plan *p = b->p;
    const td_module *m = &lay->mods[i];
    char name[256];
    td_quant_tensors qt;
    struct td_gen_job *j;
    *skip = false;

    switch (m->kind) {
    case TD_MOD_LINEAR:
    case TD_MOD_EMBEDDING: {
        td_status st = td_quant_resolve(&p->quant, m->name, m->kind == TD_MOD_LINEAR, &qt, b->err);
        if (st) {
            b->st = st;
            return;
        }
        if (qt.scheme == TD_SCHEME_NONE) {
            j = new_job(b, JOB_DENSE);
            if (!j) return;
            j->dist = m->kind == TD_MOD_EMBEDDING ? DIST_EMBED : DIST_LINEAR;
            j->dtype = TD_BF16;
            j->rows = m->shape[0];
            j->cols = m->shape[1];
            j->work = j->rows * j->cols;
            set_key(b, j, 0, m->name);
            add_tensor(b, j, qt.weight, TD_BF16, 2, m->shape[0], m->shape[1], 0);
            return;
        }
        if (qt.scheme != TD_SCHEME_NVFP4 && qt.scheme != TD_SCHEME_NVFP4_CT) {
            b->st = td_err_set(b->err, TD_ERR_UNSUPPORTED, "gen: %s: scheme %s is not generated",
                               m->name, td_scheme_name(qt.scheme));
            return;
        }
        if (m->kind != TD_MOD_LINEAR || m->shape[1] % TD_NVFP4_BLOCK) {
            b->st = td_err_set(b->err, TD_ERR_UNSUPPORTED,
                               "gen: %s: NVFP4 needs a linear module with in %% 16 == 0", m->name);
            return;
        }
        j = new_job(b, JOB_NVFP4);
        if (!j) return;
        j->conv = qt.scheme == TD_SCHEME_NVFP4 ? TD_NVFP4_MODELOPT : TD_NVFP4_CT;
        j->rows = m->shape[0];
        j->cols = m->shape[1];
        j->input_scale = qt.input_scale[0] != 0;
        j->n_mod = 1;
        set_key(b, j, 0, m->name);
        j->edge[0] = edge_flags(c, p->prefix, m->name);
        td_quant_tensors qt2;
        memset(&qt2, 0, sizeof qt2);
        bool pair = false;
        if (ends_with(m->name, ".gate_proj") && i + 1 < lay->n) {
            const td_module *u = &lay->mods[i + 1];
            size_t base = strlen(m->name) - strlen("gate_proj");
            if (u->kind == TD_MOD_LINEAR && !strncmp(u->name, m->name, base) &&
                !strcmp(u->name + base, "up_proj") && u->shape[0] == m->shape[0] &&
                u->shape[1] == m->shape[1]) {
                td_status st2 = td_quant_resolve(&p->quant, u->name, true, &qt2, b->err);
                if (st2) {
                    b->st = st2;
                    return;
                }
                pair = qt2.scheme == qt.scheme;
            }
        }
        const td_quant_tensors *qs[2] = {&qt, &qt2};
        if (pair) {
            j->n_mod = 2;
            set_key(b, j, 1, lay->mods[i + 1].name);
            j->edge[1] = edge_flags(c, p->prefix, lay->mods[i + 1].name);
            *skip = true;
        }
        for (int k = 0; k < j->n_mod; k++) {
            const td_quant_tensors *q = qs[k];
            bool ct = q->scheme == TD_SCHEME_NVFP4_CT;
            add_tensor(b, j, q->weight, TD_U8, 2, j->rows, j->cols / 2, 0);
            add_tensor(b, j, q->scale, TD_F8_E4M3, 2, j->rows, j->cols / TD_NVFP4_BLOCK, 0);
            add_tensor(b, j, q->global, TD_F32, ct ? 1 : 0, 1, 0, 0);
            if (q->input_scale[0]) add_tensor(b, j, q->input_scale, TD_F32, ct ? 1 : 0, 1, 0, 0);
        }
        j->work = j->n_mod * j->rows * j->cols;
        p->nvfp4_modules += j->n_mod;
        return;
    }
    case TD_MOD_TABLE: {
        td_status st = td_quant_resolve(&p->quant, m->name, false, &qt, b->err);
        if (st) {
            b->st = st;
            return;
        }
        bool fp8 = qt.scheme == TD_SCHEME_FP8;
        if (!fp8 && qt.scheme != TD_SCHEME_NONE) {
            b->st = td_err_set(b->err, TD_ERR_UNSUPPORTED, "gen: %s: table scheme %s is not generated",
                               m->name, td_scheme_name(qt.scheme));
            return;
        }
        float scale = (float)(GEN_TABLE_CLIP * GEN_TABLE_SIGMA) / TD_E4M3_MAX;
        for (int32_t s = 0; s < m->parts && !b->st; s++) {
            snprintf(name, sizeof name, "%s.shard_%d.weight", m->name, s);
            j = new_job(b, fp8 ? JOB_TABLE_FP8 : JOB_DENSE);
            if (!j) return;
            j->dist = DIST_TABLE;
            j->dtype = TD_BF16;
            j->rows = m->shape[0];
            j->cols = m->shape[1];
            j->work = j->rows * j->cols;
            j->table_scale = scale;
            set_key(b, j, 0, name);
            add_tensor(b, j, name, fp8 ? TD_F8_E4M3 : TD_BF16, 2, m->shape[0], m->shape[1], 0);
        }
        if (fp8) {
            snprintf(name, sizeof name, "%s.weight_scale", m->name);
            j = new_job(b, JOB_SCALAR_F32);
            if (!j) return;
            j->value = scale;
            add_tensor(b, j, name, TD_F32, 0, 1, 0, 0);
        }
        return;
    }
    case TD_MOD_BUFFER: {
        int64_t idx = 0;
        for (int64_t k = 0; k < p->cfg.n_ple_layers; k++)
            if (p->cfg.ple_layer_ids[k] == m->layer + 1) idx = k;
        td_ple_dims d;
        td_status st = td_ple_table_dims(&p->cfg, idx, &d, b->err);
        if (st) {
            b->st = st;
            return;
        }
        j = new_job(b, JOB_I64);
        if (!j) return;
        ple_buffers(&p->cfg, idx, &d, m->name, j);
        if (j->n_i64 != m->shape[0]) {
            b->st = td_err_set(b->err, TD_ERR_INTERNAL, "gen: %s: %d values for shape [%lld]",
                               m->name, j->n_i64, (long long)m->shape[0]);
            return;
        }
        add_tensor(b, j, m->name, TD_I64, 1, m->shape[0], 0, 0);
        return;
    }
    case TD_MOD_PARAM:
    case TD_MOD_NORM:
    case TD_MOD_CONV: {
        if (m->kind == TD_MOD_PARAM) snprintf(name, sizeof name, "%s", m->name);
        else snprintf(name, sizeof name, "%s.weight", m->name);
        j = new_job(b, JOB_DENSE);
        if (!j) return;
        j->dtype = TD_BF16;
        if (m->kind == TD_MOD_CONV) {
            j->dist = DIST_CONV;
            j->rows = m->shape[0];
            j->cols = m->shape[2];
        } else {
            j->rows = 1;
            j->cols = m->shape[0];
            if (m->kind == TD_MOD_PARAM)
                j->dist = ends_with(m->name, "A_log") ? DIST_A_LOG
                          : ends_with(m->name, "dt_bias") ? DIST_DT_BIAS : DIST_NORM_ZC;
            else
                j->dist = ends_with(m->name, "linear_attn.norm") ? DIST_NORM_ONE : DIST_NORM_ZC;
        }
        j->work = j->rows * j->cols;
        set_key(b, j, 0, name);
        add_tensor(b, j, name, TD_BF16, m->ndim, m->shape[0], m->shape[1], m->shape[2]);
        return;
    }
    default:
        b->st = td_err_set(b->err, TD_ERR_INTERNAL, "gen: %s: unknown module kind", m->name);
        return;
    }
}

/* The fused 3-D expert tensors of one layer (unquantized + fused_experts). */
static void plan_fused(plan_builder *b, int64_t layer)
{
    td_gen_plan *p = b->p;
    char gu[128], dn[128];
    int64_t gus[3], dns[3];
    td_layout_fused_experts(&p->cfg, p->prefix, layer, gu, gus, dn, dns);
    for (int k = 0; k < 2; k++) {
        struct td_gen_job *j = new_job(b, k ? JOB_FUSED_DOWN : JOB_FUSED_GATE_UP);
        if (!j) return;
        j->experts = p->cfg.num_experts;
        j->inter = p->cfg.moe_intermediate_size;
        j->hidden = p->cfg.hidden_size;
        snprintf(j->fused_base, sizeof j->fused_base, "%slayers.%lld.mlp.experts", p->prefix,
                 (long long)layer);
        const int64_t *s = k ? dns : gus;
        j->work = s[0] * s[1] * s[2];
        add_tensor(b, j, k ? dn : gu, TD_BF16, 3, s[0], s[1], s[2]);
    }
}

static void plan_shards(td_gen_plan *p, int64_t limit, plan_builder *b)
{
    int64_t cur = 0;
    int32_t shard = 0;
    for (size_t ji = 0; ji < p->n_jobs; ji++) {
        const struct td_gen_job *j = &p->jobs[ji];
        int64_t bytes = 0;
        for (int32_t t = 0; t < j->n_tensors; t++) bytes += p->tensors[j->tensor0 + t].nbytes;
        if (limit > 0 && cur > 0 && cur + bytes > limit) {
            shard++;
            cur = 0;
        }
        cur += bytes;
        for (int32_t t = 0; t < j->n_tensors; t++) p->tensors[j->tensor0 + t].shard = shard;
    }
    p->n_shards = (size_t)shard + 1;
    p->shards = calloc(p->n_shards, sizeof *p->shards);
    if (!p->shards) {
        b->st = td_err_set(b->err, TD_ERR_NOMEM, "gen: out of memory");
        return;
    }
    for (size_t s = 0; s < p->n_shards; s++) {
        if (p->n_shards == 1) snprintf(p->shards[s], sizeof p->shards[s], "model.safetensors");
        else
            snprintf(p->shards[s], sizeof p->shards[s], "model-%05zu-of-%05zu.safetensors", s + 1,
                     p->n_shards);
    }
}

/* Record one injected hard case in the provenance. */
static void edge_record(jb *jbb, cJSON *arr, const char *tensor, const char *kase, int64_t row,
                        int64_t block, const char *detail)
{
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToArray(arr, e)) {
        cJSON_Delete(e);
        jbb->oom = true;
        return;
    }
    j_str(jbb, e, "tensor", tensor);
    j_str(jbb, e, "case", kase);
    if (row >= 0) j_num(jbb, e, "row", (double)row);
    if (block >= 0) j_num(jbb, e, "block", (double)block);
    j_str(jbb, e, "detail", detail);
}

/* Positions used by the edge cases (shared by the injection and the provenance). */
#define EDGE_NEG_ROW0 8      /* negative codes: rows 8..12, block 0 */
#define EDGE_NEG_COUNT 5
#define EDGE_SUB_ROW0 3      /* subnormal ladder: rows 3..6 */
#define EDGE_SUB_ROWS 4
#define EDGE_SUB_EXP0 12     /* block (r, b): amax = module amax * 2^-(12 + 2(r-3) + b) */

static void edge_provenance(td_gen_plan *p, jb *jbb, cJSON *arr)
{
    for (size_t ji = 0; ji < p->n_jobs; ji++) {
        const struct td_gen_job *j = &p->jobs[ji];
        if (j->kind != JOB_NVFP4) continue;
        for (int k = 0; k < j->n_mod; k++) {
            uint32_t f = j->edge[k];
            if (!f) continue;
            const td_gen_tensor *tw = &p->tensors[j->tensor0 + k * (j->input_scale ? 4 : 3)];
            const td_gen_tensor *ts = tw + 1, *tg = tw + 2;
            char d[200];
            if (f & EDGE_ZERO_BLOCKS)
                edge_record(jbb, arr, ts->name, "zero_blocks", -1, -1,
                            "rows 0-1 and every 3rd block of row 2 are all-zero blocks (scale 0x38 = 1.0)");
            if (f & EDGE_ZERO_SCALE)
                edge_record(jbb, arr, ts->name, "zero_scale_code", 0, 0,
                            "scale byte 0x00 on an all-zero block, as older exporters wrote");
            if (f & EDGE_SUBNORMAL) {
                snprintf(d, sizeof d,
                         "rows %d-%d: block (r, b) has amax = tensor amax * 2^-(%d + 2(r-%d) + b); "
                         "subnormal codes 0x01-0x07 and clamped 2^-9 scales",
                         EDGE_SUB_ROW0, EDGE_SUB_ROW0 + EDGE_SUB_ROWS - 1, EDGE_SUB_EXP0, EDGE_SUB_ROW0);
                edge_record(jbb, arr, ts->name, "subnormal_codes", -1, -1, d);
            }
            if (f & EDGE_NEG_CODES) {
                snprintf(d, sizeof d, "rows %d-%d, block 0: scale sign bit set and every nibble's "
                         "sign flipped (dequantized values unchanged)", EDGE_NEG_ROW0,
                         EDGE_NEG_ROW0 + EDGE_NEG_COUNT - 1);
                edge_record(jbb, arr, ts->name, "negative_codes", -1, -1, d);
            }
            if (f & EDGE_NAN_CODE)
                edge_record(jbb, arr, ts->name, "nan_code", 0, 1, "scale byte 0x7F (NaN)");
            if (f & EDGE_TINY)
                edge_record(jbb, arr, tg->name, "tiny_global", -1, -1, "weights x 2^-100");
            if (f & EDGE_LARGE)
                edge_record(jbb, arr, tg->name, "large_global", -1, -1,
                            "weights x 2^8: global * 448 * 2^14 exceeds the FP16 range");
            if (f & EDGE_HUGE)
                edge_record(jbb, arr, tg->name, "huge_global", -1, -1, "weights x 2^96");
            if (f & EDGE_UNSYNCED)
                edge_record(jbb, arr, tg->name, "unsynced_gate_up", -1, -1,
                            "gate and up quantized with their own amax; up weights scaled by a power "
                            "of two so that its global is 4 to 8 times the gate's");
            if (f & EDGE_ALL_ZERO)
                edge_record(jbb, arr, tg->name, "all_zero_tensor", -1, -1,
                            "every weight 0: global 1.0, every scale 0x38");
        }
    }
}

static void provenance(td_gen_plan *p, const preset_ctx *c, const preset_def *def,
                       int64_t shard_bytes, jb *jbb)
{
    cJSON *o = cJSON_CreateObject();
    p->provenance_json = o;
    if (!o) {
        jbb->oom = true;
        return;
    }
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    j_str(jbb, o, "generator", "tandem gen");
    j_num(jbb, o, "format", TD_GEN_FORMAT);
    j_str(jbb, o, "preset", def->info.name);
    j_str(jbb, o, "summary", def->info.summary);
    j_str(jbb, o, "seed", seed);
    cJSON *op = j_obj(jbb, o, "options");
    j_bool(jbb, op, "unquantized", p->unquantized);
    j_bool(jbb, op, "fused_experts", p->fused_experts);
    j_num(jbb, op, "num_experts", (double)c->experts);
    j_num(jbb, op, "shard_bytes", (double)shard_bytes);
    j_str(jbb, o, "family", td_family_name(p->cfg.family));
    j_str(jbb, o, "prefix", p->prefix);
    j_num(jbb, o, "tensors", (double)p->n_tensors);
    j_num(jbb, o, "bytes", (double)p->total_bytes);
    cJSON *files = j_arr(jbb, o, "safetensors_files");
    for (size_t s = 0; s < p->n_shards; s++) j_push_str(jbb, files, p->shards[s]);
    cJSON *nv = j_obj(jbb, o, "nvfp4");
    j_num(jbb, nv, "modules", (double)p->nvfp4_modules);
    j_str(jbb, nv, "convention", "modelopt (weight_scale_2 = amax / 2688)");
    j_str(jbb, nv, "quantizer", "td_nvfp4_quantize: ModelOpt float32 order, block scales "
                                "clamped to [2^-9, 448], RNE to E2M1");
    j_bool(jbb, nv, "gate_up_shared_amax", true);
    j_str(jbb, nv, "input_scale", "W4A4 checkpoints: input_scale = a / 2688, a = bf16(exp(N(ln 8, 0.5^2))) "
                                  "per module (gate and up share it)");
    cJSON *d = j_obj(jbb, o, "distributions");
    cJSON *lin = j_obj(jbb, d, "linear");
    j_str(jbb, lin, "law", "w[r,c] = bf16( sigma * T * R[r] * C[c] * x[r,c] ), sigma = 1/sqrt(in)");
    j_str(jbb, lin, "element", "x = z * m: z = Irwin-Hall sum of four 12-bit uniforms (unit variance), "
                               "m = Student-t(4) scale-mixture multiplier from a 4096-entry quantile table");
    j_num(jbb, lin, "tensor_log_sigma", GEN_TENSOR_SPREAD);
    j_num(jbb, lin, "row_log_sigma", GEN_ROW_SPREAD);
    j_num(jbb, lin, "column_log_sigma", GEN_COL_SPREAD);
    j_num(jbb, lin, "hot_column_fraction", GEN_HOT_FRAC);
    j_num(jbb, lin, "hot_column_gain", GEN_HOT_GAIN);
    j_num(jbb, lin, "outlier_every", GEN_OUTLIER_EVERY);
    j_num(jbb, lin, "outlier_min", GEN_OUTLIER_MIN);
    j_num(jbb, lin, "outlier_max", GEN_OUTLIER_MAX);
    cJSON *emb = j_obj(jbb, d, "embedding");
    j_str(jbb, emb, "law", "as linear with sigma 0.02, no hot columns, no outliers");
    cJSON *nrm = j_obj(jbb, d, "norm");
    j_str(jbb, nrm, "zero_centred", "w = 0.1 z (applied as 1 + w)");
    j_str(jbb, nrm, "plain", "w = 1 + 0.1 z (linear_attn.norm)");
    j_str(jbb, d, "conv", "as linear with sigma 1/sqrt(kernel), no hot columns");
    j_str(jbb, d, "A_log", "log(1 + 15 u), u uniform in [0, 1)");
    j_str(jbb, d, "dt_bias", "log(expm1(dt)), dt = exp(U[ln 1e-3, ln 1e-1])");
    j_str(jbb, d, "ngram_table", "0.05 z m; FP8 tables store e4m3_satfinite(v / s), s = 8 * 0.05 / 448");
    j_str(jbb, d, "buffers", "PLE layer_multipliers, ngram_heads_offsets, ngram_heads_vocab_sizes: "
                             "the exact values of MODEL_SPEC B3.4");
    if (c->n_edges && !p->unquantized) {
        cJSON *arr = j_arr(jbb, o, "edge_cases");
        edge_provenance(p, jbb, arr);
    }
}

static const preset_def *find_preset(const char *name)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(presets); i++)
        if (!strcmp(presets[i].info.name, name)) return &presets[i];
    return NULL;
}

td_status td_gen_plan_build(const td_gen_opts *o, td_gen_plan *p, td_err *err)
{
    memset(p, 0, sizeof *p);
    if (!o->preset || !*o->preset)
        return td_err_set(err, TD_ERR_ARG, "gen: no preset given");
    const preset_def *def = find_preset(o->preset);
    if (!def) {
        char list[512] = "";
        for (size_t i = 0; i < TD_ARRAY_LEN(presets); i++) {
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, presets[i].info.name, sizeof list - strlen(list) - 1);
        }
        return td_err_set(err, TD_ERR_ARG, "gen: unknown preset '%s' (presets: %s)", o->preset, list);
    }
    if (o->fused_experts && !o->unquantized)
        return td_err_set(err, TD_ERR_ARG,
                          "gen: --fused-experts needs --unquantized (NVFP4 releases store routed "
                          "experts per expert)");
    if (o->num_experts < 0 || o->num_experts > 4096)
        return td_err_set(err, TD_ERR_ARG, "gen: --experts %lld outside 1..4096",
                          (long long)o->num_experts);
    if (o->num_experts > 0 && def->fixed_experts)
        return td_err_set(err, TD_ERR_ARG, "gen: preset '%s' has a fixed expert count (its hard "
                          "cases name experts); --experts is not supported", def->info.name);
    for (size_t i = 0; i < o->n_layer_ids; i++)
        if (o->layer_ids[i] < 0 || o->layer_ids[i] >= TD_CONFIG_MAX_LAYERS ||
            (i > 0 && o->layer_ids[i] <= o->layer_ids[i - 1]))
            return td_err_set(err, TD_ERR_ARG,
                              "gen: --layers must list increasing layer ids in 0..%d (entry %zu is %lld)",
                              TD_CONFIG_MAX_LAYERS - 1, i, (long long)o->layer_ids[i]);
    if (o->n_layer_ids > 0 && def->fixed_experts)
        return td_err_set(err, TD_ERR_ARG, "gen: preset %s has a fixed layout; --layers does not apply",
                          def->info.name);
    snprintf(p->preset, sizeof p->preset, "%s", def->info.name);
    p->seed = o->seed;
    p->unquantized = o->unquantized;
    p->fused_experts = o->fused_experts;

    preset_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.config = cJSON_CreateObject();
    if (!c.config) return td_err_set(err, TD_ERR_NOMEM, "gen: out of memory");
    def->build(&c);
    p->config_json = c.config;
    p->hf_quant_json = c.hf;
    td_status st = TD_OK;
    if (c.b.oom) {
        st = td_err_set(err, TD_ERR_NOMEM, "gen: out of memory");
        goto fail;
    }
    /* Read the metadata back with the same parsers inspect uses. */
    st = td_config_parse(p->config_json, "config.json", &p->cfg, err);
    if (st) goto fail;
    if (p->hf_quant_json) {
        st = td_quant_parse_hf(p->hf_quant_json, "hf_quant_config.json", &p->quant, err);
    } else {
        const cJSON *qc = cJSON_GetObjectItemCaseSensitive(p->config_json, "quantization_config");
        if (qc) st = td_quant_parse_config(qc, "config.json", &p->quant, err);
    }
    if (st) goto fail;
    snprintf(p->prefix, sizeof p->prefix, "%s",
             p->cfg.family == TD_FAMILY_QWEN4_EXP ? "model.language_model." : "model.");

    td_layout lay;
    st = td_layout_build(&p->cfg, p->prefix, &lay, err);
    if (st) goto fail;
    plan_builder b = {p, 0, 0, err, TD_OK};
    int64_t fused_layer = -1;
    for (size_t i = 0; i < lay.n && !b.st; i++) {
        const td_module *m = &lay.mods[i];
        if (m->expert >= 0 && p->fused_experts) {
            if (m->layer != fused_layer) {
                fused_layer = m->layer;
                plan_fused(&b, m->layer);
            }
            continue;
        }
        bool skip = false;
        plan_module(&b, &c, &lay, i, &skip);
        if (skip) i++;
    }
    td_layout_free(&lay);
    for (size_t ji = 0; ji < p->n_jobs; ji++) p->work += p->jobs[ji].work;
    int64_t shard_bytes = o->shard_bytes >= 0 ? o->shard_bytes : c.shard_bytes_default;
    if (!b.st) plan_shards(p, shard_bytes, &b);
    st = b.st;
    if (st) goto fail;

    jb jbb = {false};
    cJSON *g = cJSON_CreateObject();
    p->generation_json = g;
    if (!g) jbb.oom = true;
    j_num(&jbb, g, "bos_token_id", p->cfg.bos_token_id >= 0 ? (double)p->cfg.bos_token_id : 1.0);
    j_num(&jbb, g, "eos_token_id", (double)p->cfg.eos_token_id);
    j_bool(&jbb, g, "do_sample", false);
    provenance(p, &c, def, shard_bytes, &jbb);
    if (jbb.oom) {
        st = td_err_set(err, TD_ERR_NOMEM, "gen: out of memory");
        goto fail;
    }
    return TD_OK;
fail:
    td_gen_plan_free(p);
    return st;
}

void td_gen_plan_free(td_gen_plan *p)
{
    if (!p) return;
    cJSON_Delete(p->config_json);
    cJSON_Delete(p->hf_quant_json);
    cJSON_Delete(p->generation_json);
    cJSON_Delete(p->provenance_json);
    td_quant_free(&p->quant);
    free(p->tensors);
    free(p->shards);
    free(p->jobs);
    memset(p, 0, sizeof *p);
}

long td_gen_plan_find(const td_gen_plan *p, const char *name)
{
    for (size_t i = 0; i < p->n_tensors; i++)
        if (!strcmp(p->tensors[i].name, name)) return (long)i;
    return -1;
}

/* ============================================================================================
 * 4. Value generation
 * ========================================================================================== */

/* Unit-variance approximately normal variate from 48 hash bits (Irwin-Hall of four 12-bit
 * uniforms: sum of four U{0..4095}, centred and scaled by its standard deviation). */
static inline float gen_ih4(uint64_t h)
{
    int32_t s = (int32_t)(h & 0xFFF) + (int32_t)((h >> 12) & 0xFFF) + (int32_t)((h >> 24) & 0xFFF) +
                (int32_t)((h >> 36) & 0xFFF);
    return (float)(2 * s - 16380) * (0.5f / 2364.8235f);
}

/* Uniform double in [0, 1) from the top 53 bits of a hash. */
static inline double gen_unit(uint64_t h)
{
    return (double)(h >> 11) * 0x1p-53;
}

typedef struct lin_params {
    double sigma, tensor_spread, row_spread, col_spread, hot_frac, hot_gain;
    bool outliers, mixture;
} lin_params;

/* The linear-layer law (docs/gen-quantize.md): out[r*cols + c], BF16-rounded floats.
 * Returns TD_ERR_NOMEM when the row/column scale arrays cannot be allocated. */
static td_status gen_linear(uint64_t key, int64_t rows, int64_t cols, const lin_params *lp,
                            const float *mix, float *out, td_err *err)
{
    td_rng rng;
    td_rng_seed(&rng, key);
    float *rs = malloc((size_t)rows * sizeof *rs);
    float *cs = malloc((size_t)cols * sizeof *cs);
    if (!rs || !cs) {
        free(rs);
        free(cs);
        return td_err_set(err, TD_ERR_NOMEM, "gen: out of memory (%lld x %lld)", (long long)rows,
                          (long long)cols);
    }
    double t = lp->sigma * gen_exp(lp->tensor_spread * td_rng_normal(&rng));
    for (int64_t r = 0; r < rows; r++)
        rs[r] = (float)(t * gen_exp(lp->row_spread * td_rng_normal(&rng)));
    for (int64_t c = 0; c < cols; c++) {
        double s = gen_exp(lp->col_spread * td_rng_normal(&rng));
        if (td_rng_uniform(&rng) < lp->hot_frac) s *= lp->hot_gain;
        cs[c] = (float)s;
    }
    uint64_t base = gen_mix64(key ^ UINT64_C(0x656c656d656e7473));
    uint64_t idx = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float rsr = rs[r];
        float *o = out + r * cols;
        if (lp->mixture) {
            for (int64_t c = 0; c < cols; c++, idx++) {
                uint64_t h = gen_mix64(base + (idx + 1) * GEN_GOLDEN);
                float x = gen_ih4(h) * mix[h >> (64 - GEN_MIX_BITS)];
                o[c] = gen_bf16_round((rsr * cs[c]) * x);
            }
        } else {
            for (int64_t c = 0; c < cols; c++, idx++) {
                uint64_t h = gen_mix64(base + (idx + 1) * GEN_GOLDEN);
                o[c] = gen_bf16_round((rsr * cs[c]) * gen_ih4(h));
            }
        }
    }
    if (lp->outliers) {
        /* a few isolated large values, at positions and with magnitudes from the tensor's
         * own stream, relative to the local element scale */
        int64_t numel = rows * cols, n = 1 + numel / GEN_OUTLIER_EVERY;
        for (int64_t k = 0; k < n; k++) {
            int64_t at = (int64_t)td_rng_below(&rng, (uint64_t)numel);
            double mag = GEN_OUTLIER_MIN + (GEN_OUTLIER_MAX - GEN_OUTLIER_MIN) * td_rng_uniform(&rng);
            double sgn = (td_rng_u64(&rng) >> 63) ? -1.0 : 1.0;
            double v = sgn * mag * (double)rs[at / cols] * (double)cs[at % cols];
            out[at] = gen_bf16_round((float)v);
        }
    }
    free(rs);
    free(cs);
    return TD_OK;
}

/* Fill out[rows*cols] with the BF16-rounded values of distribution d for stream `key`. */
static td_status gen_values(gen_dist d, uint64_t key, int64_t rows, int64_t cols,
                            const float *mix, float *out, td_err *err)
{
    int64_t n = rows * cols;
    uint64_t base = gen_mix64(key ^ UINT64_C(0x7363616c617273));
    switch (d) {
    case DIST_LINEAR: {
        lin_params lp = {1.0 / sqrt((double)cols), GEN_TENSOR_SPREAD, GEN_ROW_SPREAD,
                         GEN_COL_SPREAD, GEN_HOT_FRAC, GEN_HOT_GAIN, true, true};
        return gen_linear(key, rows, cols, &lp, mix, out, err);
    }
    case DIST_EMBED: {
        lin_params lp = {GEN_EMBED_SIGMA, 0.0, 0.3, 0.1, 0.0, 1.0, false, true};
        return gen_linear(key, rows, cols, &lp, mix, out, err);
    }
    case DIST_CONV: {
        lin_params lp = {1.0 / sqrt((double)cols), 0.0, 0.3, 0.2, 0.0, 1.0, false, false};
        return gen_linear(key, rows, cols, &lp, mix, out, err);
    }
    case DIST_NORM_ZC:
    case DIST_NORM_ONE: {
        float off = d == DIST_NORM_ONE ? 1.0f : 0.0f;
        for (int64_t i = 0; i < n; i++)
            out[i] = gen_bf16_round(off + (float)GEN_NORM_SIGMA * gen_ih4(gen_mix64(base + (uint64_t)(i + 1) * GEN_GOLDEN)));
        return TD_OK;
    }
    case DIST_A_LOG:
        for (int64_t i = 0; i < n; i++) {
            double u = gen_unit(gen_mix64(base + (uint64_t)(i + 1) * GEN_GOLDEN));
            out[i] = gen_bf16_round((float)td_rng_log(1.0 + 15.0 * u));
        }
        return TD_OK;
    case DIST_DT_BIAS: {
        const double lo = td_rng_log(1e-3), hi = td_rng_log(1e-1);
        for (int64_t i = 0; i < n; i++) {
            double u = gen_unit(gen_mix64(base + (uint64_t)(i + 1) * GEN_GOLDEN));
            double dt = gen_exp(lo + (hi - lo) * u);
            out[i] = gen_bf16_round((float)td_rng_log(gen_expm1_small(dt)));
        }
        return TD_OK;
    }
    case DIST_TABLE:
        for (int64_t i = 0; i < n; i++) {
            uint64_t h = gen_mix64(base + (uint64_t)(i + 1) * GEN_GOLDEN);
            out[i] = gen_bf16_round((float)GEN_TABLE_SIGMA * gen_ih4(h) * mix[h >> (64 - GEN_MIX_BITS)]);
        }
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_INTERNAL, "gen: unknown distribution %d", (int)d);
}

/* ============================================================================================
 * 5. Jobs
 * ========================================================================================== */

static inline void put_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void put_f32le(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32le(p, u);
}

/* BF16-exact floats → little-endian BF16 bytes. */
static void floats_to_bf16(const float *v, int64_t n, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        out[2 * i] = (uint8_t)(u >> 16);
        out[2 * i + 1] = (uint8_t)(u >> 24);
    }
}

/* Weight-level edge cases (before quantization). */
static void edge_weights(uint32_t f, float *w, int64_t rows, int64_t cols)
{
    const int64_t nb = cols / TD_NVFP4_BLOCK;
    if (f & EDGE_ALL_ZERO) memset(w, 0, (size_t)(rows * cols) * sizeof *w);
    if (f & EDGE_ZERO_BLOCKS) {
        for (int64_t r = 0; r < 2 && r < rows; r++) memset(w + r * cols, 0, (size_t)cols * sizeof *w);
        if (rows > 2)
            for (int64_t b = 0; b < nb; b += 3)
                memset(w + 2 * cols + b * TD_NVFP4_BLOCK, 0, TD_NVFP4_BLOCK * sizeof *w);
    }
    if (f & EDGE_SUBNORMAL) {
        float amax = 0.0f;
        for (int64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, fabsf(w[i]));
        for (int64_t r = EDGE_SUB_ROW0; r < EDGE_SUB_ROW0 + EDGE_SUB_ROWS && r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                float s = ldexpf(amax, -(int)(EDGE_SUB_EXP0 + 2 * (r - EDGE_SUB_ROW0) + b));
                for (int i = 0; i < TD_NVFP4_BLOCK; i++) {
                    /* alternating ramp, max 1 at i = 0: 1, -15/16, 14/16, ... */
                    float ramp = (float)(TD_NVFP4_BLOCK - i) / (float)TD_NVFP4_BLOCK;
                    w[r * cols + b * TD_NVFP4_BLOCK + i] = gen_bf16_round((i & 1) ? -ramp * s : ramp * s);
                }
            }
    }
    int e = 0;
    if (f & EDGE_TINY) e = -100;
    if (f & EDGE_LARGE) e = 8;
    if (f & EDGE_HUGE) e = 96;
    if (e)
        for (int64_t i = 0; i < rows * cols; i++) w[i] = ldexpf(w[i], e); /* exact: BF16 stays BF16 */
}

/* Code-level edge cases (after quantization). */
static void edge_codes(uint32_t f, uint8_t *packed, uint8_t *scales, int64_t rows, int64_t cols)
{
    const int64_t nb = cols / TD_NVFP4_BLOCK;
    if (f & EDGE_ZERO_SCALE) scales[0] = 0x00;
    if ((f & EDGE_NAN_CODE) && nb > 1) scales[1] = 0x7F;
    if (f & EDGE_NEG_CODES)
        for (int64_t r = EDGE_NEG_ROW0; r < EDGE_NEG_ROW0 + EDGE_NEG_COUNT && r < rows; r++) {
            scales[r * nb] |= 0x80;
            uint8_t *p = packed + r * (cols / 2);
            for (int i = 0; i < TD_NVFP4_BLOCK / 2; i++) p[i] ^= 0x88;
        }
}

typedef struct job_out {
    uint8_t *buf[8];   /* one per tensor of the job */
    size_t len[8];
} job_out;

static void job_out_free(job_out *o)
{
    for (int i = 0; i < 8; i++) free(o->buf[i]);
    memset(o, 0, sizeof *o);
}

static td_status job_alloc(job_out *o, const td_gen_plan *p, const struct td_gen_job *j, td_err *err)
{
    TD_ASSERT(j->n_tensors <= 8);
    for (int32_t t = 0; t < j->n_tensors; t++) {
        const td_gen_tensor *gt = &p->tensors[j->tensor0 + t];
        o->len[t] = (size_t)gt->nbytes;
        o->buf[t] = malloc(o->len[t] ? o->len[t] : 1);
        if (!o->buf[t])
            return td_err_set(err, TD_ERR_NOMEM, "gen: out of memory for %s (%lld bytes)", gt->name,
                              (long long)gt->nbytes);
    }
    return TD_OK;
}

static float max_abs(const float *w, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(w[i]));
    return m;
}

static td_status run_nvfp4(const td_gen_plan *p, const struct td_gen_job *j, const float *mix,
                           job_out *o, td_err *err)
{
    const int64_t n = j->rows * j->cols;
    float *w[JOB_MAX_MOD] = {NULL, NULL};
    td_status st = TD_OK;
    for (int k = 0; k < j->n_mod && !st; k++) {
        w[k] = malloc((size_t)n * sizeof(float));
        if (!w[k]) {
            st = td_err_set(err, TD_ERR_NOMEM, "gen: out of memory for %s", j->key[k]);
            break;
        }
        st = gen_values(DIST_LINEAR, gen_key(p->seed, j->key[k]), j->rows, j->cols, mix, w[k], err);
        if (!st) edge_weights(j->edge[k], w[k], j->rows, j->cols);
    }
    if (!st && j->n_mod == 2 && (j->edge[1] & EDGE_UNSYNCED)) {
        /* scale up by the power of two (>= 4, exact in BF16) that puts its amax in
         * [4, 8) x the gate's: the two globals then differ by that factor */
        float ag = max_abs(w[0], n), au = max_abs(w[1], n);
        int e = 2;
        while (ldexpf(au, e) < 4.0f * ag) e++;
        for (int64_t i = 0; i < n; i++) w[1][i] = ldexpf(w[1][i], e);
    }
    float amax = NAN;
    bool synced = j->n_mod == 2 && !((j->edge[0] | j->edge[1]) & EDGE_UNSYNCED);
    if (!st && synced) amax = fmaxf(max_abs(w[0], n), max_abs(w[1], n));
    float in_scale = j->input_scale ? input_scale_for(p->seed, j->key[0]) : 0.0f;
    int per = j->input_scale ? 4 : 3;
    for (int k = 0; k < j->n_mod && !st; k++) {
        uint8_t *packed = o->buf[k * per], *scales = o->buf[k * per + 1];
        float g;
        st = td_nvfp4_quantize(w[k], j->rows, j->cols, j->conv, amax, packed, scales, &g, err);
        if (st) {
            td_err_prefix(err, "gen: %s: ", j->key[k]);
            break;
        }
        edge_codes(j->edge[k], packed, scales, j->rows, j->cols);
        put_f32le(o->buf[k * per + 2], g);
        if (j->input_scale) put_f32le(o->buf[k * per + 3], in_scale);
    }
    for (int k = 0; k < JOB_MAX_MOD; k++) free(w[k]);
    return st;
}

static td_status run_fused(const td_gen_plan *p, const struct td_gen_job *j, const float *mix,
                           job_out *o, td_err *err)
{
    const int64_t E = j->experts, I = j->inter, H = j->hidden;
    const bool down = j->kind == JOB_FUSED_DOWN;
    const int64_t per = I * H; /* elements per projection per expert */
    float *w = malloc((size_t)per * sizeof *w);
    if (!w) return td_err_set(err, TD_ERR_NOMEM, "gen: out of memory");
    char key[256];
    td_status st = TD_OK;
    uint8_t *out = o->buf[0];
    for (int64_t e = 0; e < E && !st; e++) {
        for (int k = 0; k < (down ? 1 : 2) && !st; k++) {
            const char *proj = down ? "down_proj" : (k ? "up_proj" : "gate_proj");
            snprintf(key, sizeof key, "%s.%lld.%s", j->fused_base, (long long)e, proj);
            st = gen_values(DIST_LINEAR, gen_key(p->seed, key), down ? H : I, down ? I : H, mix, w, err);
            if (st) break;
            /* gate rows [0, I) then up rows [I, 2I) of expert e */
            int64_t off = down ? e * per : (2 * e + k) * per;
            floats_to_bf16(w, per, out + 2 * off);
        }
    }
    free(w);
    return st;
}

static td_status run_job(const td_gen_plan *p, const struct td_gen_job *j, const float *mix,
                         job_out *o, td_err *err)
{
    td_status st = job_alloc(o, p, j, err);
    if (st) return st;
    switch (j->kind) {
    case JOB_NVFP4:
        return run_nvfp4(p, j, mix, o, err);
    case JOB_FUSED_GATE_UP:
    case JOB_FUSED_DOWN:
        return run_fused(p, j, mix, o, err);
    case JOB_SCALAR_F32:
        put_f32le(o->buf[0], j->value);
        return TD_OK;
    case JOB_I64:
        for (int i = 0; i < j->n_i64; i++) {
            uint64_t v = (uint64_t)j->i64[i];
            for (int b = 0; b < 8; b++) o->buf[0][8 * i + b] = (uint8_t)(v >> (8 * b));
        }
        return TD_OK;
    case JOB_DENSE:
    case JOB_TABLE_FP8: {
        int64_t n = j->rows * j->cols;
        float *w = malloc((size_t)(n ? n : 1) * sizeof *w);
        if (!w) return td_err_set(err, TD_ERR_NOMEM, "gen: out of memory for %s", j->key[0]);
        st = gen_values(j->dist, gen_key(p->seed, j->key[0]), j->rows, j->cols, mix, w, err);
        if (!st) {
            if (j->kind == JOB_TABLE_FP8) {
                for (int64_t i = 0; i < n; i++)
                    o->buf[0][i] = td_f32_to_e4m3(w[i] / j->table_scale, TD_E4M3_SATFINITE);
            } else if (j->dtype == TD_F32) {
                for (int64_t i = 0; i < n; i++) put_f32le(o->buf[0] + 4 * i, w[i]);
            } else {
                floats_to_bf16(w, n, o->buf[0]);
            }
        }
        free(w);
        return st;
    }
    }
    return td_err_set(err, TD_ERR_INTERNAL, "gen: unknown job kind %d", (int)j->kind);
}

/* ============================================================================================
 * 6. Writing
 * ========================================================================================== */

typedef struct gen_run {
    const td_gen_plan *p;
    td_st_writer **writers;   /* [n_shards] */
    int64_t *remaining;       /* [n_shards] tensors not yet written */
    const float *mix;
    pthread_mutex_t mu;
    size_t next;              /* next job to start */
    int64_t done;             /* finished work units */
    td_status st;             /* first error */
    td_err err;
    td_progress prog;
} gen_run;

static void *gen_worker(void *arg)
{
    gen_run *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        if (r->st || r->next >= r->p->n_jobs) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        size_t ji = r->next++;
        pthread_mutex_unlock(&r->mu);

        const struct td_gen_job *j = &r->p->jobs[ji];
        job_out o;
        memset(&o, 0, sizeof o);
        td_err err;
        td_err_clear(&err);
        td_status st = run_job(r->p, j, r->mix, &o, &err);

        int32_t complete = -1; /* a shard whose last tensor this job wrote */
        pthread_mutex_lock(&r->mu);
        for (int32_t t = 0; t < j->n_tensors && !st && !r->st; t++) {
            const td_gen_tensor *gt = &r->p->tensors[j->tensor0 + t];
            st = td_st_writer_write(r->writers[gt->shard], gt->name, o.buf[t], o.len[t], &err);
            if (!st && --r->remaining[gt->shard] == 0) complete = gt->shard;
        }
        if (st && !r->st) {
            r->st = st;
            r->err = err;
        }
        r->done += j->work;
        td_progress_update(&r->prog, (uint64_t)r->done);
        pthread_mutex_unlock(&r->mu);
        job_out_free(&o);
        /* Finish (fsync and rename) a completed shard now, overlapping its disk flush with
         * the generation of later shards. No other thread touches this writer any more. */
        if (complete >= 0 && !st) {
            st = td_st_writer_finish(r->writers[complete], &err);
            if (st) {
                pthread_mutex_lock(&r->mu);
                if (!r->st) {
                    r->st = st;
                    r->err = err;
                }
                pthread_mutex_unlock(&r->mu);
            }
        }
    }
}

td_status td_gen_write_json(const char *path, const cJSON *j, td_err *err)
{
    char *s = cJSON_Print(j);
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(s);
        return td_err_set(err, TD_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t n = strlen(s);
    bool ok = fwrite(s, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(s);
    if (!ok) return td_err_set(err, TD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return TD_OK;
}

static td_status write_index(const td_gen_plan *p, const char *path, td_err *err)
{
    cJSON *o = cJSON_CreateObject();
    jb b = {o == NULL};
    cJSON *md = j_obj(&b, o, "metadata");
    j_num(&b, md, "total_size", (double)p->total_bytes);
    cJSON *wm = j_obj(&b, o, "weight_map");
    /* weight_map sorted by name, as the HF writers do */
    size_t *ord = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *ord);
    if (!ord) b.oom = true;
    else {
        for (size_t i = 0; i < p->n_tensors; i++) ord[i] = i;
        /* insertion sort is too slow for thousands of names; simple merge sort */
        size_t *tmp = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *tmp);
        if (!tmp) b.oom = true;
        for (size_t w = 1; tmp && w < p->n_tensors; w *= 2) {
            for (size_t lo = 0; lo < p->n_tensors; lo += 2 * w) {
                size_t mid = lo + w < p->n_tensors ? lo + w : p->n_tensors;
                size_t hi = lo + 2 * w < p->n_tensors ? lo + 2 * w : p->n_tensors;
                size_t a = lo, c = mid, k = lo;
                while (a < mid && c < hi)
                    tmp[k++] = strcmp(p->tensors[ord[a]].name, p->tensors[ord[c]].name) <= 0 ? ord[a++] : ord[c++];
                while (a < mid) tmp[k++] = ord[a++];
                while (c < hi) tmp[k++] = ord[c++];
            }
            memcpy(ord, tmp, p->n_tensors * sizeof *ord);
        }
        free(tmp);
        for (size_t i = 0; i < p->n_tensors && !b.oom; i++)
            j_str(&b, wm, p->tensors[ord[i]].name, p->shards[p->tensors[ord[i]].shard]);
    }
    free(ord);
    td_status st = b.oom ? td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path)
                         : td_gen_write_json(path, o, err);
    cJSON_Delete(o);
    return st;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    return (int)n;
}

td_status td_gen_write(const td_gen_plan *p, const td_gen_opts *o, const char *out_dir,
                       td_gen_result *res, td_err *err)
{
    double t0 = now_seconds();
    td_gen_outdir od;
    td_status st = td_gen_outdir_begin(&od, out_dir, o->force, err);
    if (st) return st;

    float *mix = malloc(GEN_MIX_N * sizeof *mix);
    td_st_writer **ws = calloc(p->n_shards, sizeof *ws);
    int64_t *remaining = calloc(p->n_shards, sizeof *remaining);
    char path[4200];
    if (!mix || !ws || !remaining) {
        st = td_err_set(err, TD_ERR_NOMEM, "gen: out of memory");
        goto done;
    }
    gen_mix_table(mix);

    /* metadata files */
    struct { const char *name; const cJSON *j; } files[] = {
        {"config.json", p->config_json},
        {"hf_quant_config.json", p->hf_quant_json},
        {"generation_config.json", p->generation_json},
        {"tandem_gen.json", p->provenance_json},
    };
    int nfiles = 0;
    for (size_t i = 0; i < TD_ARRAY_LEN(files); i++) {
        if (!files[i].j) continue;
        st = td_gen_outdir_path(&od, files[i].name, path, sizeof path, err);
        if (!st) st = td_gen_write_json(path, files[i].j, err);
        if (st) goto done;
        nfiles++;
    }

    /* shard writers: declare everything, lay out the headers */
    char seed[32], fmt[16];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    snprintf(fmt, sizeof fmt, "%d", TD_GEN_FORMAT);
    for (size_t s = 0; s < p->n_shards; s++) {
        st = td_gen_outdir_path(&od, p->shards[s], path, sizeof path, err);
        if (!st) st = td_st_writer_init(path, &ws[s], err);
        if (!st) st = td_st_writer_meta(ws[s], "format", "pt", err);
        if (!st) st = td_st_writer_meta(ws[s], "tandem_gen_preset", p->preset, err);
        if (!st) st = td_st_writer_meta(ws[s], "tandem_gen_seed", seed, err);
        if (!st) st = td_st_writer_meta(ws[s], "tandem_gen_format", fmt, err);
        if (st) goto done;
    }
    for (size_t i = 0; i < p->n_tensors; i++) {
        const td_gen_tensor *t = &p->tensors[i];
        st = td_st_writer_declare(ws[t->shard], t->name, t->dtype, t->ndim, t->shape, err);
        if (st) goto done;
        remaining[t->shard]++;
    }
    for (size_t s = 0; s < p->n_shards; s++) {
        st = td_st_writer_begin(ws[s], err);
        if (st) goto done;
    }

    /* generate: a pool of workers over the jobs; each job's bytes depend only on the job */
    int nt = o->threads > 0 ? o->threads : online_cpus();
    if (nt > 64) nt = 64;
    if ((size_t)nt > p->n_jobs) nt = p->n_jobs ? (int)p->n_jobs : 1;
    gen_run run;
    memset(&run, 0, sizeof run);
    run.p = p;
    run.writers = ws;
    run.remaining = remaining;
    run.mix = mix;
    td_err_clear(&run.err);
    pthread_mutex_init(&run.mu, NULL);
    td_progress_init_ex(&run.prog, stderr, "gen", (uint64_t)p->work, o->progress ? -1 : 0, NULL, NULL);
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < nt; i++) {
        if (pthread_create(&th[started], NULL, gen_worker, &run) != 0) break;
        started++;
    }
    gen_worker(&run);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&run.mu);
    if (run.st) {
        st = run.st;
        if (err) *err = run.err;
        goto done;
    }
    td_progress_done(&run.prog);

    for (size_t s = 0; s < p->n_shards; s++) {
        if (remaining[s] == 0) continue; /* finished by a worker (an empty plan has none) */
        st = td_st_writer_finish(ws[s], err);
        if (st) goto done;
    }
    if (p->n_shards > 1) {
        st = td_gen_outdir_path(&od, "model.safetensors.index.json", path, sizeof path, err);
        if (!st) st = write_index(p, path, err);
        if (st) goto done;
        nfiles++;
    }
    st = td_gen_outdir_commit(&od, err);
    if (st) goto done;
    if (res) {
        res->tensors = (int64_t)p->n_tensors;
        res->bytes = p->total_bytes;
        res->files = nfiles + (int64_t)p->n_shards;
        res->threads = started + 1;
        res->seconds = now_seconds() - t0;
    }
done:
    if (ws)
        for (size_t s = 0; s < p->n_shards; s++) td_st_writer_free(ws[s]);
    free(ws);
    free(remaining);
    free(mix);
    if (st) td_gen_outdir_abort(&od);
    return st;
}

td_status td_gen(const td_gen_opts *o, const char *out_dir, td_gen_result *res, td_err *err)
{
    td_gen_plan p;
    td_status st = td_gen_plan_build(o, &p, err);
    if (st) return st;
    st = td_gen_write(&p, o, out_dir, res, err);
    td_gen_plan_free(&p);
    return st;
}

/* ============================================================================================
 * 7. Staged output directory
 * ========================================================================================== */

/* Remove a file or a directory tree (symbolic links are removed, never followed). Depth is
 * bounded; a checkpoint directory is flat. */
static int remove_tree(const char *path, int depth)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    if (depth > 16) return -1;
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    char child[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
            rc = -1;
            continue;
        }
        if (remove_tree(child, depth + 1) != 0) rc = -1;
    }
    closedir(d);
    if (rc == 0) rc = rmdir(path);
    return rc;
}

static td_status mkdir_parents(const char *path, td_err *err)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *s = '/';
    }
    return TD_OK;
}

td_status td_gen_outdir_begin(td_gen_outdir *d, const char *out, bool force, td_err *err)
{
    memset(d, 0, sizeof *d);
    size_t n = out ? strlen(out) : 0;
    while (n > 1 && out[n - 1] == '/') n--;
    if (n == 0) return td_err_set(err, TD_ERR_ARG, "no output directory given");
    if (n + 8 >= sizeof d->final_path)
        return td_err_set(err, TD_ERR_ARG, "%.60s...: output path too long", out);
    memcpy(d->final_path, out, n);
    d->final_path[n] = '\0';
    const char *base = strrchr(d->final_path, '/');
    base = base ? base + 1 : d->final_path;
    if (!strcmp(base, ".") || !strcmp(base, "..") || !strcmp(d->final_path, "/"))
        return td_err_set(err, TD_ERR_ARG, "%s: not usable as an output directory (name a new one)",
                          d->final_path);
    memcpy(d->tmp_path, d->final_path, n);
    memcpy(d->tmp_path + n, ".tmp", 5);
    struct stat sb;
    if (lstat(d->final_path, &sb) == 0) {
        if (!force)
            return td_err_set(err, TD_ERR_ARG, "%s already exists; pass --force to replace it",
                              d->final_path);
        if (!S_ISDIR(sb.st_mode))
            return td_err_set(err, TD_ERR_ARG, "%s exists and is not a directory", d->final_path);
    }
    td_status st = mkdir_parents(d->final_path, err);
    if (st) return st;
    if (remove_tree(d->tmp_path, 0) != 0)
        return td_err_set(err, TD_ERR_IO, "%s: cannot remove the stale staging directory: %s",
                          d->tmp_path, strerror(errno));
    if (mkdir(d->tmp_path, 0777) != 0)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create: %s", d->tmp_path, strerror(errno));
    d->active = true;
    return TD_OK;
}

td_status td_gen_outdir_path(const td_gen_outdir *d, const char *name, char *buf, size_t cap,
                             td_err *err)
{
    if (snprintf(buf, cap, "%s/%s", d->tmp_path, name) >= (int)cap)
        return td_err_set(err, TD_ERR_ARG, "%s/%s: path too long", d->final_path, name);
    return TD_OK;
}

td_status td_gen_outdir_commit(td_gen_outdir *d, td_err *err)
{
    TD_ASSERT(d->active);
    char old[2100];
    snprintf(old, sizeof old, "%s.old", d->final_path);
    struct stat sb;
    bool had = lstat(d->final_path, &sb) == 0;
    if (had) {
        if (remove_tree(old, 0) != 0 || rename(d->final_path, old) != 0)
            return td_err_set(err, TD_ERR_IO, "%s: cannot move the existing directory aside: %s",
                              d->final_path, strerror(errno));
    }
    if (rename(d->tmp_path, d->final_path) != 0) {
        int e = errno;
        if (had) (void)rename(old, d->final_path);
        return td_err_set(err, TD_ERR_IO, "%s: cannot rename %s into place: %s", d->final_path,
                          d->tmp_path, strerror(e));
    }
    d->active = false;
    if (had && remove_tree(old, 0) != 0)
        return td_err_set(err, TD_ERR_IO, "%s: written, but the previous copy %s could not be removed",
                          d->final_path, old);
    return TD_OK;
}

void td_gen_outdir_abort(td_gen_outdir *d)
{
    if (!d || !d->active) return;
    (void)remove_tree(d->tmp_path, 0);
    d->active = false;
}
