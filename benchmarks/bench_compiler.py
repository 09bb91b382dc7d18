"""The inference compiler (compile="jit") against eager PyTorch and torch.compile, same run.

On the default model (SmolLM2-135M, fp32) at three step shapes — decode T=1 (one sequence
with 128 tokens of context), decode T=16 (16 such sequences), prefill T=512 (one chunk) —
times, interleaved (best of --repeats):

- eager       the engine's per-op path with torch kernels (kernels="torch"): eager PyTorch;
- compile     that same model's forward under torch.compile (Inductor, dynamic shapes);
- jit         infergen compile="jit": the captured layer graph, fused groups as generated C;
- infergen    compile="off" with the native kernels (the hand-written fused decode step):
              what the engine runs by default, for reference;

each for the whole step (all 30 layers + head) and for one decoder layer. Then the costs of
compiling: torch.compile's first-call time per shape, infergen's cold compile (empty JIT
cache) and warm-cache start, and process start to first token for eager, jit (warm) and
torch.compile. Where the jit step's time goes: the layer programs' C timers per call site.

Targets (issue 7): decode step ≤ 0.8× eager and ≤ 1.0× torch.compile; cold compile ≤ 0.2×
torch.compile's; warm start ≤ 1 s over eager start.

    .venv/bin/python benchmarks/bench_compiler.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM  # noqa: E402
from infergen.compiler.jit_cache import JitCache  # noqa: E402
from infergen.compiler.runtime import CompiledLayers  # noqa: E402
from infergen.engine.request import Sequence  # noqa: E402
from infergen.engine.sampling_params import SamplingParams  # noqa: E402
from infergen.engine.scheduler import ScheduledBatch  # noqa: E402
from infergen.timing import best_seconds_each  # noqa: E402

SHAPES = {"decode_t1": (1, 128, 1), "decode_t16": (16, 128, 1), "prefill_t512": (1, 0, 512)}
CONTEXT_TOKENS = 2048  # KV cache sized for the shapes above
COLD_ROUNDS = 3  # cold compiles timed (each from an empty JIT cache; the median reported)


def make_batch(llm: LLM, sequences: int, context: int, new: int):
    """A ForwardBatch of `sequences` sequences, each with `context` cached tokens (computed
    now, untimed) and `new` tokens in this step. Reusable: a call rewrites the same slots."""
    engine, model = llm.engine, llm.engine.runner.model
    seqs = []
    for i in range(sequences):
        ids = [100 + (7 * i + j) % 40000 for j in range(context + new)]
        seq = Sequence(f"b{i}", None, ids, SamplingParams(), None, None, None, -1)
        if context:
            assert engine.scheduler.grow(seq, context)
            batch, _ = engine.runner.prepare(ScheduledBatch([seq], [context]))
            batch.logits_indices = torch.arange(1)
            model(batch, engine.kv_cache)
            seq.num_computed_tokens = context
        assert engine.scheduler.grow(seq, new)
        seqs.append(seq)
    batch, _ = engine.runner.prepare(ScheduledBatch(seqs, [new] * sequences))
    batch.logits_indices = torch.arange(sequences)  # one sampled row per sequence
    return batch


def step_fn(llm: LLM, batch, forward=None):
    model, cache = llm.engine.runner.model, llm.engine.kv_cache
    forward = forward or model
    return lambda: forward(batch, cache)


def program_sites(llm: LLM, batch, steps: int = 3) -> dict[str, float]:
    """Seconds per call site of the jit layer programs (their C timers, all layers) over
    `steps` steps of `batch`: where the jit step's time goes inside its one native call."""
    path = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    programs = [p for p in (path.program, path.prefill_program) if p is not None]
    with contextlib.ExitStack() as stack:
        found = [stack.enter_context(program.timed()) for program in programs]
        for _ in range(steps):
            step_fn(llm, batch)()
    sites: dict[str, float] = {}
    for seconds in found:
        for site, value in seconds.items():
            sites[site] = sites.get(site, 0.0) + value
    return {site: value for site, value in sites.items() if value > 0}


def layer_fn(llm: LLM, batch, mode: str, compiled_layer=None):
    """One decoder layer (layer 0) on the step's tokens."""
    model, cache = llm.engine.runner.model, llm.engine.kv_cache
    if batch.rope is None:
        model(batch, cache)  # sets batch.rope
    tokens = batch.input_ids.shape[0]
    h0 = torch.randn(tokens, model.config.hidden_size)
    delta = torch.randn_like(h0)
    kv = cache.layer(0)
    if mode == "jit":
        compiled = model.fast_path_for(cache)
        return lambda: compiled.run_layer(0, h0.clone(), delta, batch)
    layer = compiled_layer if compiled_layer is not None else model.layers[0]
    return lambda: layer(h0.clone(), delta, batch, kv)


def start_to_first_token(mode: str, cache_home: str | None) -> float:
    """Seconds from process start to the first generated token (a fresh interpreter)."""
    code = {
        "eager": "LLM(kernels='torch', kv_cache_memory='64MiB')",
        "infergen": "LLM(kv_cache_memory='64MiB')",
        "jit": "LLM(kv_cache_memory='64MiB', compile='jit')",
        "compile": "LLM(kernels='torch', kv_cache_memory='64MiB')",
    }[mode]
    # (the fast path's runner built first: traced by dynamo, its construction hit a guard
    # failure in torch 2.13 — "Guard failed on the same frame it was created")
    wrap = (
        "m = llm.engine.runner.model; m.fast_path_for(llm.engine.kv_cache)\n"
        "m.forward = torch.compile(m.forward, dynamic=True)\n"
        if mode == "compile"
        else ""
    )
    script = (
        "import time, torch; t0 = time.perf_counter()\n"
        f"from infergen import LLM, SamplingParams\nllm = {code}\n{wrap}"
        "llm.generate('The capital of France is', SamplingParams(max_tokens=1, temperature=0))\n"
        "print(time.perf_counter() - t0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cache_home:
        env["XDG_CACHE_HOME"] = cache_home
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{mode}: {out.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-startup", action="store_true", help="no process-start timings")
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/compiler.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    memory = f"{CONTEXT_TOKENS * 46080 * 2 // 2**20 + 16}MiB"
    print("loading four engines (eager torch, torch.compile, jit, infergen default)", flush=True)
    engines = {
        "eager": LLM(kernels="torch", kv_cache_memory=memory),
        "compile": LLM(kernels="torch", kv_cache_memory=memory),
        "jit": LLM(kv_cache_memory=memory),
        "infergen": LLM(kv_cache_memory=memory),
    }
    # infergen's compile cost: cold (an empty JIT cache), then warm (the entries just built)
    jit_model, jit_cache = engines["jit"].engine.runner.model, engines["jit"].engine.kv_cache
    # (the median of COLD_ROUNDS, each from an empty cache: the compiles run side by side,
    # and this host's speed drifts)
    colds = []
    for _ in range(COLD_ROUNDS):
        with tempfile.TemporaryDirectory() as tmp:
            cold = CompiledLayers(jit_model, jit_cache, "jit", JitCache(pathlib.Path(tmp)))
            warm = CompiledLayers(jit_model, jit_cache, "jit", JitCache(pathlib.Path(tmp)))
        colds.append(cold.report.total_seconds)
    cold_seconds = statistics.median(colds)
    jit_model.fast_path = "jit"  # the compiled layers (FAST_PATHS row), built from the user
    jit_model.fast_path_for(jit_cache)  # JIT cache as the engine option would
    compile_costs = {
        "jit_cold_compile_s": cold_seconds,
        "jit_cold_compile_rounds_s": colds,
        "jit_warm_start_s": warm.report.total_seconds,
        "jit_kernels": cold.report.kernels_built,
    }
    print(
        f"jit: cold {cold_seconds:.2f} s (median of {colds}; {cold.report.kernels_built} "
        f"kernels, {cold.report.compile_seconds:.2f} s of compiler time side by side), "
        f"warm {warm.report.total_seconds:.2f} s",
        flush=True,
    )
    compiled_model = engines["compile"].engine.runner.model
    compiled_forward = torch.compile(compiled_model.forward, dynamic=True)
    compiled_layer = torch.compile(compiled_model.layers[0], dynamic=True)
    results: dict[str, dict[str, float]] = {}
    profiles: dict[str, dict[str, float]] = {}
    for shape, (sequences, context, new) in SHAPES.items():
        batches = {name: make_batch(llm, sequences, context, new) for name, llm in engines.items()}
        started = time.perf_counter()
        step_fn(engines["compile"], batches["compile"], compiled_forward)()
        compile_costs[f"torch_compile_first_call_s_{shape}"] = time.perf_counter() - started
        started = time.perf_counter()
        layer_fn(engines["compile"], batches["compile"], "compile", compiled_layer)()
        compile_costs[f"torch_compile_layer_first_call_s_{shape}"] = time.perf_counter() - started
        print(
            f"[{shape}] torch.compile first call "
            f"{compile_costs[f'torch_compile_first_call_s_{shape}']:.1f} s",
            flush=True,
        )
        fns = {
            ("step", "eager"): step_fn(engines["eager"], batches["eager"]),
            ("step", "compile"): step_fn(engines["compile"], batches["compile"], compiled_forward),
            ("step", "jit"): step_fn(engines["jit"], batches["jit"]),
            ("step", "infergen"): step_fn(engines["infergen"], batches["infergen"]),
            ("layer", "eager"): layer_fn(engines["eager"], batches["eager"], "eager"),
            ("layer", "compile"): layer_fn(
                engines["compile"], batches["compile"], "compile", compiled_layer
            ),
            ("layer", "jit"): layer_fn(engines["jit"], batches["jit"], "jit"),
        }
        best = best_seconds_each(fns, args.repeats)
        results[shape] = {f"{part}_{engine}": seconds for (part, engine), seconds in best.items()}
        profiles[shape] = program_sites(engines["jit"], batches["jit"])
        row = "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in results[shape].items())
        print(f"[{shape}] {row}", flush=True)
    startup = {}
    if not args.skip_startup:
        with tempfile.TemporaryDirectory() as home:  # the shipped kernels, no JIT entries
            kernels = (
                pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
                / "infergen"
                / "kernels"
            )
            if kernels.is_dir():
                shutil.copytree(kernels, pathlib.Path(home) / "infergen" / "kernels")
            start_to_first_token("jit", home)  # fills this home's JIT cache
            for mode in ("eager", "infergen", "jit", "compile"):
                startup[mode] = start_to_first_token(mode, home)
                print(f"start to first token, {mode}: {startup[mode]:.1f} s", flush=True)
    write_lines(args.out, lines(args, results, compile_costs, startup, profiles))


def lines(args, results, costs, startup, profiles) -> list[dict]:
    base = {
        "bench": "compiler",
        "quick": False,
        "model": "SmolLM2-135M-Instruct (fp32)",
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": {"torch": torch.__version__},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    out = []
    for shape, values in results.items():
        for key, seconds in values.items():
            out.append(
                {
                    **base,
                    "kind": "result",
                    "metric": f"{key.split('_')[0]}_ms_{shape}",
                    "engine": key.split("_", 1)[1],
                    "value": seconds * 1e3,
                    "unit": "ms",
                    "stat": f"best of {args.repeats}",
                }
            )
        for part in ("step", "layer"):
            jit = values[f"{part}_jit"]
            for peer, name in (("eager", "eager torch"), ("compile", "torch.compile")):
                out.append(
                    {
                        **base,
                        "kind": "ratio",
                        "metric": f"{part}_ms_{shape} jit",
                        "engine": "infergen",
                        "peer": name,
                        "infergen_value": jit * 1e3,
                        "peer_value": values[f"{part}_{peer}"] * 1e3,
                        "value": values[f"{part}_{peer}"] / jit,
                        "unit": "x",
                        "definition": "peer/infergen (ms)",
                    }
                )
        total = sum(profiles[shape].values()) or 1.0
        out.append(
            {
                **base,
                "kind": "profile",
                "metric": f"jit_step_{shape}",
                "shares": {
                    k: v / total for k, v in sorted(profiles[shape].items(), key=lambda kv: -kv[1])
                },
            }
        )
        for peer, limit, name in (("eager", 0.8, "eager"), ("compile", 1.0, "torch.compile")):
            if shape.startswith("decode"):
                ratio = values["step_jit"] / values[f"step_{peer}"]
                out.append(
                    {
                        **base,
                        "kind": "target",
                        "engine": "infergen",
                        "metric": f"{shape} step <= {limit}x {name}",
                        "threshold": limit,
                        "value": ratio,
                        "met": ratio <= limit,
                    }
                )
    torch_compile = costs["torch_compile_first_call_s_decode_t1"]
    out.append(
        {
            **base,
            "kind": "result",
            "metric": "compile_costs",
            "engine": "infergen",
            "value": costs,
            "unit": "s",
        }
    )
    ratio = costs["jit_cold_compile_s"] / torch_compile
    out.append(
        {
            **base,
            "kind": "target",
            "engine": "infergen",
            "threshold": 0.2,
            "metric": "cold compile <= 0.2x torch.compile's (decode T=1)",
            "value": ratio,
            "met": ratio <= 0.2,
        }
    )
    if startup:
        out.append(
            {
                **base,
                "kind": "result",
                "metric": "start_to_first_token_s",
                "engine": "infergen",
                "value": startup,
                "unit": "s",
            }
        )
        over = startup["jit"] - startup["eager"]
        out.append(
            {
                **base,
                "kind": "target",
                "engine": "infergen",
                "threshold": 1.0,
                "metric": "warm start <= 1 s over eager start (s over)",
                "value": over,
                "met": over <= 1.0,
            }
        )
    return out


if __name__ == "__main__":
    main()
