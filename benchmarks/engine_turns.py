"""Engines run in turns, task by task: every engine loaded once (infergen in this process, the
peers as runner processes in serve mode, benchmarks/peers/protocol.py), then each task of
each round run by every engine, one after the other, the order rotating from task to task.

Why: this machine's speed drifts by up to 2x over minutes (its memory bandwidth most: the
default model's batch-1 decode read 56 tok/s in one minute and 86 in another, 2026-12-07).
An engine that runs all its tasks and then leaves the machine to the next one is judged in
other minutes than the next; in turns, run i of every engine is the same prompt within the
same minute or so, and the run-by-run ratios (generate_lines.paired) compare like with like.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from protocol import ANSWER, run_tasks  # noqa: E402


class EngineFailed(RuntimeError):
    """A runner process exited or answered with an error; the message holds its log's tail."""


class InProcess:
    """A runner in this process (protocol.py's three methods), run a task at a time."""

    def __init__(self, runner, retries: int):
        self.runner, self.retries = runner, retries

    def run(self, task: dict) -> dict:
        return run_tasks(self.runner, [task], self.retries)[0]

    def close(self) -> None:
        pass


class PeerProcess:
    """A runner script in serve mode (`script`: in benchmarks/peers/, or an absolute path):
    loaded once (`info`: its ready answer, with its version), then given a task at a time.
    Raises EngineFailed when it dies."""

    def __init__(self, python, script: str, name: str, args: dict):
        self.name = name
        self.log = pathlib.Path(tempfile.gettempdir()) / f"bench_{name}.log"
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "benchmarks" / "peers" / script), "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self.info = self._ask({**args, "serve": True})

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # (it exited: the read below says how)
        for line in self.proc.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
        code = self.proc.wait()
        self._err.flush()
        tail = self.log.read_text()[-1500:]
        raise EngineFailed(f"{self.name} runner exited ({code}); log {self.log}:\n{tail}")

    def run(self, task: dict) -> dict:
        return self._ask(task)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # (serve mode ends at the end of its input)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def run_in_turns(
    engines: dict, warmup: list[dict], tasks: list[dict], rounds: int, failed: dict
) -> dict[str, list[dict]]:
    """Each engine's results (one per task, every round's runs in order: round 1's, then
    round 2's, ...) after the warm-up tasks (results dropped). An engine that fails is moved
    to `failed` ({"error": ...}) and leaves the rest to the others."""
    results = {name: [{"kind": t["kind"], "runs": []} for t in tasks] for name in engines}

    def run(name: str, task: dict) -> dict | None:
        if name in failed:
            return None
        try:
            return engines[name].run(task)
        except EngineFailed as error:
            failed[name] = {"error": str(error)}
            return None

    for name in engines:
        for task in warmup:
            run(name, task)
    names = list(engines)
    for round_ in range(rounds):
        for i, task in enumerate(tasks):
            turn = (round_ + i) % len(names)
            for name in names[turn:] + names[:turn]:
                started = time.perf_counter()
                out = run(name, task)
                if out is not None:
                    results[name][i]["runs"] += out["runs"]
                    print(
                        f"  round {round_ + 1}/{rounds}, task {i + 1}/{len(tasks)} "
                        f"({task['kind']}): {name} {time.perf_counter() - started:.1f} s",
                        flush=True,
                    )
    return {name: out for name, out in results.items() if name not in failed}
