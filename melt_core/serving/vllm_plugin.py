"""The vLLM plugin (entry point ``vllm.general_plugins``, pyproject.toml): registers Ouro and MELT.

A hub Ouro checkpoint declares ``model_type: ouro`` and ``OuroForCausalLM`` with an ``auto_map`` to
its own code; melt_core's MELT checkpoints declare ``model_type: melt``. Both configs are
registered with transformers here, so vLLM resolves them without remote code, and both
architectures with vLLM's registry, lazily (by name: vLLM imports the class in its engine process).
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from ..modeling.config import ARCHITECTURES

MODEL_CLASS = "melt_core.serving.vllm_models:LoopedForCausalLM"


class OuroConfig(PretrainedConfig):
    """Ouro's config.json as transformers objects carry it; the fields are melt_core's ModelConfig's
    (the model reads its own config from the checkpoint directory, melt_core.modeling.checkpoint.read_config)."""

    model_type = "ouro"
    architecture = ARCHITECTURES["ouro"]

    def __init__(self, **kwargs):
        kwargs.setdefault("architectures", [self.architecture])
        kwargs.pop("auto_map", None)  # the hub's pointer to remote code: never followed
        super().__init__(**kwargs)


class MeltConfig(OuroConfig):
    model_type = "melt"
    architecture = ARCHITECTURES["melt"]


def _cpu_generators_keep_discarded_draws() -> None:
    """vLLM undoes the draw of a seeded request's discarded sample (a step that ends inside its prompt)
    by moving its Philox generator's offset back, which CPU generators do not have: on the CPU backend
    every seeded request whose prompt takes more than one step (MELT's chunks; any chunked prefill)
    raised 'CPU Generator does not use offset'. Here the generators vLLM's model runner makes on the
    CPU keep that draw instead: a seed still gives the same samples in any batch, since a request's
    steps are fixed by its chunks (melt_core/serving/vllm_scheduler.py), but not after a preemption, whose
    recompute steps draw too. GPU generators are left alone."""
    import types

    import torch
    from vllm.platforms import current_platform
    from vllm.v1.worker import gpu_model_runner

    if not current_platform.is_cpu() or isinstance(gpu_model_runner.torch, types.ModuleType) and \
            getattr(gpu_model_runner.torch, "_melt_cpu_generators", False):
        return

    class CpuGenerator(torch.Generator):
        def get_offset(self) -> int:
            return 0

        def set_offset(self, offset: int) -> None:  # the draw stays drawn
            pass

    class TorchWithCpuGenerators(types.ModuleType):
        _melt_cpu_generators = True
        Generator = CpuGenerator

        def __getattr__(self, name):
            return getattr(torch, name)

    gpu_model_runner.torch = TorchWithCpuGenerators("torch")


def register() -> None:
    from vllm import ModelRegistry

    _cpu_generators_keep_discarded_draws()
    for config in (OuroConfig, MeltConfig):
        AutoConfig.register(config.model_type, config, exist_ok=True)
        if config.architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(config.architecture, MODEL_CLASS)
