"""The engine on a GPU against plain torch on the same GPU (issue 22; run by device_check.sh).

A model with Llama-3.1-8B's shapes and random bf16 weights (no checkpoint to download: every
layer reads the same few random tensors from the host, each gets its own GPU copy), measured:

- `copy`: device copy bandwidth (read + write bytes / s): the roofline's bandwidth;
- `attention`: paged decode attention (ops/paged_decode_triton.py) GB/s of K/V read at 4k and
  32k context, and % of the copy bandwidth;
- `decode`: engine decode tok/s at batch 1 / 8 / 32 / 128 with CUDA graphs, and % of the
  HBM roofline (bytes a step reads — every weight once + each sequence's K/V — ÷ the copy
  bandwidth, against the measured step time); batch 1 and 8 with graphs off as well;
- `prefill`: engine tok/s of one 2k-token prompt and % of the bf16 peak (hardware row);
- `fp8_linear`: the decoder layer's projections at batch 1 (and 8) as W8A8 FP8 through
  `torch._scaled_mm` against bf16 F.linear (what FP8 W8A8 decode buys where the weights
  dominate);
- peers: an eager torch decode loop (SDPA over a static KV cache, gpt-fast style) and the same
  under `torch.compile(mode="reduce-overhead")`, batch 1 and 8, on their own copy of the
  weights; the ratio engine ÷ peer is in each decode line.

Each measurement is written as soon as it is made (a timeout keeps what came before). On the
CPU, `--device cpu --layers 2 --hidden 256` runs the same code on a toy model (a smoke test:
tests/bench/test_bench_gpu.py), with the figures meaningless.

Usage: python3 benchmarks/bench_gpu.py --out benchmarks/results/gpu_engine.jsonl
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from results_file import write_lines  # noqa: E402

from infergen.config import ModelConfig  # noqa: E402
from infergen.engine.engine import Engine  # noqa: E402
from infergen.engine.options import engine_config  # noqa: E402
from infergen.engine.sampling_params import SamplingParams  # noqa: E402
from infergen.io.checkpoint import Checkpoint  # noqa: E402
from infergen.perf.hardware import HARDWARE  # noqa: E402

LLAMA_31_8B = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
    intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu", tie_word_embeddings=False,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=8192),
    bos_token_id=128000, eos_token_id=128001,
)  # fmt: skip
PROMPT, DECODE_STEPS = 128, 32


def model_config(args) -> ModelConfig:
    cfg = dict(LLAMA_31_8B, num_hidden_layers=args.layers)
    if args.hidden:  # a toy of the same shape family (the CPU smoke test)
        h = args.hidden
        cfg.update(hidden_size=h, intermediate_size=int(3.5 * h), num_attention_heads=h // 128 * 4
                   or 4, num_key_value_heads=1, head_dim=32, vocab_size=1024)  # fmt: skip
    return ModelConfig.from_hf_dict(cfg, source="bench_gpu: Llama-3.1-8B shapes")


def random_tensors(config: ModelConfig, device: str) -> dict[str, torch.Tensor]:
    """Checkpoint names → random bf16 tensors on the host; every layer shares one set (the
    engine copies each into its own weights)."""
    gen = torch.Generator(device=device).manual_seed(0)
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.q_size, config.kv_size

    def randn(*shape, std=0.02):
        t = torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)
        return (t * std).cpu()

    shared = {
        "self_attn.q_proj.weight": randn(q, h), "self_attn.k_proj.weight": randn(kv, h),
        "self_attn.v_proj.weight": randn(kv, h), "self_attn.o_proj.weight": randn(h, q),
        "mlp.gate_proj.weight": randn(i, h), "mlp.up_proj.weight": randn(i, h),
        "mlp.down_proj.weight": randn(h, i),
        "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
    }  # fmt: skip
    tensors = {
        f"model.layers.{n}.{name}": t
        for n in range(config.num_hidden_layers)
        for name, t in shared.items()
    }
    tensors["model.embed_tokens.weight"] = randn(config.vocab_size, h, std=1.0)
    tensors["lm_head.weight"] = randn(config.vocab_size, h)
    tensors["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    return tensors


def timed(fn, device: str, repeat: int = 5) -> float:
    """Median seconds of fn() (synchronized on a GPU)."""
    times = []
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes read + written per second by a device copy."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / timed(lambda: dst.copy_(src), device, 10)


def attention_lines(config: ModelConfig, device: str, copy_bw: float, base: dict) -> list:
    """Paged decode attention GB/s at 4k and 32k context (batch 1 and 8, bf16 cache)."""
    from infergen.ops.paged_decode_triton import paged_decode_triton

    lines = []
    heads, kv_heads, dim, block = (config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim, 16)  # fmt: skip
    for context in (4096, 32768):
        for batch in (1, 8):
            blocks = batch * context // block
            k = torch.randn(blocks, block, kv_heads, dim, dtype=torch.bfloat16, device=device)
            v = torch.randn_like(k)
            tables = torch.randperm(blocks, device=device).view(batch, -1)
            lens = torch.full((batch,), context, device=device)
            q = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device=device)

            def attend(q=q, k=k, v=v, tables=tables, lens=lens, context=context):
                return paged_decode_triton(q, k, v, tables, lens, dim**-0.5, max_context=context)

            seconds = timed(attend, device, 20)
            read = 2 * k.numel() * k.element_size()
            lines.append({**base, "case": "attention", "context": context, "batch": batch,
                          "gb_per_s": read / seconds / 1e9,
                          "copy_pct": 100 * read / seconds / copy_bw})  # fmt: skip
    return lines


def engine(config: ModelConfig, args, **options) -> Engine:
    tensors = random_tensors(config, args.device)
    checkpoint = Checkpoint(config, tensors, None, pathlib.Path("bench_gpu"), "hf")
    opts = dict(device=args.device, max_num_seqs=max(args.batches), max_model_len=4096,
                max_num_batched_tokens=4096, enable_prefix_caching=False)  # fmt: skip
    if args.device == "cpu":
        opts.update(kv_cache_memory="512MiB", dtype="bfloat16", kernels="torch")
    opts.update(options)
    return Engine(engine_config(**opts), checkpoint)


def decode_seconds(eng: Engine, batch: int, steps: int = DECODE_STEPS) -> float:
    """Seconds per decode step of `batch` sequences with PROMPT-token contexts."""
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=steps + 3, temperature=0, ignore_eos=True)
    for _ in range(batch):
        prompt = torch.randint(10, 1000, (PROMPT,), generator=gen).tolist()
        eng.add_request(prompt, params)
    sched = eng.scheduler
    while sched.waiting or any(not seq.output_token_ids for seq in sched.running):
        eng.step()  # the prefills (and a first token each)
    eng.step()  # warm: every sequence decoding
    sync(eng.config.device)
    start = time.perf_counter()
    for _ in range(steps):
        eng.step()
    sync(eng.config.device)
    seconds = (time.perf_counter() - start) / steps
    while eng.has_unfinished():
        eng.step()
    return seconds


def step_bytes(eng: Engine, config: ModelConfig, batch: int) -> float:
    """Bytes a decode step reads: every weight once, each sequence's K/V (bf16)."""
    weights = sum(t.numel() * t.element_size() for t in eng.runner.model.state_dict().values())
    context = PROMPT + DECODE_STEPS // 2
    return weights + batch * context * config.kv_bytes_per_token(2)


def engine_lines(config: ModelConfig, args, copy_bw: float, base: dict) -> list:
    eng = engine(config, args)
    capture = eng.graph_capture
    lines = []
    model = eng.runner.model
    graphs = model.fast_path
    for batch in args.batches:
        for mode in ("graphs", "eager") if batch <= 8 else ("graphs",):
            model.fast_path = graphs if mode == "graphs" else None
            seconds = decode_seconds(eng, batch)
            nbytes = step_bytes(eng, config, batch)
            line = {**base, "case": "decode", "batch": batch, "mode": mode,
                    "tok_per_s": batch / seconds, "step_ms": seconds * 1e3,
                    "roofline_pct": 100 * nbytes / seconds / copy_bw,
                    "capture_s": capture.seconds if capture else None}  # fmt: skip
            lines.append(line)
            print(line, flush=True)
    model.fast_path = graphs
    lines.append(prefill_line(eng, config, args, base))
    return lines


def prefill_line(eng: Engine, config: ModelConfig, args, base: dict) -> dict:
    tokens = 2048 if args.device != "cpu" else 64
    prompt = torch.randint(10, 1000, (tokens,)).tolist()

    def run():
        eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True, temperature=0))
        while eng.has_unfinished():
            eng.step()

    seconds = timed(run, args.device, 3)
    flops = 2 * config.num_parameters * tokens + config.num_hidden_layers * 2 * \
        config.num_attention_heads * config.head_dim * tokens**2  # fmt: skip
    peak = HARDWARE.get(args.hardware, where="--hardware").flops["bf16"]  # dense FLOP/s
    return {**base, "case": "prefill", "tokens": tokens, "tok_per_s": tokens / seconds,
            "peak_pct": 100 * flops / seconds / peak}  # fmt: skip


def fp8_lines(config: ModelConfig, device: str, base: dict) -> list:
    """W8A8 FP8 (torch._scaled_mm, per-token × per-channel scales) vs bf16 F.linear over one
    decoder layer's projections."""
    if not device.startswith("cuda") or torch.cuda.get_device_capability() < (8, 9):
        return []
    h, i, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    shapes = [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]
    fp8 = torch.float8_e4m3fn
    lines = []
    for tokens in (1, 8, 32):
        bf16_s = fp8_s = 0.0
        for n, k in shapes:
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
            x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
            w8 = (w / (w.abs().amax(1, keepdim=True) / 448)).to(fp8)
            sw = (w.abs().amax(1) / 448).float()[None, :]
            rows = max(16, tokens)  # _scaled_mm wants M a multiple of 16 on some versions

            def quantized(x=x, w8=w8, sw=sw, rows=rows):
                xp = F.pad(x, (0, 0, 0, rows - x.shape[0]))
                sx = (xp.abs().amax(1, keepdim=True).float() / 448).clamp(min=1e-12)
                x8 = (xp / sx).to(fp8)
                return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw,
                                        out_dtype=torch.bfloat16)  # fmt: skip

            bf16_s += timed(lambda x=x, w=w: F.linear(x, w), device, 20)
            fp8_s += timed(quantized, device, 20)
        lines.append({**base, "case": "fp8_linear", "tokens": tokens, "bf16_us": bf16_s * 1e6,
                      "fp8_us": fp8_s * 1e6, "speedup": bf16_s / fp8_s})  # fmt: skip
    return lines


class TorchLlama(torch.nn.Module):
    """The peer: a plain torch decode step over a static KV cache (gpt-fast style)."""

    def __init__(self, config: ModelConfig, tensors: dict, device: str, batch: int, max_len: int):
        super().__init__()
        c = config
        self.c = c
        get = {k: v.to(device) for k, v in tensors.items() if "layers.0." in k or "layers" not in k}
        self.embed, self.head = get["model.embed_tokens.weight"], get["lm_head.weight"]
        layer = {k.split("layers.0.")[1]: v for k, v in get.items() if "layers.0." in k}
        self.wqkv = [torch.cat([layer[f"self_attn.{p}_proj.weight"] for p in "qkv"]).clone()
                     for _ in range(c.num_hidden_layers)]  # fmt: skip
        self.wo = [layer["self_attn.o_proj.weight"].clone() for _ in range(c.num_hidden_layers)]
        gate_up = torch.cat([layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]])
        self.w13 = [gate_up.clone() for _ in range(c.num_hidden_layers)]
        self.w2 = [layer["mlp.down_proj.weight"].clone() for _ in range(c.num_hidden_layers)]
        shape = (batch, c.num_key_value_heads, max_len, c.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=device)
                  for _ in range(c.num_hidden_layers)]  # fmt: skip
        self.v = [torch.zeros_like(k) for k in self.k]
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=device) / c.head_dim))
        angles = torch.outer(torch.arange(max_len, device=device).float(), inv)
        self.cos, self.sin = angles.cos().bfloat16(), angles.sin().bfloat16()
        self.mask = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()

    def rope(self, x, pos):  # x [b, heads, 1, d]
        half = x.shape[-1] // 2
        cos, sin = self.cos[pos][:, None, None, :], self.sin[pos][:, None, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, tokens, pos):  # tokens [b], pos [1] (one position for the batch)
        c = self.c
        x = self.embed[tokens]  # [b, h]
        b = x.shape[0]
        for n in range(c.num_hidden_layers):
            y = F.rms_norm(x, (c.hidden_size,), eps=c.rms_norm_eps)
            qkv = F.linear(y, self.wqkv[n])
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], -1)
            q = self.rope(q.view(b, -1, 1, c.head_dim), pos)
            k = self.rope(k.view(b, -1, 1, c.head_dim), pos)
            self.k[n].index_copy_(2, pos, k)
            self.v[n].index_copy_(2, pos, v.view(b, -1, 1, c.head_dim))
            o = F.scaled_dot_product_attention(q, self.k[n], self.v[n],
                                               attn_mask=self.mask[pos][None, None],
                                               enable_gqa=True)  # fmt: skip
            x = x + F.linear(o.reshape(b, -1), self.wo[n])
            y = F.rms_norm(x, (c.hidden_size,), eps=c.rms_norm_eps)
            gate, up = F.linear(y, self.w13[n]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, self.w2[n])
        return F.linear(F.rms_norm(x, (c.hidden_size,), eps=c.rms_norm_eps), self.head)


def peer_rates(config: ModelConfig, args, base: dict, lines: list) -> dict:
    """tok/s of the eager and the compiled torch loop per batch: {batch: {peer: tok/s}}."""
    rates: dict[int, dict[str, float]] = {}
    tensors = random_tensors(config, args.device)
    for batch in [b for b in args.batches if b <= 8]:  # the peers at the small batches
        model = TorchLlama(config, tensors, args.device, batch, PROMPT + 2 * DECODE_STEPS)
        tokens = torch.zeros(batch, dtype=torch.long, device=args.device)
        steps = {"torch_eager": torch.no_grad()(model.forward)}
        if args.compile_peer and batch == min(args.batches):  # one compile (~1 min, 32 layers)
            steps["torch_compile"] = torch.compile(model.forward, mode="reduce-overhead")
        for name, step in steps.items():
            start = time.perf_counter()
            with torch.no_grad():
                for p in range(3):  # warm (compiles and records the graph)
                    step(tokens, torch.tensor([PROMPT + p], device=args.device))
            warm = time.perf_counter() - start

            def run(step=step, tokens=tokens):
                with torch.no_grad():
                    for p in range(DECODE_STEPS):
                        step(tokens, torch.tensor([PROMPT + p], device=args.device))

            seconds = timed(run, args.device, 3) / DECODE_STEPS
            rates.setdefault(batch, {})[name] = batch / seconds
            line = {**base, "case": "peer", "peer": name, "batch": batch,
                    "tok_per_s": batch / seconds, "warmup_s": warm}  # fmt: skip
            lines.append(line)
            print(line, flush=True)
        del model, steps, step
        torch._dynamo.reset()  # the compiled graphs' memory pools go too
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "results" / "gpu_engine.jsonl")  # fmt: skip
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (8B: 32)")
    parser.add_argument(
        "--hardware",
        default="h200",
        help="the perf/hardware.json row whose bf16 peak prefill is set against",
    )
    parser.add_argument("--hidden", type=int, default=0, help="a toy hidden size (smoke test)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument(
        "--no-compile-peer",
        dest="compile_peer",
        action="store_false",
        help="skip the torch.compile peer (its compile takes a minute)",
    )
    args = parser.parse_args()
    config = model_config(args)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    base = {"bench": "gpu_engine", "gpu": gpu, "torch": torch.__version__,
            "model": f"Llama-3.1-8B shapes, {args.layers} layers, random bf16"}  # fmt: skip
    try:
        import triton

        base["triton"] = triton.__version__
    except ImportError:
        pass
    lines: list[dict] = []

    def save(new: list[dict]) -> None:
        lines.extend(new)
        write_lines(args.out, lines)

    copy_bw = copy_bandwidth(args.device, (1 << 30) if args.device != "cpu" else (1 << 24))
    save([{**base, "case": "copy", "gb_per_s": copy_bw / 1e9}])
    if args.device != "cpu":
        save(attention_lines(config, args.device, copy_bw, base))
    save(fp8_lines(config, args.device, base))
    save(engine_lines(config, args, copy_bw, base))  # before the peers: the figures that matter
    gc.collect()  # the engine's weights, KV pool and graphs go before the peers load theirs
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    peers = peer_rates(config, args, base, lines)
    for line in lines:  # the ratios, in the engine's decode lines
        rates = peers.get(line.get("batch"), {}) if line["case"] == "decode" else {}
        for peer, tok_s in rates.items():
            line[f"vs_{peer}"] = line["tok_per_s"] / tok_s
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
