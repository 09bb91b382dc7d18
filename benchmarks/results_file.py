"""Writing a benchmark's JSON lines (benchmarks/results/*.jsonl, read by report.py)."""

from __future__ import annotations

import json
import pathlib


def write_lines(path: pathlib.Path, lines: list[dict]) -> None:
    """Replace `path` with one JSON object per line (the latest run only) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines)} lines to {path}")
