/* Mamba2 selective scan (ops/ssd_scan.py) as the per-token recurrence, one (sequence, head)
 * per work item, the head's state [P, N] updated in place in its slot:
 *
 *     H = exp(δ_t·A_h) · H + δ_t · x_t ⊗ B_t        y_t = H · C_t + D_h · x_t
 *
 * On a CPU this beats the chunked (SSD) form at the sizes a step sees: a head's state (P·N
 * floats, 16 KiB at 64×64) stays in L1 while the sequence's tokens stream past, so each token
 * costs 2·P·N multiply-adds and no temporaries; the chunked form's Q×Q blocks and its ~40
 * tensor ops per call cost more than the whole recurrence below a few thousand tokens.
 *
 * x [T, H, P] with a token stride of x_stride floats; delta [T, H] (discretized: softplus and
 * clamp done by the caller); B, C [T, G, N] with a token stride of bc_stride floats (head h
 * reads group h / (H / G)); A, D [H] (D may be NULL); state [slots, H, P, N];
 * starts [S + 1] (sequence s owns tokens starts[s]..starts[s+1]); slots [S] (distinct);
 * fresh [S]: nonzero → start from a zero state (the slot may hold anything, even NaN);
 * y [T, H, P] contiguous. */
#include "common.h"

#include <math.h>

/* Work below this many state updates (tokens · heads · P · N) runs on one thread. */
#define SCAN_PARALLEL_MIN 262144L

static void scan_head(const float *x, long x_stride, const float *delta, float a, float d_skip,
                      const float *B, const float *C, long bc_stride, float *h, float *y,
                      long H, long P, long N, long t0, long t1) {
    for (long t = t0; t < t1; ++t) {
        const float dt = delta[t * H];
        const float decay = expf(dt * a);
        const float *xt = x + t * x_stride, *bt = B + t * bc_stride, *ct = C + t * bc_stride;
        float *yt = y + t * H * P;
        for (long p = 0; p < P; ++p) {
            const float u = dt * xt[p];
            float *hp = h + p * N;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (long n = 0; n < N; ++n) {
                const float v = decay * hp[n] + u * bt[n];
                hp[n] = v;
                acc += v * ct[n];
            }
            yt[p] = acc + d_skip * xt[p];
        }
    }
}

void ssd_scan_f32(const float *x, long x_stride, const float *delta, const float *A,
                  const float *B, const float *C, long bc_stride, const float *D, float *state,
                  const long *starts, const long *slots, const unsigned char *fresh, float *y,
                  long S, long H, long P, long N, long G, int num_threads) {
    const long per_group = H / G, work = starts[S] * H * P * N;
#pragma omp parallel num_threads(num_threads) if (work >= SCAN_PARALLEL_MIN)
    {
        flush_denormals();
/* round robin: a long prefill's heads and a decode's spread over the threads alike */
#pragma omp for collapse(2) schedule(static, 1)
        for (long s = 0; s < S; ++s) {
            for (long hd = 0; hd < H; ++hd) {
                float *h = state + (slots[s] * H + hd) * P * N;
                if (fresh[s])
                    for (long i = 0; i < P * N; ++i) h[i] = 0.0f;
                const long g = hd / per_group;
                scan_head(x + hd * P, x_stride, delta + hd, A[hd], D ? D[hd] : 0.0f,
                          B + g * N, C + g * N, bc_stride, h, y + hd * P, H, P, N, starts[s],
                          starts[s + 1]);
            }
        }
    }
}
