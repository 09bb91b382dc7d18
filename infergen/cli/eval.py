"""`infergen eval`: accuracy of weight schemes and KV formats against the unquantized model
(perplexity, KL, top-1 agreement, passkey retrieval), as a table, JSON, or a matrix (PREFIX.md +
PREFIX.png)."""

from __future__ import annotations

import argparse
import sys

from infergen.cli.common import positive_count
from infergen.engine.options import add_engine_args
from infergen.errors import ConfigError


def add_parser(sub) -> None:
    ev = sub.add_parser(
        "eval",
        help="accuracy of weight schemes and KV formats against the unquantized model "
        "(ppl, KL, top-1, passkey)",
        description="Scores held-out text (the end of data/shakespeare.txt) teacher-forced "
        "with the unquantized model and with each --weights scheme / --kv-format: perplexity, "
        "mean KL divergence of the next-token distributions (nats per token) and top-1 "
        "agreement; --task passkey retrieves a key hidden in 1k-7k tokens of filler; --task "
        "longctx scores long-context tasks (passkey with the question after or before the "
        "text, four keys, a two-hop variable chain) with the full KV cache and under each "
        "--kv-press.",
    )
    add_engine_args(ev, "eval")
    ev.add_argument(
        "--weights",
        action="append",
        default=None,
        help="a quantization config to score (repeatable): a weight scheme, or "
        "WEIGHTS[/ACTIVATIONS][+OPTION...] with options awq, smoothquant, max, percentile, mse, "
        "e.g. 'int4+awq', 'fp8_e4m3/fp8_e4m3', 'int8/int8_static+smoothquant' (default: every "
        "weight scheme and infergen.quant.spec.MATRIX_SPECS)",
    )
    ev.add_argument(
        "--kv-format",
        action="append",
        default=None,
        help="a KV cache format to score over the unquantized weights (repeatable; default: "
        "every format in infergen.kvcache; none when --weights is given)",
    )
    ev.add_argument(
        "--task",
        choices=("ppl", "kl", "passkey", "all", "longctx"),
        default="kl",
        help="ppl / kl: perplexity, KL and top-1 from one teacher-forced pass (the default); "
        "passkey: retrieval of a key hidden in long filler; all: both; longctx: the "
        "long-context tasks under KV presses (--kv-press)",
    )
    ev.add_argument(
        "--kv-press",
        action="append",
        default=None,
        metavar="NAME:RATIO",
        help="with --task longctx: a KV press and the share of each prompt's tokens it "
        "removes, e.g. snapkv:0.5 (repeatable; default: every press at 0.25, 0.5 and 0.75)",
    )
    ev.add_argument(
        "--longctx-tasks",
        default=None,
        metavar="NAME,NAME",
        help="with --task longctx: which tasks (default: passkey,passkey_first,multikey,chain)",
    )
    ev.add_argument(
        "--longctx-lengths",
        type=_lengths,
        default=None,
        metavar="N,N,...",
        help="with --task longctx: prompt lengths in tokens (default 1024,2048,4096)",
    )
    ev.add_argument(
        "--matrix",
        metavar="PREFIX",
        nargs="?",
        const="eval-matrix",
        default=None,
        help="also write PREFIX.md (the table) and PREFIX.png (KL against bits per weight / KV "
        "bytes per token) for the configurations scored (every weight scheme and KV format "
        "unless --weights / --kv-format name some); PREFIX defaults to eval-matrix",
    )
    ev.add_argument(
        "--passkey-lengths",
        type=_lengths,
        default=None,
        metavar="N,N,...",
        help="passkey prompt lengths in tokens (default 1024,2048,4096,7168)",
    )
    ev.add_argument(
        "--passkey-samples",
        type=positive_count,
        default=3,
        help="keys per length (3; --task longctx: samples per task and length)",
    )
    ev.add_argument("--tokens", type=int, default=1024, help="tokens of text scored (1024)")
    ev.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON")
    ev.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    if args.task == "longctx":
        return _longctx(args)

    from infergen.eval.quality import evaluate
    from infergen.kvcache.kv_format import KV_FORMATS
    from infergen.quant import WEIGHT_SCHEMES
    from infergen.quant.spec import MATRIX_SPECS, parse_spec

    applicable = [  # every weight scheme that applies to this checkpoint
        name
        for name in WEIGHT_SCHEMES.names()
        if not WEIGHT_SCHEMES.get(name).keep_blocks or _is_gguf(args.model)
    ]
    schemes = args.weights or [*applicable, *MATRIX_SPECS]
    for name in schemes:
        parse_spec(name)  # a clear error before any loading
    kv_formats = args.kv_format
    if kv_formats is None:  # every format, unless only weight schemes were asked for
        kv_formats = [] if args.weights else KV_FORMATS.names()
    for name in kv_formats:
        KV_FORMATS.get(name, where="--kv-format")
    if args.tokens < 2:
        raise ConfigError(
            "too few tokens to score", where="--tokens", found=args.tokens, expected=">= 2"
        )
    tasks = {"all": ("ppl", "kl", "passkey"), "passkey": ("passkey",)}.get(args.task, ("ppl", "kl"))
    names = ["none", *schemes, *[f"kv {k}" for k in kv_formats]]
    print(f"{', '.join(tasks)} for: {', '.join(names)}", file=sys.stderr)
    done = iter(range(1, len(names) + 1))
    rows = evaluate(
        args.model,
        schemes,
        args.tokens,
        kv_formats=kv_formats,
        tasks=tasks,
        passkey_lengths=args.passkey_lengths,
        passkey_samples=args.passkey_samples,
        progress=lambda name: print(f"[{next(done)}/{len(names)}] {name}", file=sys.stderr),
        num_threads=args.num_threads,
    )
    from infergen.eval.matrix import markdown, plot

    return _write(args, rows, markdown(rows), plot if "kl" in tasks else None)


def _write(args: argparse.Namespace, rows: list[dict], table: str, plot) -> int:
    """Print the table; with --matrix PREFIX also PREFIX.md and (`plot`) PREFIX.png; with
    --json FILE the rows."""
    import json

    print(table)
    if args.matrix:
        with open(f"{args.matrix}.md", "w") as f:
            f.write(table + "\n")
        print(f"wrote {args.matrix}.md")
        if plot is not None:
            plot(rows, f"{args.matrix}.png")
            print(f"wrote {args.matrix}.png")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _longctx(args: argparse.Namespace) -> int:
    """--task longctx: the full cache and each --kv-press on the long-context tasks."""

    from infergen.eval import press_report
    from infergen.eval.longctx import TASKS
    from infergen.kvcache.presses import PRESSES

    try:
        presses = [press_report.parse_press(p) for p in args.kv_press or []]
    except ValueError as exc:
        raise ConfigError(str(exc), where="--kv-press") from None
    presses = presses or [(n, r) for n in PRESSES.names() for r in press_report.RATIOS]
    for name, ratio in presses:
        PRESSES.get(name, where="--kv-press")
        if not 0 <= ratio < 1:
            raise ConfigError("a press's ratio is the share of tokens it removes",
                              where="--kv-press", found=ratio, expected="in [0, 1)")  # fmt: skip
    tasks = args.longctx_tasks.split(",") if args.longctx_tasks else TASKS.names()
    for name in tasks:
        TASKS.get(name, where="--longctx-tasks")
    lengths = args.longctx_lengths or [1024, 2048, 4096]
    labels = ["full", *(f"{n}:{r:g}" for n, r in presses)]
    print(f"{', '.join(tasks)} at {lengths} tokens for: {', '.join(labels)}", file=sys.stderr)
    done = iter(range(1, len(labels) + 1))
    rows = press_report.press_rows(
        args.model, presses, tasks, lengths, args.passkey_samples,
        progress=lambda name: print(f"[{next(done)}/{len(labels)}] {name}", file=sys.stderr),
        num_threads=args.num_threads,
    )  # fmt: skip
    return _write(args, rows, press_report.markdown(rows), press_report.plot)


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 64:
        raise argparse.ArgumentTypeError(f"expected prompt lengths like 1024,4096; got {text!r}")
    return values


def _is_gguf(model: str | None) -> bool:
    from infergen.io.checkpoint import load_checkpoint

    return load_checkpoint(model, load_weights=False).format == "gguf"
