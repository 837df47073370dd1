/* fuzz_config.c — libFuzzer target for the config.json and quantization-metadata parsers.
 *
 * The input is parsed as JSON (core/json.h rules), then as a model config, then its
 * "quantization_config" (if any) as quantization metadata, and the whole object as an
 * hf_quant_config.json. A parsed config is also expanded into its tensor inventory when the
 * model is small enough to do so quickly. Any crash, leak or sanitizer report is a bug.
 */
#include "config.h"
#include "layout.h"
#include "quant.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *root = NULL;
    td_err err;
    if (td_json_parse((const char *)data, size, 1 << 20, "fuzz.json", &root, &err) != TD_OK)
        return 0;
    td_config *cfg = malloc(sizeof *cfg);
    if (cfg && td_config_parse(root, "config.json", cfg, &err) == TD_OK) {
        int64_t experts = cfg->num_experts * cfg->num_hidden_layers;
        if (experts <= 4096 && cfg->ngram_vocab_size_base <= 100000 && cfg->n_ple_layers <= 4) {
            td_layout l;
            if (td_layout_build(cfg, "model.", &l, &err) == TD_OK) td_layout_free(&l);
        }
    }
    free(cfg);
    td_quant q;
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (qc && td_quant_parse_config(qc, "config.json", &q, &err) == TD_OK) {
        td_quant_tensors t;
        (void)td_quant_resolve(&q, "model.layers.0.mlp.experts.0.gate_proj", true, &t, &err);
        (void)td_quant_resolve(&q, "model.language_model.layers.1.ple.ple_embedding.ngram_embedding", false, &t, &err);
        td_quant_free(&q);
    }
    if (td_quant_parse_hf(root, "hf_quant_config.json", &q, &err) == TD_OK) {
        td_quant_tensors t;
        (void)td_quant_resolve(&q, "model.layers.3.self_attn.o_proj", true, &t, &err);
        td_quant_free(&q);
    }
    cJSON_Delete(root);
    return 0;
}
