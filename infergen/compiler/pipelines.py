"""The named pass lists (`run_pipeline(graph, name)`):

- "fuse":  the specific fusions (residual add + norm, norm + quantize, GEMM + SiLU-mul,
           RoPE + KV store), then dead values: coarse ops kept, for the hand-written kernels;
- "jit":   input quantizers into their GEMMs, the specific fusions, lowering to primitives
           (inside fused groups too), generic pointwise / row-reduction fusion, dead values:
           what the code generators render.
"""

from __future__ import annotations

from infergen.compiler import fusion, lower  # noqa: F401  (register their passes)
from infergen.compiler.passes import PIPELINES

PIPELINES.register("fuse", ("fuse_epilogues", "dead_values"))
PIPELINES.register(
    "jit", ("fuse_input_quantizers", "fuse_epilogues", "lower", "fuse_pointwise", "dead_values")
)
