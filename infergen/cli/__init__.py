"""The `infergen` command line: one module per command family (main: generate, chat, serve,
info, eval, quantize, formats, bench, perf; compile; predict)."""

from infergen.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
