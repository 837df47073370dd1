/* dec_split.h — how the decode kernel (cuda/moe_mma.cu, k_dec) shares a one-tile call's items
 * among its blocks, in plain C so that the host tests it (tests/test_dec_split.c) and the
 * kernel runs the same code.
 *
 * An item is one group x DW row tiles (one per warp); a row tile is NC chunks of K, walked one
 * after the other by one warp. Equal ranges of n items over B blocks leave r = n mod B blocks
 * with one item more than the others, so those blocks' warps walk NC chunks more and the
 * launch takes about (q + 1) / q times one block's q = n div B items. td_dec_split_of() gives
 * block b of B its range [it0, it1) of whole items and, where the call has a tail that one
 * round of the grid can take by chunks (NC >= 2, q >= 1, r > 0, r DW NC <= B DW), its share of
 * the last r items' T = r DW row tiles: every block takes exactly q whole items (b q ..
 * b q + q - 1) and the tiles tail_t0 .. tail_t0 + tail_n - 1 (tail_n <= DW / NC) of the tail,
 * which begins at item tail_item0 = q B; a block's tail tiles lie in one item, tile t of the
 * tail being row tile t mod DW of item tail_item0 + t div DW. Without such a tail, [it0, it1) is
 * the equal split (b n / B .. (b + 1) n / B) and tail_n = 0. Every item is computed exactly once
 * either way: whole, or its DW tiles each by NC warps of one block.
 *
 * The narrow blocks: a one-tile launch may instead run blocks of TD_DEC_NARROW_WARPS = 4 warps,
 * TD_DEC_NARROW_BLOCKS = 7 per SM, without the tail (28 warps per SM against three blocks of 8;
 * built for at most 72 registers per thread, which 28 warps allow). The items of 8 row tiles then
 * become more items of 4, and a launch whose chunks overflow the 8-warp grid's rounds by a little
 * (W2 at M = 4 at the production shape: 12,800 chunks for 3,168 warps, 4.04 rounds, so 5) fits
 * the 3,696 warps' rounds (4). Fewer rounds alone were measured not to pay at the production
 * shape (blocks of 4, seven per SM, 1.02-1.24 times as long; blocks of 5, five per SM, 1.06-1.40
 * times: these may also put twice as many warps on one of an SM's four schedulers as on the
 * others); td_dec_narrow_pays() says where the narrow blocks are taken (docs/perf.md).
 *
 * Contract: n_items >= 0, NC and DW powers of two with NC <= DW (td_dec_split_of with NC = 1,
 * no tail, for the narrow blocks' DW), 1 <= B, 0 <= b < B, n_items and B below 2^31 / DW. Pure integer
 * arithmetic, no state.
 */
#ifndef TD_CUDA_DEC_SPLIT_H
#define TD_CUDA_DEC_SPLIT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define TD_DEC_FN static inline __host__ __device__
#else
#define TD_DEC_FN static inline
#endif

typedef struct td_dec_split {
    int it0, it1;   /* whole items [it0, it1) */
    int tail_n;     /* tail tiles of this block (0: none) */
    int tail_t0;    /* its first tail tile */
    int tail_item0; /* the tail's first item (q B) */
} td_dec_split;

TD_DEC_FN void td_dec_split_of(int n_items, int NC, int DW, int B, int b, td_dec_split *s)
{
    s->it0 = (int)((int64_t)b * n_items / B);
    s->it1 = (int)((int64_t)(b + 1) * n_items / B);
    s->tail_n = 0;
    s->tail_t0 = 0;
    s->tail_item0 = 0;
    const int per = DW / NC, q = n_items / B, r = n_items - q * B;
    if (NC < 2 || q < 1 || r == 0 || (int64_t)r * DW > (int64_t)B * per) return;
    const int T = r * DW, t0 = b * per;
    s->it0 = b * q;
    s->it1 = s->it0 + q;
    s->tail_item0 = q * B;
    s->tail_t0 = t0;
    s->tail_n = t0 >= T ? 0 : (T - t0 < per ? T - t0 : per);
}

/* Whether the launch may take a tail, for its host: with the item count known (exact != 0:
 * direct dispatch) whether td_dec_split_of gives n_items a tail; with only a bound known (the
 * groups are counted on the device) whether some count up to n_items may, i.e. NC >= 2 and more
 * items than blocks. The kernel is instantiated with and without the tail's code, and a launch
 * for which this is 0 takes the one without. */
TD_DEC_FN int td_dec_tail_possible(int n_items, int exact, int NC, int DW, int B)
{
    if (!exact) return NC >= 2 && n_items > B;
    td_dec_split s;
    td_dec_split_of(n_items, NC, DW, B, 0, &s);
    return s.tail_n > 0;
}

/* Chunks the busiest warp of a one-tile launch walks one after the other (the launch's length
 * in rounds of chunk transfers): q whole items of NC chunks and one chunk of the tail where
 * td_dec_split_of takes one, else ceil(n_items / B) items of NC chunks. */
TD_DEC_FN int td_dec_rounds(int n_items, int NC, int DW, int B)
{
    if (n_items <= 0) return 0;
    td_dec_split s;
    td_dec_split_of(n_items, NC, DW, B, 0, &s);
    if (s.tail_n > 0) return (s.it1 - s.it0) * NC + 1;
    return (n_items + B - 1) / B * NC;
}

#define TD_DEC_NARROW_WARPS 4
#define TD_DEC_NARROW_BLOCKS 7

/* Rounds of a one-tile launch on the narrow blocks (no tail): `groups` groups of RT row tiles,
 * ceil(RT / TD_DEC_NARROW_WARPS) items each, over Bn blocks. */
TD_DEC_FN int td_dec_narrow_rounds(int groups, int RT, int NC, int Bn)
{
    const int n = groups * ((RT + TD_DEC_NARROW_WARPS - 1) / TD_DEC_NARROW_WARPS);
    return n <= 0 ? 0 : (n + Bn - 1) / Bn * NC;
}

/* Whether a one-tile launch of direct dispatch takes the narrow blocks (grid Bn) for `groups`
 * groups of RT row tiles of NC chunks: where they walk fewer rounds than the 8-warp blocks (grid
 * B8, the tail by chunks where it fits), and only where the 8-warp blocks leave warps idle (RT
 * not a multiple of 8: the TP4 slice's W13, 20 row tiles, three items of 8 with 4 warps idle) or
 * a row tile is one chunk (NC = 1: the TP4 slice's W2). Elsewhere a narrow block's chunk rounds
 * were measured slower than the 8-warp blocks' (at the production shape's W13 and W2, NC = 8
 * and 2, the routed part took 1.02-1.24 times as long with a round fewer; docs/perf.md), so
 * fewer rounds alone do not pay. Ties keep the 8-warp blocks. Only for a group count known on
 * the host. */
TD_DEC_FN int td_dec_narrow_pays(int groups, int RT, int NC, int B8, int Bn)
{
    if (groups <= 0 || Bn <= 0 || (RT % 8 == 0 && NC != 1)) return 0;
    return td_dec_narrow_rounds(groups, RT, NC, Bn) < td_dec_rounds(groups * ((RT + 7) / 8), NC, 8, B8);
}

/* Whether the routed W2 with the combine fused in (k_w2c: an item is one token x one row tile,
 * walked by k warps, one per slot, NC chunks each; equal ranges over its G blocks) takes no
 * more rounds than k_dec's W2 on its 8-warp blocks (an item is one slot x DW row tiles: tokens
 * k ceil(RT / DW) items over B blocks, td_dec_rounds), so that saving the combine's launch does
 * not lengthen W2. The launch it saves is worth about 1 us at decode sizes, and one round of
 * W2's chunks more cost more than that in every case measured (docs/cuda.md). Where it pays,
 * the fused W2 is taken even where the narrow blocks would walk fewer rounds of a separate W2:
 * on the TP4 slice at M = 2 and 4 those gave a shorter routed part but a longer block. */
TD_DEC_FN int td_w2c_pays(int tokens, int k, int RT, int NC, int DW, int B, int G)
{
    const int items = tokens * RT, w2c = items <= 0 ? 0 : (items + G - 1) / G * NC;
    return w2c <= td_dec_rounds(tokens * k * ((RT + DW - 1) / DW), NC, DW, B);
}

#endif /* TD_CUDA_DEC_SPLIT_H */
