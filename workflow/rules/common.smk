# Helpers shared by the rules: config validation, the list of runs and models, output paths.
import re
import sys
from pathlib import Path, PurePosixPath

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml", set_default=True)  # fills every default, once

# Every job's CPU arithmetic pinned (config cpu_numerics): set here, in the environment every job
# inherits, before any job imports torch (workflow/scripts/cpu_numerics.py).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
from cpu_numerics import pin  # noqa: E402
from model_id import ModelId, parse_run, run_id  # noqa: E402  the one grammar of model and run ids

from melt_core.serving.engine_choice import vllm_refusal  # noqa: E402  torch-free

pin(config.get("cpu_numerics"))

OUT = config["outdir"]
GATES = config["ablations"]["gates"]
RECIPES = list(config["recipes"])
SHARING = config["baselines"]["sharing"]
TASKS = list(config["eval"]["tasks"])
# benchmarks scored with lighteval's own task definitions: their data is fetched first
LIGHTEVAL_TASKS = {t: spec for t, spec in config["eval"]["tasks"].items() if "lighteval" in spec}
DENSE = config["dense_baselines"] or {}  # name -> {repo_id, revision, sha256}: e.g. Qwen3-1.7B
# checkpoints that the download rule fetches (the teacher unless pretrained here; the dense baselines)
DOWNLOADS = {f"dense-{d}": {"kind": "hub", **spec} for d, spec in DENSE.items()}
if config["source"]["kind"] != "pretrain":
    DOWNLOADS["ouro"] = config["source"]
SHAPES = config["profile"]["shapes"]
# Training seeds: each seed converts (the gates' random init) and trains every run again, and every
# such model is evaluated; tables report the mean over seeds with an interval over seeds and questions.
SEEDS = config["seeds"]
# source.pretrain.per_seed: each training seed pretrains its own teacher too (teacher seed =
# source.pretrain.seed + the training seed), so a seed is an independent rerun of everything trained
# and the tables' intervals cover how far a rerun moves a result; else one teacher for every seed
PER_SEED_TEACHER = config["source"]["kind"] == "pretrain" and config["source"]["pretrain"].get("per_seed", False)
TEACHER_SEEDS = SEEDS if PER_SEED_TEACHER else [None]


def _check_names():
    """Ablations must name things the config defines: one clear error before any job."""
    main = config["main_run"]
    bad = [r for r in config["ablations"]["recipes"] + [main["recipe"], config["ablations"]["gate_recipe"]]
           if r not in config["recipes"]]
    if bad:
        raise ValueError(f"config: unknown recipe name(s) {bad}; defined recipes are {RECIPES}")
    bad = [p for p in config["phases"] if not re.fullmatch(r"[A-Za-z0-9_]+", p)]
    if bad:
        raise ValueError(f"config: phase name(s) {bad} may hold only letters, digits and _ (they name folders)")
    for name, recipe in config["recipes"].items():
        missing = [p for p in recipe["phases"] if p not in config["phases"]]
        if missing:
            raise ValueError(f"config: recipes.{name} uses undefined phase(s) {missing}; "
                             f"defined phases are {list(config['phases'])}")


def _check_tasks():
    """Eval task settings that would otherwise fail inside an eval job, after other jobs ran."""
    problems = []
    for name, spec in config["eval"]["tasks"].items():
        samples, ks = spec["samples"], spec["ks"]
        if max(ks) > samples:
            problems.append(f"eval.tasks.{name}: ks {ks} asks pass@{max(ks)} from {samples} sample(s) per "
                            f"question; set samples >= {max(ks)} or drop the larger k")
        if spec["shards"] > 1 and spec.get("lighteval") and spec.get("limit"):
            problems.append(f"eval.tasks.{name}: shards with limit: lighteval applies the limit after the shard "
                            "filter, so the shards would not add up to the limited task; drop one of them")
        for key in ("path", "data_dir"):
            if spec.get(key) and not Path(spec[key]).exists():
                problems.append(f"eval.tasks.{name}.{key}: {spec[key]} does not exist (build or fetch it first)")
    if problems:
        raise ValueError("config: " + "\n".join(problems))


_check_names()
_check_tasks()


def training_runs():
    """Unique (gate, recipe) pairs: the main run, Table 3's gates and Table 4's recipes."""
    runs = {(config["main_run"]["gate"], config["main_run"]["recipe"])}
    runs |= {(g, config["ablations"]["gate_recipe"]) for g in GATES}
    runs |= {(config["main_run"]["gate"], r) for r in config["ablations"]["recipes"]}
    return sorted(runs)


RUNS = [run_id(g, r) for g, r in training_runs()]
MAIN_RUN = run_id(config["main_run"]["gate"], config["main_run"]["recipe"])
GATE_RUNS = [run_id(g, config["ablations"]["gate_recipe"]) for g in GATES]  # Table 3
RECIPE_RUNS = [run_id(config["main_run"]["gate"], r) for r in config["ablations"]["recipes"]]  # Table 4


def _segment(phase, recipe):
    """A phase as a node of a run's path: its name, plus the recipe's switches (kd_loops, chunk_size),
    which change what the phase trains, e.g. ``phase1_no_interp+kd_loops-final``."""
    switches = "".join(f"+{k}-{str(v).lower()}" for k, v in sorted(recipe.items()) if k != "phases")
    return f"{phase}{switches}"


def _segments():
    """Every path segment of the config's recipes -> (phase name, recipe switches)."""
    return {_segment(phase, recipe): (phase, {k: v for k, v in recipe.items() if k != "phases"})
            for recipe in config["recipes"].values() for phase in recipe["phases"]}


SEGMENTS = _segments()


def recipe_path(recipe):
    """A recipe as the path of phases its run trains, e.g. ``phase1/phase2``; recipes with a common
    prefix (full = phase1/phase2, no_align = phase1) share those phases' outputs."""
    spec = config["recipes"][recipe]
    return str(PurePosixPath(*(_segment(p, spec) for p in spec["phases"])))


def phase_dir(gate, path, seed):
    """Where the last phase of ``path`` (e.g. ``phase1/phase2``) trains for ``gate`` and ``seed``: its
    checkpoints, metrics and ``final/``. The one place the layout is spelled (the phase rule passes
    its wildcards, ``phase_dir("{gate}", "{path}", "{seed}")``)."""
    return f"{OUT}/runs/seed{seed}/{gate}/{path}"


def run_dir(run, seed):
    """The directory of a (gate, recipe) run ``gate__recipe`` trained with ``seed``: its last phase's."""
    gate, recipe = parse_run(run)
    return phase_dir(gate, recipe_path(recipe), seed)


def run_phase_dirs(run, seed):
    """The directories of a run's phases, in the order they train."""
    gate, recipe = parse_run(run)
    return [phase_dir(gate, p, seed) for p in path_prefixes(recipe_path(recipe))]


def trained_model(run, seed=None, variant=""):
    """The model id of a training run ``gate__recipe`` (of one seed, under an inference variant)."""
    return str(ModelId.trained(*parse_run(run), seed=seed, variant=variant))


def init_dir(gate, seed):
    """The converted (untrained) MELT checkpoint of one gate variant and seed."""
    return f"{OUT}/checkpoints/seed{seed}/melt-init-{gate}"


def path_prefixes(path):
    parts = PurePosixPath(path).parts
    return [str(PurePosixPath(*parts[:i])) for i in range(1, len(parts) + 1)]


def last_phase(path):
    """The segment of ``path`` a phase job trains, and its (phase name, switches)."""
    return SEGMENTS[PurePosixPath(path).name]


PHASE_PATHS = sorted({p for _, r in training_runs() for p in path_prefixes(recipe_path(r))})


def phase_start(gate, path, seed):
    """What a phase starts from: the converted model, or the previous phase's final checkpoint."""
    parent = PurePosixPath(path).parent
    return f"{phase_dir(gate, parent, seed)}/final" if parent.parts else init_dir(gate, seed)


def path_phases(path):
    """The phases along ``path`` with their settings, in order (the last is the one a job trains)."""
    return [{"name": SEGMENTS[s][0], **config["phases"][SEGMENTS[s][0]]} for s in PurePosixPath(path).parts]


def phase_steps():
    """Training steps the DAG runs: every phase node once (shared prefixes once), every seed."""
    nodes = {(g, p) for g, r in training_runs() for p in path_prefixes(recipe_path(r))}
    return len(SEEDS) * sum(config["phases"][last_phase(p)[0]]["steps"] for _, p in nodes)
def inference_variants():
    """The main run evaluated again, per seed, under other inference settings (each a model id's variant):
    eval.compare_prefill, the other prefill mode: chunks of the training chunk size where eval
    prefills exactly, else exact (@prefill-...); eval.compare_window, each sliding window W of v3
    (the last W tokens keep their per-loop K/V), applied at inference only (@window-W)."""
    variants = []
    if config["eval"]["compare_prefill"]:
        variants.append("prefill-" + ("exact" if config["eval"]["prefill_chunk"]
                                      else f"chunk{config['train']['chunk_size']}"))
    return variants + [f"window-{w}" for w in config["eval"]["compare_window"]]


def main_variants():
    return [trained_model(MAIN_RUN, s, v) for v in inference_variants() for s in SEEDS]


def seed_models(seed):
    """The model ids of one training seed (``seed`` may be the wildcard ``{seed}``): the converted
    model, every trained run, the main run's inference variants."""
    return ([str(ModelId.untrained(seed))] + [trained_model(r, seed) for r in RUNS]
            + [trained_model(MAIN_RUN, seed, v) for v in inference_variants()])


def model_prefill(model):
    """The prefill chunk a model id evaluates with (None: token by token, exact for MELT)."""
    mode = ModelId.parse(model).prefill
    return config["eval"]["prefill_chunk"] if mode is None else None if mode == "exact" else mode


def model_window(model):
    """The sliding window a model id evaluates with (None: the checkpoint's own)."""
    return ModelId.parse(model).window


def vllm_refusal_of(model):
    """Why vLLM cannot run a model id (None: it can), decided by melt_core.serving.engine_choice; a
    window kept in the checkpoint and a task's early exit are known in the eval job, which asks again."""
    return vllm_refusal(*ModelId.parse(model).cache, model_window(model))


def teacher_models(seed=None):
    """The teacher and its untrained sharing baselines: of one training seed's teacher (``seed`` may be
    the wildcard ``{seed}``) where each seed pretrains its own, else of the one teacher (None)."""
    return [str(ModelId.teacher(seed))] + [str(ModelId.sharing(s, seed)) for s in SHARING]


# model ids: the teacher and its sharing baselines once (or per seed); every MELT model once per seed
TEACHER_MODELS = [m for s in TEACHER_SEEDS for m in teacher_models(s)]
MODELS = (TEACHER_MODELS + [m for s in SEEDS for m in seed_models(s) if not ModelId.parse(m).variant]
          + main_variants() + [str(ModelId.dense(d)) for d in DENSE])


def _one_of(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    gate=_one_of(GATES),
    recipe=_one_of(RECIPES),
    run=_one_of(RUNS),
    path=_one_of(PHASE_PATHS),
    model=_one_of(MODELS),
    dense=_one_of(DENSE) if DENSE else "(?!)",
    task=_one_of(TASKS),
    shape=_one_of(SHAPES),
    seed=_one_of([str(s) for s in SEEDS]),


def teacher_dir(seed=None):
    """The teacher's checkpoint: training seed ``seed``'s own (source.pretrain.per_seed), else the one."""
    return f"{OUT}/checkpoints/seed{seed}/ouro" if PER_SEED_TEACHER else f"{OUT}/checkpoints/ouro"


def teacher_pretrain(seed=None):
    """The pretraining settings of a training seed's teacher (its seed offset by the training seed)."""
    spec = dict(config["source"].get("pretrain") or {})
    spec.pop("per_seed", None)
    if PER_SEED_TEACHER:
        spec["seed"] = spec["seed"] + int(seed)
    return spec


def model_checkpoint(model):
    """Checkpoint directory behind a model id of MODELS (a variant evaluates its model's checkpoint)."""
    m = ModelId.parse(model)
    if m.family == "ouro":
        return teacher_dir(m.seed)
    if m.kind == "dense":
        return f"{OUT}/checkpoints/{m.checkpoint_id}"
    if m.kind == "untrained":
        return init_dir(config["main_run"]["gate"], m.seed)
    return f"{run_dir(m.run, m.seed)}/final"


def eval_outputs():
    return expand(f"{OUT}/eval/{{model}}/{{task}}.json", model=MODELS, task=TASKS)


def profile_outputs():
    return expand(f"{OUT}/profile/memory/{{shape}}.json", shape=SHAPES) + [
        f"{OUT}/profile/speed.json", f"{OUT}/profile/sweeps.json", f"{OUT}/profile/train_throughput.json"]


TABLES = ["table1_main", "table2_memory", "table3_gates", "table4_recipe", "table5_sharing",
          "table10_speed", "table11_train_throughput", "table_early_exit"]
FIGURES = ["figure1_pareto", "training_curves", "gate_values", "ablation_accuracy", "memory_sweeps",
           "early_exit_tradeoff"] + (["accuracy_vs_length"] if config["report"]["long_column"] else [])


def report_outputs():
    return (expand(f"{OUT}/tables/{{t}}.{{ext}}", t=TABLES, ext=["md", "tex", "csv"])
            + expand(f"{OUT}/figures/{{f}}.png", f=FIGURES) + [f"{OUT}/claims.md", f"{OUT}/config.resolved.yaml"])


def mlflow_spec(stage, **tags):
    spec = dict(config["mlflow"])
    spec["experiment"] = spec.get("experiment") or f"melt-{config['name']}"
    spec["tags"] = {"stage": stage, "config": config["name"], **{k: str(v) for k, v in tags.items()}}
    return spec


def task_shards(task):
    return config["eval"]["tasks"][task]["shards"]


SHARDED_TASKS = [t for t in config["eval"]["tasks"] if task_shards(t) > 1]
# eval.group_tasks: a model's unsharded tasks in one job (rule eval_model)
GROUPED_TASKS = [t for t in TASKS if t not in SHARDED_TASKS] if config["eval"]["group_tasks"] else []
# eval.group_models (with group_tasks): every model of one training seed in one job (rule eval_seed),
# the teacher and its sharing baselines in another (rule eval_teacher)
GROUPED_MODELS = bool(GROUPED_TASKS) and config["eval"]["group_models"]


def eval_member(model):
    """What an eval job needs of one model id: its checkpoint, how it prefills, its window, and its
    MLflow tags (params: a change reruns the job)."""
    return {"checkpoint": model_checkpoint(model), "prefill_chunk": model_prefill(model),
            "window": model_window(model), "tags": {k: str(v) for k, v in model_tags(model).items()}}


def eval_params(tasks, models):
    """What an eval job reads (as params: a changed setting reruns it); ``tasks``: task name ->
    its settings; ``models``: wildcards -> the model ids it evaluates; one output JSON per (model,
    task) in that order."""
    return dict(
        tasks=tasks,
        models=lambda wc: {m: eval_member(m) for m in models(wc)},
        **{k: config["eval"][k] for k in ("backend", "engine", "vllm", "device", "dtype", "seed", "batch_size",
                                          "memory_budget_gb", "batching", "exit")},  # exit: a task's own goes over it
        template=config["train"]["template"],
    )


def eval_task_settings(task, shard=""):
    """A task's eval settings as the eval job reads them; a local JSONL task without a path reads
    the embedded task's split; ``shard`` ".shard-i-of-n" (or "") picks a shard of its questions."""
    spec = dict(config["eval"]["tasks"][task])
    spec.pop("shards", None)
    if shard:
        i, n = (int(x) for x in shard.removeprefix(".shard-").split("-of-"))
        spec["shard"] = [i, n]
    if "lighteval" not in spec:
        split = spec.pop("split", "test")
        spec.setdefault("path", f"{OUT}/data/{split}.jsonl")
    return spec


REPORT_SETTINGS = ("outdir", "name", "paper_version", "report", "main_run", "ablations", "baselines")


def report_settings():
    """The config the gather/table/figure/claims scripts read, passed as a rule param so a change
    to any of it reruns them (a script never reads snakemake.config: tests/test_rule_params.py)."""
    return {**{k: config[k] for k in REPORT_SETTINGS}, "seeds": SEEDS, "per_seed_teacher": PER_SEED_TEACHER,
            "speed_shape": config["profile"]["speed_shape"], "template": config["train"]["template"]}


def exit_models():
    """The early-exit sweep's model ids (rule early_exit); ``main`` is the main MELT run."""
    first = {"main": trained_model(MAIN_RUN, SEEDS[0]), "ouro": str(ModelId.teacher(TEACHER_SEEDS[0]))}
    return [first.get(m, m) for m in config["early_exit"]["models"]]


EXIT_MODELS = exit_models()


def model_tags(model):
    """MLflow tags of an eval run: the model, and for a trained MELT run its gate, recipe and the
    phase path whose training run made the checkpoint (the eval links to that run)."""
    m = ModelId.parse(model)
    tags = {"model": model, **({"variant": m.variant} if m.variant else {}),
            **({"seed": m.seed} if m.seed is not None else {})}
    if m.run in RUNS:
        tags |= {"gate": m.gate, "recipe": m.recipe, "trained_path": recipe_path(m.recipe)}
    return tags


def eval_inputs(*models):
    """The models' checkpoints (``model``, ``model_1``, ... in order, each once), the embedded task's
    data, and the fetched benchmark data."""
    checkpoints = list(dict.fromkeys(model_checkpoint(m) for m in models))
    inputs = {f"model_{i}" if i else "model": c for i, c in enumerate(checkpoints)}
    inputs |= {f"data_{k}": v for k, v in teacher_inputs().items() if k.startswith("test")}
    if LIGHTEVAL_TASKS:
        inputs["benchmarks"] = f"{OUT}/data/benchmarks.json"
    return inputs


def teacher_inputs():
    """The pretrained tiny teacher needs the task data (with the long-answer task's test split where
    source.task.chain asks for it); a download needs nothing."""
    if config["source"]["kind"] != "pretrain":
        return {}
    files = {"train": f"{OUT}/data/train.jsonl", "test": f"{OUT}/data/test.jsonl", "tokenizer": f"{OUT}/data/tokenizer"}
    if (config["source"].get("task") or {}).get("chain"):
        files["test_chain"] = f"{OUT}/data/test_chain.jsonl"
    return files


def train_records():
    """The JSONL training reads: the paper's mixture (rule train_data) or the embedded task's split."""
    return f"{OUT}/data/sft_mixture.jsonl" if "train_data" in config else teacher_inputs()["train"]


def init_tracking():
    """Create the MLflow store once, before jobs that log to it start in parallel."""
    if config["mlflow"]["enabled"]:
        from melt_core.tracking import ensure_store, mark_dead_runs

        ensure_store(config["mlflow"]["tracking_uri"], mlflow_spec("init")["experiment"])
        dead = mark_dead_runs(config["mlflow"]["tracking_uri"], mlflow_spec("init")["experiment"])
        if dead:
            print(f"MLflow: {len(dead)} run(s) left RUNNING by killed jobs marked KILLED")
        # one parent run per invocation: every rule's run of this invocation is its child (jobs find
        # its id in the environment, which local and sbatch jobs inherit)
        import os
        import time

        from melt_core.tracking import INVOCATION_ENV, config_hash, make_logger

        global INVOCATION
        targets = " ".join(sorted(getattr(getattr(workflow, "dag_settings", None), "targets", None) or ["all"]))[:200]
        INVOCATION = make_logger(mlflow_spec("invocation"), f"invocation {time.strftime('%Y-%m-%d %H:%M')} {targets}",
                                 {"rule": "invocation", "config_hash": config_hash(config)})
        if INVOCATION.run_id:
            os.environ[INVOCATION_ENV] = INVOCATION.run_id


INVOCATION = None


def finish_tracking(status):
    """Close the invocation's parent run (onsuccess / onerror)."""
    if INVOCATION is not None:
        INVOCATION.close(status)

