/* Shared helpers of infergen's C kernels. */
#pragma once
#include <immintrin.h>

/* Denormal inputs make x86 arithmetic ~100x slower. torch.set_flush_denormal only sets the
 * calling thread's MXCSR, so every OpenMP worker sets flush-to-zero + denormals-are-zero. */
static inline void flush_denormals(void) { _mm_setcsr(_mm_getcsr() | 0x8040); }

#ifdef __AVX512F__
/* The accumulators of the 24-column-panel micro-kernels (gemm_packed_f32.c, gemm_bf16.c), per
 * token row r: a<r> (a 16-float vector) and b<r> (an 8-float one) for a panel's 24 columns —
 * rows 0..7 of one panel (ACCUMULATORS_8X24), or rows 0..3 of two panels, c<r> / d<r> the
 * second's (ACCUMULATORS_PAIR). */
#define ACCUMULATORS_8X24                                                                      \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,     \
           a7 = a0;                                                                            \
    __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0, b4 = b0, b5 = b0, b6 = b0,     \
           b7 = b0
#define ACCUMULATORS_PAIR                                                                      \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0,     \
           c3 = a0;                                                                            \
    __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0, d0 = b0, d1 = b0, d2 = b0,     \
           d3 = b0

/* The first panel of work unit u of a GEMM that runs its full panels two at a time: units
 * 0..pairs-1 are the pairs (panels 2u, 2u + 1), the next ones the panels left (an odd or
 * partial last one), alone. */
static inline long pair_unit_panel(long u, long pairs) {
    return u < pairs ? 2 * u : pairs + u;
}
#endif

/* A weight a decode step reads once: prefetch its bytes a short way ahead of the reads with the
 * non-temporal hint, one call per 64 bytes read. Streamed through the caches normally, a step's
 * ~100 MB of weights evicts everything else from the last level every step: on Zen 4 the tiny
 * torch ops that run between the kernels (embedding, sampling, the step's inputs) then took
 * 2-3x longer (~10-40 us each), measured after a 128 MB sweep with and without this hint
 * (and the sweep itself was no slower). Further ahead than a few KB the lines were evicted
 * before use: 16 KB ahead read at ~20 GB/s instead of ~25. */
#ifndef STREAM_AHEAD
#define STREAM_AHEAD 2048
#endif
#ifndef STREAM_HINT
#define STREAM_HINT _MM_HINT_NTA
#endif
#ifdef __SSE__
#define STREAM_PREFETCH(p) _mm_prefetch((const char *)(p) + STREAM_AHEAD, STREAM_HINT)
#else
#define STREAM_PREFETCH(p) ((void)(p))
#endif

/* Work below this many elements runs on one thread: a fork/join costs more than it saves. */
#ifndef PARALLEL_MIN_ELEMENTS /* a generated program may set its own (compiler/program_tune.py) */
#define PARALLEL_MIN_ELEMENTS 32768L
#endif

/* Horizontal sum of the 8 lanes. */
#ifdef __AVX2__
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

/* exp(x) for 8 floats at once: x = n·ln2 + r with |r| ≤ ln2/2, a degree-6 polynomial for
 * e^r (Cephes coefficients, relative error ~2 ulp), 2^n built in the exponent bits. Inputs
 * are clamped to [-87.3, 88.7]; e^-87.3 ≈ 1e-38 is then flushed to zero by FTZ. */
#ifdef __AVX2__
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* y[i] = exp(x[i]) for i < n (in place allowed). */
static inline void exp_array(const float *x, float *y, long n) {
    long i = 0;
#ifdef __AVX2__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float tmp[8] = {0};
        for (long j = i; j < n; ++j) tmp[j - i] = x[j];
        _mm256_storeu_ps(tmp, exp8(_mm256_loadu_ps(tmp)));
        for (long j = i; j < n; ++j) y[j] = tmp[j - i];
    }
#else
    for (; i < n; ++i) y[i] = __builtin_expf(x[i]);
#endif
}

/* sum_i a[i]·b[i] and y[i] += w·x[i]: AVX2 for the multiple-of-8 part (head dims are). */
static inline float dot_f32(const float *a, const float *b, long n) {
    long i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

static inline void axpy_f32(float *y, float w, const float *x, long n) {
    long i = 0;
#ifdef __AVX2__
    __m256 wv = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; ++i) y[i] += w * x[i];
}
