"""What the native mixer tests share (test_program_ssm.py, test_program_deltanet.py): random
state slots, one step of the native C function against the module itself (decode: a row per
sequence; prefill: several rows per sequence)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from infergen.compiler.program import LIBRARY
from infergen.kernels.build import library

SLOTS = 20
# rows per sequence of the prefill-step cases: one sequence; 66 rows (enough to reach the
# steps' threaded loop) of three, one of a single row; four short ones
PREFILL_LENGTHS = [[5], [40, 1, 25], [3, 7, 2, 9]]


def random_states(mixer, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Every state of `mixer` over SLOTS slots, random (a fresh sequence's slot holds noise)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(SLOTS, *shape, generator=gen) * scale
        for name, shape in mixer.state_shapes().items()
    }


def native_step(function: str, build: Callable, mixer, x, states, slots, fresh) -> torch.Tensor:
    """One step of layer_kernels' `function` on `build(mixer, states)`'s arguments: x [rows,
    hidden] (row t in state slot slots[t], from zeros where fresh[t]) → [rows, hidden]; the
    states are updated in place."""
    fn = getattr(ctypes.CDLL(str(library(LIBRARY))), function)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_int]
    args, keep = build(mixer, states, "test")
    args.slots, args.fresh = slots.data_ptr(), fresh.data_ptr()
    y = torch.full_like(x, float("nan"))
    fn(ctypes.addressof(args), x.data_ptr(), y.data_ptr(), x.shape[0], 2)
    del keep
    return y


def check_step(
    function: str, build: Callable, mixer, hidden: int, sequences: int, lengths=None
) -> None:
    """The native step against the module on the same random states: outputs and every state
    (untouched slots included); a third of the sequences fresh over noisy slots. `lengths`:
    each sequence's rows (a prefill step: the rows of a sequence follow each other, in order;
    only its first row is fresh); None: one each (decode)."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor(lengths or [1] * sequences)
    starts = [0, *torch.cumsum(lengths, 0).tolist()]
    x = torch.randn(starts[-1], hidden, generator=gen)
    slots = torch.randperm(SLOTS, generator=gen)[:sequences]
    fresh = torch.arange(sequences) % 3 == 1
    expected_states, states = random_states(mixer, 5, 0.5), random_states(mixer, 5, 0.5)
    expected = mixer(x, expected_states, starts, slots, fresh)
    first = torch.zeros(starts[-1], dtype=torch.bool)
    first[starts[:-1]] = True
    row_slots = torch.repeat_interleave(slots, lengths)
    row_fresh = torch.repeat_interleave(fresh, lengths) & first
    got = native_step(function, build, mixer, x, states, row_slots, row_fresh)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for name in expected_states:
        torch.testing.assert_close(states[name], expected_states[name], rtol=1e-5, atol=1e-6)
