/* test_gen.c — synthetic checkpoints (core/gen) and `tandem gen` end to end.
 *
 * Every preset is generated (flash-next-moe-layer as a 4-expert variant at production hidden
 * size; its full-size inventory is checked from the plan without writing 1.5 GB), read back
 * through the core reader and checked by `inspect`; determinism is asserted on the SHA-256
 * of every file across runs with different thread counts. */
#include "test_common.h"
#include "config.h"
#include "formats.h"
#include "gen.h"
#include "inspect.h"
#include "nvfp4.h"
#include "safetensors.h"
#include "sha256.h"

#include <dirent.h>
#include <math.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *tandem_bin(void)
{
    const char *b = getenv("TD_TANDEM");
    return b && *b ? b : "build/release/tandem";
}

static void gen_ok(const char *preset, const char *dir, uint64_t seed, int threads, bool unquantized,
                   bool fused, int64_t experts)
{
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = preset;
    o.seed = seed;
    o.threads = threads;
    o.unquantized = unquantized;
    o.fused_experts = fused;
    o.num_experts = experts;
    o.force = true;
    td_err err;
    td_err_clear(&err);
    td_gen_result r;
    if (td_gen(&o, dir, &r, &err)) fail_msg("gen %s: %s", preset, err.msg);
    assert_true(r.tensors > 0);
}

/* Inspect must find nothing at all: no error, no warning, no note. */
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

typedef struct file_sha {
    char name[256];
    char hex[TD_SHA256_HEX_LEN];
} file_sha;

static int cmp_fs(const void *a, const void *b)
{
    return strcmp(((const file_sha *)a)->name, ((const file_sha *)b)->name);
}

/* Regular file names of dir (sorted); with hash, also each file's SHA-256. */
static size_t dir_list(const char *dir, file_sha *out, size_t cap, bool hash);

static size_t dir_shas(const char *dir, file_sha *out, size_t cap)
{
    return dir_list(dir, out, cap, true);
}

static size_t dir_names(const char *dir, file_sha *out, size_t cap)
{
    return dir_list(dir, out, cap, false);
}

static size_t dir_list(const char *dir, file_sha *out, size_t cap, bool hash)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        assert_true(n < cap);
        snprintf(out[n].name, sizeof out[n].name, "%s", e->d_name);
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        td_err err;
        out[n].hex[0] = '\0';
        if (hash && td_sha256_file(p, out[n].hex, &err)) fail_msg("%s", err.msg);
        n++;
    }
    closedir(d);
    qsort(out, n, sizeof *out, cmp_fs);
    return n;
}

static void assert_same_files(const char *a, const char *b)
{
    static file_sha fa[64], fb[64];
    size_t na = dir_shas(a, fa, 64), nb = dir_shas(b, fb, 64);
    assert_int_equal(na, nb);
    assert_true(na >= 4);
    for (size_t i = 0; i < na; i++) {
        assert_string_equal(fa[i].name, fb[i].name);
        if (strcmp(fa[i].hex, fb[i].hex)) fail_msg("%s differs between %s and %s", fa[i].name, a, b);
    }
}

static float read_f32(td_st_set *s, const char *name)
{
    td_tensor t;
    td_err err;
    if (td_st_set_tensor(s, name, &t, &err)) fail_msg("%s", err.msg);
    assert_int_equal(t.dtype, TD_F32);
    float v;
    memcpy(&v, t.data, 4);
    return v;
}

static const uint8_t *read_u8(td_st_set *s, const char *name, int64_t *n)
{
    td_tensor t;
    td_err err;
    if (td_st_set_tensor(s, name, &t, &err)) fail_msg("%s", err.msg);
    *n = td_tensor_numel(&t);
    return t.data;
}

static td_st_set *open_set(const char *dir)
{
    td_st_set *s;
    td_err err;
    if (td_st_set_open(dir, &s, &err)) fail_msg("%s", err.msg);
    if (td_st_set_validate(s, &err)) fail_msg("%s", err.msg);
    return s;
}

static cJSON *read_json(const char *dir, const char *file)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    cJSON *j;
    td_err err;
    if (td_json_read_file(p, 1u << 24, &j, &err)) fail_msg("%s", err.msg);
    return j;
}

/* ---- plans ---------------------------------------------------------------------------------- */

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void gen_every_preset_plans_a_consistent_inventory(void **state)
{
    (void)state;
    assert_int_equal(td_gen_preset_count(), 4);
    for (size_t i = 0; i < td_gen_preset_count(); i++) {
        const td_gen_preset_info *info = td_gen_preset_at(i);
        assert_non_null(info->summary);
        td_gen_opts o;
        td_gen_opts_init(&o);
        o.preset = info->name;
        td_gen_plan p;
        td_err err;
        if (td_gen_plan_build(&o, &p, &err)) fail_msg("%s: %s", info->name, err.msg);
        assert_true(p.n_tensors > 100);
        assert_true(p.nvfp4_modules > 0);
        /* names unique, shards valid, bytes add up */
        const char **names = malloc(p.n_tensors * sizeof *names);
        assert_non_null(names);
        int64_t bytes = 0;
        for (size_t t = 0; t < p.n_tensors; t++) {
            names[t] = p.tensors[t].name;
            assert_true(p.tensors[t].shard >= 0 && (size_t)p.tensors[t].shard < p.n_shards);
            bytes += p.tensors[t].nbytes;
        }
        assert_int_equal(bytes, p.total_bytes);
        qsort(names, p.n_tensors, sizeof *names, cmp_name);
        for (size_t t = 1; t < p.n_tensors; t++)
            if (!strcmp(names[t - 1], names[t])) fail_msg("%s: duplicate tensor %s", info->name, names[t]);
        free(names);
        td_gen_plan_free(&p);
        td_gen_plan_free(&p); /* idempotent */
    }
    /* unknown preset and bad option combinations are clear errors */
    td_gen_opts o;
    td_gen_opts_init(&o);
    td_gen_plan p;
    td_err err;
    o.preset = "qwen5-giant";
    assert_int_equal(td_gen_plan_build(&o, &p, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "flash-next-tiny"));
    o.preset = "flash-next-tiny";
    o.fused_experts = true;
    assert_int_equal(td_gen_plan_build(&o, &p, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--unquantized"));
    o.fused_experts = false;
    o.preset = "edge";
    o.num_experts = 4;
    assert_int_equal(td_gen_plan_build(&o, &p, &err), TD_ERR_ARG);
}

/* The production-size layer: inventory, names, dtypes and byte counts from the plan. */
static void gen_moe_layer_plan_has_the_real_per_expert_tensors(void **state)
{
    (void)state;
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = "flash-next-moe-layer";
    td_gen_plan p;
    td_err err;
    if (td_gen_plan_build(&o, &p, &err)) fail_msg("%s", err.msg);
    assert_int_equal(p.cfg.family, TD_FAMILY_QWEN4_EXP);
    assert_int_equal(p.cfg.hidden_size, 2560);
    assert_int_equal(p.cfg.num_experts, 512);
    assert_int_equal(p.cfg.moe_intermediate_size, 640);
    assert_int_equal(p.cfg.num_experts_per_tok, 10);
    assert_int_equal(p.cfg.shared_expert_intermediate_size, 640);
    assert_int_equal(p.cfg.num_hidden_layers, 1);
    assert_int_equal(p.nvfp4_modules, 512 * 3);
    assert_true(p.quant.mixed);
    int64_t packed = 0, scales = 0, expert_tensors = 0;
    for (size_t t = 0; t < p.n_tensors; t++) {
        const td_gen_tensor *g = &p.tensors[t];
        if (!strstr(g->name, ".mlp.experts.")) continue;
        expert_tensors++;
        if (g->dtype == TD_U8) packed += g->nbytes;
        if (g->dtype == TD_F8_E4M3) scales += g->nbytes;
    }
    /* 512 experts x (gate, up, down) x (weight, weight_scale, weight_scale_2, input_scale);
     * per-layer byte counts as in the released checkpoint (SEED_AUDITS.md §8.4) */
    assert_int_equal(expert_tensors, 512 * 3 * 4);
    assert_int_equal(packed, 1258291200);
    assert_int_equal(scales, 157286400);
    static const struct { const char *name; td_dtype dt; int nd; int64_t d0, d1; } want[] = {
        {"model.language_model.layers.0.mlp.experts.511.down_proj.weight", TD_U8, 2, 2560, 320},
        {"model.language_model.layers.0.mlp.experts.511.down_proj.weight_scale", TD_F8_E4M3, 2, 2560, 40},
        {"model.language_model.layers.0.mlp.experts.0.gate_proj.weight", TD_U8, 2, 640, 1280},
        {"model.language_model.layers.0.mlp.experts.0.up_proj.weight_scale", TD_F8_E4M3, 2, 640, 160},
        {"model.language_model.layers.0.mlp.experts.7.up_proj.weight_scale_2", TD_F32, 0, 0, 0},
        {"model.language_model.layers.0.mlp.experts.7.up_proj.input_scale", TD_F32, 0, 0, 0},
        {"model.language_model.layers.0.mlp.shared_expert.down_proj.weight", TD_BF16, 2, 2560, 640},
        {"model.language_model.layers.0.linear_attn.in_proj_qkv.weight", TD_BF16, 2, 10240, 2560},
        {"model.language_model.layers.0.attn_hyper_connection.input_mix_weight_down.weight", TD_BF16, 2, 320, 10240},
        {"model.language_model.layers.0.mlp.gate.weight", TD_BF16, 2, 512, 2560},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(want); i++) {
        long k = td_gen_plan_find(&p, want[i].name);
        if (k < 0) fail_msg("missing %s", want[i].name);
        const td_gen_tensor *g = &p.tensors[k];
        assert_int_equal(g->dtype, want[i].dt);
        assert_int_equal(g->ndim, want[i].nd);
        if (want[i].nd == 2) {
            assert_int_equal(g->shape[0], want[i].d0);
            assert_int_equal(g->shape[1], want[i].d1);
        }
    }
    assert_true(p.total_bytes > (int64_t)1400000000 && p.total_bytes < (int64_t)1700000000);
    assert_true(p.n_shards >= 3); /* sharded with an index, as the released checkpoints are */
    td_gen_plan_free(&p);
}

/* ---- generated checkpoints -------------------------------------------------------------------- */

static void gen_qwen3_next_tiny_loads_back_and_inspects_clean(void **state)
{
    (void)state;
    const char *dir = td_test_path("q3");
    gen_ok("qwen3-next-tiny", dir, 1, 0, false, false, 0);
    td_inspect_report r;
    inspect_clean(dir, &r);
    assert_int_equal(r.cfg.family, TD_FAMILY_QWEN3_NEXT);
    assert_int_equal(r.cfg.hidden_size, 256);
    assert_int_equal(r.cfg.num_hidden_layers, 8);
    assert_int_equal(r.cfg.num_experts, 64);
    assert_int_equal(r.cfg.num_experts_per_tok, 4);
    assert_int_equal(td_config_count_layers(&r.cfg, TD_LAYER_ATTENTION), 2);
    assert_int_equal(r.quant.source, TD_QUANT_SRC_HF_QUANT_CONFIG);
    /* NVFP4: 8 layers x (64 experts x 3 + shared x 3) + 6 GDN out_proj + 2 o_proj */
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 8 * (64 * 3 + 3) + 6 + 2);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].tensors, r.schemes[TD_SCHEME_NVFP4].modules * 4);
    assert_int_equal(r.n_shards, 1);
    td_inspect_report_free(&r);

    /* gate/up share one global (and one input scale); down has its own */
    td_st_set *s = open_set(dir);
    float g = read_f32(s, "model.layers.5.mlp.experts.17.gate_proj.weight_scale_2");
    float u = read_f32(s, "model.layers.5.mlp.experts.17.up_proj.weight_scale_2");
    float d = read_f32(s, "model.layers.5.mlp.experts.17.down_proj.weight_scale_2");
    assert_true(g == u && g != d && g > 0.0f);
    assert_true(read_f32(s, "model.layers.5.mlp.experts.17.gate_proj.input_scale") ==
                read_f32(s, "model.layers.5.mlp.experts.17.up_proj.input_scale"));
    assert_true(read_f32(s, "model.layers.2.mlp.shared_expert.gate_proj.weight_scale_2") ==
                read_f32(s, "model.layers.2.mlp.shared_expert.up_proj.weight_scale_2"));
    /* BF16 elsewhere: a router weight is BF16 and finite */
    td_tensor t;
    td_err err;
    assert_int_equal(td_st_set_tensor(s, "model.layers.0.mlp.gate.weight", &t, &err), TD_OK);
    assert_int_equal(t.dtype, TD_BF16);
    td_st_set_close(s);
}

static void gen_flash_next_tiny_loads_back_and_inspects_clean(void **state)
{
    (void)state;
    const char *dir = td_test_path("fnt");
    gen_ok("flash-next-tiny", dir, 1, 0, false, false, 0);
    td_inspect_report r;
    inspect_clean(dir, &r);
    assert_int_equal(r.cfg.family, TD_FAMILY_QWEN4_EXP);
    assert_true(r.cfg.has_text_config);
    assert_string_equal(r.prefix, "model.language_model.");
    assert_int_equal(r.cfg.hc_count, 4);
    assert_int_equal(r.cfg.n_ple_layers, 1);
    assert_int_equal(r.cfg.ple_layer_ids[0], 2);
    assert_true(td_config_layer_has_ple(&r.cfg, 1));
    assert_string_equal(r.cfg.output_gate_type, "sigmoid");
    /* QSA selection starts once more than budget / 4 blocks exist: within ~130 tokens */
    assert_true(r.cfg.indexer_budget <= 256);
    assert_true(r.quant.mixed);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 8 * 64 * 3); /* routed experts only */
    assert_int_equal(r.schemes[TD_SCHEME_FP8].modules, 1);
    assert_int_equal(r.schemes[TD_SCHEME_FP8].tensors, 8 + 1); /* 8 FP8 shards + scale */
    assert_true(r.n_shards > 1);
    td_inspect_report_free(&r);

    /* the PLE buffers hold the exact hash constants (MODEL_SPEC.md B3.4) */
    td_st_set *s = open_set(dir);
    td_tensor t;
    td_err err;
    assert_int_equal(td_st_set_tensor(s, "model.language_model.layers.1.ple.ple_embedding.ngram_heads_vocab_sizes",
                                      &t, &err), TD_OK);
    assert_int_equal(t.dtype, TD_I64);
    int64_t v0, v15;
    memcpy(&v0, t.data, 8);
    memcpy(&v15, (const uint8_t *)t.data + 15 * 8, 8);
    assert_int_equal(v0, 1009);   /* first prime >= 1000 */
    assert_int_equal(v15, 1097);  /* 16th prime >= 1000 */
    assert_int_equal(td_st_set_tensor(s, "model.language_model.layers.1.ple.ple_embedding.ngram_embedding.shard_3.weight",
                                      &t, &err), TD_OK);
    assert_int_equal(t.dtype, TD_F8_E4M3);
    float ts = read_f32(s, "model.language_model.layers.1.ple.ple_embedding.ngram_embedding.weight_scale");
    assert_true(ts > 0.0f && isfinite(ts));
    /* the shared expert and attention stay BF16 (only routed experts are NVFP4) */
    assert_int_equal(td_st_set_tensor(s, "model.language_model.layers.3.self_attn.o_proj.weight", &t, &err), TD_OK);
    assert_int_equal(t.dtype, TD_BF16);
    td_st_set_close(s);

    cJSON *cfg = read_json(dir, "config.json");
    const cJSON *qc = cJSON_GetObjectItem(cfg, "quantization_config");
    assert_string_equal(cJSON_GetObjectItem(qc, "quant_algo")->valuestring, "MIXED_PRECISION");
    assert_non_null(cJSON_GetObjectItem(cfg, "text_config"));
    cJSON_Delete(cfg);
}

/* The same seed gives the same bytes in every file, whatever the thread count; another seed
 * gives other weights. */
static void gen_same_seed_gives_identical_files(void **state)
{
    (void)state;
    const char *a = td_test_path("det_a"), *b = td_test_path("det_b"), *c = td_test_path("det_c");
    gen_ok("flash-next-tiny", a, 42, 1, false, false, 0);
    gen_ok("flash-next-tiny", b, 42, 3, false, false, 0);
    assert_same_files(a, b);
    gen_ok("flash-next-tiny", c, 43, 2, false, false, 0);
    static file_sha fa[64], fc[64];
    size_t na = dir_shas(a, fa, 64), nc = dir_shas(c, fc, 64);
    assert_int_equal(na, nc);
    for (size_t i = 0; i < na; i++)
        if (strstr(fa[i].name, ".safetensors") && strcmp(fa[i].name, "model.safetensors.index.json"))
            assert_string_not_equal(fa[i].hex, fc[i].hex);
    gen_ok("edge", a, 5, 2, false, false, 0);
    gen_ok("edge", b, 5, 1, false, false, 0);
    assert_same_files(a, b);
}

/* The production-shape layer at 4 experts: real hidden size, real GDN and HC shapes. */
static void gen_moe_layer_variant_inspects_clean_and_is_deterministic(void **state)
{
    (void)state;
    const char *a = td_test_path("moe_a"), *b = td_test_path("moe_b");
    gen_ok("flash-next-moe-layer", a, 9, 2, false, false, 4);
    td_inspect_report r;
    inspect_clean(a, &r);
    assert_int_equal(r.cfg.hidden_size, 2560);
    assert_int_equal(r.cfg.num_experts, 4);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 4 * 3);
    td_inspect_report_free(&r);
    gen_ok("flash-next-moe-layer", b, 9, 1, false, false, 4);
    /* byte-identical (cmp rather than SHA-256 here: 180 MB per run is slow to hash under
     * the sanitizers; the smaller presets are compared by SHA-256 above) */
    static file_sha fa[64];
    size_t n = dir_names(a, fa, 64);
    assert_true(n >= 4);
    for (size_t i = 0; i < n; i++)
        if (td_test_sh("cmp -s '%s/%s' '%s/%s'", a, fa[i].name, b, fa[i].name) != 0)
            fail_msg("%s differs between runs", fa[i].name);
}

/* Block-scale codes span the range real checkpoints show (SEED_AUDITS.md §2.7: codes 73..126
 * over 3M blocks, hundreds of distinct globals), with no zero, negative, subnormal or NaN
 * code; every tensor's largest block has scale 448 (code 0x7E). */
static void gen_block_scales_look_like_a_real_checkpoint(void **state)
{
    (void)state;
    const char *dir = td_test_path("census");
    gen_ok("flash-next-tiny", dir, 3, 0, false, false, 0);
    td_st_set *s = open_set(dir);
    int64_t hist[256] = {0}, blocks = 0;
    float globals[8][256];
    int n_glob[8] = {0};
    for (size_t i = 0; i < td_st_set_count(s); i++) {
        const char *name = td_st_set_name(s, i);
        if (!strstr(name, ".mlp.experts.")) continue;
        int layer = atoi(strstr(name, "layers.") + 7);
        assert_true(layer >= 0 && layer < 8);
        size_t n = strlen(name);
        if (n > 13 && !strcmp(name + n - 13, ".weight_scale")) {
            int64_t k;
            const uint8_t *p = read_u8(s, name, &k);
            uint8_t mx = 0;
            for (int64_t j = 0; j < k; j++) {
                hist[p[j]]++;
                if (p[j] > mx) mx = p[j];
            }
            /* down_proj owns its amax: its largest block scale is 448; gate/up share the
             * larger of the two amaxes, so the pair's other half may stay below */
            if (strstr(name, "down_proj")) assert_int_equal(mx, 0x7E);
            else assert_true(mx >= 0x60);
            blocks += k;
        } else if (n > 15 && !strcmp(name + n - 15, ".weight_scale_2")) {
            assert_true(n_glob[layer] < 256);
            globals[layer][n_glob[layer]++] = read_f32(s, name);
        }
    }
    td_st_set_close(s);
    int64_t in_range = 0;
    for (int c = 73; c <= 126; c++) in_range += hist[c];
    for (int c = 0; c < 0x40; c++) assert_int_equal(hist[c], 0);     /* none below 2^-1 */
    for (int c = 0x7F; c < 256; c++) assert_int_equal(hist[c], 0);   /* no NaN, no sign bit */
    assert_true((double)in_range >= 0.999 * (double)blocks);
    /* the bulk spreads over the range rather than piling up at one end */
    int64_t low = 0;
    for (int c = 73; c < 96; c++) low += hist[c];
    assert_true(low > blocks / 50 && low < blocks / 2);
    for (int l = 0; l < 8; l++) {
        assert_int_equal(n_glob[l], 64 * 3);
        int distinct = 0;
        for (int i = 0; i < n_glob[l]; i++) {
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = globals[l][j] == globals[l][i];
            distinct += !seen;
        }
        /* 128 independent amaxes per layer (gate/up pairs share one) */
        assert_true(distinct >= 60);
    }
}

/* `edge` carries each hard case where tandem_gen.json says; inspect reports exactly the NaN
 * code (error) and the negative codes (warning) and nothing structural. */
static void gen_edge_contains_each_hard_case(void **state)
{
    (void)state;
    const char *dir = td_test_path("edge");
    gen_ok("edge", dir, 1, 0, false, false, 0);
    td_inspect_report r;
    td_err err;
    if (td_inspect(dir, false, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.counts[TD_FIND_NAN_SCALE], 1);
    assert_int_equal(r.counts[TD_FIND_NEG_SCALE], 1);
    assert_int_equal(r.counts[TD_FIND_MISSING], 0);
    assert_int_equal(r.counts[TD_FIND_SHAPE], 0);
    assert_int_equal(r.counts[TD_FIND_DTYPE], 0);
    assert_int_equal(r.counts[TD_FIND_UNEXPECTED], 0);
    assert_int_equal(r.counts[TD_FIND_BAD_GLOBAL], 0);
    assert_int_equal(r.counts[TD_FIND_NOTE], 0);
    assert_int_equal(r.n_errors, 1);
    assert_int_equal(r.n_warnings, 1);
    bool nan_at = false, neg_at = false;
    for (size_t i = 0; i < r.n_findings; i++) {
        nan_at |= r.findings[i].kind == TD_FIND_NAN_SCALE &&
                  !strcmp(r.findings[i].tensor, "model.layers.2.mlp.experts.3.up_proj.weight_scale");
        neg_at |= r.findings[i].kind == TD_FIND_NEG_SCALE &&
                  !strcmp(r.findings[i].tensor, "model.layers.1.mlp.experts.2.down_proj.weight_scale") &&
                  strstr(r.findings[i].msg, "5 block-scale") != NULL;
    }
    assert_true(nan_at && neg_at);
    td_inspect_report_free(&r);

    td_st_set *s = open_set(dir);
    int64_t n;
    /* zero blocks (scale 1.0) and one zero scale code written by an old exporter */
    const uint8_t *z = read_u8(s, "model.layers.0.mlp.experts.0.gate_proj.weight_scale", &n);
    assert_int_equal(z[0], 0x00);
    for (int b = 1; b < 8; b++) assert_int_equal(z[b], 0x38);
    const uint8_t *zp = read_u8(s, "model.layers.0.mlp.experts.0.gate_proj.weight", &n);
    for (int i = 0; i < 2 * 64; i++) assert_int_equal(zp[i] & 0x77, 0);
    /* subnormal codes 0x01..0x07 in the ladder rows */
    const uint8_t *sub = read_u8(s, "model.layers.0.mlp.experts.1.gate_proj.weight_scale", &n);
    int subn = 0;
    for (int64_t i = 0; i < n; i++) subn += sub[i] >= 0x01 && sub[i] <= 0x07;
    assert_true(subn >= 8);
    /* NaN code at block (0, 1) */
    const uint8_t *nanp = read_u8(s, "model.layers.2.mlp.experts.3.up_proj.weight_scale", &n);
    assert_int_equal(nanp[1], 0x7F);
    /* negative codes: sign bit on the scale, nibble signs flipped; values are unchanged */
    const uint8_t *neg = read_u8(s, "model.layers.1.mlp.experts.2.down_proj.weight_scale", &n);
    const uint8_t *negp = read_u8(s, "model.layers.1.mlp.experts.2.down_proj.weight", &n);
    float g = read_f32(s, "model.layers.1.mlp.experts.2.down_proj.weight_scale_2");
    for (int row = 8; row < 13; row++) {
        const int nb = 64 / 16;
        assert_true(neg[row * nb] & 0x80);
        uint8_t fixed_s = (uint8_t)(neg[row * nb] & 0x7F), fixed_p[8];
        for (int i = 0; i < 8; i++) fixed_p[i] = negp[row * 32 + i] ^ 0x88;
        float a[16], b2[16];
        assert_int_equal(td_nvfp4_dequantize(negp + row * 32, neg + row * nb, g, TD_NVFP4_MODELOPT, 1, 16, a, &err), TD_OK);
        assert_int_equal(td_nvfp4_dequantize(fixed_p, &fixed_s, g, TD_NVFP4_MODELOPT, 1, 16, b2, &err), TD_OK);
        for (int i = 0; i < 16; i++) assert_true(a[i] == b2[i]);
    }
    /* globals: tiny, large (FP16 SM70 decode limit exceeded), huge; unsynced gate/up; all-zero */
    float tiny = read_f32(s, "model.layers.1.mlp.experts.4.gate_proj.weight_scale_2");
    assert_true(tiny > 0.0f && tiny < 1e-30f && tiny == read_f32(s, "model.layers.1.mlp.experts.4.up_proj.weight_scale_2"));
    assert_true(read_f32(s, "model.layers.2.mlp.experts.5.down_proj.weight_scale_2") * 448.0f * 16384.0f > 65504.0f);
    assert_true(read_f32(s, "model.layers.2.mlp.experts.6.down_proj.weight_scale_2") > 1e20f);
    float gg = read_f32(s, "model.layers.3.mlp.experts.6.gate_proj.weight_scale_2");
    float gu = read_f32(s, "model.layers.3.mlp.experts.6.up_proj.weight_scale_2");
    assert_true(gu >= 4.0f * gg * 0.9999f && gu < 8.0f * gg * 1.0001f);
    assert_true(read_f32(s, "model.layers.3.mlp.experts.7.down_proj.weight_scale_2") == 1.0f);
    const uint8_t *az = read_u8(s, "model.layers.3.mlp.experts.7.down_proj.weight_scale", &n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(az[i], 0x38);
    /* every other expert pair is synced */
    assert_true(read_f32(s, "model.layers.3.mlp.experts.5.gate_proj.weight_scale_2") ==
                read_f32(s, "model.layers.3.mlp.experts.5.up_proj.weight_scale_2"));
    td_st_set_close(s);

    /* the provenance lists every case with its tensor */
    cJSON *pj = read_json(dir, "tandem_gen.json");
    const cJSON *cases = cJSON_GetObjectItem(pj, "edge_cases");
    assert_true(cJSON_GetArraySize(cases) >= 10);
    static const char *const kinds[] = {"zero_blocks", "zero_scale_code", "subnormal_codes",
                                        "negative_codes", "nan_code", "tiny_global", "large_global",
                                        "huge_global", "unsynced_gate_up", "all_zero_tensor"};
    for (size_t k = 0; k < TD_ARRAY_LEN(kinds); k++) {
        bool found = false;
        const cJSON *c;
        cJSON_ArrayForEach(c, cases) found |= !strcmp(cJSON_GetObjectItem(c, "case")->valuestring, kinds[k]);
        if (!found) fail_msg("edge case %s not recorded", kinds[k]);
    }
    cJSON_Delete(pj);
}

/* Seeds and presets are recorded in every safetensors file and in tandem_gen.json. */
static void gen_records_its_provenance(void **state)
{
    (void)state;
    const char *dir = td_test_path("prov");
    gen_ok("edge", dir, 18446744073709551615ull, 0, false, false, 0);
    cJSON *pj = read_json(dir, "tandem_gen.json");
    assert_string_equal(cJSON_GetObjectItem(pj, "preset")->valuestring, "edge");
    assert_string_equal(cJSON_GetObjectItem(pj, "seed")->valuestring, "18446744073709551615");
    assert_int_equal((int)cJSON_GetObjectItem(pj, "format")->valuedouble, TD_GEN_FORMAT);
    assert_non_null(cJSON_GetObjectItem(pj, "distributions"));
    cJSON_Delete(pj);
    char p[1024];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    td_st_file *f;
    td_err err;
    assert_int_equal(td_st_file_open(p, &f, &err), TD_OK);
    const td_st_header *h = td_st_file_header(f);
    assert_string_equal(td_st_header_meta(h, "format"), "pt");
    assert_string_equal(td_st_header_meta(h, "tandem_gen_preset"), "edge");
    assert_string_equal(td_st_header_meta(h, "tandem_gen_seed"), "18446744073709551615");
    td_st_file_close(f);
    cJSON *gc = read_json(dir, "generation_config.json");
    assert_int_equal((int)cJSON_GetObjectItem(gc, "eos_token_id")->valuedouble, 2);
    cJSON_Delete(gc);
}

/* The unquantized variants (the quantizer's input), per-expert and fused. */
static void gen_unquantized_variants_inspect_clean(void **state)
{
    (void)state;
    const char *dir = td_test_path("fused");
    gen_ok("flash-next-tiny", dir, 1, 0, true, true, 16);
    td_inspect_report r;
    inspect_clean(dir, &r);
    assert_true(r.fused_experts);
    assert_int_equal(r.quant.source, TD_QUANT_SRC_NONE);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 0);
    td_inspect_report_free(&r);
    const char *d2 = td_test_path("unq");
    gen_ok("qwen3-next-tiny", d2, 1, 0, true, false, 16);
    inspect_clean(d2, &r);
    assert_false(r.fused_experts);
    td_inspect_report_free(&r);
    char p[1024];
    snprintf(p, sizeof p, "%s/hf_quant_config.json", d2);
    assert_int_not_equal(access(p, F_OK), 0);
}

/* --layers: only the listed layers are written, the config records them, and the subset is a
 * consistent checkpoint (inspect clean); the layers kept are byte-identical to the same
 * layers of a full-depth generation with the same seed (a layer depends on its name only). */
static void gen_layer_subset_inspects_clean_and_matches_full_model(void **state)
{
    (void)state;
    static const int64_t ids[] = {0, 3, 9};
    td_gen_opts o;
    td_gen_opts_init(&o);
    o.preset = "flash-next-tiny";
    o.seed = 5;
    o.num_experts = 8;
    o.force = true;
    o.shard_bytes = 0;
    o.layer_ids = ids;
    o.n_layer_ids = 3;
    td_err err;
    td_gen_result res;
    const char *dir = td_test_path("subset");
    if (td_gen(&o, dir, &res, &err)) fail_msg("%s", err.msg);
    td_inspect_report r;
    inspect_clean(dir, &r);
    assert_int_equal(r.cfg.num_hidden_layers, 10);
    assert_int_equal(r.cfg.n_layers_present, 3);
    assert_int_equal(r.cfg.layers_present[2], 9);
    td_inspect_report_free(&r);
    td_st_set *set;
    assert_int_equal(td_st_set_open(dir, &set, &err), TD_OK);
    size_t per_layer[10] = {0};
    for (size_t i = 0; i < td_st_set_count(set); i++) {
        int l;
        if (sscanf(td_st_set_name(set, i), "model.language_model.layers.%d.", &l) == 1) {
            assert_true(l >= 0 && l < 10);
            per_layer[l]++;
        }
    }
    for (int l = 0; l < 10; l++) assert_true((per_layer[l] > 0) == (l == 0 || l == 3 || l == 9));
    /* same tensors, same bytes as a 10-layer model without the subset */
    td_gen_opts full = o;
    full.n_layer_ids = 0;
    full.layer_ids = NULL;
    const char *dfull = td_test_path("subset_full");
    /* the full model must have the same depth: give it layers 0..9 explicitly */
    static const int64_t all[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    full.layer_ids = all;
    full.n_layer_ids = 10;
    if (td_gen(&full, dfull, &res, &err)) fail_msg("%s", err.msg);
    td_st_set *fset;
    assert_int_equal(td_st_set_open(dfull, &fset, &err), TD_OK);
    const char *probe[] = {"model.language_model.layers.9.mlp.experts.7.down_proj.weight",
                           "model.language_model.layers.3.self_attn.q_proj.weight",
                           "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"};
    for (size_t k = 0; k < 3; k++) {
        td_tensor a, b;
        assert_int_equal(td_st_set_tensor(set, probe[k], &a, &err), TD_OK);
        assert_int_equal(td_st_set_tensor(fset, probe[k], &b, &err), TD_OK);
        int64_t n = td_tensor_numel(&a), nb;
        assert_int_equal(td_dtype_nbytes(a.dtype, n, &nb, &err), TD_OK);
        assert_memory_equal(a.data, b.data, (size_t)nb);
    }
    td_st_set_close(set);
    td_st_set_close(fset);
    /* bad lists are refused */
    static const int64_t bad[] = {3, 1};
    o.layer_ids = bad;
    o.n_layer_ids = 2;
    assert_int_equal(td_gen(&o, td_test_path("subset_bad"), &res, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "--layers"));
}

/* ---- the CLI ---------------------------------------------------------------------------------- */

static int run(const char *args, char **out, char **errs)
{
    const char *o = td_test_path("cli.out"), *e = td_test_path("cli.err");
    int rc = td_test_sh("%s gen %s >'%s' 2>'%s'", tandem_bin(), args, o, e);
    *out = td_test_slurp(o, NULL);
    *errs = td_test_slurp(e, NULL);
    assert_non_null(*out);
    assert_non_null(*errs);
    return rc;
}

static void cli_gen_end_to_end(void **state)
{
    (void)state;
    char *out, *errs, args[1200], dir[800];
    snprintf(dir, sizeof dir, "%s", td_test_path("cli_edge"));
    td_test_sh("rm -rf '%s'", dir);
    assert_int_equal(run("--help", &out, &errs), 0);
    assert_non_null(strstr(out, "flash-next-moe-layer"));
    assert_non_null(strstr(out, "--seed"));
    free(out);
    free(errs);
    assert_int_equal(run("--list", &out, &errs), 0);
    assert_non_null(strstr(out, "qwen3-next-tiny"));
    free(out);
    free(errs);
    assert_int_equal(run("--out x", &out, &errs), 2);
    assert_non_null(strstr(errs, "tandem gen: --preset"));
    free(out);
    free(errs);
    assert_int_equal(run("--preset nope --out x", &out, &errs), 2);
    assert_non_null(strstr(errs, "tandem gen: unknown preset 'nope'")); /* the module prefix once */
    assert_null(strstr(errs, "gen: gen:"));
    free(out);
    free(errs);
    assert_int_equal(run("--preset edge --out x --seed -3", &out, &errs), 2);
    free(out);
    free(errs);
    assert_int_equal(run("--preset edge --out x --bogus", &out, &errs), 2);
    free(out);
    free(errs);
    snprintf(args, sizeof args, "--preset edge --out '%s' --seed 4 --json --no-progress", dir);
    assert_int_equal(run(args, &out, &errs), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "preset")->valuestring, "edge");
    assert_string_equal(cJSON_GetObjectItem(j, "seed")->valuestring, "4");
    assert_true(cJSON_GetObjectItem(j, "tensors")->valuedouble > 100);
    cJSON_Delete(j);
    free(out);
    free(errs);
    /* an existing directory is refused without --force and left alone */
    char marker[1100];
    snprintf(marker, sizeof marker, "%s/keep.txt", dir);
    td_test_write_str(marker, "x");
    assert_int_equal(run(args, &out, &errs), 2);
    assert_non_null(strstr(errs, "already exists"));
    assert_int_equal(access(marker, F_OK), 0);
    free(out);
    free(errs);
    snprintf(args, sizeof args, "--preset edge --out '%s' --seed 4 --force", dir);
    assert_int_equal(run(args, &out, &errs), 0);
    assert_non_null(strstr(out, "wrote"));
    assert_int_not_equal(access(marker, F_OK), 0); /* replaced */
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    assert_int_not_equal(access(tmp, F_OK), 0);    /* no staging left behind */
    free(out);
    free(errs);
    /* and what it wrote is what `tandem inspect` accepts */
    assert_int_equal(td_test_sh("%s inspect --model '%s' >/dev/null 2>&1", tandem_bin(), dir), 1); /* the NaN code */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gen_every_preset_plans_a_consistent_inventory),
        cmocka_unit_test(gen_moe_layer_plan_has_the_real_per_expert_tensors),
        cmocka_unit_test(gen_qwen3_next_tiny_loads_back_and_inspects_clean),
        cmocka_unit_test(gen_flash_next_tiny_loads_back_and_inspects_clean),
        cmocka_unit_test(gen_same_seed_gives_identical_files),
        cmocka_unit_test(gen_moe_layer_variant_inspects_clean_and_is_deterministic),
        cmocka_unit_test(gen_block_scales_look_like_a_real_checkpoint),
        cmocka_unit_test(gen_edge_contains_each_hard_case),
        cmocka_unit_test(gen_records_its_provenance),
        cmocka_unit_test(gen_unquantized_variants_inspect_clean),
        cmocka_unit_test(gen_layer_subset_inspects_clean_and_matches_full_model),
        cmocka_unit_test(cli_gen_end_to_end),
    };
    return cmocka_run_group_tests_name("gen", tests, NULL, NULL);
}
