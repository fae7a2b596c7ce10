"""melt_core: Ouro's LoopLM, the Memory-Efficient Looped Transformer, and what trains,
evaluates and profiles them. Knows nothing of Snakemake or SLURM."""

from .modeling.cache import KeptPromptSharedKVCache, KVCache, LoopKVCache, SharedKVCache
from .modeling.checkpoint import (
    CheckpointError,
    convert_ouro_to_melt,
    load_pretrained,
    melt_from_ouro,
    save_pretrained,
)
from .modeling.config import ConfigError, ModelConfig
from .modeling.gate import LatentGate
from .modeling.model import LoopedLM, LoopOutput, exit_distribution

__all__ = [
    "CheckpointError", "ConfigError", "KeptPromptSharedKVCache", "KVCache", "LatentGate", "LoopKVCache", "LoopOutput",
    "LoopedLM", "ModelConfig", "SharedKVCache", "convert_ouro_to_melt", "exit_distribution",
    "load_pretrained", "melt_from_ouro", "save_pretrained",
]
