"""The one description of a model (`ModelConfig`, read from a HF config.json, GGUF metadata or
a bare config) and the engine sections lower packages read (`CacheConfig`, `SchedulerConfig`).
`EngineConfig` (the whole engine's options) is infergen.engine.config."""

from infergen.config.model import KV_LAYER_TYPES, LAYER_TYPES, ModelConfig
from infergen.config.sections import CacheConfig, SchedulerConfig, parse_bytes
from infergen.config.specs import MLAConfig, MoEConfig, RopeScaling, yarn_mscale

__all__ = [
    "KV_LAYER_TYPES",
    "LAYER_TYPES",
    "CacheConfig",
    "MLAConfig",
    "ModelConfig",
    "MoEConfig",
    "RopeScaling",
    "SchedulerConfig",
    "parse_bytes",
    "yarn_mscale",
]
