"""Triton renderer: a fused pointwise / row-reduction group → one Triton kernel, one program per
token row (GPU; tested on the CPU with TRITON_INTERPRET=1).

Inside a program every value of the row is a 2-D register block [rows, cols] — its row shape
folded to (all dims but the last, the last), each padded to a power of two and masked — so
numpy broadcasting between (R, C), (1, C) and (R, 1) is Triton's. Layout ops are resolved at
load time, never on registers: slices, views and row gathers of the group's inputs become the
addresses a load reads (a `Ref`, as in codegen_c.py); a slice or view of a computed value
spills it to a per-row scratch row first; a concat is resolved at store time (its parts
stored side by side in the output row). A group outside this (a slice of a concat,
broadcasting a middle dimension) raises CodegenError and runs op by op.

The source is written into the JIT cache (`<root>/triton/<key>.py`, keyed by the Triton
version) and imported from there: Triton compiles a kernel from its source file, at its first
launch. The engine's compiled layers (runtime.py, compile="jit" with kernels="triton") build
every fused group of the layer graph as a TritonGroupKernel — the "triton" row of
runtime.GROUP_TARGETS — and time that first launch as the group's compile time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import time
from math import prod
from pathlib import Path

import torch

from infergen.compiler.codegen_c import CodegenError, Ref, _contiguous, _row_shape
from infergen.compiler.expressions import ELEMENTWISE, SCALAR_OPS, expression
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.jit_cache import COMPILER_VERSION, Built, JitCache
from infergen.compiler.tune import random_inputs


def _float(value: float) -> str:
    return repr(float(value))  # a Python literal inside the kernel source


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fold(shape: tuple[int, ...]) -> tuple[int, int]:
    """Row shape → (rows, cols) of its register block."""
    if not shape:
        return 1, 1
    return prod(shape[:-1]), shape[-1]


class _Renderer:
    def __init__(self, graph: Graph, name: str):
        self.graph, self.name = graph, name
        self.lines: list[str] = []
        self.refs: dict[int, Ref] = {}  # values still in memory (inputs and views of them)
        self.regs: dict[int, tuple[str, int, int]] = {}  # value → (register name, rows, cols)
        self.counter = 0
        self.concats: dict[int, Node] = {}  # concat outputs, stored part by part at the end

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def index(self, rows: int, cols: int) -> tuple[str, str, str]:
        """(row index, col index, mask) names for a (rows, cols) block."""
        r, c, m = self.fresh("r"), self.fresh("c"), self.fresh("m")
        self.emit(f"{r} = tl.arange(0, {_pow2(rows)})[:, None]")
        self.emit(f"{c} = tl.arange(0, {_pow2(cols)})[None, :]")
        self.emit(f"{m} = ({r} < {rows}) & ({c} < {cols})")
        return r, c, m

    def address(self, ref: Ref, r: str, c: str) -> str:
        """Element (r, c) of a ref's folded (rows, cols) view, as an offset expression."""
        shape, strides = ref.shape or (1,), ref.strides or (1,)
        terms = [str(ref.offset)]
        rest = r
        for d in range(len(shape) - 2, -1, -1):  # the folded row index → leading indices
            size = shape[d]
            terms.append(f"(({rest}) % {size}) * {strides[d]}")
            rest = f"({rest}) // {size}"
        terms.append(f"{c} * {strides[-1]}")
        return " + ".join(terms)

    def reg(self, value: Value) -> tuple[str, int, int]:
        """The value in registers (loaded from its ref the first time)."""
        if id(value) in self.regs:
            return self.regs[id(value)]
        ref = self.refs[id(value)]
        rows, cols = _fold(ref.shape)
        r, c, m = self.index(rows, cols)
        name = self.fresh("x")
        self.emit(f"{name} = tl.load({ref.base} + {self.address(ref, r, c)}, mask={m}, other=0.0)")
        self.regs[id(value)] = (name, rows, cols)
        return self.regs[id(value)]

    def render_node(self, node) -> None:
        op, out = node.op, node.outputs[0]
        if op in ELEMENTWISE:
            args = [self.reg(v) for v in node.inputs]
            rows, cols = _fold(_row_shape(out)[0])
            if any((a[1] not in (1, rows)) or (a[2] not in (1, cols)) for a in args):
                raise CodegenError("broadcast the folded block cannot express")
            scalar = _float(node.attrs["value"]) if op in SCALAR_OPS else None
            expr = expression(op, "triton", [a[0] for a in args], scalar)
            name = self.fresh("v")
            self.emit(f"{name} = {expr}")
            self.regs[id(out)] = (name, rows, cols)
        elif op in (Op.SUM, Op.MEAN):
            x, rows, cols = self.reg(node.inputs[0])
            r, c, m = self.index(rows, cols)
            name = self.fresh("v")
            total = f"tl.sum(tl.where({m}, {x}, 0.0), axis=1)[:, None]"
            self.emit(f"{name} = {total}" + (f" / {_float(cols)}" if op is Op.MEAN else ""))
            self.regs[id(out)] = (name, rows, 1)
        elif op in (Op.SLICE, Op.VIEW, Op.GATHER_ROWS):
            self.render_layout(node)
        elif op is Op.CONCAT:
            if not any(o is out for o in self.graph.outputs):
                raise CodegenError("a concat is stored only as a group output")
            self.regs[id(out)] = ("concat", 0, 0)
            self.concats[id(out)] = node
        else:
            raise CodegenError(f"no Triton code for {op.label}")

    def render_layout(self, node) -> None:
        op, out = node.op, node.outputs[0]
        if op is Op.GATHER_ROWS:
            table, index = node.inputs
            src = self.refs.get(id(table))
            if src is None or src.rowed or id(index) not in self.index_inputs:
                raise CodegenError("gather_rows of a computed table")
            row = prod(src.shape[1:])
            pos = self.fresh("g")
            self.emit(f"{pos} = tl.load({self.index_inputs[id(index)]} + t)")
            shape, _ = _row_shape(out)
            self.refs[id(out)] = Ref(
                f"({src.base} + {pos} * {row})", 0, shape, _contiguous(shape), True
            )
            return
        src = self.refs.get(id(node.inputs[0])) or self.spill(node.inputs[0])
        if op is Op.SLICE:
            dim = node.attrs["dim"] - (1 if src.rowed else 0)
            shape = list(src.shape)
            shape[dim] = node.attrs["stop"] - node.attrs["start"]
            offset = src.offset + node.attrs["start"] * src.strides[dim]
            self.refs[id(out)] = Ref(src.base, offset, tuple(shape), src.strides, src.rowed)
        else:  # VIEW
            if not src.contiguous():
                raise CodegenError("view of a strided slice")
            shape, _ = _row_shape(out)
            self.refs[id(out)] = Ref(src.base, src.offset, shape, _contiguous(shape), True)

    def spill(self, value: Value) -> Ref:
        """A computed value a slice or view reads: stored to this row's scratch (then read
        back through addresses like an input; the barrier makes the block's stores visible)."""
        shape, _ = _row_shape(value)
        if self.regs.get(id(value), ("",))[0] == "concat":
            raise CodegenError("a slice of a concat")
        target = Ref("sc", self.scratch, shape, _contiguous(shape), True)
        self.scratch += prod(shape)
        self.store_ref(target, value)
        self.emit("tl.debug_barrier()")
        self.refs[id(value)] = target
        return target

    def store(self, j: int, value: Value) -> None:
        shape, _ = _row_shape(value)
        if self.regs.get(id(value), ("",))[0] == "concat":
            node = self.concats[id(value)]
            dim, start = node.attrs["dim"] - 1, 0
            strides = _contiguous(shape)
            for part in node.inputs:
                part_shape, _ = _row_shape(part)
                target = Ref(f"o{j}", start * strides[dim], part_shape, strides, True)
                self.store_ref(target, part)
                start += part_shape[dim]
            return
        self.store_ref(Ref(f"o{j}", 0, shape, _contiguous(shape), True), value)

    def store_ref(self, target: Ref, value: Value) -> None:
        name, rows, cols = self.reg(value)
        r, c, m = self.index(*_fold(target.shape))
        full = (
            f"{name} + tl.zeros([{_pow2(_fold(target.shape)[0])}, "
            f"{_pow2(_fold(target.shape)[1])}], tl.float32)"
        )
        self.emit(f"tl.store({target.base} + {self.address(target, r, c)}, {full}, mask={m})")

    def render(self) -> str:
        params, strides = [], []
        self.scratch = 0  # floats per row spilled for slices / views of computed values
        self.index_inputs: dict[int, str] = {}
        for i, value in enumerate(self.graph.inputs):
            params.append(f"in{i}")
            if value.dtype == torch.int64 and value.rank == 1 and value.shape[0] == TOKENS:
                self.index_inputs[id(value)] = f"in{i}"
                continue
            if value.dtype != torch.float32:
                raise CodegenError(f"input %{value.name}: {value.dtype}, the renderer does fp32")
            shape, rowed = _row_shape(value)
            base = f"(in{i} + t * stride{i})" if rowed else f"in{i}"
            strides.append(f"stride{i}")
            self.refs[id(value)] = Ref(base, 0, shape, _contiguous(shape), rowed)
        for j, value in enumerate(self.graph.outputs):
            shape, rowed = _row_shape(value)
            if not rowed or value.dtype != torch.float32:
                raise CodegenError(f"output %{value.name} is not fp32 [T, ...]")
            params.append(f"out{j}")
            self.emit(f"o{j} = out{j} + t * {prod(shape)}")
        for node in self.graph.nodes:
            self.render_node(node)
        for j, value in enumerate(self.graph.outputs):
            self.store(j, value)
        signature = ", ".join([*params, "scratch", *strides])
        self.lines.insert(0, f"    sc = scratch + t * {self.scratch}")
        return "\n".join(
            [
                f'"""Generated by infergen.compiler.codegen_triton: group {self.graph.name}."""',
                "import triton",
                "import triton.language as tl",
                "",
                "",
                "@triton.jit",
                f"def {self.name}({signature}):",
                "    t = tl.program_id(0)",
                *self.lines,
                "",
                "",
                f"SCRATCH_FLOATS = {self.scratch}",
                "",
            ]
        )


def render_group_triton(graph: Graph, name: str) -> str:
    """Triton source of one fused group (function `name`); CodegenError when outside."""
    return _Renderer(graph, name).render()


def triton_target() -> str:
    """The JIT cache's target name of this renderer: Triton and its version."""
    try:
        return f"triton-{importlib.metadata.version('triton')}"
    except importlib.metadata.PackageNotFoundError:
        return "triton"


def load_triton_source(cache: JitCache, key: str, source: str):
    """(module, path, cached): `source` written into the JIT cache's `triton/<key>.py` (unless
    the same source is there: cached) and imported from there (Triton compiles a kernel from
    its source file at its first launch)."""
    path = Path(cache.root) / "triton" / f"{key}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(source.encode()).hexdigest()
    cached = path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == digest
    if not cached:
        tmp = path.with_suffix(f".{COMPILER_VERSION}.tmp")
        tmp.write_text(source)
        tmp.replace(path)  # atomic, as the C entries
    spec = importlib.util.spec_from_file_location(f"infergen_triton_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path, cached


class TritonGroupKernel:
    """A rendered group loaded from the JIT cache: `kernel(*inputs)` → output tensors.

    `built` reports it as the C kernels do (jit_cache.Built): `cached` when its source was in
    the JIT cache already; `seconds` is the first launch's wall time when `device` is given
    (Triton compiles a kernel as it first launches, or loads it from its own cache): one
    token row of random inputs on `device`, synchronized. Without `device` nothing launches
    (seconds 0)."""

    def __init__(self, graph: Graph, cache: JitCache, device: torch.device | str | None = None):
        self.graph = graph
        key = cache.key(graph.canonical(), "target=triton", triton_target())
        function = f"group_{key}"
        module, path, cached = load_triton_source(cache, key, render_group_triton(graph, function))
        self.fn = getattr(module, function)
        self.scratch_floats = module.SCRATCH_FLOATS
        self.path = path
        self.rowed = [v.rank >= 1 and v.shape[0] == TOKENS for v in graph.inputs]
        self.index = [v.dtype == torch.int64 for v in graph.inputs]
        self.out_rows = [tuple(v.shape[1:]) for v in graph.outputs]
        self.calls = 0  # launches (the engine's tests check the groups really ran here)
        seconds = 0.0 if device is None else self._first_launch(torch.device(device))
        self.built = Built(self.fn, key, path, seconds, cached)

    def _first_launch(self, device: torch.device) -> float:
        inputs = [x.to(device) for x in random_inputs(self.graph, 1)]
        started = time.perf_counter()
        self(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.calls = 0
        return time.perf_counter() - started

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        tensors, strides, tokens = [], [], None
        for x, rowed, is_index in zip(inputs, self.rowed, self.index, strict=True):
            if is_index:
                tokens = x.shape[0]
                tensors.append(x.contiguous())
                continue
            if rowed:
                tokens = x.shape[0]
                inner = tuple(x.stride()[1:])
                want = _contiguous(tuple(x.shape[1:]))
                x = x if inner == want else x.contiguous()
                strides.append(x.stride(0) if x.dim() > 1 else 1)
            else:
                x = x.contiguous()
                strides.append(0)
            tensors.append(x)
        device = tensors[0].device
        outputs = [
            torch.empty((tokens, *row), dtype=torch.float32, device=device) for row in self.out_rows
        ]
        scratch = torch.empty(max(1, tokens * self.scratch_floats), device=device)
        self.fn[(tokens,)](*tensors, *outputs, scratch, *strides)
        self.calls += 1
        return outputs
