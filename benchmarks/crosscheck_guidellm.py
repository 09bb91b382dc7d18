"""Cross-check `infergen bench serve` against a third-party load generator (guidellm, from PyPI,
installed by benchmarks/setup_peers.sh into its own virtualenv).

Both clients drive the same infergen server (default model, ONE thread: the second core is
left to the client, since guidellm itself takes ~0.4 of a core while it runs and a server using
both cores would run slower under it than under our client) with the same shape of
load, one after the other: fixed-length requests (--input-len prompt tokens, exactly
--output-len answer tokens with EOS ignored) on /v1/completions, streaming, closed loop at each
--concurrency. guidellm makes its own synthetic prompts and counts tokens with the model's
tokenizer (exported from the GGUF with Tokenizer.save_hf, since guidellm reads Hugging Face
tokenizers). Compared, where both tools define the metric the same way:
  output tok/s   output tokens / wall time of the run
  TTFT p50       request sent -> first streamed token
  ITL mean       mean gap between streamed tokens (equal answer lengths: the same as the mean
                 of per-request means, which is what guidellm reports)
  e2e p50        request sent -> last token
Each line gives guidellm / ours; `agree` when within --tolerance (default 20 %: the two runs
are minutes apart on a noisy 2-core machine, and each client competes with the server for
CPU). guidellm runs with one worker process (GUIDELLM__MAX_WORKER_PROCESSES=1) for that reason.
Also recorded per run: each client's CPU seconds and `busy` = request time / (wall x
concurrency), the share of the closed loop's slots the client kept filled; a client that
leaves gaps between one request's end and the next one's start reports lower throughput for
the same server. JSON lines to --out; `python benchmarks/report.py` puts the table into
README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import PEERS_DIR, git_state, machine_info  # noqa: E402
from bench_serving import free_port, server  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.bench.client import ClientOptions, run_load  # noqa: E402
from infergen.bench.report import format_report, summarize  # noqa: E402
from infergen.bench.workloads import WORKLOADS, WorkloadOptions  # noqa: E402
from infergen.io.checkpoint import load_checkpoint  # noqa: E402
from infergen.io.default_model import default_model_path  # noqa: E402

GUIDELLM = PEERS_DIR / "guidellm" / "bin" / "guidellm"
MODEL = "smol"
LOOP_SLEEP = os.environ.get("GUIDELLM_LOOP_SLEEP", "0.01")


def ours(url: str, tokenizer, eos, args, concurrency: int, n: int) -> dict:
    opts = WorkloadOptions(
        num_requests=n, input_len=args.input_len, output_len=args.output_len, spread=0.0
    )
    requests = WORKLOADS.get("random")(tokenizer, opts, random.Random(concurrency))
    client = ClientOptions(
        url, model=MODEL, eos_token_ids=eos, count_tokens=lambda t: len(tokenizer.encode(t))
    )
    cpu = time.process_time()
    results, wall = asyncio.run(run_load(requests, client, concurrency=concurrency))
    cpu = time.process_time() - cpu
    s = summarize(results, wall)
    print(format_report(f"infergen bench serve c={concurrency}", s), flush=True)
    return {
        "output_tok_s": s["output_tok_s"],
        "ttft_p50_s": s["ttft_s"]["p50"],
        "itl_mean_s": s["itl_s"]["mean"],
        "e2e_p50_s": s["e2e_s"]["p50"],
        "requests": s["completed"],
        "client_cpu_s": cpu,
        "wall_s": wall,
        "busy": s["e2e_s"]["mean"] * s["e2e_s"]["n"] / (wall * concurrency),
    }


def guidellm(url: str, tokenizer_dir: str, args, concurrency: int, n: int, work: str) -> dict:
    out = pathlib.Path(work) / f"guidellm_c{concurrency}.json"
    cmd = [
        str(GUIDELLM),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions",
        "--profile",
        f"kind=concurrent,streams={concurrency}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}",
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer_dir}",
        "--constraint",
        f"kind=max_requests,count={n}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console-interactive",
    ]
    env = {
        **os.environ,
        "GUIDELLM__MAX_WORKER_PROCESSES": "1",
        # its scheduler loops poll every 0.1 ms by default: most of a core taken from the
        # server on this 2-core machine
        "GUIDELLM__DEFAULT_ASYNC_LOOP_SLEEP": LOOP_SLEEP,
        "HF_HUB_OFFLINE": "1",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=work)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"guidellm failed ({done.returncode}):\n{done.stderr[-3000:]}")
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def ok(name: str) -> dict:
        return m[name]["successful"]

    return {
        "output_tok_s": ok("output_token_count")["total_sum"] / bench["duration"],
        "ttft_p50_s": ok("time_to_first_token_ms")["percentiles"]["p50"] / 1000,
        "itl_mean_s": ok("inter_token_latency_ms")["mean"] / 1000,
        "e2e_p50_s": ok("request_latency")["percentiles"]["p50"],
        "requests": ok("request_latency")["count"],
        "prompt_tokens_p50": ok("prompt_token_count")["percentiles"]["p50"],
        "output_tokens_p50": ok("output_token_count")["percentiles"]["p50"],
        "client_cpu_s": cpu,  # the whole guidellm process, start-up included
        "wall_s": bench["duration"],
        "busy": ok("request_latency")["total_sum"] / (bench["duration"] * concurrency),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="server threads (1: the other core is the client's, so neither client's own CPU "
        "use slows the server it measures)",
    )
    parser.add_argument("--tolerance", type=float, default=0.20)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/crosscheck.jsonl"
    )
    args = parser.parse_args()
    if not GUIDELLM.exists():
        raise SystemExit(f"guidellm missing ({GUIDELLM}): run `bash benchmarks/setup_peers.sh`")
    checkpoint = load_checkpoint(default_model_path(), load_weights=False)
    tokenizer, eos = checkpoint.tokenizer, tuple(checkpoint.config.eos_token_ids)
    version = subprocess.run(
        [str(GUIDELLM), "--version"], capture_output=True, text=True
    ).stdout.split()[-1]
    port = free_port()
    cmd = [sys.executable, "-m", "infergen.cli", "serve", "--port", str(port)]
    cmd += ["--threads", str(args.threads), "--served-model-name", MODEL]
    base = {
        "bench": "crosscheck",
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": {"guidellm": version},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = []
    log = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "crosscheck_server.log"
    with tempfile.TemporaryDirectory() as work, server(cmd, port, "infergen", log) as url:
        tokenizer.save_hf(pathlib.Path(work) / "tokenizer")
        tok_dir = str(pathlib.Path(work) / "tokenizer")
        # warm-up: both clients once, so neither pays first-request costs
        ours(url, tokenizer, eos, args, 2, 2)
        guidellm(url, tok_dir, args, 2, 2, work)
        for c in args.concurrency:
            n = max(16, 8 * c)  # several waves, so the first (all at once) weighs less
            a = ours(url, tokenizer, eos, args, c, n)
            b = guidellm(url, tok_dir, args, c, n, work)
            print(f"guidellm c={c}: {json.dumps(b)}", flush=True)
            for metric in ("output_tok_s", "ttft_p50_s", "itl_mean_s", "e2e_p50_s"):
                ratio = b[metric] / a[metric] if a[metric] else None
                agree = ratio is not None and abs(ratio - 1) <= args.tolerance
                lines.append(
                    {
                        **base,
                        "kind": "crosscheck",
                        "metric": f"{metric}_c{c}",
                        "ours": a[metric],
                        "peer": "guidellm",
                        "peer_value": b[metric],
                        "value": ratio,
                        "tolerance": args.tolerance,
                        "agree": agree,
                        "params": {
                            "concurrency": c,
                            "requests": n,
                            "input_len": args.input_len,
                            "output_len": args.output_len,
                            "guidellm_tokens_p50": [
                                b["prompt_tokens_p50"],
                                b["output_tokens_p50"],
                            ],
                            "client_cpu_s": {
                                "ours": a["client_cpu_s"],
                                "guidellm": b["client_cpu_s"],
                            },
                            "wall_s": {"ours": a["wall_s"], "guidellm": b["wall_s"]},
                            # request time / (wall x concurrency): < 1 = the client left
                            # slots idle between a request's end and the next one's start
                            "busy": {"ours": a["busy"], "guidellm": b["busy"]},
                        },
                    }
                )
                print(
                    f"  {metric:14s} c={c:<3d} ours {a[metric]:.4g}  guidellm {b[metric]:.4g}  "
                    f"ratio {ratio:.3f}  {'agree' if agree else 'DISAGREE'}"
                )
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
