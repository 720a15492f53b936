/* pool_run (pool.h) on OpenMP: the threads of torch's own OpenMP team (one runtime per process). */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>

/* A child forked after the parent ran OpenMP inherits a runtime whose threads it does not have
 * (GNU libgomp then hangs in the next region): a forked child runs every job alone. */
static atomic_int forked = 0;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void mark_forked(void) { atomic_store(&forked, 1); }
static void watch_forks(void) { pthread_atfork(NULL, NULL, mark_forked); }

void pool_run(pool_task fn, void *ctx, int64_t ntasks, int threads) {
    pthread_once(&once, watch_forks);
    _Atomic int64_t next = 0;
    if (threads <= 1 || ntasks <= 1 || atomic_load(&forked)) {
        for (int64_t i = 0; i < ntasks; i++) fn(ctx, i);
        return;
    }
#pragma omp parallel num_threads(threads)
    for (int64_t i; (i = atomic_fetch_add(&next, 1)) < ntasks;) fn(ctx, i);
}
