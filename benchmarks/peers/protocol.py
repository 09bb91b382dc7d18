"""The task protocol shared by bench_generate.py and its engine runners (stdlib only: it is
imported inside the llama.cpp peer virtualenv too).

A runner has three methods, each timing one thing and returning a dict:
    run_decode(prompt, max_tokens)      -> {"ttft_s", "decode_s", "tokens"}
    run_prefill(prompt)                 -> {"seconds", "tokens"}
    run_concurrent(prompts, max_tokens) -> {"seconds", "output_tokens", "outputs"}
Tasks (JSON):
    {"kind": "decode", "prompt": [ids], "max_tokens": n, "repeats": r, "options": {...}}
        (options: keywords of that runner's run_decode, e.g. transformers' generate options)
    {"kind": "prefill", "prompts": [[ids], ...]}            (one run per prompt)
    {"kind": "concurrent", "prompts": [[ids], ...], "max_tokens": n, "repeats": r}
Each task's result: {"kind", "runs": [...]}; every run carries "other_cpu_cores" (CPU used by
other processes meanwhile, see cpu_contention.py) and "attempts": a run that competed with
other processes for more than CONTENDED cores is repeated (up to `retries` more times, after a
short pause) and the least contended attempt is kept.

Two ways to drive a runner process: its argument's "tasks" all at once, the answer on the last
line of stdout (`write_result`); or, with "serve": true, one task at a time (`serve`): a line
of stdout `ANSWER` + {"ready": true, ...} once loaded, then per JSON task line on stdin one
`ANSWER` + result line, until stdin closes — so that a benchmark can run its engines in turns
task by task (the same minutes of this machine for every engine's run of a task).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from cpu_contention import OtherCpu

CONTENDED = 0.25  # cores used by other processes above which a run is retried
RETRY_PAUSE_S = 5.0


def measure(run: Callable[[], dict], retries: int) -> dict:
    """One run, repeated while contended; the least contended attempt, annotated."""
    kept = None
    for attempt in range(1 + retries):
        if attempt:
            time.sleep(RETRY_PAUSE_S)
        with OtherCpu() as other:
            result = run()
        result["other_cpu_cores"] = other.cores
        result["attempts"] = attempt + 1
        if kept is None or (other.cores or 0.0) < (kept["other_cpu_cores"] or 0.0):
            kept = result
        kept["attempts"] = attempt + 1
        if other.cores is None or other.cores <= CONTENDED:
            break
    return kept


def run_tasks(runner, tasks: list[dict], retries: int = 0) -> list[dict]:
    results = []
    for task in tasks:
        kind, repeats = task["kind"], int(task.get("repeats", 1))
        max_tokens = task.get("max_tokens")
        if kind == "decode":
            prompt, options = task["prompt"], task.get("options", {})  # options: the runner's
            calls = [lambda: runner.run_decode(prompt, max_tokens, **options)] * repeats  # noqa: B023
        elif kind == "prefill":
            calls = [lambda p=p: runner.run_prefill(p) for p in task["prompts"]]
        elif kind == "concurrent":
            prompts = task["prompts"]
            calls = [lambda: runner.run_concurrent(prompts, max_tokens)] * repeats  # noqa: B023
        else:
            raise SystemExit(f"unknown task kind {kind!r}")
        started = time.perf_counter()
        # the calls run here, before the loop variables change
        results.append({"kind": kind, "runs": [measure(call, retries) for call in calls]})
        print(
            f"  {kind} task ({len(task.get('prompts', [0]))} prompts) done in "
            f"{time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return results


def read_args() -> dict:
    """The runner's JSON argument: argv[1], or stdin's first line when argv[1] is "-" or
    absent (the rest of stdin: tasks, in serve mode)."""
    raw = sys.stdin.readline() if len(sys.argv) < 2 or sys.argv[1] == "-" else sys.argv[1]
    return json.loads(raw)


ANSWER = "@@answer "  # the prefix of serve mode's answer lines (libraries may print too)


def serve(runner, retries: int, **ready) -> None:
    """Serve mode (module docstring): `ready` (version, ...) once, then a result per task."""
    print(ANSWER + json.dumps({"ready": True, **ready}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        [result] = run_tasks(runner, [json.loads(line)], retries)
        print(ANSWER + json.dumps(result), flush=True)


def write_result(result: dict) -> None:
    """The runner's answer: one JSON object on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
