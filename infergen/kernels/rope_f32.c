/* Rotary embedding, half-split (NeoX) layout, in place on x [tokens, heads, dim] whose token
 * rows are `row_stride` floats apart (q and k may be one strided view of the fused QKV output).
 * cache [positions, dim]: cos in the first half, sin in the second.
 *   y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin
 */
#include "common.h"

void rope_f32(float *x, const long *positions, const float *cache, long tokens, long heads,
              long dim, long row_stride, int num_threads) {
    long half = dim / 2;
#pragma omp parallel num_threads(num_threads) if (tokens * heads * dim >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long t = 0; t < tokens; ++t) {
            const float *cs = cache + positions[t] * dim;
            const float *sn = cs + half;
            for (long h = 0; h < heads; ++h) {
                float *v = x + t * row_stride + h * dim;
                for (long i = 0; i < half; ++i) {
                    float a = v[i], b = v[i + half];
                    v[i] = a * cs[i] - b * sn[i];
                    v[i + half] = b * cs[i] + a * sn[i];
                }
            }
        }
    }
}
