/* Each row's argmax of an fp32 [rows, n] matrix, as torch.argmax picks it: the first index of
 * the largest value, a NaN counting as larger than any number (then the first NaN).
 *
 * Two passes over the row: its largest value (max and a NaN flag, both vectorizable), then the
 * first index holding it. The fused decode step runs it on the logits its LM head has just
 * written (decode_layers_f32.c decode_step_f32), while they are in cache.
 */
#include "common.h"

static long argmax_row(const float *x, long n) {
    float m = x[0];
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (long i = 0; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    for (long i = 0; i < n; ++i)
        if (nan ? x[i] != x[i] : x[i] == m) return i;
    return 0;
}

void argmax_f32(const float *x, long rows, long n, long *out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * n >= PARALLEL_MIN_ELEMENTS)
    for (long r = 0; r < rows; ++r) out[r] = argmax_row(x + r * n, n);
}
