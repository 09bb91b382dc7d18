"""Server metrics for GET /metrics, through the prometheus_client library.

Counters: requests by outcome, aborts and rejections by reason, prompt / generated tokens,
cached prompt tokens; with KV tiers, state checkpoints or speculative decoding, their own
families (snapshots the engine thread sets after every step). Gauges, set
by the engine thread after every step: requests waiting and running, KV blocks used / free;
and the prefix-cache hit rate (cached / all prompt tokens, since start), derived from the two
counters at scrape time. Histograms: time to first token and inter-token latency
(REFERENCES §6), measured by the engine thread from the request's submission and between the
steps that deliver its tokens.

Each ServerMetrics has its own CollectorRegistry, never the library's global default one:
several servers (the tests start more than one) live in one process, and each /metrics shows
its own engine's numbers only.

The counts are kept by the library's Counter / Gauge / Histogram objects, created unregistered
(registry=None). What the registry holds is one collector, _Exposition, that yields their
families in a fixed order, and that for two reasons:

- prometheus_client adds a `<name>_created` sample (a Unix timestamp, exposed as a gauge of
  its own, e.g. `infergen_requests_created`) to every counter and histogram. That would add
  four metric names that /metrics never had. The library's switch for it,
  disable_created_metrics(), is process-global: it would change the /metrics of anyone else
  using prometheus_client in the same process. The collector drops those samples from our
  families only, so the exposed names are exactly the hand-written exporter's.
- the hit rate is a ratio of two counters; the collector computes it from the values it is
  about to expose, under the same lock that account() holds, so the ratio always matches the
  counters printed beside it.

The exposed names need no other care: a Counter named `infergen_requests_total` is exposed as
`infergen_requests_total` (the library strips `_total` from the family name and adds it back
to the sample), histograms as `<name>_bucket{le=...}`, `<name>_sum`, `<name>_count`, with
`le` written as before ("0.01", "1.0", "+Inf"). Values are written as floats ("3.0" where the
old exporter wrote "3"), which any Prometheus parser reads alike.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "ABORT_REASONS", "CONTENT_TYPE_LATEST", "ITL_BUCKETS", "OUTCOMES", "REJECT_REASONS",
    "TTFT_BUCKETS", "ServerMetrics",
]  # fmt: skip

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("finished", "aborted", "failed", "rejected")
# why a running request was aborted: its client went away, its submission was cancelled (the
# caller's task, or one prompt of an all-or-none group failing), it passed its time limit, or
# the server shut down before it finished (the shutdown timeout)
ABORT_REASONS = ("disconnect", "cancelled", "timeout", "shutdown")
# why a request was not admitted: the engine refused it (400), too many were in flight or it
# would wait past the queue-time budget (503), the server is stopping (503), or the engine
# cannot step any more (503: a tensor-parallel worker died)
REJECT_REASONS = ("invalid", "queue_full", "overloaded", "shutting_down", "engine_stopped")


class ServerMetrics:
    def __init__(self):
        # account() / scrape consistency (hit rate vs. its counters); the library's objects
        # are thread-safe on their own
        self.lock = threading.Lock()
        self.requests = Counter(
            "infergen_requests_total", "requests by outcome", ["outcome"], registry=None
        )
        for outcome in OUTCOMES:  # every outcome shows from the start, at 0
            self.requests.labels(outcome)
        self.aborts = Counter(
            "infergen_request_aborts_total", "running requests aborted, by reason", ["reason"],
            registry=None,
        )  # fmt: skip
        for reason in ABORT_REASONS:
            self.aborts.labels(reason)
        self.rejections = Counter(
            "infergen_request_rejections_total", "requests not admitted, by reason", ["reason"],
            registry=None,
        )  # fmt: skip
        for reason in REJECT_REASONS:
            self.rejections.labels(reason)
        self.prompt_tokens = Counter(
            "infergen_prompt_tokens_total", "prompt tokens of admitted requests", registry=None
        )
        self.cached_prompt_tokens = Counter(
            "infergen_cached_prompt_tokens_total",
            "prompt tokens found in the prefix cache",
            registry=None,
        )
        self.generation_tokens = Counter(
            "infergen_generation_tokens_total", "generated tokens", registry=None
        )
        self.waiting = Gauge(
            "infergen_requests_waiting", "requests queued, not yet running", registry=None
        )
        self.running = Gauge("infergen_requests_running", "requests being computed", registry=None)
        self.blocks_used = Gauge(
            "infergen_kv_blocks_used", "KV cache blocks held by requests", registry=None
        )
        self.blocks_free = Gauge(
            "infergen_kv_blocks_free", "KV cache blocks free or idle-cached", registry=None
        )
        self.ttft = Histogram(
            "infergen_time_to_first_token_seconds",
            "submission to first generated token",
            buckets=TTFT_BUCKETS,
            registry=None,
        )
        self.itl = Histogram(
            "infergen_inter_token_latency_seconds",
            "time between consecutive generated tokens of a request",
            buckets=ITL_BUCKETS,
            registry=None,
        )
        self.tiers: dict | None = None  # the KV tiers' stats (KVTiers.stats), None: no tiers
        self.checkpoints: dict | None = None  # StateCheckpoints.stats + nbytes, None: none
        self.speculation: dict | None = None  # Speculator.summary(), None: no speculation
        self.registry = CollectorRegistry()
        self.registry.register(_Exposition(self))

    # ---- updates (engine thread, and the event loop for rejections) ---------------------------
    def count(self, outcome: str) -> None:
        """A request that ended without output to account for (failed, rejected)."""
        self.requests.labels(outcome).inc()

    def rejected(self, reason: str) -> None:
        """A request was not admitted (also counted as outcome "rejected")."""
        self.requests.labels("rejected").inc()
        self.rejections.labels(reason).inc()

    def aborted(self, reason: str) -> None:
        """A running request was aborted (also counted as outcome "aborted" by `account`)."""
        self.aborts.labels(reason).inc()

    def account(self, outcome: str, prompt_tokens: int, cached_prompt_tokens: int) -> None:
        """A request that ended (finished, aborted) with its prompt and prefix-cache hits."""
        with self.lock:
            self.requests.labels(outcome).inc()
            self.prompt_tokens.inc(prompt_tokens)
            self.cached_prompt_tokens.inc(cached_prompt_tokens)

    def tokens(self, n: int, seconds: float, first: bool) -> None:
        """n tokens of one request delivered by a step, `seconds` after its submission (first)
        or after its previous tokens."""
        self.generation_tokens.inc(n)
        (self.ttft if first else self.itl).observe(seconds)

    def set_tiers(self, stats: dict | None) -> None:
        """The KV tiers' counters as of now (kvcache/tiers/tiered.KVTiers.stats)."""
        with self.lock:
            self.tiers = stats

    def set_checkpoints(self, stats: dict | None) -> None:
        """The recurrent-state checkpoints' counters (kvcache/state_checkpoints.py)."""
        with self.lock:
            self.checkpoints = stats

    def set_speculation(self, summary: dict | None) -> None:
        """Speculative decoding's counters (engine/spec/speculator.Speculator.summary)."""
        with self.lock:
            self.speculation = summary

    def set_load(self, waiting: int, running: int, blocks_used: int, blocks_free: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)
        self.blocks_used.set(blocks_used)
        self.blocks_free.set(blocks_free)

    # ---- exposition ------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text exposition (serve it as CONTENT_TYPE_LATEST)."""
        return generate_latest(self.registry)


class _Exposition(Collector):
    """ServerMetrics' families for its registry: the library's own, less their `_created`
    samples, plus the prefix-cache hit rate (see the module docstring)."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        with m.lock:
            families = {
                name: _without_created(metric)
                for name, metric in (
                    ("requests", m.requests),
                    ("aborts", m.aborts),
                    ("rejections", m.rejections),
                    ("prompt", m.prompt_tokens),
                    ("cached", m.cached_prompt_tokens),
                    ("generation", m.generation_tokens),
                    ("waiting", m.waiting),
                    ("running", m.running),
                    ("used", m.blocks_used),
                    ("free", m.blocks_free),
                    ("ttft", m.ttft),
                    ("itl", m.itl),
                )
            }
        prompt = _value(families["prompt"])
        hit_rate = _value(families["cached"]) / prompt if prompt else 0.0
        yield from (
            families[k]
            for k in ("requests", "aborts", "rejections", "prompt", "cached", "generation")
        )
        yield from (families[k] for k in ("waiting", "running", "used", "free"))
        yield GaugeMetricFamily(
            "infergen_prefix_cache_hit_rate",
            "cached prompt tokens / prompt tokens, since start",
            value=hit_rate,
        )
        yield families["ttft"]
        yield families["itl"]
        if m.tiers is not None:
            yield from _tier_families(m.tiers)
        if m.checkpoints is not None:
            yield from _checkpoint_families(m.checkpoints)
        if m.speculation is not None:
            yield from _speculation_families(m.speculation)


def _tier_families(stats: dict) -> Iterator[Metric]:
    """The KV tiers' families (a snapshot the engine thread sets with each step)."""
    per_tier = (
        ("hits", "prefix blocks found in the tier"), ("misses", "lookups the tier missed"),
        ("evictions", "blocks the tier let go (to the next tier down, or dropped)"),
    )  # fmt: skip
    for key, text in per_tier:
        family = CounterMetricFamily(f"infergen_kv_tier_{key}", text, labels=["tier"])
        for name, tier in stats["tiers"].items():
            family.add_metric([name], tier.get(key, 0))
        yield family
    moved = CounterMetricFamily(
        "infergen_kv_tier_bytes", "bytes moved to / from the tier", labels=["tier", "direction"]
    )
    held = GaugeMetricFamily("infergen_kv_tier_bytes_held", "bytes the tier holds", labels=["tier"])
    bandwidth = GaugeMetricFamily(
        "infergen_kv_tier_read_gbps", "measured read bandwidth of the tier, GB/s", labels=["tier"]
    )
    for name, tier in stats["tiers"].items():
        moved.add_metric([name, "read"], tier.get("bytes_read", 0))
        moved.add_metric([name, "written"], tier.get("bytes_written", 0))
        held.add_metric([name], tier.get("nbytes", 0))
        if tier.get("read_gb_s") is not None:
            bandwidth.add_metric([name], tier["read_gb_s"])
    yield from (moved, held, bandwidth)
    blocks = CounterMetricFamily(
        "infergen_kv_tier_blocks", "blocks moved between the pool and the tiers", labels=["move"]
    )
    blocks.add_metric(["saved"], stats["saved"])
    blocks.add_metric(["loaded"], stats["loaded"])
    blocks.add_metric(["states_saved"], stats.get("states_saved", 0))
    blocks.add_metric(["states_loaded"], stats.get("states_loaded", 0))
    yield blocks
    decisions = CounterMetricFamily(
        "infergen_kv_tier_decisions", "tier hits loaded or recomputed (cost rule)",
        labels=["decision"],
    )  # fmt: skip
    for decision, n in stats["decisions"].items():
        decisions.add_metric([decision], n)
    yield decisions
    loads = CounterMetricFamily(
        "infergen_kv_tier_loads", "prefix loads from the tiers (jobs) by how they ran or ended",
        labels=["mode"],
    )  # fmt: skip
    for mode, n in stats["loads"].items():
        loads.add_metric([mode], n)
    load_seconds = CounterMetricFamily(
        "infergen_kv_tier_load_seconds",
        "seconds of prefix loads: inline (stalling a step) or background (overlapped)",
        labels=["mode"],
    )
    for mode, seconds in stats["load_seconds"].items():
        load_seconds.add_metric([mode], seconds)
    preemptions = CounterMetricFamily(
        "infergen_kv_preemptions", "preempted sequences swapped to the host tier or recomputed",
        labels=["mode"],
    )  # fmt: skip
    for mode, n in stats["preemptions"].items():
        preemptions.add_metric([mode], n)
    yield from (loads, load_seconds, preemptions)


def _checkpoint_families(stats: dict) -> Iterator[Metric]:
    """Recurrent-state checkpoints: events (saved, hits here / from a tier, misses,
    evictions, spilled to the tiers), prompt tokens resumed, bytes held."""
    events = CounterMetricFamily(
        "infergen_state_checkpoints", "recurrent-state checkpoint events", labels=["event"]
    )
    for event in ("saved", "hits", "tier_hits", "misses", "evictions", "spilled"):
        events.add_metric([event], stats.get(event, 0))
    yield events
    yield CounterMetricFamily(
        "infergen_state_checkpoint_resumed_tokens",
        "prompt tokens resumed from a state checkpoint (not recomputed)",
        value=stats.get("tokens_resumed", 0),
    )
    yield GaugeMetricFamily(
        "infergen_state_checkpoint_bytes_held", "bytes of checkpoints held in memory",
        value=stats.get("nbytes", 0),
    )  # fmt: skip


def _without_created(metric: Counter | Gauge | Histogram) -> Metric:
    (family,) = metric.collect()
    family.samples = [s for s in family.samples if s.name != family.name + "_created"]
    return family


def _value(family: Metric) -> float:
    (sample,) = family.samples
    return sample.value


def _speculation_families(summary: dict) -> Iterator[Metric]:
    """Speculative decoding, by proposer: draft tokens proposed / verified / accepted,
    verifying steps, the proposer's seconds, the acceptance rate (accepted / verified) and
    the mean tokens a verifying step emits (the accepted drafts + the target's own)."""
    proposer = [summary["proposer"]]
    drafts = CounterMetricFamily(
        "infergen_spec_draft_tokens", "draft tokens: proposed, verified (the cost model's "
        "choice), accepted", labels=["proposer", "kind"],
    )  # fmt: skip
    for kind in ("proposed", "drafted", "accepted"):
        drafts.add_metric([*proposer, "verified" if kind == "drafted" else kind], summary[kind])
    steps = CounterMetricFamily(
        "infergen_spec_verify_steps", "decodes that verified drafts", labels=["proposer"]
    )
    steps.add_metric(proposer, summary["steps"])
    seconds = CounterMetricFamily(
        "infergen_spec_proposer_seconds", "seconds spent drafting", labels=["proposer"]
    )
    seconds.add_metric(proposer, summary["proposer_s"])
    rate = GaugeMetricFamily(
        "infergen_spec_acceptance_rate", "accepted / verified draft tokens, since start",
        labels=["proposer"],
    )  # fmt: skip
    rate.add_metric(proposer, summary["acceptance_rate"] or 0.0)
    length = GaugeMetricFamily(
        "infergen_spec_tokens_per_verify_step",
        "tokens a verifying decode emitted on average (accepted drafts + 1), since start",
        labels=["proposer"],
    )
    length.add_metric(proposer, summary["tokens_per_step"] or 0.0)
    yield from (drafts, steps, seconds, rate, length)
