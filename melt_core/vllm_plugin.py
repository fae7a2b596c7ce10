"""The vLLM plugin (entry point ``vllm.general_plugins``, pyproject.toml): registers Ouro and MELT.

A hub Ouro checkpoint declares ``model_type: ouro`` and ``OuroForCausalLM`` with an ``auto_map`` to
its own code; melt_core's MELT checkpoints declare ``model_type: melt``. Both configs are
registered with transformers here, so vLLM resolves them without remote code, and both
architectures with vLLM's registry, lazily (by name: vLLM imports the class in its engine process).
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

MODEL_CLASS = "melt_core.vllm_models:LoopedForCausalLM"


class OuroConfig(PretrainedConfig):
    """Ouro's config.json as transformers objects carry it; the fields are melt_core's ModelConfig's
    (the model reads its own config from the checkpoint directory, melt_core.checkpoint.read_config)."""

    model_type = "ouro"
    architecture = "OuroForCausalLM"

    def __init__(self, **kwargs):
        kwargs.setdefault("architectures", [self.architecture])
        kwargs.pop("auto_map", None)  # the hub's pointer to remote code: never followed
        super().__init__(**kwargs)


class MeltConfig(OuroConfig):
    model_type = "melt"
    architecture = "MeltForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    for config in (OuroConfig, MeltConfig):
        AutoConfig.register(config.model_type, config, exist_ok=True)
        if config.architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(config.architecture, MODEL_CLASS)
