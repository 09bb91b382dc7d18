/* AMX (Intel Advanced Matrix Extensions) tiles for the 24-column panels (gemm_bf16.c,
 * gemm_w8a8_i8.c): eight tile registers of up to 16 rows x 64 bytes, one dot-product
 * instruction a 16 x 16 x (64 bytes of k) block — TDPBF16PS (bf16 pairs, fp32 sums) and TDPBUSD
 * (u8 x s8 quads, int32 sums) — where AVX-512 does 16 lanes.
 *
 * A panel's row i is 24 lanes of 4 bytes (a column's bf16 pair or int8 quad at k-step i): the B
 * operand's row layout, so a panel is read in place as two B tiles, its 16-lane part (64 bytes a
 * row) and its 8-lane part (32 bytes), at a row stride of 96 bytes. 32 tokens x 24 columns a
 * block: four C tiles (tokens 0-15 / 16-31 x columns 0-15 / 16-23), two A tiles (the two token
 * halves' 64 bytes of k), the two B tiles — all eight registers, each B load feeding two
 * products and each A load two. K is consumed 16 lanes (64 bytes) a step. The tokens are laid
 * out tile by tile (amx_tiled_offset: for each 16 tokens, for each step, 16 rows of 64 bytes,
 * 1 KB together — a tile load reads one contiguous KB instead of 16 lines a row apart: 512-token
 * products ran ~1.2x faster so), padded with zeros to whole tiles; a panel's last partial step is
 * copied into a zero-padded block (the panel's own rows end there).
 *
 * Linux grants the tile data state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA): amx_ready asks once; a kernel that is refused runs its AVX-512 path. The
 * tile configuration is per thread: each worker loads it before its tiles and releases them
 * after (the idle tile state costs a context switch nothing).
 */
#pragma once
#if defined(__AMX_TILE__)
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16          /* tokens an A tile, k-steps a B tile */
#define AMX_BLOCK_TOKENS 32  /* tokens a block: two A tiles */
#define AMX_K_BYTES 64       /* bytes of k an A row holds */
#define AMX_LANES 24         /* a panel's columns (NR) */
#define AMX_PANEL_STRIDE 96  /* bytes a panel row */

/* tile registers of a block (literal numbers: the intrinsics paste them into the assembly, so
 * they go through one more macro level, AMX_*(), to be expanded first) */
#define AMX_C00 0
#define AMX_C01 1
#define AMX_C10 2
#define AMX_C11 3
#define AMX_A0 4
#define AMX_A1 5
#define AMX_B0 6
#define AMX_B1 7
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define AMX_STORE(t, p, stride) _tile_stored(t, p, stride)
#define AMX_DOT(DOT, c, a, b) DOT(c, a, b)

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* whether this process may use the tiles (asked of the kernel once) */
static inline int amx_ready(void) {
    static int state; /* 0 not asked, 1 granted, -1 refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0
                ? 1
                : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* where byte `byte` of token m's row is in the tiled layout of `steps` 64-byte k-steps a row */
static inline long amx_tiled_offset(long m, long byte, long steps) {
    return ((m / AMX_ROWS * steps + byte / AMX_K_BYTES) * AMX_ROWS + m % AMX_ROWS) * AMX_K_BYTES +
           byte % AMX_K_BYTES;
}

/* panels a thread runs every token block across at a time: ~AMX_GROUP_KB of them (kept in L2;
 * 512 KB measured against one panel at a time and all of a thread's, 2026-12-07) */
#ifndef AMX_GROUP_KB
#define AMX_GROUP_KB 512
#endif
static inline long amx_group(long panel_bytes) {
    return 1 + ((long)AMX_GROUP_KB << 10) / panel_bytes;
}

/* this thread's tiles shaped for a block (16 rows each; 64 bytes, the 8-lane ones 32) */
static inline void amx_configure(void) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = AMX_C00; t <= AMX_B1; ++t) {
        c.rows[t] = AMX_ROWS;
        c.colsb[t] = (t == AMX_C01 || t == AMX_C11 || t == AMX_B1) ? 32 : AMX_K_BYTES;
    }
    _tile_loadconfig(&c);
}

/* The panel's k-steps [16 s, 16 s + 16) as B rows: in place, or (the last, partial one) copied
 * into `pad` (16 rows of 24 lanes) with zeros past the panel's `steps` rows. */
static inline const uint32_t *amx_panel_rows(const uint32_t *wp, long steps, long s,
                                             uint32_t *pad) {
    long first = s * AMX_ROWS, rows = steps - first;
    if (rows >= AMX_ROWS) return wp + first * AMX_LANES;
    memset(pad, 0, sizeof(uint32_t) * AMX_ROWS * AMX_LANES);
    memcpy(pad, wp + first * AMX_LANES, sizeof(uint32_t) * (size_t)(rows * AMX_LANES));
    return pad;
}

/* One block: C (32 tokens x 24 columns, 4-byte sums, row stride ldc) = the tokens' tiles from
 * A (tiled, `ksteps` k-steps a row of tiles: A points at the block's first 16 tokens) times the
 * panel wp (`steps` rows of 24 lanes); `two`: tokens 16-31 too (else only 0-15 are computed and
 * stored). DOT is the tile product (_tile_dpbf16ps or _tile_dpbusd). */
#define AMX_PANEL_BLOCK(DOT, A, ksteps, wp, steps, two, C, ldc, pad)                               \
    do {                                                                                           \
        AMX_ZERO(AMX_C00);                                                                         \
        AMX_ZERO(AMX_C01);                                                                         \
        AMX_ZERO(AMX_C10);                                                                         \
        AMX_ZERO(AMX_C11);                                                                         \
        const long amx_n = ((steps) + AMX_ROWS - 1) / AMX_ROWS;                                    \
        for (long amx_s = 0; amx_s < amx_n; ++amx_s) {                                             \
            const uint32_t *amx_b = amx_panel_rows((wp), (steps), amx_s, (pad));                   \
            const char *amx_a = (const char *)(A) + amx_s * AMX_ROWS * AMX_K_BYTES;                \
            AMX_LOAD(AMX_B0, amx_b, AMX_PANEL_STRIDE);                                             \
            AMX_LOAD(AMX_B1, amx_b + 16, AMX_PANEL_STRIDE);                                        \
            AMX_LOAD(AMX_A0, amx_a, AMX_K_BYTES);                                                  \
            AMX_DOT(DOT, AMX_C00, AMX_A0, AMX_B0);                                                 \
            AMX_DOT(DOT, AMX_C01, AMX_A0, AMX_B1);                                                 \
            if (two) {                                                                             \
                AMX_LOAD(AMX_A1, amx_a + (ksteps) * AMX_ROWS * AMX_K_BYTES, AMX_K_BYTES);          \
                AMX_DOT(DOT, AMX_C10, AMX_A1, AMX_B0);                                             \
                AMX_DOT(DOT, AMX_C11, AMX_A1, AMX_B1);                                             \
            }                                                                                      \
        }                                                                                          \
        AMX_STORE(AMX_C00, (C), 4 * (ldc));                                                        \
        AMX_STORE(AMX_C01, (C) + 16, 4 * (ldc));                                                   \
        if (two) {                                                                                 \
            AMX_STORE(AMX_C10, (C) + AMX_ROWS * (ldc), 4 * (ldc));                                 \
            AMX_STORE(AMX_C11, (C) + AMX_ROWS * (ldc) + 16, 4 * (ldc));                            \
        }                                                                                          \
    } while (0)
#endif
