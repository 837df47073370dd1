/* routes.c — route agreement and top-k consistency (see routes.h for the definitions). */
#include "routes.h"

#include <math.h>
#include <string.h>

static bool has_id(const int32_t *ids, int64_t k, int32_t id)
{
    for (int64_t j = 0; j < k; j++)
        if (ids[j] == id) return true;
    return false;
}

bool td_route_follows(const int32_t *ids, const float *logits, int64_t E, int64_t k, td_route_side *why)
{
    for (int64_t j = 0; j < k; j++) {
        if (ids[j] < 0 || ids[j] >= E) {
            why->why = TD_ROUTE_BAD_ID;
            why->sel = ids[j];
            why->unsel = -1;
            why->sel_logit = why->unsel_logit = NAN;
            return false;
        }
        if (has_id(ids, j, ids[j])) {
            why->why = TD_ROUTE_DUP_ID;
            why->sel = ids[j];
            why->unsel = -1;
            why->sel_logit = why->unsel_logit = NAN;
            return false;
        }
    }
    float lmax = -INFINITY;
    for (int64_t e = 0; e < E; e++) {
        if (!isfinite(logits[e])) {
            why->why = TD_ROUTE_NONFINITE;
            why->sel = (int32_t)e;
            why->unsel = -1;
            why->sel_logit = logits[e];
            why->unsel_logit = NAN;
            return false;
        }
        if (logits[e] > lmax) lmax = logits[e];
    }
    /* the lowest selected logit against every unselected one: the largest excess beyond tol */
    int32_t s = ids[0];
    for (int64_t j = 1; j < k; j++)
        if (logits[ids[j]] < logits[s]) s = ids[j];
    const double ls = logits[s], am = fabs((double)lmax);
    double worst = 0.0;
    int32_t u_worst = -1;
    for (int64_t e = 0; e < E; e++) {
        const double lu = logits[e];
        if (lu <= ls || has_id(ids, k, (int32_t)e)) continue;
        const double tol = 0x1p-20 * (1.0 + fabs(ls) + fabs(lu) + 2.0 * am);
        const double excess = lu - ls - tol;
        if (excess > worst) {
            worst = excess;
            u_worst = (int32_t)e;
        }
    }
    if (u_worst < 0) return true;
    why->why = TD_ROUTE_BELOW;
    why->sel = s;
    why->unsel = u_worst;
    why->sel_logit = logits[s];
    why->unsel_logit = logits[u_worst];
    return false;
}

td_status td_route_compare(const int32_t *ids_a, const float *logits_a, const int32_t *ids_b, const float *logits_b,
                           int64_t M, int64_t E, int64_t k, uint8_t *mask, td_route_cmp *out, td_err *err)
{
    if (M < 0 || E < 1 || k < 1 || k > E)
        return td_err_set(err, TD_ERR_ARG, "routes: %lld tokens, %lld experts, top-%lld (expected M >= 0, 1 <= k <= E)",
                          (long long)M, (long long)E, (long long)k);
    if (M > 0 && (!ids_a || !logits_a || !ids_b || !logits_b || !out))
        return td_err_set(err, TD_ERR_ARG, "routes: a NULL buffer");
    memset(out, 0, sizeof *out);
    out->tokens = M;
    out->first_flip = out->gap_token = -1;
    out->gap_a = out->gap_b = -1;
    for (int s = 0; s < 2; s++) {
        out->side[s].token = -1;
        out->side[s].sel = out->side[s].unsel = -1;
        out->side[s].sel_logit = out->side[s].unsel_logit = NAN;
    }
    for (int64_t t = 0; t < M; t++) {
        const int32_t *ia = ids_a + t * k, *ib = ids_b + t * k;
        const float *la = logits_a + t * E, *lb = logits_b + t * E;
        const int32_t *ids[2] = {ia, ib};
        const float *lg[2] = {la, lb};
        for (int s = 0; s < 2; s++) {
            td_route_side why = out->side[s];
            if (!td_route_follows(ids[s], lg[s], E, k, &why)) {
                if (out->side[s].unfollowed == 0) {
                    out->side[s] = why;
                    out->side[s].token = t;
                }
                out->side[s].unfollowed++;
            }
        }
        uint8_t bits = 0;
        for (int64_t j = 0; j < k; j++) {
            if (ia[j] != ib[j]) bits |= TD_ROUTE_ORDER;
            if (!has_id(ib, k, ia[j])) bits |= TD_ROUTE_FLIP;
        }
        if (mask) mask[t] = bits;
        if (bits & TD_ROUTE_FLIP) {
            if (out->first_flip < 0) out->first_flip = t;
            out->flipped++;
            /* the gap in A's logits: experts chosen by A only against those chosen by B only */
            for (int64_t i = 0; i < k; i++) {
                if (has_id(ib, k, ia[i]) || ia[i] < 0 || ia[i] >= E) continue;
                for (int64_t j = 0; j < k; j++) {
                    if (has_id(ia, k, ib[j]) || ib[j] < 0 || ib[j] >= E) continue;
                    const double gap = (double)la[ia[i]] - (double)la[ib[j]];
                    if (out->gap_token < 0 || gap > out->max_gap) {
                        out->max_gap = gap;
                        out->gap_token = t;
                        out->gap_a = ia[i];
                        out->gap_b = ib[j];
                    }
                }
            }
        } else if (bits & TD_ROUTE_ORDER) {
            out->reordered++;
        }
    }
    return TD_OK;
}
