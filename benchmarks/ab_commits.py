"""A / B of two commits on the same benchmarks, interleaved: did a change make infergen
slower?

Each round runs every benchmark command once from a checkout of the base commit and once
from the working tree (in alternating order, so neither side always runs first on this
drifting machine), each writing its JSON lines to a file of its own. The peer of every
infergen figure is then the same figure of the other commit: per (bench, metric, engine,
configuration) of the "result" lines, the best value of each side over the rounds and the
ratio head / base (>1: the head is faster for tok/s, slower for seconds — `higher_is_better`
says which), and the median of the rounds' own ratios ("paired_median": within a round the
two sides run back to back; this machine's memory bandwidth moves by up to 2x over minutes,
and a best value can be one side's luck). Output: JSON lines (kind "ab") to --out and a table
on stdout.

    python benchmarks/ab_commits.py --base 31ee2fb --rounds 2 \\
        --bench "bench_generate.py --skip-transformers --skip-llamacpp --rounds 1" \\
        --bench "bench_quant.py --rounds 1 --only int8 --only int4"

A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from results_file import write_lines  # noqa: E402

# units whose smaller values are better
LOWER_IS_BETTER = {"s", "ms", "us", "seconds"}


def checkout(commit: str, where: pathlib.Path) -> pathlib.Path:
    """A detached worktree of `commit` (the repository's own objects; nothing fetched)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    return where


def run_bench(tree: pathlib.Path, command: str, out: pathlib.Path) -> list[dict]:
    """One benchmark command from `tree`, its JSON lines written to `out`, read back."""
    script, *args = shlex.split(command)
    argv = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=_env(tree), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command} in {tree} failed:\n{done.stderr[-3000:]}")
    print(f"  {tree.name}: {command} ({time.perf_counter() - started:.0f} s)", flush=True)
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _env(tree: pathlib.Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _key(line: dict) -> tuple:
    config = line.get("config") or line.get("scheme") or line.get("mode") or ""
    return line["bench"], line["metric"], line.get("engine", ""), str(config)


def compare(base: list[list[dict]], head: list[list[dict]]) -> list[dict]:
    """Per result key, from each side's lines per round: the best value of each side and head
    / base (speed: >1 faster); and the round by round ratio (each round runs the two sides back
    to back) with its median, "paired_median": a side that met a fast minute of this machine
    (its memory bandwidth moves by up to 2x) can hold the best value by luck alone, while in
    a round both sides meet about the same minutes."""

    def best(lines: list[dict]) -> dict[tuple, tuple[float, str]]:
        found: dict[tuple, tuple[float, str]] = {}
        for line in lines:
            if line.get("kind") != "result" or not isinstance(line.get("value"), int | float):
                continue
            unit = line.get("unit", "")
            value, key = float(line["value"]), _key(line)
            lower = unit in LOWER_IS_BETTER
            if key not in found or (value < found[key][0] if lower else value > found[key][0]):
                found[key] = (value, unit)
        return found

    def ratio(va: float, vb: float, unit: str) -> float | None:
        return (va / vb if unit in LOWER_IS_BETTER else vb / va) if va and vb else None

    a, b = best([ln for r in base for ln in r]), best([ln for r in head for ln in r])
    per_round = [(best(x), best(y)) for x, y in zip(base, head, strict=True)]
    rows = []
    for key in sorted(set(a) & set(b)):
        (va, unit), (vb, _) = a[key], b[key]
        speedup = ratio(va, vb, unit)
        paired = [ratio(x[key][0], y[key][0], unit) for x, y in per_round if key in x and key in y]
        paired = [r for r in paired if r is not None]
        rows.append(
            {
                "kind": "ab",
                "bench": key[0],
                "metric": key[1],
                "engine": key[2],
                "config": key[3],
                "unit": unit,
                "base": va,
                "head": vb,
                "head_speedup": speedup,
                "paired_rounds": paired,
                "paired_median": statistics.median(paired) if paired else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--bench",
        action="append",
        required=True,
        metavar="COMMAND",
        help="a benchmarks/ script and its arguments (repeatable); --out is added",
    )
    parser.add_argument(
        "--head-benchmarks",
        action="store_true",
        help="run the working tree's benchmarks/ scripts on both sides (copied into the base "
        "checkout): the same measuring code, each side's infergen — for a benchmark the base "
        "commit does not have",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "ab.jsonl"
    )
    args = parser.parse_args()
    head_commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = checkout(args.base, pathlib.Path(tmp) / "base")
        if args.head_benchmarks:
            shutil.rmtree(base_tree / "benchmarks")
            shutil.copytree(ROOT / "benchmarks", base_tree / "benchmarks")
        try:
            sides: dict[str, list[list[dict]]] = {"base": [], "head": []}  # per round
            trees = {"base": base_tree, "head": ROOT}
            for round_ in range(args.rounds):
                order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                print(f"round {round_ + 1} of {args.rounds}: {' then '.join(order)}", flush=True)
                for side in order:
                    sides[side].append([])
                for i, command in enumerate(args.bench):
                    for side in order:
                        out = pathlib.Path(tmp) / f"{side}-{round_}-{i}.jsonl"
                        sides[side][-1] += run_bench(trees[side], command, out)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                capture_output=True,
            )
    head_lines = [ln for r in sides["head"] for ln in r]
    machine = next((ln.get("machine") for ln in head_lines if ln.get("machine")), None)
    rows = [
        {
            **row,
            "base_commit": args.base,
            "head_commit": head_commit,
            "rounds": args.rounds,
            "benchmarks": "head's on both sides" if args.head_benchmarks else "each side's",
            "machine": machine,
        }  # fmt: skip
        for row in compare(sides["base"], sides["head"])
    ]
    print(
        f"{'bench: metric (engine, config)':<64} {'base':>10} {'head':>10} {'head/base':>9} "
        f"{'paired':>7}"
    )
    for row in rows:
        name = f"{row['bench']}: {row['metric']} ({row['engine']}, {row['config']})"
        speed = f"{row['head_speedup']:.3f}" if row["head_speedup"] else "–"
        pair = f"{row['paired_median']:.3f}" if row["paired_median"] else "–"
        print(f"{name:<64} {row['base']:10.4g} {row['head']:10.4g} {speed:>9} {pair:>7}")
    write_lines(args.out, rows)


if __name__ == "__main__":
    main()
