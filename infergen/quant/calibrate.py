"""Calibration statistics: what every projection sees at its input over calibration text.

The engine runs the model teacher-forced over CALIBRATION_SEQUENCES sequences of
SEQUENCE_TOKENS tokens from the start of the shipped corpus (kvcache/calibrate.py's
`calibration_tokens`; evaluation text comes from its end), on a scratch KV cache, with a hook
on each projection recording, per input channel, the largest |x|, the mean |x| and the mean x²,
and a strided sample of SAMPLE_ROWS whole input rows (for the searches: clipping in
quant/clipping.py, smoothing scales in quant/smoothing.py). A progress bar shows the sequences.

`save_statistics` writes them (and the scales calibration chose) to one safetensors file, its
metadata saying what was run: `infergen quantize --calib-stats PATH`, `LLM(...,
calibration_stats=PATH)`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from infergen.kvcache.calibrate import calibration_tokens
from infergen.layers.linear import Linear

CALIBRATION_SEQUENCES = 8
SEQUENCE_TOKENS = 128
SAMPLE_ROWS = 256


@dataclass
class InputStats:
    """Statistics of one projection's input x [tokens, in] over the calibration text."""

    amax: torch.Tensor  # [in] largest |x| of each channel
    abs_sum: torch.Tensor  # [in] Σ|x| (float64)
    sq_sum: torch.Tensor  # [in] Σx² (float64)
    tokens: int = 0
    stride: int = 1  # every stride-th row goes into the sample
    samples: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def empty(cls, in_features: int, stride: int) -> InputStats:
        zeros = torch.zeros(in_features, dtype=torch.float64)
        return cls(torch.zeros(in_features), zeros, zeros.clone(), stride=stride)

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        self.amax = torch.maximum(self.amax, x.abs().amax(dim=0))
        self.abs_sum += x.abs().sum(dim=0, dtype=torch.float64)
        self.sq_sum += x.double().square().sum(dim=0)
        first = (-self.tokens) % self.stride  # the first row of x at a multiple of stride
        self.samples.append(x[first :: self.stride].clone())
        self.tokens += x.shape[0]

    @property
    def mean_abs(self) -> torch.Tensor:  # [in] fp32
        return (self.abs_sum / max(self.tokens, 1)).float()

    @property
    def sq_mean(self) -> torch.Tensor:  # [in] fp32, E[x²]: the diagonal of XᵀX / tokens
        return (self.sq_sum / max(self.tokens, 1)).float()

    @property
    def rows(self) -> torch.Tensor:  # [≤ SAMPLE_ROWS, in]
        return torch.cat(self.samples)


def calibration_sequences(
    tokenizer,
    vocab_size: int,
    max_len: int,
    sequences: int = CALIBRATION_SEQUENCES,
    text: str | None = None,
) -> list[list[int]]:
    """`sequences` consecutive runs of SEQUENCE_TOKENS tokens (fewer when the context is short)
    from the start of `text` (a file; default: the shipped corpus)."""
    length = min(SEQUENCE_TOKENS, max_len - 1)
    tokens = calibration_tokens(tokenizer, vocab_size, length * sequences, text)
    return [tokens[i * length : (i + 1) * length] for i in range(sequences)]


def collect_statistics(
    run: Callable[[list[int]], object],
    model: nn.Module,
    sequences: list[list[int]],
    progress: bool = True,
) -> dict[str, InputStats]:
    """Run `sequences` through `model` (`run(tokens)`: one teacher-forced pass, e.g.
    engine/scoring.py's scratch_runner) and return each projection's InputStats by module
    name."""
    from tqdm import tqdm

    total = sum(len(s) for s in sequences)
    stride = max(1, -(-total // SAMPLE_ROWS))
    stats: dict[str, InputStats] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            stats[name] = InputStats.empty(module.in_features, stride)
            hooks.append(module.register_forward_pre_hook(_recorder(stats[name])))
    try:
        bar = tqdm(sequences, desc="calibrating", unit="seq", file=sys.stderr, disable=not progress)
        for seq in bar:
            run(seq)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def _recorder(stats: InputStats):
    def hook(module, args):
        stats.update(args[0])

    return hook


def save_statistics(
    path: str | Path,
    stats: dict[str, InputStats],
    chosen: dict[str, torch.Tensor],
    metadata: dict[str, object],
) -> Path:
    """One safetensors file: `<projection>.amax | .mean_abs | .sq_mean` for every projection,
    the scales calibration chose (`chosen`, e.g. `<projection>.input_scale`), and `metadata`
    (what was run) as JSON strings."""
    from safetensors.torch import save_file

    tensors = {}
    for name, s in stats.items():
        tensors[f"{name}.amax"] = s.amax.contiguous()
        tensors[f"{name}.mean_abs"] = s.mean_abs.contiguous()
        tensors[f"{name}.sq_mean"] = s.sq_mean.contiguous()
    tensors.update({k: v.float().contiguous() for k, v in chosen.items()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = next(iter(stats.values())).tokens if stats else 0
    meta = {"tokens": str(tokens), **{k: json.dumps(v) for k, v in metadata.items()}}
    save_file(tensors, str(path), metadata=meta)
    return path
