/* The "token" rule of ops/quantize_activation.py for int8, in the same fp32 operations: a
 * token's scale is amax / 127 (1 for a zero row), its codes round(x / scale) (ties to even)
 * clamped to ±127. Shared by the integer-product kernels (gemm_w8a8_i8.c, gemm_w4a8_i8.c). */
#pragma once
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

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

/* the K values at x as bytes code + offset (mod 256): 16 at a time with AVX-512 (the same
 * division, nearest-even rounding and clamp), the rest one by one */
static inline void int8_token_codes(const float *x, long K, float s, int offset, uint8_t *out) {
    long k = 0;
#ifdef __AVX512F__
    const __m512 vs = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    const __m512i off = _mm512_set1_epi32(offset);
    for (; k + 16 <= K; k += 16) {
        __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + k), vs),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
        __m512i c = _mm512_add_epi32(_mm512_cvtps_epi32(q), off);
        _mm_storeu_si128((__m128i *)(out + k), _mm512_cvtepi32_epi8(c));
    }
#endif
    for (; k < K; ++k) out[k] = (uint8_t)(int8_token_code(x[k], s) + offset);
}
