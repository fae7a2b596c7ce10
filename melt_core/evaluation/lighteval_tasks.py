"""The lighteval tasks we evaluate on, two kinds, one metric family.

* **lighteval's own definitions** (the paper suite: AIME24/25, MATH-500, OlympiadBench,
  GPQA-Diamond, HLE, MMLU-Redux): a spec names one as ``lighteval: "<module>/<task>"`` (the
  module is the file under ``lighteval/tasks/tasks``; the task may end in ``*`` to take every
  subset, e.g. ``mmlu_redux/mmlu_redux_2:*``). We keep its prompt function, dataset and scorer,
  and apply the paper's sampling: ``samples`` completions per question, ``max_new_tokens``, and
  pass@k for every k in ``ks``. A benchmark lighteval does not define (AMC23, AIME26) reuses a
  definition with another dataset: ``hf_repo``/``hf_subset``/``split``, plus ``columns`` to
  rename the dataset's fields into the ones the prompt function reads. ``data_dir`` points at a
  local copy instead of the hub (a folder of ``<split>.jsonl``/``.parquet`` in the dataset's
  own columns; a benchmark of several subsets keeps one subfolder per subset);
  ``select: {n, seed, id_field}`` fixes a subset (HLE's 300 questions).
  Module ``melt`` holds the definitions we add (HumanEval+: melt_core.evaluation.code_tasks).
* **local JSONL tasks** (the embedded suite, or any benchmark exported to chat records): a spec
  ``{name, data_dir, split, answer_style, ...}``; scored with melt_core's answer extraction.

Each task scores with lighteval's unbiased ``PassAtK`` (pass@1 = mean correctness over the n
samples) around the task's per-sample scorer. ``tasks_module(configs)`` gives the module object
the Pipeline takes; the lighteval CLI can load this file by path with JSONL specs in the
environment variable ``MELT_LIGHTEVAL_TASKS`` (a JSON list).
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import importlib
import json
import os
import random
import re
import types
from pathlib import Path

import numpy as np
from lighteval.metrics.metrics import Metrics
from lighteval.metrics.metrics_sample import PassAtK, SamplingMetric
from lighteval.metrics.utils.metric_utils import SampleLevelMetric
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc, SamplingMethod

from melt_core.data import DataError, normalise

# absolute imports: lighteval may load this file by path, outside its package
from melt_core.evaluation.code_tasks import PassesTests, humaneval_prompt
from melt_core.evaluation.metrics import extract_answer
from melt_core.evaluation.sandbox import BWRAP_PATHS, SandboxUnavailable, available, self_test
from melt_core.modeling.config import ConfigError
from melt_core.serving.inference import in_shard

# built-in modules that act at import time (downloads, hub queries): never imported
UNSAFE_MODULES = {"tiny_benchmarks", "mt_bench", "mix_eval"}


# ----------------------------------------------------------------------------- metrics
class AnswerMatch:
    """1.0 when the completion's answer equals the gold's (melt_core's extraction), else 0.0."""

    def __init__(self, style: str):
        self.style = style

    def __call__(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        gold = extract_answer(doc.get_golds()[0], self.style)
        return float(extract_answer(model_response.text[0], self.style) == gold)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


_ANSWER_LINE = re.compile(r"^[ \t*]*(?:final[ \t]+)?answer[ \t*]*[:\uff1a][ \t]*(.+?)[ \t]*$",
                          re.IGNORECASE | re.MULTILINE)
_FINAL_IS = re.compile(r"final answer is[ \t:]*(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)


def final_answer(text: str) -> str | None:
    """The answer a completion (or a worked solution) ends on, after any reasoning: its last
    ``\\boxed{}``, else its last ``ANSWER: ...`` line (MATH-500's and HLE's prompts ask for one),
    else its last ``... final answer is ...`` (OlympiadBench's)."""
    text = text.split("</think>")[-1]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_ANSWER_LINE, _FINAL_IS):
        found = pattern.findall(text)
        if found:
            return found[-1].strip().rstrip(".").strip().strip("$").strip()
    return None


def _plain(answer: str) -> str:
    return re.sub(r"\s+", "", answer.strip().strip("$").rstrip(".")).lower()


class FinalAnswerMatch:
    """1.0 when the completion's final answer (``final_answer``) equals the gold's: the same text
    once spaces, ``$`` and case are set aside, or the same value by lighteval's math comparison
    (its LaTeX/expression extraction and sympy equivalence, precision 6: ``0.5`` = ``\\frac{1}{2}``,
    ``(3, \\frac{\\pi}{2})`` = ``\\left( 3, \\frac{\\pi}{2} \\right)``). The gold is the dataset's
    answer, or the final answer of its worked solution (MATH-500's)."""

    def __init__(self):
        from lighteval.metrics.dynamic_metrics import MultilingualExtractiveMatchMetric
        from lighteval.metrics.utils.extractive_match_utils import ExprExtractionConfig, LatexExtractionConfig
        from lighteval.utils.language import Language

        targets = [ExprExtractionConfig(), LatexExtractionConfig()]
        self.math = MultilingualExtractiveMatchMetric(language=Language.ENGLISH, gold_extraction_target=targets,
                                                      pred_extraction_target=targets, precision=6)

    def compute(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        pred = final_answer(model_response.text[0])
        if not pred:
            return 0.0
        gold = doc.get_golds()[0]
        gold = final_answer(gold) or gold.strip().strip("$")
        if _plain(pred) == _plain(gold):
            return 1.0
        boxed = Doc(query="", choices=[f"${gold}$"], gold_index=0)
        return float(self.math.compute(boxed, ModelResponse(text=[f"${pred}$"])))


class FullDocPassAtK(PassAtK):
    """lighteval's unbiased pass@k, scoring each sample against the whole doc: lighteval's own
    rebuilds a bare Doc for its scorer, dropping ``specific`` (where HumanEval+ keeps its tests)."""

    def compute(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        scored = copy.copy(doc)
        scored.choices = [self.preprocess(c) for c in doc.choices]
        return self.pass_at_k([self.compute_score(doc=scored, model_response=ModelResponse(text=[self.preprocess(p)]))
                               for p in model_response.final_text[: self.n]])


class ScoredOnce:
    """A per-sample scorer shared by a task's pass@k metrics and its detail rows, scoring each
    (question, sample) once: scoring can be costly (HumanEval+ runs the tests)."""

    def __init__(self, scorer):
        self.scorer, self.scores = scorer, {}

    def __deepcopy__(self, memo):  # lighteval's registry deep-copies task configs: keep one store
        return self

    def __call__(self, doc: Doc, model_response: ModelResponse, **kwargs) -> float:
        key = (doc.query, tuple(doc.choices), model_response.text[0])
        if key not in self.scores:
            self.scores[key] = self.scorer(doc=doc, model_response=model_response, **kwargs)
        return self.scores[key]


def pass_at_k_metrics(scorer, ks: list[int], n: int, normalize=None, strip_strings: bool = False
                      ) -> list[SampleLevelMetric]:
    """One ``pass@k`` metric per k over n samples, each sample scored by ``scorer(doc, response)``."""
    if max(ks) > n:
        raise ConfigError(f"pass@{max(ks)} needs samples >= {max(ks)}, got samples={n}")
    shared = ScoredOnce(scorer)
    return [SampleLevelMetric(metric_name=f"pass@{k}", higher_is_better=True, category=SamplingMethod.GENERATIVE,
                              sample_level_fn=FullDocPassAtK(k=k, n=n, normalize=normalize,
                                                             strip_strings=strip_strings,
                                                             sample_scoring_function=shared),
                              corpus_level_fn=np.mean)
            for k in ks]


def sample_correct(config: LightevalTaskConfig, doc: Doc, text: str) -> bool:
    """Whether one completion is correct by the task's own scorer (read from its pass@k metric's
    shared scores when that already scored it)."""
    fn = config.metrics[0].sample_level_fn
    one = FullDocPassAtK(k=1, n=1, normalize=fn.normalize, strip_strings=fn.strip_strings,
                         sample_scoring_function=fn.compute_score)
    return bool(one.compute(doc, ModelResponse(text=[text])) == 1.0)


# ----------------------------------------------------------------------------- local JSONL tasks
def jsonl_prompt(line: dict, task_name: str) -> Doc:
    """A chat record -> a Doc whose query is the user's turn; the full messages ride along so the
    model can apply its chat template to them."""
    record = normalise(line, "chat", task_name)
    prompt = [m for m in record["messages"] if m["role"] != "assistant"]
    gold = next(m["content"] for m in record["messages"] if m["role"] == "assistant")
    return Doc(query=prompt[-1]["content"], choices=[gold], gold_index=0, task_name=task_name,
               specific={"messages": prompt})


def task_config(spec: dict) -> LightevalTaskConfig:
    split = spec.get("split", "test")
    metrics = pass_at_k_metrics(AnswerMatch(spec.get("answer_style", "exact")), spec.get("ks", [1]),
                                spec.get("samples", 1))
    return LightevalTaskConfig(name=spec["name"], prompt_function=jsonl_prompt, hf_repo=spec["data_dir"],
                               hf_subset="default", metrics=metrics, hf_avail_splits=[split],
                               evaluation_splits=[split], few_shots_split=None,
                               generation_size=spec.get("max_new_tokens", 256), stop_sequence=[])


# ----------------------------------------------------------------------------- lighteval's definitions
def builtin_modules() -> list[str]:
    import lighteval.tasks.tasks as pkg

    root = Path(list(pkg.__path__)[0])  # a namespace package: no __init__.py
    return sorted([p.stem for p in root.glob("*.py") if not p.stem.startswith("_")]
                  + [d.name for d in root.iterdir() if (d / "main.py").is_file()])


def project_tasks() -> list[LightevalTaskConfig]:
    """The benchmarks lighteval does not define, as module ``melt``."""
    return [LightevalTaskConfig(name="humaneval_plus", prompt_function=humaneval_prompt,
                                hf_repo="evalplus/humanevalplus", hf_subset="default", hf_avail_splits=["test"],
                                evaluation_splits=["test"], generation_size=32_768, stop_sequence=[],
                                metrics=pass_at_k_metrics(PassesTests(), [1], 1))]


def find_builtin(ref: str, where: str) -> list[LightevalTaskConfig]:
    """lighteval's task definitions named by ``"<module>/<task pattern>"``; only that module is
    imported. Module ``melt`` holds ours (HumanEval+)."""
    module, _, pattern = ref.partition("/")
    available = ["melt", *builtin_modules()]
    if not pattern or module not in available:
        raise ConfigError(f"{where}: lighteval task {ref!r} not found; write '<module>/<task>' with a module "
                          f"from lighteval/tasks/tasks: {', '.join(available)}")
    if module in UNSAFE_MODULES:
        raise ConfigError(f"{where}: lighteval module {module!r} downloads or queries the hub when imported; "
                          "export the benchmark to JSONL and use a `path` task instead")
    if module == "melt":
        table = project_tasks()
    else:
        name = f"lighteval.tasks.tasks.{module}"
        try:
            table = importlib.import_module(name).TASKS_TABLE
        except ModuleNotFoundError:
            table = importlib.import_module(f"{name}.main").TASKS_TABLE
    found = [c for c in table if fnmatch.fnmatchcase(c.name, pattern)]
    if not found:
        names = ", ".join(sorted(c.name for c in table)[:12])
        raise ConfigError(f"{where}: lighteval module {module!r} has no task matching {pattern!r}; it defines: "
                          f"{names}{' ...' if len(table) > 12 else ''}")
    return sorted(found, key=lambda c: c.name)


def _scorer(config: LightevalTaskConfig, metric: str | None, where: str) -> SamplingMetric | object:
    """The per-sample scorer of a built-in task: its first generative metric, or ``metric`` by name."""
    def per_sample(m) -> bool:  # one score per generated sample (not a corpus-level or judge grouping)
        return type(m) is SampleLevelMetric and m.category == SamplingMethod.GENERATIVE

    if metric == "final_answer":
        return FinalAnswerMatch()
    if metric:
        if metric not in Metrics.__members__:
            raise ConfigError(f"{where}: unknown lighteval metric {metric!r}; see lighteval.metrics.metrics.Metrics")
        if not per_sample(Metrics[metric].value):
            raise ConfigError(f"{where}: lighteval metric {metric!r} does not score single generated samples; "
                              "pass@k needs one that does (e.g. exact_match, expr_gold_metric, pass_at_k_math)")
        candidates = [Metrics[metric].value]
    else:
        candidates = [m for m in config.metrics if per_sample(m)]
    if not candidates:
        raise ConfigError(f"{where}: lighteval task {config.name!r} has no per-sample generative metric "
                          "(it scores log-likelihoods or uses a judge); name one with `metric:`")
    return candidates[0].sample_level_fn


class RenamedColumns:
    """A prompt function reading a dataset whose fields are named differently."""

    def __init__(self, prompt_function, columns: dict[str, str]):
        self.prompt_function, self.columns = prompt_function, dict(columns)

    def __call__(self, line: dict, task_name: str | None = None):
        return self.prompt_function({**line, **{dst: line[src] for src, dst in self.columns.items()}}, task_name)


def answer_text(answer) -> str:
    """A dataset's answer as the text a scorer compares: hub datasets type answers as numbers
    (MathArena/aime_2026 int64, math-ai/amc23 float "27.0") or lists (OlympiadBench's
    ``final_answer``); an integral float is written as the integer, a list comma-joined."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, bool):
        return str(answer)
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    if isinstance(answer, (int, float)):
        return repr(answer)
    if isinstance(answer, (list, tuple)):
        return ", ".join(answer_text(a) for a in answer)
    raise DataError(f"an answer of type {type(answer).__name__} ({answer!r}) cannot be scored as text")


ID_FIELDS = ("Record ID", "id", "ID", "unique_id", "question_id")
QUESTION_FIELDS = ("Question", "question", "problem", "prompt", "query")


def row_seed(line: dict) -> int:
    """A seed that is a function of the question alone: its id where the row has one, else its
    question text (never the whole row, whose other fields and their rendering can differ between
    the unsharded task and a shard); a row with neither is refused."""
    basis = next((line[k] for k in ID_FIELDS if line.get(k) is not None), None)
    if basis is None:
        basis = next((line[k] for k in QUESTION_FIELDS if isinstance(line.get(k), str) and line[k].strip()), None)
    if basis is None:
        raise DataError(f"a benchmark row has no id ({', '.join(ID_FIELDS)}) and no question text "
                        f"({', '.join(QUESTION_FIELDS)}) to seed its option order from; its fields: "
                        f"{sorted(line)[:12]}. Add an id column to the data, or name the task's question field")
    return int.from_bytes(hashlib.sha256(str(basis).encode()).digest()[:8], "big")


class PurePrompt:
    """lighteval's prompt function made a pure function of the row: golds of any type become text
    (``answer_text``), and the module-level ``random`` it may draw from (GPQA's option order) is
    seeded by the question (``row_seed``), so a question reads the same in any shard and any job;
    the global random state is restored after."""

    def __init__(self, prompt_function):
        self.prompt_function = prompt_function

    def __call__(self, line: dict, task_name: str | None = None):
        state = random.getstate()
        random.seed(row_seed(line))
        try:
            doc = self.prompt_function(line, task_name)
        finally:
            random.setstate(state)
        if doc is not None:
            doc.choices = [answer_text(c) for c in doc.choices]
        return doc


class InShard:
    """A dataset filter keeping the rows of one shard (melt_core.serving.inference.in_shard), after ``inner``."""

    def __init__(self, shard: list[int], inner=None):
        self.shard, self.inner = shard, inner

    def __call__(self, row: dict) -> bool:
        return (self.inner is None or self.inner(row)) and in_shard(dict(row), self.shard)


class InIds:
    """A dataset filter keeping rows whose ``id_field`` is in a fixed set."""

    def __init__(self, id_field: str, ids: list[str]):
        self.id_field, self.ids = id_field, frozenset(ids)

    def __call__(self, row: dict) -> bool:
        return str(row[self.id_field]) in self.ids


def load_task_data(config: LightevalTaskConfig, split: str, where: str):
    """The split lighteval will read, loaded the way it loads it; a clear error when it can't be."""
    from datasets import load_dataset

    try:
        return load_dataset(path=config.hf_repo, name=config.hf_subset, revision=config.hf_revision)[split]
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds; all mean "not available"
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DataError(
            f"{where}: cannot load dataset {config.hf_repo!r} (subset {config.hf_subset!r}, split {split!r}): "
            f"{type(err).__name__}: {first[:300]}. "
            + ("This run is offline: fetch the benchmark data first where the hub is reachable "
               "(`snakemake benchmark_data --configfile <your config>`, which fills the Hugging Face cache), "
               "or point the task's `data_dir` at a local copy." if offline else
               "Check the repo name and access (gated datasets need `huggingface-cli login`).")) from None


def select_ids(config: LightevalTaskConfig, split: str, select: dict, where: str) -> list[str]:
    """A fixed subset: ``n`` ids drawn with ``seed`` from the rows the prompt function accepts
    (e.g. HLE's text-only questions), sorted first so the draw does not depend on row order."""
    rows = load_task_data(config, split, where)
    id_field = select.get("id_field", "id")
    if id_field not in rows.column_names:
        raise ConfigError(f"{where}: select.id_field {id_field!r} is not a column of {config.hf_repo!r}; "
                          f"columns: {rows.column_names}")
    ids = sorted(str(r[id_field]) for r in rows if config.prompt_function(r, config.name) is not None)
    if len(ids) < select["n"]:
        raise DataError(f"{where}: select.n={select['n']} but only {len(ids)} usable rows in {config.hf_repo!r}")
    return sorted(random.Random(select.get("seed", 0)).sample(ids, select["n"]))


def task_rows(config: LightevalTaskConfig) -> int:
    """How many rows of its split a task config will evaluate (after its filter)."""
    split = config.evaluation_splits[0]
    rows = load_task_data(config, split, f"task {config.name!r}")
    return len(rows.filter(config.hf_filter) if config.hf_filter is not None else rows)


def builtin_task_configs(spec: dict) -> list[LightevalTaskConfig]:
    """lighteval's definitions named by ``spec["lighteval"]`` with the paper's sampling applied,
    one config per matched task (subset), named ``<spec name>`` or ``<spec name>:<subset task>``.
    The data is loaded once here so a missing dataset fails before any model runs."""
    where = f"task {spec['name']!r}"
    found = find_builtin(spec["lighteval"], where)
    runs_code = any(c.name == "humaneval_plus" for c in found)
    if runs_code and not spec.get("allow_code_execution"):
        raise ConfigError(f"{where}: scoring HumanEval+ runs the model's code (in a bubblewrap sandbox: no "
                          "network, no host files, limits); opt in with `allow_code_execution: true`")
    if runs_code and not spec.get("unsafe_no_sandbox"):
        if not available():
            raise SandboxUnavailable(f"{where}: HumanEval+ runs the model's code, and bubblewrap (bwrap) is not "
                                     f"installed on this machine ({' or '.join(BWRAP_PATHS)}): install it "
                                     "(`apt-get install bubblewrap`; envs/setup.sh does as root), or set "
                                     "`unsafe_no_sandbox: true` to run it unisolated at your own risk")
        self_test()  # a sandbox that cannot start fails here, before any model runs, naming the cause
    configs = []
    for base in found:
        name = spec["name"] if len(found) == 1 else f"{spec['name']}:{base.name}"
        prompt_fn = PurePrompt(base.prompt_function)
        if spec.get("columns"):
            prompt_fn = RenamedColumns(prompt_fn, spec["columns"])
        repo, subset, revision = base.hf_repo, base.hf_subset, base.hf_revision
        if spec.get("hf_repo"):
            repo, subset, revision = spec["hf_repo"], spec.get("hf_subset", "default"), spec.get("hf_revision")
        if spec.get("data_dir"):
            root = Path(spec["data_dir"])
            if not root.is_dir():
                raise DataError(f"{where}: data_dir {root} does not exist")
            # a benchmark of several subsets (MMLU-Redux's subjects) keeps one folder per subset
            local = root / base.hf_subset if base.hf_subset and (root / base.hf_subset).is_dir() else root
            if len(found) > 1 and local == root:
                raise DataError(f"{where}: data_dir {root} has no folder for subset {base.hf_subset!r} of "
                                f"{spec['lighteval']!r}; a benchmark of several subsets keeps one folder per "
                                "subset (<data_dir>/<subset>/<split>.jsonl)")
            repo, subset, revision = str(local), "default", None
        split = spec.get("split") or base.evaluation_splits[0]
        fn = _scorer(base, spec.get("metric"), where)
        scoring = fn.compute_score if isinstance(fn, SamplingMetric) else fn.compute
        if base.name == "humaneval_plus":
            scoring = PassesTests(unsafe_no_sandbox=bool(spec.get("unsafe_no_sandbox")))
        metrics = pass_at_k_metrics(scoring, spec.get("ks", [1]), spec.get("samples", 1),
                                    normalize=getattr(fn, "normalize", None),
                                    strip_strings=getattr(fn, "strip_strings", False))
        config = LightevalTaskConfig(
            name=name, prompt_function=prompt_fn, hf_repo=repo, hf_subset=subset, hf_revision=revision,
            metrics=metrics, hf_avail_splits=[split], evaluation_splits=[split], few_shots_split=None,
            generation_size=spec.get("max_new_tokens", base.generation_size),
            stop_sequence=spec.get("stop", base.stop_sequence), version=base.version)
        if spec.get("select"):
            config.hf_filter = InIds(spec["select"].get("id_field", "id"),
                                     select_ids(config, split, spec["select"], where))
        else:
            load_task_data(config, split, where)
        if spec.get("shard"):
            config.hf_filter = InShard(spec["shard"], config.hf_filter)
        configs.append(config)
    return configs


def prefetch(specs: dict[str, dict]) -> dict[str, list[dict]]:
    """Load every lighteval task's dataset once (downloading it into the Hugging Face cache) and
    return what each task will read: repo, subset, revision, split, rows, datasets fingerprint."""
    manifest = {}
    for name, spec in specs.items():
        manifest[name] = []
        for config in builtin_task_configs({**spec, "name": name}):
            split = config.evaluation_splits[0]
            rows = load_task_data(config, split, f"task {name!r}")
            if config.hf_filter is not None:
                rows = rows.filter(config.hf_filter)
            manifest[name].append({"task": config.name, "repo": config.hf_repo, "subset": config.hf_subset,
                                   "revision": config.hf_revision, "split": split, "rows": len(rows),
                                   "fingerprint": rows._fingerprint})
    return manifest


def tasks_module(configs: list[LightevalTaskConfig]) -> types.ModuleType:
    """A custom-tasks module object for lighteval's Pipeline."""
    module = types.ModuleType("melt_lighteval_tasks", __doc__)
    module.TASKS_TABLE = list(configs)
    return module


# For the lighteval CLI (`lighteval custom ... --custom-tasks melt_core/evaluation/lighteval_tasks.py`).
TASKS_TABLE = [task_config(s) for s in json.loads(os.environ.get("MELT_LIGHTEVAL_TASKS", "[]"))]
