/* test_dec_split.c — the decode kernel's split of a one-tile call's items over its blocks
 * (cuda/dec_split.h): every item computed exactly once (whole, or each of its row tiles by one
 * block's warps), equal whole-item counts where a tail is taken by chunks, the tail only where
 * one round of the grid holds it, and the production shape's cases worked out by hand. */
#include "test_common.h"
#include "cuda/dec_split.h"

enum { DW = 8 };

/* Check one (n, NC, B): coverage, balance, and the tail's conditions. Returns the blocks with
 * tail tiles. */
static int check_split(int n, int NC, int B)
{
    int *whole = calloc((size_t)n + 1, sizeof *whole), *tile = calloc((size_t)n * DW + 1, sizeof *tile);
    assert_non_null(whole);
    assert_non_null(tile);
    const int q = n / B, r = n - q * B, per = DW / NC;
    const int expect_tail = NC >= 2 && q >= 1 && r > 0 && (int64_t)r * DW <= (int64_t)B * per;
    int tail_blocks = 0, tail_tiles = 0;
    for (int b = 0; b < B; b++) {
        td_dec_split s;
        memset(&s, 0x5a, sizeof s); /* every field must be written */
        td_dec_split_of(n, NC, DW, B, b, &s);
        assert_true(0 <= s.it0 && s.it0 <= s.it1 && s.it1 <= n);
        for (int i = s.it0; i < s.it1; i++) whole[i]++;
        assert_true(s.tail_n >= 0 && s.tail_n <= per);
        if (expect_tail) {
            assert_int_equal(s.it1 - s.it0, q); /* balanced whole items */
            assert_int_equal(s.tail_item0, q * B);
        } else {
            assert_int_equal(s.tail_n, 0);
            assert_int_equal(s.it0, (int)((int64_t)b * n / B)); /* the equal split */
            assert_int_equal(s.it1, (int)((int64_t)(b + 1) * n / B));
        }
        if (s.tail_n == 0) continue;
        tail_blocks++;
        /* the block's tail tiles lie in one item */
        assert_int_equal(s.tail_t0 / DW, (s.tail_t0 + s.tail_n - 1) / DW);
        for (int j = 0; j < s.tail_n; j++) {
            const int t = s.tail_t0 + j, item = s.tail_item0 + t / DW;
            assert_true(item >= s.tail_item0 && item < n);
            tile[item * DW + t % DW]++;
            tail_tiles++;
        }
    }
    /* every item exactly once: whole, or all of its tiles once each */
    for (int i = 0; i < n; i++) {
        int tiles = 0;
        for (int k = 0; k < DW; k++) {
            assert_true(tile[i * DW + k] <= 1);
            tiles += tile[i * DW + k];
        }
        if (whole[i] == 1) assert_int_equal(tiles, 0);
        else {
            assert_int_equal(whole[i], 0);
            assert_int_equal(tiles, DW);
        }
    }
    assert_int_equal(tail_tiles, expect_tail ? r * DW : 0);
    free(whole);
    free(tile);
    return tail_blocks;
}

static void split_covers_every_item_once(void **state)
{
    (void)state;
    static const int Bs[] = {1, 2, 3, 5, 8, 31, 132, 264, 396, 397};
    static const int NCs[] = {1, 2, 4, 8};
    long cases = 0, with_tail = 0;
    for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++)
        for (size_t ci = 0; ci < sizeof NCs / sizeof NCs[0]; ci++) {
            const int B = Bs[bi];
            for (int n = 0; n <= 3 * B + 40; n++, cases++) with_tail += check_split(n, NCs[ci], B) > 0;
            for (int n = 10 * B - 3; n <= 10 * B + 3 + B / 8; n++, cases++) with_tail += check_split(n, NCs[ci], B) > 0;
        }
    /* the tail is taken in many of the cases (not a check that never runs its branch) */
    assert_true(with_tail > cases / 20);
}

/* The work of the busiest block, in chunks a warp walks one after the other: without the tail
 * ceil(n / B) items of NC chunks; with it q items and one chunk of the tail. The tail never
 * makes it longer, and shortens it wherever it is taken. */
static void split_shortens_the_busiest_block(void **state)
{
    (void)state;
    for (int NC = 2; NC <= 8; NC *= 2)
        for (int B = 1; B <= 400; B += 13)
            for (int n = B; n <= 4 * B; n++) {
                int longest = 0, tail = 0;
                for (int b = 0; b < B; b++) {
                    td_dec_split s;
                    td_dec_split_of(n, NC, DW, B, b, &s);
                    const int w = (s.it1 - s.it0) * NC + (s.tail_n > 0);
                    if (w > longest) longest = w;
                    tail |= s.tail_n > 0;
                }
                const int equal = (n + B - 1) / B * NC;
                assert_int_equal(td_dec_rounds(n, NC, DW, B), longest); /* the closed form */
                assert_true(longest <= equal);
                if (tail) assert_true(longest < equal);
            }
}

/* The production shape on a 132-SM GPU (grid 396): W13 at K = 2560 (NC 8), W2 at K = 640 (NC 2). */
static void split_production_cases(void **state)
{
    (void)state;
    td_dec_split s;
    /* M = 4, direct dispatch: W13 400 items -> 1 each and 32 tail tiles, one per block 0..31 */
    td_dec_split_of(400, 8, DW, 396, 5, &s);
    assert_int_equal(s.it0, 5);
    assert_int_equal(s.it1, 6);
    assert_int_equal(s.tail_n, 1);
    assert_int_equal(s.tail_t0, 5);
    assert_int_equal(s.tail_item0, 396);
    td_dec_split_of(400, 8, DW, 396, 32, &s);
    assert_int_equal(s.tail_n, 0);
    assert_int_equal(s.it1 - s.it0, 1);
    assert_int_equal(check_split(400, 8, 396), 32);
    /* W2: 800 items -> 2 each and 64 tail tiles, four per block 0..15 */
    td_dec_split_of(800, 2, DW, 396, 15, &s);
    assert_int_equal(s.it0, 30);
    assert_int_equal(s.it1, 32);
    assert_int_equal(s.tail_n, 4);
    assert_int_equal(s.tail_t0, 60);
    assert_int_equal(check_split(800, 2, 396), 16);
    /* M = 8 with top-9 routes: W13 720 items leave 324 over, 2,592 tiles: more than one round
     * (396 blocks x 1 tile) holds, so the equal split */
    assert_int_equal(check_split(720, 8, 396), 0);
    td_dec_split_of(720, 8, DW, 396, 0, &s);
    assert_int_equal(s.it1 - s.it0, 1);
    td_dec_split_of(720, 8, DW, 396, 395, &s);
    assert_int_equal(s.it1 - s.it0, 2);
    /* one chunk per tile (K = 320): no tail */
    assert_int_equal(check_split(400, 1, 396), 0);
    /* fewer items than blocks (M = 1: 100 W13 items): no tail */
    assert_int_equal(check_split(100, 8, 396), 0);
}

/* td_dec_rounds without a tail (one chunk per tile, or fewer items than blocks) and the choice
 * of W2 with the combine fused in at the production shape on a 132-SM GPU: W2 at K = 640 (NC 2)
 * and at the TP4 slice's K = 160 (NC 1), 160 row tiles, top-10; k_dec's 396 blocks of 8 warps,
 * k_w2c's 264 blocks. The fused W2 takes M = 1 at TP1 and M = 1..8 on the TP4 slice, the rounds
 * of each case worked out by hand (the A/B that led to the rule: docs/perf.md). */
static void rounds_and_w2c_choice(void **state)
{
    (void)state;
    for (int B = 1; B <= 400; B += 7)
        for (int n = 0; n <= 3 * B; n++) assert_int_equal(td_dec_rounds(n, 1, DW, B), (n + B - 1) / B);
    assert_int_equal(td_dec_rounds(200, 2, DW, 396), 2);  /* TP1 M = 1: 200 items, one each */
    assert_int_equal(td_dec_rounds(400, 2, DW, 396), 3);  /* M = 2: 1 item + a tail chunk */
    assert_int_equal(td_dec_rounds(800, 2, DW, 396), 5);  /* M = 4 */
    assert_int_equal(td_dec_rounds(3200, 2, DW, 396), 17); /* M = 16 */
    static const struct { int M, NC, pays; } cases[] = {
        {1, 2, 1},  /* 160 items on 264 blocks: 2 rounds, as k_dec's 200 items on 396 */
        {2, 2, 0},  /* 320 items: 4 rounds against 3 */
        {4, 2, 0},  /* 640: 6 against 5 */
        {8, 2, 0},  /* 1,280: 10 against 9 */
        {16, 2, 0}, /* 2,560: 20 against 17 */
        {1, 1, 1},  /* TP4: 1 against 1 */
        {2, 1, 1},  /* 2 against 2 */
        {4, 1, 1},  /* 3 against 3 (no tail with one chunk per tile) */
        {8, 1, 1},  /* 5 against 5 */
        {16, 1, 0}, /* 10 against 9 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(td_w2c_pays(cases[i].M, 10, 160, cases[i].NC, DW, 396, 264), cases[i].pays);
    assert_true(td_w2c_pays(0, 10, 160, 2, DW, 396, 264)); /* nothing to do: either way */
}

/* The narrow blocks (4 warps, 7 per SM, no tail) at the production shape and its TP4 slice on a
 * 132-SM GPU (396 blocks of 8 warps, 924 of 4 at most), top-10 direct dispatch: groups = 10 M
 * slots, the grids min(items, 396) and min(items, 924) as the launcher takes them. The rounds
 * of each case worked out by hand; the narrow blocks are taken exactly where they walk fewer and
 * the 8-warp blocks leave warps idle (row tiles not a multiple of 8) or a tile is one chunk: at
 * the production shape never (they were measured slower there), on the TP4 slice for W13 at
 * M = 16 and W2 at M = 2..16. */
static int grid_of(int items, int cap) { return items < cap ? items : cap; }

static void narrow_rounds_and_choice(void **state)
{
    (void)state;
    assert_int_equal(TD_DEC_NARROW_WARPS, 4);
    assert_int_equal(TD_DEC_NARROW_BLOCKS, 7);
    static const struct { int M, RT, NC, r8, rn; } cases[] = {
        /* W13, K = 2560 (8 chunks), 80 row tiles: 10 items of 8 per group, 20 of 4 */
        {1, 80, 8, 8, 8},   /* 100 items on 100 blocks; 200 on 200 */
        {2, 80, 8, 8, 8},   /* 200; 400 */
        {4, 80, 8, 9, 8},   /* 400 on 396: 1 item + a tail chunk; 800 on 800 */
        {8, 80, 8, 17, 16}, /* 800: 2 + a chunk; 1,600 on 924: 2 */
        {16, 80, 8, 33, 32},/* 1,600: 4 + a chunk; 3,200 on 924: 4 */
        /* W2, K = 640 (2 chunks), 160 row tiles: 20 and 40 items per group */
        {1, 160, 2, 2, 2},  /* 200; 400 */
        {2, 160, 2, 3, 2},  /* 400 on 396: 1 + a chunk; 800 on 800 */
        {4, 160, 2, 5, 4},  /* 800: 2 + a chunk; 1,600 on 924: 2 */
        {8, 160, 2, 9, 8},  /* 3,200 on 924: 4 */
        {16, 160, 2, 17, 14}, /* 6,400 on 924: 7 */
        /* the TP4 slice: W13 K = 2560 over 20 row tiles (3 and 5 items), W2 K = 160 (1 chunk) */
        {1, 20, 8, 8, 8},   /* 30 items; 50 */
        {8, 20, 8, 8, 8},   /* 240; 400 */
        {16, 20, 8, 16, 8}, /* 480 on 396 (84 over: more than one round of tiles, no tail): 2; 800 on 800: 1 */
        {1, 160, 1, 1, 1},
        {2, 160, 1, 2, 1},  /* 400 on 396; 800 on 800 */
        {4, 160, 1, 3, 2},  /* 800; 1,600 on 924 */
        {8, 160, 1, 5, 4},
        {16, 160, 1, 9, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int g = 10 * cases[i].M, RT = cases[i].RT, NC = cases[i].NC;
        const int n8 = g * ((RT + 7) / 8), nn = g * ((RT + 3) / 4);
        const int B8 = grid_of(n8, 396), Bn = grid_of(nn, 924);
        assert_int_equal(td_dec_rounds(n8, NC, DW, B8), cases[i].r8);
        assert_int_equal(td_dec_narrow_rounds(g, RT, NC, Bn), cases[i].rn);
        assert_int_equal(td_dec_narrow_pays(g, RT, NC, B8, Bn),
                         cases[i].rn < cases[i].r8 && (RT % 8 != 0 || NC == 1));
        if (RT == 80 || NC == 2) assert_false(td_dec_narrow_pays(g, RT, NC, B8, Bn)); /* TP1: never */
    }
    /* nothing to do, or no narrow grid: never */
    assert_false(td_dec_narrow_pays(0, 160, 2, 1, 1));
    assert_false(td_dec_narrow_pays(40, 160, 2, 396, 0));
    assert_int_equal(td_dec_narrow_rounds(0, 160, 2, 924), 0);
    /* against a brute count: the narrow blocks' busiest block has ceil(nn / Bn) items */
    for (int g = 1; g <= 200; g += 3)
        for (int RT = 1; RT <= 170; RT += 13)
            for (int Bn = 1; Bn <= 950; Bn += 97) {
                const int nn = g * ((RT + 3) / 4);
                int most = 0;
                for (int b = 0; b < Bn; b++) {
                    td_dec_split s;
                    td_dec_split_of(nn, 1, 4, Bn, b, &s); /* the narrow kernel's split: NC 1, no tail */
                    assert_int_equal(s.tail_n, 0);
                    if (s.it1 - s.it0 > most) most = s.it1 - s.it0;
                }
                assert_int_equal(td_dec_narrow_rounds(g, RT, 2, Bn), most * 2);
            }
    /* fewer rounds alone do not take them: W2 at the production shape, M = 4 (4 against 5) */
    assert_false(td_dec_narrow_pays(40, 160, 2, 396, 924));
    /* a tile count not a multiple of 8 with a round fewer does (W13 of the TP4 slice, M = 16) */
    assert_true(td_dec_narrow_pays(160, 20, 8, 396, 800));
}

/* The host's choice of the kernel without the tail's code is safe: whenever some block of a
 * launch takes tail tiles, td_dec_tail_possible says so, for the exact count and for every count
 * up to a bound; with the exact count it is also never true without a tail. */
static void tail_possible_covers_every_tail(void **state)
{
    (void)state;
    static const int Bs[] = {1, 2, 3, 7, 8, 31, 132, 396};
    long exact_true = 0, bound_false = 0;
    for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++)
        for (int NC = 1; NC <= 8; NC *= 2) {
            const int B = Bs[bi];
            int any = 0; /* some count up to n has a tail */
            for (int n = 0; n <= 3 * B + 20; n++) {
                int has = 0;
                for (int b = 0; b < B && !has; b++) {
                    td_dec_split s;
                    td_dec_split_of(n, NC, DW, B, b, &s);
                    has = s.tail_n > 0;
                }
                any |= has;
                assert_int_equal(td_dec_tail_possible(n, 1, NC, DW, B), has);
                if (any) assert_true(td_dec_tail_possible(n, 0, NC, DW, B));
                exact_true += has;
                bound_false += !td_dec_tail_possible(n, 0, NC, DW, B);
            }
        }
    /* both answers occur (the kernel without the tail is taken somewhere, and the tail too) */
    assert_true(exact_true > 0 && bound_false > 0);
    /* the production shape: M = 1 (100 W13 items, 200 W2 on 396 blocks) takes no tail; grouped
     * M = 4 with up to 46 groups (460 W13 items) may */
    assert_false(td_dec_tail_possible(100, 1, 8, DW, 396));
    assert_false(td_dec_tail_possible(200, 1, 2, DW, 396));
    assert_false(td_dec_tail_possible(120, 0, 8, DW, 396));
    assert_true(td_dec_tail_possible(400, 1, 8, DW, 396));
    assert_true(td_dec_tail_possible(460, 0, 8, DW, 396));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_covers_every_item_once),
        cmocka_unit_test(split_shortens_the_busiest_block),
        cmocka_unit_test(split_production_cases),
        cmocka_unit_test(tail_possible_covers_every_tail),
        cmocka_unit_test(rounds_and_w2c_choice),
        cmocka_unit_test(narrow_rounds_and_choice),
    };
    return cmocka_run_group_tests_name("dec_split", tests, NULL, NULL);
}
