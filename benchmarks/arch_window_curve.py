"""The window memory curve of bench_architectures.py: one sequence of a sliding-window model run
step by step past several windows, and the blocks each KV cache group holds on the way.

A windowed group lets go of the blocks no later query reads (kvcache/groups.py), so once the
context passes window + chunk its block count stops growing, while a full-attention group's
keeps growing by one block every block_size tokens. `window_curve` records both; `plot_curves`
draws them (matplotlib, when installed); `other_pytest` says whether a test run shares the
machine.
"""

from __future__ import annotations

import os
import pathlib

import torch


def window_curve(directory: pathlib.Path, size) -> dict:
    """Run one sequence (size.curve_prompt tokens of prompt, in one chunk) to
    size.curve_windows windows of context; every size.curve_every tokens record the blocks
    held per cache group and the KV bytes they take. With the verdict "flat": every windowed
    group's largest block count after 2 windows is no larger than between window + chunk and
    2 windows (ratio late / early; 1.0 = flat)."""
    from infergen import LLM, SamplingParams
    from infergen.kvcache.groups import NO_BLOCK

    chunk = size.curve_prompt  # the longest step: the prompt, in one chunk
    llm = LLM(
        str(directory),
        kv_cache_memory="128MiB",
        max_num_seqs=1,
        max_num_batched_tokens=max(64, chunk),
        block_size=size.block_size,
        enable_prefix_caching=False,
    )
    engine = llm.engine
    cache, bs = engine.kv_cache, size.block_size
    groups = cache.groups
    window = max(g.window or 0 for g in groups)
    if not window:
        raise ValueError("the model has no sliding-window cache group")
    total = size.curve_windows * window
    page = kv_page_bytes(cache)
    desc = engine.model_config.describe()
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(10, engine.model_config.vocab_size, (chunk,), generator=g).tolist()
    params = SamplingParams(max_tokens=total - chunk, temperature=0, ignore_eos=True)
    engine.add_request(prompt, params)
    points = []
    while engine.has_unfinished():
        engine.step()
        if not engine.scheduler.running:
            break
        seq = engine.scheduler.running[0]
        context = seq.num_computed_tokens
        if context % size.curve_every and context != chunk:
            continue
        held = [sum(b != NO_BLOCK for b in blocks) for blocks in seq.blocks]
        points.append(
            {
                "context": context,
                "blocks": held,
                "kv_bytes": sum(held) * page,
                "all_full_bytes": len(groups) * -(-context // bs) * page,  # no window anywhere
                "model_bytes": desc.kv_bytes_for_context(context, 4),  # token-exact, no paging
                "pool_blocks_used": engine.pool.num_blocks - engine.pool.num_free,
            }
        )
    windowed = [i for i, grp in enumerate(groups) if grp.window]
    early = [p for p in points if window + chunk <= p["context"] < 2 * window]
    late = [p for p in points if p["context"] >= 2 * window]
    ratios = [
        max(p["blocks"][i] for p in late) / max(p["blocks"][i] for p in early) for i in windowed
    ]
    bound = [groups[i].blocks_held(total, chunk, bs) for i in windowed]
    del llm
    return {
        "window": window,
        "chunk": chunk,
        "block_size": bs,
        "page_bytes": page,
        "groups": [{"layers": list(grp.layers), "window": grp.window} for grp in groups],
        "points": points,
        "flat": {
            "ratio": max(ratios),
            "met": max(ratios) <= 1.0,
            "late_max_blocks": [max(p["blocks"][i] for p in late) for i in windowed],
            "bound_blocks": bound,  # CacheGroup.blocks_held: what the scheduler plans for
        },
    }


def kv_page_bytes(cache) -> float:
    """Bytes of one KV block of one cache group (all its layers), states excluded."""
    storage = getattr(cache, "storage", None)
    if storage is not None:
        return storage.numel() * storage.element_size() / max(cache.num_blocks, 1)
    return cache.nbytes / max(cache.num_blocks, 1)  # block-quantized: its own accounting


def plot_curves(curves: dict[str, dict], path: pathlib.Path) -> str:
    """KV bytes held against context (beside the bytes with no window), and blocks per
    windowed / full group; written to `path`. Returns what it did."""
    if not curves:
        return "no windowed architecture measured: no plot"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: window memory plot skipped"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, (name, curve) in enumerate(curves.items()):
        color = f"C{k}"
        x = [p["context"] for p in curve["points"]]
        left.plot(
            x,
            [p["kv_bytes"] / 2**20 for p in curve["points"]],
            color=color,
            label=f"{name} (window {curve['window']})",
        )
        left.plot(
            x,
            [p["all_full_bytes"] / 2**20 for p in curve["points"]],
            color=color,
            linestyle=":",
            label=f"{name}, every layer full",
        )
        for kind, style in (("windowed", "-"), ("full", "--")):
            idx = [
                i
                for i, g in enumerate(curve["groups"])
                if bool(g["window"]) == (kind == "windowed")
            ]
            if idx:
                y = [sum(p["blocks"][i] for i in idx) / len(idx) for p in curve["points"]]
                width = 1 + 1.5 * (len(curves) - 1 - k)  # wider first: equal curves stay visible
                right.plot(
                    x,
                    y,
                    color=color,
                    linestyle=style,
                    linewidth=width,
                    label=f"{name}: {kind} group",
                )
        left.axvline(curve["window"], color="grey", linewidth=0.5)
    left.set(
        xlabel="context (tokens)", ylabel="KV cache held (MiB)", title="one sequence: KV bytes held"
    )
    right.set(
        xlabel="context (tokens)",
        ylabel="blocks held per group",
        title="blocks per cache group (mean over groups of a kind)",
    )
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote the window memory plot to {path}"


def other_pytest() -> str:
    """A running pytest of someone else (pid and command, shortened), or ''."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "pytest" in cmd:
            return f"pid {pid}: {cmd.strip()[:80]}"
    return ""
