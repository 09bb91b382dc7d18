"""compressed-tensors checkpoints (`"quant_method": "compressed-tensors"` in config.json, the
layout vLLM loads): reading them into QuantWeights our backends run as stored, and the tensor
layout `infergen quantize` writes (engine/export.py).

Per quantized Linear `<p>` (weights [out, in]):
  pack-quantized (int4 / int8): `<p>.weight_packed` int32 [out, in·bits/32], value q + 2^(bits−1)
      (unsigned), element i of a row in bits [i·bits, (i+1)·bits) of its word; `<p>.weight_scale`
      [out, in / group] (group) or [out, 1] (channel); `<p>.weight_zero_point` (asymmetric)
      int32 [ceil(out / 8), groups], packed the same way along the output rows;
      `<p>.weight_shape` int64 [2].  w = (q − zero_point) · scale.
  naive-quantized / float-quantized (FP8): `<p>.weight` float8_e4m3fn, `<p>.weight_scale`
      [out, 1] or [1].  w = q · scale.
  nvfp4-pack-quantized: `<p>.weight_packed` uint8 [out, in / 2] (even column in the low nibble),
      `<p>.weight_scale` float8_e4m3fn [out, in / 16], `<p>.weight_global_scale` fp32 [1],
      a divisor: w = e2m1 · (scale / global_scale).
  mxfp4-pack-quantized: `<p>.weight_packed` as NVFP4, `<p>.weight_scale` uint8 E8M0
      [out, in / 32].  w = e2m1 · 2^(e − 127).
KV cache (`kv_cache_scheme` FP8): `model.layers.N.self_attn.k_scale` / `v_scale`, [1] or
[kv_heads, 1, 1]: k ≈ e4m3(k / k_scale) · k_scale.
Input activations (`input_activations`, ACTIVATION_ARGS): dynamic schemes store nothing; static
ones `<p>.input_scale` [1] (x ≈ q · input_scale) and NVFP4 `<p>.input_global_scale` [1], a
divisor like the weights' (global scale = 1 / it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from infergen.errors import CheckpointError
from infergen.formats.quant_weight import QuantWeight

GROUP = 32  # our group kernels' group size: a checkpoint's groups must be multiples of it

# our activation scheme (quant/activations.py) → its compressed-tensors input_activations
ACTIVATION_ARGS: dict[str, dict[str, Any]] = {
    "fp8_e4m3": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                 "dynamic": True, "group_size": None},
    "fp8_e4m3_static": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
                        "dynamic": False, "group_size": None},
    "int8": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
             "dynamic": True, "group_size": None},
    "int8_static": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor",
                    "dynamic": False, "group_size": None},
    "mxfp8": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
              "dynamic": True, "group_size": 32, "scale_dtype": "torch.uint8"},
    "mxfp4": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
              "dynamic": True, "group_size": 32, "scale_dtype": "torch.uint8"},
    "nvfp4": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
              "dynamic": "local", "group_size": 16, "scale_dtype": "torch.float8_e4m3fn"},
}  # fmt: skip
_ACTIVATION_KEY = ("num_bits", "type", "strategy", "dynamic", "group_size")


class InputScale(NamedTuple):
    """How a static activation scheme stores a projection's input scale: `<p>` + suffix, the
    scale itself or (NVFP4's global scale) its divisor."""

    suffix: str
    divisor: bool

    def stored(self, scale: torch.Tensor) -> torch.Tensor:
        """Our scale → the tensor the checkpoint holds ([1] fp32)."""
        return (1.0 / scale if self.divisor else scale).reshape(1).float().clone()

    def scale(self, stored: torch.Tensor) -> torch.Tensor:
        """The checkpoint's tensor → our scale."""
        return 1.0 / stored if self.divisor else stored


# the static activation schemes' input scales (dynamic schemes store none)
INPUT_SCALES = {
    "fp8_e4m3_static": InputScale(".input_scale", divisor=False),
    "int8_static": InputScale(".input_scale", divisor=False),
    "nvfp4": InputScale(".input_global_scale", divisor=True),
}


class CompressedExtras(NamedTuple):
    """What a compressed-tensors checkpoint carries besides its weights."""

    kv_scales: torch.Tensor | None  # FP8 KV cache scales [layers, 2, kv_heads]
    activations: str | None  # our activation scheme (ACTIVATION_ARGS), None: weight-only
    input_scales: dict[str, torch.Tensor]  # `<p>` → its static scale [1] (static schemes)


def activation_scheme(args: dict[str, Any], where: str) -> str:
    """input_activations args → our activation scheme (a clear error when we have none)."""
    key = tuple(args.get(k) for k in _ACTIVATION_KEY)
    for name, ours in ACTIVATION_ARGS.items():
        if key == tuple(ours.get(k) for k in _ACTIVATION_KEY):
            return name
    raise _unsupported(where, f"input_activations {args}")


def pack_int32(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes [rows, n] (< 2^bits) → int32 [rows, n·bits/32], element i in bits
    [i·bits, (i+1)·bits) of word i·bits/32 (bits 4 or 8)."""
    per = 32 // bits
    rows, n = values.shape
    padded = torch.zeros(rows, -(-n // per) * per, dtype=torch.int64)
    padded[:, :n] = values.to(torch.int64)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = (padded.view(rows, -1, per) << shifts).sum(-1)
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement of the top bit


def unpack_int32(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The inverse of `pack_int32`: uint8 codes [rows, n]."""
    per = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, dtype=torch.int64) * bits
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :n].to(torch.uint8)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, n/2] → codes [rows, n], even columns from the low nibbles."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def _per_group(scale: torch.Tensor, out: int, inp: int, where: str) -> torch.Tensor:
    """A group / channel scale [out, in / g] or [out, 1] → fp32 [out, in / 32]."""
    groups = scale.shape[-1] if scale.dim() == 2 else 1
    g = inp // groups
    if g % GROUP:
        raise CheckpointError(
            "quantization group size is not a multiple of 32",
            where=where,
            found=f"groups of {g} inputs",
            expected="group_size 32, 64, 128, ... or per channel",
        )
    return scale.float().reshape(out, groups).repeat_interleave(g // GROUP, dim=1)


def _unsupported(where: str, found: str) -> CheckpointError:
    return CheckpointError(
        "compressed-tensors scheme not supported",
        where=where,
        found=found,
        expected="int4 (symmetric or asymmetric, group size a multiple of 32) or int8 (per "
        "channel) pack-quantized; FP8 per channel / tensor; NVFP4; MXFP4 (weights only)",
    )


def read_weight(tensors: dict[str, torch.Tensor], prefix: str, fmt: str, args: dict,
                source: str) -> QuantWeight:  # fmt: skip
    """Pop `<prefix>.weight*` tensors of one Linear and return its QuantWeight."""
    where = f"{source}: {prefix}"
    bits, kind = args.get("num_bits"), args.get("type")
    if fmt in ("naive-quantized", "float-quantized") and kind == "float" and bits == 8:
        codes = tensors.pop(prefix + ".weight")
        out, inp = codes.shape
        scale = tensors.pop(prefix + ".weight_scale").float().reshape(-1)
        scale = scale.expand(out).contiguous() if scale.numel() == 1 else scale
        return QuantWeight("fp8_e4m3", codes.view(torch.uint8), (scale,), None, (out, inp))
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        packed = tensors.pop(prefix + ".weight_packed")
        out, inp = packed.shape[0], packed.shape[1] * 2
        scale = tensors.pop(prefix + ".weight_scale").reshape(out, -1)
        codes = _nibbles(packed)
        if fmt == "mxfp4-pack-quantized":
            return QuantWeight("mxfp4", codes, (scale.view(torch.uint8),), None, (out, inp))
        divisor = tensors.pop(prefix + ".weight_global_scale").float().reshape(-1)[0].item()
        e4m3 = scale.view(torch.uint8)
        halves = (e4m3[:, 0::2].contiguous(), e4m3[:, 1::2].contiguous())
        return QuantWeight("nvfp4", codes, halves, 1.0 / divisor, (out, inp))
    if fmt == "pack-quantized" and kind == "int" and bits in (4, 8):
        packed = tensors.pop(prefix + ".weight_packed")
        out, inp = (int(v) for v in tensors.pop(prefix + ".weight_shape").tolist())
        scale = tensors.pop(prefix + ".weight_scale")
        codes = unpack_int32(packed, bits, inp)  # q + 2^(bits-1)
        zero = tensors.pop(prefix + ".weight_zero_point", None)
        if bits == 8:
            if zero is not None or scale.numel() != out:
                raise _unsupported(where, "int8 with groups or zero points")
            signed = (codes.to(torch.int16) - 128).to(torch.int8).view(torch.uint8)
            return QuantWeight("int8", signed, (scale.float().reshape(out),), None, (out, inp))
        scales = _per_group(scale, out, inp, where)
        if zero is None:
            return QuantWeight("int4", codes, (scales,), None, (out, inp))
        groups = scale.reshape(out, -1).shape[1]
        z = unpack_int32(zero.t().contiguous(), 4, out).t()  # zp + 8, [out, groups]
        z = z.repeat_interleave(scales.shape[1] // groups, dim=1).contiguous()
        return QuantWeight("int4_asym", codes, (scales, z), None, (out, inp))
    raise _unsupported(where, f"format {fmt!r}, weights {args}")


def read_checkpoint(tensors: dict[str, torch.Tensor], qconfig: dict[str, Any], source: str,
                    num_layers: int, kv_heads: int) -> torch.Tensor | None:  # fmt: skip
    """Replace every quantized Linear's tensors in `tensors` (in place) by a QuantWeight under
    `<p>.weight`; returns the KV scales, activation scheme and input scales it carries."""
    groups = list((qconfig.get("config_groups") or {}).values())
    if len(groups) != 1 or not groups[0].get("weights"):
        raise _unsupported(source, f"{len(groups)} config groups")
    group = groups[0]
    activations, input_scales = None, {}
    if group.get("input_activations"):
        activations = activation_scheme(group["input_activations"], source)
        input_scales = _input_scales(tensors, activations, source)
    fmt = group.get("format") or qconfig.get("format")
    stored = (".weight_packed", ".weight_scale")
    prefixes = sorted({name.rsplit(".", 1)[0] for name in tensors if name.endswith(stored)})
    for prefix in prefixes:
        weight = read_weight(tensors, prefix, fmt, group["weights"], source)
        bad = weight.nonfinite()  # the load-time check: corrupt scales or codes
        if bad:
            raise CheckpointError(
                "quantized weight decodes to non-finite values (corrupt scales?)",
                where=f"{source}: {prefix}",
                found=f"{bad} NaN/Inf scales or codes ({weight.fmt})",
                expected="finite scales",
            )
        tensors[prefix + ".weight"] = weight
    return CompressedExtras(_kv_scales(tensors, qconfig, source, num_layers, kv_heads),
                            activations, input_scales)  # fmt: skip


def _input_scales(tensors: dict[str, torch.Tensor], scheme: str, source: str) -> dict:
    """`<p>` → static input scale [1], popped from `tensors` (none for dynamic schemes)."""
    layout = INPUT_SCALES.get(scheme)
    if layout is None:
        return {}
    suffix = layout.suffix
    scales = {}
    for name in [n for n in tensors if n.endswith(suffix)]:
        value = tensors.pop(name).float().reshape(-1)
        if value.numel() != 1 or not bool(torch.isfinite(value).all()) or float(value) <= 0:
            raise CheckpointError(
                "static input activation scale is not usable",
                where=f"{source}: {name}",
                found=f"{value.numel()} values, {value[:4].tolist()}",
                expected="one finite positive fp32 scale",
            )
        scales[name.removesuffix(suffix)] = layout.scale(value)
    if not scales:
        raise CheckpointError(
            f"static {scheme} input activations without their scales",
            where=source,
            expected=f"`<projection>{suffix}` tensors",
        )
    return scales


def _kv_scales(tensors, qconfig, source, num_layers, kv_heads) -> torch.Tensor | None:
    kv = qconfig.get("kv_cache_scheme")
    if not kv:
        return None
    if kv.get("type") != "float" or kv.get("num_bits") != 8:
        raise _unsupported(source, f"kv_cache_scheme {kv}")
    scales = torch.empty(num_layers, 2, kv_heads)
    for layer in range(num_layers):
        for j, kind in enumerate(("k_scale", "v_scale")):
            name = f"model.layers.{layer}.self_attn.{kind}"
            if name not in tensors:
                raise CheckpointError(
                    "the FP8 KV cache scheme's scale is missing",
                    where=f"{source}: {name}",
                    expected="one scale per layer (or per KV head) for K and for V",
                )
            scales[layer, j] = tensors.pop(name).float().reshape(-1).expand(kv_heads)
    return scales
