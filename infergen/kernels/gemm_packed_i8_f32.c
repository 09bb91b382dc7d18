/* Y[m, n] = sum_k X[m, k] * (q[n, k] * scale[n]) (+ bias[n]): int8 weights with one fp32 scale
 * per output channel (weight-only W8A32), fp32 activations.
 *
 * Packed layout (ops/linear_int8.py): the 24-column panels of gemm_packed_f32.c in int8,
 * each followed by its 24 fp32 scales: panel p is (K + 4) rows of 24 bytes, rows 0..K-1 the
 * codes Wp[p][k][j] = q[24p + j, k], rows K..K+3 the scales (96 bytes). One byte per weight is
 * read from memory instead of four.
 *
 * Every weight is used as q · scale, rounded to fp32 — the value formats.dequantize gives —
 * and then accumulated exactly as gemm_packed_f32 accumulates fp32 weights, so the product
 * equals gemm_packed_f32 on the dequantized weight bit for bit whatever the token count:
 * the first 4 tokens convert in registers (decode: the weight streams once); with more, that
 * pass also keeps the dequantized panel in an L2 buffer for the fp32 micro-kernels.
 */
#include <stdint.h>
#include <stdlib.h>

#include "gemm_packed_f32.c"

static inline const float *panel_scales(const int8_t *wp, long K) {
    return (const float *)(wp + K * NR);
}

#ifdef __AVX2__
/* 8 int8 weights → fp32, times their scales */
static inline __m256 dequant8(const int8_t *p, __m256 s) {
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
}

#define MICRO_I8(MR)                                                                           \
    static void micro_i8_##MR(const int8_t *wp, const float *X, long K, float *Y, long ldy,    \
                              const float *bias, int cols, float *keep) {                      \
        const int mr = MR;                                                                     \
        const float *sc = panel_scales(wp, K);                                                 \
        const __m256 s0 = _mm256_loadu_ps(sc), s1 = _mm256_loadu_ps(sc + 8),                   \
                     s2 = _mm256_loadu_ps(sc + 16);                                            \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,          \
               c12 = c00, c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;    \
        for (long k = 0; k < K; ++k) {                                                         \
            __m256 w0 = dequant8(wp + k * NR, s0);                                             \
            __m256 w1 = dequant8(wp + k * NR + 8, s1);                                         \
            __m256 w2 = dequant8(wp + k * NR + 16, s2);                                        \
            if (keep) { /* the dequantized panel, for the next token blocks */               \
                _mm256_storeu_ps(keep + k * NR, w0);                                           \
                _mm256_storeu_ps(keep + k * NR + 8, w1);                                       \
                _mm256_storeu_ps(keep + k * NR + 16, w2);                                      \
            }                                                                                  \
            ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3)                                        \
        }                                                                                      \
        ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3)                                    \
    }
#else
#define MICRO_I8(MR)                                                                           \
    static void micro_i8_##MR(const int8_t *wp, const float *X, long K, float *Y, long ldy,    \
                              const float *bias, int cols, float *keep) {                      \
        const float *sc = panel_scales(wp, K);                                                 \
        if (keep)                                                                              \
            for (long k = 0; k < K; ++k)                                                       \
                for (int j = 0; j < NR; ++j) keep[k * NR + j] = (float)wp[k * NR + j] * sc[j]; \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < cols; ++j) {                                                   \
                float s = 0.0f;                                                                \
                for (long k = 0; k < K; ++k) s += X[r * K + k] * ((float)wp[k * NR + j] * sc[j]); \
                Y[r * ldy + j] = s + (bias ? bias[j] : 0.0f);                                  \
            }                                                                                  \
    }
#endif

MICRO_I8(1)
MICRO_I8(2)
MICRO_I8(3)
MICRO_I8(4)

typedef void (*micro_i8_fn)(const int8_t *, const float *, long, float *, long, const float *,
                            int, float *);
static const micro_i8_fn MICROS_I8[5] = {0, micro_i8_1, micro_i8_2, micro_i8_3, micro_i8_4};

/* Wp: ceil(N/24) panels as above; X [M][K], Y [M][N]. */
void gemm_packed_i8_f32(const int8_t *Wp, const float *X, const float *bias, float *Y, long M,
                        long N, long K, int num_threads) {
    long panels = (N + NR - 1) / NR;
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        float *buf = M > 4 ? malloc(sizeof(float) * (size_t)(K * NR)) : 0;
#pragma omp for schedule(static)
        for (long p = 0; p < panels; ++p) {
            const int8_t *wp = Wp + p * (K + 4) * NR;
            long n0 = p * NR;
            int cols = (int)(N - n0 < NR ? N - n0 : NR);
            const float *b = bias ? bias + n0 : 0;
            /* the first 4 tokens convert in registers (a decode step streams the weight once);
             * with more, that pass also keeps the dequantized panel in an L2 buffer and the
             * other token blocks run the fp32 micro-kernels over it */
            MICROS_I8[M < 4 ? M : 4](wp, X, K, Y + n0, N, b, cols, buf);
            for (long m = 4; m < M; m += 4)
                MICROS[M - m < 4 ? M - m : 4](buf, X + m * K, K, Y + m * N + n0, N, b, cols, 0, 0);
        }
        free(buf);
    }
}
