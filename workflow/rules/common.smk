# Helpers shared by the rules: config validation, the list of runs and models, output paths.
import re

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

OUT = config["outdir"]
GATES = config["ablations"]["gates"]
RECIPES = list(config["recipes"])
SHARING = config["baselines"]["sharing"]
TASKS = list(config["eval"]["tasks"])
# benchmarks scored with lighteval's own task definitions: their data is fetched first
LIGHTEVAL_TASKS = {t: spec for t, spec in config["eval"]["tasks"].items() if "lighteval" in spec}
DENSE = config.get("dense_baselines") or {}  # name -> {repo_id, revision, sha256}: e.g. Qwen3-1.7B
SHAPES = config["profile"]["shapes"]


def _check_names():
    """Ablations must name things the config defines: one clear error before any job."""
    main = config["main_run"]
    bad = [r for r in config["ablations"]["recipes"] + [main["recipe"], config["ablations"]["gate_recipe"]]
           if r not in config["recipes"]]
    if bad:
        raise ValueError(f"config: unknown recipe name(s) {bad}; defined recipes are {RECIPES}")
    for name, recipe in config["recipes"].items():
        missing = [p for p in recipe["phases"] if p not in config["phases"]]
        if missing:
            raise ValueError(f"config: recipes.{name} uses undefined phase(s) {missing}; "
                             f"defined phases are {list(config['phases'])}")


_check_names()


def training_runs():
    """Unique (gate, recipe) pairs: the main run, Table 3's gates and Table 4's recipes."""
    runs = {(config["main_run"]["gate"], config["main_run"]["recipe"])}
    runs |= {(g, config["ablations"]["gate_recipe"]) for g in GATES}
    runs |= {(config["main_run"]["gate"], r) for r in config["ablations"]["recipes"]}
    return sorted(runs)


RUNS = [f"{g}__{r}" for g, r in training_runs()]
MODELS = (["ouro", "melt-untrained"] + [f"ouro-{s}" for s in SHARING] + [f"melt-{r}" for r in RUNS]
          + [f"dense-{d}" for d in DENSE])


def _one_of(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    gate=_one_of(GATES),
    recipe=_one_of(RECIPES),
    run=_one_of(RUNS),
    model=_one_of(MODELS),
    dense=_one_of(DENSE) if DENSE else "(?!)",
    task=_one_of(TASKS),
    shape=_one_of(SHAPES),


def teacher_dir():
    return f"{OUT}/checkpoints/ouro"


def model_checkpoint(model):
    """Checkpoint directory behind a model id of MODELS."""
    if model == "ouro" or model.startswith("ouro-"):
        return teacher_dir()
    if model.startswith("dense-"):
        return f"{OUT}/checkpoints/{model}"
    if model == "melt-untrained":
        return f"{OUT}/checkpoints/melt-init-{config['main_run']['gate']}"
    return f"{OUT}/runs/{model.removeprefix('melt-')}/final"


def eval_outputs():
    return expand(f"{OUT}/eval/{{model}}/{{task}}.json", model=MODELS, task=TASKS)


def profile_outputs():
    return expand(f"{OUT}/profile/memory/{{shape}}.json", shape=SHAPES) + [
        f"{OUT}/profile/speed.json", f"{OUT}/profile/sweeps.json", f"{OUT}/profile/train_throughput.json"]


TABLES = ["table1_main", "table2_memory", "table3_gates", "table4_recipe", "table5_sharing",
          "table10_speed", "table11_train_throughput"]
FIGURES = ["figure1_pareto", "training_curves", "gate_values", "memory_sweeps"]


def report_outputs():
    return (expand(f"{OUT}/tables/{{t}}.{{ext}}", t=TABLES, ext=["md", "tex", "csv"])
            + expand(f"{OUT}/figures/{{f}}.png", f=FIGURES) + [f"{OUT}/claims.md", f"{OUT}/config.resolved.yaml"])


def mlflow_spec(stage, **tags):
    spec = dict(config["mlflow"])
    spec["experiment"] = spec.get("experiment") or f"melt-{config['name']}"
    spec["tags"] = {"stage": stage, "config": config["name"], **{k: str(v) for k, v in tags.items()}}
    return spec


def eval_inputs(model):
    """A model's checkpoint, the embedded task's data, and the fetched benchmark data."""
    inputs = {"model": model_checkpoint(model)}
    if "test" in teacher_inputs():
        inputs["data"] = teacher_inputs()["test"]
    if LIGHTEVAL_TASKS:
        inputs["benchmarks"] = f"{OUT}/data/benchmarks.json"
    return inputs


def teacher_inputs():
    """The pretrained tiny teacher needs the task data; a download needs nothing."""
    if config["source"]["kind"] == "pretrain":
        return {"train": f"{OUT}/data/train.jsonl", "test": f"{OUT}/data/test.jsonl",
                "tokenizer": f"{OUT}/data/tokenizer"}
    return {}


def train_records():
    """The JSONL training reads: the paper's mixture (rule train_data) or the embedded task's split."""
    return f"{OUT}/data/sft_mixture.jsonl" if "train_data" in config else teacher_inputs()["train"]


def init_tracking():
    """Create the MLflow store once, before jobs that log to it start in parallel."""
    if config["mlflow"].get("enabled", True):
        from melt_core.tracking import ensure_store

        ensure_store(config["mlflow"].get("tracking_uri"), mlflow_spec("init")["experiment"])

