"""KV presses (issue 25): rules that pick which cached tokens a sequence keeps, so that its
cache takes fewer blocks (press.py: the interface; a row per module)."""

from infergen.kvcache.presses import baselines, h2o, kvzip, pyramidkv, snapkv  # noqa: F401
from infergen.kvcache.presses.press import PRESSES, Press, kept_count, kept_positions

__all__ = ["PRESSES", "Press", "kept_count", "kept_positions"]
