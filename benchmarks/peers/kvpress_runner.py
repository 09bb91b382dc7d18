"""kvpress peer for bench_kv_press_peer.py: NVIDIA's kvpress presses on transformers' cache, on
the same weights (a transformers checkpoint directory written from the default model's GGUF).
Runs in kvpress's own virtualenv (benchmarks/setup_peers.sh kvpress: it needs transformers
< 5.3). One JSON object in (argv[1], or stdin when "-"), one JSON object on the last line of
stdout.

Each prompt is generated greedily with the press active (`with press(model):
model.generate(...)`): kvpress compresses the KV cache at the prefill of the whole prompt,
question included, then decodes over the compressed cache — the same setting as infergen's
press at the prompt's end.

Input: {"model_dir": DIR, "n_threads": 2, "max_new_tokens": 10,
        "configs": [["snapkv", 0.5], ["full", 0.0], ...], "prompts": [[ids...], ...]}
Output: {"versions": {...}, "outputs": {"snapkv:0.5": [[ids...], ...], ...}, "seconds": {...}}
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time

import torch

# infergen's press names → kvpress's classes (their own defaults otherwise)
PRESSES = {
    "snapkv": "SnapKVPress",
    "knorm": "KnormPress",
    "streaming": "StreamingLLMPress",
    "random": "RandomPress",
    "h2o": "ObservedAttentionPress",  # (prefill only: accumulated attention of every query)
}


def main() -> None:
    raw = sys.stdin.read() if len(sys.argv) < 2 or sys.argv[1] == "-" else sys.argv[1]
    args = json.loads(raw)
    torch.set_num_threads(args.get("n_threads", 2))
    torch.set_flush_denormal(True)
    import kvpress
    from transformers import AutoModelForCausalLM

    attention = "eager" if any(c[0] == "h2o" for c in args["configs"]) else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(
        args["model_dir"], dtype=torch.float32, attn_implementation=attention
    ).eval()
    outputs, seconds = {}, {}
    for name, ratio in args["configs"]:
        label = "full" if name == "full" else f"{name}:{ratio:g}"
        press = None if name == "full" else getattr(kvpress, PRESSES[name])(compression_ratio=ratio)
        began, results = time.perf_counter(), []
        for ids in args["prompts"]:
            with torch.inference_mode():
                input_ids = torch.tensor([ids])
                kwargs = dict(max_new_tokens=args.get("max_new_tokens", 10), do_sample=False,
                              eos_token_id=None, pad_token_id=0)  # fmt: skip
                if press is None:
                    out = model.generate(input_ids, **kwargs)
                else:
                    with press(model):
                        out = model.generate(input_ids, **kwargs)
            results.append(out[0, len(ids) :].tolist())
        outputs[label], seconds[label] = results, time.perf_counter() - began
        print(f"{label}: {seconds[label]:.1f} s", file=sys.stderr, flush=True)
    versions = {p: importlib.metadata.version(p) for p in ("kvpress", "transformers", "torch")}
    print(json.dumps({"versions": versions, "outputs": outputs, "seconds": seconds}))


if __name__ == "__main__":
    main()
