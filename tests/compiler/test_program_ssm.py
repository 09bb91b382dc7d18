"""The decode layer program's native Mamba2 step (kernels/layer_kernels.c lk_ssm_decode,
compiler/program_ssm.py) called directly on a mixer's arguments, against the module itself
with the plain-torch conv1d and SSD scan rows: one token per sequence, 1 / 3 / 16 sequences in
scattered state slots, fresh and continuing ones, the gated RMSNorm after the gate, before it
and absent, one and two groups, conv bias on and off, a finite dt limit; outputs and both
states after the step. And what it refuses, by name."""

from __future__ import annotations

import pytest
import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program_ssm import ssm_args
from infergen.config.mixers import SSMSpec
from infergen.layers.ssm import Mamba2Mixer
from tests.compiler.native_mixers import PREFILL_LENGTHS, check_step, random_states


def _mixer(spec: SSMSpec, seed: int = 0) -> Mamba2Mixer:
    """A mixer with random weights: packed-panel projections, the plain-torch scan and conv."""
    mixer = Mamba2Mixer(spec, torch.float32, "native", op_backend="torch")
    gen = torch.Generator().manual_seed(seed)
    s = spec
    shapes = {
        "in_proj.weight": (s.projection_size, s.hidden_size),
        "out_proj.weight": (s.hidden_size, s.intermediate_size),
        "conv1d.weight": (s.conv_dim, 1, s.conv_kernel),
        "conv1d.bias": (s.conv_dim,),
        "A_log": (s.num_heads,),
        "D": (s.num_heads,),
        "dt_bias": (s.num_heads,),
        "norm.weight": (s.intermediate_size,),
    }
    weights = {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}
    mixer.load(weights.__getitem__, "")
    return mixer


SPECS = {
    "mamba2": dict(),
    "norm_before_gate_two_groups": dict(n_groups=2, norm_before_gate=True),
    "no_norm_no_conv_bias": dict(rms_norm=False, conv_bias=False),
    "dt_limit": dict(time_step_limit=(0.01, 0.5)),
}


@pytest.mark.parametrize("sequences", [1, 3, 16])
@pytest.mark.parametrize("variant", sorted(SPECS))
def test_lk_ssm_decode_matches_the_module(variant, sequences):
    shape = dict(n_groups=1, conv_kernel=4, chunk_size=64, norm_eps=1e-5)
    spec = SSMSpec(48, 4, 8, 16, **{**shape, **SPECS[variant]})
    mixer = _mixer(spec, seed=sequences)
    check_step("lk_ssm_decode", ssm_args, mixer, spec.hidden_size, sequences)


@pytest.mark.parametrize("lengths", PREFILL_LENGTHS)
def test_lk_ssm_decode_runs_prefill_rows_in_order(lengths):
    """Several rows per sequence (a prefill step: prefill programs call the native step for
    up to its prefill_rows), against the module's chunked form; 66 rows reach the
    threaded loop (the heads over the threads, each head's rows in order)."""
    spec = SSMSpec(48, 4, 8, 16, n_groups=1, conv_kernel=4, chunk_size=16, norm_eps=1e-5)
    mixer = _mixer(spec, seed=len(lengths))
    check_step("lk_ssm_decode", ssm_args, mixer, spec.hidden_size, len(lengths), lengths)


def test_what_the_native_step_refuses():
    """Named refusals (the program then calls the module back): state tensors that are not
    fp32 or not contiguous, projections without packed panels."""
    spec = SSMSpec(48, 4, 8, 16, 1, 4, 64, 1e-5)
    mixer = _mixer(spec)
    states = {name: t.to(torch.float64) for name, t in random_states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 3 mixer: a Mamba2 mixer that is not fp32"):
        ssm_args(mixer, states, "layer 3 mixer")
    states = {name: t.transpose(0, -1) for name, t in random_states(mixer, 0).items()}
    with pytest.raises(CodegenError, match="layer 3 mixer: strided state tensors"):
        ssm_args(mixer, states, "layer 3 mixer")
    plain = Mamba2Mixer(spec, torch.float32, "torch", op_backend="torch")
    with pytest.raises(CodegenError, match="layer 3 mixer in_proj: no packed-panel GEMM"):
        ssm_args(plain, random_states(plain, 0), "layer 3 mixer")
