/* Weight-only block-quantised matmuls on 8-bit activations: y = x W^T for a few rows of x.
 *
 * Weights are tiles of 16 output channels by blocks of 32 inputs (see block_matmul.py for the
 * layout). Each activation row is quantised per block of 32 to int8 (`xq = round(x / dx)`, dx =
 * max |x| / 127), the block's integer dot product with the weight's integers is exact (int32), and
 * the float result accumulates block by block in a fixed order:
 *
 *   int4 (w = q * d + m, q in [0, 15]):  acc = fma(isum, d * dx, acc); acc = fma(m, dx * sum(xq), acc)
 *   int8 (w = s * (u - 128), u in [1, 255]):  acc = fma(isum - 128 * sum(xq), dx, acc); y = acc * s
 *
 * An output's arithmetic depends only on its own activation row and weight channel (the row's blocks
 * in order, integer sums that are exact whatever their order), never on the other rows of the call or
 * on the thread that runs it: a row computes the same bits alone, in a verify of 8 rows, or in a
 * prefill. The AVX-512 VNNI, AVX2 and portable paths compute the same bits (explicit fmaf; the AVX2
 * path's integer sums are exact too: see its passes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"

/* BLOCK_SIMD: 2 AVX-512 VNNI, 1 AVX2 (with FMA and F16C: most x86 laptops and AMD servers), 0 portable C. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define BLOCK_SIMD 2
#define ROWS 8 /* activation rows per pass over a tile (their accumulators fill the registers) */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define BLOCK_SIMD 1
#define ROWS 4 /* 16 ymm registers: 2 accumulators and 2 integer sums per row */
#else
#define BLOCK_SIMD 0
#define ROWS 8
#endif

#define TILE 16  /* output channels per tile */
#define BLOCK 32 /* inputs per block */
/* Bytes ahead of the block being multiplied that each pass asks the cache to fetch. With a few rows a
 * block's multiply-adds take about as long as its bytes take to arrive; fetching ~20 blocks ahead
 * overlaps the two (measured: 8 rows over 400 MB of int4 blocks 23 -> 11 ms, 1 row unchanged). */
#define PREFETCH 6144
#define INT4_BLOCK_BYTES (TILE * BLOCK / 2 + 2 * TILE * 2) /* nibbles, fp16 d[16], fp16 m[16] */
#define INT8_BLOCK_BYTES (TILE * BLOCK)                   /* u8 */

int block_matmul_simd(void) { return BLOCK_SIMD; }

static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Row r's activations, quantised per block: xq (K bytes), dx and dx * sum(xq) per block, sum(xq). */
static void quantize_rows(const float *x, int64_t M, int64_t K, int64_t x_stride, int8_t *xq, float *dx,
                          float *sx, int32_t *sq) {
    int64_t nb = K / BLOCK;
    for (int64_t r = 0; r < M; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * x_stride + b * BLOCK;
            float amax = 0.0f;
            for (int i = 0; i < BLOCK; i++) amax = fmaxf(amax, fabsf(v[i]));
            float d = amax / 127.0f, inv = d > 0.0f ? 127.0f / amax : 0.0f;
            int32_t s = 0;
            int8_t *q = xq + r * K + b * BLOCK;
            for (int i = 0; i < BLOCK; i++) {
                int32_t qi = (int32_t)nearbyintf(v[i] * inv);
                qi = qi > 127 ? 127 : (qi < -127 ? -127 : qi);
                q[i] = (int8_t)qi;
                s += qi;
            }
            dx[r * nb + b] = d;
            sx[r * nb + b] = d * (float)s;
            sq[r * nb + b] = s;
        }
    }
}

/* Integer dot products of one block for one activation row: isum[j] = sum_i w[j][i] * xq[i].
 * `w(j, i)` reads the weight integer of channel j, input i of the block. */
#define PORTABLE_ISUM(isum, xqb, WEXPR)                          \
    for (int j = 0; j < TILE; j++) {                             \
        int32_t s = 0;                                           \
        for (int i = 0; i < BLOCK; i++) s += (WEXPR) * (xqb)[i]; \
        (isum)[j] = s;                                           \
    }

/* Rows of the next pass over a tile when `left` remain: passes of at most ROWS, as even as possible
 * (7 rows: 4 + 3, not 6 + 1; a pass costs about its widest row count). */
static inline int64_t pass_rows(int64_t left) {
    int64_t passes = (left + ROWS - 1) / ROWS;
    return (left + passes - 1) / passes;
}

/* Passes of `rows` activation rows over a tile, each a call PASS(NR) with NR a constant (1 to ROWS):
 * the pass function is inlined once per row count, its accumulators in registers. */
#define FOR_PASSES(rows, PASS)                                          \
    for (int64_t r0 = 0, nr; r0 < (rows); r0 += nr) {                   \
        nr = pass_rows((rows) - r0);                                    \
        PASS_CASES(nr, PASS)                                            \
    }
#if ROWS == 4
#define PASS_CASES(nr, PASS)                                            \
    switch (nr) {                                                       \
        case 1: PASS(1); break;                                         \
        case 2: PASS(2); break;                                         \
        case 3: PASS(3); break;                                         \
        default: PASS(4); break;                                        \
    }
#else
#define PASS_CASES(nr, PASS)                                            \
    switch (nr) {                                                       \
        case 1: PASS(1); break;                                         \
        case 2: PASS(2); break;                                         \
        case 3: PASS(3); break;                                         \
        case 4: PASS(4); break;                                         \
        case 5: PASS(5); break;                                         \
        case 6: PASS(6); break;                                         \
        case 7: PASS(7); break;                                         \
        default: PASS(8); break;                                        \
    }
#endif

#if BLOCK_SIMD
/* Ask for the cache lines PREFETCH bytes past a block (a hint: past the weight's end it fetches
 * nothing that matters and never faults). */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *blk, int bytes) {
    for (int c = 0; c < bytes; c += 64) _mm_prefetch((const char *)(blk + PREFETCH + c), _MM_HINT_T0);
}
#endif

#if BLOCK_SIMD == 2

/* s[r] += the block's integer dot products of the 16 channels' weights `w` (8 groups of 4 inputs) with
 * activation row r (xb + r * K). Two chains per row when few rows run (latency), one when many
 * (registers); integer sums are exact in any order. */
static inline __attribute__((always_inline)) void block_sums(const __m512i w[8], const int8_t *xb, int64_t K,
                                                             const int NR, __m512i s[]) {
    __m512i s1[ROWS];
    for (int r = 0; r < NR; r++) s1[r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; g += 2) {
        for (int r = 0; r < NR; r++) {
            const int8_t *x = xb + r * K + 4 * g;
            s[r] = _mm512_dpbusd_epi32(s[r], w[g], _mm512_set1_epi32(load_i32(x)));
            if (NR <= 2)
                s1[r] = _mm512_dpbusd_epi32(s1[r], w[g + 1], _mm512_set1_epi32(load_i32(x + 4)));
            else
                s[r] = _mm512_dpbusd_epi32(s[r], w[g + 1], _mm512_set1_epi32(load_i32(x + 4)));
        }
    }
    if (NR <= 2)
        for (int r = 0; r < NR; r++) s[r] = _mm512_add_epi32(s[r], s1[r]);
}

/* One pass of NR activation rows over a tile (NR a constant at each call: the rows' accumulators
 * stay in registers). */
static inline __attribute__((always_inline)) void int4_pass(const uint8_t *tile, int64_t nb, const int8_t *xq,
                                                            const float *dx, const float *sx, int64_t K, int64_t r0,
                                                            const int NR, float *y, int64_t y_stride, int64_t valid) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * INT4_BLOCK_BYTES;
        prefetch_block(blk, INT4_BLOCK_BYTES);
        __m512i w[8];
        for (int t = 0; t < 4; t++) {
            __m512i p = _mm512_loadu_si512((const void *)(blk + 64 * t));
            w[t] = _mm512_and_si512(p, low);
            w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + 288)));
        __m512i s[ROWS];
        for (int r = 0; r < NR; r++) s[r] = _mm512_setzero_si512();
        block_sums(w, xq + r0 * K + b * BLOCK, K, NR, s);
        for (int r = 0; r < NR; r++) {
            __m512 isum = _mm512_cvtepi32_ps(s[r]);
            __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(dx[(r0 + r) * nb + b]));
            acc[r] = _mm512_fmadd_ps(isum, dd, acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[(r0 + r) * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) {
        float out[TILE];
        _mm512_storeu_ps(out, acc[r]);
        memcpy(y + (r0 + r) * y_stride, out, (size_t)valid * sizeof(float));
    }
}
#endif

#if BLOCK_SIMD == 1
/* AVX2 passes: each 64-byte group of a block is two 32-byte halves, channels 0-7 and 8-15, and
 * `vpmaddubsw` multiplies unsigned weight bytes by signed activation bytes, adding pairs into int16
 * lanes; `vpmaddwd` by ones adds those pairs into the channel's int32 lane. Both stay exact:
 *   int4: a pair is at most 2 * 15 * 127 = 3810, and the 8 groups of a block add up to at most 30480
 *         in an int16 lane, so the int16 sums run over the whole block before widening;
 *   int8: the weight byte u becomes q = u - 128 (xor 0x80), and |q| times x with q's sign
 *         (`vpsignb`) gives pairs of at most 2 * 128 * 127 = 32512, widened group by group.
 * The float steps are the other paths' own, lane for lane. */
static inline __attribute__((always_inline)) __m256i broadcast4(const int8_t *x) {
    return _mm256_set1_epi32(load_i32(x));
}

static inline __attribute__((always_inline)) void store_rows(const __m256 acc[][2], int64_t r0, const int NR, float *y,
                                                             int64_t y_stride, int64_t valid) {
    for (int r = 0; r < NR; r++) {
        float out[TILE];
        _mm256_storeu_ps(out, acc[r][0]);
        _mm256_storeu_ps(out + 8, acc[r][1]);
        memcpy(y + (r0 + r) * y_stride, out, (size_t)valid * sizeof(float));
    }
}

static inline __attribute__((always_inline)) void int4_pass(const uint8_t *tile, int64_t nb, const int8_t *xq,
                                                            const float *dx, const float *sx, int64_t K, int64_t r0,
                                                            const int NR, float *y, int64_t y_stride, int64_t valid) {
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * INT4_BLOCK_BYTES;
        const int8_t *xb = xq + r0 * K + b * BLOCK;
        prefetch_block(blk, INT4_BLOCK_BYTES);
        __m256i s[ROWS][2];
        for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        for (int t = 0; t < 4; t++) {
            for (int h = 0; h < 2; h++) {
                __m256i p = _mm256_loadu_si256((const void *)(blk + 64 * t + 32 * h));
                __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                for (int r = 0; r < NR; r++) {
                    __m256i a = _mm256_maddubs_epi16(lo, broadcast4(xb + r * K + 4 * t));
                    __m256i c = _mm256_maddubs_epi16(hi, broadcast4(xb + r * K + 4 * (t + 4)));
                    s[r][h] = _mm256_add_epi16(s[r][h], _mm256_add_epi16(a, c));
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + 256 + 16 * h)));
            __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + 288 + 16 * h)));
            for (int r = 0; r < NR; r++) {
                __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r][h], ones));
                __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(dx[(r0 + r) * nb + b]));
                acc[r][h] = _mm256_fmadd_ps(isum, dd, acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[(r0 + r) * nb + b]), acc[r][h]);
            }
        }
    }
    store_rows(acc, r0, NR, y, y_stride, valid);
}

static inline __attribute__((always_inline)) void int8_pass(const uint8_t *tile, const float *scale, int64_t nb,
                                                            const int8_t *xq, const float *dx, const int32_t *sq,
                                                            int64_t K, int64_t r0, const int NR, float *y,
                                                            int64_t y_stride, int64_t valid) {
    (void)sq; /* the weights are made signed here, so no -128 * sum(xq) correction */
    const __m256i bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS][2];
    for (int r = 0; r < NR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * INT8_BLOCK_BYTES;
        const int8_t *xb = xq + r0 * K + b * BLOCK;
        prefetch_block(blk, INT8_BLOCK_BYTES);
        __m256i s[ROWS][2];
        for (int r = 0; r < NR; r++) s[r][0] = s[r][1] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            for (int h = 0; h < 2; h++) {
                __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const void *)(blk + 64 * g + 32 * h)), bias);
                __m256i a = _mm256_abs_epi8(q);
                for (int r = 0; r < NR; r++) {
                    __m256i p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(broadcast4(xb + r * K + 4 * g), q));
                    s[r][h] = _mm256_add_epi32(s[r][h], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for (int r = 0; r < NR; r++) {
            __m256 dxr = _mm256_set1_ps(dx[(r0 + r) * nb + b]);
            for (int h = 0; h < 2; h++) acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][h]), dxr, acc[r][h]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int h = 0; h < 2; h++) acc[r][h] = _mm256_mul_ps(acc[r][h], _mm256_loadu_ps(scale + 8 * h));
    store_rows(acc, r0, NR, y, y_stride, valid);
}
#endif

static void int4_tile(const uint8_t *tile, int64_t nb, const int8_t *xq, const float *dx, const float *sx,
                      int64_t K, int64_t rows, float *y, int64_t y_stride, int64_t valid) {
#if BLOCK_SIMD
#define INT4_PASS(NR) int4_pass(tile, nb, xq, dx, sx, K, r0, NR, y, y_stride, valid)
    FOR_PASSES(rows, INT4_PASS)
#undef INT4_PASS
#else
    for (int64_t r = 0; r < rows; r++) {
        float acc[TILE] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * INT4_BLOCK_BYTES;
            const int8_t *xqb = xq + r * K + b * BLOCK;
            int32_t isum[TILE];
            /* channel j, input i: group g = i / 4 (low nibbles for g < 4), byte 4j + i % 4 */
            PORTABLE_ISUM(isum, xqb,
                          (int32_t)((blk[64 * ((i / 4) & 3) + 4 * j + (i & 3)] >> (i / 16 * 4)) & 0x0f))
            float dxr = dx[r * nb + b], sxr = sx[r * nb + b];
            for (int j = 0; j < TILE; j++) {
                uint16_t dh, mh;
                memcpy(&dh, blk + 256 + 2 * j, 2);
                memcpy(&mh, blk + 288 + 2 * j, 2);
                float dd = half_to_float(dh) * dxr;
                acc[j] = fmaf((float)isum[j], dd, acc[j]);
                acc[j] = fmaf(half_to_float(mh), sxr, acc[j]);
            }
        }
        memcpy(y + r * y_stride, acc, (size_t)valid * sizeof(float));
    }
#endif
}

#if BLOCK_SIMD == 2
static inline __attribute__((always_inline)) void int8_pass(const uint8_t *tile, const float *scale, int64_t nb,
                                                            const int8_t *xq, const float *dx, const int32_t *sq,
                                                            int64_t K, int64_t r0, const int NR, float *y,
                                                            int64_t y_stride, int64_t valid) {
    __m512 acc[ROWS];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * INT8_BLOCK_BYTES;
        prefetch_block(blk, INT8_BLOCK_BYTES);
        __m512i w[8];
        for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(blk + 64 * g));
        __m512i s[ROWS];
        for (int r = 0; r < NR; r++) s[r] = _mm512_set1_epi32(-128 * sq[(r0 + r) * nb + b]);
        block_sums(w, xq + r0 * K + b * BLOCK, K, NR, s);
        for (int r = 0; r < NR; r++) {
            __m512 isum = _mm512_cvtepi32_ps(s[r]);
            acc[r] = _mm512_fmadd_ps(isum, _mm512_set1_ps(dx[(r0 + r) * nb + b]), acc[r]);
        }
    }
    __m512 s = _mm512_loadu_ps(scale);
    for (int r = 0; r < NR; r++) {
        float out[TILE];
        _mm512_storeu_ps(out, _mm512_mul_ps(acc[r], s));
        memcpy(y + (r0 + r) * y_stride, out, (size_t)valid * sizeof(float));
    }
}
#endif

static void int8_tile(const uint8_t *tile, const float *scale, int64_t nb, const int8_t *xq, const float *dx,
                      const int32_t *sq, int64_t K, int64_t rows, float *y, int64_t y_stride, int64_t valid) {
#if BLOCK_SIMD
#define INT8_PASS(NR) int8_pass(tile, scale, nb, xq, dx, sq, K, r0, NR, y, y_stride, valid)
    FOR_PASSES(rows, INT8_PASS)
#undef INT8_PASS
#else
    for (int64_t r = 0; r < rows; r++) {
        float acc[TILE] = {0};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = tile + b * INT8_BLOCK_BYTES;
            const int8_t *xqb = xq + r * K + b * BLOCK;
            int32_t isum[TILE];
            PORTABLE_ISUM(isum, xqb, (int32_t)blk[64 * (i / 4) + 4 * j + (i & 3)])
            float dxr = dx[r * nb + b];
            int32_t corr = -128 * sq[r * nb + b];
            for (int j = 0; j < TILE; j++) acc[j] = fmaf((float)(isum[j] + corr), dxr, acc[j]);
        }
        for (int j = 0; j < valid; j++) y[r * y_stride + j] = acc[j] * scale[j];
    }
#endif
}

typedef struct {
    const uint8_t *packed;
    const float *scale, *dx, *sx;
    const int8_t *xq;
    const int32_t *sq;
    float *y;
    int64_t M, K, N, y_stride, nb, tiles, per_task, block_bytes;
    int bits;
} job_t;

static void run_tiles(void *arg, int64_t task) {
    const job_t *j = arg;
    int64_t end = (task + 1) * j->per_task < j->tiles ? (task + 1) * j->per_task : j->tiles;
    for (int64_t t = task * j->per_task; t < end; t++) {
        const uint8_t *tile = j->packed + t * j->nb * j->block_bytes;
        int64_t valid = j->N - t * TILE < TILE ? j->N - t * TILE : TILE;
        if (j->bits == 4)
            int4_tile(tile, j->nb, j->xq, j->dx, j->sx, j->K, j->M, j->y + t * TILE, j->y_stride, valid);
        else
            int8_tile(tile, j->scale + t * TILE, j->nb, j->xq, j->dx, j->sq, j->K, j->M, j->y + t * TILE, j->y_stride, valid);
    }
}

/* y (M, N) float32 = x (M, K) float32 times the packed weight; K a multiple of 32, x rows `x_stride`
 * floats apart, y rows `y_stride` floats apart. bits: 4 (`packed` holds N/16 tiles of K/32 int4 blocks)
 * or 8 (int8 blocks, `scale` the (N padded to 16,) float32 channel scales). Tiles run as tasks of
 * `pool.h` on up to `nthreads` threads. Returns nonzero when scratch memory ran out. */
int block_matmul_strided(const float *x, int64_t M, int64_t K, int64_t x_stride, const uint8_t *packed,
                         const float *scale, int bits, int64_t N, float *y, int64_t y_stride, int nthreads) {
    int64_t nb = K / BLOCK, tiles = (N + TILE - 1) / TILE;
    /* one scratch allocation: per block dx, dx * sum(xq), sum(xq) (4-byte each), then the int8 rows */
    size_t per_block = (size_t)(M * nb);
    char *scratch = malloc(per_block * (2 * sizeof(float) + sizeof(int32_t)) + (size_t)(M * K));
    if (!scratch) return 1;
    float *dx = (float *)scratch, *sx = dx + per_block;
    int32_t *sq = (int32_t *)(sx + per_block);
    int8_t *xq = (int8_t *)(sq + per_block);
    quantize_rows(x, M, K, x_stride, xq, dx, sx, sq);
    job_t job = {packed, scale, dx, sx, xq, sq, y, M, K, N, y_stride, nb, tiles, 1,
                 bits == 4 ? INT4_BLOCK_BYTES : INT8_BLOCK_BYTES, bits};
    int64_t chunks = nthreads > 1 ? 8 * (int64_t)nthreads : 1; /* a few tasks per thread: late helpers matter less */
    job.per_task = (tiles + chunks - 1) / chunks;
    pool_run(run_tiles, &job, (tiles + job.per_task - 1) / job.per_task, nthreads);
    free(scratch);
    return 0;
}

/* block_matmul_strided with y (M, N) contiguous. */
int block_matmul_f32(const float *x, int64_t M, int64_t K, int64_t x_stride, const uint8_t *packed,
                     const float *scale, int bits, int64_t N, float *y, int nthreads) {
    return block_matmul_strided(x, M, K, x_stride, packed, scale, bits, N, y, N, nthreads);
}
