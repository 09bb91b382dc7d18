"""Writing a benchmark's JSON lines (benchmarks/results/*.jsonl, read by report.py)."""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib


def write_lines(path: pathlib.Path, lines: list[dict]) -> None:
    """Replace `path` with one JSON object per line (the latest run only) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} lines to {path}")


def read_lines(path: pathlib.Path) -> list[dict]:
    """The JSON lines of `path` (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def base_line(bench: str, model: str, machine: dict, git: dict, **extra) -> dict:
    """The fields every JSON line of a run starts with: the bench, the model, the machine
    (bench_generate.machine_info), the commit (git_state), torch's version, the time."""
    return {
        "bench": bench,
        "model": model,
        **extra,
        "git": git,
        "machine": machine,
        "peer_versions": {"torch": machine.get("torch")},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def ratio_line(base: dict, metric: str, ours: float, peer: str, theirs: float, unit: str,
               **extra) -> dict:  # fmt: skip
    """A "ratio" line (the README's results table): our value and the peer's in `unit`, and
    how many times better ours is (time units: theirs / ours; rates: ours / theirs)."""
    better = theirs / ours if unit in ("ms", "s", "us") else ours / theirs
    return {**base, "kind": "ratio", "metric": metric, "infergen_value": ours, "peer": peer,
            "peer_value": theirs, "value": round(better, 3), "unit": unit, **extra}  # fmt: skip


def bench_arguments(doc: str, repeats: int, out: pathlib.Path) -> argparse.ArgumentParser:
    """A benchmark's parser with the usual --repeats, --threads (default 2) and --out."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=out)
    return parser
