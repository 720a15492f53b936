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

#define DENSE_ROWS 6 /* activation rows per pass */
#define DENSE_COLS 4 /* weight channels per pass */

typedef struct {
    const float *x, *W;
    float *y;
    int64_t M, K, xs, N, ys, per_task;
} dense_job;

/* Channels j .. j + nc - 1 (nc <= DENSE_COLS; a missing channel repeats the last) for NR rows from r0. */
static inline __attribute__((always_inline)) void dense_pass(const dense_job *a, int64_t j, int64_t nc, int64_t r0,
                                                             const int NR) {
    const int64_t K = a->K;
    const float *w[DENSE_COLS];
    for (int c = 0; c < DENSE_COLS; c++) w[c] = a->W + (j + (c < nc ? c : nc - 1)) * K;
    v16 s[DENSE_ROWS][DENSE_COLS];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < DENSE_COLS; c++) s[r][c] = (v16){0};
    int64_t d = 0;
    for (; d + LANES <= K; d += LANES) {
        v16 u[DENSE_COLS];
        for (int c = 0; c < DENSE_COLS; c++) u[c] = load16(w[c] + d);
        for (int r = 0; r < NR; r++) {
            const v16 xv = load16(a->x + (r0 + r) * a->xs + d);
            for (int c = 0; c < DENSE_COLS; c++) s[r][c] = fma16(u[c], xv, s[r][c]);
        }
    }
    for (int l = 0; d < K; d++, l++)
        for (int r = 0; r < NR; r++) {
            const float xv = a->x[(r0 + r) * a->xs + d];
            for (int c = 0; c < DENSE_COLS; c++) s[r][c][l] = fmaf(w[c][d], xv, s[r][c][l]);
        }
    for (int r = 0; r < NR; r++) {
        float *y = a->y + (r0 + r) * a->ys + j;
        for (int c = 0; c < nc; c++) y[c] = reduce16(s[r][c]);
    }
}

#if VEC_HALVES && defined(__FMA__)
#define DENSE_AVX2 1
/* dense_pass for one row with the 16 lanes as two 8-lane halves in registers (without AVX-512, the
 * 16-lane vector types of 6 rows x 4 channels spill): the same fused multiply-adds, the same reduction. */
static inline void dense_row_avx2(const dense_job *a, int64_t j, int64_t nc, int64_t r) {
    const int64_t K = a->K;
    const float *w[DENSE_COLS], *x = a->x + r * a->xs;
    for (int c = 0; c < DENSE_COLS; c++) w[c] = a->W + (j + (c < nc ? c : nc - 1)) * K;
    __m256 s[DENSE_COLS][2];
    for (int c = 0; c < DENSE_COLS; c++) s[c][0] = s[c][1] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + LANES <= K; d += LANES) {
        const __m256 x0 = _mm256_loadu_ps(x + d), x1 = _mm256_loadu_ps(x + d + 8);
        for (int c = 0; c < DENSE_COLS; c++) {
            s[c][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[c] + d), x0, s[c][0]);
            s[c][1] = _mm256_fmadd_ps(_mm256_loadu_ps(w[c] + d + 8), x1, s[c][1]);
        }
    }
    if (d < K) { /* a short tail into its lanes, as dense_pass adds it */
        float lanes[DENSE_COLS][LANES];
        for (int c = 0; c < DENSE_COLS; c++) {
            _mm256_storeu_ps(lanes[c], s[c][0]);
            _mm256_storeu_ps(lanes[c] + 8, s[c][1]);
        }
        for (int l = 0; d < K; d++, l++)
            for (int c = 0; c < DENSE_COLS; c++) lanes[c][l] = fmaf(w[c][d], x[d], lanes[c][l]);
        for (int c = 0; c < DENSE_COLS; c++) {
            s[c][0] = _mm256_loadu_ps(lanes[c]);
            s[c][1] = _mm256_loadu_ps(lanes[c] + 8);
        }
    }
    float *y = a->y + r * a->ys + j;
    for (int c = 0; c < nc; c++) y[c] = reduce8x2(s[c][0], s[c][1]);
}
#else
#define DENSE_AVX2 0
#endif

static void dense_task(void *arg, int64_t task) {
    const dense_job *a = arg;
    const int64_t first = task * a->per_task, end = first + a->per_task < a->N ? first + a->per_task : a->N;
    for (int64_t j = first; j < end; j += DENSE_COLS) {
        const int64_t nc = end - j < DENSE_COLS ? end - j : DENSE_COLS;
        if (DENSE_AVX2) { /* a row at a time: the 4 channels' weights stay in L1 for the next row */
#if DENSE_AVX2
            for (int64_t r = 0; r < a->M; r++) dense_row_avx2(a, j, nc, r);
#endif
            continue;
        }
        for (int64_t r0 = 0, nr; r0 < a->M; r0 += nr) {
            const int64_t left = a->M - r0, passes = (left + DENSE_ROWS - 1) / DENSE_ROWS;
            nr = (left + passes - 1) / passes;
            switch (nr) {
                case 1: dense_pass(a, j, nc, r0, 1); break;
                case 2: dense_pass(a, j, nc, r0, 2); break;
                case 3: dense_pass(a, j, nc, r0, 3); break;
                case 4: dense_pass(a, j, nc, r0, 4); break;
                case 5: dense_pass(a, j, nc, r0, 5); break;
                default: dense_pass(a, j, nc, r0, 6); break;
            }
        }
    }
}

/* y (M, N), rows `y_stride` floats apart, = x (M, K), rows `x_stride` apart, times W (N, K) row-major. */
void dense_matmul_f32(const float *x, int64_t M, int64_t K, int64_t x_stride, const float *W, int64_t N, float *y,
                      int64_t y_stride, int nthreads) {
    dense_job a = {x, W, y, M, K, x_stride, N, y_stride, 0};
    const int64_t chunks = nthreads > 1 ? 8 * (int64_t)nthreads : 1;
    a.per_task = ((N + chunks - 1) / chunks + DENSE_COLS - 1) / DENSE_COLS * DENSE_COLS;
    if (a.per_task < DENSE_COLS) a.per_task = DENSE_COLS;
    pool_run(dense_task, &a, (N + a.per_task - 1) / a.per_task, nthreads);
}
