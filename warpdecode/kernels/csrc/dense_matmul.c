/* Float32 matmuls of a few activation rows by a dense weight: y = x W^T, W (N, K) row-major (a
 * `Linear`'s own weight, read in place: no packed copy).
 *
 * Each output is one dot product summed in a fixed order: lane l of 16 takes inputs l, l + 16, ...
 * (fused multiply-adds, fma16), the lanes reduced by reduce16. An output depends only on its activation row and weight channel, never on the other rows
 * of the call or the thread running it, so a row computes the same bits alone, in a verify of several
 * rows, or in a batch. Channels run as tasks of `pool.h`, two channels and up to eight rows at a time
 * (a weight vector loaded once serves the pass's rows).
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

#define DENSE_ROWS 8 /* activation rows per pass */

typedef struct {
    const float *x, *W;
    float *y;
    int64_t M, K, xs, N, ys, per_task;
} dense_job;

/* Channels j and j + 1 (`two`: whether j + 1 is one) for NR rows from r0. */
static inline __attribute__((always_inline)) void dense_pass(const dense_job *a, int64_t j, int two, int64_t r0,
                                                             const int NR) {
    const int64_t K = a->K;
    const float *w0 = a->W + j * K, *w1 = two ? w0 + K : w0;
    v16 s0[DENSE_ROWS], s1[DENSE_ROWS];
    for (int r = 0; r < NR; r++) s0[r] = s1[r] = (v16){0};
    int64_t d = 0;
    for (; d + LANES <= K; d += LANES) {
        const v16 u0 = load16(w0 + d), u1 = load16(w1 + d);
        for (int r = 0; r < NR; r++) {
            const v16 xv = load16(a->x + (r0 + r) * a->xs + d);
            s0[r] = fma16(u0, xv, s0[r]);
            s1[r] = fma16(u1, xv, s1[r]);
        }
    }
    for (int l = 0; d < K; d++, l++)
        for (int r = 0; r < NR; r++) {
            const float xv = a->x[(r0 + r) * a->xs + d];
            s0[r][l] = fmaf(w0[d], xv, s0[r][l]);
            s1[r][l] = fmaf(w1[d], xv, s1[r][l]);
        }
    for (int r = 0; r < NR; r++) {
        float *y = a->y + (r0 + r) * a->ys + j;
        y[0] = reduce16(s0[r]);
        if (two) y[1] = reduce16(s1[r]);
    }
}

static void dense_task(void *arg, int64_t task) {
    const dense_job *a = arg;
    const int64_t first = task * a->per_task, end = first + a->per_task < a->N ? first + a->per_task : a->N;
    for (int64_t j = first; j < end; j += 2) {
        const int two = j + 1 < end;
        for (int64_t r0 = 0, nr; r0 < a->M; r0 += nr) {
            const int64_t left = a->M - r0, passes = (left + DENSE_ROWS - 1) / DENSE_ROWS;
            nr = (left + passes - 1) / passes;
            switch (nr) {
                case 1: dense_pass(a, j, two, r0, 1); break;
                case 2: dense_pass(a, j, two, r0, 2); break;
                case 3: dense_pass(a, j, two, r0, 3); break;
                case 4: dense_pass(a, j, two, r0, 4); break;
                case 5: dense_pass(a, j, two, r0, 5); break;
                case 6: dense_pass(a, j, two, r0, 6); break;
                case 7: dense_pass(a, j, two, r0, 7); break;
                default: dense_pass(a, j, two, r0, 8); break;
            }
        }
    }
}

/* y (M, N), rows `y_stride` floats apart, = x (M, K), rows `x_stride` apart, times W (N, K) row-major. */
void dense_matmul_f32(const float *x, int64_t M, int64_t K, int64_t x_stride, const float *W, int64_t N, float *y,
                      int64_t y_stride, int nthreads) {
    dense_job a = {x, W, y, M, K, x_stride, N, y_stride, 0};
    const int64_t chunks = nthreads > 1 ? 8 * (int64_t)nthreads : 1;
    a.per_task = ((N + chunks - 1) / chunks + 1) / 2 * 2; /* even: a task's channel pairs never straddle tasks */
    if (a.per_task < 2) a.per_task = 2;
    pool_run(dense_task, &a, (N + a.per_task - 1) / a.per_task, nthreads);
}
