/* bench_gen.c — time `tandem gen` on the production-shape MoE layer and report what the
 * generated block scales look like.
 *
 *   build/release/bench/bench_gen [--preset NAME] [--threads LIST] [--dir DIR] [--keep]
 *
 * For each thread count in LIST (default "1,2") it generates the preset (default
 * flash-next-moe-layer, ~1.5 GiB) into DIR (default build/bench/gen), prints wall time and
 * throughput, checks that every run produced identical files, and prints a census of the
 * routed experts' E4M3 block-scale codes and global scales (SEED_AUDITS.md §2.7 reports codes
 * 73..126 and 470 distinct globals for the real checkpoint). The output is removed unless
 * --keep is given.
 */
#include "formats.h"
#include "gen.h"
#include "safetensors.h"
#include "sha256.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Concatenated SHA-256 of the safetensors files, as one digest. */
static void dir_digest(const char *dir, char hex[TD_SHA256_HEX_LEN])
{
    static char names[64][256];
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < 64)
        if (e->d_name[0] != '.') snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_name);
    td_sha256_ctx ctx;
    td_sha256_init(&ctx);
    for (int i = 0; i < n; i++) {
        char p[1400], h[TD_SHA256_HEX_LEN];
        if (snprintf(p, sizeof p, "%s/%s", dir, names[i]) >= (int)sizeof p) continue;
        td_err err;
        if (td_sha256_file(p, h, &err) == TD_OK) td_sha256_update(&ctx, h, 64);
        td_sha256_update(&ctx, names[i], strlen(names[i]));
    }
    uint8_t dg[TD_SHA256_DIGEST_LEN];
    td_sha256_final(&ctx, dg);
    td_sha256_hex(dg, hex);
}

static void census(const char *dir)
{
    td_st_set *s;
    td_err err;
    if (td_st_set_open(dir, &s, &err)) {
        fprintf(stderr, "bench_gen: %s\n", err.msg);
        return;
    }
    int64_t hist[256] = {0}, blocks = 0;
    size_t n = td_st_set_count(s), ng = 0;
    float *g = malloc(n * sizeof *g);
    for (size_t i = 0; g && i < n; i++) {
        const char *name = td_st_set_name(s, i);
        if (!strstr(name, ".mlp.experts.")) continue;
        size_t l = strlen(name);
        td_tensor t;
        if (l > 13 && !strcmp(name + l - 13, ".weight_scale") && !td_st_set_tensor(s, name, &t, &err)) {
            const uint8_t *p = t.data;
            int64_t k = td_tensor_numel(&t);
            for (int64_t j = 0; j < k; j++) hist[p[j]]++;
            blocks += k;
        } else if (l > 15 && !strcmp(name + l - 15, ".weight_scale_2") && !td_st_set_tensor(s, name, &t, &err)) {
            memcpy(&g[ng++], t.data, 4);
        }
    }
    td_st_set_close(s);
    if (!blocks) {
        free(g);
        return;
    }
    int lo = -1, hi = -1, p001 = -1, p1 = -1, p50 = -1;
    int64_t acc = 0, in_range = 0;
    for (int c = 0; c < 256; c++) {
        if (hist[c] && lo < 0) lo = c;
        if (hist[c]) hi = c;
        acc += hist[c];
        if (p001 < 0 && acc * 10000 >= blocks) p001 = c;
        if (p1 < 0 && acc * 100 >= blocks) p1 = c;
        if (p50 < 0 && acc * 2 >= blocks) p50 = c;
        if (c >= 73 && c <= 126) in_range += hist[c];
    }
    qsort(g, ng, sizeof *g, cmp_f);
    size_t distinct = 0;
    for (size_t i = 0; i < ng; i++) distinct += i == 0 || g[i] != g[i - 1];
    printf("\nrouted-expert block scales: %lld blocks\n", (long long)blocks);
    printf("  code  min %3d (%g)  0.01%% %3d (%g)  1%% %3d (%g)  median %3d (%g)  max %3d (%g)\n", lo,
           (double)td_e4m3_to_f32((uint8_t)lo), p001, (double)td_e4m3_to_f32((uint8_t)p001), p1,
           (double)td_e4m3_to_f32((uint8_t)p1), p50, (double)td_e4m3_to_f32((uint8_t)p50), hi,
           (double)td_e4m3_to_f32((uint8_t)hi));
    printf("  in the real checkpoint's range 73..126: %.4f%%\n", 100.0 * (double)in_range / (double)blocks);
    printf("  globals: %zu tensors, %zu distinct, %g .. %g\n", ng, distinct, ng ? (double)g[0] : 0.0,
           ng ? (double)g[ng - 1] : 0.0);
    free(g);
}

int main(int argc, char **argv)
{
    const char *preset = "flash-next-moe-layer", *dir = "build/bench/gen", *threads = "1,2";
    bool keep = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--keep")) keep = true;
        else {
            fprintf(stderr, "usage: bench_gen [--preset NAME] [--threads 1,2] [--dir DIR] [--keep]\n");
            return 2;
        }
    }
    printf("tandem gen --preset %s (seed 1)\n\n", preset);
    printf("%8s %10s %8s %10s %12s  %s\n", "threads", "tensors", "GiB", "seconds", "MB/s", "digest");
    char first[TD_SHA256_HEX_LEN] = "";
    int rc = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", threads);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        td_gen_opts o;
        td_gen_opts_init(&o);
        o.preset = preset;
        o.seed = 1;
        o.threads = atoi(t);
        o.force = true;
        td_gen_result r;
        td_err err;
        if (td_gen(&o, dir, &r, &err)) {
            fprintf(stderr, "bench_gen: %s\n", err.msg);
            return 1;
        }
        char hex[TD_SHA256_HEX_LEN];
        dir_digest(dir, hex);
        printf("%8d %10lld %8.3f %10.2f %12.1f  %.16s%s\n", r.threads, (long long)r.tensors,
               (double)r.bytes / (1 << 30), r.seconds, (double)r.bytes / 1e6 / r.seconds, hex,
               first[0] && strcmp(first, hex) ? "  (DIFFERS)" : "");
        if (first[0] && strcmp(first, hex)) rc = 1;
        if (!first[0]) snprintf(first, sizeof first, "%s", hex);
    }
    census(dir);
    if (!keep) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "bench_gen: could not remove %s\n", dir);
    }
    return rc;
}
