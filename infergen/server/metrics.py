"""Server metrics in the Prometheus text format (GET /metrics).

Counters: requests by outcome, prompt / generated tokens, cached prompt tokens. Gauges, read
from the engine thread after every step: requests waiting and running, KV blocks used / free,
prefix-cache hit rate (cached / all prompt tokens). Histograms: time to first token and
inter-token latency (REFERENCES §6), measured by the engine thread from the request's
submission and between the steps that deliver its tokens.
"""

from __future__ import annotations

import bisect
import threading

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last: +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
        out += [f"{name}_sum {self.total}", f"{name}_count {self.count}"]
        return out


class ServerMetrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = {"finished": 0, "aborted": 0, "failed": 0, "rejected": 0}
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        self.gauges = {"waiting": 0, "running": 0, "blocks_used": 0, "blocks_free": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.requests[outcome] += 1

    def render(self) -> str:
        with self.lock:
            hit = self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            rows = [
                (
                    "infergen_requests_total",
                    "counter",
                    "requests by outcome",
                    [
                        f'infergen_requests_total{{outcome="{k}"}} {v}'
                        for k, v in self.requests.items()
                    ],
                ),
                (
                    "infergen_prompt_tokens_total",
                    "counter",
                    "prompt tokens of admitted requests",
                    [f"infergen_prompt_tokens_total {self.prompt_tokens}"],
                ),
                (
                    "infergen_cached_prompt_tokens_total",
                    "counter",
                    "prompt tokens found in the prefix cache",
                    [f"infergen_cached_prompt_tokens_total {self.cached_prompt_tokens}"],
                ),
                (
                    "infergen_generation_tokens_total",
                    "counter",
                    "generated tokens",
                    [f"infergen_generation_tokens_total {self.generation_tokens}"],
                ),
                (
                    "infergen_requests_waiting",
                    "gauge",
                    "requests queued, not yet running",
                    [f"infergen_requests_waiting {self.gauges['waiting']}"],
                ),
                (
                    "infergen_requests_running",
                    "gauge",
                    "requests being computed",
                    [f"infergen_requests_running {self.gauges['running']}"],
                ),
                (
                    "infergen_kv_blocks_used",
                    "gauge",
                    "KV cache blocks held by requests",
                    [f"infergen_kv_blocks_used {self.gauges['blocks_used']}"],
                ),
                (
                    "infergen_kv_blocks_free",
                    "gauge",
                    "KV cache blocks free or idle-cached",
                    [f"infergen_kv_blocks_free {self.gauges['blocks_free']}"],
                ),
                (
                    "infergen_prefix_cache_hit_rate",
                    "gauge",
                    "cached prompt tokens / prompt tokens, since start",
                    [f"infergen_prefix_cache_hit_rate {hit}"],
                ),
                (
                    "infergen_time_to_first_token_seconds",
                    "histogram",
                    "submission to first generated token",
                    self.ttft.lines("infergen_time_to_first_token_seconds"),
                ),
                (
                    "infergen_inter_token_latency_seconds",
                    "histogram",
                    "time between consecutive generated tokens of a request",
                    self.itl.lines("infergen_inter_token_latency_seconds"),
                ),
            ]
        text = []
        for name, kind, help_text, samples in rows:
            text += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(text) + "\n"
