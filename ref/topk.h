/* topk.h — the k largest of n float scores, ties broken as torch.topk on the CPU breaks them.
 *
 * torch.topk(largest=True) on a CPU float32 vector fills pairs (value, index) in index order
 * and selects with the C++ standard library of its build (libstdc++): std::nth_element(first,
 * first + k - 1, last) when 64 k > n, else std::partial_sort(first, first + k, last), both with
 * the order "a before b iff (a is NaN and b is not) or a > b" (NaN ranks above every number).
 * Neither algorithm is stable, so which of several equal scores are kept depends on the
 * algorithm's exact steps; ref_topk_torch replays them:
 *   nth_element = introselect with depth limit 2 floor(log2 n): while the range holds more than
 *     3 pairs, move the median of (second, middle, last) to the front as pivot, Hoare-partition
 *     the rest around it (unguarded), keep the side holding position k - 1; at depth 0 fall back
 *     to heap selection; finish with an insertion sort of the remaining range.
 *   partial_sort = heap selection: a binary heap over the first k (its top the worst kept), every
 *     later pair better than the top replaces it (pop into the later slot, sift down, push up).
 * QSA block selection (qsa.h) uses this so that tied block scores (ReLU makes exact zeros
 * common) select the same blocks as the public implementation run on the CPU.
 *
 * Contract: 1 <= k <= n; work has n pairs (caller owned, overwritten); out receives the k selected
 * indices in ascending order. Pure, deterministic.
 */
#ifndef TD_REF_TOPK_H
#define TD_REF_TOPK_H

#include <stdint.h>

typedef struct ref_topk_pair {
    float v;
    int32_t id;
} ref_topk_pair;

void ref_topk_torch(const float *score, int64_t n, int64_t k, ref_topk_pair *work, int32_t *out);

#endif /* TD_REF_TOPK_H */
