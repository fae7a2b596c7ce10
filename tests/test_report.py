"""The report says what the results say. Rules gather and table run here as Snakemake runs them (their
scripts, with the inputs, outputs and params Snakemake itself resolves for the embedded default) on
a results folder of the real formats: every eval file written by the evals' own writer, each model
and seed with scores of its own; the profiles and early-exit sweeps as the ninth main run wrote them
(tests/fixtures/report-inputs). Each table cell is then checked against the eval files it stands
for, recomputed here: a row that reads another model, a score left as a fraction, an interval
printed backwards or a speed ratio upside down fails."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from melt_core.evaluation.evaluate import TaskSpec, write_result
from melt_core.evaluation.metrics import pass_at_k
from melt_core.serving.inference import ModelSpec
from melt_core.tracking import NullLogger

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ROOT / "tests" / "fixtures" / "report-inputs"
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402

TABLES = ["table1_main", "table3_gates", "table4_recipe", "table5_sharing", "table10_speed", "table_early_exit"]

# Snakemake's own view of the report rules for the embedded default: inputs, outputs, params, log
_RULES = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, ResourceSettings
out = {}
with SnakemakeApi() as api:
    wf = api.workflow(snakefile=Path("Snakefile"), resource_settings=ResourceSettings(),
                      config_settings=ConfigSettings(configfiles=[]), workdir=Path("."))
    for r in wf._workflow.rules:
        if r.name in ("gather", "table"):
            files = lambda nl: {n: (str(v) if isinstance(v, str) else [str(x) for x in v])
                                for n, v in ((n, getattr(nl, n)) for n in nl._names)}
            out[r.name] = {"script": str(Path(r.snakefile).parent / r.script), "input": files(r.input),
                           "output": files(r.output), "log": [str(x) for x in r.log],
                           "params": {n: getattr(r.params, n) for n in r.params._names}}
print(json.dumps(out, default=lambda f: "<per job>"))  # mlflow: a function of the wildcards
"""

# Runs rule scripts in one process as Snakemake's script directive does: `snakemake` in their globals
_RUN = r"""
import json, re, sys, types
from pathlib import Path

class Files(list):  # a Snakemake Namedlist: positional, and named entries as attributes
    def __init__(self, named):
        super().__init__(x for v in named.values() for x in (v if isinstance(v, list) else [v]))
        for k, v in named.items():
            setattr(self, k, v)

class Wildcards(dict):
    __getattr__ = dict.__getitem__

for job in json.loads(sys.stdin.read()):
    sub = lambda p: re.sub(r"\{(\w+)(,[^}]*)?\}", lambda m: job["wildcards"][m.group(1)], p)
    named = lambda d: {k: (sub(v) if isinstance(v, str) else [sub(x) for x in v]) for k, v in d.items()}
    sm = types.SimpleNamespace(input=Files(named(job["input"])), output=Files(named(job["output"])),
                               params=types.SimpleNamespace(**job["params"]), log=[sub(x) for x in job["log"]],
                               threads=1, rule=job["rule"], config={}, wildcards=Wildcards(job["wildcards"]),
                               scriptdir=str(Path(job["script"]).parent))
    for path in [*sm.output, *sm.log]:  # Snakemake makes their folders before a job starts
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    exec(compile(Path(job["script"]).read_text(), job["script"], "exec"), {"snakemake": sm, "__name__": "__main__"})
"""


@pytest.fixture(scope="module")
def rules():
    r = subprocess.run([sys.executable, "-c", _RULES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rules = json.loads(r.stdout.strip().splitlines()[-1])
    for rule in rules.values():
        rule["script"] = str(ROOT / rule["script"])
        rule["params"]["mlflow"] = {"enabled": False}
    rules["table"]["input"]["paper"] = str(ROOT / rules["table"]["input"]["paper"])
    return rules


def write_evals(paths: list[str], settings: dict, root: Path) -> None:
    """Every eval file gather reads, through the evals' writer: per question a number of correct
    samples drawn for its (model, task), so every model and seed scores differently."""
    tasks = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())["eval"]["tasks"]
    for i, path in enumerate(sorted(paths)):
        model, task = path.split("/")[-2], Path(path).stem
        samples, ks = tasks[task]["samples"], tasks[task]["ks"]
        rng = np.random.default_rng(i)
        p = rng.uniform(0.02, 0.3) if samples > 1 else rng.uniform(0.1, 0.9)  # its skill (pass@10 not all 100)
        details = []
        for q in range(24):
            correct = [bool(x) for x in rng.random(samples) < p]
            gold = f"{q:03d}" * (1 + q % 5)
            completions = [gold if c else gold[:q % 4] + "x" for c in correct]
            details.append({"task": task, "prompt": f"question {q}", "gold": gold, "completions": completions,
                            "correct": correct, "generated_tokens": [len(c) for c in completions],
                            "loops": [4 * len(c) for c in completions],
                            "scores": {f"pass@{k}": pass_at_k(samples, sum(correct), k) for k in ks}})
        spec = TaskSpec(name=task, path=f"{settings['outdir']}/data/{task}.jsonl", samples=samples, ks=ks)
        write_result(root / path, ModelSpec(name=model, path=f"checkpoints/{model}"), spec, 0, details, 1.0,
                     NullLogger(), backend="native")


def early_exit_input(model: str) -> dict:
    """The early-exit sweep of ``model`` (``<id>-seed<s>``): seed 0's is the one a run of the rule
    wrote (fixtures/report-inputs/early_exit); seed s's is that one with the first 3s questions of
    every early-exit rule scored 0 (its every-loop rows as they were) and its speeds x (1 + s/10),
    so the seeds' sweeps differ and the tables must pool them."""
    m = ModelId.parse(model)
    sweep = json.loads((INPUTS / "early_exit" / f"{replace(m, seed=0)}.json").read_text())
    sweep["model"] = model
    for row in sweep["rows"]:
        row["model"] = model
        row["tokens_per_s"] *= 1 + m.seed / 10
        if row["label"] != "all loops":
            row["per_question"] = [0.0] * (3 * m.seed) + row["per_question"][3 * m.seed:]
            row["accuracy"] = sum(row["per_question"]) / len(row["per_question"])
    return sweep


def write_curves(runs: dict, root: Path) -> dict[tuple[str, int], list[dict]]:
    """Each phase job's metrics.jsonl (train.py's per-step lines); returns each run's expected curve."""
    expected = {}
    for where in runs.values():
        curve = expected[where["run"], where["seed"]] = []
        for j, phase_dir in enumerate(where["phases"]):
            lines = [{"step": 1 + j * 3 + s, "loss": 1.0 / (1 + s), "kd": 1.0 / (1 + s), "align": 0.1 * j,
                      "alpha": 1.0, "phase": Path(phase_dir).name, "grad_norm": 1.0, "tokens_per_s": 100.0}
                     for s in range(3)]
            (root / phase_dir).mkdir(parents=True, exist_ok=True)
            (root / phase_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            curve += lines
        (root / where["final"]).mkdir(parents=True, exist_ok=True)
    return expected


@pytest.fixture(scope="module")
def report(rules, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    gather = rules["gather"]
    settings = gather["params"]["settings"]
    write_evals(gather["input"]["evals"], settings, root)
    curves = write_curves(gather["params"]["runs"], root)
    for path in gather["input"]["profiles"]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes((INPUTS / Path(path).parent.name / Path(path).name).read_bytes())
    for path in gather["input"]["early_exit"]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps(early_exit_input(Path(path).stem)))
    jobs = [{"rule": "gather", "wildcards": {}, **gather}]
    jobs += [{"rule": "table", "wildcards": {"table": t}, **rules["table"]} for t in TABLES]
    # this tree's melt_core, not the installed one (tests/breaks.py runs the suite in a scratch copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _RUN], cwd=root, input=json.dumps(jobs), capture_output=True,
                       text=True, timeout=600, env=env)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted((root / settings["outdir"] / "logs").glob("*.log")))
    assert r.returncode == 0, r.stderr[-3000:] + logs
    return root / settings["outdir"], settings, curves, gather["input"]["early_exit"]


def truth(out: Path, model: str, column: str, settings: dict) -> float:
    """A column's score of a model (percent), from its eval files: the mean over its training seeds
    (``<model>-seed<n>``, a variant's ``<model>-seed<n>@<variant>``) of the mean over questions of
    each question's score; a model without seeds has one file."""
    task, metric = settings["report"]["columns"][column].split("/")
    base, _, variant = model.partition("@")
    files = [p for p in sorted(out.glob(f"eval/{base}-seed*/{task}.json"))
             if p.parent.name.partition("@")[2] == variant] or [out / "eval" / model / f"{task}.json"]
    per_file = [np.mean([d["scores"][metric] for d in json.loads(f.read_text())["details"]]) for f in files]
    return 100 * float(np.mean(per_file))


def cell(df: pd.DataFrame, key: str, row: str, column: str) -> tuple[float, float, float]:
    hit = df[df[key] == row]
    assert len(hit) == 1, f"{row!r}: {len(hit)} rows"
    r = hit.iloc[0]
    return r[column], r[f"{column} CI low"], r[f"{column} CI high"]


def check(got: tuple[float, float, float], want: float) -> None:
    mean, lo, hi = got
    assert mean == pytest.approx(want, abs=1e-9)
    assert lo < mean < hi  # scores vary over questions and seeds: a real interval around the mean


def table(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / "tables" / f"{name}.csv")


def test_gathered_scores_are_the_eval_files_in_percent(report):
    out, *_ = report
    evals = pd.read_csv(out / "summary" / "evals.csv")
    files = sorted(out.glob("eval/*/*.json"))
    assert len(evals) == sum(len(json.loads(f.read_text())["metrics"]) for f in files)
    for f in files:
        r = json.loads(f.read_text())
        for metric, value in r["metrics"].items():
            row = evals[(evals.model_id == r["model"]["name"]) & (evals.task == r["task"]["name"])
                        & (evals.metric == metric)]
            assert row.value.tolist() == [pytest.approx(100 * value)]


def test_training_curves_hold_every_phase_of_every_run(report):
    out, settings, curves, _ = report
    got = pd.read_csv(out / "summary" / "training_curves.csv")
    assert len(settings["seeds"]) > 1 and len(curves) == 9 * len(settings["seeds"])  # 9 runs a seed
    for (run, seed), lines in curves.items():
        rows = got[(got.run == run) & (got.seed == seed)]
        assert rows.step.tolist() == [x["step"] for x in lines] and rows.phase.tolist() == [x["phase"] for x in lines]


def test_main_table_reads_ouro_and_the_main_run(report):
    out, s, *_ = report
    main = f"melt-{s['main_run']['gate']}__{s['main_run']['recipe']}"
    df = table(out, "table1_main")
    for column in s["report"]["columns"]:
        check(cell(df, "benchmark", column, "Ouro ours"), truth(out, "ouro", column, s))
        check(cell(df, "benchmark", column, "MELT ours"), truth(out, main, column, s))


def test_gate_table_reads_each_gate_after_the_gate_recipe(report):
    out, s, *_ = report
    df = table(out, "table3_gates")
    columns = {c: f"{c} ours ({s['report']['columns'][c]})" for c in ("AIME24", "AIME25", "MATH-500")}
    for gate in s["ablations"]["gates"]:
        model = f"melt-{gate}__{s['ablations']['gate_recipe']}"
        for column, header in columns.items():
            check(cell(df, "gate", gate, header), truth(out, model, column, s))


def test_recipe_table_reads_each_recipe_and_the_untrained_conversion(report):
    out, s, *_ = report
    df = table(out, "table4_recipe")
    key = "recipe (cumulative removal)"
    rows = {r: f"melt-{s['main_run']['gate']}__{r}" for r in s["ablations"]["recipes"]}
    rows["untrained (conversion only)"] = "melt-untrained"
    for row, model in rows.items():
        for column in ("AIME24", "MATH-500"):
            check(cell(df, key, row, f"{column} ours ({s['report']['columns'][column]})"), truth(out, model, column, s))


def test_sharing_table_reads_each_cache_policy(report):
    out, s, *_ = report
    df = table(out, "table5_sharing")
    long = s["report"]["long_column"]
    main = f"melt-{s['main_run']['gate']}__{s['main_run']['recipe']}"
    rows = {"ouro (full per-loop cache)": "ouro", **{v: f"ouro-{v}" for v in s["baselines"]["sharing"]},
            "MELT main run": main}
    variants = sorted({p.parent.name.split("@")[1] for p in out.glob(f"eval/{main}-seed*@*/*.json")})
    assert variants  # the embedded default evaluates the main run with chunked prefill and a window
    rows |= {f"MELT main run {v}": f"{main}@{v}" for v in variants}
    for row, model in rows.items():
        for column, header in (("MATH-500", "MATH-500 ours"), ("AIME24", "AIME24 ours"),
                               (long, f"{long} ours ({s['report']['columns'][long]})")):
            check(cell(df, "variant", row, header), truth(out, model, column, s))


def test_markdown_prints_each_interval_low_then_high(report):
    out, *_ = report
    text = (out / "tables" / "table3_gates.md").read_text()
    cells = re.findall(r"(\d+\.\d) \[(\d+\.\d), (\d+\.\d)\]", text)
    assert len(cells) >= 15
    assert all(float(lo) <= float(mean) <= float(hi) for mean, lo, hi in cells)


def test_early_exit_table_pools_the_seeds_sweeps(report):
    """One row per model (across its seeds), exit gate and rule, in the rule's order: the seeds'
    mean accuracy inside its interval, their mean loops, tok/s and speed ratio, and how many seeds."""
    out, settings, _, sweeps = report
    got = table(out, "table_early_exit").to_dict("records")
    rows = [r for f in sweeps for r in json.loads((out.parent / f).read_text())["rows"]]
    seeds = {ModelId.parse(r["model"]).seed for r in rows}
    assert seeds == set(settings["seeds"]) and len(seeds) > 1 and len(got) == len(rows) / len(seeds)
    for row in got:
        want = [r for r in rows if str(ModelId.parse(r["model"]).across_seeds) == row["model"]
                and r["variant"] == row["exit gate"] and r["label"] == row["rule"]]
        every = {r["model"]: r for r in rows if r["variant"] == row["exit gate"] and r["label"] == "all loops"}
        assert row["seeds"] == len(want) == len(seeds)
        assert row["accuracy"] == pytest.approx(np.mean([w["accuracy"] for w in want]))
        assert row["loops per token"] == pytest.approx(np.mean([w["mean_loops"] for w in want]))
        assert row["tok/s"] == pytest.approx(np.mean([w["tokens_per_s"] for w in want]))
        assert row["speed ratio to all loops"] == pytest.approx(
            np.mean([w["tokens_per_s"] / every[w["model"]]["tokens_per_s"] for w in want]))
        lo, hi = map(float, row["95% CI"].split("–"))
        assert lo <= row["accuracy"] <= hi
    assert len({row["accuracy"] for row in got if row["rule"] != "all loops"}) > 1


def test_speed_table_ratios_are_each_model_over_ouro_at_the_same_context(report):
    out, *_ = report
    df = table(out, "table10_speed")
    speed = json.loads((out / "profile" / "speed.json").read_text())
    ouro = {r["context"]: r["decode_tok_s"] for r in speed if r["model"] == "ouro"}
    for r in speed:
        row = df[(df.model == r["model"]) & (df.context == r["context"]) & (df["shape"] == r["shape"])]
        assert row["decode ratio to Ouro (ours)"].tolist() == [pytest.approx(r["decode_tok_s"] / ouro[r["context"]])]
