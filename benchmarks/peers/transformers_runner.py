"""transformers peer for bench_generate.py: `generate` on the same GGUF, dequantized to fp32 by
transformers itself. Runs in its own process (infergen's virtualenv has transformers) so its
threads and memory do not mix with infergen's. Same JSON protocol as llama_cpp_runner.py:
one JSON object in (argv[1], or stdin when "-"), one JSON object on the last line of stdout.

Fairness settings, applied before loading: torch.set_num_threads(n_threads) and
torch.set_flush_denormal(True) (infergen flushes denormals too; without it transformers' CPU
forward of the dequantized weights runs several times slower). EOS is disabled
(eos_token_id=None) so every request generates exactly max_tokens, like ignore_eos.

Input: {"model": "x.gguf", "n_threads": 2, "tasks": [...]}
Output: {"version", "load_s", "results": [...]}; tasks and results as in protocol.py.
With "serve": true instead of "tasks": protocol.py's serve mode (a task at a time).
"""

from __future__ import annotations

import pathlib
import time

import torch
from protocol import read_args, run_tasks, serve, write_result


class _TimingStreamer:
    """Records when generate() emits each new token (its first put() is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class Runner:
    def __init__(self, model_path: str, n_threads: int):
        torch.set_num_threads(n_threads)
        torch.set_flush_denormal(True)
        from transformers import AutoModelForCausalLM

        path = pathlib.Path(model_path)
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
        self.load_s = time.perf_counter() - start
        self.pad_id = 0

    def _generate(self, input_ids: torch.Tensor, mask: torch.Tensor, max_tokens: int, **kw):
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=self.pad_id,
                **kw,
            )

    def run_decode(self, prompt: list[int], max_tokens: int, **options) -> dict:
        """`options`: more `generate` keywords (e.g. prompt_lookup_num_tokens: its prompt
        lookup decoding)."""
        ids = torch.tensor([prompt])
        streamer = _TimingStreamer()
        start = time.perf_counter()
        out = self._generate(ids, torch.ones_like(ids), max_tokens, streamer=streamer, **options)
        end = time.perf_counter()
        first = streamer.times[1]  # times[0]: the prompt
        tokens = out[0, len(prompt) :].tolist()
        return {"ttft_s": first - start, "decode_s": end - first, "tokens": tokens}

    def run_prefill(self, prompt: list[int]) -> dict:
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        self._generate(ids, torch.ones_like(ids), 1)
        return {"seconds": time.perf_counter() - start, "tokens": len(prompt)}

    def run_concurrent(self, prompts: list[list[int]], max_tokens: int) -> dict:
        """One left-padded batch of every prompt."""
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p) :] = torch.tensor(p)
            mask[i, longest - len(p) :] = 1
        start = time.perf_counter()
        out = self._generate(ids, mask, max_tokens)
        seconds = time.perf_counter() - start
        outputs = out[:, longest:].tolist()
        return {
            "seconds": seconds,
            "output_tokens": sum(len(o) for o in outputs),
            "outputs": outputs,
        }


def main() -> None:
    args = read_args()
    import transformers

    runner = Runner(args["model"], int(args.get("n_threads", 2)))
    retries = int(args.get("retries", 0))
    if args.get("serve"):
        serve(runner, retries, version=transformers.__version__, load_s=runner.load_s)
        return
    results = run_tasks(runner, args["tasks"], retries)
    write_result({"version": transformers.__version__, "load_s": runner.load_s, "results": results})


if __name__ == "__main__":
    main()
