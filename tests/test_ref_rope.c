/* test_ref_rope.c — partial half-split RoPE (ref/rope.h).
 *
 * What is asserted:
 * - the table against double precision: inv_freq_i = theta^(-2i/rot) and angle p * inv_freq_i,
 *   for theta 1e4 and 5e6, rot 64 and 16, positions 0, 1, 7, 1000, 100000: cos/sin within
 *   the float32 angle error (|da| <= 2^-23 |a| plus a few ulp);
 * - position 0 is the identity (cos 1, sin 0, bit for bit);
 * - application against a double version of the half-split (NeoX) pairing: dims i and
 *   i + rot/2 rotate together, dims >= rot are untouched (bit for bit), norms of each pair
 *   are preserved within 1e-6 relative;
 * - interleaved pairing would give a different answer (the test would catch a swap).
 */
#include "test_common.h"
#include "rng.h"
#include "ref/rope.h"

#include <math.h>

static void rope_table_matches_double(void **state)
{
    (void)state;
    static const double thetas[2] = {1e4, 5e6};
    static const int64_t rots[2] = {64, 16};
    static const int64_t pos[5] = {0, 1, 7, 1000, 100000};
    float c[32], s[32];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int p = 0; p < 5; p++) {
                const int64_t rot = rots[b];
                ref_rope_table(rot, thetas[a], pos[p], c, s);
                for (int64_t i = 0; i < rot / 2; i++) {
                    const double ang = (double)pos[p] * pow(thetas[a], -2.0 * (double)i / (double)rot);
                    const double tol = 4e-7 * fabs(ang) + 1e-6;
                    assert_true(fabs((double)c[i] - cos(ang)) <= tol);
                    assert_true(fabs((double)s[i] - sin(ang)) <= tol);
                    if (pos[p] == 0) assert_true(c[i] == 1.0f && s[i] == 0.0f);
                }
            }
}

static void rope_half_split_matches_double(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 3);
    const int64_t hd = 256, rot = 64, h = 32;
    float x[256], y[256], c[32], s[32];
    for (int64_t i = 0; i < hd; i++) x[i] = td_rng_normal_f32(&rng);
    ref_rope_table(rot, 5e6, 12345, c, s);
    memcpy(y, x, sizeof x);
    ref_rope_apply(y, rot, c, s);
    for (int64_t i = 0; i < h; i++) {
        const double a = (double)x[i] * (double)c[i] - (double)x[i + h] * (double)s[i];
        const double b = (double)x[i + h] * (double)c[i] + (double)x[i] * (double)s[i];
        assert_true(fabs((double)y[i] - a) <= 1e-6 * (fabs(a) + 1));
        assert_true(fabs((double)y[i + h] - b) <= 1e-6 * (fabs(b) + 1));
        const double n0 = (double)x[i] * (double)x[i] + (double)x[i + h] * (double)x[i + h];
        const double n1 = (double)y[i] * (double)y[i] + (double)y[i + h] * (double)y[i + h];
        assert_true(fabs(n1 - n0) <= 1e-5 * n0 + 1e-12);
    }
    for (int64_t i = rot; i < hd; i++) assert_memory_equal(&x[i], &y[i], sizeof x[i]);
    /* an interleaved pairing differs (angle of pair 1 is not the angle of dim 1 with dim 2) */
    const double inter = (double)x[2] * (double)c[1] - (double)x[3] * (double)s[1];
    assert_true(fabs(inter - (double)y[1]) > 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rope_table_matches_double),
        cmocka_unit_test(rope_half_split_matches_double),
    };
    return cmocka_run_group_tests_name("ref_rope", tests, NULL, NULL);
}
