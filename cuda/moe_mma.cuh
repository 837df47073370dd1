/* moe_mma.cuh — the tensor-core path of the MoE block (cuda/moe_mma.cu): NVFP4 expert weights
 * decoded in registers and multiplied on the tensor cores (mma.sync m16n8k16, FP16 or BF16
 * inputs, FP32 accumulation) for act_dtype=fp16|bf16; BF16 shared experts on the same path;
 * expert grouping on the device.
 *
 * Device layout (cu_qmat): a set of matrices (expert x rank slice), each `rows` x `cols`, padded
 * to R (multiple of 16) x K (multiple of 32), stored in the order the mma fragments need, so
 * that one warp load of 256 (NVFP4) or 1024 (BF16) contiguous bytes feeds one 16-row tile for
 * 32 columns (two 16-column blocks):
 * - tile rows: W13 interleaves gate and up, 8 intermediate columns per tile (tile rows 0..7 gate
 *   rows c0..c0+7, rows 8..15 up rows c0..c0+7), so one thread holds gate and up of the same
 *   column and SwiGLU needs no exchange; W2 tiles are 16 consecutive output rows.
 * - NVFP4 weights: per (tile rt, step ks, lane) one uint2, word b for 16-column block 2ks+b;
 *   lane l (g = l/4, q = l%4) gets the codes of elements j = 0..7, (row, column) (g, 2q),
 *   (g+8, 2q), (g, 2q+8), (g+8, 2q+8), (g, 2q+1), (g+8, 2q+1), (g, 2q+9), (g+8, 2q+9) of the
 *   block; elements (J, J+4) are the A-fragment half2 register J = 0..3. Element j's 3
 *   magnitude bits sit at bits m..m+2 and its sign bit at bit s, plus 16 for j >= 4; two
 *   placements, chosen by the engine's act_dtype at load (cu_qmat::bf16_words):
 *   - FP16 (act_dtype fp16): (m, s) = (9, 15), (6, 12), (3, 14), (0, 13) for J = 0..3:
 *     register 0 is then in FP16 position already (E2M1 x 2^-14, the 0.5 code an FP16
 *     subnormal), register 1 one shift away, registers 2 and 3 one mask and one
 *     multiplication away (9 integer instructions per word);
 *   - BF16 (act_dtype bf16): (m, s) = (6, 15), (3, 12), (9, 14), (0, 13): bits 6..8 are BF16's
 *     one position where the three magnitude bits read linearly (E2M1 x 2^-126, the 0.5 code a
 *     BF16 subnormal); register 0 in place, register 1 one shift away, register 3 one mask and
 *     one multiplication, register 2 a shift more (10 integer instructions per word), taken
 *     as they are (the inputs carry the power of two instead: Numerics).
 *   cuda/nvfp4_layout.h checks both (the BF16 decode on the GPU as well).
 * - prepared scales: FP16 effective scales [rt][ks][g 0..7][row g, g+8][2 blocks] (lane
 *   group g reads its two rows' four scales with one 8-byte load); raw scales: the
 *   checkpoint's E4M3 bytes in the same order (one 4-byte load), plus one float2 per matrix (decode multipliers of
 *   tile rows 0..7 and 8..15: gate and up for W13, the same value twice for W2).
 * - BF16 weights: per (rt, ks, lane) two uint4, one per block, holding the A-fragment registers
 *   (g, 2q..2q+1), (g+8, 2q..), (g, 2q+8..), (g+8, 2q+8..).
 * Padding rows and columns hold code 0 / scale 0 (zero weights); padded input columns are 0.
 *
 * Numerics (every bit fixed by the inputs; no atomics)
 * - E2M1 codes become FP16 `e2m1 x 2^-14` by bit placement (exact, the 0.5 code is an FP16
 *   subnormal), the FP16 inputs taken as they are. With BF16 activations the codes become BF16
 *   `e2m1 x 2^-126` (the 0.5 code a BF16 subnormal) and each input row t of a call is taken
 *   times 2^s_t, s_t = min(112, 254 - E_t) (0 when that is negative), E_t the largest exponent
 *   field of the row's BF16 values: the largest shift up to 112 under which no value of the row
 *   overflows, so the multiplication is exact (subnormals included), a function of the row
 *   alone; for rows below 2^16 the products are those of `e2m1 x 2^-14` by x. Every kernel
 *   multiplying NVFP4 weights by BF16 inputs represents each token's operands so, whether it
 *   scales the staged row (k_mm, the decode kernel with two or three 8-token tiles, the fused
 *   W2) or each lane's B registers as it loads them (the decode kernel with one tile): the
 *   tensor cores' sum of the same products can depend on how the operands represent them
 *   (docs/cuda.md, Numerics), so one representation everywhere is what makes the exact pairs
 *   hold. `kernels=generic` (k_mm) is the exact pair that checks it.
 * - Per 16-column block b of row r and token t: D = tensor-core dot of the 16 products (FP32
 *   accumulation, the hardware's order), then acc = fma(eff(r,b), D, acc) in FP32, blocks
 *   ascending; D and acc carry the codes' 2^-14 (FP16) or 2^(s_t - 126) (BF16), which the
 *   epilogue removes with one exact multiplication by 2^14 or 2^(126 - s_t) (the same bits as
 *   scaling eff instead, except below FP32's normal range). eff is the prepared FP16 effective scale; with raw storage it is recomputed in
 *   the kernel as FP16_rn(fl32(E4M3(code) x g_dec)) (compressed-tensors: / g_enc), the same
 *   arithmetic as the prepared scales, so raw and prepared give identical bits.
 * - BF16 weights: acc = mma(W, x, acc) per block, blocks ascending; FP16 activations are split
 *   exactly into hi = bf16(x) and lo = bf16(x - hi) and multiplied as two mmas (hi, then lo).
 * - K is cut into NC contiguous chunks of steps, a function of K only (KS = K/32 steps;
 *   NC = the smallest power of two >= ceil(KS/10), at most 8; chunk = ceil(KS/NC)); each chunk
 *   is accumulated from +0 and the NC partial sums are added in chunk order. Whether the
 *   chunks of a tile run on NC warps (decode-sized calls) or one after the other on one warp
 *   (prefill-sized calls) does not change a bit, nor does staging a prefill-sized call's
 *   input rows in two halves of K one after the other (k_mm with BF16 weights and FP16 inputs,
 *   whose hi / lo rows of 16 tokens at K = 2560 would keep it to one block per SM: cu_mm
 *   halves them above 104 KB). A token's result depends on its own input
 *   row and the weights only: never on which other tokens share the group, how many there are
 *   or where the token sits in the group (the tensor cores compute each output column from its
 *   own column of B). Hence moe_dispatch=direct and grouped give identical bits.
 * - Epilogue: W13 h = act_dtype(fl32(silu(gate) x up)), silu in double rounded once; W2
 *   y = act_dtype(sum).
 *
 * Kernels: k_mm is the general kernel (groups of at most 16 slots). Calls of NVFP4 matrices
 * whose groups hold at most 24 slots and whose K cut has chunks of exactly 5 or 10 steps (the
 * production shapes: K = 2560, 640 and the TP slices 160), when the rings and staged rows fit
 * the SM's shared memory, run on k_dec, which computes the same sums in the same order (so
 * the same bits): each warp computes whole row tiles (k_mm's unsplit order), streaming its
 * chunks of weights and scales into shared memory through the bulk-copy engine, a ring of
 * DEC_STAGES buffers per warp, while it computes the chunk before; blocks are persistent (8
 * warps for one 8-token tile, 16 for two or three) and take contiguous ranges of (group, one
 * row tile per warp) items; with one tile, where the items leave a remainder over the blocks
 * that one round of the grid can take by chunks, every block takes the same number of whole
 * items and the remaining items' row tiles are cut by chunks over the blocks' warps, one warp
 * per tile adding their partial sums in chunk order (the same sums in the same order); a launch
 * in which no block can take such a tail runs an instantiation without its code (cuda/dec_split.h,
 * td_dec_tail_possible). With `pdl` a launch may start while the previous kernel runs (W2
 * loads its weights while W13 computes). Prefill-sized calls of BF16 matrices with range
 * groups (the router and the shared expert) run on k_wgp when the call has a split_ws (sm_90a's
 * warpgroup MMA, 64 or 128 rows by 64 tokens per block: a launch before it lays the inputs out
 * once in the stages' layout, FP16 inputs split into their BF16 hi and lo parts, BF16 inputs as
 * they are, into the call's split_ws; an issuer copies weights and inputs into a ring of stages,
 * one or two consumer warpgroups issue the wgmmas; the same sums in the same order) and on
 * k_gemm without one (blocks of 8 row tiles by 32 tokens, the tokens' input rows staged one K
 * chunk at a time, where its grid has a block for every SM). k_w2c is k_dec's W2 for direct
 * dispatch with the combine fused in (cu_mm_w2c, below). `generic` keeps every call on k_mm
 * (and the combine on its own launch), so the kernels can be compared.
 *
 * Groups: a group is one expert (matrix) and up to `pack` slots. Direct dispatch: group g is
 * slot g alone. Grouped dispatch: cu_mm_group() sorts slots by expert (ascending expert,
 * ascending slot inside an expert) and cuts each expert's list into packs of `pack` slots:
 * cu_mm_group_pack() (CU_MM_PACK_DEC = 24 for prefill-sized calls whose W13 and W2 both run on
 * k_dec, three 8-token tiles per warp, so that an expert's tokens are read once; else
 * cu_mm_pack(), 4 for calls of 3 or 4 tokens: cuda/group_pack.h).
 * Range groups (shared expert, router): group g = slots g*P .. g*P+P-1 on matrix 0, P =
 * cu_mm_pack(tokens) (8 for decode-sized calls, so that each group is one 8-token tile).
 *
 * Contract: launchers enqueue on `s`, check the launch and return a td_status; they neither
 * allocate nor synchronize. cu_mm_init() must run once per device before the first launch
 * (it raises the grouping kernel's shared-memory limit). Host packers fill caller-owned host
 * buffers.
 */
#ifndef TD_CUDA_MOE_MMA_CUH
#define TD_CUDA_MOE_MMA_CUH

#include "common.cuh"
#include "group_pack.h"

/* Most slots per group (tokens sharing one read of an expert's weights): prefill-sized calls
 * (256 slots or more) pack up to CU_MM_PACK, decode-sized calls up to CU_MM_PACK / 2 (one
 * 8-token tensor-core tile: fewer registers, more blocks per SM). cu_mm_pack() says which;
 * cuda/group_pack.h holds the arithmetic. */
#define CU_MM_PACK TD_GROUP_PACK
/* Most slots per group on the decode kernel (prefill-sized grouped calls, cu_mm_group_pack). */
#define CU_MM_PACK_DEC TD_GROUP_PACK_DEC

typedef struct cu_qmat {
    int kind;              /* CU_W_NVFP4 or CU_W_BF16 */
    int raw;               /* NVFP4: scales stored as E4M3 codes + globals */
    int bf16_words;        /* NVFP4: words in the BF16 placement (for act_dtype bf16); cu_mm
                              refuses a call whose act_dtype does not match */
    int conv;              /* raw: 0 ModelOpt (code x g), 1 compressed-tensors (code / g) */
    int64_t rows, cols;    /* logical shape of one matrix */
    int64_t R, K;          /* padded: R % 16 == 0, K % 32 == 0 */
    const uint8_t *w;      /* matrix 0 */
    const uint8_t *s;      /* prepared: FP16 scales; raw: E4M3 codes (NVFP4 only) */
    const float2 *g;       /* raw: decode multipliers per matrix */
    int64_t mat_w, mat_s;  /* bytes per matrix */
} cu_qmat;

/* Padded geometry and byte sizes of one matrix of the layout above. */
void cu_qmat_geometry(int kind, int64_t rows, int64_t cols, int64_t *R, int64_t *K, int64_t *wbytes,
                      int64_t *sbytes_prepared, int64_t *sbytes_raw);

/* Pack one NVFP4 matrix. row_w[r] / row_s[r] (r < rows) point at the packed E2M1 bytes and
 * the E4M3 scale bytes of logical row r, already offset to its first column (NULL: a zero
 * row); cols valid columns (multiple of 16). With raw == 0 scales become FP16 effective
 * scales of (code, global, conv) (core/nvfp4.h td_nvfp4_block_factor, rounded to FP16);
 * with raw != 0 the codes are copied. bf16 != 0: the words in the BF16 placement (above).
 * `w` and `s` are sized by cu_qmat_geometry. */
void cu_pack_nvfp4(const uint8_t *const *row_w, const uint8_t *const *row_s, const float *row_global, int conv,
                   int raw, int bf16, int64_t rows, int64_t cols, uint8_t *w, uint8_t *s);

/* Pack one BF16 matrix: row_w[r] points at logical row r's first element (uint16 BF16). */
void cu_pack_bf16(const uint16_t *const *row_w, int64_t rows, int64_t cols, uint8_t *w);

td_status cu_mm_init(td_err *err);

/* Grouped dispatch: ids [nslots] (expert of each slot; ids outside [0, E) join no group) ->
 * n_groups [1], g_mat [G], g_start [G], g_count [G], perm [nslots] in packs of `pack` slots
 * (1 <= pack <= CU_MM_PACK_DEC), with G >= td_group_bound(nslots, E, pack) (group_pack.h).
 * Calls of at most 128 slots are grouped by a kernel of one thread per slot unless `generic`
 * (the general kernel for every call, so the two can be compared: the same arrays).
 * cu_mm_group_pack: the pack for the routed experts' W13 / W2 of a call of `tokens` tokens
 * (td_group_pack); cu_mm_group_grid: the groups a call's launches size their grids for
 * (max_groups, at least the bound); cu_mm_group_ws: G for every call of up to tokens_max
 * tokens of k slots. */
int64_t cu_mm_pack(int64_t nslots);
int64_t cu_mm_group_pack(int64_t nslots, int64_t tokens, const cu_qmat *w13, const cu_qmat *w2, int generic);
int64_t cu_mm_group_grid(int64_t nslots, int64_t E, int64_t pack);
int64_t cu_mm_group_ws(int64_t tokens_max, int64_t k, int64_t E);
td_status cu_mm_group(const int32_t *ids, int64_t nslots, int64_t E, int64_t pack, int32_t *n_groups, int32_t *g_mat,
                      int32_t *g_start, int32_t *g_count, int32_t *perm, bool generic, bool pdl, cudaStream_t s,
                      td_err *err);

typedef enum cu_mm_epi { CU_MM_SWIGLU = 0, CU_MM_STORE, CU_MM_F32 } cu_mm_epi;

/* One projection over groups.
 * - mat_of_expert: matrix index = expert * mats_per_expert + mat_off.
 * - groups: perm == NULL -> range groups (g covers slots g*pack .. g*pack+pack-1 < nslots,
 *   pack = 1 for direct dispatch with `ids`, cu_mm_pack(slots) for shared experts with ids == NULL);
 *   perm != NULL -> device groups from cu_mm_group (n_groups read on the device), `pack` the
 *   pack they were cut with (groups above 16 slots only on the decode kernel).
 * - input row of slot s: in16 + (s / in_div) * in_ld, FP16 (act 1) or BF16 (act 2) bit
 *   patterns; in_cols valid columns (multiple of 16, <= K).
 * - output: SWIGLU: out[s * out_ld + c] for c < out_n (= rows / 2, intermediate columns),
 *   rounded to act; STORE: out[s * out_ld + r] for r < out_n (= rows), rounded to act; F32:
 *   the same without rounding. `out` (float) and `out16` (16-bit, same index) may each be NULL;
 *   out16 needs an even out_ld and 4-byte alignment (STORE with out16 only writes a token's
 *   16 rows of a tile as 4-byte words).
 * act: 1 fp16, 2 bf16. max_groups: the grid's group dimension (>= the number of groups). */
typedef struct cu_mm_call {
    cu_qmat W;
    int64_t mats_per_expert, mat_off;
    const int32_t *ids;          /* range groups with pack 1: expert of slot g */
    int64_t nslots, pack;
    const int32_t *n_groups, *g_mat, *g_start, *g_count, *perm;
    int64_t max_groups;
    const uint16_t *in16;
    int64_t in_ld, in_div, in_cols;
    float *out;
    uint16_t *out16;
    int64_t out_ld, out_n;
    int epi, act;
    int generic;                 /* 1: always k_mm (the decode kernel k_dec is never used) */
    uint8_t *split_ws;           /* k_wgp (prefill-sized BF16 calls, in_div 1): scratch of
                                    cu_mm_split_bytes(nslots, W.K) bytes where a launch before
                                    k_wgp writes the inputs in k_wgp's stage layout (FP16
                                    inputs: their exact BF16 hi / lo split; BF16 inputs: as
                                    they are), which k_wgp copies a stage at a time with one
                                    bulk copy; NULL: such calls take k_gemm. Never changes a
                                    bit */
    int presplit;                /* 1: split_ws holds the inputs in that layout already
                                    (cu_mm_round_split wrote them): no split launch; only for
                                    a call that runs on k_wgp (cu_mm_wgp_stages > 0) */
    const uint32_t *xst;         /* decode-sized calls of BF16 matrices on k_mm (nslots < 256,
                                    range groups, in_div 1, not generic): the input rows
                                    already staged by cu_mm_round_stage in the order k_mm
                                    stages them in shared memory (FP16 inputs as their BF16 hi
                                    plane and, xst_plane words further, their lo plane; BF16
                                    inputs as they are), which each block copies with one bulk
                                    copy per plane instead of converting the rows itself.
                                    NULL, or any other call: the block stages them. Never
                                    changes a bit */
    int64_t xst_plane;           /* words from the hi plane to the lo plane of xst */
    int dec_narrow;              /* 1: a one-tile call of direct dispatch on the decode kernel
                                    may run on blocks of 4 warps, 7 per SM (no tail), where
                                    td_dec_narrow_pays (cuda/dec_split.h) takes them; the same
                                    chunks and sums per row tile, so the same bits. 0: the
                                    8-warp blocks always */
    int pdl;                     /* programmatic dependent launch (common.cuh): 0 none; 2 the
                                    kernel may start while the previous kernel on the stream
                                    runs and waits for it first; 1 the same, but the kernel
                                    loads its first weights before it waits: the routes and
                                    groups must come from earlier work, only in16 from that
                                    kernel (the decode kernel; k_mm with range groups, e.g.
                                    the router; k_mm with routes or device groups waits
                                    first) */
} cu_mm_call;

td_status cu_mm(const cu_mm_call *c, cudaStream_t s, td_err *err);

/* Range groups over M tokens on matrix 0 (shared expert, router): nslots = M, packs of
 * cu_mm_pack(M) (decode-sized calls get 8-token groups, one tile each), max_groups to match. */
void cu_mm_range_groups(cu_mm_call *c, int64_t M);

/* The routed W2 with the combine fused in (k_w2c): for a W2 call of direct dispatch (ids, pack
 * 1, nslots = M * k, 16-bit outputs only) that runs on the decode kernel, one block per token
 * and row tile with one warp per slot computes the k slots' rows exactly as cu_mm does (and
 * stores them to out16: the moe.expert_out intermediate), then the combine of those rows
 * (cuda/combine.cuh: the arithmetic of cu_moe_combine with mode 0) into out. The caller orders
 * the shared expert's output (sh16 / sh32) before this launch; with `pdl` 1 its weights load
 * before it waits for W13, as on the decode kernel. Same bits as cu_mm + cu_moe_combine (the
 * pair that kernels=generic runs). */
#define W2C_MAX_K 12
typedef struct cu_w2c_args {
    const float *wts;            /* [M, k] routing weights */
    const float *sgdot;          /* gate dot of token t at sgdot[t * sg_ld]; NULL: no shared expert */
    int64_t sg_ld;
    const uint16_t *sh16;        /* shared expert's output [M, H] as 16-bit act patterns, or NULL: */
    const float *sh32;           /* as floats */
    float *out;                  /* [M, H] the block output */
    int64_t H, k;
} cu_w2c_args;
/* Whether cu_mm_w2c can take the W2 call c with k slots per token (1 <= k <= W2C_MAX_K, prepared
 * storage, the rest as above); cu_mm_w2c_pays: whether it is also no slower than cu_mm's W2 by
 * the kernels' chunk rounds on this device (td_w2c_pays, cuda/dec_split.h), the engine's choice. */
bool cu_mm_w2c_fits(const cu_mm_call *c, int64_t k);
bool cu_mm_w2c_pays(const cu_mm_call *c, int64_t k);
td_status cu_mm_w2c(const cu_mm_call *c, const cu_w2c_args *cb, cudaStream_t s, td_err *err);
/* Bytes of a cu_mm_call's split_ws for `tokens` tokens and K (padded) columns (FP16 inputs; BF16
 * inputs use half of it). */
int64_t cu_mm_split_bytes(int64_t tokens, int64_t K);
/* The stages (of 64 columns) of k_wgp's input layout for call c when cu_mm runs it on k_wgp
 * given a split_ws; 0 when it would not. */
int cu_mm_wgp_stages(const cu_mm_call *c);
/* x [M, H] (rows of H floats) rounded to act (1 fp16, 2 bf16) as cu_moe_round16 rounds it:
 * x16 [M, H] the 16-bit patterns, xa [M, H] as floats unless NULL, and the same inputs in
 * k_wgp's layout of nst stages (nst * 64 >= H, H % 8 == 0) into split, of
 * cu_mm_split_bytes(M, nst * 64) bytes, for calls with cu_mm_wgp_stages() == nst, the same
 * M and x16 as input (presplit). The first kernel of a block: launched without waiting. */
td_status cu_mm_round_split(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H, int act, int nst,
                            uint8_t *split, cudaStream_t s, td_err *err);
/* Words of one staged input row of K (padded) columns in k_mm's shared-memory order, and bytes
 * of cu_mm_round_stage's image of `tokens` rows of H columns (two planes; BF16 inputs use the
 * first only). */
int64_t cu_mm_stage_words(int64_t K);
int64_t cu_mm_stage_bytes(int64_t tokens, int64_t H);
/* Words from the hi plane to the lo plane of cu_mm_round_stage's image of M rows of H columns
 * (cu_mm_call::xst_plane for calls that read it). */
int64_t cu_mm_stage_plane(int64_t M, int64_t H);
/* Bytes of a block workspace's sp_x (cu_block_ws) for up to `tokens` tokens of H columns: k_wgp's
 * layout at prefill sizes (cu_mm_split_bytes) or the staged image at decode sizes
 * (cu_mm_stage_bytes of at most 255 tokens), whichever is larger. */
int64_t cu_mm_input_ws_bytes(int64_t tokens, int64_t H);
/* x [M, H] (H % 8 == 0, M < 256) rounded to act as cu_moe_round16 rounds it (x16, and xa as
 * floats unless NULL) and at once staged for k_mm into img (cu_mm_stage_bytes(M, H) bytes):
 * row t at word t * W (W = cu_mm_stage_words(round_up(H, 32))) in k_mm's word order, columns
 * from H to the row's end 0; FP16 inputs split exactly into BF16 hi (plane 0) and lo (plane 1,
 * M * W words further), BF16 inputs as they are (plane 0). For calls with that M and x16 as
 * input (cu_mm_call::xst = img, xst_plane = M * W). The first kernel of a block: launched
 * without waiting; its dependents may launch at once and wait for it. */
td_status cu_mm_round_stage(const float *x, float *xa, uint16_t *x16, int64_t M, int64_t H, int act, uint32_t *img,
                            cudaStream_t s, td_err *err);

#endif /* TD_CUDA_MOE_MMA_CUH */
