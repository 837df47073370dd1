/* topk.c — top-k selection with torch's CPU tie behaviour (algorithm in topk.h). */
#include "topk.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

typedef ref_topk_pair pair;

/* a ranks before b */
static bool before(pair a, pair b)
{
    const bool na = isnan(a.v), nb = isnan(b.v);
    return (na && !nb) || a.v > b.v;
}

static void swap(pair *a, pair *b)
{
    const pair t = *a;
    *a = *b;
    *b = t;
}

/* The hole at `hole` of heap h[0..len) is filled: move the better child up until a leaf, then
 * push `val` up from there, not above `top`. */
static void adjust_heap(pair *h, int64_t hole, int64_t len, pair val)
{
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(h[child], h[child - 1])) child--;
        h[hole] = h[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        h[hole] = h[child - 1];
        hole = child - 1;
    }
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(h[parent], val)) {
        h[hole] = h[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    h[hole] = val;
}

static void make_heap(pair *h, int64_t len)
{
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(h, parent, len, h[parent]);
        if (parent == 0) return;
    }
}

/* The `mid` best of p[0..n) into p[0..mid) (a heap, its top the worst of them). */
static void heap_select(pair *p, int64_t mid, int64_t n)
{
    make_heap(p, mid);
    for (int64_t i = mid; i < n; i++)
        if (before(p[i], p[0])) {
            const pair val = p[i];
            p[i] = p[0];
            adjust_heap(p, 0, mid, val);
        }
}

static void insertion_sort(pair *p, int64_t n)
{
    for (int64_t i = 1; i < n; i++) {
        const pair val = p[i];
        if (before(val, p[0])) {
            for (int64_t j = i; j > 0; j--) p[j] = p[j - 1];
            p[0] = val;
        } else {
            int64_t j = i;
            while (before(val, p[j - 1])) {
                p[j] = p[j - 1];
                j--;
            }
            p[j] = val;
        }
    }
}

/* Median of p[a], p[b], p[c] swapped into p[r]. */
static void median_to_first(pair *p, int64_t r, int64_t a, int64_t b, int64_t c)
{
    int64_t m;
    if (before(p[a], p[b])) {
        if (before(p[b], p[c])) m = b;
        else if (before(p[a], p[c])) m = c;
        else m = a;
    } else if (before(p[a], p[c])) {
        m = a;
    } else if (before(p[b], p[c])) {
        m = c;
    } else {
        m = b;
    }
    swap(&p[r], &p[m]);
}

/* Partition p[lo..hi) around the pivot p[piv] (outside the range); returns the cut. */
static int64_t partition(pair *p, int64_t lo, int64_t hi, int64_t piv)
{
    for (;;) {
        while (before(p[lo], p[piv])) lo++;
        hi--;
        while (before(p[piv], p[hi])) hi--;
        if (!(lo < hi)) return lo;
        swap(&p[lo], &p[hi]);
        lo++;
    }
}

static int64_t floor_log2(int64_t n)
{
    int64_t r = 0;
    while (n > 1) {
        n >>= 1;
        r++;
    }
    return r;
}

static void nth_element(pair *p, int64_t nth, int64_t n)
{
    if (n == 0 || nth == n) return;
    int64_t first = 0, last = n, depth = 2 * floor_log2(n);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(p + first, nth - first + 1, last - first);
            swap(&p[first], &p[nth]);
            return;
        }
        depth--;
        median_to_first(p, first, first + 1, first + (last - first) / 2, last - 1);
        const int64_t cut = partition(p, first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(p + first, last - first);
}

static int id_cmp(const void *pa, const void *pb)
{
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

void ref_topk_torch(const float *score, int64_t n, int64_t k, ref_topk_pair *work, int32_t *out)
{
    for (int64_t j = 0; j < n; j++) work[j] = (pair){score[j], (int32_t)j};
    if (k * 64 <= n) heap_select(work, k, n);
    else nth_element(work, k - 1, n);
    for (int64_t i = 0; i < k; i++) out[i] = work[i].id;
    qsort(out, (size_t)k, sizeof *out, id_cmp);
}
