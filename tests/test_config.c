/* test_config.c — config.json parsing for both families (core/config). */
#include "test_common.h"
#include "config.h"

/* The released Qwen3-Next-80B-A3B config (MODEL_SPEC.md A1). */
static const char *const QWEN3_NEXT_CONFIG =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\","
    " \"hidden_size\": 2048, \"num_hidden_layers\": 48, \"full_attention_interval\": 4,"
    " \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256,"
    " \"partial_rotary_factor\": 0.25, \"rope_theta\": 5000000, \"rope_scaling\": null,"
    " \"max_position_embeddings\": 262144, \"linear_num_key_heads\": 16,"
    " \"linear_num_value_heads\": 32, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
    " \"linear_conv_kernel_dim\": 4, \"num_experts\": 512, \"num_experts_per_tok\": 10,"
    " \"norm_topk_prob\": true, \"moe_intermediate_size\": 512,"
    " \"shared_expert_intermediate_size\": 512, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
    " \"intermediate_size\": 5120, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06,"
    " \"vocab_size\": 151936, \"tie_word_embeddings\": false, \"attention_bias\": false,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645}";

/* The Qwen3.8-Flash-Next text_config (MODEL_SPEC.md B1), nested as in the release. */
static const char *const FLASH_NEXT_CONFIG =
    "{\"architectures\": [\"Qwen4ExpForConditionalGeneration\"], \"model_type\": \"qwen4_exp\","
    " \"tie_word_embeddings\": false,"
    " \"text_config\": {\"model_type\": \"qwen4_exp_text\", \"hidden_size\": 2560,"
    " \"num_hidden_layers\": 48, \"layer_types\": [%s],"
    " \"num_attention_heads\": 24, \"num_key_value_heads\": 2, \"head_dim\": 256,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000,"
    "   \"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true},"
    " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48, \"linear_key_head_dim\": 128,"
    " \"linear_value_head_dim\": 128, \"linear_conv_kernel_dim\": 4, \"output_gate_type\": \"sigmoid\","
    " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"norm_topk_prob\": true,"
    " \"moe_intermediate_size\": 640, \"shared_expert_intermediate_size\": 640,"
    " \"hc_count\": 4, \"hc_lowrank\": 320, \"indexer_n_heads\": 4, \"indexer_kv_heads\": 1,"
    " \"indexer_head_dim\": 128, \"indexer_budget\": 2048, \"indexer_compress_ratio\": 4,"
    " \"ple_layer_ids\": [2], \"ple_embed_dim\": 2560, \"ple_conv_kernel_size\": 4,"
    " \"ngram_size\": 3, \"heads_per_ngram\": 8, \"ngram_vocab_size_base\": 20000000,"
    " \"make_ngram_vocab_size_divisible_by\": 128, \"split_ngram_parts\": 128,"
    " \"rms_norm_eps\": 1e-06, \"vocab_size\": 248320, \"eos_token_id\": 248044,"
    " \"max_position_embeddings\": 262144, \"mtp_num_hidden_layers\": 1, \"hidden_act\": \"silu\"}}";

static td_status parse_text(const char *text, td_config *cfg, td_err *err)
{
    cJSON *j = NULL;
    td_status st = td_json_parse(text, strlen(text), 1 << 20, "config.json", &j, err);
    if (st) return st;
    st = td_config_parse(j, "config.json", cfg, err);
    cJSON_Delete(j);
    return st;
}

static char *flash_next_text(void)
{
    static char types[48 * 24];
    types[0] = 0;
    for (int i = 0; i < 48; i++) {
        strcat(types, (i + 1) % 4 == 0 ? "\"full_attention\"" : "\"linear_attention\"");
        if (i < 47) strcat(types, ",");
    }
    size_t n = strlen(FLASH_NEXT_CONFIG) + strlen(types) + 1;
    char *s = malloc(n);
    snprintf(s, n, FLASH_NEXT_CONFIG, types);
    return s;
}

static void config_qwen3_next_release_parses(void **state)
{
    (void)state;
    td_config c;
    td_err err;
    assert_int_equal(parse_text(QWEN3_NEXT_CONFIG, &c, &err), TD_OK);
    assert_int_equal(c.family, TD_FAMILY_QWEN3_NEXT);
    assert_string_equal(c.architecture, "Qwen3NextForCausalLM");
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.num_hidden_layers, 48);
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(td_config_rotary_dim(&c), 64);
    assert_true(c.rope_theta == 5e6);
    assert_int_equal(td_config_count_layers(&c, TD_LAYER_GDN), 36);
    assert_int_equal(td_config_count_layers(&c, TD_LAYER_ATTENTION), 12);
    for (int i = 0; i < 48; i++)
        assert_int_equal(c.layer_types[i], (i + 1) % 4 == 0 ? TD_LAYER_ATTENTION : TD_LAYER_GDN);
    assert_false(c.layer_types_given);
    assert_int_equal(c.num_experts, 512);
    assert_int_equal(c.num_experts_per_tok, 10);
    assert_true(c.norm_topk_prob);
    assert_string_equal(c.output_gate_type, "silu");
    assert_int_equal(c.eos_token_id, 151645);
    assert_true(td_config_layer_is_moe(&c, 0) && td_config_layer_is_moe(&c, 47));
    assert_false(td_config_layer_has_ple(&c, 1));
}

static void config_flash_next_text_config_parses(void **state)
{
    (void)state;
    char *text = flash_next_text();
    td_config c;
    td_err err;
    assert_int_equal(parse_text(text, &c, &err), TD_OK);
    free(text);
    assert_int_equal(c.family, TD_FAMILY_QWEN4_EXP);
    assert_true(c.has_text_config);
    assert_int_equal(c.hidden_size, 2560);
    assert_true(c.rope_theta == 1e7);
    assert_int_equal(td_config_rotary_dim(&c), 64);
    assert_true(c.layer_types_given);
    assert_int_equal(td_config_count_layers(&c, TD_LAYER_ATTENTION), 12);
    assert_string_equal(c.output_gate_type, "sigmoid");
    assert_int_equal(c.hc_count, 4);
    assert_int_equal(c.hc_lowrank, 320);
    assert_int_equal(c.indexer_budget, 2048);
    assert_int_equal(c.n_ple_layers, 1);
    assert_true(td_config_layer_has_ple(&c, 1));
    assert_false(td_config_layer_has_ple(&c, 2));
    assert_int_equal(c.seed, 1234);
    assert_int_equal(c.eos_token_id, 248044);
    assert_int_equal(c.mtp_num_layers, 1);
    assert_int_equal(c.moe_intermediate_size, 640);
}

static void config_defaults_fill_optional_keys(void **state)
{
    (void)state;
    td_config c;
    td_err err;
    assert_int_equal(parse_text("{\"model_type\":\"qwen3_next\",\"hidden_size\":64,"
                                "\"num_hidden_layers\":8,\"vocab_size\":100,"
                                "\"num_attention_heads\":4,\"num_key_value_heads\":2}",
                                &c, &err), TD_OK);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.full_attention_interval, 4);
    assert_int_equal(td_config_count_layers(&c, TD_LAYER_ATTENTION), 2);
    assert_int_equal(c.layer_types[3], TD_LAYER_ATTENTION);
    assert_int_equal(c.layer_types[7], TD_LAYER_ATTENTION);
    assert_int_equal(c.linear_num_value_heads, 32);
    assert_int_equal(c.bos_token_id, -1);
    /* architectures alone identify the family; an eos list keeps its first id */
    assert_int_equal(parse_text("{\"architectures\":[\"Qwen3NextForCausalLM\"],\"hidden_size\":64,"
                                "\"num_hidden_layers\":4,\"vocab_size\":100,\"eos_token_id\":[7,9],"
                                "\"num_attention_heads\":4,\"num_key_value_heads\":2}",
                                &c, &err), TD_OK);
    assert_int_equal(c.family, TD_FAMILY_QWEN3_NEXT);
    assert_int_equal(c.eos_token_id, 7);
}

static void config_mlp_only_layers_are_dense(void **state)
{
    (void)state;
    td_config c;
    td_err err;
    assert_int_equal(parse_text("{\"model_type\":\"qwen3_next\",\"hidden_size\":64,"
                                "\"num_hidden_layers\":4,\"vocab_size\":100,\"intermediate_size\":96,"
                                "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                                "\"mlp_only_layers\":[1],\"decoder_sparse_step\":1}",
                                &c, &err), TD_OK);
    assert_true(td_config_layer_is_moe(&c, 0));
    assert_false(td_config_layer_is_moe(&c, 1));
}

static void config_layer_subset_is_read_and_checked(void **state)
{
    (void)state;
    td_config c;
    td_err err;
    assert_int_equal(parse_text("{\"model_type\":\"qwen4_exp\",\"text_config\":{\"hidden_size\":64,"
                                "\"num_hidden_layers\":48,\"vocab_size\":100,\"num_attention_heads\":4,"
                                "\"num_key_value_heads\":2,\"tandem_layers_present\":[0,23,47]}}",
                                &c, &err), TD_OK);
    assert_int_equal(c.n_layers_present, 3);
    assert_true(td_config_layer_present(&c, 23));
    assert_false(td_config_layer_present(&c, 22));
    assert_false(td_config_layer_present(&c, 48));
    assert_int_equal(parse_text("{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                                "\"vocab_size\":100,\"num_attention_heads\":4,\"num_key_value_heads\":2}",
                                &c, &err), TD_OK);
    assert_int_equal(c.n_layers_present, 0);
    assert_true(td_config_layer_present(&c, 3));
    assert_false(td_config_layer_present(&c, 4));
    static const char *const bad[] = {"[1,1]", "[2,1]", "[4]", "[-1]", "\"0\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                 "\"vocab_size\":100,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                 "\"tandem_layers_present\":%s}", bad[i]);
        td_err_clear(&err);
        assert_int_not_equal(parse_text(text, &c, &err), TD_OK);
        assert_non_null(strstr(err.msg, "tandem_layers_present"));
    }
}

static void config_bad_values_name_the_key(void **state)
{
    (void)state;
    static const struct { const char *text; td_status code; const char *needle; } cases[] = {
        {"{\"model_type\":\"llama\",\"hidden_size\":8}", TD_ERR_UNSUPPORTED, "llama"},
        {"{\"hidden_size\":8}", TD_ERR_UNSUPPORTED, "model_type"},
        {"[1,2]", TD_ERR_FORMAT, "object"},
        {"{\"model_type\":\"qwen3_next\",\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2}", TD_ERR_NOTFOUND, "hidden_size"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":\"64\",\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":-64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2}", TD_ERR_RANGE, "hidden_size"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64.5,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":5,\"num_key_value_heads\":2}", TD_ERR_MISMATCH, "num_key_value_heads"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":2,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"layer_types\":[\"linear_attention\"]}",
         TD_ERR_MISMATCH, "layer_types"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":1,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"layer_types\":[\"mamba\"]}",
         TD_ERR_UNSUPPORTED, "mamba"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":8}",
         TD_ERR_MISMATCH, "num_experts_per_tok"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"partial_rotary_factor\":0.001}",
         TD_ERR_RANGE, "rotary"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":5000,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2}", TD_ERR_RANGE, "num_hidden_layers"},
        {"{\"model_type\":\"qwen4_exp\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"ple_layer_ids\":[0]}",
         TD_ERR_RANGE, "ple_layer_ids"},
        {"{\"model_type\":\"qwen4_exp\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"text_config\":[]}",
         TD_ERR_FORMAT, "text_config"},
        {"{\"model_type\":\"qwen3_next\",\"hidden_size\":64,\"num_hidden_layers\":4,\"vocab_size\":100,"
         "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"rope_parameters\":{\"rope_theta\":-1}}",
         TD_ERR_RANGE, "rope_theta"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_config c;
        td_err err;
        td_err_clear(&err);
        td_status st = parse_text(cases[i].text, &c, &err);
        if (st != cases[i].code || !strstr(err.msg, cases[i].needle) || !strstr(err.msg, "config.json"))
            fail_msg("case %zu: status %d (want %d) msg '%s'", i, st, cases[i].code, err.msg);
    }
}

static void config_load_reads_directory(void **state)
{
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s", td_test_path("cfgdir"));
    mkdir(dir, 0777);
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_test_write_str(path, QWEN3_NEXT_CONFIG);
    td_config c;
    td_err err;
    assert_int_equal(td_config_load(dir, &c, &err), TD_OK);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(td_config_load(td_test_path("nope"), &c, &err), TD_ERR_IO);
    assert_non_null(strstr(err.msg, "nope/config.json"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_qwen3_next_release_parses),
        cmocka_unit_test(config_flash_next_text_config_parses),
        cmocka_unit_test(config_defaults_fill_optional_keys),
        cmocka_unit_test(config_mlp_only_layers_are_dense),
        cmocka_unit_test(config_layer_subset_is_read_and_checked),
        cmocka_unit_test(config_bad_values_name_the_key),
        cmocka_unit_test(config_load_reads_directory),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
