/* Y[m, r] = sum_k X[m, k] * W[r, k] (+ bias[r]) for a few rows of X (decode of a small batch).
 *
 * BLAS GEMMs are tuned for large M; at M = 2..32 they re-read W per panel and run far below
 * both the memory and the FMA roofline here (MKL: M=4 took 2x the time of M=1). This kernel
 * streams each weight row once per block of 8 tokens: the row chunk is loaded once and
 * multiplied into 8 register accumulators, one per token, so weights come from DRAM once and
 * token vectors from L1. X is padded to a multiple of 8 rows by the caller.
 */
#include "common.h"

/* 8 tokens (X rows x0..x7, `cols` apart) times one weight row w. */
static inline void row_times8(const float *w, const float *X, long cols, float *out8) {
    long k = 0;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (; k + 8 <= cols; k += 8) {
        __m256 wv = _mm256_loadu_ps(w + k);
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + k), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + cols + k), a1);
        a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 2 * cols + k), a2);
        a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 3 * cols + k), a3);
        a4 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 4 * cols + k), a4);
        a5 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 5 * cols + k), a5);
        a6 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 6 * cols + k), a6);
        a7 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + 7 * cols + k), a7);
    }
    out8[0] = hsum8(a0);
    out8[1] = hsum8(a1);
    out8[2] = hsum8(a2);
    out8[3] = hsum8(a3);
    out8[4] = hsum8(a4);
    out8[5] = hsum8(a5);
    out8[6] = hsum8(a6);
    out8[7] = hsum8(a7);
#else
    for (int j = 0; j < 8; ++j) out8[j] = 0.0f;
#endif
    for (; k < cols; ++k)
        for (int j = 0; j < 8; ++j) out8[j] += w[k] * X[j * cols + k];
}

/* X [m_padded, cols] (m_padded % 8 == 0), Y [m, rows]: only the first m rows are written. */
void matmul_small_f32(const float *W, const float *X, const float *bias, float *Y, long rows,
                      long cols, long m, long m_padded, int num_threads) {
#pragma omp parallel num_threads(num_threads)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long r = 0; r < rows; ++r) {
            const float *w = W + r * cols;
            float b = bias ? bias[r] : 0.0f;
            for (long j0 = 0; j0 < m_padded; j0 += 8) {
                float acc[8];
                row_times8(w, X + j0 * cols, cols, acc);
                for (long j = j0; j < j0 + 8 && j < m; ++j) Y[j * rows + r] = acc[j - j0] + b;
            }
        }
    }
}
