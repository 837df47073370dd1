/* group_pack.h — grouped dispatch's pack sizes and group-count bounds (cuda/moe_mma.cu:
 * cu_mm_pack, cu_mm_group_pack, cu_mm_group_grid, cu_mm_group_ws, k_group_small), in plain C so that the
 * host tests them (tests/test_group_pack.c) and the engine runs the same code.
 *
 * A call of n slots (tokens x k) sorted by expert is cut into groups: each expert's slots in
 * packs of at most P. A group is read once per weight step and its slots are staged as input
 * rows of the decode kernel, so P sets the staged rows' shared memory (P rows) and how many
 * blocks fit an SM.
 * - td_pack_of(n): the pack of range groups (router, shared expert) and the largest pack of a
 *   decode-sized grouped call: 8 under 256 slots (one 8-token tile), else 16.
 * - td_group_pack(n, tokens, dec24): the routed experts' pack. Prefill-sized calls whose W13
 *   and W2 both run on the decode kernel (dec24 != 0, n >= 256) take 24; other calls
 *   td_pack_of(n), except calls of 3 or 4 tokens, which take packs of 4. The router's top-k
 *   gives each token distinct experts, so an expert has at most `tokens` slots and packs of 4
 *   cut none of its groups there, while the staged rows shrink: the decode kernel's W13
 *   blocks take 72 KB instead of 92, three per SM instead of two, and W13's 290 to 400 items
 *   (top-10, 512 x 640) then fit one round of the grid. Measured on the H200 (grouped, fp16,
 *   one graph per call, same calls): block 69.1-69.7 -> 64.3-65.0 us at 4 tokens, 62.8-63.1 ->
 *   59.3-59.6 at 3; packs of the tokens at 2, 5 and 6 tokens were 0.3-1.5 us slower, packs
 *   of 4 at 5 to 16 tokens up to 8 us slower (docs/perf.md). Routes with an expert repeated within a token
 *   (imposed routes) are still grouped correctly, in more packs. Which slots share a group
 *   changes no bit (each output column of the tensor-core product depends on its own input
 *   column only).
 * - td_group_bound(n, E, P): the most groups n slots on E experts can give in packs of P:
 *   sum over experts of ceil(c_e / P) <= floor(n / P) + min(n, E), and at most n (a group has
 *   a slot).
 * - td_group_grid(n, E, P): the groups the launches size their grids for (the blocks past the
 *   device's count return at once): the bound, or where larger the count the bound gave before
 *   packs below 8 slots, min(n, E) + n / td_pack_of(n) + 1. Measured on the H200 (grouped,
 *   fp16, three runs each): the tighter grid at 2 tokens (W13 200 blocks instead of 230) made
 *   the routed experts 34.9-35.0 us instead of 33.6-33.8.
 * - td_group_ws(tokens_max, k, E): the most groups any call of 1..tokens_max tokens of k slots
 *   can give with the pack td_group_pack picks (either dec24): the size of the group arrays.
 *
 * - td_group_small_walk1 / td_group_small_walk2: the two walks of k_group_small (the grouping
 *   of calls of at most 128 slots, one thread per slot), for the slot at position s of
 *   sid[0..ns) whose expert is e (sid[j] = -1 for slots in no group). Walk 1: rank (the slots
 *   before s of expert e), cnt (the slots of e) and before (the slots of experts below e): the
 *   slot's place in perm is before + rank, and the expert's first slot (rank 0) holds its
 *   ceil(cnt / P) packs. Walk 2, with npk[j] the packs slot j holds: first (the packs of
 *   experts below e: the expert's first group) and total (the group count). perm then lists
 *   each expert's slots in ascending slot order, groups in ascending expert order, as k_group
 *   writes them.
 *
 * Contract: n, tokens, k, E >= 0; P >= 1; tokens_max * k below 2^62; ns <= 2^16. Pure integer
 * arithmetic, no state.
 */
#ifndef TD_CUDA_GROUP_PACK_H
#define TD_CUDA_GROUP_PACK_H

#include <stdint.h>

#if defined(__CUDACC__)
#define TD_GP_FN static inline __host__ __device__
#else
#define TD_GP_FN static inline
#endif

/* Slots at which a call counts as prefill-sized, and the packs (CU_MM_PACK and CU_MM_PACK_DEC
 * in cuda/moe_mma.cuh are these). */
#define TD_GROUP_PREFILL_SLOTS 256
#define TD_GROUP_PACK 16
#define TD_GROUP_PACK_DEC 24

TD_GP_FN int64_t td_pack_of(int64_t n) { return n < TD_GROUP_PREFILL_SLOTS ? TD_GROUP_PACK / 2 : TD_GROUP_PACK; }

TD_GP_FN int64_t td_group_pack(int64_t n, int64_t tokens, int dec24)
{
    if (n >= TD_GROUP_PREFILL_SLOTS) return dec24 ? TD_GROUP_PACK_DEC : TD_GROUP_PACK;
    return tokens == 3 || tokens == 4 ? TD_GROUP_PACK / 4 : TD_GROUP_PACK / 2;
}

TD_GP_FN int64_t td_group_bound(int64_t n, int64_t E, int64_t P)
{
    const int64_t lone = n < E ? n : E, b = n / P + lone;
    return b < n ? b : n;
}

TD_GP_FN int64_t td_group_grid(int64_t n, int64_t E, int64_t P)
{
    const int64_t b = td_group_bound(n, E, P), old = (n < E ? n : E) + n / td_pack_of(n) + 1;
    return b > old ? b : old;
}

TD_GP_FN int64_t td_group_ws(int64_t tokens_max, int64_t k, int64_t E)
{
    int64_t most = 0;
    for (int64_t t = 1; t <= tokens_max; t++) {
        /* the smaller pack of the two td_group_pack may pick gives the larger bound */
        const int64_t b = td_group_bound(t * k, E, td_group_pack(t * k, t, 0));
        if (b > most) most = b;
    }
    return most;
}

#if defined(__CUDA_ARCH__)
#define TD_GP_UNROLL4 _Pragma("unroll 4")
#else
#define TD_GP_UNROLL4
#endif

TD_GP_FN void td_group_small_walk1(const int32_t *sid, int ns, int s, int e, int *rank, int *cnt, int *before)
{
    int r = 0, c = 0, b = 0;
    TD_GP_UNROLL4
    for (int j = 0; j < ns; j++) {
        const int o = sid[j];
        r += o == e && j < s;
        c += o == e;
        b += o >= 0 && o < e;
    }
    *rank = r;
    *cnt = c;
    *before = b;
}

TD_GP_FN void td_group_small_walk2(const int32_t *sid, const int32_t *npk, int ns, int e, int *first, int *total)
{
    int f = 0, t = 0;
    TD_GP_UNROLL4
    for (int j = 0; j < ns; j++) {
        const int c = npk[j];
        t += c;
        f += sid[j] < e ? c : 0;
    }
    *first = f;
    *total = t;
}

#endif /* TD_CUDA_GROUP_PACK_H */
