/* fp16 bits → fp32, shared by the group-quantized weight kernels (GGUF scales are fp16). */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

/* fp16 bits → fp32 (scalar paths; exact, subnormals included). */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), (int)e - 25);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits |= sign;
    memcpy(&v, &bits, 4);
    return v;
}

/* n fp16 values → fp32 (n a multiple of 8 with F16C: 8 a conversion) */
static inline void halves_to_floats(const uint16_t *h, float *out, int n) {
#ifdef __F16C__
    for (int i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#else
    for (int i = 0; i < n; ++i) out[i] = half_to_float(h[i]);
#endif
}
