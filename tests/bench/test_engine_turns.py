"""benchmarks/engine_turns.py: engines take turns task by task (the order rotating), a runner
process in serve mode answers task by task over real pipes, one that dies leaves the others
running; generate_lines.paired gives run-by-run ratios only where the runs pair up."""

from __future__ import annotations

import pathlib
import sys
import textwrap

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "peers"))

from engine_turns import EngineFailed, InProcess, PeerProcess, run_in_turns  # noqa: E402
from generate_lines import paired  # noqa: E402


class Recorder:
    """A runner (protocol.py's three methods) that logs who ran what, in one shared log."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def run_decode(self, prompt, max_tokens):
        self.log.append((self.name, "decode", tuple(prompt)))
        return {"ttft_s": 0.1, "decode_s": 1.0, "tokens": list(prompt)[:max_tokens]}

    def run_prefill(self, prompt):
        self.log.append((self.name, "prefill", tuple(prompt)))
        return {"seconds": 0.5, "tokens": len(prompt)}

    def run_concurrent(self, prompts, max_tokens):
        self.log.append((self.name, "concurrent", len(prompts)))
        return {"seconds": 1.0, "output_tokens": len(prompts) * max_tokens, "outputs": []}


TASKS = [
    {"kind": "decode", "prompt": [1, 2, 3], "max_tokens": 2},
    {"kind": "prefill", "prompts": [[4, 5], [6, 7, 8]]},
    {"kind": "concurrent", "prompts": [[1], [2]], "max_tokens": 3, "repeats": 2},
]


def test_every_task_runs_on_every_engine_in_turn_the_order_rotating():
    log: list = []
    engines = {n: InProcess(Recorder(n, log), retries=0) for n in ("a", "b", "c")}
    warmup = [{"kind": "decode", "prompt": [9], "max_tokens": 1}]
    results = run_in_turns(engines, warmup, TASKS, rounds=2, failed={})
    assert [entry[0] for entry in log[:3]] == ["a", "b", "c"]  # warm-up, then the turns
    turns = log[3:]
    # task by task: every engine's runs of a task before the next task starts
    expected_order = []
    for round_ in range(2):
        for i, task in enumerate(TASKS):
            names = ["a", "b", "c"]
            k = (round_ + i) % 3
            runs = len(task["prompts"]) if task["kind"] == "prefill" else task.get("repeats", 1)
            for name in names[k:] + names[:k]:
                expected_order += [name] * runs
    assert [entry[0] for entry in turns] == expected_order
    # each engine: one result per task, the runs of both rounds in order
    for name in engines:
        assert [r["kind"] for r in results[name]] == ["decode", "prefill", "concurrent"]
        assert [len(r["runs"]) for r in results[name]] == [2, 4, 4]
        assert [run["tokens"] for run in results[name][1]["runs"]] == [2, 3, 2, 3]


RUNNER = """
import sys
sys.path.insert(0, {peers!r})
from protocol import read_args, serve

class Runner:
    def __init__(self, scale):
        self.scale = scale
    def run_decode(self, prompt, max_tokens):
        return {{"ttft_s": 0.0, "decode_s": 1.0, "tokens": [t * self.scale for t in prompt]}}
    def run_prefill(self, prompt):
        if prompt == [666]:
            sys.exit(3)  # (a runner that dies mid-run)
        print("a library's chatter on stdout")
        return {{"seconds": 1.0, "tokens": len(prompt)}}
    def run_concurrent(self, prompts, max_tokens):
        return {{"seconds": 1.0, "output_tokens": 0, "outputs": []}}

args = read_args()
serve(Runner(args["scale"]), int(args.get("retries", 0)), version="test-1")
"""


@pytest.fixture
def runner_script(tmp_path) -> str:
    """A runner script in serve mode (an absolute path: PeerProcess takes it as it is)."""
    script = tmp_path / "runner.py"
    script.write_text(textwrap.dedent(RUNNER.format(peers=str(BENCH / "peers"))))
    return str(script)


def test_a_runner_process_answers_task_by_task(runner_script):
    peer = PeerProcess(sys.executable, runner_script, "turns_test", {"scale": 10})
    try:
        assert peer.info["ready"] and peer.info["version"] == "test-1"
        first = peer.run({"kind": "decode", "prompt": [1, 2], "max_tokens": 2})
        assert first["kind"] == "decode" and first["runs"][0]["tokens"] == [10, 20]
        second = peer.run({"kind": "prefill", "prompts": [[1, 2, 3]]})  # (past the chatter)
        assert second["runs"][0]["tokens"] == 3
    finally:
        peer.close()
    assert peer.proc.returncode == 0  # (its input closed: serve mode ended)


def test_a_runner_that_dies_leaves_the_others_running(runner_script):
    log: list = []
    peer = PeerProcess(sys.executable, runner_script, "turns_test", {"scale": 1})
    engines = {"ours": InProcess(Recorder("ours", log), retries=0), "peer": peer}
    tasks = [
        {"kind": "decode", "prompt": [1], "max_tokens": 1},
        {"kind": "prefill", "prompts": [[666]]},
        {"kind": "decode", "prompt": [2], "max_tokens": 1},
    ]
    failed: dict = {}
    try:
        results = run_in_turns(engines, [], tasks, rounds=1, failed=failed)
        with pytest.raises(EngineFailed):
            peer.run(tasks[0])
    finally:
        peer.close()
    assert set(results) == {"ours"}
    assert "exited (3)" in failed["peer"]["error"]
    assert [len(r["runs"]) for r in results["ours"]] == [1, 1, 1]


def test_paired_ratios_where_runs_pair_up():
    ours = {"unit": "tok/s", "runs": [60.0, 80.0, 70.0]}
    theirs = {"unit": "tok/s", "runs": [50.0, 40.0, 70.0]}
    pair = paired(ours, theirs)
    assert pair["paired_runs"] == [60 / 50, 80 / 40, 70 / 70]
    assert pair["paired_median"] == 60 / 50
    seconds = paired({"unit": "s", "runs": [0.1, 0.2]}, {"unit": "s", "runs": [0.3, 0.3]})
    assert seconds["paired_runs"] == [0.3 / 0.1, 0.3 / 0.2]  # (peer / ours: >1 ours faster)
    assert paired(ours, {"unit": "tok/s", "runs": [1.0]}) == {}  # (no pairs: nothing)
