/* moe_fixture.h — numeric MoE fixtures for the reference-engine and layer-audit tests.
 *
 * mf_build() draws seeded random float weights for every MoE layer of a small model (router,
 * routed experts, shared expert and its gate), quantizes the expert projections to NVFP4
 * with the library quantizer (td_nvfp4_quantize; gate/up of an expert share one amax, as
 * ModelOpt exports them) or rounds them to BF16, and keeps the stored bytes. From them:
 *   mf_views()   ref_linear views for ref_moe_run() (no file involved);
 *   mf_write()   a checkpoint directory (config.json, quantization metadata, model.safetensors
 *                holding the MoE tensors only) for the engine and the audit;
 *   mf_weight()  the exact value of a stored weight in double, decoded here from the bytes
 *                with this file's own E2M1/E4M3/BF16 formulas (independent of the library).
 * Unlike fixture_ckpt.h these checkpoints carry real numbers.
 */
#ifndef TD_TEST_MOE_FIXTURE_H
#define TD_TEST_MOE_FIXTURE_H

#include "test_common.h"
#include "formats.h"
#include "nvfp4.h"
#include "rng.h"
#include "safetensors.h"
#include "ref/moe.h"

#include <math.h>

typedef enum mf_fmt { MF_MODELOPT = 0, MF_CT, MF_BF16 } mf_fmt;

typedef struct mf_opts {
    int64_t hidden, experts, top_k, inter, shared_inter, layers;
    bool norm_topk_prob;
    mf_fmt fmt;              /* routed experts */
    bool shared_bf16;        /* shared expert in BF16 (else like the routed experts) */
    bool fused;              /* with MF_BF16: fused 3-D expert tensors on disk */
    float wscale;            /* weight standard deviation */
    uint64_t seed;
} mf_opts;

typedef struct mf_linear {
    int64_t rows, cols;
    bool nvfp4;
    td_nvfp4_conv conv;
    uint8_t *packed;         /* [rows, cols/2] */
    uint8_t *scales;         /* [rows, cols/16] */
    float global;
    uint16_t *bf16;          /* [rows, cols] when !nvfp4 */
} mf_linear;

typedef struct mf_layer {
    mf_linear router;                 /* [E, H] BF16 */
    mf_linear *gate, *up, *down;      /* [E] */
    mf_linear sh_gate, sh_up, sh_down;
    mf_linear sh_gw;                  /* [1, H] BF16 */
    ref_expert *views;                /* [E] for mf_views */
} mf_layer;

typedef struct mf_model {
    mf_opts o;
    mf_layer *layers;                 /* [o.layers] */
} mf_model;

static inline void mf_defaults(mf_opts *o)
{
    memset(o, 0, sizeof *o);
    o->hidden = 64;
    o->experts = 8;
    o->top_k = 3;
    o->inter = 64;
    o->shared_inter = 64;
    o->layers = 2;
    o->norm_topk_prob = true;
    o->fmt = MF_MODELOPT;
    o->wscale = 0.05f;
    o->seed = 1;
}

static inline void mf_bf16_linear(td_rng *rng, mf_linear *l, int64_t rows, int64_t cols, float scale)
{
    memset(l, 0, sizeof *l);
    l->rows = rows;
    l->cols = cols;
    l->bf16 = malloc((size_t)(rows * cols) * 2);
    assert_non_null(l->bf16);
    for (int64_t i = 0; i < rows * cols; i++) l->bf16[i] = td_f32_to_bf16(scale * td_rng_normal_f32(rng));
}

/* Quantize a pair (gate, up) sharing one amax, or a single weight (b == NULL). */
static inline void mf_quant(td_rng *rng, mf_fmt fmt, mf_linear *a, mf_linear *b, int64_t rows, int64_t cols,
                            float scale)
{
    mf_linear *ls[2] = {a, b};
    float *w[2] = {NULL, NULL};
    float amax = 0.0f;
    for (int i = 0; i < 2 && ls[i]; i++) {
        w[i] = malloc((size_t)(rows * cols) * sizeof(float));
        assert_non_null(w[i]);
        for (int64_t j = 0; j < rows * cols; j++) {
            w[i][j] = scale * td_rng_normal_f32(rng);
            if (fabsf(w[i][j]) > amax) amax = fabsf(w[i][j]);
        }
    }
    for (int i = 0; i < 2 && ls[i]; i++) {
        mf_linear *l = ls[i];
        memset(l, 0, sizeof *l);
        l->rows = rows;
        l->cols = cols;
        if (fmt == MF_BF16) {
            l->bf16 = malloc((size_t)(rows * cols) * 2);
            assert_non_null(l->bf16);
            for (int64_t j = 0; j < rows * cols; j++) l->bf16[j] = td_f32_to_bf16(w[i][j]);
        } else {
            l->nvfp4 = true;
            l->conv = fmt == MF_CT ? TD_NVFP4_CT : TD_NVFP4_MODELOPT;
            l->packed = malloc((size_t)(rows * cols / 2));
            l->scales = malloc((size_t)(rows * cols / 16));
            assert_true(l->packed && l->scales);
            td_err err;
            assert_int_equal(td_nvfp4_quantize(w[i], rows, cols, l->conv, amax, l->packed, l->scales, &l->global,
                                               &err),
                             TD_OK);
        }
        free(w[i]);
    }
}

static inline void mf_build(const mf_opts *o, mf_model *m)
{
    memset(m, 0, sizeof *m);
    m->o = *o;
    const int64_t H = o->hidden, E = o->experts, I = o->inter, Is = o->shared_inter;
    td_rng rng;
    td_rng_seed(&rng, o->seed);
    m->layers = calloc((size_t)o->layers, sizeof *m->layers);
    assert_non_null(m->layers);
    for (int64_t L = 0; L < o->layers; L++) {
        mf_layer *ly = &m->layers[L];
        mf_bf16_linear(&rng, &ly->router, E, H, 0.5f);
        ly->gate = calloc((size_t)E, sizeof *ly->gate);
        ly->up = calloc((size_t)E, sizeof *ly->up);
        ly->down = calloc((size_t)E, sizeof *ly->down);
        ly->views = calloc((size_t)E, sizeof *ly->views);
        assert_true(ly->gate && ly->up && ly->down && ly->views);
        for (int64_t e = 0; e < E; e++) {
            mf_quant(&rng, o->fmt, &ly->gate[e], &ly->up[e], I, H, o->wscale);
            mf_quant(&rng, o->fmt, &ly->down[e], NULL, H, I, o->wscale);
        }
        if (Is > 0) {
            mf_fmt sf = o->shared_bf16 ? MF_BF16 : o->fmt;
            mf_quant(&rng, sf, &ly->sh_gate, &ly->sh_up, Is, H, o->wscale);
            mf_quant(&rng, sf, &ly->sh_down, NULL, H, Is, o->wscale);
            mf_bf16_linear(&rng, &ly->sh_gw, 1, H, 0.2f);
        }
    }
}

static inline void mf_linear_free(mf_linear *l)
{
    free(l->packed);
    free(l->scales);
    free(l->bf16);
}

static inline void mf_free(mf_model *m)
{
    for (int64_t L = 0; m->layers && L < m->o.layers; L++) {
        mf_layer *ly = &m->layers[L];
        mf_linear_free(&ly->router);
        for (int64_t e = 0; e < m->o.experts; e++) {
            mf_linear_free(&ly->gate[e]);
            mf_linear_free(&ly->up[e]);
            mf_linear_free(&ly->down[e]);
        }
        free(ly->gate);
        free(ly->up);
        free(ly->down);
        free(ly->views);
        mf_linear_free(&ly->sh_gate);
        mf_linear_free(&ly->sh_up);
        mf_linear_free(&ly->sh_down);
        mf_linear_free(&ly->sh_gw);
    }
    free(m->layers);
    memset(m, 0, sizeof *m);
}

static inline void mf_view(const mf_linear *l, ref_linear *v)
{
    if (l->nvfp4) ref_linear_nvfp4(v, l->conv, l->rows, l->cols, l->packed, l->scales, l->global);
    else ref_linear_dense(v, TD_BF16, l->rows, l->cols, l->bf16);
}

/* Views of layer L for ref_moe_run (valid while m lives). */
static inline void mf_views(mf_model *m, int64_t L, ref_moe_weights *w)
{
    mf_layer *ly = &m->layers[L];
    const mf_opts *o = &m->o;
    memset(w, 0, sizeof *w);
    w->hidden = o->hidden;
    w->n_experts = o->experts;
    w->top_k = o->top_k;
    w->inter = o->inter;
    w->norm_topk_prob = o->norm_topk_prob;
    w->has_router = true;
    mf_view(&ly->router, &w->router);
    for (int64_t e = 0; e < o->experts; e++) {
        mf_view(&ly->gate[e], &ly->views[e].gate);
        mf_view(&ly->up[e], &ly->views[e].up);
        mf_view(&ly->down[e], &ly->views[e].down);
    }
    w->experts = ly->views;
    if (o->shared_inter > 0) {
        w->has_shared = true;
        w->shared_inter = o->shared_inter;
        mf_view(&ly->sh_gate, &w->shared.gate);
        mf_view(&ly->sh_up, &w->shared.up);
        mf_view(&ly->sh_down, &w->shared.down);
        mf_view(&ly->sh_gw, &w->shared_gate);
    }
}

/* ---- independent decoding (double) ---------------------------------------------------------- */

static inline double mf_e2m1(unsigned c)
{
    const int e = (int)((c >> 1) & 3), mant = (int)(c & 1);
    double v = e == 0 ? 0.5 * mant : ldexp(1.0 + 0.5 * mant, e - 1);
    return (c & 8) ? -v : v;
}

static inline double mf_e4m3(uint8_t b)
{
    const int e = (b >> 3) & 15, mant = b & 7;
    double v = (e == 15 && mant == 7) ? (double)NAN : e == 0 ? ldexp(mant, -9) : ldexp(8 + mant, e - 10);
    return (b & 0x80) ? -v : v;
}

static inline double mf_bf16(uint16_t h)
{
    const int e = (h >> 7) & 0xFF, mant = h & 0x7F;
    double v = e == 0xFF ? (mant ? (double)NAN : HUGE_VAL) : e == 0 ? ldexp(mant, -133) : ldexp(128 + mant, e - 134);
    return (h & 0x8000) ? -v : v;
}

/* The block scale product exactly as the engine's scale=exact defines it: fl32(S * g_dec)
 * (ModelOpt) or fl32(S / g_enc) (compressed-tensors); the double quotient/product is rounded
 * to float once, which is what IEEE float arithmetic does. */
static inline float mf_eff(const mf_linear *l, uint8_t s)
{
    double sd = mf_e4m3(s);
    return l->conv == TD_NVFP4_MODELOPT ? (float)(sd * (double)l->global) : (float)(sd / (double)l->global);
}

/* Round a double to the nearest FP16 / BF16 value (RNE, overflow to inf), as a double. */
static inline double mf_round_bits(double x, int min_exp, int mant_bits, double overflow)
{
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    const double a = fabs(x);
    if (a >= overflow) return copysign(HUGE_VAL, x);
    int e;
    frexp(a, &e);
    const int ex = e - 1 < min_exp ? min_exp : e - 1;
    const double q = ldexp(1.0, ex - mant_bits);
    return copysign(nearbyint(a / q) * q, x);
}

static inline double mf_round_f16(double x) { return mf_round_bits(x, -14, 10, 65520.0); }
static inline double mf_round_bf16(double x) { return mf_round_bits(x, -126, 7, ldexp(2.0 - 0x1p-8, 127)); }

/* Element (r, c) of the stored weight as the engine decodes it: fl32(e2m1 * eff) with eff
 * rounded to FP16 when fp16_scale (NVFP4), or the BF16 value. */
static inline double mf_weight_mode(const mf_linear *l, int64_t r, int64_t c, bool fp16_scale)
{
    if (!l->nvfp4) return mf_bf16(l->bf16[r * l->cols + c]);
    const uint8_t byte = l->packed[r * (l->cols / 2) + c / 2];
    const unsigned code = (c & 1) ? byte >> 4 : byte & 15;
    float eff = mf_eff(l, l->scales[r * (l->cols / 16) + c / 16]);
    if (fp16_scale) eff = (float)mf_round_f16((double)eff);
    return (double)(float)(mf_e2m1(code) * (double)eff);
}

/* The same with scale=exact. */
static inline double mf_weight(const mf_linear *l, int64_t r, int64_t c)
{
    return mf_weight_mode(l, r, c, false);
}

/* ---- checkpoint ----------------------------------------------------------------------------- */

static inline void mf_config(const mf_model *m, const char *dir)
{
    const mf_opts *o = &m->o;
    char buf[4096], path[1024];
    int n = snprintf(buf, sizeof buf,
                     "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":%lld,"
                     "\"num_hidden_layers\":%lld,\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                     "\"head_dim\":16,\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":16,"
                     "\"linear_value_head_dim\":16,\"num_experts\":%lld,\"num_experts_per_tok\":%lld,"
                     "\"moe_intermediate_size\":%lld,\"shared_expert_intermediate_size\":%lld,\"norm_topk_prob\":%s",
                     (long long)o->hidden, (long long)o->layers, (long long)o->experts, (long long)o->top_k,
                     (long long)o->inter, (long long)o->shared_inter, o->norm_topk_prob ? "true" : "false");
    const char *shared_ignore = o->shared_bf16 ? ",\"re:.*shared_expert[.].*\"" : "";
    if (o->fmt == MF_CT)
        n += snprintf(buf + n, sizeof buf - (size_t)n,
                      ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
                      "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"float\","
                      "\"strategy\":\"tensor_group\",\"group_size\":16,\"symmetric\":true},\"input_activations\":null}},"
                      "\"ignore\":[\"lm_head\",\"re:.*mlp[.]gate$\",\"re:.*shared_expert_gate$\"%s]}",
                      shared_ignore);
    snprintf(buf + n, sizeof buf - (size_t)n, "}");
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_test_write_str(path, buf);
    if (o->fmt == MF_MODELOPT) {
        snprintf(buf, sizeof buf,
                 "{\"producer\":{\"name\":\"modelopt\",\"version\":\"test\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
                 "\"kv_cache_quant_algo\":null,\"group_size\":16,\"exclude_modules\":[\"lm_head\",\"*mlp.gate\","
                 "\"*shared_expert_gate\"%s]}}",
                 o->shared_bf16 ? ",\"*shared_expert.*\"" : "");
        snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
        td_test_write_str(path, buf);
    }
}

typedef struct mf_writer {
    char (*names)[160];
    td_tensor *t;
    size_t n, cap;
} mf_writer;

static inline void mf_add(mf_writer *w, const char *name, td_dtype dt, int nd, int64_t a, int64_t b, int64_t c,
                          const void *data)
{
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 256;
        w->names = realloc(w->names, w->cap * sizeof *w->names);
        w->t = realloc(w->t, w->cap * sizeof *w->t);
        assert_true(w->names && w->t);
    }
    snprintf(w->names[w->n], sizeof w->names[0], "%s", name);
    const int64_t shape[3] = {a, b, c};
    td_tensor_init(&w->t[w->n], dt, nd, shape, (void *)data, NULL);
    w->n++;
}

static inline void mf_add_linear(mf_writer *w, const char *module, const mf_linear *l)
{
    char name[160];
    if (!l->nvfp4) {
        snprintf(name, sizeof name, "%s.weight", module);
        mf_add(w, name, TD_BF16, 2, l->rows, l->cols, 0, l->bf16);
        return;
    }
    const bool ct = l->conv == TD_NVFP4_CT;
    snprintf(name, sizeof name, "%s.%s", module, ct ? "weight_packed" : "weight");
    mf_add(w, name, TD_U8, 2, l->rows, l->cols / 2, 0, l->packed);
    snprintf(name, sizeof name, "%s.weight_scale", module);
    mf_add(w, name, TD_F8_E4M3, 2, l->rows, l->cols / 16, 0, l->scales);
    snprintf(name, sizeof name, "%s.%s", module, ct ? "weight_global_scale" : "weight_scale_2");
    if (ct) mf_add(w, name, TD_F32, 1, 1, 0, 0, &l->global);
    else mf_add(w, name, TD_F32, 0, 0, 0, 0, &l->global);
}

/* Write the checkpoint into dir (created). Fused BF16 experts need scratch buffers that
 * live until the file is written; they are freed here. */
static inline void mf_write(const mf_model *m, const char *dir)
{
    const mf_opts *o = &m->o;
    mkdir(dir, 0777);
    mf_config(m, dir);
    mf_writer w;
    memset(&w, 0, sizeof w);
    uint16_t **fused = calloc((size_t)(2 * o->layers), sizeof *fused);
    assert_non_null(fused);
    char mod[160];
    for (int64_t L = 0; L < o->layers; L++) {
        const mf_layer *ly = &m->layers[L];
        snprintf(mod, sizeof mod, "model.layers.%lld.mlp.gate", (long long)L);
        mf_add_linear(&w, mod, &ly->router);
        const int64_t E = o->experts, H = o->hidden, I = o->inter;
        if (o->fused && o->fmt == MF_BF16) {
            uint16_t *gu = malloc((size_t)(E * 2 * I * H) * 2), *dn = malloc((size_t)(E * H * I) * 2);
            assert_true(gu && dn);
            for (int64_t e = 0; e < E; e++) {
                memcpy(gu + e * 2 * I * H, ly->gate[e].bf16, (size_t)(I * H) * 2);
                memcpy(gu + e * 2 * I * H + I * H, ly->up[e].bf16, (size_t)(I * H) * 2);
                memcpy(dn + e * H * I, ly->down[e].bf16, (size_t)(H * I) * 2);
            }
            fused[2 * L] = gu;
            fused[2 * L + 1] = dn;
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.experts.gate_up_proj", (long long)L);
            mf_add(&w, mod, TD_BF16, 3, E, 2 * I, H, gu);
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.experts.down_proj", (long long)L);
            mf_add(&w, mod, TD_BF16, 3, E, H, I, dn);
        } else {
            for (int64_t e = 0; e < E; e++) {
                snprintf(mod, sizeof mod, "model.layers.%lld.mlp.experts.%lld.gate_proj", (long long)L, (long long)e);
                mf_add_linear(&w, mod, &ly->gate[e]);
                snprintf(mod, sizeof mod, "model.layers.%lld.mlp.experts.%lld.up_proj", (long long)L, (long long)e);
                mf_add_linear(&w, mod, &ly->up[e]);
                snprintf(mod, sizeof mod, "model.layers.%lld.mlp.experts.%lld.down_proj", (long long)L, (long long)e);
                mf_add_linear(&w, mod, &ly->down[e]);
            }
        }
        if (o->shared_inter > 0) {
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.shared_expert.gate_proj", (long long)L);
            mf_add_linear(&w, mod, &ly->sh_gate);
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.shared_expert.up_proj", (long long)L);
            mf_add_linear(&w, mod, &ly->sh_up);
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.shared_expert.down_proj", (long long)L);
            mf_add_linear(&w, mod, &ly->sh_down);
            snprintf(mod, sizeof mod, "model.layers.%lld.mlp.shared_expert_gate", (long long)L);
            mf_add_linear(&w, mod, &ly->sh_gw);
        }
    }
    const char **names = malloc(w.n * sizeof *names);
    assert_non_null(names);
    for (size_t i = 0; i < w.n; i++) names[i] = w.names[i];
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    td_err err;
    td_status st = td_st_write_file(path, w.n, names, w.t, 0, NULL, NULL, &err);
    if (st) fail_msg("mf_write: %s", err.msg);
    free(names);
    free(w.names);
    free(w.t);
    for (int64_t i = 0; i < 2 * o->layers; i++) free(fused[i]);
    free(fused);
}

#endif /* TD_TEST_MOE_FIXTURE_H */
