/* Y[m, n] = sum_k X[m, k] * W[n, k] (+ bias[n]) with W held as group-quantized codes: groups of
 * 32 consecutive inputs of one output channel share a scale (and an offset), fp32 activations.
 * One kernel per group format (gemm_packed_<fmt>_f32):
 *   q4_0       GGUF Q4_0: 4-bit u, fp16 d          w = d·(u − 8)
 *   q4_1       GGUF Q4_1: 4-bit u, fp16 d, fp16 m  w = d·u + m
 *   q8_0       GGUF Q8_0: int8 q, fp16 d           w = d·q
 *   int4       formats "int4": 4-bit u = q + 8, fp32 s             w = s·(u − 8)
 *   int4_asym  formats "int4_asym": 4-bit u, fp32 s, uint8 zero z  w = s·(u − z)
 *   mxfp4      formats "mxfp4": E2M1 codes, E8M0 scale 2^(e − 127)  w = e2m1(u)·2^(e − 127)
 *   nvfp4      formats "nvfp4": E2M1 codes, an E4M3 scale per 16 inputs and one fp32 global
 *              scale per weight                                 w = (e2m1(u)·e4m3(s))·global
 *
 * Packed layout (ops/linear_grouped.py): the 24-column panels of gemm_packed_f32.c cut into
 * groups of 32 inputs. Group g of panel p is a header — the 24 columns' scales (then offsets
 * or zero points) — followed by the codes: for 4-bit formats 16 rows of 24 bytes, row r byte j
 * holding inputs 32g + 2r (low nibble) and 32g + 2r + 1 (high nibble) of column 24p + j; for
 * Q8_0 32 rows of 24 bytes. A Q4 group is 96 + 384 bytes for 768 weights (5 bits a weight);
 * a decode step streams those instead of 4 bytes a weight.
 *
 * Every weight is decoded to the fp32 value the format's reference dequantization gives (d·u
 * and s·(u − 8) as one fused multiply-add: d·u is exact in fp32 for fp16 d, and fma(s, u, −8s)
 * rounds s·(u − 8) once, as the reference does), then accumulated in the order and form of
 * gemm_packed_f32 — so the product equals gemm_packed_f32 on the dequantized weight bit for bit.
 * One or two tokens decode in registers; with more, the group is decoded into an L2 copy of the
 * fp32 panel that the fp32 micro-kernels then sweep for every token block.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "gemm_packed_f32.c"
#include "half.h"

#define GROUP 32

/* Per format: header bytes, code rows (of 24 bytes) per group, and the scalar decode of code
 * row r's column j (element `hi` of the byte for 4-bit formats) from the group at g. */
#define HDR_q4_0 48
#define HDR_q4_1 96
#define HDR_q8_0 48
#define HDR_int4 96
#define HDR_int4_asym 120
#define HDR_mxfp4 24  /* 24 E8M0 bytes */
#define HDR_nvfp4 52  /* 24 E4M3 bytes (inputs 0..15), 24 (inputs 16..31), fp32 global */
#define ROWS_mxfp4 16
#define ROWS_nvfp4 16
#define ROWS_q4_0 16
#define ROWS_q4_1 16
#define ROWS_q8_0 32
#define ROWS_int4 16
#define ROWS_int4_asym 16
#define GROUP_BYTES(FMT) (HDR_##FMT + ROWS_##FMT * NR)

static inline const uint16_t *hdr16(const uint8_t *g) { return (const uint16_t *)g; }
static inline const float *hdr32(const uint8_t *g) { return (const float *)g; }

static inline float nibble(const uint8_t *g, int hdr, int r, int j, int hi) {
    uint8_t b = g[hdr + r * NR + j];
    return (float)(hi ? b >> 4 : b & 0xF);
}
static inline float scalar_q4_0(const uint8_t *g, int r, int j, int hi) {
    float d = half_to_float(hdr16(g)[j]);
    return fmaf(d, nibble(g, HDR_q4_0, r, j, hi), -8.0f * d);
}
static inline float scalar_q4_1(const uint8_t *g, int r, int j, int hi) {
    return fmaf(half_to_float(hdr16(g)[j]), nibble(g, HDR_q4_1, r, j, hi),
                half_to_float(hdr16(g)[NR + j]));
}
static inline float scalar_q8_0(const uint8_t *g, int r, int j, int hi) {
    (void)hi;
    return half_to_float(hdr16(g)[j]) * (float)(int8_t)g[HDR_q8_0 + r * NR + j];
}
static inline float scalar_int4(const uint8_t *g, int r, int j, int hi) {
    float s = hdr32(g)[j];
    return fmaf(s, nibble(g, HDR_int4, r, j, hi), -8.0f * s);
}
static inline float scalar_int4_asym(const uint8_t *g, int r, int j, int hi) {
    float z = (float)g[NR * 4 + j];
    return (nibble(g, HDR_int4_asym, r, j, hi) - z) * hdr32(g)[j];
}

/* E2M1 code → value (sign bit 3, then 2 exponent and 1 mantissa bits) */
static const float E2M1_VALUES[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
static inline float e2m1(int u) { return (u & 8) ? -E2M1_VALUES[u & 7] : E2M1_VALUES[u & 7]; }
static inline float e8m0(uint8_t e) { /* 2^(e - 127); 0 for e = 0 (its elements are zero) */
    uint32_t bits = (uint32_t)e << 23;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}
static inline float scalar_mxfp4(const uint8_t *g, int r, int j, int hi) {
    uint8_t b = g[HDR_mxfp4 + r * NR + j];
    return e2m1(hi ? b >> 4 : b & 0xF) * e8m0(g[j]);
}
static inline float scalar_nvfp4(const uint8_t *g, int r, int j, int hi) {
    uint8_t b = g[HDR_nvfp4 + r * NR + j];
    float global;
    memcpy(&global, g + 2 * NR, 4);
    return e2m1(hi ? b >> 4 : b & 0xF) * decode_e4m3(g[(r >= 8) * NR + j]) * global;
}

#ifdef __AVX2__
/* The group's per-column decode constants, 8 columns (c = 0, 8, 16) at a time: w = fma(u, a, b)
 * for the fma formats, w = (u − b)·a for int4_asym, w = q·a for q8_0. */
static inline __m256 h8(const uint8_t *g, int off) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + off)));
}
#define SETUP_q4_0(g, c) __m256 a##c = h8(g, 2 * c), b##c = _mm256_mul_ps(a##c, _mm256_set1_ps(-8.0f));
#define SETUP_q4_1(g, c) __m256 a##c = h8(g, 2 * c), b##c = h8(g, 2 * NR + 2 * c);
#define SETUP_q8_0(g, c) __m256 a##c = h8(g, 2 * c), b##c = _mm256_setzero_ps();
#define SETUP_int4(g, c)                                                                       \
    __m256 a##c = _mm256_loadu_ps(hdr32(g) + c), b##c = _mm256_mul_ps(a##c, _mm256_set1_ps(-8.0f));
#define SETUP_int4_asym(g, c)                                                                  \
    __m256 a##c = _mm256_loadu_ps(hdr32(g) + c),                                               \
           b##c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(                                    \
               _mm_loadl_epi64((const __m128i *)(g + 4 * NR + c))));
/* FP4: a (and h for inputs 16..31) the per-column scale, b nvfp4's global scale */
static inline __m256 e8m0x8(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), 23));
}
/* the negated scales too (na, nh): a code's sign picks a or −a (fp4x8 below) */
#define NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.0f))
#define SETUP_mxfp4(g, c)                                                                      \
    __m256 a##c = e8m0x8(g + c), h##c = a##c, b##c = a##c, na##c = NEG(a##c), nh##c = na##c;
#define SETUP_nvfp4(g, c)                                                                      \
    __m256 a##c = _mm256_mul_ps(e4m3x8_times_2m8(g + c), _mm256_set1_ps(256.0f)),              \
           h##c = _mm256_mul_ps(e4m3x8_times_2m8(g + NR + c), _mm256_set1_ps(256.0f)),         \
           b##c = _mm256_broadcast_ss((const float *)(g + 2 * NR)), na##c = NEG(a##c),         \
           nh##c = NEG(h##c);
/* 8 E2M1 codes (bits 0..3 of each lane; bits 4.. zero or ignored) → |value| · (±scale): the
 * magnitude by a permute of bits 0..2, the sign (bit 3, moved to bit 31) by choosing a or −a
 * — |e2m1| · a is exact (2 and 4 significant bits), so the product is e2m1 · a exactly. */
static inline __m256 fp4x8(__m256i u, __m256 a, __m256 na) {
    const __m256 table = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
#ifdef __AVX512VL__ /* bits 0..2 pick the magnitude, bit 3 the negated table: one op */
    const __m256 negated = _mm256_xor_ps(table, _mm256_set1_ps(-0.0f));
    (void)na;
    return _mm256_mul_ps(_mm256_permutex2var_ps(table, u, negated), a);
#else
    __m256 mag = _mm256_permutevar8x32_ps(table, u); /* uses bits 0..2 */
    __m256 scale = _mm256_blendv_ps(a, na, _mm256_castsi256_ps(_mm256_slli_epi32(u, 28)));
    return _mm256_mul_ps(mag, scale);
#endif
}
#define FP4_mxfp4(u, a, na, b) fp4x8(u, a, na)
#define FP4_nvfp4(u, a, na, b) _mm256_mul_ps(fp4x8(u, a, na), b)
#define DEQ_q4_0(u, a, b) _mm256_fmadd_ps(u, a, b)
#define DEQ_q4_1(u, a, b) _mm256_fmadd_ps(u, a, b)
#define DEQ_q8_0(u, a, b) _mm256_mul_ps(u, a)
#define DEQ_int4(u, a, b) _mm256_fmadd_ps(u, a, b)
#define DEQ_int4_asym(u, a, b) _mm256_mul_ps(_mm256_sub_ps(u, b), a)

static inline __m256i bytes8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline __m256 lo4(__m256i v) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xF)));
}
static inline __m256 hi4(__m256i v) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)); }
static inline __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Input k's three weight vectors w0..w2 are used for every row (and kept for the fp32 pass). */
#define USE_W(k)                                                                               \
    do {                                                                                       \
        if (keep) {                                                                            \
            _mm256_storeu_ps(keep + (k) * NR, w0);                                             \
            _mm256_storeu_ps(keep + (k) * NR + 8, w1);                                         \
            _mm256_storeu_ps(keep + (k) * NR + 16, w2);                                        \
        }                                                                                      \
        long kk = (k);                                                                         \
        if (mr > 0) {                                                                          \
            __m256 x = _mm256_broadcast_ss(X + kk);                                            \
            c00 = _mm256_fmadd_ps(w0, x, c00), c01 = _mm256_fmadd_ps(w1, x, c01),              \
            c02 = _mm256_fmadd_ps(w2, x, c02);                                                 \
        }                                                                                      \
        if (mr > 1) {                                                                          \
            __m256 x = _mm256_broadcast_ss(X + K + kk);                                        \
            c10 = _mm256_fmadd_ps(w0, x, c10), c11 = _mm256_fmadd_ps(w1, x, c11),              \
            c12 = _mm256_fmadd_ps(w2, x, c12);                                                 \
        }                                                                                      \
    } while (0)

/* One group's inputs: 4-bit formats decode each code row's low then high nibbles (inputs
 * 2r, 2r + 1), Q8_0 a byte per input. */
#define GROUP_BODY_4(FMT)                                                                      \
    for (int r = 0; r < ROWS_##FMT; ++r) {                                                     \
        const uint8_t *row = g + HDR_##FMT + r * NR;                                           \
        __m256i v0 = bytes8(row), v1 = bytes8(row + 8), v2 = bytes8(row + 16);                 \
        __m256 w0 = DEQ_##FMT(lo4(v0), a0, b0), w1 = DEQ_##FMT(lo4(v1), a8, b8),               \
               w2 = DEQ_##FMT(lo4(v2), a16, b16);                                              \
        USE_W(k0 + 2 * r);                                                                     \
        w0 = DEQ_##FMT(hi4(v0), a0, b0), w1 = DEQ_##FMT(hi4(v1), a8, b8),                      \
        w2 = DEQ_##FMT(hi4(v2), a16, b16);                                                     \
        USE_W(k0 + 2 * r + 1);                                                                 \
    }
#define FP4_ROWS(FMT, R0, R1, A, NA)                                                           \
    for (int r = R0; r < R1; ++r) {                                                            \
        const uint8_t *row = g + HDR_##FMT + r * NR;                                           \
        __m256i v0 = bytes8(row), v1 = bytes8(row + 8), v2 = bytes8(row + 16);                 \
        __m256 w0 = FP4_##FMT(v0, A##0, NA##0, b0), w1 = FP4_##FMT(v1, A##8, NA##8, b8),       \
               w2 = FP4_##FMT(v2, A##16, NA##16, b16);                                         \
        USE_W(k0 + 2 * r);                                                                     \
        v0 = _mm256_srli_epi32(v0, 4), v1 = _mm256_srli_epi32(v1, 4),                          \
        v2 = _mm256_srli_epi32(v2, 4);                                                         \
        w0 = FP4_##FMT(v0, A##0, NA##0, b0), w1 = FP4_##FMT(v1, A##8, NA##8, b8),              \
        w2 = FP4_##FMT(v2, A##16, NA##16, b16);                                                \
        USE_W(k0 + 2 * r + 1);                                                                 \
    }
/* FP4: code rows 0..7 hold inputs 0..15 (scale a), rows 8..15 inputs 16..31 (scale h) */
#define GROUP_BODY_FP4(FMT) FP4_ROWS(FMT, 0, 8, a, na) FP4_ROWS(FMT, 8, 16, h, nh)
#define GROUP_BODY_8(FMT)                                                                      \
    for (int r = 0; r < ROWS_##FMT; ++r) {                                                     \
        const uint8_t *row = g + HDR_##FMT + r * NR;                                           \
        __m256 w0 = DEQ_##FMT(i8x8(row), a0, b0), w1 = DEQ_##FMT(i8x8(row + 8), a8, b8),       \
               w2 = DEQ_##FMT(i8x8(row + 16), a16, b16);                                       \
        USE_W(k0 + r);                                                                         \
    }

/* Rows 0..MR-1 (MR ≤ 2) of Y for one panel, decoding in registers; `keep` (when set) receives
 * the decoded fp32 panel [K][24]. MR = 0 only decodes. */
#define MICRO_G(FMT, MR, BODY)                                                                 \
    static void micro_g_##FMT##_##MR(const uint8_t *wp, const float *X, long K, float *Y,    \
                                     long ldy, const float *bias, int cols, float *keep) {     \
        const int mr = MR;                                                                     \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,          \
               c12 = c00;                                                                      \
        for (long k0 = 0; k0 < K; k0 += GROUP) {                                               \
            const uint8_t *g = wp + (k0 / GROUP) * GROUP_BYTES(FMT);                           \
            SETUP_##FMT(g, 0) SETUP_##FMT(g, 8) SETUP_##FMT(g, 16) BODY(FMT)                   \
        }                                                                                      \
        (void)c10, (void)c11, (void)c12;                                                       \
        ROW_STORE(0) ROW_STORE(1)                                                              \
    }
#else
/* Scalar: the same decoded values, accumulated in k order as gemm_packed_f32's scalar path. */
#define MICRO_G(FMT, MR, BODY)                                                                 \
    static void micro_g_##FMT##_##MR(const uint8_t *wp, const float *X, long K, float *Y,    \
                                     long ldy, const float *bias, int cols, float *keep) {     \
        float acc[2][NR];                                                                      \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < NR; ++j) acc[r][j] = bias && j < cols ? bias[j] : 0.0f;        \
        for (long k = 0; k < K; ++k) {                                                         \
            const uint8_t *g = wp + (k / GROUP) * GROUP_BYTES(FMT);                            \
            int i = (int)(k % GROUP), four = ROWS_##FMT == 16;                                 \
            for (int j = 0; j < NR; ++j) {                                                     \
                float w = scalar_##FMT(g, four ? i / 2 : i, j, four ? i % 2 : 0);              \
                if (keep) keep[k * NR + j] = w;                                                \
                for (int r = 0; r < MR; ++r) acc[r][j] += X[r * K + k] * w;                    \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < cols; ++j) Y[r * ldy + j] = acc[r][j];                          \
    }
#define GROUP_BODY_4(FMT)
#define GROUP_BODY_8(FMT)
#define GROUP_BODY_FP4(FMT)
#endif

typedef void (*micro_g_fn)(const uint8_t *, const float *, long, float *, long, const float *,
                           int, float *);

/* gemm_packed_<FMT>_f32(Wp, X, bias, Y, M, N, K, threads): Wp the panels above (K a multiple
 * of 32), X [M][K], Y [M][N]. */
#define GEMM_PACKED_G(FMT, BODY)                                                               \
    MICRO_G(FMT, 0, BODY)                                                                      \
    MICRO_G(FMT, 1, BODY)                                                                      \
    MICRO_G(FMT, 2, BODY)                                                                      \
    static const micro_g_fn MICROS_G_##FMT[3] = {micro_g_##FMT##_0, micro_g_##FMT##_1,        \
                                                 micro_g_##FMT##_2};                           \
    void gemm_packed_##FMT##_f32(const uint8_t *Wp, const float *X, const float *bias,        \
                                 float *Y, long M, long N, long K, int num_threads) {         \
        if (M <= 0 || N <= 0) return;                                                          \
        long panels = (N + NR - 1) / NR;                                                       \
        long panel_bytes = K / GROUP * GROUP_BYTES(FMT);                                       \
        _Pragma("omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)") \
        {                                                                                      \
            flush_denormals();                                                                 \
            float *buf = M > 2 ? malloc(sizeof(float) * (size_t)(K * NR)) : 0;                 \
            _Pragma("omp for schedule(static)")                                                \
            for (long p = 0; p < panels; ++p) {                                                \
                const uint8_t *wp = Wp + p * panel_bytes;                                      \
                long n0 = p * NR;                                                              \
                int cols = (int)(N - n0 < NR ? N - n0 : NR);                                   \
                const float *b = bias ? bias + n0 : 0;                                         \
                if (M <= 2) {                                                                  \
                    MICROS_G_##FMT[M](wp, X, K, Y + n0, N, b, cols, 0);                        \
                    continue;                                                                  \
                }                                                                              \
                MICROS_G_##FMT[0](wp, X, K, Y + n0, N, b, cols, buf);                          \
                for (long m = 0; m < M; m += 4)                                                \
                    MICROS[M - m < 4 ? M - m : 4](buf, X + m * K, K, Y + m * N + n0, N, b,    \
                                                  cols, 0, 0);                                 \
            }                                                                                  \
            free(buf);                                                                         \
        }                                                                                      \
    }

GEMM_PACKED_G(q4_0, GROUP_BODY_4)
GEMM_PACKED_G(q4_1, GROUP_BODY_4)
GEMM_PACKED_G(q8_0, GROUP_BODY_8)
GEMM_PACKED_G(int4, GROUP_BODY_4)
GEMM_PACKED_G(int4_asym, GROUP_BODY_4)
GEMM_PACKED_G(mxfp4, GROUP_BODY_FP4)
GEMM_PACKED_G(nvfp4, GROUP_BODY_FP4)
