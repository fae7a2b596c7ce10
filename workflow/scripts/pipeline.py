"""The workflow's vocabulary, computed from a validated config: which runs train, which models are
evaluated, where every output lives, and the settings each rule passes on as params.

The rules (workflow/rules/*.smk) only name what this module computes; common.smk builds one
``Pipeline(config)`` after the schema has filled in every default and binds its names for the rules.
Plain Python, no Snakemake: tests/test_pipeline.py checks it on the configs we ship. It imports
model_id (the grammar of model and run ids) and the torch-free engine choice, nothing heavier.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path, PurePosixPath

from model_id import ModelId, parse_run, run_id

from melt_core.serving.engine_choice import vllm_refusal

TABLES = ["table1_main", "table2_memory", "table3_gates", "table4_recipe", "table5_sharing",
          "table10_speed", "table11_train_throughput", "table_early_exit"]
FIGURES = ["figure1_pareto", "training_curves", "gate_values", "ablation_accuracy", "memory_sweeps",
           "early_exit_tradeoff"]
LONG_FIGURES = ["accuracy_vs_length"]  # with report.long_column
# the config the gather/table/figure/claims scripts read (report_settings)
REPORT_SETTINGS = ("outdir", "name", "paper_version", "report", "main_run", "ablations", "baselines")


def check_config(config: dict) -> None:
    """What the schema cannot say: names that must exist, task settings that would fail inside an
    eval job after other jobs ran. One ValueError naming each key and how to fix it."""
    recipes = config["recipes"]
    main = config["main_run"]
    bad = [r for r in config["ablations"]["recipes"] + [main["recipe"], config["ablations"]["gate_recipe"]]
           if r not in recipes]
    if bad:
        raise ValueError(f"config: unknown recipe name(s) {bad}; defined recipes are {list(recipes)}")
    bad = [p for p in config["phases"] if not re.fullmatch(r"[A-Za-z0-9_]+", p)]
    if bad:
        raise ValueError(f"config: phase name(s) {bad} may hold only letters, digits and _ (they name folders)")
    for name, recipe in recipes.items():
        missing = [p for p in recipe["phases"] if p not in config["phases"]]
        if missing:
            raise ValueError(f"config: recipes.{name} uses undefined phase(s) {missing}; "
                             f"defined phases are {list(config['phases'])}")
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


def path_prefixes(path: str) -> list[str]:
    """``a/b/c`` -> ``[a, a/b, a/b/c]``: the phases a path trains, each as the path that ends in it."""
    parts = PurePosixPath(path).parts
    return [str(PurePosixPath(*parts[:i])) for i in range(1, len(parts) + 1)]


def segment(phase: str, recipe: dict) -> str:
    """A phase as a node of a run's path: its name, plus the recipe's switches (kd_loops, chunk_size),
    which change what the phase trains, e.g. ``phase1_no_interp+kd_loops-final``."""
    switches = "".join(f"+{k}-{str(v).lower()}" for k, v in sorted(recipe.items()) if k != "phases")
    return f"{phase}{switches}"


def one_of(names) -> str:
    """A wildcard constraint matching exactly these names."""
    return "|".join(re.escape(str(n)) for n in names)


class Pipeline:
    """Runs, models and paths of one config (already validated: every default filled in)."""

    def __init__(self, config: dict):
        check_config(config)
        self.config = config
        self.out = config["outdir"]
        self.gates = config["ablations"]["gates"]
        self.recipes = list(config["recipes"])
        self.sharing = config["baselines"]["sharing"]
        self.tasks = list(config["eval"]["tasks"])
        # benchmarks scored with lighteval's own task definitions: their data is fetched first
        self.lighteval_tasks = {t: s for t, s in config["eval"]["tasks"].items() if "lighteval" in s}
        self.dense = config["dense_baselines"] or {}  # name -> {repo_id, revision, sha256}
        # checkpoints the download rule fetches: the dense baselines, and the teacher unless pretrained here
        self.downloads = {f"dense-{d}": {"kind": "hub", **spec} for d, spec in self.dense.items()}
        if config["source"]["kind"] != "pretrain":
            self.downloads["ouro"] = config["source"]
        self.shapes = config["profile"]["shapes"]
        # Training seeds: each converts (the gates' random init), trains every run again and evaluates it.
        self.seeds = config["seeds"]
        # source.pretrain.per_seed: each training seed pretrains its own teacher too (teacher seed =
        # source.pretrain.seed + the training seed), so a seed reruns everything trained
        self.per_seed_teacher = (config["source"]["kind"] == "pretrain"
                                 and config["source"]["pretrain"].get("per_seed", False))
        self.teacher_seeds = self.seeds if self.per_seed_teacher else [None]

        main = config["main_run"]
        self.main_run = run_id(main["gate"], main["recipe"])
        self.runs = [run_id(g, r) for g, r in self.training_runs()]
        self.gate_runs = [run_id(g, config["ablations"]["gate_recipe"]) for g in self.gates]  # Table 3
        self.recipe_runs = [run_id(main["gate"], r) for r in config["ablations"]["recipes"]]  # Table 4
        self.segments = {segment(p, spec): (p, {k: v for k, v in spec.items() if k != "phases"})
                         for spec in config["recipes"].values() for p in spec["phases"]}
        self.phase_paths = sorted({p for _, p in self.phase_nodes()})

        # model ids: the teacher and its sharing baselines once (or per seed); every MELT model once per seed
        self.teacher_models_all = [m for s in self.teacher_seeds for m in self.teacher_models(s)]
        self.models = (self.teacher_models_all
                       + [m for s in self.seeds for m in self.seed_models(s) if not ModelId.parse(m).variant]
                       + self.main_variants() + [str(ModelId.dense(d)) for d in self.dense])
        # early exit: "main" and "ouro" name every seed's main run and teacher (early_exit.seeds: all),
        # or the first seed's (first); any other id is taken as it is
        exit_seeds = self.seeds if config["early_exit"].get("seeds", "all") == "all" else self.seeds[:1]
        exit_teachers = [s for s in self.teacher_seeds if s is None or s in exit_seeds]
        named = {"main": [self.trained_model(self.main_run, s) for s in exit_seeds],
                 "ouro": [str(ModelId.teacher(s)) for s in exit_teachers]}
        self.exit_models = [x for m in config["early_exit"]["models"] for x in named.get(m, [m])]

        ev = config["eval"]
        self.sharded_tasks = [t for t in ev["tasks"] if self.task_shards(t) > 1]
        # eval.group_tasks: a model's unsharded tasks in one job (rule eval_model)
        self.grouped_tasks = [t for t in self.tasks if t not in self.sharded_tasks] if ev["group_tasks"] else []
        # eval.group_models (with group_tasks): every model of one training seed in one job (rule eval_seed),
        # the teacher and its sharing baselines in another (rule eval_teacher)
        self.grouped_models = bool(self.grouped_tasks) and ev["group_models"]
        self.figures = FIGURES + (LONG_FIGURES if config["report"]["long_column"] else [])

    # --- runs and their phases -------------------------------------------------------------------

    def training_runs(self) -> list[tuple[str, str]]:
        """Unique (gate, recipe) pairs: the main run, Table 3's gates and Table 4's recipes."""
        c = self.config
        runs = {(c["main_run"]["gate"], c["main_run"]["recipe"])}
        runs |= {(g, c["ablations"]["gate_recipe"]) for g in c["ablations"]["gates"]}
        runs |= {(c["main_run"]["gate"], r) for r in c["ablations"]["recipes"]}
        return sorted(runs)

    def recipe_path(self, recipe: str) -> str:
        """A recipe as the path of phases its run trains, e.g. ``phase1/phase2``; recipes with a common
        prefix (full = phase1/phase2, no_align = phase1) share those phases' outputs."""
        spec = self.config["recipes"][recipe]
        return str(PurePosixPath(*(segment(p, spec) for p in spec["phases"])))

    def phase_nodes(self) -> list[tuple[str, str]]:
        """Every (gate, phase path) the DAG trains, once: runs that share a prefix share its phases."""
        return sorted({(g, p) for g, r in self.training_runs() for p in path_prefixes(self.recipe_path(r))})

    def phase_dir(self, gate, path, seed) -> str:
        """Where the last phase of ``path`` (e.g. ``phase1/phase2``) trains for ``gate`` and ``seed``: its
        checkpoints, metrics and ``final/``. The one place the layout is spelled (the phase rule passes
        its wildcards, ``phase_dir("{gate}", "{path}", "{seed}")``)."""
        return f"{self.out}/runs/seed{seed}/{gate}/{path}"

    def run_dir(self, run: str, seed) -> str:
        """The directory of a (gate, recipe) run ``gate__recipe`` trained with ``seed``: its last phase's."""
        gate, recipe = parse_run(run)
        return self.phase_dir(gate, self.recipe_path(recipe), seed)

    def run_phase_dirs(self, run: str, seed) -> list[str]:
        """The directories of a run's phases, in the order they train."""
        gate, recipe = parse_run(run)
        return [self.phase_dir(gate, p, seed) for p in path_prefixes(self.recipe_path(recipe))]

    def init_dir(self, gate, seed) -> str:
        """The converted (untrained) MELT checkpoint of one gate variant and seed."""
        return f"{self.out}/checkpoints/seed{seed}/melt-init-{gate}"

    def last_phase(self, path: str) -> tuple[str, dict]:
        """The segment of ``path`` a phase job trains, as (phase name, recipe switches)."""
        return self.segments[PurePosixPath(path).name]

    def phase_start(self, gate, path, seed) -> str:
        """What a phase starts from: the converted model, or the previous phase's final checkpoint."""
        parent = PurePosixPath(path).parent
        return f"{self.phase_dir(gate, parent, seed)}/final" if parent.parts else self.init_dir(gate, seed)

    def path_phases(self, path: str) -> list[dict]:
        """The phases along ``path`` with their settings, in order (the last is the one a job trains)."""
        names = [self.segments[s][0] for s in PurePosixPath(path).parts]
        return [{"name": n, **self.config["phases"][n]} for n in names]

    def phase_jobs(self) -> list[tuple[str, str, int]]:
        """(seed<s>/<gate>, phase path, steps) of every phase job, for the cost plan."""
        return [(f"seed{s}/{g}", p, self.config["phases"][self.last_phase(p)[0]]["steps"])
                for s in self.seeds for g, p in self.phase_nodes()]

    # --- model ids ---------------------------------------------------------------------------------

    def trained_model(self, run: str, seed=None, variant: str = "") -> str:
        """The model id of a training run ``gate__recipe`` (of one seed, under an inference variant)."""
        return str(ModelId.trained(*parse_run(run), seed=seed, variant=variant))

    def inference_variants(self) -> list[str]:
        """The main run evaluated again, per seed, under other inference settings (a model id's variant):
        eval.compare_prefill, the other prefill mode (chunks of the training chunk size where eval
        prefills exactly, else exact: @prefill-...); eval.compare_window, each sliding window W of v3
        applied at inference only (@window-W)."""
        ev = self.config["eval"]
        variants = []
        if ev["compare_prefill"]:
            variants.append("prefill-" + ("exact" if ev["prefill_chunk"]
                                          else f"chunk{self.config['train']['chunk_size']}"))
        return variants + [f"window-{w}" for w in ev["compare_window"]]

    def main_variants(self) -> list[str]:
        """The main run's model id under each inference variant, every seed."""
        return [self.trained_model(self.main_run, s, v) for v in self.inference_variants() for s in self.seeds]

    def seed_models(self, seed) -> list[str]:
        """The model ids of one training seed (``seed`` may be the wildcard ``{seed}``): the converted
        model, every trained run, the main run's inference variants."""
        return ([str(ModelId.untrained(seed))] + [self.trained_model(r, seed) for r in self.runs]
                + [self.trained_model(self.main_run, seed, v) for v in self.inference_variants()])

    def teacher_models(self, seed=None) -> list[str]:
        """The teacher and its untrained sharing baselines: of one training seed's teacher (``seed`` may be
        the wildcard ``{seed}``) where each seed pretrains its own, else of the one teacher (None)."""
        return [str(ModelId.teacher(seed))] + [str(ModelId.sharing(s, seed)) for s in self.sharing]

    def model_prefill(self, model: str):
        """The prefill chunk a model id evaluates with (None: token by token, exact for MELT)."""
        mode = ModelId.parse(model).prefill
        return self.config["eval"]["prefill_chunk"] if mode is None else None if mode == "exact" else mode

    @staticmethod
    def model_window(model: str):
        """The sliding window a model id evaluates with (None: the checkpoint's own)."""
        return ModelId.parse(model).window

    def vllm_refusal_of(self, model: str) -> str | None:
        """Why vLLM cannot run a model id (None: it can), decided by melt_core.serving.engine_choice; a
        window kept in the checkpoint and a task's early exit are known in the eval job, which asks again."""
        return vllm_refusal(*ModelId.parse(model).cache, self.model_window(model))

    def model_tags(self, model: str) -> dict:
        """MLflow tags of an eval run: the model, and for a trained MELT run its gate, recipe and the
        phase path whose training run made the checkpoint (the eval links to that run)."""
        m = ModelId.parse(model)
        tags = {"model": model, **({"variant": m.variant} if m.variant else {}),
                **({"seed": m.seed} if m.seed is not None else {})}
        if m.run in self.runs:
            tags |= {"gate": m.gate, "recipe": m.recipe, "trained_path": self.recipe_path(m.recipe)}
        return tags

    # --- checkpoints and data ------------------------------------------------------------------------

    def teacher_dir(self, seed=None) -> str:
        """The teacher's checkpoint: training seed ``seed``'s own (source.pretrain.per_seed), else the one."""
        if self.per_seed_teacher:
            return f"{self.out}/checkpoints/seed{seed}/ouro"
        return f"{self.out}/checkpoints/ouro"

    def teacher_pretrain(self, seed=None) -> dict:
        """The pretraining settings of a training seed's teacher (its seed offset by the training seed)."""
        spec = dict(self.config["source"].get("pretrain") or {})
        spec.pop("per_seed", None)
        if self.per_seed_teacher:
            spec["seed"] = spec["seed"] + int(seed)
        return spec

    def model_checkpoint(self, model: str) -> str:
        """Checkpoint directory behind a model id of ``models`` (a variant evaluates its model's checkpoint)."""
        m = ModelId.parse(model)
        if m.family == "ouro":
            return self.teacher_dir(m.seed)
        if m.kind == "dense":
            return f"{self.out}/checkpoints/{m.checkpoint_id}"
        if m.kind == "untrained":
            return self.init_dir(self.config["main_run"]["gate"], m.seed)
        return f"{self.run_dir(m.run, m.seed)}/final"

    def teacher_inputs(self) -> dict[str, str]:
        """The pretrained tiny teacher needs the task data (with the long-answer task's test split where
        source.task.chain asks for it); a download needs nothing."""
        source = self.config["source"]
        if source["kind"] != "pretrain":
            return {}
        files = {"train": f"{self.out}/data/train.jsonl", "test": f"{self.out}/data/test.jsonl",
                 "tokenizer": f"{self.out}/data/tokenizer"}
        if (source.get("task") or {}).get("chain"):
            files["test_chain"] = f"{self.out}/data/test_chain.jsonl"
        return files

    def train_records(self) -> str:
        """The JSONL training reads: the paper's mixture (rule train_data) or the embedded task's split."""
        return f"{self.out}/data/sft_mixture.jsonl" if "train_data" in self.config else self.teacher_inputs()["train"]

    # --- evaluation ---------------------------------------------------------------------------------

    def task_shards(self, task: str) -> int:
        """How many eval jobs split a task's questions."""
        return self.config["eval"]["tasks"][task]["shards"]

    def eval_member(self, model: str) -> dict:
        """What an eval job needs of one model id: its checkpoint, how it prefills, its window, and its
        MLflow tags (params: a change reruns the job)."""
        return {"checkpoint": self.model_checkpoint(model), "prefill_chunk": self.model_prefill(model),
                "window": self.model_window(model),
                "tags": {k: str(v) for k, v in self.model_tags(model).items()}}

    def eval_params(self, tasks: dict, models) -> dict:
        """What an eval job reads (as params: a changed setting reruns it); ``tasks``: task name ->
        its settings; ``models``: wildcards -> the model ids it evaluates; one output JSON per (model,
        task) in that order."""
        ev = self.config["eval"]
        return dict(
            tasks=tasks,
            models=lambda wc: {m: self.eval_member(m) for m in models(wc)},
            **{k: ev[k] for k in ("backend", "engine", "vllm", "device", "dtype", "seed", "batch_size",
                                  "memory_budget_gb", "batching", "exit")},  # exit: a task's own goes over it
            template=self.config["train"]["template"],
        )

    def eval_task_settings(self, task: str, shard: str = "") -> dict:
        """A task's eval settings as the eval job reads them; a local JSONL task without a path reads
        the embedded task's split; ``shard`` ".shard-i-of-n" (or "") picks a shard of its questions."""
        spec = dict(self.config["eval"]["tasks"][task])
        spec.pop("shards", None)
        if shard:
            i, n = (int(x) for x in shard.removeprefix(".shard-").split("-of-"))
            spec["shard"] = [i, n]
        if "lighteval" not in spec:
            split = spec.pop("split", "test")
            spec.setdefault("path", f"{self.out}/data/{split}.jsonl")
        return spec

    def eval_inputs(self, *models: str) -> dict[str, str]:
        """The models' checkpoints (``model``, ``model_1``, ... in order, each once), the embedded task's
        data, and the fetched benchmark data."""
        checkpoints = list(dict.fromkeys(self.model_checkpoint(m) for m in models))
        inputs = {f"model_{i}" if i else "model": c for i, c in enumerate(checkpoints)}
        inputs |= {f"data_{k}": v for k, v in self.teacher_inputs().items() if k.startswith("test")}
        if self.lighteval_tasks:
            inputs["benchmarks"] = f"{self.out}/data/benchmarks.json"
        return inputs

    # --- what the targets ask for -------------------------------------------------------------------

    def eval_outputs(self) -> list[str]:
        return [f"{self.out}/eval/{m}/{t}.json" for m, t in itertools.product(self.models, self.tasks)]

    def profile_outputs(self) -> list[str]:
        return [f"{self.out}/profile/memory/{s}.json" for s in self.shapes] + [
            f"{self.out}/profile/{name}.json" for name in ("speed", "sweeps", "train_throughput")]

    def report_outputs(self) -> list[str]:
        tables = [f"{self.out}/tables/{t}.{ext}" for t, ext in itertools.product(TABLES, ["md", "tex", "csv"])]
        figures = [f"{self.out}/figures/{f}.png" for f in self.figures]
        return tables + figures + [f"{self.out}/claims.md", f"{self.out}/config.resolved.yaml"]

    def report_settings(self) -> dict:
        """The config the gather/table/figure/claims scripts read, passed as a rule param so a change
        to any of it reruns them (a script never reads snakemake.config: tests/test_rule_params.py)."""
        c = self.config
        return {**{k: c[k] for k in REPORT_SETTINGS}, "seeds": self.seeds, "per_seed_teacher": self.per_seed_teacher,
                "speed_shape": c["profile"]["speed_shape"], "template": c["train"]["template"]}

    def mlflow_spec(self, stage: str, **tags) -> dict:
        """The MLflow settings of one rule's run, tagged with its stage and the config's name."""
        spec = dict(self.config["mlflow"])
        spec["experiment"] = spec.get("experiment") or f"melt-{self.config['name']}"
        spec["tags"] = {"stage": stage, "config": self.config["name"], **{k: str(v) for k, v in tags.items()}}
        return spec

    def wildcard_constraints(self) -> dict[str, str]:
        """Each wildcard matches exactly the names this config defines."""
        return {"gate": one_of(self.gates), "recipe": one_of(self.recipes), "run": one_of(self.runs),
                "path": one_of(self.phase_paths), "model": one_of(self.models),
                "dense": one_of(self.dense) if self.dense else "(?!)", "task": one_of(self.tasks),
                "shape": one_of(self.shapes), "seed": one_of(self.seeds)}


def open_invocation(pipeline: Pipeline, targets: list[str]):
    """Create the MLflow store once, before jobs that log to it start in parallel; mark runs left
    RUNNING by killed jobs; open one parent run for this invocation, whose id every job inherits
    through the environment (local and sbatch jobs alike), so each rule's run is its child.
    Returns the parent run's logger (None with MLflow off)."""
    import os
    import time

    from melt_core.tracking import INVOCATION_ENV, config_hash, ensure_store, make_logger, mark_dead_runs

    config = pipeline.config
    if not config["mlflow"]["enabled"]:
        return None
    uri, experiment = config["mlflow"]["tracking_uri"], pipeline.mlflow_spec("init")["experiment"]
    ensure_store(uri, experiment)
    dead = mark_dead_runs(uri, experiment)
    if dead:
        print(f"MLflow: {len(dead)} run(s) left RUNNING by killed jobs marked KILLED")
    names = " ".join(sorted(targets or ["all"]))[:200]
    logger = make_logger(pipeline.mlflow_spec("invocation"), f"invocation {time.strftime('%Y-%m-%d %H:%M')} {names}",
                         {"rule": "invocation", "config_hash": config_hash(config)})
    if logger.run_id:
        os.environ[INVOCATION_ENV] = logger.run_id
    return logger
