"""The host's cost of the steps the engine runs op by op, by layer part.

A decode step of a plain Llama-shaped model runs as one native call (models/fused_decode.py;
on a GPU, a replayed CUDA graph) and costs a few launches. Every other step — one with a chunk
of several tokens, or any step of a model whose layers the fused decode does not cover
(recurrent, latent-attention, expert, sandwich-norm or sliding-window layers) — runs layer by
layer, op by op, from Python: 30 to 200 torch and native calls per layer at 5 to 30 us each.
On a CPU that cost is a large part of a small model's step (a random Falcon-H1 of 55M
parameters: ~13 of a 26 ms decode), and counting it as six launches a layer predicted half of
the step.

perf/eager_measure.py times it where it happens: the engine's own layers of a tiny model of
each family (io/random_checkpoint.py: hidden 64, so their arithmetic is negligible and what
is left is the cost of running them), every step op by op, each part's forward timed in its
place — a mixer by kind (ModelDesc's "attention", "mla", "ssm", "linear_attention",
"attention+ssm"; an attention layer with per-head q/k norms or an output gate as its own
part, "attention+qk_norm" (Gemma-3's tiny layer: 130–135 us against a Llama layer's 73–92
here) or, gated too, "attention+qk_norm+output_gate" (Qwen3-Next): `mixer_part`), a
feed-forward by kind ("dense", "moe") and an RMSNorm ("norm") — in decode steps of two
sequences and in 2-token prefill steps. `infergen perf calibrate` stores the medians in the
cpu-local row (Hardware.eager_layer_s); perf/roofline.py adds
`eager_seconds` of a step's layers where the engine runs the step op by op
(`fused_decode_covers`), in place of the launches it counts otherwise.
"""

from __future__ import annotations

from infergen.config.description import Attention, ModelDesc


def fused_decode_covers(desc: ModelDesc) -> bool:
    """Whether the engine's fused decode (models/fused_decode.py: no `Transformer.layer_features`)
    runs this model's decode steps: every layer Llama-shaped attention (no q/k norm, sinks or
    output gate; one window for all) with a gated dense feed-forward and no sandwich norms.
    (The engine also needs SiLU and full-width RoPE, which the description does not carry.)"""
    windows = set()
    for layer in desc.layers:
        m, f = layer.mixer, layer.ffn
        if not isinstance(m, Attention) or m.qk_norm or m.sinks or m.output_gate:
            return False
        if f is None or f.kind != "dense" or not f.gated or layer.sandwich_norms:
            return False
        windows.add(m.window)
    return len(windows) == 1


# attention features whose layers the engine runs with more ops (their own eager part)
ATTENTION_FEATURES = ("qk_norm", "output_gate")


def mixer_part(mixer) -> str:
    """The eager part a mixer is timed as: its kind, an attention with ATTENTION_FEATURES
    with them appended ("attention+qk_norm")."""
    if not isinstance(mixer, Attention):
        return mixer.kind
    return "+".join([mixer.kind, *(f for f in ATTENTION_FEATURES if getattr(mixer, f))])


def eager_seconds(desc: ModelDesc, table: dict[str, tuple[float, float]], decode: bool) -> float:
    """Seconds of running `desc`'s layers op by op in a decode (or a prefill) step, from a
    measured `table` ({part: (decode, prefill)}); a mixer part the table lacks costs as its
    kind (a table calibrated before the attention variants), any other part nothing."""
    column = 0 if decode else 1

    def cost(part: str) -> float:
        return table.get(part, (0.0, 0.0))[column]

    total = 0.0
    for layer in desc.layers:
        part = mixer_part(layer.mixer)
        total += cost(part if part in table else layer.mixer.kind) + layer.norms * cost("norm")
        if layer.ffn is not None:
            total += cost(layer.ffn.kind)
    return total + cost("norm")  # the final norm
