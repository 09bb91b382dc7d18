"""Every architecture at one comparable size: infergen's decode against transformers `generate`
on the same weights, in the same run, and the KV / state memory each keeps.

Each row of arch_rows.ARCHS is a variant of tests/hf_models.py built with random weights at one
comparable size (arch_rows.SIZE: hidden 512, 8 layers, vocab 32000, ~55M parameters; MoE rows
keep the dense MLP's active width; --quick: QUICK, tiny) and saved as safetensors; infergen and
transformers both load that directory. Every JSON line names the parameters (total / active).

Per architecture, in --rounds interleaved rounds (infergen, then transformers; each metric
keeps its best run of all rounds, this machine drifts by tens of percent over minutes):
  decode_tok_s_bs1   prompt 64 -> 64 new tokens, greedy, EOS ignored: (new - 1) / (time
                     after the first token); best of 2 distinct prompts per round.
  decode_tok_s_bs16  16 distinct prompts of 64 at once -> 64 new each: tokens emitted after
                     every sequence has its first token / that time (transformers: one
                     `generate` on the batch of 16 equal-length prompts, no padding).
transformers runs in this process (torch.set_num_threads(--threads), set_flush_denormal(True),
its default attention, fp32), each model freed before the next loads. Memory per architecture:
KV bytes per token from the engine's cache (windowed groups: while the window still grows; MLA:
the latent) beside the same model's bytes if every layer cached full multi-head K and V, and
the recurrent state per sequence where the engine keeps one. For windowed architectures, one
sequence (prompt 40) runs step by step to 4 windows of context, recording the blocks each cache
group holds and the KV bytes held (the curve: JSON and --plot PNG).
Targets (the issue): infergen decode >= 2x transformers at batch 1 and 16, every architecture;
windowed groups' blocks flat once the context passes window + chunk. Rows whose variant does
not exist yet or does not build / load are skipped with the reason. Each timed run records
other_cpu_cores (CPU used by other processes meanwhile, e.g. a test run).

    .venv/bin/python benchmarks/bench_architectures.py [--rounds 2] [--quick] [--only a,b]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import pathlib
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks", ROOT / "benchmarks" / "peers", ROOT / "tests"):
    sys.path.insert(0, str(_p))

from arch_rows import ARCHS, QUICK, SIZE, Size, build  # noqa: E402
from arch_window_curve import kv_page_bytes, other_pytest, plot_curves, window_curve  # noqa: E402
from bench_generate import decode_phase, git_state, machine_info  # noqa: E402
from protocol import CONTENDED, measure  # noqa: E402
from results_file import write_lines  # noqa: E402

TARGET = 2.0  # infergen decode tok/s over transformers', every architecture and batch


def prompts(size: Size, count: int, seed: int) -> list[list[int]]:
    """`count` distinct random token-id prompts of size.prompt tokens."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, size.vocab, (size.prompt,), generator=g).tolist() for _ in range(count)
    ]


# ---- the two engines ------------------------------------------------------------------------
class Infergen:
    def __init__(self, directory: pathlib.Path, size: Size, threads: int):
        from infergen import LLM, SamplingParams

        self.params = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        self.llm = LLM(
            str(directory),
            kv_cache_memory="256MiB",
            max_num_seqs=size.batch,
            max_num_batched_tokens=512,
            block_size=size.block_size,
            enable_prefix_caching=False,
            num_threads=threads,
        )

    def decode(self, batch: list[list[int]], new: int) -> dict:
        """All prompts at once; decode phase: after every sequence has its first token."""
        run = decode_phase(self.llm.engine, batch, self.params(new))
        return {"tok_s": run["decode_phase_tokens"] / run["decode_phase_s"],
                "tokens": run["outputs"]}  # fmt: skip

    def memory(self) -> dict:
        engine = self.llm.engine
        cache, config = engine.kv_cache, engine.model_config
        out = {
            "kv_bytes_per_token": config.kv_bytes_per_token(4),
            "kv_bytes_per_token_measured": kv_page_bytes(cache)
            / cache.block_size
            * len(cache.groups),
            "cache_groups": [{"layers": list(g.layers), "window": g.window} for g in cache.groups],
        }
        # recurrent mixers' constant-size state (kvcache/state_cache.py), where the engine has it
        states = getattr(cache, "states", None) or getattr(engine, "state_cache", None)
        if states is not None and getattr(states, "num_slots", 0):
            out["state_bytes_per_sequence"] = states.nbytes / states.num_slots
        return out


class Transformers:
    def __init__(self, directory: pathlib.Path, threads: int):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch.set_flush_denormal(True)
        self.model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        self.model.eval()
        self.model.generation_config.eos_token_id = None  # every request runs to max tokens

    def decode(self, batch: list[list[int]], new: int) -> dict:
        """One `generate` on the batch (equal lengths: no padding); time after the first token
        (the streamer's first put is the prompt, the second the first new tokens)."""
        times: list[float] = []
        streamer = type(
            "Clock",
            (),
            {"put": lambda _, v: times.append(time.perf_counter()), "end": lambda _: None},
        )()
        ids = torch.tensor(batch)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
                streamer=streamer,
            )
        seconds = time.perf_counter() - times[1]
        tokens = out[:, ids.shape[1] :].tolist()
        assert all(len(t) == new for t in tokens), "generate stopped early"
        return {"tok_s": (new - 1) * len(batch) / seconds, "tokens": tokens}


def run_engine(kind: str, directory, size: Size, threads: int, retries: int) -> dict:
    """One engine's round on one architecture: warm-up, then bs1 and bs16 decode runs."""
    engine = (
        Infergen(directory, size, threads)
        if kind == "infergen"
        else Transformers(directory, threads)
    )
    warm = prompts(size, size.batch, seed=1)
    engine.decode(warm[:1], 4)
    engine.decode(warm, 2)
    out: dict = {}
    for i, prompt in enumerate(prompts(size, size.bs1_prompts, seed=2)):
        run = measure(lambda p=prompt: engine.decode([p], size.new_tokens), retries)
        out.setdefault("bs1", []).append(run)
        if i == 0:
            out["bs1_tokens"] = run["tokens"][0]
    batch = prompts(size, size.batch, seed=3)
    out["batch"] = [measure(lambda: engine.decode(batch, size.new_tokens), retries)]
    if kind == "infergen":
        out["memory"] = engine.memory()
    return out


def wait_quiet(limit_s: float) -> float:
    """Wait (up to limit_s) until other processes use at most CONTENDED cores over a second;
    the seconds waited."""
    from cpu_contention import OtherCpu

    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        with OtherCpu() as other:
            time.sleep(1.0)
        if other.cores is None or other.cores <= CONTENDED:
            break
    return time.perf_counter() - start


def _reason(exc: Exception) -> str:
    """An exception as one short line (it goes into a markdown table)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _agreement(a: list[int], b: list[int]) -> int:
    """Tokens two greedy runs share before they first differ (random weights: near ties)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


# ---- main ---------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (quick: 1)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 round: a smoke run")
    parser.add_argument(
        "--only",
        default=None,
        help="NAME[,NAME]: these rows of ARCHS only; written as bench 'architectures_only' to "
        "architectures_only.jsonl unless --out says otherwise (the full table stays whole)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--retries", type=int, default=None, help="contended-run retries (1)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="before each engine's runs, wait up to this many seconds for "
        "other processes to leave the CPU (default 600; quick: 0)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "architectures.jsonl"
    )
    parser.add_argument(
        "--plot",
        type=pathlib.Path,
        default=None,
        help="window memory PNG (default docs/architectures-window-memory.png; quick: a temp file)",
    )
    args = parser.parse_args()
    size = QUICK if args.quick else SIZE
    rounds = args.rounds or (1 if args.quick else 2)
    retries = args.retries if args.retries is not None else (0 if args.quick else 1)
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0 if args.quick else 600)
    archs = list(ARCHS)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {a.name for a in archs}
        if unknown:
            sys.exit(f"--only: unknown {sorted(unknown)}; rows: {[a.name for a in archs]}")
        archs = [a for a in archs if a.name in wanted]
        if args.out == ROOT / "benchmarks" / "results" / "architectures.jsonl":
            args.out = args.out.with_name("architectures_only.jsonl")
    plot = args.plot or (
        pathlib.Path(tempfile.gettempdir()) / "architectures-window-memory-quick.png"
        if args.quick
        else ROOT / "docs" / "architectures-window-memory.png"
    )
    git = git_state()
    if other_pytest():
        print(f"note: a test run is going on ({other_pytest()}); other_cpu_cores records it")
    skipped: dict[str, str] = {}
    built: dict[str, dict] = {}
    runs: dict[tuple[str, str], list[dict]] = {}
    memory: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_arch_") as tmp:
        for arch in archs:
            try:
                built[arch.name] = build(arch, size, pathlib.Path(tmp) / arch.name)
            except Exception as exc:  # noqa: BLE001 - a row that cannot be built is skipped
                skipped[arch.name] = f"build: {_reason(exc)}"
                print(f"[{arch.name}] skipped: {skipped[arch.name]}", flush=True)
        for round_ in range(1, rounds + 1):
            for arch in archs:
                if arch.name not in built:
                    continue
                directory = pathlib.Path(tmp) / arch.name
                for kind in ("infergen", "transformers"):
                    if arch.name in skipped:
                        break
                    waited = wait_quiet(quiet_wait)
                    if waited > 1.5:
                        print(f"  waited {waited:.0f} s for other processes to leave the CPU")
                    started = time.perf_counter()
                    try:
                        out = run_engine(kind, directory, size, args.threads, retries)
                        gc.collect()  # the engine's model and cache, before the next loads
                    except Exception as exc:  # noqa: BLE001 - e.g. an unsupported architecture
                        skipped[arch.name] = f"{kind}: {_reason(exc)}"
                        print(f"[{arch.name}] skipped: {skipped[arch.name]}", flush=True)
                        break
                    memory.setdefault(arch.name, {}).update(out.pop("memory", {}))
                    for key, value in out.items():
                        runs.setdefault((arch.name, kind), []).append((key, value))
                    bs1 = max(r["tok_s"] for r in out["bs1"])
                    print(
                        f"round {round_} [{arch.name}] {kind}: bs1 {bs1:.1f} tok/s, "
                        f"bs{size.batch} {out['batch'][0]['tok_s']:.1f} tok/s "
                        f"({time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )
        curves = {}
        for arch in archs:
            if arch.windowed and arch.name in built and arch.name not in skipped:
                try:
                    curves[arch.name] = window_curve(pathlib.Path(tmp) / arch.name, size)
                except Exception as exc:  # noqa: BLE001
                    skipped[f"{arch.name} window curve"] = _reason(exc)
                    print(f"[{arch.name}] window curve failed: {type(exc).__name__}: {exc}")
    base = {
        "bench": "architectures_only" if args.only else "architectures",
        "quick": args.quick,
        "size": dataclasses.asdict(size),
        "git": git,
        "machine": machine_info(args.threads),
        "peer_versions": {"transformers": _version("transformers"), "torch": torch.__version__},
        "rounds": rounds,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = build_lines(base, archs, built, runs, memory, curves, skipped, size)
    write_lines(args.out, lines)
    print_table(lines, size)
    print(plot_curves(curves, plot))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def build_lines(base, archs, built, runs, memory, curves, skipped, size: Size) -> list[dict]:
    lines: list[dict] = [
        {**base, "kind": "skip", "engine": name, "note": note}
        for name, note in skipped.items()
        if name.endswith("window curve")
    ]
    for arch in archs:
        name = arch.name
        if name in skipped or name not in built:
            lines.append(
                {**base, "kind": "skip", "engine": name, "note": skipped.get(name, "not built")}
            )
            continue
        best, tokens = {}, {}
        for kind in ("infergen", "transformers"):
            for key, value in runs[(name, kind)]:
                if key == "bs1_tokens":
                    tokens[kind] = value
                    continue
                for run in value:
                    if run["tok_s"] > best.get((kind, key), {}).get("tok_s", 0.0):
                        best[(kind, key)] = run
        info = {"arch": name, "variant": arch.variant, **built[name]}
        for key, batch in (("bs1", 1), ("batch", size.batch)):
            metric = f"decode_tok_s_bs{batch} ({name})"
            for kind in ("infergen", "transformers"):
                run = best[(kind, key)]
                lines.append(
                    {
                        **base,
                        **info,
                        "kind": "result",
                        "metric": metric,
                        "engine": kind,
                        "value": run["tok_s"],
                        "unit": "tok/s",
                        "stat": f"best of {_count(runs[(name, kind)], key)} runs",
                        "other_cpu_cores": run["other_cpu_cores"],
                    }
                )
            ours, peer = best[("infergen", key)], best[("transformers", key)]
            ratio = ours["tok_s"] / peer["tok_s"]
            others = {"infergen": ours["other_cpu_cores"], "transformers": peer["other_cpu_cores"]}
            lines.append(
                {
                    **base,
                    **info,
                    "kind": "ratio",
                    "metric": metric,
                    "engine": "infergen",
                    "peer": "transformers",
                    "infergen_value": ours["tok_s"],
                    "peer_value": peer["tok_s"],
                    "value": ratio,
                    "unit": "x",
                    "definition": "infergen / transformers (decode tok/s)",
                    "other_cpu_cores": others,
                }
            )
            lines.append(
                {
                    **base,
                    **info,
                    "kind": "target",
                    "engine": "infergen",
                    "metric": f"{name} decode bs{batch} >= {TARGET:g}x transformers",
                    "threshold": TARGET,
                    "value": ratio,
                    "met": ratio >= TARGET,
                    "contended": any((c or 0) > CONTENDED for c in others.values()),
                }
            )
        mem = memory.get(name, {})
        lines.append(
            {
                **base,
                **info,
                "kind": "memory",
                "engine": "infergen",
                "mha_bytes_per_token": built[name].get("mha_bytes_per_token"),
                "greedy_agreement_bs1": _agreement(tokens["infergen"], tokens["transformers"]),
                "new_tokens": size.new_tokens,
                **mem,
            }
        )
    for name, curve in curves.items():
        info = {"arch": name, **built[name]}
        lines.append({**base, **info, "kind": "curve", "engine": "infergen", **curve})
        flat = curve["flat"]
        lines.append(
            {
                **base,
                **info,
                "kind": "target",
                "engine": "infergen",
                "metric": f"{name}: windowed groups' blocks flat after window + chunk "
                "(late max / early max)",
                "threshold": 1.0,
                "value": flat["ratio"],
                "met": flat["met"],
            }
        )
    return lines


def _count(entries, key) -> int:
    return sum(len(v) for k, v in entries if k == key)


def print_table(lines: list[dict], size: Size) -> None:
    from report import render_architectures

    print()
    lines = [{**ln, "bench": "architectures"} for ln in lines]  # --only: its rows too
    print(render_architectures(lines) or "no architecture measured")


if __name__ == "__main__":
    main()
