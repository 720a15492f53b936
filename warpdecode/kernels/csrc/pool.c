/* The work pool of pool.h (one per process: every kernel of the library shares it). */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>

#define POOL_MAX_HELPERS 63
#define POOL_CLOSED 0xffffffffULL
#define POOL_SPIN 20000 /* pauses (~0.5 ms) of polling before a helper sleeps */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t ticket;
    _Atomic int64_t done;
    _Atomic int active;
    _Atomic int sleepers;
    int helpers;        /* started */
    int job_helpers;    /* helpers that may join the current job */
    pool_task fn;
    void *ctx;
    int64_t ntasks;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, POOL_CLOSED, 0, 0, 0, 0, 0, 0, 0, 0};

static inline void pool_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Take and run tasks of generation `gen` until none is left. */
static void pool_drain(uint64_t gen, pool_task fn, void *ctx, int64_t ntasks) {
    uint64_t t = atomic_load(&pool.ticket);
    for (;;) {
        if ((t >> 32) != gen || (t & 0xffffffffULL) >= (uint64_t)ntasks) return;
        if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) {
            fn(ctx, (int64_t)(t & 0xffffffffULL));
            atomic_fetch_add(&pool.done, 1);
            t = atomic_load(&pool.ticket);
        }
    }
}

static void *pool_helper(void *arg) {
    int index = (int)(intptr_t)arg;
    uint64_t seen = atomic_load(&pool.ticket) >> 32;
    for (;;) {
        uint64_t t;
        int spins = 0;
        while (((t = atomic_load(&pool.ticket)) >> 32) == seen || (t & 0xffffffffULL) == POOL_CLOSED) {
            if (++spins < POOL_SPIN) {
                pool_pause();
                continue;
            }
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while (((t = atomic_load(&pool.ticket)) >> 32) == seen || (t & 0xffffffffULL) == POOL_CLOSED)
                pthread_cond_wait(&pool.cv, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        uint64_t gen = t >> 32;
        seen = gen;
        atomic_fetch_add(&pool.active, 1);
        t = atomic_load(&pool.ticket);
        if ((t >> 32) == gen && (t & 0xffffffffULL) != POOL_CLOSED && index < pool.job_helpers)
            pool_drain(gen, pool.fn, pool.ctx, pool.ntasks);
        atomic_fetch_sub(&pool.active, 1);
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has no helpers: it runs every job alone */
    pool.helpers = 0;
    atomic_store(&pool.active, 0);
    atomic_store(&pool.sleepers, 0);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.cv, NULL);
}

/* Run fn(ctx, 0 .. ntasks - 1) on up to `threads` threads (the caller included). One caller at a
 * time: the kernels are called from Python with the GIL's callers serialised by `pool_lock`. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

void pool_run(pool_task fn, void *ctx, int64_t ntasks, int threads) {
    if (threads <= 1 || ntasks <= 1) {
        for (int64_t i = 0; i < ntasks; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool_lock);
    static int atfork = 0;
    if (!atfork) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        atfork = 1;
    }
    int want = threads - 1 > POOL_MAX_HELPERS ? POOL_MAX_HELPERS : threads - 1;
    while (pool.helpers < want) {
        pthread_t th;
        if (pthread_create(&th, NULL, pool_helper, (void *)(intptr_t)pool.helpers) != 0) break;
        pthread_detach(th);
        pool.helpers++;
    }
    uint64_t gen = (atomic_load(&pool.ticket) >> 32) + 1;
    atomic_store(&pool.ticket, ((gen - 1) << 32) | POOL_CLOSED);
    while (atomic_load(&pool.active) > 0) pool_pause();
    pool.fn = fn;
    pool.ctx = ctx;
    pool.ntasks = ntasks;
    pool.job_helpers = want;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.ticket, gen << 32);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    pool_drain(gen, fn, ctx, ntasks);
    while (atomic_load(&pool.done) < ntasks) pool_pause();
    pthread_mutex_unlock(&pool_lock);
}

