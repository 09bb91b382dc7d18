/* y[r] = sum_k W[r, k] * x[k] (+ bias[r]) for a row-major fp32 W [rows, cols].
 *
 * Decode at batch 1 is a matrix-vector product: every weight byte is read once and used for
 * one multiply-add, so the speed is the memory bandwidth. Four rows are streamed at a time
 * with AVX2 FMA (8 floats per instruction, 4 independent accumulators) and the rows are
 * split over the OpenMP threads of the process (torch's libgomp, shared by soname).
 */
#include <stddef.h>
#ifdef __AVX2__
#include <immintrin.h>
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

static float dot_tail(const float *w, const float *x, long start, long cols) {
    float s = 0.0f;
    for (long k = start; k < cols; ++k) s += w[k] * x[k];
    return s;
}

static void rows4(const float *W, const float *x, float *y, long r, long cols) {
    const float *w0 = W + r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    long k = 0;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 8 <= cols; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
    }
    y[r] = hsum8(a0) + dot_tail(w0, x, k, cols);
    y[r + 1] = hsum8(a1) + dot_tail(w1, x, k, cols);
    y[r + 2] = hsum8(a2) + dot_tail(w2, x, k, cols);
    y[r + 3] = hsum8(a3) + dot_tail(w3, x, k, cols);
#else
    y[r] = dot_tail(w0, x, 0, cols);
    y[r + 1] = dot_tail(w1, x, 0, cols);
    y[r + 2] = dot_tail(w2, x, 0, cols);
    y[r + 3] = dot_tail(w3, x, 0, cols);
#endif
}

void matvec_f32(const float *W, const float *x, const float *bias, float *y, long rows,
                long cols, int num_threads) {
    long blocks = rows / 4;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (long b = 0; b < blocks; ++b) rows4(W, x, y, b * 4, cols);
    for (long r = blocks * 4; r < rows; ++r) y[r] = dot_tail(W + r * cols, x, 0, cols);
    if (bias)
        for (long r = 0; r < rows; ++r) y[r] += bias[r];
}
