/* Decode attention straight through the block table: one query token per sequence.
 *
 * q [batch, heads, dim]; k_cache / v_cache [num_blocks, block_size, kv_heads, dim];
 * block_tables [batch, max_blocks]; seq_lens [batch]; out [batch, heads, dim].
 * Query head h reads KV head h / (heads / kv_heads) (GQA; MQA and MHA are the edge cases).
 * The sequence attends positions [max(0, len - window), len) (window 0 = unlimited):
 *   out = softmax(q.K^T * scale) V, two passes (scores, then weighted sum of V).
 * With `sinks` [heads] (GPT-OSS's learned sink logits; NULL: none) the softmax has one more
 * term per head, e^(sinks[h]), that weighs no value (ops/attention_sinks.py).
 * K/V rows of a (sequence, KV head) come from DRAM once for the group of query heads.
 * Query heads go three at a time where the group allows (each K / V row loaded once for the
 * three: 12 accumulators); other heads: scores 8 positions at a time (eight FMA chains, one
 * transpose-add for the eight horizontal sums), the weighted sum of V in registers.
 * Decode steps read scattered KV blocks and stall on DRAM latency more than on bandwidth: work
 * is split into chunks of CHUNK positions (decode_attention below), a thread prefetches its
 * next chunk's K/V lines a few per row it computes in this one (a cursor over the chunk's
 * runs of slots: no division per line), and a KV head's rows a few positions ahead. The
 * cursor against the slice-per-head loop before it (two integer divisions a line), in
 * benchmarks/bench_decode_attention.py (2 threads, 30 layers; AMD EPYC Zen 4, 3 rounds of
 * ab_commits): KV in cache, batch 16 at 138 positions 124 -> 86 us a layer, batch 4 at 2048
 * 421 -> 286 us, Gemma-3's 4 heads of 256 at 1024 84 -> 61 us; cold, batch 1 at 129 / 512
 * positions 1.20x / 1.12x faster, Gemma-3's 1.08x, batch 16 and batch 4 at 2048 within
 * +-5 % (DRAM-bound: ~150-170 and ~500-570 us). Chunks of 128 against whole sequences, batch 1 (9 heads, 3 KV heads,
 * dim 64, cold caches, 2 threads, medians of 40): 512 positions 99 -> 88 us, 2048 352 -> 164,
 * 8192 1558 -> 563; in the engine's decode step at 2048 positions the 30 layers' attention
 * 9.3 -> 4.0-5.0 ms.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"
#include "fp8.h"

/* Cache slot of position p. Block sizes are powers of two in practice: shift and mask then,
 * since an integer division per position would cost more than the dot product. */
static inline long slot_of(const long *table, long p, long block_size) {
    if ((block_size & (block_size - 1)) == 0) {
        long shift = __builtin_ctzl((unsigned long)block_size);
        return (table[p >> shift] << shift) | (p & (block_size - 1));
    }
    return table[p / block_size] * block_size + p % block_size;
}

/* A work item's most positions (see decode_attention; a tuner knob). */
#ifndef DECODE_ATTN_CHUNK
#define DECODE_ATTN_CHUNK 128
#endif
#define CHUNK DECODE_ATTN_CHUNK

/* The lines of a work item's K and V slots, walked in order without a division per line: the
 * item's positions fall in runs of consecutive slots (a run per cache block), and a run's K
 * (or V) rows are one contiguous span of bytes. */
typedef struct {
    const char *k, *v;          /* the caches */
    long off[CHUNK + 1], end[CHUNK + 1]; /* run r: bytes [off, end) of either cache */
    long runs, lines;           /* its runs, and lines (of each cache) */
    long r, at, done;           /* the next line (run r, byte at); lines prefetched so far */
} line_cursor;

/* the cursor at the first line of positions [p0, p1) of the sequence with block `table` */
static inline void cursor_start(line_cursor *c, const char *k, const char *v, const long *table,
                                long p0, long p1, long block_size, long slot_bytes) {
    c->k = k, c->v = v, c->runs = 0, c->lines = 0, c->r = 0, c->done = 0;
    for (long p = p0; p < p1;) { /* (at most CHUNK positions: CHUNK + 1 runs) */
        long blk = p / block_size, stop = (blk + 1) * block_size;
        stop = stop < p1 ? stop : p1;
        long first = table[blk] * block_size + (p - blk * block_size);
        c->off[c->runs] = first * slot_bytes & ~63L; /* (from the line the run starts in) */
        c->end[c->runs] = (first + stop - p) * slot_bytes;
        c->lines += (c->end[c->runs] - c->off[c->runs] + 63) / 64;
        ++c->runs, p = stop;
    }
    c->at = c->runs ? c->off[0] : 0;
}

/* prefetch the next n lines of K and of V (fewer where the item ends) */
static inline void cursor_prefetch(line_cursor *c, long n) {
    for (; n > 0 && c->r < c->runs; --n) {
        _mm_prefetch(c->k + c->at, _MM_HINT_T1);
        _mm_prefetch(c->v + c->at, _MM_HINT_T1);
        c->at += 64, ++c->done;
        if (c->at >= c->end[c->r] && ++c->r < c->runs) c->at = c->off[c->r];
    }
}

/* prefetch up to the item's first `target` lines */
static inline void cursor_prefetch_to(line_cursor *c, long target) {
    cursor_prefetch(c, target - c->done);
}

#ifdef __AVX2__
/* [sum(a0), sum(a1), ..., sum(a7)]: eight horizontal sums in one transpose-add tree. */
static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                             __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
    __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* s[j] = q . K[p_j] for the 8 rows kr[0..7] (dim % 8 == 0): eight independent FMA chains,
 * q read once per 8 rows. */
static inline __m256 dot8_rows(const float *q, const float *const kr[8], long dim,
                               line_cursor *pf, long rate) {
    cursor_prefetch(pf, rate);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (long i = 0; i < dim; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[0] + i), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[1] + i), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[2] + i), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[3] + i), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[4] + i), a4);
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[5] + i), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[6] + i), a6);
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[7] + i), a7);
    }
    return hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
}

/* o[0..64) = sum_i w[i] * V[rows i][0..64): eight accumulators held in registers across all
 * positions (the axpy form loads and stores o for every position). */
static inline void weighted_sum64(float *o, const float *w, const float *const *vr, long n,
                                  long offset, line_cursor *pf, long rate) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (long i = 0; i < n; ++i) {
        cursor_prefetch(pf, rate);
        const float *v = vr[i] + offset;
        __m256 wv = _mm256_broadcast_ss(w + i);
        a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v), a0);
        a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8), a1);
        a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 16), a2);
        a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 24), a3);
        a4 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 32), a4);
        a5 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 40), a5);
        a6 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 48), a6);
        a7 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 56), a7);
    }
    _mm256_storeu_ps(o, a0);
    _mm256_storeu_ps(o + 8, a1);
    _mm256_storeu_ps(o + 16, a2);
    _mm256_storeu_ps(o + 24, a3);
    _mm256_storeu_ps(o + 32, a4);
    _mm256_storeu_ps(o + 40, a5);
    _mm256_storeu_ps(o + 48, a6);
    _mm256_storeu_ps(o + 56, a7);
}
/* Three query heads of one KV head at once: each K / V row is loaded once for the three.
 * s_h[j] = q_h . K[p_j] for 4 rows at a time (12 accumulators + 3 query + 1 row register). */
static inline void dot4_rows_3heads(const float *q0, const float *q1, const float *q2,
                                    const float *const kr[4], long dim, float *s0, float *s1,
                                    float *s2, float scale, line_cursor *pf, long rate) {
    cursor_prefetch(pf, rate);
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
           a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (long i = 0; i < dim; i += 8) {
        __m256 x0 = _mm256_loadu_ps(q0 + i), x1 = _mm256_loadu_ps(q1 + i),
               x2 = _mm256_loadu_ps(q2 + i);
        __m256 k = _mm256_loadu_ps(kr[0] + i);
        a00 = _mm256_fmadd_ps(x0, k, a00), a10 = _mm256_fmadd_ps(x1, k, a10), a20 = _mm256_fmadd_ps(x2, k, a20);
        k = _mm256_loadu_ps(kr[1] + i);
        a01 = _mm256_fmadd_ps(x0, k, a01), a11 = _mm256_fmadd_ps(x1, k, a11), a21 = _mm256_fmadd_ps(x2, k, a21);
        k = _mm256_loadu_ps(kr[2] + i);
        a02 = _mm256_fmadd_ps(x0, k, a02), a12 = _mm256_fmadd_ps(x1, k, a12), a22 = _mm256_fmadd_ps(x2, k, a22);
        k = _mm256_loadu_ps(kr[3] + i);
        a03 = _mm256_fmadd_ps(x0, k, a03), a13 = _mm256_fmadd_ps(x1, k, a13), a23 = _mm256_fmadd_ps(x2, k, a23);
    }
    __m256 sc = _mm256_set1_ps(scale);
    __m256 h01 = _mm256_mul_ps(hsum8x8(a00, a01, a02, a03, a10, a11, a12, a13), sc);
    __m256 z = _mm256_setzero_ps();
    __m256 h2 = _mm256_mul_ps(hsum8x8(a20, a21, a22, a23, z, z, z, z), sc);
    _mm_storeu_ps(s0, _mm256_castps256_ps128(h01));
    _mm_storeu_ps(s1, _mm256_extractf128_ps(h01, 1));
    _mm_storeu_ps(s2, _mm256_castps256_ps128(h2));
}

/* o_h[0..32) = sum_i w_h[i] * V[rows i][offset..offset+32) for three heads (12 accumulators). */
static inline void weighted_sum32_3heads(float *o0, float *o1, float *o2, const float *w0,
                                         const float *w1, const float *w2,
                                         const float *const *vr, long n, long offset,
                                         line_cursor *pf, long rate) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00,
           a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (long i = 0; i < n; ++i) {
        cursor_prefetch(pf, rate);
        const float *v = vr[i] + offset;
        __m256 b0 = _mm256_broadcast_ss(w0 + i), b1 = _mm256_broadcast_ss(w1 + i),
               b2 = _mm256_broadcast_ss(w2 + i);
        __m256 x = _mm256_loadu_ps(v);
        a00 = _mm256_fmadd_ps(b0, x, a00), a10 = _mm256_fmadd_ps(b1, x, a10), a20 = _mm256_fmadd_ps(b2, x, a20);
        x = _mm256_loadu_ps(v + 8);
        a01 = _mm256_fmadd_ps(b0, x, a01), a11 = _mm256_fmadd_ps(b1, x, a11), a21 = _mm256_fmadd_ps(b2, x, a21);
        x = _mm256_loadu_ps(v + 16);
        a02 = _mm256_fmadd_ps(b0, x, a02), a12 = _mm256_fmadd_ps(b1, x, a12), a22 = _mm256_fmadd_ps(b2, x, a22);
        x = _mm256_loadu_ps(v + 24);
        a03 = _mm256_fmadd_ps(b0, x, a03), a13 = _mm256_fmadd_ps(b1, x, a13), a23 = _mm256_fmadd_ps(b2, x, a23);
    }
    _mm256_storeu_ps(o0, a00), _mm256_storeu_ps(o0 + 8, a01), _mm256_storeu_ps(o0 + 16, a02), _mm256_storeu_ps(o0 + 24, a03);
    _mm256_storeu_ps(o1, a10), _mm256_storeu_ps(o1 + 8, a11), _mm256_storeu_ps(o1 + 16, a12), _mm256_storeu_ps(o1 + 24, a13);
    _mm256_storeu_ps(o2, a20), _mm256_storeu_ps(o2 + 8, a21), _mm256_storeu_ps(o2 + 16, a22), _mm256_storeu_ps(o2 + 24, a23);
}
#endif

/* The calls to the row functions above that take a line cursor (each prefetches `rate` of the
 * next item's lines) for one KV head's n rows: scores of three heads per call of 4 rows, of
 * the other heads per call of 8 rows; weighted sums a call a row and 32 (three heads) or 64
 * (one head) columns. 0 without AVX2 (the next item's lines then go after each KV head). */
static inline long row_steps(long n, long group, long dim) {
#ifdef __AVX2__
    long triples = dim % 8 == 0 ? group / 3 : 0, scores = 0, sums = 0;
    if (dim % 8 == 0) scores = triples * (n / 4) + (group - 3 * triples) * (n / 8);
    if (dim % 32 == 0 && group % 3 == 0) sums = group / 3 * n * (dim / 32);
    else if (dim % 64 == 0) sums = group * n * (dim / 64);
    return scores + sums;
#else
    (void)n, (void)group, (void)dim;
    return 0;
#endif
}

/* Rows of FP8 E4M3 codes → fp32 values · s (one rounding, as the torch path decodes them). */
static inline void decode_rows_e4m3(const uint8_t *const *src, float *dst, long n, long dim,
                                    float s) {
    for (long i = 0; i < n; ++i) {
        const uint8_t *c = src[i];
        float *d = dst + i * dim;
        long j = 0;
#ifdef __AVX2__
        __m256 s256 = _mm256_set1_ps(s * 256.0f);
        for (; j + 8 <= dim; j += 8)
            _mm256_storeu_ps(d + j, _mm256_mul_ps(e4m3x8_times_2m8(c + j), s256));
#endif
        for (; j < dim; ++j) d[j] = decode_e4m3(c[j]) * s;
    }
}

/* The kernel for both cache element types: fp32 values (k_scales NULL) or FP8 E4M3 codes
 * with one scale per KV head, decoded per (chunk, KV head) into a thread's fp32 rows before the
 * same arithmetic runs on them.
 *
 * Work items are chunks of a sequence (the fewest of at most CHUNK positions, of equal
 * lengths), every KV head in turn: a chunk's
 * slots are read whole (each slot holds all KV heads side by side), one sequence spreads over
 * the threads (batch 1 with 3 KV heads on 2 threads was 2 : 1), and a thread prefetches its next
 * chunk while it computes this one. A chunk leaves per query head its partial softmax state —
 * the running max m, the sum l of e^(s − m) and o = sum e^(s − m) V — and a merge pass combines
 * a sequence's chunks: out = sum_c e^(m_c − M) o_c / sum_c e^(m_c − M) l_c. The split depends
 * on the sequence alone, so its result does not depend on the batch or the thread count.
 * A generated layer program may set another chunk length (DECODE_ATTN_CHUNK, a tuner knob:
 * compiler/program_tune.py). */

/* A sequence's work items: the fewest chunks of at most CHUNK of its `span` positions (one,
 * empty, when it has none). */
static inline long chunks_of(long span) { return span > 0 ? (span + CHUNK - 1) / CHUNK : 1; }

static void decode_attention(const float *q, const void *k_cache, const void *v_cache,
                             const float *k_scales, const float *v_scales,
                             const long *block_tables, long max_blocks, const long *seq_lens,
                             float *out, long batch, long heads, long kv_heads, long dim,
                             long block_size, float scale, long window, const float *sinks,
                             int num_threads) {
    int codes = k_scales != 0;
    long esz = codes ? 1 : 4; /* bytes per cached element */
    const char *kc = (const char *)k_cache, *vc = (const char *)v_cache;
    long group = heads / kv_heads;
    long slot_stride = kv_heads * dim; /* floats between consecutive cache slots */
    /* item it covers sequence item_seq[it], positions [item_pos[it], item_end[it]) */
    long items = 0, work = 0;
    for (long b = 0; b < batch; ++b) {
        long len = seq_lens[b], start = (window > 0 && len > window) ? len - window : 0;
        items += chunks_of(len - start);
        work += len - start;
    }
    long *item_seq = malloc(sizeof(long) * (size_t)(3 * items));
    long *item_pos = item_seq + items, *item_end = item_pos + items;
    long *first_item = malloc(sizeof(long) * (size_t)(batch + 1));
    for (long b = 0, it = 0; b < batch; ++b) {
        long len = seq_lens[b], start = (window > 0 && len > window) ? len - window : 0;
        /* chunks of equal lengths (to one): 129 positions are 65 + 64, not 128 + 1, which
         * left one thread idle */
        long span = len - start, chunks = chunks_of(span);
        first_item[b] = it;
        for (long c = 0; c < chunks; ++c, ++it) {
            item_seq[it] = b;
            item_pos[it] = start + c * span / chunks;
            item_end[it] = start + (c + 1) * span / chunks;
        }
        first_item[b + 1] = it;
    }
    /* per item and query head: o [dim], then m and l */
    long state = dim + 2;
    float *partial = malloc(sizeof(float) * (size_t)(items * heads * state));
#pragma omp parallel num_threads(num_threads) if (work * kv_heads * dim >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        float *scores = malloc(sizeof(float) * (size_t)(group * CHUNK));
        const float **krows = malloc(sizeof(float *) * (size_t)CHUNK);
        const float **vrows = malloc(sizeof(float *) * (size_t)CHUNK);
        float *kbuf = codes ? malloc(sizeof(float) * (size_t)(CHUNK * dim)) : 0;
        float *vbuf = codes ? malloc(sizeof(float) * (size_t)(CHUNK * dim)) : 0;
        int nthr = omp_get_num_threads();
        const long slot_bytes = slot_stride * esz; /* a slot's K (or V) rows, every KV head */
        line_cursor pf;
#pragma omp for schedule(static, 1)
        for (long it = 0; it < items; ++it) {
            long b = item_seq[it], start = item_pos[it], n = item_end[it] - start;
            const long *table = block_tables + b * max_blocks;
            if (it < nthr) { /* a thread's first item, which no earlier item prefetched: all
                              * of its lines asked for now (batch 1 at 129 positions, 30
                              * layers, cold: 0.91 -> 0.74 ms; 512: 1.41 -> 1.27 ms) */
                cursor_start(&pf, kc, vc, table, start, start + n, block_size, slot_bytes);
                cursor_prefetch(&pf, pf.lines);
            }
            /* this thread's next item: its slots (every KV head), K and V, prefetched a few
             * lines (pf_rate) per call of the row functions (row_steps), the rest after each
             * KV head (up to its share) */
            long pf_it = it + nthr;
            cursor_start(&pf, kc, vc, pf_it < items ? block_tables + item_seq[pf_it] * max_blocks : 0,
                         pf_it < items ? item_pos[pf_it] : 0, pf_it < items ? item_end[pf_it] : 0,
                         block_size, slot_bytes);
            long pf_lines = pf.lines;
            long pf_rate = pf_lines / (kv_heads * row_steps(n, group, dim) + 1) + 1;
            for (long kvh = 0; kvh < kv_heads; ++kvh) {
                /* the next item's lines not yet asked for, up to this KV head's share */
                cursor_prefetch_to(&pf, pf_lines * kvh / kv_heads);
                for (long i = 0; i < n; ++i) { /* slots once per (chunk, KV head) */
                    long offset = slot_of(table, start + i, block_size) * slot_stride + kvh * dim;
                    krows[i] = (const float *)(kc + offset * esz);
                    vrows[i] = (const float *)(vc + offset * esz);
                }
                if (codes) { /* the codes' values, in this thread's rows */
                    decode_rows_e4m3((const uint8_t *const *)krows, kbuf, n, dim, k_scales[kvh]);
                    decode_rows_e4m3((const uint8_t *const *)vrows, vbuf, n, dim, v_scales[kvh]);
                    for (long i = 0; i < n; ++i) krows[i] = kbuf + i * dim, vrows[i] = vbuf + i * dim;
                }
                long g3 = 0; /* heads done three at a time (scores of rows 0..n4) */
                long n4 = 0;
#ifdef __AVX2__
                if (dim % 8 == 0) {
                    n4 = n / 4 * 4;
                    for (; g3 + 3 <= group; g3 += 3) {
                        const float *qh = q + (b * heads + kvh * group + g3) * dim;
                        for (long i = 0; i < n4; i += 4) {
                            if (g3 == 0 && !codes) { /* this KV head's K rows ahead, V rows now (L2) */
                                for (long r = i + 16; r < i + 20 && r < n; ++r)
                                    for (long c = 0; c < dim; c += 16)
                                        _mm_prefetch((const char *)(krows[r] + c), _MM_HINT_T0);
                                for (long r = i; r < i + 4; ++r)
                                    for (long c = 0; c < dim; c += 16)
                                        _mm_prefetch((const char *)(vrows[r] + c), _MM_HINT_T1);
                            }
                            dot4_rows_3heads(qh, qh + dim, qh + 2 * dim, krows + i, dim,
                                             scores + g3 * n + i, scores + (g3 + 1) * n + i,
                                             scores + (g3 + 2) * n + i, scale, &pf, pf_rate);
                        }
                    }
                }
#endif
                float *st = partial + (it * heads + kvh * group) * state; /* the group's states */
                for (long g = 0; g < group; ++g) {
                    const float *qh = q + (b * heads + kvh * group + g) * dim;
                    float *s = scores + g * n;
                    long i = g < g3 ? n4 : 0;
#ifdef __AVX2__
                    if (dim % 8 == 0)
                        for (; i + 8 <= n; i += 8)
                            _mm256_storeu_ps(s + i, _mm256_mul_ps(dot8_rows(qh, krows + i, dim, &pf, pf_rate),
                                                                  _mm256_set1_ps(scale)));
#endif
                    for (; i < n; ++i) s[i] = dot_f32(qh, krows[i], dim) * scale;
                    float best = -INFINITY;
                    for (i = 0; i < n; ++i) best = s[i] > best ? s[i] : best;
                    for (i = 0; i < n; ++i) s[i] -= best;
                    exp_array(s, s, n);
                    float total = 0.0f;
#pragma omp simd reduction(+ : total)
                    for (i = 0; i < n; ++i) total += s[i];
                    st[g * state + dim] = best, st[g * state + dim + 1] = total;
                }
                /* o = sum e^(s - m) V per head of the group (unnormalized: merged below) */
#ifdef __AVX2__
                if (dim % 32 == 0 && group % 3 == 0) { /* V rows once per three heads */
                    for (long g = 0; g < group; g += 3)
                        for (long c = 0; c < dim; c += 32)
                            weighted_sum32_3heads(st + g * state + c, st + (g + 1) * state + c,
                                                  st + (g + 2) * state + c, scores + g * n,
                                                  scores + (g + 1) * n, scores + (g + 2) * n,
                                                  vrows, n, c, &pf, pf_rate);
                    continue;
                }
                if (dim % 64 == 0) { /* V rows from cache (L1/L2) once per head, o in registers */
                    for (long g = 0; g < group; ++g)
                        for (long c = 0; c < dim; c += 64)
                            weighted_sum64(st + g * state + c, scores + g * n, vrows, n, c, &pf,
                                           pf_rate);
                    continue;
                }
#endif
                for (long g = 0; g < group; ++g)
                    for (long d = 0; d < dim; ++d) st[g * state + d] = 0.0f;
                for (long i = 0; i < n; ++i) /* each V row read once for the whole group */
                    for (long g = 0; g < group; ++g)
                        axpy_f32(st + g * state, scores[g * n + i], vrows[i], dim);
            }
            cursor_prefetch_to(&pf, pf_lines); /* (what the rate left) */
        }
        /* the merge: a sequence's chunks, per query head */
#pragma omp for schedule(static)
        for (long bh = 0; bh < batch * heads; ++bh) {
            long b = bh / heads, h = bh % heads;
            const float *st0 = partial + (first_item[b] * heads + h) * state;
            long chunks = first_item[b + 1] - first_item[b];
            /* a learned sink logit (GPT-OSS) is one more softmax term with no value */
            float sink = sinks ? sinks[h] : -INFINITY;
            float m = sink, l = 0.0f;
            for (long c = 0; c < chunks; ++c) {
                float mc = st0[c * heads * state + dim];
                m = mc > m ? mc : m;
            }
            float *o = out + bh * dim;
            for (long d = 0; d < dim; ++d) o[d] = 0.0f;
            for (long c = 0; c < chunks; ++c) {
                const float *sc = st0 + c * heads * state;
                if (!(sc[dim + 1] > 0.0f)) continue; /* (an empty chunk: nothing to add) */
                float w = chunks == 1 && !sinks ? 1.0f : expf(sc[dim] - m);
                l += w * sc[dim + 1];
                for (long d = 0; d < dim; ++d) o[d] += w * sc[d];
            }
            if (sinks) l += expf(sink - m);
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (long d = 0; d < dim; ++d) o[d] *= inv;
        }
        free(scores);
        free(krows);
        free(vrows);
        free(kbuf);
        free(vbuf);
    }
    free(partial);
    free(item_seq);
    free(first_item);
}

void paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                                const long *block_tables, long max_blocks, const long *seq_lens,
                                float *out, long batch, long heads, long kv_heads, long dim,
                                long block_size, float scale, long window, const float *sinks,
                                int num_threads) {
    decode_attention(q, k_cache, v_cache, 0, 0, block_tables, max_blocks, seq_lens, out, batch,
                     heads, kv_heads, dim, block_size, scale, window, sinks, num_threads);
}

/* k_cache / v_cache: FP8 E4M3 codes; k_scales / v_scales [kv_heads]. */
void paged_decode_attention_e4m3(const float *q, const uint8_t *k_cache, const uint8_t *v_cache,
                                 const float *k_scales, const float *v_scales,
                                 const long *block_tables, long max_blocks, const long *seq_lens,
                                 float *out, long batch, long heads, long kv_heads, long dim,
                                 long block_size, float scale, long window,
                                 const float *sinks, int num_threads) {
    decode_attention(q, k_cache, v_cache, k_scales, v_scales, block_tables, max_blocks, seq_lens,
                     out, batch, heads, kv_heads, dim, block_size, scale, window, sinks,
                     num_threads);
}
