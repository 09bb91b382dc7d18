/* The kernels of the generated layer programs (layer_kernels.h), one shared library per set
 * of the program variant's knob macros (DECODE_ATTN_CHUNK, GEMM_SMALL_TOP,
 * GEMM_PREFETCH_PANELS, PARALLEL_MIN_ELEMENTS: compiler/program_variants.py), given as -D
 * flags (kernels/build.py library). Built with -Wl,-Bsymbolic: its calls between its own
 * functions stay inside it whatever else the process has loaded. */
#include "decode_layers_f32.c"
#include "layer_kernels.h"
#include "paged_prefill_attention_f32.c"

void lk_gemm_any(long format, const float *W, const float *X, const float *B, float *Y, long M,
                 long N, long K, int threads) {
    gemm_any(format, W, X, B, Y, M, N, K, threads);
}

void lk_decode_attention(const float *q, const void *k_cache, const void *v_cache,
                         const float *k_scales, const float *v_scales, const long *block_tables,
                         long max_blocks, const long *seq_lens, float *out, long batch,
                         long heads, long kv_heads, long dim, long block_size, float scale,
                         long window, const float *sinks, int threads) {
    decode_attention(q, k_cache, v_cache, k_scales, v_scales, block_tables, max_blocks,
                     seq_lens, out, batch, heads, kv_heads, dim, block_size, scale, window,
                     sinks, threads);
}

void lk_store_e4m3(const float *x, uint8_t *dst, const float *scale, const float *shift,
                   long kv_heads, long dim) {
    store_e4m3(x, dst, scale, shift, kv_heads, dim);
}
