"""The decode layer program's native gated DeltaNet step (kernels/layer_kernels.c
lk_deltanet_decode, compiler/program_deltanet.py) called directly on a mixer's arguments,
against the module itself with the plain-torch delta rule, conv1d and norm rows: one token per
sequence, 1 / 3 / 16 sequences in scattered state slots, fresh and continuing ones, one and
two value heads per key head; outputs and both states after the step. And what it refuses."""

from __future__ import annotations

import ctypes

import pytest
import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program import LIBRARY
from infergen.compiler.program_deltanet import deltanet_args
from infergen.config.mixers import DeltaNetSpec
from infergen.kernels.build import library
from infergen.layers.linear_attention import GatedDeltaNet

SLOTS = 20


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


def _states(mixer: GatedDeltaNet, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(SLOTS, *shape, generator=gen) * 0.5
        for name, shape in mixer.state_shapes().items()
    }


def _lk_deltanet_decode(mixer, x, states, slots, fresh) -> torch.Tensor:
    fn = ctypes.CDLL(str(library(LIBRARY))).lk_deltanet_decode
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int]
    args, keep = deltanet_args(mixer, states, "test")
    args.slots, args.fresh = slots.data_ptr(), fresh.data_ptr()
    y = torch.full_like(x, float("nan"))
    fn(ctypes.addressof(args), x.data_ptr(), y.data_ptr(), x.shape[0], 2)
    del keep
    return y


@pytest.mark.parametrize("sequences", [1, 3, 16])
@pytest.mark.parametrize("v_heads", [2, 4])
def test_lk_deltanet_decode_matches_the_module(v_heads, sequences):
    spec = DeltaNetSpec(48, 2, v_heads, 16, 8)
    mixer = _mixer(spec, seed=sequences)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(sequences, spec.hidden_size, generator=gen)
    slots = torch.randperm(SLOTS, generator=gen)[:sequences]
    fresh = torch.arange(sequences) % 3 == 1  # (some start from zeros: their slots hold noise)
    expected_states, states = _states(mixer, 5), _states(mixer, 5)
    expected = mixer(x, expected_states, list(range(sequences + 1)), slots, fresh)
    got = _lk_deltanet_decode(mixer, x, states, slots, fresh)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for name in ("conv", "recurrent"):  # (the untouched slots too)
        torch.testing.assert_close(states[name], expected_states[name], rtol=1e-5, atol=1e-6)


def test_what_the_native_step_refuses():
    spec = DeltaNetSpec(48, 2, 2, 16, 8)
    mixer = _mixer(spec)
    states = {name: t.to(torch.float64) for name, t in _states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 1 mixer: a gated DeltaNet mixer that is not"):
        deltanet_args(mixer, states, "layer 1 mixer")
    states = {name: t.transpose(0, -1) for name, t in _states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 1 mixer: strided state tensors"):
        deltanet_args(mixer, states, "layer 1 mixer")
    plain = _mixer(spec, backend="torch")
    with pytest.raises(CodegenError, match="layer 1 mixer in_proj: no packed-panel GEMM"):
        deltanet_args(plain, _states(plain, 0), "layer 1 mixer")
