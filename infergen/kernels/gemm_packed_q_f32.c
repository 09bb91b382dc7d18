/* Y[m, n] = sum_k X[m, k] * (decode(q[n, k]) * scale[n]) (+ bias[n]): one-byte weight codes
 * with one fp32 scale per output channel (weight-only, fp32 activations), one kernel per code
 * format: gemm_packed_i8_f32 (int8) and gemm_packed_e4m3_f32 (FP8 E4M3FN).
 *
 * Packed layout (ops/linear_quantized.py): the 24-column panels of gemm_packed_f32.c with a
 * byte per weight, each followed by its 24 fp32 scales: panel p is (K + 4) rows of 24 bytes,
 * rows 0..K-1 the codes Wp[p][k][j] = q[24p + j, k], rows K..K+3 the scales (96 bytes). One
 * byte per weight is read from memory instead of four.
 *
 * Every weight is used as decode(q) · scale, rounded to fp32 — the value formats.dequantize
 * gives — and accumulated exactly as gemm_packed_f32 accumulates fp32 weights, so the product
 * equals gemm_packed_f32 on the dequantized weight bit for bit whatever the token count: the
 * first 4 tokens decode in registers (decode steps: the weight streams once); with more, that
 * pass also keeps the dequantized panel in an L2 buffer for the fp32 micro-kernels.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "gemm_packed_f32.c"

static inline const float *panel_scales(const uint8_t *wp, long K) {
    return (const float *)(wp + K * NR);
}

/* One code → its fp32 value (scalar paths). */
static inline float decode_i8(uint8_t c) { return (float)(int8_t)c; }

/* what a format's AVX2 decode leaves to multiply into the scale (exact powers of two) */
#define SCALE_i8 1.0f
#define SCALE_e4m3 256.0f

#ifdef __AVX2__
/* 8 codes → their fp32 values (exact), times their scales */
static inline __m256 dequant8_i8(const uint8_t *p, __m256 s) {
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
}

/* (value · 2^-8) · (2^8 · s) rounds once, to value · s: the scale vector of an FP8 panel is
 * premultiplied by 256 (exact) in MICRO_Q's setup. */
static inline __m256 dequant8_e4m3(const uint8_t *p, __m256 s256) {
    return _mm256_mul_ps(e4m3x8_times_2m8(p), s256);
}

#define MICRO_Q(FMT, MR)                                                                       \
    static void micro_##FMT##_##MR(const uint8_t *wp, const float *X, long K, float *Y,       \
                                   long ldy, const float *bias, int cols, float *keep) {       \
        const int mr = MR;                                                                     \
        const float *sc = panel_scales(wp, K);                                                 \
        const __m256 f = _mm256_set1_ps(SCALE_##FMT);                                          \
        const __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(sc), f),                               \
                     s1 = _mm256_mul_ps(_mm256_loadu_ps(sc + 8), f),                           \
                     s2 = _mm256_mul_ps(_mm256_loadu_ps(sc + 16), f);                          \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,          \
               c12 = c00, c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;    \
        for (long k = 0; k < K; ++k) {                                                         \
            if ((k & 7) == 0) { /* 192 bytes every 8 rows: three lines */                      \
                STREAM_PREFETCH(wp + k * NR);                                                  \
                STREAM_PREFETCH(wp + k * NR + 64);                                             \
                STREAM_PREFETCH(wp + k * NR + 128);                                            \
            }                                                                                  \
            __m256 w0 = dequant8_##FMT(wp + k * NR, s0);                                       \
            __m256 w1 = dequant8_##FMT(wp + k * NR + 8, s1);                                   \
            __m256 w2 = dequant8_##FMT(wp + k * NR + 16, s2);                                  \
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
#define MICRO_Q(FMT, MR)                                                                       \
    static void micro_##FMT##_##MR(const uint8_t *wp, const float *X, long K, float *Y,       \
                                   long ldy, const float *bias, int cols, float *keep) {       \
        const float *sc = panel_scales(wp, K);                                                 \
        float w[NR];                                                                           \
        float acc[4][NR]; /* bias first, then k in order: as gemm_packed_f32's scalar path */ \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < NR; ++j) acc[r][j] = bias && j < cols ? bias[j] : 0.0f;        \
        for (long k = 0; k < K; ++k) {                                                         \
            for (int j = 0; j < NR; ++j) w[j] = decode_##FMT(wp[k * NR + j]) * sc[j];          \
            if (keep) memcpy(keep + k * NR, w, sizeof w);                                      \
            for (int r = 0; r < MR; ++r)                                                       \
                for (int j = 0; j < NR; ++j) acc[r][j] += X[r * K + k] * w[j];                 \
        }                                                                                      \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < cols; ++j) Y[r * ldy + j] = acc[r][j];                          \
    }
#endif

typedef void (*micro_q_fn)(const uint8_t *, const float *, long, float *, long, const float *,
                           int, float *);

/* gemm_packed_<FMT>_f32(Wp, X, bias, Y, M, N, K, threads): Wp the panels above, X [M][K],
 * Y [M][N]. */
#define GEMM_PACKED_Q(FMT)                                                                     \
    MICRO_Q(FMT, 1)                                                                            \
    MICRO_Q(FMT, 2)                                                                            \
    MICRO_Q(FMT, 3)                                                                            \
    MICRO_Q(FMT, 4)                                                                            \
    static const micro_q_fn MICROS_##FMT[5] = {0, micro_##FMT##_1, micro_##FMT##_2,           \
                                               micro_##FMT##_3, micro_##FMT##_4};             \
    void gemm_packed_##FMT##_f32(const uint8_t *Wp, const float *X, const float *bias,        \
                                 float *Y, long M, long N, long K, int num_threads) {         \
        if (M <= 0 || N <= 0) return;                                                          \
        long panels = (N + NR - 1) / NR;                                                       \
        _Pragma("omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)") \
        {                                                                                      \
            flush_denormals();                                                                 \
            float *buf = M > 4 ? malloc(sizeof(float) * (size_t)(K * NR)) : 0;                \
            _Pragma("omp for schedule(static)")                                                \
            for (long p = 0; p < panels; ++p) {                                                \
                const uint8_t *wp = Wp + p * (K + 4) * NR;                                     \
                long n0 = p * NR;                                                              \
                int cols = (int)(N - n0 < NR ? N - n0 : NR);                                   \
                const float *b = bias ? bias + n0 : 0;                                         \
                MICROS_##FMT[M < 4 ? M : 4](wp, X, K, Y + n0, N, b, cols, buf);                \
                for (long m = 4; m < M; m += 4)                                                \
                    MICROS[M - m < 4 ? M - m : 4](buf, X + m * K, K, Y + m * N + n0, N, b,    \
                                                  cols, 0, 0);                                 \
            }                                                                                  \
            free(buf);                                                                         \
        }                                                                                      \
    }

/* A code's value as formats.dequantize (torch) decodes it, NaN codes included (E4M3FN's
 * 0x7F / 0xFF; the products' decoders read them as numbers: the load check rejects such
 * weights first, QuantWeight.nonfinite). */
static inline float value_i8(uint8_t c) { return decode_i8(c); }
static inline float value_e4m3(uint8_t c) { return (c & 0x7F) == 0x7F ? NAN : decode_e4m3(c); }

/* rows_packed_<FMT>(Wp, K, N, ids, n, out): rows ids[0..n) of the [N, K] weight, dequantized
 * (decode(q) · scale, the values the products use) into out [n][K] — a tied LM head's
 * embedding lookup, one call instead of a handful of small tensor ops per step. Returns -1, or
 * the index of the first id outside [0, N) (nothing written from it on). */
#define ROWS_PACKED_Q(FMT)                                                                     \
    long rows_packed_##FMT(const uint8_t *Wp, long K, long N, const int64_t *ids, long n,      \
                           float *out) {                                                       \
        for (long i = 0; i < n; ++i) {                                                         \
            if (ids[i] < 0 || ids[i] >= N) return i;                                           \
            const uint8_t *wp = Wp + ids[i] / NR * (K + 4) * NR;                               \
            const long j = ids[i] % NR;                                                        \
            const float s = panel_scales(wp, K)[j];                                            \
            for (long k = 0; k < K; ++k) out[i * K + k] = value_##FMT(wp[k * NR + j]) * s;     \
        }                                                                                      \
        return -1;                                                                             \
    }

GEMM_PACKED_Q(i8)
GEMM_PACKED_Q(e4m3)
ROWS_PACKED_Q(i8)
ROWS_PACKED_Q(e4m3)
