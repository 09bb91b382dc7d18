"""Soak: `infergen serve` under 1,000 concurrent clients of which some abuse it, then under a
schema-driven fuzzer (schemathesis' own CLI) — localhost only, bounded in count and time.

Phases, one server process (the default model, fp32, 2 threads):
1. clean: the well-behaved clients alone (70 % of --clients): completions and chat, streaming
   and not, `max_tokens` answers (ignore_eos), each started at a random point of the --ramp;
   a client told 503 waits its Retry-After and tries again (at most --retries times).
2. mixed: the same well-behaved clients (the same requests and start times) plus 20 %
   that disconnect at random points (mid-stream after a few chunks, or before a whole
   response) and 10 % that send malformed bodies (broken JSON, wrong types, out-of-range
   values, token ids outside the vocabulary, a body that is not an object, ...).
3. fuzz: schemathesis' CLI generates requests from the server's /openapi.json (valid and
   invalid, every operation) until --fuzz-requests have been sent, checking
   `not_a_server_error`.
After each phase the server must be idle with no KV block held (`/metrics`: running and
waiting 0, `infergen_kv_blocks_used` 0).

Pass: no 5xx except the deliberate 503 sheds (each carrying Retry-After, its client retrying);
no lost accepted request (every well-behaved client ends with a 200 holding all of its
tokens); 0 KV blocks held after each phase; every malformed body a 4xx with the OpenAI error
body; p99 TTFT of the well-behaved streaming clients in the mixed phase within 2× of the clean
phase. JSON lines to --out (`kind: "soak"`), then `python benchmarks/report.py` puts them in
the README.

Usage: python benchmarks/soak_server.py [--clients 1000] [--fuzz-requests 10000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402
from bench_generate import git_state, machine_info  # noqa: E402
from bench_serving import free_port, server  # noqa: E402
from results_file import write_lines  # noqa: E402

CORPUS = ROOT / "data" / "shakespeare.txt"
SCHEMATHESIS = pathlib.Path(sys.executable).parent / "schemathesis"


@dataclass
class Client:
    """One client's request and what it does with it."""

    kind: str  # "good" | "disconnect" | "malformed"
    start: float  # seconds after the phase began
    route: str
    body: dict | str  # a str is sent as is (malformed JSON)
    stream: bool = False
    leave_after: float = 0.0  # disconnect: chunks read (stream) or seconds waited (whole)
    expected_tokens: int = 0


@dataclass
class Outcome:
    kind: str
    stream: bool
    status: int | None = None
    ttft: float | None = None  # streaming: the first chunk with text, after the accepted try
    e2e: float | None = None
    tokens: int | None = None  # usage.completion_tokens
    complete: bool = False  # good: a 200 with every token (and [DONE] for a stream)
    sheds: int = 0  # 503s (with Retry-After) before it was accepted
    resets: int = 0  # connections that failed before an answer began (retried)
    shed_without_retry_after: int = 0
    error_body: bool = True  # a 4xx/5xx carried {"error": {...}}
    notes: list[str] = field(default_factory=list)


# ---- the clients -------------------------------------------------------------------------------
def _prompt(rng: random.Random, words: list[str]) -> str:
    n = rng.randrange(8, 40)
    at = rng.randrange(0, len(words) - n)
    return " ".join(words[at : at + n])


def _good(rng: random.Random, words: list[str], max_tokens: int, ramp: float) -> Client:
    stream = rng.random() < 0.5
    common = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.7,
              "seed": rng.randrange(1 << 30), "stream": stream}  # fmt: skip
    if stream:
        common["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        route, body = "/v1/completions", {"prompt": _prompt(rng, words), **common}
    else:
        messages = [{"role": "user", "content": _prompt(rng, words)}]
        route, body = "/v1/chat/completions", {"messages": messages, **common}
    return Client("good", rng.uniform(0, ramp), route, body, stream, 0.0, max_tokens)


def _disconnecting(rng: random.Random, words: list[str], max_tokens: int, ramp: float) -> Client:
    client = _good(rng, words, max_tokens, ramp)
    client.kind = "disconnect"
    # a stream leaves after a few chunks; a whole response is given up after a while
    client.leave_after = rng.randrange(0, max_tokens) if client.stream else rng.uniform(0.05, 10)
    return client


MALFORMED: list[tuple[str, dict | str]] = [
    ("/v1/completions", '{"prompt": "Hello", "max_tokens": '),  # cut off
    ("/v1/completions", "[1, 2, 3]"),  # not an object
    ("/v1/completions", {"prompt": 5}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -3}),
    ("/v1/completions", {"prompt": "Hi", "n": 1000}),
    ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}),
    ("/v1/completions", {"prompt": [999999999, 3]}),  # outside the vocabulary
    ("/v1/completions", {"prompt": "Hi", "stop": ["s"] * 40}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**9}),
    ("/v1/completions", {"prompt": "Hi", "timeout": -1}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": "hello"}),
    ("/v1/chat/completions", {"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}),
]


def _malformed(rng: random.Random, ramp: float) -> Client:
    route, body = rng.choice(MALFORMED)
    return Client("malformed", rng.uniform(0, ramp), route, body)


def clients_for(n: int, max_tokens: int, ramp: float, seed: int) -> dict[str, list[Client]]:
    """The well-behaved clients (70 %), the disconnecting (20 %) and malformed ones (10 %)."""
    words = CORPUS.read_text().split()
    rng = random.Random(seed)
    n_disconnect, n_malformed = n // 5, n // 10
    good = [_good(rng, words, max_tokens, ramp) for _ in range(n - n_disconnect - n_malformed)]
    leave = [_disconnecting(rng, words, max_tokens, ramp) for _ in range(n_disconnect)]
    bad = [_malformed(rng, ramp) for _ in range(n_malformed)]
    return {"good": good, "disconnect": leave, "malformed": bad}


async def run_client(http: httpx.AsyncClient, c: Client, t0: float, retries: int) -> Outcome:
    await asyncio.sleep(max(0.0, t0 + c.start - time.perf_counter()))
    out = Outcome(c.kind, c.stream)
    content = c.body if isinstance(c.body, str) else json.dumps(c.body)
    headers = {"content-type": "application/json"}
    for _ in range(retries + 1):
        began = time.perf_counter()
        try:
            if c.kind == "disconnect" and not c.stream:
                await asyncio.wait_for(
                    http.post(c.route, content=content, headers=headers), c.leave_after
                )
                out.notes.append("finished before leaving")
                return out
            async with http.stream("POST", c.route, content=content, headers=headers) as resp:
                out.status = resp.status_code
                if resp.status_code == 503 and c.kind != "malformed":
                    await resp.aread()
                    retry_after = resp.headers.get("retry-after")
                    out.sheds += 1
                    out.shed_without_retry_after += retry_after is None
                    await asyncio.sleep(float(retry_after or 1))
                    continue
                if resp.status_code != 200:
                    raw = await resp.aread()
                    out.error_body = _is_error_body(raw)
                    return out
                if c.stream:
                    await _read_stream(resp, c, out, began)
                else:
                    answer = json.loads(await resp.aread())
                    out.tokens = answer["usage"]["completion_tokens"]
                    out.complete = out.tokens == c.expected_tokens
                out.e2e = time.perf_counter() - began
                return out
        except asyncio.TimeoutError:  # a disconnecting client giving up on a whole response
            return out
        except httpx.TransportError as exc:
            if out.status not in (None, 503) or c.kind != "good":
                out.notes.append(f"transport: {exc!r}")
                return out
            # no answer began (e.g. a kept-alive connection the server was closing): the
            # request may be sent again, as HTTP clients do; counted
            out.resets += 1
            out.notes.append(f"reset before an answer, retried: {exc!r}")
    out.notes.append("still refused after every retry")
    return out


async def _read_stream(resp: httpx.Response, c: Client, out: Outcome, began: float) -> None:
    chunks, done = 0, False
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            out.notes.append(f"error event: {event['error']['message']}")
            continue
        if event.get("usage"):
            out.tokens = event["usage"]["completion_tokens"]
        if event.get("choices"):
            chunks += 1
            if out.ttft is None:
                out.ttft = time.perf_counter() - began
        if c.kind == "disconnect" and chunks > c.leave_after:
            return  # hang up mid-stream
    out.complete = done and out.tokens == c.expected_tokens


def _is_error_body(raw: bytes) -> bool:
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"message", "type"} <= error.keys()


async def run_phase(url: str, clients: list[Client], retries: int) -> list[Outcome]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(600.0, connect=60.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        t0 = time.perf_counter() + 0.5
        return await asyncio.gather(*(run_client(http, c, t0, retries) for c in clients))


# ---- the server's side -------------------------------------------------------------------------
def metrics(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def settle(url: str, timeout: float = 120.0) -> dict[str, float]:
    """Wait until nothing runs or waits (aborted requests end within a step); the metrics."""
    deadline = time.time() + timeout
    while True:
        m = metrics(url)
        idle = m["infergen_requests_running"] == 0 and m["infergen_requests_waiting"] == 0
        if idle or time.time() > deadline:
            return m


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(phase: str, outcomes: list[Outcome], seconds: float, m: dict) -> dict:
    good = [o for o in outcomes if o.kind == "good"]
    statuses: dict[str, int] = {}
    for o in outcomes:
        status = "left" if o.status is None else str(o.status)  # hung up before a status
        statuses[status] = statuses.get(status, 0) + 1
    ttfts = [o.ttft for o in good if o.ttft is not None]
    e2es = [o.e2e for o in good if o.e2e is not None]
    malformed = [o for o in outcomes if o.kind == "malformed"]
    return {
        "phase": phase,
        "clients": len(outcomes),
        "good": len(good),
        "disconnecting": sum(o.kind == "disconnect" for o in outcomes),
        "malformed": len(malformed),
        "seconds": round(seconds, 1),
        "statuses": statuses,
        "server_errors": sum(
            o.status is not None and o.status >= 500 and o.status != 503 for o in outcomes
        ),  # fmt: skip
        "sheds": sum(o.sheds for o in outcomes),
        "sheds_without_retry_after": sum(o.shed_without_retry_after for o in outcomes),
        "connection_resets_retried": sum(o.resets for o in outcomes),
        "lost": sum(not o.complete for o in good),
        "malformed_not_4xx": sum(not (o.status and 400 <= o.status < 500) for o in malformed),
        "errors_without_error_body": sum(not o.error_body for o in outcomes),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "e2e_p50_s": percentile(e2es, 0.5),
        "e2e_p99_s": percentile(e2es, 0.99),
        "kv_blocks_used_after": m["infergen_kv_blocks_used"],
        "running_after": m["infergen_requests_running"],
        "waiting_after": m["infergen_requests_waiting"],
        "notes": sorted({n for o in good for n in o.notes})[:5],
        "refused_after_all_retries": sum(o.status == 503 or o.status is None for o in good),
    }


def fuzz(url: str, requests: int, workers: int, seed: int, report: pathlib.Path) -> dict:
    """schemathesis' CLI over every operation, run after run (seed, seed + 1, ...), until at
    least `requests` have been sent; every response is checked not to be a server error."""
    statuses: dict[str, int] = {}
    runs, exits, findings, summary = 0, [], 0, ""
    began = time.perf_counter()
    while sum(statuses.values()) < requests:
        cmd = [str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
               "--max-examples", "400", "--workers", str(workers), "--mode", "all",
               "--seed", str(seed + runs), "--suppress-health-check", "all",
               "--request-timeout", "300",
               "--no-color", "--generation-database", "none",
               "--report", "ndjson", "--report-ndjson-path", str(report)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=report.parent)
        runs += 1
        exits.append(proc.returncode)
        findings += proc.stdout.count("Server error")
        summary = proc.stdout[-1500:]
        for status, n in _statuses(report).items():
            statuses[status] = statuses.get(status, 0) + n
        print(f"soak: fuzz run {runs}: {sum(statuses.values())} requests so far", flush=True)
    return {
        "phase": "fuzz",
        "requests": sum(statuses.values()),
        "runs": runs,
        "seconds": round(time.perf_counter() - began, 1),
        "statuses": statuses,
        "server_errors": sum(n for s, n in statuses.items() if s.startswith("5") and s != "503"),
        "schemathesis_exits": exits,
        "schemathesis_server_error_findings": findings,
        "summary": summary,
    }


def _statuses(report: pathlib.Path) -> dict[str, int]:
    """The response statuses of one schemathesis run (its NDJSON event report)."""
    statuses: dict[str, int] = {}
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        for interaction in (finished.get("recorder", {}).get("interactions") or {}).values():
            status = str((interaction.get("response") or {}).get("status_code"))
            statuses[status] = statuses.get(status, 0) + 1
    return statuses


# ---- main --------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8, help="each answer's length (8)")
    parser.add_argument("--ramp", type=float, default=5.0, help="clients start within it (5 s)")
    parser.add_argument(
        "--retries", type=int, default=50, help="503s / resets a good client retries (50)"
    )
    parser.add_argument("--fuzz-requests", type=int, default=10_000)
    parser.add_argument("--fuzz-workers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="100 clients, 500 fuzz requests")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results/soak.jsonl")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.fuzz_requests = 100, 500
    if not SCHEMATHESIS.exists():
        raise SystemExit(f"schemathesis' CLI is missing ({SCHEMATHESIS}): run `make setup`")
    port = free_port()
    cmd = [sys.executable, "-m", "infergen.cli", "serve", "--port", str(port),
           "--threads", str(args.threads), "--kv-cache-memory", "256MiB",
           # room for every client at once: what is measured is shedding by cost, not count
           "--max-pending", str(2 * args.clients),
           # fuzzed requests (n up to 16, 64 prompts, no max_tokens) stay short
           "--max-model-len", "256", "--max-tokens-limit", "16"]  # fmt: skip
    log = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "soak_server.log"
    clients = clients_for(args.clients, args.max_tokens, args.ramp, args.seed)
    lines, stamp = [], datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    common = {"bench": "soak", "kind": "soak", "timestamp": stamp, "quick": args.quick,
              "machine": machine_info(args.threads), **git_state()}  # fmt: skip
    with server(cmd, port, "infergen", log) as url:
        for _ in range(3):  # warm up; the step time the admission estimate needs
            body = {"prompt": "Hello", "max_tokens": args.max_tokens, "ignore_eos": True}
            httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        phases = {"clean": clients["good"], "mixed": [c for cs in clients.values() for c in cs]}
        for phase, members in phases.items():
            print(f"soak: {phase} phase, {len(members)} clients", flush=True)
            began = time.perf_counter()
            outcomes = asyncio.run(run_phase(url, members, args.retries))
            seconds = time.perf_counter() - began
            summary = summarize(phase, outcomes, seconds, settle(url))
            print(json.dumps(summary), flush=True)
            lines.append({**common, **summary})
        print(f"soak: fuzz phase, ~{args.fuzz_requests} requests", flush=True)
        report = log.with_name("soak_fuzz.ndjson")
        summary = fuzz(url, args.fuzz_requests, args.fuzz_workers, args.seed, report)
        m = settle(url)
        summary |= {"kv_blocks_used_after": m["infergen_kv_blocks_used"],
                    "running_after": m["infergen_requests_running"]}  # fmt: skip
        final = httpx.post(f"{url}/v1/completions", timeout=120,
                           json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True})  # fmt: skip
        summary["serves_after"] = final.status_code == 200
        print(json.dumps({k: v for k, v in summary.items() if k != "summary"}), flush=True)
        lines.append({**common, **summary})
    clean, mixed = lines[0], lines[1]
    ratio = (mixed["ttft_p99_s"] or 0) / clean["ttft_p99_s"] if clean["ttft_p99_s"] else None
    passed = (
        all(ln["server_errors"] == 0 for ln in lines)
        and all(ln["kv_blocks_used_after"] == 0 for ln in lines)
        and clean["lost"] == 0 and mixed["lost"] == 0  # (refused after all retries: lost)
        and mixed["malformed_not_4xx"] == 0
        and mixed["errors_without_error_body"] == 0
        and mixed["sheds_without_retry_after"] == 0
        and lines[2]["serves_after"]
        and ratio is not None and ratio <= 2.0
    )  # fmt: skip
    verdict = {**common, "phase": "verdict", "ttft_p99_ratio_mixed_over_clean": ratio,
               "passed": passed}  # fmt: skip
    lines.append(verdict)
    print(json.dumps({k: verdict[k] for k in ("ttft_p99_ratio_mixed_over_clean", "passed")}))
    write_lines(args.out, lines)
    if not passed:
        raise SystemExit("soak: FAILED (see the lines above)")


if __name__ == "__main__":
    main()
