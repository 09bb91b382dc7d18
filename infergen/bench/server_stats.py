"""What an infergen server says about its caches during a `bench serve` run: its /metrics
read before and after each load (prometheus_client's parser), as the change over the run —
prompt tokens found in the prefix cache, and per KV tier (kvcache/tiers/) the hits, bytes read
and written, the blocks loaded back and the load-or-recompute decisions. Other servers (no
/metrics, or none of infergen's families) give None, and the report says nothing."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, api_key: str | None = None) -> dict[tuple, float] | None:
    """{(sample name, sorted labels): value} of the server's infergen_* samples, or None."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or "infergen_" not in response.text:
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("infergen_")
    }


def cache_delta(before: dict | None, after: dict | None) -> dict | None:
    """The run's cache figures from two scrapes (None without both)."""
    if before is None or after is None:
        return None

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    prompt = delta("infergen_prompt_tokens_total")
    cached = delta("infergen_cached_prompt_tokens_total")
    out: dict = {"prompt_tokens": prompt, "cached_prompt_tokens": cached,
                 "prefix_hit_rate": cached / prompt if prompt else 0.0}  # fmt: skip
    tiers = sorted({dict(labels)["tier"] for (name, labels) in after
                    if name == "infergen_kv_tier_hits_total"})  # fmt: skip
    if tiers:
        out["tiers"] = {
            tier: {
                "hits": delta("infergen_kv_tier_hits_total", tier=tier),
                "bytes_read": delta("infergen_kv_tier_bytes_total", tier=tier, direction="read"),
                "bytes_written": delta(
                    "infergen_kv_tier_bytes_total", tier=tier, direction="written"
                ),
            }
            for tier in tiers
        }
        out["blocks_loaded"] = delta("infergen_kv_tier_blocks_total", move="loaded")
        out["decisions"] = {d: delta("infergen_kv_tier_decisions_total", decision=d)
                            for d in ("load", "recompute")}  # fmt: skip
    if any(name == "infergen_state_checkpoints_total" for name, _ in after):
        out["state_checkpoints"] = {
            "hits": delta("infergen_state_checkpoints_total", event="hits"),
            "misses": delta("infergen_state_checkpoints_total", event="misses"),
            "resumed_tokens": delta("infergen_state_checkpoint_resumed_tokens_total"),
        }
    return out


def format_cache(delta: dict | None) -> str:
    """One line for the report ('' for a server that says nothing)."""
    if delta is None:
        return ""
    rate = 100 * delta["prefix_hit_rate"]
    line = (f"server cache: {delta['cached_prompt_tokens']:.0f} of {delta['prompt_tokens']:.0f} "
            f"prompt tokens from the prefix cache ({rate:.1f} %)")  # fmt: skip
    for tier, t in delta.get("tiers", {}).items():
        line += (f"; {tier} tier: {t['hits']:.0f} hits, {t['bytes_read'] / 1e6:.1f} MB read, "
                 f"{t['bytes_written'] / 1e6:.1f} MB written")  # fmt: skip
    if "decisions" in delta:
        d = delta["decisions"]
        line += f"; loaded {d['load']:.0f} / recomputed {d['recompute']:.0f} tier hits"
    if "state_checkpoints" in delta:
        s = delta["state_checkpoints"]
        line += (f"; recurrent states: {s['hits']:.0f} resumed ({s['resumed_tokens']:.0f} "
                 f"tokens), {s['misses']:.0f} missed")  # fmt: skip
    return line
