"""A model as evaluation runs it: which checkpoint, in which cache and prefill mode, with which
exit rule, on which device and dtype, in how much memory; loading it; and which questions a shard
holds. The layer under both evaluation backends (melt_core.evaluation.evaluate, the native one, and
melt_core.evaluation.lighteval_adapter, lighteval's), which import it and never each other's internals
through it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from ..generation.generate import Completion, SamplingParams, generate, trim_to_text
from ..modeling.checkpoint import CheckpointError, load_pretrained, read_config
from ..modeling.config import ConfigError
from ..modeling.dense import DenseLM, checkpoint_kind
from ..modeling.early_exit import ExitRule
from .engine_choice import vllm_refusal


@dataclass
class ModelSpec:
    """A checkpoint plus how to run it."""

    name: str
    path: str
    cache_mode: str = "default"  # Ouro: default | first-loop | last-loop
    keep_prompt: bool = False  # Ouro sharing modes: keep the prompt's per-loop cache
    prefill_chunk: int | None = None  # MELT: None = token-by-token (exact), C = chunked
    window: int | None = None  # MELT: v3's sliding window W at inference (None: the checkpoint's own)
    memory_budget_gb: float | None = None  # batches sized to fit it (generate.plan_batch); None: as given
    batching: str = "continuous"  # or "static" (generate())
    exit: dict[str, Any] | None = None  # early-exit rule (melt_core/modeling/early_exit.py); None: every loop
    # native (melt_core.generation.generate) | vllm (melt_core.serving.vllm_engine, where it can serve the model)
    engine: str = "native"
    vllm: dict[str, Any] | None = None  # vLLM's settings (config eval.vllm): kv_cache_gb, max_num_seqs, ...

    @property
    def memory_budget_bytes(self) -> int | None:
        return None if self.memory_budget_gb is None else int(self.memory_budget_gb * 1e9)


def exit_rule(model_spec: ModelSpec, task_exit: dict[str, Any] | None = None, model_config=None) -> ExitRule:
    """The model's exit rule with a task's settings (``task_exit``) over it, both over the
    checkpoint's own default exit (``model_config``: a looped model's config, once loaded)."""
    default = ExitRule.of_checkpoint(model_config) if model_config is not None else {}
    return ExitRule.from_dict({**default, **(model_spec.exit or {}), **(task_exit or {})})


def in_shard(row: dict, shard: list[int] | None) -> bool:
    """Whether a question (a dataset row or a JSONL record) belongs to shard [i, n]: a hash of its
    content, so the split depends neither on row order nor on which job asks."""
    if shard is None:
        return True
    key = json.dumps(row, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") % shard[1] == shard[0]


def model_kind(spec: ModelSpec) -> str:
    """``melt`` or ``dense`` (checkpoint_kind), the error naming the model."""
    try:
        return checkpoint_kind(spec.path)
    except CheckpointError as err:
        raise CheckpointError(f"model {spec.name!r}: {err}") from None


def resolve_device(device: str = "auto") -> str:
    """``auto``: the GPU where the job has one, else the CPU; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("eval.device is cuda but this job sees no GPU: request one from the scheduler "
                          "(the slurm profile's gres for rule eval) or set eval.device: cpu")
    return device


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype | None:
    """``auto``: bfloat16 on a GPU (the paper's inference precision), float32 on the CPU."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


CPU_MEMORY_BUDGET_GB = 16.0  # eval.memory_budget_gb's default off a GPU (a stated value, not measured)


def resolve_memory_budget(setting: float | None, device: str, model) -> float:
    """GB that weights + caches + activations may use: the setting, else on a GPU what is free now
    plus what the loaded weights already take, else CPU_MEMORY_BUDGET_GB."""
    if setting is not None:
        return float(setting)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return (free + sum(t.numel() * t.element_size() for t in model.parameters())) / 1e9
    return CPU_MEMORY_BUDGET_GB


def spec_vllm_refusal(spec: ModelSpec, exit_rule_: ExitRule | None = None, cfg=None) -> str | None:
    """vllm_refusal for an eval's model: its spec, the checkpoint's own window and the task's exit rule.
    ``cfg``: the checkpoint's config where the caller has read it already (else read here)."""
    if cfg is None and model_kind(spec) == "melt":
        cfg = read_config(spec.path)
    window = spec.window or (cfg.window if cfg is not None and cfg.is_melt else None)
    stops = exit_rule_ is not None and cfg is not None and exit_rule_.stops_early(cfg.total_ut_steps)
    return vllm_refusal(spec.cache_mode, spec.keep_prompt, window, exit_rule_.label() if stops else None)


def start_engine(spec: ModelSpec, max_model_len: int, seed: int = 0, dtype: str = "auto", log=None):
    """A vLLM engine for ``spec`` (melt_core.serving.vllm_engine.VllmEngine) with the eval's vLLM settings; one per
    model and job, shared by its tasks (the job closes it)."""
    from .vllm_engine import VllmEngine, model_type

    opts = dict(spec.vllm or {})
    if "kv_cache_gb" not in opts:
        raise ConfigError(f"{spec.path}: eval.vllm.kv_cache_gb is not set: the KV memory to give vLLM (GiB)")
    gb = opts.pop("kv_cache_gb")
    opts.pop("max_prompt_tokens", None)  # the caller's max_model_len has it
    return VllmEngine(spec.path, log=log, prefill_chunk=spec.prefill_chunk if model_type(spec.path) == "melt" else None,
                      dtype=dtype, seed=seed, max_model_len=max_model_len, kv_cache_bytes=int(gb * 2**30), **opts)


def generate_with(model, prompts, params: SamplingParams, spec: ModelSpec, tokenizer, batch_size: int,
                  exit_rule_: ExitRule | None = None) -> list[list[Completion]]:
    """Completions from the model a job holds, as generate() returns them: melt_core's engine on a
    loaded model, or a vLLM engine's (start_engine) with text, stop strings and loops filled in the same
    way (vLLM runs every loop of every token)."""
    from .vllm_engine import VllmEngine

    if not isinstance(model, VllmEngine):
        return generate(model, prompts, params, cache_mode=spec.cache_mode, keep_prompt=spec.keep_prompt,
                        prefill_chunk=spec.prefill_chunk, tokenizer=tokenizer, batch_size=batch_size,
                        memory_budget_bytes=spec.memory_budget_bytes, batching=spec.batching, exit_rule=exit_rule_)
    if exit_rule_ is not None:
        raise ConfigError(f"model {spec.name!r}: {spec_vllm_refusal(spec, exit_rule_)}")
    outs = model.generate(prompts, params)
    for row in outs:
        for c in row:
            text = tokenizer.decode(c.token_ids, skip_special_tokens=True) if tokenizer is not None else None
            hits = [text.find(s) for s in params.stop_strings if text is not None and s in text]
            if hits:  # cut before the first stop string, as generate() does
                text = text[:min(hits)]
                c.token_ids = trim_to_text(c.token_ids, text, tokenizer)
                c.finish_reason = "stop"
            c.text, c.loops = text, [model.num_loops] * len(c.token_ids)
    return outs


def load_model(spec: ModelSpec, device: str = "cpu", dtype: torch.dtype | None = None):
    """An Ouro/MELT checkpoint, or a dense transformers one (the baselines), by its config.json."""
    if model_kind(spec) != "melt":
        if spec.window is not None:
            raise ConfigError(f"model {spec.name!r}: a sliding window applies to MELT checkpoints only")
        return DenseLM.from_pretrained(spec.path, device, dtype)
    model = load_pretrained(spec.path, dtype=dtype, device=device)
    if spec.window is not None:
        if not model.config.is_melt:
            raise ConfigError(f"model {spec.name!r}: a sliding window applies to MELT checkpoints only, "
                              f"{spec.path} is {model.config.model_type}")
        model.config.window = spec.window  # read by every cache the model makes (LoopedLM.new_cache)
    return model
