/* What a generated layer program (compiler/codegen_layer.py) calls: the kernels of
 * layer_kernels.c, a shared library the program links against (built once per set of the
 * program variant's macros: compiler/program.py), so a program's own compile is its generated
 * code alone — not the ~5 s of the kernels it used to include. */
#pragma once
#include <stdint.h>

#include "step_args.h"

/* one projection in its weight format (decode_layers_f32.c's gemm_any) */
void lk_gemm_any(long format, const float *W, const float *X, const float *B, float *Y, long M,
                 long N, long K, int threads);
/* decode attention over the paged cache, fp32 or FP8 E4M3 codes (paged_decode_attention_f32.c);
 * sinks: learned sink logits per head, or NULL */
void lk_decode_attention(const float *q, const void *k_cache, const void *v_cache,
                         const float *k_scales, const float *v_scales, const long *block_tables,
                         long max_blocks, const long *seq_lens, float *out, long batch,
                         long heads, long kv_heads, long dim, long block_size, float scale,
                         long window, const float *sinks, int threads);
/* a cache row's FP8 codes of (x - shift) / scale per KV head (decode_layers_f32.c) */
void lk_store_e4m3(const float *x, uint8_t *dst, const float *scale, const float *shift,
                   long kv_heads, long dim);
/* prefill attention over the paged cache (paged_prefill_attention_f32.c); sinks as above */
void paged_prefill_attention_f32(const float *q, long q_stride, const float *k_cache,
                                 const float *v_cache, const int32_t *query_start,
                                 const int32_t *query_lens, const int32_t *seq_lens,
                                 const int32_t *block_tables, long max_blocks, long prefills,
                                 float *out, long heads, long kv_heads, long dim,
                                 long block_size, float scale, long window, const float *sinks,
                                 int num_threads);
