"""Serving benchmark: infergen's OpenAI server against llama.cpp's (`python -m llama_cpp.server`
from benchmarks/setup_peers.sh's virtualenv), driven by the same client (infergen/bench) in the
same run, one server at a time (this machine has 2 cores).

Default model, fp32 on both (llama.cpp gets the F32 GGUF written by bench_generate.py from the
same file), 2 threads each; llama.cpp's server runs one request at a time
(`--interrupt_requests False`: its default ends a running stream when another arrives).
Workloads `agentic` (multi-turn sessions resending the growing conversation) and
`random`, at concurrency 1, 8 and 32 (closed loop); every answer is exactly
--output-len tokens (ignore_eos for infergen, an EOS logit bias for llama.cpp). Reports TTFT,
ITL, TPOT, e2e (mean, p50, p90, p99), output tok/s; ratio lines infergen/llama.cpp; the
issue's target lines (at concurrency 8 and 32: higher output throughput than llama.cpp's
server with p50 TTFT no worse). JSON lines to --out; then `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import pathlib
import random
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402
from bench_generate import LLAMA_PYTHON, PEERS_DIR, git_state, machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.bench.client import ClientOptions, run_load  # noqa: E402
from infergen.bench.report import DEFINITIONS, format_report, summarize  # noqa: E402
from infergen.bench.workloads import WORKLOADS, WorkloadOptions  # noqa: E402
from infergen.io.checkpoint import load_checkpoint  # noqa: E402
from infergen.io.default_model import default_model_path  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(cmd: list[str], port: int, name: str, log: pathlib.Path):
    """Start a server process, wait for /v1/models, stop it (SIGTERM) afterwards."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 180
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"{name} server did not start; see {log}")
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--workloads", nargs="+", default=["agentic", "random"])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/serving.jsonl"
    )
    args = parser.parse_args()
    gguf = default_model_path()
    llama_gguf = PEERS_DIR / (pathlib.Path(gguf).stem + ".F32.gguf")
    if not LLAMA_PYTHON.exists() or not llama_gguf.exists():
        raise SystemExit(
            "llama.cpp peer missing: run `bash benchmarks/setup_peers.sh` and "
            "`python benchmarks/bench_generate.py` (writes the F32 GGUF) first"
        )
    checkpoint = load_checkpoint(gguf, load_weights=False)
    tokenizer, eos = checkpoint.tokenizer, tuple(checkpoint.config.eos_token_ids)
    logs = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    engines = {
        "infergen": lambda port: [
            sys.executable,
            "-m",
            "infergen.cli",
            "serve",
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--kv-cache-memory",
            "1GiB",
        ],
        "llama.cpp": lambda port: [
            str(LLAMA_PYTHON),
            "-m",
            "llama_cpp.server",
            "--model",
            str(llama_gguf),
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
            "--n_ctx",
            "8192",
            # serve requests one after another; its default (True) cuts a running stream short
            # whenever another request arrives, which would make its answers shorter
            "--interrupt_requests",
            "False",
            "--port",
            str(port),
        ],
    }
    jobs = []  # (workload, concurrency, requests): the same requests for both servers
    for w, workload in enumerate(args.workloads):
        for c in args.concurrency:
            n = max(16, 2 * c)
            opts = WorkloadOptions(
                num_requests=n, input_len=args.input_len, output_len=args.output_len, spread=0.5
            )
            jobs.append((workload, c, WORKLOADS.get(workload)(tokenizer, opts, random.Random(w))))
    print(DEFINITIONS)
    summaries: dict[tuple[str, str, int], dict] = {}
    for name, cmd in engines.items():
        port = free_port()
        with server(cmd(port), port, name, logs / f"bench_serving_{name}.log") as url:
            client = ClientOptions(
                url, eos_token_ids=eos, count_tokens=lambda t: len(tokenizer.encode(t))
            )
            warm = WORKLOADS.get("random")(
                tokenizer, WorkloadOptions(num_requests=2, output_len=4), random.Random(99)
            )
            asyncio.run(run_load(warm, client, concurrency=2))
            for workload, c, requests in jobs:
                results, wall = asyncio.run(run_load(requests, client, concurrency=c))
                summary = summarize(results, wall)
                summaries[(name, workload, c)] = summary
                print(format_report(f"{name} {workload} c={c}", summary), flush=True)
    base = {
        "bench": "serving",
        "quick": False,
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": {"llama-cpp-python": _llama_version()},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = []
    for (name, workload, c), s in summaries.items():
        params = {
            "workload": workload,
            "concurrency": c,
            "input_len": args.input_len,
            "output_len": args.output_len,
        }
        for metric, value, unit in (
            ("output_tok_s", s["output_tok_s"], "tok/s"),
            ("ttft_p50_s", s["ttft_s"]["p50"], "s"),
            ("itl_p50_s", s["itl_s"]["p50"], "s"),
            ("tpot_p50_s", s["tpot_s"]["p50"], "s"),
            ("e2e_p50_s", s["e2e_s"]["p50"], "s"),
        ):
            lines.append(
                {
                    **base,
                    "kind": "result",
                    "metric": f"{metric}_{workload}_c{c}",
                    "engine": name,
                    "value": value,
                    "unit": unit,
                    "params": params,
                    "summary": s,
                }
            )
    for workload in args.workloads:
        for c in args.concurrency:
            ours, theirs = (
                summaries[("infergen", workload, c)],
                summaries[("llama.cpp", workload, c)],
            )
            tput = ours["output_tok_s"] / theirs["output_tok_s"]
            ttft = (theirs["ttft_s"]["p50"] or 0) / (ours["ttft_s"]["p50"] or float("inf"))
            for metric, ratio, a, b in (
                (
                    f"output_tok_s_{workload}_c{c}",
                    tput,
                    ours["output_tok_s"],
                    theirs["output_tok_s"],
                ),
                (
                    f"ttft_p50_s_{workload}_c{c}",
                    ttft,
                    ours["ttft_s"]["p50"],
                    theirs["ttft_s"]["p50"],
                ),
            ):
                lines.append(
                    {
                        **base,
                        "kind": "ratio",
                        "metric": metric,
                        "engine": "infergen",
                        "peer": "llama.cpp",
                        "infergen_value": a,
                        "peer_value": b,
                        "value": ratio,
                        "unit": "x",
                        "definition": "tok/s: infergen/peer; seconds: peer/infergen",
                    }
                )
            if c >= 8:
                met = tput > 1 and ttft >= 1
                lines.append(
                    {
                        **base,
                        "kind": "target",
                        "metric": f"{workload} c{c}: output tok/s > llama.cpp server, p50 "
                        f"TTFT no worse (TTFT ratio {ttft:.2f}x)",
                        "target": f"serving {workload} c{c}: output tok/s > llama.cpp "
                        "server and p50 TTFT no worse",
                        "value": tput,
                        "unit": "x",
                        "met": met,
                        "detail": {"throughput_ratio": tput, "ttft_ratio": ttft},
                    }
                )
                print(
                    f"target {workload} c={c}: throughput {tput:.2f}x, p50 TTFT "
                    f"{ttft:.2f}x (llama/ours) -> {'met' if met else 'NOT met'}"
                )
    write_lines(args.out, lines)


def _llama_version() -> str:
    out = subprocess.run(
        [str(LLAMA_PYTHON), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    main()
