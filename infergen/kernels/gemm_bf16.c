/* bf16 products: Y[m, n] = sum_k bf16(X[m, k]) * Wb[n, k] (+ bias[n]) with bf16 weights Wb and
 * the fp32 activations rounded to bf16 (nearest even) here, products exact, sums in fp32 — the
 * numerics of a bf16 GEMM with fp32 accumulation (ops/linear_bf16.py).
 *
 * Packed layout: 24-column panels of k pairs, panel p is K2 = ceil(K / 2) rows of 24 32-bit
 * lanes, lane j of row i holding the bf16 weights of column 24p + j at inputs 2i (low half) and
 * 2i + 1 (high half; 0 past K): the operand of AVX-512 BF16's vdpbf16ps, which adds to each
 * fp32 lane the products of a lane's pair — the odd element's first, then the even one's,
 * rounding after each addition (Intel SDM's definition; bf16 products are exact in fp32).
 *
 * Built with AVX-512 BF16 where the CPU has it (kernels/build.py): 8 tokens x 24 columns a
 * micro-step, a 512-bit and a 256-bit accumulator a token, the token's pair broadcast as one
 * 32-bit lane — 32 multiply-adds an instruction where an fp32 FMA does 16. Elsewhere each pair
 * is widened to two fp32 values (a shift and a mask) and the same two additions are FMAs in the
 * same order (AVX2, or a scalar loop): the same values, denormals flushed as vdpbf16ps does.
 *
 * Where the CPU has AMX-BF16 (built with it unless INFERGEN_KERNEL_ISA says otherwise), products
 * of BF16_AMX_MIN_TOKENS tokens or more run on tiles instead (amx.h: the panels are TDPBF16PS's
 * B operand as they are, 32 tokens x 24 columns a block): ~1.1-2.0 TFLOP/s on 2 Sapphire Rapids
 * class cores at 512 tokens against ~0.17 for vdpbf16ps and ~0.28 for fp32 FMAs, and faster
 * from 4-8 tokens on (measured 2026-12-07). Tiles add each row's products in their own order
 * (no documented rounding sequence: not vdpbf16ps's, nor any sequential fp32 order — measured),
 * so those sums agree with the others to fp32 rounding, not bit for bit; gemm_bf16_tiles says
 * which products take them.
 */
#ifndef GEMM_BF16_C
#define GEMM_BF16_C
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_bf16.h"
#include "common.h"

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#define GEMM_BF16_NATIVE 1
#ifdef AMX_BF16
#define GEMM_BF16_AMX 1 /* AMX-BF16 tiles (amx.h) from BF16_AMX_MIN_TOKENS tokens on */
#endif
#endif

#define NR 24 /* columns a panel */
#ifdef GEMM_BF16_NATIVE
#define BF16_MR 8 /* tokens a micro-step */
#else
#define BF16_MR 4
#endif

static inline float even_of(uint32_t pair) { /* the low bf16 of a lane as fp32 */
    uint32_t u = pair << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float odd_of(uint32_t pair) {
    uint32_t u = pair & 0xFFFF0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* rows [0, mr) of Y = acc (+ bias), the bias added last */
static void bf16_finish(float acc[][NR], const float *bias, float *Y, long ldy, int mr, int cols) {
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < cols; ++j) Y[r * ldy + j] = bias ? acc[r][j] + bias[j] : acc[r][j];
}

#ifdef GEMM_BF16_NATIVE
#define BF16_ROW_DOT(R)                                                                            \
    if (R < mr) {                                                                                  \
        __m512i x2 = _mm512_set1_epi32((int)Xb[R * K2 + i]);                                       \
        a##R = _mm512_dpbf16_ps(a##R, (__m512bh)x2, (__m512bh)w16);                                \
        b##R = _mm256_dpbf16_ps(b##R, (__m256bh)_mm512_castsi512_si256(x2), (__m256bh)w8);         \
    }
#define BF16_ROW_SAVE(R)                                                                           \
    if (R < mr) {                                                                                  \
        _mm512_storeu_ps(acc[R], a##R);                                                            \
        _mm256_storeu_ps(acc[R] + 16, b##R);                                                       \
    }
#define BF16_MICRO(MRX)                                                                            \
    static void bf16_micro_##MRX(const uint32_t *wp, const uint32_t *Xb, long K2,                  \
                                 const float *bias, float *Y, long ldy, int cols,                  \
                                 const uint32_t *pf) {                                             \
        const int mr = MRX;                                                                        \
        ACCUMULATORS_8X24;                                                                         \
        for (long i = 0; i < K2; ++i) {                                                            \
            if (pf) { /* the next panel's row i into L2 (one token block: no time otherwise) */  \
                _mm_prefetch((const char *)(pf + i * NR), _MM_HINT_T1);                            \
                _mm_prefetch((const char *)(pf + i * NR + 16), _MM_HINT_T1);                       \
            }                                                                                      \
            __m512i w16 = _mm512_loadu_si512((const void *)(wp + i * NR));                         \
            __m256i w8 = _mm256_loadu_si256((const __m256i *)(wp + i * NR + 16));                  \
            BF16_ROW_DOT(0) BF16_ROW_DOT(1) BF16_ROW_DOT(2) BF16_ROW_DOT(3)                        \
            BF16_ROW_DOT(4) BF16_ROW_DOT(5) BF16_ROW_DOT(6) BF16_ROW_DOT(7)                        \
        }                                                                                          \
        float acc[BF16_MR][NR];                                                                    \
        BF16_ROW_SAVE(0) BF16_ROW_SAVE(1) BF16_ROW_SAVE(2) BF16_ROW_SAVE(3)                        \
        BF16_ROW_SAVE(4) BF16_ROW_SAVE(5) BF16_ROW_SAVE(6) BF16_ROW_SAVE(7)                        \
        bf16_finish(acc, bias, Y, ldy, mr, cols);                                                  \
    }
/* Past 8 tokens: blocks of 4 tokens on two full panels at once (wp0, wp1 -> Y0, Y1), each
 * broadcast pair feeding four dot-product instructions instead of two (as gemm_packed_f32.c's
 * pair kernel: the 8-token kernel's eight broadcasts a step hold it under the FMA peak). The
 * same instructions in the same order per lane: bitwise the 8-token kernel's sums. */
#define BF16_PAIR_ROWS 4
#define BF16_ROW_DOT_PAIR(R)                                                                       \
    if (R < mr) {                                                                                  \
        __m512i x2 = _mm512_set1_epi32((int)Xb[R * K2 + i]);                                       \
        __m256bh xh = (__m256bh)_mm512_castsi512_si256(x2);                                        \
        a##R = _mm512_dpbf16_ps(a##R, (__m512bh)x2, (__m512bh)w16);                                \
        b##R = _mm256_dpbf16_ps(b##R, xh, (__m256bh)w8);                                           \
        c##R = _mm512_dpbf16_ps(c##R, (__m512bh)x2, (__m512bh)v16);                                \
        d##R = _mm256_dpbf16_ps(d##R, xh, (__m256bh)v8);                                           \
    }
#define BF16_ROW_SAVE_PAIR(R)                                                                      \
    if (R < mr) {                                                                                  \
        _mm512_storeu_ps(acc0[R], a##R);                                                           \
        _mm256_storeu_ps(acc0[R] + 16, b##R);                                                      \
        _mm512_storeu_ps(acc1[R], c##R);                                                           \
        _mm256_storeu_ps(acc1[R] + 16, d##R);                                                      \
    }
#define BF16_PAIR(MRX)                                                                             \
    static void bf16_pair_##MRX(const uint32_t *wp0, const uint32_t *wp1, const uint32_t *Xb,      \
                                long K2, const float *bias0, const float *bias1, float *Y0,        \
                                float *Y1, long ldy) {                                             \
        const int mr = MRX;                                                                        \
        ACCUMULATORS_PAIR;                                                                         \
        for (long i = 0; i < K2; ++i) {                                                            \
            __m512i w16 = _mm512_loadu_si512((const void *)(wp0 + i * NR));                        \
            __m256i w8 = _mm256_loadu_si256((const __m256i *)(wp0 + i * NR + 16));                 \
            __m512i v16 = _mm512_loadu_si512((const void *)(wp1 + i * NR));                        \
            __m256i v8 = _mm256_loadu_si256((const __m256i *)(wp1 + i * NR + 16));                 \
            BF16_ROW_DOT_PAIR(0) BF16_ROW_DOT_PAIR(1) BF16_ROW_DOT_PAIR(2) BF16_ROW_DOT_PAIR(3)    \
        }                                                                                          \
        float acc0[BF16_MR][NR], acc1[BF16_MR][NR];                                                \
        BF16_ROW_SAVE_PAIR(0) BF16_ROW_SAVE_PAIR(1) BF16_ROW_SAVE_PAIR(2) BF16_ROW_SAVE_PAIR(3)    \
        bf16_finish(acc0, bias0, Y0, ldy, mr, NR);                                                 \
        bf16_finish(acc1, bias1, Y1, ldy, mr, NR);                                                 \
    }
BF16_PAIR(1)
BF16_PAIR(2)
BF16_PAIR(3)
BF16_PAIR(4)
typedef void (*bf16_pair_fn)(const uint32_t *, const uint32_t *, const uint32_t *, long,
                             const float *, const float *, float *, float *, long);
static const bf16_pair_fn BF16_PAIRS[BF16_PAIR_ROWS + 1] = {0, bf16_pair_1, bf16_pair_2,
                                                            bf16_pair_3, bf16_pair_4};
#elif defined(__AVX2__)
/* a lane's pair widened: odd = the high half, even = the low half shifted up */
#define BF16_ROW_FMA(R)                                                                            \
    if (R < mr) {                                                                                  \
        __m256i x2 = _mm256_set1_epi32((int)Xb[R * K2 + i]);                                       \
        __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(x2, high)),                               \
               xe = _mm256_castsi256_ps(_mm256_slli_epi32(x2, 16));                                \
        c##R##0 = _mm256_fmadd_ps(we0, xe, _mm256_fmadd_ps(wo0, xo, c##R##0));                     \
        c##R##1 = _mm256_fmadd_ps(we1, xe, _mm256_fmadd_ps(wo1, xo, c##R##1));                     \
        c##R##2 = _mm256_fmadd_ps(we2, xe, _mm256_fmadd_ps(wo2, xo, c##R##2));                     \
    }
#define BF16_ROW_SAVE(R)                                                                           \
    if (R < mr) {                                                                                  \
        _mm256_storeu_ps(acc[R], c##R##0);                                                         \
        _mm256_storeu_ps(acc[R] + 8, c##R##1);                                                     \
        _mm256_storeu_ps(acc[R] + 16, c##R##2);                                                    \
    }
#define BF16_WIDEN(J)                                                                              \
    __m256i w##J = _mm256_loadu_si256((const __m256i *)(wp + i * NR + 8 * J));                     \
    __m256 wo##J = _mm256_castsi256_ps(_mm256_and_si256(w##J, high)),                              \
           we##J = _mm256_castsi256_ps(_mm256_slli_epi32(w##J, 16));
#define BF16_MICRO(MRX)                                                                            \
    static void bf16_micro_##MRX(const uint32_t *wp, const uint32_t *Xb, long K2,                  \
                                 const float *bias, float *Y, long ldy, int cols,                  \
                                 const uint32_t *pf) {                                             \
        const int mr = MRX;                                                                        \
        const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);                                  \
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00,              \
               c12 = c00, c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;        \
        for (long i = 0; i < K2; ++i) {                                                            \
            if (pf) { /* the next panel's row i into L2 (one token block: no time otherwise) */  \
                _mm_prefetch((const char *)(pf + i * NR), _MM_HINT_T1);                            \
                _mm_prefetch((const char *)(pf + i * NR + 16), _MM_HINT_T1);                       \
            }                                                                                      \
            BF16_WIDEN(0) BF16_WIDEN(1) BF16_WIDEN(2)                                              \
            BF16_ROW_FMA(0) BF16_ROW_FMA(1) BF16_ROW_FMA(2) BF16_ROW_FMA(3)                        \
        }                                                                                          \
        float acc[BF16_MR][NR];                                                                    \
        BF16_ROW_SAVE(0) BF16_ROW_SAVE(1) BF16_ROW_SAVE(2) BF16_ROW_SAVE(3)                        \
        bf16_finish(acc, bias, Y, ldy, mr, cols);                                                  \
    }
#else
#define BF16_MICRO(MRX)                                                                            \
    static void bf16_micro_##MRX(const uint32_t *wp, const uint32_t *Xb, long K2,                  \
                                 const float *bias, float *Y, long ldy, int cols,                  \
                                 const uint32_t *pf) {                                             \
        float acc[BF16_MR][NR] = {{0}};                                                            \
        (void)pf;                                                                                  \
        for (long i = 0; i < K2; ++i)                                                              \
            for (int r = 0; r < MRX; ++r) {                                                        \
                uint32_t x2 = Xb[r * K2 + i];                                                      \
                float xo = odd_of(x2), xe = even_of(x2);                                           \
                for (int j = 0; j < NR; ++j) {                                                     \
                    uint32_t w2 = wp[i * NR + j];                                                  \
                    acc[r][j] = fmaf(even_of(w2), xe, fmaf(odd_of(w2), xo, acc[r][j]));            \
                }                                                                                  \
            }                                                                                      \
        bf16_finish(acc, bias, Y, ldy, MRX, cols);                                                 \
    }
#endif

BF16_MICRO(1)
BF16_MICRO(2)
BF16_MICRO(3)
BF16_MICRO(4)
#if BF16_MR == 8
BF16_MICRO(5)
BF16_MICRO(6)
BF16_MICRO(7)
BF16_MICRO(8)
#endif

typedef void (*bf16_micro_fn)(const uint32_t *, const uint32_t *, long, const float *, float *,
                              long, int, const uint32_t *);
#if BF16_MR == 8
static const bf16_micro_fn BF16_MICROS[BF16_MR + 1] = {
    0, bf16_micro_1, bf16_micro_2, bf16_micro_3, bf16_micro_4,
    bf16_micro_5, bf16_micro_6, bf16_micro_7, bf16_micro_8};
#else
static const bf16_micro_fn BF16_MICROS[BF16_MR + 1] = {0, bf16_micro_1, bf16_micro_2,
                                                       bf16_micro_3, bf16_micro_4};
#endif

#ifdef GEMM_BF16_AMX
/* tokens [0, mr) (at most 32) of Y (row stride N) = their tiles a (ksteps k-steps a row) times
 * panel wp (+ bias, `cols` of its columns): stored straight into Y when the block is whole */
static void bf16_tile_block(const uint32_t *wp, long K2, const uint16_t *a, long ksteps,
                            const float *bias, float *y, long N, long mr, int cols,
                            uint32_t *pad) {
    if (mr == AMX_BLOCK_TOKENS && cols == NR) {
        AMX_PANEL_BLOCK(_tile_dpbf16ps, a, ksteps, wp, K2, 1, y, N, pad);
        if (bias)
            for (long r = 0; r < mr; ++r)
                for (int j = 0; j < NR; ++j) y[r * N + j] += bias[j];
        return;
    }
    float C[AMX_BLOCK_TOKENS][NR];
    AMX_PANEL_BLOCK(_tile_dpbf16ps, a, ksteps, wp, K2, mr > 16, &C[0][0], NR, pad);
    bf16_finish(C, bias, y, N, (int)mr, cols);
}
#endif

/* whether a product of M tokens runs on AMX tiles here (built with them, M past the threshold,
 * the kernel's permission granted): their sums are in the hardware's own order */
int gemm_bf16_tiles(long M) {
#ifdef GEMM_BF16_AMX
    return M >= BF16_AMX_MIN_TOKENS && amx_ready();
#else
    (void)M;
    return 0;
#endif
}

/* gemm_bf16(Wp, X, bias, Y, M, N, K, threads): Wp the bf16 panels, X [M][K] fp32 (rounded to
 * bf16 here, K padded to pairs), Y [M][N] — the signature of the packed fp32 GEMMs. With AMX the
 * rounded rows are also padded to whole tiles (16 tokens, 16 pairs) with zeros. */
void gemm_bf16(const uint32_t *Wp, const float *X, const float *bias, float *Y, long M, long N,
               long K, int num_threads) {
    if (M <= 0 || N <= 0) return;
    long panels = (N + NR - 1) / NR, K2 = (K + 1) / 2;
    const int amx = gemm_bf16_tiles(M);
    /* pairs a row of Xb (whole tiles with AMX), and its rows */
    const long ldx = amx ? (K2 + 15) / 16 * 16 : K2, rows = amx ? (M + 15) / 16 * 16 : M;
    uint16_t *Xb = malloc(sizeof(uint16_t) * (size_t)(rows * 2 * ldx));
#pragma omp parallel num_threads(num_threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals(); /* (vdpbf16ps flushes denormals whatever MXCSR says; so do these) */
#ifdef GEMM_BF16_AMX
        if (amx) { /* tile by tile (amx_bf16.h) */
            amx_bf16_tokens(X, M, K, ldx / 16, Xb);
        } else
#endif
        {
#pragma omp for schedule(static)
            for (long m = 0; m < M; ++m) {
                long k = 0;
#ifdef GEMM_BF16_NATIVE /* (vcvtneps2bf16 rounds to nearest even too; it flushes denormals, \
                           which every product here treats as zeros anyway) */
                for (; k + 16 <= K; k += 16) {
                    __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(X + m * K + k));
                    _mm256_storeu_si256((__m256i *)(Xb + m * 2 * K2 + k), (__m256i)b);
                }
#endif
                for (; k < K; ++k) Xb[m * 2 * K2 + k] = to_bf16(X[m * K + k]);
                if (K % 2) Xb[m * 2 * K2 + K] = 0;
            }
        }
#ifdef GEMM_BF16_AMX
        if (amx) { /* 32 tokens x a panel's 24 columns a block: each thread its own panels,
                    * ~512 KB of them at a time (kept in L2), every block of 32 tokens across
                    * them in turn (Y's rows written a group's width at once) */
            uint32_t pad[AMX_ROWS * NR];
            const int t = omp_get_thread_num(), threads = omp_get_num_threads();
            const long p0 = panels * t / threads, p1 = panels * (t + 1) / threads;
            const long group = amx_group(K2 * NR * 4);
            amx_configure();
            for (long g = p0; g < p1; g += group) {
                const long g1 = g + group < p1 ? g + group : p1;
                for (long m = 0; m < M; m += AMX_BLOCK_TOKENS) {
                    const uint16_t *a = Xb + amx_tiled_offset(m, 0, ldx / 16) / 2;
                    const long mr = M - m < AMX_BLOCK_TOKENS ? M - m : AMX_BLOCK_TOKENS;
                    for (long p = g; p < g1; ++p)
                        bf16_tile_block(Wp + p * K2 * NR, K2, a, ldx / 16, bias ? bias + p * NR : 0,
                                        Y + m * N + p * NR, N, mr,
                                        (int)(N - p * NR < NR ? N - p * NR : NR), pad);
                }
            }
            _tile_release();
        } else
#endif
#ifdef GEMM_BF16_NATIVE
        if (M > BF16_MR) { /* full panels in pairs, a last odd or partial one alone */
            const long pairs = N / NR / 2, units = panels - pairs;
#pragma omp for schedule(static)
            for (long u = 0; u < units; ++u) {
                const long p = pair_unit_panel(u, pairs), n0 = p * NR;
                const uint32_t *wp = Wp + p * K2 * NR;
                const float *b = bias ? bias + n0 : 0;
                if (u < pairs) {
                    for (long m = 0; m < M; m += BF16_PAIR_ROWS) {
                        long mr = M - m < BF16_PAIR_ROWS ? M - m : BF16_PAIR_ROWS;
                        BF16_PAIRS[mr](wp, wp + K2 * NR, (const uint32_t *)Xb + m * K2, K2, b,
                                       b ? b + NR : 0, Y + m * N + n0, Y + m * N + n0 + NR, N);
                    }
                    continue;
                }
                int cols = (int)(N - n0 < NR ? N - n0 : NR);
                for (long m = 0; m < M; m += BF16_MR)
                    BF16_MICROS[M - m < BF16_MR ? M - m : BF16_MR](
                        wp, (const uint32_t *)Xb + m * K2, K2, b, Y + m * N + n0, N, cols, 0);
            }
        } else
#endif
        {
#pragma omp for schedule(static)
            for (long p = 0; p < panels; ++p) {
                long n0 = p * NR;
                int cols = (int)(N - n0 < NR ? N - n0 : NR);
                const uint32_t *wp = Wp + p * K2 * NR;
                const uint32_t *pf = M <= BF16_MR && p + 1 < panels ? wp + K2 * NR : 0;
                for (long m = 0; m < M; m += BF16_MR)
                    BF16_MICROS[M - m < BF16_MR ? M - m : BF16_MR](
                        wp, (const uint32_t *)Xb + m * K2, K2, bias ? bias + n0 : 0,
                        Y + m * N + n0, N, cols, pf);
            }
        }
    }
    free(Xb);
}
#endif /* GEMM_BF16_C */
