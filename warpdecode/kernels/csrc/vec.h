/* 16-float vectors (GCC/Clang vector extensions, lowered to whatever the CPU has) and their sum in a
 * fixed order: the kernels' reductions give the same bits whichever thread or call runs them. */
#ifndef WARPDECODE_VEC_H
#define WARPDECODE_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

/* VEC_HALVES: an AVX CPU without AVX-512, where the 16-lane vector types below would go through memory
 * for splats and shuffles; the kernels' hot loops then hold the same 16 lanes as two 8-lane registers. */
#if defined(__AVX__) && !defined(__AVX512F__)
#define VEC_HALVES 1
#else
#define VEC_HALVES 0
#endif

#define LANES 16
typedef float v16 __attribute__((vector_size(LANES * sizeof(float))));

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* x in every lane. */
static inline v16 splat16(float x) {
#if VEC_HALVES
    const __m256 h[2] = {_mm256_set1_ps(x), _mm256_set1_ps(x)};
    v16 v;
    memcpy(&v, h, sizeof v);
    return v;
#else
    return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#endif
}

/* The 16 lanes summed in a fixed pairwise order: lane i += lane i + 8, then i + 4, i + 2, i + 1. */
typedef int32_t i16v __attribute__((vector_size(LANES * sizeof(int32_t))));
#if VEC_HALVES
/* reduce16 of the 16 lanes held as two 8-lane halves (lanes 0-7, 8-15): the same adds. */
static inline float reduce8x2(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);                                                /* i += i + 8 */
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)); /* i += i + 4 */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                /* i += i + 2 */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                       /* i += i + 1 */
}
#endif

static inline float reduce16(v16 a) {
#if VEC_HALVES
    __m256 h[2];
    memcpy(h, &a, sizeof a);
    return reduce8x2(h[0], h[1]);
#else
    a += __builtin_shuffle(a, (i16v){8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
    a += __builtin_shuffle(a, (i16v){4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
    a += __builtin_shuffle(a, (i16v){2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
    a += __builtin_shuffle(a, (i16v){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    return a[0];
#endif
}

/* exp(x) for x <= 0 (scores minus their maximum), branch-free so that loops over it vectorise:
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in two parts (Cody-Waite), exp(r) by a
 * degree-6 polynomial (relative error ~2e-7 on [-ln2/2, ln2/2]); below -87 it returns 0. */
static inline float exp_nonpositive(float x) {
    const float lo = -87.0f;
    const float under = x < lo ? 0.0f : 1.0f;
    x = x < lo ? lo : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest even */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * under;
}

/* a * b + c with one rounding per lane (the same bits on every path). */
static inline v16 fma16(v16 a, v16 b, v16 c) {
#if defined(__AVX512F__)
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX__) && defined(__FMA__)
    __m256 a2[2], b2[2], c2[2]; /* two halves of 8 lanes */
    memcpy(a2, &a, sizeof a);
    memcpy(b2, &b, sizeof b);
    memcpy(c2, &c, sizeof c);
    for (int h = 0; h < 2; h++) c2[h] = _mm256_fmadd_ps(a2[h], b2[h], c2[h]);
    memcpy(&c, c2, sizeof c);
    return c;
#else
    for (int l = 0; l < LANES; l++) c[l] = fmaf(a[l], b[l], c[l]);
    return c;
#endif
}

#endif
