/* A small work pool for the C kernels: the caller runs a job's tasks itself and never waits for a
 * helper thread that has not started.
 *
 * OpenMP's parallel regions end in a barrier: when one of their threads is descheduled (another
 * process holds the core), every call waits for it, a scheduler time slice of milliseconds per call,
 * and a decode step makes hundreds of calls. Here the caller publishes a job, takes tasks from a
 * shared counter until none is left, and then waits only for the tasks a helper has already taken.
 * A helper that wakes late finds nothing left; on a busy machine a job runs at one thread's speed
 * instead of stalling. Helpers spin briefly between jobs (a decode step's matmuls follow each other
 * within microseconds), then sleep.
 *
 * A task's work must not depend on which thread runs it (the kernels' results are the same bits
 * whatever the thread count).
 *
 * Protocol: `ticket` holds (generation << 32 | next task). The caller closes the old job (next =
 * CLOSED), waits until no helper is inside it, writes the new job, then opens it with one store. A
 * helper registers in `active` before reading the job and re-checks the ticket after registering;
 * tasks are claimed with a compare-exchange that fails once the generation moved on.
 */
#ifndef WARPDECODE_POOL_H
#define WARPDECODE_POOL_H

#include <stdint.h>

typedef void (*pool_task)(void *ctx, int64_t task);

/* Run fn(ctx, 0 .. ntasks - 1) on up to `threads` threads, the caller included; returns when all ran. */
void pool_run(pool_task fn, void *ctx, int64_t ntasks, int threads);

#endif
