"""Start to first answer: from launching a server on the default model to its first completion.

Per round, in turns, each engine is launched as its own process on the default model's GGUF,
2 threads: its OpenAI endpoint polled until /v1/models answers (ready), then one completion
of 8 greedy tokens (answered). Engines:

- infergen          `infergen serve` (the default: the GGUF's blocks decoded to fp32 at load);
- infergen --weights gguf   the blocks kept as stored (Q4_1), as llama.cpp runs them;
- llama-server      llama.cpp's server on the same file (it maps the file and computes on the
                    blocks as stored; built by `bash benchmarks/setup_peers.sh llama-server`).

The median of --repeats rounds per engine; the ratio lines set each infergen row beside
llama-server's. JSON lines to benchmarks/results/startup.jsonl, the machine beside them.

    .venv/bin/python benchmarks/bench_startup.py [--repeats 3]
"""

from __future__ import annotations

import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from bench_serving import LLAMA_SERVER, free_port, llama_server_version, stop  # noqa: E402
from results_file import base_line, bench_arguments, ratio_line, write_lines  # noqa: E402

from infergen.io.default_model import default_model_path  # noqa: E402

PROMPT = "The capital of France is"
NEW_TOKENS = 8
PEER = "llama-server"


def engines(gguf: pathlib.Path, threads: int) -> dict[str, Callable[[int], list[str]]]:
    """name → (port → the command line)."""
    # (this checkout's infergen: run from ROOT, so an A/B's base tree runs its own)
    infergen = [sys.executable, "-m", "infergen", "serve", "--num-threads", str(threads)]
    rows = {
        "infergen": lambda port: [*infergen, "--port", str(port)],
        "infergen --weights gguf": lambda port: [
            *infergen,
            "--weights",
            "gguf",
            "--port",
            str(port),
        ],  # fmt: skip
    }
    if LLAMA_SERVER.exists():
        rows[PEER] = lambda port: [
            str(LLAMA_SERVER), "--model", str(gguf), "--threads", str(threads), "--ctx-size",
            "2048", "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
    return rows


def start_to_answer(cmd: list[str], port: int, log: pathlib.Path) -> tuple[float, float, str]:
    """(seconds to ready, seconds to the first answer, its text) of a fresh process."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        started = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        try:
            while True:
                try:
                    if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.perf_counter() - started > 180:
                    raise SystemExit(f"{cmd[0]} did not start; see {log}")
                time.sleep(0.02)
            ready = time.perf_counter() - started
            body = {"prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0}
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
            return ready, time.perf_counter() - started, answer["choices"][0]["text"]
        finally:
            stop(proc)


def main() -> None:
    out = ROOT / "benchmarks" / "results" / "startup.jsonl"
    args = bench_arguments(__doc__, repeats=3, out=out).parse_args()
    gguf = default_model_path()
    rows = engines(gguf, args.threads)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    log = pathlib.Path("/tmp/infergen-bench-startup.log")
    for round_index in range(args.repeats):
        for name, command in rows.items():
            port = free_port()
            ready, answered, text = start_to_answer(command(port), port, log)
            times[name].append((ready, answered))
            print(f"round {round_index + 1} {name}: ready {ready:.2f} s, answered {answered:.2f} s "
                  f"({text!r})", flush=True)  # fmt: skip
    base = base_line("startup", gguf.name, machine_info(args.threads), git_state(),
                     new_tokens=NEW_TOKENS)  # fmt: skip
    base["peer_versions"] = {**base["peer_versions"], PEER: llama_server_version()
                             if LLAMA_SERVER.exists() else None}  # fmt: skip
    lines = []
    for name, runs in times.items():
        for metric, index in (("ready_s", 0), ("first_answer_s", 1)):
            value = statistics.median(run[index] for run in runs)
            lines.append({**base, "kind": "result", "metric": metric, "engine": name,
                          "value": value, "unit": "s", "rounds": [r[index] for r in runs],
                          "stat": f"median of {len(runs)}"})  # fmt: skip
    if PEER in times:
        peer = statistics.median(run[1] for run in times[PEER])
        version = base["peer_versions"][PEER]
        for name in rows:
            if name != PEER:
                ours = statistics.median(run[1] for run in times[name])
                metric = f"start_to_first_answer_s [{name}]"
                lines.append(ratio_line(base, metric, ours, PEER, peer, "s", peer_version=version))
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
