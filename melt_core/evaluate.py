"""Benchmark evaluation of any melt_core model: Ouro in any cache mode, MELT with any gate,
window and prefill mode. The paper's sampling (docs/METHOD.md section 4): temperature 1.0,
top-p 0.7, n samples per question with pass@1 (mean) and unbiased pass@k; greedy
exact-match where a task says so.

One call evaluates one (model, task) pair and writes one JSON with the settings, the
metrics and every sample's details. Two backends give the same JSON: ``evaluate_lighteval``
(the paper's harness, lighteval's Pipeline over melt_core.lighteval_adapter; the workflow's
default) and ``evaluate`` (melt_core only: no lighteval machinery, used where its overhead or
its import-time behaviour is unwanted). Tests check they agree.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import CheckpointError, load_pretrained
from .config import ConfigError, ModelConfig
from .data import DataError, load_tokenizer, prompt_ids, read_jsonl, stop_token_ids
from .dense import DenseLM, checkpoint_kind
from .early_exit import ExitRule
from .generate import SamplingParams, generate
from .metrics import extract_answer, pass_at_k
from .tracking import NullLogger, stamp


@dataclass
class TaskSpec:
    """One benchmark. Either ``path`` (a local JSONL of chat records; the assistant message is
    the gold answer) or ``lighteval`` ("<module>/<task>": lighteval's own definition, with the
    dataset overrides of melt_core.lighteval_tasks)."""

    name: str
    path: str | None = None
    lighteval: str | None = None
    template: str = "plain"
    answer_style: str = "exact"  # exact | boxed
    samples: int = 1  # completions per question (AIME/AMC: 16)
    ks: list[int] = field(default_factory=lambda: [1])
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 0.7
    max_new_tokens: int = 32_768
    limit: int | None = None
    # lighteval tasks only: dataset overrides, scorer, stop strings, fixed subset
    hf_repo: str | None = None
    hf_subset: str | None = None
    hf_revision: str | None = None
    split: str | None = None
    data_dir: str | None = None
    columns: dict[str, str] | None = None
    metric: str | None = None
    stop: list[str] | None = None
    select: dict[str, Any] | None = None
    allow_code_execution: bool = False  # HumanEval+: scoring runs the model's code (in the sandbox)
    exit: dict[str, Any] | None = None  # early-exit rule for this task, over the model's (ExitRule)
    shard: list[int] | None = None  # [i, n]: only the questions of shard i of n (in_shard); None: all
    unsafe_no_sandbox: bool = False  # run it without isolation where bubblewrap is missing (don't)

    def __post_init__(self):
        if (self.path is None) == (self.lighteval is None):
            raise ConfigError(f"task {self.name!r}: give exactly one of `path` (a local JSONL) or `lighteval` "
                              "('<module>/<task>', lighteval's own definition)")
        if self.shard is not None and not (len(self.shard) == 2 and 0 <= self.shard[0] < self.shard[1]):
            raise ConfigError(f"task {self.name!r}: shard must be [i, n] with 0 <= i < n, got {self.shard}")
        if self.shard is not None and self.lighteval and self.limit:
            raise ConfigError(f"task {self.name!r}: lighteval applies `limit` after the shard filter, so shards "
                              "of a limited task would not add up to it; drop `limit` or `shards`")

    def lighteval_spec(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


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
    exit: dict[str, Any] | None = None  # early-exit rule (melt_core/early_exit.py); None: every loop


def exit_rule(model_spec: ModelSpec, task: TaskSpec, model_config=None) -> ExitRule:
    """The model's exit rule with the task's settings over it, both over the checkpoint's own
    default exit (``model_config``: a looped model's config, once loaded)."""
    default = ExitRule.of_checkpoint(model_config) if model_config is not None else {}
    return ExitRule.from_dict({**default, **(model_spec.exit or {}), **(task.exit or {})})


def in_shard(row: dict, shard: list[int] | None) -> bool:
    """Whether a question (a dataset row or a JSONL record) belongs to shard [i, n]: a hash of its
    content, so the split depends neither on row order nor on which job asks."""
    if shard is None:
        return True
    key = json.dumps(row, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") % shard[1] == shard[0]


def _kind(spec: ModelSpec) -> str:
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


def load_model(spec: ModelSpec, device: str = "cpu", dtype: torch.dtype | None = None):
    """An Ouro/MELT checkpoint, or a dense transformers one (the baselines), by its config.json."""
    if _kind(spec) != "melt":
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


def _prepare(model_spec: ModelSpec, task: TaskSpec) -> list[dict] | None:
    """Checks shared by both backends, before any generation: the model directory, and the
    task's records (a JSONL task's; None for a lighteval task, whose data lighteval loads)."""
    if max(task.ks) > task.samples:
        raise ConfigError(f"task {task.name!r}: pass@{max(task.ks)} needs samples >= {max(task.ks)}, "
                          f"got samples={task.samples}")
    _kind(model_spec)
    if task.lighteval:
        return None
    try:  # the limit first, then the shard: shards of a limited task add up to the limited task
        return [r for r in read_jsonl(task.path, "chat", task.limit) if in_shard(r, task.shard)]
    except DataError as err:
        raise DataError(f"task {task.name!r}: {err}") from None


def evaluate(model_spec: ModelSpec, task: TaskSpec, out_path: str | Path, seed: int = 0,
             batch_size: int = 64, logger=None, device: str = "cpu", model=None) -> dict[str, Any]:
    """``model``: the checkpoint already loaded (load_model), when one job evaluates several tasks."""
    logger = logger or NullLogger()
    if task.lighteval:
        raise ConfigError(f"task {task.name!r} is lighteval's definition ({task.lighteval}); "
                          "evaluate it with the lighteval backend (eval.backend: lighteval)")
    records = _prepare(model_spec, task)
    if not records:  # a shard with no questions (more shards than the hash gives each)
        return _write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="native")
    model = model if model is not None else load_model(model_spec, device)
    tokenizer = load_tokenizer(model_spec.path)
    torch.manual_seed(seed)
    golds = [next(m["content"] for m in r["messages"] if m["role"] == "assistant") for r in records]
    prompts = [prompt_ids(r, tokenizer, task.template) for r in records]
    max_new = min(task.max_new_tokens, model.config.max_position_embeddings - max(map(len, prompts)))
    params = SamplingParams(max_new_tokens=max_new, greedy=task.greedy, temperature=task.temperature,
                            top_p=task.top_p, n=task.samples, seed=seed,
                            stop_token_ids=stop_token_ids(tokenizer))
    t0 = time.perf_counter()
    budget = None if model_spec.memory_budget_gb is None else int(model_spec.memory_budget_gb * 1e9)
    outs = generate(model, prompts, params, cache_mode=model_spec.cache_mode, keep_prompt=model_spec.keep_prompt,
                    prefill_chunk=model_spec.prefill_chunk, tokenizer=tokenizer, batch_size=batch_size,
                    memory_budget_bytes=budget, exit_rule=_exits(model, model_spec, task),
                    batching=model_spec.batching)
    seconds = time.perf_counter() - t0
    details = []
    for rec, gold, samples in zip(records, golds, outs):
        texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
        correct = [extract_answer(t, task.answer_style) == extract_answer(gold, task.answer_style) for t in texts]
        details.append({"prompt": _question(rec), "gold": gold, "completions": texts,
                        "correct": correct, "generated_tokens": [len(s.token_ids) for s in samples],
                        "loops": [sum(s.loops or []) for s in samples],
                        "scores": {f"pass@{k}": pass_at_k(len(correct), sum(correct), k) for k in task.ks}})
    return _write_result(out_path, model_spec, task, seed, details, seconds, logger, backend="native")


def evaluate_lighteval(model_spec: ModelSpec, task: TaskSpec, out_path: str | Path, seed: int = 0,
                       batch_size: int = 64, logger=None, device: str = "cpu", model=None) -> dict[str, Any]:
    """The evaluation through lighteval's Pipeline (melt_core.lighteval_adapter); same JSON out.
    Runs local JSONL tasks and lighteval's own task definitions alike."""
    import shutil
    import tempfile

    from lighteval.models.model_input import GenerationParameters

    from .lighteval_adapter import build_pipeline, melt_model_config
    from .lighteval_tasks import builtin_task_configs, sample_correct, task_config, task_rows, tasks_module

    logger = logger or NullLogger()
    records = _prepare(model_spec, task)  # fail on bad input before lighteval starts
    if records is not None and not records:  # an empty shard
        return _write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="lighteval")
    rule = _exits(model, model_spec, task)
    config = melt_model_config(
        model_spec.path, model_spec.name, cache_mode=model_spec.cache_mode, keep_prompt=model_spec.keep_prompt,
        prefill_chunk=model_spec.prefill_chunk, seed=seed, batch_size=batch_size, device=device,
        memory_budget_gb=model_spec.memory_budget_gb, batching=model_spec.batching,
        template=task.template, exit=rule.as_dict() if rule else None,
        generation_parameters=GenerationParameters(temperature=0.0 if task.greedy else task.temperature,
                                                   top_p=task.top_p))
    with tempfile.TemporaryDirectory() as tmp:
        if task.lighteval:
            configs = builtin_task_configs(task.lighteval_spec())
            if task.shard is not None and not any(task_rows(c) for c in configs):  # an empty shard
                return _write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="lighteval")
        else:
            data_dir = Path(tmp) / "data"
            data_dir.mkdir()
            with (data_dir / "test.jsonl").open("w") as fh:  # a folder holding just this split
                fh.writelines(json.dumps(r) + "\n" for r in records)
            configs = [task_config({"name": task.name, "data_dir": str(data_dir), "split": "test",
                                    "samples": task.samples, "ks": task.ks, "answer_style": task.answer_style,
                                    "max_new_tokens": task.max_new_tokens})]
        stamp(f"eval {model_spec.name} {task.name}: {task.samples} samples per question, up to "
              f"{task.max_new_tokens} new tokens, batch {batch_size}, {device}")
        t0 = time.perf_counter()
        limit = task.limit if task.lighteval else None  # (a JSONL task's records are already limited)
        pipeline = build_pipeline(config, ",".join(f"{c.name}|0" for c in configs), Path(tmp) / "lighteval",
                                  custom_tasks=tasks_module(configs), max_samples=limit, model=model)
        pipeline.evaluate()
        seconds = time.perf_counter() - t0
        loops = pipeline.model.loops  # prompt text -> loops run per sample
        logged = pipeline.evaluation_tracker.details_logger.details
        shutil.rmtree(Path(tmp) / "lighteval", ignore_errors=True)
    by_name = {f"{c.name}|0": c for c in configs}  # lighteval keys details by "<task>|<few-shots>"
    details = []
    for key, rows in sorted(logged.items()):
        cfg = by_name[key]
        for row in rows:
            texts = list(row.model_response.text)
            scored = row.model_response.final_text  # what the metrics scored (lighteval may strip reasoning)
            details.append({"task": cfg.name, "prompt": row.doc.query, "gold": row.doc.get_golds()[0],
                            "completions": texts, "correct": [sample_correct(cfg, row.doc, t) for t in scored],
                            "generated_tokens": [len(t) for t in row.model_response.output_tokens],
                            "loops": loops.get(row.model_response.input, [0] * len(texts)),
                            "scores": {k: float(v) for k, v in row.metric.items()}})
    return _write_result(out_path, model_spec, task, seed, details, seconds, logger, backend="lighteval")


def _exits(model, model_spec: ModelSpec, task: TaskSpec) -> ExitRule | None:
    """The exit rule where it can stop a token early (a dense model has one loop: never); with the
    model not loaded yet, the rule as set (generate() decides)."""
    config = getattr(model, "config", None)  # a dense baseline's is transformers', with no exit defaults
    rule = exit_rule(model_spec, task, config if isinstance(config, ModelConfig) else None)
    return rule if model is None or rule.stops_early(model.num_loops) else None


def _question(record: dict) -> str:
    return [m for m in record["messages"] if m["role"] != "assistant"][-1]["content"]


def _canonical(details: list[dict]) -> list[dict]:
    """Questions in one order whatever the backend or sharding: by task (subset), prompt, gold."""
    return sorted(details, key=lambda d: (d.get("task", ""), d["prompt"], str(d["gold"])))


def _metrics(details: list[dict], ks: list[int]) -> dict[str, float]:
    """pass@k: the mean over questions of each question's unbiased pass@k (pooled over subsets);
    None for no questions (an empty shard)."""
    if not details:
        return {f"pass@{k}": None for k in ks}
    return {f"pass@{k}": float(np.mean([d["scores"][f"pass@{k}"] for d in details])) for k in ks}


def merge_shards(paths: list[str | Path], out_path: str | Path, logger=None) -> dict[str, Any]:
    """One task's result from the results of its shards [0, n) ... [n-1, n): the questions joined,
    pass@k recomputed over all of them; the same JSON an unsharded run writes (tests check it)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    n = len(parts)
    got = sorted(tuple(p["task"]["shard"] or ()) for p in parts)
    if got != [(i, n) for i in range(n)]:
        raise DataError(f"merge of {first['task']['name']!r}: expected shards 0..{n - 1} of {n}, got {got}")
    for p in parts[1:]:
        if p["model"] != first["model"] or {**p["task"], "shard": None} != {**first["task"], "shard": None} \
                or p["seed"] != first["seed"]:
            raise DataError(f"merge of {first['task']['name']!r}: shards of different models or settings")
    task = TaskSpec(**{**first["task"], "shard": None})
    details = [d for p in parts for d in p["details"]]
    return _write_result(out_path, ModelSpec(**first["model"]), task, first["seed"], details,
                         sum(p["seconds"] for p in parts), logger or NullLogger(), backend=first["backend"],
                         shards=n)


def _write_result(out_path, model_spec, task, seed, details, seconds, logger, backend,
                  shards: int | None = None) -> dict[str, Any]:
    details = _canonical(details)
    metrics = _metrics(details, task.ks)
    stamp(f"eval {model_spec.name} {task.name}: {len(details)} questions x {task.samples} samples in "
          f"{seconds:.1f} s: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in metrics.items() if v is not None))
    tokens = sum(sum(d.get("generated_tokens", [])) for d in details)
    loops = sum(sum(d.get("loops", [])) for d in details)
    result = {"model": asdict(model_spec), "task": asdict(task), "seed": seed, "backend": backend,
              "metrics": metrics, "n_questions": len(details), "generated_tokens": tokens,
              "mean_loops": loops / tokens if tokens else None,  # loops per generated token
              "seconds": seconds, "shards": shards, "details": details}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out_path)
    logger.log_metrics({f"{task.name}/{k}": v for k, v in metrics.items()})
    return result
