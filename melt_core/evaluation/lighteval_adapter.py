"""The lighteval route: any melt_core model (Ouro in any cache mode; MELT with any gate, window
and prefill mode) served to lighteval's Pipeline as a custom ``LightevalModel``.

Why a custom model class and not lighteval's in-memory transformers route: our models are not
transformers ``PreTrainedModel``s (no remote code, our own caches), and the custom class lets
generation go through ``melt_core.generation.generate`` so cache modes and prefill chunking are honoured.

Known lighteval 0.13 pitfalls and what this module does about each (tests in
tests/test_lighteval.py):

* lighteval's task registry imports every built-in task module, and some act at import time:
  ``tiny_benchmarks`` downloads a pickle from GitHub (fails offline, and would unpickle a
  downloaded file), the LLM-judge tasks (mt_bench, mix_eval, ...) query the hub. While
  ``build_pipeline`` constructs the pipeline, the registry imports no built-in module (every
  task reaches it as our custom module; melt_core.evaluation.lighteval_tasks imports just the one built-in
  module a task names), and ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` are set when asked to run
  offline.
* Sampling several completions (n > 1) needs ``do_sample`` in the transformers route; here
  n > 1 always samples (temperature, top-p from the generation parameters), and greedy is used
  only when temperature is 0.
* ``max_new_tokens`` in its GenerationParameters also truncates the prompt in the transformers
  route; here the prompt is never truncated: the new-token budget is capped instead, and a
  prompt longer than the model's positions is an error.
* Its prediction cache is keyed on the model config, not the weights, so a retrained
  checkpoint at the same path would be served stale answers; the config's ``model_name``
  carries a hash of the weights file, and ``greedy_until`` is not cached at all.
* It does not seed torch; sampling draws from a generator seeded by ``seed``.
* xxhash 4 breaks its result logging: ``envs/requirements-cpu.txt`` pins xxhash 3.x.
* Importing its transformers model module calls ``torch.set_grad_enabled(False)`` for the whole
  process; ``melt_core.training.train`` and ``pretrain`` therefore enable grad themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from lighteval.models.abstract_model import LightevalModel
from lighteval.models.abstract_model import ModelConfig as LightevalModelConfig
from lighteval.models.model_input import GenerationParameters
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.prompt_manager import PromptManager
from lighteval.tasks.requests import Doc
from lighteval.utils.cache_management import SampleCache

from ..data import load_tokenizer, prompt_text, stop_token_ids
from ..generation.generate import SamplingParams
from ..modeling.checkpoint import CheckpointError
from ..modeling.config import ConfigError
from ..modeling.early_exit import ExitRule
from ..serving.inference import ModelSpec, generate_with, load_model
from ..tracking import NullLogger, stamp
from .evaluate import TaskSpec, prepare, task_exit_rule, write_result
from .lighteval_tasks import builtin_task_configs, sample_correct, task_config, task_rows, tasks_module

CHAT_PROMPTS = PromptManager(use_chat_template=True)  # lighteval's own messages for a built-in task's doc

def weights_digest(path: str | Path) -> str:
    """A short hash of a checkpoint's weights (size + mtime + first MB), cheap even at 3 GB."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no safetensors weights; not a melt_core checkpoint directory")
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:12]


class MeltModelConfig(LightevalModelConfig):
    """lighteval's view of one of our models: the model as evaluation runs it (``spec``: checkpoint,
    cache and prefill mode, memory budget, batching, the exit rule as resolved for the task), plus
    what lighteval's side needs. ``template``: the chat template that turns a task's question into
    the model's prompt (melt_core.data.TEMPLATES); None takes each doc's query as the finished
    prompt."""

    spec: ModelSpec
    template: str | None = None
    seed: int = 0
    batch_size: int = 16
    device: str = "cpu"


def melt_model_config(spec: ModelSpec, **kw) -> MeltModelConfig:
    """A config whose model_name carries the weights' digest, so lighteval's cache can't go stale."""
    return MeltModelConfig(model_name=f"{spec.name}@{weights_digest(spec.path)}", spec=spec, **kw)


class MeltLightevalModel(LightevalModel):
    def __init__(self, config: MeltModelConfig, model=None):
        """``model``: the checkpoint of ``config.spec`` already loaded, or a vLLM engine serving it
        (melt_core.serving.inference.start_engine); else it is loaded here."""
        self.config = config
        self.model = model if model is not None else load_model(config.spec, device=config.device)
        self._tokenizer = load_tokenizer(config.spec.path)
        self._cache = SampleCache(config)  # the pipeline expects one; greedy_until never reads it
        self.loops: dict[str, list[int]] = {}  # prompt text -> loops run for each sample's tokens

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def add_special_tokens(self) -> bool:
        return False

    @property
    def max_length(self) -> int:
        return getattr(self.model, "max_model_len", None) or self.model.config.max_position_embeddings

    def prompt(self, doc: Doc) -> str:
        """The text the model completes: the doc's messages (our tasks), or the messages lighteval's
        own chat route builds from its instruction, few-shot samples and query, in the chat
        template; or the bare query."""
        if self.config.template is None:
            return doc.query
        messages = (doc.specific or {}).get("messages") or CHAT_PROMPTS.prepare_prompt_api(doc)
        return prompt_text({"messages": messages}, self._tokenizer, self.config.template)

    def _sampling(self, doc: Doc, prompt_len: int) -> SamplingParams:
        gp = self.config.generation_parameters
        temperature = gp.temperature if gp.temperature is not None else 0.0
        greedy = temperature == 0.0 and doc.num_samples == 1
        budget = doc.generation_size or gp.max_new_tokens or 256
        if prompt_len >= self.max_length:
            raise ConfigError(f"doc {doc.id or doc.query[:30]!r}: prompt of {prompt_len} tokens does not fit "
                              f"max_position_embeddings={self.max_length}")
        # the budget is capped by what fits after the prompt; the prompt itself is never cut
        return SamplingParams(max_new_tokens=min(budget, self.max_length - prompt_len), greedy=greedy,
                              temperature=temperature if temperature > 0 else 1.0, top_p=gp.top_p or 1.0,
                              n=doc.num_samples, seed=self.config.seed,
                              stop_token_ids=stop_token_ids(self._tokenizer),
                              stop_strings=tuple(doc.stop_sequences or ()))

    def greedy_until(self, docs: list[Doc]) -> list[ModelResponse]:
        """Docs with the same sampling settings are generated together, in batches, in doc order."""
        texts = [self.prompt(doc) for doc in docs]
        prompts = [self.tok_encode(t) for t in texts]
        groups: dict[SamplingParams, list[int]] = {}
        for i, doc in enumerate(docs):
            groups.setdefault(self._sampling(doc, len(prompts[i])), []).append(i)
        responses: list[ModelResponse | None] = [None] * len(docs)
        spec = self.config.spec
        rule = None if spec.exit is None else ExitRule.from_dict(spec.exit)
        rule = rule if rule is not None and rule.stops_early(self.model.num_loops) else None
        for params, idx in groups.items():
            outs = generate_with(self.model, [prompts[i] for i in idx], params, spec, self._tokenizer,
                                 self.config.batch_size, rule)
            for i, samples in zip(idx, outs):
                self.loops[texts[i]] = [sum(o.loops or []) for o in samples]
                responses[i] = ModelResponse(input=texts[i], input_tokens=prompts[i], text=[o.text for o in samples],
                                             output_tokens=[o.token_ids for o in samples])
        return responses

    def loglikelihood(self, docs: list[Doc]) -> list[ModelResponse]:
        raise NotImplementedError(
            "no log-likelihood route: every task is scored on generated samples (melt_core.evaluation.lighteval_tasks "
            "refuses a metric that is not per-sample generative before the model is asked)")

    loglikelihood_rolling = loglikelihood


@contextlib.contextmanager
def only_builtin_task_modules(allowed: set[str]):
    """Let lighteval's registry import just the built-in task modules in ``allowed``."""
    from lighteval.tasks.registry import Registry

    from_files, from_subdirs = Registry._load_from_files, Registry._load_from_subdirs

    def files(paths, prefix):
        return from_files([p for p in paths if p.stem in allowed], prefix)

    def subdirs(paths):
        return from_subdirs([p for p in paths if p.name in allowed])

    Registry._load_from_files, Registry._load_from_subdirs = staticmethod(files), staticmethod(subdirs)
    try:
        yield
    finally:
        Registry._load_from_files, Registry._load_from_subdirs = staticmethod(from_files), staticmethod(from_subdirs)


def build_pipeline(model_config: MeltModelConfig, tasks: str, output_dir: str | Path,
                   custom_tasks: str | Path | None = None, max_samples: int | None = None,
                   offline: bool = True, model=None):
    """A lighteval Pipeline evaluating ``tasks`` (e.g. "column_add|0", defined in ``custom_tasks``)
    on our model; ``model``: the checkpoint already loaded (MeltLightevalModel)."""
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lighteval.logging.evaluation_tracker import EvaluationTracker
    from lighteval.pipeline import ParallelismManager, Pipeline, PipelineParameters

    tracker = EvaluationTracker(output_dir=str(output_dir), save_details=True)
    params = PipelineParameters(launcher_type=ParallelismManager.CUSTOM, custom_tasks_directory=custom_tasks,
                                max_samples=max_samples)
    with only_builtin_task_modules(set()):
        return Pipeline(tasks=tasks, pipeline_parameters=params, evaluation_tracker=tracker,
                        model=MeltLightevalModel(model_config, model))


def evaluate_lighteval(model_spec: ModelSpec, task: TaskSpec, out_path: str | Path, seed: int = 0,
                       batch_size: int = 64, logger=None, device: str = "cpu", model=None) -> dict[str, Any]:
    """The evaluation through lighteval's Pipeline: the same JSON as melt_core.evaluation.evaluate.evaluate.
    Runs local JSONL tasks and lighteval's own task definitions alike."""
    logger = logger or NullLogger()
    records = prepare(model_spec, task)  # fail on bad input before lighteval starts
    if records is not None and not records:  # an empty shard
        return write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="lighteval")
    rule = task_exit_rule(model, model_spec, task)
    config = melt_model_config(
        dataclasses.replace(model_spec, exit=rule.as_dict() if rule else None), seed=seed, batch_size=batch_size,
        device=device, template=task.template,
        generation_parameters=GenerationParameters(temperature=0.0 if task.greedy else task.temperature,
                                                   top_p=task.top_p))
    with tempfile.TemporaryDirectory() as tmp:
        if task.lighteval:
            configs = builtin_task_configs(task.lighteval_spec())
            if task.shard is not None and not any(task_rows(c) for c in configs):  # an empty shard
                return write_result(out_path, model_spec, task, seed, [], 0.0, logger, backend="lighteval")
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
    return write_result(out_path, model_spec, task, seed, details, seconds, logger, backend="lighteval")
