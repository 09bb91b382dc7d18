"""KV presses against kvpress (issue 25, the peer): the long-context tasks (eval/longctx.py) on
the default model, each press at each ratio in infergen and in NVIDIA's kvpress on the same
weights (transformers' fp32 dequantization of the same GGUF), the full cache on both sides as
the reference; the same prompts (token ids) and greedy answers scored the same way.

kvpress runs in its own virtualenv (`bash benchmarks/setup_peers.sh kvpress`: it needs
transformers < 5.3); its checkpoint directory is written once from the GGUF with our
transformers (saved under the peers' cache). Target (issue 25): SnapKV at 50 % removal
>= kvpress's SnapKV at the same ratio, and >= 95 % of the full cache's passkey score.
JSON lines to benchmarks/results/kv_press_peer.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import random
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.eval.longctx import ANSWER_TOKENS, TASKS  # noqa: E402
from infergen.io.default_model import default_model_path  # noqa: E402

PEERS = pathlib.Path(os.environ.get("INFERGEN_PEERS_DIR", pathlib.Path.home() /
                                    ".cache/infergen/peers"))  # fmt: skip
PEER_PYTHON = PEERS / "kvpress" / "bin" / "python"
MODEL = "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)"


def hf_checkpoint() -> pathlib.Path:
    """The default model as a transformers checkpoint directory (written once)."""
    out = PEERS / "smollm2-135m-instruct-hf"
    if not (out / "config.json").exists():
        from transformers import AutoModelForCausalLM

        gguf = pathlib.Path(default_model_path())
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        config = loaded.config
        del config.quantization_config  # (a plain fp32 copy: the GGUF's values dequantized)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(out, safe_serialization=True)
    return out


def _mean(accuracy: dict) -> float:
    cells = [v for per_length in accuracy.values() for v in per_length.values()]
    return sum(cells) / len(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presses", default="snapkv,knorm,streaming")
    parser.add_argument("--ratios", default="0.5,0.75")
    parser.add_argument("--tasks", default="passkey,passkey_first,multikey")
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/kv_press_peer.jsonl"
    )
    args = parser.parse_args()
    if not PEER_PYTHON.exists():
        sys.exit("kvpress is not set up: bash benchmarks/setup_peers.sh kvpress")
    torch.set_num_threads(2)
    configs = [("full", 0.0)] + [(p, float(r)) for p in args.presses.split(",")
                                 for r in args.ratios.split(",")]  # fmt: skip
    lengths = [int(n) for n in args.lengths.split(",")]
    tasks = args.tasks.split(",")
    llm = LLM(kv_cache_memory="2GiB")
    cases = []  # (task, length, prompt ids, answer)
    for task in tasks:
        rng = random.Random(0)
        for length in lengths:
            for i in range(args.samples):
                ids, answer = TASKS.get(task).prompt(llm.tokenizer, length,
                                                     (i + 0.5) / args.samples, rng)  # fmt: skip
                cases.append((task, length, ids, answer))
    prompts = [ids for _, _, ids, _ in cases]

    # the peer first (its own process and threads), then ours
    request = {"model_dir": str(hf_checkpoint()), "n_threads": 2,
               "max_new_tokens": ANSWER_TOKENS, "configs": configs, "prompts": prompts}  # fmt: skip
    run = subprocess.run(
        [str(PEER_PYTHON), str(ROOT / "benchmarks/peers/kvpress_runner.py"), "-"],
        input=json.dumps(request),
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )  # (its stderr, not captured: progress per configuration)
    peer = json.loads(run.stdout.strip().splitlines()[-1])

    def accuracy(outputs: list[list[int]]) -> dict:
        per: dict = {}
        for (task, length, _, answer), ids in zip(cases, outputs, strict=True):
            hit = answer in llm.tokenizer.decode(ids)
            per.setdefault(task, {}).setdefault(str(length), []).append(hit)
        return {t: {n: sum(v) / len(v) for n, v in per_len.items()} for t, per_len in per.items()}

    base = {"bench": "kv_press_peer", "model": MODEL, "machine": machine_info(2),
            "date": datetime.date.today().isoformat(), "samples": args.samples,
            "peer": "kvpress", "peer_versions": peer["versions"]}  # fmt: skip
    lines = []
    params = SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0.0)
    for name, ratio in configs:
        label = "full" if name == "full" else f"{name}:{ratio:g}"
        engine = llm if name == "full" else LLM(kv_cache_memory="2GiB", kv_press=name,
                                                kv_press_ratio=ratio)  # fmt: skip
        ours = [o.token_ids for o in engine.generate(prompts, params)]
        mine, theirs = accuracy(ours), accuracy(peer["outputs"][label])
        line = {**base, "press": name, "ratio": ratio, "infergen": mine, "kvpress": theirs,
                "infergen_mean": round(_mean(mine), 3), "kvpress_mean": round(_mean(theirs), 3),
                "same_answers": sum(a == b for a, b in zip(ours, peer["outputs"][label],
                                                           strict=True)),
                "prompts": len(prompts)}  # fmt: skip
        print({k: v for k, v in line.items() if k not in ("machine", "model", "peer_versions")},
              flush=True)  # fmt: skip
        lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
