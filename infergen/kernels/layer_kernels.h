/* What a generated layer program (compiler/codegen_layer.py) calls: the kernels of
 * layer_kernels.c, a shared library the program links against (built once per set of the
 * program variant's macros: compiler/program.py), so a program's own compile is its generated
 * code alone — not the ~5 s of the kernels it used to include. */
#pragma once
#include <stdint.h>

#include "step_args.h"

/* A knob of the program (compiler/program_variants.py, "epilogue_min"): a GEMM with a
 * pointwise tail on fp32 panels runs as the fused GEMM (codegen_gemm.py: the tail on each
 * tile) past this many tokens, and as the GEMM then its tail up to it — the same products and
 * the same tail arithmetic either way. At decode sizes the fused form streams two parts'
 * panels at once and saved nothing: the default model's jit step, fused against unfused, in
 * turns (2 threads, AMD EPYC Zen 4, 2026-12-07; best of 10, 3 rounds): 0.97-1.00x at 1-8
 * tokens, 0.95-0.97x at 12, 0.97-0.99x at 16, 1.01-1.02x at 32. */
#ifndef GEMM_EPILOGUE_MIN_TOKENS
#define GEMM_EPILOGUE_MIN_TOKENS 16
#endif

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
/* A mixture-of-experts feed-forward (layers/moe.py) as the layer program runs it: the router
 * (dense [experts, hidden] + bias) scores each token and picks its top_k experts with their
 * weights (`router`, layers/moe.py ROUTERS: 0 softmax_topk, GPT-OSS; 1 softmax_greedy,
 * DeepSeek-V2 / Qwen3-Next; 2 softmax_group_limited, DeepSeek-V2; 3 sigmoid_group_limited,
 * DeepSeek-V3), tokens are grouped by expert, and each expert with tokens runs its gate/up
 * GEMM, the gated activation and its down GEMM on them (lk_gemm_any, the expert's own weight
 * format); y = sum of weight x expert output, plus the shared experts' SwiGLU MLP on every
 * token (times sigmoid(x . shared_gate) where there is one: Qwen3-Next).
 * Built by compiler/program_moe.py (MoEArgs) per layer. */
typedef struct {
    long experts, top_k, inter;
    const float *router, *router_bias;   /* [experts, hidden]; [experts] or NULL */
    const void *const *gate_up, *const *down; /* per expert: prepared panels */
    const float *const *gate_up_bias, *const *down_bias; /* per expert, entries may be NULL */
    const long *gate_up_format, *down_format; /* per expert */
    long activation;                     /* 0: SwiGLU; 1: GPT-OSS's clamped SwiGLU */
    float limit, alpha;                  /* the clamped SwiGLU's */
    long router_kind, groups, topk_groups, norm_topk;
    float routed_scaling;
    const float *correction;             /* [experts] or NULL (sigmoid_group_limited) */
    long shared_inter;                   /* 0: no shared experts */
    const void *shared_gate_up, *shared_down; /* prepared panels */
    long shared_gate_up_format, shared_down_format;
    const float *shared_gate;            /* [hidden] or NULL */
} moe_args;
void lk_moe(const moe_args *m, const float *x, float *y, long T, long hidden, int threads);
/* A Mamba2 mixer's step (layers/ssm.py) over T token rows, row t's state in slot slots[t]
 * (zeros where fresh[t]): one row per sequence (decode), or a prefill's rows, a sequence's
 * following each other in order (only its first fresh), each reading the state the row
 * before wrote (then the heads go over the threads, each head's rows in order): in_proj, the
 * causal conv1d
 * over the conv state (silu or none), the SSM state update with clamp(softplus(dt + dt_bias)),
 * y = C . state + D x, the gated RMSNorm over groups (before or after the gate, or none),
 * out_proj. Built by compiler/program_ssm.py (SSMArgs) per layer; `slots` and `fresh` are set
 * per step. */
typedef struct {
    long hidden, inter, heads, head_dim, groups, state, conv_dim, width;
    const void *in_proj; long in_format; const float *in_bias;
    const float *conv_w, *conv_b;        /* [conv_dim, width], [conv_dim] or NULL */
    long activation;                     /* 0: silu; 1: none */
    const float *A, *D, *dt_bias;        /* [heads] each; D, dt_bias may be NULL */
    float dt_lo, dt_hi;
    const float *norm_w;                 /* [inter] or NULL: y * silu(z) */
    long norm_before_gate;
    float eps;
    const void *out_proj; long out_format; const float *out_bias;
    float *conv_state, *ssm_state;       /* [slots, conv_dim, width-1], [slots, H, P, N] */
    const int64_t *slots; const uint8_t *fresh;  /* per step: [T] */
} ssm_args;
void lk_ssm_decode(const ssm_args *a, const float *x, float *y, long T, int threads);
/* A gated DeltaNet mixer's step (layers/linear_attention.py) over token rows as
 * lk_ssm_decode's: in_proj, the conv1d step over q | k | v, l2-normed q (times k_dim^-1/2) and
 * k, beta = sigmoid(b), decay = exp(-decay_rate softplus(a + dt_bias)), the delta rule on the
 * [k_dim, v_dim] state of each value head, the RMSNorm of its output times silu(z), out_proj.
 * Built by compiler/program_deltanet.py (DeltaNetArgs) per layer. */
typedef struct {
    long hidden, k_heads, v_heads, k_dim, v_dim, conv_dim, width;
    const void *in_proj; long in_format;
    const void *out_proj; long out_format;
    const float *conv_w;                 /* [conv_dim, width] */
    long activation;                     /* 0: silu; 1: none */
    const float *decay_rate, *dt_bias;   /* [v_heads] */
    const float *norm_w;                 /* [v_dim] */
    float eps;
    float *conv_state, *rec_state;       /* [slots, conv_dim, width-1], [slots, Hv, Dk, Dv] */
    const int64_t *slots; const uint8_t *fresh;  /* per step: [T] */
} deltanet_args;
void lk_deltanet_decode(const deltanet_args *a, const float *x, float *y, long T, int threads);
/* a mixer's native decode step by kind (compiler/program.py NATIVE_MIXERS: 1 lk_ssm_decode,
 * 2 lk_deltanet_decode, 3 lk_mla_decode); 0 when it has none (the program calls the module back) */
int lk_mixer_decode(long kind, const void *native, const float *x, float *y, long T,
                    int threads);
/* A latent attention's decode step (layers/mla.py, DeepSeek-V2/V3), one token per sequence,
 * the weight-absorbed form: the down projection (q LoRA: its RMSNorm and up projection), the
 * latent's RMSNorm and the RoPE key written as the token's cache row [latent | k_pe], q's
 * nope part absorbed through W_uk, decode attention of [q_latent | rope(q_pe)] over the cached
 * rows (one KV head, V = the rows' latent part), W_uv, o_proj. Built by
 * compiler/program_mla.py (MLAArgs) per layer; the step's fields are set per call. */
typedef struct {
    long hidden, heads, nope, rope, latent, v_dim, q_lora; /* q_lora 0: no q LoRA */
    const void *down; long down_format;
    const float *q_norm_w; const void *q_up; long q_up_format;
    const float *kv_norm_w; float eps;
    const float *w_uk, *w_uv;            /* [heads, nope, latent], [heads, v_dim, latent] */
    const void *o; long o_format;
    float scale;
    float *cache; long block_size;       /* [blocks, block_size, 1, latent + rope] */
    /* per step */
    const int64_t *positions, *slots, *block_tables, *seq_lens;
    long max_blocks;
    const float *rope_cache;             /* [positions, rope]: cos | sin halves */
} mla_args;
void lk_mla_decode(const mla_args *a, const float *x, float *y, long T, int threads);
