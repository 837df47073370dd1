/* e4m3.h — Part 1 of `tandem audit e4m3`: the codec self-audit (no checkpoint needed).
 *
 * td_codec_audit() checks a td_codec (core/e4m3_recon.h; td_codec_tandem() for tandem's own
 * conversions) against oracles written independently of core/formats.c: sign/exponent/
 * mantissa arithmetic in double (ldexp), nearest-value searches over sorted value tables with
 * ties to the even code, and FP16/BF16 bit patterns built from frexp. docs/audit-e4m3.md lists
 * every check; in short:
 *   e4m3.decode            all 256 codes against the format's formula (±0, subnormals m·2^-9,
 *                          448, NaN exactly at 0x7F/0xFF); e4m3.constants: NVFP4_SPEC.md §1.2
 *   e4m3.constants         the constants table of NVFP4_SPEC.md §1.2
 *   e4m3.encode.<mode>     every decision point (each code's value, each midpoint between
 *                          neighbouring codes, one float32 ULP either side of both, the
 *                          subnormal boundary, 448/464/480/inf/NaN, ±0) for torch, satfinite
 *                          and nosat semantics
 *   e4m3.sweep.<mode>      seeded random float32 patterns against the same oracle
 *   e4m3.roundtrip         encode(decode(c)) == c for every finite code, in every mode
 *   e2m1.decode / e2m1.encode.<rule> / e2m1.sweep / e2m1.nan
 *                          the same for FP4 E2M1 (both sign rules; NaN rejected by the checked
 *                          encoder, 0x7 from the non-failing one)
 *   e4m3.to_f16 / e4m3.to_bf16
 *                          every E4M3 value through FP16/BF16 and back, bit for bit
 *   prepared.all_codes     FP16(FP32(e4m3) × FP32 g) for every code × a global set covering
 *                          zero, negative, FP16-underflow and FP16-overflow globals (the seed's
 *                          {0, 2^-24, 2^-10, 2^-4, 1, 2, -1, 256} and more), bitwise, NaN as NaN
 *   strict.<stage>         the seed's all-codes strict expansion over W13 (non-interleaved,
 *                          interleaved) and W2 shapes with tiled codes and per-slot globals
 *   admission.unsupported  codes {0, 1, 7, 0x80, 0x81, 0xFF} at g = 2^-10 are rejected with
 *                          the right reason; admission.effective: code 64 at g = 2^-10 is
 *                          admitted with effective scale 32 (the seed's two admission tests);
 *                          admission.classes: one vector per remaining reason class
 *   fast.pow2_globals      the fast path reproduces the effective scale for every positive
 *                          normal code and every power-of-two global 2^-8..2^1 (lo == 0)
 *   fp16.fma               pinned vectors of the FP16 fused multiply-add emulation
 *
 * Every check but fp16.fma goes through the codec, so a codec with a planted bug makes the
 * checks covering it fail (tests/test_e4m3_audit.c plants one bug per check family).
 *
 * Contract
 * - Every check records elements tested, mismatches (bit-pattern differences, NaN positions
 *   compared by NaN-ness), NaN mismatches (exactly one side NaN) and a description of the
 *   first mismatch. A check passes when it has no mismatch. The report is a plain value.
 * - Deterministic for a seed; no allocation beyond a few small stack tables; no global state;
 *   thread-safe for distinct reports. Runs in well under a second.
 */
#ifndef TD_E4M3_H
#define TD_E4M3_H

#include "e4m3_recon.h"

#define TD_CODEC_MAX_CHECKS 40
#define TD_CODEC_DETAIL_MAX 200

typedef struct td_codec_check {
    char name[48];
    int64_t elements;
    int64_t mismatches;       /* includes NaN mismatches */
    int64_t nan_mismatches;   /* exactly one side NaN */
    int64_t first_index;      /* index of the first mismatch in the check's order, -1 none */
    char first[TD_CODEC_DETAIL_MAX]; /* "input 0x3f800000 (1): got 0x39, want 0x38" */
    bool passed;
} td_codec_check;

typedef struct td_codec_report {
    char codec[32];
    td_codec_check checks[TD_CODEC_MAX_CHECKS];
    size_t n;
    int64_t failed;           /* checks that did not pass */
    uint64_t seed;
    double seconds;
} td_codec_report;

/* Run every Part 1 check on codec `c` (random sweeps seeded by `seed`) and fill rep. A failing
 * check is a result (rep->failed), not an error; nothing here can fail otherwise. */
void td_codec_audit(const td_codec *c, uint64_t seed, td_codec_report *rep);

/* The check named `name` in rep, or NULL. */
const td_codec_check *td_codec_report_find(const td_codec_report *rep, const char *name);

/* The random-sweep size per mode (float32 patterns). */
#define TD_CODEC_SWEEP 1048576

#endif /* TD_E4M3_H */
