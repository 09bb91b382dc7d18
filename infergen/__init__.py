"""infergen: an LLM inference engine with its own inference compiler, on PyTorch.

Public API: `LLM`, `SamplingParams`, `EngineConfig`.
"""

import os as _os

# PyTorch's CPU allocator puts allocations of 2 MB and more in transparent huge pages when
# this is set (read once, at torch's first allocation: so before anything imports torch).
# Decode streams every weight per token: with 4 KB pages the default model's first engine
# decoded 41.7 tok/s here, with huge pages 45.3 (Xeon, 2 threads; a user's own setting wins).
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from infergen.config import CacheConfig, ModelConfig, SchedulerConfig  # noqa: E402
from infergen.engine.config import EngineConfig  # noqa: E402
from infergen.engine.sampling_params import SamplingParams  # noqa: E402
from infergen.llm import LLM  # noqa: E402

__all__ = ["LLM", "SamplingParams", "EngineConfig", "CacheConfig", "SchedulerConfig", "ModelConfig"]
__version__ = "0.1.0"
