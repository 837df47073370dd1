/* metrics.h — how two tensors compare: the metrics of every audit and their verdicts.
 *
 * Definitions (a = candidate side, b = reference side, n elements, docs/audit-layer.md):
 * - An element pair is *equal* when its bit patterns are identical and neither is NaN (for
 *   I32: the integers are equal). So +0 vs -0 differs, the same infinity on both sides is
 *   equal, and a NaN on either side is never equal, never "close".
 * - exact        every pair equal (n == 0 counts as exact).
 * - mismatches   pairs that are not equal.
 * - first_diff   index of the first pair that is not equal, -1 when none.
 * - finite       every element of both sides is finite (finite_a, finite_b per side).
 * - d_i          0 for an equal pair; |a_i - b_i| (in double) when both are finite; +inf
 *                otherwise (a NaN or infinity involved and the pair not equal).
 * - max_abs      max d_i (0 for n == 0).
 * - rel_l2       sqrt(sum d_i^2) / max(||b||_2, 1e-12), ||b|| over the finite b_i; +inf as
 *                soon as some d_i is +inf.
 * - nmse         sum d_i^2 / max(sum b_i^2, 1e-24) (the square of rel_l2 up to the floors).
 * - cosine       a.b / (||a|| ||b||) in double when both sides are finite; 1 when both are
 *                all zero, 0 when exactly one is; NaN when a side is not finite.
 * - max_ulp      largest distance in units in the last place of `dtype` (F32, F16 or BF16:
 *                the values are rounded to dtype first, with RNE, then their ordered bit
 *                patterns are subtracted, so +0 and -0 are 0 apart and an infinity is one
 *                step beyond the largest finite value); for I32 the largest |a_i - b_i|.
 *                -1 when a NaN is involved in a pair that is not equal (unknown).
 * Verdicts:
 * - exact expectation:   pass iff exact and finite.
 * - bounded expectation: pass iff finite and rel_l2 <= bound (an exact result passes too).
 *   Bounds by dtype (td_metrics_bound): FP32 1e-5, FP16 2e-3, BF16 1e-2 relative
 *   (SEED_AUDITS.md §7, Type B).
 *
 * Contract: pure functions, no allocation, thread-safe. Buffers are borrowed; n >= 0.
 */
#ifndef TD_AUDIT_METRICS_H
#define TD_AUDIT_METRICS_H

#include "td.h"
#include "tensor.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct td_metrics {
    td_dtype dtype;         /* dtype the comparison is judged in (TD_F32, TD_F16, TD_BF16, TD_I32) */
    int64_t numel;
    bool exact;
    int64_t mismatches;
    int64_t first_diff;     /* -1 when none */
    bool finite;            /* finite_a && finite_b */
    bool finite_a, finite_b;
    int64_t nan_a, nan_b;   /* NaN counts per side */
    int64_t inf_a, inf_b;   /* infinity counts per side */
    double max_abs;
    double rel_l2;
    double nmse;
    double cosine;
    int64_t max_ulp;        /* -1 unknown */
    double first_a, first_b;/* values at first_diff (NaN when none) */
} td_metrics;

typedef enum td_expect { TD_EXPECT_EXACT = 0, TD_EXPECT_BOUNDED, TD_EXPECT_COUNT } td_expect;

/* Compare float32 tensors a and b of n elements, judged in dtype (TD_F32, TD_F16 or TD_BF16;
 * anything else is a programmer error). */
void td_metrics_f32(const float *a, const float *b, int64_t n, td_dtype dtype, td_metrics *m);
/* Compare int32 tensors (ids). */
void td_metrics_i32(const int32_t *a, const int32_t *b, int64_t n, td_metrics *m);

/* The relative bound of a dtype: F32 1e-5, F16 2e-3, BF16 1e-2 (others: 1e-5). */
double td_metrics_bound(td_dtype dtype);

/* Does m meet the expectation (bound used for TD_EXPECT_BOUNDED)? */
bool td_metrics_pass(const td_metrics *m, td_expect e, double bound);

/* "exact", "bounded"; NULL for an invalid value. */
const char *td_expect_name(td_expect e);

/* Distance in ULPs of dtype between two float32 values (both rounded to dtype first); -1
 * when either is NaN. */
int64_t td_ulp_distance(float a, float b, td_dtype dtype);

#endif /* TD_AUDIT_METRICS_H */
