"""`infergen`: the parser (one sub-command module after another, in COMMANDS) and main().

Each command module has `add_parser(subparsers)`, which registers its sub-command(s) with
`set_defaults(func=...)`. Errors caused by input (bad model path, bad option values) print one
message and exit with code 2; `--debug` shows the traceback too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from infergen.cli import (
    bench,
    chat,
    formats,
    generate,
    info,
    perf,
    predict,
    profile,
    quantize,
    serve,
)
from infergen.cli import compile as compile_command
from infergen.cli import eval as eval_command
from infergen.cli.common import EXIT_USER_ERROR, torchrun_rank
from infergen.errors import InfergenError

# in the order `infergen --help` lists them
COMMANDS = (
    generate,
    chat,
    info,
    formats,
    eval_command,
    quantize,
    serve,
    perf,
    predict,
    compile_command,
    bench,
    profile,
)

EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infergen",
        description="infergen: an LLM inference engine. Runs GGUF and Hugging Face checkpoints "
        "with a paged KV cache, continuous batching and prefix caching.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = torchrun_rank(args)  # (a rank > 0 that torchrun started serves rank 0)
        return func(args) if code is None else code
    except InfergenError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
