"""A layer program writes the layer's outputs (delta, h) straight into the step's `delta` / `h`
when nothing reads those inputs afterwards (codegen_layer._streams), instead of copying them
there at the end of the layer; otherwise it keeps the copy. The programs' results against the
per-op path are tests/compiler/test_runtime.py's; here, which outputs are written in place."""

from __future__ import annotations

import torch

from infergen import LLM
from infergen.compiler.codegen_layer import _streams
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from tests.hf_models import build_hf_model

F32 = torch.float32


def _v(name, columns=4, role="activation"):
    return Value(name, (TOKENS, columns), F32, role)


def _graph(nodes, delta_out, h_out, inputs):
    return Graph("layer", inputs, nodes, [delta_out, h_out])


def test_outputs_written_after_their_inputs_last_read_go_in_place():
    h, delta = _v("h", role="input"), _v("delta", role="input")
    h1, y, h2 = _v("h.1"), _v("y"), _v("h.2")
    nodes = [
        Node(Op.ADD, (h, delta), (h1,), {}),
        Node(Op.MUL, (h1, h1), (y,), {}),
        Node(Op.ADD, (y, h1), (h2,), {}),
    ]
    assert _streams(_graph(nodes, y, h2, [h, delta])) == {"y": "delta", "h.2": "h"}


def test_an_output_whose_input_is_read_later_or_by_its_producer_is_copied():
    h, delta = _v("h", role="input"), _v("delta", role="input")
    h1, d1, z = _v("h.1"), _v("d.1"), _v("z")
    nodes = [
        Node(Op.MUL, (h, h), (h1,), {}),  # h's output: its producer reads h
        Node(Op.ADD, (h1, delta), (d1,), {}),  # delta's output: its producer reads delta
        Node(Op.ADD, (h, d1), (z,), {}),  # h read after h.1 is written
    ]
    assert _streams(_graph(nodes, d1, h1, [h, delta])) == {}


def test_an_output_of_another_shape_is_copied():
    h, delta = _v("h", role="input"), _v("delta", role="input")
    h1, wide = _v("h.1"), _v("wide", 8)
    nodes = [Node(Op.ADD, (h, delta), (h1,), {}), Node(Op.MUL, (h1, h1), (wide,), {})]
    assert _streams(_graph(nodes, wide, h1, [h, delta])) == {}


def test_programs_keep_the_copy_only_where_needed(tmp_path):
    """The default model's layers write both outputs in place (no copy-out call site); a
    Mamba2 layer's h is the first group's output, which reads h: it is still copied."""
    llm = LLM(compile="jit", kv_cache_memory="16MiB")
    path = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    for program in (path.program, path.prefill_program):
        assert "copy out (h, delta)" not in program.program.sites, program.program.sites
    build_hf_model("mamba2", tmp_path / "mamba2")
    llm = LLM(str(tmp_path / "mamba2"), compile="jit", kv_cache_memory="4MiB")
    path = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    assert "copy out (h, delta)" in path.program.program.sites, path.program.program.sites
