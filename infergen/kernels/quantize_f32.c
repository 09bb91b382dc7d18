/* Block quantization fast path (formats/fast.py), bit-identical to formats/codec.py.
 *
 * Minifloat encode of a = |v| (round to nearest even, saturating; formats/elements.py):
 *   e = max(floor(log2 a), emin); m = rint(a / 2^(e - mbits))  (an integer, RNE)
 *   code = ((e - emin) << mbits) + m, capped at max_code; sign bit on top.
 * This single formula covers subnormals (e = emin, m < 2^mbits) and the carry into the next
 * binade (m = 2^(mbits+1)), because the codes of a sign-magnitude minifloat are its values in
 * increasing order. NaN → nan_code (or 0 where the type has none); ±Inf → ±max.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

typedef struct {
    int mbits, emin, bits, max_code, nan_code; /* nan_code < 0: the type has no NaN */
    float max;
} elem_t;

static inline float pow2f(int e) { /* 2^e for -126 <= e <= 127 (a normal float) */
    uint32_t b = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static inline uint8_t encode(float v, const elem_t *t) {
    /* branch-free (selects only), so that GCC vectorises the loops that call it */
    uint32_t bits;
    memcpy(&bits, &v, 4);
    int sign = (int)(bits >> 31) << (t->bits - 1);
    int is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    float a = fabsf(v);
    a = a < t->max ? a : t->max; /* NaN → max here; replaced below */
    uint32_t abits;
    memcpy(&abits, &a, 4);
    int e = (int)(abits >> 23) - 127; /* floor(log2 a) for normal a; fp32 subnormals and 0 are
                                         far below emin and clamp to it (then round to 0) */
    e = e < t->emin ? t->emin : e;
    float m = rintf(a * pow2f(t->mbits - e));
    int code = ((e - t->emin) << t->mbits) + (int)m;
    code = code > t->max_code ? t->max_code : code;
    int nan = t->nan_code >= 0 ? (sign | t->nan_code) : 0;
    return (uint8_t)(is_nan ? nan : (sign | code));
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
        float amax = 0.0f;
        int bad = 0;
        for (long i = 0; i < block; ++i) {
            float a = fabsf(v[i]);
            bad |= !isfinite(a);
            amax = a > amax ? a : amax;
        }
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
        for (long i = 0; i < block; ++i) c[i] = encode(scale_pow2(v[i], e), &t);
    }
}

/* NVFP4: blocks of 16; scale = e4m3(amax / 6 / global); elements e2m1(v / (scale · global)).
 * e4m3_values: the 256-entry E4M3 decode table (fp32). */
void nvfp4_quantize_f32(const float *x, uint8_t *codes, uint8_t *scales, long n_blocks,
                        float global, const float *e4m3_values, int num_threads) {
    elem_t e4m3 = {3, -6, 8, 0x7E, 0x7F, 448.0f};
    elem_t e2m1 = {1, 0, 4, 0x7, -1, 6.0f};
#pragma omp parallel for num_threads(num_threads) schedule(static) if (n_blocks * 16 >= PARALLEL_MIN_ELEMENTS)
    for (long b = 0; b < n_blocks; ++b) {
        flush_denormals();
        const float *v = x + b * 16;
        uint8_t *c = codes + b * 16;
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < 16; ++i) {
            float a = fabsf(v[i]);
            bad |= !isfinite(a);
            amax = a > amax ? a : amax;
        }
        uint8_t s = bad ? 0x7F : encode(amax / 6.0f / global, &e4m3);
        scales[b] = s;
        float divisor = e4m3_values[s] * global;
        if (bad || e4m3_values[s] == 0.0f) {
            memset(c, 0, 16);
            continue;
        }
        for (int i = 0; i < 16; ++i) c[i] = encode(v[i] / divisor, &e2m1);
    }
}

/* Per-tensor scaled cast (FP8): codes[i] = encode(x[i] / scale). */
void scaled_encode_f32(const float *x, uint8_t *codes, long n, float scale, int mbits, int emin,
                       int bits, int max_code, int nan_code, float max_elem, int num_threads) {
    elem_t t = {mbits, emin, bits, max_code, nan_code, max_elem};
#pragma omp parallel num_threads(num_threads) if (n >= PARALLEL_MIN_ELEMENTS)
    {
        flush_denormals();
#pragma omp for schedule(static)
        for (long i = 0; i < n; ++i) codes[i] = encode(x[i] / scale, &t);
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

/* max |x[i]| over the finite x[i] (0 when none): the per-tensor amax of FP8 and NVFP4. */
void finite_amax_f32(const float *x, long n, float *result, int num_threads) {
    float best = 0.0f;
#pragma omp parallel for num_threads(num_threads) reduction(max : best) if (n >= PARALLEL_MIN_ELEMENTS)
    for (long i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        if (a <= 3.4028234663852886e38f && a > best) best = a; /* NaN and Inf fail the test */
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
        float lo = INFINITY, hi = -INFINITY, amax = 0.0f;
        int nan = 0;
        for (long i = 0; i < group; ++i) {
            float a = v[i];
            nan |= isnan(a);
            lo = a < lo ? a : lo;
            hi = a > hi ? a : hi;
            amax = fabsf(a) > amax ? fabsf(a) : amax;
        }
        float scale;
        if (mode == 0)
            scale = nan ? NAN : amax / (float)qmax;
        else if (mode == 1) {
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
            for (long i = 0; i < group; ++i) {
                float q = rintf(v[i] / div);
                q = q < (float)-qmax ? (float)-qmax : (q > (float)qmax ? (float)qmax : q);
                c[i] = (uint8_t)((int)q) & mask;
            }
        } else if (mode == 1) {
            float z = rintf(-lo / div);
            z = z < 0.0f ? 0.0f : (z > (float)qmax ? (float)qmax : z);
            zeros[g] = (uint8_t)z;
            for (long i = 0; i < group; ++i) {
                float q = rintf(v[i] / div) + z;
                c[i] = (uint8_t)(q < 0.0f ? 0.0f : (q > (float)qmax ? (float)qmax : q));
            }
        } else {
            offsets[g] = lo;
            for (long i = 0; i < group; ++i) {
                float q = rintf((v[i] - lo) / div);
                c[i] = (uint8_t)(q < 0.0f ? 0.0f : (q > (float)qmax ? (float)qmax : q));
            }
        }
    }
}

/* Integer dequantize: symmetric out = signed(code) · scale; with zero points
 * out = (code − zero) · scale (the KIVI form q · scale + min stays in torch: a compiler
 * could fuse it into one FMA and round differently from the reference). */
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
