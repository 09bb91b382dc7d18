"""The traffic the startup budget plans for: how many engine steps ran in each token-count
bucket lately, per model — recorded by a server (`infergen serve`) and read at the next
engine start with `compile_budget_s` (engine option `compile_traffic`, default "recorded").

Counts decay by half every HALF_LIFE_STEPS steps, so the mix follows the recent traffic. The
file is `<JIT cache>/traffic/<model hash>.json`, written whole and atomically (a reader never
sees half a file; two servers of one model: the last write wins).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from infergen.compiler.buckets import BUCKET_TOKENS, bucket_of
from infergen.compiler.jit_cache import default_root

HALF_LIFE_STEPS = 20_000
DEFAULT_TRAFFIC = {"1": 0.7, "2-8": 0.1, "9-64": 0.1, "65-512": 0.1}  # mostly decode


class TrafficRecord:
    def __init__(self, path: Path, model: str):
        self.path, self.model = path, model
        self.counts = dict.fromkeys(BUCKET_TOKENS, 0.0)
        self.steps = 0  # recorded by this process
        self._decay = 0.5 ** (1.0 / HALF_LIFE_STEPS)
        self._load()

    @classmethod
    def for_model(cls, model: str | None, root: Path | None = None) -> TrafficRecord:
        name = model or "default"
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return cls((root or default_root()) / "traffic" / f"{digest}.json", name)

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            counts = data["counts"]
            for bucket in self.counts:
                self.counts[bucket] = max(0.0, float(counts.get(bucket, 0.0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # none yet, or unreadable: start from nothing

    def add(self, tokens: int) -> None:
        """One engine step of `tokens` tokens."""
        for bucket in self.counts:
            self.counts[bucket] *= self._decay
        self.counts[bucket_of(max(1, tokens))] += 1.0
        self.steps += 1

    def mix(self) -> dict[str, float] | None:
        """bucket → share of the recent steps (buckets with none left out); None: no steps."""
        total = sum(self.counts.values())
        if total <= 0:
            return None
        return {b: c / total for b, c in self.counts.items() if c > 0}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"model": self.model, "counts": self.counts}, indent=1))
        os.replace(tmp, self.path)
