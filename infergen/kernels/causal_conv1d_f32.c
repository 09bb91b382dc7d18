/* Short causal depthwise convolution over a packed varlen batch (ops/causal_conv1d.py), one
 * (sequence, block of channels) per work item; channels are the vector lanes:
 *
 *     y[t, c] = act(bias[c] + Σ_{j<W} w[c, j] · ext[t + j, c])
 *
 * where ext is the sequence's W-1 previous inputs (its state slot, zeros when fresh) followed
 * by its tokens; the slot then keeps the last W-1 rows of ext.
 *
 * x [T, Cn] with a token stride of x_stride floats; w [Cn, W]; bias [Cn] or NULL;
 * state [slots, Cn, W-1]; starts [S + 1]; slots [S] (distinct); fresh [S]; y [T, Cn]
 * contiguous; silu: 1 applies y / (1 + e^-y). */
#include "common.h"

#define BLOCK 64 /* channels per work item */
#define MAX_WIDTH 8

static void conv_block(const float *x, long x_stride, const float *w, const float *bias,
                       float *st, int fresh, float *y, long Cn, long W, int silu, long c0,
                       long nc, long t0, long t1) {
    const long hist = W - 1, len = t1 - t0;
    float wt[MAX_WIDTH][BLOCK], prev[MAX_WIDTH][BLOCK], acc[BLOCK], e[BLOCK];
    for (long j = 0; j < W; ++j)
        for (long c = 0; c < nc; ++c) wt[j][c] = w[(c0 + c) * W + j];
    for (long k = 0; k < hist; ++k) /* prev[k]: the slot's column k, oldest first */
        for (long c = 0; c < nc; ++c) prev[k][c] = fresh ? 0.0f : st[(c0 + c) * hist + k];
    for (long i = 0; i < len; ++i) {
        for (long c = 0; c < nc; ++c) acc[c] = bias ? bias[c0 + c] : 0.0f;
        for (long j = 0; j < W; ++j) {
            const long src = i - hist + j; /* row of ext relative to the first token */
            const float *v = src >= 0 ? x + (t0 + src) * x_stride + c0 : prev[hist + src];
#pragma omp simd
            for (long c = 0; c < nc; ++c) acc[c] += wt[j][c] * v[c];
        }
        float *yt = y + (t0 + i) * Cn + c0;
        if (silu) {
            for (long c = 0; c < nc; ++c) e[c] = -acc[c];
            exp_array(e, e, nc);
            for (long c = 0; c < nc; ++c) yt[c] = acc[c] / (1.0f + e[c]);
        } else {
            for (long c = 0; c < nc; ++c) yt[c] = acc[c];
        }
    }
    for (long k = 0; k < hist; ++k) { /* the new state: the last hist rows of ext */
        const long src = len - hist + k;
        const float *v = src >= 0 ? x + (t0 + src) * x_stride + c0 : prev[hist + src];
        for (long c = 0; c < nc; ++c) st[(c0 + c) * hist + k] = v[c];
    }
}

/* The caller checks 1 ≤ W ≤ MAX_WIDTH. */
void causal_conv1d_f32(const float *x, long x_stride, const float *w, const float *bias,
                      float *state, const long *starts, const long *slots,
                      const unsigned char *fresh, float *y, long S, long Cn, long W, int silu,
                      int num_threads) {
    const long blocks = (Cn + BLOCK - 1) / BLOCK;
#pragma omp parallel num_threads(num_threads) if (starts[S] * Cn * W >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for collapse(2) schedule(static, 1)
        for (long s = 0; s < S; ++s) {
            for (long b = 0; b < blocks; ++b) {
                const long c0 = b * BLOCK, nc = Cn - c0 < BLOCK ? Cn - c0 : BLOCK;
                conv_block(x, x_stride, w, bias, state + slots[s] * Cn * (W - 1), fresh[s], y,
                           Cn, W, silu, c0, nc, starts[s], starts[s + 1]);
            }
        }
    }
}
