"""Measured acceptance of speculative decoding, read back for the performance model
(`infergen predict --acceptance-from FILE`).

The simulator's acceptance is per token: a draft token is kept with probability α when those
before it were (perf/simulate.SpecDecode), and a decode verifies drafts with probability f
(a proposer has none to offer at some steps — an n-gram lookup that finds nothing — or the
cost model drops them). The engine measures (engine/spec/speculator.Speculator.summary):

- `tokens_per_step` (T) and `drafts_per_verify_step` (d): the tokens a verifying step emitted
  and the drafts it verified, on average. α is the one whose geometric chain of d drafts
  emits T tokens on average, 1 + α + … + α^d = T. Real drafts are not kept independently —
  a copied passage is either all kept or rejected at once — so this α, not the per-token
  rate, gives the simulator the right tokens per step;
- `per_token_acceptance`: kept / compared draft tokens, the α used when T and d are absent;
- `verify_fraction` (f): verifying steps / decodes (1 when absent);
- `drafts_histogram` ({"d": verifying steps that verified d drafts}; optional): the
  simulator then draws each verifying step's drafts from it (a step's cost is not linear in
  its rows: on the CPU a GEMM of 9 rows takes ~1.2x one of 8, the micro-kernels' row tiles
  being 8 high), and α is the one whose chains over those draft counts emit T on average.

FILE is one JSON object with those keys — e.g. `json.dump(llm.engine.speculator.summary(),
f)` — or JSON lines, as benchmarks/bench_spec.py writes them (its `tokens_per_verify_step`
is T): every object that has an acceptance counts, those of another proposer than the one
asked for (their "proposer" key) left out, and α and f are their means.
"""

from __future__ import annotations

import json
import pathlib
from typing import NamedTuple

from infergen.errors import ConfigError

KEY = "per_token_acceptance"
TOKENS = ("tokens_per_step", "tokens_per_verify_step")  # T: the engine's, the benchmark's
DRAFTS = "drafts_per_verify_step"
FRACTION = "verify_fraction"
HISTOGRAM = "drafts_histogram"


class MeasuredAcceptance(NamedTuple):
    alpha: float  # per draft token, given the ones before it were kept
    verify_fraction: float  # of decodes that verify drafts
    # {drafts: share of verifying steps} (None: every step verifies the fixed k)
    drafts: dict[int, float] | None = None


def chain_acceptance(tokens: float, drafts: float | dict[int, float]) -> float:
    """The α with 1 + α + … + α^d = `tokens` for d = `drafts` (a real d: the geometric sum's
    closed form; a histogram {d: share}: the shares' mean of the sums), by bisection; 0 and
    1 at the ends."""
    shares = drafts if isinstance(drafts, dict) else {drafts: 1.0}
    total = sum(shares.values())
    shares = {d: w / total for d, w in shares.items() if d > 0} if total > 0 else {}
    if not shares or tokens <= 1.0:
        return 0.0
    idle = 1.0 - sum(shares.values())  # steps of 0 drafts: one token each
    if tokens >= idle + sum(w * (d + 1.0) for d, w in shares.items()):  # every draft kept
        return 1.0

    def emitted(a: float) -> float:
        return idle + sum(w * (1.0 - a ** (d + 1.0)) / (1.0 - a) for d, w in shares.items())

    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if emitted(mid) < tokens else (lo, mid)
    return (lo + hi) / 2


def _number(record: dict, *keys: str) -> float | None:
    for key in keys:
        if isinstance(record.get(key), int | float) and not isinstance(record.get(key), bool):
            return float(record[key])
    return None


def _histogram(record: dict) -> dict[int, float] | None:
    """A record's drafts_histogram as {drafts: steps} (None: absent or not one)."""
    table = record.get(HISTOGRAM)
    if not isinstance(table, dict) or not table:
        return None
    try:
        counts = {int(d): float(n) for d, n in table.items()}
    except (TypeError, ValueError):
        return None
    if any(d < 0 or n < 0 for d, n in counts.items()) or not sum(counts.values()):
        return None
    return counts


def _alpha(record: dict) -> float | None:
    tokens, drafts = _number(record, *TOKENS), _number(record, DRAFTS)
    histogram = _histogram(record)
    if tokens is not None and histogram is not None:
        return chain_acceptance(tokens, histogram)
    if tokens is not None and drafts is not None:
        return chain_acceptance(tokens, drafts)
    return _number(record, KEY)


def measured_acceptance(
    path: str | pathlib.Path, proposer: str | None = None
) -> MeasuredAcceptance:
    """α and f from FILE (module docstring), of `proposer`'s measurements when given."""
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
    records = [
        r
        for r in records
        if isinstance(r, dict)
        and _alpha(r) is not None
        and (proposer is None or r.get("proposer", proposer) == proposer)
    ]
    if not records:
        wanted = f" of proposer {proposer!r}" if proposer else ""
        raise ConfigError(
            f"the acceptance file has no measurement{wanted}",
            where=where,
            expected=f'JSON objects with "{KEY}" (a number in [0, 1]), or "tokens_per_step" '
            f'and "{DRAFTS}": Speculator.summary(), or benchmarks/bench_spec.py\'s results',
        )
    alpha = sum(_alpha(r) for r in records) / len(records)
    fractions = [_number(r, FRACTION) for r in records]
    fraction = sum(1.0 if f is None else f for f in fractions) / len(records)
    for name, value in (("acceptance", alpha), (FRACTION, fraction)):
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{name} out of range", where=where, found=value, expected="[0, 1]")
    counts: dict[int, float] = {}
    for record in records:
        for d, n in (_histogram(record) or {}).items():
            counts[d] = counts.get(d, 0.0) + n
    total = sum(counts.values())
    drafts = {d: n / total for d, n in sorted(counts.items())} if total else None
    return MeasuredAcceptance(alpha, fraction, drafts)
