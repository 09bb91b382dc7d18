"""Generation speed of infergen against transformers and llama.cpp, in the same run.

Default model (SmolLM2-135M-Instruct, Q4_1 GGUF) at fp32 on every engine, 2 threads:
  * infergen: the GGUF dequantized to fp32 (in process, prefix caching off).
  * transformers: `generate` on the same GGUF, dequantized to fp32 by transformers
    (subprocess, torch.set_num_threads(2), torch.set_flush_denormal(True) for fairness).
  * llama.cpp (llama-cpp-python, peer virtualenv from benchmarks/setup_peers.sh): an F32 GGUF
    written from the same file (all metadata copied, every tensor dequantized to F32, F32 KV
    cache), driven through the low-level llama_batch API (one seq_id per request).
Metrics (greedy, ignore EOS, real text prompts from data/):
  decode_tok_s_bs1      128-token prompt → 128 new tokens; (new − 1) / (time after the first
                        token); also ttft_s_bs1. Best of 3 runs (distinct prompts).
  prefill_tok_s         512-token prompt, max_tokens=1; best of 3 (distinct prompts).
  throughput_tok_s_cN   N concurrent requests (16 and 64), 128 → 128 each, distinct prompts:
                        total output tokens / wall time (prefill included).
Output: one JSON line per result, per ratio (infergen / peer, >1 means infergen is faster) and
per target of the issue (with "met"), written to --out (overwritten) and a table on stdout.
This is a benchmark, not a test: it asserts nothing. The machine is noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
PEERS_DIR = pathlib.Path(os.path.expanduser("~/.cache/infergen/peers"))
LLAMA_PYTHON = PEERS_DIR / "llama-cpp" / "bin" / "python"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))


@dataclass(frozen=True)
class Sizes:
    decode_prompt: int = 128
    decode_new: int = 128
    prefill_prompt: int = 512
    concurrency: tuple[int, ...] = (16, 64)
    conc_prompt: int = 128
    conc_new: int = 128
    repeats: int = 3


FULL = Sizes()
QUICK = Sizes(32, 16, 128, (4, 8), 32, 16, 2)
AGREE_TOKENS = 16  # greedy tokens compared between engines (same-model sanity check)
TARGETS = [  # (name, numerator, denominator, threshold) from the issue
    ("decode_bs1 >= 2x transformers", ("decode_tok_s_bs1", "infergen"),
     ("decode_tok_s_bs1", "transformers"), 2.0),
    ("decode_bs1 >= 0.9x llama.cpp", ("decode_tok_s_bs1", "infergen"),
     ("decode_tok_s_bs1", "llama.cpp"), 0.9),
    ("throughput_c16 >= 5x own decode_bs1", ("throughput_tok_s_c{c0}", "infergen"),
     ("decode_tok_s_bs1", "infergen"), 5.0),
]  # fmt: skip


# ---- workload -------------------------------------------------------------------------------
def make_tasks(tokenizer, sizes: Sizes) -> tuple[list[dict], list[dict]]:
    """(warm-up tasks, measured tasks): token-id prompts cut from real text, all distinct."""
    prose = tokenizer.encode((ROOT / "data" / "shakespeare.txt").read_text())
    docs = tokenizer.encode((ROOT / "data" / "python_docs.txt").read_text())

    def windows(tokens: list[int], length: int, count: int, skip: int = 0) -> list[list[int]]:
        stride = length + 7  # windows never share a block-aligned prefix
        need = skip + count * stride
        if need > len(tokens):
            raise SystemExit(f"data/ text too short for {count} prompts of {length} tokens")
        return [tokens[skip + i * stride : skip + i * stride + length] for i in range(count)]

    decode = windows(prose, sizes.decode_prompt, sizes.repeats, skip=200)
    prefill = windows(docs, sizes.prefill_prompt, sizes.repeats + 1)
    conc = windows(docs, sizes.conc_prompt, max(sizes.concurrency), skip=len(prefill) * 600)
    warm_prompt = prose[:48]
    warmup = [
        {"kind": "decode", "prompt": warm_prompt, "max_tokens": 8, "repeats": 1},
        {"kind": "prefill", "prompts": prefill[-1:]},
        {"kind": "concurrent", "prompts": windows(prose, 24, 4, skip=100), "max_tokens": 4},
    ]
    tasks = [{"kind": "decode", "prompt": p, "max_tokens": sizes.decode_new} for p in decode]
    tasks.append({"kind": "prefill", "prompts": prefill[:-1]})
    for c in sizes.concurrency:
        tasks.append({"kind": "concurrent", "prompts": conc[:c], "max_tokens": sizes.conc_new})
    return warmup, tasks


# ---- engines --------------------------------------------------------------------------------
class InfergenRunner:
    """Same task protocol as benchmarks/peers/*_runner.py, in process."""

    def __init__(self, threads: int):
        from infergen import LLM, SamplingParams

        self.params = SamplingParams
        self.llm = LLM(
            model=None, num_threads=threads, kv_cache_memory="1GiB", max_num_seqs=64,
            max_num_batched_tokens=512, enable_prefix_caching=False,
        )  # fmt: skip

    def _sp(self, max_tokens: int):
        return self.params(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def run(self, task: dict) -> dict:
        engine = self.llm.engine
        if task["kind"] == "decode":
            start = time.perf_counter()
            rid = engine.add_request(task["prompt"], self._sp(task["max_tokens"]))
            first = None
            while engine.has_unfinished():
                for delta in engine.step():
                    if first is None and delta.request_id == rid and delta.token_ids:
                        first = time.perf_counter()
            end = time.perf_counter()
            tokens = engine.output(rid).token_ids
            engine.release(rid)
            return {"runs": [{"ttft_s": first - start, "decode_s": end - first, "tokens": tokens}]}
        if task["kind"] == "prefill":
            runs = []
            for prompt in task["prompts"]:
                start = time.perf_counter()
                self.llm.generate([prompt], self._sp(1))
                runs.append({"seconds": time.perf_counter() - start, "tokens": len(prompt)})
            return {"runs": runs}
        start = time.perf_counter()
        outs = self.llm.generate(task["prompts"], self._sp(task["max_tokens"]))
        seconds = time.perf_counter() - start
        outputs = [list(o.token_ids) for o in outs]
        return {"seconds": seconds, "output_tokens": sum(map(len, outputs)), "outputs": outputs}


def run_subprocess(python: pathlib.Path, script: str, args: dict, name: str) -> dict:
    """Run a peer runner; returns its JSON, or {"error": ...} (never raises)."""
    log = pathlib.Path(tempfile.gettempdir()) / f"bench_generate_{name}.log"
    # Warm-up tasks run first in the same process; their results are dropped here.
    with log.open("w") as err:
        proc = subprocess.run(
            [str(python), str(ROOT / "benchmarks" / "peers" / script), "-"],
            input=json.dumps(args), stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = log.read_text()[-1500:]
        return {"error": f"{name} runner failed (exit {proc.returncode}); log {log}:\n{tail}"}
    return json.loads(lines[-1])


def run_peer(python, script, name, model, threads, warmup, tasks, extra=None) -> dict:
    args = {"model": str(model), "n_threads": threads, "tasks": warmup + tasks, **(extra or {})}
    load = os.getloadavg()[0]
    out = run_subprocess(python, script, args, name)
    out["loadavg"] = load
    if "error" not in out:
        out["results"] = out["results"][len(warmup) :]
    return out


def llama_cpp_available() -> str | None:
    """None if the peer virtualenv imports llama_cpp, else the reason."""
    if not LLAMA_PYTHON.is_file():
        return f"llama.cpp peer virtualenv not found at {LLAMA_PYTHON.parent.parent}"
    probe = subprocess.run([str(LLAMA_PYTHON), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        return f"llama_cpp does not import in {LLAMA_PYTHON}: {probe.stderr.decode()[-300:]}"
    return None


# ---- results --------------------------------------------------------------------------------
def summarize(engine_out: dict, tasks: list[dict], sizes: Sizes) -> dict[str, dict]:
    """metric → {"value", "unit", ...} from one engine's task results."""
    metrics: dict[str, dict] = {}
    results = engine_out["results"]
    decodes = [r["runs"][0] for t, r in zip(tasks, results) if t["kind"] == "decode"]
    if decodes:
        rates = [(len(d["tokens"]) - 1) / d["decode_s"] for d in decodes]
        params = {"prompt_tokens": sizes.decode_prompt, "new_tokens": sizes.decode_new}
        metrics["decode_tok_s_bs1"] = {"value": max(rates), "unit": "tok/s", "stat":
            f"best of {len(rates)}", "runs": rates, "params": params}  # fmt: skip
        ttfts = [d["ttft_s"] for d in decodes]
        metrics["ttft_s_bs1"] = {"value": min(ttfts), "unit": "s", "stat":
            f"best of {len(ttfts)}", "runs": ttfts, "params": params}  # fmt: skip
    for task, result in zip(tasks, results):
        if task["kind"] == "prefill":
            rates = [r["tokens"] / r["seconds"] for r in result["runs"]]
            metrics["prefill_tok_s"] = {"value": max(rates), "unit": "tok/s", "stat":
                f"best of {len(rates)}", "runs": rates,
                "params": {"prompt_tokens": sizes.prefill_prompt, "max_tokens": 1}}  # fmt: skip
        elif task["kind"] == "concurrent":
            c = len(task["prompts"])
            metrics[f"throughput_tok_s_c{c}"] = {
                "value": result["output_tokens"] / result["seconds"], "unit": "tok/s",
                "stat": "one run", "params": {"requests": c, "prompt_tokens": sizes.conc_prompt,
                "new_tokens": sizes.conc_new, "wall_s": result["seconds"]}}  # fmt: skip
    return metrics


def agreement(a: dict, b: dict, tasks: list[dict]) -> dict:
    """Common greedy prefix (up to AGREE_TOKENS) of two engines on the same prompts."""
    prefixes = []
    for task, ra, rb in zip(tasks, a["results"], b["results"]):
        if task["kind"] == "decode":
            pairs = [(ra["runs"][0]["tokens"], rb["runs"][0]["tokens"])]
        elif task["kind"] == "concurrent":
            pairs = list(zip(ra["outputs"], rb["outputs"]))
        else:
            continue
        for x, y in pairs:
            n = min(AGREE_TOKENS, len(x), len(y))
            prefixes.append(next((i for i in range(n) if x[i] != y[i]), n))
    full = sum(p == AGREE_TOKENS for p in prefixes)
    return {"value": full / max(1, len(prefixes)), "unit": "fraction of prompts",
            "detail": f"{full}/{len(prefixes)} prompts agree on the first {AGREE_TOKENS} greedy "
            f"tokens; common prefix lengths {prefixes}"}  # fmt: skip


def machine_info(threads: int) -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())  # fmt: skip
    mem_kb = next(int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
            "torch": torch.__version__, "threads": threads, "python": platform.python_version()}  # fmt: skip


def _infergen_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infergen")
    except PackageNotFoundError:
        return "dev"


def build_lines(engines: dict[str, dict], tasks, sizes, base: dict) -> list[dict]:
    lines: list[dict] = []
    summaries = {}
    for name, out in engines.items():
        if "error" in out or "skipped" in out:
            note = out.get("skipped") or out["error"]
            lines.append({**base, "kind": "skip", "engine": name, "note": note})
            continue
        summaries[name] = summarize(out, tasks, sizes)
        for metric, m in summaries[name].items():
            line = {**base, "kind": "result", "metric": metric, "engine": name, **m,
                    "loadavg_1m": out.get("loadavg")}  # fmt: skip
            if name in NOTES:
                line["note"] = NOTES[name]
            lines.append(line)
    ours = summaries.get("infergen", {})
    for peer, theirs in summaries.items():
        if peer == "infergen":
            continue
        for metric, m in theirs.items():
            if metric not in ours:
                continue
            seconds = m["unit"] == "s"
            ratio = m["value"] / ours[metric]["value"] if seconds else ours[metric]["value"] / m["value"]
            lines.append({**base, "kind": "ratio", "metric": metric, "engine": "infergen",
                "peer": peer, "infergen_value": ours[metric]["value"], "peer_value": m["value"],
                "value": ratio, "unit": "x", "definition": "peer/infergen (seconds)"
                if seconds else "infergen/peer (tok/s)"})  # fmt: skip
        lines.append({**base, "kind": "agreement", "metric": "greedy_agreement", "engine":
                      "infergen", "peer": peer, **agreement(engines["infergen"], engines[peer], tasks)})  # fmt: skip
    for name, (m1, e1), (m2, e2), threshold in TARGETS:
        m1 = m1.format(c0=sizes.concurrency[0])
        a, b = summaries.get(e1, {}).get(m1), summaries.get(e2, {}).get(m2)
        line = {**base, "kind": "target", "metric": name, "engine": "infergen",
                "threshold": threshold, "numerator": f"{e1}:{m1}", "denominator": f"{e2}:{m2}"}  # fmt: skip
        if a is None or b is None:
            line.update(value=None, met=None, note="not measured in this run")
        else:
            line.update(value=a["value"] / b["value"], met=a["value"] / b["value"] >= threshold)
        lines.append(line)
    return lines


NOTES = {
    "transformers": "torch.set_num_threads(threads) and torch.set_flush_denormal(True) for "
    "fairness; concurrency = one left-padded generate() batch",
    "llama.cpp": "F32 GGUF written from the same Q4_1 file, F32 KV cache; concurrency via the "
    "low-level llama_batch API (one seq_id per request: prefill in 512-token batches, then "
    "lockstep decode of all sequences); greedy argmax on the host",
}


def print_table(lines: list[dict]) -> None:
    print(f"\n{'metric':<24}{'engine':<14}{'value':>12}  unit     notes")
    for ln in lines:
        if ln["kind"] == "result":
            print(f"{ln['metric']:<24}{ln['engine']:<14}{ln['value']:>12.3f}  {ln['unit']:<8} {ln['stat']}")
        elif ln["kind"] == "skip":
            print(f"{'(skipped)':<24}{ln['engine']:<14}{'':>12}  {'':<8} {ln['note'][:120]}")
    print(f"\n{'ratio (>1: infergen faster)':<34}{'peer':<14}{'value':>8}")
    for ln in lines:
        if ln["kind"] == "ratio":
            print(f"{ln['metric']:<34}{ln['peer']:<14}{ln['value']:>8.2f}x")
        elif ln["kind"] == "agreement":
            print(f"{'greedy agreement':<34}{ln['peer']:<14}{'':>8}  {ln['detail']}")
    print("\ntargets")
    for ln in lines:
        if ln["kind"] == "target":
            v = "n/a" if ln["value"] is None else f"{ln['value']:.2f}x"
            print(f"  {ln['metric']:<40}{v:>8}  met={ln['met']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: smaller sizes {asdict(QUICK)}")  # fmt: skip
    parser.add_argument("--skip-transformers", action="store_true", help="no transformers peer")
    parser.add_argument("--skip-llamacpp", action="store_true", help="no llama.cpp peer")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine (2)")
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "benchmarks" / "results" / "generate.jsonl",
                        help="JSON-lines output, overwritten (default %(default)s)")  # fmt: skip
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL

    from infergen.io.default_model import default_model_path

    model = default_model_path()
    engines: dict[str, dict] = {}
    print(f"[infergen] {model.name}, fp32, {args.threads} threads", flush=True)
    t = time.perf_counter()
    engines["infergen"] = _run_infergen_with_tasks(args.threads, sizes)
    warmup, tasks = engines["infergen"].pop("_warmup"), engines["infergen"].pop("_tasks")
    print(f"[infergen] done in {time.perf_counter() - t:.0f} s", flush=True)
    versions = {}
    if not args.skip_transformers:
        print("[transformers] loading the GGUF (~45 s) and running", flush=True)
        t = time.perf_counter()
        out = run_peer(pathlib.Path(sys.executable), "transformers_runner.py", "transformers",
                       model, args.threads, warmup, tasks)  # fmt: skip
        engines["transformers"] = out
        versions["transformers"] = out.get("version")
        print(f"[transformers] done in {time.perf_counter() - t:.0f} s", flush=True)
    if not args.skip_llamacpp:
        missing = llama_cpp_available()
        if missing:
            msg = f"{missing}; build it with `bash benchmarks/setup_peers.sh`. llama.cpp skipped."
            print(f"[llama.cpp] {msg}", flush=True)
            engines["llama.cpp"] = {"skipped": msg}
        else:
            from gguf_f32 import cached_f32_gguf

            t = time.perf_counter()
            f32 = cached_f32_gguf(model, PEERS_DIR)
            print(f"[llama.cpp] {f32.name} ready in {time.perf_counter() - t:.0f} s", flush=True)
            out = run_peer(LLAMA_PYTHON, "llama_cpp_runner.py", "llama.cpp", f32, args.threads,
                           warmup, tasks, {"kv_type": "f32"})  # fmt: skip
            engines["llama.cpp"] = out
            versions["llama-cpp-python"] = out.get("version")
            if "error" in out:
                print(f"[llama.cpp] {out['error']}", flush=True)
            print(f"[llama.cpp] done in {time.perf_counter() - t:.0f} s", flush=True)
    base = {"bench": "generate", "quick": args.quick, "model": model.name, "dtype": "fp32",
            "peer_versions": versions, "machine": machine_info(args.threads),
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}  # fmt: skip
    lines = build_lines(engines, tasks, sizes, base)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    print_table(lines)
    print(f"\nwrote {len(lines)} lines to {args.out}")


def _run_infergen_with_tasks(threads: int, sizes: Sizes) -> dict:
    runner = InfergenRunner(threads)
    warmup, tasks = make_tasks(runner.llm.tokenizer, sizes)
    for task in warmup:
        runner.run(task)
    load = os.getloadavg()[0]
    results = [runner.run(task) for task in tasks]
    del runner
    return {"version": _infergen_version(), "loadavg": load, "results": results,
            "_warmup": warmup, "_tasks": tasks}  # fmt: skip


if __name__ == "__main__":
    main()
