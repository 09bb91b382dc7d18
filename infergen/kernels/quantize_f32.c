/* Block quantization fast path (formats/fast.py), bit-identical to formats/codec.py.
 * The minifloat element encode is minifloat.h's.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "minifloat.h"

/* c[i] = encode(v[i] / div) when `divide`, else encode(v[i] · s1 · s2); 8 lanes at a time. */
static inline void encode_run(const float *v, uint8_t *c, long n, int divide, float s1,
                              float s2, float div, const elem_t *t) {
    long i = 0;
#ifdef __AVX2__
    __m256 m1 = _mm256_set1_ps(s1), m2 = _mm256_set1_ps(s2), d = _mm256_set1_ps(div);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        x = divide ? _mm256_div_ps(x, d) : _mm256_mul_ps(_mm256_mul_ps(x, m1), m2);
        store8_u8(c + i, encode8(x, t));
    }
#endif
    for (; i < n; ++i) c[i] = encode(divide ? v[i] / div : v[i] * s1 * s2, t);
}

/* Block amax over |v| and whether the block holds NaN or ±Inf. */
static inline float block_amax(const float *v, long n, int *bad) {
    long i = 0;
    float amax = 0.0f;
    int nonfinite = 0;
#ifdef __AVX2__
    __m256 vmax = _mm256_setzero_ps();
    __m256i vbad = _mm256_setzero_si256();
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F7FFFFF);
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(v + i)), abs_mask);
        vbad = _mm256_or_si256(vbad, _mm256_cmpgt_epi32(b, inf));
        vmax = _mm256_max_ps(_mm256_castsi256_ps(b), vmax); /* NaN lane: keeps vmax */
    }
    nonfinite = !_mm256_testz_si256(vbad, vbad);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
    for (; i < n; ++i) {
        float a = fabsf(v[i]);
        nonfinite |= !isfinite(a);
        amax = a > amax ? a : amax;
    }
    *bad = nonfinite;
    return amax;
}

/* x · 2^-e exactly for |e| <= 127, as the reference's pow2_scale (two normal factors). */
static inline float scale_pow2(float x, int e) {
    int neg = -e;
    int half = neg >= 0 ? neg / 2 : -((-neg + 1) / 2); /* floor(neg / 2) */
    return x * pow2f(half) * pow2f(neg - half);
}

static inline int floor_log2(float a) { /* a > 0 finite */
    int e;
    frexpf(a, &e);
    return e - 1;
}

static inline int ceil_log2(float a) {
    int e;
    float m = frexpf(a, &e);
    return m == 0.5f ? e - 1 : e;
}

/* MX: blocks of `block` along rows of x [n_blocks * block]; scales[n_blocks] E8M0 bytes;
 * codes[n] one per element. rule 0 = FLOOR (emax = floor(log2 max)), 1 = RCEIL. */
void mx_quantize_f32(const float *x, uint8_t *codes, uint8_t *scales, long n_blocks, long block,
                     int mbits, int emin, int bits, int max_code, int nan_code, float max_elem,
                     int rule, int num_threads) {
    elem_t t = {mbits, emin, bits, max_code, nan_code, max_elem};
    int emax = floor_log2(max_elem);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks * block >= PARALLEL_MIN_ELEMENTS)
    for (long b = 0; b < n_blocks; ++b) {
        flush_denormals();
        const float *v = x + b * block;
        uint8_t *c = codes + b * block;
        int bad;
        float amax = block_amax(v, block, &bad);
        if (bad) {
            scales[b] = 0xFF;
            memset(c, 0, (size_t)block);
            continue;
        }
        int e;
        if (amax == 0.0f)
            e = -127;
        else
            e = rule == 0 ? floor_log2(amax) - emax : ceil_log2(amax / max_elem);
        e = e < -127 ? -127 : (e > 127 ? 127 : e);
        scales[b] = (uint8_t)(e + 127);
        int neg = -e, half = neg >= 0 ? neg / 2 : -((-neg + 1) / 2); /* as scale_pow2 */
        encode_run(v, c, block, 0, pow2f(half), pow2f(neg - half), 1.0f, &t);
    }
}

/* NVFP4: blocks of 16; scale = e4m3(amax / 6 / global); elements e2m1(v / (scale · global)),
 * written packed (8 bytes a block, element 2i in the low nibble: formats/pack.py).
 * e4m3_values: the 256-entry E4M3 decode table (fp32). */
/* One NVFP4 block's elements, given its E4M3 scale code (scalar tail and the 8-block path). */
static inline void nvfp4_block(const float *v, uint8_t *packed, uint8_t s, int bad, float global,
                               const float *e4m3_values, const elem_t *e2m1) {
    float divisor = e4m3_values[s] * global;
    if (bad || e4m3_values[s] == 0.0f) {
        memset(packed, 0, 8);
        return;
    }
    uint8_t c[16];
    encode_run(v, c, 16, 1, 1.0f, 1.0f, divisor, e2m1);
#ifdef __AVX2__
    /* (low, high) byte pairs → low + 16 · high, then the 8 u16 lanes → 8 bytes */
    __m128i pairs = _mm_maddubs_epi16(_mm_loadu_si128((const __m128i *)c), _mm_set1_epi16(0x1001));
    _mm_storel_epi64((__m128i *)packed, _mm_packus_epi16(pairs, pairs));
#else
    for (int j = 0; j < 8; ++j) packed[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
#endif
}

#ifdef __AVX2__
/* out lane k = max over the 8 lanes of r[k] (a transpose-and-reduce). */
static inline __m256 hmax8x8(const __m256 *r) {
    __m256 a01 = _mm256_max_ps(_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpackhi_ps(r[0], r[1]));
    __m256 a23 = _mm256_max_ps(_mm256_unpacklo_ps(r[2], r[3]), _mm256_unpackhi_ps(r[2], r[3]));
    __m256 a45 = _mm256_max_ps(_mm256_unpacklo_ps(r[4], r[5]), _mm256_unpackhi_ps(r[4], r[5]));
    __m256 a67 = _mm256_max_ps(_mm256_unpacklo_ps(r[6], r[7]), _mm256_unpackhi_ps(r[6], r[7]));
    __m256 b = _mm256_max_ps(_mm256_shuffle_ps(a01, a23, 0x44), _mm256_shuffle_ps(a01, a23, 0xEE));
    __m256 c = _mm256_max_ps(_mm256_shuffle_ps(a45, a67, 0x44), _mm256_shuffle_ps(a45, a67, 0xEE));
    return _mm256_max_ps(_mm256_permute2f128_ps(b, c, 0x20), _mm256_permute2f128_ps(b, c, 0x31));
}
#endif

void nvfp4_quantize_f32(const float *x, uint8_t *codes, uint8_t *scales, long n_blocks,
                        float global, const float *e4m3_values, int num_threads) {
    elem_t e4m3 = {3, -6, 8, 0x7E, 0x7F, 448.0f};
    elem_t e2m1 = {1, 0, 4, 0x7, -1, 6.0f};
    long n_groups = n_blocks / 8; /* 8 blocks at a time: their scales in one vector */
#ifndef __AVX2__
    n_groups = 0;
#endif
#pragma omp parallel num_threads(num_threads) if (n_blocks * 16 >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#ifdef __AVX2__
        const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), big = _mm256_set1_epi32(0x7F7FFFFF);
#pragma omp for schedule(static)
        for (long grp = 0; grp < n_groups; ++grp) {
            const float *v = x + grp * 128;
            uint8_t *c = codes + grp * 64;
            __m256 amax[8];
            int bad[8];
            for (int k = 0; k < 8; ++k) {
                __m256i b0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + 16 * k)), abs_mask);
                __m256i b1 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + 16 * k + 8)), abs_mask);
                __m256i nonfinite = _mm256_or_si256(_mm256_cmpgt_epi32(b0, big), _mm256_cmpgt_epi32(b1, big));
                bad[k] = !_mm256_testz_si256(nonfinite, nonfinite);
                amax[k] = _mm256_max_ps(_mm256_castsi256_ps(b0), _mm256_castsi256_ps(b1));
            }
            __m256 m = hmax8x8(amax);
            __m256i bad_lanes = _mm256_setr_epi32(-bad[0], -bad[1], -bad[2], -bad[3], -bad[4],
                                                  -bad[5], -bad[6], -bad[7]);
            m = _mm256_andnot_ps(_mm256_castsi256_ps(bad_lanes), m); /* bad → 0, then NaN code */
            __m256 r = _mm256_div_ps(_mm256_div_ps(m, _mm256_set1_ps(6.0f)), _mm256_set1_ps(global));
            __m256i s = _mm256_blendv_epi8(encode8(r, &e4m3), _mm256_set1_epi32(0x7F), bad_lanes);
            store8_u8(scales + grp * 8, s);
            int sc[8];
            _mm256_storeu_si256((__m256i *)sc, s);
            for (int k = 0; k < 8; ++k)
                nvfp4_block(v + 16 * k, c + 8 * k, (uint8_t)sc[k], bad[k], global, e4m3_values, &e2m1);
        }
#endif
#pragma omp for schedule(static)
        for (long b = n_groups * 8; b < n_blocks; ++b) {
            const float *v = x + b * 16;
            int bad;
            float amax = block_amax(v, 16, &bad);
            uint8_t s = bad ? 0x7F : encode(amax / 6.0f / global, &e4m3);
            scales[b] = s;
            nvfp4_block(v, codes + b * 8, s, bad, global, e4m3_values, &e2m1);
        }
    }
}

/* Per-tensor scaled cast (FP8): codes[i] = encode(x[i] / scale). */
void scaled_encode_f32(const float *x, uint8_t *codes, long n, float scale, int mbits, int emin,
                       int bits, int max_code, int nan_code, float max_elem, int num_threads) {
    elem_t t = {mbits, emin, bits, max_code, nan_code, max_elem};
    const long chunk = 4096;
#pragma omp parallel num_threads(num_threads) if (n >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long start = 0; start < n; start += chunk) {
            long len = n - start < chunk ? n - start : chunk;
            encode_run(x + start, codes + start, len, 1, 1.0f, 1.0f, scale, &t);
        }
    }
}

/* Dequantize: out[i] = table[codes[i]] * 2^(scales[i / block] - 127) (MX; 0xFF → NaN). */
void mx_dequantize_f32(const uint8_t *codes, const uint8_t *scales, const float *table,
                       float *out, long n_blocks, long block, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks * block >= PARALLEL_MIN_ELEMENTS)
    for (long b = 0; b < n_blocks; ++b) {
        flush_denormals();
        int e = (int)scales[b] - 127;
        int half = e >= 0 ? e / 2 : -((-e + 1) / 2);
        float s1 = pow2f(half), s2 = pow2f(e - half);
        if (scales[b] == 0xFF) s1 = NAN;
        const uint8_t *c = codes + b * block;
        float *o = out + b * block;
        for (long i = 0; i < block; ++i) o[i] = table[c[i]] * s1 * s2;
    }
}

/* Dequantize with one float scale per block (NVFP4: E4M3 value · global; FP8: the tensor
 * scale with block = n): out[i] = table[codes[i]] * scale_values[i / block] * post. */
void block_dequantize_f32(const uint8_t *codes, const float *scale_values, float post,
                          const float *table, float *out, long n_blocks, long block,
                          int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks * block >= PARALLEL_MIN_ELEMENTS)
    for (long b = 0; b < n_blocks; ++b) {
        flush_denormals();
        float s = scale_values[b];
        const uint8_t *c = codes + b * block;
        float *o = out + b * block;
        for (long i = 0; i < block; ++i) o[i] = table[c[i]] * s * post;
    }
}

/* max |x[i]| over the finite x[i] (0 when none): the per-tensor amax of FP8 and NVFP4.
 * Vectorised on the bit patterns: non-negative floats order as their int32 bits. */
void finite_amax_f32(const float *x, long n, float *result, int num_threads) {
    float best = 0.0f;
#pragma omp parallel num_threads(num_threads) reduction(max : best) if (n >= PARALLEL_MIN_ELEMENTS)
    {
        long per = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
        long start = per * omp_get_thread_num(), end = start + per < n ? start + per : n;
        long i = start;
#ifdef __AVX2__
        __m256i vbest = _mm256_setzero_si256();
        const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
        for (; i + 8 <= end; i += 8) {
            __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), abs_mask);
            b = _mm256_and_si256(b, _mm256_cmpgt_epi32(inf, b)); /* NaN / Inf lanes → 0 */
            vbest = _mm256_max_epi32(vbest, b);
        }
        float lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, vbest);
        for (int k = 0; k < 8; ++k) best = lanes[k] > best ? lanes[k] : best;
#endif
        for (; i < end; ++i) {
            float a = fabsf(x[i]);
            if (a <= 3.4028234663852886e38f && a > best) best = a; /* NaN and Inf fail the test */
        }
    }
    *result = best;
}

/* Integer groups (formats/codec.py `_int_quantize`, same float operations in the same order):
 * mode 0 symmetric: scale = amax / qmax, q = clamp(rint(v / scale), -qmax, qmax) stored as
 *        two's complement in the low `bits` bits;
 * mode 1 asymmetric, integer zero point: [min, max] widened to hold 0, scale = (hi - lo) / qmax,
 *        zero = clamp(rint(-lo / scale), 0, qmax), q = clamp(rint(v / scale) + zero, 0, qmax);
 * mode 2 KIVI: scale = (max - min) / qmax, q = clamp(rint((v - min) / scale), 0, qmax), the
 *        fp32 minimum stored in `offsets`.
 * A zero scale divides by 1; a group holding NaN gets a NaN scale (and NaN zero/offset where
 * the reference has one) and zero codes. */
/* Group statistics: min, max (over non-NaN values) and whether a NaN is present. */
static inline void group_stats(const float *v, long n, float *lo_out, float *hi_out, int *nan) {
    float lo = INFINITY, hi = -INFINITY;
    int has_nan = 0;
    long i = 0;
#ifdef __AVX2__
    __m256 vlo = _mm256_set1_ps(INFINITY), vhi = _mm256_set1_ps(-INFINITY);
    __m256 vnan = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        vlo = _mm256_min_ps(x, vlo); /* a NaN lane keeps the second operand */
        vhi = _mm256_max_ps(x, vhi);
    }
    has_nan = _mm256_movemask_ps(vnan) != 0;
    float l[8], h[8];
    _mm256_storeu_ps(l, vlo);
    _mm256_storeu_ps(h, vhi);
    for (int k = 0; k < 8; ++k) {
        lo = l[k] < lo ? l[k] : lo;
        hi = h[k] > hi ? h[k] : hi;
    }
#endif
    for (; i < n; ++i) {
        float a = v[i];
        has_nan |= isnan(a);
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
    }
    *lo_out = lo;
    *hi_out = hi;
    *nan = has_nan;
}

/* Integer codes of one group: q = clamp(rint((v - sub) / div) + add, qlo, qhi), NaN → 0,
 * stored & mask (mode 0: sub = add = 0, [-qmax, qmax]; 1: add = zero; 2: sub = min). */
static inline void int_encode_run(const float *v, uint8_t *c, long n, float sub, float div,
                                  float add, float qlo, float qhi, uint8_t mask) {
    long i = 0;
#ifdef __AVX2__
    const __m256 vsub = _mm256_set1_ps(sub), vdiv = _mm256_set1_ps(div), vadd = _mm256_set1_ps(add);
    const __m256 vlo = _mm256_set1_ps(qlo), vhi = _mm256_set1_ps(qhi);
    const __m256i vmask = _mm256_set1_epi32(mask);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), vsub), vdiv);
        x = _mm256_add_ps(_mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vadd);
        x = _mm256_and_ps(x, _mm256_cmp_ps(x, x, _CMP_ORD_Q)); /* NaN → 0 */
        x = _mm256_min_ps(_mm256_max_ps(x, vlo), vhi);
        store8_u8(c + i, _mm256_and_si256(_mm256_cvttps_epi32(x), vmask));
    }
#endif
    for (; i < n; ++i) {
        float q = rintf((v[i] - sub) / div) + add;
        q = q != q ? 0.0f : q;
        q = q < qlo ? qlo : (q > qhi ? qhi : q);
        c[i] = (uint8_t)((int)q) & mask;
    }
}

void int_quantize_f32(const float *x, uint8_t *codes, float *scales, uint8_t *zeros,
                      float *offsets, long n_groups, long group, int bits, int mode,
                      int num_threads) {
    int qmax = mode == 0 ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
    uint8_t mask = (uint8_t)((1 << bits) - 1);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_groups * group >= PARALLEL_MIN_ELEMENTS)
    for (long g = 0; g < n_groups; ++g) {
        flush_denormals();
        const float *v = x + g * group;
        uint8_t *c = codes + g * group;
        float lo, hi;
        int nan;
        group_stats(v, group, &lo, &hi, &nan);
        float scale;
        if (mode == 0) {
            float amax = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
            scale = nan ? NAN : amax / (float)qmax;
        } else if (mode == 1) {
            lo = lo < 0.0f ? lo : 0.0f;
            hi = hi > 0.0f ? hi : 0.0f;
            scale = nan ? NAN : (hi - lo) / (float)qmax;
        } else
            scale = nan ? NAN : (hi - lo) / (float)qmax;
        scales[g] = scale;
        float div = scale == 0.0f ? 1.0f : scale;
        if (nan) {
            memset(c, 0, (size_t)group);
            if (mode == 1) zeros[g] = 0;
            if (mode == 2) offsets[g] = NAN;
            continue;
        }
        if (mode == 0) {
            int_encode_run(v, c, group, 0.0f, div, 0.0f, (float)-qmax, (float)qmax, mask);
        } else if (mode == 1) {
            float z = rintf(-lo / div);
            z = z < 0.0f ? 0.0f : (z > (float)qmax ? (float)qmax : z);
            zeros[g] = (uint8_t)z;
            int_encode_run(v, c, group, 0.0f, div, z, 0.0f, (float)qmax, mask);
        } else {
            offsets[g] = lo;
            int_encode_run(v, c, group, lo, div, 0.0f, 0.0f, (float)qmax, mask);
        }
    }
}

/* Integer dequantize: symmetric out = signed(code) · scale; with zero points
 * out = (code − zero) · scale. */
void int_dequantize_f32(const uint8_t *codes, const float *scales, const uint8_t *zeros,
                        float *out, long n_groups, long group, int bits, int num_threads) {
    int half = 1 << (bits - 1);
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_groups * group >= PARALLEL_MIN_ELEMENTS)
    for (long g = 0; g < n_groups; ++g) {
        const uint8_t *c = codes + g * group;
        float *o = out + g * group;
        float s = scales[g];
        if (zeros) {
            float z = (float)zeros[g];
            for (long i = 0; i < group; ++i) o[i] = ((float)c[i] - z) * s;
        } else {
            for (long i = 0; i < group; ++i) {
                int q = c[i] >= half ? (int)c[i] - 2 * half : (int)c[i];
                o[i] = (float)q * s;
            }
        }
    }
}

/* KIVI dequantize: out = code · scale + min, rounded twice as the torch reference does (this
 * function is compiled without FMA contraction, which would round once). */
__attribute__((optimize("fp-contract=off"))) void kivi_dequantize_f32(
    const uint8_t *codes, const float *scales, const float *mins, float *out, long n_groups,
    long group, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_groups * group >= PARALLEL_MIN_ELEMENTS)
    for (long g = 0; g < n_groups; ++g) {
        const uint8_t *c = codes + g * group;
        float *o = out + g * group;
        float s = scales[g], lo = mins[g];
        for (long i = 0; i < group; ++i) {
            float p = (float)c[i] * s;
            o[i] = p + lo;
        }
    }
}

/* Sub-byte packing (formats/pack.py): code i of a group of 8 / bits goes to bits
 * [bits·i, bits·(i+1)) of its byte, so element 2i of a 4-bit tensor is the low nibble.
 * Built from one step each way: combine (out[j] = in[2j] + w·in[2j+1]: w = 16 packs nibbles;
 * 2-bit codes take w = 4, then w = 16) and split (its inverse). */
static void combine_pairs(const uint8_t *in, uint8_t *out, long n_out, int w) {
    long j = 0;
#ifdef __AVX2__
    const __m256i weights = _mm256_set1_epi16((short)(1 | (w << 8)));
    for (; j + 32 <= n_out; j += 32) {
        __m256i a = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(in + 2 * j)), weights);
        __m256i b = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(in + 2 * j + 32)), weights);
        __m256i r = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)(out + j), r);
    }
#endif
    for (; j < n_out; ++j) out[j] = (uint8_t)(in[2 * j] + w * in[2 * j + 1]);
}

static void split_pairs(const uint8_t *in, uint8_t *out, long n_in, int shift) {
    uint8_t mask = (uint8_t)((1 << shift) - 1);
    long j = 0;
#ifdef __AVX2__
    const __m128i m = _mm_set1_epi8((char)mask);
    for (; j + 16 <= n_in; j += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(in + j));
        __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, shift), m);
        _mm_storeu_si128((__m128i *)(out + 2 * j), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(out + 2 * j + 16), _mm_unpackhi_epi8(lo, hi));
    }
#endif
    for (; j < n_in; ++j) {
        out[2 * j] = in[j] & mask;
        out[2 * j + 1] = (uint8_t)(in[j] >> shift) & mask;
    }
}

#define PACK_CHUNK 4096L /* packed bytes per work item (the 2-bit steps stay in L1) */

void pack_bits_u8(const uint8_t *codes, uint8_t *out, long n_out, int bits, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_out * 2 >= PARALLEL_MIN_ELEMENTS)
    for (long start = 0; start < n_out; start += PACK_CHUNK) {
        long len = n_out - start < PACK_CHUNK ? n_out - start : PACK_CHUNK;
        if (bits == 4) {
            combine_pairs(codes + 2 * start, out + start, len, 16);
        } else { /* bits == 2 */
            uint8_t nibbles[2 * PACK_CHUNK];
            combine_pairs(codes + 4 * start, nibbles, 2 * len, 4);
            combine_pairs(nibbles, out + start, len, 16);
        }
    }
}

void unpack_bits_u8(const uint8_t *packed, uint8_t *codes, long n_in, int bits, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_in * 2 >= PARALLEL_MIN_ELEMENTS)
    for (long start = 0; start < n_in; start += PACK_CHUNK) {
        long len = n_in - start < PACK_CHUNK ? n_in - start : PACK_CHUNK;
        if (bits == 4) {
            split_pairs(packed + start, codes + 2 * start, len, 4);
        } else { /* bits == 2 */
            uint8_t nibbles[2 * PACK_CHUNK];
            split_pairs(packed + start, nibbles, len, 4);
            split_pairs(nibbles, codes + 4 * start, 2 * len, 2);
        }
    }
}

/* Dequantize packed 4-bit codes (MXFP4, NVFP4) without unpacking them first. Every code of a
 * block decodes to table[c] · f1 · f2 with the block's two factors, so the block's 16 possible
 * values are computed once, in that order (bit-identical to decoding element by element), and
 * each element is a lookup: two 8-entry permutes picked by the code's high bit.
 * Factors: mode 0 (NVFP4): f1 = e4m3_values[scales[b]], f2 = post (the global scale);
 * mode 1 (MX, E8M0): 2^(s-127) split in two normal halves as mx_dequantize_f32 (0xFF → NaN).
 * packed: n_blocks · block / 2 bytes, element 2i in the low nibble. */
static inline void fp4_block_factors(int mode, uint8_t s, const float *e4m3_values, float post,
                                     float *f1, float *f2) {
    if (mode == 0) {
        *f1 = e4m3_values[s];
        *f2 = post;
        return;
    }
    int e = (int)s - 127;
    int half = e >= 0 ? e / 2 : -((-e + 1) / 2);
    *f1 = s == 0xFF ? NAN : pow2f(half);
    *f2 = pow2f(e - half);
}

void fp4_dequantize_f32(const uint8_t *packed, const uint8_t *scales, const float *table,
                        const float *e4m3_values, float post, int mode, float *out,
                        long n_blocks, long block, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks * block >= PARALLEL_MIN_ELEMENTS)
    for (long b = 0; b < n_blocks; ++b) {
        flush_denormals();
        float f1, f2, lut[16];
        fp4_block_factors(mode, scales[b], e4m3_values, post, &f1, &f2);
        for (int k = 0; k < 16; ++k) lut[k] = table[k] * f1 * f2;
        const uint8_t *p = packed + b * block / 2;
        float *o = out + b * block;
        long i = 0;
#ifdef __AVX2__
        __m256 lo = _mm256_loadu_ps(lut), hi = _mm256_loadu_ps(lut + 8);
        const __m128i nibble = _mm_set1_epi16(0x0F);
        for (; i + 16 <= block; i += 16) {
            /* 8 bytes → 16 codes in element order: each u16 lane holds (low, high) nibble */
            __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i / 2)));
            __m128i codes = _mm_or_si128(_mm_and_si128(w, nibble),
                                         _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
            __m256i c0 = _mm256_cvtepu8_epi32(codes);
            __m256i c1 = _mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8));
            __m256 v0 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, c0),
                                         _mm256_permutevar8x32_ps(hi, c0),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(c0, 28)));
            __m256 v1 = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, c1),
                                         _mm256_permutevar8x32_ps(hi, c1),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(c1, 28)));
            _mm256_storeu_ps(o + i, v0);
            _mm256_storeu_ps(o + i + 8, v1);
        }
#endif
        for (; i < block; i += 2) {
            o[i] = lut[p[i / 2] & 15];
            o[i + 1] = lut[p[i / 2] >> 4];
        }
    }
}
