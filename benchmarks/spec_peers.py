"""The peers of bench_spec.py, each without and with its own prompt-lookup speculation, batch 1,
greedy, on the same prompts (token ids) and the same model (the default one unless given):

  transformers   `generate(prompt_lookup_num_tokens=K)` (its prompt lookup decoding) and
                 `generate(assistant_early_exit=L)` (assisted generation, the first L layers
                 as the assistant) on the GGUF dequantized to fp32, in its own process
                 (peers/transformers_runner.py)
  llama-server   llama.cpp's C++ server (built by `bash benchmarks/setup_peers.sh
                 llama-server`) on the fp32 GGUF with an f32 KV cache, `--spec-type
                 ngram-simple` (its prompt-lookup drafts; --spec-draft-n-max K)

Each returns decode tokens per second (after the first token: the prompt's prefill is not in
it) per (workload, mode), best of `repeats`. transformers' assisted generation with another
model needs a smaller one with the same tokenizer, and none is available offline
(REFERENCES.md §1): its early-exit assistant is the one it runs here.
"""

from __future__ import annotations

import os
import pathlib
import sys

import httpx
from bench_generate import run_peer
from bench_serving import LLAMA_SERVER, PEERS_DIR, free_port, llama_server_cmd, server
from bench_serving import llama_server_version as _llama_version
from gguf_f32 import cached_f32_gguf

# transformers' own suggestion for prompt lookup (its docs' example): 10 drafted tokens
TRANSFORMERS_LOOKUP = 10


def transformers_modes(layers: int) -> dict[str, dict]:
    """transformers' generate options per mode: plain, prompt lookup, and its assisted
    generation with the target's first layers as the assistant (LayerSkip-style early exit):
    half of the model's `layers` (15 of SmolLM2's 30), what infergen's `layerskip` does by
    default."""
    return {
        "plain": {},
        f"prompt lookup {TRANSFORMERS_LOOKUP}": {"prompt_lookup_num_tokens": TRANSFORMERS_LOOKUP},
        f"assisted early exit {layers // 2}": {"assistant_early_exit": layers // 2},
    }


def transformers_peer(
    model: pathlib.Path, prompts: dict, tokens: int, repeats: int, layers: int
) -> dict:
    """{(workload, mode): tok/s} for each `transformers_modes(layers)` mode, with "version";
    or {"error": ...}."""
    modes = transformers_modes(layers)
    tasks = [
        {"kind": "decode", "prompt": prompt, "max_tokens": tokens, "repeats": repeats,
         "options": options}
        for prompt in prompts.values()
        for options in modes.values()
    ]  # fmt: skip
    warmup = [{"kind": "decode", "prompt": [1, 2, 3], "max_tokens": 4}]
    out = run_peer(sys.executable, "transformers_runner.py", "transformers_spec", model, 2,
                   warmup, tasks)  # fmt: skip
    if "error" in out:
        return out
    rates, results = {}, iter(out["results"])
    for work in prompts:
        for mode in modes:
            runs = next(results)["runs"]
            rates[(work, mode)] = max((len(r["tokens"]) - 1) / r["decode_s"] for r in runs)
    return {"version": out["version"], "rates": rates}


def llama_server_peer(
    prompts: dict, tokens: int, repeats: int, drafts: int, model: pathlib.Path | None = None
) -> dict:
    """{(workload, mode): tok/s} for mode "plain" / "ngram-simple", with "version"; or
    {"error": ...}. `model`: a GGUF (None: the default model), run as its fp32 GGUF."""
    if not LLAMA_SERVER.exists():
        return {"error": f"{LLAMA_SERVER} missing: run `bash benchmarks/setup_peers.sh "
                         "llama-server` first"}  # fmt: skip
    from infergen.io.default_model import default_model_path

    gguf = cached_f32_gguf(model or pathlib.Path(default_model_path()), PEERS_DIR)
    ctx = -(-(max(len(p) for p in prompts.values()) + tokens + 64) // 256) * 256
    logs = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    modes = {
        "plain": (),
        f"ngram-simple {drafts}": ("--spec-type", "ngram-simple", "--spec-draft-n-max",
                                   str(drafts)),
    }  # fmt: skip
    rates = {}
    for mode, extra in modes.items():
        port = free_port()
        cmd = llama_server_cmd(gguf, port, 1, ctx, 2, extra)
        log = logs / f"bench_spec_llama_{mode.split()[0]}.log"
        with server(cmd, port, "llama-server", log) as url:
            body = {"prompt": [1, 2, 3], "n_predict": 4, "temperature": 0, "cache_prompt": False}
            httpx.post(f"{url}/completion", json=body, timeout=600)  # warm-up
            for work, prompt in prompts.items():
                best = 0.0
                for _ in range(repeats):
                    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0,
                            "ignore_eos": True, "cache_prompt": False}  # fmt: skip
                    reply = httpx.post(f"{url}/completion", json=body, timeout=600).json()
                    best = max(best, reply["timings"]["predicted_per_second"])
                rates[(work, mode)] = best
    return {"version": _llama_version(), "rates": rates}
