/* test_ref_topk.c — top-k with torch's CPU tie behaviour (ref/topk.h).
 *
 * What is asserted:
 * - distinct scores (seeded random, n from 1 to 1000, k from 1 to n, both the selection path
 *   64 k > n and the heap path 64 k <= n): the selected set equals the k largest found by a
 *   naive double sort written here, reported in ascending index order; the slot after the k
 *   outputs stays untouched;
 * - NaN ranks above every number (torch sorts NaN as the largest);
 * - ties: cases worked out by hand from the steps of the algorithms topk.h names (the pivot
 *   moves, partitions and heap sifts are written out in the comments), where "ties to the
 *   lower index" would select differently.
 */
#include "test_common.h"
#include "rng.h"
#include "ref/topk.h"

#include <math.h>

static void naive_topk(const float *s, int64_t n, int64_t k, int32_t *out)
{
    char *used = calloc((size_t)n, 1);
    assert_non_null(used);
    for (int64_t i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t j = 0; j < n; j++)
            if (!used[j] && (best < 0 || (double)s[j] > (double)s[best])) best = j;
        assert_true(best >= 0);
        used[best] = 1;
    }
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (used[j]) out[m++] = (int32_t)j;
    assert_int_equal(m, k);
    free(used);
}

static void distinct(void **state)
{
    (void)state;
    static const int64_t ns[] = {1, 2, 3, 4, 5, 7, 16, 63, 64, 65, 128, 200, 1000};
    td_rng r;
    td_rng_seed(&r, 7);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int64_t n = ns[a];
        const int64_t ks[] = {1, 2, 3, n / 64, n / 2, n - 1, n};
        float *s = malloc((size_t)n * sizeof *s);
        ref_topk_pair *w = malloc((size_t)n * sizeof *w);
        int32_t *got = malloc((size_t)(n + 1) * sizeof *got), *want = malloc((size_t)n * sizeof *want);
        assert_true(s && w && got && want);
        for (int64_t j = 0; j < n; j++) s[j] = (float)j * 0.25f - 3.0f; /* distinct */
        for (int64_t j = n - 1; j > 0; j--) { /* shuffle */
            const int64_t i = (int64_t)td_rng_below(&r, (uint64_t)j + 1);
            const float t = s[i];
            s[i] = s[j];
            s[j] = t;
        }
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            const int64_t k = ks[b];
            if (k < 1 || k > n) continue;
            for (int64_t j = 0; j <= n; j++) got[j] = -77;
            ref_topk_torch(s, n, k, w, got);
            naive_topk(s, n, k, want);
            assert_memory_equal(got, want, (size_t)k * sizeof *got);
            assert_int_equal(got[k], -77);
        }
        free(s);
        free(w);
        free(got);
        free(want);
    }
}

static void nan_first(void **state)
{
    (void)state;
    /* selection path (64 > 4): pivot = median of (NaN, 2, 0) = 2, partition -> [NaN | 2 ...],
     * insertion sort of the first two puts NaN first */
    const float s[4] = {1.0f, NAN, 2.0f, 0.0f};
    ref_topk_pair w[4];
    int32_t o[2];
    ref_topk_torch(s, 4, 1, w, o);
    assert_int_equal(o[0], 1);
    ref_topk_torch(s, 4, 2, w, o);
    assert_int_equal(o[0], 1);
    assert_int_equal(o[1], 2);
}

static void ties_select(void **state)
{
    (void)state;
    ref_topk_pair w[8];
    int32_t o[3];
    /* [0, 2.5, 0, 0], k = 2: median of (2.5, 0@2, 0@3) is 0@3 -> front; partition of
     * [2.5, 0@2, 0@0] stops at cut 3 > 1, so the range shrinks to [0@3, 2.5, 0@2]; insertion
     * sort gives [2.5, 0@3, 0@2]: blocks 1 and 3 (not 0). */
    const float a[4] = {0.0f, 2.5f, 0.0f, 0.0f};
    ref_topk_torch(a, 4, 2, w, o);
    assert_int_equal(o[0], 1);
    assert_int_equal(o[1], 3);
    /* 8 equal scores, k = 3: pivot 4 swapped to the front, the partition swaps (1,7), (2,6),
     * (3,5) and cuts at 4; on [4, 7, 6, 5] pivot 6 is moved to the front, the partition swaps
     * (7, 5) and cuts at 2 = k - 1; the first three are 6, 5, 4. */
    const float z[8] = {0};
    ref_topk_torch(z, 8, 3, w, o);
    assert_int_equal(o[0], 4);
    assert_int_equal(o[1], 5);
    assert_int_equal(o[2], 6);
}

static void ties_heap(void **state)
{
    (void)state;
    /* n = 192, k = 3 (heap path): heap of ids [2, 1, 0] over equal zeros; 150 (score 1)
     * replaces the top: [0, 1, 150]; 160 replaces the top 0: the hole sifts to child 1, giving
     * [1, 160, 150]. Selected {1, 150, 160} (not {0, 150, 160}). */
    float s[192] = {0};
    s[150] = s[160] = 1.0f;
    ref_topk_pair w[192];
    int32_t o[3];
    ref_topk_torch(s, 192, 3, w, o);
    assert_int_equal(o[0], 1);
    assert_int_equal(o[1], 150);
    assert_int_equal(o[2], 160);
    /* all equal: nothing replaces the heap top, the first k are kept */
    for (int i = 0; i < 192; i++) s[i] = -1.0f;
    ref_topk_torch(s, 192, 3, w, o);
    assert_int_equal(o[0], 0);
    assert_int_equal(o[1], 1);
    assert_int_equal(o[2], 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(distinct),
        cmocka_unit_test(nan_first),
        cmocka_unit_test(ties_select),
        cmocka_unit_test(ties_heap),
    };
    return cmocka_run_group_tests_name("ref_topk", tests, NULL, NULL);
}
