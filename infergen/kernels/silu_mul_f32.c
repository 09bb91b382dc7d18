/* SwiGLU activation: out[r, c] = silu(x[r, c]) * x[r, n + c] for x [rows, 2n], out [rows, n].
 * silu(g) = g / (1 + exp(-g)). */
#include "common.h"

void silu_mul_f32(const float *x, float *out, long rows, long n, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (rows * n >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long r = 0; r < rows; ++r) {
            const float *g = x + r * 2 * n, *u = g + n;
            float *y = out + r * n;
            for (long c = 0; c < n; ++c) y[c] = -g[c];
            exp_array(y, y, n); /* y = e^-g */
            for (long c = 0; c < n; ++c) y[c] = g[c] / (1.0f + y[c]) * u[c];
        }
    }
}
