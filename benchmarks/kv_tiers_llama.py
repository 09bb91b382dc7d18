"""The llama-server peer of bench_kv_tiers.py: llama.cpp's own C++ server (built by
`bash benchmarks/setup_peers.sh llama-server`; launched by bench_serving.py's code) on the same
conversation trace, default model only.

Setup: the F32 GGUF of the default model (bench_generate.py's copy), an F32 KV cache, 2 threads,
one slot per session (`--parallel sessions`, each holding the session's longest request: so its
KV holds the whole working set, 4x infergen's pool — llama-server's best case, nothing
recomputed while a slot keeps its conversation), `--slot-save-path` a temporary directory; every
request goes to its session's slot (`id_slot`) with `cache_prompt: true` (the slot's prompt
cache: only the part past the cached prefix is computed), greedy, EOS ignored, streamed from
/completion with token ids as the prompt. The same closed loop as infergen's
(kv_tiers_workload.py: `concurrency` turns in flight, first in first out); each session
continues with llama-server's own answers (the same system prompt, tool outputs and lengths;
answers of a Q4_1 model's F32 copy may differ from infergen's in a token or two).
Restart: every slot saved (`POST /slots/{id}?action=save`), the server stopped, a fresh one on
the same directory; each session's next turn restores its slot (`action=restore`) just before
it is sent, the restore counted in its TTFT; against a fresh server given the same requests
without restoring (cold start).
TTFT: request sent → first streamed token (client side, loopback HTTP).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import statistics
import tempfile
import time

import httpx
from bench_generate import PEERS_DIR
from bench_serving import LLAMA_SERVER, free_port, llama_server_cmd, llama_server_version, server
from cpu_contention import OtherCpu
from gguf_f32 import cached_f32_gguf
from kv_tiers_lines import PEER
from kv_tiers_workload import Conversations, Sizes, longest_request

CACHE = f"{PEER} (prompt cache)"
RESTORE = f"{PEER} (slot restore)"
COLD = f"{PEER} (cold start)"


async def _one(client: httpx.AsyncClient, prompt: list[int], slot: int, answer: int) -> dict:
    body = {"prompt": prompt, "n_predict": answer, "cache_prompt": True,
            "id_slot": slot, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_tokens": True}  # fmt: skip
    start, first, answer, final = time.perf_counter(), None, [], {}
    async with client.stream("POST", "/completion", json=body) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"{PEER}: HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if data.get("tokens"):
                first = first or time.perf_counter()
                answer += data["tokens"]
            if data.get("stop"):
                final = data
    timings = final.get("timings", {})
    return {"ttft_s": first - start, "answer": answer, "cached": timings.get("cache_n", 0)}


def _client(url: str) -> httpx.AsyncClient:
    """A fresh connection per request (llama-server may close one after a streamed answer)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.AsyncClient(base_url=url, timeout=600, limits=limits)


async def _closed_loop(url: str, sessions: Conversations, sizes: Sizes, restore: bool) -> list:
    """`concurrency` turns in flight, a session re-queued when its answer is in (lockstep:
    every session's next turn together once the round is over); with `restore`, each
    request's slot is restored from its file first (counted in its TTFT)."""
    queue: asyncio.Queue = asyncio.Queue()
    for s in range(sizes.sessions):
        queue.put_nowait(s)
    left = sum(sessions.turns - t for t in sessions.turn)
    out: list[dict] = []
    async with _client(url) as client:

        async def turn(s: int) -> bool:
            r = {"session": s, "turn": sessions.turn[s], "reusable": sessions.reusable(s),
                 "prompt_tokens": len(sessions.prompt(s)), "restore_s": 0.0}  # fmt: skip
            if restore:
                start = time.perf_counter()
                resp = await client.post(f"/slots/{s}?action=restore",
                                         json={"filename": f"slot{s}.bin"})  # fmt: skip
                if resp.status_code != 200:
                    raise SystemExit(f"{PEER}: slot restore failed: {resp.text[:200]}")
                r["restore_s"] = time.perf_counter() - start
            r.update(await _one(client, sessions.prompt(s), s, sessions.answer(s)))
            r["ttft_s"] += r["restore_s"]
            out.append(r)
            return sessions.finish(s, r["answer"])

        async def worker() -> None:
            nonlocal left
            while (s := await queue.get()) is not None:
                if await turn(s):
                    queue.put_nowait(s)
                left -= 1
                if left == 0:
                    for _ in range(sizes.concurrency):
                        queue.put_nowait(None)

        if sizes.lockstep:
            ready = list(range(sizes.sessions))
            while ready:
                more = await asyncio.gather(*(turn(s) for s in ready))
                ready = [s for s, again in zip(ready, more, strict=True) if again]
        else:
            await asyncio.gather(*(worker() for _ in range(sizes.concurrency)))
    return out


def _save_slots(url: str, sessions: int) -> None:
    with httpx.Client(base_url=url, timeout=600) as client:
        for s in range(sessions):
            resp = client.post(f"/slots/{s}?action=save", json={"filename": f"slot{s}.bin"})
            if resp.status_code != 200:
                raise SystemExit(f"{PEER}: slot save failed: {resp.text[:200]}")


def _warm_up(url: str, sizes: Sizes) -> None:
    """One short unrelated request on the last slot (its session's first turn replaces it)."""
    asyncio.run(_warm(url, sizes))


async def _warm(url: str, sizes: Sizes) -> None:
    async with _client(url) as client:
        await _one(client, list(range(1000, 1040)), sizes.sessions - 1, sizes.answer)


def _m(value: float, other) -> dict:
    return {"value": value, "runs": [value], "other_cpu_cores": other, "stat": "1 run"}


def run_llama_server(model: str | None, work: dict, sizes: Sizes) -> dict:
    """The peer's results as (metric, config, {"value", ...}) rows, its version and setup; or
    {"skipped": why}."""
    if model is not None:
        return {"skipped": f"{PEER} runs on the default model only"}
    if not LLAMA_SERVER.exists():
        return {"skipped": f"{LLAMA_SERVER} missing: run `bash benchmarks/setup_peers.sh "
                "llama-server` first"}  # fmt: skip
    from infergen.io.default_model import default_model_path

    gguf = cached_f32_gguf(pathlib.Path(default_model_path()), PEERS_DIR)
    longest = longest_request(sizes)
    ctx = -(-(longest + 32) // 256) * 256
    logs = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_kv_tiers_slots_") as slots:
        extra = ("--slot-save-path", slots)

        def launch(name: str):
            port = free_port()
            cmd = llama_server_cmd(gguf, port, sizes.sessions, ctx, 2, extra)
            return server(cmd, port, PEER, logs / f"bench_kv_tiers_{PEER}_{name}.log")

        with launch("run") as url:
            _warm_up(url, sizes)
            sessions = Conversations(work, sizes)
            start = time.perf_counter()
            with OtherCpu() as other:
                requests = asyncio.run(_closed_loop(url, sessions, sizes, restore=False))
            seconds = time.perf_counter() - start
            _save_slots(url, sizes.sessions)
        later = [r for r in requests if r["turn"] >= 1]
        reusable = sum(r["reusable"] for r in later)
        served = sum(min(r["cached"], r["reusable"]) for r in later) / reusable
        answers = sum(len(r["answer"]) for r in requests)
        results += [
            ("ttft_p50_s_turn2on", CACHE,
             _m(statistics.median(r["ttft_s"] for r in later), other.cores)),
            ("throughput_tok_s", CACHE, _m(answers / seconds, other.cores)),
            ("cache_served_share", CACHE, _m(served, other.cores)),
        ]  # fmt: skip
        resume = sessions.state()
        for config, restore in ((RESTORE, True), (COLD, False)):
            with launch(config.split("(")[1][:-1].replace(" ", "_")) as url:
                _warm_up(url, sizes)
                again = Conversations(work, sizes, turns=sizes.turns + 1, resume=resume)
                with OtherCpu() as other:
                    first = asyncio.run(_closed_loop(url, again, sizes, restore=restore))
            ttft = statistics.median(r["ttft_s"] for r in first)
            results.append(("ttft_p50_s_first_turn", config, _m(ttft, other.cores)))
            if restore:
                results.append(("restore_s_p50", config, _m(
                    statistics.median(r["restore_s"] for r in first), other.cores)))  # fmt: skip
    setup = {"gguf": gguf.name, "slots": sizes.sessions, "slot_ctx": ctx, "kv": "f32",
             "threads": 2}  # fmt: skip
    return {"version": llama_server_version(), "setup": setup, "results": results,
            "requests": requests}  # fmt: skip
