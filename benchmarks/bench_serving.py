"""Serving benchmark: infergen's OpenAI server against llama.cpp's own C++ `llama-server`
(continuous batching over `--parallel` slots; built by benchmarks/setup_peers.sh into
~/.cache/infergen/peers/llama.cpp/bin), driven by the same client (infergen/bench) in the same
run, one server at a time (this machine has 2 cores).

Default model, fp32 on both (llama-server gets the F32 GGUF that bench_generate.py writes from
the same file, written here too if missing, and an F32 KV cache), 2 threads each (`-t 2 -tb 2`).
Every measurement (one workload at one concurrency) gets a fresh server of each engine, warmed
up with two short requests: llama-server with `--parallel` = that concurrency (one slot per
client), `--cont-batching`, and `--ctx-size` = slots x a per-slot context that holds the
workload's longest request (its last turn's prompt plus its answer, with a margin for
re-tokenizing; at most the model's context length); its prompt cache as by default
(`cache_prompt`, the RAM cache). Restarting per measurement keeps either engine from reusing
the prompts of an earlier measurement (the same workload at two concurrencies shares its first
requests), and sets llama-server's slots to the concurrency.
Workloads `agentic` (multi-turn sessions resending the growing conversation) and `random`, at
concurrency 1, 8 and 32 (closed loop); every answer is exactly its request's max_tokens
(`ignore_eos`, which both servers honour; output_len is the mean for `random`), checked
against the servers' usage counts. Reports TTFT, ITL, TPOT, e2e (mean, p50, p90, p99), output
tok/s; ratio lines infergen/llama-server; the issue's target lines (at concurrency 8 and 32:
higher output throughput than llama-server with p50 TTFT no worse). JSON lines to --out; then
`python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import pathlib
import random
import re
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402
from bench_generate import PEERS_DIR, git_state, machine_info  # noqa: E402
from gguf_f32 import cached_f32_gguf  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.bench.client import ClientOptions, run_load  # noqa: E402
from infergen.bench.report import DEFINITIONS, format_report, summarize  # noqa: E402
from infergen.bench.workloads import WORKLOADS, WorkloadOptions, shape_of  # noqa: E402
from infergen.io.checkpoint import load_checkpoint  # noqa: E402
from infergen.io.default_model import default_model_path  # noqa: E402

LLAMA_CPP_DIR = PEERS_DIR / "llama.cpp"
LLAMA_SERVER = LLAMA_CPP_DIR / "bin" / "llama-server"
PEER = "llama-server"


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
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def llama_server_cmd(
    gguf: pathlib.Path, port: int, slots: int, ctx: int, threads: int, extra: tuple = ()
) -> list[str]:
    """llama-server on `gguf` with `slots` slots of `ctx` tokens each (non-unified KV), an F32
    KV cache (infergen's precision; llama.cpp's default is F16), `threads` threads for decode
    and prompt batches, continuous batching; `extra`: more flags."""
    return [
        str(LLAMA_SERVER),
        "--model",
        str(gguf),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        # one slot per concurrent client, batched continuously; --ctx-size is split evenly
        # between the slots (no unified KV cache when --parallel is given)
        "--parallel",
        str(slots),
        "--cont-batching",
        "--ctx-size",
        str(slots * ctx),
        "--cache-type-k",
        "f32",
        "--cache-type-v",
        "f32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def slot_context(requests, count_tokens, max_context: int) -> int:
    """Per-slot context for llama-server: the longest request of the workload (an agentic
    session's last turn: its prompt, the earlier answers and user turns, and its own answer),
    plus a margin for the peer re-tokenizing the text and its BOS token, rounded up to 256."""
    longest = 0
    for request in requests:
        shape = shape_of(request, count_tokens)
        turns = 1 + len(shape.follow_up_tokens)
        longest = max(
            longest, shape.prompt_tokens + sum(shape.follow_up_tokens) + turns * shape.max_tokens
        )
    need = -(-(longest + longest // 8 + 32) // 256) * 256
    if longest > max_context:
        raise SystemExit(f"the longest request ({longest} tokens) exceeds the model's context")
    return min(need, max_context)


def exact_lengths(requests, results) -> bool:
    """Whether every answer had exactly its request's max_tokens (the servers' usage counts)."""
    expected = sorted(r.max_tokens for r in requests for _ in range(1 + len(r.follow_up)))
    return all(r.ok for r in results) and sorted(r.output_tokens for r in results) == expected


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
    if not LLAMA_SERVER.exists():
        raise SystemExit(
            f"llama.cpp peer missing ({LLAMA_SERVER}): run "
            "`bash benchmarks/setup_peers.sh llama-server` first"
        )
    gguf = pathlib.Path(default_model_path())
    llama_gguf = cached_f32_gguf(gguf, PEERS_DIR)  # the one bench_generate.py gives llama.cpp
    checkpoint = load_checkpoint(gguf, load_weights=False)
    tokenizer, max_context = checkpoint.tokenizer, checkpoint.config.max_position_embeddings

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text))

    logs = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    engines = {
        "infergen": lambda port, slots, ctx: [
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
        PEER: lambda port, slots, ctx: llama_server_cmd(llama_gguf, port, slots, ctx, args.threads),
    }
    jobs = []  # (workload, concurrency, requests): the same requests for both servers
    for w, workload in enumerate(args.workloads):
        for c in args.concurrency:
            # agentic counts turns: at least one session per client, so all c are busy
            n = WorkloadOptions().turns * max(4, c) if workload == "agentic" else max(16, 2 * c)
            opts = WorkloadOptions(
                num_requests=n, input_len=args.input_len, output_len=args.output_len, spread=0.5
            )
            jobs.append((workload, c, WORKLOADS.get(workload)(tokenizer, opts, random.Random(w))))
    print(DEFINITIONS)
    summaries: dict[tuple[str, str, int], dict] = {}
    exact: dict[tuple[str, str, int], bool] = {}
    slot_ctx: dict[tuple[str, int], int] = {}
    for workload, c, requests in jobs:
        ctx = slot_ctx[(workload, c)] = slot_context(requests, count_tokens, max_context)
        for name, cmd in engines.items():  # a fresh server of each engine per measurement
            port = free_port()
            log = logs / f"bench_serving_{name}_{workload}_c{c}.log"
            with server(cmd(port, c, ctx), port, name, log) as url:
                client = ClientOptions(url, count_tokens=count_tokens)
                warm = WORKLOADS.get("random")(
                    tokenizer, WorkloadOptions(num_requests=2, output_len=4), random.Random(99)
                )
                asyncio.run(run_load(warm, client, concurrency=2))
                results, wall = asyncio.run(run_load(requests, client, concurrency=c))
            summary = summarize(results, wall)
            summaries[(name, workload, c)] = summary
            exact[(name, workload, c)] = exact_lengths(requests, results)
            print(format_report(f"{name} {workload} c={c}", summary), flush=True)
            if not exact[(name, workload, c)]:
                print(f"WARNING: {name} {workload} c={c}: answers not all of max_tokens tokens")
    base = {
        "bench": "serving",
        "quick": False,
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": {PEER: llama_server_version()},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = []
    for (name, workload, c), s in summaries.items():
        params = {
            "workload": workload,
            "concurrency": c,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "exact_output_len": exact[(name, workload, c)],
        }
        if name == PEER:
            params["slots"], params["slot_ctx"] = c, slot_ctx[(workload, c)]
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
                summaries[(PEER, workload, c)],
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
                        "peer": PEER,
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
                        "metric": f"{workload} c{c}: output tok/s > llama-server, p50 "
                        f"TTFT no worse (TTFT ratio {ttft:.2f}x)",
                        "target": f"serving {workload} c{c}: output tok/s > llama-server "
                        "and p50 TTFT no worse",
                        "value": tput,
                        "unit": "x",
                        "met": met,
                        "detail": {"throughput_ratio": tput, "ttft_ratio": ttft},
                    }
                )
                print(
                    f"target {workload} c={c}: throughput {tput:.2f}x, p50 TTFT "
                    f"{ttft:.2f}x (llama-server/ours) -> {'met' if met else 'NOT met'}"
                )
    write_lines(args.out, lines)


def llama_server_version() -> str:
    """E.g. "b11312 (llama.cpp 0c1e57098, llama-cpp-python 0.3.36 sources)": llama-server's
    build number and commit (`--version`), and the sdist setup_peers.sh built it from."""
    out = subprocess.run([str(LLAMA_SERVER), "--version"], capture_output=True, text=True)
    match = re.search(r"\(build (\d+), commit (\w+)\)", out.stdout + out.stderr)
    build = f"b{match[1]} (llama.cpp {match[2]}" if match else "? (llama.cpp ?"
    source = LLAMA_CPP_DIR / "SOURCE"
    return f"{build}, {source.read_text().strip() if source.exists() else '? sources'})"


if __name__ == "__main__":
    main()
