"""`infergen compile`: capture the model's graphs (one decoder layer, the head), run a pass
pipeline over them and report what it fused; `--dump-dir` writes each graph's text before and
after the passes (and the buffer plan) for reading."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_compile_parser(sub, add_model_args) -> None:
    p = sub.add_parser(
        "compile",
        help="the compiler's view of a model: captured graphs, fusions, buffer plan",
        description="Capture one decoder layer and the head of the model as IR graphs (from the "
        "model code, with torch.fx), run a pass pipeline ('fuse': the specific fusions, coarse "
        "ops kept; 'jit': the specific fusions, lowering to primitives, generic pointwise / "
        "row-reduction fusion) and print what each graph became: kernels launched per step "
        "before and after, the fused groups, and the activation memory per token with and "
        "without buffer reuse.",
    )
    add_model_args(p)
    p.add_argument(
        "--pipeline",
        default="jit",
        help="pass list to run: 'fuse' or 'jit' (default jit)",
    )
    p.add_argument(
        "--dump-dir",
        default=None,
        metavar="DIR",
        help="write <graph>.captured.txt and <graph>.<pipeline>.txt (IR text) into DIR",
    )
    p.add_argument("--log", action="store_true", help="print each rule as it fires")
    p.set_defaults(func=cmd_compile)


def _launches(graph) -> int:
    from infergen.compiler.ir import Op

    return sum(n.op not in (Op.VIEW, Op.SLICE) for n in graph.nodes)


def cmd_compile(args: argparse.Namespace) -> int:
    import copy

    from infergen.cli import _load
    from infergen.compiler import pipelines  # noqa: F401  (registers the pipelines)
    from infergen.compiler.buffers import plan_buffers
    from infergen.compiler.decoder import capture_head, capture_layer
    from infergen.compiler.ir import Op
    from infergen.compiler.passes import PIPELINES, run_pipeline

    PIPELINES.get(args.pipeline, where="--pipeline")
    llm = _load(args)
    model, cache = llm.engine.runner.model, llm.engine.kv_cache
    dump = Path(args.dump_dir) if args.dump_dir else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    layers = model.config.num_hidden_layers
    for captured, count in ((capture_layer(model, cache), layers), (capture_head(model), 1)):
        graph = captured.graph
        log: list[str] = []
        compiled = run_pipeline(copy.deepcopy(graph), args.pipeline, log)
        before, after = plan_buffers(graph), plan_buffers(compiled)
        kernels = [n.attrs["kernel"] for n in compiled.nodes if n.op is Op.FUSED]
        print(
            f"{graph.name} (x{count}): {len(graph.nodes)} nodes, {_launches(graph)} kernels "
            f"-> {_launches(compiled)} kernels after '{args.pipeline}'"
        )
        print(f"  fused groups: {', '.join(kernels) or 'none'}")
        print(
            f"  activation floats per token: {before.naive} one buffer per value, "
            f"{after.total} with reuse ({len(after.sizes)} buffers)"
        )
        if args.log:
            for line in log:
                print(f"  {line}")
        if dump:
            (dump / f"{graph.name}.captured.txt").write_text(graph.dump() + "\n")
            text = compiled.dump() + "\n\nbuffers (floats per token): " + str(after.sizes)
            (dump / f"{graph.name}.{args.pipeline}.txt").write_text(text + "\n")
    if dump:
        print(f"wrote the graphs to {dump}/", file=sys.stderr)
    return 0
