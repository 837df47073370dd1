/* pool.c — worker threads for the reference engine (see pool.h). */
#include "pool.h"
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct worker_arg {
    ref_pool *pool;
    int index;                 /* 1..threads-1 */
} worker_arg;

struct ref_pool {
    int threads;
    pthread_t *tids;           /* [threads - 1] */
    worker_arg *args;          /* [threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t start_cv;   /* a new job (or shutdown) is posted */
    pthread_cond_t done_cv;    /* the last worker finished the job */
    uint64_t generation;       /* bumped for every job */
    int running;               /* workers still inside the current job */
    bool quit;
    /* the current job */
    ref_pool_fn fn;
    void *ctx;
    int64_t n_items;
    atomic_llong next;         /* next item to hand out */
};

static void drain(ref_pool *p, int worker)
{
    for (;;) {
        long long i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_items) break;
        p->fn(p->ctx, (int64_t)i, worker);
    }
}

static void *worker_main(void *arg)
{
    worker_arg *a = arg;
    ref_pool *p = a->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, a->index);
        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

td_status ref_pool_new(int threads, ref_pool **out, td_err *err)
{
    *out = NULL;
    if (threads < 1 || threads > TD_ENGINE_MAX_THREADS)
        return td_err_set(err, TD_ERR_ARG, "ref: %d threads (expected 1..%d)", threads, TD_ENGINE_MAX_THREADS);
    ref_pool *p = calloc(1, sizeof *p);
    if (!p) return td_err_set(err, TD_ERR_NOMEM, "ref: out of memory (thread pool)");
    p->threads = threads;
    atomic_init(&p->next, 0);
    if (threads == 1) {
        *out = p;
        return TD_OK;
    }
    p->tids = calloc((size_t)threads - 1, sizeof *p->tids);
    p->args = calloc((size_t)threads - 1, sizeof *p->args);
    if (!p->tids || !p->args) {
        free(p->tids);
        free(p->args);
        free(p);
        return td_err_set(err, TD_ERR_NOMEM, "ref: out of memory (thread pool)");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (int i = 0; i < threads - 1; i++) {
        p->args[i].pool = p;
        p->args[i].index = i + 1;
        if (pthread_create(&p->tids[i], NULL, worker_main, &p->args[i]) != 0) {
            p->threads = i + 1; /* the workers started so far are joined by free */
            ref_pool_free(p);
            return td_err_set(err, TD_ERR_INTERNAL, "ref: cannot start worker thread %d of %d", i + 1,
                              threads);
        }
    }
    *out = p;
    return TD_OK;
}

void ref_pool_free(ref_pool *p)
{
    if (!p) return;
    if (p->tids) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->start_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->threads - 1; i++) pthread_join(p->tids[i], NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->start_cv);
        pthread_cond_destroy(&p->done_cv);
    }
    free(p->tids);
    free(p->args);
    free(p);
}

int ref_pool_threads(const ref_pool *p) { return p->threads; }

void ref_pool_run(ref_pool *p, int64_t n_items, ref_pool_fn fn, void *ctx)
{
    if (n_items <= 0) return;
    if (p->threads == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    atomic_store(&p->next, 0);
    p->running = p->threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->running > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
