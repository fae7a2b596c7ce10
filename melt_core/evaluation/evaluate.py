"""Benchmark evaluation of any melt_core model: Ouro in any cache mode, MELT with any gate,
window and prefill mode. The paper's sampling (docs/METHOD.md section 4): temperature 1.0,
top-p 0.7, n samples per question with pass@1 (mean) and unbiased pass@k; greedy
exact-match where a task says so.

One call evaluates one (model, task) pair and writes one JSON with the settings, the
metrics and every sample's details. Two backends give the same JSON: ``evaluate`` here
(melt_core only: no lighteval machinery, used where its overhead or its import-time behaviour
is unwanted) and melt_core.evaluation.lighteval_adapter.evaluate_lighteval (the paper's harness,
lighteval's Pipeline; the workflow's default), which builds on this module's task spec, checks
and result writing. Tests check they agree. The model side (spec, loading, exit rule, shards)
is melt_core.serving.inference, under both.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import DataError, load_tokenizer, prompt_ids, read_jsonl, stop_token_ids
from ..generation.generate import SamplingParams
from ..modeling.config import ConfigError, ModelConfig
from ..modeling.early_exit import ExitRule
from ..serving.inference import ModelSpec, exit_rule, generate_with, in_shard, load_model, model_kind
from ..tracking import NullLogger, stamp
from .metrics import extract_answer, pass_at_k


@dataclass
class TaskSpec:
    """One benchmark. Either ``path`` (a local JSONL of chat records; the assistant message is
    the gold answer) or ``lighteval`` ("<module>/<task>": lighteval's own definition, with the
    dataset overrides of melt_core.evaluation.lighteval_tasks)."""

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


def prepare(model_spec: ModelSpec, task: TaskSpec) -> list[dict] | None:
    """Checks shared by both backends, before any generation: the model directory, and the
    task's records (a JSONL task's; None for a lighteval task, whose data lighteval loads)."""
    if max(task.ks) > task.samples:
        raise ConfigError(f"task {task.name!r}: pass@{max(task.ks)} needs samples >= {max(task.ks)}, "
                          f"got samples={task.samples}")
    model_kind(model_spec)
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
    records = prepare(model_spec, task)
    if not records:  # a shard with no questions (more shards than the hash gives each)
        return write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="native")
    model = model if model is not None else load_model(model_spec, device)
    tokenizer = load_tokenizer(model_spec.path)
    torch.manual_seed(seed)
    golds = [next(m["content"] for m in r["messages"] if m["role"] == "assistant") for r in records]
    prompts = [prompt_ids(r, tokenizer, task.template) for r in records]
    max_new = min(task.max_new_tokens, (getattr(model, "max_model_len", None) or model.config.max_position_embeddings)
                  - max(map(len, prompts)))
    params = SamplingParams(max_new_tokens=max_new, greedy=task.greedy, temperature=task.temperature,
                            top_p=task.top_p, n=task.samples, seed=seed,
                            stop_token_ids=stop_token_ids(tokenizer))
    t0 = time.perf_counter()
    outs = generate_with(model, prompts, params, model_spec, tokenizer, batch_size,
                         task_exit_rule(model, model_spec, task))
    seconds = time.perf_counter() - t0
    details = []
    for rec, gold, samples in zip(records, golds, outs):
        texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
        correct = [extract_answer(t, task.answer_style) == extract_answer(gold, task.answer_style) for t in texts]
        details.append({"prompt": _question(rec), "gold": gold, "completions": texts,
                        "correct": correct, "generated_tokens": [len(s.token_ids) for s in samples],
                        "loops": [sum(s.loops or []) for s in samples],
                        "scores": {f"pass@{k}": pass_at_k(len(correct), sum(correct), k) for k in task.ks}})
    return write_result(out_path, model_spec, task, seed, details, seconds, logger, backend="native")


def task_exit_rule(model, model_spec: ModelSpec, task: TaskSpec) -> ExitRule | None:
    """The exit rule where it can stop a token early (a dense model has one loop: never); with the
    model not loaded yet, the rule as set (generate() decides)."""
    config = getattr(model, "config", None)  # a dense baseline's is transformers', with no exit defaults
    rule = exit_rule(model_spec, task.exit, config if isinstance(config, ModelConfig) else None)
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
    return write_result(out_path, ModelSpec(**first["model"]), task, first["seed"], details,
                         sum(p["seconds"] for p in parts), logger or NullLogger(), backend=first["backend"],
                         shards=n)


def write_result(out_path, model_spec, task, seed, details, seconds, logger, backend,
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
