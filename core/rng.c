/* rng.c — splitmix64-seeded xoshiro256** and deterministic derived variates (see rng.h). */
#include "rng.h"

#include <float.h>
#include <math.h>

/* Bitwise reproducibility of the double outputs needs every double operation rounded once to
 * binary64. x87 excess precision (FLT_EVAL_METHOD 2) would round differently. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "rng.c needs FLT_EVAL_METHOD == 0 (SSE2 or equivalent double arithmetic)"
#endif

/* GCC does not contract in ISO C modes and the build passes -ffp-contract=off; clang also
 * honours the standard pragma, which keeps a*b+c two roundings whatever the flags. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- splitmix64 ---------------------------------------------------------------------- */

#define SPLITMIX64_GAMMA UINT64_C(0x9e3779b97f4a7c15) /* 2^64 / golden ratio, odd */

/* The splitmix64 output function (a bijection on 64-bit words; mix64(0) == 0). */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Advance a splitmix64 state and return its next output. */
static inline uint64_t splitmix64_next(uint64_t *x)
{
    *x += SPLITMIX64_GAMMA;
    return mix64(*x);
}

/* ---- xoshiro256** -------------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, unsigned k) { return (x << k) | (x >> (64u - k)); }

void td_rng_seed(td_rng *rng, uint64_t seed)
{
    TD_ASSERT(rng != NULL);
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64_next(&x);
}

uint64_t td_rng_u64(td_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t out = rotl64(s[1] * 5u, 7) * 9u; /* the ** scrambler */
    uint64_t t = s[1] << 17;                  /* the linear engine (xoshiro256) */
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

uint32_t td_rng_u32(td_rng *rng)
{
    return (uint32_t)(td_rng_u64(rng) >> 32);
}

uint64_t td_rng_below(td_rng *rng, uint64_t n)
{
    TD_ASSERT(n >= 1);
    /* 2^64 mod n, computed in 64 bits as (2^64 - n) mod n. Outputs in [reject, 2^64) number
     * a multiple of n, so reducing them mod n is exactly uniform. */
    uint64_t reject = (0u - n) % n;
    for (;;) {
        uint64_t x = td_rng_u64(rng);
        if (x >= reject) return x % n;
    }
}

double td_rng_uniform(td_rng *rng)
{
    return (double)(td_rng_u64(rng) >> 11) * 0x1.0p-53;
}

void td_rng_split(const td_rng *rng, uint64_t stream, td_rng *out)
{
    TD_ASSERT(rng != NULL && out != NULL);
    /* Each step is a bijection of h for a fixed parent word, so distinct streams of one parent
     * always give distinct seeds; the gamma keeps an all-zero input from staying zero. */
    uint64_t h = mix64(stream + SPLITMIX64_GAMMA);
    for (int i = 0; i < 4; i++) h = mix64((h ^ rng->s[i]) + SPLITMIX64_GAMMA);
    td_rng_seed(out, h);
}

/* ---- deterministic logarithm --------------------------------------------------------- */

/* ln 2 split so that e * LN2_HI is exact for |e| < 2^20 (LN2_HI has 33 significant bits) and
 * LN2_HI + LN2_LO equals ln 2 to about 2^-86 relative. */
static const double LN2_HI = 0x1.62e42fee00000p-1;
static const double LN2_LO = 0x1.a39ef35793c76p-33;
static const double SQRT_HALF = 0x1.6a09e667f3bcdp-1;

double td_rng_log(double x)
{
    if (isnan(x)) return x;
    if (x < 0.0) return (double)NAN;
    if (x == 0.0) return -HUGE_VAL;
    if (isinf(x)) return x;

    /* x = m * 2^e with m in [sqrt(1/2), sqrt(2)); frexp is exact (subnormals included). */
    int e;
    double m = frexp(x, &e); /* m in [1/2, 1) */
    if (m < SQRT_HALF) {
        m *= 2.0; /* exact */
        e -= 1;
    }
    /* log(m) = log(1 + f), f = m - 1 exact (Sterbenz). With s = f / (2 + f):
     *   log(1 + f) = 2 atanh(s) = 2s + s*R,  R = sum_{j>=1} 2 s^(2j) / (2j + 1),
     * and 2s = f - f*s = f - (hf2 - s*hf2) with hf2 = f*f/2, so
     *   log(1 + f) = f - (hf2 - s*(hf2 + R)).
     * The leading f is exact; everything subtracted from it is at most ~f^2/2, so its
     * rounding errors enter scaled down. |s| <= 0.1716, s^2 <= 0.02944: eleven terms of R
     * leave a truncation error below 2^-60 relative. */
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    static const double c[11] = {
        2.0 / 3.0,  2.0 / 5.0,  2.0 / 7.0,  2.0 / 9.0,  2.0 / 11.0, 2.0 / 13.0,
        2.0 / 15.0, 2.0 / 17.0, 2.0 / 19.0, 2.0 / 21.0, 2.0 / 23.0,
    };
    double r = c[10];
    for (int j = 9; j >= 0; j--) r = r * z + c[j];
    double big_r = z * r;
    double hf2 = 0.5 * f * f;
    double de = (double)e;
    return de * LN2_HI + (f - (hf2 - (s * (hf2 + big_r) + de * LN2_LO)));
}

/* ---- normal variates ----------------------------------------------------------------- */

double td_rng_normal(td_rng *rng)
{
    for (;;) {
        /* 2*U - 1 is exact: U is a multiple of 2^-53 in [0, 1). */
        double u = 2.0 * td_rng_uniform(rng) - 1.0;
        double v = 2.0 * td_rng_uniform(rng) - 1.0;
        double s = u * u + v * v;
        if (s < 1.0 && s > 0.0) return u * sqrt(-2.0 * td_rng_log(s) / s);
    }
}

float td_rng_normal_f32(td_rng *rng)
{
    return (float)td_rng_normal(rng);
}
