/* moe_mma.cu — the tensor-core path of the MoE block: packers, grouping, and the grouped
 * NVFP4 / BF16 projection kernel (see moe_mma.cuh for the layout and the numerics).
 *
 * Layering: host packers (cu_pack_*), device helpers, kernels (k_*), launchers (cu_mm*).
 */
#include "moe_mma.cuh"
#include "dec_split.h"
#include "group_pack.h"
#include "nvfp4_layout.h"
#include "wgmma.cuh"
#include "combine.cuh"
#include "timeline.cuh"

#include <stdio.h>
#include <string.h>

extern "C" {
#include "formats.h"
#include "nvfp4.h"
}

/* Steps (32 columns) whose loads one warp issues before it computes on them. */
#define MM_PREFETCH 10
/* Most warps one block splits K over. */
#define MM_MAX_WARPS 8
#define GROUP_THREADS 1024
/* Most slots of a call grouped by k_group_small (one thread per slot; its O(slots^2) walks
 * were measured faster than k_group at 80 slots and slower at 160: docs/perf.md). */
#define GROUP_SMALL 128

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* ==== host packers =========================================================================== */

void cu_qmat_geometry(int kind, int64_t rows, int64_t cols, int64_t *R, int64_t *K, int64_t *wbytes,
                      int64_t *sbytes_prepared, int64_t *sbytes_raw)
{
    *R = round_up(rows > 0 ? rows : 1, 16);
    *K = round_up(cols > 0 ? cols : 1, 32);
    *wbytes = kind == CU_W_NVFP4 ? *R * *K / 2 : *R * *K * 2;
    *sbytes_prepared = kind == CU_W_NVFP4 ? *R * *K / 16 * 2 : 0;
    *sbytes_raw = kind == CU_W_NVFP4 ? *R * *K / 16 : 0;
}

/* Fragment positions of nibble j (see the header): row offset and column offset (+ 2q). */
static const int frag_row[8] = {0, 8, 0, 8, 0, 8, 0, 8};
static const int frag_col[8] = {0, 0, 8, 8, 1, 1, 9, 9};

/* FP16 effective scales of all 256 codes for one (global, conv). */
static void eff_table(float global, int conv, uint16_t lut[256])
{
    for (int code = 0; code < 256; code++)
        lut[code] = td_f32_to_f16(td_nvfp4_block_factor((uint8_t)code, global, conv ? TD_NVFP4_CT : TD_NVFP4_MODELOPT));
}

/* Bit positions of fragment element j's code in its 32-bit word (see the header): register
 * J = j % 4, the low half for j < 4, the high half (+16) for j >= 4; magnitude bits at
 * mag_at[P][J] .. mag_at[P][J] + 2, the sign at sign_at[J]; P = 0 the FP16 placement, 1 the
 * BF16 one. */
static const int mag_at[2][4] = {{9, 6, 3, 0}, {6, 3, 9, 0}};
static const int sign_at[4] = {15, 12, 14, 13};

static uint32_t place(uint32_t code, int j, int P)
{
    const int J = j & 3, hi = j >= 4 ? 16 : 0;
    return (code & 7u) << (mag_at[P][J] + hi) | (code >> 3 & 1u) << (sign_at[J] + hi);
}

static uint32_t nib(const uint8_t *row, int64_t c, int64_t cols)
{
    return (row && c < cols) ? (row[c / 2] >> (4 * (c & 1))) & 15u : 0u;
}

void cu_pack_nvfp4(const uint8_t *const *row_w, const uint8_t *const *row_s, const float *row_global, int conv,
                   int raw, int bf16, int64_t rows, int64_t cols, uint8_t *w, uint8_t *s)
{
    const int P = bf16 ? 1 : 0;
    int64_t R, K, wb, sp, sr;
    cu_qmat_geometry(CU_W_NVFP4, rows, cols, &R, &K, &wb, &sp, &sr);
    const int64_t KS = K / 32;
    uint16_t lut[256];
    float lut_g = 0.0f;
    bool have_lut = false;
    for (int64_t rt = 0; rt < R / 16; rt++)
        for (int64_t ks = 0; ks < KS; ks++) {
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, q = lane & 3;
                const int64_t r_lo = rt * 16 + g, r_hi = r_lo + 8;
                const uint8_t *wl = r_lo < rows ? row_w[r_lo] : NULL;
                const uint8_t *wh = r_hi < rows ? row_w[r_hi] : NULL;
                for (int b = 0; b < 2; b++) {
                    const int64_t kb = 2 * ks + b;
                    uint32_t word;
                    if ((kb + 1) * 16 <= cols && wl && wh) {
                        /* bytes holding columns (2q, 2q+1) and (2q+8, 2q+9) of both rows */
                        const uint32_t b0 = wl[kb * 8 + q], b1 = wh[kb * 8 + q];
                        const uint32_t b2 = wl[kb * 8 + q + 4], b3 = wh[kb * 8 + q + 4];
                        word = place(b0 & 15u, 0, P) | place(b1 & 15u, 1, P) | place(b2 & 15u, 2, P) |
                               place(b3 & 15u, 3, P) | place(b0 >> 4, 4, P) | place(b1 >> 4, 5, P) |
                               place(b2 >> 4, 6, P) | place(b3 >> 4, 7, P);
                    } else {
                        word = 0;
                        for (int j = 0; j < 8; j++) {
                            const uint8_t *row = frag_row[j] ? wh : wl;
                            word |= place(nib(row, kb * 16 + 2 * q + frag_col[j], cols), j, P);
                        }
                    }
                    uint8_t *dst = w + (((rt * KS + ks) * 32 + lane) * 2 + b) * 4;
                    for (int i = 0; i < 4; i++) dst[i] = (uint8_t)(word >> (8 * i));
                }
            }
            for (int r16 = 0; r16 < 16; r16++) {
                const int64_t r = rt * 16 + r16;
                const bool row_ok = r < rows && row_s[r];
                if (row_ok && !raw && (!have_lut || memcmp(&lut_g, &row_global[r], sizeof lut_g) != 0)) {
                    eff_table(row_global[r], conv, lut);
                    lut_g = row_global[r];
                    have_lut = true;
                }
                for (int b = 0; b < 2; b++) {
                    const int64_t kb = 2 * ks + b;
                    /* [rt][ks][g = r16 % 8][r16 / 8][b] */
                    const int64_t idx = (((rt * KS + ks) * 8 + (r16 & 7)) * 2 + (r16 >> 3)) * 2 + b;
                    const bool have = row_ok && kb * 16 < cols;
                    const uint8_t code = have ? row_s[r][kb] : 0;
                    if (raw) {
                        s[idx] = code;
                    } else {
                        const uint16_t h = have ? lut[code] : 0;
                        s[2 * idx] = (uint8_t)(h & 0xff);
                        s[2 * idx + 1] = (uint8_t)(h >> 8);
                    }
                }
            }
        }
}

void cu_pack_bf16(const uint16_t *const *row_w, int64_t rows, int64_t cols, uint8_t *w)
{
    int64_t R, K, wb, sp, sr;
    cu_qmat_geometry(CU_W_BF16, rows, cols, &R, &K, &wb, &sp, &sr);
    const int64_t KS = K / 32;
    /* register j of a block: (row offset, column offset) of its low element; high = col + 1 */
    static const int reg_row[4] = {0, 8, 0, 8};
    static const int reg_col[4] = {0, 0, 8, 8};
    for (int64_t rt = 0; rt < R / 16; rt++)
        for (int64_t ks = 0; ks < KS; ks++)
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, q = lane & 3;
                for (int b = 0; b < 2; b++) {
                    uint8_t *dst = w + (((rt * KS + ks) * 32 + lane) * 2 + b) * 16;
                    for (int j = 0; j < 4; j++)
                        for (int e = 0; e < 2; e++) {
                            const int64_t r = rt * 16 + g + reg_row[j];
                            const int64_t c = (2 * ks + b) * 16 + 2 * q + reg_col[j] + e;
                            const uint16_t v = (r < rows && c < cols && row_w[r]) ? row_w[r][c] : 0;
                            dst[4 * j + 2 * e] = (uint8_t)(v & 0xff);
                            dst[4 * j + 2 * e + 1] = (uint8_t)(v >> 8);
                        }
                }
            }
}

/* ==== device helpers ========================================================================= */

/* A-fragment half2 register J of an NVFP4 word (the packer's `place` layout) as FP16
 * e2m1 x 2^-14: magnitude bits moved to bits 9..11 (25..27), the sign to bit 15 (31).
 * Register 0 sits in place already and register 1 one shift away; registers 2 and 3 have
 * their magnitudes and signs at different distances from the FP16 positions, so their four
 * bits are isolated first and moved by one multiplication by (2^a + 2^b), i.e. the sum of
 * the word shifted by a (magnitudes) and by b (signs): the stray copies (signs shifted by a,
 * magnitudes by b) land outside the kept bits, and no carry of their sum reaches a kept bit
 * (checked for every code pair by td_cuda_nvfp4_layout_check). 9 integer instructions per
 * word. */
#define E2M1_F16_MASK 0x8E008E00u
template <int J>
__host__ __device__ __forceinline__ uint32_t e2m1x2_f16(uint32_t w)
{
    if (J == 0) return w & E2M1_F16_MASK;
    if (J == 1) return (w << 3) & E2M1_F16_MASK;
    if (J == 2) return ((w & 0x40384038u) * ((1u << 6) + (1u << 1))) & E2M1_F16_MASK;
    return ((w & 0x20072007u) * ((1u << 9) + (1u << 2))) & E2M1_F16_MASK;
}

/* A-fragment bf16x2 register J of a word in the BF16 placement as BF16 e2m1 x 2^-126 (the
 * linear position: magnitude bits at 6..8 (22..24), the sign at bit 15 (31); the 0.5 code a
 * BF16 subnormal). Register 0 sits in place, register 1 one shift away, register 3 one mask
 * and one multiplication by (2^6 + 2^2) as in the FP16 decode, register 2 first shifted right
 * by 3 (magnitudes to 6..8, the sign to 11) and then multiplied by (1 + 2^4); the stray copies
 * and their carries stay below the kept bits (checked by td_cuda_nvfp4_layout_check). 10
 * integer instructions per word, taken as they are: the staged inputs carry the power of two
 * (bf16_row_shift below). */
#define E2M1_BF16_MASK 0x81C081C0u
template <int J>
__host__ __device__ __forceinline__ uint32_t e2m1x2_bf16lin(uint32_t w)
{
    if (J == 0) return w & E2M1_BF16_MASK;
    if (J == 1) return (w << 3) & E2M1_BF16_MASK;
    if (J == 2) return (((w >> 3) & 0x09C009C0u) * (1u + (1u << 4))) & E2M1_BF16_MASK;
    return ((w & 0x20072007u) * ((1u << 6) + (1u << 2))) & E2M1_BF16_MASK;
}

/* The layout checks' word for register J's codes (c0, c1) in placement P: the other six codes
 * background bg < 4 of a fixed set, else random from rng. */
static uint32_t check_word(int P, int J, int c0, int c1, int bg, uint64_t &rng)
{
    static const uint32_t backgrounds[4] = {0u, 15u, 7u, 8u};
    uint32_t word = place((uint32_t)c0, J, P) | place((uint32_t)c1, J + 4, P);
    for (int j = 0; j < 8; j++) {
        if (j == J || j == J + 4) continue;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        word |= place(bg < 4 ? backgrounds[bg] : (uint32_t)(rng >> 60), j, P);
    }
    return word;
}
#define CHECK_BACKGROUNDS (4 + 32)

/* Host check of a placement (P: 0 FP16, 1 BF16) against its integer decode (nvfp4_layout.h):
 * every register J decodes every pair of its codes to the FP16 bits of e2m1 x 2^-14 (P 0) or
 * the BF16 bits of e2m1 x 2^-126 (P 1), compared with td_e2m1_to_f32 (an independent decode),
 * whatever the word's other six codes hold. */
template <int P, int J, int D = J>
static int layout_check_reg(char *msg, size_t cap)
{
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int c0 = 0; c0 < 16; c0++)
        for (int c1 = 0; c1 < 16; c1++)
            for (int bg = 0; bg < CHECK_BACKGROUNDS; bg++) {
                const uint32_t word = check_word(P, J, c0, c1, bg, rng);
                const uint32_t got = P ? e2m1x2_bf16lin<D>(word) : e2m1x2_f16<D>(word);
                const int codes[2] = {c0, c1};
                for (int h = 0; h < 2; h++) {
                    const uint16_t bits = (uint16_t)(got >> (16 * h));
                    const float want = td_e2m1_to_f32((uint8_t)codes[h]) * (P ? 0x1p-126f : 0x1p-14f);
                    const float have = P ? td_bf16_to_f32(bits) : td_f16_to_f32(bits);
                    /* signed zero included: code 8 (-0) must decode to -0 */
                    if (memcmp(&want, &have, sizeof want) != 0) {
                        snprintf(msg, cap,
                                 "%s placement, register %d, %s half: code %d decodes to 0x%04x (%g), expected %g x "
                                 "2^%d (word 0x%08x)",
                                 P ? "BF16" : "FP16", J, h ? "high" : "low", codes[h], bits, (double)have,
                                 (double)td_e2m1_to_f32((uint8_t)codes[h]), P ? -126 : -14, word);
                        return 1;
                    }
                }
            }
    return 0;
}

template <int P>
static int layout_check_placement(char *msg, size_t cap)
{
    uint32_t seen = 0;
    int bits = 0;
    for (int j = 0; j < 8; j++) {
        const uint32_t p = place(15u, j, P);
        if (seen & p) {
            snprintf(msg, cap, "%s placement: element %d's bits 0x%08x overlap earlier elements' 0x%08x",
                     P ? "BF16" : "FP16", j, p, seen);
            return 1;
        }
        seen |= p;
        bits += __builtin_popcount(p);
    }
    if (seen != 0xFFFFFFFFu || bits != 32) {
        snprintf(msg, cap, "%s placement: the eight placements cover 0x%08x (%d bits), not the whole word",
                 P ? "BF16" : "FP16", seen, bits);
        return 1;
    }
    return layout_check_reg<P, 0>(msg, cap) || layout_check_reg<P, 1>(msg, cap) || layout_check_reg<P, 2>(msg, cap) ||
           layout_check_reg<P, 3>(msg, cap);
}

extern "C" int td_cuda_nvfp4_layout_check(int broken, char *msg, size_t cap)
{
    if (broken == 1) /* the check's own test: register 2's codes through register 3's decode */
        return layout_check_reg<0, 2, 3>(msg, cap);
    if (broken == 2) /* the same for the BF16 placement */
        return layout_check_reg<1, 2, 3>(msg, cap);
    if (layout_check_placement<0>(msg, cap) || layout_check_placement<1>(msg, cap)) return 1;
    snprintf(msg, cap, "ok");
    return 0;
}

/* ---- BF16 inputs of NVFP4 weights: one power of two per staged row ----
 * The BF16 placement decodes to e2m1 x 2^-126 (the 0.5 code a BF16 subnormal) and is taken as
 * it is. Each staged input row j is multiplied by 2^s_j instead, s_j = bf16_row_shift(E_j),
 * E_j the largest exponent field (bits 7..14) of the row's BF16 values: the largest shift up to
 * 112 that no value of the row overflows (E + s <= 254; a row with an infinity or a NaN takes
 * 0), so the multiplication is exact (subnormal inputs included) and, for rows below 2^16, the
 * products are those of e2m1 x 2^-14 by x. The sums then carry 2^(s_j - 126), which the epilogue
 * removes with one exact multiplication by 2^(126 - s_j). Every kernel that multiplies NVFP4
 * weights by BF16 inputs takes them so (stage_x scaling the staged rows, w2c_stage, or the
 * one-tile decode kernel scaling each lane's B registers: dec_chunk's BSC), so a token's
 * operands are the same in every kernel and every dispatch: the exact pairs hold by
 * construction (docs/cuda.md, Numerics). */
#define XS_ROWS_MAX 32 /* staged rows with a recorded exponent: at most a group's 24 */
static_assert(CU_MM_PACK_DEC <= XS_ROWS_MAX && 2 * 8 <= XS_ROWS_MAX,
              "every staged row (the decode kernel's groups, k_mm's two tiles) has its exponent entry");
__host__ __device__ __forceinline__ int bf16_row_shift(int emax)
{
    const int s = 254 - emax;
    return s > 112 ? 112 : s < 0 ? 0 : s;
}

/* the largest exponent field of a pair of BF16 values */
__device__ __forceinline__ int bf16x2_emax(uint32_t w)
{
    const int lo = (int)((w >> 7) & 0xffu), hi = (int)((w >> 23) & 0xffu);
    return lo > hi ? lo : hi;
}

__device__ __forceinline__ int bf16x4w_emax(uint4 q)
{
    const int a = bf16x2_emax(q.x), b = bf16x2_emax(q.y), c = bf16x2_emax(q.z), d = bf16x2_emax(q.w);
    const int ab = a > b ? a : b, cd = c > d ? c : d;
    return ab > cd ? ab : cd;
}

/* A BF16 pair times 2^s (0 <= s <= 112), one BF16 multiplication (exact where E + s <= 254:
 * checked on the GPU by td_cuda_bf16_row_scale_check). */
__device__ __forceinline__ uint32_t bf16x2_pow2(uint32_t w, int s)
{
    const uint32_t m = (uint32_t)(s + 127) << 7;
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(w), "r"(m | m << 16));
    return r;
}

/* 16 bytes of BF16 inputs times 2^s, in registers */
__device__ __forceinline__ uint4 bf16x4w_pow2(uint4 q, int s)
{
    return make_uint4(bf16x2_pow2(q.x, s), bf16x2_pow2(q.y, s), bf16x2_pow2(q.z, s), bf16x2_pow2(q.w, s));
}

/* 16 bytes of BF16 inputs times 2^s where stage_x put them (store_x4's words d[0], d[4], d[8],
 * d[12]) */
__device__ __forceinline__ void bf16_staged_pow2(uint32_t *d, int s)
{
#pragma unroll
    for (int i = 0; i < 4; i++) d[i * 4] = bf16x2_pow2(d[i * 4], s);
}

/* The epilogue's factor for a row of largest exponent field emax: 2^(126 - s) as FP32 */
__device__ __forceinline__ float bf16_row_unscale(int emax)
{
    return __int_as_float((126 - bf16_row_shift(emax) + 127) << 23);
}

/* The block's per-row exponents of the rows stage_x staged last (BF16 inputs of NVFP4 weights;
 * k_mm, k_w2c's per-warp rows keep theirs in a register) */
__device__ __forceinline__ int *xs_emax()
{
    __shared__ int e[XS_ROWS_MAX];
    return e;
}

/* The same staging's epilogue factors: entry j the 2^(126 - s) of staged row min(j, count - 1)
 * (bf16_row_unscale of its exponent), every entry written, so that the epilogue of the decode
 * kernel reads a lane's factor without the clamp and the exponent arithmetic per item
 * (unscale_sums_f) */
__device__ __forceinline__ float *xs_unscale()
{
    __shared__ float f[XS_ROWS_MAX];
    return f;
}

/* k_dec's: two buffers by the parity of its stagings, so that a staging clears the next one's
 * buffer (whose readers finished before this staging's barrier) instead of clearing its own
 * behind a barrier more */
__device__ __forceinline__ int *xs_emax2(int parity)
{
    __shared__ int e[2][XS_ROWS_MAX];
    return e[parity & 1];
}

/* One 8-token tile's four sums of lane (g, q) times its two columns' factors: elements 0 and 2
 * are column 2q's, 1 and 3 column 2q + 1's. */
__device__ __forceinline__ void mul_cols(float (&t)[4], float f0, float f1)
{
    t[0] = __fmul_rn(t[0], f0);
    t[1] = __fmul_rn(t[1], f1);
    t[2] = __fmul_rn(t[2], f0);
    t[3] = __fmul_rn(t[3], f1);
}

/* The sums' scaling removed, exactly: per token column for BF16 inputs (2^(126 - s) of the
 * column's staged row, em: the staging's exponents; columns past count are never stored and take
 * row count - 1),
 * 2^14 for FP16 (the codes' 2^-14). Lane (g, q) holds columns 2q (elements 0, 2) and 2q + 1
 * (1, 3) of each 8-token tile. */
template <int ACT, int N>
__device__ __forceinline__ void unscale_sums(float (&v)[N][4], int count, int lane, const int *em)
{
#pragma unroll
    for (int nt = 0; nt < N; nt++) {
        float f0 = 16384.0f, f1 = 16384.0f;
        if (ACT == 2) {
            const int c0 = nt * 8 + 2 * (lane & 3), c1 = c0 + 1;
            f0 = bf16_row_unscale(em[c0 < count ? c0 : count - 1]);
            f1 = bf16_row_unscale(em[c1 < count ? c1 : count - 1]);
        }
        mul_cols(v[nt], f0, f1);
    }
}

/* unscale_sums for BF16 inputs staged by stage_x with SC 2 (f: xs_unscale(), whose entries past
 * count repeat row count - 1's): the same factors, read as they are */
template <int N>
__device__ __forceinline__ void unscale_sums_f(float (&v)[N][4], int lane, const float *f)
{
#pragma unroll
    for (int nt = 0; nt < N; nt++) {
        const int c0 = nt * 8 + 2 * (lane & 3);
        const float f0 = f[c0], f1 = f[c0 + 1];
        mul_cols(v[nt], f0, f1);
    }
}

/* Register J of a word as the mma's A operand for act_dtype ACT (the matrix's placement). */
template <int ACT, int J>
__device__ __forceinline__ uint32_t e2m1x2_act(uint32_t w)
{
    return ACT == 1 ? e2m1x2_f16<J>(w) : e2m1x2_bf16lin<J>(w);
}

template <int ACT>
__device__ __forceinline__ void mma16816(const uint32_t a[4], uint32_t b0, uint32_t b1, float &c0, float &c1,
                                         float &c2, float &c3)
{
    if (ACT == 1)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The numerics' K cut (a function of K only): KS steps of 32 columns in NC chunks of `chunk`
 * steps, NC a power of two <= 8 with chunk <= MM_PREFETCH where possible. */
struct mm_geo {
    int KS, NC, chunk;
    int64_t xs_w;   /* 32-bit words per staged input row: K/2 rounded up to 32, plus 16 */
};

/* 32-bit words per staged input row holding `steps` steps (16 words each), rounded up to 32,
 * plus 16 */
static __host__ __device__ int64_t xs_words(int64_t steps) { return (steps * 16 + 31) / 32 * 32 + 16; }

static mm_geo geo_of(int64_t K)
{
    mm_geo g;
    g.KS = (int)(K / 32);
    int want = (g.KS + MM_PREFETCH - 1) / MM_PREFETCH;
    g.NC = 1;
    while (g.NC < want && g.NC < MM_MAX_WARPS) g.NC *= 2;
    g.chunk = (g.KS + g.NC - 1) / g.NC;
    if (g.chunk < 1) g.chunk = 1;
    g.xs_w = xs_words(K / 32);
    return g;
}

struct mm_args {
    cu_mm_call c;
    mm_geo geo;
    int split;      /* 1: the NC chunks of a row tile run on NC warps; 0: on one warp */
    int xrows;      /* staged input rows (the most tokens a group can have) */
    int kparts;     /* unsplit mode: the staged rows hold K in this many parts of NC / kparts
                       chunks, one after the other (geo.xs_w sized for one part), so that
                       two blocks fit an SM where the whole rows would not */
};

/* Staged rows: the pair of input columns (2w, 2w+1) of step w / 16 goes to word
 * (w / 16) * 16 + (u & 3) * 4 + b * 2 + (u >> 2), with b = (w % 16) / 8 (the 16-column block)
 * and u = w % 8: lane quad q then finds the four words it needs (columns 2q and 2q+8 of both
 * blocks) side by side, so one 16-byte load fetches them. */

/* The word of a staged row where the 16-byte piece v of the input row (columns 8v .. 8v + 7)
 * starts, for rows staged from step s0 on (its four words at +0, +4, +8, +12: store_x4). */
__device__ __forceinline__ int xs_word(int v, int s0) { return ((v >> 2) - s0) * 16 + ((v & 3) >> 1) * 2 + (v & 1); }

/* The exact BF16 split of two FP16 values (one 32-bit word): hi = bf16(x), lo = bf16(x - hi). */
__device__ __forceinline__ void split_hi_lo(uint32_t w, uint32_t &uh, uint32_t &ul)
{
    __half2 h;
    memcpy(&h, &w, 4);
    const float2 f = __half22float2(h);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(f.x, f.y);
    const float2 hf = __bfloat1622float2(hi);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(__fsub_rn(f.x, hf.x), __fsub_rn(f.y, hf.y));
    memcpy(&uh, &hi, 4);
    memcpy(&ul, &lo, 4);
}

/* The four words (column pairs) of a 16-byte load of input row columns at d[0], d[4], d[8],
 * d[12]; with SPLIT (FP16 inputs for BF16 weights) their exact BF16 hi / lo split, hi there and
 * lo at the same offsets + copy. */
template <bool SPLIT>
__device__ __forceinline__ void store_x4(uint4 q, uint32_t *d, int copy)
{
    const uint32_t w4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t w = w4[i];
        if (!SPLIT) {
            d[i * 4] = w;
        } else {
            uint32_t uh, ul;
            split_hi_lo(w, uh, ul);
            d[i * 4] = uh;
            d[copy + i * 4] = ul;
        }
    }
}

/* Stage the group's input rows into shared memory as 16-bit pairs in that order (the
 * block's threads together, 16 bytes per load; columns at or beyond in_cols become 0), with
 * the BF16 hi / lo split of FP16 inputs for BF16 weights (copy 1 holds lo). Ends with
 * __syncthreads(). Words 4v .. 4v+3 (v = 4s + m) land at s*16 + i*4 + (m>>1)*2 + (m&1),
 * i = 0..3. The (row, v) pairs of all rows are one index space and each thread issues U
 * loads before it stores any, so staging 16 rows costs a few round trips to memory, not one
 * per row (U: 4 in k_dec, 2 in k_mm, whose weight registers are live meanwhile). SC (BF16
 * inputs of NVFP4 weights) 1: each row's largest exponent field goes to em[row] (the caller's
 * buffer, zero for the staged rows: the warp's lanes of one row combined first, then one
 * shared-memory maximum), the rows staged as they are (the kernel multiplies them: dec_chunk's
 * BSC), and em_next (XS_ROWS_MAX entries) is cleared for the next staging; SC 2: into
 * xs_emax(), cleared behind a barrier, and after another barrier the rows' epilogue factors go
 * to xs_unscale() (FACT: k_dec's epilogue reads them, k_mm's reads xs_emax()) and a second pass
 * multiplies each staged row by 2^bf16_row_shift of it. */
template <bool SPLIT, int U, int SC = 0, bool FACT = true>
__device__ __forceinline__ void stage_x(const mm_args &a, const int32_t *plist, int64_t slot0, int count, uint32_t *xs,
                                        int s0 = 0, int s1 = -1, int *em = nullptr, int *em_next = nullptr)
{
    /* steps [s0, s1) (s1 < 0: to the end of K) land at step s - s0 */
    const int xs_w = (int)a.geo.xs_w, valid = (int)(a.c.in_cols / 8);
    const int v0 = 4 * s0, v1 = s1 < 0 ? (int)(a.c.W.K / 8) : 4 * s1, nv = v1 - v0;
    const int copy = a.xrows * xs_w;
    const int div = (int)a.c.in_div;
    const int total = count * nv, step = (int)blockDim.x;
    if constexpr (SC == 2) {
        em = xs_emax();
        if ((int)threadIdx.x < count) em[threadIdx.x] = 0;
        __syncthreads();
    }
    int emax1 = 0; /* one row: this thread's maximum, combined once at the end */
    (void)emax1;
    for (int base = threadIdx.x - (int)(threadIdx.x & 31u); base < total; base += U * step) {
        /* base: the warp's first index (SC's warp-wide maxima need every lane in the loop) */
        uint4 q4[U];
        uint32_t *dst[U];
        int jrow[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int idx = base + (int)(threadIdx.x & 31u) + u * step;
            q4[u] = make_uint4(0, 0, 0, 0);
            dst[u] = nullptr;
            jrow[u] = -1;
            if (idx < total) {
                const int j = idx / nv, v = v0 + (idx - j * nv);
                const int slot = plist ? plist[j] : (int)slot0 + j;
                if (v < valid)
                    q4[u] = __ldg(reinterpret_cast<const uint4 *>(a.c.in16 + (int64_t)(slot / div) * a.c.in_ld) + v);
                dst[u] = xs + j * xs_w + xs_word(v, s0);
                jrow[u] = j;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (dst[u]) store_x4<SPLIT>(q4[u], dst[u], copy);
            if constexpr (SC != 0) {
                if (count == 1) { /* (uniform) */
                    const int e = bf16x4w_emax(q4[u]);
                    emax1 = e > emax1 ? e : emax1;
                } else {
                    const unsigned same = __match_any_sync(0xffffffffu, jrow[u]);
                    const int e = (int)__reduce_max_sync(same, (unsigned)bf16x4w_emax(q4[u]));
                    if (jrow[u] >= 0 && (threadIdx.x & 31u) == (unsigned)(__ffs(same) - 1)) atomicMax(&em[jrow[u]], e);
                }
            }
        }
    }
    if constexpr (SC != 0) {
        if (count == 1) {
            emax1 = (int)__reduce_max_sync(0xffffffffu, (unsigned)emax1);
            if ((threadIdx.x & 31u) == 0) atomicMax(&em[0], emax1);
        }
    }
    if constexpr (SC == 1) /* the next staging's buffer (its readers are done: dec_sc) */
        if (threadIdx.x < XS_ROWS_MAX) em_next[threadIdx.x] = 0;
    if constexpr (SC == 2) {
        __syncthreads();
        if (FACT && (int)threadIdx.x < XS_ROWS_MAX && count > 0)
            xs_unscale()[threadIdx.x] = bf16_row_unscale(em[(int)threadIdx.x < count ? threadIdx.x : count - 1]);
        /* (row, piece) of idx walked without a division per piece: idx advances by step, i.e.
         * by dj rows and dv pieces, with one carry */
        const int nvd = nv > 0 ? nv : 1, dj = step / nvd, dv = step - dj * nvd;
        int j = (int)threadIdx.x / nvd, v = (int)threadIdx.x - j * nvd;
        for (int idx = threadIdx.x; idx < total; idx += step) {
            bf16_staged_pow2(xs + j * xs_w + xs_word(v0 + v, s0), bf16_row_shift(em[j]));
            j += dj;
            v += dv;
            if (v >= nv) {
                v -= nv;
                j++;
            }
        }
    }
    __syncthreads();
}

/* The group's input rows from the image cu_mm_round_stage made (cu_mm_call::xst): rows slot0 ..
 * slot0 + count - 1 of each plane are contiguous there and land where stage_x puts them (row j
 * at j * xs_w, the lo plane `copy` words further), so thread 0 moves them with one bulk copy per
 * plane on a barrier of the block's and every thread waits for its bytes. Ends with the rows in
 * place for every thread (the barrier's wait orders them, as a __syncthreads would). */
template <bool SPLIT>
__device__ __forceinline__ void stage_img(const mm_args &a, int64_t slot0, int count, uint32_t *xs)
{
    __shared__ __align__(8) uint64_t img_bar;
    const uint32_t bar = cu_smem_addr(&img_bar);
    const int64_t xs_w = a.geo.xs_w;
    if (threadIdx.x == 0) {
        cu_mbar_init(&img_bar);
        cu_mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint32_t bytes = (uint32_t)(count * xs_w * 4);
        cu_mbar_expect(bar, SPLIT ? 2 * bytes : bytes);
        cu_bulk_copy(cu_smem_addr(xs), a.c.xst + slot0 * xs_w, bytes, bar);
        if (SPLIT) cu_bulk_copy(cu_smem_addr(xs + a.xrows * xs_w), a.c.xst + a.c.xst_plane + slot0 * xs_w, bytes, bar);
    }
    cu_mbar_wait(bar, 0);
}

/* One warp's weights and scales of up to PF steps, in registers. */
template <int PF>
struct mm_regs {
    uint2 wq[PF];           /* NVFP4 */
    uint4 wd[PF][2];        /* BF16 */
    uint32_t s_lo[PF], s_hi[PF];
};

/* Issue the loads of steps [base, base + n) of row tile rt of matrix `mat` (n <= PF). With
 * `ef`, BF16 weights are tagged evict-first in L2: a decode-sized call (the router and the
 * shared expert) reads each weight once, so they need not displace what the block reads again
 * (docs/perf.md, "The router's and the shared expert's weights evict-first in L2"). A hint:
 * the values loaded are the same. */
template <int WK, int PF>
__device__ __forceinline__ void mm_load(const cu_qmat &W, int64_t KS, int64_t mat, int64_t rt, int base, int n, int lane,
                                        mm_regs<PF> &r, bool ef)
{
    const uint64_t pol = WK == 2 && ef ? cu_policy_evict_first() : 0;
    const int g = lane >> 2;
    const uint8_t *wbase = W.w + mat * W.mat_w;
    const uint8_t *sbase = WK < 2 ? W.s + mat * W.mat_s : nullptr;
    const int64_t tile0 = rt * KS;
#pragma unroll
    for (int i = 0; i < PF; i++) {
        if (i < n) {
            const int64_t step = tile0 + base + i;
            if (WK < 2) {
                r.wq[i] = __ldg(reinterpret_cast<const uint2 *>(wbase) + step * 32 + lane);
            } else {
                const uint4 *p = reinterpret_cast<const uint4 *>(wbase) + (step * 32 + lane) * 2;
                if (ef) {
                    r.wd[i][0] = cu_ldg_policy(p, pol);
                    r.wd[i][1] = cu_ldg_policy(p + 1, pol);
                } else {
                    r.wd[i][0] = __ldg(p);
                    r.wd[i][1] = __ldg(p + 1);
                }
            }
            if (WK == 0) {
                const uint2 v = __ldg(reinterpret_cast<const uint2 *>(sbase) + step * 8 + g);
                r.s_lo[i] = v.x;
                r.s_hi[i] = v.y;
            } else if (WK == 1) {
                const uint32_t v = __ldg(reinterpret_cast<const uint32_t *>(sbase) + step * 8 + g);
                r.s_lo[i] = v & 0xffffu;
                r.s_hi[i] = v >> 16;
            }
        }
    }
}

/* Accumulate steps [base, base + n) held in r into acc (NT n-tiles), B from the staged rows. */
template <int WK, int ACT, int NT, int PF>
__device__ __forceinline__ void mm_compute(const mm_args &a, int64_t mat, int base, int n, int count, const uint32_t *xs,
                                           int s0, int lane, const mm_regs<PF> &r, float acc[2][4])
{
    const cu_qmat &W = a.c.W;
    const int xs_w = (int)a.geo.xs_w, copy = a.xrows * xs_w;
    const int g = lane >> 2, q = lane & 3;
    constexpr bool SPLIT = WK == 2 && ACT == 1;
    const uint4 *xrow[2] = {reinterpret_cast<const uint4 *>(xs + g * xs_w + q * 4),
                            reinterpret_cast<const uint4 *>(xs + (8 + g) * xs_w + q * 4)};
    float2 glob = make_float2(0.f, 0.f);
    if (WK == 1) glob = W.g[mat];
#pragma unroll
    for (int i = 0; i < PF; i++) {
        if (i < n) {
            /* both blocks of the step: x = block 0 (cols 2q, 2q+8), z = block 1 */
            uint4 Bs[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
            uint4 Ls[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (nt * 8 + g < count) {
                    Bs[nt] = xrow[nt][(base - s0 + i) * 4];
                    if (SPLIT) Ls[nt] = xrow[nt][copy / 4 + (base - s0 + i) * 4];
                }
            float2 eff_lo = make_float2(0.f, 0.f), eff_hi = make_float2(0.f, 0.f);
            if (WK == 0) {
                __half2 hl, hh;
                memcpy(&hl, &r.s_lo[i], 4);
                memcpy(&hh, &r.s_hi[i], 4);
                eff_lo = __half22float2(hl);
                eff_hi = __half22float2(hh);
            } else if (WK == 1) {
                eff_lo = make_float2(cu_raw_eff(r.s_lo[i] & 0xffu, glob.x, W.conv),
                                     cu_raw_eff((r.s_lo[i] >> 8) & 0xffu, glob.x, W.conv));
                eff_hi = make_float2(cu_raw_eff(r.s_hi[i] & 0xffu, glob.y, W.conv),
                                     cu_raw_eff((r.s_hi[i] >> 8) & 0xffu, glob.y, W.conv));
            }
#pragma unroll
            for (int b = 0; b < 2; b++) {
                uint32_t B[2][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    B[nt][0] = b ? Bs[nt].z : Bs[nt].x;
                    B[nt][1] = b ? Bs[nt].w : Bs[nt].y;
                    B[nt][2] = b ? Ls[nt].z : Ls[nt].x;
                    B[nt][3] = b ? Ls[nt].w : Ls[nt].y;
                }
                uint32_t A[4];
                if (WK < 2) {
                    const uint32_t word = b ? r.wq[i].y : r.wq[i].x;
                    A[0] = e2m1x2_act<ACT, 0>(word);
                    A[1] = e2m1x2_act<ACT, 1>(word);
                    A[2] = e2m1x2_act<ACT, 2>(word);
                    A[3] = e2m1x2_act<ACT, 3>(word);
                } else {
                    A[0] = r.wd[i][b].x;
                    A[1] = r.wd[i][b].y;
                    A[2] = r.wd[i][b].z;
                    A[3] = r.wd[i][b].w;
                }
                /* the decode's scaling (2^-14, or the BF16 rows' 2^(s - 126)) stays in acc; the
                 * epilogue scales it back */
                const float e_lo = b ? eff_lo.y : eff_lo.x, e_hi = b ? eff_hi.y : eff_hi.x;
                if (WK < 2) {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
                        mma16816<ACT>(A, B[nt][0], B[nt][1], d0, d1, d2, d3);
                        acc[nt][0] = __fmaf_rn(e_lo, d0, acc[nt][0]);
                        acc[nt][1] = __fmaf_rn(e_lo, d1, acc[nt][1]);
                        acc[nt][2] = __fmaf_rn(e_hi, d2, acc[nt][2]);
                        acc[nt][3] = __fmaf_rn(e_hi, d3, acc[nt][3]);
                    }
                } else {
                    /* per tile hi then lo; the tiles' hi products first, so that no lo
                     * product waits right behind its own tile's hi */
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mma16816<2>(A, B[nt][0], B[nt][1], acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
                    if (SPLIT)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            mma16816<2>(A, B[nt][2], B[nt][3], acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
                }
            }
        }
    }
}

/* A GEMM launch's role in the timeline build (cuda/timeline.cuh): BF16 weights are the router
 * (FP32 logits) and the shared expert's W13 (SwiGLU) and W2, NVFP4 weights the routed W13 and W2 */
__device__ __forceinline__ int mm_tl_role(bool bf16_weights, int epi)
{
    if (bf16_weights) return epi == CU_MM_F32 ? CU_TL_ROUTER : epi == CU_MM_SWIGLU ? CU_TL_SH13 : CU_TL_SH2;
    return epi == CU_MM_SWIGLU ? CU_TL_W13 : CU_TL_W2;
}

/* Partial sums of steps [k0, k1) of row tile rt for NT n-tiles (acc from +0); with `stage`,
 * the block stages the inputs once the first weights are on their way. WK: 0 NVFP4
 * prepared, 1 NVFP4 raw, 2 BF16. */
template <int WK, int ACT, int NT, int NTMAX>
__device__ __forceinline__ void mm_chunk(const mm_args &a, int64_t mat, int64_t rt, int k0, int k1, int count,
                                         uint32_t *xs, const int32_t *plist, int64_t slot0, bool stage, bool early,
                                         int s0, int s1, int lane, float acc[2][4])
{
    constexpr bool SPLIT = WK == 2 && ACT == 1;
    /* BF16 in a one-tile kernel (the router and shared expert at decode sizes, grids of at most
     * a block per SM): a whole chunk's weights in registers at once */
    constexpr int PF = WK == 2 ? (NTMAX == 1 ? MM_PREFETCH : 4) : WK == 1 && NT == 1 ? 6 : MM_PREFETCH;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
    for (int base = k0;; base += PF) {
        const int n = k1 - base < PF ? (k1 > base ? k1 - base : 0) : PF;
        mm_regs<PF> r;
        /* decode-sized calls read each BF16 weight once: evict-first */
        mm_load<WK, PF>(a.c.W, a.geo.KS, mat, rt, base, n, lane, r, a.split != 0);
        if (base == k0) cu_tl_mark(mm_tl_role(WK == 2, a.c.epi), 0); /* the first loads issued */
        if (stage && base == k0) { /* while the weights load */
            if (early) { /* the first weights were issued before the previous kernel ended */
                cu_pdl_wait();
                cu_tl_waited(mm_tl_role(WK == 2, a.c.epi));
                cu_pdl_release();
            }
            if (s0 > 0) __syncthreads(); /* a later part: every warp is done with the one before */
            /* staged by the round already (cu_mm only passes xst to such calls: BF16 weights,
             * range groups, the chunks on NC warps, K staged whole) */
            if (WK == 2 && a.c.xst) stage_img<SPLIT>(a, slot0, count, xs);
            else stage_x<SPLIT, 2, WK < 2 && ACT == 2 ? 2 : 0, false>(a, plist, slot0, count, xs, s0, s1);
            cu_tl_mark(mm_tl_role(WK == 2, a.c.epi), 1); /* the inputs staged */
        }
        mm_compute<WK, ACT, NT, PF>(a, mat, base, n, count, xs, s0, lane, r, acc);
        if (base == k0) cu_tl_mark(mm_tl_role(WK == 2, a.c.epi), 2); /* the first steps computed */
        if (base + PF >= k1) break;
    }
}

/* v as the FP16 (act 1) or BF16 (act 2) bit pattern, round to nearest even. */
__device__ __forceinline__ uint32_t bits16(float v, int act)
{
    return act == 1 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ void store16(uint16_t *p, float v, int act) { *p = (uint16_t)bits16(v, act); }

/* SwiGLU of one output from its gate and up sums: silu(gate) in double precision rounded to
 * float, times up, rounded to the act dtype (both epilogue paths below). */
template <int ACT>
__device__ __forceinline__ float swiglu_h(float gate, float up)
{
    const double d = (double)gate;
    const float silu = (float)(d / (1.0 + exp(-d)));
    return cu_round_act(__fmul_rn(silu, up), ACT);
}

/* The SwiGLU epilogue of N token tiles (N known at compile time): the 2N evaluations of a lane
 * are computed side by side, whatever the count (past it the sums are finite stand-ins and the
 * results are not stored), so that they share their constants and overlap; then the stores of
 * the tokens within the count. */
template <int N, int NA, int ACT>
__device__ __forceinline__ void mm_swiglu(const cu_mm_call &c, int64_t rt, int count, const int32_t *plist,
                                          int64_t slot0, int lane, const float v[NA][4])
{
    const int g = lane >> 2, q = lane & 3;
    const int64_t col = rt * 8 + g;
    float h[N][2];
#pragma unroll
    for (int nt = 0; nt < N; nt++)
#pragma unroll
        for (int t = 0; t < 2; t++) h[nt][t] = swiglu_h<ACT>(v[nt][t], v[nt][2 + t]);
    if (col >= c.out_n) return;
#pragma unroll
    for (int nt = 0; nt < N; nt++)
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int j = nt * 8 + 2 * q + t;
            if (j >= count) continue;
            const int64_t slot = plist ? plist[j] : slot0 + j;
            if (c.out) c.out[slot * c.out_ld + col] = h[nt][t];
            if (c.out16) store16(c.out16 + slot * c.out_ld + col, h[nt][t], ACT);
        }
}

/* Epilogue of one row tile: v[nt][e] final sums (e: 0,1 row g tokens 2q, 2q+1; 2,3 row g+8).
 * ACT: the call's act_dtype (c.act), as the kernel's template parameter so that only its
 * conversions are compiled. EPI: c.epi known at compile time (the decode kernel: CU_MM_SWIGLU,
 * or CU_MM_STORE with 16-bit outputs only), so that only that epilogue is compiled; -1: read
 * from c at run time. */
template <int NA, int ACT, int EPI = -1>
__device__ __forceinline__ void mm_epilogue(const cu_mm_call &c, int64_t rt, int count, const int32_t *plist,
                                            int64_t slot0, int lane, int ntn, const float v[NA][4])
{
    const int epi = EPI >= 0 ? EPI : c.epi;
    const int g = lane >> 2, q = lane & 3;
    /* the tile loops' bound: for up to 3 tiles (the decode kernel, k_mm) the compile-time NA (with
     * a break at ntn), so that they unroll and v stays in registers; for more (k_wgp, k_gemm)
     * ntn: unrolled over 8 tiles, k_wgp's three GEMMs at M = 784 took 3 us more each */
    const int nmax = NA <= 3 ? NA : ntn;
    if constexpr (NA <= 3) { /* the decode kernel and k_mm: SwiGLU unrolled for the tile count */
        if (epi == CU_MM_SWIGLU) {
            if (ntn <= 1) mm_swiglu<1, NA, ACT>(c, rt, count, plist, slot0, lane, v);
            else if (NA < 3 || ntn == 2) mm_swiglu<(NA >= 2 ? 2 : 1), NA, ACT>(c, rt, count, plist, slot0, lane, v);
            else mm_swiglu<NA, NA, ACT>(c, rt, count, plist, slot0, lane, v);
            return;
        }
    }
    if (epi == CU_MM_STORE && (EPI == CU_MM_STORE || !c.out)) {
        /* 16-bit only: lane g of a token writes rows 2g and 2g + 1 as one 4-byte word, so the
         * 8 lanes of a token write its 16 rows (32 bytes) in one store instead of two halves.
         * Row R is held by lane (R % 8, q) in half R / 8. */
        const int hs = g < 4 ? 0 : 1, ga = 2 * g - 8 * hs;
        const int la = ga * 4 + q, lb = la + 4;
        const int64_t r = rt * 16 + 2 * g;
        for (int nt = 0; nt < nmax; nt++) {
            if (nt >= ntn) break;
#pragma unroll
            for (int t = 0; t < 2; t++) {
                /* one rounding to act_dtype: bits16 of cu_round_act(x) is bits16(x), NaNs included
                 * (a 16-bit value converts back to itself) */
                const uint32_t p0 = bits16(v[nt][t], ACT), p1 = bits16(v[nt][2 + t], ACT);
                const uint32_t a0 = __shfl_sync(0xffffffffu, p0, la), a1 = __shfl_sync(0xffffffffu, p1, la);
                const uint32_t b0 = __shfl_sync(0xffffffffu, p0, lb), b1 = __shfl_sync(0xffffffffu, p1, lb);
                const int j = nt * 8 + 2 * q + t;
                if (j >= count || r >= c.out_n) continue;
                const int64_t slot = plist ? plist[j] : slot0 + j;
                uint16_t *o = c.out16 + slot * c.out_ld + r;
                const uint32_t lo = hs ? a1 : a0, hi = hs ? b1 : b0;
                if (r + 1 < c.out_n) *(uint32_t *)o = lo | hi << 16;
                else *o = (uint16_t)lo;
            }
        }
        return;
    }
    /* the STORE instantiation (the decode kernel's W2) returned above for every call */
    if constexpr (EPI != CU_MM_STORE) {
        for (int nt = 0; nt < nmax; nt++) {
            if (nt >= ntn) break;
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int j = nt * 8 + 2 * q + t;
                if (j >= count) continue;
                const int64_t slot = plist ? plist[j] : slot0 + j;
                if (epi == CU_MM_SWIGLU) {
                    const int64_t col = rt * 8 + g;
                    if (col >= c.out_n) continue;
                    const float h = swiglu_h<ACT>(v[nt][t], v[nt][2 + t]);
                    if (c.out) c.out[slot * c.out_ld + col] = h;
                    if (c.out16) store16(c.out16 + slot * c.out_ld + col, h, ACT);
                } else {
                    for (int hh = 0; hh < 2; hh++) {
                        const int64_t r = rt * 16 + g + 8 * hh;
                        if (r >= c.out_n) continue;
                        const float x = epi == CU_MM_F32 ? v[nt][2 * hh + t] : cu_round_act(v[nt][2 * hh + t], ACT);
                        if (c.out) c.out[slot * c.out_ld + r] = x;
                        if (c.out16) store16(c.out16 + slot * c.out_ld + r, x, ACT);
                    }
                }
            }
        }
    }
}

/* Group gy of the call: its matrix, slot count and slot list (plist, or slot0 + j); false when
 * the group does not exist (the grid is sized for the most groups there can be). */
__device__ __forceinline__ bool mm_group(const mm_args &a, int64_t gy, int64_t &mat, int &count, const int32_t *&plist,
                                         int64_t &slot0)
{
    const cu_mm_call &c = a.c;
    slot0 = 0;
    plist = nullptr;
    if (c.perm) {
        if (gy >= *c.n_groups) return false;
        mat = c.g_mat[gy];
        count = c.g_count[gy];
        plist = c.perm + c.g_start[gy];
    } else {
        slot0 = gy * c.pack;
        if (slot0 >= c.nslots) return false;
        count = (int)(c.nslots - slot0 < c.pack ? c.nslots - slot0 : c.pack);
        mat = c.ids ? c.ids[slot0] : 0;
    }
    if (count > a.xrows) count = a.xrows; /* never: xrows bounds every group */
    mat = mat * c.mats_per_expert + c.mat_off;
    return true;
}

/* ==== kernels ================================================================================ */

template <int WK, int ACT, int NTMAX>
__global__ void __launch_bounds__(MM_MAX_WARPS * 32, WK == 2 && NTMAX == 1 ? 2 : NTMAX == 1 ? 3 : 2) k_mm(mm_args a)
{
    const cu_tl_guard tl_(mm_tl_role(WK == 2, a.c.epi));
    __shared__ float red[MM_MAX_WARPS][2][4][32];
    extern __shared__ uint4 xs_raw[];
    uint32_t *xs = reinterpret_cast<uint32_t *>(xs_raw);
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* pdl 1 with range groups (router, shared expert): the group needs no memory and the
     * weights are constant, so the first chunk's weight loads are issued before the wait
     * (mm_chunk waits before it stages the inputs) */
    const bool early = c.pdl == 1 && !c.perm && !c.ids;
    if (!early) {
        cu_pdl_wait();
        tl_.waited();
        cu_pdl_release();
    }
    int64_t mat, slot0;
    int count;
    const int32_t *plist;
    if (!mm_group(a, blockIdx.y, mat, count, plist, slot0)) return;
    const int NC = a.geo.NC, chunk = a.geo.chunk, KS = a.geo.KS;
    const int nk = a.split ? NC : 1, rpb = MM_MAX_WARPS / nk;
    const int kw = warp % nk, rtl = warp / nk;
    const int64_t rt = (int64_t)blockIdx.x * rpb + rtl;
    const bool live = rt < c.W.R / 16;
    const int ntn = count > 8 ? NTMAX : 1;
    float v[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (a.split) {
        int k0 = kw * chunk, k1 = k0 + chunk < KS ? k0 + chunk : KS;
        if (!live || k1 < k0) k1 = k0;
        if (ntn == 1) mm_chunk<WK, ACT, 1, NTMAX>(a, mat, rt, k0, k1, count, xs, plist, slot0, true, early, 0, -1, lane, v);
        else mm_chunk<WK, ACT, NTMAX, NTMAX>(a, mat, rt, k0, k1, count, xs, plist, slot0, true, early, 0, -1, lane, v);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp][nt][e][lane] = v[nt][e];
        cu_tl_mark(mm_tl_role(WK == 2, c.epi), 3); /* the chunk's sums (after its last steps) */
        __syncthreads();
        cu_tl_mark(mm_tl_role(WK == 2, c.epi), 4); /* every warp's sums */
        if (kw != 0 || !live) return;
        for (int nt = 0; nt < 2; nt++)
            for (int e = 0; e < 4; e++) {
                float s = red[warp][nt][e][lane];
                for (int w = 1; w < nk; w++) s = __fadd_rn(s, red[warp + w][nt][e][lane]);
                v[nt][e] = s;
            }
    } else {
        /* chunks per staged part (parts only where cu_mm chooses them: BF16 weights, FP16
         * inputs, prefill-sized calls; every other instance stages K whole) */
        constexpr bool PARTS = WK == 2 && ACT == 1 && NTMAX == 2;
        const int cpp = PARTS ? NC / a.kparts : NC;
        for (int ch = 0; ch < NC; ch++) {
            int k0 = ch * chunk, k1 = k0 + chunk < KS ? k0 + chunk : KS;
            if (!live || k1 < k0) k1 = k0;
            /* the part's steps [s0, s1): staged by the whole block at its first chunk */
            int s0 = 0, s1 = -1;
            if (PARTS) {
                s0 = ch / cpp * cpp * chunk;
                s1 = s0 + cpp * chunk < KS ? s0 + cpp * chunk : KS;
            }
            const bool stage = PARTS ? ch % cpp == 0 : ch == 0;
            float p[2][4];
            if (ntn == 1)
                mm_chunk<WK, ACT, 1, NTMAX>(a, mat, rt, k0, k1, count, xs, plist, slot0, stage, early && ch == 0, s0, s1,
                                            lane, p);
            else
                mm_chunk<WK, ACT, NTMAX, NTMAX>(a, mat, rt, k0, k1, count, xs, plist, slot0, stage, early && ch == 0, s0,
                                                s1, lane, p);
            for (int nt = 0; nt < 2; nt++)
                for (int e = 0; e < 4; e++) v[nt][e] = ch == 0 ? p[nt][e] : __fadd_rn(v[nt][e], p[nt][e]);
        }
        if (!live) return;
    }
    if constexpr (WK < 2) /* NVFP4 sums carry the decode's 2^-14 (FP16) or the rows' 2^(s - 126) (BF16) */
        unscale_sums<ACT>(v, count, lane, ACT == 2 ? xs_emax() : nullptr);
    mm_epilogue<2, ACT>(c, rt, count, plist, slot0, lane, ntn, v);
}

/* ==== the prefill GEMM of BF16 matrices =========================================================
 *
 * k_gemm: BF16 weights with range groups (the router and the shared expert) at prefill sizes.
 * k_mm gives such a call one warp per (row tile, 16 tokens), each warp streaming its row tile's
 * weights for two 8-token tiles; here a block of GM_WARPS warps takes GM_WARPS row tiles (one per
 * warp) and GM_NT * 8 tokens, whose input rows are staged one K chunk at a time into a double
 * buffer (the next chunk's loads are issued before the current chunk is computed, stored after
 * it), so that each weight fragment serves GM_NT tiles and the inputs are read once per block.
 * Per output element the same mma sequence as k_mm (each chunk from +0, steps and blocks
 * ascending, hi then lo; the chunk sums added in chunk order), so the same bits. */
#define GM_WARPS 8
#define GM_NT 4
/* chunk steps it takes (geo.chunk <= GM_CHUNK), staging loads per thread that covers */
#define GM_CHUNK 10
#define GM_U ((GM_NT * 8 * GM_CHUNK * 4 + GM_WARPS * 32 - 1) / (GM_WARPS * 32))
#define GM_PF 2

/* 32-bit words of one copy (hi, or lo) of a staged chunk for GM_NT * 8 rows */
static int64_t gm_copy_words(const mm_geo &g) { return (int64_t)GM_NT * 8 * xs_words(g.chunk); }

/* The chunk [k0, k1) of the block's rows (slot t0 + j reads input row t0 + j: cu_mm sends only
 * calls with in_div 1 here; j < count; zero beyond count or in_cols) as
 * GM_U 16-byte loads per thread into q4. */
__device__ __forceinline__ void gm_fetch(const mm_args &a, int64_t t0, int count, int k0, int k1, uint4 q4[GM_U])
{
    const int nv = 4 * (k1 - k0), total = GM_NT * 8 * nv, valid = (int)(a.c.in_cols / 8);
#pragma unroll
    for (int u = 0; u < GM_U; u++) {
        const int idx = (int)threadIdx.x + u * GM_WARPS * 32;
        q4[u] = make_uint4(0, 0, 0, 0);
        if (idx < total) {
            const int j = idx / nv, v = 4 * k0 + idx % nv;
            if (j < count && v < valid)
                q4[u] = __ldg(reinterpret_cast<const uint4 *>(a.c.in16 + (t0 + j) * a.c.in_ld) + v);
        }
    }
}

/* Store what gm_fetch loaded into buffer xb in stage_x's word order (hi at xb, lo at xb + copy
 * for SPLIT). */
template <bool SPLIT>
__device__ __forceinline__ void gm_store(const mm_args &a, int k0, int k1, const uint4 q4[GM_U], uint32_t *xb,
                                         int copy)
{
    const int nv = 4 * (k1 - k0), total = GM_NT * 8 * nv, xs_w = (int)xs_words(a.geo.chunk);
#pragma unroll
    for (int u = 0; u < GM_U; u++) {
        const int idx = (int)threadIdx.x + u * GM_WARPS * 32;
        if (idx >= total) continue;
        const int j = idx / nv, vl = idx % nv, m = vl & 3;
        store_x4<SPLIT>(q4[u], xb + j * xs_w + (vl >> 2) * 16 + (m >> 1) * 2 + (m & 1), copy);
    }
}

template <int ACT>
__global__ void __launch_bounds__(GM_WARPS * 32, 2) k_gemm(mm_args a)
{
    const cu_tl_guard tl_(mm_tl_role(true, a.c.epi));
    extern __shared__ uint4 gm_raw[];
    uint32_t *xs = reinterpret_cast<uint32_t *>(gm_raw);
    constexpr bool SPLIT = ACT == 1;
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int NC = a.geo.NC, chunk = a.geo.chunk, KS = a.geo.KS, xs_w = (int)xs_words(chunk);
    const int copy = GM_NT * 8 * xs_w, bufw = copy * (SPLIT ? 2 : 1);
    const int64_t t0 = (int64_t)blockIdx.y * GM_NT * 8;
    const int count = (int)(c.nslots - t0 < GM_NT * 8 ? c.nslots - t0 : GM_NT * 8);
    const int ntn = (count + 7) / 8;
    const int64_t rt = (int64_t)blockIdx.x * GM_WARPS + warp, mat = c.mat_off;
    const bool live = rt < c.W.R / 16;
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    uint4 q4[GM_U];
    gm_fetch(a, t0, count, 0, chunk < KS ? chunk : KS, q4);
    gm_store<SPLIT>(a, 0, chunk < KS ? chunk : KS, q4, xs, copy);
    __syncthreads();
    float v[GM_NT][4];
    for (int ch = 0; ch < NC; ch++) {
        const int k0 = ch * chunk, k1 = k0 + chunk < KS ? k0 + chunk : KS;
        const int n0 = k1, n1 = n0 + chunk < KS ? n0 + chunk : KS; /* the next chunk */
        const bool next = ch + 1 < NC && n1 > n0;
        if (next) gm_fetch(a, t0, count, n0, n1, q4);
        const uint32_t *xb = xs + (ch & 1) * bufw;
        float p[GM_NT][4];
#pragma unroll
        for (int nt = 0; nt < GM_NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nt][e] = 0.0f;
        for (int base = k0; live && base < k1; base += GM_PF) {
            const int n = k1 - base < GM_PF ? k1 - base : GM_PF;
            mm_regs<GM_PF> r;
            mm_load<2, GM_PF>(c.W, KS, mat, rt, base, n, lane, r, false);
#pragma unroll
            for (int i = 0; i < GM_PF; i++) {
                if (i >= n) break;
                const int sl = base - k0 + i;
                /* every tile, also past count: the staged rows there are zeros, their sums
                 * unused, and no predicate keeps the mma from being scheduled together */
                uint4 Bs[GM_NT], Ls[GM_NT];
#pragma unroll
                for (int nt = 0; nt < GM_NT; nt++) {
                    const uint32_t *row = xb + (nt * 8 + g) * xs_w + sl * 16 + q * 4;
                    Bs[nt] = *reinterpret_cast<const uint4 *>(row);
                    Ls[nt] = SPLIT ? *reinterpret_cast<const uint4 *>(row + copy) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const uint32_t A[4] = {r.wd[i][b].x, r.wd[i][b].y, r.wd[i][b].z, r.wd[i][b].w};
                    /* each tile's sequence is hi then lo; the tiles' hi products issue back to
                     * back before the lo ones, which wait for them */
#pragma unroll
                    for (int nt = 0; nt < GM_NT; nt++)
                        mma16816<2>(A, b ? Bs[nt].z : Bs[nt].x, b ? Bs[nt].w : Bs[nt].y, p[nt][0], p[nt][1], p[nt][2],
                                    p[nt][3]);
                    if (SPLIT)
#pragma unroll
                        for (int nt = 0; nt < GM_NT; nt++)
                            mma16816<2>(A, b ? Ls[nt].z : Ls[nt].x, b ? Ls[nt].w : Ls[nt].y, p[nt][0], p[nt][1],
                                        p[nt][2], p[nt][3]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < GM_NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) v[nt][e] = ch == 0 ? p[nt][e] : __fadd_rn(v[nt][e], p[nt][e]);
        if (next) gm_store<SPLIT>(a, n0, n1, q4, xs + ((ch + 1) & 1) * bufw, copy);
        __syncthreads();
    }
    if (live) mm_epilogue<GM_NT, ACT>(c, rt, count, nullptr, t0, lane, ntn, v);
}

/* ==== the prefill GEMM of BF16 matrices on warpgroup MMA ========================================
 *
 * k_wgp: prefill-sized calls of BF16 matrices with range groups (the router and the shared
 * expert at 256 tokens or more) on Hopper's warpgroup MMA. FP16 inputs come split into their
 * exact BF16 hi and lo parts, BF16 inputs as they are, by k_wsplit, launched just before into
 * the call's split_ws in the stages' own layout (below). A block covers WG * 64 rows (WG consumer warpgroups, one or
 * two) by WP_NT * 8 = 64 tokens with two roles:
 * - warps 0..4 WG - 1, the consumers: per stage, wait for `full`, load each 16-column block's A
 *   fragments (the weights in the device layout: mma.sync's A fragment is wgmma's register A)
 *   from shared memory, issue one m64n64k16 on the hi plane and (FP16 inputs) one on the lo
 *   plane into the chunk's accumulator, and give the previous stage back (`empty`) once the wgmmas that read it
 *   have completed (two sets of A registers: one stage's are still read while the next stage's
 *   load). Both warpgroups read the same input planes: the second halves the input bytes per
 *   product that a block moves from L2;
 * - warp 4 WG, the issuer: once a slot is empty, the row tiles' weights of the stage (one bulk
 *   copy per tile) and the stage's input planes (one bulk copy: wgmma's B operand, 8 x 8 core
 *   matrices without swizzle: 16-column block kb at kb * 2048 bytes, 8-token block j at
 *   j * WG_SBO, K half at WG_LBO), all completing on `full`; up to WP_STAGES stages ahead.
 * Until b617135 the issuer copied the FP16 inputs by cp.async and three converter warps split
 * them per stage and block: that was the kernel's critical path (the consumers waited on
 * `full` 46% of their samples; ncu, docs/perf.md); with the split done once before, the router,
 * shared W13 and W2 at M = 784 take 23 / 37 / 23 us instead of 33 / 47 / 30.
 * Every consumer thread arrives on `empty` itself, after its own reads of the stage (not one
 * lane for its warp after __syncwarp): each thread's reads are then ordered before the stage's
 * next writes by its own arrival, which is also what compute-sanitizer's racecheck tracks.
 * Per output element the sequence is k_mm's (each chunk from +0, blocks ascending, hi then lo,
 * the chunk sums added in chunk order) and wgmma's sums are mma.sync's (bench/gpu/mma_probe),
 * so the bits are the same; `kernels=generic` (k_mm) is the exact pair that checks it. The
 * accumulators are mma.sync's C fragments of the warp's row tile for the 8 token tiles, so
 * the epilogue is k_mm's. Needs sm_90a (wgmma); K cut into chunks of an even number of steps.
 * Calls without a split_ws take k_gemm (BF16 inputs did too until the BF16 layout of k_wsplit:
 * with the inputs copied per stage by the kernel itself this kernel was not faster there). */
#define WP_NT 8
#define WP_SS 2
#define WP_STAGES 4
/* a stage's weights: 1 KiB per row tile and step, 4 WG row tiles */
__host__ __device__ constexpr int wp_wbytes(int wg) { return 4 * wg * WP_SS * 1024; }
#define WP_XBYTES (WP_NT * 8 * WP_SS * 64)    /* a stage's inputs, one plane: 64 bytes per token and step */
/* consumers (4 WG warps) and the issuer */
__host__ __device__ constexpr int wp_threads(int wg) { return (4 * wg + 1) * 32; }

__host__ __device__ constexpr int wp_stage_bytes(int act, int wg)
{
    return wp_wbytes(wg) + WP_XBYTES * (act == 1 ? 2 : 1);
}

/* One consumer stage: wait until stage `slot` is full, load the warp's A fragments of its
 * WP_SS steps into A (not the registers the previous stage's wgmmas still read), issue the
 * wgmmas (per 16-column block: hi, then lo for FP16 inputs) into p, and give the previous
 * stage back once its wgmmas are done. */
template <int ACT, int WG>
__device__ __forceinline__ void wp_step(uint32_t sbase, const uint4 *raw, uint64_t *full, uint64_t *empty, int slot,
                                        int s, int lane, int warp, int prev, uint32_t (&A)[2 * WP_SS][4],
                                        float (&p)[32])
{
    constexpr int STAGE = wp_stage_bytes(ACT, WG);
    const uint32_t st = sbase + (uint32_t)(slot * STAGE);
    cu_mbar_wait(cu_smem_addr(&full[slot]), (s / WP_STAGES) & 1);
#pragma unroll
    for (int kb = 0; kb < 2 * WP_SS; kb++) {
        const uint4 w4 = *reinterpret_cast<const uint4 *>(reinterpret_cast<const uint8_t *>(raw) + slot * STAGE +
                                                          warp * WP_SS * 1024 + (kb >> 1) * 1024 + lane * 32 +
                                                          (kb & 1) * 16);
        A[kb][0] = w4.x;
        A[kb][1] = w4.y;
        A[kb][2] = w4.z;
        A[kb][3] = w4.w;
    }
#pragma unroll
    for (int i = 0; i < 32; i++) reg_fence(p[i]);
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < 2 * WP_SS; kb++) {
        const uint32_t xb = st + wp_wbytes(WG) + (uint32_t)(kb * 2048);
        wg_mma_n64(p, A[kb], wg_desc(xb, WG_LBO, WG_SBO));
        if (ACT == 1) wg_mma_n64(p, A[kb], wg_desc(xb + WP_XBYTES, WG_LBO, WG_SBO));
    }
    wg_commit();
    wg_wait<1>();
#pragma unroll
    for (int i = 0; i < 32; i++) reg_fence(p[i]);
    if (prev >= 0) cu_mbar_arrive(cu_smem_addr(&empty[prev]));
}

/* The pre-split inputs (cu_mm_call::split_ws): per 64-token block tb and stage st (64 columns),
 * wp_split_bytes(ACT) at (tb * nst + st) * wp_split_bytes(ACT): FP16 inputs the hi plane then
 * the lo plane, BF16 inputs one plane (the inputs as they are), each the stage's wgmma B
 * operand exactly as k_wgp's consumers read it from shared memory, so that one bulk copy lands
 * it there (piece p of 8 columns of token jn * 8 + n8 at (p / 2) * 2048 + jn * WG_SBO +
 * (p % 2) * WG_LBO + n8 * 16), zeros past the tokens and past in_cols. */
__host__ __device__ constexpr int wp_split_bytes(int act) { return (act == 1 ? 2 : 1) * WP_XBYTES; }

/* Piece i of the split layout (16 bytes of 8 inputs): its token t, first column c0 and where
 * it goes in `out`. */
template <int ACT>
__device__ __forceinline__ uint8_t *wp_piece(int64_t i, int nst, uint8_t *out, int64_t &t, int64_t &c0)
{
    const int n8 = (int)(i & 7), p = (int)((i >> 3) & 7), jn = (int)((i >> 6) & 7);
    const int64_t chunk = i >> 9, tb = chunk / nst, st = chunk - tb * nst;
    t = tb * (WP_NT * 8) + jn * 8 + n8;
    c0 = st * (WP_SS * 32) + p * 8;
    return out + chunk * wp_split_bytes(ACT) + (p >> 1) * 2048 + jn * WG_SBO + (p & 1) * WG_LBO + n8 * 16;
}

/* 8 inputs (16-bit patterns) into their piece d: FP16 split into hi and lo planes, BF16 as
 * they are. */
template <int ACT>
__device__ __forceinline__ void wp_put(uint8_t *d, uint4 q)
{
    if (ACT == 1) {
        uint4 h, l;
        split_hi_lo(q.x, h.x, l.x);
        split_hi_lo(q.y, h.y, l.y);
        split_hi_lo(q.z, h.z, l.z);
        split_hi_lo(q.w, h.w, l.w);
        *reinterpret_cast<uint4 *>(d) = h;
        *reinterpret_cast<uint4 *>(d + WP_XBYTES) = l;
    } else {
        *reinterpret_cast<uint4 *>(d) = q;
    }
}

/* k_wsplit: one thread per 16-byte piece (8 inputs) of the split layout above. */
template <int ACT>
__global__ void __launch_bounds__(256) k_wsplit(const uint16_t *in, int64_t ld, int64_t M, int64_t in_cols, int nst,
                                                int64_t pieces, uint8_t *out)
{
    cu_pdl_wait();
    cu_pdl_release();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pieces) return;
    int64_t t, c0;
    uint8_t *d = wp_piece<ACT>(i, nst, out, t, c0);
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    if (t < M && c0 < in_cols) q = *reinterpret_cast<const uint4 *>(in + t * ld + c0);
    wp_put<ACT>(d, q);
}

/* Columns c0 .. c0 + 7 of row t of x [*, H] rounded to act as k_round16 rounds them: their 16-bit
 * patterns stored to x16 (and the rounded floats to xa unless NULL) and returned as one 16-byte
 * piece (k_round_split and k_round_stage, which then lay the piece out). */
template <int ACT>
__device__ __forceinline__ uint4 round_piece(const float *x, float *xa, uint16_t *x16, int64_t t, int64_t H, int64_t c0)
{
    const float4 *src = reinterpret_cast<const float4 *>(x + t * H + c0);
    const float4 f0 = src[0], f1 = src[1];
    const float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
    uint32_t b[8];
    float r[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        b[j] = bits16(f[j], ACT);
        r[j] = cu_round_act(f[j], ACT);
    }
    const uint4 q = make_uint4(b[0] | b[1] << 16, b[2] | b[3] << 16, b[4] | b[5] << 16, b[6] | b[7] << 16);
    *reinterpret_cast<uint4 *>(x16 + t * H + c0) = q;
    if (xa) {
        float4 *dst = reinterpret_cast<float4 *>(xa + t * H + c0);
        dst[0] = make_float4(r[0], r[1], r[2], r[3]);
        dst[1] = make_float4(r[4], r[5], r[6], r[7]);
    }
    return q;
}

/* k_round_split: the block's input x [M, H] rounded to act as k_round16 rounds it (x16, and xa
 * as floats unless NULL) and at once laid out as k_wsplit lays out x16 (one thread per piece
 * of the layout; H % 8 == 0), so that the router and the shared W13 need no k_wsplit. The
 * first kernel of a block call: no wait; its dependents may launch at once and wait for it. */
template <int ACT>
__global__ void __launch_bounds__(256) k_round_split(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H,
                                                     int nst, int64_t pieces, uint8_t *out)
{
    const cu_tl_guard tl_(CU_TL_ROUND);
    cu_pdl_release();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pieces) return;
    int64_t t, c0;
    uint8_t *d = wp_piece<ACT>(i, nst, out, t, c0);
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    if (t < M && c0 < H) q = round_piece<ACT>(x, xa, x16, t, H, c0);
    wp_put<ACT>(d, q);
}

/* k_round_stage: x [M, H] rounded to act as k_round16 rounds it (x16, and xa as floats unless
 * NULL) and at once staged for k_mm (cu_mm_round_stage): one thread per 16-byte piece v of row t
 * of the image (W / 4 pieces per row, W words), the pieces at or beyond H / 8 zeros, its four
 * words where stage_x puts them, split into hi (plane 0) and lo (plane 1, M * W words further)
 * for FP16 inputs by the same function. The first kernel of a block call: no wait. */
template <int ACT>
__global__ void __launch_bounds__(256) k_round_stage(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H,
                                                     int W, int64_t pieces, uint32_t *img)
{
    const cu_tl_guard tl_(CU_TL_ROUND);
    cu_pdl_release();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pieces) return;
    const int64_t t = i / (W / 4);
    const int v = (int)(i - t * (W / 4));
    const int64_t c0 = (int64_t)v * 8;
    uint4 q = make_uint4(0u, 0u, 0u, 0u);
    if (c0 < H) q = round_piece<ACT>(x, xa, x16, t, H, c0);
    store_x4<ACT == 1>(q, img + t * W + xs_word(v, 0), (int)(M * W));
}

template <int ACT, int WG>
__global__ void __launch_bounds__(wp_threads(WG), WG == 1 ? 2 : 1) k_wgp(mm_args a)
{
    const cu_tl_guard tl_(mm_tl_role(true, a.c.epi));
    extern __shared__ __align__(128) uint4 wp_raw[];
    __shared__ __align__(8) uint64_t full[WP_STAGES], empty[WP_STAGES];
    static_assert(ACT == 1 || ACT == 2, "k_wgp takes FP16 (split) or BF16 inputs");
    constexpr int SPLIT = wp_split_bytes(ACT), STAGE = wp_stage_bytes(ACT, WG), TILES = 4 * WG, WBYTES = wp_wbytes(WG);
    constexpr int ISSUER = 4 * WG; /* the issuing warp */
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int NC = a.geo.NC, chunk = a.geo.chunk, KS = a.geo.KS;
    const int64_t RT = c.W.R / 16, rt0 = (int64_t)blockIdx.x * TILES;
    const int64_t t0 = (int64_t)blockIdx.y * WP_NT * 8;
    const int count = (int)(c.nslots - t0 < WP_NT * 8 ? c.nslots - t0 : WP_NT * 8);
    const int nst = (KS + WP_SS - 1) / WP_SS; /* stages of the whole K (chunk % WP_SS == 0) */
    const uint32_t sbase = cu_smem_addr(wp_raw);
    if (threadIdx.x == 0) {
        for (int i = 0; i < WP_STAGES; i++) {
            cu_mbar_init_n(&full[i], 1);           /* the copies' expect */
            cu_mbar_init_n(&empty[i], TILES * 32); /* the consumers' threads */
        }
        cu_mbar_init_fence();
    }
    __syncthreads();
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    if (warp == ISSUER) {
        /* the issuing warp's lane 0: once the consumers gave stage s's slot back, the weights of
         * its row tiles and its hi / lo input planes by bulk copies completing on `full`, up to
         * WP_STAGES stages ahead */
        if (lane != 0) return;
        const int live_tiles = (int)(RT - rt0 < TILES ? RT - rt0 : TILES);
        const uint8_t *wsrc = c.W.w + c.mat_off * c.W.mat_w;
        const uint8_t *xsrc = c.split_ws + (int64_t)blockIdx.y * nst * SPLIT;
        for (int s = 0; s < nst; s++) {
            const int slot = s % WP_STAGES;
            const uint32_t st = sbase + (uint32_t)(slot * STAGE);
            cu_mbar_wait(cu_smem_addr(&empty[slot]), ((s / WP_STAGES) & 1) ^ 1);
            const uint32_t fb = cu_smem_addr(&full[slot]);
            cu_mbar_expect(fb, (uint32_t)(live_tiles * WP_SS * 1024 + SPLIT));
            for (int w = 0; w < live_tiles; w++)
                cu_bulk_copy(st + (uint32_t)(w * WP_SS * 1024), wsrc + ((rt0 + w) * KS + (int64_t)s * WP_SS) * 1024,
                             WP_SS * 1024, fb);
            cu_bulk_copy(st + WBYTES, xsrc + (int64_t)s * SPLIT, SPLIT, fb);
        }
        return;
    }
    /* consumers */
    const int64_t rt = rt0 + warp;
    float v[32], p[32];
    uint32_t A0[2 * WP_SS][4], A1[2 * WP_SS][4]; /* two stages' A fragments: one in flight */
    int s = 0;
    for (int ch = 0; ch < NC; ch++) {
        const int k0 = ch * chunk, k1 = k0 + chunk < KS ? k0 + chunk : KS;
#pragma unroll
        for (int i = 0; i < 32; i++) p[i] = 0.0f;
        int prev = -1;
        for (int k = k0; k < k1; k += WP_SS, s++) {
            const int slot = s % WP_STAGES;
            if (s & 1) wp_step<ACT, WG>(sbase, wp_raw, full, empty, slot, s, lane, warp, prev, A1, p);
            else wp_step<ACT, WG>(sbase, wp_raw, full, empty, slot, s, lane, warp, prev, A0, p);
            prev = slot;
        }
        wg_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; i++) reg_fence(p[i]);
        if (prev >= 0) cu_mbar_arrive(cu_smem_addr(&empty[prev]));
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = ch == 0 ? p[i] : __fadd_rn(v[i], p[i]);
    }
    if (rt >= RT) return;
    float vv[WP_NT][4];
#pragma unroll
    for (int nt = 0; nt < WP_NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) vv[nt][e] = v[4 * nt + e];
    mm_epilogue<WP_NT, ACT>(c, rt, count, nullptr, t0, lane, (count + 7) / 8, vv);
}

/* ==== the decode kernel =========================================================================
 *
 * k_dec: k_mm's arithmetic for NT 8-token tiles (one, two or three) and chunks of exactly CH
 * steps, each warp computing whole row tiles (its NC chunks one after the other, added in
 * chunk order: k_mm's unsplit mode, the same bits as its split mode). Persistent: a grid of a
 * few blocks per SM, each block taking a contiguous range of items (item = group x DW row
 * tiles, one per warp; ranges of equal item counts, or of equal cost for grouped calls with
 * NT >= 2, dec_range_cost). Every warp streams its chunks through a
 * ring of DEC_STAGES buffers of its own, filled by the bulk-copy engine: while it computes one
 * chunk from shared memory, the next ones (of this tile or of its tile in the next item) are
 * on their way, so no block barrier is needed except where the walk enters a new group and
 * the group's input rows are staged. */

/* Blocks per SM the decode kernel is built for (registers), at most, and warps per block:
 * NT = 1: 3 blocks of 8 warps; NT = 2 or 3 (whose staged rows take most of the shared memory,
 * so one block fits per SM): 1 block of 16 warps. */
#define DEC_BLOCKS 3
/* Most 8-token tiles of one decode-kernel group (the extent of its accumulator arrays); groups
 * of up to 24 slots (grouped prefill, cu_mm_group_pack) run with NT = 3. */
#define DEC_NA 3
__host__ __device__ constexpr int dec_warps(int nt) { return nt == 1 ? 8 : 16; }
template <int NT> struct dec_occupancy {
    static constexpr int blocks = NT == 1 ? DEC_BLOCKS : 1;
    static constexpr int warps = dec_warps(NT);
};
/* The narrow one-tile shape (cuda/dec_split.h): blocks of 4 warps, 7 per SM, without the tail;
 * a launch takes it where td_dec_narrow_pays finds fewer chunk rounds and the call asks for it
 * (cu_mm_call::dec_narrow). */
#define DEC_NARROW_WARPS TD_DEC_NARROW_WARPS
#define DEC_NARROW_BLOCKS TD_DEC_NARROW_BLOCKS
/* Blocks per SM that k_dec with NT tiles and DW warps per block is built for (registers). */
__host__ __device__ constexpr int dec_blocks(int nt, int dw)
{
    return nt != 1 ? 1 : dw == DEC_NARROW_WARPS ? DEC_NARROW_BLOCKS : DEC_BLOCKS;
}
/* Chunk buffers per warp: DEC_STAGES - 1 chunks are in flight while one is computed (at most
 * 32: one mbarrier per buffer, phases kept in one word). Deeper rings for grids of one or two
 * blocks per SM (decode with few experts) were measured slower (docs/perf.md). */
#define DEC_STAGES 2

/* Bytes of one chunk of one warp: CH steps of weights (256 bytes each) and of scales (16 rows
 * x 2 blocks: FP16 prepared, E4M3 raw). */
__host__ __device__ constexpr int dec_scale_step(int wk) { return wk == 0 ? 64 : 32; }
__host__ __device__ constexpr int dec_chunk_bytes(int wk, int ch) { return ch * 256 + ch * dec_scale_step(wk); }
template <int WK, int CH> struct dec_sizes {
    static constexpr int w = CH * 256;
    static constexpr int s = CH * dec_scale_step(WK);
    static constexpr int chunk = dec_chunk_bytes(WK, CH);
};

/* Bytes of a block's rings (DEC_STAGES buffers per warp), ahead of its staged rows: for
 * `warps` warps, and for the warps of NT tiles' usual shape. */
__host__ __device__ constexpr int dec_ring_bytes_w(int wk, int ch, int warps)
{
    return warps * DEC_STAGES * dec_chunk_bytes(wk, ch);
}
__host__ __device__ constexpr int dec_ring_bytes(int wk, int ch, int nt)
{
    return dec_ring_bytes_w(wk, ch, dec_warps(nt));
}
template <int WK, int CH, int NT> struct dec_rings {
    static constexpr int bytes = dec_ring_bytes(WK, CH, NT);
};

/* A block's walk over its items: group g (matrix, slots) and block of DW row tiles tb. The
 * group lookup (a global load) runs only when the walk enters a new group. */
struct dec_pos {
    int g, tb, count, slot0;
    int64_t mat;
    const int32_t *plist;
};

__device__ __forceinline__ void dec_group(const mm_args &a, dec_pos &p)
{
    int64_t mat, slot0;
    mm_group(a, p.g, mat, p.count, p.plist, slot0); /* g < the number of groups: true */
    p.mat = mat;
    p.slot0 = (int)slot0;
}

__device__ __forceinline__ dec_pos dec_next(const mm_args &a, dec_pos p, int tbx)
{
    if (++p.tb == tbx) {
        p.tb = 0;
        p.g++;
        dec_group(a, p);
    }
    return p;
}

/* Source of chunk 0 of row tile rt of matrix mat: weights and scales. */
template <int WK, int CH>
__device__ __forceinline__ void dec_src(const mm_args &a, int64_t mat, int rt, const uint8_t *&gw, const uint8_t *&gs)
{
    typedef dec_sizes<WK, CH> Z;
    const int64_t step0 = (int64_t)rt * a.geo.KS;
    gw = a.c.W.w + mat * a.c.W.mat_w + step0 * 256;
    gs = a.c.W.s + mat * a.c.W.mat_s + step0 * (Z::s / CH);
}

/* Lane 0 issues one chunk (weights, then scales) into `buf`, completing on `bar`. The expert
 * weights stream through L2 once per call, so they are tagged evict-first: they then do not
 * displace what the block reads again (its activations, the intermediate W2 reads back, the
 * router's and the shared expert's weights), which made the routed part 1-4% faster at
 * M = 1..8 (docs/perf.md, "Expert weights evict-first in L2"). */
template <int WK, int CH>
__device__ __forceinline__ void dec_issue(const uint8_t *gw, const uint8_t *gs, uint32_t buf, uint32_t bar, int lane)
{
    typedef dec_sizes<WK, CH> Z;
    if (lane == 0) {
        const uint64_t pol = cu_policy_evict_first();
        cu_mbar_expect(bar, Z::chunk);
        cu_bulk_copy_policy(buf, gw, Z::w, bar, pol);
        cu_bulk_copy_policy(buf + Z::w, gs, Z::s, bar, pol);
    }
}

/* A warp's issue cursor: the chunk it issues next (chunk ch of row tile rt of item it of the
 * block's range [.., it1)), its sources, and the walk. */
template <int WK, int CH, int DW> struct dec_stream {
    dec_pos pos;
    int it, it1, ch, rt;
    bool live; /* rt is a row tile of the matrix (not padding): its chunks are issued */
    const uint8_t *gw, *gs;

    __device__ __forceinline__ void start(const mm_args &a, const dec_pos &p, int first, int last, int warp)
    {
        pos = p;
        it = first;
        it1 = last;
        ch = 0;
        rt = pos.tb * DW + warp;
        live = rt < (int)(a.c.W.R / 16);
        dec_src<WK, CH>(a, pos.mat, rt, gw, gs);
    }
    __device__ __forceinline__ bool more(void) const { return it < it1; }
    /* Issue the cursor's chunk into `buf` (nothing for a padding tile) and advance. */
    __device__ __forceinline__ void issue(const mm_args &a, int tbx, int warp, int lane, uint32_t buf, uint32_t bar)
    {
        typedef dec_sizes<WK, CH> Z;
        if (live) dec_issue<WK, CH>(gw, gs, buf, bar, lane);
        gw += Z::w;
        gs += Z::s;
        if (++ch == a.geo.NC) {
            ch = 0;
            if (++it < it1) {
                pos = dec_next(a, pos, tbx);
                rt = pos.tb * DW + warp;
                live = rt < (int)(a.c.W.R / 16);
                dec_src<WK, CH>(a, pos.mat, rt, gw, gs);
            }
        }
    }
};

/* Partial sums of one chunk (acc from +0) for NT 8-token tiles, from its buffer; B from the
 * staged rows, steps from step0 of the row. */
template <int WK, int ACT, int CH, int NT, bool BSC = false>
__device__ __forceinline__ void dec_chunk(const mm_args &a, const dec_pos &p, const uint8_t *buf, const uint32_t *xs,
                                          int step0, int lane, float acc[DEC_NA][4], const int *em = nullptr)
{
    static_assert(!BSC || (NT == 1 && ACT == 2), "B scaled in the loop: one tile of BF16 inputs");
    typedef dec_sizes<WK, CH> Z;
    const cu_mm_call &c = a.c;
    const int g = lane >> 2, q = lane & 3;
    const uint2 *wsm = reinterpret_cast<const uint2 *>(buf) + lane;
    /* B column g of tile nt is token nt*8 + g; past the group's count the lane reads the last
     * token's row instead of zeros: that column is computed and never stored (a column of D
     * depends on its own column of B only), and the loads need no predicate */
    const uint4 *xrow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int row = nt * 8 + g < p.count ? nt * 8 + g : p.count - 1;
        xrow[nt] = reinterpret_cast<const uint4 *>(xs + row * (int)a.geo.xs_w + q * 4) + step0 * 4;
    }
    float2 glob = make_float2(0.f, 0.f);
    if (WK == 1) glob = c.W.g[p.mat];
    /* BSC: the rows were staged as they are (stage_x SC 1); this lane's B column g is multiplied
     * by its row's 2^s here, the same exact products as staging them scaled (SC 2) */
    int bsh = 0;
    if constexpr (BSC) bsh = bf16_row_shift(em[g < p.count ? g : p.count - 1]);
#pragma unroll
    for (int nt = 0; nt < DEC_NA; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const uint2 wq = wsm[i * 32];
        uint4 Bs[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) Bs[nt] = xrow[nt][i * 4];
        if constexpr (BSC) Bs[0] = bf16x4w_pow2(Bs[0], bsh);
        float2 eff_lo, eff_hi;
        if (WK == 0) {
            const uint2 sv = reinterpret_cast<const uint2 *>(buf + Z::w)[i * 8 + g];
            __half2 hl, hh;
            memcpy(&hl, &sv.x, 4);
            memcpy(&hh, &sv.y, 4);
            eff_lo = __half22float2(hl);
            eff_hi = __half22float2(hh);
        } else {
            const uint32_t sv = reinterpret_cast<const uint32_t *>(buf + Z::w)[i * 8 + g];
            const uint32_t sl = sv & 0xffffu, sh = sv >> 16;
            eff_lo = make_float2(cu_raw_eff(sl & 0xffu, glob.x, c.W.conv), cu_raw_eff(sl >> 8, glob.x, c.W.conv));
            eff_hi = make_float2(cu_raw_eff(sh & 0xffu, glob.y, c.W.conv), cu_raw_eff(sh >> 8, glob.y, c.W.conv));
        }
#pragma unroll
        for (int bb = 0; bb < 2; bb++) {
            const uint32_t word = bb ? wq.y : wq.x;
            const uint32_t A[4] = {e2m1x2_act<ACT, 0>(word), e2m1x2_act<ACT, 1>(word), e2m1x2_act<ACT, 2>(word),
                                   e2m1x2_act<ACT, 3>(word)};
            const float e_lo = bb ? eff_lo.y : eff_lo.x, e_hi = bb ? eff_hi.y : eff_hi.x;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
                mma16816<ACT>(A, bb ? Bs[nt].z : Bs[nt].x, bb ? Bs[nt].w : Bs[nt].y, d0, d1, d2, d3);
                acc[nt][0] = __fmaf_rn(e_lo, d0, acc[nt][0]);
                acc[nt][1] = __fmaf_rn(e_lo, d1, acc[nt][1]);
                acc[nt][2] = __fmaf_rn(e_hi, d2, acc[nt][2]);
                acc[nt][3] = __fmaf_rn(e_hi, d3, acc[nt][3]);
            }
        }
    }
}

/* Sum of v over the block (every thread gets it); red: 32 words of shared memory, free on
 * entry and exit. */
__device__ __forceinline__ long long block_sum(long long v, long long *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    long long t = 0;
    for (int w = 0; w < nw; w++) t += red[w];
    __syncthreads();
    return t;
}

/* Exclusive prefix of the integer v over the block's threads in thread order, and the total
 * (every thread gets it); red: 32 words of T in shared memory, free on entry and exit. Each
 * warp scans its lanes, then the warp totals, with shuffles. Integer sums: any order gives the
 * same values. */
template <typename T>
__device__ __forceinline__ T block_excl(T v, T *red, T &total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    T incl = v;
    for (int off = 1; off < 32; off <<= 1) {
        const T o = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += o;
    }
    if (lane == 31) red[warp] = incl;
    __syncthreads();
    const T wv = lane < nw ? red[lane] : 0;
    T wincl = wv;
    for (int off = 1; off < 32; off <<= 1) {
        const T o = __shfl_up_sync(0xffffffffu, wincl, off);
        if (lane >= off) wincl += o;
    }
    total = __shfl_sync(0xffffffffu, wincl, 31);
    const T before = __shfl_sync(0xffffffffu, wincl - wv, warp);
    __syncthreads();
    return before + incl - v;
}

/* Cost of each item of a group of `count` slots (decode-kernel units, see dec_range_cost). */
template <int NT>
__device__ __forceinline__ long long dec_item_cost(int count)
{
    const int t = (count + 7) / 8;
    return 2 + (t < NT ? t : NT);
}

/* Grouped prefill calls (device groups, NT >= 2): the groups' items differ in cost (a step's
 * weights are decoded once per group, then multiplied once per 8-token tile), so the blocks
 * take contiguous ranges of equal cost instead of equal item counts: an item of a group of
 * c slots costs 2 + its tiles (min(ceil(c / 8), NT)); block b's range is the items whose
 * cost-ordered start lies in [b T / B, (b + 1) T / B), T the total. Every thread gets the
 * same it0, it1 (the whole block calls this; which block computes an item changes no bit). */
template <int NT>
__device__ __forceinline__ void dec_range_cost(const cu_mm_call &c, int tbx, int &it0, int &it1)
{
    __shared__ long long red[32];
    const int G = *c.n_groups, nth = (int)blockDim.x, tid = (int)threadIdx.x;
    long long w_all = 0;
    for (int g = tid; g < G; g += nth) w_all += dec_item_cost<NT>(c.g_count[g]);
    const long long T = block_sum(w_all, red) * tbx, B = gridDim.x, b = blockIdx.x;
    const long long t0 = T * b / B, t1 = T * (b + 1) / B;
    /* items with a start below t: in group g (start lo = tbx * (cost of the groups before g),
     * w per item), min(tbx, max(0, ceil((t - lo) / w))) */
    long long f0 = 0, f1 = 0, carry = 0;
    for (int base = 0; base < G; base += nth) {
        const int g = base + tid;
        const long long w = g < G ? dec_item_cost<NT>(c.g_count[g]) : 0;
        long long chunk;
        const long long lo = (carry + block_excl(w, red, chunk)) * tbx;
        if (g < G) {
            const long long n0 = t0 > lo ? (t0 - lo + w - 1) / w : 0, n1 = t1 > lo ? (t1 - lo + w - 1) / w : 0;
            f0 += n0 < tbx ? n0 : tbx;
            f1 += n1 < tbx ? n1 : tbx;
        }
        carry += chunk;
    }
    it0 = (int)block_sum(f0, red);
    it1 = (int)block_sum(f1, red);
}

/* dec_chunk for the group's tile count (uniform branches: tiles past the group's slots would be
 * dropped). */
template <int WK, int ACT, int CH, int NT>
__device__ __forceinline__ void dec_chunk_n(const mm_args &a, const dec_pos &p, const uint8_t *buf, const uint32_t *xs,
                                            int step0, int lane, float acc[DEC_NA][4], const int *em)
{
    if (NT >= 2 && p.count <= 8)
        dec_chunk<WK, ACT, CH, 1>(a, p, buf, xs, step0, lane, acc);
    else if (NT == 3 && p.count <= 16)
        dec_chunk<WK, ACT, CH, 2>(a, p, buf, xs, step0, lane, acc);
    else
        dec_chunk<WK, ACT, CH, NT, NT == 1 && ACT == 2>(a, p, buf, xs, step0, lane, acc, em);
}

/* stage_x's SC for the decode kernel with NT tiles: BF16 rows of one-tile launches are scaled in
 * the chunk loop (dec_chunk's BSC: a lane's one B column, four multiplications per step), those
 * of more tiles in the staging (their multiplications would repeat per tile) */
template <int ACT, int NT>
__host__ __device__ constexpr int dec_sc()
{
    return ACT != 2 ? 0 : NT == 1 ? 1 : 2;
}

/* Items of a call with equal-count ranges: groups x tbx. */
__device__ __forceinline__ int dec_items(const cu_mm_call &c, int tbx)
{
    const int groups = c.perm ? *c.n_groups : (int)((c.nslots + c.pack - 1) / c.pack);
    return groups * tbx;
}

/* The last items of a one-tile call, split by chunks (NT = 1; cuda/dec_split.h says which items
 * and tiles a block takes, and why: at M = 4, top-9 routes give 360 W13 items on 396 blocks and
 * the routed part took 38.7 us, top-10 routes 400 items and 49.4 us before this split). The
 * block's tail tiles: DW / NC of them at once, warp w computing chunk w % NC of tile w / NC
 * (its partial sum from +0, as the whole-tile walk computes it, into its ring buffer); after a
 * block barrier the tile's chunk-0 warp adds the NC partials in chunk order from -0, scales by
 * 2^14 and stores the epilogue. The same sums in the same order, so the same bits. */
template <int WK, int ACT, int CH, int EPI>
__device__ __forceinline__ void dec_tail_run(const mm_args &a, int tbx, const td_dec_split &tail, uint4 *sh,
                                             uint32_t bar_s, uint32_t *xs, int slot, uint32_t phases, int stg)
{
    typedef dec_sizes<WK, CH> Z;
    constexpr int DW = dec_occupancy<1>::warps;
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int NC = a.geo.NC, RT = (int)(c.W.R / 16);
    const int j = warp / NC, ch = warp - j * NC;
    /* the block's tail tiles lie in one item (dec_split.h) */
    const int t = tail.tail_t0 + j, item = tail.tail_item0 + tail.tail_t0 / DW;
    dec_pos p;
    p.g = item / tbx;
    p.tb = item - p.g * tbx;
    dec_group(a, p);
    const int rt = p.tb * DW + t % DW;
    const bool live = j < tail.tail_n && rt < RT;
    uint8_t *buf = reinterpret_cast<uint8_t *>(sh) + warp * DEC_STAGES * Z::chunk + slot * Z::chunk;
    const uint32_t buf_s = cu_smem_addr(buf), bar = bar_s + slot * 8;
    if (live) {
        const uint8_t *gw, *gs;
        dec_src<WK, CH>(a, p.mat, rt, gw, gs);
        dec_issue<WK, CH>(gw + (int64_t)ch * Z::w, gs + (int64_t)ch * Z::s, buf_s, bar, lane);
    }
    __syncthreads(); /* every warp is done with the staged rows of its last item */
    /* stg: this staging's parity (the walk's last cleared its buffer) */
    stage_x<false, 4, dec_sc<ACT, 1>()>(a, p.plist, p.slot0, p.count, xs, 0, -1, xs_emax2(stg), xs_emax2(stg + 1));
    float part[DEC_NA][4];
    if (live) {
        cu_mbar_wait_warp(bar, phases >> slot & 1u);
        dec_chunk_n<WK, ACT, CH, 1>(a, p, buf, xs, ch * CH, lane, part, xs_emax2(stg));
        __syncwarp(); /* every lane is done with the chunk before the partials overwrite it */
        reinterpret_cast<float4 *>(buf)[lane] = make_float4(part[0][0], part[0][1], part[0][2], part[0][3]);
    }
    __syncthreads();
    if (!live || ch != 0) return;
    float v[DEC_NA][4];
#pragma unroll
    for (int nt = 0; nt < DEC_NA; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) v[nt][e] = -0.0f;
    for (int k = 0; k < NC; k++) {
        const float4 q = reinterpret_cast<const float4 *>(reinterpret_cast<const uint8_t *>(sh) +
                                                         (j * NC + k) * DEC_STAGES * Z::chunk + slot * Z::chunk)[lane];
        v[0][0] = __fadd_rn(v[0][0], q.x);
        v[0][1] = __fadd_rn(v[0][1], q.y);
        v[0][2] = __fadd_rn(v[0][2], q.z);
        v[0][3] = __fadd_rn(v[0][3], q.w);
    }
    unscale_sums<ACT>(v, p.count, lane, ACT == 2 ? xs_emax2(stg) : nullptr);
    mm_epilogue<1, ACT, EPI>(c, rt, p.count, p.plist, p.slot0, lane, 1, v);
}

/* TAIL: the instantiation with the last items by chunks (NT = 1 only); the host takes the one
 * without where no block can have a tail (td_dec_tail_possible), so those launches run no
 * code of it. */
template <int WK, int ACT, int CH, int NT, bool TAIL, int EPI, int DW>
__global__ void __launch_bounds__(DW * 32, dec_blocks(NT, DW)) k_dec(mm_args a, int tbx)
{
    const cu_tl_guard tl_(mm_tl_role(false, EPI >= 0 ? EPI : a.c.epi));
    static_assert(NT == 1 || !TAIL, "the last items by chunks are for one token tile");
    static_assert(DW == dec_warps(NT) || (NT == 1 && !TAIL && DW == DEC_NARROW_WARPS),
                  "the narrow blocks are for one token tile, without the tail");
    typedef dec_sizes<WK, CH> Z;
    extern __shared__ uint4 dec_sh[];
    __shared__ uint64_t bars[DW][DEC_STAGES];
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *ring = reinterpret_cast<uint8_t *>(dec_sh) + warp * DEC_STAGES * Z::chunk; /* this warp's buffers */
    uint64_t *bar = bars[warp];
    uint32_t *xs = reinterpret_cast<uint32_t *>(reinterpret_cast<uint8_t *>(dec_sh) + dec_ring_bytes_w(WK, CH, DW));
    const int NC = a.geo.NC, RT = (int)(c.W.R / 16);
    /* pdl 1 (early loads): the routes and groups are complete before this kernel starts, so it
     * lets its dependents launch, issues its first weight chunks, and waits for its
     * predecessor only before it reads the input rows; otherwise it waits first */
    const bool early = c.pdl == 1;
    if (!early) {
        cu_pdl_wait();
        tl_.waited();
    }
    cu_pdl_release();
    /* items: groups x blocks of DW row tiles, item = g * tbx + tb; this block's contiguous share */
    int it0, it1;
    td_dec_split tail;
    tail.tail_n = 0;
    if (NT >= 2 && c.perm) {
        dec_range_cost<NT>(c, tbx, it0, it1);
    } else {
        /* equal ranges; with one tile, the last items by chunks where they fit (dec_split.h) */
        td_dec_split_of(dec_items(c, tbx), TAIL ? a.geo.NC : 1, DW, (int)gridDim.x, (int)blockIdx.x, &tail);
        it0 = tail.it0;
        it1 = tail.it1;
    }
    if (it0 >= it1) return;
    if (lane < DEC_STAGES) cu_mbar_init(&bar[lane]);
    cu_mbar_init_fence();
    /* BF16 rows of one tile: the first staging's exponent buffer cleared (stage_x SC 1) */
    constexpr int SC = dec_sc<ACT, NT>();
    if constexpr (SC == 1) {
        if (threadIdx.x < XS_ROWS_MAX) xs_emax2(0)[threadIdx.x] = 0;
        __syncthreads();
    } else {
        __syncwarp();
    }
    int stg = 0; /* stagings so far: the parity of xs_emax2 */
    dec_pos cur;
    cur.g = it0 / tbx;
    cur.tb = it0 - cur.g * tbx;
    dec_group(a, cur);
    /* chunk k of this warp's stream lives in buffer k % DEC_STAGES; the issue cursor runs
     * DEC_STAGES chunks ahead of the computed one; a padding tile (rt >= RT) is neither issued
     * nor waited for */
    dec_stream<WK, CH, DW> is;
    is.start(a, cur, it0, it1, warp);
    const uint32_t ring_s = cu_smem_addr(ring), bar_s = cu_smem_addr(bar); /* shared-memory addresses */
    for (int st = 0; st < DEC_STAGES && is.more(); st++)
        is.issue(a, tbx, warp, lane, ring_s + st * Z::chunk, bar_s + st * 8);
    if (early) {
        cu_pdl_wait();
        tl_.waited();
    }
    stage_x<false, 4, SC>(a, cur.plist, cur.slot0, cur.count, xs, 0, -1, xs_emax2(0), xs_emax2(1));
    int slot = 0;
    uint32_t phases = 0; /* bit s: the phase buffer s waits for next */
    for (int it = it0; it < it1; it++) {
        const int rt = cur.tb * DW + warp;
        const bool live = rt < RT;
        /* the chunk sums added in chunk order from -0: -0 + x is x bit for bit (signed zeros,
         * subnormals and infinities included; a NaN stays a NaN and the epilogue's scaling
         * below makes every NaN the same), so the first chunk's sum is taken as it is without
         * a select per element, which cost a register move per element and chunk */
        float v[DEC_NA][4];
#pragma unroll
        for (int nt = 0; nt < DEC_NA; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) v[nt][e] = -0.0f;
        for (int ch = 0; ch < NC; ch++) {
            if (live) {
                cu_mbar_wait_warp(bar_s + slot * 8, phases >> slot & 1u);
                phases ^= 1u << slot;
                float p[DEC_NA][4];
                dec_chunk_n<WK, ACT, CH, NT>(a, cur, ring + slot * Z::chunk, xs, ch * CH, lane, p, xs_emax2(stg));
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) v[nt][e] = __fadd_rn(v[nt][e], p[nt][e]);
            }
            __syncwarp(); /* every lane is done with this buffer before it is refilled */
            /* refill this buffer with the chunk DEC_STAGES ahead */
            if (is.more()) is.issue(a, tbx, warp, lane, ring_s + slot * Z::chunk, bar_s + slot * 8);
            slot = slot + 1 == DEC_STAGES ? 0 : slot + 1;
        }
        if (live) {
            if constexpr (SC == 2)
                unscale_sums_f(v, lane, xs_unscale());
            else
                unscale_sums<ACT>(v, cur.count, lane, SC == 1 ? xs_emax2(stg) : nullptr);
            const int ntn = (cur.count + 7) / 8;
            mm_epilogue<NT, ACT, EPI>(c, rt, cur.count, cur.plist, cur.slot0, lane, ntn < NT ? ntn : NT, v);
        }
        if (it + 1 < it1) {
            const dec_pos nxt = dec_next(a, cur, tbx);
            if (nxt.g != cur.g) { /* the same for every thread: a uniform branch */
                __syncthreads(); /* every warp is done with the staged rows */
                stg++;
                stage_x<false, 4, SC>(a, nxt.plist, nxt.slot0, nxt.count, xs, 0, -1, xs_emax2(stg), xs_emax2(stg + 1));
            }
            cur = nxt;
        }
    }
    if (TAIL && tail.tail_n > 0) dec_tail_run<WK, ACT, CH, EPI>(a, tbx, tail, dec_sh, bar_s, xs, slot, phases, stg + 1);
}

/* ==== the routed W2 with the combine fused in (k_w2c) ==================================== */

/* Stage input row `slot` into this warp's own staged row xs (stage_x's layout, row 0; the warp's
 * own loop: with stage_x's block-wide index arithmetic, a division and a destination pointer
 * per load, k_w2c's routed part at M = 1 took 21.79-21.86 us against 21.22-21.44): 16
 * bytes per lane, a lane's loads of a round issued before its stores; columns at or beyond
 * in_cols become 0. BF16 inputs (ACT 2): the row's largest exponent field by a warp maximum,
 * the row multiplied by 2^bf16_row_shift of it, as stage_x does: in registers before the stores
 * where the row is one round of loads (K <= 1024: W2 of the production shape and its TP4
 * slice), otherwise in a second pass over the lane's own stores; returns that field (0 for
 * FP16). Ends with __syncwarp(). */
template <int ACT>
__device__ __forceinline__ int w2c_stage(const mm_args &a, int64_t slot, uint32_t *xs, int lane)
{
    const int valid = (int)(a.c.in_cols / 8), nv = (int)(a.c.W.K / 8);
    const uint4 *src = reinterpret_cast<const uint4 *>(a.c.in16 + (slot / a.c.in_div) * a.c.in_ld);
    int emax = 0;
    if (ACT == 2 && nv <= 4 * 32) {
        uint4 q4[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int v = lane + u * 32;
            q4[u] = v < valid ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
            const int e = bf16x4w_emax(q4[u]);
            emax = e > emax ? e : emax;
        }
        emax = (int)__reduce_max_sync(0xffffffffu, (unsigned)emax);
        const int sh = bf16_row_shift(emax);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int v = lane + u * 32;
            if (v < nv) store_x4<false>(bf16x4w_pow2(q4[u], sh), xs + xs_word(v, 0), 0);
        }
        __syncwarp();
        return emax;
    }
    for (int base = lane; base < nv; base += 4 * 32) {
        uint4 q4[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int v = base + u * 32;
            q4[u] = v < valid ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int v = base + u * 32;
            if (v < nv) {
                store_x4<false>(q4[u], xs + xs_word(v, 0), 0);
                if (ACT == 2) {
                    const int e = bf16x4w_emax(q4[u]);
                    emax = e > emax ? e : emax;
                }
            }
        }
    }
    if constexpr (ACT == 2) {
        /* each lane rescales the words it stored (v = lane mod 32 in both loops): no barrier */
        emax = (int)__reduce_max_sync(0xffffffffu, (unsigned)emax);
        const int sh = bf16_row_shift(emax);
        for (int v = lane; v < nv; v += 32) bf16_staged_pow2(xs + xs_word(v, 0), sh);
    }
    __syncwarp();
    return emax;
}

/* A warp's issue cursor in k_w2c: chunk ch of item it (token it / RT, row tile it % RT), the
 * matrix of the warp's slot of token t. */
struct w2c_stream {
    int it, it1, ch, t;
    int64_t mat;

    template <int CH>
    __device__ __forceinline__ void issue(const mm_args &a, int k, int RT, int warp, int lane, uint32_t buf,
                                          uint32_t bar)
    {
        typedef dec_sizes<0, CH> Z;
        const cu_mm_call &c = a.c;
        const int tt = it / RT, rt = it - tt * RT;
        if (tt != t) {
            t = tt;
            mat = (int64_t)c.ids[(int64_t)tt * k + warp] * c.mats_per_expert + c.mat_off;
        }
        const uint8_t *gw, *gs;
        dec_src<0, CH>(a, mat, rt, gw, gs);
        dec_issue<0, CH>(gw + (int64_t)ch * Z::w, gs + (int64_t)ch * Z::s, buf, bar, lane);
        if (++ch == a.geo.NC) {
            ch = 0;
            it++;
        }
    }
};

/* W2 of direct dispatch (group = one slot) with the combine fused in (moe_mma.cuh, cu_mm_w2c).
 * A block has one warp per slot of a token (k warps) and takes a contiguous range of items
 * (token t, row tile rt): warp j computes row tile rt of slot t*k + j exactly as k_dec computes
 * it (the same chunks in the same order, its own ring of DEC_STAGES bulk-copy buffers running
 * ahead over the block's items, its own staged input row) and stores it (the moe.expert_out
 * intermediate); its 16 rounded outputs go to shared memory and, after a block barrier, warp 0's
 * lanes 0..15 add the k slots of their row in slot order and the shared expert's term
 * (combine.cuh: the arithmetic of k_combine) and store the block output. No atomics, no state
 * shared between blocks: a row's combine waits for the block's k warps only, not for the whole
 * grid as a separate launch does. The slots' outputs of item i sit in buffer i % 2, so the
 * warps may compute item i + 1 while warp 0 combines item i. */
template <int ACT, int CH>
__global__ void __launch_bounds__(W2C_MAX_K * 32, 2) k_w2c(mm_args a, cu_w2c_args cb)
{
    const cu_tl_guard tl_(CU_TL_W2);
    constexpr int WK = 0; /* prepared storage (raw keeps k_dec and the separate combine: cu_mm_w2c_fits) */
    typedef dec_sizes<WK, CH> Z;
    extern __shared__ uint4 w2c_sh[];
    __shared__ uint64_t bars[W2C_MAX_K][DEC_STAGES];
    __shared__ uint16_t ys[2][W2C_MAX_K][16]; /* the slots' outputs of an item, by item parity */
    __shared__ float wk[W2C_MAX_K];           /* warp 0 only: the routing weights of its token */
    const cu_mm_call &c = a.c;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k = (int)cb.k, NC = a.geo.NC, RT = (int)(c.W.R / 16);
    uint8_t *ring = reinterpret_cast<uint8_t *>(w2c_sh) + warp * DEC_STAGES * Z::chunk;
    uint32_t *xs = reinterpret_cast<uint32_t *>(reinterpret_cast<uint8_t *>(w2c_sh) + k * DEC_STAGES * Z::chunk) +
                   warp * (int)a.geo.xs_w;
    /* pdl 1: the routes predate this kernel (k_dec's early loads) */
    const bool early = c.pdl == 1;
    if (!early) {
        cu_pdl_wait();
        tl_.waited();
    }
    cu_pdl_release();
    const int items = (int)(c.nslots / k) * RT, G = (int)gridDim.x, b = (int)blockIdx.x;
    const int per = items / G, rem = items - per * G;
    const int it0 = b * per + (b < rem ? b : rem), it1 = it0 + per + (b < rem ? 1 : 0);
    if (it0 >= it1) return;
    uint64_t *bar = bars[warp];
    if (lane < DEC_STAGES) cu_mbar_init(&bar[lane]);
    cu_mbar_init_fence();
    __syncwarp();
    const uint32_t ring_s = cu_smem_addr(ring), bar_s = cu_smem_addr(bar);
    w2c_stream is;
    is.it = it0;
    is.it1 = it1;
    is.ch = 0;
    is.t = -1;
    is.mat = 0;
    for (int st = 0; st < DEC_STAGES && is.it < it1; st++)
        is.issue<CH>(a, k, RT, warp, lane, ring_s + st * Z::chunk, bar_s + st * 8);
    if (early) {
        cu_pdl_wait();
        tl_.waited();
    }
    dec_pos cur;
    cur.g = 0;
    cur.tb = 0;
    cur.count = 1;
    cur.slot0 = 0;
    cur.plist = nullptr;
    cur.mat = 0;
    int t_staged = -1, slot = 0, row_e = 0;
    uint32_t phases = 0;
    float sg = 0.0f;
    for (int it = it0; it < it1; it++) {
        const int t = it / RT, rt = it - t * RT;
        const int64_t myslot = (int64_t)t * k + warp;
        if (t != t_staged) { /* every lane is done with the staged row: the chunk loop ends with __syncwarp */
            t_staged = t;
            cur.mat = (int64_t)c.ids[myslot] * c.mats_per_expert + c.mat_off;
            row_e = w2c_stage<ACT>(a, myslot, xs, lane);
            if (warp == 0) {
                if (lane < k) wk[lane] = cb.wts[(int64_t)t * k + lane];
                if (cb.sgdot) sg = cu_combine_gate(cb.sgdot[(int64_t)t * cb.sg_ld]);
                __syncwarp();
            }
        }
        const int r = rt * 16 + lane; /* warp 0, lanes 0..15: the row it combines */
        float shv = 0.0f;
        if (warp == 0 && lane < 16 && cb.sgdot && r < c.out_n)
            shv = cb.sh16 ? cu_from16(cb.sh16[(int64_t)t * cb.H + r], ACT) : cb.sh32[(int64_t)t * cb.H + r];
        float v[DEC_NA][4];
#pragma unroll
        for (int nt = 0; nt < DEC_NA; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) v[nt][e] = -0.0f; /* chunk sums from -0, as k_dec */
        for (int ch = 0; ch < NC; ch++) {
            cu_mbar_wait_warp(bar_s + slot * 8, phases >> slot & 1u);
            phases ^= 1u << slot;
            float p[DEC_NA][4];
            dec_chunk<WK, ACT, CH, 1>(a, cur, ring + slot * Z::chunk, xs, ch * CH, lane, p);
#pragma unroll
            for (int e = 0; e < 4; e++) v[0][e] = __fadd_rn(v[0][e], p[0][e]);
            __syncwarp(); /* every lane is done with this buffer before it is refilled */
            if (is.it < it1) is.issue<CH>(a, k, RT, warp, lane, ring_s + slot * Z::chunk, bar_s + slot * 8);
            slot = slot + 1 == DEC_STAGES ? 0 : slot + 1;
        }
        unscale_sums<ACT>(v, 1, lane, &row_e); /* one row: the warp's slot */
        mm_epilogue<1, ACT, CU_MM_STORE>(c, rt, 1, nullptr, myslot, lane, 1, v);
        /* token column 0 of the tile: lane (g, q = 0) holds rows g (v[0][0]) and g + 8 (v[0][2]) */
        const int par = (it - it0) & 1;
        if ((lane & 3) == 0) {
            ys[par][warp][lane >> 2] = (uint16_t)bits16(v[0][0], ACT);
            ys[par][warp][(lane >> 2) + 8] = (uint16_t)bits16(v[0][2], ACT);
        }
        __syncthreads();
        if (warp == 0 && lane < 16 && r < c.out_n) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) acc = cu_combine_add(acc, wk[j], cu_from16(ys[par][j][lane], ACT));
            if (cb.sgdot) acc = cu_combine_add(acc, sg, shv);
            cb.out[(int64_t)t * cb.H + r] = cu_round_act(acc, ACT);
        }
    }
}

/* k_group's slot-id array, padded past its end (to a multiple of 4 words, plus 4) so that the
 * compiler's wide loads of the last ids never reach into the counts that follow. */
__host__ __device__ static inline int64_t group_sid_words(int64_t nslots) { return (nslots + 3) / 4 * 4 + 4; }
/* k_group's row stride of its per-expert segment counts: seg rounded up to an odd number, so
 * that the lanes of a warp reading consecutive (expert, segment) entries hit distinct banks. */
__host__ __device__ static inline int group_stride(int seg) { return seg | 1; }
/* k_group's shared memory in int32 words: the slot array, the counts [E][group_stride(seg)],
 * and 32 words of scan partials. */
__host__ __device__ static inline int64_t group_words(int64_t nslots, int64_t E, int seg)
{
    return group_sid_words(nslots) + E * group_stride(seg) + 32;
}
/* Bits of a slot's expert in k_group's packed slot word (rank << bits | expert): the least
 * with E - 1 < 2^bits. */
__host__ __device__ static inline int group_ebits(int64_t E)
{
    int b = 1;
    while (b < 31 && ((int64_t)1 << b) < E) b++;
    return b;
}

/* Grouped dispatch of a small call (nslots <= GROUP_SMALL) on one block, thread s
 * holding slot s: k_group's groups, perm and count with no per-expert arrays (k_group clears,
 * counts and scans one count per expert and segment: 512 experts for a handful of slots).
 * Every thread walks the slots' experts in shared memory twice (cuda/group_pack.h, tested on
 * the host): first its slot's rank among the earlier slots of its expert, the expert's count
 * and the valid slots of lower experts (its position in perm); then, over the first slot of
 * each expert, the packs of lower experts (its expert's first group) and the total.
 * O(slots^2) steps of one shared-memory broadcast each. The same arrays as k_group, written
 * by other threads: perm lists each expert's slots in ascending slot order, groups in
 * ascending expert order, each expert's slots cut into packs of P in that order. */
__global__ void __launch_bounds__(GROUP_SMALL) k_group_small(const int32_t *ids, int ns, int ne, int P,
                                                             int32_t *n_groups, int32_t *g_mat, int32_t *g_start,
                                                             int32_t *g_count, int32_t *perm)
{
    const cu_tl_guard tl_(CU_TL_GROUP);
    __shared__ int32_t sid[GROUP_SMALL]; /* expert of each slot, -1 outside [0, E) or past ns */
    __shared__ int32_t npk[GROUP_SMALL]; /* packs of the slot's expert at its first slot, else 0 */
    const int s = threadIdx.x;
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    int e = -1;
    if (s < ns) {
        const int32_t id = ids[s];
        e = id >= 0 && id < ne ? id : -1;
    }
    sid[s] = e;
    __syncthreads();
    int rank, cnt, before;
    td_group_small_walk1(sid, ns, s, e, &rank, &cnt, &before);
    const bool lead = e >= 0 && rank == 0;
    const int mine = lead ? (cnt + P - 1) / P : 0;
    npk[s] = mine;
    __syncthreads();
    if (e >= 0) perm[before + rank] = s;
    int first, total;
    td_group_small_walk2(sid, npk, ns, e, &first, &total);
    for (int q = 0; q < mine; q++) {
        g_mat[first + q] = e;
        g_start[first + q] = before + q * P;
        g_count[first + q] = cnt - q * P < P ? cnt - q * P : P;
    }
    if (s == 0) *n_groups = total;
}

/* Grouped dispatch on one block, O(slots + segments x experts), every step spread over the
 * block's threads so that no warp walks a long chain of dependent steps (the kernel is bound
 * by latency, not by its work):
 * 0. the ids are loaded, eight independent loads per thread at a time, into the slot array
 *    (-1 outside [0, E)), and the counts are cleared;
 * 1. the slots are cut into `seg` contiguous segments (seg <= the block's warps); warp w walks
 *    segment w, NB batches of 32 slots at a time (NB = 1 where a segment has at most 32 slots,
 *    else 8): the lanes of a batch holding the same
 *    expert are found by one ballot per bit of the expert; then, batch after batch, each
 *    takes its rank in the segment (the expert's count so far plus its rank among those
 *    lanes) into its slot word (rank << ebits | expert), and the lowest of them advances the
 *    count;
 * 2. the counts, in (expert, segment) order, are scanned over the threads (each a contiguous
 *    run of entries) into the first position of each segment's slots of each expert; then
 *    thread t owns a contiguous run of experts: their slot totals (differences of first
 *    positions) and packs, scanned over the threads into each expert's first pack, and it
 *    writes their packs;
 * 3. warp w walks its segment again: each slot goes to its expert's first position for the
 *    segment plus its rank (independent steps), into shared memory where it fits (`stage`),
 *    then copied out in order.
 * So perm lists each expert's slots in ascending slot order, the same for every run and every
 * cut (the arrays of k_group_small and of td_cuda_group_check's reference). Slots whose id is
 * outside [0, E) are in no group. The host checks that ranks below ceil(nslots / seg) fit
 * 31 - ebits bits. */
template <int NB>
__global__ void __launch_bounds__(GROUP_THREADS, 1) k_group(const int32_t *ids, int64_t nslots, int64_t E, int P, int seg,
                                                            int ebits, bool stage, int32_t *n_groups, int32_t *g_mat,
                                                            int32_t *g_start, int32_t *g_count, int32_t *perm)
{
    const cu_tl_guard tl_(CU_TL_GROUP);
    extern __shared__ int32_t sh[];
    const int ns = (int)nslots, ne = (int)E, S = group_stride(seg);
    const int sw = (int)group_sid_words(nslots);
    int32_t *sid = sh;                     /* [sw]: packed slot words, -1 for no group */
    int32_t *wc = sh + sw;                 /* [E][S]: counts, then first positions */
    int *red = sh + sw + (int64_t)ne * S;  /* [32]: scan partials; then perm [nslots] if `stage` */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int emask = (int)((1u << ebits) - 1u);
    cu_pdl_wait();
    tl_.waited();
    cu_pdl_release();
    /* 0 */
    for (int base = 0; base < sw; base += 8 * GROUP_THREADS) {
        int32_t v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int s = base + j * GROUP_THREADS + tid;
            v[j] = s < ns ? ids[s] : -1;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int s = base + j * GROUP_THREADS + tid;
            if (s < sw) sid[s] = v[j] >= 0 && v[j] < ne ? v[j] : -1;
        }
    }
    for (int i = tid; i < ne * S; i += GROUP_THREADS) wc[i] = 0;
    __syncthreads();
    /* 1: NB batches of 32 slots at a time; their masks first (independent ballots), then the
     * counts' chain */
    const int len = (ns + seg - 1) / seg;
    const int s0 = warp * len, s1 = s0 + len < ns ? s0 + len : ns;
    const unsigned below = (1u << lane) - 1u;
    if (warp < seg)
        for (int b0 = s0; b0 < s1; b0 += NB * 32) {
            int32_t ev[NB];
            unsigned mv[NB];
#pragma unroll
            for (int i = 0; i < NB; i++) {
                const int s = b0 + 32 * i + lane;
                ev[i] = s < s1 ? sid[s] : -1;
                mv[i] = __ballot_sync(0xffffffffu, ev[i] >= 0);
            }
            /* the lanes holding the same expert: one ballot per bit of the expert (match.any
             * computes the same mask; with it the kernel took 22.4-22.9 us at 7,840 slots
             * against 19.2-19.8 with ballots one batch at a time: docs/perf.md) */
            for (int bit = 0; bit < ebits; bit++)
#pragma unroll
                for (int i = 0; i < NB; i++) {
                    const bool on = (ev[i] >> bit & 1) != 0;
                    const unsigned vote = __ballot_sync(0xffffffffu, on);
                    mv[i] &= on ? vote : ~vote;
                }
#pragma unroll
            for (int i = 0; i < NB; i++) {
                const int32_t e = ev[i];
                int c = 0;
                if (e >= 0) {
                    c = wc[e * S + warp];
                    sid[b0 + 32 * i + lane] = (c + __popc(mv[i] & below)) << ebits | e;
                }
                __syncwarp();
                if (e >= 0 && lane == __ffs(mv[i]) - 1) wc[e * S + warp] = c + __popc(mv[i]);
                __syncwarp();
            }
        }
    __syncthreads();
    /* 2: counts -> first positions, over the flat (expert, segment) order f = e * seg + w */
    const int nf = ne * seg, per = (nf + GROUP_THREADS - 1) / GROUP_THREADS;
    const int f0 = tid * per < nf ? tid * per : nf, f1 = f0 + per < nf ? f0 + per : nf;
    const int fe = f0 / seg, fw = f0 - fe * seg; /* the run's first entry */
    int mine = 0;
    for (int f = f0, e = fe, w = fw; f < f1; f++) {
        mine += wc[e * S + w];
        if (++w == seg) {
            w = 0;
            e++;
        }
    }
    int valid;
    int pos = block_excl(mine, red, valid);
    for (int f = f0, e = fe, w = fw; f < f1; f++) {
        const int i = e * S + w, c = wc[i];
        wc[i] = pos;
        pos += c;
        if (++w == seg) {
            w = 0;
            e++;
        }
    }
    __syncthreads();
    const int pe = (ne + GROUP_THREADS - 1) / GROUP_THREADS;
    const int e0 = tid * pe < ne ? tid * pe : ne, e1 = e0 + pe < ne ? e0 + pe : ne;
    int packs = 0;
    for (int e = e0; e < e1; e++) {
        const int n = (e + 1 < ne ? wc[(e + 1) * S] : valid) - wc[e * S];
        packs += (n + P - 1) / P;
    }
    int groups;
    int gb = block_excl(packs, red, groups);
    if (tid == 0) *n_groups = groups;
    for (int e = e0; e < e1; e++) {
        const int first = wc[e * S], n = (e + 1 < ne ? wc[(e + 1) * S] : valid) - first;
        for (int j = 0; j * P < n; j++) {
            g_mat[gb + j] = (int32_t)e;
            g_start[gb + j] = first + j * P;
            g_count[gb + j] = n - j * P < P ? n - j * P : P;
        }
        gb += (n + P - 1) / P;
    }
    /* 3 (wc holds the first positions since the barrier in the scan above): into shared
     * memory where it fits, then copied out in order (written directly to global memory, the
     * phase with its 7,840 scattered stores from one SM took 12,500-15,700 of the kernel's
     * 32,000-35,500 cycles at 7,840 slots: docs/perf.md) */
    int32_t *out = stage ? red + 32 : perm;
    if (warp < seg)
#pragma unroll 4
        for (int s = s0 + lane; s < s1; s += 32) {
            const int32_t v = sid[s];
            if (v >= 0) out[wc[(v & emask) * S + warp] + (v >> ebits)] = s;
        }
    if (stage) {
        __syncthreads();
        for (int i = tid; i < valid; i += GROUP_THREADS) perm[i] = out[i];
    }
}

/* ==== launchers ============================================================================== */

#define MM_SMEM_MAX (200 * 1024)
/* k_mm's staged rows, at most, for two blocks per SM (227 KB less two blocks' static and
 * reserved shared memory, rounded down) */
#define MM_SMEM_TWO (104 * 1024)
/* The decode kernel's dynamic shared memory, at most: the SM's 227 KB less its static barriers
 * (24 staged rows of K = 2560 plus the rings of 16 warps take 221.5 KB). */
#define DEC_SMEM_MAX (227 * 1024 - 1024)

/* The current device and its SM count. */
static td_status sm_count(int *dev, int *sms, td_err *err)
{
    TD_CU_TRY(err, cudaGetDevice(dev));
    TD_CU_TRY(err, cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev));
    return TD_OK;
}

static size_t dec_smem(int rings, int xrows, int64_t xs_w) { return (size_t)rings + (size_t)xrows * (size_t)xs_w * 4; }

/* Whether calls of matrix W with groups of up to xrows slots run on the decode kernel: NVFP4,
 * not `generic`, chunks of exactly 5 or 10 steps, 16-byte aligned weights and scales, and the
 * rings plus the staged rows within its shared memory. */
static bool dec_fits(const cu_qmat *W, int generic, int xrows)
{
    if (generic || W->kind != CU_W_NVFP4 || xrows < 1 || xrows > CU_MM_PACK_DEC) return false;
    const mm_geo g = geo_of(W->K);
    if (!(g.chunk == 10 || g.chunk == 5) || g.KS != g.NC * g.chunk || ((uintptr_t)W->w & 15) || ((uintptr_t)W->s & 15))
        return false;
    return dec_smem(dec_ring_bytes(W->raw ? 1 : 0, g.chunk, (xrows + 7) / 8), xrows, g.xs_w) <= DEC_SMEM_MAX;
}

template <int WK, int ACT, int NTMAX>
static cudaError_t set_smem_limit(void)
{
    return cudaFuncSetAttribute(k_mm<WK, ACT, NTMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, MM_SMEM_MAX);
}

template <int ACT, int WG>
static cudaError_t set_wgp_smem(void)
{
    return cudaFuncSetAttribute(k_wgp<ACT, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                WP_STAGES * wp_stage_bytes(ACT, WG));
}

/* The epilogue instances of one k_dec shape (dec_kernel). */
template <int WK, int ACT, int CH, int NT, bool TAIL, int DW = dec_warps(NT)>
static cudaError_t set_dec_epis(void)
{
    if constexpr (WK == 1) {
        return cudaFuncSetAttribute(k_dec<WK, ACT, CH, NT, TAIL, -1, DW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    DEC_SMEM_MAX);
    } else {
        cudaError_t e = cudaFuncSetAttribute(k_dec<WK, ACT, CH, NT, TAIL, CU_MM_SWIGLU, DW>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, DEC_SMEM_MAX);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(k_dec<WK, ACT, CH, NT, TAIL, CU_MM_STORE, DW>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, DEC_SMEM_MAX);
        return e;
    }
}

template <int WK, int ACT, int CH>
static cudaError_t set_dec_smem(void)
{
    cudaError_t e = set_dec_epis<WK, ACT, CH, 1, false>();
    if (e == cudaSuccess) e = set_dec_epis<WK, ACT, CH, 1, true>();
    if (e == cudaSuccess) e = set_dec_epis<WK, ACT, CH, 1, false, DEC_NARROW_WARPS>();
    if (e == cudaSuccess) e = set_dec_epis<WK, ACT, CH, 2, false>();
    if (e == cudaSuccess) e = set_dec_epis<WK, ACT, CH, 3, false>();
    if constexpr (WK == 0)
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(k_w2c<ACT, CH>, cudaFuncAttributeMaxDynamicSharedMemorySize, DEC_SMEM_MAX);
    return e;
}

td_status cu_mm_init(td_err *err)
{
    TD_CU_TRY(err, (set_smem_limit<0, 1, 1>()));
    TD_CU_TRY(err, (set_smem_limit<0, 1, 2>()));
    TD_CU_TRY(err, (set_smem_limit<0, 2, 1>()));
    TD_CU_TRY(err, (set_smem_limit<0, 2, 2>()));
    TD_CU_TRY(err, (set_smem_limit<1, 1, 1>()));
    TD_CU_TRY(err, (set_smem_limit<1, 1, 2>()));
    TD_CU_TRY(err, (set_smem_limit<1, 2, 1>()));
    TD_CU_TRY(err, (set_smem_limit<1, 2, 2>()));
    TD_CU_TRY(err, (set_smem_limit<2, 1, 1>()));
    TD_CU_TRY(err, (set_smem_limit<2, 1, 2>()));
    TD_CU_TRY(err, (set_smem_limit<2, 2, 1>()));
    TD_CU_TRY(err, (set_smem_limit<2, 2, 2>()));
    TD_CU_TRY(err, (set_dec_smem<0, 1, 10>()));
    TD_CU_TRY(err, (set_dec_smem<0, 2, 10>()));
    TD_CU_TRY(err, (set_dec_smem<1, 1, 10>()));
    TD_CU_TRY(err, (set_dec_smem<1, 2, 10>()));
    TD_CU_TRY(err, (set_dec_smem<0, 1, 5>()));
    TD_CU_TRY(err, (set_dec_smem<0, 2, 5>()));
    TD_CU_TRY(err, (set_dec_smem<1, 1, 5>()));
    TD_CU_TRY(err, (set_dec_smem<1, 2, 5>()));
    TD_CU_TRY(err, cudaFuncSetAttribute(k_group<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    TD_CU_TRY(err, cudaFuncSetAttribute(k_group<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    TD_CU_TRY(err, cudaFuncSetAttribute(k_gemm<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 / 2 - 1024));
    TD_CU_TRY(err, cudaFuncSetAttribute(k_gemm<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 / 2 - 1024));
    TD_CU_TRY(err, (set_wgp_smem<1, 1>()));
    TD_CU_TRY(err, (set_wgp_smem<1, 2>()));
    TD_CU_TRY(err, (set_wgp_smem<2, 1>()));
    TD_CU_TRY(err, (set_wgp_smem<2, 2>()));
    return TD_OK;
}

int64_t cu_mm_pack(int64_t nslots) { return td_pack_of(nslots); }

void cu_mm_range_groups(cu_mm_call *c, int64_t M)
{
    c->nslots = M;
    c->pack = cu_mm_pack(M);
    c->max_groups = (M + c->pack - 1) / c->pack;
}

int64_t cu_mm_group_pack(int64_t nslots, int64_t tokens, const cu_qmat *w13, const cu_qmat *w2, int generic)
{
    const int dec24 = nslots >= TD_GROUP_PREFILL_SLOTS && dec_fits(w13, generic, CU_MM_PACK_DEC) &&
                      dec_fits(w2, generic, CU_MM_PACK_DEC);
    return td_group_pack(nslots, tokens, dec24);
}

int64_t cu_mm_group_grid(int64_t nslots, int64_t E, int64_t pack) { return td_group_grid(nslots, E, pack); }

int64_t cu_mm_group_ws(int64_t tokens_max, int64_t k, int64_t E) { return td_group_ws(tokens_max, k, E); }

td_status cu_mm_group(const int32_t *ids, int64_t nslots, int64_t E, int64_t pack, int32_t *n_groups, int32_t *g_mat,
                      int32_t *g_start, int32_t *g_count, int32_t *perm, bool generic, bool pdl, cudaStream_t s,
                      td_err *err)
{
    if (pack < 1 || pack > CU_MM_PACK_DEC)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: grouping %lld slots in packs of %lld", (long long)nslots,
                          (long long)pack);
    if (!generic && nslots >= 1 && nslots <= GROUP_SMALL && E >= 1 && E < (1ll << 31)) {
        TD_CU_TRY(err, cu_launch(k_group_small, dim3(1), dim3(GROUP_SMALL), 0, s, pdl, ids, (int)nslots, (int)E,
                                 (int)pack, n_groups, g_mat, g_start, g_count, perm));
        TD_CU_LAUNCHED(err, "k_group_small");
        return TD_OK;
    }
    /* segments: one per 32 slots, at most one per warp, and as many as shared memory allows
     * (their counts take E x group_stride(seg) words); at least one (then the layout is the
     * slot ids and one count per expert). The block scans all E x seg counts, so a
     * decode-sized call takes few segments. The segments change no result: perm lists each
     * expert's slots in ascending slot order whatever the cut. */
    const size_t cap = 227 * 1024;
    const bool sizes_ok = nslots >= 1 && E >= 1 && E < (1ll << 31) && nslots < (1ll << 31) / 2;
    int seg = sizes_ok ? (int)((nslots + 31) / 32) : 1;
    if (seg > GROUP_THREADS / 32) seg = GROUP_THREADS / 32;
    while (seg > 1 && (size_t)group_words(nslots, E, seg) * 4 > cap) seg /= 2;
    const int ebits = group_ebits(E);
    if (!sizes_ok || (size_t)group_words(nslots, E, seg) * 4 > cap ||
        (nslots + seg - 1) / seg > ((int64_t)1 << (31 - ebits)))
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: grouping %lld slots over %lld experts is outside the kernel's "
                                             "range", (long long)nslots, (long long)E);
    const int64_t len = (nslots + seg - 1) / seg;
    /* perm staged in shared memory where it fits beside the rest */
    size_t bytes = (size_t)group_words(nslots, E, seg) * 4;
    const bool stage = bytes + (size_t)nslots * 4 <= cap;
    if (stage) bytes += (size_t)nslots * 4;
    /* one batch of 32 slots per round where a segment has no more (decode-sized calls: eight
     * batches' ballots for one cost 1 us at 160 slots), eight otherwise */
    if (len <= 32)
        TD_CU_TRY(err, cu_launch(k_group<1>, dim3(1), dim3(GROUP_THREADS), bytes, s, pdl, ids, nslots, E, (int)pack,
                                 seg, ebits, stage, n_groups, g_mat, g_start, g_count, perm));
    else
        TD_CU_TRY(err, cu_launch(k_group<8>, dim3(1), dim3(GROUP_THREADS), bytes, s, pdl, ids, nslots, E, (int)pack,
                                 seg, ebits, stage, n_groups, g_mat, g_start, g_count, perm));
    TD_CU_LAUNCHED(err, "k_group");
    return TD_OK;
}

template <int WK, int ACT, int NTMAX>
static td_status launch(const mm_args &a, dim3 grid, cudaStream_t s, td_err *err)
{
    const size_t smem = (size_t)a.xrows * (size_t)a.geo.xs_w * 4 * ((WK == 2 && ACT == 1) ? 2 : 1);
    if (smem > MM_SMEM_MAX)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: K = %lld needs %zu bytes of shared memory per block",
                          (long long)a.c.W.K, smem);
    TD_CU_TRY(err, cu_launch(k_mm<WK, ACT, NTMAX>, grid, dim3(MM_MAX_WARPS * 32), smem, s, a.c.pdl != 0, a));
    TD_CU_LAUNCHED(err, "k_mm");
    return TD_OK;
}

/* k_dec's instantiation: with the tail's code for one tile only; for prepared storage the
 * call's epilogue compiled in (launch_dec admits CU_MM_SWIGLU and 16-bit-only CU_MM_STORE), so
 * that neither instance carries the other's code (W2's kernel 2,200 machine instructions
 * instead of 3,032; block 0.3-3 us faster at decode sizes). Raw storage keeps one instance
 * that reads the epilogue at run time: specialised, its W13 kernel was compiled to 72
 * registers instead of 79 and the block ran 0.7-2% slower (docs/perf.md). */
template <int WK, int ACT, int CH, int NT, bool TAIL, int DW = dec_warps(NT)>
static void (*dec_kernel(int epi))(mm_args, int)
{
    if constexpr (WK == 1) {
        (void)epi;
        return k_dec<WK, ACT, CH, NT, NT == 1 && TAIL, -1, DW>;
    } else {
        if (epi == CU_MM_SWIGLU) return k_dec<WK, ACT, CH, NT, NT == 1 && TAIL, CU_MM_SWIGLU, DW>;
        return k_dec<WK, ACT, CH, NT, NT == 1 && TAIL, CU_MM_STORE, DW>;
    }
}

/* Blocks per SM of a launch whose blocks take `smem` dynamic bytes (plus static and reserved:
 * `fixed`), at most `cap` (what the kernel's registers were built for). */
static int blocks_per_sm(size_t smem, size_t fixed, int cap)
{
    int bps = (int)((227 * 1024) / (smem + fixed));
    if (bps > cap) bps = cap;
    return bps < 1 ? 1 : bps;
}

/* A persistent grid for `items` work items: min(items, SMs x the blocks per SM that blocks_per_sm
 * allows), *bps set to the latter. */
static int64_t persistent_grid(int64_t items, size_t smem, size_t fixed, int cap, int sms, int *bps)
{
    *bps = blocks_per_sm(smem, fixed, cap);
    return items < (int64_t)sms * *bps ? items : (int64_t)sms * *bps;
}

/* The decode kernel's persistent grid for `groups` groups of a matrix of R rows on blocks of dw
 * warps (one row tile each) taking `smem` dynamic bytes, at most `cap` per SM: *tbx row-tile
 * blocks per group, *items = groups x *tbx, *bps blocks per SM. launch_dec, the narrow blocks'
 * grid and cu_mm_w2c_pays all size k_dec's grid here. */
static int64_t dec_grid(int64_t groups, int64_t R, int dw, size_t smem, int cap, int sms, int64_t *tbx,
                        int64_t *items, int *bps)
{
    *tbx = (R / 16 + dw - 1) / dw;
    *items = groups * *tbx;
    return persistent_grid(*items, smem, 1024, cap, sms, bps);
}

/* A grid that needs fewer blocks per SM than fit: the block scheduler may still stack two
 * or three of its blocks on one SM while other SMs idle (measured in the block's graph, the
 * shared expert running beside: W13's 100 blocks at M = 1 on 91 SMs, 9 of them with two), and
 * such an SM takes twice as long. Asking for more shared memory than the kernel uses caps the
 * blocks per SM at what the grid needs, so its blocks spread over the SMs (no bit changes: the
 * extra bytes are never touched; docs/perf.md). *launch_smem: the dynamic size to launch kern
 * with (smem, or the least size at which one block more than the grid needs per SM does not
 * fit); bps: the blocks per SM that smem allows. */
static td_status spread_smem(const void *kern, int64_t grid, int sms, int bps, int dev, size_t smem,
                             size_t *launch_smem, td_err *err)
{
    *launch_smem = smem;
    const int need = (int)((grid + sms - 1) / sms);
    if (need >= bps) return TD_OK;
    int per_sm = 0, reserved = 0;
    cudaFuncAttributes fa;
    TD_CU_TRY(err, cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    TD_CU_TRY(err, cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    TD_CU_TRY(err, cudaFuncGetAttributes(&fa, kern));
    /* the least dynamic size at which need + 1 blocks exceed the SM's shared memory */
    const size_t fixed = fa.sharedSizeBytes + (size_t)reserved, cap = (size_t)per_sm / (size_t)(need + 1) + 1;
    if (cap > fixed && cap - fixed > smem && cap - fixed <= (size_t)DEC_SMEM_MAX) *launch_smem = cap - fixed;
    return TD_OK;
}

/* Launch the persistent kernel kern (`what`: its name in errors) with args on `grid` blocks of
 * `threads` threads (bps blocks per SM fit; smem: the dynamic bytes it uses, raised by
 * spread_smem where the grid needs fewer blocks per SM); a programmatic dependent launch where
 * pdl. k_dec and k_w2c. */
template <typename... P, typename... A>
static td_status spread_launch(void (*kern)(P...), const char *what, int64_t grid, int threads, int bps, size_t smem,
                               int sms, int dev, cudaStream_t s, bool pdl, td_err *err, A... args)
{
    size_t launch_smem = smem;
    const td_status pst = spread_smem((const void *)kern, grid, sms, bps, dev, smem, &launch_smem, err);
    if (pst) return pst;
    TD_CU_TRY(err, cu_launch(kern, dim3((unsigned)grid), dim3((unsigned)threads), launch_smem, s, pdl, args...));
    TD_CU_LAUNCHED(err, what);
    return TD_OK;
}

/* The narrow blocks' grid for a one-tile call c of direct dispatch (groups known on the host:
 * nslots / pack) with wk storage, chunks of `chunk` steps and xrows staged rows of xs_w words, or
 * 0 where the call does not ask for them or they do not fit; *tbxn: row-tile blocks of
 * DEC_NARROW_WARPS per group, *bpsn: blocks per SM, *smemn: dynamic bytes. Whether they pay is
 * td_dec_narrow_pays. */
static int64_t dec_narrow_grid(const cu_mm_call &c, int wk, int chunk, int xrows, int64_t xs_w, int sms, int64_t *tbxn,
                               int *bpsn, size_t *smemn)
{
    if (!c.dec_narrow || c.perm) return 0;
    *smemn = dec_smem(dec_ring_bytes_w(wk, chunk, DEC_NARROW_WARPS), xrows, xs_w);
    if (*smemn > DEC_SMEM_MAX) return 0;
    int64_t items = 0;
    const int64_t grid = dec_grid((c.nslots + c.pack - 1) / c.pack, c.W.R, DEC_NARROW_WARPS, *smemn, DEC_NARROW_BLOCKS,
                                  sms, tbxn, &items, bpsn);
    return items <= 0 || items > 0x7fffffff ? 0 : grid;
}

template <int WK, int ACT, int CH, int NT>
static td_status launch_dec(const mm_args &a, cudaStream_t s, td_err *err)
{
    constexpr int DW = dec_occupancy<NT>::warps;
    const size_t smem = dec_smem(dec_rings<WK, CH, NT>::bytes, a.xrows, a.geo.xs_w);
    if (smem > DEC_SMEM_MAX)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: K = %lld needs %zu bytes of shared memory per block",
                          (long long)a.c.W.K, smem);
    int dev = 0, sms = 0;
    const td_status sst = sm_count(&dev, &sms, err);
    if (sst) return sst;
    /* blocks per SM: what shared memory allows, at most what the registers were built for */
    int64_t tbx = 0, items = 0;
    int bps = 0;
    const int64_t grid = dec_grid(a.c.max_groups, a.c.W.R, DW, smem, dec_occupancy<NT>::blocks, sms, &tbx, &items, &bps);
    if (items > 0x7fffffff)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld work items in one launch", (long long)items);
    if (!(a.c.epi == CU_MM_SWIGLU || (a.c.epi == CU_MM_STORE && !a.c.out)))
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: epilogue %d with float outputs on the decode kernel", a.c.epi);
    if constexpr (NT == 1) {
        /* the narrow blocks where the call asks for them and they walk fewer rounds; the same
         * chunks and sums per row tile, so the same bits */
        int64_t tbxn = 0;
        int bpsn = 0;
        size_t smemn = 0;
        const int64_t gridn = dec_narrow_grid(a.c, WK, CH, a.xrows, a.geo.xs_w, sms, &tbxn, &bpsn, &smemn);
        const int64_t groups = (a.c.nslots + a.c.pack - 1) / a.c.pack; /* <= its items < 2^31 when gridn > 0 */
        if (gridn > 0 && td_dec_narrow_pays((int)groups, (int)(a.c.W.R / 16), a.geo.NC, (int)grid, (int)gridn))
            return spread_launch(dec_kernel<WK, ACT, CH, 1, false, DEC_NARROW_WARPS>(a.c.epi), "k_dec", gridn,
                                 DEC_NARROW_WARPS * 32, bpsn, smemn, sms, dev, s, a.c.pdl != 0, err, a, (int)tbxn);
    }
    /* one tile: the kernel with the last items by chunks where a block may take some (the item
     * count is known here for direct dispatch; grouped dispatch counts its groups on the device) */
    bool tail = false;
    if (NT == 1) {
        const int64_t n = a.c.perm ? items : (a.c.nslots + a.c.pack - 1) / a.c.pack * tbx;
        /* n <= items, as max_groups bounds the groups; were it not, the kernel with the tail is
         * the safe choice (and n need not fit an int) */
        tail = n > items || td_dec_tail_possible((int)n, !a.c.perm, a.geo.NC, DW, (int)grid);
    }
    return spread_launch(tail ? dec_kernel<WK, ACT, CH, NT, true>(a.c.epi) : dec_kernel<WK, ACT, CH, NT, false>(a.c.epi),
                         "k_dec", grid, DW * 32, bps, smem, sms, dev, s, a.c.pdl != 0, err, a, (int)tbx);
}

template <int WK, int ACT>
static td_status launch_nt(const mm_args &a, int ntmax, dim3 grid, cudaStream_t s, td_err *err)
{
    return ntmax == 1 ? launch<WK, ACT, 1>(a, grid, s, err) : launch<WK, ACT, 2>(a, grid, s, err);
}

template <int WK, int ACT, int CH>
static td_status launch_dec_nt(const mm_args &a, cudaStream_t s, td_err *err)
{
    if (a.xrows > 16) return launch_dec<WK, ACT, CH, 3>(a, s, err);
    return a.xrows > 8 ? launch_dec<WK, ACT, CH, 2>(a, s, err) : launch_dec<WK, ACT, CH, 1>(a, s, err);
}

template <int WK, int ACT>
static td_status launch_dec_ch(const mm_args &a, bool c10, cudaStream_t s, td_err *err)
{
    return c10 ? launch_dec_nt<WK, ACT, 10>(a, s, err) : launch_dec_nt<WK, ACT, 5>(a, s, err);
}

static td_status launch_dec_pick(const mm_args &a, int WK, int act, bool c10, cudaStream_t s, td_err *err)
{
    if (WK == 0) return act == 1 ? launch_dec_ch<0, 1>(a, c10, s, err) : launch_dec_ch<0, 2>(a, c10, s, err);
    return act == 1 ? launch_dec_ch<1, 1>(a, c10, s, err) : launch_dec_ch<1, 2>(a, c10, s, err);
}

/* Whether k_gemm's grid holds at least one block per SM: each of its warps walks the whole K
 * of its row tile, so with fewer blocks than SMs their weight loads do not hide one another and
 * k_mm is faster (the router at 784 tokens: 125 blocks; docs/perf.md). */
static td_status gemm_fills(const mm_args &a, bool *use, td_err *err)
{
    int dev = 0, sms = 0;
    const td_status sst = sm_count(&dev, &sms, err);
    if (sst) return sst;
    const int64_t RT = a.c.W.R / 16, TB = (a.c.nslots + GM_NT * 8 - 1) / (GM_NT * 8);
    *use = (RT + GM_WARPS - 1) / GM_WARPS * TB >= (int64_t)sms;
    return TD_OK;
}

/* k_gemm over the call's slots (range groups on one matrix): GM_WARPS row tiles by GM_NT * 8
 * tokens per block, two buffers of staged chunks. */
static td_status launch_gemm(const mm_args &a, cudaStream_t s, td_err *err)
{
    const int64_t RT = a.c.W.R / 16, TB = (a.c.nslots + GM_NT * 8 - 1) / (GM_NT * 8);
    if (TB > 65535) return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld tokens in one launch", (long long)a.c.nslots);
    const size_t smem = (size_t)gm_copy_words(a.geo) * (a.c.act == 1 ? 2 : 1) * 2 * 4;
    const dim3 grid((unsigned)((RT + GM_WARPS - 1) / GM_WARPS), (unsigned)TB);
    if (a.c.act == 1) TD_CU_TRY(err, cu_launch(k_gemm<1>, grid, dim3(GM_WARPS * 32), smem, s, a.c.pdl != 0, a));
    else TD_CU_TRY(err, cu_launch(k_gemm<2>, grid, dim3(GM_WARPS * 32), smem, s, a.c.pdl != 0, a));
    TD_CU_LAUNCHED(err, "k_gemm");
    return TD_OK;
}

/* k_wgp over the call's slots (range groups on one matrix, FP16 or BF16 inputs): WG * 64 rows by
 * WP_NT * 8 tokens per block. Two consumer warpgroups (128 rows, one block per SM) where their
 * grid leaves at most a tenth of the SMs without a block (at M = 784 the shared expert's W13, 130
 * blocks, and W2, 260); one (64 rows, two blocks per SM) otherwise, e.g. the router's 513 rows
 * (65 blocks of 128 rows). Measured at M = 784 (ncu, docs/perf.md): the shared W13 takes 58.5 us
 * on one, 48.1 on two; the router 33.3 on one, 41.2 on two. The rows of a block change no bit
 * (each output's sequence is its own). */
template <int ACT>
static td_status launch_wgp_act(const mm_args &a, cudaStream_t s, td_err *err)
{
    const int64_t RT = a.c.W.R / 16, TB = (a.c.nslots + WP_NT * 8 - 1) / (WP_NT * 8);
    if (TB > 65535) return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld tokens in one launch", (long long)a.c.nslots);
    int dev = 0, sms = 0;
    const td_status sst = sm_count(&dev, &sms, err);
    if (sst) return sst;
    const int wg = (RT + 7) / 8 * TB * 10 >= (int64_t)sms * 9 ? 2 : 1;
    const dim3 grid((unsigned)((RT + 4 * wg - 1) / (4 * wg)), (unsigned)TB);
    const size_t smem = (size_t)WP_STAGES * wp_stage_bytes(ACT, wg);
    const bool pdl = a.c.pdl != 0;
    if (!a.c.split_ws || a.c.in_div != 1)
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: k_wgp needs a split workspace and one input row per slot");
    const int nst = (int)(a.geo.KS / WP_SS);
    const int64_t pieces = TB * nst * (WP_XBYTES / 16);
    if (!a.c.presplit) {
        TD_CU_TRY(err, cu_launch(k_wsplit<ACT>, dim3((unsigned)((pieces + 255) / 256)), dim3(256), 0, s, pdl, a.c.in16,
                                 a.c.in_ld, a.c.nslots, a.c.in_cols, nst, pieces, a.c.split_ws));
        TD_CU_LAUNCHED(err, "k_wsplit");
    }
    /* a dependent launch after k_wsplit: k_wgp waits for the split before it reads it
     * (cu_pdl_wait); presplit, the call's own pdl */
    const bool dep = a.c.presplit ? pdl : true;
    if (wg == 2) TD_CU_TRY(err, cu_launch(k_wgp<ACT, 2>, grid, dim3(wp_threads(2)), smem, s, dep, a));
    else TD_CU_TRY(err, cu_launch(k_wgp<ACT, 1>, grid, dim3(wp_threads(1)), smem, s, dep, a));
    TD_CU_LAUNCHED(err, "k_wgp");
    return TD_OK;
}

static td_status launch_wgp(const mm_args &a, cudaStream_t s, td_err *err)
{
    return a.c.act == 1 ? launch_wgp_act<1>(a, s, err) : launch_wgp_act<2>(a, s, err);
}

/* The stages of k_wgp's layout when cu_mm runs call c (whose split_ws is not tested) on k_wgp,
 * else 0: BF16 matrices, range groups, prefill-sized, one input row per slot, K in chunks of an
 * even number of steps. */
static int wgp_stages(const cu_mm_call *c, const mm_geo &g)
{
    if (c->W.kind == CU_W_NVFP4 || c->nslots < 256 || c->perm || c->ids || c->generic || c->in_div != 1 ||
        g.chunk % WP_SS != 0 || g.KS % WP_SS != 0 || (c->act != 1 && c->act != 2))
        return 0;
    return (int)(g.KS / WP_SS);
}

int cu_mm_wgp_stages(const cu_mm_call *c) { return wgp_stages(c, geo_of(c->W.K)); }

td_status cu_mm_round_split(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H, int act, int nst,
                            uint8_t *split, cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    if ((act != 1 && act != 2) || nst <= 0 || H <= 0 || H % 8 || H > (int64_t)nst * WP_SS * 32 || !split)
        return td_err_set(err, TD_ERR_ARG, "cuda moe: split rounding of %lld columns in %d stages (act %d)", (long long)H,
                          nst, act);
    const int64_t TB = (M + WP_NT * 8 - 1) / (WP_NT * 8), pieces = TB * nst * (WP_XBYTES / 16);
    const dim3 grid((unsigned)((pieces + 255) / 256));
    if (act == 1) k_round_split<1><<<grid, 256, 0, s>>>(x, xa, x16, M, H, nst, pieces, split);
    else k_round_split<2><<<grid, 256, 0, s>>>(x, xa, x16, M, H, nst, pieces, split);
    TD_CU_LAUNCHED(err, "k_round_split");
    return TD_OK;
}

int64_t cu_mm_split_bytes(int64_t tokens, int64_t K)
{
    return (tokens + WP_NT * 8 - 1) / (WP_NT * 8) * ((K + WP_SS * 32 - 1) / (WP_SS * 32)) * wp_split_bytes(1);
}

int64_t cu_mm_stage_words(int64_t K) { return xs_words(K / 32); }

int64_t cu_mm_stage_plane(int64_t M, int64_t H) { return M * cu_mm_stage_words(round_up(H, 32)); }

int64_t cu_mm_stage_bytes(int64_t tokens, int64_t H) { return 2 * cu_mm_stage_plane(tokens, H) * 4; }

int64_t cu_mm_input_ws_bytes(int64_t tokens, int64_t H)
{
    const int64_t a = cu_mm_split_bytes(tokens, H), b = cu_mm_stage_bytes(tokens < 255 ? tokens : 255, H);
    return a > b ? a : b;
}

td_status cu_mm_round_stage(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H, int act, uint32_t *img,
                            cudaStream_t s, td_err *err)
{
    if (M <= 0) return TD_OK;
    const int64_t W = cu_mm_stage_words(round_up(H, 32));
    if ((act != 1 && act != 2) || H <= 0 || H % 8 || M >= 256 || !img || (uintptr_t)img % 16)
        return td_err_set(err, TD_ERR_ARG, "cuda moe: staging %lld rows of %lld columns (act %d) for k_mm",
                          (long long)M, (long long)H, act);
    const int64_t pieces = M * (W / 4);
    const dim3 grid((unsigned)((pieces + 255) / 256));
    if (act == 1) k_round_stage<1><<<grid, 256, 0, s>>>(x, xa, x16, M, H, (int)W, pieces, img);
    else k_round_stage<2><<<grid, 256, 0, s>>>(x, xa, x16, M, H, (int)W, pieces, img);
    TD_CU_LAUNCHED(err, "k_round_stage");
    return TD_OK;
}

/* The checks every projection call passes before it is launched (cu_mm, cu_mm_w2c). */
static td_status mm_check(const cu_mm_call *c, td_err *err)
{
    if (c->act != 1 && c->act != 2)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda moe: the tensor-core path needs act_dtype fp16 or bf16");
    if (c->max_groups > 65535)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: %lld groups in one launch", (long long)c->max_groups);
    if (c->in_cols > c->W.K || (c->in_cols & 15) || (c->in_ld & 7) || ((uintptr_t)c->in16 & 15))
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: input of %lld columns (ld %lld) for K = %lld",
                          (long long)c->in_cols, (long long)c->in_ld, (long long)c->W.K);
    if (c->out16 && ((c->out_ld & 1) || ((uintptr_t)c->out16 & 3)))
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: 16-bit output with an odd row stride (%lld) or unaligned",
                          (long long)c->out_ld);
    if (c->pack < 1 || c->pack > CU_MM_PACK_DEC)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: pack %lld outside 1..%d", (long long)c->pack, CU_MM_PACK_DEC);
    if (c->W.kind == CU_W_NVFP4 && (c->W.bf16_words != 0) != (c->act == 2))
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: NVFP4 words in the %s placement for act_dtype %s",
                          c->W.bf16_words ? "BF16" : "FP16", c->act == 2 ? "bf16" : "fp16");
    return TD_OK;
}

td_status cu_mm(const cu_mm_call *c, cudaStream_t s, td_err *err)
{
    if (c->max_groups <= 0) return TD_OK;
    const td_status cst = mm_check(c, err);
    if (cst) return cst;
    mm_args a;
    a.c = *c;
    a.geo = geo_of(c->W.K);
    /* prefill-sized calls: one warp per row tile and all chunks (8 tiles share the inputs in
     * L1); decode-sized calls: the chunks of a tile on NC warps. Same bits either way. */
    a.split = c->nslots < 256;
    a.kparts = 1;
    const int nk = a.split ? a.geo.NC : 1, rpb = MM_MAX_WARPS / nk;
    /* staged rows: the most slots a group can hold */
    a.xrows = (int)(c->pack < c->nslots ? c->pack : c->nslots);
    const int ntmax = a.xrows > 8 ? 2 : 1;
    const int WK = c->W.kind == CU_W_NVFP4 ? (c->W.raw ? 1 : 0) : 2;
    const int64_t RT = c->W.R / 16;
    /* the staged image only where k_mm runs the chunks on NC warps over range groups */
    if (!(WK == 2 && a.split && !c->generic && !c->perm && !c->ids && c->in_div == 1)) a.c.xst = NULL;
    if (a.c.xst && ((uintptr_t)a.c.xst % 16 || a.c.xst_plane % 4 || a.c.xst_plane < c->nslots * a.geo.xs_w))
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: a staged input image that is misaligned or smaller than "
                          "%lld rows", (long long)c->nslots);
    dim3 grid((unsigned)((RT + rpb - 1) / rpb), (unsigned)c->max_groups);
    if (dec_fits(&c->W, c->generic, a.xrows))
        return launch_dec_pick(a, WK, c->act, a.geo.chunk == 10, s, err);
    /* k_wgp: calls with a split workspace (FP16 inputs split once by k_wsplit, BF16 inputs laid
     * out once by it); calls without one take k_gemm */
    if (c->split_ws && wgp_stages(c, a.geo)) return launch_wgp(a, s, err);
    if (c->presplit)
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: a presplit input for a call that does not run on k_wgp");
    if (WK == 2 && !a.split && !c->perm && !c->ids && c->in_div == 1 && !c->generic && a.geo.chunk <= GM_CHUNK) {
        bool use = false;
        const td_status st = gemm_fills(a, &use, err);
        if (st) return st;
        if (use) return launch_gemm(a, s, err);
    }
    if (a.xrows > 2 * 8)
        return td_err_set(err, TD_ERR_RANGE, "cuda moe: groups of %d slots need the decode kernel", a.xrows);
    /* prefill-sized calls whose staged rows would keep k_mm to one block per SM (BF16 weights
     * with FP16 inputs, whose rows are staged twice, hi and lo, at K = 2560: 166 KB) stage K
     * in two halves instead (same sums, same order) */
    if (WK == 2 && c->act == 1 && ntmax == 2 && !a.split && a.geo.NC % 2 == 0 &&
        (size_t)a.xrows * (size_t)a.geo.xs_w * 4 * 2 > MM_SMEM_TWO) {
        a.kparts = 2;
        a.geo.xs_w = xs_words((int64_t)(a.geo.NC / 2) * a.geo.chunk);
    }
    if (WK == 0) return c->act == 1 ? launch_nt<0, 1>(a, ntmax, grid, s, err) : launch_nt<0, 2>(a, ntmax, grid, s, err);
    if (WK == 1) return c->act == 1 ? launch_nt<1, 1>(a, ntmax, grid, s, err) : launch_nt<1, 2>(a, ntmax, grid, s, err);
    return c->act == 1 ? launch_nt<2, 1>(a, ntmax, grid, s, err) : launch_nt<2, 2>(a, ntmax, grid, s, err);
}

/* ==== the routed W2 with the combine fused in =================================================== */

static size_t w2c_smem(int64_t k, const mm_geo &g)
{
    return (size_t)k * ((size_t)DEC_STAGES * (size_t)dec_chunk_bytes(0, g.chunk) + (size_t)g.xs_w * 4);
}

/* k_w2c's grid for a call of `items` (token x row tile) items: persistent, at most two blocks
 * per SM (its launch bounds; its static barriers and buffers take < 1 KB), as its shared memory
 * allows. */
static int64_t w2c_grid(int64_t items, size_t smem, int sms, int *bps)
{
    return persistent_grid(items, smem, 2048, 2, sms, bps);
}

bool cu_mm_w2c_fits(const cu_mm_call *c, int64_t k)
{
    return k >= 1 && k <= W2C_MAX_K && c->ids && !c->perm && c->pack == 1 && c->nslots >= k && c->nslots % k == 0 &&
           c->epi == CU_MM_STORE && !c->out && c->out16 && !c->W.raw && dec_fits(&c->W, c->generic, 1) &&
           w2c_smem(k, geo_of(c->W.K)) <= DEC_SMEM_MAX && c->nslots / k * (c->W.R / 16) <= 0x7fffffff;
}

bool cu_mm_w2c_pays(const cu_mm_call *c, int64_t k)
{
    int dev = 0, sms = 0, bps = 0;
    td_err err;
    if (!cu_mm_w2c_fits(c, k) || sm_count(&dev, &sms, &err)) return false;
    /* the grids both launches would take: k_dec's W2 (one 8-token tile, 8 warps) and k_w2c's */
    const mm_geo g = geo_of(c->W.K);
    const int64_t RT = c->W.R / 16, tokens = c->nslots / k, DW = dec_occupancy<1>::warps;
    int64_t tbx = 0, items_dec = 0;
    const int B = (int)dec_grid(c->nslots, c->W.R, (int)DW, dec_smem(dec_ring_bytes(0, g.chunk, 1), 1, g.xs_w),
                                dec_occupancy<1>::blocks, sms, &tbx, &items_dec, &bps);
    if (items_dec > 0x7fffffff) return false;
    const int G = (int)w2c_grid(tokens * RT, w2c_smem(k, g), sms, &bps);
    return td_w2c_pays((int)tokens, (int)k, (int)RT, g.NC, (int)DW, B, G) != 0;
}

template <int ACT, int CH>
static td_status launch_w2c(const mm_args &a, const cu_w2c_args &cb, cudaStream_t s, td_err *err)
{
    const size_t smem = w2c_smem(cb.k, a.geo);
    int dev = 0, sms = 0, bps = 0;
    const td_status sst = sm_count(&dev, &sms, err);
    if (sst) return sst;
    const int64_t grid = w2c_grid(a.c.nslots / cb.k * (a.c.W.R / 16), smem, sms, &bps);
    return spread_launch(k_w2c<ACT, CH>, "k_w2c", grid, (int)(cb.k * 32), bps, smem, sms, dev, s, a.c.pdl != 0, err, a,
                         cb);
}

template <int ACT>
static td_status launch_w2c_ch(const mm_args &a, const cu_w2c_args &cb, cudaStream_t s, td_err *err)
{
    return a.geo.chunk == 10 ? launch_w2c<ACT, 10>(a, cb, s, err) : launch_w2c<ACT, 5>(a, cb, s, err);
}

td_status cu_mm_w2c(const cu_mm_call *c, const cu_w2c_args *cb, cudaStream_t s, td_err *err)
{
    if (c->nslots <= 0) return TD_OK;
    if (!cu_mm_w2c_fits(c, cb->k) || !cb->out || !cb->wts || (cb->sgdot && !cb->sh16 && !cb->sh32) ||
        cb->H != c->out_n)
        return td_err_set(err, TD_ERR_INTERNAL, "cuda moe: a W2 call of %lld slots (top-%lld) that the fused combine "
                          "does not take", (long long)c->nslots, (long long)cb->k);
    const td_status cst = mm_check(c, err);
    if (cst) return cst;
    mm_args a;
    memset(&a, 0, sizeof a);
    a.c = *c;
    a.geo = geo_of(c->W.K);
    a.xrows = 1;
    a.kparts = 1;
    return c->act == 1 ? launch_w2c_ch<1>(a, *cb, s, err) : launch_w2c_ch<2>(a, *cb, s, err);
}

/* ==== check of cu_mm_round_split ================================================================ */

/* The layout's byte offset of input (t, c) in plane `plane` (0 hi / BF16, 1 lo), from the
 * formula of the split layout's comment: piece p = (c % 64) / 8 of token t = jn * 8 + n8 at
 * (p / 2) * 2048 + jn * WG_SBO + (p % 2) * WG_LBO + n8 * 16 of its stage's plane. broken: the
 * two roles of p swapped (the check's own test). */
static size_t split_offset(int64_t t, int64_t c, int nst, int planes, int plane, int broken)
{
    const int64_t tb = t / 64, jn = (t % 64) / 8, n8 = t % 8, st = c / 64, p = (c % 64) / 8;
    const int64_t kb = broken ? (p & 3) : p / 2, half = broken ? p / 4 : p % 2;
    return (size_t)((tb * nst + st) * planes * 8192 + plane * 8192 + kb * 2048 + jn * 256 + half * 128 + n8 * 16 +
                    (c % 8) * 2);
}

static bool same16(uint16_t a, uint16_t b, int act)
{
    if (a == b) return true;
    const float fa = act == 1 ? td_f16_to_f32(a) : td_bf16_to_f32(a), fb = act == 1 ? td_f16_to_f32(b) : td_bf16_to_f32(b);
    return fa != fa && fb != fb; /* NaNs: any payload */
}

/* n seeded inputs of the round checks: uniform at scales 1e-3 .. 3e4, one in 16 an edge value
 * (signed zeros, FP16 / BF16 subnormals and overflow, infinities, NaN, rounding ties). */
static void round_inputs(float *hx, int64_t n, uint64_t seed)
{
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -7e4f, 1e-7f, -6e-8f,
                                    3e-8f, 5.96046448e-8f, 1e-40f, 3.0e38f, INFINITY, -INFINITY, NAN, 1.00390625f,
                                    1.005859375f, 0.333333343f};
    uint64_t r = seed;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t u = (uint32_t)(r >> 32);
        if ((u & 15) == 0) {
            hx[i] = special[(u >> 4) % (sizeof special / sizeof special[0])];
        } else {
            static const float scales[4] = {1e-3f, 1.0f, 3.0f, 3e4f};
            const float z = ((float)(u >> 8) / 16777216.0f) * 2.0f - 1.0f;
            hx[i] = z * scales[(u >> 4) & 3];
        }
    }
}

/* The round's x16 and xa (n values, then `canary` elements that must stay all-ones) against the
 * host's RNE conversions of hx; 0 or 1 with msg. */
static int round_outputs_check(const float *hx, const uint16_t *h16, const float *hxa, int64_t n, int64_t canary,
                               int64_t M, int64_t H, int act, char *msg, size_t cap)
{
    for (int64_t i = 0; i < n + canary; i++) {
        uint32_t xb;
        memcpy(&xb, &hxa[i], 4);
        if (i >= n) {
            if (xb != 0xFFFFFFFFu || h16[i] != 0xFFFF) {
                snprintf(msg, cap, "M %lld H %lld act %d: element %lld past the inputs written", (long long)M,
                         (long long)H, act, (long long)i);
                return 1;
            }
            continue;
        }
        const uint16_t want = act == 1 ? td_f32_to_f16(hx[i]) : td_f32_to_bf16(hx[i]);
        const float wf = act == 1 ? td_f16_to_f32(want) : td_bf16_to_f32(want);
        if (!same16(h16[i], want, act) || !(memcmp(&hxa[i], &wf, 4) == 0 || (wf != wf && hxa[i] != hxa[i]))) {
            snprintf(msg, cap, "M %lld H %lld act %d: input %lld (%g) rounds to 0x%04x (%g as float), expected 0x%04x",
                     (long long)M, (long long)H, act, (long long)i, (double)hx[i], h16[i], (double)hxa[i], want);
            return 1;
        }
    }
    return 0;
}

/* What the laid-out planes hold for the 16-bit input v: FP16 (act 1) its exact BF16 split, hi in
 * want[0] and lo in want[1]; BF16 (act 2) v itself in want[0] (want[1] 0, no second plane). */
static void planes_of(uint16_t v, int act, uint16_t want[2])
{
    want[0] = v;
    want[1] = 0;
    if (act == 1) {
        const float f = td_f16_to_f32(v);
        want[0] = td_f32_to_bf16(f);
        want[1] = td_f32_to_bf16(f - td_bf16_to_f32(want[0]));
    }
}

/* One case: M x H inputs, nst stages, act; returns 0, 1 (mismatch, msg), -1 (CUDA error). */
static int round_split_case(int64_t M, int64_t H, int nst, int act, uint64_t seed, int broken, char *msg, size_t cap)
{
    const int64_t n = M * H, canary = 64;
    const int planes = act == 1 ? 2 : 1;
    const size_t sbytes = (size_t)cu_mm_split_bytes(M, (int64_t)nst * 64) / (size_t)(3 - planes);
    float *hx = (float *)malloc((size_t)n * 4), *hxa = (float *)malloc((size_t)(n + canary) * 4);
    uint16_t *h16 = (uint16_t *)malloc((size_t)(n + canary) * 2);
    uint8_t *hs = (uint8_t *)malloc(sbytes + 256);
    float *dx = NULL, *dxa = NULL;
    uint16_t *d16 = NULL;
    uint8_t *ds = NULL;
    int rc = -1;
    if (!hx || !hxa || !h16 || !hs) goto done;
    round_inputs(hx, n, seed);
    if (cudaMalloc(&dx, (size_t)n * 4) || cudaMalloc(&dxa, (size_t)(n + canary) * 4) ||
        cudaMalloc(&d16, (size_t)(n + canary) * 2) || cudaMalloc(&ds, sbytes + 256))
        goto done;
    if (cudaMemcpy(dx, hx, (size_t)n * 4, cudaMemcpyHostToDevice) || cudaMemset(dxa, 0xFF, (size_t)(n + canary) * 4) ||
        cudaMemset(d16, 0xFF, (size_t)(n + canary) * 2) || cudaMemset(ds, 0xA5, sbytes + 256))
        goto done;
    {
        td_err err;
        memset(&err, 0, sizeof err);
        if (cu_mm_round_split(dx, dxa, d16, M, H, act, nst, ds, 0, &err)) {
            snprintf(msg, cap, "cu_mm_round_split: %s", err.msg);
            rc = 1;
            goto done;
        }
    }
    if (cudaDeviceSynchronize() || cudaMemcpy(hxa, dxa, (size_t)(n + canary) * 4, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(h16, d16, (size_t)(n + canary) * 2, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(hs, ds, sbytes + 256, cudaMemcpyDeviceToHost))
        goto done;
    rc = 1;
    if (round_outputs_check(hx, h16, hxa, n, canary, M, H, act, msg, cap)) goto done;
    {
        const int64_t T = (M + 63) / 64 * 64;
        size_t covered = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < (int64_t)nst * 64; c++) {
                const uint16_t v = t < M && c < H ? (act == 1 ? td_f32_to_f16(hx[t * H + c]) : td_f32_to_bf16(hx[t * H + c]))
                                                  : (uint16_t)0;
                uint16_t want[2];
                planes_of(v, act, want);
                for (int pl = 0; pl < planes; pl++) {
                    const size_t off = split_offset(t, c, nst, planes, pl, broken);
                    uint16_t got;
                    memcpy(&got, hs + off, 2);
                    covered += 2;
                    if (!same16(got, want[pl], 2)) { /* the planes are BF16 */
                        snprintf(msg, cap,
                                 "M %lld H %lld act %d: token %lld column %lld plane %d is 0x%04x at byte %zu, expected "
                                 "0x%04x",
                                 (long long)M, (long long)H, act, (long long)t, (long long)c, pl, got, off, want[pl]);
                        goto done;
                    }
                }
            }
        for (size_t b = sbytes; b < sbytes + 256; b++)
            if (hs[b] != 0xA5) {
                snprintf(msg, cap, "M %lld H %lld act %d: byte %zu past the layout written", (long long)M, (long long)H,
                         act, b);
                goto done;
            }
        if (covered != sbytes) {
            snprintf(msg, cap, "M %lld H %lld act %d: the layout has %zu bytes, the inputs cover %zu", (long long)M,
                     (long long)H, act, sbytes, covered);
            goto done;
        }
    }
    rc = 0;
done:
    if (rc < 0) snprintf(msg, cap, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(dx);
    cudaFree(dxa);
    cudaFree(d16);
    cudaFree(ds);
    free(hx);
    free(hxa);
    free(h16);
    free(hs);
    return rc;
}

/* Whether a CUDA device is there for the GPU checks (else msg says so). */
static bool check_device(char *msg, size_t cap)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        snprintf(msg, cap, "no CUDA device");
        return false;
    }
    return true;
}

extern "C" int td_cuda_round_split_check(int broken, char *msg, size_t cap)
{
    if (!check_device(msg, cap)) return -1;
    static const struct {
        int64_t M, H;
        int nst;
    } cases[] = {{1, 64, 1}, {63, 200, 4}, {300, 256, 4}, {130, 2560, 40}, {65, 520, 10}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int act = 1; act <= 2; act++) {
            const int rc = round_split_case(cases[i].M, cases[i].H, cases[i].nst, act, 0x5EED0000u + i * 2 + act, broken,
                                            msg, cap);
            if (rc) return rc;
        }
    snprintf(msg, cap, "ok");
    return 0;
}

/* ==== check of cu_mm_round_stage and of k_mm's staged input ===================================== */

/* The word of column c in a staged row, from the layout's formula (stage_x's comment): column
 * pair w = c / 2 of step w / 16 at (w / 16) * 16 + (u & 3) * 4 + b * 2 + (u >> 2), b = (w % 16) / 8
 * the 16-column block, u = w % 8; the low half for even c. broken: b and u >> 2 swapped. */
static int64_t stage_word_of(int64_t c, int broken)
{
    const int64_t w = c / 2, b = (w % 16) / 8, u = w % 8;
    return (w / 16) * 16 + (u & 3) * 4 + (broken ? (u >> 2) * 2 + b : b * 2 + (u >> 2));
}

/* One case: M x H inputs, act. The image against the formula (every word of both planes, zeros
 * past H, nothing past the image), x16 / xa against the host; then a BF16 matrix of 40 rows (3
 * row tiles, the last half padding) on k_mm with range groups and F32 outputs, poisoned, once
 * staging the rows itself and once from the image: bit-identical, every output written, the
 * row padding untouched. broken 1: the reference's word formula wrong; broken 2: k_mm given an
 * image 16 words off. Returns 0, 1 (msg) or -1 (CUDA error). */
static int round_stage_case(int64_t M, int64_t H, int act, uint64_t seed, int broken, char *msg, size_t cap)
{
    const int64_t n = M * H, canary = 64, K = round_up(H, 32), W = cu_mm_stage_words(K), rows = 40, R = 48;
    const int64_t out_ld = rows + 3, nout = M * out_ld + canary;
    const size_t ibytes = (size_t)cu_mm_stage_bytes(M, H);
    float *hx = (float *)malloc((size_t)n * 4), *hxa = (float *)malloc((size_t)(n + canary) * 4);
    uint16_t *h16 = (uint16_t *)malloc((size_t)(n + canary) * 2), *hw = (uint16_t *)malloc((size_t)(R * K) * 2);
    uint32_t *himg = (uint32_t *)malloc(ibytes + 256), *ho[2] = {(uint32_t *)malloc((size_t)nout * 4),
                                                                  (uint32_t *)malloc((size_t)nout * 4)};
    float *dx = NULL, *dxa = NULL, *dout = NULL;
    uint16_t *d16 = NULL, *dw = NULL;
    uint32_t *dimg = NULL;
    int rc = -1;
    td_err err;
    memset(&err, 0, sizeof err);
    if (!hx || !hxa || !h16 || !hw || !himg || !ho[0] || !ho[1]) goto done;
    round_inputs(hx, n, seed);
    {
        uint64_t r = seed ^ 0xB5297A4D3F84D5B5ull; /* finite BF16 weights of magnitudes 2^-8 .. 2^3 */
        for (int64_t i = 0; i < R * K; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t u = (uint32_t)(r >> 32);
            hw[i] = (uint16_t)((u >> 31) << 15 | (119 + (u >> 8) % 12) << 7 | (u & 127));
        }
    }
    if (cudaMalloc(&dx, (size_t)n * 4) || cudaMalloc(&dxa, (size_t)(n + canary) * 4) ||
        cudaMalloc(&d16, (size_t)(n + canary) * 2) || cudaMalloc(&dimg, ibytes + 256) ||
        cudaMalloc(&dw, (size_t)(R * K) * 2) || cudaMalloc(&dout, (size_t)nout * 4))
        goto done;
    if (cudaMemcpy(dx, hx, (size_t)n * 4, cudaMemcpyHostToDevice) || cudaMemset(dxa, 0xFF, (size_t)(n + canary) * 4) ||
        cudaMemset(d16, 0xFF, (size_t)(n + canary) * 2) || cudaMemset(dimg, 0xA5, ibytes + 256) ||
        cudaMemcpy(dw, hw, (size_t)(R * K) * 2, cudaMemcpyHostToDevice))
        goto done;
    rc = 1;
    if (cu_mm_init(&err) || cu_mm_round_stage(dx, dxa, d16, M, H, act, dimg, 0, &err)) {
        snprintf(msg, cap, "cu_mm_round_stage: %s", err.msg);
        goto done;
    }
    rc = -1;
    if (cudaDeviceSynchronize() || cudaMemcpy(hxa, dxa, (size_t)(n + canary) * 4, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(h16, d16, (size_t)(n + canary) * 2, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(himg, dimg, ibytes + 256, cudaMemcpyDeviceToHost))
        goto done;
    rc = 1;
    if (round_outputs_check(hx, h16, hxa, n, canary, M, H, act, msg, cap)) goto done;
    {
        const int planes = act == 1 ? 2 : 1;
        const uint8_t *hb = reinterpret_cast<const uint8_t *>(himg);
        for (int64_t t = 0; t < M; t++)
            for (int64_t c = 0; c < 2 * W; c++) { /* every word of the row: W words, 2 columns each */
                const uint16_t v = c < H ? (act == 1 ? td_f32_to_f16(hx[t * H + c]) : td_f32_to_bf16(hx[t * H + c]))
                                         : (uint16_t)0;
                uint16_t want[2];
                planes_of(v, act, want);
                for (int pl = 0; pl < planes; pl++) {
                    const size_t off = (size_t)(((pl * M + t) * W + stage_word_of(c, broken == 1)) * 4 + (c & 1) * 2);
                    uint16_t got;
                    memcpy(&got, hb + off, 2);
                    if (!same16(got, want[pl], 2)) { /* BF16 bits in both planes */
                        snprintf(msg, cap,
                                 "M %lld H %lld act %d: token %lld column %lld plane %d is 0x%04x at byte %zu, "
                                 "expected 0x%04x",
                                 (long long)M, (long long)H, act, (long long)t, (long long)c, pl, got, off, want[pl]);
                        goto done;
                    }
                }
            }
        for (size_t b = (size_t)(planes * M * W * 4); b < ibytes + 256; b++)
            if (hb[b] != 0xA5) {
                snprintf(msg, cap, "M %lld H %lld act %d: byte %zu past the image written", (long long)M, (long long)H,
                         act, b);
                goto done;
            }
    }
    for (int v = 0; v < 2; v++) {
        cu_mm_call c;
        memset(&c, 0, sizeof c);
        c.W.kind = CU_W_BF16;
        c.W.rows = rows;
        c.W.cols = H;
        c.W.R = R;
        c.W.K = K;
        c.W.w = reinterpret_cast<const uint8_t *>(dw);
        c.W.mat_w = R * K * 2;
        c.mats_per_expert = 1;
        cu_mm_range_groups(&c, M);
        c.in16 = d16;
        c.in_ld = H;
        c.in_div = 1;
        c.in_cols = H;
        c.out = dout;
        c.out_ld = out_ld;
        c.out_n = rows;
        c.epi = CU_MM_F32;
        c.act = act;
        if (v == 1) {
            c.xst = dimg + (broken == 2 ? 16 : 0);
            c.xst_plane = M * W;
        }
        if (cudaMemset(dout, 0xFF, (size_t)nout * 4)) {
            rc = -1;
            goto done;
        }
        if (cu_mm(&c, 0, &err)) {
            snprintf(msg, cap, "cu_mm: %s", err.msg);
            goto done;
        }
        if (cudaDeviceSynchronize() || cudaMemcpy(ho[v], dout, (size_t)nout * 4, cudaMemcpyDeviceToHost)) {
            rc = -1;
            goto done;
        }
    }
    for (int64_t i = 0; i < nout; i++) {
        const bool in = i < M * out_ld && i % out_ld < rows;
        if (ho[0][i] != ho[1][i] || (ho[0][i] == 0xFFFFFFFFu) == in) {
            snprintf(msg, cap,
                     "M %lld H %lld act %d: k_mm output %lld is 0x%08x staging the rows, 0x%08x from the image "
                     "(%s)",
                     (long long)M, (long long)H, act, (long long)i, ho[0][i], ho[1][i],
                     in ? "an output" : "past the outputs");
            goto done;
        }
    }
    rc = 0;
done:
    if (rc < 0) snprintf(msg, cap, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(dx);
    cudaFree(dxa);
    cudaFree(d16);
    cudaFree(dimg);
    cudaFree(dw);
    cudaFree(dout);
    free(hx);
    free(hxa);
    free(h16);
    free(hw);
    free(himg);
    free(ho[0]);
    free(ho[1]);
    return rc;
}

extern "C" int td_cuda_round_stage_check(int broken, char *msg, size_t cap)
{
    if (!check_device(msg, cap)) return -1;
    static const struct {
        int64_t M, H;
    } cases[] = {{1, 64}, {5, 208}, {8, 2560}, {16, 2560}, {17, 528}, {100, 1040}, {255, 256}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int act = 1; act <= 2; act++) {
            const int rc = round_stage_case(cases[i].M, cases[i].H, act, 0x57A6E000u + i * 2 + act, broken, msg, cap);
            if (rc) return rc;
        }
    snprintf(msg, cap, "ok");
    return 0;
}

/* ==== check of the BF16 decode on the GPU ======================================================= */

__global__ void k_bf16_decode_check(const uint32_t *words, const uint8_t *dsel, int n, uint32_t *out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32_t w = words[i];
    switch (dsel[i]) {
    case 0: out[i] = e2m1x2_act<2, 0>(w); break;
    case 1: out[i] = e2m1x2_act<2, 1>(w); break;
    case 2: out[i] = e2m1x2_act<2, 2>(w); break;
    default: out[i] = e2m1x2_act<2, 3>(w); break;
    }
}

extern "C" int td_cuda_nvfp4_bf16_check(int broken, char *msg, size_t cap)
{
    if (!check_device(msg, cap)) return -1;
    const int per = 16 * 16 * CHECK_BACKGROUNDS, n = 4 * per;
    uint32_t *hw = (uint32_t *)malloc((size_t)n * 4), *ho = (uint32_t *)malloc((size_t)n * 4);
    uint8_t *hsel = (uint8_t *)malloc((size_t)n), *codes = (uint8_t *)malloc((size_t)n * 2);
    uint32_t *dw = NULL, *dout = NULL;
    uint8_t *dsel = NULL;
    int rc = -1;
    if (!hw || !ho || !hsel || !codes) goto done;
    {
        uint64_t rng = 0x9E3779B97F4A7C15ull;
        int i = 0;
        for (int J = 0; J < 4; J++)
            for (int c0 = 0; c0 < 16; c0++)
                for (int c1 = 0; c1 < 16; c1++)
                    for (int bg = 0; bg < CHECK_BACKGROUNDS; bg++, i++) {
                        hw[i] = check_word(1, J, c0, c1, bg, rng);
                        hsel[i] = (uint8_t)(broken && J == 2 ? 3 : J);
                        codes[2 * i] = (uint8_t)c0;
                        codes[2 * i + 1] = (uint8_t)c1;
                    }
    }
    if (cudaMalloc(&dw, (size_t)n * 4) || cudaMalloc(&dout, (size_t)n * 4) || cudaMalloc(&dsel, (size_t)n) ||
        cudaMemcpy(dw, hw, (size_t)n * 4, cudaMemcpyHostToDevice) ||
        cudaMemcpy(dsel, hsel, (size_t)n, cudaMemcpyHostToDevice) || cudaMemset(dout, 0xFF, (size_t)n * 4))
        goto done;
    k_bf16_decode_check<<<(n + 255) / 256, 256>>>(dw, dsel, n, dout);
    if (cudaGetLastError() || cudaDeviceSynchronize() || cudaMemcpy(ho, dout, (size_t)n * 4, cudaMemcpyDeviceToHost))
        goto done;
    rc = 1;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < 2; h++) {
            const uint8_t code = codes[2 * i + h];
            const uint16_t want = td_f32_to_bf16(td_e2m1_to_f32(code) * 0x1p-126f), got = (uint16_t)(ho[i] >> (16 * h));
            if (got != want) {
                snprintf(msg, cap,
                         "register %d, %s half: code %d decodes to BF16 0x%04x (%g), expected 0x%04x (%g x 2^-126; "
                         "word 0x%08x)",
                         i / per, h ? "high" : "low", code, got, (double)td_bf16_to_f32(got), want,
                         (double)td_e2m1_to_f32(code), hw[i]);
                goto done;
            }
        }
    snprintf(msg, cap, "ok");
    rc = 0;
done:
    if (rc < 0) snprintf(msg, cap, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(dw);
    cudaFree(dout);
    cudaFree(dsel);
    free(hw);
    free(ho);
    free(hsel);
    free(codes);
    return rc;
}

/* ---- td_cuda_bf16_row_scale_check: the staging's multiplication of BF16 inputs by 2^s ---- */

__global__ void k_bf16_scale_check(const int *shifts, int ns, uint32_t *out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x; /* one pair of BF16 patterns per thread */
    if (i >= 32768 * ns) return;
    const int p = i % 32768, s = shifts[i / 32768];
    const uint32_t w = (uint32_t)(2 * p) | (uint32_t)(2 * p + 1) << 16;
    out[i] = bf16x2_pow2(w, s);
}

__global__ void k_bf16_shift_check(int *out)
{
    const int e = threadIdx.x; /* every exponent field */
    if (e < 256) {
        out[e] = bf16_row_shift(e);
        out[256 + e] = __float_as_int(bf16_row_unscale(e));
    }
}

extern "C" int td_cuda_bf16_row_scale_check(int broken, char *msg, size_t cap)
{
    if (!check_device(msg, cap)) return -1;
    static const int shifts[] = {0, 1, 7, 8, 64, 111, 112};
    const int ns = (int)(sizeof shifts / sizeof shifts[0]), n = 32768 * ns;
    uint32_t *ho = (uint32_t *)malloc((size_t)n * 4);
    int hsh[512];
    int *dsh = NULL, *dsf = NULL;
    uint32_t *dout = NULL;
    int rc = -1;
    if (!ho || cudaMalloc(&dsh, sizeof shifts) || cudaMalloc(&dsf, sizeof hsh) || cudaMalloc(&dout, (size_t)n * 4) ||
        cudaMemcpy(dsh, shifts, sizeof shifts, cudaMemcpyHostToDevice) || cudaMemset(dout, 0xFF, (size_t)n * 4) ||
        cudaMemset(dsf, 0xFF, sizeof hsh))
        goto done;
    k_bf16_scale_check<<<(n + 255) / 256, 256>>>(dsh, ns, dout);
    k_bf16_shift_check<<<1, 256>>>(dsf);
    if (cudaGetLastError() || cudaDeviceSynchronize() || cudaMemcpy(ho, dout, (size_t)n * 4, cudaMemcpyDeviceToHost) ||
        cudaMemcpy(hsh, dsf, sizeof hsh, cudaMemcpyDeviceToHost))
        goto done;
    rc = 1;
    /* the shift: the largest s <= 112 with e + s <= 254 (0 for infinities and NaNs), and the
     * epilogue's factor 2^(126 - s) as FP32 bits */
    for (int e = 0; e < 256; e++) {
        int want = 254 - e > 112 ? 112 : 254 - e;
        if (want < 0) want = 0;
        if (broken == 2 && e == 200) want++;
        const int got_s = hsh[e];
        float got_f;
        memcpy(&got_f, &hsh[256 + e], 4);
        if (got_s != want || got_f != ldexpf(1.0f, 126 - want)) {
            snprintf(msg, cap, "row shift of exponent field %d: %d (factor %g), expected %d (2^%d)", e, got_s,
                     (double)got_f, want, 126 - want);
            goto done;
        }
    }
    /* every BF16 pattern times each shift, wherever the product is finite in BF16 (e + s <= 254):
     * the host's exact product (float holds it: 8 significant bits between 2^-133 and 2^128),
     * infinities and signed zeros kept, a NaN any NaN */
    for (int i = 0; i < n; i++)
        for (int h = 0; h < 2; h++) {
            const int s = shifts[i / 32768], pat = 2 * (i % 32768) + h;
            const int e = (pat >> 7) & 0xff;
            if (e != 255 && e + s > 254) continue;
            const float x = td_bf16_to_f32((uint16_t)pat);
            const uint16_t got = (uint16_t)(ho[i] >> (16 * h));
            const float gv = td_bf16_to_f32(got);
            const uint16_t want = isnan(x) ? got : td_f32_to_bf16(ldexpf(x, s + (broken == 1 && s == 7 ? 1 : 0)));
            if ((isnan(x) && !isnan(gv)) || got != want) {
                snprintf(msg, cap, "BF16 0x%04x (%g) x 2^%d gave 0x%04x (%g), expected 0x%04x", pat, (double)x, s, got,
                         (double)gv, want);
                goto done;
            }
        }
    snprintf(msg, cap, "ok");
    rc = 0;
done:
    if (rc < 0) snprintf(msg, cap, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(dsh);
    cudaFree(dsf);
    cudaFree(dout);
    free(ho);
    return rc;
}

/* ---- td_cuda_group_check: cu_mm_group's arrays against a host grouping ---- */

/* The reference grouping (host, a counting sort): experts in ascending order, each expert's
 * slots in ascending slot order (descending with `broken`, the check's own test), cut into
 * packs of P. Returns the group count; g arrays of at least that size, perm of n, first of E. */
static int group_reference(const int32_t *ids, int n, int E, int P, int broken, int32_t *g_mat, int32_t *g_start,
                           int32_t *g_count, int32_t *perm, int32_t *first)
{
    for (int e = 0; e < E; e++) first[e] = 0;
    for (int s = 0; s < n; s++)
        if (ids[s] >= 0 && ids[s] < E) first[ids[s]]++;
    int at = 0, G = 0;
    for (int e = 0; e < E; e++) {
        const int c = first[e];
        for (int j = 0; j * P < c; j++, G++) {
            g_mat[G] = e;
            g_start[G] = at + j * P;
            g_count[G] = c - j * P < P ? c - j * P : P;
        }
        first[e] = at;
        at += c;
    }
    for (int j = 0; j < n; j++) {
        const int s = broken ? n - 1 - j : j;
        if (ids[s] >= 0 && ids[s] < E) perm[first[ids[s]]++] = s;
    }
    return G;
}

/* Route patterns of the check: 0 k distinct random experts per token, 1 random among few
 * experts (repeats within a token) with ids outside [0, E) (-1, E, 2^30), 2 every slot on one
 * expert, 3 descending experts (slot s on E - 1 - s mod E), 4 s mod 17. */
static void group_ids(int pattern, int n, int E, int k, uint64_t &rng, int32_t *ids)
{
    for (int s = 0; s < n; s++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t r = (uint32_t)(rng >> 33);
        if (pattern == 0) {
            const int t0 = s / k * k;
            bool dup;
            do {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                ids[s] = (int32_t)((rng >> 33) % (uint64_t)E);
                dup = false;
                for (int j = t0; j < s; j++) dup |= ids[j] == ids[s];
            } while (dup && s - t0 < E);
        } else if (pattern == 1) {
            const uint32_t c = r % 16, few = E < 37 ? (uint32_t)E : 37u;
            ids[s] = c == 0 ? -1 : c == 1 ? E : c == 2 ? (1 << 30) : (int32_t)(r / 16 % few * (uint32_t)(E / few));
        } else if (pattern == 2) {
            ids[s] = E / 2;
        } else if (pattern == 3) {
            ids[s] = E - 1 - s % E;
        } else {
            ids[s] = s % 17 % E;
        }
    }
}

/* The first element where got and want differ among n, or -1. */
static int first_diff(const int32_t *got, const int32_t *want, int n)
{
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) return i;
    return -1;
}

extern "C" int td_cuda_group_check(int broken, char *msg, size_t cap)
{
    if (!check_device(msg, cap)) return -1;
    static const int sizes[] = {1, 7, 40, 128, 129, 160, 250, 1000, 4096, 7840, 10240};
    static const int experts[] = {8, 512, 3000};
    enum { NMAX = 10240, GMAX = NMAX + 1, EMAX = 3000, POISON = 0x7A5A5A5A };
    /* outputs, device and host: n_groups [1], g_mat, g_start, g_count [GMAX], perm [NMAX] */
    const int nout = 1 + 3 * GMAX + NMAX;
    static const char *const names[] = {"n_groups", "g_mat", "g_start", "g_count", "perm"};
    const int off[] = {0, 1, 1 + GMAX, 1 + 2 * GMAX, 1 + 3 * GMAX}, len[] = {1, GMAX, GMAX, GMAX, NMAX};
    int32_t *h = (int32_t *)malloc(((size_t)NMAX + 2 * (size_t)nout + EMAX) * 4);
    int32_t *d = NULL;
    int rc = -1;
    if (!h || cudaMalloc(&d, ((size_t)NMAX + nout) * 4)) goto done;
    {
        td_err ierr;
        if (cu_mm_init(&ierr)) {
            snprintf(msg, cap, "cu_mm_init: %s", ierr.msg);
            rc = 1;
            goto done;
        }
        int32_t *ids = h, *want = h + NMAX, *got = want + nout, *first = got + nout, *dout = d + NMAX;
        uint64_t rng = 0x243F6A8885A308D3ull;
        for (int pattern = 0; pattern < 5; pattern++)
            for (size_t ei = 0; ei < sizeof experts / sizeof experts[0]; ei++)
                for (size_t ni = 0; ni < sizeof sizes / sizeof sizes[0]; ni++)
                    for (int generic = 0; generic < 2; generic++) {
                        const int E = experts[ei], n = sizes[ni], k = 10;
                        /* the engine's packs: 24 or 16 at prefill sizes, 4 at 3 or 4 tokens, else 8 */
                        const int P = (int)td_group_pack(n, (n + k - 1) / k, (int)((ni + ei) & 1));
                        group_ids(pattern, n, E, k, rng, ids);
                        for (int i = 0; i < nout; i++) want[i] = got[i] = POISON;
                        want[0] = group_reference(ids, n, E, P, broken, want + off[1], want + off[2], want + off[3],
                                                  want + off[4], first);
                        td_err err;
                        if (cudaMemcpy(d, ids, (size_t)n * 4, cudaMemcpyHostToDevice) ||
                            cudaMemcpy(dout, got, (size_t)nout * 4, cudaMemcpyHostToDevice))
                            goto done;
                        if (cu_mm_group(d, n, E, P, dout + off[0], dout + off[1], dout + off[2], dout + off[3],
                                        dout + off[4], generic != 0, false, 0, &err)) {
                            snprintf(msg, cap, "cu_mm_group(%d slots, %d experts): %s", n, E, err.msg);
                            rc = 1;
                            goto done;
                        }
                        if (cudaDeviceSynchronize() || cudaMemcpy(got, dout, (size_t)nout * 4, cudaMemcpyDeviceToHost))
                            goto done;
                        for (int a = 0; a < 5; a++) {
                            const int i = first_diff(got + off[a], want + off[a], len[a]);
                            if (i < 0) continue;
                            snprintf(msg, cap,
                                     "%s[%d] = %d, expected %d (pattern %d, %d slots, %d experts, pack %d, %s kernel)",
                                     names[a], i, got[off[a] + i], want[off[a] + i], pattern, n, E, P,
                                     generic || n > GROUP_SMALL ? "general" : "small");
                            rc = 1;
                            goto done;
                        }
                    }
        snprintf(msg, cap, "ok");
        rc = 0;
    }
done:
    if (rc < 0) snprintf(msg, cap, "CUDA: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(d);
    free(h);
    return rc;
}

#ifdef TD_TIMELINE
int cu_mm_timeline(uint64_t *out)
{
    return cu_tl_take(out);
}
#endif
