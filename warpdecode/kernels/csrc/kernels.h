/* The kernels one C file calls in another (all in one library: see native.py). */
#ifndef WARPDECODE_KERNELS_H
#define WARPDECODE_KERNELS_H

#include <stdint.h>

/* block_matmul.c: y (M, N) = x (M, K) times a packed int4 / int8 weight, y rows `y_stride` apart.
 * Nonzero when out of memory. */
int block_matmul_strided(const float *x, int64_t M, int64_t K, int64_t x_stride, const uint8_t *packed,
                         const float *scale, int bits, int64_t N, float *y, int64_t y_stride, int nthreads);

/* dense_matmul.c: y (M, N) = x (M, K) times a float32 weight W (N, K) row-major, y rows `y_stride` apart. */
void dense_matmul_f32(const float *x, int64_t M, int64_t K, int64_t x_stride, const float *W, int64_t N, float *y,
                      int64_t y_stride, int nthreads);

/* exact_attention.c: every query over exactly its visible slots, any strides. Nonzero when out of memory. */
int exact_attention_strided(const float *q, int64_t q_sb, int64_t q_sh, int64_t q_st,
                            const float *k, const float *v, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                            float *out, int64_t o_sb, int64_t o_sh, int64_t o_st,
                            int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D,
                            const int32_t *prefix, const int32_t *extra_off, const int32_t *extra,
                            float scale, int threads);

#endif
