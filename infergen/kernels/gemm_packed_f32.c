/* Y[m, n] = sum_k X[m, k] * W[n, k] (+ bias[n]) with W pre-packed into column panels.
 *
 * Packed layout (ops/linear.py pack_weight): Wp[p][k][j] = W[p*24 + j, k], N padded with zero
 * rows to a multiple of 24. A panel is a contiguous K x 24 strip, so the inner loop reads
 * three 8-float vectors of W per k and multiplies them by 4 broadcast token values into 12
 * register accumulators (a 4 x 24 outer-product micro-kernel, the BLIS/GotoBLAS idea): 12 FMAs
 * per 7 loads keeps both FMA pipes of a Zen/Skylake core busy, where the dot-product form
 * (one W row times token rows, horizontal sums at the end) is load-bound at about half peak.
 *
 * With AVX-512 (compiled with -mavx512f: kernels/build.py) the micro-kernel is 8 x 24 instead:
 * per row one 16-float and one 8-float accumulator (16 registers of the 32), 16 FMAs per 2
 * loads + 8 broadcasts, 192 multiply-adds per k where the AVX2 one does 96. Measured on a
 * Xeon with AVX-512 (2 cores, SmolLM2-135M's shapes): ~145 -> ~200-214 GF/s at 64-512 tokens,
 * where MKL's sgemm ran ~140-235 (benchmarks/bench_linear.py). Past 8 tokens the full panels
 * run two at a time (4 x 48: each broadcast feeds four FMAs, half the 8 x 24 kernel's
 * broadcasts per FMA): on Zen 4 (2 cores) the 8 x 24 kernel reached ~88 % of the FMA peak even
 * with its panel in L1 (103.5 of 117 GF/s a thread), the pair kernel ~100 %; SmolLM2's prefill
 * shapes at 512 tokens ~200 -> ~230 GF/s, the measured peak being 234.
 * Both accumulate every output with the same FMAs in the same k order and add the bias last,
 * so their results are bitwise equal (the grouped kernels, gemm_packed_g_f32.c, run the
 * 4-row one on dequantized panels and are checked bitwise against this one).
 *
 * Every weight panel is read from memory once per call: all token blocks are swept while the
 * panel sits in L2. Panels are split over the OpenMP threads. M-remainders (m % 4, or m % 8)
 * use the same micro-kernel specialised for fewer rows, so one token (batch-1 decode) streams
 * each panel exactly once, at memory bandwidth.
 */
#ifndef GEMM_PACKED_F32_C
#define GEMM_PACKED_F32_C
#include "gemm_packed_f32.h"

/* y[0..cols) = a row's accumulated columns + bias: the bias added last, as every micro-kernel
 * does (their results stay bitwise equal) */
static inline void finish_row(const float *tmp, float *y, const float *bias, int cols) {
    for (int j = 0; j < cols; ++j) y[j] = tmp[j] + (bias ? bias[j] : 0.0f);
}

#ifdef __AVX2__
/* Row r of the micro-kernel: three accumulators for the 24 columns (named registers; an
 * accumulator array made GCC spill every accumulator to the stack on every k). */
#define ROW_FMA(r)                                                                             \
    if (mr > r) {                                                                              \
        __m256 x = _mm256_broadcast_ss(X + r * K + k);                                         \
        c##r##0 = _mm256_fmadd_ps(w0, x, c##r##0);                                             \
        c##r##1 = _mm256_fmadd_ps(w1, x, c##r##1);                                             \
        c##r##2 = _mm256_fmadd_ps(w2, x, c##r##2);                                             \
    }
#define ROW_STORE(r)                                                                           \
    if (mr > r) {                                                                              \
        float tmp[NR];                                                                         \
        _mm256_storeu_ps(tmp, c##r##0);                                                        \
        _mm256_storeu_ps(tmp + 8, c##r##1);                                                    \
        _mm256_storeu_ps(tmp + 16, c##r##2);                                                   \
        finish_row(tmp, Y + r * ldy, bias, cols);                                              \
    }

/* Y[r, 0..cols) = sum_k X[r, k] * Wp[k, 0..cols) (+ bias) for r < MR. */
#define MICRO(MR)                                                                              \
    static void micro_##MR(const float *wp, const float *X, long K, float *Y, long ldy,        \
                           const float *bias, int cols, const float *prefetch,                 \
                           long pf_step) {                                                     \
        const int mr = MR;                                                                     \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,          \
               c12 = c00, c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;    \
        for (long k = 0; k < K; ++k) {                                                         \
            __m256 w0 = _mm256_loadu_ps(wp + k * NR);                                          \
            __m256 w1 = _mm256_loadu_ps(wp + k * NR + 8);                                      \
            __m256 w2 = _mm256_loadu_ps(wp + k * NR + 16);                                     \
            if (prefetch) _mm_prefetch((const char *)(prefetch + k * pf_step), _MM_HINT_T1);   \
            ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3)                                        \
        }                                                                                      \
        ROW_STORE(0) ROW_STORE(1) ROW_STORE(2) ROW_STORE(3)                                    \
    }
#else
#define MICRO(MR)                                                                              \
    static void micro_##MR(const float *wp, const float *X, long K, float *Y, long ldy,        \
                           const float *bias, int cols, const float *prefetch,                 \
                           long pf_step) {                                                     \
        (void)prefetch, (void)pf_step;                                                                        \
        for (int r = 0; r < MR; ++r)                                                           \
            for (int j = 0; j < cols; ++j) {                                                   \
                float s = bias ? bias[j] : 0.0f;                                               \
                for (long k = 0; k < K; ++k) s += X[r * K + k] * wp[k * NR + j];               \
                Y[r * ldy + j] = s;                                                            \
            }                                                                                  \
    }
#endif

MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)

static const micro_fn MICROS[5] = {0, micro_1, micro_2, micro_3, micro_4};

#ifdef __AVX512F__
/* Row r of the 8 x 24 micro-kernel: columns 0..15 in a 16-float accumulator, 16..23 in an
 * 8-float one (the broadcast's lower half). */
#define ROW_FMA8(r)                                                                            \
    if (mr > r) {                                                                              \
        __m512 x = _mm512_set1_ps(X[r * K + k]);                                               \
        a##r = _mm512_fmadd_ps(w0, x, a##r);                                                   \
        b##r = _mm256_fmadd_ps(w1, _mm512_castps512_ps256(x), b##r);                           \
    }
#define ROW_STORE8(r)                                                                          \
    if (mr > r) {                                                                              \
        float tmp[NR];                                                                         \
        _mm512_storeu_ps(tmp, a##r);                                                           \
        _mm256_storeu_ps(tmp + 16, b##r);                                                      \
        finish_row(tmp, Y + r * ldy, bias, cols);                                              \
    }
#define MICRO8(MR)                                                                             \
    static void micro8_##MR(const float *wp, const float *X, long K, float *Y, long ldy,       \
                            const float *bias, int cols, const float *prefetch,                \
                            long pf_step) {                                                    \
        const int mr = MR;                                                                     \
        ACCUMULATORS_8X24;                                                                     \
        for (long k = 0; k < K; ++k) {                                                         \
            __m512 w0 = _mm512_loadu_ps(wp + k * NR);                                          \
            __m256 w1 = _mm256_loadu_ps(wp + k * NR + 16);                                     \
            if (prefetch) _mm_prefetch((const char *)(prefetch + k * pf_step), _MM_HINT_T1);   \
            ROW_FMA8(0) ROW_FMA8(1) ROW_FMA8(2) ROW_FMA8(3)                                    \
            ROW_FMA8(4) ROW_FMA8(5) ROW_FMA8(6) ROW_FMA8(7)                                    \
        }                                                                                      \
        ROW_STORE8(0) ROW_STORE8(1) ROW_STORE8(2) ROW_STORE8(3)                                \
        ROW_STORE8(4) ROW_STORE8(5) ROW_STORE8(6) ROW_STORE8(7)                                \
    }
MICRO8(1)
MICRO8(2)
MICRO8(3)
MICRO8(4)
MICRO8(5)
MICRO8(6)
MICRO8(7)
MICRO8(8)
/* Row r of the two-panel micro-kernel: panel 0's 24 columns in a##r / b##r, panel 1's in
 * c##r / d##r, all four fed by one broadcast. */
#define ROW_FMA_PAIR(r)                                                                        \
    if (mr > r) {                                                                              \
        __m512 x = _mm512_set1_ps(X[r * K + k]);                                               \
        __m256 xh = _mm512_castps512_ps256(x);                                                 \
        a##r = _mm512_fmadd_ps(w0, x, a##r);                                                   \
        b##r = _mm256_fmadd_ps(w1, xh, b##r);                                                  \
        c##r = _mm512_fmadd_ps(v0, x, c##r);                                                   \
        d##r = _mm256_fmadd_ps(v1, xh, d##r);                                                  \
    }
#define ROW_STORE_PAIR(r)                                                                      \
    if (mr > r) {                                                                              \
        float tmp[2 * NR];                                                                     \
        _mm512_storeu_ps(tmp, a##r);                                                           \
        _mm256_storeu_ps(tmp + 16, b##r);                                                      \
        _mm512_storeu_ps(tmp + NR, c##r);                                                      \
        _mm256_storeu_ps(tmp + NR + 16, d##r);                                                 \
        finish_row(tmp, Y0 + r * ldy, bias0, NR);                                              \
        finish_row(tmp + NR, Y1 + r * ldy, bias1, NR);                                         \
    }
#define PAIR(MR)                                                                               \
    static void pair_##MR(const float *wp0, const float *wp1, const float *X, long K,          \
                          float *Y0, float *Y1, long ldy, const float *bias0,                  \
                          const float *bias1, const float *prefetch, long pf_step) {           \
        const int mr = MR;                                                                     \
        ACCUMULATORS_PAIR;                                                                     \
        for (long k = 0; k < K; ++k) {                                                         \
            __m512 w0 = _mm512_loadu_ps(wp0 + k * NR), v0 = _mm512_loadu_ps(wp1 + k * NR);     \
            __m256 w1 = _mm256_loadu_ps(wp0 + k * NR + 16);                                    \
            __m256 v1 = _mm256_loadu_ps(wp1 + k * NR + 16);                                    \
            if (prefetch) _mm_prefetch((const char *)(prefetch + k * pf_step), _MM_HINT_T1);   \
            ROW_FMA_PAIR(0) ROW_FMA_PAIR(1) ROW_FMA_PAIR(2) ROW_FMA_PAIR(3)                    \
        }                                                                                      \
        ROW_STORE_PAIR(0) ROW_STORE_PAIR(1) ROW_STORE_PAIR(2) ROW_STORE_PAIR(3)                \
    }
PAIR(1)
PAIR(2)
PAIR(3)
PAIR(4)
static const pair_fn PAIRS[PAIR_ROWS + 1] = {0, pair_1, pair_2, pair_3, pair_4};
const pair_fn *gemm_packed_f32_pairs(void) { return PAIRS; }

/* the micro-kernel per height of gemm_packed_f32's token blocks past 8 tokens */
static const micro_fn TOP_MICROS[TOP_ROWS + 1] = {0,        micro8_1, micro8_2, micro8_3, micro8_4,
                                                  micro8_5, micro8_6, micro8_7, micro8_8};
#else
#define TOP_MICROS MICROS
#endif
#if GEMM_SMALL_TOP
#define SMALL_MICROS TOP_MICROS
#else
#define SMALL_MICROS MICROS
#endif

const micro_fn *gemm_packed_f32_micros(int small) { return small ? SMALL_MICROS : TOP_MICROS; }

#ifdef __AVX512F__
/* Past 8 tokens: the full panels two at a time (pair micro-kernels over blocks of PAIR_ROWS
 * tokens), a last odd or partial panel alone (the 8 x 24 kernel). A work unit is a pair or a
 * lone panel; units are split over the threads. */
static void gemm_pairs(const float *Wp, const float *X, const float *bias, float *Y, long M,
                       long N, long K, int num_threads) {
    const long panels = (N + NR - 1) / NR, pairs = N / NR / 2, units = panels - pairs;
    const long blocks = (M + PAIR_ROWS - 1) / PAIR_ROWS;
    const long pf_step = (2 * NR + blocks - 1) / blocks;
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long u = 0; u < units; ++u) {
            const long p = pair_unit_panel(u, pairs);
            const float *wp = Wp + p * K * NR;
            const float *b = bias ? bias + p * NR : 0;
            if (u >= pairs) { /* a lone panel */
                int cols = (int)(N - p * NR < NR ? N - p * NR : NR);
                const long lone = (M + TOP_ROWS - 1) / TOP_ROWS;
                for (long j = 0; j < lone; ++j) {
                    long m = block_start(j, M, lone), mr = block_start(j + 1, M, lone) - m;
                    TOP_MICROS[mr](wp, X + m * K, K, Y + m * N + p * NR, N, b, cols, 0, 0);
                }
                continue;
            }
            const float *next = p + 2 < panels ? wp + 2 * K * NR : 0;
            for (long j = 0; j < blocks; ++j) {
                long m = block_start(j, M, blocks), mr = block_start(j + 1, M, blocks) - m;
                const float *pf = pair_prefetch(next, next + K * NR, j, pf_step, K);
                float *y = Y + m * N + p * NR;
                PAIRS[mr](wp, wp + K * NR, X + m * K, K, y, y + NR, N, b, b ? b + NR : 0, pf,
                          pf_step);
            }
        }
    }
}
#endif

/* Wp [ceil(N/24)][K][24], X [M][K] contiguous, Y [M][N]. */
void gemm_packed_f32(const float *Wp, const float *X, const float *bias, float *Y, long M, long N,
                     long K, int num_threads) {
    if (M <= 0 || N <= 0) return; /* nothing to compute (e.g. a step with no logits rows) */
#ifdef __AVX512F__
    if (M > 8) {
        gemm_pairs(Wp, X, bias, Y, M, N, K, num_threads);
        return;
    }
#endif
    long panels = (N + NR - 1) / NR;
    /* up to 8 tokens, two 4-row blocks: the first prefetches the next panel (a single block
     * has no time to), which the weight-streaming small-M products need */
    const long rows = M > 8 ? TOP_ROWS : SMALL_ROWS;
    const micro_fn *micros = M > 8 ? TOP_MICROS : SMALL_MICROS;
    long blocks = (M + rows - 1) / rows;
    long pf_step = (NR + blocks - 1) / blocks;
    const long ahead = blocks > 1 ? 1 : GEMM_PREFETCH_PANELS; /* panels ahead (0: none) */
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long p = 0; p < panels; ++p) {
            const float *wp = Wp + p * K * NR;
            long n0 = p * NR;
            int cols = (int)(N - n0 < NR ? N - n0 : NR);
            const float *b = bias ? bias + n0 : 0;
            /* With several token blocks the panel is computed on long enough to fetch the
             * next one meanwhile (into L2) instead of stalling on DRAM at its start: block j
             * prefetches floats [j*K*step, (j+1)*K*step) of the next panel, spread over its k. */
            const float *next = (ahead && p + ahead < panels) ? wp + ahead * K * NR : 0;
            for (long j = 0; j < blocks; ++j) {
                long m = block_start(j, M, blocks), mr = block_start(j + 1, M, blocks) - m;
                const float *pf = next && j * pf_step < NR ? next + j * K * pf_step : 0;
                micros[mr](wp, X + m * K, K, Y + m * N + n0, N, b, cols, pf, pf_step);
            }
        }
    }
}
#endif /* GEMM_PACKED_F32_C */
