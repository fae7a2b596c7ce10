"""Benchmark evaluation of any melt_core model: Ouro in any cache mode, MELT with any gate,
window and prefill mode. The paper's sampling (METHOD.md section 4): temperature 1.0,
top-p 0.7, n samples per question with pass@1 (mean) and unbiased pass@k; greedy
exact-match where a task says so.

One call evaluates one (model, task) pair and writes one JSON with the settings, the
metrics and every sample's details. Two backends give the same JSON: ``evaluate_lighteval``
(the paper's harness, lighteval's Pipeline over melt_core.lighteval_adapter; the workflow's
default) and ``evaluate`` (melt_core only: no lighteval machinery, used where its overhead or
its import-time behaviour is unwanted). Tests check they agree.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointError, load_pretrained
from .config import ConfigError
from .data import DataError, load_tokenizer, prompt_ids, prompt_text, read_jsonl
from .generate import SamplingParams, generate
from .metrics import extract_answer, pass_at_k
from .tracking import NullLogger


@dataclass
class TaskSpec:
    name: str
    path: str  # local JSONL of chat records; the assistant message is the gold answer
    template: str = "plain"
    answer_style: str = "exact"  # exact | boxed
    samples: int = 1  # completions per question (AIME/AMC: 16)
    ks: list[int] = field(default_factory=lambda: [1])
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 0.7
    max_new_tokens: int = 32_768
    limit: int | None = None


@dataclass
class ModelSpec:
    """A checkpoint plus how to run it."""

    name: str
    path: str
    cache_mode: str = "default"  # Ouro: default | first-loop | last-loop
    keep_prompt: bool = False  # Ouro sharing modes: keep the prompt's per-loop cache
    prefill_chunk: int | None = None  # MELT: None = token-by-token (exact), C = chunked


def load_model(spec: ModelSpec, device: str = "cpu"):
    path = Path(spec.path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"model {spec.name!r}: {path} is not a melt_core checkpoint directory "
                              "(no config.json); train, convert or download it first")
    return load_pretrained(path, device=device)


def _prepare(model_spec: ModelSpec, task: TaskSpec, device: str):
    """Checks shared by both backends, before any generation: the task's records and the model."""
    if max(task.ks) > task.samples:
        raise ConfigError(f"task {task.name!r}: pass@{max(task.ks)} needs samples >= {max(task.ks)}, "
                          f"got samples={task.samples}")
    try:
        records = read_jsonl(task.path, "chat", task.limit)
    except DataError as err:
        raise DataError(f"task {task.name!r}: {err}") from None
    return records, load_model(model_spec, device)


def evaluate(model_spec: ModelSpec, task: TaskSpec, out_path: str | Path, seed: int = 0,
             batch_size: int = 64, logger=None, device: str = "cpu") -> dict[str, Any]:
    logger = logger or NullLogger()
    records, model = _prepare(model_spec, task, device)
    tokenizer = load_tokenizer(model_spec.path)
    torch.manual_seed(seed)
    golds = [next(m["content"] for m in r["messages"] if m["role"] == "assistant") for r in records]
    prompts = [prompt_ids(r, tokenizer, task.template) for r in records]
    max_new = min(task.max_new_tokens, model.config.max_position_embeddings - max(map(len, prompts)))
    params = SamplingParams(max_new_tokens=max_new, greedy=task.greedy, temperature=task.temperature,
                            top_p=task.top_p, n=task.samples, seed=seed,
                            stop_token_ids=tuple({tokenizer.eos_token_id, *_im_end(tokenizer)}))
    t0 = time.perf_counter()
    outs = generate(model, prompts, params, cache_mode=model_spec.cache_mode, keep_prompt=model_spec.keep_prompt,
                    prefill_chunk=model_spec.prefill_chunk, tokenizer=tokenizer, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    details, per_k = [], {k: [] for k in task.ks}
    for rec, gold, samples in zip(records, golds, outs):
        texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
        correct = [extract_answer(t, task.answer_style) == extract_answer(gold, task.answer_style) for t in texts]
        for k in task.ks:
            per_k[k].append(pass_at_k(len(correct), sum(correct), k))
        details.append({"prompt": rec["messages"][0]["content"], "gold": gold, "completions": texts,
                        "correct": correct, "generated_tokens": [len(s.token_ids) for s in samples]})
    metrics = {f"pass@{k}": sum(v) / len(v) for k, v in per_k.items()}
    return _write_result(out_path, model_spec, task, seed, metrics, details, seconds, logger, backend="native")


def evaluate_lighteval(model_spec: ModelSpec, task: TaskSpec, out_path: str | Path, seed: int = 0,
                       batch_size: int = 64, logger=None, device: str = "cpu") -> dict[str, Any]:
    """The same evaluation through lighteval's Pipeline (melt_core.lighteval_adapter); same JSON out."""
    import shutil
    import tempfile

    from lighteval.models.model_input import GenerationParameters

    from .lighteval_adapter import build_pipeline, melt_model_config
    from .lighteval_tasks import tasks_module

    logger = logger or NullLogger()
    records, _ = _prepare(model_spec, task, device)  # fail on bad input before lighteval starts
    config = melt_model_config(
        model_spec.path, model_spec.name, cache_mode=model_spec.cache_mode, keep_prompt=model_spec.keep_prompt,
        prefill_chunk=model_spec.prefill_chunk, seed=seed, batch_size=batch_size, device=device,
        generation_parameters=GenerationParameters(temperature=0.0 if task.greedy else task.temperature,
                                                   top_p=task.top_p))
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        with (data_dir / "test.jsonl").open("w") as fh:  # a folder holding just this split
            fh.writelines(json.dumps(r) + "\n" for r in records)
        spec = {"name": task.name, "data_dir": str(data_dir), "split": "test", "template": task.template,
                "tokenizer": model_spec.path, "samples": task.samples, "ks": task.ks,
                "answer_style": task.answer_style, "max_new_tokens": task.max_new_tokens}
        t0 = time.perf_counter()
        pipeline = build_pipeline(config, f"{task.name}|0", Path(tmp) / "lighteval",
                                  custom_tasks=tasks_module([spec]))
        pipeline.evaluate()
        seconds = time.perf_counter() - t0
        scores = pipeline.get_results()["results"][f"{task.name}:0"]
        completions = pipeline.model.completions
        shutil.rmtree(Path(tmp) / "lighteval", ignore_errors=True)
    tokenizer = load_tokenizer(model_spec.path)
    metrics = {f"pass@{k}": float(scores[f"pass@{k}"]) for k in task.ks}
    details = []
    for rec in records:
        gold = next(m["content"] for m in rec["messages"] if m["role"] == "assistant")
        texts = completions.get(prompt_text(rec, tokenizer, task.template), [])
        details.append({"prompt": rec["messages"][0]["content"], "gold": gold, "completions": texts,
                        "correct": [extract_answer(t, task.answer_style) == extract_answer(gold, task.answer_style)
                                    for t in texts]})
    return _write_result(out_path, model_spec, task, seed, metrics, details, seconds, logger, backend="lighteval")


def _write_result(out_path, model_spec, task, seed, metrics, details, seconds, logger, backend) -> dict[str, Any]:
    result = {"model": asdict(model_spec), "task": asdict(task), "seed": seed, "backend": backend,
              "metrics": metrics, "n_questions": len(details),
              "generated_tokens": sum(sum(d.get("generated_tokens", [])) for d in details),
              "seconds": seconds, "details": details}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out_path)
    logger.log_metrics({f"{task.name}/{k}": v for k, v in metrics.items()})
    return result


def _im_end(tokenizer) -> list[int]:
    tid = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [tid] if isinstance(tid, int) and tid != tokenizer.unk_token_id else []
