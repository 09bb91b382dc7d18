/* bf16 products on AMX tiles: what gemm_bf16.c and the generated GEMM-with-tail kernels
 * (gemm_epilogue_bf16.h) share — the rounding to bf16, the tokens' tiled layout (amx.h) and
 * the sizes. AMX_BF16 is defined where the build has AMX-BF16 tiles (and AVX-512 BF16). */
#pragma once
#include <stdint.h>
#include <string.h>

#include "common.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) &&                \
    defined(__AVX512VL__)
#define AMX_BF16 1
#include "amx.h"
#ifndef BF16_AMX_MIN_TOKENS /* products of this many tokens or more run on tiles */
#define BF16_AMX_MIN_TOKENS 5
#endif
#endif

/* fp32 → bf16 bits, round to nearest even (a NaN stays a quiet NaN) */
static inline uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef AMX_BF16
/* X [M][K] rounded to bf16 into Xb tile by tile (amx.h: 16 tokens x 32 inputs a KB; `steps`
 * k-steps a row), zeros past K and in the rows past M up to a whole tile. A `#pragma omp for`:
 * call it from inside the parallel region. (vcvtneps2bf16 rounds to nearest even too; it
 * flushes denormals, which every product here treats as zeros anyway.) */
static inline void amx_bf16_tokens(const float *X, long M, long K, long steps, uint16_t *Xb) {
    const long rows = (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
#pragma omp for schedule(static)
    for (long m = 0; m < rows; ++m)
        for (long s = 0; s < steps; ++s) {
            uint16_t *to = Xb + amx_tiled_offset(m, s * AMX_K_BYTES, steps) / 2;
            const long k0 = 32 * s;
            if (m < M && k0 + 32 <= K) {
                const float *x = X + m * K + k0;
                _mm256_storeu_si256((__m256i *)to, (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x)));
                _mm256_storeu_si256((__m256i *)(to + 16),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + 16)));
            } else
                for (long j = 0; j < 32; ++j)
                    to[j] = m < M && k0 + j < K ? to_bf16(X[m * K + k0 + j]) : 0;
        }
}
#endif
