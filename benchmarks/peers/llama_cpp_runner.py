"""llama.cpp peer for bench_generate.py: runs in the peer virtualenv (llama-cpp-python), not in
infergen's. Reads one JSON object (argv[1], or stdin when argv[1] is "-"), prints one JSON object
on the last line of stdout.

It uses llama-cpp-python's low-level C API (llama_batch + llama_decode), not the high-level
`Llama` class, so that several sequences (seq_ids) decode in one batch, like continuous
batching, and so that every timing is of llama_decode itself plus a greedy argmax on the host.

Input: {"model": "x.F32.gguf", "n_threads": 2, "kv_type": "f32", "tasks": [...]}
Output: {"version", "system_info", "results": [...]}; tasks and results as in protocol.py.
With "serve": true instead of "tasks": protocol.py's serve mode (a task at a time).
"""

from __future__ import annotations

import ctypes
import time

import llama_cpp as lc
import numpy as np
from protocol import read_args, run_tasks, serve, write_result

N_BATCH = 512  # logical and physical batch (tokens per llama_decode), as infergen's step budget
KV_TYPES = {"f32": lc.GGML_TYPE_F32, "f16": lc.GGML_TYPE_F16}


class Runner:
    def __init__(self, model_path: str, n_threads: int, kv_type: str):
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {model_path}")
        vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(vocab)
        self.n_threads = n_threads
        self.kv_type = KV_TYPES[kv_type]
        self.ctx = None
        self.ctx_shape = None

    def context(self, n_seqs: int, ctx_per_seq: int):
        """A context holding n_seqs sequences of up to ctx_per_seq tokens each (reused when the
        shape matches; its memory is cleared)."""
        shape = (n_seqs, ctx_per_seq)
        if self.ctx_shape != shape:
            if self.ctx is not None:
                lc.llama_free(self.ctx)
            params = lc.llama_context_default_params()
            params.n_ctx = n_seqs * ctx_per_seq
            params.n_batch = N_BATCH
            params.n_ubatch = N_BATCH
            params.n_seq_max = n_seqs
            params.n_threads = self.n_threads
            params.n_threads_batch = self.n_threads
            params.type_k = self.kv_type
            params.type_v = self.kv_type
            params.kv_unified = False  # one KV stream per sequence (no shared prefixes here)
            self.ctx = lc.llama_init_from_model(self.model, params)
            if not self.ctx:
                raise SystemExit(f"llama.cpp could not create a context {shape}")
            self.ctx_shape = shape
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        return self.ctx

    def decode(self, items: list[tuple[int, int, int, bool]]) -> list[int]:
        """One llama_decode of (token, pos, seq_id, want_logits) items, in chunks of N_BATCH.
        Returns the greedy next token of every item that asked for logits, in order."""
        out: list[int] = []
        for lo in range(0, len(items), N_BATCH):
            chunk = items[lo : lo + N_BATCH]
            batch = lc.llama_batch_init(len(chunk), 0, 1)
            try:
                for i, (token, pos, seq, logits) in enumerate(chunk):
                    batch.token[i] = token
                    batch.pos[i] = pos
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = int(logits)
                batch.n_tokens = len(chunk)
                rc = lc.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise SystemExit(f"llama_decode returned {rc}")
                for i, (_, _, _, logits) in enumerate(chunk):
                    if logits:
                        ptr = lc.llama_get_logits_ith(self.ctx, i)
                        row = np.ctypeslib.as_array(
                            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,)
                        )
                        out.append(int(row.argmax()))
            finally:
                lc.llama_batch_free(batch)
        return out

    # ---- tasks ------------------------------------------------------------------------------
    def run_decode(self, prompt: list[int], max_tokens: int) -> dict:
        self.context(1, _ctx_size(len(prompt) + max_tokens))
        items = [(t, p, 0, p == len(prompt) - 1) for p, t in enumerate(prompt)]
        start = time.perf_counter()
        tokens = self.decode(items)
        first = time.perf_counter()
        pos = len(prompt)
        while len(tokens) < max_tokens:
            tokens += self.decode([(tokens[-1], pos, 0, True)])
            pos += 1
        end = time.perf_counter()
        return {"ttft_s": first - start, "decode_s": end - first, "tokens": tokens}

    def run_prefill(self, prompt: list[int]) -> dict:
        self.context(1, _ctx_size(len(prompt) + 1))
        items = [(t, p, 0, p == len(prompt) - 1) for p, t in enumerate(prompt)]
        start = time.perf_counter()
        self.decode(items)
        return {"seconds": time.perf_counter() - start, "tokens": len(prompt)}

    def run_concurrent(self, prompts: list[list[int]], max_tokens: int) -> dict:
        """All prompts prefilled in N_BATCH-token batches mixing sequences, then every sequence
        decodes one token per llama_decode, all in one batch (lockstep; same lengths here)."""
        longest = max(len(p) for p in prompts)
        self.context(len(prompts), _ctx_size(longest + max_tokens))
        items = [
            (t, p, s, p == len(prompt) - 1)
            for s, prompt in enumerate(prompts)
            for p, t in enumerate(prompt)
        ]
        start = time.perf_counter()
        firsts = self.decode(items)
        prefill_s = time.perf_counter() - start
        outputs = [[t] for t in firsts]
        positions = [len(p) for p in prompts]
        while True:
            live = [s for s, out in enumerate(outputs) if len(out) < max_tokens]
            if not live:
                break
            step = [(outputs[s][-1], positions[s], s, True) for s in live]
            for s, token in zip(live, self.decode(step), strict=True):
                outputs[s].append(token)
                positions[s] += 1
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "prefill_s": prefill_s,
            "output_tokens": sum(len(o) for o in outputs),
            "outputs": outputs,
        }


def _ctx_size(tokens: int) -> int:
    return -(-tokens // 256) * 256  # llama.cpp pads contexts to 256


def main() -> None:
    args = read_args()
    runner = Runner(args["model"], int(args.get("n_threads", 2)), args.get("kv_type", "f32"))
    system_info = lc.llama_print_system_info().decode(errors="replace").strip()
    retries = int(args.get("retries", 0))
    if args.get("serve"):
        serve(runner, retries, version=lc.__version__, system_info=system_info)
        return
    results = run_tasks(runner, args["tasks"], retries)
    write_result({"version": lc.__version__, "system_info": system_info, "results": results})


if __name__ == "__main__":
    main()
