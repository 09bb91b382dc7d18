/* The kernels of the generated layer programs (layer_kernels.h), one shared library per set
 * of the program variant's knob macros (DECODE_ATTN_CHUNK, GEMM_SMALL_TOP,
 * GEMM_PREFETCH_PANELS, PARALLEL_MIN_ELEMENTS: compiler/program_variants.py), given as -D
 * flags (kernels/build.py library). Built with -Wl,-Bsymbolic: its calls between its own
 * functions stay inside it whatever else the process has loaded. */
#include "decode_layers_f32.c"
#include "layer_kernels.h"
#include "paged_prefill_attention_f32.c"

#include <math.h>

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

/* the gated activation of one [n, 2 inter] row block into [n, inter] (layers/moe.py):
 * SwiGLU, or GPT-OSS's (up + 1) * gate * sigmoid(alpha * gate) with gate <= limit and
 * |up| <= limit; rows over the threads, the exponentials vectorized (common.h exp_array) */
static void moe_activation(const moe_args *m, const float *gu, float *out, long n, long inter,
                           int clamped, int threads) {
    float limit = m->limit, alpha = clamped ? m->alpha : 1.0f;
#pragma omp parallel for num_threads(threads) if (n * inter >= PARALLEL_MIN_ELEMENTS)
    for (long r = 0; r < n; ++r) {
        const float *gate = gu + r * 2 * inter, *up = gate + inter;
        float *o = out + r * inter;
        for (long i = 0; i < inter; ++i) {
            float g = clamped && gate[i] > limit ? limit : gate[i];
            o[i] = -alpha * g;
        }
        exp_array(o, o, inter); /* e^(-alpha g) */
        for (long i = 0; i < inter; ++i) {
            float g = clamped && gate[i] > limit ? limit : gate[i], u = up[i];
            if (clamped) u = (u < -limit ? -limit : (u > limit ? limit : u)) + 1.0f;
            o[i] = g / (1.0f + o[i]) * u;
        }
    }
}

/* idx[0..n): the n largest of v[0..m) among `allowed` (NULL: all), largest first, the first
 * of equal values first (as torch.topk) */
static void top_n(const float *v, const unsigned char *allowed, long m, long n, long *idx) {
    for (long j = 0; j < n; ++j) {
        long best = -1;
        for (long e = 0; e < m; ++e) {
            if (allowed && !allowed[e]) continue;
            int taken = 0;
            for (long i = 0; i < j; ++i) taken |= idx[i] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[j] = best;
    }
}

/* `allowed`[e]: expert e is in one of the best topk_groups groups, a group scored by its
 * best score (top2 = 0) or the sum of its best two (top2 = 1) */
static void group_mask(const moe_args *m, const float *score, int top2, unsigned char *allowed) {
    long E = m->experts, G = m->groups, per = E / G, best[64], order[64];
    float group_score[64];
    for (long g = 0; g < G; ++g) {
        long n = top2 && per > 1 ? 2 : 1;
        top_n(score + g * per, 0, per, n, best);
        group_score[g] = 0.0f;
        for (long i = 0; i < n; ++i) group_score[g] += score[g * per + best[i]];
    }
    top_n(group_score, 0, G, m->topk_groups, order);
    for (long e = 0; e < E; ++e) allowed[e] = 0;
    for (long i = 0; i < m->topk_groups; ++i)
        for (long e = 0; e < per; ++e) allowed[order[i] * per + e] = 1;
}

/* one token's experts and weights from its router logits (layers/moe.py ROUTERS) */
static void moe_route(const moe_args *m, const float *l, long *chosen, float *w) {
    long E = m->experts, k = m->top_k;
    float p[256], choice[256];
    unsigned char allowed[256];
    if (m->router_kind == 0) { /* top k of the logits, a softmax over them */
        top_n(l, 0, E, k, chosen);
        float top = l[chosen[0]], total = 0.0f;
        for (long j = 0; j < k; ++j) total += w[j] = expf(l[chosen[j]] - top);
        for (long j = 0; j < k; ++j) w[j] /= total;
        return;
    }
    if (m->router_kind == 3) { /* sigmoid scores; the choice adds the correction */
        for (long e = 0; e < E; ++e) {
            p[e] = 1.0f / (1.0f + expf(-l[e]));
            choice[e] = p[e] + (m->correction ? m->correction[e] : 0.0f);
        }
        group_mask(m, choice, 1, allowed);
        top_n(choice, allowed, E, k, chosen);
    } else { /* a softmax over every expert, then the top k (of the best groups: kind 2) */
        float top = l[0], total = 0.0f;
        for (long e = 1; e < E; ++e) top = l[e] > top ? l[e] : top;
        for (long e = 0; e < E; ++e) total += p[e] = expf(l[e] - top);
        for (long e = 0; e < E; ++e) p[e] /= total;
        if (m->router_kind == 2) group_mask(m, p, 0, allowed);
        top_n(p, m->router_kind == 2 ? allowed : 0, E, k, chosen);
    }
    float sum = 0.0f;
    for (long j = 0; j < k; ++j) sum += w[j] = p[chosen[j]];
    for (long j = 0; j < k; ++j) {
        if (m->norm_topk && m->router_kind != 2) /* (softmax_group_limited: never) */
            w[j] /= sum + (m->router_kind == 3 ? 1e-20f : 0.0f);
        w[j] *= m->routed_scaling;
    }
}

/* y += the shared experts' SwiGLU MLP of x (times sigmoid(x . shared_gate) per token) */
static void moe_shared(const moe_args *m, const float *x, float *y, long T, long hidden,
                       int threads) {
    long inter = m->shared_inter;
    float *gu = malloc(sizeof(float) * (size_t)(T * 2 * inter));
    float *act = malloc(sizeof(float) * (size_t)(T * inter));
    float *out = malloc(sizeof(float) * (size_t)(T * hidden));
    gemm_any(m->shared_gate_up_format, m->shared_gate_up, x, 0, gu, T, 2 * inter, hidden,
             threads);
    moe_activation(m, gu, act, T, inter, 0, threads);
    gemm_any(m->shared_down_format, m->shared_down, act, 0, out, T, hidden, inter, threads);
    for (long t = 0; t < T; ++t) {
        float g = 1.0f;
        if (m->shared_gate)
            g = 1.0f / (1.0f + expf(-dot_f32(x + t * hidden, m->shared_gate, hidden)));
        for (long d = 0; d < hidden; ++d) y[t * hidden + d] += g * out[t * hidden + d];
    }
    free(gu), free(act), free(out);
}

void lk_moe(const moe_args *m, const float *x, float *y, long T, long hidden, int threads) {
    long E = m->experts, k = m->top_k, inter = m->inter, pairs = T * k;
    float *logits = malloc(sizeof(float) * (size_t)(T * E));
    long *expert_of = malloc(sizeof(long) * (size_t)pairs);
    float *weight_of = malloc(sizeof(float) * (size_t)pairs);
    /* the router's logits, a token per iteration */
#pragma omp parallel for num_threads(threads) if (T * E * hidden >= PARALLEL_MIN_ELEMENTS)
    for (long t = 0; t < T; ++t)
        for (long e = 0; e < E; ++e)
            logits[t * E + e] = dot_f32(x + t * hidden, m->router + e * hidden, hidden) +
                                (m->router_bias ? m->router_bias[e] : 0.0f);
    for (long t = 0; t < T; ++t)
        moe_route(m, logits + t * E, expert_of + t * k, weight_of + t * k);
    /* token-expert pairs grouped by expert, in token order within an expert */
    long *start = calloc((size_t)(E + 1), sizeof(long));
    long *order = malloc(sizeof(long) * (size_t)pairs);
    for (long p = 0; p < pairs; ++p) ++start[expert_of[p] + 1];
    for (long e = 0; e < E; ++e) start[e + 1] += start[e];
    long *fill = malloc(sizeof(long) * (size_t)E);
    for (long e = 0; e < E; ++e) fill[e] = start[e];
    long *row_of = malloc(sizeof(long) * (size_t)pairs); /* pair -> its row in the groups */
    for (long p = 0; p < pairs; ++p)
        row_of[p] = fill[expert_of[p]], order[fill[expert_of[p]]++] = p;
    float *xs = malloc(sizeof(float) * (size_t)(pairs * hidden));
    float *gu = malloc(sizeof(float) * (size_t)(pairs * 2 * inter));
    float *act = malloc(sizeof(float) * (size_t)(pairs * inter));
    float *ys = malloc(sizeof(float) * (size_t)(pairs * hidden));
    int wide = pairs * hidden >= PARALLEL_MIN_ELEMENTS;
#pragma omp parallel for num_threads(threads) if (wide)
    for (long q = 0; q < pairs; ++q) /* each pair's token row, grouped by expert */
        memcpy(xs + q * hidden, x + order[q] / k * hidden, sizeof(float) * (size_t)hidden);
    for (long e = 0; e < E; ++e) {
        long n = start[e + 1] - start[e], r0 = start[e];
        if (n == 0) continue;
        gemm_any(m->gate_up_format[e], m->gate_up[e], xs + r0 * hidden, m->gate_up_bias[e],
                 gu + r0 * 2 * inter, n, 2 * inter, hidden, threads);
        moe_activation(m, gu + r0 * 2 * inter, act + r0 * inter, n, inter, m->activation == 1,
                       threads);
        gemm_any(m->down_format[e], m->down[e], act + r0 * inter, m->down_bias[e],
                 ys + r0 * hidden, n, hidden, inter, threads);
    }
#pragma omp parallel for num_threads(threads) if (wide)
    for (long t = 0; t < T; ++t) { /* a token's experts' outputs, weighed, in choice order */
        float *dst = y + t * hidden;
        for (long d = 0; d < hidden; ++d) dst[d] = 0.0f;
        for (long j = 0; j < k; ++j) {
            float w = weight_of[t * k + j];
            const float *src = ys + row_of[t * k + j] * hidden;
            for (long d = 0; d < hidden; ++d) dst[d] += w * src[d];
        }
    }
    free(logits), free(expert_of), free(weight_of), free(start), free(order), free(fill);
    free(row_of);
    if (m->shared_inter) moe_shared(m, x, y, T, hidden, threads);
    free(xs), free(gu), free(act), free(ys);
}

/* Whether some token rows share a state slot: rows of one sequence (a prefill's tokens, in
 * order, only the first one `fresh`), each reading the state the row before it wrote. */
static int rows_chained(const long *slots, long T) {
    for (long t = 1; t < T; ++t)
        if (slots[t] == slots[t - 1]) return 1;
    return 0;
}

static inline float ssm_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
static inline float ssm_silu(float v) { return v / (1.0f + expf(-v)); }

/* One token of a causal depthwise conv over its sequence's state (ops/causal_conv1d.py): x
 * [C] becomes act(bias + w . [state's W-1 inputs | x]) in place, the state drops its oldest
 * input for x (zeros instead of the state where `fresh`). activation 0: silu; 1: none. */
static void conv_step(float *x, float *state, const float *conv_w, const float *conv_b, long C,
                      long W, int fresh, long activation) {
    for (long c = 0; c < C; ++c) {
        float *hist = state + c * (W - 1);
        const float *w = conv_w + c * W;
        float v = x[c], acc = conv_b ? conv_b[c] : 0.0f;
        for (long j = 0; j < W - 1; ++j) {
            float h = fresh ? 0.0f : hist[j];
            acc += w[j] * h;
            hist[j] = j + 1 < W - 1 ? (fresh ? 0.0f : hist[j + 1]) : v;
        }
        acc += w[W - 1] * v;
        x[c] = activation == 0 ? ssm_silu(acc) : acc;
    }
}

void lk_ssm_decode(const ssm_args *a, const float *x, float *y, long T, int threads) {
    long I = a->inter, H = a->heads, P = a->head_dim, G = a->groups, N = a->state;
    long C = a->conv_dim, W = a->width, proj = I + C + H, R = H / G;
    float *zx = malloc(sizeof(float) * (size_t)(T * proj));
    float *yv = malloc(sizeof(float) * (size_t)(T * I));
    lk_gemm_any(a->in_format, a->in_proj, x, a->in_bias, zx, T, proj, a->hidden, threads);
    for (long t = 0; t < T; ++t) /* the conv over the state's W-1 inputs and the token */
        conv_step(zx + t * proj + I, a->conv_state + a->slots[t] * C * (W - 1), a->conv_w,
                  a->conv_b, C, W, a->fresh[t] != 0, a->activation);
    /* the state update and y, a (token, head) per iteration; rows of one sequence (a
     * prefill's tokens, in order) read the state the row before wrote: then the heads go
     * over the threads, each head's rows in order */
    int chained = rows_chained(a->slots, T);
#pragma omp parallel for num_threads(threads) if (T * H * P * N >= PARALLEL_MIN_ELEMENTS)
    for (long it = 0; it < (chained ? H : T * H); ++it)
    for (long row = 0; row < (chained ? T : 1); ++row) {
        long t = chained ? row : it / H, h = chained ? it : it % H, g = h / R;
        const float *row = zx + t * proj, *xs = row + I + h * P;
        /* xBC after the conv: x [I] | B [G, N] | C [G, N]; then dt [H] */
        const float *B = row + 2 * I + g * N, *Cm = row + 2 * I + G * N + g * N;
        float d = row[I + C + h] + (a->dt_bias ? a->dt_bias[h] : 0.0f);
        d = ssm_softplus(d);
        d = d < a->dt_lo ? a->dt_lo : (d > a->dt_hi ? a->dt_hi : d);
        float decay = expf(d * a->A[h]), Dh = a->D ? a->D[h] : 0.0f;
        float *hs = a->ssm_state + (a->slots[t] * H + h) * P * N;
        int fresh = a->fresh[t] != 0;
        for (long p = 0; p < P; ++p) {
            float xv = xs[p], dx = d * xv, acc = 0.0f;
            float *hrow = hs + p * N;
#pragma omp simd reduction(+ : acc) /* (a float sum: not vectorized without it) */
            for (long n = 0; n < N; ++n) {
                float v = (fresh ? 0.0f : hrow[n]) * decay + dx * B[n];
                hrow[n] = v;
                acc += v * Cm[n];
            }
            yv[t * I + h * P + p] = acc + Dh * xv;
        }
    }
    /* the gated RMSNorm, per group of I / G channels */
    long width = I / G;
    for (long t = 0; t < T; ++t) {
        const float *z = zx + t * proj;
        float *yt = yv + t * I;
        for (long g = 0; g < G; ++g) {
            float *v = yt + g * width;
            const float *zg = z + g * width;
            if (!a->norm_w) {
                for (long i = 0; i < width; ++i) v[i] *= ssm_silu(zg[i]);
                continue;
            }
            if (!a->norm_before_gate)
                for (long i = 0; i < width; ++i) v[i] *= ssm_silu(zg[i]);
            double ss = 0.0;
            for (long i = 0; i < width; ++i) ss += (double)v[i] * v[i];
            float inv = 1.0f / sqrtf((float)(ss / (double)width) + a->eps);
            const float *wg = a->norm_w + g * width;
            for (long i = 0; i < width; ++i) {
                float o = v[i] * inv * wg[i];
                v[i] = a->norm_before_gate ? o * ssm_silu(zg[i]) : o;
            }
        }
    }
    lk_gemm_any(a->out_format, a->out_proj, yv, a->out_bias, y, T, a->hidden, I, threads);
    free(zx);
    free(yv);
}

void lk_deltanet_decode(const deltanet_args *a, const float *x, float *y, long T, int threads) {
    long Hk = a->k_heads, Hv = a->v_heads, Dk = a->k_dim, Dv = a->v_dim, C = a->conv_dim;
    long W = a->width, key_dim = Hk * Dk, value_dim = Hv * Dv, proj = C + value_dim + 2 * Hv;
    long per_k = Hv / Hk;
    float *zx = malloc(sizeof(float) * (size_t)(T * proj));
    float *yv = malloc(sizeof(float) * (size_t)(T * value_dim));
    lk_gemm_any(a->in_format, a->in_proj, x, 0, zx, T, proj, a->hidden, threads);
    for (long t = 0; t < T; ++t) /* the conv over q | k | v */
        conv_step(zx + t * proj, a->conv_state + a->slots[t] * C * (W - 1), a->conv_w, 0, C, W,
                  a->fresh[t] != 0, a->activation);
    float q_scale = 1.0f / sqrtf((float)Dk);
    /* the gated delta rule and the gated norm, a (token, value head) per iteration; each
     * head's rows in order where rows of one sequence follow each other (as lk_ssm_decode) */
    int chained = rows_chained(a->slots, T);
#pragma omp parallel for num_threads(threads) if (T * Hv * Dk * Dv >= PARALLEL_MIN_ELEMENTS)
    for (long it = 0; it < (chained ? Hv : T * Hv); ++it)
    for (long row = 0; row < (chained ? T : 1); ++row) {
        long t = chained ? row : it / Hv, h = chained ? it : it % Hv, kh = h / per_k;
        const float *row = zx + t * proj;
        const float *q = row + kh * Dk, *k = row + key_dim + kh * Dk;
        const float *v = row + 2 * key_dim + h * Dv, *z = row + C + h * Dv;
        float b = row[C + value_dim + h], av = row[C + value_dim + Hv + h];
        float qn[Dk], kn[Dk], read[Dv], out[Dv];
        float sq = 0.0f, sk = 0.0f;
        for (long i = 0; i < Dk; ++i) {
            sq += q[i] * q[i];
            sk += k[i] * k[i];
        }
        float iq = q_scale / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        for (long i = 0; i < Dk; ++i) {
            qn[i] = q[i] * iq;
            kn[i] = k[i] * ik;
        }
        float beta = 1.0f / (1.0f + expf(-b));
        float decay = expf(-a->decay_rate[h] * ssm_softplus(av + a->dt_bias[h]));
        float *S = a->rec_state + ((a->slots[t] * Hv + h) * Dk) * Dv;
        int fresh = a->fresh[t] != 0;
        for (long j = 0; j < Dv; ++j) read[j] = out[j] = 0.0f;
        for (long i = 0; i < Dk; ++i) { /* decay, then read the state along k */
            float *Si = S + i * Dv;
            for (long j = 0; j < Dv; ++j) {
                float sv = fresh ? 0.0f : Si[j] * decay;
                Si[j] = sv;
                read[j] += kn[i] * sv;
            }
        }
        for (long j = 0; j < Dv; ++j) read[j] = beta * (v[j] - read[j]); /* the correction */
        for (long i = 0; i < Dk; ++i) { /* write it, and read the new state along q */
            float *Si = S + i * Dv;
            for (long j = 0; j < Dv; ++j) {
                Si[j] += kn[i] * read[j];
                out[j] += qn[i] * Si[j];
            }
        }
        float ss = 0.0f;
        for (long j = 0; j < Dv; ++j) ss += out[j] * out[j];
        float inv = 1.0f / sqrtf(ss / (float)Dv + a->eps);
        float *o = yv + t * value_dim + h * Dv;
        for (long j = 0; j < Dv; ++j) o[j] = out[j] * inv * a->norm_w[j] * ssm_silu(z[j]);
    }
    lk_gemm_any(a->out_format, a->out_proj, yv, 0, y, T, a->hidden, value_dim, threads);
    free(zx);
    free(yv);
}

/* RMSNorm of n values in place: x / sqrt(mean(x^2) + eps) * w */
static void mla_rms_norm(float *x, const float *w, long n, float eps) {
    float ss = 0.0f;
    for (long i = 0; i < n; ++i) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (long i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

/* RoPE of one head's r dims in place (half split: cos | sin rows of the table) */
static void mla_rope(float *x, const float *table, long r) {
    long half = r / 2;
    const float *cs = table, *sn = table + half;
    for (long i = 0; i < half; ++i) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cs[i] - x2 * sn[i];
        x[i + half] = x2 * cs[i] + x1 * sn[i];
    }
}

void lk_mla_decode(const mla_args *a, const float *x, float *y, long T, int threads) {
    long H = a->heads, nope = a->nope, r = a->rope, L = a->latent, V = a->v_dim;
    long qk = nope + r, q_rows = a->q_lora ? a->q_lora : H * qk, width = q_rows + L + r;
    long row = L + r;
    float *down = malloc(sizeof(float) * (size_t)(T * width));
    float *q = a->q_lora ? malloc(sizeof(float) * (size_t)(T * H * qk)) : 0;
    float *query = malloc(sizeof(float) * (size_t)(T * H * row));
    float *att = malloc(sizeof(float) * (size_t)(T * H * row));
    float *heads_out = malloc(sizeof(float) * (size_t)(T * H * V));
    lk_gemm_any(a->down_format, a->down, x, 0, down, T, width, a->hidden, threads);
    long q_stride = width;
    const float *qsrc = down;
    if (a->q_lora) {
        for (long t = 0; t < T; ++t) mla_rms_norm(down + t * width, a->q_norm_w, a->q_lora, a->eps);
        /* the up projection reads rows of `width` floats: pack them first */
        float *qa = malloc(sizeof(float) * (size_t)(T * a->q_lora));
        for (long t = 0; t < T; ++t)
            memcpy(qa + t * a->q_lora, down + t * width, sizeof(float) * (size_t)a->q_lora);
        lk_gemm_any(a->q_up_format, a->q_up, qa, 0, q, T, H * qk, a->q_lora, threads);
        free(qa);
        qsrc = q;
        q_stride = H * qk;
    }
    for (long t = 0; t < T; ++t) { /* the cache row: normed latent, rotated k_pe */
        float *lat = down + t * width + q_rows;
        mla_rms_norm(lat, a->kv_norm_w, L, a->eps);
        const float *table = a->rope_cache + a->positions[t] * r;
        mla_rope(lat + L, table, r);
        memcpy(a->cache + a->slots[t] * row, lat, sizeof(float) * (size_t)row);
    }
#pragma omp parallel for num_threads(threads) if (T * H * nope * L >= PARALLEL_MIN_ELEMENTS)
    for (long th = 0; th < T * H; ++th) { /* [W_uk^T q_nope | rope(q_pe)] */
        long t = th / H, h = th % H;
        const float *qh = qsrc + t * q_stride + h * qk;
        float *out = query + th * row;
        for (long c = 0; c < L; ++c) out[c] = 0.0f;
        const float *w = a->w_uk + h * nope * L;
        for (long n = 0; n < nope; ++n) {
            float qv = qh[n];
            const float *wn = w + n * L;
            for (long c = 0; c < L; ++c) out[c] += qv * wn[c];
        }
        memcpy(out + L, qh + nope, sizeof(float) * (size_t)r);
        mla_rope(out + L, a->rope_cache + a->positions[t] * r, r);
    }
    lk_decode_attention(query, a->cache, a->cache, 0, 0, (const long *)a->block_tables,
                        a->max_blocks, (const long *)a->seq_lens, att, T, H, 1, row,
                        a->block_size, a->scale, 0, 0, threads);
#pragma omp parallel for num_threads(threads) if (T * H * V * L >= PARALLEL_MIN_ELEMENTS)
    for (long th = 0; th < T * H; ++th) { /* W_uv on the latent part */
        long h = th % H;
        const float *o = att + th * row;
        const float *w = a->w_uv + h * V * L;
        float *dst = heads_out + th * V;
        for (long v = 0; v < V; ++v) {
            float acc = 0.0f;
            const float *wv = w + v * L;
            for (long c = 0; c < L; ++c) acc += o[c] * wv[c];
            dst[v] = acc;
        }
    }
    lk_gemm_any(a->o_format, a->o, heads_out, 0, y, T, a->hidden, H * V, threads);
    free(down);
    free(q);
    free(query);
    free(att);
    free(heads_out);
}

int lk_mixer_decode(long kind, const void *native, const float *x, float *y, long T,
                    int threads) {
    switch (kind) {
    case 1:
        lk_ssm_decode((const ssm_args *)native, x, y, T, threads);
        return 1;
    case 2:
        lk_deltanet_decode((const deltanet_args *)native, x, y, T, threads);
        return 1;
    case 3:
        lk_mla_decode((const mla_args *)native, x, y, T, threads);
        return 1;
    default:
        return 0;
    }
}
