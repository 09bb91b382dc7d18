/* W4A8 with integer compute: 4-bit group-quantized weights times int8 activations quantized
 * per token (ops/quantize_activation.py's "token" rule), like llama.cpp's Q4 x Q8 dot
 * products. One kernel per weight format (gemm_w4a8_<fmt>), on the panels of
 * kernels/gemm_packed_g_f32.c (ops/linear_grouped.py):
 *   q4_0       w = d·(u − 8)   fp16 d
 *   q4_1       w = d·u + m     fp16 d, m
 *   int4       w = s·(u − 8)   fp32 s
 *   int4_asym  w = s·(u − z)   fp32 s, uint8 z
 * Each is w = S·u + O per group of 32 inputs of one column (S, O the group's constants), so
 * with a the token's int8 codes and sa its scale
 *   y = sa · sum_groups (S · sum_k u a + O · sum_k a)
 * sum_k u a is exact in int32: u (0..15) is the unsigned byte and a the signed one of
 * vpdpbusd (AVX-512 VNNI) or vpmaddubsw (AVX2: 2 · 15 · 127 fits int16); sum_k a is the
 * group's code sum, taken once per token when it is quantized. Against the emulation (x̂ · ŵ
 * accumulated in fp32) the results differ by fp32 rounding only.
 *
 * Per call, each panel (24 columns) is regrouped once into a per-thread buffer: per group its
 * S and O (fp32) and its 32 codes per column as 8 quads (4 inputs of a column side by side, as
 * vpdpbusd reads them), unpacked from the nibbles by SSE2 masks and interleaves; then every
 * token block runs over it. Up to 4 tokens (decode steps), the AVX-512 VBMI build unpacks each
 * quad in registers instead (w4_direct): the weights stream once, with no buffer.
 */
#ifndef GEMM_W4A8_I8_C
#define GEMM_W4A8_I8_C
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "half.h"
#include "int8_token.h"

#ifdef __SSE2__
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define W4A8_VNNI 1
#endif

#define NR 24     /* columns a panel (gemm_packed_f32.c's) */
#define GROUP 32  /* inputs a group */
#define W4_QUADS 8   /* quads (of 4 inputs) a group */
#define W4_CODE_ROWS 16 /* a group's code rows of 24 bytes: row r inputs 2r (low nibble), 2r + 1 */
#define W4_MR 4      /* tokens a micro-step */
/* a regrouped group: S[24], O[24] (fp32), then quads [8][24][4] (u8 codes 0..15) */
#define W4_CONST_BYTES (2 * NR * 4)
#define W4_REGROUPED (W4_CONST_BYTES + W4_QUADS * NR * 4)

/* header bytes of a group, per format (ops/linear_grouped.py's fields, in order) */
#define HDR_q4_0 48       /* fp16 d [24] */
#define HDR_q4_1 96       /* fp16 d [24], fp16 m [24] */
#define HDR_int4 96       /* fp32 s [24] */
#define HDR_int4_asym 120 /* fp32 s [24], uint8 z [24] */

typedef void (*w4_consts_fn)(const uint8_t *header, float *S, float *O);

static void w4_consts_q4_0(const uint8_t *h, float *S, float *O) {
    halves_to_floats((const uint16_t *)h, S, NR);
    for (int j = 0; j < NR; ++j) O[j] = -8.0f * S[j];
}
static void w4_consts_q4_1(const uint8_t *h, float *S, float *O) {
    halves_to_floats((const uint16_t *)h, S, NR);
    halves_to_floats((const uint16_t *)h + NR, O, NR);
}
static void w4_consts_int4(const uint8_t *h, float *S, float *O) {
    memcpy(S, h, NR * 4);
    for (int j = 0; j < NR; ++j) O[j] = -8.0f * S[j];
}
static void w4_consts_int4_asym(const uint8_t *h, float *S, float *O) {
    memcpy(S, h, NR * 4);
    for (int j = 0; j < NR; ++j) O[j] = -((float)h[4 * NR + j] * S[j]);
}

/* a group's 16 code rows → 8 quads [24][4]: quad i of column j holds inputs 4i..4i+3, the low
 * and high nibbles of rows 2i and 2i + 1 */
static void w4_nibble_quads(const uint8_t *rows, uint8_t *quads) {
#ifdef __SSE2__
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int i = 0; i < W4_QUADS; ++i) {
        const uint8_t *r0 = rows + 2 * i * NR, *r1 = r0 + NR;
        __m128i *out = (__m128i *)(quads + i * NR * 4);
        __m128i x0 = _mm_loadu_si128((const __m128i *)r0),
                x1 = _mm_loadu_si128((const __m128i *)r1);
        __m128i a0 = _mm_and_si128(x0, low), a1 = _mm_and_si128(_mm_srli_epi16(x0, 4), low);
        __m128i a2 = _mm_and_si128(x1, low), a3 = _mm_and_si128(_mm_srli_epi16(x1, 4), low);
        __m128i p01l = _mm_unpacklo_epi8(a0, a1), p01h = _mm_unpackhi_epi8(a0, a1);
        __m128i p23l = _mm_unpacklo_epi8(a2, a3), p23h = _mm_unpackhi_epi8(a2, a3);
        _mm_storeu_si128(out, _mm_unpacklo_epi16(p01l, p23l));     /* columns 0-3 */
        _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(p01l, p23l)); /* 4-7 */
        _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(p01h, p23h)); /* 8-11 */
        _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(p01h, p23h)); /* 12-15 */
        __m128i y0 = _mm_loadl_epi64((const __m128i *)(r0 + 16)),
                y1 = _mm_loadl_epi64((const __m128i *)(r1 + 16));
        __m128i b0 = _mm_and_si128(y0, low), b1 = _mm_and_si128(_mm_srli_epi16(y0, 4), low);
        __m128i b2 = _mm_and_si128(y1, low), b3 = _mm_and_si128(_mm_srli_epi16(y1, 4), low);
        __m128i q01 = _mm_unpacklo_epi8(b0, b1), q23 = _mm_unpacklo_epi8(b2, b3);
        _mm_storeu_si128(out + 4, _mm_unpacklo_epi16(q01, q23)); /* 16-19 */
        _mm_storeu_si128(out + 5, _mm_unpackhi_epi16(q01, q23)); /* 20-23 */
    }
#else
    for (int i = 0; i < W4_QUADS; ++i)
        for (int j = 0; j < NR; ++j) {
            uint8_t b0 = rows[2 * i * NR + j], b1 = rows[(2 * i + 1) * NR + j];
            uint8_t *q = quads + (i * NR + j) * 4;
            q[0] = b0 & 0xF, q[1] = b0 >> 4, q[2] = b1 & 0xF, q[3] = b1 >> 4;
        }
#endif
}

/* a panel's groups → the regrouped buffer (constants, then quads, per group) */
static void w4_regroup(const uint8_t *panel, long groups, int hdr, w4_consts_fn consts,
                       uint8_t *buf) {
    long group_bytes = hdr + W4_CODE_ROWS * NR;
    for (long g = 0; g < groups; ++g) {
        const uint8_t *src = panel + g * group_bytes;
        uint8_t *dst = buf + g * W4_REGROUPED;
        consts(src, (float *)dst, (float *)dst + NR);
        w4_nibble_quads(src + hdr, dst + W4_CONST_BYTES);
    }
}

/* rows [0, mr) of y = sums · sa (+ bias) */
static void w4_finish(float y[][NR], const float *sa, const float *bias, float *Y, long ldy, int mr,
                   int cols) {
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < cols; ++j) {
            float v = y[r][j] * sa[r];
            Y[r * ldy + j] = bias ? v + bias[j] : v;
        }
}

#ifdef W4A8_VNNI
/* one token row's dot products with a quad of 24 columns (u8 codes x the token's 4 s8 codes) */
#define W4_ROW_DOT(R)                                                                              \
    if (R < mrx) {                                                                                 \
        __m512i a4 = _mm512_castps_si512(_mm512_broadcastss_ps(                                    \
            _mm_load_ss((const float *)(A + R * K + g * GROUP + 4 * i))));                         \
        c16_##R = _mm512_dpbusd_epi32(c16_##R, w16, a4);                                           \
        c8_##R = _mm256_dpbusd_epi32(c8_##R, w8, _mm512_castsi512_si256(a4));                      \
    }
/* the group's integer sums into the fp32 sums: y += S · sum u a + O · sum a */
#define W4_ROW_SCALE(R)                                                                            \
    if (R < mrx) {                                                                                 \
        __m512 as = _mm512_set1_ps(asum[R * groups + g]);                                          \
        y16_##R = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c16_##R), s16, y16_##R);                      \
        y16_##R = _mm512_fmadd_ps(as, o16, y16_##R);                                               \
        y8_##R = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c8_##R), s8, y8_##R);                          \
        y8_##R = _mm256_fmadd_ps(_mm512_castps512_ps256(as), o8, y8_##R);                          \
    }
#define W4_ROW_SAVE(R)                                                                             \
    if (R < mrx) {                                                                                 \
        _mm512_storeu_ps(y[R], y16_##R);                                                           \
        _mm256_storeu_ps(y[R] + 16, y8_##R);                                                       \
    }
#define W4_MICRO(MRX)                                                                              \
    static void w4_micro_##MRX(const uint8_t *buf, long groups, const int8_t *A, long K,           \
                            const float *asum, const float *sa, const float *bias, float *Y,       \
                            long ldy, int cols) {                                                  \
        const int mrx = MRX; /* (a constant: the unused rows' code is dropped) */                  \
        __m512 y16_0 = _mm512_setzero_ps(), y16_1 = y16_0, y16_2 = y16_0, y16_3 = y16_0;           \
        __m256 y8_0 = _mm256_setzero_ps(), y8_1 = y8_0, y8_2 = y8_0, y8_3 = y8_0;                  \
        for (long g = 0; g < groups; ++g) {                                                        \
            const uint8_t *grp = buf + g * W4_REGROUPED, *q = grp + W4_CONST_BYTES;                \
            __m512i c16_0 = _mm512_setzero_si512(), c16_1 = c16_0, c16_2 = c16_0,                  \
                    c16_3 = c16_0;                                                                 \
            __m256i c8_0 = _mm256_setzero_si256(), c8_1 = c8_0, c8_2 = c8_0, c8_3 = c8_0;          \
            for (int i = 0; i < W4_QUADS; ++i) {                                                   \
                __m512i w16 = _mm512_loadu_si512((const void *)(q + i * NR * 4));                  \
                __m256i w8 = _mm256_loadu_si256((const __m256i *)(q + i * NR * 4 + 64));           \
                W4_ROW_DOT(0) W4_ROW_DOT(1) W4_ROW_DOT(2) W4_ROW_DOT(3)                            \
            }                                                                                      \
            const float *S = (const float *)grp, *O = S + NR;                                      \
            __m512 s16 = _mm512_loadu_ps(S), o16 = _mm512_loadu_ps(O);                             \
            __m256 s8 = _mm256_loadu_ps(S + 16), o8 = _mm256_loadu_ps(O + 16);                     \
            W4_ROW_SCALE(0) W4_ROW_SCALE(1) W4_ROW_SCALE(2) W4_ROW_SCALE(3)                        \
        }                                                                                          \
        float y[W4_MR][NR];                                                                        \
        W4_ROW_SAVE(0) W4_ROW_SAVE(1) W4_ROW_SAVE(2) W4_ROW_SAVE(3)                                \
        w4_finish(y, sa, bias, Y, ldy, MRX, cols);                                                 \
    }
#else
/* the integer sums of rows [0, rows) with one group: AVX2's vpmaddubsw (u8 codes x s8
 * activations, pairs into int16) then vpmaddwd with ones (into int32), else scalar */
static inline void w4_dot_group(const uint8_t *q, const int8_t *A, long K, long g, int rows,
                             int32_t acc[][NR]) {
#ifdef __AVX2__
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < rows; ++r) {
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0;
        for (int i = 0; i < W4_QUADS; ++i) {
            const uint8_t *w = q + i * NR * 4;
            __m256i a = _mm256_set1_epi32(*(const int32_t *)(A + r * K + g * GROUP + 4 * i));
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)w), a), ones));
            c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w + 32)), a), ones));
            c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w + 64)), a), ones));
        }
        _mm256_storeu_si256((__m256i *)acc[r], c0);
        _mm256_storeu_si256((__m256i *)(acc[r] + 8), c1);
        _mm256_storeu_si256((__m256i *)(acc[r] + 16), c2);
    }
#else
    for (int r = 0; r < rows; ++r) {
        const int8_t *a = A + r * K + g * GROUP;
        for (int j = 0; j < NR; ++j) {
            int32_t sum = 0;
            for (int i = 0; i < W4_QUADS; ++i)
                for (int t = 0; t < 4; ++t) sum += q[(i * NR + j) * 4 + t] * a[4 * i + t];
            acc[r][j] = sum;
        }
    }
#endif
}
#define W4_MICRO(MRX)                                                                              \
    static void w4_micro_##MRX(const uint8_t *buf, long groups, const int8_t *A, long K,           \
                            const float *asum, const float *sa, const float *bias, float *Y,       \
                            long ldy, int cols) {                                                  \
        float y[W4_MR][NR] = {{0}};                                                                \
        int32_t acc[W4_MR][NR];                                                                    \
        for (long g = 0; g < groups; ++g) {                                                        \
            const uint8_t *grp = buf + g * W4_REGROUPED;                                           \
            const float *S = (const float *)grp, *O = S + NR;                                      \
            w4_dot_group(grp + W4_CONST_BYTES, A, K, g, MRX, acc);                                 \
            for (int r = 0; r < MRX; ++r) {                                                        \
                float as = asum[r * groups + g];                                                   \
                for (int j = 0; j < NR; ++j)                                                       \
                    y[r][j] = fmaf(as, O[j], fmaf((float)acc[r][j], S[j], y[r][j]));               \
            }                                                                                      \
        }                                                                                          \
        w4_finish(y, sa, bias, Y, ldy, MRX, cols);                                                 \
    }
#endif

W4_MICRO(1)
W4_MICRO(2)
W4_MICRO(3)
W4_MICRO(4)

typedef void (*w4_micro_fn)(const uint8_t *, long, const int8_t *, long, const float *,
                            const float *, const float *, float *, long, int);
static const w4_micro_fn W4_MICROS[W4_MR + 1] = {0, w4_micro_1, w4_micro_2, w4_micro_3,
                                                 w4_micro_4};

#if defined(W4A8_VNNI) && defined(__AVX512VBMI__)
/* Up to W4_MR tokens straight from the group panels (decode steps: the weights stream once,
 * and regrouping them into a buffer — a write and a read of every group — costs more than a
 * single token's dot products): a quad's two code rows (48 bytes) split into low and high
 * nibbles, and two byte permutes (vpermt2b) lay each column's 4 inputs side by side, as the
 * regrouped buffer holds them; the group's S and O from its header as w4_regroup takes them.
 * The same integer sums and the same fp32 steps as w4_micro: the same result. */
#define W4_DIRECT 1
static __m512i w4_nibble_index(int first) {
    uint8_t idx[64]; /* byte 4c + t of columns [first, first + 16): L or H of row 0 or 1 */
    for (int i = 0; i < 64; ++i) {
        int c = first + i / 4, t = i % 4;
        idx[i] = (uint8_t)((t & 1 ? 64 : 0) + (t & 2 ? NR : 0) + c);
    }
    return _mm512_loadu_si512((const void *)idx);
}

/* (inlined into one function per token count, w4_direct_1..W4_MR below: with mr a constant
 * the row loops unroll and the accumulators live in registers, not on the stack) */
static inline __attribute__((always_inline)) void w4_direct(
    const uint8_t *panel, long groups, int hdr, w4_consts_fn consts, const int8_t *A, long K,
    const float *asum, const float *sa, const float *bias, float *Y, long ldy, int mr,
    int cols) {
    const __m512i lo_idx = w4_nibble_index(0), hi_idx = w4_nibble_index(16);
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 y16[W4_MR];
    __m256 y8[W4_MR];
    for (int r = 0; r < W4_MR; ++r) y16[r] = _mm512_setzero_ps(), y8[r] = _mm256_setzero_ps();
    long group_bytes = hdr + W4_CODE_ROWS * NR;
    for (long g = 0; g < groups; ++g) {
        const uint8_t *src = panel + g * group_bytes, *rows = src + hdr;
        float S[NR], O[NR];
        consts(src, S, O);
        __m512i c16[W4_MR];
        __m256i c8[W4_MR];
        for (int r = 0; r < W4_MR; ++r)
            c16[r] = _mm512_setzero_si512(), c8[r] = _mm256_setzero_si256();
        for (int i = 0; i < W4_QUADS; ++i) {
            __m512i x = _mm512_maskz_loadu_epi8(0xFFFFFFFFFFFFull, rows + 2 * i * NR); /* 48 */
            __m512i L = _mm512_and_si512(x, low);
            __m512i H = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
            __m512i w16 = _mm512_permutex2var_epi8(L, lo_idx, H);
            __m256i w8 = _mm512_castsi512_si256(_mm512_permutex2var_epi8(L, hi_idx, H));
            for (int r = 0; r < mr; ++r) {
                __m512i a4 = _mm512_set1_epi32(*(const int32_t *)(A + r * K + g * GROUP + 4 * i));
                c16[r] = _mm512_dpbusd_epi32(c16[r], w16, a4);
                c8[r] = _mm256_dpbusd_epi32(c8[r], w8, _mm512_castsi512_si256(a4));
            }
        }
        __m512 s16 = _mm512_loadu_ps(S), o16 = _mm512_loadu_ps(O);
        __m256 s8 = _mm256_loadu_ps(S + 16), o8 = _mm256_loadu_ps(O + 16);
        for (int r = 0; r < mr; ++r) {
            __m512 as = _mm512_set1_ps(asum[r * groups + g]);
            y16[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c16[r]), s16, y16[r]);
            y16[r] = _mm512_fmadd_ps(as, o16, y16[r]);
            y8[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c8[r]), s8, y8[r]);
            y8[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(as), o8, y8[r]);
        }
    }
    float y[W4_MR][NR];
    for (int r = 0; r < mr; ++r) {
        _mm512_storeu_ps(y[r], y16[r]);
        _mm256_storeu_ps(y[r] + 16, y8[r]);
    }
    w4_finish(y, sa, bias, Y, ldy, mr, cols);
}

#define W4_DIRECT_MR(MR)                                                                       \
    static void w4_direct_##MR(const uint8_t *panel, long groups, int hdr,                     \
                               w4_consts_fn consts, const int8_t *A, long K, const float *asum, \
                               const float *sa, const float *bias, float *Y, long ldy,         \
                               int cols) {                                                     \
        w4_direct(panel, groups, hdr, consts, A, K, asum, sa, bias, Y, ldy, MR, cols);         \
    }
W4_DIRECT_MR(1)
W4_DIRECT_MR(2)
W4_DIRECT_MR(3)
W4_DIRECT_MR(4)
typedef void (*w4_direct_fn)(const uint8_t *, long, int, w4_consts_fn, const int8_t *, long,
                             const float *, const float *, const float *, float *, long, int);
static const w4_direct_fn W4_DIRECTS[W4_MR + 1] = {0, w4_direct_1, w4_direct_2, w4_direct_3,
                                                   w4_direct_4};
#endif

/* token row m of X [M][K] -> its scale and s8 codes by int8_token.h's rule, and each group's
 * code sum */
static void w4_quantize_token(const float *X, long m, long K, int8_t *A, float *sa, float *asum) {
    const float *x = X + m * K;
    float s = sa[m] = int8_token_scale(x, K);
    int8_t *a = A + m * K;
    int8_token_codes(x, K, s, 0, (uint8_t *)a);
    long groups = K / GROUP;
    for (long g = 0; g < groups; ++g) {
        int32_t sum = 0;
        for (int k = 0; k < GROUP; ++k) sum += a[g * GROUP + k];
        asum[m * groups + g] = (float)sum;
    }
}

/* Y [M][N] from Wp (the group panels) and X [M][K] fp32, K a multiple of 32 */
static void gemm_w4a8(const uint8_t *Wp, const float *X, const float *bias, float *Y, long M,
                      long N, long K, int num_threads, int hdr, w4_consts_fn consts) {
    if (M <= 0 || N <= 0) return;
    long panels = (N + NR - 1) / NR, groups = K / GROUP;
    long panel_bytes = groups * (hdr + W4_CODE_ROWS * NR);
    int8_t *A = malloc((size_t)(M * K));
    float *sa = malloc(sizeof(float) * (size_t)M);
    float *asum = malloc(sizeof(float) * (size_t)(M * groups + 1));
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long m = 0; m < M; ++m) w4_quantize_token(X, m, K, A, sa, asum);
#ifdef W4_DIRECT
        if (M <= W4_MR) {
#pragma omp for schedule(static)
            for (long p = 0; p < panels; ++p) {
                long n0 = p * NR;
                W4_DIRECTS[M](Wp + p * panel_bytes, groups, hdr, consts, A, K, asum, sa,
                              bias ? bias + n0 : 0, Y + n0, N, (int)(N - n0 < NR ? N - n0 : NR));
            }
        } else {
#endif
        uint8_t *buf = aligned_alloc(64, (size_t)(groups * W4_REGROUPED + 64));
#pragma omp for schedule(static)
        for (long p = 0; p < panels; ++p) {
            long n0 = p * NR;
            int cols = (int)(N - n0 < NR ? N - n0 : NR);
            w4_regroup(Wp + p * panel_bytes, groups, hdr, consts, buf);
            for (long m = 0; m < M; m += W4_MR)
                W4_MICROS[M - m < W4_MR ? M - m : W4_MR](buf, groups, A + m * K, K,
                                                         asum + m * groups, sa + m,
                                                         bias ? bias + n0 : 0, Y + m * N + n0, N,
                                                         cols);
        }
        free(buf);
#ifdef W4_DIRECT
        }
#endif
    }
    free(A);
    free(sa);
    free(asum);
}

/* gemm_w4a8_<fmt>(Wp, X, bias, Y, M, N, K, threads): the signature of the packed GEMMs */
#define W4A8(FMT)                                                                                  \
    void gemm_w4a8_##FMT(const uint8_t *Wp, const float *X, const float *bias, float *Y,           \
                         long M, long N, long K, int num_threads) {                                \
        gemm_w4a8(Wp, X, bias, Y, M, N, K, num_threads, HDR_##FMT, w4_consts_##FMT);               \
    }
W4A8(q4_0)
W4A8(q4_1)
W4A8(int4)
W4A8(int4_asym)
#endif /* GEMM_W4A8_I8_C */
