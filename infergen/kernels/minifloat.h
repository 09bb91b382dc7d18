/* Minifloat encode (round to nearest even, saturating; formats/elements.py), shared by the
 * quantize fast path (quantize_f32.c) and the FP8 KV cache store (decode_layers_f32.c):
 *   e = max(floor(log2 a), emin); m = rint(a / 2^(e - mbits))  (an integer, RNE)
 *   code = ((e - emin) << mbits) + m, capped at max_code; sign bit on top.
 * This single formula covers subnormals (e = emin, m < 2^mbits) and the carry into the next
 * binade (m = 2^(mbits+1)), because the codes of a sign-magnitude minifloat are its values in
 * increasing order. NaN → nan_code (or 0 where the type has none); ±Inf → ±max.
 */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

typedef struct {
    int mbits, emin, bits, max_code, nan_code; /* nan_code < 0: the type has no NaN */
    float max;
} elem_t;

static inline float pow2f(int e) { /* 2^e for -126 <= e <= 127 (a normal float) */
    uint32_t b = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static inline uint8_t encode(float v, const elem_t *t) {
    /* branch-free (selects only), so that GCC vectorises the loops that call it */
    uint32_t bits;
    memcpy(&bits, &v, 4);
    int sign = (int)(bits >> 31) << (t->bits - 1);
    int is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    float a = fabsf(v);
    a = a < t->max ? a : t->max; /* NaN → max here; replaced below */
    uint32_t abits;
    memcpy(&abits, &a, 4);
    int e = (int)(abits >> 23) - 127; /* floor(log2 a) for normal a; fp32 subnormals and 0 are
                                         far below emin and clamp to it (then round to 0) */
    e = e < t->emin ? t->emin : e;
    float m = rintf(a * pow2f(t->mbits - e));
    int code = ((e - t->emin) << t->mbits) + (int)m;
    code = code > t->max_code ? t->max_code : code;
    int nan = t->nan_code >= 0 ? (sign | t->nan_code) : 0;
    return (uint8_t)(is_nan ? nan : (sign | code));
}

#ifdef __AVX2__
/* encode() on 8 lanes: the same integer and float operations (cvtps rounds to nearest even
 * under the default MXCSR rounding mode, as rintf does), so bit-identical to the scalar. */
static inline __m256i encode8(__m256 v, const elem_t *t) {
    __m256i bits = _mm256_castps_si256(v);
    __m256i sign = _mm256_sll_epi32(_mm256_srli_epi32(bits, 31), _mm_cvtsi32_si128(t->bits - 1));
    __m256i absbits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i is_nan = _mm256_cmpgt_epi32(absbits, _mm256_set1_epi32(0x7F800000));
    /* min_ps returns its second operand when the first is NaN: NaN → max, replaced below */
    __m256 a = _mm256_min_ps(_mm256_castsi256_ps(absbits), _mm256_set1_ps(t->max));
    __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 23),
                                 _mm256_set1_epi32(127));
    e = _mm256_max_epi32(e, _mm256_set1_epi32(t->emin));
    __m256 quantum_inv = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(t->mbits + 127), e), 23));
    __m256i m = _mm256_cvtps_epi32(_mm256_mul_ps(a, quantum_inv));
    __m256i code = _mm256_add_epi32(
        _mm256_sll_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(t->emin)),
                         _mm_cvtsi32_si128(t->mbits)),
        m);
    code = _mm256_or_si256(_mm256_min_epi32(code, _mm256_set1_epi32(t->max_code)), sign);
    __m256i nan = t->nan_code >= 0 ? _mm256_or_si256(sign, _mm256_set1_epi32(t->nan_code))
                                   : _mm256_setzero_si256();
    return _mm256_blendv_epi8(code, nan, is_nan);
}

/* The low byte of each of 8 int32 lanes → 8 consecutive bytes. */
static inline void store8_u8(uint8_t *dst, __m256i codes) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    __m256i p = _mm256_shuffle_epi8(codes, pick);
    __m128i lo = _mm256_castsi256_si128(p), hi = _mm256_extracti128_si256(p, 1);
    _mm_storel_epi64((__m128i *)dst, _mm_unpacklo_epi32(lo, hi));
}
#endif

