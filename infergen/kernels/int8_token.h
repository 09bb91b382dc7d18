/* The "token" rule of ops/quantize_activation.py for int8, in the same fp32 operations: a
 * token's scale is amax / 127 (1 for a zero row), its codes round(x / scale) (ties to even)
 * clamped to ±127. Shared by the integer-product kernels (gemm_w8a8_i8.c, gemm_w4a8_i8.c). */
#pragma once
#include <math.h>

/* the scale of the K values at x */
static inline float int8_token_scale(const float *x, long K) {
    float amax = 0.0f;
    for (long k = 0; k < K; ++k) { /* (a compare, not fmaxf: it vectorizes) */
        float v = fabsf(x[k]);
        amax = v > amax ? v : amax;
    }
    float s = amax / 127.0f;
    return s > 0.0f ? s : 1.0f;
}

/* one value's code under scale s */
static inline int int8_token_code(float x, float s) {
    float q = nearbyintf(x / s);
    return (int)(q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q));
}
