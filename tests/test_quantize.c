/* test_quantize.c — the checkpoint quantizer (core/quantize) and `tandem quantize` end to end.
 *
 * Quantizing the unquantized variant of a generated preset must reproduce the preset's NVFP4
 * bytes exactly; dequantization error is checked element by element against the bound that
 * E2M1 spacing and the E4M3 block scale imply, on random and adversarial weights; ModelOpt and
 * compressed-tensors outputs are compared value by value; outputs must inspect clean. */
#include "test_common.h"
/* the fixture header's writer helpers are not all used here */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "fixture_ckpt.h"
#pragma GCC diagnostic pop
#include "formats.h"
#include "gen.h"
#include "inspect.h"
#include "nvfp4.h"
#include "quantize.h"
#include "rng.h"
#include "sha256.h"

#include <math.h>

static fx_ckpt g_fx;

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *tandem_bin(void)
{
    const char *b = getenv("TD_TANDEM");
    return b && *b ? b : "build/release/tandem";
}

static void gen_ok(const char *preset, const char *dir, uint64_t seed, bool unquantized, bool fused,
                   int64_t experts)
{
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = preset;
    o.seed = seed;
    o.unquantized = unquantized;
    o.fused_experts = fused;
    o.num_experts = experts;
    o.force = true;
    td_err err;
    if (td_gen(&o, dir, NULL, &err)) fail_msg("gen %s: %s", preset, err.msg);
}

static td_status quantize(const char *in, const char *out, td_nvfp4_conv conv, const char *only,
                          const char *exclude, const char *manifest, td_quantize_result *r, td_err *err)
{
    td_quantize_opts o;
    td_quantize_opts_init(&o);
    o.in_dir = in;
    o.out_dir = out;
    o.conv = conv;
    o.force = true;
    o.only = &only;
    o.n_only = only ? 1 : 0;
    o.exclude = &exclude;
    o.n_exclude = exclude ? 1 : 0;
    o.dequant_manifest = manifest;
    td_err_clear(err);
    return td_quantize(&o, r, err);
}

static void quantize_ok(const char *in, const char *out, td_nvfp4_conv conv, const char *only,
                        const char *exclude, td_quantize_result *r)
{
    td_err err;
    td_quantize_result rr;
    if (quantize(in, out, conv, only, exclude, NULL, r ? r : &rr, &err))
        fail_msg("quantize %s: %s", in, err.msg);
}

static void inspect_clean(const char *dir, td_inspect_report *r)
{
    td_err err;
    td_err_clear(&err);
    if (td_inspect(dir, false, r, &err)) fail_msg("inspect %s: %s", dir, err.msg);
    int64_t any = 0;
    for (int k = 0; k < TD_FIND_KIND_COUNT; k++) any += r->counts[k];
    if (r->n_errors || r->n_warnings || any) {
        td_inspect_print(r, stderr);
        fail_msg("%s: inspect is not clean", dir);
    }
}

static td_st_set *open_set(const char *dir)
{
    td_st_set *s;
    td_err err;
    if (td_st_set_open(dir, &s, &err)) fail_msg("%s", err.msg);
    if (td_st_set_validate(s, &err)) fail_msg("%s", err.msg);
    return s;
}

static bool get(td_st_set *s, const char *name, td_tensor *t)
{
    td_err err;
    if (!td_st_set_has(s, name)) return false;
    if (td_st_set_tensor(s, name, t, &err)) fail_msg("%s", err.msg);
    return true;
}

static int64_t nbytes_of(const td_tensor *t)
{
    int64_t nb;
    td_err err;
    assert_int_equal(td_dtype_nbytes(t->dtype, td_tensor_numel(t), &nb, &err), TD_OK);
    return nb;
}

static bool same_tensor(const td_tensor *a, const td_tensor *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    int64_t n = nbytes_of(a);
    return n == 0 || !memcmp(a->data, b->data, (size_t)n);
}

static float f32_of(td_st_set *s, const char *name)
{
    td_tensor t;
    if (!get(s, name, &t)) fail_msg("missing %s", name);
    float v;
    memcpy(&v, t.data, 4);
    return v;
}

/* Input weight (BF16/F16/F32 file bytes) widened to float. */
static void widen(const td_tensor *t, int64_t off, int64_t n, float *out)
{
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = off + i;
        if (t->dtype == TD_BF16) out[i] = td_bf16_to_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
        else if (t->dtype == TD_F16) out[i] = td_f16_to_f32((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
        else memcpy(&out[i], p + 4 * k, 4);
    }
}

/* Names of an NVFP4 module's tensors in a convention. */
static void nv_names(const char *m, td_nvfp4_conv conv, char *w, char *s, char *g, size_t cap)
{
    snprintf(w, cap, "%s.%s", m, conv == TD_NVFP4_CT ? "weight_packed" : "weight");
    snprintf(s, cap, "%s.weight_scale", m);
    snprintf(g, cap, "%s.%s", m, conv == TD_NVFP4_CT ? "weight_global_scale" : "weight_scale_2");
}

/* Write a BF16 checkpoint for `config` whose values come from fill(name, n, out). */
typedef void (*fill_fn)(const char *name, int64_t rows, int64_t cols, float *out, td_rng *rng);

static void write_custom(const char *dir, const char *config, fill_fn fill, uint64_t seed)
{
    fx_write_meta(dir, config, NULL);
    fx_inventory(dir, &g_fx);
    char p[900];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    td_st_writer *w;
    td_err err;
    if (td_st_writer_init(p, &w, &err)) fail_msg("%s", err.msg);
    for (size_t i = 0; i < g_fx.n; i++)
        if (td_st_writer_declare(w, g_fx.t[i].name, g_fx.t[i].dt, g_fx.t[i].nd, g_fx.t[i].shape, &err))
            fail_msg("%s", err.msg);
    if (td_st_writer_begin(w, &err)) fail_msg("%s", err.msg);
    td_rng rng;
    td_rng_seed(&rng, seed);
    for (size_t i = 0; i < g_fx.n; i++) {
        const fx_tensor *t = &g_fx.t[i];
        int64_t numel, nb;
        assert_int_equal(td_shape_numel(t->nd, t->shape, &numel, &err), TD_OK);
        assert_int_equal(td_dtype_nbytes(t->dt, numel, &nb, &err), TD_OK);
        uint8_t *buf = malloc((size_t)nb + 8);
        float *v = malloc((size_t)numel * sizeof *v + 8);
        assert_non_null(buf);
        assert_non_null(v);
        if (t->dt == TD_BF16) {
            int64_t cols = t->nd >= 2 ? t->shape[t->nd - 1] : numel;
            fill(t->name, numel / (cols ? cols : 1), cols, v, &rng);
            for (int64_t k = 0; k < numel; k++) {
                uint16_t h = td_f32_to_bf16(v[k]);
                buf[2 * k] = (uint8_t)h;
                buf[2 * k + 1] = (uint8_t)(h >> 8);
            }
        } else {
            memset(buf, 0, (size_t)nb);
        }
        if (td_st_writer_write(w, t->name, buf, (size_t)nb, &err)) fail_msg("%s", err.msg);
        free(buf);
        free(v);
    }
    if (td_st_writer_finish(w, &err)) fail_msg("%s", err.msg);
    td_st_writer_free(w);
}

static const char Q3_UNQUANT_CONFIG[] =
    "{\"architectures\":[\"Qwen3NextForCausalLM\"],\"model_type\":\"qwen3_next\",\"hidden_size\":32,"
    "\"num_hidden_layers\":4,\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"head_dim\":8,\"partial_rotary_factor\":0.25,\"linear_num_key_heads\":2,"
    "\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":%d,"
    "\"shared_expert_intermediate_size\":16,\"eos_token_id\":1}";

static const char *q3_config(int inter)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, Q3_UNQUANT_CONFIG, inter);
    return buf;
}

/* ---- value recipes ----------------------------------------------------------------------- */

static float heavy(td_rng *rng)
{
    /* normal with an occasional 10-30x outlier */
    float x = td_rng_normal_f32(rng) * 0.05f;
    if (td_rng_below(rng, 200) == 0) x *= (float)(10 + td_rng_below(rng, 20));
    return x;
}

/* Random weights everywhere, with adversarial blocks planted in chosen modules. */
static void fill_adversarial(const char *name, int64_t rows, int64_t cols, float *v, td_rng *rng)
{
    int64_t n = rows * cols;
    for (int64_t i = 0; i < n; i++) v[i] = heavy(rng);
    static const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    if (strstr(name, "layers.0.mlp.experts.0.gate_proj")) {
        /* exact E2M1 ties: block max 6c with an exactly representable scale, members t*c */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < cols / 16; b++) {
                float c = ldexpf(1.0f, -(int)(4 + (r + b) % 6));
                float *p = v + r * cols + b * 16;
                p[0] = 6.0f * c;
                for (int i = 1; i < 16; i++) p[i] = ((i & 1) ? -1.0f : 1.0f) * ties[i % 7] * c;
            }
    } else if (strstr(name, "layers.0.mlp.experts.0.up_proj")) {
        /* one spike per block, the rest tiny; some whole blocks at 1e-7 of the amax */
        for (int64_t i = 0; i < n; i++) v[i] = (i % 16 == 3) ? 0.9f : 1e-4f * (float)((i % 7) - 3);
        for (int64_t i = 0; i < 16; i++) v[16 + i] = 1e-7f * (float)(i + 1);
        for (int64_t i = 0; i < 16; i++) v[48 + i] = 3e-6f * (float)(i - 8);
    } else if (strstr(name, "layers.0.mlp.experts.1.down_proj")) {
        /* zero blocks (+0 and -0), constant blocks, alternating signs */
        for (int64_t i = 0; i < 16; i++) v[i] = 0.0f;
        for (int64_t i = 16; i < 32 && i < n; i++) v[i] = -0.0f;
        for (int64_t i = 32; i < 48 && i < n; i++) v[i] = 0.3f;
        for (int64_t i = 48; i < 64 && i < n; i++) v[i] = (i & 1) ? -0.7f : 0.7f;
    } else if (strstr(name, "layers.1.mlp.experts.2.gate_proj")) {
        /* huge magnitudes; its up_proj sibling (normal) shares this amax, so its blocks get
         * tiny, subnormal and clamped scales */
        for (int64_t i = 0; i < n; i++) v[i] *= 1e30f;
    } else if (strstr(name, "layers.2.mlp.experts.3.down_proj")) {
        for (int64_t i = 0; i < n; i++) v[i] = 0.0f; /* all-zero tensor */
    } else if (strstr(name, "layers.3.mlp.shared_expert.down_proj")) {
        for (int64_t i = 0; i < n; i++) v[i] *= 1e-30f; /* tiny but normal */
    } else if (strstr(name, "layers.1.self_attn") == NULL && strstr(name, "experts.3.gate_proj")) {
        for (int64_t i = 0; i < n; i++) v[i] = td_rng_uniform(rng) < 0.5 ? 1e-39f : -2e-39f; /* BF16 subnormals... */
        v[0] = 0.5f;                                                                           /* ...and one normal */
    }
}

/* amax = 2688 * 2^-12 = 0.65625 in every tensor: both conventions' globals are powers of two. */
static void fill_pow2(const char *name, int64_t rows, int64_t cols, float *v, td_rng *rng)
{
    (void)name;
    int64_t n = rows * cols;
    for (int64_t i = 0; i < n; i++) {
        float x = td_rng_normal_f32(rng) * 0.1f;
        v[i] = fmaxf(-0.6f, fminf(0.6f, x));
    }
    v[0] = 0.65625f;
    if (n >= 64) {
        for (int i = 16; i < 32; i++) v[i] = (i & 1) ? 0.0f : -0.0f;  /* a zero block */
        const float g = 0x1p-12f, ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        v[32] = 6.0f * 0.5f * g;                                    /* scale exactly 0.5 */
        for (int i = 1; i < 16; i++) v[32 + i] = ties[i % 7] * 0.5f * g * ((i & 2) ? -1.0f : 1.0f);
    }
}

/* Per-element bound: |w - dq| <= h(y) * f, y = |w| / f, h = half the E2M1 spacing at y
 * (0.25 below 2, 0.5 below 4, 1 below 6) or y - 6 above 6 (saturation), plus float32
 * rounding of the division and the product. */
static double e2m1_bound(double y)
{
    if (y <= 2.0) return 0.25;
    if (y <= 4.0) return 0.5;
    if (y <= 6.0) return 1.0;
    return y - 6.0;
}

typedef struct bound_stats {
    int64_t elements, modules, zero_blocks, subnormal_scales, normal_blocks;
    double worst;  /* max |w - dq| / (h f) over elements that do not saturate (y <= 6) */
} bound_stats;

/* Check every NVFP4 module of `out` against the input values of `in`. */
static void check_bound(const char *in, const char *out, td_nvfp4_conv conv, bound_stats *bs)
{
    td_st_set *si = open_set(in), *so = open_set(out);
    memset(bs, 0, sizeof *bs);
    char w[400], s[400], g[400], m[300], iw[400];
    for (size_t i = 0; i < td_st_set_count(so); i++) {
        const char *name = td_st_set_name(so, i);
        size_t nl = strlen(name);
        if (nl < 13 || strcmp(name + nl - 13, ".weight_scale")) continue;
        snprintf(m, sizeof m, "%.*s", (int)(nl - 13), name);
        nv_names(m, conv, w, s, g, sizeof w);
        td_tensor tw, ts, ti;
        assert_true(get(so, w, &tw) && get(so, s, &ts));
        float glob = f32_of(so, g);
        snprintf(iw, sizeof iw, "%s.weight", m);
        assert_true(get(si, iw, &ti));
        int64_t rows = ti.shape[0], k = ti.shape[1], n = rows * k;
        float *x = malloc((size_t)n * sizeof *x), *dq = malloc((size_t)n * sizeof *dq);
        assert_non_null(x);
        assert_non_null(dq);
        widen(&ti, 0, n, x);
        td_err err;
        assert_int_equal(td_nvfp4_dequantize(tw.data, ts.data, glob, conv, rows, k, dq, &err), TD_OK);
        /* the global comes from the tensor's amax, shared with the gate/up sibling */
        float amax = 0.0f;
        for (int64_t e = 0; e < n; e++) amax = fmaxf(amax, fabsf(x[e]));
        const char *sib = NULL;
        char sibn[400];
        if (strstr(m, ".gate_proj")) sib = "up_proj";
        if (strstr(m, ".up_proj")) sib = "gate_proj";
        if (sib) {
            snprintf(sibn, sizeof sibn, "%.*s%s.weight", (int)(strrchr(m, '.') - m + 1), m, sib);
            td_tensor tsib;
            assert_true(get(si, sibn, &tsib));
            float *y = malloc((size_t)n * sizeof *y);
            assert_non_null(y);
            widen(&tsib, 0, n, y);
            for (int64_t e = 0; e < n; e++) amax = fmaxf(amax, fabsf(y[e]));
            free(y);
        }
        float want = amax == 0.0f ? 1.0f : conv == TD_NVFP4_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
        if (glob != want) fail_msg("%s: global %a, amax %a implies %a", m, (double)glob, (double)amax, (double)want);
        const uint8_t *sc = ts.data;
        for (int64_t b = 0; b < n / 16; b++) {
            float f = td_nvfp4_block_factor(sc[b], glob, conv);
            bool zero = true;
            float bmax = 0.0f;
            for (int e = 0; e < 16; e++) {
                zero = zero && x[b * 16 + e] == 0.0f;
                bmax = fmaxf(bmax, fabsf(x[b * 16 + e]));
            }
            if (zero) {
                bs->zero_blocks++;
                for (int e = 0; e < 16; e++) assert_true(dq[b * 16 + e] == 0.0f);
                assert_int_equal(sc[b], conv == TD_NVFP4_MODELOPT ? 0x38 : 0x20);
                continue;
            }
            if ((sc[b] & 0x78) == 0) bs->subnormal_scales++;
            if ((sc[b] & 0x78) != 0) {
                /* a normal, unclamped scale keeps the block max within 6 * (1 + 2^-4) */
                bs->normal_blocks++;
                assert_true((double)bmax / (double)f <= 6.0 * (1.0 + 0x1p-4) * (1.0 + 1e-6));
            }
            for (int e = 0; e < 16; e++) {
                double wv = x[b * 16 + e], d = dq[b * 16 + e], y = fabs(wv) / (double)f;
                double h = e2m1_bound(y) * (double)f;
                double err_abs = fabs(wv - d);
                double allowed = h * (1.0 + 0x1p-18) + fabs(wv) * 0x1p-20 + (double)f * 0x1p-20;
                if (err_abs > allowed)
                    fail_msg("%s[%lld]: w %a dq %a f %a y %g: error %g > bound %g", m,
                             (long long)(b * 16 + e), wv, d, (double)f, y, err_abs, allowed);
                if (y <= 6.0 && h > 0 && err_abs / h > bs->worst) bs->worst = err_abs / h;
                bs->elements++;
            }
        }
        free(x);
        free(dq);
        bs->modules++;
    }
    td_st_set_close(si);
    td_st_set_close(so);
}

/* ---- tests -------------------------------------------------------------------------------- */

/* quantize(unquantized preset) == the preset's NVFP4 bytes, tensor by tensor. */
static void quantize_reproduces_the_generated_nvfp4_bytes(void **state)
{
    (void)state;
    char nv[800], bf[800], out[800];
    snprintf(nv, sizeof nv, "%s", td_test_path("q3_nv"));
    snprintf(bf, sizeof bf, "%s", td_test_path("q3_bf"));
    snprintf(out, sizeof out, "%s", td_test_path("q3_q"));
    gen_ok("qwen3-next-tiny", nv, 3, false, false, 16);
    gen_ok("qwen3-next-tiny", bf, 3, true, false, 16);
    td_quantize_result r;
    quantize_ok(bf, out, TD_NVFP4_MODELOPT, NULL, NULL, &r);
    assert_int_equal(r.modules_quantized, 8 * (16 * 3 + 3) + 6 + 2);
    td_inspect_report ir;
    inspect_clean(out, &ir);
    assert_string_equal(ir.quant.quant_algo, "W4A16_NVFP4");
    assert_false(ir.quant.has_input_scale);
    td_inspect_report_free(&ir);
    td_st_set *a = open_set(nv), *b = open_set(out);
    size_t compared = 0;
    for (size_t i = 0; i < td_st_set_count(b); i++) {
        const char *name = td_st_set_name(b, i);
        td_tensor ta, tb;
        if (!get(a, name, &ta)) fail_msg("%s is not in the generated checkpoint", name);
        assert_true(get(b, name, &tb));
        if (!same_tensor(&ta, &tb)) fail_msg("%s differs from the generated checkpoint", name);
        compared++;
    }
    /* everything but the W4A4 input scales, which a weight-only quantizer does not write */
    assert_int_equal(compared + (size_t)r.modules_quantized, td_st_set_count(a));
    td_st_set_close(a);
    td_st_set_close(b);
}

/* Fused 3-D experts are split into per-expert NVFP4 tensors named as in the releases. */
static void quantize_splits_fused_experts(void **state)
{
    (void)state;
    char fu[800], nv[800], pe[800], out[800];
    snprintf(fu, sizeof fu, "%s", td_test_path("fl_fused"));
    snprintf(nv, sizeof nv, "%s", td_test_path("fl_nv"));
    snprintf(pe, sizeof pe, "%s", td_test_path("fl_pe"));
    snprintf(out, sizeof out, "%s", td_test_path("fl_q"));
    gen_ok("flash-next-tiny", fu, 4, true, true, 8);
    gen_ok("flash-next-tiny", nv, 4, false, false, 8);
    gen_ok("flash-next-tiny", pe, 4, true, false, 8);
    td_quantize_result r;
    quantize_ok(fu, out, TD_NVFP4_MODELOPT, "*.mlp.experts.*", NULL, &r);
    assert_int_equal(r.modules_quantized, 8 * 8 * 3);
    assert_int_equal(r.modules_split, 8 * 8 * 3);
    td_inspect_report ir;
    inspect_clean(out, &ir);
    assert_false(ir.fused_experts);
    td_inspect_report_free(&ir);
    td_st_set *a = open_set(nv), *b = open_set(out);
    assert_false(td_st_set_has(b, "model.language_model.layers.0.mlp.experts.gate_up_proj"));
    int64_t compared = 0;
    for (size_t i = 0; i < td_st_set_count(b); i++) {
        const char *name = td_st_set_name(b, i);
        if (!strstr(name, ".mlp.experts.")) continue;
        td_tensor ta, tb;
        assert_true(get(a, name, &ta) && get(b, name, &tb));
        if (!same_tensor(&ta, &tb)) fail_msg("%s differs from the generated NVFP4 expert", name);
        compared++;
    }
    assert_int_equal(compared, 8 * 8 * 3 * 3);
    td_st_set_close(a);
    td_st_set_close(b);

    /* an excluded expert becomes per-expert BF16 slices equal to the unfused weights */
    quantize_ok(fu, out, TD_NVFP4_CT, NULL, "*.mlp.experts.1.*", &r);
    inspect_clean(out, &ir);
    assert_int_equal(ir.schemes[TD_SCHEME_NVFP4_CT].modules, r.modules_quantized);
    td_inspect_report_free(&ir);
    a = open_set(pe);
    b = open_set(out);
    static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
    for (int l = 0; l < 8; l++)
        for (int k = 0; k < 3; k++) {
            char name[200];
            snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.1.%s.weight", l, proj[k]);
            td_tensor ta, tb;
            assert_true(get(a, name, &ta) && get(b, name, &tb));
            assert_true(same_tensor(&ta, &tb));
        }
    td_st_set_close(a);
    td_st_set_close(b);

    /* experts not selected at all: the fused tensors are copied whole */
    quantize_ok(fu, out, TD_NVFP4_MODELOPT, "*.self_attn.o_proj", NULL, &r);
    assert_int_equal(r.modules_split, 0);
    inspect_clean(out, &ir);
    assert_true(ir.fused_experts);
    assert_int_equal(ir.schemes[TD_SCHEME_NVFP4].modules, 2);
    td_inspect_report_free(&ir);
}

/* Every dequantized element is within half an E2M1 step (or the saturation excess) of the
 * input, for random weights and adversarial blocks: exact ties, spikes, tiny, zero and -0
 * blocks, constant and alternating blocks, huge and tiny magnitudes, BF16 subnormals, an
 * all-zero tensor, and a gate/up pair whose shared amax is 1e30 times one half's. */
static void quantize_error_is_within_the_e2m1_bound(void **state)
{
    (void)state;
    char in[800], out[800];
    snprintf(in, sizeof in, "%s", td_test_path("adv_in"));
    snprintf(out, sizeof out, "%s", td_test_path("adv_out"));
    write_custom(in, q3_config(16), fill_adversarial, 11);
    static const td_nvfp4_conv convs[2] = {TD_NVFP4_MODELOPT, TD_NVFP4_CT};
    for (int c = 0; c < 2; c++) {
        td_quantize_result r;
        quantize_ok(in, out, convs[c], NULL, NULL, &r);
        td_inspect_report ir;
        inspect_clean(out, &ir);
        td_inspect_report_free(&ir);
        bound_stats bs;
        check_bound(in, out, convs[c], &bs);
        assert_int_equal(bs.modules, r.modules_quantized);
        assert_true(bs.zero_blocks >= 4 + 16);     /* planted zero blocks + the zero tensor */
        assert_true(bs.subnormal_scales > 0);      /* the 1e30 pair and the tiny blocks */
        assert_true(bs.normal_blocks > 1000);
        assert_true(bs.worst <= 1.0 + 1e-5);
        print_message("%s: %lld elements in %lld modules, %lld zero blocks, %lld subnormal scales, "
                      "worst error %.6f of the bound\n", td_nvfp4_conv_name(convs[c]), (long long)bs.elements,
                      (long long)bs.modules, (long long)bs.zero_blocks, (long long)bs.subnormal_scales, bs.worst);
    }
}

/* ModelOpt and compressed-tensors dequantize to the same values: exactly (as numbers) when
 * the globals are powers of two; otherwise within 2 ulp, except at arithmetic ties, where the
 * two operation orders may round an element or a block scale to the neighbouring value. */
static void ct_and_modelopt_dequantize_to_the_same_values(void **state)
{
    (void)state;
    char in[800], mo[800], ct[800];
    snprintf(in, sizeof in, "%s", td_test_path("p2_in"));
    snprintf(mo, sizeof mo, "%s", td_test_path("p2_mo"));
    snprintf(ct, sizeof ct, "%s", td_test_path("p2_ct"));
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) write_custom(in, q3_config(16), fill_pow2, 5);
        else gen_ok("qwen3-next-tiny", in, 6, true, false, 16);
        quantize_ok(in, mo, TD_NVFP4_MODELOPT, NULL, NULL, NULL);
        quantize_ok(in, ct, TD_NVFP4_CT, NULL, NULL, NULL);
        td_st_set *si = open_set(in), *sa = open_set(mo), *sb = open_set(ct);
        int64_t elems = 0, neq = 0, code_diff = 0, scale_diff = 0, blocks = 0, zero_blocks = 0;
        char w[400], s[400], g[400], m[300], iw[400];
        for (size_t i = 0; i < td_st_set_count(sa); i++) {
            const char *name = td_st_set_name(sa, i);
            size_t nl = strlen(name);
            if (nl < 15 || strcmp(name + nl - 15, ".weight_scale_2")) continue;
            snprintf(m, sizeof m, "%.*s", (int)(nl - 15), name);
            td_tensor aw, as, bw, bsc, ti;
            nv_names(m, TD_NVFP4_MODELOPT, w, s, g, sizeof w);
            assert_true(get(sa, w, &aw) && get(sa, s, &as));
            float ga = f32_of(sa, g);
            nv_names(m, TD_NVFP4_CT, w, s, g, sizeof w);
            assert_true(get(sb, w, &bw) && get(sb, s, &bsc));
            float gb = f32_of(sb, g);
            snprintf(iw, sizeof iw, "%s.weight", m);
            assert_true(get(si, iw, &ti));
            int64_t rows = ti.shape[0], k = ti.shape[1], n = rows * k;
            float *x = malloc((size_t)n * 4), *da = malloc((size_t)n * 4), *db = malloc((size_t)n * 4);
            assert_true(x && da && db);
            widen(&ti, 0, n, x);
            td_err err;
            assert_int_equal(td_nvfp4_dequantize(aw.data, as.data, ga, TD_NVFP4_MODELOPT, rows, k, da, &err), TD_OK);
            assert_int_equal(td_nvfp4_dequantize(bw.data, bsc.data, gb, TD_NVFP4_CT, rows, k, db, &err), TD_OK);
            const uint8_t *sca = as.data, *scb = bsc.data, *pa = aw.data, *pb = bw.data;
            for (int64_t bl = 0; bl < n / 16; bl++) {
                blocks++;
                bool zero = true;
                for (int e = 0; e < 16; e++) zero = zero && x[bl * 16 + e] == 0.0f;
                if (zero) {
                    zero_blocks++;
                    assert_int_equal(sca[bl], 0x38);
                    assert_int_equal(scb[bl], 0x20);
                    for (int e = 0; e < 16; e++) assert_true(da[bl * 16 + e] == 0.0f && db[bl * 16 + e] == 0.0f);
                    continue;
                }
                float fa = td_nvfp4_block_factor(sca[bl], ga, TD_NVFP4_MODELOPT);
                if (sca[bl] != scb[bl]) {
                    /* only when ModelOpt's raw scale sits on the midpoint of two E4M3 values */
                    scale_diff++;
                    float amax_b = 0.0f;
                    for (int e = 0; e < 16; e++) amax_b = fmaxf(amax_b, fabsf(x[bl * 16 + e]));
                    float six_g = 6.0f * ga, s_raw = amax_b / six_g;
                    double mid = ((double)td_e4m3_to_f32(sca[bl]) + (double)td_e4m3_to_f32(scb[bl])) / 2.0;
                    assert_true(pass == 1);
                    assert_true(abs((int)sca[bl] - (int)scb[bl]) == 1);
                    if (fabs((double)s_raw - mid) > 1e-6 * mid)
                        fail_msg("%s block %lld: scales %02x/%02x differ off a tie (s_raw %.9g)", m,
                                 (long long)bl, sca[bl], scb[bl], (double)s_raw);
                    elems += 16;
                    continue;
                }
                for (int e = 0; e < 16; e++) {
                    int64_t j = bl * 16 + e;
                    elems++;
                    uint8_t ca = (uint8_t)((pa[j / 2] >> (4 * (j & 1))) & 0xF);
                    uint8_t cb = (uint8_t)((pb[j / 2] >> (4 * (j & 1))) & 0xF);
                    if ((ca & 7) == 0 && (cb & 7) == 0) ca = cb; /* ±0 */
                    if (ca != cb) {
                        /* only where w / f is an E2M1 rounding tie */
                        code_diff++;
                        assert_true(pass == 1);
                        double y = fabs((double)x[j] / (double)fa), best = 1e9;
                        static const double t[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
                        for (int q = 0; q < 7; q++) best = fmin(best, fabs(y - t[q]) / t[q]);
                        if (best > 1e-6) fail_msg("%s[%lld]: codes %x/%x differ off a tie (y %.9g)", m, (long long)j, ca, cb, y);
                        continue;
                    }
                    if (da[j] == db[j]) continue;
                    neq++;
                    assert_true(pass == 1); /* power-of-two globals: identical values */
                    int32_t ua, ub;
                    memcpy(&ua, &da[j], 4);
                    memcpy(&ub, &db[j], 4);
                    if (abs(ua - ub) > 2) fail_msg("%s[%lld]: %a vs %a", m, (long long)j, (double)da[j], (double)db[j]);
                }
            }
            free(x);
            free(da);
            free(db);
        }
        td_st_set_close(si);
        td_st_set_close(sa);
        td_st_set_close(sb);
        print_message("%s: %lld blocks (%lld zero), %lld elements: %lld scale ties, %lld code ties, "
                      "%lld values 1-2 ulp apart\n", pass ? "generated weights" : "power-of-two globals",
                      (long long)blocks, (long long)zero_blocks, (long long)elems, (long long)scale_diff,
                      (long long)code_diff, (long long)neq);
        if (pass == 0) {
            assert_int_equal(neq + code_diff + scale_diff, 0);
            assert_true(zero_blocks > 0);
        } else {
            /* ties are rare: < 0.1% of blocks and elements */
            assert_true(scale_diff * 1000 < blocks);
            assert_true(code_diff * 1000 < elems);
        }
        assert_true(elems > 10000);
    }
}

/* Refusals and failures leave the output directory untouched. */
static void quantize_refuses_bad_requests_cleanly(void **state)
{
    (void)state;
    char in[800], out[800], q[800], tmp[900];
    snprintf(in, sizeof in, "%s", td_test_path("ref_in"));
    snprintf(out, sizeof out, "%s", td_test_path("ref_out"));
    snprintf(q, sizeof q, "%s", td_test_path("ref_q"));
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    write_custom(in, q3_config(16), fill_adversarial, 1);
    td_quantize_result r;
    td_err err;
    td_test_sh("rm -rf '%s' && mkdir -p '%s' && touch '%s/keep'", out, out, out);
    td_quantize_opts o;
    td_quantize_opts_init(&o);
    o.in_dir = in;
    o.out_dir = out;
    assert_int_equal(td_quantize(&o, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "already exists"));
    char keep[900];
    snprintf(keep, sizeof keep, "%s/keep", out);
    assert_int_equal(access(keep, F_OK), 0);

    /* globs that select nothing, or nothing quantizable */
    assert_int_equal(quantize(in, out, TD_NVFP4_MODELOPT, "*.mlp.expert.*", NULL, NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--only '*.mlp.expert.*'"));
    assert_int_equal(quantize(in, out, TD_NVFP4_MODELOPT, "*embed_tokens", NULL, NULL, &r, &err), TD_ERR_ARG);
    assert_int_equal(quantize(in, out, TD_NVFP4_MODELOPT, NULL, "*.experts.99.*", NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--exclude '*.experts.99.*'"));
    assert_int_equal(access(keep, F_OK), 0);

    /* a non-finite weight: an error naming the module; no output, no staging left */
    td_test_sh("rm -rf '%s'", out);
    char nanin[800];
    snprintf(nanin, sizeof nanin, "%s", td_test_path("nan_in"));
    write_custom(nanin, q3_config(16), fill_adversarial, 2);
    {
        /* poison one element of a routed expert */
        char p[900];
        snprintf(p, sizeof p, "%s/model.safetensors", nanin);
        td_st_file *f;
        assert_int_equal(td_st_file_open(p, &f, &err), TD_OK);
        const td_st_info *inf = td_st_header_find(td_st_file_header(f), "model.layers.2.mlp.experts.1.up_proj.weight");
        assert_non_null(inf);
        uint64_t off = 8 + td_st_file_header(f)->header_len + inf->begin + 2 * 5;
        td_st_file_close(f);
        FILE *fp = fopen(p, "r+b");
        assert_non_null(fp);
        assert_int_equal(fseek(fp, (long)off, SEEK_SET), 0);
        const uint8_t nanbf[2] = {0xC0, 0x7F};
        assert_int_equal(fwrite(nanbf, 1, 2, fp), 2);
        assert_int_equal(fclose(fp), 0);
    }
    assert_int_equal(quantize(nanin, out, TD_NVFP4_MODELOPT, NULL, NULL, NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "model.layers.2.mlp.experts.1"));
    assert_non_null(strstr(err.msg, "NaN"));
    assert_int_not_equal(access(out, F_OK), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);

    /* an input dimension that is not a multiple of 16 */
    char odd[800];
    snprintf(odd, sizeof odd, "%s", td_test_path("odd_in"));
    write_custom(odd, q3_config(24), fill_adversarial, 3);
    assert_int_equal(quantize(odd, out, TD_NVFP4_MODELOPT, NULL, NULL, NULL, &r, &err), TD_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "down_proj"));
    assert_non_null(strstr(err.msg, "multiple of 16"));
    quantize_ok(odd, out, TD_NVFP4_MODELOPT, NULL, "*.mlp.experts.*.down_proj", NULL);
    td_inspect_report ir;
    inspect_clean(out, &ir);
    td_inspect_report_free(&ir);

    /* an already quantized checkpoint */
    quantize_ok(in, q, TD_NVFP4_MODELOPT, NULL, NULL, NULL);
    assert_int_equal(quantize(q, out, TD_NVFP4_CT, NULL, NULL, NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "already quantized"));
}

/* --only / --exclude, siblings sharing a global, and a compact exclusion list. */
static void quantize_selection_and_gate_up_siblings(void **state)
{
    (void)state;
    char in[800], out[800];
    snprintf(in, sizeof in, "%s", td_test_path("sel_in"));
    snprintf(out, sizeof out, "%s", td_test_path("sel_out"));
    gen_ok("qwen3-next-tiny", in, 8, true, false, 8);
    td_quantize_result r;
    quantize_ok(in, out, TD_NVFP4_MODELOPT, "*.mlp.experts.*", "*.experts.2.*", &r);
    assert_int_equal(r.modules_quantized, 8 * 7 * 3);
    assert_true(r.n_exclusions <= 16); /* one pattern per kind of unselected module */
    td_inspect_report ir;
    inspect_clean(out, &ir);
    assert_int_equal(ir.schemes[TD_SCHEME_NVFP4].modules, 8 * 7 * 3);
    td_inspect_report_free(&ir);
    td_st_set *s = open_set(out);
    td_tensor t;
    assert_true(get(s, "model.layers.4.mlp.experts.2.up_proj.weight", &t));
    assert_int_equal(t.dtype, TD_BF16);
    assert_true(get(s, "model.layers.4.mlp.shared_expert.up_proj.weight", &t));
    assert_int_equal(t.dtype, TD_BF16);
    for (int l = 0; l < 8; l++)
        for (int e = 0; e < 8; e++) {
            if (e == 2) continue;
            char a[200], b[200], d[200];
            snprintf(a, sizeof a, "model.layers.%d.mlp.experts.%d.gate_proj.weight_scale_2", l, e);
            snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d.up_proj.weight_scale_2", l, e);
            snprintf(d, sizeof d, "model.layers.%d.mlp.experts.%d.down_proj.weight_scale_2", l, e);
            assert_true(f32_of(s, a) == f32_of(s, b));
            assert_true(f32_of(s, a) != f32_of(s, d));
        }
    td_st_set_close(s);
    /* the hf_quant_config.json and config.json lists agree (no note from inspect above) */
    char p[900];
    snprintf(p, sizeof p, "%s/hf_quant_config.json", out);
    char *txt = td_test_slurp(p, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "model.layers.*.mlp.experts.2.gate_proj"));
    assert_non_null(strstr(txt, "W4A16_NVFP4"));
    free(txt);
}

/* Other files are copied, provenance recorded, shards kept or rebuilt by size. */
static void quantize_copies_files_and_shards(void **state)
{
    (void)state;
    char in[800], out[800], p[900], q[900];
    snprintf(in, sizeof in, "%s", td_test_path("sh_in"));
    snprintf(out, sizeof out, "%s", td_test_path("sh_out"));
    gen_ok("flash-next-tiny", in, 2, true, false, 8);
    snprintf(p, sizeof p, "%s/tokenizer.json", in);
    td_test_write_str(p, "{\"model\": {\"type\": \"BPE\"}}");
    td_quantize_result r;
    quantize_ok(in, out, TD_NVFP4_MODELOPT, NULL, NULL, &r);
    /* same shard file names as the input */
    td_st_set *a = open_set(in), *b = open_set(out);
    assert_int_equal(td_st_set_shard_count(a), td_st_set_shard_count(b));
    assert_true(td_st_set_shard_count(b) > 1);
    for (size_t i = 0; i < td_st_set_shard_count(a); i++)
        assert_string_equal(td_st_set_shard_name(a, i), td_st_set_shard_name(b, i));
    td_st_set_close(a);
    td_st_set_close(b);
    static const char *const copied[] = {"tokenizer.json", "generation_config.json"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", in, copied[i]);
        snprintf(q, sizeof q, "%s/%s", out, copied[i]);
        char ha[TD_SHA256_HEX_LEN], hb[TD_SHA256_HEX_LEN];
        td_err err;
        assert_int_equal(td_sha256_file(p, ha, &err), TD_OK);
        assert_int_equal(td_sha256_file(q, hb, &err), TD_OK);
        assert_string_equal(ha, hb);
    }
    assert_int_equal(r.files_copied, 2);
    snprintf(q, sizeof q, "%s/tandem_gen.json", out);
    assert_int_not_equal(access(q, F_OK), 0);
    snprintf(q, sizeof q, "%s/tandem_quantize.json", out);
    char *prov = td_test_slurp(q, NULL);
    assert_non_null(prov);
    assert_non_null(strstr(prov, "\"source_tandem_gen\""));
    assert_non_null(strstr(prov, "flash-next-tiny"));
    free(prov);
    /* resharded by size */
    td_quantize_opts o;
    td_quantize_opts_init(&o);
    o.in_dir = in;
    o.out_dir = out;
    o.force = true;
    o.shard_bytes = 3 << 20;
    o.conv = TD_NVFP4_CT;
    td_err err;
    assert_int_equal(td_quantize(&o, &r, &err), TD_OK);
    assert_true(r.shards_out >= 2);
    td_inspect_report ir;
    inspect_clean(out, &ir);
    assert_int_equal(ir.n_shards, r.shards_out);
    td_inspect_report_free(&ir);

    /* one shard behind an index (model-00001-of-00001.safetensors): name and index kept */
    char one[800];
    snprintf(one, sizeof one, "%s", td_test_path("sh_one"));
    gen_ok("edge", one, 2, true, false, 0);
    td_st_set *s1 = open_set(one);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", one);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\": {");
    for (size_t i = 0; i < td_st_set_count(s1); i++)
        fprintf(f, "%s\"%s\": \"model-00001-of-00001.safetensors\"", i ? ", " : "", td_st_set_name(s1, i));
    fprintf(f, "}}");
    assert_int_equal(fclose(f), 0);
    td_st_set_close(s1);
    assert_int_equal(td_test_sh("mv '%s/model.safetensors' '%s/model-00001-of-00001.safetensors'", one, one), 0);
    quantize_ok(one, out, TD_NVFP4_MODELOPT, NULL, NULL, &r);
    snprintf(q, sizeof q, "%s/model-00001-of-00001.safetensors", out);
    assert_int_equal(access(q, F_OK), 0);
    inspect_clean(out, &ir);
    assert_int_equal(ir.n_shards, 1);
    td_inspect_report_free(&ir);
}

/* Checkpoints written by transformers save_pretrained (tests/fixtures/hf inventories, filled
 * with random values) are quantized in both formats and inspect clean. */
static void quantize_accepts_public_implementation_inventories(void **state)
{
    (void)state;
    static const char *const models[] = {"qwen3_next", "qwen4_exp"};
    for (size_t mi = 0; mi < 2; mi++) {
        char src[256], dir[800], p[900], out[800];
        snprintf(src, sizeof src, "tests/fixtures/hf/%s", models[mi]);
        snprintf(dir, sizeof dir, "%s/hfq_%s", td_test_tmpdir(), models[mi]);
        snprintf(out, sizeof out, "%s/hfq_%s_out", td_test_tmpdir(), models[mi]);
        snprintf(p, sizeof p, "%s/config.json", src);
        char *cfg = td_test_slurp(p, NULL);
        assert_non_null(cfg);
        fx_write_meta(dir, cfg, NULL);
        free(cfg);
        snprintf(p, sizeof p, "%s/tensors.json", src);
        char *inv = td_test_slurp(p, NULL);
        assert_non_null(inv);
        cJSON *j = cJSON_Parse(inv);
        free(inv);
        assert_non_null(j);
        /* one file with every tensor, random BF16 values (I64 buffers zero) */
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        td_st_writer *w;
        td_err err;
        assert_int_equal(td_st_writer_init(p, &w, &err), TD_OK);
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tensors")) {
            const cJSON *shape = cJSON_GetObjectItem(t, "shape");
            int64_t d[3] = {0, 0, 0};
            int nd = cJSON_GetArraySize(shape);
            for (int k = 0; k < nd; k++) d[k] = (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble;
            assert_int_equal(td_st_writer_declare(w, cJSON_GetObjectItem(t, "name")->valuestring,
                                                  td_dtype_from_name(cJSON_GetObjectItem(t, "dtype")->valuestring),
                                                  nd, d, &err), TD_OK);
        }
        assert_int_equal(td_st_writer_begin(w, &err), TD_OK);
        td_rng rng;
        td_rng_seed(&rng, 77);
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(j, "tensors")) {
            const cJSON *shape = cJSON_GetObjectItem(t, "shape");
            int64_t numel = 1;
            for (int k = 0; k < cJSON_GetArraySize(shape); k++) numel *= (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble;
            td_dtype dt = td_dtype_from_name(cJSON_GetObjectItem(t, "dtype")->valuestring);
            size_t nb = (size_t)numel * (size_t)(td_dtype_bits(dt) / 8);
            uint8_t *buf = calloc(nb + 1, 1);
            assert_non_null(buf);
            if (dt == TD_BF16)
                for (int64_t k = 0; k < numel; k++) {
                    uint16_t h = td_f32_to_bf16(heavy(&rng));
                    buf[2 * k] = (uint8_t)h;
                    buf[2 * k + 1] = (uint8_t)(h >> 8);
                }
            assert_int_equal(td_st_writer_write(w, cJSON_GetObjectItem(t, "name")->valuestring, buf, nb, &err), TD_OK);
            free(buf);
        }
        assert_int_equal(td_st_writer_finish(w, &err), TD_OK);
        td_st_writer_free(w);
        cJSON_Delete(j);
        for (int c = 0; c < 2; c++) {
            td_quantize_result r;
            quantize_ok(dir, out, c ? TD_NVFP4_CT : TD_NVFP4_MODELOPT, NULL, NULL, &r);
            /* 4 layers x (8 experts x 3 + 3 shared) + 3 GDN out_proj + 1 o_proj */
            assert_int_equal(r.modules_quantized, 4 * (8 * 3 + 3) + 3 + 1);
            td_inspect_report ir;
            inspect_clean(out, &ir);
            assert_int_equal(ir.schemes[c ? TD_SCHEME_NVFP4_CT : TD_SCHEME_NVFP4].modules, r.modules_quantized);
            td_inspect_report_free(&ir);
            bound_stats bs;
            check_bound(dir, out, c ? TD_NVFP4_CT : TD_NVFP4_MODELOPT, &bs);
            assert_int_equal(bs.modules, r.modules_quantized);
        }
    }
}

/* The dequant manifest matches an independent dequantization of the files written. */
static void dequant_manifest_matches_the_files(void **state)
{
    (void)state;
    char in[800], out[800], man[800];
    snprintf(in, sizeof in, "%s", td_test_path("man_in"));
    snprintf(out, sizeof out, "%s", td_test_path("man_out"));
    snprintf(man, sizeof man, "%s", td_test_path("manifest.json"));
    write_custom(in, q3_config(16), fill_adversarial, 9);
    for (int c = 0; c < 2; c++) {
        td_nvfp4_conv conv = c ? TD_NVFP4_CT : TD_NVFP4_MODELOPT;
        td_quantize_result r;
        td_err err;
        assert_int_equal(quantize(in, out, conv, NULL, NULL, man, &r, &err), TD_OK);
        cJSON *j;
        assert_int_equal(td_json_read_file(man, 1u << 26, &j, &err), TD_OK);
        assert_string_equal(cJSON_GetObjectItem(j, "format")->valuestring, c ? "compressed-tensors" : "modelopt");
        const cJSON *ts = cJSON_GetObjectItem(j, "tensors");
        assert_int_equal(cJSON_GetArraySize(ts), r.modules_quantized);
        td_st_set *s = open_set(out);
        const cJSON *e;
        cJSON_ArrayForEach(e, ts) {
            td_tensor tw, tsc;
            assert_true(get(s, cJSON_GetObjectItem(e, "weight")->valuestring, &tw));
            assert_true(get(s, cJSON_GetObjectItem(e, "scale")->valuestring, &tsc));
            float g = f32_of(s, cJSON_GetObjectItem(e, "global")->valuestring);
            int64_t rows = tsc.shape[0], k = tsc.shape[1] * 16;
            float *dq = malloc((size_t)(rows * k) * 4);
            uint8_t *le = malloc((size_t)(rows * k) * 4);
            assert_true(dq && le);
            assert_int_equal(td_nvfp4_dequantize(tw.data, tsc.data, g, conv, rows, k, dq, &err), TD_OK);
            for (int64_t i = 0; i < rows * k; i++) {
                uint32_t u;
                memcpy(&u, &dq[i], 4);
                for (int b = 0; b < 4; b++) le[4 * i + b] = (uint8_t)(u >> (8 * b));
            }
            uint8_t dg[TD_SHA256_DIGEST_LEN];
            char hex[TD_SHA256_HEX_LEN];
            td_sha256(le, (size_t)(rows * k) * 4, dg);
            td_sha256_hex(dg, hex);
            assert_string_equal(hex, cJSON_GetObjectItem(e, "sha256_dequant_f32le")->valuestring);
            td_sha256(tw.data, (size_t)(rows * k / 2), dg);
            td_sha256_hex(dg, hex);
            assert_string_equal(hex, cJSON_GetObjectItem(e, "sha256_packed")->valuestring);
            char gb[16];
            uint32_t gu;
            memcpy(&gu, &g, 4);
            snprintf(gb, sizeof gb, "0x%08x", gu);
            assert_string_equal(gb, cJSON_GetObjectItem(e, "global_bits")->valuestring);
            free(dq);
            free(le);
        }
        td_st_set_close(s);
        cJSON_Delete(j);
    }
}

static int run(const char *args, char **out, char **errs)
{
    const char *o = td_test_path("cli.out"), *e = td_test_path("cli.err");
    int rc = td_test_sh("%s quantize %s >'%s' 2>'%s'", tandem_bin(), args, o, e);
    *out = td_test_slurp(o, NULL);
    *errs = td_test_slurp(e, NULL);
    assert_non_null(*out);
    assert_non_null(*errs);
    return rc;
}

static void cli_quantize_end_to_end(void **state)
{
    (void)state;
    char in[800], out[800], args[2000], *o, *e;
    snprintf(in, sizeof in, "%s", td_test_path("cli_in"));
    snprintf(out, sizeof out, "%s", td_test_path("cli_q"));
    td_test_sh("rm -rf '%s'", out);
    gen_ok("edge", in, 1, true, false, 0);
    assert_int_equal(run("--help", &o, &e), 0);
    assert_non_null(strstr(o, "*.mlp.shared_expert.*"));
    assert_non_null(strstr(o, "--format modelopt|ct"));
    free(o);
    free(e);
    assert_int_equal(run("--in x", &o, &e), 2);
    assert_non_null(strstr(e, "tandem quantize: --in DIR and --out DIR are required"));
    free(o);
    free(e);
    snprintf(args, sizeof args, "--in '%s' --out '%s' --format fp4", in, out);
    assert_int_equal(run(args, &o, &e), 2);
    assert_non_null(strstr(e, "'fp4'"));
    free(o);
    free(e);
    snprintf(args, sizeof args, "--in '%s/nowhere' --out '%s'", in, out);
    assert_int_equal(run(args, &o, &e), 2);
    assert_non_null(strstr(e, "config.json"));
    free(o);
    free(e);
    snprintf(args, sizeof args, "--in '%s' --out '%s' --format ct --only '*.mlp.experts.*' --json --no-progress", in, out);
    assert_int_equal(run(args, &o, &e), 0);
    cJSON *j = cJSON_Parse(o);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "format")->valuestring, "compressed-tensors");
    assert_int_equal((int)cJSON_GetObjectItem(j, "modules_quantized")->valuedouble, 4 * 8 * 3);
    cJSON_Delete(j);
    free(o);
    free(e);
    assert_int_equal(run(args, &o, &e), 2);
    assert_non_null(strstr(e, "--force"));
    free(o);
    free(e);
    snprintf(args, sizeof args, "--in '%s' --out '%s' --force", in, out);
    assert_int_equal(run(args, &o, &e), 0);
    assert_non_null(strstr(o, "wrote"));
    free(o);
    free(e);
    assert_int_equal(td_test_sh("%s inspect --model '%s' >/dev/null 2>&1", tandem_bin(), out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(quantize_reproduces_the_generated_nvfp4_bytes),
        cmocka_unit_test(quantize_splits_fused_experts),
        cmocka_unit_test(quantize_error_is_within_the_e2m1_bound),
        cmocka_unit_test(ct_and_modelopt_dequantize_to_the_same_values),
        cmocka_unit_test(quantize_refuses_bad_requests_cleanly),
        cmocka_unit_test(quantize_selection_and_gate_up_siblings),
        cmocka_unit_test(quantize_copies_files_and_shards),
        cmocka_unit_test(quantize_accepts_public_implementation_inventories),
        cmocka_unit_test(dequant_manifest_matches_the_files),
        cmocka_unit_test(cli_quantize_end_to_end),
    };
    return cmocka_run_group_tests_name("quantize", tests, NULL, NULL);
}
