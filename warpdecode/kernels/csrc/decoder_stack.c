/* A run of decoder layers (Llama / Qwen2: RMSNorm, rotary attention with grouped KV heads, SwiGLU)
 * of a block-quantised or float32 target in one call: the decode and verify steps of `decoder_stack.py`.
 *
 * Per layer, for the call's R = B * T query rows:
 *   h = rmsnorm(x) * attn_norm;  q, k, v = h W_qkv (+ bias);  rotate q and k;  k, v -> cache slots;
 *   a = exact attention of every query over its visible slots;  x += a W_o (+ bias);
 *   h = rmsnorm(x) * mlp_norm;  g, u = h W_gate_up (+ bias);  x += (silu(g) * u) W_down (+ bias).
 * The matmuls are block_matmul.c's (block weights) or dense_matmul.c's (float32 weights), the
 * attention exact_attention.c's, each parallel over its tasks; the element-wise steps are small
 * (R x C) and run on the calling thread. Every step treats a row alone in a fixed order (norm sums
 * over 16 lanes reduced by reduce16; the rotation and SiLU per element, SiLU's exp the branch-free
 * polynomial of vec.h), so a row's result does not depend on the other rows of the call or on the
 * thread count: a verified token computes the same bits as a one-token step after the same tokens.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

/* One weight: block-quantised (`kernels/quantized.py` BlockInt4Weight / BlockInt8Weight, bits 4 or 8)
 * or dense float32 (bits 32: a Linear's (out, in) row-major weight, read in place). out == 0: absent. */
typedef struct {
    const void *w;
    const float *scale; /* int8: (out padded to 16,) channel scales; else NULL */
    const float *bias;  /* (out,) or NULL */
    int64_t bits, out, width; /* width: the inputs (padded to a multiple of 32 for block weights) */
} matrix_t;

/* One layer: every field 8 bytes (decoder_stack.py fills an int64 table of this layout). q, k, v write
 * consecutive columns of one output (a stacked q/k/v weight is `q`, with k and v absent), as do gate
 * and up. */
typedef struct {
    const float *attn_norm, *mlp_norm; /* (C,) */
    matrix_t q, k, v, o, gate, up, down;
} layer_t;

/* out[r, 0..C) = x[r] / sqrt(mean(x[r]^2) + eps) * w, the mean over 16 lane sums in a fixed order;
 * out rows `out_stride` floats apart (their padding past C stays as it is). */
static void rms_norm(const float *x, int64_t R, int64_t C, const float *w, float eps, float *out,
                     int64_t out_stride) {
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C;
        v16 acc = {0};
        int64_t i = 0;
        for (; i + LANES <= C; i += LANES) {
            const v16 v = load16(xr + i);
            acc += v * v;
        }
        for (int l = 0; i < C; i++, l++) acc[l] += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(reduce16(acc) / (float)C + eps);
        float *o = out + r * out_stride;
        for (i = 0; i < C; i++) o[i] = (xr[i] * inv) * w[i];
    }
}

/* y[r, 0..m->out) (+ bias) = h[r] W for R rows: h rows `h_stride` floats apart, y rows `y_stride`. */
static int matmul(const matrix_t *m, const float *h, int64_t h_stride, int64_t R, float *y, int64_t y_stride,
                  int threads) {
    if (m->out == 0) return 0;
    if (m->bits == 32)
        dense_matmul_f32(h, R, m->width, h_stride, m->w, m->out, y, y_stride, threads);
    else if (block_matmul_strided(h, R, m->width, h_stride, m->w, m->scale, (int)m->bits, m->out, y, y_stride,
                                  threads))
        return 1;
    if (m->bias)
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < m->out; j++) y[r * y_stride + j] += m->bias[j];
    return 0;
}

/* v[0..D) rotated by the position's angles: v * cos + rotate_half(v) * sin, rotate_half(v) =
 * (-v[D/2..D), v[0..D/2)) (the same two products and sum as the PyTorch layers). */
static void rotate(float *v, const float *cos, const float *sin, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] + (-b) * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* x (B*T, C) float32, updated in place by layers[0 .. n_layers). Rows are (b, t): row b's token t
 * sits at position slot start[b] + t of cache row b. cos, sin: (B*T, D) rotary tables.
 * k_cache, v_cache: element (layer, b, g, s, d) at base + layer*kv_sl + b*kv_sb + g*kv_sh + s*kv_ss + d,
 * layer 0 being layers[0]'s. prefix / extra_off / extra: each query's visible slots (exact_attention.c).
 * keep: NULL (every row), or the n_keep ascending rows (b * T + t) to compute: the others are padding
 * of a batch's ragged trees, whose rows of x stay as they were and whose cache slots are not written
 * (give them no visible slots: their attention is then skipped). A kept row's bits are the same either
 * way. Returns 0, or 1 when scratch memory could not be allocated. */
int decoder_stack_f32(const layer_t *layers, int64_t n_layers, float *x, int64_t B, int64_t T, int64_t C,
                      int64_t H, int64_t Hkv, int64_t D, float eps, const float *cos, const float *sin,
                      float *k_cache, float *v_cache, int64_t kv_sl, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                      const int64_t *start, const int32_t *prefix, const int32_t *extra_off, const int32_t *extra,
                      const int64_t *keep, int64_t n_keep, int threads) {
    const int64_t R = keep ? n_keep : B * T, Q = H * D, KV = Hkv * D;
    /* every layer has the first's shapes (checked by decoder_stack.py) */
    const layer_t *L0 = layers;
    const int64_t in_width = L0->q.width, out_width = L0->o.width, mid_width = L0->down.width;
    const int64_t n_qkv = Q + 2 * KV, F = (L0->gate.out + L0->up.out) / 2;
    const int64_t y_width = n_qkv > 2 * F ? n_qkv : 2 * F;
    /* h: normed rows (padded inputs zero); a: attention rows; m: SwiGLU rows; y: a product */
    /* with `keep`: the kept rows of x, and the attention's queries and outputs at their (b, t) places */
    const int64_t padded = keep ? B * T * (n_qkv + out_width) + R * C : 0;
    const int64_t floats = R * (in_width + out_width + mid_width + (y_width > C ? y_width : C)) + padded;
    float *scratch = calloc((size_t)(floats > 0 ? floats : 1), sizeof(float));
    if (!scratch) return 1;
    float *h = scratch, *a = h + R * in_width, *m = a + R * out_width, *y = m + R * mid_width;
    float *q_at = y + R * (y_width > C ? y_width : C), *a_at = q_at + B * T * n_qkv, *kept = a_at + B * T * out_width;
    float *const x_out = x;
    if (keep) {
        for (int64_t i = 0; i < R; i++) memcpy(kept + i * C, x + keep[i] * C, sizeof(float) * (size_t)C);
        x = kept;
    }
    const float scale = 1.0f / sqrtf((float)D);
    int failed = 0;
    for (int64_t l = 0; l < n_layers && !failed; l++) {
        const layer_t *L = layers + l;
        float *kl = k_cache + l * kv_sl, *vl = v_cache + l * kv_sl;
        rms_norm(x, R, C, L->attn_norm, eps, h, in_width);
        if ((failed = matmul(&L->q, h, in_width, R, y, n_qkv, threads) ||
                      matmul(&L->k, h, in_width, R, y + L->q.out, n_qkv, threads) ||
                      matmul(&L->v, h, in_width, R, y + L->q.out + L->k.out, n_qkv, threads)))
            break;
        for (int64_t i = 0; i < R; i++) {
            float *row = y + i * n_qkv;
            const int64_t r = keep ? keep[i] : i, b = r / T, slot = start[b] + r % T;
            for (int64_t hd = 0; hd < H + Hkv; hd++) rotate(row + hd * D, cos + r * D, sin + r * D, D);
            for (int64_t g = 0; g < Hkv; g++) {
                memcpy(kl + b * kv_sb + g * kv_sh + slot * kv_ss, row + Q + g * D, sizeof(float) * (size_t)D);
                memcpy(vl + b * kv_sb + g * kv_sh + slot * kv_ss, row + Q + KV + g * D, sizeof(float) * (size_t)D);
            }
            if (keep) memcpy(q_at + r * n_qkv, row, sizeof(float) * (size_t)Q);
        }
        if ((failed = exact_attention_strided(keep ? q_at : y, T * n_qkv, D, n_qkv, kl, vl, kv_sb, kv_sh, kv_ss,
                                              keep ? a_at : a, T * out_width, D, out_width, B, H, Hkv, T, D, prefix,
                                              extra_off, extra, scale, threads)))
            break;
        if (keep)
            for (int64_t i = 0; i < R; i++) memcpy(a + i * out_width, a_at + keep[i] * out_width, sizeof(float) * (size_t)out_width);
        if ((failed = matmul(&L->o, a, out_width, R, y, C, threads))) break;
        for (int64_t i = 0; i < R * C; i++) x[i] += y[i];
        rms_norm(x, R, C, L->mlp_norm, eps, h, in_width);
        if ((failed = matmul(&L->gate, h, in_width, R, y, 2 * F, threads) ||
                      matmul(&L->up, h, in_width, R, y + L->gate.out, 2 * F, threads)))
            break;
        for (int64_t r = 0; r < R; r++) {
            const float *g = y + r * 2 * F, *u = g + F;
            float *mr = m + r * mid_width;
            for (int64_t i = 0; i < F; i++) { /* silu(g) = g * sigmoid(g), the exp of -|g| <= 0 */
                const float e = exp_nonpositive(-fabsf(g[i])), sig = (g[i] >= 0.0f ? 1.0f : e) / (1.0f + e);
                mr[i] = g[i] * sig * u[i];
            }
        }
        if ((failed = matmul(&L->down, m, mid_width, R, y, C, threads))) break;
        for (int64_t i = 0; i < R * C; i++) x[i] += y[i];
    }
    if (keep)
        for (int64_t i = 0; i < R; i++) memcpy(x_out + keep[i] * C, kept + i * C, sizeof(float) * (size_t)C);
    free(scratch);
    return failed;
}
