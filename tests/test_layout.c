/* test_layout.c — tensor inventory implied by a config (core/layout). */
#include "test_common.h"
#include "layout.h"

static void release_qwen3_next(td_config *c)
{
    const char *text = "{\"model_type\":\"qwen3_next\",\"hidden_size\":2048,\"num_hidden_layers\":48,"
                       "\"vocab_size\":151936,\"num_attention_heads\":16,\"num_key_value_heads\":2}";
    cJSON *j;
    td_err err;
    assert_int_equal(td_json_parse(text, strlen(text), 1 << 20, "c", &j, &err), TD_OK);
    assert_int_equal(td_config_parse(j, "c", c, &err), TD_OK);
    cJSON_Delete(j);
}

static void release_flash_next(td_config *c)
{
    const char *text = "{\"model_type\":\"qwen4_exp\",\"text_config\":{\"hidden_size\":2560,"
                       "\"num_hidden_layers\":48,\"vocab_size\":248320,\"num_attention_heads\":24,"
                       "\"num_key_value_heads\":2}}";
    cJSON *j;
    td_err err;
    assert_int_equal(td_json_parse(text, strlen(text), 1 << 20, "c", &j, &err), TD_OK);
    assert_int_equal(td_config_parse(j, "c", c, &err), TD_OK);
    cJSON_Delete(j);
}

static const td_module *find(const td_layout *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->mods[i].name, name)) return &l->mods[i];
    return NULL;
}

static void assert_shape2(const td_module *m, int64_t a, int64_t b)
{
    assert_non_null(m);
    assert_int_equal(m->ndim, 2);
    assert_int_equal(m->shape[0], a);
    assert_int_equal(m->shape[1], b);
}

static void layout_qwen3_next_release_matches_spec(void **state)
{
    (void)state;
    static td_config c;
    release_qwen3_next(&c);
    td_layout l;
    td_err err;
    assert_int_equal(td_layout_build(&c, "model.", &l, &err), TD_OK);
    /* MODEL_SPEC.md A2 shapes */
    assert_shape2(find(&l, "model.embed_tokens"), 151936, 2048);
    assert_shape2(find(&l, "lm_head"), 151936, 2048);
    assert_shape2(find(&l, "model.layers.0.linear_attn.in_proj_qkvz"), 12288, 2048);
    assert_shape2(find(&l, "model.layers.0.linear_attn.in_proj_ba"), 64, 2048);
    assert_shape2(find(&l, "model.layers.0.linear_attn.out_proj"), 2048, 4096);
    const td_module *conv = find(&l, "model.layers.0.linear_attn.conv1d");
    assert_non_null(conv);
    assert_int_equal(conv->shape[0], 8192);
    assert_int_equal(conv->shape[2], 4);
    assert_shape2(find(&l, "model.layers.3.self_attn.q_proj"), 8192, 2048);
    assert_shape2(find(&l, "model.layers.3.self_attn.k_proj"), 512, 2048);
    assert_shape2(find(&l, "model.layers.3.self_attn.o_proj"), 2048, 4096);
    assert_null(find(&l, "model.layers.3.linear_attn.out_proj"));
    assert_null(find(&l, "model.layers.0.self_attn.q_proj"));
    assert_shape2(find(&l, "model.layers.47.mlp.gate"), 512, 2048);
    const td_module *e = find(&l, "model.layers.47.mlp.experts.511.down_proj");
    assert_shape2(e, 2048, 512);
    assert_int_equal(e->expert, 511);
    assert_int_equal(e->moe_proj, TD_MOE_DOWN);
    assert_shape2(find(&l, "model.layers.5.mlp.shared_expert_gate"), 1, 2048);
    assert_non_null(find(&l, "model.norm"));
    assert_non_null(find(&l, "model.layers.0.linear_attn.A_log"));
    /* counts: per layer 2 norms + mixer + router + 512*3 experts + 4 shared */
    size_t experts = 0, linears = 0;
    for (size_t i = 0; i < l.n; i++) {
        experts += l.mods[i].expert >= 0;
        linears += l.mods[i].kind == TD_MOD_LINEAR;
    }
    assert_int_equal(experts, 48 * 512 * 3);
    /* linears: experts + 48*(router + 4 shared) + 36*3 GDN + 12*4 attention + lm_head */
    assert_int_equal(linears, 48 * 512 * 3 + 48 * 5 + 36 * 3 + 12 * 4 + 1);
    td_layout_free(&l);
    td_layout_free(&l);
}

static void layout_flash_next_release_matches_spec(void **state)
{
    (void)state;
    static td_config c;
    release_flash_next(&c);
    const char *names[] = {"lm_head.weight", "model.language_model.embed_tokens.weight"};
    const char *P = td_layout_detect_prefix(2, names);
    assert_string_equal(P, "model.language_model.");
    assert_string_equal(td_layout_detect_prefix(1, names), "model.");
    td_layout l;
    td_err err;
    assert_int_equal(td_layout_build(&c, P, &l, &err), TD_OK);
    /* MODEL_SPEC.md B2 shapes */
    assert_shape2(find(&l, "model.language_model.embed_tokens"), 248320, 2560);
    assert_shape2(find(&l, "model.language_model.hyper_connection_mixer.input_mix_weight_down"), 320, 10240);
    assert_shape2(find(&l, "model.language_model.layers.0.attn_hyper_connection.input_mix_weight_up"), 10240, 320);
    assert_shape2(find(&l, "model.language_model.layers.0.mlp_hyper_connection.block_inject_weight"), 4, 10240);
    assert_shape2(find(&l, "model.language_model.layers.0.linear_attn.in_proj_qkv"), 10240, 2560);
    assert_shape2(find(&l, "model.language_model.layers.0.linear_attn.in_proj_z"), 6144, 2560);
    assert_shape2(find(&l, "model.language_model.layers.0.linear_attn.in_proj_b"), 48, 2560);
    assert_shape2(find(&l, "model.language_model.layers.0.linear_attn.out_proj"), 2560, 6144);
    assert_shape2(find(&l, "model.language_model.layers.23.self_attn.q_proj"), 12288, 2560);
    assert_shape2(find(&l, "model.language_model.layers.23.self_attn.o_proj"), 2560, 6144);
    assert_shape2(find(&l, "model.language_model.layers.23.self_attn.indexer.index_qk_proj"), 640, 2560);
    assert_shape2(find(&l, "model.language_model.layers.1.ple.key_proj"), 10240, 2560);
    assert_shape2(find(&l, "model.language_model.layers.1.ple.value_proj"), 2560, 2560);
    assert_shape2(find(&l, "model.language_model.layers.9.mlp.experts.0.gate_proj"), 640, 2560);
    const td_module *t = find(&l, "model.language_model.layers.1.ple.ple_embedding.ngram_embedding");
    assert_shape2(t, 2500012, 160);
    assert_int_equal(t->parts, 128);
    assert_null(find(&l, "model.language_model.layers.2.ple.key_proj"));
    assert_null(find(&l, "model.language_model.norm"));
    assert_null(find(&l, "model.language_model.layers.0.input_layernorm"));
    char gu[128], dn[128];
    int64_t s1[3], s2[3];
    td_layout_fused_experts(&c, P, 4, gu, s1, dn, s2);
    assert_string_equal(gu, "model.language_model.layers.4.mlp.experts.gate_up_proj");
    assert_int_equal(s1[0], 512);
    assert_int_equal(s1[1], 1280);
    assert_int_equal(s1[2], 2560);
    assert_int_equal(s2[1], 2560);
    assert_int_equal(s2[2], 640);
    td_layout_free(&l);
}

static void layout_ple_table_matches_release_primes(void **state)
{
    (void)state;
    static td_config c;
    release_flash_next(&c);
    td_ple_dims d;
    td_err err;
    assert_int_equal(td_ple_table_dims(&c, 0, &d, &err), TD_OK);
    /* MODEL_SPEC.md B3.4: head sizes, last offset, padded total, shard rows */
    static const int64_t primes[16] = {20000003, 20000023, 20000033, 20000047, 20000059, 20000063,
                                       20000069, 20000077, 20000081, 20000093, 20000107, 20000147,
                                       20000153, 20000159, 20000161, 20000171};
    assert_int_equal(d.heads, 16);
    assert_int_equal(d.head_dim, 160);
    for (int h = 0; h < 16; h++) assert_int_equal(d.sizes[h], primes[h]);
    assert_int_equal(d.offsets[15], 300001275);
    assert_int_equal(d.rows, 320001536);
    assert_int_equal(d.rows_per_part, 2500012);
    /* a second PLE module continues the prime sequence */
    td_ple_dims d2;
    assert_int_equal(td_ple_table_dims(&c, 1, &d2, &err), TD_OK);
    assert_true(d2.sizes[0] > primes[15]);
    /* shards that do not divide are rejected */
    c.split_ngram_parts = 7;
    assert_int_equal(td_ple_table_dims(&c, 0, &d, &err), TD_ERR_RANGE);
    assert_non_null(strstr(err.msg, "7"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layout_qwen3_next_release_matches_spec),
        cmocka_unit_test(layout_flash_next_release_matches_spec),
        cmocka_unit_test(layout_ple_table_matches_release_primes),
    };
    return cmocka_run_group_tests_name("layout", tests, NULL, NULL);
}
