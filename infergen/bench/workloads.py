"""Workloads for `infergen bench serve`: what requests to send, in what order.

A workload is a registry row: a function (tokenizer, options, rng) → list of `BenchRequest`.
Prompts are cut from the real text in data/ (token windows, decoded back to text), so every
server sees the same text and counts its own tokens.

- random       prompt lengths uniform in [input_len·(1−spread), input_len·(1+spread)], answers
               likewise around output_len;
- long-context prompts of long_input_len tokens, short answers (short_output_len);
- agentic      sessions of `turns` turns: each turn resends the whole conversation so far
               (previous prompt + the server's answer + a new user message), so a server's
               prefix reuse matters; turns of one session run in order, sessions in parallel;
- replay       a JSONL trace, one request per line: {"prompt": str, "max_tokens": int} and
               optionally "session" (str) to chain turns as in agentic.
"""

from __future__ import annotations

import json
import pathlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from infergen.registry import Registry

DATA = pathlib.Path(__file__).resolve().parent.parent.parent / "data"


@dataclass
class BenchRequest:
    prompt: str
    max_tokens: int
    session: str | None = None  # agentic: turns of one session are sent in order
    follow_up: list[str] = field(default_factory=list)  # agentic: the next turns' user text


@dataclass(frozen=True)
class WorkloadOptions:
    num_requests: int = 64
    input_len: int = 128
    output_len: int = 64
    spread: float = 0.5
    long_input_len: int = 1024
    short_output_len: int = 16
    turns: int = 4
    trace: str | None = None


WorkloadFn = Callable[[object, WorkloadOptions, random.Random], list[BenchRequest]]
WORKLOADS: Registry[WorkloadFn] = Registry("workload")


class _Corpus:
    """Token windows of the data/ texts, decoded to text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens = []
        for name in ("shakespeare.txt", "python_docs.txt"):
            self.tokens += tokenizer.encode((DATA / name).read_text())

    def text(self, length: int, rng: random.Random) -> str:
        length = max(1, min(length, len(self.tokens) - 1))
        start = rng.randrange(0, len(self.tokens) - length)
        return self.tokenizer.decode(self.tokens[start : start + length])


def _around(center: int, spread: float, rng: random.Random) -> int:
    return max(1, round(center * rng.uniform(1 - spread, 1 + spread)))


@dataclass(frozen=True)
class Shape:
    """A workload's request (or agentic session) in tokens: what the performance model
    simulates and what `infergen bench` fills with text."""

    prompt_tokens: int
    max_tokens: int
    follow_up_tokens: tuple[int, ...] = ()  # agentic: new user tokens of each later turn
    session: str | None = None


ShapeFn = Callable[[WorkloadOptions, random.Random], list[Shape]]
SHAPES: Registry[ShapeFn] = Registry("workload")


@SHAPES.decorator("random")
def random_shapes(opts: WorkloadOptions, rng: random.Random) -> list[Shape]:
    return [
        Shape(_around(opts.input_len, opts.spread, rng), _around(opts.output_len, opts.spread, rng))
        for _ in range(opts.num_requests)
    ]


@SHAPES.decorator("long-context")
def long_context_shapes(opts: WorkloadOptions, rng: random.Random) -> list[Shape]:
    return [Shape(opts.long_input_len, opts.short_output_len) for _ in range(opts.num_requests)]


@SHAPES.decorator("agentic")
def agentic_shapes(opts: WorkloadOptions, rng: random.Random) -> list[Shape]:
    """num_requests counts turns: num_requests // turns sessions of `turns` turns."""
    sessions = max(1, opts.num_requests // opts.turns)
    follow_up = max(8, opts.input_len // 4)
    return [
        Shape(opts.input_len, opts.output_len, (follow_up,) * (opts.turns - 1), f"s{s}")
        for s in range(sessions)
    ]


def _text_workload(name: str) -> WorkloadFn:
    def make(tokenizer, opts: WorkloadOptions, rng: random.Random) -> list[BenchRequest]:
        corpus = _Corpus(tokenizer)
        return [
            BenchRequest(
                corpus.text(shape.prompt_tokens, rng),
                shape.max_tokens,
                session=shape.session,
                follow_up=[corpus.text(n, rng) for n in shape.follow_up_tokens],
            )
            for shape in SHAPES.get(name)(opts, rng)
        ]

    make.__doc__ = SHAPES.get(name).__doc__
    return make


for _name in list(SHAPES):
    WORKLOADS.register(_name, _text_workload(_name))


@WORKLOADS.decorator("replay")
def replay(tokenizer, opts: WorkloadOptions, rng: random.Random) -> list[BenchRequest]:
    if not opts.trace:
        raise ValueError("workload replay needs --trace FILE.jsonl")
    requests, sessions = [], {}
    for number, line in enumerate(pathlib.Path(opts.trace).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, max_tokens = str(row["prompt"]), int(row["max_tokens"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{opts.trace}:{number}: expected a JSON object with 'prompt' (string) and "
                f"'max_tokens' (integer): {exc}"
            ) from None
        session = row.get("session")
        if session is not None and session in sessions:
            sessions[session].follow_up.append(prompt)
            continue
        request = BenchRequest(prompt, max_tokens, session=session)
        if session is not None:
            sessions[session] = request
        requests.append(request)
    return requests


def shapes(name: str, opts: WorkloadOptions, rng: random.Random, count_tokens) -> list[Shape]:
    """Any workload as token shapes; a trace's prompts are counted with `count_tokens`."""
    if name in SHAPES:
        return SHAPES.get(name, where="--workload")(opts, rng)
    requests = WORKLOADS.get(name, where="--workload")(None, opts, rng)
    return [shape_of(r, count_tokens) for r in requests]


def shape_of(request: BenchRequest, count_tokens) -> Shape:
    """A text request in tokens; each later turn also carries the client's "\n\n" joint."""
    return Shape(
        count_tokens(request.prompt),
        request.max_tokens,
        tuple(count_tokens(text) + 1 for text in request.follow_up),
        request.session,
    )


def add_workload_args(parser, num_requests: int) -> None:
    """The workload options `infergen bench serve` and `infergen predict` share."""
    parser.add_argument("--workload", default="random", help=f"{' | '.join(WORKLOADS.names())}")
    parser.add_argument(
        "--num-requests", type=int, default=num_requests, help="requests (agentic: turns)"
    )
    parser.add_argument(
        "--input-len", type=int, default=128, help="prompt tokens (random, agentic)"
    )
    parser.add_argument(
        "--output-len", type=int, default=64, help="answer tokens (random, agentic)"
    )
    parser.add_argument(
        "--long-input-len", type=int, default=1024, help="long-context prompt tokens"
    )
    parser.add_argument(
        "--short-output-len", type=int, default=16, help="long-context answer tokens"
    )
    parser.add_argument("--turns", type=int, default=4, help="agentic: turns per session")
    parser.add_argument(
        "--trace", default=None, help="replay: JSONL of {prompt, max_tokens[, session]}"
    )


def workload_options(args) -> WorkloadOptions:
    return WorkloadOptions(
        num_requests=args.num_requests,
        input_len=args.input_len,
        output_len=args.output_len,
        long_input_len=args.long_input_len,
        short_output_len=args.short_output_len,
        turns=args.turns,
        trace=args.trace,
    )
