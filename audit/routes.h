/* routes.h — how two engines' routes of one MoE call compare, and whether each engine's top-k
 * follows its own router logits (the `L{l}.moe.routes` check of `tandem audit layer`).
 *
 * Two engines that compute the router logits in different precisions may legitimately pick
 * different experts for a token whose k-th and (k+1)-th logits are nearly tied (SEED_AUDITS.md
 * §7: "low-margin flips are allowed as warnings"). Such a token's output then differs by a
 * whole expert's contribution, far beyond any rounding bound, so a block comparison over all
 * tokens says nothing about the arithmetic. This module tells the near-tie flips apart from a
 * selection bug:
 *
 * - A side's top-k *follows its logits* at token t when its k ids are valid (0 <= id < E),
 *   distinct, and no unselected expert's logit exceeds a selected one's by more than the
 *   tolerance tol(s, u) = 2^-20 * (1 + |l_s| + |l_u| + 2 |l_max|), l_max the token's largest
 *   logit (finite logits only: a NaN or infinity in the token's row is not followed). The
 *   tolerance covers the engines' FP32 softmax: logits that close can round to the same
 *   probability, and the tie-break (lowest index) then picks either. A selection bug (an
 *   off-by-one in the top-k, a wrong tie-break on real gaps) is orders of magnitude larger.
 * - Token t *flips* when the sides' expert sets differ; it is *reordered* when the sets are
 *   equal and the slot order differs (per-slot tensors then differ slot by slot while the
 *   block output only sums in another order).
 * - The gap of a flip, in side A's logits: max over i chosen by A only and j chosen by B only
 *   of l_a[i] - l_a[j] (how far A preferred its expert). When both sides follow their logits,
 *   every flip's gap is at most |Δ_i| + |Δ_j| + tol with Δ = l_a - l_b: a flip is then a
 *   near-tie that the logits' own difference explains.
 *
 * Contract: pure, no allocation, thread-safe; buffers borrowed. ids_* are [M, k] int32,
 * logits_* [M, E] float32, row-major. mask (optional, [M]) gets per token
 * TD_ROUTE_FLIP | TD_ROUTE_ORDER bits (0: the same ids in the same order).
 */
#ifndef TD_AUDIT_ROUTES_H
#define TD_AUDIT_ROUTES_H

#include "td.h"

#include <stdbool.h>
#include <stdint.h>

enum { TD_ROUTE_FLIP = 1, TD_ROUTE_ORDER = 2 };

/* Why a side's top-k does not follow its logits at its first such token. */
typedef enum td_route_fault {
    TD_ROUTE_OK = 0,
    TD_ROUTE_BAD_ID,      /* an id outside [0, E) */
    TD_ROUTE_DUP_ID,      /* an id twice */
    TD_ROUTE_NONFINITE,   /* a logit of the token is NaN or infinite */
    TD_ROUTE_BELOW        /* a selected expert's logit below an unselected one's beyond tol */
} td_route_fault;

typedef struct td_route_side {
    int64_t unfollowed;   /* tokens whose top-k does not follow the side's logits */
    int64_t token;        /* the first such token, -1 when none */
    td_route_fault why;
    int32_t sel, unsel;   /* BAD_ID / DUP_ID: the id (unsel -1); BELOW: the selected expert and
                           * the unselected one above it (the largest excess) */
    float sel_logit, unsel_logit;
} td_route_side;

typedef struct td_route_cmp {
    int64_t tokens;       /* M */
    int64_t flipped;      /* tokens whose expert sets differ */
    int64_t reordered;    /* same set, another slot order */
    int64_t first_flip;   /* -1 when none */
    double max_gap;       /* largest gap of a flip in A's logits (0 when none) */
    int64_t gap_token;    /* its token, -1 when none */
    int32_t gap_a, gap_b; /* its experts: chosen by A only, by B only */
    td_route_side side[2];/* A, B */
} td_route_cmp;

/* Compare the routes of M tokens (E experts, top-k). TD_ERR_ARG for M < 0, E < 1, k < 1,
 * k > E, or a NULL buffer with M > 0. */
td_status td_route_compare(const int32_t *ids_a, const float *logits_a, const int32_t *ids_b, const float *logits_b,
                           int64_t M, int64_t E, int64_t k, uint8_t *mask, td_route_cmp *out, td_err *err);

/* Does side s (ids [k], logits [E]) follow its logits at one token? Fills the fault fields of
 * *why (token left as is) when it does not. */
bool td_route_follows(const int32_t *ids, const float *logits, int64_t E, int64_t k, td_route_side *why);

#endif /* TD_AUDIT_ROUTES_H */
