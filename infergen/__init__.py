"""infergen: an LLM inference engine with its own inference compiler, on PyTorch.

Public API: `LLM`, `SamplingParams`, `EngineConfig`.
"""

from infergen.config import CacheConfig, ModelConfig, SchedulerConfig
from infergen.engine.config import EngineConfig
from infergen.engine.sampling_params import SamplingParams
from infergen.llm import LLM

__all__ = ["LLM", "SamplingParams", "EngineConfig", "CacheConfig", "SchedulerConfig", "ModelConfig"]
__version__ = "0.1.0"
