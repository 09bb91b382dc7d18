/* Every decoder layer of a decode step in one call: the same kernels the per-op path calls
 * from Python (rms_norm, gemm_packed, rope, paged decode attention, silu_mul), in the same
 * order with the same arguments, so the results are bit-identical to it — without ~10 Python
 * calls, tensor allocations and module dispatches per layer.
 *
 * Per layer (T tokens, one per sequence; h [T, hidden] is the residual stream, `delta` the
 * pending output of the previous layer's MLP):
 *   x = rms_norm(h += delta, attn_norm);  qkv = x Wqkvᵀ + b;  rope(q, k);  cache[slot] = k, v
 *   a = attention(q, cache);  o = a Woᵀ + b;  x = rms_norm(h += o, mlp_norm)
 *   delta = down(silu(gate) · up)
 */
#include <omp.h>
#include <string.h>

#include "argmax_f32.c"
#include "gemm_bf16.c"
#include "gemm_packed_f32.c"
#include "gemm_packed_g_f32.c"
#include "gemm_packed_q_f32.c"
#include "gemm_w4a8_i8.c"
#include "gemm_w8a8_i8.c"
#include "minifloat.h"
#include "paged_decode_attention_f32.c"
#include "rms_norm_f32.c"
#include "rope_f32.c"
#include "silu_mul_f32.c"
#include "step_args.h"

/* Seconds spent per phase since the last reset, summed over layers and calls (for profiling:
 * decode_layers_profile copies them out; 9 phases in the order of the loop below, then
 * decode_step_f32's head: 3). */
#define N_PHASES 12
static double phase_seconds[N_PHASES];
static int profiling = 0;

void decode_layers_profile(int enable, double *out) {
    if (out) memcpy(out, phase_seconds, sizeof phase_seconds);
    memset(phase_seconds, 0, sizeof phase_seconds);
    profiling = enable;
}

#define PHASE(i, call)                                            \
    do {                                                          \
        double t0_ = profiling ? omp_get_wtime() : 0.0;           \
        call;                                                     \
        if (profiling) phase_seconds[i] += omp_get_wtime() - t0_; \
    } while (0)

typedef struct {
    const float *attn_norm, *qkv_w, *qkv_b, *o_w, *o_b;
    const float *mlp_norm, *gate_up_w, *gate_up_b, *down_w, *down_b;
    float *k_cache, *v_cache; /* [blocks, block_size, kv_heads, dim] */
    /* each projection's panels (qkv, o, gate_up, down): 0 fp32, 1 int8, 2 FP8 E4M3 codes,
     * 3 Q4_0, 4 Q4_1, 5 Q8_0, 6 int4, 7 int4_asym, 8 MXFP4, 9 NVFP4 groups, 10 bf16 pairs
     * (LinearBackend.decode_format); with the input quantized to int8 per token and integer
     * sums (LinearBackend.quantized_decode_formats): 11 int8 (W8A8), 12 Q4_0, 13 Q4_1,
     * 14 int4, 15 int4_asym (W4A8) */
    long formats[4];
    /* FP8 E4M3 KV cache (kvcache/kv_format.py): k_cache / v_cache hold codes of
     * (k − k_shift) / k_scale and v / v_scale per KV head; NULL scales: fp32 values */
    const float *k_scale, *v_scale, *k_shift;
} layer_weights;

/* cache row ← codes of (x − shift) / scale per KV head, as kv_format.encode computes them */
static void store_e4m3(const float *x, uint8_t *dst, const float *scale, const float *shift,
                       long kv_heads, long dim) {
    static const elem_t e4m3 = {3, -6, 8, 0x7E, 0x7F, 448.0f};
    for (long h = 0; h < kv_heads; ++h)
        for (long j = 0; j < dim; ++j) {
            float v = x[h * dim + j] - (shift ? shift[h * dim + j] : 0.0f);
            dst[h * dim + j] = encode(v / scale[h], &e4m3);
        }
}

/* One projection in its weight format (the per-op path's LINEAR_BACKENDS row). */
static inline void gemm_any(long format, const float *W, const float *X, const float *B,
                            float *Y, long M, long N, long K, int threads) {
    const uint8_t *Q = (const uint8_t *)W;
    switch (format) {
    case 1: gemm_packed_i8_f32(Q, X, B, Y, M, N, K, threads); break;
    case 2: gemm_packed_e4m3_f32(Q, X, B, Y, M, N, K, threads); break;
    case 3: gemm_packed_q4_0_f32(Q, X, B, Y, M, N, K, threads); break;
    case 4: gemm_packed_q4_1_f32(Q, X, B, Y, M, N, K, threads); break;
    case 5: gemm_packed_q8_0_f32(Q, X, B, Y, M, N, K, threads); break;
    case 6: gemm_packed_int4_f32(Q, X, B, Y, M, N, K, threads); break;
    case 7: gemm_packed_int4_asym_f32(Q, X, B, Y, M, N, K, threads); break;
    case 8: gemm_packed_mxfp4_f32(Q, X, B, Y, M, N, K, threads); break;
    case 9: gemm_packed_nvfp4_f32(Q, X, B, Y, M, N, K, threads); break;
    case 10: gemm_bf16((const uint32_t *)W, X, B, Y, M, N, K, threads); break;
    case 11: gemm_w8a8_i8(Q, X, B, Y, M, N, K, threads); break;
    case 12: gemm_w4a8_q4_0(Q, X, B, Y, M, N, K, threads); break;
    case 13: gemm_w4a8_q4_1(Q, X, B, Y, M, N, K, threads); break;
    case 14: gemm_w4a8_int4(Q, X, B, Y, M, N, K, threads); break;
    case 15: gemm_w4a8_int4_asym(Q, X, B, Y, M, N, K, threads); break;
    default: gemm_packed_f32(W, X, B, Y, M, N, K, threads);
    }
}


/* h [T, hidden] in/out; delta [T, hidden] in (when has_delta) and out; scratch: see below. */
void decode_layers_f32(const layer_weights *layers, long n_layers, const step_args *a, float *h,
                       float *delta, int has_delta, float *scratch, int num_threads) {
    long T = a->tokens, q_size = a->heads * a->dim, kv_size = a->kv_heads * a->dim;
    long qkv_cols = q_size + 2 * kv_size;
    float *x = scratch;                     /* [T, hidden] */
    float *qkv = x + T * a->hidden;         /* [T, qkv_cols] */
    float *q = qkv + T * qkv_cols;          /* [T, q_size] */
    float *attn = q + T * q_size;           /* [T, q_size] */
    float *o = attn + T * q_size;           /* [T, hidden] */
    float *gate_up = o + T * a->hidden;     /* [T, 2 · inter] */
    float *act = gate_up + T * 2 * a->inter; /* [T, inter] */
    for (long l = 0; l < n_layers; ++l) {
        const layer_weights *w = layers + l;
        PHASE(0, rms_norm_f32(h, (l > 0 || has_delta) ? delta : 0, w->attn_norm, x, T, a->hidden,
                              a->eps, num_threads));
        PHASE(1, gemm_any(w->formats[0], w->qkv_w, x, w->qkv_b, qkv, T, qkv_cols, a->hidden, num_threads));
        PHASE(2, {
            rope_f32(qkv, a->positions, a->rope_cache, T, a->heads + a->kv_heads, a->dim,
                     qkv_cols, num_threads);
            for (long t = 0; t < T; ++t) {
                const float *row = qkv + t * qkv_cols;
                memcpy(q + t * q_size, row, sizeof(float) * (size_t)q_size);
                if (w->k_scale) {
                    long at = a->slots[t] * kv_size; /* codes: a byte per element */
                    store_e4m3(row + q_size, (uint8_t *)w->k_cache + at, w->k_scale, w->k_shift,
                               a->kv_heads, a->dim);
                    store_e4m3(row + q_size + kv_size, (uint8_t *)w->v_cache + at, w->v_scale, 0,
                               a->kv_heads, a->dim);
                    continue;
                }
                memcpy(w->k_cache + a->slots[t] * kv_size, row + q_size,
                       sizeof(float) * (size_t)kv_size);
                memcpy(w->v_cache + a->slots[t] * kv_size, row + q_size + kv_size,
                       sizeof(float) * (size_t)kv_size);
            }
        });
        PHASE(3, decode_attention(q, w->k_cache, w->v_cache, w->k_scale, w->v_scale,
                                  a->block_tables, a->max_blocks, a->seq_lens, attn, T, a->heads,
                                  a->kv_heads, a->dim, a->block_size, a->scale, a->window, 0,
                                  num_threads));
        PHASE(4, gemm_any(w->formats[1], w->o_w, attn, w->o_b, o, T, a->hidden, q_size, num_threads));
        PHASE(5, rms_norm_f32(h, o, w->mlp_norm, x, T, a->hidden, a->eps, num_threads));
        PHASE(6, gemm_any(w->formats[2], w->gate_up_w, x, w->gate_up_b, gate_up, T, 2 * a->inter,
                                 a->hidden, num_threads));
        PHASE(7, silu_mul_f32(gate_up, act, T, a->inter, num_threads));
        PHASE(8, gemm_any(w->formats[3], w->down_w, act, w->down_b, delta, T, a->hidden, a->inter,
                                 num_threads));
    }
}

/* The step's head, after the layers in the same call: the final RMSNorm of h + the pending
 * delta, then the LM head's product into logits [T, vocab] (Transformer.head: the same
 * kernels, so the same logits), and with `argmax` (not NULL) each row's argmax (the greedy
 * sampler's tokens). Run from Python after a step has streamed its weights, those
 * two small calls cost several times their warm time (docs/profile.md). */
typedef struct {
    const float *norm_w, *weight, *bias; /* the final norm's weight; the head's panels, bias */
    long format, vocab;                  /* the panels' weight_format (as layer_weights') */
    float eps;
} head_weights;

/* The head alone, after decoder layers run elsewhere (the compiler's layer programs): h ← h +
 * delta, x = RMSNorm(h) in scratch [T, hidden], logits = the head's product of x, and with
 * `argmax` each row's argmax. */
void decode_head_f32(const head_weights *head, float *h, const float *delta, float *logits,
                     long *argmax, float *scratch, long T, long hidden, int num_threads) {
    PHASE(9, rms_norm_f32(h, delta, head->norm_w, scratch, T, hidden, head->eps, num_threads));
    PHASE(10, gemm_any(head->format, head->weight, scratch, head->bias, logits, T, head->vocab,
                       hidden, num_threads));
    if (argmax) /* greedy rows: their tokens, while the logits are in cache */
        PHASE(11, argmax_f32(logits, T, head->vocab, argmax, num_threads));
}

/* The step's embedding rows, in the same call (Transformer.embed_rows without a scale): the
 * model's fp32 [rows, hidden] embedding, or a tied head's panels in its stored format — fp32
 * (gemm_packed_f32's layout), int8 or FP8 E4M3 codes (rows_packed_<fmt>: the values the
 * products use). */
typedef struct {
    const void *weight;
    long kind; /* 0 fp32 rows, 1 fp32 panels, 2 int8 panels, 3 FP8 E4M3 panels */
    long rows; /* ids must lie in [0, rows) */
} embed_weights;

/* h [T, K] ← the rows ids; -1, or the index of the first id outside [0, rows) */
static long embed_rows_f32(const embed_weights *e, const int64_t *ids, long T, long K, float *h) {
    if (e->kind == 2) return rows_packed_i8(e->weight, K, e->rows, ids, T, h);
    if (e->kind == 3) return rows_packed_e4m3(e->weight, K, e->rows, ids, T, h);
    const float *W = (const float *)e->weight;
    for (long t = 0; t < T; ++t) {
        if (ids[t] < 0 || ids[t] >= e->rows) return t;
        if (e->kind == 0) {
            memcpy(h + t * K, W + ids[t] * K, sizeof(float) * (size_t)K);
            continue;
        }
        const float *wp = W + ids[t] / NR * K * NR;
        for (long k = 0; k < K; ++k) h[t * K + k] = wp[k * NR + ids[t] % NR];
    }
    return -1;
}

/* A whole decode step in one call: with `embed` (not NULL) h ← the rows of `ids` first, then
 * the layers and the head. Returns -1, or the index of the first id outside the embedding
 * (nothing else run). */
long decode_step_f32(const layer_weights *layers, long n_layers, const step_args *a, float *h,
                     float *delta, const head_weights *head, float *logits, long *argmax,
                     float *scratch, int num_threads, const embed_weights *embed,
                     const int64_t *ids) {
    if (embed) {
        long bad = embed_rows_f32(embed, ids, a->tokens, a->hidden, h);
        if (bad >= 0) return bad;
    }
    decode_layers_f32(layers, n_layers, a, h, delta, 0, scratch, num_threads);
    decode_head_f32(head, h, n_layers > 0 ? delta : 0, logits, argmax, scratch, a->tokens,
                    a->hidden, num_threads);
    return -1;
}

/* Floats of scratch decode_layers_f32 needs. */
long decode_layers_scratch(const step_args *a) {
    long q_size = a->heads * a->dim, kv_size = a->kv_heads * a->dim;
    return a->tokens * (2 * a->hidden + q_size + 2 * kv_size + 2 * q_size + 3 * a->inter);
}
