/* Fused residual add + RMSNorm over rows of an fp32 [rows, cols] matrix.
 *
 *   if residual_in:  h = h + delta        (in place on h: the residual stream)
 *   out = h / sqrt(mean(h^2) + eps) * weight
 *
 * One pass over h to add and accumulate the sum of squares (double), one to scale.
 */
#include "common.h"

void rms_norm_f32(float *h, const float *delta, const float *weight, float *out, long rows,
                  long cols, float eps, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (rows * cols >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long r = 0; r < rows; ++r) {
            float *x = h + r * cols;
            float *y = out + r * cols;
            float sum = 0.0f;
            if (delta) {
                const float *d = delta + r * cols;
#pragma omp simd reduction(+ : sum)
                for (long c = 0; c < cols; ++c) {
                    x[c] += d[c];
                    sum += x[c] * x[c];
                }
            } else {
#pragma omp simd reduction(+ : sum)
                for (long c = 0; c < cols; ++c) sum += x[c] * x[c];
            }
            float inv = 1.0f / __builtin_sqrtf(sum / (float)cols + eps);
            for (long c = 0; c < cols; ++c) y[c] = weight[c] * (x[c] * inv);
        }
    }
}
