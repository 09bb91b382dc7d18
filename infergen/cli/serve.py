"""`infergen serve`: the OpenAI-compatible HTTP server (server/api.py) under uvicorn, over one
engine loaded off the main thread."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infergen.cli.common import load_llm
from infergen.config import parse_bytes
from infergen.engine.options import add_engine_args
from infergen.errors import ConfigError
from infergen.server.limits import Limits


def add_parser(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models)",
        description="Serve the model over the OpenAI API with FastAPI + uvicorn. All concurrent "
        "requests share one engine loop (continuous batching); streaming uses server-sent "
        "events as the OpenAI API does.",
    )
    add_engine_args(serve, "serve")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (8000)")
    serve.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on the /v1 routes; repeat for several keys",
    )
    serve.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="API keys, one per line (blank lines and # comments skipped), besides --api-key",
    )
    serve.add_argument(
        "--protect-monitoring",
        action="store_true",
        help="/metrics and /health need an API key too (default: open, for probes)",
    )
    serve.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: file name)"
    )
    serve.add_argument(
        "--max-pending",
        type=int,
        default=Limits.max_pending,
        help="requests in flight before 503 (%(default)s)",
    )
    serve.add_argument(
        "--max-tokens-limit",
        type=int,
        default=Limits.max_tokens,
        metavar="N",
        help="most tokens one choice may generate: a request asking more is a 400, one that "
        "leaves max_tokens unset gets this (or what the context leaves) (%(default)s)",
    )
    serve.add_argument(
        "--max-body-size",
        default="4MiB",
        metavar="BYTES",
        help="largest request body; a larger one is a 413 (4MiB)",
    )
    serve.add_argument(
        "--max-queue-time",
        type=float,
        default=Limits.max_queue_time,
        metavar="SECONDS",
        help="admission by cost: a request that would wait longer than this before it starts "
        "(every request ahead of it generating its max_tokens, or the recent requests' typical "
        "length where it may stop sooner, at the measured step time) gets a 503 with "
        "Retry-After instead of queueing; 0 turns shedding off (%(default)s)",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop a request still unfinished this long after it arrived: it answers what it "
        'generated, finish_reason "timeout"; a request\'s own `timeout` field may ask for '
        "less (default: none)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM / SIGINT: stop admitting requests, let those in flight finish for at "
        "most this long, then abort the rest (503, or an error event in a stream) and exit; a "
        "second signal exits at once (30)",
    )
    serve.add_argument(
        "--step-trace",
        default=None,
        metavar="FILE",
        help="append one JSON line per engine step to FILE: start, scheduling / forward / "
        "sampling seconds, and the batch as (new tokens, context) per sequence",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from infergen.process import in_transient_thread
    from infergen.server.api import create_app
    from infergen.server.lifecycle import DrainingServer

    checked = limits(args)  # before the (long) load
    # load off the main thread: the engine thread must be the only one with an OpenMP pool
    llm = in_transient_thread(load_llm, args)
    if args.step_trace:
        from infergen.engine.step_trace import StepTraceWriter

        llm.engine.on_step = StepTraceWriter(args.step_trace)
    name = args.served_model_name or served_model_name(args.model)
    app = create_app(
        llm,
        name,
        api_key=api_keys(args.api_key, args.api_key_file),
        limits=checked,
        protect_monitoring=args.protect_monitoring,
    )
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    server = DrainingServer(config, app.state.engine, args.shutdown_timeout)
    server.run()
    return server.exit_code  # (1: the engine stopped, e.g. a tensor-parallel worker died)


def limits(args: argparse.Namespace) -> Limits:
    """The server's limits from the flags (checked: a bad value is a ConfigError naming it)."""
    for flag, value in (("--max-pending", args.max_pending),
                        ("--max-tokens-limit", args.max_tokens_limit)):  # fmt: skip
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1", where=flag, found=value)
    for flag, value in (("--max-queue-time", args.max_queue_time),
                        ("--request-timeout", args.request_timeout)):  # fmt: skip
        if value is not None and value < 0:
            raise ConfigError(f"{flag} must not be negative", where=flag, found=value)
    return Limits(
        max_pending=args.max_pending,
        max_tokens=args.max_tokens_limit,
        max_body_bytes=parse_bytes(args.max_body_size, where="--max-body-size"),
        max_queue_time=args.max_queue_time or None,
        request_timeout=args.request_timeout or None,
    )


def api_keys(given: list[str] | None, key_file: str | None) -> list[str]:
    """--api-key values and the lines of --api-key-file (the keys are never printed)."""
    keys = list(given or ())
    if key_file is not None:
        try:
            lines = Path(key_file).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the API key file: {exc.strerror}", where="--api-key-file"
            ) from None
        keys += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not keys:
            raise ConfigError("the API key file holds no key", where="--api-key-file",
                              expected="one key per line")  # fmt: skip
    return keys


def served_model_name(model: str | None) -> str:
    """The id clients use: the checkpoint's file or directory name (without .gguf)."""
    from infergen.io.default_model import default_model_path

    path = Path(model) if model else Path(default_model_path())
    return path.name.removesuffix(".gguf")
