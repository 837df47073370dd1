/* cmd_quantize.c — `tandem quantize`: BF16/F16/F32 checkpoint → NVFP4. */
#include "cli.h"
#include "args.h"
#include "quantize.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GLOBS 256

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem quantize --in DIR --out DIR [--format modelopt|ct] [--only GLOB]...\n"
            "                       [--exclude GLOB]... [--force] [options]\n"
            "\n"
            "Quantize an unquantized (BF16/F16/F32) qwen3_next or qwen4_exp checkpoint to NVFP4 with\n"
            "the reference algorithm: global scale from the tensor amax, one E4M3 scale per block of\n"
            "16 inputs, values divided by the rounded scale and rounded to E2M1 (nearest, ties to\n"
            "even). gate_proj/up_proj siblings share one amax; all-zero blocks follow the format's\n"
            "convention. Everything not selected is copied byte for byte, and so are the other files\n"
            "(tokenizer, generation_config.json). Fused 3-D experts (experts.gate_up_proj /\n"
            "experts.down_proj) are split into the per-expert tensors of the real NVFP4 releases.\n"
            "Weight-only: the metadata says W4A16_NVFP4 (ModelOpt) or NVFP4A16 (compressed-tensors).\n"
            "The output is written as DIR.tmp and renamed at the end; memory is bounded by the\n"
            "largest quantized module, not the model.\n"
            "\n"
            "options:\n"
            "  --in DIR                 input checkpoint directory\n"
            "  --out DIR                output directory (refused if it exists, unless --force)\n"
            "  --format modelopt|ct     ModelOpt (weight, weight_scale, weight_scale_2 = amax/2688;\n"
            "                           hf_quant_config.json) or compressed-tensors (weight_packed,\n"
            "                           weight_scale, weight_global_scale = 2688/amax); default modelopt\n"
            "  --only GLOB              quantize only modules matching GLOB (repeatable; replaces the\n"
            "                           default selection)\n"
            "  --exclude GLOB           never quantize modules matching GLOB (repeatable)\n"
            "  --shard-size BYTES       reshard by size (suffixes K, M, G); default: the input's shards\n"
            "  --force                  replace DIR if it exists (once the new one is complete)\n"
            "  --dequant-manifest FILE  write, per NVFP4 tensor, the SHA-256 of its float32\n"
            "                           dequantization (for scripts/quantize_crosscheck.py)\n"
            "  --json                   print a JSON summary on stdout\n"
            "  --no-progress            never draw the progress bar (drawn only on a terminal)\n"
            "  -h, --help               this text\n"
            "\n"
            "Globs are fnmatch(3) patterns over module names (tensor names without \".weight\"), e.g.\n"
            "'*.mlp.experts.*' or 'model.layers.3.self_attn.o_proj'. Only linear modules of the\n"
            "model's inventory are candidates; a glob that matches none is an error. Default\n"
            "selection (NVIDIA's NVFP4 recipe):");
    for (size_t i = 0; i < td_quantize_default_glob_count(); i++)
        fprintf(f, " '%s'", td_quantize_default_glob(i));
    fprintf(f,
            ".\n"
            "\n"
            "exit status: 0 written, 2 usage error, unreadable or unsupported input, or a write\n"
            "             failure (the output directory is then left untouched).\n");
}


int cmd_quantize(int argc, char **argv)
{
    td_quantize_opts o;
    td_quantize_opts_init(&o);
    static const char *only[MAX_GLOBS], *excl[MAX_GLOBS];
    size_t n_only = 0, n_excl = 0;
    bool json = false;
    o.progress = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--in")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            o.in_dir = val;
        } else if (!strcmp(a, "--out")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            o.out_dir = val;
        } else if (!strcmp(a, "--format")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            td_err err;
            if (td_quantize_format_from_name(val, &o.conv, &err)) {
                cli_error("quantize", err.msg);
                return 2;
            }
        } else if (!strcmp(a, "--only") || !strcmp(a, "--exclude")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            bool is_only = a[2] == 'o';
            if ((is_only ? n_only : n_excl) >= MAX_GLOBS) {
                fprintf(stderr, "tandem quantize: at most %d %s globs\n", MAX_GLOBS, a);
                return 2;
            }
            if (is_only) only[n_only++] = val;
            else excl[n_excl++] = val;
        } else if (!strcmp(a, "--shard-size")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            if (cli_size(val, &o.shard_bytes) || o.shard_bytes == 0) {
                fprintf(stderr, "tandem quantize: --shard-size '%s' is not a size (e.g. 2G)\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--dequant-manifest")) {
            if (!(val = cli_value(argc, argv, &i, "quantize"))) return 2;
            o.dequant_manifest = val;
        } else if (!strcmp(a, "--force")) {
            o.force = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-progress")) {
            o.progress = false;
        } else {
            fprintf(stderr, "tandem quantize: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o.in_dir || !o.out_dir) {
        fprintf(stderr, "tandem quantize: --in DIR and --out DIR are required (see --help)\n");
        return 2;
    }
    o.only = only;
    o.n_only = n_only;
    o.exclude = excl;
    o.n_exclude = n_excl;
    td_quantize_result r;
    td_err err;
    td_err_clear(&err);
    if (td_quantize(&o, &r, &err)) {
        cli_error("quantize", err.msg);
        return 2;
    }
    double mbs = r.seconds > 0 ? (double)r.bytes_in / 1e6 / r.seconds : 0.0;
    if (json) {
        printf("{\"format\": \"%s\", \"modules_quantized\": %lld, \"modules_split\": %lld, "
               "\"tensors_in\": %lld, \"tensors_out\": %lld, \"tensors_copied\": %lld, "
               "\"bytes_in\": %lld, \"bytes_out\": %lld, \"bytes_quantized_in\": %lld, "
               "\"files_copied\": %lld, \"shards\": %lld, \"exclusions\": %zu, "
               "\"seconds\": %.3f, \"mb_per_s\": %.1f}\n",
               o.conv == TD_NVFP4_CT ? "compressed-tensors" : "modelopt",
               (long long)r.modules_quantized, (long long)r.modules_split, (long long)r.tensors_in,
               (long long)r.tensors_out, (long long)r.tensors_copied, (long long)r.bytes_in,
               (long long)r.bytes_out, (long long)r.bytes_quantized_in, (long long)r.files_copied,
               (long long)r.shards_out, r.n_exclusions, r.seconds, mbs);
    } else {
        printf("wrote %s (%s): %lld modules quantized%s, %lld tensors copied, %.2f MiB -> %.2f MiB "
               "in %lld shard(s), %zu exclusion pattern(s), %.2f s (%.0f MB/s)\n",
               o.out_dir, o.conv == TD_NVFP4_CT ? "compressed-tensors" : "modelopt",
               (long long)r.modules_quantized, r.modules_split ? " (split from fused experts)" : "",
               (long long)r.tensors_copied, (double)r.bytes_in / 1048576.0,
               (double)r.bytes_out / 1048576.0, (long long)r.shards_out, r.n_exclusions, r.seconds, mbs);
    }
    return 0;
}
