/* cmd_gen.c — `tandem gen`: write a synthetic checkpoint in the real format. */
#include "cli.h"
#include "args.h"
#include "gen.h"
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem gen --preset NAME --out DIR [--seed N] [--force] [options]\n"
            "       tandem gen --list\n"
            "\n"
            "Write a synthetic HF checkpoint directory in the exact format of the real releases:\n"
            "config.json, sharded safetensors (+ model.safetensors.index.json) or one\n"
            "model.safetensors, quantization metadata (hf_quant_config.json and/or config.json\n"
            "quantization_config), generation_config.json and tandem_gen.json (provenance: preset,\n"
            "seed, distributions). Weights are heavy-tailed with per-row and per-channel scales;\n"
            "NVFP4 modules are quantized with the reference ModelOpt quantizer, gate/up sharing one\n"
            "global. The same preset, options and seed give the same bytes on every machine,\n"
            "whatever --threads is. The directory is written as DIR.tmp and renamed at the end.\n"
            "\n"
            "presets:\n");
    for (size_t i = 0; i < td_gen_preset_count(); i++) {
        const td_gen_preset_info *p = td_gen_preset_at(i);
        fprintf(f, "  %-22s %s\n", p->name, p->summary);
    }
    fprintf(f,
            "\n"
            "options:\n"
            "  --preset NAME       which checkpoint (see above; --list prints sizes)\n"
            "  --out DIR           output directory (refused if it exists, unless --force)\n"
            "  --seed N            64-bit seed (default 0); recorded in every file\n"
            "  --force             replace DIR if it exists (only once the new one is complete)\n"
            "  --unquantized       BF16 everywhere, no quantization metadata: the exact weights the\n"
            "                      NVFP4 variant quantized (input for `tandem quantize`)\n"
            "  --fused-experts     with --unquantized: routed experts as 3-D experts.gate_up_proj\n"
            "                      [E, 2I, H] and experts.down_proj [E, H, I] (transformers layout)\n"
            "  --experts N         override the number of routed experts (a smaller variant)\n"
            "  --layers LIST       write only these layers (e.g. 0,23,47): the model is made deep\n"
            "                      enough to hold them and config.json records the subset\n"
            "                      (\"tandem_layers_present\"), which inspect and the audits honour\n"
            "  --shard-size BYTES  at most BYTES per shard (suffixes K, M, G; 0 = one file);\n"
            "                      default: the preset's\n"
            "  --threads N         worker threads (default: online CPUs); output is identical\n"
            "  --json              print a JSON summary on stdout\n"
            "  --no-progress       never draw the progress bar (drawn only on a terminal)\n"
            "  --list              list presets with tensor counts and sizes, then exit\n"
            "  -h, --help          this text\n"
            "\n"
            "exit status: 0 written, 2 usage error or the checkpoint could not be written.\n");
}

/* "0,23,47" or "0-3": increasing layer ids below TD_CONFIG_MAX_LAYERS. */
static bool parse_layer_list(const char *s, int64_t *ids, size_t *n)
{
    int64_t *v;
    size_t k;
    if (cli_int_list(s, 0, TD_CONFIG_MAX_LAYERS - 1, &v, &k)) return false;
    bool ok = k <= TD_CONFIG_MAX_LAYERS;
    for (size_t i = 0; ok && i < k; i++) {
        ok = i == 0 || v[i] > v[i - 1];
        ids[i] = v[i];
    }
    free(v);
    if (ok) *n = k;
    return ok;
}


static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = (uint64_t)v;
    return true;
}

static int list_presets(void)
{
    printf("%-22s %8s %8s %7s %12s\n", "preset", "tensors", "nvfp4", "shards", "bytes");
    for (size_t i = 0; i < td_gen_preset_count(); i++) {
        td_gen_opts o;
        td_gen_opts_init(&o);
        o.preset = td_gen_preset_at(i)->name;
        td_gen_plan p;
        td_err err;
        if (td_gen_plan_build(&o, &p, &err)) {
            cli_error("gen", err.msg);
            return 2;
        }
        printf("%-22s %8zu %8lld %7zu %12lld  (%.1f MiB)\n", o.preset, p.n_tensors,
               (long long)p.nvfp4_modules, p.n_shards, (long long)p.total_bytes,
               (double)p.total_bytes / 1048576.0);
        td_gen_plan_free(&p);
    }
    return 0;
}

int cmd_gen(int argc, char **argv)
{
    td_gen_opts o;
    td_gen_opts_init(&o);
    static int64_t layer_ids[TD_CONFIG_MAX_LAYERS];
    const char *out = NULL;
    bool json = false;
    o.progress = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--list")) {
            return list_presets();
        } else if (!strcmp(a, "--preset")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            o.preset = val;
        } else if (!strcmp(a, "--out")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            out = val;
        } else if (!strcmp(a, "--seed")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            if (!parse_u64(val, &o.seed)) {
                fprintf(stderr, "tandem gen: --seed '%s' is not an unsigned 64-bit integer\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--experts")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            uint64_t e;
            if (!parse_u64(val, &e) || e == 0 || e > 4096) {
                fprintf(stderr, "tandem gen: --experts '%s' must be in 1..4096\n", val);
                return 2;
            }
            o.num_experts = (int64_t)e;
        } else if (!strcmp(a, "--layers")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            if (!parse_layer_list(val, layer_ids, &o.n_layer_ids)) {
                fprintf(stderr, "tandem gen: --layers '%s' must be increasing ids such as 0,23,47\n", val);
                return 2;
            }
            o.layer_ids = layer_ids;
        } else if (!strcmp(a, "--shard-size")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            if (cli_size(val, &o.shard_bytes)) {
                fprintf(stderr, "tandem gen: --shard-size '%s' is not a size (e.g. 512M)\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            if (!(val = cli_value(argc, argv, &i, "gen"))) return 2;
            uint64_t t;
            if (!parse_u64(val, &t) || t == 0 || t > 64) {
                fprintf(stderr, "tandem gen: --threads '%s' must be in 1..64\n", val);
                return 2;
            }
            o.threads = (int)t;
        } else if (!strcmp(a, "--force")) {
            o.force = true;
        } else if (!strcmp(a, "--unquantized")) {
            o.unquantized = true;
        } else if (!strcmp(a, "--fused-experts")) {
            o.fused_experts = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-progress")) {
            o.progress = false;
        } else {
            fprintf(stderr, "tandem gen: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o.preset) {
        fprintf(stderr, "tandem gen: --preset NAME is required (see --help or --list)\n");
        return 2;
    }
    if (!out) {
        fprintf(stderr, "tandem gen: --out DIR is required (see --help)\n");
        return 2;
    }
    td_gen_plan plan;
    td_err err;
    td_err_clear(&err);
    if (td_gen_plan_build(&o, &plan, &err)) {
        cli_error("gen", err.msg);
        return 2;
    }
    td_gen_result res;
    memset(&res, 0, sizeof res);
    td_status st = td_gen_write(&plan, &o, out, &res, &err);
    if (st) {
        cli_error("gen", err.msg);
        td_gen_plan_free(&plan);
        return 2;
    }
    if (json) {
        printf("{\"preset\": \"%s\", \"seed\": \"%" PRIu64 "\", \"out\": \"", plan.preset, plan.seed);
        for (const char *s = out; *s; s++) {
            if (*s == '"' || *s == '\\') putchar('\\');
            if ((unsigned char)*s >= 0x20) putchar(*s);
        }
        printf("\", \"tensors\": %lld, \"bytes\": %lld, \"shards\": %zu, \"files\": %lld, "
               "\"nvfp4_modules\": %lld, \"threads\": %d, \"seconds\": %.3f}\n",
               (long long)res.tensors, (long long)res.bytes, plan.n_shards, (long long)res.files,
               (long long)plan.nvfp4_modules, res.threads, res.seconds);
    } else {
        printf("wrote %s: preset %s, seed %" PRIu64 ", %lld tensors, %.2f MiB in %zu shard(s), "
               "%lld NVFP4 modules, %.2f s on %d thread(s)\n",
               out, plan.preset, plan.seed, (long long)res.tensors,
               (double)res.bytes / 1048576.0, plan.n_shards, (long long)plan.nvfp4_modules,
               res.seconds, res.threads);
    }
    td_gen_plan_free(&plan);
    return 0;
}
