/* FP8 E4M3FN codes → fp32 (exact), shared by the FP8 weight and KV cache kernels. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "common.h"

/* One code (scalar paths). E4M3FN: bias 7, subnormals below 2^-6. */
static inline float decode_e4m3(uint8_t c) {
    int e = (c >> 3) & 0xF, m = c & 7;
    float v = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf((float)m, -9);
    return (c & 0x80) ? -v : v;
}

#ifdef __AVX2__
/* 8 codes → their values · 2^-8, exactly, through fp16: a sign-extended code shifted left by 7
 * puts the sign in bit 15 (and a copy in bit 14, cleared) and eeee mmm in bits 13..7 — the
 * fp16 whose exponent field is 0eeee and mantissa mmm0000000, i.e. the E4M3 value times
 * 2^(7-15) for normal and subnormal codes alike. Three integer operations and one F16C
 * conversion for eight codes; multiply by 256 · scale for the scaled value (one rounding). */
static inline __m256 e4m3x8_times_2m8(const uint8_t *p) {
    __m128i c = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i h = _mm_and_si128(_mm_slli_epi16(c, 7), _mm_set1_epi16((short)0xBF80));
    return _mm256_cvtph_ps(h);
}
#endif
