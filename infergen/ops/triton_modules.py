"""The modules holding the Triton rows of the op registries. `kernels="triton"` imports them
(engine/build.py) — Triton itself is imported only then (it takes about a second); one line
per module."""

TRITON_MODULES: tuple[str, ...] = (
    "infergen.ops.paged_decode_triton",  # decode attention
    "infergen.ops.paged_prefill_triton",  # prefill attention (varlen, one launch a step)
    "infergen.ops.pointwise_triton",  # add + RMSNorm, SiLU-mul, GELU-mul, RoPE
    "infergen.ops.rope_kv_store_triton",  # RoPE + KV store
    "infergen.ops.sampling_triton",  # the sampler's token choice
    "infergen.ops.linear_triton_rows",  # quantized projections; W8A8 FP8 (torch._scaled_mm)
)
