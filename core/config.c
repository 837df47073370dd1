/* config.c — config.json parsing for qwen3_next and qwen4_exp (see config.h). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CONFIG_MAX_BYTES (16u << 20)

static const char *const family_names[] = {"unknown", "qwen3_next", "qwen4_exp"};
_Static_assert(TD_ARRAY_LEN(family_names) == TD_FAMILY_COUNT, "family_names incomplete");

const char *td_family_name(td_family f)
{
    return (unsigned)f < TD_FAMILY_COUNT ? family_names[f] : "unknown";
}

const char *td_layer_type_name(td_layer_type t)
{
    return t == TD_LAYER_GDN ? "gdn" : "attention";
}

/* Defaults: the released models' values (MODEL_SPEC.md A1 and B1). */
static void set_defaults(td_config *c, td_family fam)
{
    c->head_dim = 256;
    c->partial_rotary_factor = 0.25;
    c->max_position_embeddings = 262144;
    c->rms_norm_eps = 1e-6;
    c->tie_word_embeddings = false;
    c->attention_bias = false;
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    c->bos_token_id = -1;
    c->eos_token_id = -1;
    c->full_attention_interval = 4;
    c->linear_num_key_heads = 16;
    c->linear_key_head_dim = 128;
    c->linear_value_head_dim = 128;
    c->linear_conv_kernel_dim = 4;
    c->num_experts = 512;
    c->num_experts_per_tok = 10;
    c->norm_topk_prob = true;
    c->decoder_sparse_step = 1;
    c->mtp_num_layers = 0;
    c->seed = 1234;
    if (fam == TD_FAMILY_QWEN4_EXP) {
        c->rope_theta = 1e7;
        c->linear_num_value_heads = 48;
        snprintf(c->output_gate_type, sizeof c->output_gate_type, "sigmoid");
        c->moe_intermediate_size = 640;
        c->shared_expert_intermediate_size = 640;
        c->intermediate_size = 0;
        c->hc_count = 4;
        c->hc_lowrank = 320;
        c->indexer_n_heads = 4;
        c->indexer_kv_heads = 1;
        c->indexer_head_dim = 128;
        c->indexer_budget = 2048;
        c->indexer_compress_ratio = 4;
        c->n_ple_layers = 1;
        c->ple_layer_ids[0] = 2;
        c->ple_embed_dim = 0; /* defaults to hidden_size below */
        c->ple_conv_kernel_size = 4;
        c->ngram_size = 3;
        c->heads_per_ngram = 8;
        c->ngram_vocab_size_base = 20000000;
        c->make_ngram_vocab_size_divisible_by = 128;
        c->split_ngram_parts = 128;
    } else {
        c->rope_theta = 5e6;
        c->linear_num_value_heads = 32;
        snprintf(c->output_gate_type, sizeof c->output_gate_type, "silu");
        c->moe_intermediate_size = 512;
        c->shared_expert_intermediate_size = 512;
        c->intermediate_size = 5120;
    }
}

static td_family family_from(const char *model_type, const char *arch)
{
    if (model_type) {
        if (!strcmp(model_type, "qwen3_next")) return TD_FAMILY_QWEN3_NEXT;
        if (!strcmp(model_type, "qwen4_exp") || !strcmp(model_type, "qwen4_exp_text"))
            return TD_FAMILY_QWEN4_EXP;
        return TD_FAMILY_UNKNOWN;
    }
    if (arch) {
        if (!strncmp(arch, "Qwen3Next", 9)) return TD_FAMILY_QWEN3_NEXT;
        if (!strncmp(arch, "Qwen4Exp", 8)) return TD_FAMILY_QWEN4_EXP;
    }
    return TD_FAMILY_UNKNOWN;
}

/* Optional positive integer. */
static td_status opt_pos(const cJSON *o, const char *key, const char *what, int64_t *out,
                         td_err *err)
{
    td_status st = td_json_opt_int(o, key, what, out, err);
    if (st) return st;
    if (*out <= 0)
        return td_err_set(err, TD_ERR_RANGE, "%s: \"%s\" must be positive (got %lld)", what, key,
                          (long long)*out);
    return TD_OK;
}

static td_status req_pos(const cJSON *o, const char *key, const char *what, int64_t *out,
                         td_err *err)
{
    td_status st = td_json_get_int(o, key, what, out, err);
    if (st) return st;
    if (*out <= 0)
        return td_err_set(err, TD_ERR_RANGE, "%s: \"%s\" must be positive (got %lld)", what, key,
                          (long long)*out);
    return TD_OK;
}

static td_status opt_str_copy(const cJSON *o, const char *key, const char *what, char *dst,
                              size_t cap, td_err *err)
{
    const char *s = NULL;
    td_status st = td_json_opt_str(o, key, what, &s, err);
    if (st || !s) return st;
    if (strlen(s) >= cap)
        return td_err_set(err, TD_ERR_RANGE, "%s: \"%s\" is too long", what, key);
    snprintf(dst, cap, "%s", s);
    return TD_OK;
}

/* Token id: integer or list of integers (first is kept). */
static td_status opt_token(const cJSON *o, const char *key, const char *what, int64_t *out,
                           td_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return TD_OK;
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s: \"%s\"", what, key);
    if (cJSON_IsArray(v)) {
        v = v->child;
        if (!v) return TD_OK;
    }
    td_status st = td_json_as_int(v, ctx, out, err);
    if (st) return st;
    if (*out < 0) return td_err_set(err, TD_ERR_RANGE, "%s must be >= 0", ctx);
    return TD_OK;
}

/* Integer array into dst[cap]; *n receives the count. */
static td_status int_array(const cJSON *o, const char *key, const char *what, int64_t *dst,
                           int64_t cap, int64_t *n, td_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return TD_OK;
    if (!cJSON_IsArray(v))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"%s\" must be a list of integers", what, key);
    int64_t k = 0;
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s: \"%s\" entry", what, key);
    for (const cJSON *e = v->child; e; e = e->next) {
        if (k >= cap)
            return td_err_set(err, TD_ERR_RANGE, "%s: \"%s\" has more than %lld entries", what,
                              key, (long long)cap);
        td_status st = td_json_as_int(e, ctx, &dst[k], err);
        if (st) return st;
        k++;
    }
    *n = k;
    return TD_OK;
}

static td_status parse_layer_types(const cJSON *o, const char *what, td_config *c, td_err *err)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        if (c->num_hidden_layers > TD_CONFIG_MAX_LAYERS)
            return td_err_set(err, TD_ERR_RANGE, "%s: num_hidden_layers %lld exceeds %d", what,
                              (long long)c->num_hidden_layers, TD_CONFIG_MAX_LAYERS);
        for (int64_t i = 0; i < c->num_hidden_layers; i++)
            c->layer_types[i] = ((i + 1) % c->full_attention_interval == 0) ? TD_LAYER_ATTENTION
                                                                            : TD_LAYER_GDN;
        return TD_OK;
    }
    if (!cJSON_IsArray(lt))
        return td_err_set(err, TD_ERR_FORMAT, "%s: \"layer_types\" must be a list of strings", what);
    int64_t n = 0;
    for (const cJSON *e = lt->child; e; e = e->next, n++) {
        if (n >= TD_CONFIG_MAX_LAYERS)
            return td_err_set(err, TD_ERR_RANGE, "%s: \"layer_types\" has more than %d entries",
                              what, TD_CONFIG_MAX_LAYERS);
        if (!cJSON_IsString(e) || !e->valuestring)
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"layer_types\"[%lld] must be a string",
                              what, (long long)n);
        const char *s = e->valuestring;
        if (strstr(s, "linear"))
            c->layer_types[n] = TD_LAYER_GDN;
        else if (strstr(s, "attention") || !strcmp(s, "hybrid_indexed"))
            c->layer_types[n] = TD_LAYER_ATTENTION;
        else
            return td_err_set(err, TD_ERR_UNSUPPORTED,
                              "%s: \"layer_types\"[%lld] = \"%s\" is not a known layer type", what,
                              (long long)n, s);
    }
    if (n != c->num_hidden_layers)
        return td_err_set(err, TD_ERR_MISMATCH,
                          "%s: \"layer_types\" has %lld entries but num_hidden_layers is %lld",
                          what, (long long)n, (long long)c->num_hidden_layers);
    c->layer_types_given = true;
    return TD_OK;
}

#define TRY(x) do { td_status st_ = (x); if (st_) return st_; } while (0)

td_status td_config_parse(const cJSON *root, const char *what, td_config *c, td_err *err)
{
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root))
        return td_err_set(err, TD_ERR_FORMAT, "%s: top level must be a JSON object", what);

    const char *top_type = NULL, *arch = NULL;
    TRY(td_json_opt_str(root, "model_type", what, &top_type, err));
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (cJSON_IsArray(archs) && cJSON_IsString(archs->child)) arch = archs->child->valuestring;

    const cJSON *o = root;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    char where[300];
    snprintf(where, sizeof where, "%s", what);
    const char *text_type = NULL;
    if (tc && !cJSON_IsNull(tc)) {
        if (!cJSON_IsObject(tc))
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"text_config\" must be an object", what);
        o = tc;
        c->has_text_config = true;
        snprintf(where, sizeof where, "%s: text_config", what);
        TRY(td_json_opt_str(tc, "model_type", where, &text_type, err));
    }
    td_family fam = family_from(top_type, arch);
    if (fam == TD_FAMILY_UNKNOWN && text_type) fam = family_from(text_type, NULL);
    if (fam == TD_FAMILY_UNKNOWN)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "%s: model_type \"%s\" is not supported (expected qwen3_next or qwen4_exp)",
                          what, top_type ? top_type : (text_type ? text_type : "(missing)"));
    c->family = fam;
    snprintf(c->model_type, sizeof c->model_type, "%s", top_type ? top_type : (text_type ? text_type : ""));
    if (arch) snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    set_defaults(c, fam);

    TRY(req_pos(o, "hidden_size", where, &c->hidden_size, err));
    TRY(req_pos(o, "num_hidden_layers", where, &c->num_hidden_layers, err));
    TRY(req_pos(o, "vocab_size", where, &c->vocab_size, err));
    TRY(req_pos(o, "num_attention_heads", where, &c->num_attention_heads, err));
    TRY(req_pos(o, "num_key_value_heads", where, &c->num_key_value_heads, err));
    if (c->num_hidden_layers > TD_CONFIG_MAX_LAYERS)
        return td_err_set(err, TD_ERR_RANGE, "%s: num_hidden_layers %lld exceeds %d", where,
                          (long long)c->num_hidden_layers, TD_CONFIG_MAX_LAYERS);
    TRY(opt_pos(o, "head_dim", where, &c->head_dim, err));
    TRY(opt_pos(o, "max_position_embeddings", where, &c->max_position_embeddings, err));
    TRY(td_json_opt_num(o, "rms_norm_eps", where, &c->rms_norm_eps, err));
    TRY(td_json_opt_bool(o, "tie_word_embeddings", where, &c->tie_word_embeddings, err));
    if (!cJSON_GetObjectItemCaseSensitive(o, "tie_word_embeddings"))
        TRY(td_json_opt_bool(root, "tie_word_embeddings", what, &c->tie_word_embeddings, err));
    TRY(td_json_opt_bool(o, "attention_bias", where, &c->attention_bias, err));
    TRY(opt_str_copy(o, "hidden_act", where, c->hidden_act, sizeof c->hidden_act, err));
    TRY(opt_token(o, "bos_token_id", where, &c->bos_token_id, err));
    TRY(opt_token(o, "eos_token_id", where, &c->eos_token_id, err));
    if (c->eos_token_id < 0) TRY(opt_token(root, "eos_token_id", what, &c->eos_token_id, err));

    /* RoPE: rope_parameters wins over top-level keys. */
    TRY(td_json_opt_num(o, "rope_theta", where, &c->rope_theta, err));
    TRY(td_json_opt_num(o, "partial_rotary_factor", where, &c->partial_rotary_factor, err));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) rp = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return td_err_set(err, TD_ERR_FORMAT, "%s: \"rope_parameters\" must be an object", where);
        char rw[340];
        snprintf(rw, sizeof rw, "%s: rope_parameters", where);
        TRY(td_json_opt_num(rp, "rope_theta", rw, &c->rope_theta, err));
        TRY(td_json_opt_num(rp, "partial_rotary_factor", rw, &c->partial_rotary_factor, err));
        TRY(opt_str_copy(rp, "rope_type", rw, c->rope_type, sizeof c->rope_type, err));
        if (c->rope_type[0] == '\0')
            TRY(opt_str_copy(rp, "type", rw, c->rope_type, sizeof c->rope_type, err));
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return td_err_set(err, TD_ERR_RANGE, "%s: rope_theta must be positive", where);
    if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
        return td_err_set(err, TD_ERR_RANGE, "%s: partial_rotary_factor must be in (0, 1]", where);
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return td_err_set(err, TD_ERR_RANGE, "%s: rms_norm_eps must be in (0, 1)", where);

    TRY(opt_pos(o, "full_attention_interval", where, &c->full_attention_interval, err));
    TRY(parse_layer_types(o, where, c, err));

    TRY(opt_pos(o, "linear_num_key_heads", where, &c->linear_num_key_heads, err));
    TRY(opt_pos(o, "linear_num_value_heads", where, &c->linear_num_value_heads, err));
    TRY(opt_pos(o, "linear_key_head_dim", where, &c->linear_key_head_dim, err));
    TRY(opt_pos(o, "linear_value_head_dim", where, &c->linear_value_head_dim, err));
    TRY(opt_pos(o, "linear_conv_kernel_dim", where, &c->linear_conv_kernel_dim, err));
    TRY(opt_str_copy(o, "output_gate_type", where, c->output_gate_type, sizeof c->output_gate_type, err));
    if (strcmp(c->output_gate_type, "silu") && strcmp(c->output_gate_type, "sigmoid") &&
        strcmp(c->output_gate_type, "swish"))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: output_gate_type \"%s\" is not supported",
                          where, c->output_gate_type);

    TRY(opt_pos(o, "num_experts", where, &c->num_experts, err));
    TRY(opt_pos(o, "num_experts_per_tok", where, &c->num_experts_per_tok, err));
    TRY(opt_pos(o, "moe_intermediate_size", where, &c->moe_intermediate_size, err));
    TRY(td_json_opt_int(o, "shared_expert_intermediate_size", where,
                        &c->shared_expert_intermediate_size, err));
    if (c->shared_expert_intermediate_size < 0)
        return td_err_set(err, TD_ERR_RANGE, "%s: shared_expert_intermediate_size must be >= 0", where);
    TRY(opt_pos(o, "decoder_sparse_step", where, &c->decoder_sparse_step, err));
    TRY(td_json_opt_int(o, "intermediate_size", where, &c->intermediate_size, err));
    TRY(td_json_opt_bool(o, "norm_topk_prob", where, &c->norm_topk_prob, err));
    TRY(int_array(o, "mlp_only_layers", where, c->mlp_only_layers, TD_CONFIG_MAX_LAYERS,
                  &c->n_mlp_only_layers, err));
    for (int64_t i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_hidden_layers)
            return td_err_set(err, TD_ERR_RANGE, "%s: mlp_only_layers entry %lld out of range", where,
                              (long long)c->mlp_only_layers[i]);
    if (c->n_mlp_only_layers > 0 && c->intermediate_size <= 0)
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: mlp_only_layers needs a positive intermediate_size", where);

    TRY(int_array(o, "tandem_layers_present", where, c->layers_present, TD_CONFIG_MAX_LAYERS,
                  &c->n_layers_present, err));
    if (c->n_layers_present == 0 && o != root)
        TRY(int_array(root, "tandem_layers_present", what, c->layers_present, TD_CONFIG_MAX_LAYERS,
                      &c->n_layers_present, err));
    for (int64_t i = 0; i < c->n_layers_present; i++) {
        int64_t l = c->layers_present[i];
        if (l < 0 || l >= c->num_hidden_layers || (i > 0 && l <= c->layers_present[i - 1]))
            return td_err_set(err, TD_ERR_RANGE,
                              "%s: \"tandem_layers_present\" must list increasing layer ids in 0..%lld (entry %lld is %lld)",
                              where, (long long)c->num_hidden_layers - 1, (long long)i, (long long)l);
    }

    int64_t mtp = -1;
    TRY(td_json_opt_int(o, "num_nextn_predict_layers", where, &mtp, err));
    TRY(td_json_opt_int(o, "mtp_num_hidden_layers", where, &mtp, err));
    c->mtp_num_layers = mtp > 0 ? mtp : 0;

    if (fam == TD_FAMILY_QWEN4_EXP) {
        TRY(opt_pos(o, "hc_count", where, &c->hc_count, err));
        TRY(opt_pos(o, "hc_lowrank", where, &c->hc_lowrank, err));
        TRY(opt_pos(o, "indexer_n_heads", where, &c->indexer_n_heads, err));
        TRY(opt_pos(o, "indexer_kv_heads", where, &c->indexer_kv_heads, err));
        TRY(opt_pos(o, "indexer_head_dim", where, &c->indexer_head_dim, err));
        TRY(opt_pos(o, "indexer_budget", where, &c->indexer_budget, err));
        TRY(opt_pos(o, "indexer_compress_ratio", where, &c->indexer_compress_ratio, err));
        if (cJSON_GetObjectItemCaseSensitive(o, "ple_layer_ids")) c->n_ple_layers = 0;
        TRY(int_array(o, "ple_layer_ids", where, c->ple_layer_ids, TD_CONFIG_MAX_PLE,
                      &c->n_ple_layers, err));
        c->ple_embed_dim = c->hidden_size;
        TRY(opt_pos(o, "ple_embed_dim", where, &c->ple_embed_dim, err));
        TRY(opt_pos(o, "ple_conv_kernel_size", where, &c->ple_conv_kernel_size, err));
        TRY(opt_pos(o, "ngram_size", where, &c->ngram_size, err));
        TRY(opt_pos(o, "heads_per_ngram", where, &c->heads_per_ngram, err));
        TRY(opt_pos(o, "ngram_vocab_size_base", where, &c->ngram_vocab_size_base, err));
        TRY(opt_pos(o, "make_ngram_vocab_size_divisible_by", where,
                    &c->make_ngram_vocab_size_divisible_by, err));
        TRY(opt_pos(o, "split_ngram_parts", where, &c->split_ngram_parts, err));
        TRY(td_json_opt_int(o, "seed", where, &c->seed, err));
        for (int64_t i = 0; i < c->n_ple_layers; i++)
            if (c->ple_layer_ids[i] < 1 || c->ple_layer_ids[i] > c->num_hidden_layers)
                return td_err_set(err, TD_ERR_RANGE,
                                  "%s: ple_layer_ids entry %lld outside 1..%lld (ids are 1-based)",
                                  where, (long long)c->ple_layer_ids[i],
                                  (long long)c->num_hidden_layers);
        if (c->ngram_size < 2)
            return td_err_set(err, TD_ERR_RANGE, "%s: ngram_size must be >= 2", where);
        int64_t heads = (c->ngram_size - 1) * c->heads_per_ngram;
        if (c->n_ple_layers > 0 && c->ple_embed_dim % heads != 0)
            return td_err_set(err, TD_ERR_RANGE,
                              "%s: ple_embed_dim %lld is not divisible by the %lld n-gram heads",
                              where, (long long)c->ple_embed_dim, (long long)heads);
    }

    /* cross-key consistency */
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return td_err_set(err, TD_ERR_MISMATCH,
                          "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                          where, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (c->linear_num_value_heads % c->linear_num_key_heads != 0)
        return td_err_set(err, TD_ERR_MISMATCH,
                          "%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld",
                          where, (long long)c->linear_num_value_heads,
                          (long long)c->linear_num_key_heads);
    if (c->num_experts_per_tok > c->num_experts)
        return td_err_set(err, TD_ERR_MISMATCH,
                          "%s: num_experts_per_tok %lld exceeds num_experts %lld", where,
                          (long long)c->num_experts_per_tok, (long long)c->num_experts);
    int64_t rot = td_config_rotary_dim(c);
    if (rot < 2 || rot % 2 != 0 || rot > c->head_dim)
        return td_err_set(err, TD_ERR_RANGE,
                          "%s: rotary dim %lld (head_dim x partial_rotary_factor) must be even and in 2..head_dim",
                          where, (long long)rot);
    if (c->vocab_size > ((int64_t)1 << 31))
        return td_err_set(err, TD_ERR_RANGE, "%s: vocab_size %lld too large", where,
                          (long long)c->vocab_size);
    return TD_OK;
}

td_status td_config_load(const char *dir, td_config *cfg, td_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return td_err_set(err, TD_ERR_ARG, "%s: path too long", dir);
    cJSON *root = NULL;
    td_status st = td_json_read_file(path, CONFIG_MAX_BYTES, &root, err);
    if (st) return st;
    st = td_config_parse(root, path, cfg, err);
    cJSON_Delete(root);
    return st;
}

int64_t td_config_rotary_dim(const td_config *c)
{
    return (int64_t)((double)c->head_dim * c->partial_rotary_factor);
}

bool td_config_layer_present(const td_config *c, int64_t layer)
{
    if (c->n_layers_present == 0) return layer >= 0 && layer < c->num_hidden_layers;
    for (int64_t i = 0; i < c->n_layers_present; i++)
        if (c->layers_present[i] == layer) return true;
    return false;
}

bool td_config_layer_is_moe(const td_config *c, int64_t layer)
{
    for (int64_t i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer) return false;
    return c->num_experts > 0 && (layer + 1) % c->decoder_sparse_step == 0;
}

bool td_config_layer_has_ple(const td_config *c, int64_t layer)
{
    if (c->family != TD_FAMILY_QWEN4_EXP) return false;
    for (int64_t i = 0; i < c->n_ple_layers; i++)
        if (c->ple_layer_ids[i] == layer + 1) return true;
    return false;
}

int64_t td_config_count_layers(const td_config *c, td_layer_type t)
{
    int64_t n = 0;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) n += c->layer_types[i] == t;
    return n;
}
