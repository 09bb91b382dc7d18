"""Variants of the generated layer program: the knobs of the kernels it calls, each a C macro
(first in the program's source, and — unless only the generated program reads it — a -D flag
of the kernel library it links against: one library per set of values) or a run-time
argument, and a variant as a set of knob values.

- `threads`: the step's OpenMP threads (0: all of torch's, else that many): 0, 1
- `attn_chunk`: decode attention's most positions per work item (`DECODE_ATTN_CHUNK`): 64, 128, 256
- `gemm_small_top`: up to 8 tokens in 4-row blocks (0) or one block of the widest micro-kernel
  (1) (`GEMM_SMALL_TOP`)
- `gemm_prefetch`: one token block: software prefetch of the weight panel that many ahead
  (`GEMM_PREFETCH_PANELS`): 0, 1, 2
- `fork_min`: work below this many elements stays on one thread (`PARALLEL_MIN_ELEMENTS`):
  8192, 32768, 131072
- `epilogue_min`: a GEMM with a pointwise tail runs fused (the tail on each tile) past this
  many tokens, the GEMM then its tail up to it (`GEMM_EPILOGUE_MIN_TOKENS`): 0, 16

The GEMM and epilogue knobs leave every product and sum as it was (same results); the
attention chunk changes where partial softmax states are merged (results within rounding).
A variant's label ("default", or "attn_chunk=256,threads=1") is how tuning.json names it; its
prelude is the `#define` lines that go first in the program's source, so the JIT cache key of
each variant is its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from infergen.registry import Registry


@dataclass(frozen=True)
class Knob:
    macro: str | None  # the C macro it defines (None: a run-time argument)
    values: tuple[int, ...]
    default: int
    doc: str
    # whether the kernel library reads the macro too (False: the generated program alone,
    # whose variants then link the one library built without it)
    in_library: bool = True


KNOBS: Registry[Knob] = Registry("layer program knob")
KNOBS.register("threads", Knob(None, (0, 1), 0, "OpenMP threads (0: all torch threads)"))
KNOBS.register(
    "attn_chunk", Knob("DECODE_ATTN_CHUNK", (64, 128, 256), 128, "attention positions per item")
)
KNOBS.register(
    "gemm_small_top", Knob("GEMM_SMALL_TOP", (0, 1), 0, "<= 8 tokens: widest micro-kernel")
)
KNOBS.register(
    "gemm_prefetch", Knob("GEMM_PREFETCH_PANELS", (0, 1, 2), 0, "one token block: panels ahead")
)
KNOBS.register(
    "epilogue_min",
    Knob(
        "GEMM_EPILOGUE_MIN_TOKENS",
        (0, 16),
        16,
        "fused GEMM tail past this many tokens",
        in_library=False,
    ),
)
KNOBS.register(
    "fork_min",
    Knob("PARALLEL_MIN_ELEMENTS", (8192, 32768, 131072), 32768, "smallest work split"),
)


@dataclass(frozen=True)
class ProgramVariant:
    """Knob values away from their defaults, sorted by knob name."""

    settings: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, label: str) -> ProgramVariant:
        """ "default" or "name=value,..." → the variant (ValueError naming a bad part)."""
        variant = cls()
        if label == "default":
            return variant
        for part in label.split(","):
            name, _, value = part.partition("=")
            if name not in KNOBS:
                raise ValueError(f"layer program knob {name!r}: expected one of {list(KNOBS)}")
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"knob {name}={value!r}: not an integer") from None
            variant = variant.with_value(name, number)
        return variant

    def with_value(self, name: str, value: int) -> ProgramVariant:
        knob = KNOBS.get(name, where="layer program knob")
        if value not in knob.values:
            raise ValueError(f"knob {name}={value}: expected one of {list(knob.values)}")
        rest = {k: v for k, v in self.settings if k != name}
        if value != knob.default:
            rest[name] = value
        return ProgramVariant(tuple(sorted(rest.items())))

    def value(self, name: str) -> int:
        return dict(self.settings).get(name, KNOBS.get(name).default)

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.settings) or "default"

    @property
    def defines(self) -> tuple[tuple[str, int], ...]:
        """(macro, value) of its compile-time knobs (empty for the default variant)."""
        found = ((KNOBS.get(name).macro, value) for name, value in self.settings)
        return tuple((macro, value) for macro, value in found if macro is not None)

    @property
    def library_defines(self) -> tuple[tuple[str, int], ...]:
        """`defines` that the kernel library reads (its -D flags: a library per set)."""
        knobs = ((KNOBS.get(name), value) for name, value in self.settings)
        return tuple((k.macro, v) for k, v in knobs if k.macro is not None and k.in_library)

    @property
    def prelude(self) -> str:
        """The `#define` lines of its compile-time knobs (empty for the default variant)."""
        return "".join(f"#define {macro} {value}\n" for macro, value in self.defines)

    def threads(self, available: int) -> int:
        wanted = self.value("threads")
        return available if wanted == 0 else min(wanted, available)
