/* pool.h — a fixed pool of worker threads for the reference engine.
 *
 * The reference engine parallelizes only across independent outputs (rows of a linear,
 * experts, tokens): every output element is computed start to finish by one thread in the
 * documented order, so results are bitwise identical for any thread count. This pool hands
 * out work items; which thread takes which item never changes a result.
 *
 * Contract
 * - ref_pool_new(threads) starts threads - 1 workers (the caller is worker 0); threads is
 *   1..TD_ENGINE_MAX_THREADS. With 1 thread nothing is started and ref_pool_run calls fn
 *   inline. All allocation happens in ref_pool_new.
 * - ref_pool_run(p, n, fn, ctx) calls fn(ctx, item, worker) exactly once for every item in
 *   [0, n) and returns when all calls have returned. `worker` is in [0, threads) and says
 *   which thread runs the call, so fn can use per-worker scratch space. Items are taken in
 *   increasing order from a shared counter (dynamic scheduling). fn must not fail; it records
 *   errors in ctx if it can have any.
 * - One ref_pool_run at a time per pool (not reentrant, one calling thread at a time).
 *   ref_pool_free (NULL-safe) joins the workers.
 */
#ifndef TD_REF_POOL_H
#define TD_REF_POOL_H

#include "td.h"

typedef struct ref_pool ref_pool;

typedef void (*ref_pool_fn)(void *ctx, int64_t item, int worker);

td_status ref_pool_new(int threads, ref_pool **out, td_err *err);
void ref_pool_free(ref_pool *p);
int ref_pool_threads(const ref_pool *p);
void ref_pool_run(ref_pool *p, int64_t n_items, ref_pool_fn fn, void *ctx);

#endif /* TD_REF_POOL_H */
