"""What the native mixer tests share (test_program_ssm.py, test_program_deltanet.py): random
state slots, one decode step of the native C function against the module itself."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from infergen.compiler.program import LIBRARY
from infergen.kernels.build import library

SLOTS = 20


def random_states(mixer, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Every state of `mixer` over SLOTS slots, random (a fresh sequence's slot holds noise)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(SLOTS, *shape, generator=gen) * scale
        for name, shape in mixer.state_shapes().items()
    }


def native_step(function: str, build: Callable, mixer, x, states, slots, fresh) -> torch.Tensor:
    """One decode step of layer_kernels' `function` on `build(mixer, states)`'s arguments: x
    [sequences, hidden] (row t: sequence t in slot slots[t]) → [sequences, hidden]; the states
    are updated in place."""
    fn = getattr(ctypes.CDLL(str(library(LIBRARY))), function)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int]
    args, keep = build(mixer, states, "test")
    args.slots, args.fresh = slots.data_ptr(), fresh.data_ptr()
    y = torch.full_like(x, float("nan"))
    fn(ctypes.addressof(args), x.data_ptr(), y.data_ptr(), x.shape[0], 2)
    del keep
    return y


def check_step(function: str, build: Callable, mixer, hidden: int, sequences: int) -> None:
    """The native step against the module on the same random states: outputs and every state
    (untouched slots included); a third of the sequences fresh over noisy slots."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(sequences, hidden, generator=gen)
    slots = torch.randperm(SLOTS, generator=gen)[:sequences]
    fresh = torch.arange(sequences) % 3 == 1
    expected_states, states = random_states(mixer, 5, 0.5), random_states(mixer, 5, 0.5)
    expected = mixer(x, expected_states, list(range(sequences + 1)), slots, fresh)
    got = native_step(function, build, mixer, x, states, slots, fresh)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for name in expected_states:
        torch.testing.assert_close(states[name], expected_states[name], rtol=1e-5, atol=1e-6)
