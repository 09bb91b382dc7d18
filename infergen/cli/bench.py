"""`infergen bench serve`: load-test an OpenAI-compatible server with a workload (closed or
open loop) and report TTFT, ITL, TPOT, e2e percentiles, throughput and goodput."""

from __future__ import annotations

import argparse
import sys

from infergen.bench.workloads import add_workload_args
from infergen.errors import InfergenError


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks; `infergen bench serve --help`")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    bs = bench_sub.add_parser(
        "serve",
        help="load-test an OpenAI-compatible server: TTFT, ITL, TPOT, e2e, throughput, goodput",
        description="Send a workload's requests as streaming completions to a running server "
        "(infergen, llama.cpp, vLLM, ...) and report latency percentiles (mean, p50, p90, p99), "
        "throughput and goodput, measured on the client side.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    bs.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    load = bs.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="closed loop: this many requests in flight (several values: one run each)",
    )
    load.add_argument("--rate", type=float, default=None, help="open loop: Poisson arrivals, req/s")
    bs.add_argument("--duration", type=float, default=None, help="stop starting requests after S s")
    add_workload_args(bs, num_requests=64)
    bs.add_argument(
        "--tokenizer",
        default=None,
        help="model whose tokenizer cuts the prompts (default: the default model)",
    )
    bs.add_argument("--model-name", default=None, help="`model` field of the requests")
    bs.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    bs.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="let answers stop at EOS (default: exactly max_tokens tokens)",
    )
    bs.add_argument("--slo-ttft", type=float, default=None, help="goodput SLO on TTFT (s)")
    bs.add_argument("--slo-tpot", type=float, default=None, help="goodput SLO on TPOT (s)")
    bs.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    bs.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    bs.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="latency CDFs and throughput vs latency (needs matplotlib)",
    )
    bs.set_defaults(func=cmd_bench_serve)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import random

    from tqdm import tqdm

    from infergen.bench.client import ClientOptions, run_load
    from infergen.bench.report import DEFINITIONS, format_report, plot, summarize
    from infergen.bench.server_stats import cache_delta, format_cache, scrape
    from infergen.bench.workloads import WORKLOADS, workload_options
    from infergen.io.checkpoint import load_checkpoint

    make = WORKLOADS.get(args.workload, where="--workload")
    checkpoint = load_checkpoint(args.tokenizer, load_weights=False)
    tokenizer = checkpoint.tokenizer
    options = workload_options(args)
    try:
        requests = make(tokenizer, options, random.Random(args.seed))
    except ValueError as exc:
        raise InfergenError(str(exc), where="--workload") from None
    client = ClientOptions(
        args.url.rstrip("/"),
        args.model_name,
        args.api_key,
        ignore_eos=not args.no_ignore_eos,
        eos_token_ids=tuple(checkpoint.config.eos_token_ids),
        count_tokens=lambda text: len(tokenizer.encode(text)),
    )
    loads = (
        [("rate", args.rate)]
        if args.rate
        else [("concurrency", c) for c in (args.concurrency or [8])]
    )
    total = sum(1 + len(r.follow_up) for r in requests)
    runs, report = [], {"workload": args.workload, "options": vars(options), "runs": []}
    print(DEFINITIONS, file=sys.stderr)
    for kind, value in loads:
        label = f"{args.workload} {kind}={value}"
        before = scrape(client.url, args.api_key)
        with tqdm(total=total, desc=label, unit="req", file=sys.stderr) as bar:
            results, wall = asyncio.run(
                run_load(
                    requests,
                    client,
                    duration=args.duration,
                    seed=args.seed,
                    progress=bar,
                    **{kind: value},
                )
            )
        summary = summarize(results, wall, args.slo_ttft, args.slo_tpot)
        cache = cache_delta(before, scrape(client.url, args.api_key))
        print(format_report(label, summary))
        if cache is not None:
            print(format_cache(cache))
        runs.append((label, results, summary))
        report["runs"].append(
            {
                "label": label,
                kind: value,
                "summary": summary,
                "server_cache": cache,
                "requests": [r.as_dict() for r in results],
            }
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(runs, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
