"""The workflow's vocabulary (workflow/scripts/pipeline.py) on the configs we ship, without Snakemake:
which runs train and which phases they share, where each phase starts, which checkpoint a model id
evaluates, the wildcards' patterns, and one clear error for a config the schema lets through.
(The whole DAG built from it is checked by the dry runs in tests/test_workflow.py.)"""

import copy
import re
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402
from pipeline import Pipeline, check_config, path_prefixes  # noqa: E402


def load(*files: str, **overrides) -> dict:
    """A config as the workflow sees it: the files merged in order, overrides on top, the schema's
    defaults filled in."""
    config: dict = {}
    for f in files:
        update_config(config, yaml.safe_load((ROOT / "config" / f).read_text()))
    update_config(config, overrides)
    config.pop("overlays", None)
    validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"), set_default=True)
    return config


@pytest.fixture(scope="module")
def default() -> Pipeline:
    return Pipeline(load("default.yaml"))


@pytest.fixture(scope="module")
def paper() -> Pipeline:
    return Pipeline(load("paper.yaml", outdir="results/paper-test"))


def test_runs_are_the_main_run_the_gates_and_the_recipes_each_once(default):
    c = default.config
    gates, recipes = c["ablations"]["gates"], c["ablations"]["recipes"]
    assert default.main_run == f"{c['main_run']['gate']}__{c['main_run']['recipe']}"
    assert default.gate_runs == [f"{g}__{c['ablations']['gate_recipe']}" for g in gates]
    assert default.recipe_runs == [f"elementwise__{r}" for r in recipes]
    assert sorted(default.runs) == sorted({default.main_run, *default.gate_runs, *default.recipe_runs})
    assert len(default.runs) == len(set(default.runs)) == 9  # elementwise__no_interp is in both tables


def test_recipes_with_a_common_prefix_share_its_phases_and_switches_make_their_own(default):
    full, no_align = default.recipe_path("full"), default.recipe_path("no_align")
    assert full == "phase1/phase2" and no_align == "phase1"
    assert default.run_dir("elementwise__no_align", 0) in default.run_phase_dirs("elementwise__full", 0)
    # kd_loops / chunk_size change what the same phase trains: each its own folder
    paths = {r: default.recipe_path(r) for r in ("no_interp", "no_allloop_kd", "no_chunking")}
    assert len(set(paths.values())) == 3
    assert paths["no_allloop_kd"] == "phase1_no_interp+kd_loops-final"
    assert default.last_phase(paths["no_chunking"]) == ("phase1_no_interp",
                                                         {"kd_loops": "final", "chunk_size": None})
    # every phase node trains once per seed: 9 nodes x 2 seeds, the phase jobs of the dry run
    nodes = default.phase_nodes()
    assert len(nodes) == len(set(nodes)) == 9
    assert len(default.phase_jobs()) == 9 * len(default.seeds)
    assert sum(s for *_, s in default.phase_jobs()) == 2 * (8 * 150 + 75)


def test_a_phase_starts_from_the_converted_model_or_the_phase_before_it(default):
    assert default.phase_start("scalar", "phase1", 1) == default.init_dir("scalar", 1)
    assert default.phase_start("elementwise", "phase1/phase2", 0) == \
        default.phase_dir("elementwise", "phase1", 0) + "/final"
    assert [p["name"] for p in default.path_phases("phase1/phase2")] == ["phase1", "phase2"]
    assert default.path_phases("phase1/phase2")[1]["align_beta"] == 0.1
    assert path_prefixes("a/b/c") == ["a", "a/b", "a/b/c"]


def test_each_seed_has_its_own_teacher_only_where_the_config_says_so(default):
    assert default.teacher_dir(0) != default.teacher_dir(1)
    base = default.config["source"]["pretrain"]["seed"]
    assert [default.teacher_pretrain(s)["seed"] for s in (0, 1)] == [base, base + 1]
    assert "per_seed" not in default.teacher_pretrain(0)
    one = Pipeline(load("default.yaml", source={"pretrain": {"per_seed": False}}))
    assert one.teacher_dir(0) == one.teacher_dir(1) and one.teacher_seeds == [None]
    assert one.teacher_pretrain(1)["seed"] == base
    assert len(one.teacher_models_all) == len(default.teacher_models_all) // 2


def test_every_model_evaluates_the_checkpoint_it_names(default):
    models = default.models
    assert len(models) == len(set(models))
    finals = {f"{default.run_dir(r, s)}/final" for r in default.runs for s in default.seeds}
    for model in models:
        m, ckpt = ModelId.parse(model), default.model_checkpoint(model)
        if m.family == "ouro":
            assert ckpt == default.teacher_dir(m.seed), model
        elif m.kind == "untrained":
            assert ckpt == default.init_dir("elementwise", m.seed), model
        else:
            assert ckpt in finals and f"/seed{m.seed}/{m.gate}/" in ckpt, model
    # an inference variant evaluates its run's own weights, under other settings
    variant = default.trained_model(default.main_run, 1, "window-34")
    assert variant in models
    assert default.model_checkpoint(variant) == default.model_checkpoint(default.trained_model(default.main_run, 1))
    assert default.model_window(variant) == 34
    chunked = default.trained_model(default.main_run, 0, "prefill-chunk16")
    assert default.model_prefill(chunked) == 16
    assert default.model_prefill(default.trained_model(default.main_run, 0)) is None  # exact


def test_the_paper_downloads_its_teacher_and_trains_on_the_mixture(paper, default):
    assert set(paper.downloads) == {"ouro", "dense-qwen3-1.7b"}
    assert paper.teacher_inputs() == {} and paper.train_records().endswith("sft_mixture.jsonl")
    assert paper.teacher_seeds == [None]
    assert default.downloads == {} and default.train_records() == default.teacher_inputs()["train"]
    assert "test_chain" in default.teacher_inputs()


def test_wildcards_match_exactly_the_names_the_config_defines(default):
    patterns = {k: re.compile(f"(?:{v})") for k, v in default.wildcard_constraints().items()}
    for name in default.models:
        assert patterns["model"].fullmatch(name), name
    assert patterns["seed"].fullmatch("1") and not patterns["seed"].fullmatch("10")
    assert not patterns["run"].fullmatch("elementwise__fullx")
    assert not patterns["dense"].fullmatch("")  # no dense baselines: the wildcard matches nothing
    for path in default.phase_paths:
        assert patterns["path"].fullmatch(path)


def test_outputs_follow_the_config(default):
    assert len(default.eval_outputs()) == len(default.models) * len(default.tasks)
    assert f"{default.out}/figures/accuracy_vs_length.png" in default.report_outputs()
    short = Pipeline(load("default.yaml", report={"long_column": None}))
    assert not any("accuracy_vs_length" in p for p in short.report_outputs())
    spec = default.eval_task_settings(default.tasks[0], ".shard-2-of-4")
    assert spec["shard"] == [2, 4] and "shards" not in spec and spec["path"].startswith(default.out)
    main = default.trained_model(default.main_run, 0)
    inputs = default.eval_inputs(main, default.trained_model(default.main_run, 0, "window-34"))
    assert inputs["model"].endswith("/final") and "model_1" not in inputs  # one checkpoint, named once
    spec = default.mlflow_spec("train", gate="scalar", seed=1)
    assert spec["tags"] == {"stage": "train", "config": "embedded", "gate": "scalar", "seed": "1"}


@pytest.mark.parametrize("change, message", [
    (lambda c: c["ablations"]["recipes"].append("nope"), "unknown recipe name(s) ['nope']"),
    (lambda c: c["phases"].update({"bad/name": c["phases"]["phase1"]}), "may hold only letters"),
    (lambda c: c["recipes"]["full"]["phases"].append("phase9"), "recipes.full uses undefined phase(s) ['phase9']"),
    (lambda c: c["eval"]["tasks"]["digit_sum"].update(ks=[1, 4], samples=2), "eval.tasks.digit_sum: ks [1, 4]"),
    (lambda c: c["eval"]["tasks"]["digit_sum"].update(path="/nonexistent/x.jsonl"), "does not exist"),
])
def test_a_config_the_schema_lets_through_gets_one_error_naming_the_key(default, change, message):
    config = copy.deepcopy(default.config)
    change(config)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_config(config)
    with pytest.raises(ValueError):
        Pipeline(config)
