/* A decode or prefill step's arguments, shared by the fused decode driver
 * (decode_layers_f32.c) and the generated layer programs (compiler/codegen_layer.py);
 * models/fused_decode.py's StepArgs is the ctypes mirror, field for field. */
#pragma once

typedef struct {
    long tokens, hidden, heads, kv_heads, dim, inter, block_size, max_blocks, window;
    float eps, scale;
    const long *positions, *slots, *block_tables, *seq_lens;
    const float *rope_cache;
} step_args;
