"""The conversation workload of bench_kv_tiers.py and the closed loop that runs it in process.

Shape. `infergen bench serve --workload agentic` sends sessions whose every turn resends the
whole conversation so far; its closed loop (`--concurrency N`) gives each of N workers one
session at a time and sends a session's next turn the moment its answer is in: there is no
think or tool time, so with N sessions in flight each one's context is always the most recently
used and stays in the pool. A real agent spends seconds in a tool between two turns while other
sessions keep the server busy; that gap is what pushes its context out of the pool. This
benchmark keeps bench serve's closed loop and adds the gap:

- `sessions` sessions, all open from the start, each of `turns` turns: turn 1 is a system
  prompt shared by every session (`system` tokens) + a tool output (`tool` tokens); turn k+1
  resends turn k's prompt + the model's answer (greedy, EOS ignored) + a new tool output.
  Every window is cut from data/ text (token ids). Answers are `answer` - `answer_spread`,
  `answer` or `answer` + `answer_spread` tokens long, by session (0, 1, 2, 0, ...): with one
  length for all, the turns in flight decoded in lockstep, so the next ones were submitted in
  the same step and prefilled together, every time, or never — whichever way an early
  background tier load happened to set the phase; the TTFTs of the engine and of the
  performance model's simulation of it followed that accident.
- `concurrency` turns are in flight at once (closed loop). A session whose answer came back
  runs its tool and queues for its next turn behind the sessions already waiting (first in,
  first out); a finished turn lets the queue's head in. So the first turns are staggered
  (sessions `concurrency`.. start as earlier turns end), and between two of its turns a session
  waits for about `sessions / concurrency` other turns: its tool time.
- The pool holds `pool_share` (25 %) of the working set (every session's final context, in
  blocks of 16), at least the longest request + 1 block: about `concurrency` sessions' contexts,
  the ones in flight; the waiting sessions' contexts are what the tiers hold (or what is
  recomputed without them).

Per request: TTFT (submission to the step that returns its first token), where those seconds
went (the engine steps in between: scheduling — tier loads and write-back copies happen there
—, the forward, the rest — sampling, write-through copies; and the time outside steps), its
answer, the prompt tokens served from cache, and the reusable ones (full blocks an earlier
request computed: the session's previous prompt + answer, or for a first turn the system prompt
once any turn has finished).
"""

from __future__ import annotations

import pathlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = 16  # tokens per KV block (the engine's default)


@dataclass(frozen=True)
class Sizes:
    sessions: int = 8
    concurrency: int = 2  # turns in flight (closed loop)
    turns: int = 12
    system: int = 200
    tool: int = 100
    answer: int = 16  # answer tokens: this, less or more answer_spread by session (answer_of)
    answer_spread: int = 4
    random_prompt: int = 200  # control: prompt tokens of each unrelated request
    control_requests: int = 32  # control: unrelated requests per run
    control_rounds: int = 5  # control: alternations of no tiers / host (median: noise)
    pool_share: float = 0.25
    # every session's turn k submitted together once turn k-1 has finished, concurrency =
    # sessions (the previous shape; what the perf model's predicted_tier_gain simulates)
    lockstep: bool = False

    def answer_of(self, session: int) -> int:
        """Answer tokens of every turn of `session`: 12, 16, 20, 12, ... at the defaults."""
        return self.answer + self.answer_spread * (session % 3 - 1)

    @property
    def answers(self) -> list[int]:
        return [self.answer_of(s) for s in range(self.sessions)]


FULL = Sizes()
QUICK = Sizes(sessions=4, concurrency=1, turns=3, system=48, tool=24, answer=4, answer_spread=1,
              random_prompt=48, control_requests=6, control_rounds=2)  # fmt: skip
WARMUP = list(range(1000, 1040))  # unrelated token ids: every engine's first request


class Corpus:
    """Distinct token windows of data/ (never reused: every cut starts past the last one);
    ids folded into `vocab` for a model without the tokenizer's vocabulary."""

    def __init__(self, tokens: list[int], vocab: int | None = None):
        self.tokens = [t % vocab for t in tokens] if vocab else tokens
        self.at = 0

    @classmethod
    def of(cls, encode: Callable[[str], list[int]], vocab: int | None = None) -> Corpus:
        tokens: list[int] = []
        for name in ("python_docs.txt", "shakespeare.txt"):
            tokens += encode((ROOT / "data" / name).read_text())
        return cls(tokens, vocab)

    def take(self, length: int) -> list[int]:
        if self.at + length > len(self.tokens):
            raise SystemExit(f"data/ text too short for another {length}-token window")
        window = self.tokens[self.at : self.at + length]
        self.at += length + 7
        return window


def make_workload(corpus: Corpus, sizes: Sizes) -> dict:
    """The system prompt, every session's tool outputs (turns + 1: the last one resumes after
    the restart), the control's prompt sets (one per round: both configurations' engines get
    the same prompts, each engine new ones every round)."""
    return {
        "system": corpus.take(sizes.system),
        "tools": [
            [corpus.take(sizes.tool) for _ in range(sizes.turns + 1)] for _ in range(sizes.sessions)
        ],  # fmt: skip
        "random": [
            [corpus.take(sizes.random_prompt) for _ in range(sizes.control_requests)]
            for _ in range(sizes.control_rounds)
        ],  # fmt: skip
        "warmup": WARMUP,
    }


def final_context(sizes: Sizes, session: int) -> int:
    """Tokens of `session` after its last turn's answer."""
    return sizes.system + sizes.turns * (sizes.tool + sizes.answer_of(session))


def longest_request(sizes: Sizes) -> int:
    """Tokens of the longest request (a session's turn after the restart, with its answer)."""
    return max(
        final_context(sizes, s) + sizes.tool + sizes.answer_of(s) for s in range(sizes.sessions)
    )


def working_set_blocks(sizes: Sizes, blocks_for_tokens: Callable[[int], int]) -> tuple[int, int]:
    """(pool blocks of every session's final context summed, of the longest request);
    `blocks_for_tokens`: the pool blocks one sequence of that many tokens holds (over the
    model's cache groups: a windowed group only its window)."""
    finals = [blocks_for_tokens(final_context(sizes, s)) for s in range(sizes.sessions)]
    return sum(finals), blocks_for_tokens(longest_request(sizes))


class Conversations:
    """Every session's conversation as the closed loop advances it: the next prompt, and per
    finished turn its reusable prompt tokens."""

    def __init__(self, work: dict, sizes: Sizes, turns: int | None = None, resume=None):
        self.sizes, self.tools = sizes, work["tools"]
        self.turns = sizes.turns if turns is None else turns
        if resume is None:
            self.conv = [work["system"] + tools[0] for tools in self.tools]
            self.turn = [0] * sizes.sessions
            self.computed = [0] * sizes.sessions  # tokens an earlier turn computed (KV)
        else:  # (after the restart: the turn past the last, every context computed before)
            self.conv = [list(c) for c in resume["conv"]]
            self.turn = [sizes.turns] * sizes.sessions
            self.computed = list(resume["computed"])
        self.system = len(work["system"])
        self.any_done = resume is not None

    def prompt(self, s: int) -> list[int]:
        return self.conv[s]

    def answer(self, s: int) -> int:
        return self.sizes.answer_of(s)

    def reusable(self, s: int) -> int:
        """Full blocks of the prompt of `s` an earlier request computed (as it is submitted)."""
        done = self.computed[s] or (self.system if self.any_done else 0)
        return min(done, len(self.conv[s]) - 1) // BLOCK * BLOCK

    def finish(self, s: int, answer: list[int]) -> bool:
        """Record the answer of `s`'s turn; whether the session has another turn."""
        self.any_done = True
        k = self.turn[s]
        self.computed[s] = len(self.conv[s]) + len(answer) - 1
        self.turn[s] += 1
        if self.turn[s] <= self.sizes.turns:  # (the resume turn's tool output is the last)
            self.conv[s] = self.conv[s] + answer + self.tools[s][k + 1]
        return self.turn[s] < self.turns

    def state(self) -> dict:
        return {"conv": [list(c) for c in self.conv], "computed": list(self.computed)}


class Unrelated:
    """Unrelated prompts (the control) as one-turn sessions of the closed loop."""

    system = 0  # (no shared prompt)

    def __init__(self, prompts: list[list[int]], answer: int):
        self.conv, self.turn, self.answer_tokens = prompts, [0] * len(prompts), answer

    def prompt(self, s: int) -> list[int]:
        return self.conv[s]

    def answer(self, s: int) -> int:
        return self.answer_tokens

    def reusable(self, s: int) -> int:
        return 0

    def finish(self, s: int, answer: list[int]) -> bool:
        return False


def run_closed_loop(
    engine, sessions, concurrency: int, params, lockstep: bool = False
) -> tuple[list[dict], dict]:
    """Run every session's turns (`sessions`: Conversations or Unrelated; `params` with each
    session's answer length), `concurrency` in flight, a session re-queued (behind those
    waiting) when its answer is in (`lockstep`: the queue let in only once nothing is in
    flight: every session's next turn together). Per
    request: session, turn, TTFT and its breakdown, answer, cached and reusable prompt tokens
    and the blocks its reusable part needs (over the cache groups); and the engine's seconds
    over all steps (schedule, forward, after) and their number. (Which request a tier's block
    was loaded for is not told: a load may run in the background while other sequences step,
    its sequence admitted at a later step; the runs count the tiers' loads as a whole.)"""
    loop = ClosedLoop(engine, sessions, concurrency, params, lockstep)
    while not loop.done:
        loop.step()
    return loop.result()


class ClosedLoop:
    """run_closed_loop one engine step at a time (`step` until `done`, then `result`), so
    that two loops can take turns (interleave.step_by_progress). `seconds`: the loop's own
    time (its submissions and steps); `progress`: the share of its sessions' turns finished."""

    def __init__(self, engine, sessions, concurrency: int, params, lockstep: bool = False):
        self.engine, self.sessions, self.params = engine, sessions, params
        self.concurrency, self.lockstep = concurrency, lockstep
        self.steps: list = []
        engine.on_step = self.steps.append
        self.groups = engine.scheduler.groups
        self.ready = deque(range(len(sessions.conv)))
        # requests it will make: each session's turns from its current one (Unrelated: one)
        self.turns = sum(getattr(sessions, "turns", 1) - t for t in sessions.turn)
        self.records: dict[str, dict] = {}
        self.flight: set[str] = set()
        self.finished, self.seconds = 0, 0.0

    @property
    def done(self) -> bool:
        return not (self.ready or self.flight)

    @property
    def progress(self) -> float:
        return self.finished / self.turns

    def step(self) -> None:
        start = time.perf_counter()
        if not (self.lockstep and self.flight):  # (lockstep: the next round once this is over)
            while self.ready and len(self.flight) < self.concurrency:
                rid, r = _submit(self.engine, self.sessions, self.ready.popleft(), self.params,
                                 self.groups)  # fmt: skip
                self.records[rid] = r
                self.flight.add(rid)
        deltas = self.engine.step()
        now = time.perf_counter()
        for d in deltas:
            r = self.records[d.request_id]
            if d.token_ids and "first" not in r:
                r["first"] = now
            if d.finished:
                self.flight.discard(d.request_id)
                self.finished += 1
                result = self.engine.output(d.request_id)
                self.engine.release(d.request_id)
                r["answer"] = list(result.token_ids)
                r["cached"] = result.num_cached_prompt_tokens
                if self.sessions.finish(r["session"], r["answer"]):
                    self.ready.append(r["session"])
        self.seconds += time.perf_counter() - start

    def result(self) -> tuple[list[dict], dict]:
        self.engine.on_step = None
        out = list(self.records.values())
        for r in out:
            r.update(ttft_breakdown(self.steps, r.pop("submitted"), r.pop("first")))
        totals = {k: sum(getattr(s, k) for s in self.steps)
                  for k in ("schedule_s", "forward_s", "after_s")}  # fmt: skip
        return out, {**totals, "steps": len(self.steps)}


def _submit(engine, sessions, s: int, params, groups) -> tuple[str, dict]:
    prompt, reusable = sessions.prompt(s), sessions.reusable(s)
    r = {"session": s, "turn": sessions.turn[s], "prompt_tokens": len(prompt),
         "reusable": reusable, "needed_blocks": blocks_needed(groups, reusable // BLOCK),
         "shared": min(sessions.system // BLOCK * BLOCK, reusable),  # the system prompt's
         "submitted": time.perf_counter()}  # fmt: skip
    return engine.add_request(prompt, replace(params, max_tokens=sessions.answer(s))), r


def ttft_breakdown(steps: list, submitted: float, first: float) -> dict:
    """TTFT and the seconds of the steps run while the request waited for its first token:
    scheduling, forward, after (the rest of each step); outside: between steps."""
    inside = [s for s in steps if submitted <= s.start < first]
    parts = {
        "schedule_s": sum(s.schedule_s for s in inside),
        "forward_s": sum(s.forward_s for s in inside),
        "after_s": sum(s.after_s for s in inside),
    }
    ttft = first - submitted
    return {"ttft_s": ttft, "steps": len(inside), **parts, "outside_s": ttft - sum(parts.values())}


def blocks_needed(groups, n: int) -> int:
    """Blocks a prefix hit of n blocks needs over the engine's cache groups (a windowed group:
    its sink blocks and the blocks its window still reads)."""
    total = 0
    for group in groups:
        if group.window is None:
            total += n
        else:
            first = group.first_needed_block(n * BLOCK, BLOCK)
            total += min(group.sink_blocks(BLOCK), first) + n - first
    return total
