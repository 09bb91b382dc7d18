"""What several commands share: the exit code of a user error, the sampling flags and their
SamplingParams, loading the LLM of a command's engine options, a positive-integer flag type."""

from __future__ import annotations

import argparse
import os
import sys
import time

EXIT_USER_ERROR = 2  # an error caused by input (bad model path, bad option values)


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (128)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); e.g. 0.7 to sample"
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k best tokens (0 = off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="min-p filter (0 = off)")
    parser.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="CTRL-style penalty (1.0 = off)"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (reproducible)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_params(args: argparse.Namespace):
    """The SamplingParams of add_sampling_args' flags."""
    from infergen.engine.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )


def load_llm(args: argparse.Namespace):
    """The LLM of a command's engine options (engine/options.py: the command's flags)."""
    from infergen.engine.options import options_from_args
    from infergen.llm import LLM

    started = time.perf_counter()
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    llm = LLM(**options_from_args(args, args.command), progress=sys.stderr.isatty())
    cache = llm.engine.kv_cache
    print(
        f"loaded in {time.perf_counter() - started:.1f} s; KV cache holds "
        f"{llm.engine.kv_capacity_tokens} tokens in {cache.nbytes / 2**20:.0f} MiB "
        f"({cache.kv_format or str(cache.dtype).removeprefix('torch.')})",
        file=sys.stderr,
        flush=True,
    )
    return llm


def torchrun_rank(args: argparse.Namespace) -> int | None:
    """Under torchrun (engine/workers.py): a command that runs requests takes torchrun's world
    as its tensor-parallel size; on a rank > 0 this process serves rank 0 instead of running
    the command, and its exit status is returned (None: run the command here)."""
    if "WORLD_SIZE" not in os.environ:  # (not torchrun's: nothing to import)
        return None
    from infergen.engine import workers
    from infergen.engine.options import RUN, engine_config, options_from_args

    found = workers.launched()
    if found is None or args.command not in RUN:
        return None
    args.tensor_parallel_size = workers.launched_size(args.tensor_parallel_size)
    if found[0] == 0:
        return None
    print(f"rank {found[0]} of {found[1]} (torchrun): serving rank 0", file=sys.stderr,
          flush=True)  # fmt: skip
    return workers.serve_rank(engine_config(**options_from_args(args, args.command)))


def positive_count(text: str) -> int:
    """argparse type: an integer > 0."""
    return _count(text, 1, "a positive integer")


def non_negative_count(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _count(text, 0, "an integer >= 0")


def _count(text: str, least: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value
