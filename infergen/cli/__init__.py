"""The `infergen` command line: main.py builds the parser from one module per command (generate,
chat, info, formats, eval, quantize, serve, perf, predict, compile, bench); common.py holds
what they share."""

from infergen.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
