/* W8A8 int8 with integer compute: Y[m, n] = (sum_k a[m, k] * q[n, k]) * sa[m] * sw[n] (+ bias[n])
 * with int8 weight codes q (one fp32 scale sw per output channel: the "int8" backend's panels,
 * ops/linear_quantized.py) and int8 activation codes a (one fp32 scale sa per token, quantized
 * here from fp32 X by ops/quantize_activation.py's "token" rule). The sum is exact in int32
 * and scaled once.
 *
 * With AVX-512 VNNI, activations are held as bytes a + 128 (u8), K padded to a multiple of 4
 * with zero codes; the byte products u8 x s8 are what vpdpbusd multiplies and adds four at a
 * time, and sum_k (a + 128) q = sum_k a q + 128 sum_k q, so each column's code sum times 128 is
 * subtracted before scaling. Without it, the bytes are the s8 codes (AVX2: vpmaddubsw on
 * |q| and a · sign q, then vpmaddwd; else a scalar loop).
 *
 * The weight panels hold 24 columns k-major (panel p: K rows of 24 codes, then 24 fp32 scales).
 * Each panel is regrouped once per call into a per-thread buffer of quads — for each 4 k, each
 * column's 4 codes side by side, as vpdpbusd reads them — with its column sums, then every
 * token block runs over it: 8 tokens x 24 columns a micro-step, one 512-bit (16 columns) and
 * one 256-bit (8 columns) accumulator a token (16 independent chains hide vpdpbusd's latency).
 *
 * Built with AVX-512 VNNI where the CPU has it (kernels/build.py; the regroup by AVX-512 VBMI's
 * byte permutes where it exists too, else SSE2 interleaves), else AVX2's byte multiplies, else
 * the portable scalar loop (INFERGEN_KERNEL_ISA=avx2 or generic forces those): the same int32
 * sums, so the same result.
 */
#ifndef GEMM_W8A8_I8_C
#define GEMM_W8A8_I8_C
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "int8_token.h"

#ifdef __SSE2__
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define W8A8_VNNI 1
#if defined(__AVX512VBMI__)
#define W8A8_VBMI 1 /* byte permutes across a 512-bit register pair: the regroup in two ops */
#endif
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define W8A8_AMX 1 /* AMX-INT8 tiles (amx.h) from W8_AMX_MIN_TOKENS tokens on */
#include "amx.h"
#ifndef W8_AMX_MIN_TOKENS
#define W8_AMX_MIN_TOKENS 5
#endif
#endif
#endif

#define NR 24 /* columns a panel (gemm_packed_f32.c's) */
#define W8_MR 8  /* tokens a micro-step */

#ifdef W8A8_VNNI
#define W8_A_OFFSET 128 /* vpdpbusd multiplies u8 by s8: activation bytes are code + 128 */
#else
#define W8_A_OFFSET 0 /* the activation bytes are the s8 codes themselves */
#endif

#ifdef W8A8_VBMI
/* byte i of a 4-column-quad group: row i % 4, column first + i / 4 of 4 rows of NR codes */
static __m512i w8_quad_index(int first) {
    uint8_t idx[64];
    for (int i = 0; i < 64; ++i) idx[i] = (uint8_t)((i % 4) * NR + first + i / 4);
    return _mm512_loadu_si512((const void *)idx);
}
#endif

/* panel (K rows of NR codes) -> quads[K4][NR][4] (zero-padded past K) and column sums */
static void w8_regroup(const uint8_t *wp, long K, long K4, int8_t *quads, int32_t *colsum) {
    long kq = 0, summed = 0; /* quads [0, summed) are in colsum already */
    int32_t sums[NR] = {0};
#if defined(W8A8_VBMI)
    /* the 96 bytes of 4 rows -> 24 columns of 4 in two byte permutes (vpermt2b), the column
     * sums by vpdpbusd with ones */
    const __m512i lo = w8_quad_index(0), hi = w8_quad_index(16), ones = _mm512_set1_epi8(1);
    __m512i s16 = _mm512_setzero_si512(), s8 = s16;
    for (; 4 * kq + 3 < K; ++kq) {
        const uint8_t *r = wp + 4 * kq * NR;
        __m512i a = _mm512_loadu_si512((const void *)r);
        __m512i b = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, r + 64); /* bytes 64..95 */
        __m512i q16 = _mm512_permutex2var_epi8(a, lo, b), q8 = _mm512_permutex2var_epi8(a, hi, b);
        int8_t *out = quads + kq * NR * 4;
        _mm512_storeu_si512((void *)out, q16);
        _mm256_storeu_si256((__m256i *)(out + 64), _mm512_castsi512_si256(q8));
        s16 = _mm512_dpbusd_epi32(s16, ones, q16);
        s8 = _mm512_dpbusd_epi32(s8, ones, q8);
    }
    _mm512_storeu_si512((void *)sums, s16);
    int32_t rest[16];
    _mm512_storeu_si512((void *)rest, s8);
    memcpy(sums + 16, rest, sizeof(int32_t) * 8);
    summed = kq;
#elif defined(__SSE2__)
    /* four rows of 24 codes -> 24 columns of 4: byte then 16-bit interleaves (SSE2) */
    for (; 4 * kq + 3 < K; ++kq) {
        const uint8_t *r = wp + 4 * kq * NR;
        __m128i a0 = _mm_loadu_si128((const __m128i *)r),
                a1 = _mm_loadu_si128((const __m128i *)(r + NR)),
                a2 = _mm_loadu_si128((const __m128i *)(r + 2 * NR)),
                a3 = _mm_loadu_si128((const __m128i *)(r + 3 * NR));
        __m128i p01l = _mm_unpacklo_epi8(a0, a1), p01h = _mm_unpackhi_epi8(a0, a1);
        __m128i p23l = _mm_unpacklo_epi8(a2, a3), p23h = _mm_unpackhi_epi8(a2, a3);
        __m128i *out = (__m128i *)(quads + kq * NR * 4);
        _mm_storeu_si128(out, _mm_unpacklo_epi16(p01l, p23l));     /* columns 0-3 */
        _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(p01l, p23l)); /* 4-7 */
        _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(p01h, p23h)); /* 8-11 */
        _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(p01h, p23h)); /* 12-15 */
        __m128i b0 = _mm_loadl_epi64((const __m128i *)(r + 16)),
                b1 = _mm_loadl_epi64((const __m128i *)(r + NR + 16)),
                b2 = _mm_loadl_epi64((const __m128i *)(r + 2 * NR + 16)),
                b3 = _mm_loadl_epi64((const __m128i *)(r + 3 * NR + 16));
        __m128i q01 = _mm_unpacklo_epi8(b0, b1), q23 = _mm_unpacklo_epi8(b2, b3);
        _mm_storeu_si128(out + 4, _mm_unpacklo_epi16(q01, q23)); /* 16-19 */
        _mm_storeu_si128(out + 5, _mm_unpackhi_epi16(q01, q23)); /* 20-23 */
    }
#endif
    for (long tail = kq; tail < K4; ++tail) /* (the rest, and the quad K does not fill: 0) */
        for (int j = 0; j < NR; ++j)
            for (int t = 0; t < 4; ++t) {
                long k = 4 * tail + t;
                quads[(tail * NR + j) * 4 + t] = k < K ? (int8_t)wp[k * NR + j] : 0;
            }
    for (long i = summed; i < K4; ++i) { /* (vectorizes: 4 codes a column a quad) */
        const int8_t *q = quads + i * NR * 4;
        for (int j = 0; j < NR; ++j)
            sums[j] += q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3];
    }
    memcpy(colsum, sums, sizeof sums);
}

/* the epilogue of rows [0, mr): exact sums (less W8_A_OFFSET x the column sums), scaled once */
static void w8_finish(int32_t acc[][NR], const int32_t *colsum, const float *sw, const float *sa,
                   const float *bias, float *Y, long ldy, int mr, int cols) {
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < cols; ++j) {
            float y = (float)(acc[r][j] - W8_A_OFFSET * colsum[j]) * sa[r] * sw[j];
            Y[r * ldy + j] = bias ? y + bias[j] : y;
        }
}

#ifdef W8A8_VNNI
/* one token row's dot products with a quad of 24 columns: a 512-bit and a 256-bit vpdpbusd */
#define W8_ROW_DOT(R)                                                                              \
    if (R < mrx) { /* the token's 4 bytes broadcast from memory (a load, no shuffle port) */       \
        __m512i a4 = _mm512_castps_si512(                                                          \
            _mm512_broadcastss_ps(_mm_load_ss((const float *)(A + R * 4 * K4 + 4 * kq))));         \
        c16_##R = _mm512_dpbusd_epi32(c16_##R, a4, w16);                                           \
        c8_##R = _mm256_dpbusd_epi32(c8_##R, _mm512_castsi512_si256(a4), w8);                      \
    }
#define W8_ROW_SAVE(R)                                                                             \
    if (R < mrx) {                                                                                 \
        _mm512_storeu_si512((void *)acc[R], c16_##R);                                              \
        _mm256_storeu_si256((__m256i *)(acc[R] + 16), c8_##R);                                     \
    }
/* rows [0, MRX) of one panel, the accumulators in registers (MRX a compile-time constant) */
#define W8_MICRO(MRX)                                                                              \
    static void w8_micro_##MRX(const int8_t *quads, const int32_t *colsum, const float *sw,        \
                            const uint8_t *A, long K4, const float *sa, const float *bias,         \
                            float *Y, long ldy, int cols) {                                        \
        const int mrx = MRX; /* (a constant: the unused rows' code is dropped) */                  \
        __m512i c16_0 = _mm512_setzero_si512(), c16_1 = c16_0, c16_2 = c16_0, c16_3 = c16_0;       \
        __m512i c16_4 = c16_0, c16_5 = c16_0, c16_6 = c16_0, c16_7 = c16_0;                        \
        __m256i c8_0 = _mm256_setzero_si256(), c8_1 = c8_0, c8_2 = c8_0, c8_3 = c8_0;              \
        __m256i c8_4 = c8_0, c8_5 = c8_0, c8_6 = c8_0, c8_7 = c8_0;                                \
        for (long kq = 0; kq < K4; ++kq) {                                                         \
            const int8_t *w = quads + kq * NR * 4;                                                 \
            __m512i w16 = _mm512_loadu_si512((const void *)w);                                     \
            __m256i w8 = _mm256_loadu_si256((const __m256i *)(w + 64));                            \
            W8_ROW_DOT(0) W8_ROW_DOT(1) W8_ROW_DOT(2) W8_ROW_DOT(3)                                \
            W8_ROW_DOT(4) W8_ROW_DOT(5) W8_ROW_DOT(6) W8_ROW_DOT(7)                                \
        }                                                                                          \
        int32_t acc[W8_MR][NR];                                                                    \
        W8_ROW_SAVE(0) W8_ROW_SAVE(1) W8_ROW_SAVE(2) W8_ROW_SAVE(3)                                \
        W8_ROW_SAVE(4) W8_ROW_SAVE(5) W8_ROW_SAVE(6) W8_ROW_SAVE(7)                                \
        w8_finish(acc, colsum, sw, sa, bias, Y, ldy, MRX, cols);                                   \
    }
#elif defined(__AVX2__)
/* AVX2 has no u8 x s8 dot product into int32: vpmaddubsw multiplies u8 by s8 and adds pairs
 * into int16, which |w| x (a · sign w) cannot overflow (|a|, |w| <= 127 — or one of them 128:
 * 2 x 128 x 127 < 32768), then vpmaddwd with ones adds the pairs into int32: one column's quad
 * a 32-bit lane, as vpdpbusd. Rows in groups of 4 (12 accumulators of 16 registers). */
#define W8_ROW4(R)                                                                                 \
    if (R < rows) {                                                                                \
        __m256i a = _mm256_set1_epi32(*(const int32_t *)(A + R * 4 * K4 + 4 * kq));                \
        c##R##0 = _mm256_add_epi32(                                                                \
            c##R##0, _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(a, w0)), ones));  \
        c##R##1 = _mm256_add_epi32(                                                                \
            c##R##1, _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(a, w1)), ones));  \
        c##R##2 = _mm256_add_epi32(                                                                \
            c##R##2, _mm256_madd_epi16(_mm256_maddubs_epi16(u2, _mm256_sign_epi8(a, w2)), ones));  \
    }
#define W8_SAVE4(R)                                                                                \
    if (R < rows) {                                                                                \
        _mm256_storeu_si256((__m256i *)acc[R], c##R##0);                                           \
        _mm256_storeu_si256((__m256i *)(acc[R] + 8), c##R##1);                                     \
        _mm256_storeu_si256((__m256i *)(acc[R] + 16), c##R##2);                                    \
    }
/* rows [0, rows) (at most 4) of one panel: their int32 sums into acc */
static inline void w8_dot4(const int8_t *quads, const uint8_t *A, long K4, int32_t acc[][NR],
                        int rows) {
    const __m256i ones = _mm256_set1_epi16(1), z = _mm256_setzero_si256();
    __m256i c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z;
    __m256i c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z;
    for (long kq = 0; kq < K4; ++kq) {
        const int8_t *w = quads + kq * NR * 4;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w),
                w1 = _mm256_loadu_si256((const __m256i *)(w + 32)),
                w2 = _mm256_loadu_si256((const __m256i *)(w + 64));
        __m256i u0 = _mm256_sign_epi8(w0, w0), u1 = _mm256_sign_epi8(w1, w1),
                u2 = _mm256_sign_epi8(w2, w2); /* |w| */
        W8_ROW4(0) W8_ROW4(1) W8_ROW4(2) W8_ROW4(3)
    }
    W8_SAVE4(0) W8_SAVE4(1) W8_SAVE4(2) W8_SAVE4(3)
}
#define W8_MICRO(MRX)                                                                              \
    static void w8_micro_##MRX(const int8_t *quads, const int32_t *colsum, const float *sw,        \
                            const uint8_t *A, long K4, const float *sa, const float *bias,         \
                            float *Y, long ldy, int cols) {                                        \
        int32_t acc[W8_MR][NR];                                                                    \
        for (int r0 = 0; r0 < MRX; r0 += 4)                                                        \
            w8_dot4(quads, A + r0 * 4 * K4, K4, acc + r0, MRX - r0 < 4 ? MRX - r0 : 4);            \
        w8_finish(acc, colsum, sw, sa, bias, Y, ldy, MRX, cols);                                   \
    }
#else
#define W8_MICRO(MRX)                                                                              \
    static void w8_micro_##MRX(const int8_t *quads, const int32_t *colsum, const float *sw,        \
                            const uint8_t *A, long K4, const float *sa, const float *bias,         \
                            float *Y, long ldy, int cols) {                                        \
        int32_t acc[W8_MR][NR] = {{0}};                                                            \
        for (long kq = 0; kq < K4; ++kq) {                                                         \
            const int8_t *w = quads + kq * NR * 4;                                                 \
            for (int r = 0; r < MRX; ++r) {                                                        \
                const int8_t *a = (const int8_t *)A + r * 4 * K4 + 4 * kq; /* s8 codes */          \
                for (int j = 0; j < NR; ++j)                                                       \
                    acc[r][j] += a[0] * w[4 * j] + a[1] * w[4 * j + 1] +                           \
                                 a[2] * w[4 * j + 2] + a[3] * w[4 * j + 3];                        \
            }                                                                                      \
        }                                                                                          \
        w8_finish(acc, colsum, sw, sa, bias, Y, ldy, MRX, cols);                                   \
    }
#endif

W8_MICRO(1)
W8_MICRO(2)
W8_MICRO(3)
W8_MICRO(4)
W8_MICRO(5)
W8_MICRO(6)
W8_MICRO(7)
W8_MICRO(8)

#ifdef W8A8_VBMI
/* Up to W8_DIRECT_ROWS tokens straight from the k-major panel (decode steps: the weights stream
 * once, and the regroup into a buffer — a write and a read of the panel, and a column-sum
 * pass — cost more than the dot products). Each 4 rows of 24 codes become quads in registers
 * (two byte permutes), made unsigned (xor 0x80: q + 128), and vpdpbusd multiplies them by the
 * token's signed codes (its bytes xor 0x80). sum_k (q + 128) a = sum_k q a + 128 sum_k a: the
 * token's code sum, taken once, is subtracted — the same exact int32 sums as the regrouped
 * path, so the same result. A quad past K reads the panel's scale bytes as codes times
 * activation code 0. */
#define W8_DIRECT_ROWS 4
/* (inlined into one function per token count, w8_direct_1..4 below: with mr a constant the
 * row loops unroll and the accumulators live in registers; with mr a run-time value GCC kept
 * them on the stack, a store and a reload on every vpdpbusd's chain — ~3x slower) */
static inline __attribute__((always_inline)) void w8_direct(
    const uint8_t *wp, long K4, const uint8_t *A, const int32_t *asum, const float *sw,
    const float *sa, const float *bias, float *Y, long ldy, int mr, int cols) {
    const __m512i lo = w8_quad_index(0), hi = w8_quad_index(16);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i c16[W8_DIRECT_ROWS];
    __m256i c8[W8_DIRECT_ROWS];
    for (int r = 0; r < W8_DIRECT_ROWS; ++r) c16[r] = _mm512_setzero_si512();
    for (int r = 0; r < W8_DIRECT_ROWS; ++r) c8[r] = _mm256_setzero_si256();
    for (long kq = 0; kq < K4; ++kq) {
        const uint8_t *rows = wp + 4 * kq * NR;
        if ((kq & 1) == 0) { /* 192 bytes every two quads: three lines */
            STREAM_PREFETCH(rows);
            STREAM_PREFETCH(rows + 64);
            STREAM_PREFETCH(rows + 128);
        }
        __m512i a = _mm512_loadu_si512((const void *)rows);
        __m512i b = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, rows + 64); /* bytes 64..95 */
        __m512i w16 = _mm512_xor_si512(_mm512_permutex2var_epi8(a, lo, b), flip);
        __m256i w8 = _mm512_castsi512_si256(
            _mm512_xor_si512(_mm512_permutex2var_epi8(a, hi, b), flip));
        for (int r = 0; r < mr; ++r) {
            __m512i a4 = _mm512_xor_si512(
                _mm512_set1_epi32(*(const int32_t *)(A + r * 4 * K4 + 4 * kq)), flip);
            c16[r] = _mm512_dpbusd_epi32(c16[r], w16, a4);
            c8[r] = _mm256_dpbusd_epi32(c8[r], w8, _mm512_castsi512_si256(a4));
        }
    }
    int32_t acc[W8_MR][NR];
    const int32_t none[NR] = {0};
    for (int r = 0; r < mr; ++r) {
        _mm512_storeu_si512((void *)acc[r],
                            _mm512_sub_epi32(c16[r], _mm512_set1_epi32(128 * asum[r])));
        _mm256_storeu_si256((__m256i *)(acc[r] + 16),
                            _mm256_sub_epi32(c8[r], _mm256_set1_epi32(128 * asum[r])));
    }
    w8_finish(acc, none, sw, sa, bias, Y, ldy, mr, cols);
}

#define W8_DIRECT(MR)                                                                          \
    static void w8_direct_##MR(const uint8_t *wp, long K4, const uint8_t *A,                   \
                               const int32_t *asum, const float *sw, const float *sa,          \
                               const float *bias, float *Y, long ldy, int cols) {              \
        w8_direct(wp, K4, A, asum, sw, sa, bias, Y, ldy, MR, cols);                            \
    }
W8_DIRECT(1)
W8_DIRECT(2)
W8_DIRECT(3)
W8_DIRECT(4)
typedef void (*w8_direct_fn)(const uint8_t *, long, const uint8_t *, const int32_t *,
                             const float *, const float *, const float *, float *, long, int);
static const w8_direct_fn W8_DIRECTS[W8_DIRECT_ROWS + 1] = {0, w8_direct_1, w8_direct_2,
                                                            w8_direct_3, w8_direct_4};
#endif

typedef void (*w8_micro_fn)(const int8_t *, const int32_t *, const float *, const uint8_t *,
                            long, const float *, const float *, float *, long, int);
static const w8_micro_fn W8_MICROS[W8_MR + 1] = {0,          w8_micro_1, w8_micro_2,
                                                 w8_micro_3, w8_micro_4, w8_micro_5,
                                                 w8_micro_6, w8_micro_7, w8_micro_8};

/* token row m of X [M][K] -> its scale and codes by int8_token.h's rule, as bytes code +
 * W8_A_OFFSET, zero-padded to 4 * K4 */
static void w8_quantize_token(const float *X, long m, long K, long K4, uint8_t *A, float *sa) {
    const float *x = X + m * K;
    float s = sa[m] = int8_token_scale(x, K);
    uint8_t *a = A + m * 4 * K4;
    int8_token_codes(x, K, s, W8_A_OFFSET, a);
    for (long k = K; k < 4 * K4; ++k) a[k] = W8_A_OFFSET; /* (code 0) */
}

/* whether a product of M tokens runs on AMX tiles here (built with them, M past the threshold,
 * the kernel's permission granted): the same exact int32 sums either way */
int gemm_w8a8_tiles(long M) {
#ifdef W8A8_AMX
    return M >= W8_AMX_MIN_TOKENS && amx_ready();
#else
    (void)M;
    return 0;
#endif
}

#ifdef W8A8_AMX
/* The tokens on tiles (inside the parallel region): A the tokens' codes laid out tile by tile
 * (amx.h; K4p quads a row: a whole number of 16-quad k-steps, padded with code 0, as are the
 * rows to whole tiles of 16). Each thread takes its own panels ~512 KB at a time, regroups them
 * into quads (zero past K4: TDPBUSD's B rows as they are) and runs every block of 32 tokens
 * across them. */
static void w8_tiles(const uint8_t *Wp, const uint8_t *A, const float *sa, const float *bias,
                     float *Y, long M, long N, long K, long K4, long K4p, long panels) {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    const long p0 = panels * t / threads, p1 = panels * (t + 1) / threads;
    const long panel_bytes = K4p * NR * 4, most = amx_group(panel_bytes);
    const long group = p1 - p0 < most ? p1 - p0 : most;
    if (group <= 0) return;
    int8_t *quads = malloc((size_t)(group * panel_bytes));
    for (long i = 0; i < group; ++i) /* (rows past K4: 0, for good) */
        memset(quads + i * panel_bytes + K4 * NR * 4, 0, (size_t)((K4p - K4) * NR * 4));
    int32_t(*colsum)[NR] = malloc(sizeof(int32_t[NR]) * (size_t)group);
    int32_t C[AMX_BLOCK_TOKENS][NR];
    uint32_t pad[AMX_ROWS * NR];
    amx_configure();
    for (long g = p0; g < p1; g += group) {
        const long gn = p1 - g < group ? p1 - g : group;
        for (long i = 0; i < gn; ++i)
            w8_regroup(Wp + (g + i) * (K + 4) * NR, K, K4, quads + i * panel_bytes, colsum[i]);
        for (long m = 0; m < M; m += AMX_BLOCK_TOKENS) {
            const long mr = M - m < AMX_BLOCK_TOKENS ? M - m : AMX_BLOCK_TOKENS;
            for (long i = 0; i < gn; ++i) {
                const long n0 = (g + i) * NR;
                const uint8_t *wp = Wp + (g + i) * (K + 4) * NR;
                AMX_PANEL_BLOCK(_tile_dpbusd, A + amx_tiled_offset(m, 0, K4p / 16), K4p / 16,
                                (const uint32_t *)(quads + i * panel_bytes), K4p, mr > 16,
                                &C[0][0], NR, pad);
                w8_finish(C, colsum[i], (const float *)(wp + K * NR), sa + m,
                          bias ? bias + n0 : 0, Y + m * N + n0, N, (int)mr,
                          (int)(N - n0 < NR ? N - n0 : NR));
            }
        }
    }
    _tile_release();
    free(colsum);
    free(quads);
}

/* token m's codes (w8_quantize_token's, x its K values) into the tiled layout of K4p quads a
 * row, through `row` */
static void w8_quantize_tiled(const float *x, long m, long K, long K4p, uint8_t *A, float *sa,
                              uint8_t *row) {
    w8_quantize_token(x, 0, K, K4p, row, sa + m); /* (row 0 of a one-row buffer) */
    for (long s = 0; s < K4p / 16; ++s)
        memcpy(A + amx_tiled_offset(m, s * AMX_K_BYTES, K4p / 16), row + s * AMX_K_BYTES,
               AMX_K_BYTES);
}
#endif

/* gemm_w8a8_i8(Wp, X, bias, Y, M, N, K, threads): Wp the "int8" panels, X [M][K] fp32 (each
 * token quantized here), Y [M][N] — the signature of the packed fp32 GEMMs. */
void gemm_w8a8_i8(const uint8_t *Wp, const float *X, const float *bias, float *Y, long M,
                  long N, long K, int num_threads) {
    if (M <= 0 || N <= 0) return;
    long panels = (N + NR - 1) / NR, K4 = (K + 3) / 4;
#ifdef W8A8_AMX
    if (gemm_w8a8_tiles(M)) {
        const long K4p = (K4 + 15) / 16 * 16, rows = (M + 15) / 16 * 16;
        uint8_t *A = malloc((size_t)(rows * 4 * K4p));
        float *sa = malloc(sizeof(float) * (size_t)M);
        /* (the rows past M: code 0; the tiled layout keeps 16-token tiles whole, so they are
         * the last tile's last rows, each k-step's) */
        for (long m = M; m < rows; ++m)
            for (long s = 0; s < K4p / 16; ++s)
                memset(A + amx_tiled_offset(m, s * AMX_K_BYTES, K4p / 16), W8_A_OFFSET,
                       AMX_K_BYTES);
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
        {
            uint8_t *row = malloc((size_t)(4 * K4p));
#pragma omp for schedule(static)
            for (long m = 0; m < M; ++m) w8_quantize_tiled(X + m * K, m, K, K4p, A, sa, row);
            free(row);
            w8_tiles(Wp, A, sa, bias, Y, M, N, K, K4, K4p, panels);
        }
        free(A);
        free(sa);
        return;
    }
#endif
    uint8_t *A = malloc((size_t)(M * 4 * K4));
    float *sa = malloc(sizeof(float) * (size_t)M);
#ifdef W8A8_VBMI
    if (M <= W8_DIRECT_ROWS) { /* decode: the few tokens quantized here, then one fork (a
                                * barrier fewer than quantizing inside the parallel region) */
        int32_t asum[W8_DIRECT_ROWS];
        for (long m = 0; m < M; ++m) {
            w8_quantize_token(X, m, K, K4, A, sa);
            int32_t total = 0; /* the token's signed code sum */
            for (long k = 0; k < 4 * K4; ++k) total += (int32_t)A[m * 4 * K4 + k] - 128;
            asum[m] = total;
        }
#pragma omp parallel for num_threads(num_threads) schedule(static) \
    if (M * N * K >= PARALLEL_MIN_ELEMENTS)
        for (long p = 0; p < panels; ++p) {
            const uint8_t *wp = Wp + p * (K + 4) * NR;
            long n0 = p * NR;
            W8_DIRECTS[M](wp, K4, A, asum, (const float *)(wp + K * NR), sa,
                          bias ? bias + n0 : 0, Y + n0, N, (int)(N - n0 < NR ? N - n0 : NR));
        }
        free(A);
        free(sa);
        return;
    }
#endif
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
#pragma omp for schedule(static)
        for (long m = 0; m < M; ++m) w8_quantize_token(X, m, K, K4, A, sa);
        int8_t *quads = malloc((size_t)(K4 * NR * 4));
        int32_t colsum[NR];
#pragma omp for schedule(static)
        for (long p = 0; p < panels; ++p) {
            const uint8_t *wp = Wp + p * (K + 4) * NR;
            const float *sw = (const float *)(wp + K * NR);
            long n0 = p * NR;
            int cols = (int)(N - n0 < NR ? N - n0 : NR);
            w8_regroup(wp, K, K4, quads, colsum);
            for (long m = 0; m < M; m += W8_MR)
                W8_MICROS[M - m < W8_MR ? M - m : W8_MR](quads, colsum, sw, A + m * 4 * K4, K4,
                                                         sa + m, bias ? bias + n0 : 0,
                                                         Y + m * N + n0, N, cols);
        }
        free(quads);
    }
    free(A);
    free(sa);
}
#endif /* GEMM_W8A8_I8_C */
