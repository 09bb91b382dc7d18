"""The modules holding the Triton rows of the op registries. `kernels="triton"` imports them
(engine/build.py) — Triton itself is imported only then (it takes about a second); one line
per module."""

TRITON_MODULES: tuple[str, ...] = (
    "infergen.ops.paged_decode_triton",  # decode attention
    "infergen.ops.pointwise_triton",  # add + RMSNorm, SiLU-mul, GELU-mul, RoPE
    "infergen.ops.rope_kv_store_triton",  # RoPE + KV store
)
