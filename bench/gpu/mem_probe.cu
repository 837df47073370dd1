/* mem_probe.cu — how fast this GPU reads a few tens of megabytes when nothing is computed:
 * the memory side's own floor for the decode kernel's access pattern (docs/perf.md).
 *
 * usage: mem_probe [--iters 200] [--copies 8] [--json]
 *                  [--cfg NAME:TOTAL_B:SEG_B:CHUNK_B:GRID:WARPS:STAGES[:WORK] ...]
 *                  [--chain NAME:GRID:WARPS:STAGES:CHUNK_B:PHASES ...]
 *
 * Each configuration reads TOTAL_B bytes, cut into segments of SEG_B contiguous bytes (a
 * segment is what one decode-kernel warp reads for one row tile), segment s going to warp
 * (s mod W) of the grid, warps numbered block-fastest (warp w of block b is W-index
 * w * GRID + b), so consecutive segments land on different SMs. A warp streams its segments
 * in chunks of CHUNK_B bytes through a ring of STAGES shared-memory buffers filled by the
 * bulk-copy engine (cp.async.bulk completing on one mbarrier per buffer; the decode kernel's
 * mechanism), touching one word per lane of each chunk and, with WORK > 0, issuing WORK
 * floating-point instructions per lane on it (eight independent chains) before the buffer is
 * refilled — a stand-in for the decode kernel's arithmetic on a chunk (about 440 warp
 * instructions per 3.2 KB chunk), to see how a ring overlaps it with the transfers. STAGES = 0 reads
 * the same bytes with 16-byte loads by every thread instead (grid-stride, four loads in
 * flight per thread), GRID x WARPS warps.
 *
 * Every configuration runs on COPIES separate buffers in rotation, so the 50 MB L2 cannot
 * serve a call from the previous one; each call is one graph of one launch, bracketed by
 * events (as bench/gpu/moe_decode times a block), the median over ITERS calls is reported,
 * with the GB/s and the fraction of the copy bandwidth measured here (cudaMemcpy device to
 * device of 1 GiB, read + write bytes over time, median of 10). "empty" is a graph of one
 * kernel that does nothing: the fixed cost of a call.
 *
 * A chain (--chain) is one launch that reads up to four phases one after another, the
 * skeleton of a whole MoE block in one launch (router, then the routed W13, then W2):
 * PHASES is TOTAL_B@SEG_B[*WORK] items (WORK: the stand-in arithmetic per chunk of that phase, as
 * in --cfg) joined by ',' (no barrier: the next phase's bytes streamed
 * on), '/' (a grid-wide barrier, the next phase's copies issued only after it: its
 * addresses depend on what came before, as the routed experts' on the routing) or '+' (a
 * grid-wide barrier with the next phase's first STAGES chunks issued before it: its bytes
 * are known, only its arithmetic waits, as W2's on W13's). Each phase reads its own bytes
 * (the phases lie one after another in the buffer) in chunks of CHUNK_B through the same
 * rings, segments dealt out as above. The grid must fit the GPU at once (checked), and the
 * barrier is an integer counter and generation in global memory (no floating-point atomics).
 *
 * Then where the hardware puts the blocks of a grid that fits the GPU at once (the decode
 * kernel's persistent grids): for grids of 100 to 396 blocks of 256 threads with 51 KB of
 * shared memory (three fit per SM), the number of SMs that received a block and the most
 * blocks one SM received (each block records its %smid and stays until all have started).
 */
#include <cuda_runtime.h>

#include "common.cuh"
#include "gpu_timing.cuh"

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#define MAX_WARPS 32
#define MAX_STAGES 16
#define MAX_PHASES 4

struct cfg {
    std::string name;
    long long total, seg, chunk;
    int grid, warps, stages, work;
    std::string phases = ""; /* a chain's PHASES as given; empty for a single read */
};

/* How a chain's phase starts: streamed on, after a barrier, or after a barrier with its first
 * chunks issued before it. */
enum { SYNC_NONE = 0, SYNC_DEP = 1, SYNC_EARLY = 2 };

struct chain_dev {
    long long off[MAX_PHASES], total[MAX_PHASES], seg[MAX_PHASES];
    int nseg[MAX_PHASES], cps[MAX_PHASES]; /* segments of the phase, chunks per segment (set by check_chain) */
    int work[MAX_PHASES];                  /* the stand-in arithmetic per chunk of the phase (0: none) */
    int sync[MAX_PHASES];                  /* sync[0] unused */
    int nph;
};

extern __shared__ uint4 ring_sh[];

/* This warp's ring: STAGES buffers of CHUNK bytes in the dynamic shared memory, their
 * mbarriers (bars[warp][0..STAGES)) initialized. */
__device__ uint8_t *warp_ring(uint64_t (*bars)[MAX_STAGES], int stages, int chunk)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane < stages) cu_mbar_init(&bars[warp][lane]);
    cu_mbar_init_fence();
    __syncwarp();
    return reinterpret_cast<uint8_t *>(ring_sh) + (size_t)warp * stages * chunk;
}

/* WORK floating-point instructions per lane on a chunk's word (eight independent chains), folded
 * into acc: the stand-in for the decode kernel's arithmetic on a chunk. */
__device__ __forceinline__ unsigned stand_in_work(unsigned word, int work)
{
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = __uint_as_float((word & 0x007fffffu) | 0x3f800000u) + (float)j;
    for (int i = 0; i < work; i += 8)
#pragma unroll
        for (int j = 0; j < 8; j++) f[j] = __fmaf_rn(f[j], 0.999f, 0.001f);
    unsigned acc = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) acc += __float_as_uint(f[j]);
    return acc;
}

__global__ void k_bulk(const uint8_t *base, long long total, long long seg, int chunk, int stages, int work, unsigned *sink)
{
    __shared__ uint64_t bars[MAX_WARPS][MAX_STAGES];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    uint8_t *ring = warp_ring(bars, stages, chunk);
    const long long nseg = total / seg, tw = (long long)nw * gridDim.x;
    const int cps = (int)(seg / chunk);
    long long s_iss = (long long)warp * gridDim.x + blockIdx.x; /* issue cursor: segment, chunk */
    int c_iss = 0;
    long long todo = 0; /* chunks of this warp */
    for (long long s = s_iss; s < nseg; s += tw) todo += cps;
    auto issue = [&](int slot) {
        if (lane == 0) {
            const uint32_t bar = cu_smem_addr(&bars[warp][slot]), dst = cu_smem_addr(ring + (size_t)slot * chunk);
            cu_mbar_expect(bar, (uint32_t)chunk);
            cu_bulk_copy(dst, base + s_iss * seg + (long long)c_iss * chunk, (uint32_t)chunk, bar);
        }
        if (++c_iss == cps) {
            c_iss = 0;
            s_iss += tw;
        }
    };
    long long issued = 0;
    for (int st = 0; st < stages && issued < todo; st++, issued++) issue(st);
    unsigned acc = 0, phases = 0;
    int slot = 0;
    for (long long k = 0; k < todo; k++) {
        cu_mbar_wait(cu_smem_addr(&bars[warp][slot]), (phases >> slot) & 1u);
        phases ^= 1u << slot;
        const unsigned word = reinterpret_cast<const unsigned *>(ring + (size_t)slot * chunk)[lane];
        acc ^= word;
        if (work > 0) acc += stand_in_work(word, work);
        __syncwarp();
        if (issued < todo) {
            issue(slot);
            issued++;
        }
        slot = slot + 1 == stages ? 0 : slot + 1;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the reads and the arithmetic */
}

__global__ void k_load(const uint4 *base, long long n16, unsigned *sink)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * stride < n16 ? __ldcs(base + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

/* A grid-wide barrier of co-resident blocks: bar[0] counts arrivals, bar[1] is the generation.
 * The last block to arrive resets the count, then moves the generation on; the others wait for
 * it to move. Both return to the same state after every barrier, so graph replays reuse them.
 * A wait of more than about a second traps (a launch error, not a hung GPU). */
__device__ void grid_barrier(unsigned *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            for (long long spin = 0; *gen == g; spin++) {
                if (spin > (1LL << 25)) __trap();
                __nanosleep(32);
            }
        }
        __threadfence();
    }
    __syncthreads();
}

/* The last phase (exclusive of later dependent ones) whose copies may be issued once phase p's
 * may: phases joined by ',' or '+' follow on. */
__device__ __forceinline__ int chain_reach(const chain_dev &cd, int p)
{
    while (p + 1 < cd.nph && cd.sync[p + 1] != SYNC_DEP) p++;
    return p;
}

/* The chain's table is copied into shared memory first (indexed by the phase at run time, it
 * would otherwise sit in a local-memory copy of the parameter), and every per-chunk step is
 * 32-bit integer adds: the segment and chunk counts per phase come from the host, the ring slot
 * is a counter, no division runs per chunk (the decode kernel's own bookkeeping is as cheap). */
__global__ void k_chain(const uint8_t *base, chain_dev cd_param, int chunk, int stages, unsigned *bar, unsigned *sink)
{
    __shared__ uint64_t bars[MAX_WARPS][MAX_STAGES];
    __shared__ chain_dev cd;
    if (threadIdx.x == 0) cd = cd_param;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    uint8_t *ring = warp_ring(bars, stages, chunk);
    __syncthreads();
    const int tw = nw * (int)gridDim.x, first = warp * (int)gridDim.x + (int)blockIdx.x;
    /* the issue cursor: phase, segment, chunk of this warp's next copy, and its ring slot */
    int ip = 0, is = first, ic = 0, islot = 0;
    auto settle = [&]() { /* past the phases in which this warp has no segment left */
        while (ip < cd.nph && is >= cd.nseg[ip]) {
            ip++;
            is = first;
            ic = 0;
        }
    };
    settle();
    int allowed = chain_reach(cd, 0), in_flight = 0;
    auto top_up = [&]() {
        while (in_flight < stages && ip < cd.nph && ip <= allowed) {
            if (lane == 0) {
                const uint32_t b = cu_smem_addr(&bars[warp][islot]), dst = cu_smem_addr(ring + (size_t)islot * chunk);
                cu_mbar_expect(b, (uint32_t)chunk);
                cu_bulk_copy(dst, base + cd.off[ip] + (long long)is * cd.seg[ip] + (long long)ic * chunk, (uint32_t)chunk, b);
            }
            in_flight++;
            if (++islot == stages) islot = 0;
            if (++ic == cd.cps[ip]) {
                ic = 0;
                is += tw;
                settle();
            }
        }
    };
    top_up();
    unsigned acc = 0, parity = 0;
    int slot = 0;
    for (int p = 0; p < cd.nph; p++) {
        if (p > 0 && cd.sync[p] != SYNC_NONE) {
            grid_barrier(bar);
            if (cd.sync[p] == SYNC_DEP) {
                allowed = chain_reach(cd, p);
                top_up();
            }
        }
        const int mine = first < cd.nseg[p] ? (cd.nseg[p] - first + tw - 1) / tw * cd.cps[p] : 0;
        for (int k = 0; k < mine; k++) {
            cu_mbar_wait(cu_smem_addr(&bars[warp][slot]), (parity >> slot) & 1u);
            parity ^= 1u << slot;
            const unsigned word = reinterpret_cast<const unsigned *>(ring + (size_t)slot * chunk)[lane];
            acc ^= word;
            if (cd.work[p] > 0) acc += stand_in_work(word, cd.work[p]);
            __syncwarp();
            if (++slot == stages) slot = 0;
            in_flight--;
            top_up();
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

/* Each block records its SM and waits (bounded) until every block of the grid has started, so
 * that no block's SM is reused by a later block. */
__global__ void k_where(int *smid, unsigned *arrived, int n)
{
    if (threadIdx.x == 0) {
        int id;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
        smid[blockIdx.x] = id;
        __threadfence();
        atomicAdd(arrived, 1u);
        for (long long spin = 0; spin < 2000000 && *(volatile unsigned *)arrived < (unsigned)n; spin++)
            __nanosleep(100);
    }
    __syncthreads();
}

__global__ void k_empty(unsigned *sink)
{
    if (sink == nullptr) __trap();
}

static bool parse_cfg(const char *s, cfg &c)
{
    char name[64];
    long long tot, seg, ch;
    int g, w, st, wk = 0, used = -1;
    /* seven fields, or eight with WORK; nothing may follow */
    if (sscanf(s, "%63[^:]:%lld:%lld:%lld:%d:%d:%d%n", name, &tot, &seg, &ch, &g, &w, &st, &used) != 7 || used < 0)
        return false;
    if (s[used] == ':') {
        const char *r = s + used + 1;
        int more = -1;
        if (sscanf(r, "%d%n", &wk, &more) != 1 || more < 0 || r[more] != '\0') return false;
    } else if (s[used] != '\0') {
        return false;
    }
    c = cfg{name, tot, seg, ch, g, w, st, wk};
    return true;
}

/* NAME:GRID:WARPS:STAGES:CHUNK_B:PHASES, PHASES = TOTAL_B@SEG_B[*WORK] joined by ',', '/' or '+'
 * (1 to MAX_PHASES of them); fills c (total: the phases' sum) and cd (offsets, kinds). */
static bool parse_chain(const char *s, cfg &c, chain_dev &cd)
{
    char name[64];
    long long ch;
    int g, w, st, used = -1;
    if (sscanf(s, "%63[^:]:%d:%d:%d:%lld:%n", name, &g, &w, &st, &ch, &used) != 5 || used < 0) return false;
    const char *r = s + used;
    memset(&cd, 0, sizeof cd);
    long long off = 0;
    for (;;) {
        long long tot, seg;
        int n = -1, wk = 0;
        if (cd.nph == MAX_PHASES || sscanf(r, "%lld@%lld%n", &tot, &seg, &n) != 2 || n < 0) return false;
        if (tot <= 0 || seg <= 0 || tot > (1LL << 36) || seg > tot) return false;
        r += n;
        if (*r == '*') { /* the phase's stand-in WORK per chunk */
            n = -1;
            if (sscanf(r + 1, "%d%n", &wk, &n) != 1 || n < 0 || wk < 0 || wk > 100000) return false;
            r += 1 + n;
        }
        cd.work[cd.nph] = wk;
        cd.off[cd.nph] = off;
        cd.total[cd.nph] = tot;
        cd.seg[cd.nph] = seg;
        off += tot;
        cd.nph++;
        if (*r == '\0') break;
        const int kind = *r == ',' ? SYNC_NONE : *r == '/' ? SYNC_DEP : *r == '+' ? SYNC_EARLY : -1;
        if (kind < 0) return false;
        if (cd.nph == MAX_PHASES) return false;
        cd.sync[cd.nph] = kind;
        r++;
    }
    c = cfg{name, off, 0, ch, g, w, st, 0, std::string(s + used)};
    return true;
}

static const char *check_chain(const cfg &c, chain_dev &cd, int max_smem)
{
    if (c.grid < 1 || c.warps < 1 || c.warps > MAX_WARPS || c.stages < 1 || c.stages > MAX_STAGES)
        return "GRID, WARPS (1..32) or STAGES (1..16) out of range";
    if (c.chunk < 16 || c.chunk % 16 || c.chunk > (1 << 20)) return "CHUNK must be a multiple of 16 (at most 1 MiB)";
    for (int p = 0; p < cd.nph; p++) {
        if (cd.seg[p] % c.chunk || cd.total[p] % cd.seg[p])
            return "every phase's SEG must be a multiple of CHUNK and divide its TOTAL";
        if (cd.total[p] / cd.seg[p] > (1LL << 30) || cd.seg[p] / c.chunk > (1LL << 30))
            return "a phase of more than 2^30 segments or chunks per segment";
        cd.nseg[p] = (int)(cd.total[p] / cd.seg[p]);
        cd.cps[p] = (int)(cd.seg[p] / c.chunk);
    }
    if ((long long)c.grid * c.warps > (1LL << 30)) return "GRID x WARPS above 2^30";
    if ((long long)c.warps * c.stages * c.chunk > max_smem) return "WARPS x STAGES x CHUNK exceeds shared memory";
    return nullptr;
}

static const char *check_cfg(const cfg &c, int max_smem)
{
    if (c.work < 0 || c.work > 100000) return "WORK out of range (0..100000)";
    if (c.total <= 0 || c.grid < 1 || c.warps < 1 || c.warps > MAX_WARPS || c.stages < 0 || c.stages > MAX_STAGES)
        return "TOTAL, GRID, WARPS (1..32) or STAGES (0..16) out of range";
    if (c.stages == 0) return (c.total % 16) ? "TOTAL must be a multiple of 16" : nullptr;
    if (c.chunk < 16 || c.chunk % 16 || c.seg % c.chunk || c.total % c.seg)
        return "CHUNK must be a multiple of 16 dividing SEG, SEG must divide TOTAL";
    if ((long long)c.warps * c.stages * c.chunk > max_smem) return "WARPS x STAGES x CHUNK exceeds shared memory";
    return nullptr;
}

int main(int argc, char **argv)
{
    int iters = 200, copies = 8, json = 0;
    std::vector<cfg> cfgs, chains;
    std::vector<chain_dev> chain_devs;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--copies") && i + 1 < argc) copies = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--cfg") && i + 1 < argc) {
            cfg c;
            if (!parse_cfg(argv[++i], c)) {
                fprintf(stderr, "mem_probe: --cfg %s: expected NAME:TOTAL_B:SEG_B:CHUNK_B:GRID:WARPS:STAGES[:WORK]\n", argv[i]);
                return 2;
            }
            cfgs.push_back(c);
        } else if (!strcmp(argv[i], "--chain") && i + 1 < argc) {
            cfg c;
            chain_dev cd;
            if (!parse_chain(argv[++i], c, cd)) {
                fprintf(stderr,
                        "mem_probe: --chain %s: expected NAME:GRID:WARPS:STAGES:CHUNK_B:PHASES, PHASES of 1 to %d "
                        "TOTAL_B@SEG_B[*WORK] joined by ',', '/' or '+'\n",
                        argv[i], MAX_PHASES);
                return 2;
            }
            chains.push_back(c);
            chain_devs.push_back(cd);
        } else {
            fprintf(stderr, "usage: mem_probe [--iters N] [--copies N] [--json] [--cfg NAME:TOTAL_B:SEG_B:CHUNK_B:GRID:"
                            "WARPS:STAGES[:WORK] ...] [--chain NAME:GRID:WARPS:STAGES:CHUNK_B:PHASES ...]\n");
            return 2;
        }
    }
    if (iters < 1 || copies < 1) {
        fprintf(stderr, "mem_probe: --iters and --copies must be at least 1\n");
        return 2;
    }
    if (cfgs.empty() && chains.empty()) {
        /* the decode kernel's W13 at M = 1 (10 experts x 80 row tiles of 25.6 KB, chunks of
         * 3.2 KB, 100 blocks of 8 warps, 2 stages) and variations; W2 at M = 1 (1,600 tiles
         * of 6.4 KB, 200 blocks); both at once; larger reads; plain loads */
        const long long w13 = 800 * 25600LL, w2 = 1600 * 6400LL;
        const cfg d[] = {
            {"w13_m1_as_now", w13, 25600, 3200, 100, 8, 2, 0},   {"w13_m1_g132", w13, 25600, 3200, 132, 8, 2, 0},
            {"w13_m1_g132_s4", w13, 25600, 3200, 132, 8, 4, 0},  {"w13_m1_g132_s8", w13, 25600, 3200, 132, 8, 8, 0},
            {"w13_m1_half_g132w16", w13, 12800, 3200, 132, 16, 2, 0}, {"w13_m1_half_g132w16_s4", w13, 12800, 3200, 132, 16, 4, 0},
            {"w13_m1_c6k_s4", w13, 25600, 6400, 132, 8, 4, 0},   {"w13_m1_ld", w13, 0, 0, 264, 16, 0, 0},
            {"w2_m1_as_now", w2, 6400, 3200, 200, 8, 2, 0},      {"w2_m1_g132w16", w2, 6400, 3200, 132, 16, 2, 0},
            {"w2_m1_ld", w2, 0, 0, 264, 16, 0, 0},               {"both_m1_g132w16_s4", w13 + w2, 6400, 3200, 132, 16, 4, 0},
            {"m4_w13_as_now", 3040 * 25600LL, 25600, 3200, 380, 8, 2, 0}, {"m4_w13_g132w16_s4", 3040 * 25600LL, 25600, 3200, 132, 16, 4, 0},
            {"m4_w2_as_now", 6080 * 6400LL, 6400, 3200, 396, 8, 2, 0}, {"m4_both_g396w8", 3040 * 25600LL + 6080 * 6400LL, 6400, 3200, 396, 8, 2, 0},
            /* with a stand-in for the arithmetic (WORK 440 per chunk of 3.2 KB) */
            {"m1_w13_now_work", w13, 25600, 3200, 100, 8, 2, 440}, {"m1_w13_g132_s4_work", w13, 25600, 3200, 132, 8, 4, 440},
            {"m4_w13_now_work", 3040 * 25600LL, 25600, 3200, 380, 8, 2, 440},
            {"m4_w13_s3_g264_work", 3040 * 25600LL, 25600, 3200, 264, 8, 3, 440},
            {"m4_w13_s4_g132w16_work", 3040 * 25600LL, 25600, 3200, 132, 16, 4, 440},
            {"m4_w13_c1600_s4_work", 3040 * 25600LL, 25600, 1600, 380, 8, 4, 220},
            {"m4_w13_c6400_s2_g264_work", 3040 * 25600LL, 25600, 6400, 264, 8, 2, 880},
            {"m4_w13_now_work220", 3040 * 25600LL, 25600, 3200, 380, 8, 2, 220},
            {"m16_w13_g396w8", 12000 * 25600LL, 25600, 3200, 396, 8, 2, 0}, {"big_ld", 12000 * 25600LL, 0, 0, 264, 16, 0, 0},
        };
        cfgs.assign(d, d + sizeof d / sizeof d[0]);
        /* one launch for the MoE block's reads at M = 1 and 4 (132 blocks of 16 warps, rings of
         * 4 chunks of 3.2 KB): W13 then W2 streamed on, behind a barrier, behind a barrier with
         * W2's first chunks early; then the router's 2.6 MB (820 segments of 3.2 KB) before
         * them behind a dependent barrier (the routing). Row tiles of W13 (25.6 KB) leave most of
         * the 2,112 warps without a W13 segment at M = 1 (800 segments): the same chains with W13
         * dealt in quarter row tiles of 6.4 KB (a split of K over four warps, as W2's), and at M = 4
         * on the decode kernel's 396 blocks of 8 warps with rings of 2; and every byte of the
         * block at decode sizes (the _block chains): the router, the dependent barrier, the routed
         * W13 with the shared expert's W13 (6.55 MB of BF16) streamed after it, then W2 with the
         * shared W2 (3.28 MB) behind a barrier with its first chunks early */
        const char *dc[] = {
            "chain_m1_w13,w2:132:16:4:3200:20480000@25600,10240000@6400",
            "chain_m1_w13/w2:132:16:4:3200:20480000@25600/10240000@6400",
            "chain_m1_w13+w2:132:16:4:3200:20480000@25600+10240000@6400",
            "chain_m1_r/w13+w2:132:16:4:3200:2624000@3200/20480000@25600+10240000@6400",
            "chain_m4_w13+w2:132:16:4:3200:77824000@25600+38912000@6400",
            "chain_m4_r/w13+w2:132:16:4:3200:2624000@3200/77824000@25600+38912000@6400",
            "chain_m1_w13q,w2:132:16:4:3200:20480000@6400,10240000@6400",
            "chain_m1_w13q+w2:132:16:4:3200:20480000@6400+10240000@6400",
            "chain_m1_r/w13q+w2:132:16:4:3200:2624000@3200/20480000@6400+10240000@6400",
            "chain_m4_r/w13q+w2:132:16:4:3200:2624000@3200/77824000@6400+38912000@6400",
            "chain_m4_r/w13q+w2_g396:396:8:2:3200:2624000@3200/77824000@6400+38912000@6400",
            "chain_m1_block:132:16:4:3200:2624000@3200/20480000@6400,6553600@3200+13516800@6400",
            "chain_m4_block:132:16:4:3200:2624000@3200/77824000@6400,6553600@3200+42188800@6400",
            /* the same with the stand-in arithmetic (440 per 3.2 KB chunk) on the routed W13 and on
             * W2, the router's and the shared W13's chunks without it; and the routed W13 and W2
             * in the single read's dealing (6.4 KB segments, no barrier) with it, their bound */
            "chain_m1_block_work:132:16:4:3200:2624000@3200/20480000@6400*440,6553600@3200+13516800@6400*440",
            "chain_m4_block_work:132:16:4:3200:2624000@3200/77824000@6400*440,6553600@3200+42188800@6400*440",
            "chain_m4_w13q,w2:132:16:4:3200:77824000@6400,38912000@6400",
            "chain_m4_w13q,w2_work:132:16:4:3200:77824000@6400*440,38912000@6400*440",
            /* every byte of the block at M = 2, 8 and 16 (19, 75 and 140 distinct experts, as in
             * the block bench's route sets; 2,048,000 bytes of W13 and 1,024,000 of W2 each), with
             * nothing computed and with the stand-in arithmetic */
            "chain_m2_block:132:16:4:3200:2624000@3200/38912000@6400,6553600@3200+22732800@6400",
            "chain_m2_block_work:132:16:4:3200:2624000@3200/38912000@6400*440,6553600@3200+22732800@6400*440",
            "chain_m8_block:132:16:4:3200:2624000@3200/153600000@6400,6553600@3200+80076800@6400",
            "chain_m8_block_work:132:16:4:3200:2624000@3200/153600000@6400*440,6553600@3200+80076800@6400*440",
            "chain_m16_block:132:16:4:3200:2624000@3200/286720000@6400,6553600@3200+146636800@6400",
            "chain_m16_block_work:132:16:4:3200:2624000@3200/286720000@6400*440,6553600@3200+146636800@6400*440",
        };
        for (const char *t : dc) {
            cfg c;
            chain_dev cd;
            if (!parse_chain(t, c, cd)) {
                fprintf(stderr, "mem_probe: default chain %s does not parse\n", t);
                return 1;
            }
            chains.push_back(c);
            chain_devs.push_back(cd);
        }
    }
    int dev = 0, max_smem = 0;
    BENCH_CK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    BENCH_CK(cudaGetDeviceProperties(&prop, dev));
    BENCH_CK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    /* each kernel's rings get what its static shared memory (barriers; the chain's table) leaves */
    cudaFuncAttributes fa_bulk, fa_chain;
    BENCH_CK(cudaFuncGetAttributes(&fa_bulk, k_bulk));
    BENCH_CK(cudaFuncGetAttributes(&fa_chain, k_chain));
    const int max_chain = max_smem - (int)fa_chain.sharedSizeBytes;
    max_smem -= (int)fa_bulk.sharedSizeBytes;
    long long most = 0;
    for (auto &c : cfgs) {
        const char *why = check_cfg(c, max_smem);
        if (why) {
            fprintf(stderr, "mem_probe: --cfg %s: %s\n", c.name.c_str(), why);
            return 2;
        }
        most = std::max(most, c.total);
    }
    BENCH_CK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    BENCH_CK(cudaFuncSetAttribute(k_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, max_chain));
    for (size_t i = 0; i < chains.size(); i++) {
        const cfg &c = chains[i];
        const char *why = check_chain(c, chain_devs[i], max_chain);
        int per_sm = 0;
        if (!why) {
            BENCH_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_chain, c.warps * 32,
                                                                   (size_t)c.warps * c.stages * c.chunk));
            if ((long long)c.grid > (long long)per_sm * prop.multiProcessorCount)
                why = "GRID does not fit the GPU at once (its barriers would never open)";
        }
        if (why) {
            fprintf(stderr, "mem_probe: --chain %s: %s\n", c.name.c_str(), why);
            return 2;
        }
        most = std::max(most, c.total);
    }
    cudaStream_t s;
    BENCH_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const double bw = bench_copy_bandwidth(s);
    std::vector<uint8_t *> buf((size_t)copies);
    for (auto &b : buf) {
        BENCH_CK(cudaMalloc(&b, (size_t)most));
        BENCH_CK(cudaMemsetAsync(b, 0, (size_t)most, s));
    }
    unsigned *sink, *gbar;
    BENCH_CK(cudaMalloc(&sink, 16));
    BENCH_CK(cudaMalloc(&gbar, 2 * sizeof(unsigned)));
    BENCH_CK(cudaMemsetAsync(gbar, 0, 2 * sizeof(unsigned), s));
    BENCH_CK(cudaStreamSynchronize(s));

    struct res {
        cfg c;
        double us;
    };
    std::vector<res> out;
    cfg empty{"empty", 0, 0, 0, 1, 1, 0, 0};
    std::vector<cfg> all(1, empty);
    all.insert(all.end(), cfgs.begin(), cfgs.end());
    const size_t first_chain = all.size();
    all.insert(all.end(), chains.begin(), chains.end());
    for (size_t ci = 0; ci < all.size(); ci++) {
        const cfg &c = all[ci];
        std::vector<cudaGraphExec_t> g;
        for (int i = 0; i < copies; i++) {
            cudaGraph_t graph;
            BENCH_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            if (ci >= first_chain)
                k_chain<<<c.grid, c.warps * 32, (size_t)c.warps * c.stages * c.chunk, s>>>(
                    buf[(size_t)i], chain_devs[ci - first_chain], (int)c.chunk, c.stages, gbar, sink);
            else if (c.total == 0)
                k_empty<<<1, 32, 0, s>>>(sink);
            else if (c.stages == 0)
                k_load<<<c.grid, c.warps * 32, 0, s>>>(reinterpret_cast<const uint4 *>(buf[(size_t)i]), c.total / 16, sink);
            else
                k_bulk<<<c.grid, c.warps * 32, (size_t)c.warps * c.stages * c.chunk, s>>>(buf[(size_t)i], c.total, c.seg,
                                                                                           (int)c.chunk, c.stages, c.work, sink);
            BENCH_CK(cudaGetLastError());
            BENCH_CK(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t ex;
            BENCH_CK(cudaGraphInstantiate(&ex, graph, 0));
            BENCH_CK(cudaGraphDestroy(graph));
            g.push_back(ex);
        }
        out.push_back(res{c, bench_time_graphs(g, iters, s)});
        for (auto e : g) BENCH_CK(cudaGraphExecDestroy(e));
    }
    if (json) {
        printf("{\"gpu\": \"%s\", \"copy_bw_GBps\": %.1f, \"rows\": [", prop.name, bw * 1e-9);
        for (size_t i = 0; i < out.size(); i++) {
            const res &r = out[i];
            printf("%s{\"name\": \"%s\", \"bytes\": %lld, \"seg\": %lld, \"chunk\": %lld, \"grid\": %d, \"warps\": %d, "
                   "\"stages\": %d, \"work\": %d, \"phases\": \"%s\", \"us\": %.3f}",
                   i ? ", " : "", r.c.name.c_str(), r.c.total, r.c.seg, r.c.chunk, r.c.grid, r.c.warps, r.c.stages, r.c.work,
                   r.c.phases.c_str(), r.us);
        }
        printf("]}\n");
    } else {
        printf("gpu: %s, copy bandwidth %.1f GB/s (read + write), %d buffers in rotation, median of %d calls\n",
               prop.name, bw * 1e-9, copies, iters);
        printf("%-26s %10s %8s %7s %5s %5s %6s %5s %9s %8s %8s\n", "config", "MB", "seg_B", "chunk_B", "grid", "warps",
               "stages", "work", "us", "GB/s", "%copy");
        for (auto &r : out) {
            const double gbs = r.c.total ? (double)r.c.total / (r.us * 1e-6) * 1e-9 : 0.0;
            printf("%-26s %10.2f %8lld %7lld %5d %5d %6d %5d %9.2f %8.1f %7.1f%%\n", r.c.name.c_str(), r.c.total * 1e-6,
                   r.c.seg, r.c.chunk, r.c.grid, r.c.warps, r.c.stages, r.c.work, r.us, gbs, 100.0 * gbs * 1e9 / bw);
        }
        for (auto &r : out)
            if (!r.c.phases.empty()) printf("  %s: %s\n", r.c.name.c_str(), r.c.phases.c_str());
    }
    /* block placement of persistent-sized grids */
    {
        const int grids[] = {100, 132, 200, 264, 300, 396};
        int *smid;
        unsigned *arrived;
        BENCH_CK(cudaMalloc(&smid, 4096 * sizeof(int)));
        BENCH_CK(cudaMalloc(&arrived, sizeof(unsigned)));
        BENCH_CK(cudaFuncSetAttribute(k_where, cudaFuncAttributeMaxDynamicSharedMemorySize, 51 * 1024));
        if (!json) printf("\nplacement (256 threads, 51 KB shared memory per block):\n%6s %8s %14s\n", "grid", "SMs_used",
                          "max_blocks/SM");
        for (int gi = 0; gi < (int)(sizeof grids / sizeof grids[0]); gi++) {
            const int n = grids[gi];
            BENCH_CK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), s));
            k_where<<<n, 256, 51 * 1024, s>>>(smid, arrived, n);
            BENCH_CK(cudaGetLastError());
            std::vector<int> h((size_t)n);
            BENCH_CK(cudaMemcpyAsync(h.data(), smid, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, s));
            BENCH_CK(cudaStreamSynchronize(s));
            std::vector<int> per(1024, 0);
            int used = 0, most_b = 0;
            for (int v : h)
                if (v >= 0 && v < 1024 && per[(size_t)v]++ == 0) used++;
            for (int v : per) most_b = std::max(most_b, v);
            if (json) printf("{\"placement_grid\": %d, \"sms_used\": %d, \"max_blocks_per_sm\": %d}\n", n, used, most_b);
            else printf("%6d %8d %14d\n", n, used, most_b);
        }
        BENCH_CK(cudaFree(smid));
        BENCH_CK(cudaFree(arrived));
    }
    for (auto &b : buf) BENCH_CK(cudaFree(b));
    BENCH_CK(cudaFree(sink));
    BENCH_CK(cudaFree(gbar));
    BENCH_CK(cudaStreamDestroy(s));
    return 0;
}
