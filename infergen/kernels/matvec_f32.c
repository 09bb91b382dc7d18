/* y[r] = sum_k W[r, k] * x[k] (+ bias[r]) for a row-major fp32 W [rows, cols].
 *
 * Decode at batch 1 is a matrix-vector product: every weight byte is read once and used for
 * one multiply-add, so the speed is the memory bandwidth. Each thread streams one row at a
 * time with four independent AVX2 FMA accumulators along k (one sequential stream per thread
 * measured ~10-15 % faster here than four interleaved row streams), and the rows are split over
 * the OpenMP threads of the process (torch's libgomp, shared by soname).
 */
#include <stddef.h>

#include "common.h"

static inline float dot_row(const float *w, const float *x, long cols) {
    long k = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 32 <= cols; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= cols; k += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
    for (; k < cols; ++k) s += w[k] * x[k];
    return s;
}

void matvec_f32(const float *W, const float *x, const float *bias, float *y, long rows,
                long cols, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (rows * cols >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long r = 0; r < rows; ++r) y[r] = dot_row(W + r * cols, x, cols) + (bias ? bias[r] : 0.0f);
    }
}
