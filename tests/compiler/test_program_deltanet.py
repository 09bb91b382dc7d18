"""The decode layer program's native gated DeltaNet step (kernels/layer_kernels.c
lk_deltanet_decode, compiler/program_deltanet.py) called directly on a mixer's arguments,
against the module itself with the plain-torch delta rule, conv1d and norm rows: one token per
sequence, 1 / 3 / 16 sequences in scattered state slots, fresh and continuing ones, one and
two value heads per key head; outputs and both states after the step. And what it refuses."""

from __future__ import annotations

import pytest
import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program_deltanet import deltanet_args
from infergen.config.mixers import DeltaNetSpec
from infergen.layers.linear_attention import GatedDeltaNet
from tests.compiler.native_mixers import PREFILL_LENGTHS, check_step, random_states


def _mixer(spec: DeltaNetSpec, seed: int = 0, backend: str = "native") -> GatedDeltaNet:
    """A mixer with random weights: packed-panel projections, the plain-torch ops."""
    mixer = GatedDeltaNet(spec, torch.float32, linear_backend=backend)
    gen = torch.Generator().manual_seed(seed)
    s, r = spec, spec.num_v_heads // spec.num_k_heads
    group = 2 * s.k_head_dim + 2 * r * s.v_head_dim
    shapes = {
        "in_proj_qkvz.weight": (s.num_k_heads * group, s.hidden_size),
        "in_proj_ba.weight": (s.num_k_heads * 2 * r, s.hidden_size),
        "out_proj.weight": (s.hidden_size, s.value_dim),
        "conv1d.weight": (s.conv_dim, 1, s.conv_width),
        "A_log": (s.num_v_heads,),
        "dt_bias": (s.num_v_heads,),
        "norm.weight": (s.v_head_dim,),
    }
    weights = {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}
    weights["norm.weight"] += 1.0
    mixer.load(weights.__getitem__, "")
    return mixer


@pytest.mark.parametrize("sequences", [1, 3, 16])
@pytest.mark.parametrize("v_heads", [2, 4])
def test_lk_deltanet_decode_matches_the_module(v_heads, sequences):
    spec = DeltaNetSpec(48, 2, v_heads, 16, 8)
    mixer = _mixer(spec, seed=sequences)
    check_step("lk_deltanet_decode", deltanet_args, mixer, spec.hidden_size, sequences)


@pytest.mark.parametrize("lengths", PREFILL_LENGTHS)
def test_lk_deltanet_decode_runs_prefill_rows_in_order(lengths):
    """Several rows per sequence (a prefill step), against the module's chunked form; 66 rows
    reach the threaded loop (the heads over the threads, each head's rows in order)."""
    spec = DeltaNetSpec(48, 2, 4, 16, 8)
    mixer = _mixer(spec, seed=len(lengths))
    check_step("lk_deltanet_decode", deltanet_args, mixer, spec.hidden_size, len(lengths), lengths)


def test_what_the_native_step_refuses():
    spec = DeltaNetSpec(48, 2, 2, 16, 8)
    mixer = _mixer(spec)
    states = {name: t.to(torch.float64) for name, t in random_states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 1 mixer: a gated DeltaNet mixer that is not"):
        deltanet_args(mixer, states, "layer 1 mixer")
    states = {name: t.transpose(0, -1) for name, t in random_states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 1 mixer: strided state tensors"):
        deltanet_args(mixer, states, "layer 1 mixer")
    plain = _mixer(spec, backend="torch")
    with pytest.raises(CodegenError, match="layer 1 mixer in_proj: no packed-panel GEMM"):
        deltanet_args(plain, random_states(plain, 0), "layer 1 mixer")
