"""`infergen info`: architecture, parameter count, weight and KV bytes of a checkpoint, or of any
Hugging Face config.json (described without weights)."""

from __future__ import annotations

import argparse

from infergen.cli.predict import add_weight_args, describe_model, weight_formats


def add_parser(sub) -> None:
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


def _weight_rows(args: argparse.Namespace, d) -> list[tuple[str, str]]:
    """The checkpoint's stored weight formats and the weight bytes in the formats of
    --weights / --expert-weights (default: the stored ones)."""
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


def _head_layout(c) -> str:
    if c.num_key_value_heads == c.num_attention_heads:
        return "MHA"
    return "MQA" if c.num_key_value_heads == 1 else "GQA"
