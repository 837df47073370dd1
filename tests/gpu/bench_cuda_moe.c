/* bench_cuda_moe.c — wall time of the CUDA engine's MoE block (a first measurement, not the
 * issue's bench/moe_decode: no graph replay, no weight-copy rotation, no cuBLAS baseline).
 *
 * usage: bench_cuda_moe DIR [VARIANT] [LAYER]
 * For M = 1, 2, 4, 8, 16, 784: seeded activations (scale 0.1), the checkpoint's router,
 * 5 warm-up calls, then 50 timed td_engine_run_block calls; prints the median and minimum
 * wall time per call (host clock around the whole call: input/output copies, every launch
 * and the final synchronization included) and the routed-expert bytes one call touches
 * (distinct experts of the call x this rank's W13 + W2 bytes incl. FP16 scales) over the
 * median time.
 */
#include "engine.h"
#include "audit/engines.h"
#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cuda_moe DIR [VARIANT] [LAYER]\n");
        return 2;
    }
    const char *vt = argc > 2 ? argv[2] : "cuda";
    const int64_t L = argc > 3 ? atoll(argv[3]) : 0;
    td_variant v;
    td_err err;
    td_engine *e = NULL;
    if (td_variant_parse(vt, &v, &err) || td_engine_load(argv[1], &v, &e, &err)) {
        fprintf(stderr, "bench_cuda_moe: %s\n", err.msg);
        return 1;
    }
    const td_engine_model *m = td_engine_model_info(e);
    const int64_t H = m->hidden, k = m->top_k, T = v.tp_size;
    const double ebytes = 3.0 * (double)H * (double)(m->moe_inter / T) * (0.5 + 2.0 / 16.0);
    static const int64_t Ms[] = {1, 2, 4, 8, 16, 784};
    const int64_t Mmax = 784;
    float *x = malloc((size_t)(Mmax * H) * sizeof *x), *y = malloc((size_t)(Mmax * H) * sizeof *y);
    td_taps *taps = NULL;
    static const char *const pat[] = {"L*.moe.topk"};
    if (!x || !y || td_taps_new(pat, 1, &taps, &err)) return 1;
    td_rng rng;
    td_rng_seed(&rng, 7);
    for (int64_t i = 0; i < Mmax * H; i++) x[i] = 0.1f * td_rng_normal_f32(&rng);
    printf("model %s, variant %s, layer %lld: hidden %lld, %lld experts top-%lld, inter %lld\n", argv[1], vt,
           (long long)L, (long long)H, (long long)m->num_experts, (long long)k, (long long)m->moe_inter);
    printf("%6s %12s %12s %10s %14s\n", "M", "median_us", "min_us", "experts", "routed_GB/s");
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int64_t M = Ms[mi];
        td_block_call c = {L, TD_BLOCK_MOE, M, x, y, NULL, NULL};
        double t[50];
        td_engine_set_taps(e, taps);
        if (td_engine_run_block(e, &c, &err)) {
            fprintf(stderr, "bench_cuda_moe: %s\n", err.msg);
            return 1;
        }
        char name[32];
        snprintf(name, sizeof name, "L%lld.moe.topk", (long long)L);
        const td_tap *tp = td_taps_find(taps, name);
        int64_t distinct = 0;
        if (tp) {
            char *seen = calloc((size_t)m->num_experts, 1);
            const int32_t *ids = tp->data;
            for (int64_t s = 0; s < tp->numel; s++)
                if (!seen[ids[s]]) seen[ids[s]] = 1, distinct++;
            free(seen);
        }
        td_engine_set_taps(e, NULL);
        for (int w = 0; w < 5; w++)
            if (td_engine_run_block(e, &c, &err)) return 1;
        for (int r = 0; r < 50; r++) {
            const double t0 = now();
            if (td_engine_run_block(e, &c, &err)) return 1;
            t[r] = now() - t0;
        }
        qsort(t, 50, sizeof t[0], cmp_d);
        const double med = 0.5 * (t[24] + t[25]);
        printf("%6lld %12.1f %12.1f %10lld %14.1f\n", (long long)M, med * 1e6, t[0] * 1e6, (long long)distinct,
               distinct ? (double)distinct * ebytes / med * 1e-9 : 0.0);
    }
    td_taps_free(taps);
    td_engine_free(e);
    free(x);
    free(y);
    return 0;
}
