"""lighteval custom tasks for local JSONL benchmarks (the embedded suite, or a paper benchmark
exported to JSONL). A task spec is ``{name, data_dir, split, template, tokenizer, samples, ks,
answer_style, max_new_tokens}``; ``tasks_module(specs)`` gives the module object the Pipeline
takes, and the lighteval CLI can load this file by path with the specs in the environment
variable ``MELT_LIGHTEVAL_TASKS`` (a JSON list).

Each task scores with the same metric kinds as melt_core.evaluate: pass@k for every k
(pass@1 = mean correctness over the n samples), answers extracted the same way.
"""

from __future__ import annotations

import json
import os
import types

import numpy as np
from lighteval.metrics.metrics_sample import SampleLevelComputation, SamplingMetric
from lighteval.metrics.utils.metric_utils import SampleLevelMetric
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc, SamplingMethod

# absolute imports: lighteval may load this file by path, outside its package
from melt_core.data import load_tokenizer, normalise, prompt_text
from melt_core.metrics import extract_answer, pass_at_k


class PassAtK(SamplingMetric, SampleLevelComputation):
    """Unbiased pass@k over n samples, with melt_core's answer extraction."""

    def __init__(self, k: int, n: int, answer_style: str):
        self.k, self.n, self.answer_style = k, n, answer_style

    def compute(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        gold = extract_answer(doc.get_golds()[0], self.answer_style)
        correct = [extract_answer(t, self.answer_style) == gold for t in model_response.text[: self.n]]
        return pass_at_k(len(correct), sum(correct), self.k)

    def num_samples(self) -> int:
        return self.n


def task_config(spec: dict) -> LightevalTaskConfig:
    tokenizer = load_tokenizer(spec["tokenizer"])
    template = spec.get("template", "plain")

    def prompt_fn(line: dict, task_name: str) -> Doc:
        record = normalise(line, "chat", task_name)
        gold = next(m["content"] for m in record["messages"] if m["role"] == "assistant")
        return Doc(query=prompt_text(record, tokenizer, template), choices=[gold], gold_index=0, task_name=task_name)

    n = spec.get("samples", 1)
    metrics = [SampleLevelMetric(metric_name=f"pass@{k}", higher_is_better=True, category=SamplingMethod.GENERATIVE,
                                 sample_level_fn=PassAtK(k, n, spec.get("answer_style", "exact")),
                                 corpus_level_fn=np.mean)
               for k in spec.get("ks", [1])]
    return LightevalTaskConfig(name=spec["name"], prompt_function=prompt_fn, hf_repo=spec["data_dir"],
                               hf_subset="default", metrics=metrics, hf_avail_splits=[spec.get("split", "test")],
                               evaluation_splits=[spec.get("split", "test")], few_shots_split=None,
                               generation_size=spec.get("max_new_tokens", 256), stop_sequence=[])


def tasks_module(specs: list[dict]) -> types.ModuleType:
    """A custom-tasks module object for lighteval's Pipeline, built from task specs."""
    module = types.ModuleType("melt_lighteval_tasks", __doc__)
    module.TASKS_TABLE = [task_config(s) for s in specs]
    return module


# For the lighteval CLI (`lighteval custom ... --custom-tasks melt_core/lighteval_tasks.py`).
TASKS_TABLE = [task_config(s) for s in json.loads(os.environ.get("MELT_LIGHTEVAL_TASKS", "[]"))]
