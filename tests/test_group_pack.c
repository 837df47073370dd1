/* test_group_pack.c — grouped dispatch's packs and group-count bounds (cuda/group_pack.h):
 * the bound holds for every way of spreading a call's slots over its experts (brute force over
 * small cases, adversarial and seeded random counts over large ones), the workspace bound
 * covers every call size, packs cut no group of routes that are distinct within each token,
 * and the small grouping kernel's walks give the reference grouping's arrays. */
#include "test_common.h"
#include "cuda/group_pack.h"
#include "rng.h"

/* Groups of counts c[0..E) in packs of P. */
static int64_t groups_of(const int64_t *c, int64_t E, int64_t P)
{
    int64_t g = 0;
    for (int64_t e = 0; e < E; e++) g += (c[e] + P - 1) / P;
    return g;
}

/* The most groups of n slots on E experts in packs of P, by brute force over every count
 * vector (E and n small). */
static int64_t most_groups(int64_t n, int64_t E, int64_t P, int64_t *c, int64_t e)
{
    if (e == E - 1) {
        c[e] = n;
        return groups_of(c, E, P);
    }
    int64_t best = 0;
    for (int64_t x = 0; x <= n; x++) {
        c[e] = x;
        const int64_t g = most_groups(n - x, E, P, c, e + 1);
        if (g > best) best = g;
    }
    return best;
}

/* The bound before packs below 8 slots existed: with them it is too small (a check that can
 * fail). */
static int64_t old_bound(int64_t n, int64_t E) { return (n < E ? n : E) + n / td_pack_of(n) + 1; }

static void bound_holds_for_every_count_vector(void **state)
{
    (void)state;
    int64_t c[6];
    long tight = 0, old_short = 0;
    for (int64_t E = 1; E <= 5; E++)
        for (int64_t n = 0; n <= (E <= 3 ? 24 : 12); n++)
            for (int64_t P = 1; P <= 9; P++) {
                const int64_t most = most_groups(n, E, P, c, 0), b = td_group_bound(n, E, P);
                assert_true(most <= b);
                assert_true(b <= n);
                tight += most == b;
                old_short += most > old_bound(n, E);
            }
    assert_true(tight > 100);    /* the bound is reached in many cases, not just safe */
    assert_true(old_short > 10); /* and the old formula with small packs would be short */
}

/* Large calls: counts that put P * j + 1 slots on as many experts as possible (the most groups
 * per slot), and seeded random spreads, on up to 512 experts. */
static void bound_holds_at_production_sizes(void **state)
{
    (void)state;
    static const int64_t Es[] = {8, 64, 128, 512, 3000};
    static int64_t c[3000];
    td_rng rng;
    td_rng_seed(&rng, 20261201);
    for (size_t ei = 0; ei < TD_ARRAY_LEN(Es); ei++) {
        const int64_t E = Es[ei];
        for (int64_t n = 1; n <= 8000; n = n * 3 / 2 + 1)
            for (int64_t P = 1; P <= TD_GROUP_PACK_DEC; P++) {
                /* adversarial: one slot on each of min(n, E) experts, the rest in whole packs */
                memset(c, 0, sizeof c);
                int64_t left = n;
                for (int64_t e = 0; e < E && left > 0; e++, left--) c[e] = 1;
                for (int64_t e = 0; left > 0; e = (e + 1) % E) {
                    const int64_t add = left < P ? left : P;
                    c[e] += add;
                    left -= add;
                }
                assert_true(groups_of(c, E, P) <= td_group_bound(n, E, P));
                /* random */
                memset(c, 0, sizeof c);
                for (int64_t s = 0; s < n; s++) c[td_rng_below(&rng, (uint64_t)E)]++;
                assert_true(groups_of(c, E, P) <= td_group_bound(n, E, P));
            }
    }
}

static void pack_choice(void **state)
{
    (void)state;
    assert_int_equal(td_pack_of(1), 8);
    assert_int_equal(td_pack_of(255), 8);
    assert_int_equal(td_pack_of(256), 16);
    for (int64_t t = 0; t <= 40; t++)
        for (int64_t k = 1; k <= 16; k++) {
            const int64_t n = t * k, p0 = td_group_pack(n, t, 0), p1 = td_group_pack(n, t, 1);
            if (n >= 256) {
                assert_int_equal(p0, 16);
                assert_int_equal(p1, 24);
            } else {
                assert_int_equal(p0, p1);
                assert_int_equal(p0, t == 3 || t == 4 ? 4 : 8);
            }
        }
    /* the production shape (top-10): M = 1, 2 take packs of 8, M = 3, 4 of 4, M = 8, 16 of 8,
     * M = 784 of 24 */
    assert_int_equal(td_group_pack(10, 1, 1), 8);
    assert_int_equal(td_group_pack(20, 2, 1), 8);
    assert_int_equal(td_group_pack(30, 3, 1), 4);
    assert_int_equal(td_group_pack(40, 4, 1), 4);
    assert_int_equal(td_group_pack(80, 8, 1), 8);
    assert_int_equal(td_group_pack(160, 16, 1), 8);
    assert_int_equal(td_group_pack(7840, 784, 1), 24);
    /* bounds there: at most the slots, so M = 1's 10 groups give the decode kernel 100 W13 items */
    assert_int_equal(td_group_bound(10, 512, 8), 10);
    assert_int_equal(td_group_bound(40, 512, 4), 40);
    assert_int_equal(td_group_bound(160, 512, 8), 160);
    assert_int_equal(td_group_bound(7840, 512, 24), 512 + 326);
}

/* Routes distinct within each token (the router's top-k): at up to 8 tokens the packs of
 * td_group_pack cut no expert's slots, so the groups are the distinct experts; beyond, and
 * with one expert taking every slot (imposed routes), the groups fit the bound. */
static void packs_cut_no_distinct_route(void **state)
{
    (void)state;
    static const int64_t Es[] = {10, 16, 64, 512};
    static int64_t c[512];
    long uncut = 0;
    td_rng rng;
    td_rng_seed(&rng, 7);
    for (size_t ei = 0; ei < TD_ARRAY_LEN(Es); ei++) {
        const int64_t E = Es[ei];
        for (int64_t k = 1; k <= 10 && k <= E; k++)
            for (int64_t t = 1; t <= 24; t++)
                for (int rep = 0; rep < 8; rep++) {
                    memset(c, 0, sizeof c);
                    int64_t distinct = 0;
                    for (int64_t tok = 0; tok < t; tok++) {
                        unsigned char used[512] = {0};
                        for (int64_t j = 0; j < k; j++) {
                            int64_t e;
                            do e = (int64_t)td_rng_below(&rng, (uint64_t)E);
                            while (used[e]);
                            used[e] = 1;
                            distinct += c[e]++ == 0;
                        }
                    }
                    const int64_t n = t * k, P = td_group_pack(n, t, 0);
                    if (t <= P) assert_int_equal(groups_of(c, E, P), distinct);
                    uncut += t <= P;
                    assert_true(groups_of(c, E, P) <= td_group_bound(n, E, P));
                    /* the same slots all on one expert: n / P packs and a last one */
                    memset(c, 0, sizeof c);
                    c[0] = n;
                    assert_int_equal(groups_of(c, E, P), (n + P - 1) / P);
                    assert_true(groups_of(c, E, P) <= td_group_bound(n, E, P));
                }
    }
    assert_true(uncut > 1000);
}

/* The grids cover the bound (every group has a block), and keep at least the earlier sizes. */
static void grid_covers_the_bound(void **state)
{
    (void)state;
    long wider = 0;
    for (int64_t E = 1; E <= 600; E += 37)
        for (int64_t n = 0; n <= 3000; n += 7)
            for (int64_t P = 1; P <= TD_GROUP_PACK_DEC; P++) {
                const int64_t g = td_group_grid(n, E, P);
                assert_true(g >= td_group_bound(n, E, P));
                assert_true(g >= (n < E ? n : E) + n / td_pack_of(n) + 1);
                wider += g > td_group_bound(n, E, P);
            }
    assert_true(wider > 0);
    /* 2 tokens of top-10 on 512 experts in packs of 8: 23 groups (W13 230 blocks), not 20 */
    assert_int_equal(td_group_grid(20, 512, 8), 23);
    assert_int_equal(td_group_grid(40, 512, 4), 46);
}

/* The workspace bound covers every call of up to tokens_max tokens whichever pack is picked,
 * and is the largest of those bounds (no wider than needed). */
static void workspace_covers_every_call(void **state)
{
    (void)state;
    static const int64_t Es[] = {1, 4, 16, 512, 3000};
    static const int64_t ks[] = {1, 2, 8, 10};
    static const int64_t Cs[] = {1, 3, 7, 8, 25, 26, 100, 1024};
    for (size_t ei = 0; ei < TD_ARRAY_LEN(Es); ei++)
        for (size_t ki = 0; ki < TD_ARRAY_LEN(ks); ki++)
            for (size_t ci = 0; ci < TD_ARRAY_LEN(Cs); ci++) {
                const int64_t E = Es[ei], k = ks[ki], C = Cs[ci], ws = td_group_ws(C, k, E);
                int64_t most = 0;
                for (int64_t t = 1; t <= C; t++)
                    for (int d = 0; d <= 1; d++) {
                        const int64_t b = td_group_bound(t * k, E, td_group_pack(t * k, t, d));
                        assert_true(b <= ws);
                        if (b > most) most = b;
                    }
                assert_int_equal(ws, most);
            }
    /* the engine's workspace: 1,024 tokens of top-10 on 512 experts */
    assert_int_equal(td_group_ws(1024, 10, 512), 512 + 640);
}

/* k_group_small on the host: every slot's two walks (cuda/group_pack.h), then the writes the
 * kernel makes, into arrays poisoned beforehand. */
static void small_groups(const int32_t *ids, int ns, int E, int P, int32_t *ng, int32_t *g_mat, int32_t *g_start,
                         int32_t *g_count, int32_t *perm)
{
    int32_t sid[128], npk[128];
    int rank[128], cnt[128], before[128];
    for (int s = 0; s < ns; s++) sid[s] = ids[s] >= 0 && ids[s] < E ? ids[s] : -1;
    for (int s = 0; s < ns; s++) {
        td_group_small_walk1(sid, ns, s, sid[s], &rank[s], &cnt[s], &before[s]);
        npk[s] = sid[s] >= 0 && rank[s] == 0 ? (cnt[s] + P - 1) / P : 0;
    }
    for (int s = 0; s < ns; s++) {
        if (sid[s] >= 0) perm[before[s] + rank[s]] = s;
        int first, total;
        td_group_small_walk2(sid, npk, ns, sid[s], &first, &total);
        for (int q = 0; q < npk[s]; q++) {
            g_mat[first + q] = sid[s];
            g_start[first + q] = before[s] + q * P;
            g_count[first + q] = cnt[s] - q * P < P ? cnt[s] - q * P : P;
        }
        if (s == 0) *ng = total;
    }
}

/* The grouping's contract written the plain way: experts ascending, each expert's slots in
 * ascending slot order, cut into packs of P. */
static void reference_groups(const int32_t *ids, int ns, int E, int P, int32_t *ng, int32_t *g_mat, int32_t *g_start,
                             int32_t *g_count, int32_t *perm)
{
    int at = 0, g = 0;
    for (int e = 0; e < E; e++) {
        const int start = at;
        for (int s = 0; s < ns; s++)
            if (ids[s] == e) perm[at++] = s;
        for (int q = start; q < at; q += P, g++) {
            g_mat[g] = e;
            g_start[g] = q;
            g_count[g] = at - q < P ? at - q : P;
        }
    }
    *ng = g;
}

/* The small grouping kernel's walks give the reference's arrays, element for element, and
 * write no element past them: random routes with invalid ids and repeated experts, one expert
 * taking every slot, every slot invalid; up to 128 slots, packs 1..24. */
static void small_grouping_matches_the_reference(void **state)
{
    (void)state;
    static const int Es[] = {1, 3, 16, 512};
    td_rng rng;
    td_rng_seed(&rng, 128);
    long groups_seen = 0;
    for (size_t ei = 0; ei < TD_ARRAY_LEN(Es); ei++)
        for (int ns = 1; ns <= 128; ns += (ns < 24 ? 1 : 13))
            for (int P = 1; P <= TD_GROUP_PACK_DEC; P += (P < 8 ? 1 : 8))
                for (int kind = 0; kind < 4; kind++) {
                    const int E = Es[ei];
                    int32_t ids[128], a[5][129], b[5][129];
                    for (int s = 0; s < ns; s++) {
                        const uint64_t r = td_rng_below(&rng, (uint64_t)E + 2);
                        ids[s] = kind == 0 ? (int32_t)r - 1 : kind == 1 ? (int32_t)(r % (uint64_t)E)
                                 : kind == 2 ? 0 : (s % 2 ? -5 : E);
                    }
                    memset(a, 0x7f, sizeof a);
                    memset(b, 0x7f, sizeof b);
                    small_groups(ids, ns, E, P, &a[0][0], a[1], a[2], a[3], a[4]);
                    reference_groups(ids, ns, E, P, &b[0][0], b[1], b[2], b[3], b[4]);
                    assert_memory_equal(a, b, sizeof a);
                    groups_seen += b[0][0];
                }
    assert_true(groups_seen > 10000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bound_holds_for_every_count_vector),
        cmocka_unit_test(bound_holds_at_production_sizes),
        cmocka_unit_test(pack_choice),
        cmocka_unit_test(packs_cut_no_distinct_route),
        cmocka_unit_test(grid_covers_the_bound),
        cmocka_unit_test(workspace_covers_every_call),
        cmocka_unit_test(small_grouping_matches_the_reference),
    };
    return cmocka_run_group_tests_name("group_pack", tests, NULL, NULL);
}
