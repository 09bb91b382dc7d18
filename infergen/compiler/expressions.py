"""The pointwise primitives as expressions, one row per op with a template per renderer
("c": codegen_c.py, "triton": codegen_triton.py). {a}, {b}: operands; {c}: the op's scalar."""

from __future__ import annotations

from infergen.compiler.ir import Op

ELEMENTWISE: dict[Op, dict[str, str]] = {
    Op.NEG: {"c": "-({a})", "triton": "-({a})"},
    Op.SIGMOID: {"c": "1.0f / (1.0f + expf(-({a})))", "triton": "1.0 / (1.0 + tl.exp(-({a})))"},
    Op.RSQRT: {"c": "1.0f / sqrtf({a})", "triton": "1.0 / tl.sqrt({a})"},
    Op.ADD: {"c": "({a}) + ({b})", "triton": "({a}) + ({b})"},
    Op.SUB: {"c": "({a}) - ({b})", "triton": "({a}) - ({b})"},
    Op.MUL: {"c": "({a}) * ({b})", "triton": "({a}) * ({b})"},
    Op.ADD_SCALAR: {"c": "({a}) + {c}", "triton": "({a}) + {c}"},
    Op.MUL_SCALAR: {"c": "({a}) * {c}", "triton": "({a}) * {c}"},
}
SCALAR_OPS = (Op.ADD_SCALAR, Op.MUL_SCALAR)


def expression(op: Op, target: str, operands: list[str], scalar: str | None = None) -> str:
    """The op's expression for `target` on operand expressions (and its scalar literal)."""
    names = dict(zip("ab", operands, strict=False))
    return ELEMENTWISE[op][target].format(**names, c=scalar)
