/* bits_fixture.h — helpers of the numeric-format tests (tests/test_formats.c, test_nvfp4.c,
 * test_e4m3_audit.c): float <-> bit pattern, and a splitmix64 stream of their own (independent
 * of the library's RNG, so a bug there cannot hide one in the code under test). */
#ifndef TD_TEST_BITS_FIXTURE_H
#define TD_TEST_BITS_FIXTURE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* splitmix64: a small seeded generator of the tests' own. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

#endif /* TD_TEST_BITS_FIXTURE_H */
