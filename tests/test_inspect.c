/* test_inspect.c — checkpoint inspection (core/inspect) and `tandem inspect` end to end,
 * including a corpus of malformed checkpoints that must each fail cleanly. */
#include "test_common.h"
#include "fixture_ckpt.h"
#include "inspect.h"

static fx_ckpt g_fx; /* large; one instance reused by the tests */

static const char *dirpath(const char *name)
{
    return td_test_path(name);
}

static void write_qwen3(const char *dir, int shards)
{
    fx_write_meta(dir, FX_QWEN3_CONFIG, FX_QWEN3_QUANT);
    fx_inventory(dir, &g_fx);
    fx_write_tensors(dir, &g_fx, shards);
}

static void inspect_ok(const char *dir, td_inspect_report *r)
{
    td_err err;
    td_err_clear(&err);
    if (td_inspect(dir, false, r, &err)) fail_msg("inspect %s: %s", dir, err.msg);
}

static bool has_finding(const td_inspect_report *r, td_finding_kind k, const char *tensor_part,
                        const char *msg_part)
{
    for (size_t i = 0; i < r->n_findings; i++) {
        const td_finding *f = &r->findings[i];
        if (f->kind == k && strstr(f->tensor, tensor_part) && strstr(f->msg, msg_part)) return true;
    }
    return false;
}

static void inspect_qwen3_next_fixture_is_consistent(void **state)
{
    (void)state;
    const char *dir = dirpath("q3");
    write_qwen3(dir, 1);
    td_inspect_report r;
    inspect_ok(dir, &r);
    if (r.n_errors || r.n_warnings) {
        td_inspect_print(&r, stderr);
        fail_msg("fixture not clean");
    }
    assert_int_equal(r.cfg.family, TD_FAMILY_QWEN3_NEXT);
    assert_string_equal(r.prefix, "model.");
    assert_int_equal(r.n_shards, 1);
    assert_int_equal(r.n_tensors, (int64_t)g_fx.n);
    /* NVFP4 modules: 4 layers x (4 experts x 3 + 3 shared) + 3 GDN out_proj + 1 o_proj */
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 4 * 15 + 3 + 1);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].tensors, 64 * 4);
    /* every tensor is accounted for, and bytes add up */
    int64_t bytes = 0, tensors = 0;
    for (int s = 0; s < TD_SCHEME_COUNT; s++) {
        bytes += r.schemes[s].bytes;
        tensors += r.schemes[s].tensors;
    }
    assert_int_equal(tensors, r.n_tensors);
    assert_int_equal(bytes, r.total_bytes);
    /* block scales: every NVFP4 module scanned: experts 32x2 / 16x2, etc. */
    assert_true(r.nvfp4_scale_bytes_scanned > 0);
    td_inspect_report_free(&r);
    td_inspect_report_free(&r);
}

static void inspect_flash_next_sharded_fixture_is_consistent(void **state)
{
    (void)state;
    const char *dir = dirpath("fx");
    fx_write_meta(dir, FX_FLASH_CONFIG, NULL);
    fx_inventory(dir, &g_fx);
    fx_write_tensors(dir, &g_fx, 3);
    td_inspect_report r;
    inspect_ok(dir, &r);
    if (r.n_errors || r.n_warnings) {
        td_inspect_print(&r, stderr);
        fail_msg("fixture not clean");
    }
    assert_int_equal(r.cfg.family, TD_FAMILY_QWEN4_EXP);
    assert_string_equal(r.prefix, "model.language_model.");
    assert_int_equal(r.n_shards, 3);
    assert_true(r.quant.mixed);
    assert_int_equal(r.schemes[TD_SCHEME_NVFP4].modules, 4 * 4 * 3);
    assert_int_equal(r.schemes[TD_SCHEME_FP8].modules, 1);
    assert_int_equal(r.schemes[TD_SCHEME_FP8].tensors, 3); /* 2 shards + scale */
    char *js = td_inspect_json(&r);
    assert_non_null(js);
    cJSON *j = cJSON_Parse(js);
    assert_non_null(j);
    cJSON *cons = cJSON_GetObjectItem(j, "consistency");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cons, "ok")));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "family")->valuestring, "qwen4_exp");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "shards")), 3);
    cJSON_Delete(j);
    free(js);
    td_inspect_report_free(&r);
}

static void inspect_fused_bf16_experts_are_accepted(void **state)
{
    (void)state;
    const char *dir = dirpath("fused");
    fx_write_meta(dir, FX_QWEN3_CONFIG, NULL); /* unquantized */
    fx_inventory(dir, &g_fx);
    /* replace per-expert tensors of every layer by the 3-D fused pair */
    for (size_t i = 0; i < g_fx.n;) {
        if (strstr(g_fx.t[i].name, ".mlp.experts.")) g_fx.t[i] = g_fx.t[--g_fx.n];
        else i++;
    }
    char name[128];
    for (int L = 0; L < 4; L++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", L);
        fx_add(&g_fx, name, TD_BF16, 3, 4, 32, 32);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", L);
        fx_add(&g_fx, name, TD_BF16, 3, 4, 32, L == 2 ? 15 : 16); /* layer 2: wrong I */
    }
    fx_write_tensors(dir, &g_fx, 1);
    td_inspect_report r;
    inspect_ok(dir, &r);
    assert_true(r.fused_experts);
    assert_int_equal(r.n_errors, 1);
    assert_true(has_finding(&r, TD_FIND_SHAPE, "layers.2.mlp.experts.down_proj", "[4, 32, 16]"));
    assert_int_equal(r.counts[TD_FIND_MISSING], 0);
    td_inspect_report_free(&r);
}

static void inspect_reports_each_inconsistency(void **state)
{
    (void)state;
    const char *dir = dirpath("bad");
    fx_write_meta(dir, FX_QWEN3_CONFIG, FX_QWEN3_QUANT);
    fx_inventory(dir, &g_fx);
    fx_drop(&g_fx, "model.layers.1.mlp.experts.2.up_proj.weight_scale");          /* missing */
    fx_find(&g_fx, "model.layers.0.linear_attn.in_proj_ba.weight")->shape[0] = 9;  /* shape */
    fx_tensor *t = fx_find(&g_fx, "model.layers.2.mlp.experts.0.down_proj.weight");
    t->dt = TD_BF16;                                                               /* dtype */
    t->shape[1] = 16;
    t = fx_find(&g_fx, "model.layers.0.mlp.experts.1.gate_proj.weight_scale");
    t->poison_at = 5;                                                              /* NaN scale */
    t->poison_byte = 0xFF;
    t = fx_find(&g_fx, "model.layers.0.mlp.experts.1.up_proj.weight_scale");
    t->poison_at = 0;                                                              /* negative */
    t->poison_byte = 0xB8;
    t = fx_find(&g_fx, "model.layers.3.self_attn.o_proj.weight_scale_2");
    t->poison_at = 3;                                                              /* global < 0 */
    t->poison_byte = 0xBF;
    fx_add(&g_fx, "model.layers.0.mystery.weight", TD_F32, 1, 4, 0, 0);           /* unexpected */
    fx_write_tensors(dir, &g_fx, 2);
    td_inspect_report r;
    inspect_ok(dir, &r);
    assert_true(has_finding(&r, TD_FIND_MISSING, "layers.1.mlp.experts.2.up_proj.weight_scale", "NVFP4"));
    assert_true(has_finding(&r, TD_FIND_SHAPE, "layers.0.linear_attn.in_proj_ba.weight", "[9, 32]"));
    assert_true(has_finding(&r, TD_FIND_DTYPE, "layers.2.mlp.experts.0.down_proj.weight", "BF16"));
    assert_true(has_finding(&r, TD_FIND_NAN_SCALE, "layers.0.mlp.experts.1.gate_proj.weight_scale", "flat index 5"));
    assert_true(has_finding(&r, TD_FIND_NEG_SCALE, "layers.0.mlp.experts.1.up_proj.weight_scale", "1 block-scale"));
    assert_true(has_finding(&r, TD_FIND_BAD_GLOBAL, "layers.3.self_attn.o_proj.weight_scale_2", "finite and > 0"));
    assert_true(has_finding(&r, TD_FIND_UNEXPECTED, "model.layers.0.mystery.weight", "not implied"));
    assert_int_equal(r.counts[TD_FIND_MISSING], 1);
    assert_int_equal(r.counts[TD_FIND_NAN_SCALE], 1);
    assert_int_equal(r.counts[TD_FIND_UNEXPECTED], 1);
    assert_int_equal(r.n_warnings, 2); /* negative scale + unexpected */
    assert_int_equal(r.n_errors, r.counts[TD_FIND_MISSING] + r.counts[TD_FIND_SHAPE] +
                                     r.counts[TD_FIND_DTYPE] + r.counts[TD_FIND_NAN_SCALE] +
                                     r.counts[TD_FIND_BAD_GLOBAL]);
    td_inspect_report_free(&r);
}


/* Checkpoints whose names, shapes and config were written by transformers save_pretrained
 * (tests/fixtures/hf): rebuilt with filler bytes, they must inspect clean. */
static void inspect_public_implementation_inventories_are_consistent(void **state)
{
    (void)state;
    static const char *const models[] = {"qwen3_next", "qwen4_exp"};
    for (size_t mi = 0; mi < 2; mi++) {
        char src[256], dir[600], p[800];
        snprintf(src, sizeof src, "tests/fixtures/hf/%s", models[mi]);
        snprintf(dir, sizeof dir, "%s/hf_%s", td_test_tmpdir(), models[mi]);
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
        /* group by shard: write one file per distinct shard name plus the index */
        cJSON *ts = cJSON_GetObjectItem(j, "tensors");
        char shards[8][64];
        int n_shards = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, ts) {
            const char *sh = cJSON_GetObjectItem(t, "shard")->valuestring;
            int k = 0;
            while (k < n_shards && strcmp(shards[k], sh)) k++;
            if (k == n_shards) {
                assert_true(n_shards < 8);
                snprintf(shards[n_shards++], 64, "%s", sh);
            }
        }
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        FILE *idx = fopen(p, "w");
        assert_non_null(idx);
        fprintf(idx, "{\"weight_map\":{");
        bool first = true;
        size_t total = 0;
        for (int s = 0; s < n_shards; s++) {
            g_fx.n = 0;
            cJSON_ArrayForEach(t, ts) {
                if (strcmp(cJSON_GetObjectItem(t, "shard")->valuestring, shards[s])) continue;
                const cJSON *shape = cJSON_GetObjectItem(t, "shape");
                int64_t d[3] = {0, 0, 0};
                int nd = cJSON_GetArraySize(shape);
                assert_true(nd <= 3);
                for (int k = 0; k < nd; k++) d[k] = (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble;
                const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
                fx_add(&g_fx, name, td_dtype_from_name(cJSON_GetObjectItem(t, "dtype")->valuestring), nd, d[0], d[1], d[2]);
                fprintf(idx, "%s\"%s\":\"%s\"", first ? "" : ",", name, shards[s]);
                first = false;
            }
            total += g_fx.n;
            char sdir[700];
            snprintf(sdir, sizeof sdir, "%s/.s%d", dir, s);
            assert_int_equal(mkdir(sdir, 0777), 0);
            fx_write_tensors(sdir, &g_fx, 1);
            assert_int_equal(td_test_sh("mv '%s/model.safetensors' '%s/%s' && rmdir '%s'", sdir, dir, shards[s], sdir), 0);
        }
        fprintf(idx, "}}");
        assert_int_equal(fclose(idx), 0);
        cJSON_Delete(j);
        td_inspect_report r;
        inspect_ok(dir, &r);
        if (r.n_errors || r.n_warnings) {
            td_inspect_print(&r, stderr);
            fail_msg("%s: transformers-written inventory not consistent", models[mi]);
        }
        assert_int_equal(r.n_tensors, (int64_t)total);
        assert_int_equal(r.n_shards, n_shards);
        td_inspect_report_free(&r);
    }
}

/* ---- end to end through the CLI ---- */

static const char *tandem_bin(void)
{
    const char *b = getenv("TD_TANDEM");
    return b && *b ? b : "build/release/tandem";
}

/* Run `tandem inspect --model DIR [extra]`, capture stdout/stderr, return exit status. */
static int run_inspect(const char *dir, const char *extra, char **out, char **errs)
{
    const char *o = td_test_path("cli.out"), *e = td_test_path("cli.err");
    int rc = td_test_sh("%s inspect --model '%s' %s >'%s' 2>'%s'", tandem_bin(), dir, extra ? extra : "", o, e);
    *out = td_test_slurp(o, NULL);
    *errs = td_test_slurp(e, NULL);
    assert_non_null(*out);
    assert_non_null(*errs);
    return rc;
}

static void cli_inspect_clean_and_broken_checkpoints(void **state)
{
    (void)state;
    const char *dir = dirpath("cli_ok");
    write_qwen3(dir, 2);
    char *out, *errs;
    assert_int_equal(run_inspect(dir, NULL, &out, &errs), 0);
    assert_non_null(strstr(out, "qwen3_next"));
    assert_non_null(strstr(out, "no inconsistency found"));
    assert_non_null(strstr(out, "NVFP4"));
    free(out);
    free(errs);
    assert_int_equal(run_inspect(dir, "--json", &out, &errs), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal((int)cJSON_GetObjectItem(j, "tensor_count")->valuedouble, (int)g_fx.n);
    cJSON_Delete(j);
    free(out);
    free(errs);
    /* NaN in a scale tensor parses, but inspect reports it and exits 1 */
    fx_find(&g_fx, "model.layers.0.linear_attn.out_proj.weight_scale")->poison_at = 0;
    fx_find(&g_fx, "model.layers.0.linear_attn.out_proj.weight_scale")->poison_byte = 0x7F;
    fx_write_tensors(dir, &g_fx, 2);
    assert_int_equal(run_inspect(dir, NULL, &out, &errs), 1);
    assert_non_null(strstr(out, "NaN block-scale"));
    assert_non_null(strstr(out, "model.layers.0.linear_attn.out_proj.weight_scale"));
    free(out);
    free(errs);
    /* usage errors */
    assert_int_equal(td_test_sh("%s inspect >/dev/null 2>&1", tandem_bin()), 2);
    assert_int_equal(td_test_sh("%s inspect --bogus >/dev/null 2>&1", tandem_bin()), 2);
    assert_int_equal(td_test_sh("%s inspect --help >/dev/null 2>&1", tandem_bin()), 0);
    assert_int_equal(td_test_sh("%s frobnicate >/dev/null 2>&1", tandem_bin()), 2);
}

/* Raw safetensors image: u64 header length, header text, `data_len` zero bytes. */
static void write_raw_st(const char *path, const char *header, size_t data_len, int64_t len_override)
{
    size_t hl = strlen(header);
    uint64_t n = len_override >= 0 ? (uint64_t)len_override : hl;
    uint8_t *buf = calloc(8 + hl + data_len + 1, 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    td_test_write(path, buf, 8 + hl + data_len);
    free(buf);
}

typedef struct bad_case {
    const char *label;
    const char *config;     /* NULL: the good qwen3 config */
    const char *hf_quant;   /* NULL: none */
    const char *st_header;  /* model.safetensors header (NULL: none) */
    size_t st_data;
    int64_t st_len;         /* header length override, -1 none */
    const char *index;      /* model.safetensors.index.json (NULL: none) */
    const char *shard;      /* extra shard: "name|header|data_len" written with write_raw_st */
    const char *needle;     /* must appear in stderr */
} bad_case;

#define GOOD_T "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void cli_malformed_corpus_fails_cleanly(void **state)
{
    (void)state;
    static char deep[400];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{\"model_type\":\"qwen3_next\",\"x\":");
    for (int i = 0; i < 100; i++) strcat(deep, "[");
    for (int i = 0; i < 100; i++) strcat(deep, "]");
    strcat(deep, "}");
    const bad_case cases[] = {
        {"config missing", "", NULL, NULL, 0, -1, NULL, NULL, "config.json"},
        {"config not JSON", "{\"model_type\": qwen3_next}", NULL, NULL, 0, -1, NULL, NULL, "config.json"},
        {"config non-UTF-8", "{\"model_type\":\"qwen3_next\xff\"}", NULL, NULL, 0, -1, NULL, NULL, "UTF-8"},
        {"config deeply nested", deep, NULL, NULL, 0, -1, NULL, NULL, "nested"},
        {"config wrong type", "{\"model_type\":\"qwen3_next\",\"hidden_size\":[32],\"num_hidden_layers\":4,"
         "\"vocab_size\":64,\"num_attention_heads\":4,\"num_key_value_heads\":2}", NULL, NULL, 0, -1, NULL, NULL, "hidden_size"},
        {"config unsupported family", "{\"model_type\":\"llama\"}", NULL, NULL, 0, -1, NULL, NULL, "llama"},
        {"no safetensors", NULL, NULL, NULL, 0, -1, NULL, NULL, "model.safetensors"},
        {"safetensors truncated", NULL, NULL, "", 0, 4, NULL, NULL, "model.safetensors"},
        {"header length beyond file", NULL, NULL, "{" GOOD_T "}", 8, 4096, NULL, NULL, "model.safetensors"},
        {"header not JSON", NULL, NULL, "{\"t\":{dtype}}   ", 0, -1, NULL, NULL, "model.safetensors"},
        {"offsets out of range", NULL, NULL, "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, -1, NULL, NULL, "\"t\""},
        {"overlapping tensors", NULL, NULL, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, -1, NULL, NULL, "model.safetensors"},
        {"unknown dtype", NULL, NULL, "{\"t\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1, NULL, NULL, "F12"},
        {"byte count mismatch", NULL, NULL, "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1, NULL, NULL, "\"t\""},
        {"duplicate tensor", NULL, NULL, "{" GOOD_T "," GOOD_T "}", 8, -1, NULL, NULL, "duplicate"},
        {"trailing data", NULL, NULL, "{" GOOD_T "}", 12, -1, NULL, NULL, "model.safetensors"},
        {"negative dim", NULL, NULL, "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -1, NULL, NULL, "\"t\""},
        {"index not JSON", NULL, NULL, NULL, 0, -1, "{\"weight_map\":", NULL, "model.safetensors.index.json"},
        {"index without weight_map", NULL, NULL, NULL, 0, -1, "{\"metadata\":{}}", NULL, "weight_map"},
        {"index shard escapes dir", NULL, NULL, NULL, 0, -1, "{\"weight_map\":{\"t\":\"../x.safetensors\"}}", NULL, "x.safetensors"},
        {"index names missing shard", NULL, NULL, NULL, 0, -1, "{\"weight_map\":{\"t\":\"gone.safetensors\"}}", NULL, "gone.safetensors"},
        {"shard lacks indexed tensor", NULL, NULL, NULL, 0, -1, "{\"weight_map\":{\"t\":\"s1.safetensors\",\"u\":\"s1.safetensors\"}}",
         "s1.safetensors|{" GOOD_T "}|8", "\"u\""},
        {"tensor not in index", NULL, NULL, NULL, 0, -1, "{\"weight_map\":{\"t\":\"s1.safetensors\"}}",
         "s1.safetensors|{" GOOD_T ",\"v\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}|9", "\"v\""},
        {"quant metadata malformed", NULL, "{\"quantization\": [}", NULL, 0, -1, NULL, NULL, "hf_quant_config.json"},
        {"quant algo unsupported", NULL, "{\"quantization\":{\"quant_algo\":\"INT2\"}}", NULL, 0, -1, NULL, NULL, "INT2"},
    };
    assert_true(sizeof cases / sizeof cases[0] >= 20);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        char dir[600], p[800];
        snprintf(dir, sizeof dir, "%s/bad%02zu", td_test_tmpdir(), i);
        td_test_sh("rm -rf '%s'", dir);
        assert_int_equal(mkdir(dir, 0777), 0);
        if (!c->config || c->config[0]) {
            snprintf(p, sizeof p, "%s/config.json", dir);
            td_test_write_str(p, c->config ? c->config : FX_QWEN3_CONFIG);
        }
        if (c->hf_quant) {
            snprintf(p, sizeof p, "%s/hf_quant_config.json", dir);
            td_test_write_str(p, c->hf_quant);
        }
        if (c->st_header) {
            snprintf(p, sizeof p, "%s/model.safetensors", dir);
            if (c->st_len == 4 && !c->st_header[0]) td_test_write(p, "\x10\0\0\0", 4);
            else write_raw_st(p, c->st_header, c->st_data, c->st_len);
        }
        if (c->index) {
            snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
            td_test_write_str(p, c->index);
        }
        if (c->shard) {
            char spec[600];
            snprintf(spec, sizeof spec, "%s", c->shard);
            char *name = strtok(spec, "|"), *hdr = strtok(NULL, "|"), *len = strtok(NULL, "|");
            snprintf(p, sizeof p, "%s/%s", dir, name);
            write_raw_st(p, hdr, (size_t)atoi(len), -1);
        }
        char *out, *errs;
        int rc = run_inspect(dir, NULL, &out, &errs);
        if (rc != 2 || !strstr(errs, c->needle) || !strstr(errs, "tandem inspect: "))
            fail_msg("case %zu (%s): exit %d, stderr '%s'", i, c->label, rc, errs);
        free(out);
        free(errs);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(inspect_qwen3_next_fixture_is_consistent),
        cmocka_unit_test(inspect_flash_next_sharded_fixture_is_consistent),
        cmocka_unit_test(inspect_fused_bf16_experts_are_accepted),
        cmocka_unit_test(inspect_reports_each_inconsistency),
        cmocka_unit_test(inspect_public_implementation_inventories_are_consistent),
        cmocka_unit_test(cli_inspect_clean_and_broken_checkpoints),
        cmocka_unit_test(cli_malformed_corpus_fails_cleanly),
    };
    return cmocka_run_group_tests_name("inspect", tests, NULL, NULL);
}
