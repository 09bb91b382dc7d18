"""The task protocol shared by bench_generate.py and its engine runners (stdlib only: it is
imported inside the llama.cpp peer virtualenv too).

A runner has three methods, each timing one thing and returning a dict:
    run_decode(prompt, max_tokens)     → {"ttft_s", "decode_s", "tokens"}
    run_prefill(prompt)                → {"seconds", "tokens"}
    run_concurrent(prompts, max_tokens) → {"seconds", "output_tokens", "outputs"}
Tasks (JSON):
    {"kind": "decode", "prompt": [ids], "max_tokens": n, "repeats": r}
    {"kind": "prefill", "prompts": [[ids], ...]}            (one run per prompt)
    {"kind": "concurrent", "prompts": [[ids], ...], "max_tokens": n, "repeats": r}
Each task's result: {"kind", "runs": [...], "other_cpu_cores"} (see cpu_contention.py).
"""

from __future__ import annotations

import json
import sys

from cpu_contention import OtherCpu


def run_tasks(runner, tasks: list[dict]) -> list[dict]:
    results = []
    for task in tasks:
        kind, repeats = task["kind"], int(task.get("repeats", 1))
        with OtherCpu() as other:
            if kind == "decode":
                runs = [
                    runner.run_decode(task["prompt"], task["max_tokens"]) for _ in range(repeats)
                ]
            elif kind == "prefill":
                runs = [runner.run_prefill(prompt) for prompt in task["prompts"]]
            elif kind == "concurrent":
                runs = [
                    runner.run_concurrent(task["prompts"], task["max_tokens"])
                    for _ in range(repeats)
                ]
            else:
                raise SystemExit(f"unknown task kind {kind!r}")
        results.append({"kind": kind, "runs": runs, "other_cpu_cores": other.cores})
    return results


def read_args() -> dict:
    """The runner's JSON argument: argv[1], or stdin when argv[1] is "-" or absent."""
    raw = sys.stdin.read() if len(sys.argv) < 2 or sys.argv[1] == "-" else sys.argv[1]
    return json.loads(raw)


def write_result(result: dict) -> None:
    """The runner's answer: one JSON object on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
