"""Capture: the IR graph of a model method, traced from the model code with torch.fx.

Our layers call ops, never raw kernels, so tracing stops at them: `Linear` and `RMSNorm`
modules and the op functions (ROPE / SILU_MUL / GELU_MUL backends, `kv_store`,
`paged_attention`) become single IR nodes whatever backend the engine picked; the views,
slices and shape arithmetic between them become LAYOUT nodes. Every architecture the generic
decoder assembles is thus captured without a hand-written graph (tests/compiler/
test_capture.py runs each against the layer itself).

The engine's in-place updates become SSA values: the RMSNorm that adds the pending delta into
the residual stream returns the new stream (later reads of `h` use it), and the KV store
returns the new caches; both are graph outputs.

`capture(module, method, args)` returns a `Captured`: the graph, and for each graph
input where its runtime value comes from (`bind`).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from infergen.compiler.ir import Graph, Namer, Node, Op, Sym, Value
from infergen.compiler.shapes import infer
from infergen.compiler.trace import leaf_functions, trace
from infergen.compiler.verify import verify
from infergen.errors import InfergenError
from infergen.layers.linear import Linear
from infergen.layers.moe import MoE
from infergen.layers.norm import RMSNorm
from infergen.ops.attention_operands import ATTENTION_OPERANDS
from infergen.ops.attention_sinks import SinkCore
from infergen.ops.linear import LINEAR_BACKENDS

BLOCKS = Sym("B")  # KV cache blocks: fixed per engine, not part of what a kernel is built for


class CaptureError(InfergenError):
    """Model code that capture cannot turn into IR: names the construct and the node."""


# torch functions / operators on tensors that map to one pointwise op: (op, op with a scalar)
FX_POINTWISE: dict[Any, tuple[Op, Op | None]] = {
    operator.add: (Op.ADD, Op.ADD_SCALAR),
    operator.mul: (Op.MUL, Op.MUL_SCALAR),
    operator.sub: (Op.SUB, None),
    operator.neg: (Op.NEG, None),
    torch.sigmoid: (Op.SIGMOID, None),
    torch.rsqrt: (Op.RSQRT, None),
}


class Struct:
    """A non-tensor argument (the ForwardBatch, a layer's KVLayer) as the graph sees it: named
    fields that are graph inputs or nested structs. Fields a KV store replaces are updated, so
    later reads see the new cache."""

    def __init__(self, **fields: Value | Struct):
        self.fields = fields

    def get(self, attr: str, where: str) -> Value | Struct:
        if attr not in self.fields:
            raise CaptureError(
                f"capture: {where} reads .{attr}, which the graph does not model",
                expected=f"one of {sorted(self.fields)}",
            )
        return self.fields[attr]

    def flatten(self, prefix: str) -> list[tuple[str, Value]]:
        out: list[tuple[str, Value]] = []
        for attr, field in self.fields.items():
            path = f"{prefix}.{attr}"
            out.extend(field.flatten(path) if isinstance(field, Struct) else [(path, field)])
        return out


_LINEAR_FORMATS = {"torch": None, "native": None}  # fp32 backends: the dtype says it all


def _linear_format(linear: Linear) -> str | None:
    for name, backend in LINEAR_BACKENDS.items():
        if backend is linear.backend:
            return _LINEAR_FORMATS.get(name, name)
    raise CaptureError(f"capture: linear backend {linear.backend!r} is not registered")


def _name_of(registry_items, value, what: str) -> str:
    for name, row in registry_items:
        if row is value:
            return name
    raise CaptureError(f"capture: {what} {value!r} is not a registered row")


@dataclass
class Source:
    """Where a graph input's runtime value comes from: `origin` (an argument of the call, or
    "module" for the traced module itself), then attribute names ("kv", ("k",)) or
    ("module", ("attn", "qkv", "weight"))."""

    origin: str
    attrs: tuple[str, ...]

    def fetch(self, module: nn.Module, args: dict[str, Any]) -> Any:
        obj = module if self.origin == "module" else args[self.origin]
        for attr in self.attrs:  # (a digit: an item of a tuple, a (KV, states) cache pair)
            obj = obj[int(attr)] if attr.isdigit() else getattr(obj, attr)
        return obj


@dataclass
class Captured:
    graph: Graph
    sources: dict[str, Source]  # graph input name → where its runtime value comes from
    outputs: list[str]  # per graph output: "return", or the argument it updates in place

    def bind(self, module: nn.Module, **args: Any) -> dict[str, Any]:
        """Runtime values of the graph inputs for a call `module.<method>(**args)`."""
        return {name: src.fetch(module, args) for name, src in self.sources.items()}


class _Converter:
    """fx graph → IR graph, node by node, in execution order."""

    def __init__(
        self,
        root: nn.Module,
        name: str,
        args: dict[str, Value | Struct],
        mixers: dict[nn.Module, str],
    ):
        self.root = root
        self.args = args
        self.mixers = mixers  # module run whole → its label (the MIXER node's attrs)
        self.namer = Namer()
        self.inputs: list[Value] = []
        self.sources: dict[str, Source] = {}
        self.nodes: list[Node] = []
        self.weights: dict[tuple[int, str], Value] = {}
        self.name = name
        for arg, spec in args.items():
            leaves = spec.flatten(arg) if isinstance(spec, Struct) else [(arg, spec)]
            for path, value in leaves:
                origin, *attrs = path.split(".")
                self._add_input(value, Source(origin, tuple(attrs)))

    def _add_input(self, value: Value, source: Source) -> Value:
        value.name = self.namer(value.name)
        self.inputs.append(value)
        self.sources[value.name] = source
        return value

    def weight(self, module: nn.Module, path: str, attr: str, fmt: str | None = None) -> Value:
        """The graph input for `module.<attr>` (a parameter / buffer of the traced module)."""
        key = (id(module), attr)
        if key not in self.weights:
            linear = isinstance(module, Linear)
            # (a Linear's weight is stored in its backend's layout — packed panels, or a
            # PreparedTensors of codes and scales —; the graph sees the checkpoint's [out, in])
            if linear and attr == "weight":
                shape = (module.out_features, module.in_features)
            else:
                shape = tuple(getattr(module, attr).shape)
            value = Value(
                f"{path}.{attr}" if path else attr,
                shape,
                module.dtype if linear else getattr(module, attr).dtype,
                "weight",
                fmt,
            )
            attrs = (*path.split("."), attr) if path else (attr,)
            if isinstance(module, Linear) and attr == "weight":
                attrs = attrs[:-1]  # the Linear itself: its weight is read through it
            self.weights[key] = self._add_input(value, Source("module", attrs))
        return self.weights[key]

    def _module(self, module: nn.Module, path: str, value: Value) -> Value:
        """The graph input for a module run whole (an MoE layer, a mixer): bound to the module
        itself per layer, like a Linear for its weight."""
        key = (id(module), "")
        if key not in self.weights:
            self.weights[key] = self._add_input(value, Source("module", tuple(path.split("."))))
        return self.weights[key]

    def _whole(self, arg: Any, where: str) -> Value:
        """An argument of the traced call, or a part of one, passed on whole (a mixer's view of
        the step, its cache layer): one opaque graph input bound to it."""
        path = next((p for n, spec in self.args.items() if (p := _path_of(arg, spec, n))), None)
        if path is None:
            raise CaptureError(f"capture: a mixer is passed {arg!r}", where=where,
                               expected="the traced call's arguments or their parts")  # fmt: skip
        key = (id(arg), "whole")
        if key not in self.weights:
            origin, *attrs = path.split(".")
            value = Value(f"{path}_whole", (), None, "opaque")
            self.weights[key] = self._add_input(value, Source(origin, tuple(attrs)))
        return self.weights[key]

    def emit(
        self, op: Op, inputs: tuple[Value | None, ...], name: str | tuple[str, ...], **attrs
    ) -> list[Value]:
        results = infer(op, inputs, attrs)
        names = (name,) if isinstance(name, str) else name
        outputs = tuple(
            Value(self.namer(n), shape, dtype)
            for n, (shape, dtype) in zip(names, results, strict=True)
        )
        self.nodes.append(Node(op, inputs, outputs, attrs))
        return list(outputs)

    def run(self, fx_graph: fx.Graph) -> tuple[Graph, dict[str, Source], list[str]]:
        env: dict[fx.Node, Any] = {}
        self.rebound: dict[str, Value] = {}  # argument name → its value after in-place updates
        result = None
        for node in fx_graph.nodes:
            where = f"{node.format_node()}"
            if node.op == "placeholder":
                env[node] = self.args.get(node.target) if node.target in self.args else None
            elif node.op == "output":
                result = fx.node.map_arg(node.args[0], lambda n: env[n])
            else:
                args = fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
                handler = getattr(self, f"_{node.op}")
                env[node] = handler(node, args, kwargs, env, where)
        outputs, roles = self._outputs(result)
        graph = Graph(self.name, self.inputs, self.nodes, outputs)
        return verify(graph), self.sources, roles

    def _outputs(self, result: Any) -> tuple[list[Value], list[str]]:
        returned = result if isinstance(result, (tuple, list)) else (result,)
        outputs, roles = [], []
        for i, value in enumerate(returned):
            if not isinstance(value, Value):
                raise CaptureError(f"capture: {self.name} returns {value!r}, not a tensor")
            outputs.append(value)
            roles.append(f"return.{i}" if len(returned) > 1 else "return")
        for arg, value in self.rebound.items():  # updated in place by the engine
            outputs.append(value)
            roles.append(arg)
        for arg, spec in self.args.items():
            if isinstance(spec, Struct):
                for path, value in spec.flatten(arg):
                    if value.role == "cache" and value not in self.inputs:
                        outputs.append(value)
                        roles.append(path)
        return outputs, roles

    # ---- fx node kinds -------------------------------------------------------------------
    def _get_attr(self, node, args, kwargs, env, where) -> Value:
        path, _, attr = node.target.rpartition(".")
        module = self.root.get_submodule(path) if path else self.root
        return self.weight(module, path, attr)

    def _call_module(self, node, args, kwargs, env, where) -> Value:
        module = self.root.get_submodule(node.target)
        name = node.target
        if isinstance(module, Linear):
            (x,) = args
            if module.act is not None:  # weight + activation scheme: inputs quantized first
                (x,) = self.emit(
                    Op.QUANTIZE_ACT,
                    (x,),
                    f"{name}.input",
                    fmt=module.act.act.fmt,
                    granularity=module.act.act.granularity,
                    quantizer=module.act,
                )
            weight = self.weight(module, name, "weight", _linear_format(module))
            bias = self.weight(module, name, "bias") if module.bias is not None else None
            return self.emit(
                Op.LINEAR, (x, weight, bias), name.replace(".", "_"), format=weight.format or "f32"
            )[0]
        if isinstance(module, MoE):
            (x,) = args
            shape = (module.moe.num_experts,)
            value = Value(name, shape, module.router.dtype, "weight", "moe")
            experts = self._module(module, name, value)
            return self.emit(Op.MOE, (x, experts), name.replace(".", "_"))[0]
        if module in self.mixers:  # (the layer's mixer seat: module(x, batch, cache layer))
            x, step, cache = args
            mixer = self._module(module, name, Value(name, (), None, "weight", "mixer"))
            inputs = (x, mixer, self._whole(step, where), self._whole(cache, where))
            return self.emit(Op.MIXER, inputs, name.replace(".", "_"), mixer=self.mixers[module])[0]
        if isinstance(module, RMSNorm):
            weight = self.weight(module, name, "weight")
            x, *delta = args
            if not delta or delta[0] is None:
                return self.emit(Op.RMS_NORM, (x, weight), name, eps=module.eps)[0]
            y, h = self.emit(Op.ADD_RMS_NORM, (x, delta[0], weight), (name, x.name), eps=module.eps)
            self._rebind(x, h, env)
            return y
        raise CaptureError(
            f"capture: module {name} ({type(module).__name__}) has no IR op",
            where=where,
            expected="Linear, RMSNorm, MoE or mixer leaves",
        )

    def _rebind(self, old: Value, new: Value, env) -> None:
        """`old` was updated in place: later reads of that fx value see `new`."""
        for fx_node, value in list(env.items()):
            if value is old:
                env[fx_node] = new
        for arg, spec in self.args.items():
            if spec is old or self.rebound.get(arg) is old:
                self.rebound[arg] = new

    def _call_method(self, node, args, kwargs, env, where) -> Any:
        x, *rest = args
        if node.target in ("view", "reshape"):
            shape = (
                tuple(rest[0])
                if len(rest) == 1 and isinstance(rest[0], (tuple, list))
                else tuple(rest)
            )
            result = infer(Op.VIEW, (x,), {"shape": shape})[0][0]
            return self.emit(Op.VIEW, (x,), x.name, shape=result)[0]
        if node.target in ("float", "contiguous") or (node.target == "to" and rest == [x.dtype]):
            if node.target == "float" and x.dtype != torch.float32:
                return self.emit(Op.CAST, (x,), x.name, dtype=torch.float32)[0]
            return x
        raise CaptureError(f"capture: tensor method .{node.target}() has no IR op", where=where)

    def _call_function(self, node, args, kwargs, env, where) -> Any:
        target = node.target
        leaf = leaf_functions().get(target)
        if leaf is not None:
            return getattr(self, f"_leaf_{leaf.label}")(target, args, kwargs, where)
        if target is getattr:
            obj, attr = args
            if isinstance(obj, Struct):
                return obj.get(attr, where)
            if isinstance(obj, Value) and attr in ("shape", "dtype"):
                return obj.shape if attr == "shape" else obj.dtype
            raise CaptureError(f"capture: reads .{attr} of {obj!r}", where=where)
        if target is operator.getitem and isinstance(args[0], Value):
            return self._index(args[0], args[1], where)
        if target is operator.getitem and isinstance(args[0], Struct):  # (a cache pair's part)
            return args[0].get(str(args[1]), where)
        if target is torch.cat and any(isinstance(a, Value) for a in args[0]):
            return self._concat(args, kwargs, where)
        values = [a for a in (*args, *kwargs.values()) if isinstance(a, Value)]
        if target in FX_POINTWISE and values:
            return self._pointwise(target, args, where)
        if values or any(isinstance(a, Sym) for a in args) and target is not operator.getitem:
            raise CaptureError(
                f"capture: {getattr(target, '__name__', target)} has no IR op", where=where
            )
        return target(*args, **kwargs)  # plain Python on constants (shape arithmetic)

    def _concat(self, args, kwargs, where: str) -> Value:
        """torch.cat of graph values along one dimension (Qwen3-Next's partial RoPE: rotated
        dims beside the rest)."""
        tensors, dim = args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0)
        if not all(isinstance(t, Value) for t in tensors):
            raise CaptureError("capture: torch.cat of a graph value and a constant", where=where)
        dim = dim % tensors[0].rank
        return self.emit(Op.CONCAT, tuple(tensors), "cat", dim=dim)[0]

    def _pointwise(self, target, args, where) -> Value:
        op, scalar_op = FX_POINTWISE[target]
        if len(args) == 1:
            return self.emit(op, (args[0],), op.label)[0]
        a, b = args
        if isinstance(a, Value) and isinstance(b, Value):
            return self.emit(op, (a, b), op.label)[0]
        tensor, scalar = (a, b) if isinstance(a, Value) else (b, a)
        if scalar_op is None or not isinstance(scalar, (int, float)):
            raise CaptureError(f"capture: {op.label} of a tensor and {scalar!r}", where=where)
        return self.emit(scalar_op, (tensor,), op.label, value=float(scalar))[0]

    def _index(self, x: Value, index: Any, where: str) -> Value:
        index = index if isinstance(index, tuple) else (index,)
        if Ellipsis in index:  # (the dimensions it stands for: whole)
            at = index.index(Ellipsis)
            whole = (slice(None),) * (x.rank - len(index) + 1)
            index = index[:at] + whole + index[at + 1 :]
        if any(not isinstance(i, slice) or i.step not in (None, 1) for i in index):
            raise CaptureError(
                f"capture: indexing {x!r} with {index}",
                where=where,
                expected="slices with unit step",
            )
        for dim, part in enumerate(index):
            size = x.shape[dim]
            if part == slice(None):
                continue
            if isinstance(size, Sym):
                raise CaptureError(f"capture: slicing dynamic dimension {size}", where=where)
            start, stop, _ = part.indices(size)
            name = f"{x.name}[{start}:{stop}]"
            x = self.emit(Op.SLICE, (x,), name, dim=dim, start=start, stop=stop)[0]
        return x

    # ---- op functions kept whole ------------------------------------------------------------
    def _leaf_rope(self, fn, args, kwargs, where) -> Value:
        x, rope = args
        positions, table = rope.get("positions", where), rope.get("cache", where)
        return self.emit(Op.ROPE, (x, positions, table), f"{x.name}_rot")[0]

    def _leaf_silu_mul(self, fn, args, kwargs, where) -> Value:
        return self.emit(Op.SILU_MUL, (args[0],), "act")[0]

    def _leaf_gelu_mul(self, fn, args, kwargs, where) -> Value:
        return self.emit(Op.GELU_MUL, (args[0],), "act")[0]

    def _leaf_kv_store(self, fn, args, kwargs, where) -> None:
        call = inspect.signature(fn).bind(*args, **kwargs).arguments
        kv = call.get("kv")
        k_cache, v_cache = call["k_cache"], call["v_cache"]
        new_k, new_v = self.emit(
            Op.KV_STORE,
            (call["k"], call["v"], k_cache, v_cache, call["slot_mapping"], *_kv_scales(kv)),
            (k_cache.name, v_cache.name),
            format=k_cache.format or "f32",
        )
        new_k.role = new_v.role = "cache"
        new_k.format, new_v.format = k_cache.format, v_cache.format
        if isinstance(kv, Struct):
            for field, old, new in (("k", k_cache, new_k), ("v", v_cache, new_v)):
                if kv.fields.get(field) is old:
                    kv.fields[field] = new
        return None

    def _leaf_attention(self, fn, args, kwargs, where) -> Value:
        call = inspect.signature(fn).bind(*args, **kwargs).arguments
        core = call.get("core", ATTENTION_OPERANDS.get("fp32"))
        names = ("q", "k_new", "v_new", "k_cache", "v_cache", "attn_plan")
        inputs = (*(call[n] for n in names), call.get("new_slots"), *_kv_scales(call.get("kv")))
        attrs = dict(scale=float(call["scale"]), kv_format=call["k_cache"].format or "f32")
        if isinstance(core, SinkCore):  # learned sink logits: the module's, one more input
            inputs += (self._sinks(core, where),)
            attrs.update(operands="fp32", sinks=True)
        else:
            attrs["operands"] = _name_of(ATTENTION_OPERANDS.items(), core, "attention core")
        return self.emit(Op.ATTENTION, inputs, "attn", **attrs)[0]

    def _sinks(self, core: SinkCore, where: str) -> Value:
        """The graph input of a sink core's logits: the parameter of the module holding them."""
        for path, module in self.root.named_modules():
            if module is not self.root and getattr(module, "sinks", None) is core.sinks:
                return self.weight(module, path, "sinks")
        raise CaptureError("capture: sink logits of no module", where=where)


def _path_of(arg: Any, spec: Any, path: str) -> str | None:
    """The dotted path of `arg` inside the argument described by `spec` (named `path`)."""
    if spec is arg:
        return path
    if isinstance(spec, Struct):
        for attr, field in spec.fields.items():
            found = _path_of(arg, field, f"{path}.{attr}")
            if found:
                return found
    return None


def _kv_scales(kv: Any) -> tuple[Value, ...]:
    """A scaled KV format's per-head scales and key shift (KV store and attention inputs)."""
    if not isinstance(kv, Struct) or "k_scale" not in kv.fields:
        return ()
    return kv.fields["k_scale"], kv.fields["v_scale"], kv.fields["k_shift"]


def capture(
    module: nn.Module,
    method: str,
    args: dict[str, Value | Struct],
    name: str | None = None,
    mixers: dict[nn.Module, str] | None = None,
) -> Captured:
    """The IR of `module.<method>(**args)`; `args` describes each argument (a Value, or a
    Struct of them); `mixers`: submodules kept whole as MIXER nodes (module → label). Raises
    CaptureError naming the construct capture has no op for."""
    mixers = mixers or {}
    fx_graph = trace(module, method, tuple(mixers))
    graph, sources, roles = _Converter(module, name or method, args, mixers).run(fx_graph)
    return Captured(graph, sources, roles)
