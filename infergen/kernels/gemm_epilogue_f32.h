/* A packed-panel fp32 GEMM whose pointwise tail runs on each output tile while it is in L1:
 * the template of the GEMM-with-epilogue kernels that compiler/codegen_gemm.py generates.
 *
 * The GEMM's N output columns are EPI_PARTS equal parts (1: the tail reads column n of the
 * product; 2: it pairs column n with column n + N/2, as SwiGLU's silu(gate) · up does), each
 * a whole number of NR-column panels. Per panel p of the first part and token block: the
 * micro-kernels of gemm_packed_f32.c (in a library the kernel links against: layer_kernels for
 * the layer programs, gemm_packed_f32 for the walker's fused GEMMs) compute panel p of every
 * part into a tile on the stack (EPI_PARTS x NR columns of up to TOP_ROWS rows), then
 * EPI_TAIL — the generated tail,
 * rendered for a row of EPI_PARTS x NR columns — writes its NR output columns of each row of
 * the block straight into Y. The product itself is never written to memory.
 *
 * Before including, define:
 *   EPI_NAME   the function's name
 *   EPI_PARTS  1 or 2
 *   EPI_TAIL   void (const void **in, const long *row_stride, void **out,
 *                    const long *out_stride, long T, int threads)
 *
 * void EPI_NAME(const float *Wp, const float *X, const float *bias, float *Y, long ldy,
 *               long M, long N, long K, int threads)
 * Wp [N/NR][K][NR] (gemm_packed_f32's layout, N a multiple of EPI_PARTS x NR), X [M][K],
 * bias [N] or NULL, Y [M][ldy] (the tail's N / EPI_PARTS output columns per row).
 * The same micro-kernels with the same FMAs in the same order as gemm_packed_f32: the product
 * the tail sees is bitwise the one the unfused GEMM writes.
 */
#include "gemm_packed_f32.h"

#ifdef __AVX512F__
/* Past 8 tokens with AVX-512: two panels per micro-kernel call (gemm_packed_f32.h's pairs),
 * blocks of PAIR_ROWS tokens. With 2 parts a unit is panel p of both parts (the tile row is the
 * tail's whole input); with 1 part, panels p and p + 1 (the tail runs on each half), a last odd
 * panel alone on the 8 x 24 kernel. */
#define EPI_PAIRS_(name) name##_pairs
#define EPI_PAIRS(name) EPI_PAIRS_(name)
static void EPI_PAIRS(EPI_NAME)(const float *Wp, const float *X, const float *bias, float *Y,
                                long ldy, long M, long N, long K, int threads) {
    const long part = N / EPI_PARTS, panels = part / NR;
    const long pairs = EPI_PARTS == 2 ? panels : panels / 2;
    const long units = EPI_PARTS == 2 ? panels : panels - pairs;
    const long partner = EPI_PARTS == 2 ? panels : 1; /* the second panel's offset */
    const long blocks = (M + PAIR_ROWS - 1) / PAIR_ROWS;
    const long pf_step = (2 * NR + blocks - 1) / blocks;
    const pair_fn *pair = gemm_packed_f32_pairs();
    const micro_fn *micros = gemm_packed_f32_micros(0);
#pragma omp parallel num_threads(threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        float tile[TOP_ROWS * 2 * NR];
        const long tile_stride = 2 * NR;
#pragma omp for schedule(static)
        for (long u = 0; u < units; ++u) {
            const long p = EPI_PARTS == 2 ? u : pair_unit_panel(u, pairs);
            const float *wp = Wp + p * K * NR;
            const float *b = bias ? bias + p * NR : 0;
            if (u >= pairs) { /* a lone panel (1 part, odd count) */
                const long lone = (M + TOP_ROWS - 1) / TOP_ROWS;
                for (long j = 0; j < lone; ++j) {
                    long m = block_start(j, M, lone), mr = block_start(j + 1, M, lone) - m;
                    micros[mr](wp, X + m * K, K, tile, NR, b, NR, 0, 0);
                    const void *in[1] = {tile};
                    const long in_stride[1] = {NR};
                    void *out[1] = {Y + m * ldy + p * NR};
                    const long out_stride[1] = {ldy};
                    EPI_TAIL(in, in_stride, out, out_stride, mr, 1);
                }
                continue;
            }
            const long step = EPI_PARTS == 2 ? 1 : 2; /* panels to the next unit */
            const float *next0 = u + 1 < pairs ? wp + step * K * NR : 0;
            const float *next1 = next0 ? next0 + partner * K * NR : 0;
            for (long j = 0; j < blocks; ++j) {
                long m = block_start(j, M, blocks), mr = block_start(j + 1, M, blocks) - m;
                const float *pf = pair_prefetch(next0, next1, j, pf_step, K);
                pair[mr](wp, wp + partner * K * NR, X + m * K, K, tile, tile + NR, tile_stride, b,
                         b ? b + partner * NR : 0, pf, pf_step);
                for (long h = 0; h < 3 - EPI_PARTS; ++h) { /* 2 parts: once; 1 part: per half */
                    const void *in[1] = {tile + h * NR};
                    const long in_stride[1] = {tile_stride};
                    void *out[1] = {Y + m * ldy + (p + h) * NR};
                    const long out_stride[1] = {ldy};
                    EPI_TAIL(in, in_stride, out, out_stride, mr, 1);
                }
            }
        }
    }
}
#endif

void EPI_NAME(const float *Wp, const float *X, const float *bias, float *Y, long ldy, long M,
              long N, long K, int threads) {
    if (M <= 0 || N <= 0) return;
#ifdef __AVX512F__
    if (M > 8) {
        EPI_PAIRS(EPI_NAME)(Wp, X, bias, Y, ldy, M, N, K, threads);
        return;
    }
#endif
    const long part = N / EPI_PARTS, panels = part / NR;
    const long rows = M > 8 ? TOP_ROWS : SMALL_ROWS;
    const micro_fn *micros = gemm_packed_f32_micros(M <= 8);
    const long blocks = (M + rows - 1) / rows;
    const long pf_step = (NR + blocks - 1) / blocks;
    const long ahead = blocks > 1 ? 1 : GEMM_PREFETCH_PANELS;
#pragma omp parallel num_threads(threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        float tile[TOP_ROWS * EPI_PARTS * NR];
        const long tile_stride = EPI_PARTS * NR;
#pragma omp for schedule(static)
        for (long p = 0; p < panels; ++p) {
            for (long j = 0; j < blocks; ++j) {
                long m = block_start(j, M, blocks), mr = block_start(j + 1, M, blocks) - m;
                for (long s = 0; s < EPI_PARTS; ++s) {
                    long q = p + s * panels; /* panel p of part s */
                    const float *wp = Wp + q * K * NR;
                    const float *next =
                        (ahead && p + ahead < panels) ? wp + ahead * K * NR : 0;
                    const float *pf = next && j * pf_step < NR ? next + j * K * pf_step : 0;
                    micros[mr](wp, X + m * K, K, tile + s * NR, tile_stride,
                               bias ? bias + q * NR : 0, NR, pf, pf_step);
                }
                const void *in[1] = {tile};
                const long in_stride[1] = {tile_stride};
                void *out[1] = {Y + m * ldy + p * NR};
                const long out_stride[1] = {ldy};
                EPI_TAIL(in, in_stride, out, out_stride, mr, 1);
            }
        }
    }
}
