"""validate_perf_model.py's "architectures" part: one step of every architecture of
bench_architectures (benchmarks/arch_rows.py: random weights, hidden 512, 8 layers, ~55M
parameters), measured in process and predicted by the step model.

Two steps per architecture: a decode of two sequences (contexts ~100; the median forward of
20 such steps) and a 2-token prefill (the best of 6): the steps whose host cost the step model
prices by layer part (perf/eager.py) wherever the fused decode does not run them, with little
arithmetic beside it. A row that does not build here is skipped with the reason.
"""

from __future__ import annotations

import gc
import pathlib
import random
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests", ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from arch_rows import ARCHS, SIZE, build  # noqa: E402

from infergen.perf import roofline  # noqa: E402
from infergen.perf.step_cost import Chunk, Formats  # noqa: E402

FP32 = Formats(weight_bits=32, kv_bits=32, act_bytes=4)
PROMPT, DECODES = 100, 10  # per sequence, two sequences a decode step
CHUNKS = {"decode_ms_b2": [Chunk(1, PROMPT + 5)] * 2, "prefill_ms_2": [Chunk(2, 2)]}


def measure_architectures(threads: int) -> dict[str, dict]:
    """{arch: {metric: measured ms, "_desc": its ModelDesc}}."""
    from infergen import LLM
    from infergen.io.model_config import read_model_config

    measured: dict[str, dict] = {}
    for arch in ARCHS:
        with tempfile.TemporaryDirectory() as tmp:
            directory = pathlib.Path(tmp) / arch.name
            directory.mkdir()
            try:
                build(arch, SIZE, directory)
                llm = LLM(model=str(directory), num_threads=threads)
            except Exception as error:  # noqa: BLE001 - reported, the other rows go on
                print(f"{arch.name}: skipped ({type(error).__name__}: {error})", flush=True)
                continue
            ms = _steps(llm)
            measured[arch.name] = {**ms, "_desc": read_model_config(directory).describe()}
            print(f"{arch.name}: {ms['decode_ms_b2']:.1f} ms a decode of two, "
                  f"{ms['prefill_ms_2']:.1f} ms a 2-token prefill", flush=True)  # fmt: skip
            del llm
            gc.collect()
    return measured


def _steps(llm) -> dict[str, float]:
    """The median forward of its decode steps of two sequences, the best 2-token prefill."""
    from infergen import SamplingParams
    from infergen.models.transformer import Transformer

    seconds: dict[str, list[float]] = {"decode": [], "prefill": []}
    forward = Transformer.forward

    def timed(self, batch, kv_cache):
        start = time.perf_counter()
        out = forward(self, batch, kv_cache)
        if batch.num_tokens == 2:
            decode = len(batch.logits_indices) == 2
            seconds["decode" if decode else "prefill"].append(time.perf_counter() - start)
        return out

    rng = random.Random(0)
    vocab = llm.config.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(PROMPT)] for _ in range(4)]
    Transformer.forward = timed
    try:
        params = SamplingParams(max_tokens=DECODES + 1, temperature=0.0, ignore_eos=True)
        llm.generate(prompts[:2], params)
        llm.generate(prompts[2:], params)
        for _ in range(6):
            pair = [rng.randrange(100, vocab) for _ in range(2)]
            llm.generate([pair], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        Transformer.forward = forward
    return {
        "decode_ms_b2": statistics.median(seconds["decode"]) * 1e3,
        "prefill_ms_2": min(seconds["prefill"]) * 1e3,
    }


def predict_architectures(hw, measured: dict[str, dict]) -> list[tuple]:
    """(metric, predicted ms, measured ms, target) per architecture and step."""
    rows = []
    for arch, values in measured.items():
        for metric, chunks in CHUNKS.items():
            times = roofline.predict_step(values["_desc"], hw, chunks, FP32, "fp32")
            rows.append((f"{arch}_{metric}", roofline.step_seconds(times) * 1e3,
                         values[metric], None))  # fmt: skip
    return rows
