/* The interface of gemm_packed_f32.c's micro-kernels, for the kernels that drive them from
 * another translation unit (the generated GEMM epilogues: gemm_epilogue_f32.h): the panel
 * width, the token-block heights, the tuner's knobs, and the micro-kernel tables. */
#pragma once
#include "common.h"

#define NR 24 /* columns per packed weight panel */

/* Y[r, 0..cols) = sum_k X[r, k] * wp[k, 0..cols) (+ bias) for the micro-kernel's rows:
 * (wp, X, K, Y, ldy, bias, cols, prefetch, pf_step); `prefetch` (or NULL) is prefetched one
 * k-row of pf_step floats per k */
typedef void (*micro_fn)(const float *, const float *, long, float *, long, const float *, int,
                         const float *, long);

/* rows per token block past 8 tokens: the widest micro-kernel (8 x 24 with AVX-512) */
#ifdef __AVX512F__
#define TOP_ROWS 8
#else
#define TOP_ROWS 4
#endif

/* Knobs a generated layer program may set (the tuner's variants, compiler/program_tune.py):
 * GEMM_SMALL_TOP, up to 8 tokens in blocks of 4 rows (0: two blocks past 4 tokens, the first
 * prefetching the next panel) or in one block of the widest micro-kernel (1; the same with
 * AVX2, whose widest is 4 rows); GEMM_PREFETCH_PANELS, with a single token block, the panel
 * that far ahead prefetched a k-row per k while this one is computed (0: none, the hardware
 * prefetcher alone). Every choice sums the same products in the same order: same results.
 * A translation unit and the library whose micro-kernels it calls must agree on them. */
#ifndef GEMM_SMALL_TOP
#define GEMM_SMALL_TOP 0
#endif
#ifndef GEMM_PREFETCH_PANELS
#define GEMM_PREFETCH_PANELS 0
#endif
/* rows per token block up to 8 tokens */
#if GEMM_SMALL_TOP
#define SMALL_ROWS TOP_ROWS
#else
#define SMALL_ROWS 4
#endif

/* Token block j of `blocks` near-equal blocks over M rows starts at row j * M / blocks: 5 rows
 * in blocks of at most 4 are 3 + 2, not 4 + 1 — a block of one row re-reads its panel from L2
 * for a single FMA per weight, which cost a 5-row product 1.82x a 1-row one (Gemma-3-270M's LM
 * head, 262144 x 640, 2 threads, Zen 4: 20.6 ms against 11.3; 4 rows 13.9), 9 rows 2.3x. Every
 * output row sums the same FMAs in the same k order whatever its block: same results. */
static inline long block_start(long j, long M, long blocks) { return j * M / blocks; }

/* the micro-kernel per block height (index = rows): up to 8 tokens (small) or past 8 */
const micro_fn *gemm_packed_f32_micros(int small);

#ifdef __AVX512F__
/* Past 8 tokens with AVX-512, token blocks of PAIR_ROWS rows run on two full panels at once:
 * Y0[r, 0..NR) from panel wp0 and Y1[r, 0..NR) from wp1 (+ bias0 / bias1, either NULL), for
 * the micro-kernel's rows: (wp0, wp1, X, K, Y0, Y1, ldy, bias0, bias1, prefetch, pf_step).
 * Each broadcast token value feeds four FMAs instead of two: the 8 x 24 kernel's eight
 * broadcasts a k-step take issue slots the FMAs need (~88 % of the FMA peak on Zen 4, where
 * this one reaches ~100 %). The same FMAs in the same k order: bitwise the 8 x 24 kernel. */
typedef void (*pair_fn)(const float *, const float *, const float *, long, float *, float *,
                        long, const float *, const float *, const float *, long);
#define PAIR_ROWS 4
/* the pair micro-kernel per block height (index = rows, 1..PAIR_ROWS) */
const pair_fn *gemm_packed_f32_pairs(void);

/* What token block j of a pair prefetches while it computes: the next unit's two panels (next0,
 * next1; NULL: none) spread over the blocks, floats [j*K*step, (j+1)*K*step) of their 2 x NR
 * columns of K floats each. */
static inline const float *pair_prefetch(const float *next0, const float *next1, long j,
                                         long step, long K) {
    const long at = j * step;
    if (!next0 || at >= 2 * NR) return 0;
    return at < NR ? next0 + at * K : next1 + (at - NR) * K;
}
#endif

void gemm_packed_f32(const float *Wp, const float *X, const float *bias, float *Y, long M, long N,
                     long K, int num_threads);
