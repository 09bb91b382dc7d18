"""Tracing with torch.fx down to our ops (the first half of capture, capture.py converts).

`Linear`, `RMSNorm` and `MoE` modules are leaf modules (and the mixers the caller names:
the per-layer fallback, capture.py's MIXER nodes); op functions are kept whole as single call
nodes whichever backend the engine picked: the global ones (`kv_store`, `paged_attention`)
through fx's autowrap, the ones a layer holds as an attribute (its RoPE / SiLU-mul / GELU-mul
backend) by standing in for them while tracing (`_LeafCall`). Any method can be traced, not only
`forward` (`Transformer.head`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from infergen.compiler.ir import Op
from infergen.layers.linear import Linear
from infergen.layers.moe import MoE
from infergen.layers.norm import RMSNorm
from infergen.ops.gelu_mul import GELU_MUL_BACKENDS
from infergen.ops.kv_store import kv_store
from infergen.ops.paged_attention import paged_attention
from infergen.ops.rope import ROPE_BACKENDS
from infergen.ops.rope_kv_store import ROPE_STORE_BACKENDS
from infergen.ops.silu_mul import SILU_MUL_BACKENDS

# modules traced as one call: projections, norms, and mixture-of-experts feed-forwards (whose
# routing depends on the values: one MOE node the module runs)
LEAF_MODULES = (Linear, RMSNorm, MoE)


def leaf_functions() -> dict[Callable, Op]:
    """Op functions the tracer keeps whole (every backend of the op is the same IR node)."""
    table: dict[Callable, Op] = {kv_store: Op.KV_STORE, paged_attention: Op.ATTENTION}
    for registry, op in (
        (ROPE_BACKENDS, Op.ROPE),
        (SILU_MUL_BACKENDS, Op.SILU_MUL),
        (GELU_MUL_BACKENDS, Op.GELU_MUL),
    ):
        for _, fn in registry.items():
            table[fn] = op
    return table


def composite_functions() -> dict[Callable, Callable]:
    """Fused op functions the tracer traces as their composition (the op's torch row), so the
    graph holds the parts the compiler fuses itself: RoPE + KV store → ROPE and KV_STORE."""
    composition = ROPE_STORE_BACKENDS.get("torch")
    return {fn: composition for _, fn in ROPE_STORE_BACKENDS.items()}


class _LeafCall:
    """Stands in for an op function held as a module attribute while tracing: with proxy
    arguments it records one call node, otherwise it calls the function."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, fx.Proxy):
                return arg.tracer.create_proxy("call_function", self.fn, args, kwargs)
        return self.fn(*args, **kwargs)


class _Tracer(fx.Tracer):
    def __init__(self, root: nn.Module, whole: frozenset[int]):
        super().__init__(autowrap_functions=(kv_store, paged_attention))
        self.paths = {module: name for name, module in root.named_modules()}
        self.whole = whole  # id()s of further modules traced as one call (opaque mixers)

    def is_leaf_module(self, module: nn.Module, name: str) -> bool:
        return (
            isinstance(module, LEAF_MODULES)
            or id(module) in self.whole
            or super().is_leaf_module(module, name)
        )

    def path_of_module(self, module: nn.Module) -> str:
        return self.paths[module]  # names relative to the module whose method is traced

    def create_arg(self, a: Any) -> Any:
        # op functions passed as arguments (the decode backend, the attention core) stay as
        # they are: the converter reads them, fx never generates code from this graph
        if callable(a) and not isinstance(a, (nn.Module, fx.Proxy, torch.Tensor, type)):
            return a
        return super().create_arg(a)


def trace(module: nn.Module, method: str, whole: tuple[nn.Module, ...] = ()) -> fx.Graph:
    """The fx graph of `module.<method>` (any method, not only forward), with op functions
    held as module attributes kept whole, and the submodules `whole` as one call each."""
    leaves, composites = leaf_functions(), composite_functions()
    swapped: list[tuple[nn.Module, str, Any]] = []
    for sub in module.modules():
        for attr, value in list(vars(sub).items()):
            if callable(value) and _hashable(value) and value in leaves:
                swapped.append((sub, attr, value))
                setattr(sub, attr, _LeafCall(value))
            elif callable(value) and _hashable(value) and value in composites:
                swapped.append((sub, attr, value))
                setattr(sub, attr, composites[value])
    try:
        with warnings.catch_warnings():  # fx cannot assert on the specialised `self`
            warnings.simplefilter("ignore", UserWarning)
            fn = getattr(type(module), method)
            tracer = _Tracer(module, frozenset(id(m) for m in whole))
            return tracer.trace(fn, concrete_args={"self": module})
    finally:
        for sub, attr, value in swapped:
            setattr(sub, attr, value)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
