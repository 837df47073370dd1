/* test_quant.c — quantization metadata parsing and module scheme resolution (core/quant). */
#include "test_common.h"
#include "quant.h"

static cJSON *js(const char *text)
{
    cJSON *j = NULL;
    td_err err;
    if (td_json_parse(text, strlen(text), 1 << 20, "q.json", &j, &err) != TD_OK)
        fail_msg("fixture JSON: %s", err.msg);
    return j;
}

static td_scheme resolve(const td_quant *q, const char *m, bool linear, td_quant_tensors *t)
{
    td_err err;
    assert_int_equal(td_quant_resolve(q, m, linear, t, &err), TD_OK);
    return t->scheme;
}

static void quant_modelopt_hf_file_resolves_with_globs(void **state)
{
    (void)state;
    cJSON *j = js("{\"producer\":{\"name\":\"modelopt\",\"version\":\"0.40\"},"
                  "\"quantization\":{\"quant_algo\":\"NVFP4\",\"kv_cache_quant_algo\":null,"
                  "\"group_size\":16,\"exclude_modules\":[\"lm_head\",\"*mlp.gate\","
                  "\"*shared_expert_gate\",\"*linear_attn.in_proj*\",\"model.layers.*.self_attn.q_proj\"]}}");
    td_quant q;
    td_err err;
    assert_int_equal(td_quant_parse_hf(j, "hf_quant_config.json", &q, &err), TD_OK);
    cJSON_Delete(j);
    assert_int_equal(q.source, TD_QUANT_SRC_HF_QUANT_CONFIG);
    assert_string_equal(q.quant_algo, "NVFP4");
    assert_true(q.has_input_scale);
    td_quant_tensors t;
    assert_int_equal(resolve(&q, "model.layers.0.mlp.experts.3.gate_proj", true, &t), TD_SCHEME_NVFP4);
    assert_string_equal(t.weight, "model.layers.0.mlp.experts.3.gate_proj.weight");
    assert_string_equal(t.scale, "model.layers.0.mlp.experts.3.gate_proj.weight_scale");
    assert_string_equal(t.global, "model.layers.0.mlp.experts.3.gate_proj.weight_scale_2");
    assert_string_equal(t.input_scale, "model.layers.0.mlp.experts.3.gate_proj.input_scale");
    assert_int_equal(resolve(&q, "lm_head", true, &t), TD_SCHEME_NONE);
    assert_string_equal(t.weight, "lm_head.weight");
    assert_string_equal(t.scale, "");
    assert_int_equal(resolve(&q, "model.layers.3.mlp.gate", true, &t), TD_SCHEME_NONE);
    /* "*mlp.gate" must not swallow gate_proj */
    assert_int_equal(resolve(&q, "model.layers.3.mlp.shared_expert.gate_proj", true, &t), TD_SCHEME_NVFP4);
    assert_int_equal(resolve(&q, "model.layers.3.mlp.shared_expert_gate", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.layers.0.linear_attn.in_proj_qkvz", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.layers.0.linear_attn.out_proj", true, &t), TD_SCHEME_NVFP4);
    assert_int_equal(resolve(&q, "model.layers.3.self_attn.q_proj", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.layers.3.self_attn.o_proj", true, &t), TD_SCHEME_NVFP4);
    /* the language_model prefix is rewritten for matching */
    assert_int_equal(resolve(&q, "model.language_model.layers.3.self_attn.q_proj", true, &t), TD_SCHEME_NONE);
    /* embeddings are never quantized by a linear scheme */
    assert_int_equal(resolve(&q, "model.embed_tokens", false, &t), TD_SCHEME_NONE);
    td_quant_free(&q);
    td_quant_free(&q); /* idempotent */
}

static void quant_w4a16_has_no_input_scale(void **state)
{
    (void)state;
    cJSON *j = js("{\"quantization\":{\"quant_algo\":\"w4a16_nvfp4\",\"group_size\":16,\"exclude_modules\":[]}}");
    td_quant q;
    td_err err;
    assert_int_equal(td_quant_parse_hf(j, "hf_quant_config.json", &q, &err), TD_OK);
    cJSON_Delete(j);
    td_quant_tensors t;
    assert_int_equal(resolve(&q, "model.layers.0.mlp.experts.0.up_proj", true, &t), TD_SCHEME_NVFP4);
    assert_string_equal(t.input_scale, "");
    td_quant_free(&q);
}

static void quant_mixed_precision_config_resolves_per_layer(void **state)
{
    (void)state;
    cJSON *j = js("{\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"MIXED_PRECISION\","
                  "\"quantized_layers\":{"
                  "\"model.language_model.layers.0.mlp.experts\":{\"quant_algo\":\"NVFP4\",\"group_size\":16},"
                  "\"model.language_model.layers.1.ple.ple_embedding.ngram_embedding\":{\"quant_algo\":\"FP8\"},"
                  "\"mtp.layers.0.mlp.experts\":{\"quant_algo\":\"FP8_BLOCK_SCALES\"}},"
                  "\"ignore\":[\"lm_head\"]}}");
    td_quant q;
    td_err err;
    assert_int_equal(td_quant_parse_config(cJSON_GetObjectItem(j, "quantization_config"), "config.json", &q, &err), TD_OK);
    cJSON_Delete(j);
    assert_true(q.mixed);
    assert_int_equal(q.n_layers, 3);
    td_quant_tensors t;
    assert_int_equal(resolve(&q, "model.language_model.layers.0.mlp.experts.511.down_proj", true, &t), TD_SCHEME_NVFP4);
    assert_string_equal(t.input_scale, "model.language_model.layers.0.mlp.experts.511.down_proj.input_scale");
    /* layer 1's experts are not listed: unquantized; a prefix must end at a dot */
    assert_int_equal(resolve(&q, "model.language_model.layers.1.mlp.experts.0.down_proj", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.language_model.layers.0.mlp.experts_x", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.language_model.layers.0.mlp.shared_expert.up_proj", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.language_model.layers.1.ple.ple_embedding.ngram_embedding", false, &t), TD_SCHEME_FP8);
    assert_string_equal(t.input_scale, "");
    assert_int_equal(resolve(&q, "mtp.layers.0.mlp.experts.2.gate_proj", true, &t), TD_SCHEME_FP8_BLOCK);
    assert_string_equal(t.scale, "mtp.layers.0.mlp.experts.2.gate_proj.weight_scale_inv");
    td_quant_free(&q);
}

static void quant_compressed_tensors_names_and_regex_ignore(void **state)
{
    (void)state;
    cJSON *j = js("{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
                  "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],"
                  "\"weights\":{\"num_bits\":4,\"type\":\"float\",\"strategy\":\"tensor_group\",\"group_size\":16,\"symmetric\":true},"
                  "\"input_activations\":null}},"
                  "\"ignore\":[\"lm_head\",\"re:.*mlp[.]gate$\",\"re:.*linear_attn.*\"]}");
    td_quant q;
    td_err err;
    assert_int_equal(td_quant_parse_config(j, "config.json", &q, &err), TD_OK);
    cJSON_Delete(j);
    assert_int_equal(q.scheme, TD_SCHEME_NVFP4_CT);
    assert_false(q.has_input_scale);
    td_quant_tensors t;
    assert_int_equal(resolve(&q, "model.layers.0.mlp.experts.1.up_proj", true, &t), TD_SCHEME_NVFP4_CT);
    assert_string_equal(t.weight, "model.layers.0.mlp.experts.1.up_proj.weight_packed");
    assert_string_equal(t.global, "model.layers.0.mlp.experts.1.up_proj.weight_global_scale");
    assert_int_equal(resolve(&q, "model.layers.0.mlp.gate", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "model.layers.0.linear_attn.out_proj", true, &t), TD_SCHEME_NONE);
    assert_int_equal(resolve(&q, "lm_head", true, &t), TD_SCHEME_NONE);
    td_quant_free(&q);
}

static void quant_bad_metadata_is_rejected(void **state)
{
    (void)state;
    static const struct { bool hf; const char *text; td_status code; const char *needle; } cases[] = {
        {true, "{\"quantization\":{\"quant_algo\":\"INT3\"}}", TD_ERR_UNSUPPORTED, "INT3"},
        {true, "{\"producer\":{}}", TD_ERR_FORMAT, "quantization"},
        {true, "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"exclude_modules\":\"lm_head\"}}", TD_ERR_FORMAT, "exclude_modules"},
        {true, "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"exclude_modules\":[1]}}", TD_ERR_FORMAT, "exclude_modules"},
        {true, "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"group_size\":32}}", TD_ERR_UNSUPPORTED, "group_size"},
        {true, "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\"}}", TD_ERR_FORMAT, "quantized_layers"},
        {true, "{\"quantization\":{\"quant_algo\":\"MIXED_PRECISION\",\"quantized_layers\":{\"a\":{\"quant_algo\":\"X\"}}}}", TD_ERR_UNSUPPORTED, "\"X\""},
        {false, "{\"quant_method\":\"gptq\"}", TD_ERR_UNSUPPORTED, "gptq"},
        {false, "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"int\"}}}}", TD_ERR_UNSUPPORTED, "pack-quantized"},
        {false, "{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"group_size\":16}}}}", TD_ERR_UNSUPPORTED, "num_bits"},
        {false, "{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16}}},\"ignore\":[\"re:([\"]}", TD_ERR_FORMAT, "regular expression"},
        {false, "{\"quant_method\":\"modelopt\"}", TD_ERR_NOTFOUND, "quant_algo"},
        /* hostile regexes that would make the POSIX compiler explode are refused up front */
        {false, "{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16}}},\"ignore\":[\"re:hea++++++++++++++++++++++++d\"]}", TD_ERR_UNSUPPORTED, "refuses"},
        {false, "{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"group_size\":16}}},\"ignore\":[\"re:(a{1,100}){1,100}\"]}", TD_ERR_UNSUPPORTED, "refuses"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = js(cases[i].text);
        td_quant q;
        td_err err;
        td_err_clear(&err);
        td_status st = cases[i].hf ? td_quant_parse_hf(j, "hf_quant_config.json", &q, &err)
                                   : td_quant_parse_config(j, "config.json", &q, &err);
        cJSON_Delete(j);
        if (st != cases[i].code || !strstr(err.msg, cases[i].needle))
            fail_msg("case %zu: status %d (want %d) msg '%s'", i, st, cases[i].code, err.msg);
        assert_int_equal(q.n_exclude, 0); /* nothing leaked on failure */
    }
}

/* Scheme names as reports print them: unquantized modules may be BF16, F16 or F32, so they are
 * not called "BF16"; out-of-range values print as "?". */
static void quant_scheme_names(void **state)
{
    (void)state;
    assert_string_equal(td_scheme_name(TD_SCHEME_NONE), "unquantized");
    assert_string_equal(td_scheme_name(TD_SCHEME_NVFP4), "NVFP4");
    assert_string_equal(td_scheme_name(TD_SCHEME_NVFP4_CT), "NVFP4-CT");
    assert_string_equal(td_scheme_name(TD_SCHEME_FP8_BLOCK), "FP8-BLOCK");
    assert_string_equal(td_scheme_name(TD_SCHEME_COUNT), "?");
}

static void quant_load_prefers_hf_file_and_notes_disagreement(void **state)
{
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s", td_test_path("qdir"));
    mkdir(dir, 0777);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", dir);
    td_test_write_str(p, "{\"model_type\":\"qwen3_next\",\"quantization_config\":{\"quant_method\":\"modelopt\","
                         "\"quant_algo\":\"NVFP4\",\"ignore\":[\"lm_head\",\"x\"]}}");
    snprintf(p, sizeof p, "%s/hf_quant_config.json", dir);
    td_test_write_str(p, "{\"quantization\":{\"quant_algo\":\"NVFP4\",\"exclude_modules\":[\"lm_head\"]}}");
    td_quant q;
    td_err err;
    assert_int_equal(td_quant_load(dir, &q, &err), TD_OK);
    assert_int_equal(q.source, TD_QUANT_SRC_HF_QUANT_CONFIG);
    assert_int_equal(q.n_exclude, 1);
    assert_non_null(strstr(q.note, "disagree"));
    td_quant_free(&q);
    /* no metadata at all: unquantized */
    snprintf(dir, sizeof dir, "%s", td_test_path("qdir2"));
    mkdir(dir, 0777);
    snprintf(p, sizeof p, "%s/config.json", dir);
    td_test_write_str(p, "{\"model_type\":\"qwen3_next\"}");
    assert_int_equal(td_quant_load(dir, &q, &err), TD_OK);
    assert_int_equal(q.source, TD_QUANT_SRC_NONE);
    td_quant_tensors t;
    assert_int_equal(resolve(&q, "model.layers.0.mlp.experts.0.up_proj", true, &t), TD_SCHEME_NONE);
    td_quant_free(&q);
    /* malformed hf_quant_config.json names the file */
    snprintf(p, sizeof p, "%s/hf_quant_config.json", dir);
    td_test_write_str(p, "{\"quantization\":");
    assert_int_equal(td_quant_load(dir, &q, &err), TD_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "hf_quant_config.json"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(quant_modelopt_hf_file_resolves_with_globs),
        cmocka_unit_test(quant_w4a16_has_no_input_scale),
        cmocka_unit_test(quant_mixed_precision_config_resolves_per_layer),
        cmocka_unit_test(quant_compressed_tensors_names_and_regex_ignore),
        cmocka_unit_test(quant_bad_metadata_is_rejected),
        cmocka_unit_test(quant_load_prefers_hf_file_and_notes_disagreement),
        cmocka_unit_test(quant_scheme_names),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
