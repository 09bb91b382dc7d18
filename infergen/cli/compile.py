"""`infergen compile`: capture the model's graphs (one decoder layer, the head), run a pass
pipeline over them and report what it fused; `--dump-dir` writes each graph's text before and
after the passes (and the buffer plan) for reading."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infergen.cli.common import load_llm
from infergen.engine.options import add_engine_args


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compile",
        help="pre-build a model's generated kernels; show its graphs, fusions, buffer plan",
        description="Capture one decoder layer and the head of the model as IR graphs (from the "
        "model code, with torch.fx), run a pass pipeline ('fuse': the specific fusions, coarse "
        "ops kept; 'jit': the specific fusions, lowering to primitives, generic pointwise / "
        "row-reduction fusion) and print what each graph became: kernels launched per step "
        "before and after, the fused groups, and the activation memory per token with and "
        "without buffer reuse. Then build the generated kernels and the decode layer "
        "program into the JIT cache (what `--compile jit` loads at engine start) and tune "
        "the chosen buckets — the layer program's variants (attention chunk, GEMM blocking "
        "and prefetch, fork threshold, threads) on real decode steps, the groups' (threads, "
        "row tiles) — within --budget-seconds; each item is printed with its expected gain "
        "beside the gain measured once built. The same plan runs at engine start with "
        "--compile-budget-s.",
    )
    add_engine_args(p, "compile")
    p.add_argument(
        "--pipeline",
        default="jit",
        help="pass list to run: 'fuse' or 'jit' (default jit)",
    )
    p.add_argument(
        "--dump-dir",
        default=None,
        metavar="DIR",
        help="write <graph>.captured.txt and <graph>.<pipeline>.txt (IR text), and the "
        "generated sources (group<i>.c, group<i>.triton.py, the GEMMs with their tails fused "
        "gemm<i>.c and gemm<i>.triton.py, layer_program.c, prefill_program.c) into DIR",
    )
    p.add_argument("--log", action="store_true", help="print each rule as it fires")
    p.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        metavar="S",
        help="build within S seconds (default: no limit): compile the groups with the most "
        "expected gain per second first, then the layer program and its search per bucket "
        "(~30 s for the first bucket: it compiles the variants), then the groups' tuning with "
        "what is left; prints what it built, tuned and skipped, with the expected and the "
        "measured gain of each",
    )
    p.add_argument(
        "--buckets",
        default=None,
        metavar="LIST",
        help="the token-count buckets to tune, e.g. '1,2-8' (default: those in --traffic)",
    )
    p.add_argument("--no-build", action="store_true", help="only show (and dump) the graphs")
    p.add_argument(
        "--traffic",
        default="1=0.7,2-8=0.1,9-64=0.1,65-512=0.1",
        metavar="MIX",
        help="the expected traffic as bucket=share of steps, buckets 1, 2-8, 9-64, 65-512, "
        ">512 (default %(default)s: mostly single-sequence decode)",
    )
    p.add_argument(
        "--jit-cache",
        default=None,
        metavar="DIR",
        help="the JIT cache directory (default ~/.cache/infergen/jit)",
    )
    p.set_defaults(func=cmd_compile)


def _launches(graph) -> int:
    from infergen.compiler.ir import Op

    return sum(n.op not in (Op.VIEW, Op.SLICE) for n in graph.nodes)


def cmd_compile(args: argparse.Namespace) -> int:
    import copy

    from infergen.compiler import pipelines  # noqa: F401  (registers the pipelines)
    from infergen.compiler.buffers import plan_buffers
    from infergen.compiler.decoder import capture_head, capture_kinds
    from infergen.compiler.ir import Op
    from infergen.compiler.passes import PIPELINES, run_pipeline

    PIPELINES.get(args.pipeline, where="--pipeline")
    llm = load_llm(args)
    model, cache = llm.engine.runner.model, llm.engine.kv_cache
    dump = Path(args.dump_dir) if args.dump_dir else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    kinds = capture_kinds(model, cache)  # (one graph per kind of decoder layer)
    graphs = [(kind.captured.graph, len(kind.layers)) for kind in kinds]
    for k, kind in enumerate(kinds if len(kinds) > 1 else ()):
        graphs[k][0].name = f"decoder_layer_kind{k}"
        print(f"decoder_layer_kind{k}: {kind.describe()}")
    for graph, count in (*graphs, (capture_head(model).graph, 1)):
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
        _dump_sources(dump, model, cache)
        print(f"wrote the graphs and generated sources to {dump}/", file=sys.stderr)
    if not args.no_build:
        _build_within_budget(args, model, cache)
    return 0


def _dump_sources(dump: Path, model, cache) -> None:
    from infergen.compiler.runtime import jit_kinds

    kinds = jit_kinds(model, cache)
    for k, (graph, _) in enumerate(kinds):
        _dump_kind(dump, model, graph, f"kind{k}_" if len(kinds) > 1 else "")


def _dump_kind(dump: Path, model, graph, prefix: str) -> None:
    """One kind of layer's generated sources (files named `prefix`group0.c, ...)."""
    from infergen.compiler.codegen_c import CodegenError, render_group
    from infergen.compiler.codegen_gemm import is_gemm_group, plan_epilogue, render_gemm_epilogue
    from infergen.compiler.codegen_triton import render_group_triton
    from infergen.compiler.codegen_triton_gemm import render_gemm_epilogue_triton
    from infergen.compiler.program import model_program
    from infergen.compiler.runtime import pointwise_groups

    for i, node in enumerate(pointwise_groups(graph)):
        sub = node.attrs["graph"]
        for suffix, render in (("c", render_group), ("triton.py", render_group_triton)):
            try:
                (dump / f"{prefix}group{i}.{suffix}").write_text(render(sub, f"group{i}"))
            except CodegenError as error:
                (dump / f"{prefix}group{i}.{suffix}").write_text(f"not renderable: {error}\n")
    renders = {"c": render_gemm_epilogue, "triton.py": render_gemm_epilogue_triton}
    for i, node in enumerate(filter(is_gemm_group, graph.nodes)):
        for suffix, render in renders.items():
            try:
                source = render(plan_epilogue(node.attrs["graph"]), f"gemm{i}")
            except CodegenError as error:
                source = f"not renderable: {error}\n"
            (dump / f"{prefix}gemm{i}.{suffix}").write_text(source)
    for phase, name in (("decode", "layer_program.c"), ("prefill", "prefill_program.c")):
        try:
            (dump / f"{prefix}{name}").write_text(model_program(model, graph, phase).source)
        except CodegenError as error:
            (dump / f"{prefix}{name}").write_text(f"/* not renderable: {error} */\n")


def _build_within_budget(args: argparse.Namespace, model, cache) -> None:
    from infergen.compiler.budget import parse_traffic
    from infergen.compiler.jit_cache import JitCache
    from infergen.compiler.startup import plan_lines, plan_startup
    from infergen.errors import ConfigError

    try:
        traffic = parse_traffic(args.traffic)
    except ValueError as error:
        raise ConfigError(str(error), where="--traffic") from None
    if args.buckets is not None:
        chosen = [b.strip() for b in args.buckets.split(",") if b.strip()]
        try:  # the chosen buckets, weighted as in the traffic (equally if it omits them)
            traffic = parse_traffic(",".join(f"{b}={traffic.get(b, 1.0)}" for b in chosen))
        except ValueError as error:
            raise ConfigError(str(error), where="--buckets") from None
    budget = float("inf") if args.budget_seconds is None else args.budget_seconds
    jit = JitCache(Path(args.jit_cache) if args.jit_cache else None)
    items = plan_startup(model, cache, traffic, budget, jit)
    mix = ",".join(f"{b}={w:.2g}" for b, w in traffic.items())
    print(f"budget {budget:g} s, traffic {mix}, cache {jit.root}")
    print("\n".join(plan_lines(items)))
