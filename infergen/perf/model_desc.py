"""What the performance model knows about a model: its shapes, layer by layer, read from any
config (a Hugging Face config.json, a directory holding one, or a GGUF), and what follows from
them: exact parameter counts (total, and active per token for mixtures of experts), weight
bytes in a storage format, KV-cache bytes per token (and per sequence, where sliding windows
cap it), and the constant-size state of SSM layers.

A layer is a token mixer — "attention" (MHA / GQA / MQA, optionally a sliding window),
"mla" (DeepSeek's latent attention: one compressed KV vector of kv_lora_rank +
qk_rope_head_dim per token) or "ssm" (Mamba-2: a fixed state per sequence) — plus a feed-forward
part: "dense", "moe" or none. Architectures are rows of CONFIG_READERS (model_type -> reader).

Counting conventions, as transformers instantiates the models (the tests compare against
it on the meta device): embeddings once when tied; norms and biases included; DeepSeek's
multi-token-prediction layer excluded (transformers does not build it). "Active" parameters
are those a token multiplies with: the total minus the routed experts it does not use and
minus the input embedding table (a lookup; counted once when tied to the LM head).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

from infergen.config.description import (
    MLA,
    SSM,
    Attention,
    Dense,
    Layer,
    ModelDesc,
    MoE,
    describe,
)
from infergen.errors import ConfigError
from infergen.io.checkpoint import load_checkpoint
from infergen.registry import Registry

# ---- readers ---------------------------------------------------------------------------------
ConfigReader = Callable[[dict, str], ModelDesc]
CONFIG_READERS: Registry[ConfigReader] = Registry("architecture (config.json model_type)")


def _need(config: dict, key: str, source: str):
    if key not in config or config[key] is None:
        raise ConfigError(f"config lacks {key!r}", where=source, expected=f"a value for {key}")
    return config[key]


def _head_dim(config: dict, source: str) -> int:
    return config.get("head_dim") or _need(config, "hidden_size", source) // _need(
        config, "num_attention_heads", source
    )


def _base(config: dict, source: str, layers: list[Layer], **extra) -> ModelDesc:
    return ModelDesc(
        name=_name_of(source),
        architecture=config.get("model_type", "?"),
        hidden=_need(config, "hidden_size", source),
        vocab=_need(config, "vocab_size", source),
        layers=tuple(layers),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=config.get("max_position_embeddings"),
        source=source,
        **extra,
    )


def _name_of(source: str) -> str:
    """A model's name: its directory for a config.json, else the file's stem."""
    path = pathlib.Path(source)
    return (path.parent.name if path.name == "config.json" else path.stem) or source


def _layer_windows(config: dict, n_layers: int) -> list[int | None]:
    """Sliding window of each layer: `layer_types` when the config lists them, else Mistral's
    rule (every layer, when sliding_window is set) or Qwen2's (layers from max_window_layers
    on, when use_sliding_window)."""
    window = config.get("sliding_window")
    if "layer_types" in config:
        types = config["layer_types"]
        return [window if t == "sliding_attention" else None for t in types[:n_layers]]
    if not window or not config.get("use_sliding_window", True):
        return [None] * n_layers
    first = config.get("max_window_layers", 0) if "use_sliding_window" in config else 0
    return [window if i >= first else None for i in range(n_layers)]


def _llama_like(qkv_bias: bool | None = None, o_bias: bool | None = None, qk_norm=False):
    def read(config: dict, source: str) -> ModelDesc:
        bias = bool(config.get("attention_bias", False))
        n_layers = _need(config, "num_hidden_layers", source)
        heads = _need(config, "num_attention_heads", source)
        layers = [
            Layer(
                Attention(
                    heads=heads,
                    kv_heads=config.get("num_key_value_heads") or heads,
                    head_dim=_head_dim(config, source),
                    window=window,
                    qkv_bias=bias if qkv_bias is None else qkv_bias,
                    o_bias=bias if o_bias is None else o_bias,
                    qk_norm=qk_norm,
                ),
                Dense(_need(config, "intermediate_size", source), bool(config.get("mlp_bias"))),
            )
            for window in _layer_windows(config, n_layers)
        ]
        return _base(config, source, layers)

    return read


CONFIG_READERS.register("llama", _llama_like())
CONFIG_READERS.register("mistral", _llama_like(qkv_bias=False, o_bias=False))
CONFIG_READERS.register("qwen2", _llama_like(qkv_bias=True, o_bias=False))
CONFIG_READERS.register("qwen3", _llama_like(qk_norm=True))


def _deepseek(config: dict, source: str) -> ModelDesc:
    n_layers = _need(config, "num_hidden_layers", source)
    mla = MLA(
        heads=_need(config, "num_attention_heads", source),
        q_lora_rank=config.get("q_lora_rank"),
        kv_lora_rank=_need(config, "kv_lora_rank", source),
        qk_nope_head_dim=_need(config, "qk_nope_head_dim", source),
        qk_rope_head_dim=_need(config, "qk_rope_head_dim", source),
        v_head_dim=_need(config, "v_head_dim", source),
    )
    experts = config.get("n_routed_experts")
    moe = MoE(
        experts=experts or 0,
        top_k=config.get("num_experts_per_tok") or 0,
        intermediate=config.get("moe_intermediate_size") or 0,
        shared_intermediate=(config.get("moe_intermediate_size") or 0)
        * (config.get("n_shared_experts") or 0),
        # V3's e_score_correction_bias is a buffer in transformers, not a parameter (E floats)
    )
    dense = Dense(_need(config, "intermediate_size", source))
    first_dense = config.get("first_k_dense_replace", 0)
    every = config.get("moe_layer_freq", 1)
    layers = [
        Layer(mla, moe if experts and i >= first_dense and i % every == 0 else dense)
        for i in range(n_layers)
    ]
    notes = ()
    if config.get("num_nextn_predict_layers"):
        notes = ("multi-token-prediction layers not counted (transformers does not build them)",)
    return _base(config, source, layers, notes=notes)


CONFIG_READERS.register("deepseek_v2", _deepseek)
CONFIG_READERS.register("deepseek_v3", _deepseek)


def _gpt_oss(config: dict, source: str) -> ModelDesc:
    n_layers = _need(config, "num_hidden_layers", source)
    heads = _need(config, "num_attention_heads", source)
    moe = MoE(
        experts=_need(config, "num_local_experts", source),
        top_k=config.get("num_experts_per_tok") or _need(config, "experts_per_token", source),
        intermediate=_need(config, "intermediate_size", source),
        router_bias=True,
        expert_bias=True,
    )
    layers = [
        Layer(
            Attention(
                heads=heads,
                kv_heads=_need(config, "num_key_value_heads", source),
                head_dim=_head_dim(config, source),
                window=window,
                qkv_bias=bool(config.get("attention_bias", True)),
                o_bias=bool(config.get("attention_bias", True)),
                sinks=True,
            ),
            moe,
        )
        for window in _layer_windows(config, n_layers)
    ]
    return _base(config, source, layers)


CONFIG_READERS.register("gpt_oss", _gpt_oss)


def _mamba2(config: dict, source: str) -> ModelDesc:
    hidden = _need(config, "hidden_size", source)
    heads = _need(config, "num_heads", source)
    ssm = SSM(
        heads=heads,
        head_dim=config.get("head_dim") or int(config.get("expand", 2) * hidden) // heads,
        state_size=_need(config, "state_size", source),
        groups=config.get("n_groups", 1),
        conv_kernel=config.get("conv_kernel", 4),
        bias=bool(config.get("use_bias", False)),
        conv_bias=bool(config.get("use_conv_bias", True)),
    )
    layers = [Layer(ssm, None) for _ in range(_need(config, "num_hidden_layers", source))]
    return _base(config, source, layers)


CONFIG_READERS.register("mamba2", _mamba2)


def from_config(config: dict, source: str = "config") -> ModelDesc:
    model_type = config.get("model_type")
    if model_type is None:
        raise ConfigError("config has no model_type", where=source, expected="e.g. 'llama'")
    return CONFIG_READERS.get(model_type, where=f"{source}: model_type")(config, source)


def from_path(path: str | pathlib.Path) -> ModelDesc:
    """A config.json, a directory holding one, or a GGUF file."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ConfigError("model config not found", where=str(path), expected="a file")
    if path.suffix == ".gguf":
        return _from_gguf(path)
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}") from None
    return from_config(config, str(path))


def _from_gguf(path: pathlib.Path) -> ModelDesc:
    return from_model_config(load_checkpoint(path, load_weights=False).config)


def from_model_config(cfg) -> ModelDesc:
    """The engine's own ModelConfig (any checkpoint infergen loads) as a description."""
    return describe(cfg)
