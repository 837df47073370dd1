/* test_routes.c — route agreement and top-k consistency (audit/routes).
 *
 * What is asserted:
 * - identical routes: nothing flipped or reordered, both sides follow, the mask (poisoned
 *   before) all 0;
 * - a near-tie flip between two experts: flipped 1, the gap in A's logits, its token and
 *   experts, the mask bits; the same set in another slot order: reordered, not flipped;
 * - a selection that does not follow its logits is named: the selected expert below an
 *   unselected one (with both logits), an id outside [0, E), a negative id, a duplicate id, a
 *   NaN or infinite logit; only the faulty side is blamed, and the first such token is kept;
 * - the tolerance: an exact tie picked either way and a gap of 1e-7 at logits near 1 follow, a
 *   gap of 1e-4 does not, and the tolerance grows with the logits' magnitude (a gap of 1e-5 at
 *   logits near 100 follows, 1e-3 does not);
 * - k = E (no unselected expert) follows; M = 0 is fine; bad sizes and NULL buffers are
 *   TD_ERR_ARG;
 * - seeded random logits at several scales (E 64, k 8, and E 512, k 10): top-k computed here
 *   by repeated selection follows; B's logits perturbed by noise of growing size and its top-k recomputed
 *   give flipped/reordered counts equal to a brute-force set comparison written here, and every
 *   flip's gap is at most |Δ_i| + |Δ_j| (the logits' own difference explains it).
 */
#include "test_common.h"
#include "audit/routes.h"
#include "rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void routes_identical(void **state)
{
    (void)state;
    const float lg[2 * 4] = {3, 2, 1, 0, 0, 1, 2, 3};
    const int32_t ids[2 * 2] = {0, 1, 3, 2};
    uint8_t mask[2];
    memset(mask, 0xAA, sizeof mask);
    td_route_cmp r;
    td_err err;
    assert_int_equal(td_route_compare(ids, lg, ids, lg, 2, 4, 2, mask, &r, &err), TD_OK);
    assert_int_equal(r.tokens, 2);
    assert_int_equal(r.flipped, 0);
    assert_int_equal(r.reordered, 0);
    assert_int_equal(r.first_flip, -1);
    assert_int_equal(r.gap_token, -1);
    assert_true(r.max_gap == 0.0);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(r.side[s].unfollowed, 0);
        assert_int_equal(r.side[s].token, -1);
    }
    assert_int_equal(mask[0], 0);
    assert_int_equal(mask[1], 0);
}

static void routes_flip_and_reorder(void **state)
{
    (void)state;
    /* token 0 the same; token 1: experts 2 and 3 nearly tied, A takes 2, B takes 3; token 2: the
     * same set, slots swapped */
    const float la[3 * 5] = {5, 4, 3, 2, 1, 5, 4, 3.0001f, 3.0f, 1, 9, 8, 1, 1, 1};
    const float lb[3 * 5] = {5, 4, 3, 2, 1, 5, 4, 3.0f, 3.0001f, 1, 8, 9, 1, 1, 1};
    const int32_t ia[3 * 3] = {0, 1, 2, 0, 1, 2, 0, 1, 2};
    const int32_t ib[3 * 3] = {0, 1, 2, 0, 1, 3, 1, 0, 2};
    uint8_t mask[3];
    memset(mask, 0xAA, sizeof mask);
    td_route_cmp r;
    td_err err;
    assert_int_equal(td_route_compare(ia, la, ib, lb, 3, 5, 3, mask, &r, &err), TD_OK);
    assert_int_equal(r.flipped, 1);
    assert_int_equal(r.reordered, 1);
    assert_int_equal(r.first_flip, 1);
    assert_int_equal(r.gap_token, 1);
    assert_int_equal(r.gap_a, 2);
    assert_int_equal(r.gap_b, 3);
    assert_true(fabs(r.max_gap - ((double)3.0001f - 3.0)) < 1e-12);
    assert_int_equal(r.side[0].unfollowed, 0);
    assert_int_equal(r.side[1].unfollowed, 0);
    assert_int_equal(mask[0], 0);
    assert_int_equal(mask[1], TD_ROUTE_FLIP | TD_ROUTE_ORDER);
    assert_int_equal(mask[2], TD_ROUTE_ORDER);
}

static void routes_unfollowed_named(void **state)
{
    (void)state;
    td_route_cmp r;
    td_err err;
    const float lg[4 * 4] = {4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1};
    const int32_t good[4 * 2] = {0, 1, 0, 1, 0, 1, 0, 1};
    /* B: token 0 fine, token 1 takes expert 3 (logit 1) over expert 1 (logit 3), token 2 the same */
    const int32_t below[4 * 2] = {0, 1, 0, 3, 0, 3, 0, 1};
    assert_int_equal(td_route_compare(good, lg, below, lg, 4, 4, 2, NULL, &r, &err), TD_OK);
    assert_int_equal(r.side[0].unfollowed, 0);
    assert_int_equal(r.side[1].unfollowed, 2);
    assert_int_equal(r.side[1].token, 1);
    assert_int_equal(r.side[1].why, TD_ROUTE_BELOW);
    assert_int_equal(r.side[1].sel, 3);
    assert_int_equal(r.side[1].unsel, 1);
    assert_true(r.side[1].sel_logit == 1.0f && r.side[1].unsel_logit == 3.0f);
    assert_int_equal(r.flipped, 2);
    /* blamed on A when A is the faulty side */
    assert_int_equal(td_route_compare(below, lg, good, lg, 4, 4, 2, NULL, &r, &err), TD_OK);
    assert_int_equal(r.side[0].unfollowed, 2);
    assert_int_equal(r.side[1].unfollowed, 0);
    /* ids that are not experts, twice the same expert */
    const struct {
        int32_t ids[2];
        td_route_fault why;
        int32_t id;
    } bad[] = {{{0, 4}, TD_ROUTE_BAD_ID, 4}, {{-1, 0}, TD_ROUTE_BAD_ID, -1}, {{1, 1}, TD_ROUTE_DUP_ID, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_route_side s;
        memset(&s, 0, sizeof s);
        assert_false(td_route_follows(bad[i].ids, lg, 4, 2, &s));
        assert_int_equal(s.why, bad[i].why);
        assert_int_equal(s.sel, bad[i].id);
        int32_t ib[4 * 2];
        memcpy(ib, good, sizeof ib);
        memcpy(ib + 2 * 2, bad[i].ids, sizeof bad[i].ids);
        assert_int_equal(td_route_compare(good, lg, ib, lg, 4, 4, 2, NULL, &r, &err), TD_OK);
        assert_int_equal(r.side[1].unfollowed, 1);
        assert_int_equal(r.side[1].token, 2);
        assert_int_equal(r.side[1].why, bad[i].why);
    }
    /* a logit that is not finite */
    const float inf = INFINITY;
    const float nonfin[2][4] = {{4, 3, NAN, 1}, {4, 3, 2, -inf}};
    for (int i = 0; i < 2; i++) {
        td_route_side s;
        memset(&s, 0, sizeof s);
        assert_false(td_route_follows(good, nonfin[i], 4, 2, &s));
        assert_int_equal(s.why, TD_ROUTE_NONFINITE);
        assert_int_equal(s.sel, i ? 3 : 2);
    }
}

static void routes_tolerance(void **state)
{
    (void)state;
    td_route_side s;
    const int32_t ids[2] = {0, 2}; /* expert 2 taken over expert 1 */
    const struct {
        float l1, l2;
        bool follows;
    } c[] = {
        {1.0f, 1.0f, true},             /* an exact tie, taken by the higher index */
        {1.0f + 1e-7f, 1.0f, true},     /* FP32 softmax can round these to one probability */
        {1.0001f, 1.0f, false},         /* a real gap */
        {100.00001f, 100.0f, true},     /* the tolerance scales with the logits */
        {100.001f, 100.0f, false},
        {-50.0f + 1e-5f, -50.0f, true}, /* and with their magnitude when negative */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const float lg[4] = {c[i].l1 + 3.0f, c[i].l1, c[i].l2, c[i].l2 - 5.0f};
        memset(&s, 0, sizeof s);
        if (td_route_follows(ids, lg, 4, 2, &s) != c[i].follows)
            fail_msg("case %zu: %.9g over %.9g: follows should be %d", i, (double)c[i].l2, (double)c[i].l1,
                     (int)c[i].follows);
        if (!c[i].follows) assert_true(s.why == TD_ROUTE_BELOW && s.sel == 2 && s.unsel == 1);
    }
    /* k = E: nothing unselected */
    const float lg3[3] = {0, 5, -5};
    const int32_t all[3] = {2, 0, 1};
    assert_true(td_route_follows(all, lg3, 3, 3, &s));
}

static void routes_errors(void **state)
{
    (void)state;
    td_route_cmp r;
    td_err err;
    const float lg[4] = {1, 2, 3, 4};
    const int32_t ids[2] = {3, 2};
    assert_int_equal(td_route_compare(NULL, NULL, NULL, NULL, 0, 4, 2, NULL, &r, &err), TD_OK);
    assert_int_equal(r.tokens, 0);
    assert_int_equal(td_route_compare(ids, lg, ids, lg, 1, 4, 5, NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "top-5"));
    assert_int_equal(td_route_compare(ids, lg, ids, lg, 1, 4, 0, NULL, &r, &err), TD_ERR_ARG);
    assert_int_equal(td_route_compare(ids, lg, ids, lg, 1, 0, 1, NULL, &r, &err), TD_ERR_ARG);
    assert_int_equal(td_route_compare(ids, lg, ids, lg, -1, 4, 2, NULL, &r, &err), TD_ERR_ARG);
    assert_int_equal(td_route_compare(ids, NULL, ids, lg, 1, 4, 2, NULL, &r, &err), TD_ERR_ARG);
    assert_non_null(strstr(err.msg, "NULL"));
}

/* Top-k of one row by repeated selection (descending logit, lowest index on ties). */
static void select_topk(const float *row, int64_t E, int64_t k, int32_t *ids)
{
    for (int64_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t i = 0; i < j && !taken; i++) taken = ids[i] == (int32_t)e;
            if (!taken && (best < 0 || row[e] > row[best])) best = (int32_t)e;
        }
        ids[j] = best;
    }
}

static bool in(const int32_t *ids, int64_t k, int32_t e)
{
    for (int64_t j = 0; j < k; j++)
        if (ids[j] == e) return true;
    return false;
}

static void routes_random(void **state)
{
    (void)state;
    const struct {
        int64_t M, E, k;
        double scale, noise;
    } cases[] = {{200, 64, 8, 1.0, 1e-3}, {200, 64, 8, 10.0, 1e-2}, {100, 512, 10, 0.3, 1e-4}, {100, 512, 10, 3.0, 0.3}};
    td_rng rng;
    td_rng_seed(&rng, 20261202);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t M = cases[c].M, E = cases[c].E, k = cases[c].k;
        float *la = malloc((size_t)(M * E) * sizeof *la), *lb = malloc((size_t)(M * E) * sizeof *lb);
        int32_t *ia = malloc((size_t)(M * k) * sizeof *ia), *ib = malloc((size_t)(M * k) * sizeof *ib);
        uint8_t *mask = malloc((size_t)cases[c].M);
        assert_true(la && lb && ia && ib && mask);
        for (int64_t i = 0; i < M * E; i++) {
            la[i] = (float)(cases[c].scale * (double)td_rng_normal_f32(&rng));
            lb[i] = (float)((double)la[i] + cases[c].noise * (double)td_rng_normal_f32(&rng));
        }
        for (int64_t t = 0; t < M; t++) {
            select_topk(la + t * E, E, k, ia + t * k);
            select_topk(lb + t * E, E, k, ib + t * k);
        }
        for (int64_t t = 0; t < M; t++) mask[t] = 0xAA; /* poison */
        td_route_cmp r;
        td_err err;
        assert_int_equal(td_route_compare(ia, la, ib, lb, M, E, k, mask, &r, &err), TD_OK);
        assert_int_equal(r.side[0].unfollowed, 0);
        assert_int_equal(r.side[1].unfollowed, 0);
        int64_t flipped = 0, reordered = 0;
        for (int64_t t = 0; t < M; t++) {
            const int32_t *a = ia + t * k, *b = ib + t * k;
            bool same_set = true, same_order = true;
            for (int64_t j = 0; j < k; j++) {
                same_set = same_set && in(b, k, a[j]);
                same_order = same_order && a[j] == b[j];
            }
            flipped += !same_set;
            reordered += same_set && !same_order;
            const uint8_t want = (uint8_t)((!same_set ? TD_ROUTE_FLIP : 0) | (!same_order ? TD_ROUTE_ORDER : 0));
            assert_int_equal(mask[t], want);
            for (int64_t i = 0; i < k && !same_set; i++)
                for (int64_t j = 0; j < k; j++) {
                    if (in(b, k, a[i]) || in(a, k, b[j])) continue;
                    const float *pa = la + t * E, *pb = lb + t * E;
                    const double gap = (double)pa[a[i]] - (double)pa[b[j]];
                    const double explained =
                        fabs((double)pa[a[i]] - (double)pb[a[i]]) + fabs((double)pa[b[j]] - (double)pb[b[j]]);
                    assert_true(gap >= 0.0 && gap <= explained + 1e-12);
                    assert_true(gap <= r.max_gap);
                }
        }
        assert_int_equal(r.flipped, flipped);
        assert_int_equal(r.reordered, reordered);
        /* the noise of each case is large enough to flip something, and the first case's not all */
        assert_true(flipped > 0 || reordered > 0);
        assert_true(flipped < M);
        free(la);
        free(lb);
        free(ia);
        free(ib);
        free(mask);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(routes_identical),
        cmocka_unit_test(routes_flip_and_reorder),
        cmocka_unit_test(routes_unfollowed_named),
        cmocka_unit_test(routes_tolerance),
        cmocka_unit_test(routes_errors),
        cmocka_unit_test(routes_random),
    };
    return cmocka_run_group_tests_name("routes", tests, NULL, NULL);
}
