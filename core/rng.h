/* rng.h — portable seeded random numbers: the same seed gives the same bits everywhere.
 *
 * Contract
 * - Generator: xoshiro256** 1.0 (Blackman and Vigna, "Scrambled linear pseudorandom number
 *   generators", 2018/2021) over a 256-bit state. td_rng_seed() fills the state with four
 *   consecutive outputs of splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
 *   number generators", 2014) started at `seed`; splitmix64 is a bijection per output, so
 *   the state is never all zero. Both are exact 64-bit integer algorithms, so every integer
 *   output is identical on every platform and compiler.
 * - Floating-point outputs are identical on every IEEE-754 binary64 platform that evaluates
 *   double expressions in double (FLT_EVAL_METHOD == 0, checked at compile time) without
 *   fused multiply-add contraction (the build uses -ffp-contract=off). They use only
 *   +, -, *, / and sqrt, which IEEE-754 rounds correctly, plus frexp, which is exact; no
 *   libm function whose rounding differs between C libraries (log, exp, sin, cos) is used.
 * - The sequences are a stable format: tensors and synthetic checkpoints are generated from
 *   them, so any change to an output below is a breaking change (tests pin golden values).
 * - td_rng is a plain value the caller owns; copying it forks an identical stream. Nothing
 *   here allocates or fails. Not thread-safe per generator (each thread uses its own,
 *   e.g. one from td_rng_split() per thread or per tensor); no global state.
 * - Programmer errors: NULL pointers; td_rng_below(rng, 0) (caught by TD_ASSERT).
 */
#ifndef TD_RNG_H
#define TD_RNG_H

#include "td.h"

typedef struct td_rng {
    uint64_t s[4]; /* xoshiro256** state; never all zero when set by seed or split */
} td_rng;

/* Seed from a 64-bit value (every value, 0 included, is a valid seed). */
void td_rng_seed(td_rng *rng, uint64_t seed);

/* Next 64 random bits (the xoshiro256** output). */
uint64_t td_rng_u64(td_rng *rng);

/* Next 32 random bits: the upper half of one td_rng_u64() output. */
uint32_t td_rng_u32(td_rng *rng);

/* Uniform integer in [0, n), n >= 1, without modulo bias: 64-bit outputs below
 * 2^64 mod n are rejected and the next one is drawn; the rest are reduced mod n. */
uint64_t td_rng_below(td_rng *rng, uint64_t n);

/* Uniform double in [0, 1): the top 53 bits of one td_rng_u64() output times 2^-53, so
 * every value is a multiple of 2^-53 and 1.0 is never returned. */
double td_rng_uniform(td_rng *rng);

/* Standard normal N(0, 1) variate by the Marsaglia polar method: u, v = 2*uniform - 1
 * (two outputs per attempt), s = u*u + v*v, retry unless 0 < s < 1, then
 * return u * sqrt(-2 * td_rng_log(s) / s). The second variate (v * same factor) is
 * discarded, so a draw consumes a whole number of attempts and no state is hidden. */
double td_rng_normal(td_rng *rng);

/* td_rng_normal() rounded to float (round to nearest even). */
float td_rng_normal_f32(td_rng *rng);

/* Derive an independent generator for `stream` (a tensor index, a layer, a thread) from
 * rng without advancing it: the parent state and the stream number are hashed with the
 * splitmix64 finalizer into a seed for td_rng_seed(). The same parent and stream always
 * give the same child; different streams give unrelated sequences. out may equal rng. */
void td_rng_split(const td_rng *rng, uint64_t stream, td_rng *out);

/* Natural logarithm built from frexp, +, -, *, / only (bitwise identical on all IEEE-754
 * platforms; error within about 1 ulp). log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf,
 * log(NaN) = NaN, log(1) = +0. Used by td_rng_normal(); public so tests can check it and
 * other deterministic code can use it. */
double td_rng_log(double x);

#endif /* TD_RNG_H */
