"""What the eval and early_exit rules share: the model a model id names, loaded on the job's
device with its cache mode, and the backend that evaluates it."""

import json
from dataclasses import replace
from pathlib import Path

from model_id import ModelId

from melt_core.evaluation.evaluate import evaluate
from melt_core.evaluation.lighteval_adapter import evaluate_lighteval
from melt_core.modeling.checkpoint import read_config
from melt_core.serving.inference import (
    ModelSpec,
    exit_rule,
    load_model,
    model_kind,
    resolve_device,
    resolve_dtype,
    resolve_memory_budget,
    spec_vllm_refusal,
    start_engine,
)


def load_eval_model(sm, log, task_cfg: dict, model_id: str, member: dict, model=None, **spec_kw):
    """(ModelSpec, loaded model, device, run) for a model id; sharing-baseline ids run Ouro with that
    cache; the memory budget is resolved against the loaded weights. ``member``: the id's checkpoint,
    prefill, window and MLflow tags (pipeline.py eval_member, in the rules' ``models`` param);
    ``model``: the one an earlier task of the same job loaded for this id, reused."""
    cache_mode, keep_prompt = ModelId.parse(model_id).cache
    asked = ModelSpec(name=model_id, path=member["checkpoint"], prefill_chunk=member["prefill_chunk"],
                      window=member["window"], batching=sm.params.batching, cache_mode=cache_mode,
                      keep_prompt=keep_prompt, **{"engine": sm.params.engine, "vllm": sm.params.vllm, **spec_kw})
    device = resolve_device(sm.params.device)
    dtype = resolve_dtype(sm.params.dtype, device)
    refusal = None
    if asked.engine == "vllm":
        config = read_config(asked.path) if model_kind(asked) == "melt" else None
        refusal = spec_vllm_refusal(asked, exit_rule(asked, task_cfg.get("exit"), config), config)
        if refusal:  # README: what stays on the native engine, and why
            print(f"{model_id}: evaluated on the native engine, not vLLM: {refusal}")
    spec = replace(asked, engine="native") if refusal else asked
    log.log_params({"model": model_id, "cache_mode": spec.cache_mode, "keep_prompt": spec.keep_prompt,
                    "prefill_chunk": spec.prefill_chunk, "window": spec.window, "batching": spec.batching,
                    "backend": sm.params.backend, "engine": spec.engine,
                    "device": device,
                    "dtype": str(dtype).removeprefix("torch.")})
    log.set_tags({"engine": spec.engine})
    if spec.engine == "vllm":
        if model is None:
            model = start_engine(spec, max_model_len(sm, spec), seed=sm.params.seed,
                                 dtype=str(dtype).removeprefix("torch."))
            print(f"{model_id}: vLLM engine started in {model.start_seconds:.1f} s")
        log.log_params({"vllm": spec.vllm})
    else:
        model = load_model(spec, device, dtype) if model is None else model
        spec.memory_budget_gb = resolve_memory_budget(sm.params.memory_budget_gb, device, model)
        log.log_params({"memory_budget_gb": spec.memory_budget_gb})
    run = evaluate_lighteval if sm.params.backend == "lighteval" else evaluate
    link_training_run(sm, log, task_cfg, member)
    return spec, model, device, run


def max_model_len(sm, spec: ModelSpec) -> int:
    """The longest sequence a vLLM engine must hold for the job's tasks: the largest new-token budget
    plus eval.vllm.max_prompt_tokens, within the model's positions."""
    positions = json.loads((Path(spec.path) / "config.json").read_text()).get("max_position_embeddings", 1 << 30)
    budget = max(int(t.get("max_new_tokens", 32768)) for t in sm.params.tasks.values())
    return min(positions, budget + int((spec.vllm or {}).get("max_prompt_tokens", 4096)))


def link_training_run(sm, log, task_cfg: dict, member: dict) -> None:
    """Tag the run with the checkpoint it evaluates and, for a trained MELT run, the training run
    (rule phase) that wrote that checkpoint, so MLflow leads from a score to its loss curves."""
    tags = member["tags"]
    links = {"checkpoint": str(member["checkpoint"])}
    data = task_cfg.get("path") or task_cfg.get("data_dir")
    if data:  # a local JSONL or a fetched benchmark copy: what this eval read, with its digest
        log.log_dataset(data, "evaluation")
    elif getattr(sm.input, "benchmarks", None):  # hub datasets fetched by rule benchmark_data: its manifest
        log.log_dataset(sm.input.benchmarks, "evaluation", name="benchmarks manifest")
    if tags.get("trained_path"):
        found = log.find_run({"rule": "phase", "gate": tags["gate"], "path": tags["trained_path"],
                              "seed": tags["seed"]})
        if found:
            links["training_run_id"] = found
    log.set_tags(links)
