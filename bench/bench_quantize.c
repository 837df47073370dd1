/* bench_quantize.c — throughput of the NVFP4 checkpoint quantizer on one core.
 *
 *   build/release/bench/bench_quantize [--experts N] [--dir DIR] [--keep]
 *
 * 1. Kernel: one production-shape expert projection [640, 2560] held in memory as BF16,
 *    widened to float32 and quantized with td_nvfp4_quantize (both conventions): MB/s of BF16
 *    input, no file I/O.
 * 2. End to end: `tandem gen --preset flash-next-moe-layer --unquantized --experts N`
 *    (default 64: ~0.8 GB of BF16, of which the routed experts are 0.6 GB) is written to DIR
 *    (default build/bench/quantize), then td_quantize() converts it in each format: wall
 *    time, MB/s over all input tensor bytes, and over the bytes of the modules it quantized.
 *    The input is in the page cache (just written); the output is fsynced, as always.
 * td_quantize() is single-threaded, so every number is one core.
 */
#include "formats.h"
#include "gen.h"
#include "nvfp4.h"
#include "quantize.h"
#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void kernel(void)
{
    const int64_t rows = 640, k = 2560, n = rows * k;
    uint16_t *bf = malloc((size_t)n * 2);
    float *w = malloc((size_t)n * 4);
    uint8_t *packed = malloc((size_t)n / 2), *scales = malloc((size_t)n / 16);
    if (!bf || !w || !packed || !scales) return;
    td_rng rng;
    td_rng_seed(&rng, 1);
    for (int64_t i = 0; i < n; i++) bf[i] = td_f32_to_bf16(td_rng_normal_f32(&rng) * 0.02f);
    printf("kernel: [640, 2560] BF16 -> NVFP4 in memory (widen + td_nvfp4_quantize)\n");
    printf("%20s %10s %12s\n", "format", "ms/tensor", "MB/s BF16");
    for (int c = 0; c < TD_NVFP4_CONV_COUNT; c++) {
        int reps = 20;
        double t0 = now();
        for (int r = 0; r < reps; r++) {
            for (int64_t i = 0; i < n; i++) w[i] = td_bf16_to_f32(bf[i]);
            float g;
            td_err err;
            if (td_nvfp4_quantize(w, rows, k, (td_nvfp4_conv)c, NAN, packed, scales, &g, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return;
            }
        }
        double dt = (now() - t0) / reps;
        printf("%20s %10.2f %12.1f\n", td_nvfp4_conv_name((td_nvfp4_conv)c), dt * 1e3,
               (double)n * 2.0 / 1e6 / dt);
    }
    free(bf);
    free(w);
    free(packed);
    free(scales);
}

int main(int argc, char **argv)
{
    int64_t experts = 64;
    const char *dir = "build/bench/quantize";
    bool keep = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--experts") && i + 1 < argc) experts = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--keep")) keep = true;
        else {
            fprintf(stderr, "usage: bench_quantize [--experts N] [--dir DIR] [--keep]\n");
            return 2;
        }
    }
    kernel();

    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/bf16", dir);
    snprintf(out, sizeof out, "%s/nvfp4", dir);
    td_gen_opts g;
    td_gen_opts_init(&g);
    g.preset = "flash-next-moe-layer";
    g.unquantized = true;
    g.num_experts = experts;
    g.seed = 1;
    g.force = true;
    td_gen_result gr;
    td_err err;
    if (td_gen(&g, in, &gr, &err)) {
        fprintf(stderr, "bench_quantize: %s\n", err.msg);
        return 1;
    }
    printf("\nend to end: flash-next-moe-layer --unquantized --experts %lld: %.1f MB BF16 in %lld tensors\n",
           (long long)experts, (double)gr.bytes / 1e6, (long long)gr.tensors);
    printf("%20s %9s %9s %10s %14s %16s\n", "format", "modules", "out MB", "seconds", "MB/s (all in)",
           "MB/s (quantized)");
    int rc = 0;
    for (int c = 0; c < TD_NVFP4_CONV_COUNT; c++) {
        td_quantize_opts o;
        td_quantize_opts_init(&o);
        o.in_dir = in;
        o.out_dir = out;
        o.conv = (td_nvfp4_conv)c;
        o.force = true;
        td_quantize_result r;
        if (td_quantize(&o, &r, &err)) {
            fprintf(stderr, "bench_quantize: %s\n", err.msg);
            return 1;
        }
        double all = (double)r.bytes_in / 1e6 / r.seconds, q = (double)r.bytes_quantized_in / 1e6 / r.seconds;
        printf("%20s %9lld %9.1f %10.2f %14.1f %16.1f\n", td_nvfp4_conv_name((td_nvfp4_conv)c),
               (long long)r.modules_quantized, (double)r.bytes_out / 1e6, r.seconds, all, q);
        if (all < 100.0) rc = 1;
    }
    if (!keep) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "bench_quantize: could not remove %s\n", dir);
    }
    if (rc) printf("\nbelow the 100 MB/s target\n");
    return rc;
}
