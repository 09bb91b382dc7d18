/* Decode attention straight through the block table: one query token per sequence.
 *
 * q [batch, heads, dim]; k_cache / v_cache [num_blocks, block_size, kv_heads, dim];
 * block_tables [batch, max_blocks]; seq_lens [batch]; out [batch, heads, dim].
 * Query head h reads KV head h / (heads / kv_heads) (GQA; MQA and MHA are the edge cases).
 * The sequence attends positions [max(0, len - window), len) (window 0 = unlimited):
 *   out = softmax(q.K^T * scale) V, two passes (scores, then weighted sum of V).
 * Work items are (sequence, KV head) pairs, so K/V rows are read once per group of heads.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"

/* Cache slot of position p. Block sizes are powers of two in practice: shift and mask then,
 * since an integer division per position would cost more than the dot product. */
static inline long slot_of(const long *table, long p, long block_size) {
    if ((block_size & (block_size - 1)) == 0) {
        long shift = __builtin_ctzl((unsigned long)block_size);
        return (table[p >> shift] << shift) | (p & (block_size - 1));
    }
    return table[p / block_size] * block_size + p % block_size;
}

void paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                                const long *block_tables, long max_blocks, const long *seq_lens,
                                float *out, long batch, long heads, long kv_heads, long dim,
                                long block_size, float scale, long window, int num_threads) {
    long group = heads / kv_heads;
    long slot_stride = kv_heads * dim; /* floats between consecutive cache slots */
    long max_len = 0;
    for (long b = 0; b < batch; ++b) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;
    long work = 0;
    for (long b = 0; b < batch; ++b) work += seq_lens[b];
#pragma omp parallel num_threads(num_threads) if (work * kv_heads * dim >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
        float *scores = malloc(sizeof(float) * (size_t)(group * (max_len > 0 ? max_len : 1)));
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (long b = 0; b < batch; ++b) {
            for (long kvh = 0; kvh < kv_heads; ++kvh) {
                long len = seq_lens[b];
                long start = (window > 0 && len > window) ? len - window : 0;
                long n = len - start;
                const long *table = block_tables + b * max_blocks;
                for (long g = 0; g < group; ++g) {
                    long h = kvh * group + g;
                    const float *qh = q + (b * heads + h) * dim;
                    float *s = scores + g * n;
                    float best = -INFINITY;
                    for (long p = start; p < len; ++p) {
                        const float *kr = k_cache + slot_of(table, p, block_size) * slot_stride +
                                          kvh * dim;
                        float dot = dot_f32(qh, kr, dim) * scale;
                        s[p - start] = dot;
                        best = dot > best ? dot : best;
                    }
                    for (long i = 0; i < n; ++i) s[i] -= best;
                    exp_array(s, s, n);
                    float total = 0.0f;
#pragma omp simd reduction(+ : total)
                    for (long i = 0; i < n; ++i) total += s[i];
                    float inv = 1.0f / total;
                    for (long i = 0; i < n; ++i) s[i] *= inv;
                    float *o = out + (b * heads + h) * dim;
                    for (long d = 0; d < dim; ++d) o[d] = 0.0f;
                }
                /* weighted sum of V, each V row read once for the whole group */
                for (long p = start; p < len; ++p) {
                    const float *vr =
                        v_cache + slot_of(table, p, block_size) * slot_stride + kvh * dim;
                    for (long g = 0; g < group; ++g) {
                        float w = scores[g * n + (p - start)];
                        axpy_f32(out + (b * heads + kvh * group + g) * dim, w, vr, dim);
                    }
                }
            }
        }
        free(scores);
    }
}
