/* Prefill attention straight through the block table: sequences with several query tokens
 * (a cold prompt, or a chunk after a prefix hit or earlier chunks), fp32.
 *
 * q rows [tokens] of `q_stride` floats, heads adjacent ([heads, dim] at the row's start);
 * k_cache / v_cache [num_blocks, block_size, kv_heads, dim]; per prefill sequence b:
 * query_start[b] (its first row of q and out), query_lens[b], seq_lens[b] (its context
 * after the step, its queries the last query_lens[b] positions, their K/V already stored) and
 * block_tables[b, max_blocks]; out [tokens, heads, dim]. Query at position p reads the keys
 * at positions k with p - window < k <= p (window 0: unlimited):
 *   out = softmax(q.K^T * scale) V.
 * With `sinks` [heads] (GPT-OSS's learned sink logits; NULL: none) the softmax has one more
 * term per head, e^(sinks[h]), that weighs no value: out = O / (l + e^(sinks[h] - m)).
 * Query head h reads KV head h / (heads / kv_heads) (GQA; MQA and MHA the edge cases).
 *
 * One work item: a tile of ROWS query rows (tq tokens x hn heads of one KV head's group,
 * token-major) against that KV head's keys, KC at a time, with the online softmax (running
 * max and sum per row, flash-attention's recurrence). The tile is held transposed, Qt[dim][ROWS]
 * (pre-scaled): a score block S^T[key][rows] is a sum over d of a broadcast key element times
 * a row vector of Qt, so keys are read in place from their cache rows (no packing), the
 * softmax runs over whole row vectors, and the probabilities P^T[key][rows] feed the second
 * product (O[rows][dim] += P V) as broadcasts against V's rows, also read in place. Each K / V
 * row is read once per tile for all of its rows (GQA: the group's heads are rows of one tile).
 * Fully visible key chunks skip the mask.
 *
 * The vector code is written in GCC vector extensions, one width per build: 16 floats with
 * AVX-512, 8 with AVX2, 4 otherwise (the portable build, INFERGEN_KERNEL_ISA=generic).
 */
#ifndef PAGED_PREFILL_ATTENTION_F32_C
#define PAGED_PREFILL_ATTENTION_F32_C
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if defined(__AVX512F__)
#define VW 16 /* floats per vector */
#define JB 8  /* keys per score micro-kernel: JB x RV accumulators */
#define RP 6  /* rows per P.V micro-kernel: RP x 4 accumulators */
#elif defined(__AVX2__)
#define VW 8
#define JB 4
#define RP 3
#else
#define VW 4
#define JB 4
#define RP 3
#endif
#define RV 3            /* row vectors per tile */
#define ROWS (RV * VW)  /* query rows per tile: 48 / 24 / 12 */
#define KC 64           /* keys per online-softmax update */
#define CV 4            /* column vectors per P.V micro-kernel */
#define MASKED (-1e30f) /* the running max before any key: finite, so exp(m - m') never NaNs */

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int vi __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4))); /* unaligned loads */

#define LD(p) (*(const vfu *)(p))
#define ST(p, v) (*(vfu *)(p) = (v))

static inline vf splat(float x) { return (vf){0} + x; }
static inline vf vsel(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }

/* e^x per lane (the scheme of common.h's exp8: x = n ln2 + r, Cephes polynomial, 2^n in the
 * exponent bits); lanes below -87 (e^x under the smallest normal float, -inf included) are 0.
 * With AVX-512, rounding and the 2^n scaling are one instruction each (vrndscaleps,
 * vscalefps: an n below the normal range gives 0 under flush-to-zero). */
/* e^r for the reduced argument: r = x - n ln2 (ln2 in two parts), Cephes' polynomial. */
static inline vf exp_reduced(vf x, vf nf) {
    vf r = x - nf * 0.693359375f;
    r = r + nf * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return (p * r) * r + (r + 1.0f);
}

#if defined(__AVX512F__)
static inline vf vexp(vf x) {
    vi dead = x < splat(-87.0f);
    __m512 v = _mm512_min_ps(_mm512_max_ps((__m512)x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf p = exp_reduced((vf)v, (vf)n);
    return (vf)((vi)(vf)_mm512_scalef_ps((__m512)p, n) & ~dead);
}
#else
static inline vf vexp(vf x) {
    vi dead = x < splat(-87.0f);
    x = vmax(vsel(x > splat(88.0f), splat(88.0f), x), splat(-87.0f));
    vf t = x * 1.44269504088896341f + 0.5f;
    vi n = __builtin_convertvector(t, vi); /* toward zero ... */
    vf nf = __builtin_convertvector(n, vf);
    vi over = nf > t; /* ... then down: floor */
    n += over;
    nf += __builtin_convertvector(over, vf);
    vf scale = (vf)((n + 127) << 23);
    return (vf)((vi)(exp_reduced(x, nf) * scale) & ~dead);
}
#endif

/* Cache slot of position p (block sizes are powers of two in practice: shift and mask). */
static inline long prefill_slot_of(const int32_t *table, long p, long block_size) {
    if ((block_size & (block_size - 1)) == 0) {
        long shift = __builtin_ctzl((unsigned long)block_size);
        return ((long)table[p >> shift] << shift) | (p & (block_size - 1));
    }
    return (long)table[p / block_size] * block_size + p % block_size;
}

/* st[j][rows] = sum_d kr[j][d] * Qt[d][rows] for the JB keys kr[0..JB). */
#define S_DECL(j) vf a##j##0 = z, a##j##1 = z, a##j##2 = z;
#define S_FMA(j)                                                                               \
    {                                                                                          \
        vf kb = splat(kr[j][d]);                                                               \
        a##j##0 += kb * q0, a##j##1 += kb * q1, a##j##2 += kb * q2;                            \
    }
#define S_STORE(j) ST(st + (j) * ROWS, a##j##0), ST(st + (j) * ROWS + VW, a##j##1), ST(st + (j) * ROWS + 2 * VW, a##j##2);
static void scores(const float *qt, const float *const *kr, long dim, float *st) {
    vf z = splat(0.0f);
    S_DECL(0) S_DECL(1) S_DECL(2) S_DECL(3)
#if JB == 8
    S_DECL(4) S_DECL(5) S_DECL(6) S_DECL(7)
#endif
    for (long d = 0; d < dim; ++d) {
        vf q0 = LD(qt + d * ROWS), q1 = LD(qt + d * ROWS + VW), q2 = LD(qt + d * ROWS + 2 * VW);
        S_FMA(0) S_FMA(1) S_FMA(2) S_FMA(3)
#if JB == 8
        S_FMA(4) S_FMA(5) S_FMA(6) S_FMA(7)
#endif
    }
    S_STORE(0) S_STORE(1) S_STORE(2) S_STORE(3)
#if JB == 8
    S_STORE(4) S_STORE(5) S_STORE(6) S_STORE(7)
#endif
}

/* O[r][c .. c + nv·VW) = O[r][..] * corr[r] + sum_j P^T[j][r] * V[j][..] for the RP rows
 * r0 .. r0 + RP (nv <= CV column vectors). */
#define PV_DECL(i) vf o##i##0, o##i##1, o##i##2, o##i##3;
#define PV_LOAD(i)                                                                             \
    {                                                                                          \
        const float *src = o + (r0 + i) * dim + c;                                             \
        float s = corr[r0 + i];                                                                \
        o##i##0 = LD(src) * s;                                                                 \
        o##i##1 = nv > 1 ? LD(src + VW) * s : z;                                               \
        o##i##2 = nv > 2 ? LD(src + 2 * VW) * s : z;                                           \
        o##i##3 = nv > 3 ? LD(src + 3 * VW) * s : z;                                           \
    }
#define PV_FMA(i)                                                                              \
    {                                                                                          \
        vf pb = splat(pt[j * ROWS + r0 + i]);                                                  \
        o##i##0 += pb * v0, o##i##1 += pb * v1, o##i##2 += pb * v2, o##i##3 += pb * v3;        \
    }
#define PV_STORE(i)                                                                            \
    {                                                                                          \
        float *dst = o + (r0 + i) * dim + c;                                                   \
        ST(dst, o##i##0);                                                                      \
        if (nv > 1) ST(dst + VW, o##i##1);                                                     \
        if (nv > 2) ST(dst + 2 * VW, o##i##2);                                                 \
        if (nv > 3) ST(dst + 3 * VW, o##i##3);                                                 \
    }
static void weighted_values(float *o, const float *corr, const float *pt,
                            const float *const *vr, long n, long dim, long r0) {
    vf z = splat(0.0f);
    for (long c = 0; c < dim; c += CV * VW) {
        long nv = (dim - c) / VW < CV ? (dim - c) / VW : CV;
        PV_DECL(0) PV_DECL(1) PV_DECL(2)
        PV_LOAD(0) PV_LOAD(1) PV_LOAD(2)
#if RP == 6
        PV_DECL(3) PV_DECL(4) PV_DECL(5)
        PV_LOAD(3) PV_LOAD(4) PV_LOAD(5)
#endif
        for (long j = 0; j < n; ++j) {
            const float *v = vr[j] + c;
            vf v0 = LD(v), v1 = nv > 1 ? LD(v + VW) : z, v2 = nv > 2 ? LD(v + 2 * VW) : z,
               v3 = nv > 3 ? LD(v + 3 * VW) : z;
            PV_FMA(0) PV_FMA(1) PV_FMA(2)
#if RP == 6
            PV_FMA(3) PV_FMA(4) PV_FMA(5)
#endif
        }
        PV_STORE(0) PV_STORE(1) PV_STORE(2)
#if RP == 6
        PV_STORE(3) PV_STORE(4) PV_STORE(5)
#endif
    }
}

/* Per thread: the tile's transposed queries, scores / probabilities, output rows, running
 * max / sum / correction, the chunk's key and value row pointers, and a zero row (the
 * score kernel's keys past a chunk's end). */
typedef struct {
    float *qt, *st, *o, *m, *l, *corr, *zero;
    const float *kr[KC], *vr[KC];
} Scratch;

static void tile(const float *q, long q_stride, const float *k_cache, const float *v_cache,
                 const int32_t *table, long qs, long qlen, long ctx, long t0, long tq,
                 long head0, long hn, long kvh, long kv_heads, long heads, long dim,
                 long block_size, float scale, long window, const float *sinks, float *out,
                 Scratch *w) {
    long nrow = tq * hn, slot_stride = kv_heads * dim;
    long first = ctx - qlen + t0; /* the tile's first query position */
    long last = first + tq - 1;
    /* Qt[d][r] = q[row r's token][row r's head][d] * scale (padding rows: 0) */
    memset(w->qt, 0, sizeof(float) * (size_t)(dim * ROWS));
    for (long r = 0; r < nrow; ++r) {
        const float *src = q + (qs + t0 + r / hn) * q_stride + (head0 + r % hn) * dim;
        for (long d = 0; d < dim; ++d) w->qt[d * ROWS + r] = src[d] * scale;
    }
    vf qpos[RV]; /* each row's query position (padding rows: the last one's) */
    for (long rv = 0; rv < RV; ++rv)
        for (long i = 0; i < VW; ++i) {
            long r = rv * VW + i;
            qpos[rv][i] = (float)(first + (r < nrow ? r : nrow - 1) / hn);
        }
    for (long rv = 0; rv < RV; ++rv) ST(w->m + rv * VW, splat(MASKED)), ST(w->l + rv * VW, splat(0.0f));
    memset(w->o, 0, sizeof(float) * (size_t)(ROWS * dim));
    long lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0, hi = last + 1;
    long rows_pv = (nrow + RP - 1) / RP * RP;
    for (long k0 = lo; k0 < hi; k0 += KC) {
        long n = hi - k0 < KC ? hi - k0 : KC;
        for (long j = 0; j < KC; ++j) {
            if (j < n) {
                long off = prefill_slot_of(table, k0 + j, block_size) * slot_stride + kvh * dim;
                w->kr[j] = k_cache + off, w->vr[j] = v_cache + off;
            } else {
                w->kr[j] = w->vr[j] = w->zero;
            }
        }
        for (long jb = 0; jb < n; jb += JB) scores(w->qt, w->kr + jb, dim, w->st + jb * ROWS);
        /* masked: keys after a row's query, or before its window */
        int visible = k0 + n - 1 <= first && (window <= 0 || k0 > last - window);
        if (!visible)
            for (long j = 0; j < n; ++j) {
                vf kp = splat((float)(k0 + j));
                for (long rv = 0; rv < RV; ++rv) {
                    vi hide = kp > qpos[rv];
                    if (window > 0) hide |= kp <= qpos[rv] - (float)window;
                    float *s = w->st + j * ROWS + rv * VW;
                    ST(s, vsel(hide, splat(-INFINITY), LD(s)));
                }
            }
        for (long rv = 0; rv < RV; ++rv) { /* the online softmax, a row vector at a time */
            vf best = LD(w->m + rv * VW);
            for (long j = 0; j < n; ++j) best = vmax(best, LD(w->st + j * ROWS + rv * VW));
            vf corr = vexp(LD(w->m + rv * VW) - best), total = splat(0.0f);
            for (long j = 0; j < n; ++j) {
                vf p = vexp(LD(w->st + j * ROWS + rv * VW) - best);
                ST(w->st + j * ROWS + rv * VW, p);
                total += p;
            }
            ST(w->m + rv * VW, best);
            ST(w->l + rv * VW, LD(w->l + rv * VW) * corr + total);
            ST(w->corr + rv * VW, corr);
        }
        for (long r0 = 0; r0 < rows_pv; r0 += RP)
            weighted_values(w->o, w->corr, w->st, w->vr, n, dim, r0);
    }
    for (long r = 0; r < nrow; ++r) {
        float l = w->l[r];
        if (sinks) l += expf(sinks[head0 + r % hn] - w->m[r]);
        float inv = 1.0f / l;
        float *dst = out + ((qs + t0 + r / hn) * heads + head0 + r % hn) * dim;
        const float *src = w->o + r * dim;
        for (long d = 0; d < dim; ++d) dst[d] = src[d] * inv;
    }
}

/* dim % VW == 0 (the caller checks: ops/paged_prefill_native.py). */
void paged_prefill_attention_f32(const float *q, long q_stride, const float *k_cache,
                                 const float *v_cache, const int32_t *query_start,
                                 const int32_t *query_lens, const int32_t *seq_lens,
                                 const int32_t *block_tables, long max_blocks, long prefills,
                                 float *out, long heads, long kv_heads, long dim,
                                 long block_size, float scale, long window, const float *sinks,
                                 int num_threads) {
    long group = heads / kv_heads;
    long hn = group < ROWS ? group : ROWS; /* heads per tile */
    long head_tiles = (group + hn - 1) / hn;
    long tq = ROWS / hn; /* tokens per tile */
    long items = 0, work = 0;
    for (long b = 0; b < prefills; ++b) {
        items += kv_heads * head_tiles * ((query_lens[b] + tq - 1) / tq);
        work += (long)query_lens[b] * seq_lens[b];
    }
#pragma omp parallel num_threads(num_threads) if (work * heads * dim >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        Scratch w;
        size_t vec = sizeof(float) * ROWS;
        w.qt = aligned_alloc(64, vec * (size_t)dim);
        w.st = aligned_alloc(64, vec * KC);
        w.o = aligned_alloc(64, vec * (size_t)dim);
        w.m = aligned_alloc(64, vec), w.l = aligned_alloc(64, vec), w.corr = aligned_alloc(64, vec);
        w.zero = calloc((size_t)dim, sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; ++it) {
            long b = 0, rest = it; /* item -> (sequence, KV head, head tile, token tile) */
            for (;; ++b) {
                long here = kv_heads * head_tiles * ((query_lens[b] + tq - 1) / tq);
                if (rest < here) break;
                rest -= here;
            }
            long tiles = (query_lens[b] + tq - 1) / tq;
            long t = rest % tiles, ht = rest / tiles % head_tiles, kvh = rest / tiles / head_tiles;
            long t0 = t * tq, n_tok = query_lens[b] - t0 < tq ? query_lens[b] - t0 : tq;
            long h0 = ht * hn, nh = group - h0 < hn ? group - h0 : hn;
            /* tiles of fewer heads than hn (a group ROWS does not divide) keep hn's tokens */
            tile(q, q_stride, k_cache, v_cache, block_tables + b * max_blocks, query_start[b],
                 query_lens[b], seq_lens[b], t0, n_tok, kvh * group + h0, nh, kvh, kv_heads,
                 heads, dim, block_size, scale, window, sinks, out, &w);
        }
        free(w.qt), free(w.st), free(w.o), free(w.m), free(w.l), free(w.corr), free(w.zero);
    }
}
#endif /* PAGED_PREFILL_ATTENTION_F32_C */
