"""Measured acceptance of speculative decoding, read back for the performance model
(`infergen predict --acceptance-from FILE`).

The simulator's acceptance is per token: a draft token is kept with probability α when those
before it were (perf/simulate.SpecDecode). The engine measures exactly that as
`per_token_acceptance` (engine/spec/speculator.Speculator.summary: draft tokens compared with
the tokens that followed). FILE is one JSON object with that key — e.g.
`json.dump(llm.engine.speculator.summary(), f)` — or JSON lines, as benchmarks/bench_spec.py
writes them: every object that has it counts, those of another proposer than the one asked
for (their "proposer" key) left out, and α is their mean.
"""

from __future__ import annotations

import json
import pathlib

from infergen.errors import ConfigError

KEY = "per_token_acceptance"


def measured_acceptance(path: str | pathlib.Path, proposer: str | None = None) -> float:
    """α from FILE (module docstring), of `proposer`'s measurements when given."""
    where = f"--acceptance-from {path}"
    try:
        text = pathlib.Path(path).read_text()
    except OSError as exc:
        raise ConfigError("cannot read the acceptance file", where=where, found=str(exc)) from None
    try:
        records = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError("the acceptance file is not JSON or JSON lines", where=where,
                              found=str(exc)) from None  # fmt: skip
    values = [
        r[KEY]
        for r in records
        if isinstance(r, dict)
        and isinstance(r.get(KEY), int | float)
        and (proposer is None or r.get("proposer", proposer) == proposer)
    ]
    if not values:
        wanted = f" of proposer {proposer!r}" if proposer else ""
        raise ConfigError(
            f"the acceptance file has no measurement{wanted}",
            where=where,
            expected=f'JSON objects with "{KEY}" (a number in [0, 1]): '
            "Speculator.summary(), or benchmarks/bench_spec.py's results",
        )
    alpha = sum(values) / len(values)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError("acceptance out of range", where=where, found=alpha, expected="[0, 1]")
    return alpha
