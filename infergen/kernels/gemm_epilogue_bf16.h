/* The GEMM-with-epilogue template (gemm_epilogue_f32.h) on bf16 panels (ops/linear_bf16.py's
 * layout) with AMX-BF16 tiles: each 32-token block of panel p of every part is computed into a
 * tile on the stack (amx.h's block: the same tile products, in the same order, on the same
 * tiled tokens as gemm_bf16 — so bitwise the product gemm_bf16 writes), the bias added, and
 * EPI_TAIL writes the block's NR output columns straight into Y. The product is never written
 * to memory (SwiGLU's gate_up: 512 tokens x 3072 fp32 columns, 6.3 MB, a layer).
 *
 * Defines EPI_NAME##_bf16, with EPI_NAME's signature (Wp the bf16 panels), returning 1 when it
 * ran: where the build has AMX-BF16 tiles, the kernel grants them and M reaches
 * BF16_AMX_MIN_TOKENS (gemm_bf16's own condition for tiles); else 0, and the caller runs
 * gemm_bf16, then the tail. Include after gemm_epilogue_f32.h, with the same EPI_* defined. */
#include <omp.h>
#include <stdlib.h>

#include "amx_bf16.h"

#define EPI_BF16_(name) name##_bf16
#define EPI_BF16(name) EPI_BF16_(name)

int EPI_BF16(EPI_NAME)(const void *Wp, const float *X, const float *bias, float *Y, long ldy,
                       long M, long N, long K, int threads) {
#ifdef AMX_BF16
    if (M < BF16_AMX_MIN_TOKENS || N <= 0 || !amx_ready()) return 0;
    const long part = N / EPI_PARTS, panels = part / AMX_LANES, K2 = (K + 1) / 2;
    const long steps = (K2 + 15) / 16, rows = (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    const long group = (amx_group(K2 * AMX_LANES * 4) + EPI_PARTS - 1) / EPI_PARTS; /* units */
    const uint32_t *W = (const uint32_t *)Wp;
    uint16_t *Xb = malloc(sizeof(uint16_t) * (size_t)(rows * 32 * steps));
#pragma omp parallel num_threads(threads) if (M * N * K >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        amx_bf16_tokens(X, M, K, steps, Xb);
        const int t = omp_get_thread_num(), team = omp_get_num_threads();
        const long p0 = panels * t / team, p1 = panels * (t + 1) / team;
        float tile[AMX_BLOCK_TOKENS * EPI_PARTS * AMX_LANES];
        const long tile_stride = EPI_PARTS * AMX_LANES;
        uint32_t pad[AMX_ROWS * AMX_LANES];
        amx_configure();
        for (long g = p0; g < p1; g += group) {
            const long g1 = g + group < p1 ? g + group : p1;
            for (long m = 0; m < M; m += AMX_BLOCK_TOKENS) {
                const uint16_t *a = Xb + amx_tiled_offset(m, 0, steps) / 2;
                const long mr = M - m < AMX_BLOCK_TOKENS ? M - m : AMX_BLOCK_TOKENS;
                for (long p = g; p < g1; ++p) {
                    for (long s = 0; s < EPI_PARTS; ++s) {
                        const long q = p + s * panels; /* panel p of part s */
                        float *c = tile + s * AMX_LANES;
                        AMX_PANEL_BLOCK(_tile_dpbf16ps, a, steps, W + q * K2 * AMX_LANES, K2,
                                        mr > 16, c, tile_stride, pad);
                        if (bias)
                            for (long r = 0; r < mr; ++r)
                                for (int j = 0; j < AMX_LANES; ++j)
                                    c[r * tile_stride + j] += bias[q * AMX_LANES + j];
                    }
                    const void *in[1] = {tile};
                    const long in_stride[1] = {tile_stride};
                    void *out[1] = {Y + m * ldy + p * AMX_LANES};
                    const long out_stride[1] = {ldy};
                    EPI_TAIL(in, in_stride, out, out_stride, mr, 1);
                }
            }
        }
        _tile_release();
    }
    free(Xb);
    return 1;
#else
    (void)Wp, (void)X, (void)bias, (void)Y, (void)ldy, (void)M, (void)N, (void)K, (void)threads;
    return 0;
#endif
}
