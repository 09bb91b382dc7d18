"""Timing the engine's layers op by op, part by part (perf/eager.py says what for): a tiny
random model of each family (io/random_checkpoint.py), every step op by op, each part's
forward wrapped by a timer in its place. `infergen perf calibrate` calls
`measure_eager_layers` and stores its table in the cpu-local row (Hardware.eager_layer_s)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.engine.sampling_params import SamplingParams
from infergen.io.random_checkpoint import random_checkpoint
from infergen.perf.eager import mixer_part

# tiny models (io/tiny_configs.json) whose layers hold every part kind; a part is timed in
# the first family that has it (Llama's attention, Gemma-3's attention with q/k norms, Qwen3-
# Next's gated one: perf/eager.mixer_part; the dense feed-forward Llama's)
FAMILIES = ("llama_gqa", "gemma3", "falcon_h1", "mamba2", "qwen3_next", "deepseek_v2")
PHASES = ("decode", "prefill")


def measure_eager_layers(
    repeats: int = 5, families: tuple[str, ...] = FAMILIES
) -> dict[str, tuple[float, float]]:
    """{part: (decode seconds, prefill seconds)}: the median time of each layer part of the
    tiny `families`, run op by op, in decode steps of two sequences and in 2-token prefills
    (`repeats` requests of each)."""
    table: dict[str, tuple[float, float]] = {}
    for family in families:
        seen = _time_parts(family, repeats)
        for part in sorted({part for part, _ in seen} - table.keys()):
            if all((part, phase) in seen for phase in PHASES):
                table[part] = tuple(statistics.median(seen[part, phase]) for phase in PHASES)
    return dict(sorted(table.items()))


def _time_parts(family: str, repeats: int) -> dict[tuple[str, str], list[float]]:
    """{(part, phase): seconds of each call} of one tiny model of `family`."""
    checkpoint = random_checkpoint(family)
    desc = checkpoint.config.describe()
    engine = Engine(engine_config(block_size=16, num_kv_blocks=64), checkpoint)
    model = engine.runner.model
    model.fast_path = None  # every step op by op
    phase: list[str | None] = [None]
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)

    def timed(forward, part: str):
        def run(*args, **kwargs):
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            if phase[0] is not None:
                seen[part, phase[0]].append(time.perf_counter() - start)
            return out

        return run

    for layer, spec in zip(model.layers, desc.layers, strict=True):
        parts = [(layer.attn, mixer_part(spec.mixer)), (layer.mlp, spec.ffn and spec.ffn.kind)]
        norms = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm")
        parts += [(getattr(layer, name), "norm") for name in norms]
        for module, part in parts:
            if module is not None:
                module.forward = timed(module.forward, part)
    step_forward = model.forward

    def forward(batch, kv_cache):
        decode = len(batch.logits_indices) == batch.num_tokens
        phase[0] = "decode" if decode and batch.num_tokens > 1 else None
        if not decode and batch.num_tokens == 2:
            phase[0] = "prefill"
        try:
            return step_forward(batch, kv_cache)
        finally:
            phase[0] = None

    model.forward = forward
    vocab = checkpoint.config.vocab_size
    greedy = SamplingParams(max_tokens=repeats + 1, temperature=0.0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for i in range(2):  # decode steps of two sequences of 24-token prompts
        engine.add_request([(7 * i + j) % vocab for j in range(24)], greedy)
    for i in range(repeats):  # 2-token prompts, one per step
        _drain(engine)
        engine.add_request([(11 * i + 3) % vocab, (13 * i + 5) % vocab], one)
    _drain(engine)
    return seen


def _drain(engine) -> None:
    while engine.has_unfinished():
        engine.step()
