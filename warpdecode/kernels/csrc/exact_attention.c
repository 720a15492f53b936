/* Exact attention for decode and verify steps: every query over exactly the keys it sees.
 *
 * Each (row, query, query head) task computes softmax(q k^T * scale) v over the
 * query's visible slots, in slot order: the first `prefix` slots of its row, then the `extra`
 * slots listed for it (tree ancestors past the prefix). The arithmetic of a task depends only on
 * its own query and keys (fixed loop orders, per-lane partial sums reduced in a fixed order), never
 * on the other tasks of the call or on which thread runs it: a query computes the same bits in a
 * one-token step, a chain or tree verify, and a batch of any size. See exact_attention.py.
 *
 * Vectors are GCC/Clang vector extensions (16 floats), lowered to whatever the CPU has.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <stdatomic.h>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

/* Dot products of `a` (n floats) with four rows: per row, LANES partial sums over d (lane l takes
 * d = l, l + 16, ...), then reduce16. Every key's score goes through this one function (a short
 * block repeats its last row), so a key's bits never depend on its neighbours. */
static inline void dot4(const float *a, const float *const b[4], int64_t n, float out[4]) {
#if VEC_HALVES
    /* The same lanes as two 8-lane halves in registers (16-lane vector types spill without AVX-512). */
    __m256 acc[4][2];
    for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) {
        const __m256 x0 = _mm256_loadu_ps(a + d), x1 = _mm256_loadu_ps(a + d + 8);
        for (int r = 0; r < 4; ++r) {
            acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(x0, _mm256_loadu_ps(b[r] + d)));
            acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(x1, _mm256_loadu_ps(b[r] + d + 8)));
        }
    }
    if (d < n) { /* the lanes of a short tail, as the 16-lane loop below adds them */
        float lanes[4][LANES];
        for (int r = 0; r < 4; ++r) {
            _mm256_storeu_ps(lanes[r], acc[r][0]);
            _mm256_storeu_ps(lanes[r] + 8, acc[r][1]);
        }
        for (int l = 0; d < n; ++d, ++l)
            for (int r = 0; r < 4; ++r) lanes[r][l] += a[d] * b[r][d];
        for (int r = 0; r < 4; ++r) {
            acc[r][0] = _mm256_loadu_ps(lanes[r]);
            acc[r][1] = _mm256_loadu_ps(lanes[r] + 8);
        }
    }
    for (int r = 0; r < 4; ++r) out[r] = reduce8x2(acc[r][0], acc[r][1]);
#else
    v16 acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) {
        const v16 x = load16(a + d);
        acc0 += x * load16(b[0] + d);
        acc1 += x * load16(b[1] + d);
        acc2 += x * load16(b[2] + d);
        acc3 += x * load16(b[3] + d);
    }
    for (int l = 0; d < n; ++d, ++l) {
        acc0[l] += a[d] * b[0][d];
        acc1[l] += a[d] * b[1][d];
        acc2[l] += a[d] * b[2][d];
        acc3[l] += a[d] * b[3][d];
    }
    out[0] = reduce16(acc0);
    out[1] = reduce16(acc1);
    out[2] = reduce16(acc2);
    out[3] = reduce16(acc3);
#endif
}

/* out[0..D) = sum over the n keys, in order, of s[i] * v_i[0..D): one sequential sum per element
 * (64 elements at a time in four registers, then 16, then one). */
static void weighted_sum(const float *s, const float *vb, const int32_t *more, int64_t n_prefix, int64_t n,
                         int64_t stride, int64_t D, float *out) {
    int64_t d = 0;
#if VEC_HALVES
    for (; d + 4 * LANES <= D; d += 4 * LANES) { /* the same sums, 8 lanes a register */
        __m256 acc[8];
        for (int c = 0; c < 8; ++c) acc[c] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; ++i) {
            const float *vs = vb + (i < n_prefix ? i : more[i - n_prefix]) * stride + d;
            const __m256 p = _mm256_set1_ps(s[i]);
            for (int c = 0; c < 8; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(p, _mm256_loadu_ps(vs + 8 * c)));
        }
        for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + d + 8 * c, acc[c]);
    }
#endif
    for (; d + 4 * LANES <= D; d += 4 * LANES) {
        v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int64_t i = 0; i < n; ++i) {
            const float *vs = vb + (i < n_prefix ? i : more[i - n_prefix]) * stride + d;
            const v16 p = splat16(s[i]);
            a0 += p * load16(vs);
            a1 += p * load16(vs + LANES);
            a2 += p * load16(vs + 2 * LANES);
            a3 += p * load16(vs + 3 * LANES);
        }
        memcpy(out + d, &a0, sizeof a0);
        memcpy(out + d + LANES, &a1, sizeof a1);
        memcpy(out + d + 2 * LANES, &a2, sizeof a2);
        memcpy(out + d + 3 * LANES, &a3, sizeof a3);
    }
    for (; d + LANES <= D; d += LANES) {
        v16 a0 = {0};
        for (int64_t i = 0; i < n; ++i)
            a0 += splat16(s[i]) * load16(vb + (i < n_prefix ? i : more[i - n_prefix]) * stride + d);
        memcpy(out + d, &a0, sizeof a0);
    }
    for (; d < D; ++d) {
        float a = 0.0f;
        for (int64_t i = 0; i < n; ++i) a += s[i] * vb[(i < n_prefix ? i : more[i - n_prefix]) * stride + d];
        out[d] = a;
    }
}

typedef struct {
    const float *q, *k, *v;
    int64_t q_sb, q_sh, q_st, kv_sb, kv_sh, kv_ss;
    float *out;
    int64_t o_sb, o_sh, o_st;
    int64_t H, Hkv, T, D, G;
    const int32_t *prefix, *extra_off, *extra;
    float scale;
    _Atomic int failed;
} attention_job;

/* One (row, query, query head) task. A decode step of a GQA model has few key heads (3 for the
 * default model) and 2 threads would split 3 key-head tasks 2:1; its query heads split evenly. */
static void attention_task(void *arg, int64_t task) {
    attention_job *a = arg;
    const float *q = a->q, *k = a->k, *v = a->v;
    const int64_t q_sb = a->q_sb, q_sh = a->q_sh, q_st = a->q_st, kv_sb = a->kv_sb, kv_sh = a->kv_sh,
                  kv_ss = a->kv_ss, H = a->H, T = a->T, D = a->D, G = a->G;
    const int32_t *prefix = a->prefix, *extra_off = a->extra_off, *extra = a->extra;
    const float scale = a->scale;
    float *out = a->out;
    const int64_t o_sb = a->o_sb, o_sh = a->o_sh, o_st = a->o_st;

    const int64_t h = task % H, g = h / G, bt = task / H, b = bt / T, t = bt % T;
    const int64_t n_prefix = prefix[bt], n = n_prefix + extra_off[bt + 1] - extra_off[bt];
    const int32_t *more = extra + extra_off[bt];
    const float *kb = k + b * kv_sb + g * kv_sh, *vb = v + b * kv_sb + g * kv_sh;
    const float *qh = q + b * q_sb + h * q_sh + t * q_st;
    float *o = out + b * o_sb + h * o_sh + t * o_st;
    if (n == 0) {
        memset(o, 0, sizeof(float) * (size_t)D);
        return;
    }
    float *s = malloc(sizeof(float) * (size_t)n);
    if (s == NULL) {
        atomic_store(&a->failed, 1);
        return;
    }
    for (int64_t i = 0; i < n; i += 4) {
        const float *rows[4];
        for (int r = 0; r < 4; ++r) {
            const int64_t at = i + r < n ? i + r : n - 1;
            rows[r] = kb + (at < n_prefix ? at : more[at - n_prefix]) * kv_ss;
        }
        float four[4];
        dot4(qh, rows, D, four);
        for (int r = 0; r < 4 && i + r < n; ++r) s[i + r] = four[r] * scale;
    }
    float m = s[0];
    for (int64_t i = 1; i < n; ++i) m = s[i] > m ? s[i] : m;
    for (int64_t i = 0; i < n; ++i) s[i] = exp_nonpositive(s[i] - m);
    v16 part = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) part += load16(s + i);
    for (int l = 0; i < n; ++i, ++l) part[l] += s[i];
    const float inv = 1.0f / reduce16(part);
    weighted_sum(s, vb, more, n_prefix, n, kv_ss, D, o);
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    free(s);
}

/* q: element (b, h, t, d) at q + b*q_sb + h*q_sh + t*q_st + d.
 * k, v: element (b, g, s, d) at k + b*kv_sb + g*kv_sh + s*kv_ss + d (the same strides for v).
 * out: element (b, h, t, d) at out + b*o_sb + h*o_sh + t*o_st + d.
 * prefix: (B*T,) leading slots each query sees; extra_off: (B*T + 1,) offsets into extra, the
 * further slots each query sees, ascending.
 * Tasks run on `pool.h` (up to `threads` threads).
 * Returns 0, or 1 when scratch memory could not be allocated. */
int exact_attention_strided(const float *q, int64_t q_sb, int64_t q_sh, int64_t q_st,
                            const float *k, const float *v, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                            float *out, int64_t o_sb, int64_t o_sh, int64_t o_st,
                            int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D,
                            const int32_t *prefix, const int32_t *extra_off, const int32_t *extra,
                            float scale, int threads) {
    attention_job a = {q, k, v, q_sb, q_sh, q_st, kv_sb, kv_sh, kv_ss, out, o_sb, o_sh, o_st, H, Hkv, T, D,
                       H / Hkv, prefix, extra_off, extra, scale, 0};
    pool_run(attention_task, &a, B * T * H, threads);
    return atomic_load(&a.failed);
}

/* exact_attention_strided with out (B, H, T, D) contiguous. */
int exact_attention_f32(const float *q, int64_t q_sb, int64_t q_sh, int64_t q_st,
                        const float *k, const float *v, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                        float *out, int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t D,
                        const int32_t *prefix, const int32_t *extra_off, const int32_t *extra,
                        float scale, int threads) {
    return exact_attention_strided(q, q_sb, q_sh, q_st, k, v, kv_sb, kv_sh, kv_ss, out, H * T * D, T * D, D,
                                   B, H, Hkv, T, D, prefix, extra_off, extra, scale, threads);
}
