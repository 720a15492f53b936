/* The C kernels' work sharing: a job is `ntasks` independent tasks that the threads of one OpenMP
 * team take from a shared counter, so a thread that starts late finds less work instead of holding a
 * fixed share of it (the region still ends when every thread of the team has arrived).
 *
 * OpenMP, and not threads of the library's own: a kernel runs inside a torch process whose OpenMP
 * team is awake between torch's operations; a second set of spinning threads competes with it for
 * the cores (measured: 2-thread decoding 0.80x one thread with the library's own pool, 1.17x torch's
 * int4 kernel with the shared team). On an oversubscribed machine every OpenMP region, torch's
 * included, can wait a scheduler time slice for a descheduled thread; `--threads 1` avoids it.
 *
 * A task's work must not depend on which thread runs it (the kernels' results are the same bits
 * whatever the thread count). Without OpenMP (a compiler without -fopenmp), and in a child forked from
 * the process, the tasks run in order on the calling thread.
 */
#ifndef WARPDECODE_POOL_H
#define WARPDECODE_POOL_H

#include <stdint.h>

typedef void (*pool_task)(void *ctx, int64_t task);

/* Run fn(ctx, 0 .. ntasks - 1) on up to `threads` threads, the caller included; returns when all ran. */
void pool_run(pool_task fn, void *ctx, int64_t ntasks, int threads);

#endif
