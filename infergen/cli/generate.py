"""`infergen generate`: complete a prompt, streaming tokens to the terminal."""

from __future__ import annotations

import argparse
import sys
import time

from infergen.cli.common import add_sampling_args, load_llm, sampling_params
from infergen.engine.options import add_engine_args


def add_parser(sub) -> None:
    gen = sub.add_parser("generate", help="complete a prompt, streaming tokens to the terminal")
    gen.add_argument("prompt", help="the text to continue")
    add_engine_args(gen, "generate")
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    sys.stdout.write(args.prompt)
    tokens, seconds, reason = _stream_to_terminal(llm, args.prompt, params)
    print(
        f"[{tokens} tokens in {seconds:.2f} s, {tokens / max(seconds, 1e-9):.1f} tok/s, "
        f"finish: {reason}]",
        file=sys.stderr,
    )
    return 0


def _stream_to_terminal(llm, prompt, params) -> tuple[int, float, str | None]:
    """Print deltas as they come; returns (tokens, seconds, finish_reason)."""
    started = time.perf_counter()
    tokens, reason = 0, None
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
        tokens += len(delta.token_ids)
        reason = delta.finish_reason
    sys.stdout.write("\n")
    return tokens, time.perf_counter() - started, reason
