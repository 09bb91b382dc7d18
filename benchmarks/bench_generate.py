"""Generation speed of infergen against transformers and llama.cpp, in the same run.

Default model (SmolLM2-135M-Instruct, Q4_1 GGUF) at fp32 on every engine, 2 threads:
  * infergen: the GGUF dequantized to fp32 (in process; prefix caching off), its decoder layers
    run as --compile says: "off" (the per-op path and the hand-written fused decode step;
    results in generate.jsonl) or "jit" (the compiler's generated layer programs; results in
    generate_jit.jsonl).
  * transformers: `generate` on the same GGUF, dequantized to fp32 by transformers
    (subprocess; torch.set_num_threads(2) and torch.set_flush_denormal(True) for fairness).
  * llama.cpp (llama-cpp-python from benchmarks/setup_peers.sh's cached virtualenv): an F32
    GGUF written from the same file (metadata copied, every tensor dequantized to F32), F32 KV
    cache, driven through the low-level llama_batch API (one seq_id per request).
Metrics (greedy, EOS ignored, prompts cut from the real text in data/):
  decode_tok_s_bs1     128-token prompt -> 128 new tokens: (new - 1) / (time after the first
                       token); also ttft_s_bs1. Best of 3 runs on distinct prompts.
  prefill_tok_s        512-token prompt, max_tokens=1: 512 / time. Best of 3 distinct prompts.
  throughput_tok_s_cN  N concurrent requests (16, 64), 128 -> 128 each, distinct prompts:
                       output tokens / wall time (prefill included). Best of 2.
  decode_tok_s_cN      infergen only: the same runs' decode phase (after every request has
                       its first token): tokens emitted in it / its time.
  roofline             the bound on throughput_tok_s_cN at this machine's fp32 GEMM peak,
                       measured in the run (benchmarks/compute_bound.py: the workload's
                       FLOPs / peak); the ratio infergen / roofline is the fraction reached.
Every engine is loaded once (the peers as runner processes that take a task at a time) and
warmed up; then every task runs on each engine in turn, the order rotating from task to task,
--rounds times (benchmarks/engine_turns.py): the machine's speed drifts by up to 2x over
minutes, and in turns each engine's run of a task is in the same minute as the others'. Each
metric is the best run of all rounds; each ratio also the median of the run-by-run ratios
("paired_median", which the targets use). Output: one JSON line per result, per ratio
(infergen / peer: >1 means infergen is faster), per greedy-agreement check and per target of
the issue (with "met"), written to --out (overwritten); a table on stdout. Every line records
other_cpu_cores: the CPU other processes used meanwhile (this machine is shared and noisy).
A benchmark, not a test: it asserts nothing. Then `python benchmarks/report.py` updates README.
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
PEERS_DIR = pathlib.Path(
    os.environ.get("INFERGEN_PEERS_DIR") or os.path.expanduser("~/.cache/infergen/peers")
)
LLAMA_PYTHON = PEERS_DIR / "llama-cpp" / "bin" / "python"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from engine_turns import EngineFailed, InProcess, PeerProcess, run_in_turns  # noqa: E402
from generate_lines import build_lines, print_table  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.config.sections import COMPILE_MODES  # noqa: E402


def decode_phase(engine, prompts: list[list[int]], params) -> dict:
    """Run all prompts at once through an infergen engine. Returns the wall time, the outputs,
    and the decode phase: from the step in which the last request got its first token to the
    end, and the tokens emitted in it."""
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    waiting, decode_start, decode_tokens = set(ids), None, 0
    while engine.has_unfinished():
        deltas = engine.step()
        if decode_start is not None:
            decode_tokens += sum(len(d.token_ids) for d in deltas)
        waiting -= {d.request_id for d in deltas if d.token_ids}
        if not waiting and decode_start is None:
            decode_start = time.perf_counter()
    end = time.perf_counter()
    outputs = [list(engine.output(r).token_ids) for r in ids]
    for r in ids:
        engine.release(r)
    return {
        "seconds": end - start,
        "output_tokens": sum(map(len, outputs)),
        "outputs": outputs,
        "decode_phase_s": end - decode_start,
        "decode_phase_tokens": decode_tokens,
    }


@dataclass(frozen=True)
class Sizes:
    decode_prompt: int = 128
    decode_new: int = 128
    prefill_prompt: int = 512
    concurrency: tuple[int, ...] = (16, 64)
    conc_prompt: int = 128
    conc_new: int = 128
    repeats: int = 3  # batch-1 decode and prefill
    conc_repeats: int = 2


FULL = Sizes()
QUICK = Sizes(32, 16, 128, (4, 8), 32, 16, 2, 1)


# ---- workload -------------------------------------------------------------------------------
def make_tasks(tokenizer, sizes: Sizes) -> tuple[list[dict], list[dict]]:
    """(warm-up tasks, measured tasks): token-id prompts cut from real text, all distinct."""
    prose = tokenizer.encode((ROOT / "data" / "shakespeare.txt").read_text())
    docs = tokenizer.encode((ROOT / "data" / "python_docs.txt").read_text())

    def windows(tokens: list[int], length: int, count: int, skip: int = 0) -> list[list[int]]:
        stride = length + 7  # distinct windows that never share a block-aligned prefix
        if skip + count * stride > len(tokens):
            raise SystemExit(f"data/ text too short for {count} prompts of {length} tokens")
        return [tokens[skip + i * stride : skip + i * stride + length] for i in range(count)]

    decode = windows(prose, sizes.decode_prompt, sizes.repeats, skip=200)
    prefill = windows(docs, sizes.prefill_prompt, sizes.repeats + 1)
    conc = windows(docs, sizes.conc_prompt, max(sizes.concurrency), skip=len(prefill) * 600)
    warmup = [
        {"kind": "decode", "prompt": prose[:48], "max_tokens": 8},
        {"kind": "prefill", "prompts": prefill[-1:]},
        {"kind": "concurrent", "prompts": windows(prose, 24, 4, skip=100), "max_tokens": 4},
    ]
    tasks = [
        {"kind": "decode", "prompt": p, "max_tokens": sizes.decode_new} for p in decode
    ]  # one task per prompt: distinct prompts, compared token by token across engines
    tasks.append({"kind": "prefill", "prompts": prefill[:-1]})
    for c in sizes.concurrency:
        tasks.append(
            {
                "kind": "concurrent",
                "prompts": conc[:c],
                "max_tokens": sizes.conc_new,
                "repeats": sizes.conc_repeats,
            }
        )
    return warmup, tasks


# ---- engines --------------------------------------------------------------------------------
class InfergenRunner:
    """infergen in this process, with the runner protocol of benchmarks/peers/protocol.py."""

    def __init__(self, threads: int, **options):
        """`options`: LLM quantization arguments (weights, kv_format, activations, ...)."""
        from infergen import LLM, SamplingParams

        self.sampling_params = SamplingParams
        self.llm = LLM(
            model=None,
            **options,
            num_threads=threads,
            kv_cache_memory="1GiB",
            max_num_seqs=64,
            max_num_batched_tokens=512,
            enable_prefix_caching=False,
        )

    def _params(self, max_tokens: int):
        return self.sampling_params(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def run_decode(self, prompt: list[int], max_tokens: int) -> dict:
        engine = self.llm.engine
        start = time.perf_counter()
        request_id = engine.add_request(prompt, self._params(max_tokens))
        first = None
        while engine.has_unfinished():
            for delta in engine.step():
                if first is None and delta.request_id == request_id and delta.token_ids:
                    first = time.perf_counter()
        end = time.perf_counter()
        tokens = list(engine.output(request_id).token_ids)
        engine.release(request_id)
        return {"ttft_s": first - start, "decode_s": end - first, "tokens": tokens}

    def run_prefill(self, prompt: list[int]) -> dict:
        start = time.perf_counter()
        self.llm.generate([prompt], self._params(1))
        return {"seconds": time.perf_counter() - start, "tokens": len(prompt)}

    def run_concurrent(self, prompts: list[list[int]], max_tokens: int) -> dict:
        """All prompts at once; also times the decode phase (see decode_phase)."""
        return decode_phase(self.llm.engine, prompts, self._params(max_tokens))


def run_peer(python, script: str, name: str, model, threads: int, warmup, tasks, **extra):
    """A peer runner in a subprocess (warm-up tasks first, their results dropped). Returns its
    JSON, or {"error": ...} with the tail of its log — never raises. `extra`: more runner
    arguments (retries, kv_type)."""
    args = {"model": str(model), "n_threads": threads, "tasks": warmup + tasks, **extra}
    log = pathlib.Path(tempfile.gettempdir()) / f"bench_generate_{name}.log"
    with log.open("w") as err:
        proc = subprocess.run(
            [str(python), str(ROOT / "benchmarks" / "peers" / script), "-"],
            input=json.dumps(args),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = log.read_text()[-1500:]
        return {"error": f"{name} runner failed (exit {proc.returncode}); log {log}:\n{tail}"}
    out = json.loads(lines[-1])
    out["results"] = out["results"][len(warmup) :]
    return out


def llama_cpp_missing() -> str | None:
    """None if the peer virtualenv imports llama_cpp, else why not."""
    if not LLAMA_PYTHON.is_file():
        return f"llama.cpp peer virtualenv not found ({LLAMA_PYTHON} is missing)"
    probe = subprocess.run([str(LLAMA_PYTHON), "-c", "import llama_cpp"], capture_output=True)
    if probe.returncode != 0:
        return f"llama_cpp does not import in {LLAMA_PYTHON}: {probe.stderr.decode()[-300:]}"
    return None


def machine_info(threads: int) -> dict:
    with open("/proc/cpuinfo") as f:
        text = f.read().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in text if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1] for ln in text if ln.startswith("flags")), "").split())
    # machines of one name differ (both "AMD EPYC" here): the widest vector ISA tells them apart
    isa = next((name for name in ("avx512f", "avx2", "sse4_2") if name in flags), "?")
    with open("/proc/meminfo") as f:
        mem_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal"))
    import torch

    return {
        "cpu": cpu,
        "isa": isa.replace("avx512f", "avx512"),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "torch": torch.__version__,
        "threads": threads,
        "python": platform.python_version(),
    }


def git_state() -> dict:
    """The infergen commit measured, and whether the working tree differed from it."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--untracked-files=no", "--", "infergen")
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "infergen_dirty": bool(changed)}


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "dev"


def open_engines(args, retries: int, model, versions: dict, failed: dict):
    """Every engine loaded, each once: infergen in this process (its tokenizer cuts the
    prompts), transformers and llama.cpp as runner processes in serve mode. Returns (engines:
    name -> runner with .run(task) / .close(), the infergen runner, warm-up tasks, tasks); an
    engine that cannot start goes to `failed` with why."""
    print(
        f"[infergen] {model.name}, fp32, {args.threads} threads, compile={args.compile}",
        flush=True,
    )
    infergen = InfergenRunner(args.threads, compile=args.compile)
    warmup, tasks = make_tasks(infergen.llm.tokenizer, sizes_of(args))
    engines = {"infergen": InProcess(infergen, retries)}
    peers = []
    if not args.skip_transformers:
        peers.append(
            ("transformers", "transformers", sys.executable, "transformers_runner.py", model, {})
        )
    if not args.skip_llamacpp:
        missing = llama_cpp_missing()
        if missing:
            message = f"{missing}; build it with `bash benchmarks/setup_peers.sh`. Skipped."
            print(f"[llama.cpp] {message}", flush=True)
            failed["llama.cpp"] = {"skipped": message}
        else:
            from gguf_f32 import cached_f32_gguf

            f32 = cached_f32_gguf(model, PEERS_DIR)
            script, extra = "llama_cpp_runner.py", {"kv_type": "f32"}
            peers.append(("llama.cpp", "llama-cpp-python", LLAMA_PYTHON, script, f32, extra))
    # (name, the package whose version peer_versions records, python, runner script, weights,
    # more runner arguments)
    for name, package, python, script, weights, extra in peers:
        started = time.perf_counter()
        print(f"[{name}] loading {weights.name}", flush=True)
        args_ = {"model": str(weights), "n_threads": args.threads, "retries": retries, **extra}
        try:
            engines[name] = PeerProcess(python, script, name, args_)
        except EngineFailed as error:
            failed[name] = {"error": str(error)}
            print(f"[{name}] failed: {error}", flush=True)
            continue
        versions[package] = engines[name].info.get("version", "?")
        print(f"[{name}] ready ({time.perf_counter() - started:.0f} s)", flush=True)
    return engines, infergen, warmup, tasks


def sizes_of(args) -> Sizes:
    return QUICK if args.quick else FULL


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {asdict(QUICK)}")
    parser.add_argument("--skip-transformers", action="store_true", help="no transformers peer")
    parser.add_argument("--skip-llamacpp", action="store_true", help="no llama.cpp peer")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (2)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="run every task this many times, each time on every engine in turn (default "
        "2; quick 1): this machine's speed drifts by tens of percent over minutes, so the "
        "engines take turns task by task and each ratio is also given run by run",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=None,
        help="re-run a measurement that competed with other processes for more than "
        "0.25 cores, up to this many times, keeping the least contended (default 2; quick 0)",
    )
    parser.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="off",
        help="infergen's decoder layers: 'off' (per-op path and the hand-written fused decode "
        "step), 'eager' (the captured graph op by op) or 'jit' (generated layer programs, "
        "built at engine start and cached on disk); default %(default)s",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="JSON-lines output, overwritten (default: benchmarks/results/generate.jsonl, "
        "generate_jit.jsonl with --compile jit)",
    )
    args = parser.parse_args()
    if args.out is None:
        suffix = "" if args.compile == "off" else f"_{args.compile}"
        args.out = ROOT / "benchmarks" / "results" / f"generate{suffix}.jsonl"
    sizes = sizes_of(args)
    retries = args.retries if args.retries is not None else (0 if args.quick else 2)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 2)
    git = git_state()  # before the run: others may change the tree meanwhile

    from compute_bound import compute_bound

    from infergen.io.default_model import default_model_path

    model = default_model_path()
    versions: dict[str, str] = {}
    failed: dict[str, dict] = {}
    engines, infergen, warmup, tasks = open_engines(args, retries, model, versions, failed)
    try:
        print(f"== {args.rounds} rounds, the engines in turns task by task", flush=True)
        results = run_in_turns(engines, warmup, tasks, args.rounds, failed)
    finally:
        for engine in engines.values():
            engine.close()
    found: dict[str, dict] = {name: {"results": out} for name, out in results.items()}
    for name, engine in engines.items():
        if name in found and isinstance(engine, PeerProcess):
            found[name].update(engine.info)
    if "infergen" in found:
        found["infergen"]["version"] = _version("infergen")
        found["infergen"]["bounds"] = {
            c: compute_bound(infergen.llm.config, c, sizes.conc_prompt, sizes.conc_new)
            for c in sizes.concurrency
        }
    found.update(failed)
    base = {
        "bench": "generate",
        "quick": args.quick,
        "model": model.name,
        "dtype": "fp32",
        "compile": args.compile,
        "retries": retries,
        "git": git,
        "peer_versions": versions,
        "machine": machine_info(args.threads),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = build_lines(found, tasks, sizes, base)
    write_lines(args.out, lines)
    print_table(lines)
    print(f"\nwrote {len(lines)} lines to {args.out}")


if __name__ == "__main__":
    main()
