/* 16-float vectors (GCC/Clang vector extensions, lowered to whatever the CPU has) and their sum in a
 * fixed order: the kernels' reductions give the same bits whichever thread or call runs them. */
#ifndef WARPDECODE_VEC_H
#define WARPDECODE_VEC_H

#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float v16 __attribute__((vector_size(LANES * sizeof(float))));

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 lanes summed in a fixed pairwise order: lane i += lane i + 8, then i + 4, i + 2, i + 1. */
typedef int32_t i16v __attribute__((vector_size(LANES * sizeof(int32_t))));
static inline float reduce16(v16 a) {
    a += __builtin_shuffle(a, (i16v){8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
    a += __builtin_shuffle(a, (i16v){4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
    a += __builtin_shuffle(a, (i16v){2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
    a += __builtin_shuffle(a, (i16v){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    return a[0];
}

#endif
