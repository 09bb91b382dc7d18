"""PyramidKV (Cai et al., 2024): lower layers spread their attention over the whole context,
upper layers concentrate it on a few tokens, so lower layers keep more of the cache and upper
layers less — the same total. Scores are SnapKV's (snapkv.py); the budgets fall linearly over
the layers, from `TOP` times the press's kept count in the first layers to `2 − TOP` times
it in the last (their mean: the press's count, the same memory).

Layers sharing a cache block keep the same count (kvcache/groups.py: a block is a page of a
group of layers), so the engine is built with cache groups of at most `GROUP_LAYERS` layers
when `kv_press="pyramidkv"` is set engine-wide (30 layers: five groups of six); each group is
a step of the pyramid. As a per-request press on an engine built otherwise, it has the
engine's groups (one, for most models: SnapKV's budgets)."""

from __future__ import annotations

from infergen.kvcache.presses.press import PRESSES
from infergen.kvcache.presses.snapkv import SnapKV

TOP = 1.5  # the first layers' share of the press's kept count
GROUP_LAYERS = 6  # layers of one step of the pyramid


class PyramidKV(SnapKV):
    name = "pyramidkv"
    description = (
        f"SnapKV's scores with per-layer budgets falling linearly from {TOP}x the kept count "
        f"in the first layers to {2 - TOP:g}x in the last (cache groups of {GROUP_LAYERS} layers)"
    )
    group_layers = GROUP_LAYERS

    def shares(self, groups):
        if groups == 1:
            return [1.0]
        return [TOP - (2 * TOP - 2) * g / (groups - 1) for g in range(groups)]


PRESSES.register("pyramidkv", PyramidKV())
