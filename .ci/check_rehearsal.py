"""After the rehearsal DAG (config/rehearsal.yaml) ran: check it is the paper's DAG and that it
produced what a paper run must produce. Exit 1 with every problem listed.

    python .ci/check_rehearsal.py CONFIGFILE...   (the --configfile list the rehearsal ran with)
"""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
problems = []


def plan(*configfiles: str) -> dict[str, int]:
    """Rule -> job count of the whole DAG for these config files (dry run, everything forced)."""
    r = subprocess.run([sys.executable, "-m", "snakemake", "all", "-n", "--forceall", "--quiet", "rules",
                        "--configfile", *configfiles], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if r.returncode:
        sys.exit(f"dry run failed for {configfiles}:\n{r.stdout}\n{r.stderr}")
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", r.stdout, re.M))
    return {k: int(v) for k, v in counts.items() if k != "total"}


files = sys.argv[1:]
layers = [yaml.safe_load((ROOT / f).read_text()) for f in files]
version = [c["paper_version"] for c in layers if "paper_version" in c][-1]
out = ROOT / [c["outdir"] for c in layers if "outdir" in c][-1].replace("{paper_version}", version)
cfg = yaml.safe_load((out / "config.resolved.yaml").read_text())  # what the rehearsal ran with
paper, rehearsal = plan("config/paper.yaml"), plan(*files)
# eval.group_tasks packs the tasks the rehearsal leaves unsharded into one job per model (rule
# eval_model, the same script), eval.group_models those of several models (rules eval_teacher and
# eval_seed); every other rule is the paper DAG's
packing = ({"eval_model"} if cfg["eval"].get("group_tasks") else set()) | (
    {"eval_teacher", "eval_seed"} if cfg["eval"].get("group_tasks") and cfg["eval"].get("group_models") else set())
if set(paper) != set(rehearsal) - packing:
    problems.append(f"rules differ from the paper DAG: {sorted(set(paper) ^ (set(rehearsal) - packing))}")
# the same jobs, except the profiled shapes and the eval shards (a job size) the rehearsal trims
for rule, n in paper.items():
    if rule not in ("profile_memory", "eval", "merge_eval") and rehearsal.get(rule) != n:
        problems.append(f"rule {rule}: {rehearsal.get(rule)} jobs in the rehearsal, {n} in the paper DAG")
# ... and every (model, task) result the paper DAG writes (it shards every task: one merge_eval each)
results = [p for p in (out / "eval").glob("*/*.json") if p.stem in cfg["eval"]["tasks"]]
if len(results) != paper["merge_eval"]:
    problems.append(f"{len(results)} (model, task) results under {out / 'eval'}, "
                    f"{paper['merge_eval']} in the paper DAG")
left = subprocess.run([sys.executable, "-m", "snakemake", "all", "-n", "--configfile", *files], cwd=ROOT,
                      capture_output=True, text=True, timeout=600)
if "Nothing to be done" not in left.stdout + left.stderr:
    problems.append("the rehearsal DAG left jobs undone:\n" + left.stdout[-2000:])

columns = list(cfg["report"]["columns"])
table = pd.read_csv(out / "tables" / "table1_main.csv").set_index("benchmark")
ours = [c for c in table.columns if c.endswith(" ours")]
for col in columns:  # one row per paper benchmark, every model's "ours" cell a number
    if col not in table.index:
        problems.append(f"table1_main.csv has no row for benchmark {col}")
    elif pd.to_numeric(table.loc[col, ours], errors="coerce").isna().any():
        problems.append(f"table1_main.csv: benchmark {col} lacks a number in {ours}")
for name in ["claims.md", *(f"figures/{f}.png" for f in ("figure1_pareto", "training_curves", "gate_values",
                                                         "memory_sweeps"))]:
    if not (out / name).is_file() or (out / name).stat().st_size == 0:
        problems.append(f"{out / name} missing or empty")

import mlflow  # noqa: E402

client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
exp = client.get_experiment_by_name(cfg["mlflow"]["experiment"])
runs = client.search_runs([exp.experiment_id], max_results=5000) if exp else []
logged = {r.data.tags.get("rule") for r in runs}
missing = sorted(r for r in rehearsal if r not in logged and r not in ("all",))
if missing:
    problems.append(f"MLflow holds no run for rule(s) {missing}")
last_run = {}
for r in sorted(runs, key=lambda r: r.info.start_time):  # a retried job: its last run counts
    last_run[r.info.run_name] = r
unfinished = sorted(name for name, r in last_run.items() if r.info.status != "FINISHED")
if unfinished:
    problems.append(f"MLflow runs whose last attempt did not finish: {unfinished[:5]}")

# Rules meant for the cluster ran as SLURM jobs: each one's MLflow run carries the SLURM job id it ran
# under (melt_core.tracking.make_logger). Local: the invocation's parent run, the rules declared
# `localrules:`, and rule phase, which only submits its training as a submitit job: the training run
# (a child of the phase rule's run) must carry an id.
local = {"all", "invocation", "phase"}
for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
    for block in re.findall(r"^localrules:\n((?:[ \t]+\w+,?\n)+)", smk.read_text(), re.M):
        local |= set(re.findall(r"\w+", block))
by_id = {r.info.run_id: r for r in runs}


def is_training(r) -> bool:
    parent = by_id.get(r.data.tags.get("mlflow.parentRunId", ""))
    return r.data.tags.get("stage") == "train" and parent is not None and parent.data.tags.get("rule") == "phase"


trained = [r for r in last_run.values() if is_training(r)]
for name, r in sorted(last_run.items()):
    rule, stage = r.data.tags.get("rule"), r.data.tags.get("stage")
    if (rule not in local or is_training(r)) and not r.data.tags.get("slurm_job_id"):
        problems.append(f"MLflow run {name!r} (rule {rule}, stage {stage}) ran outside SLURM: no slurm_job_id tag")
# Evals ran in the engine the config names (eval.engine): every eval run of a model vLLM can serve says
# vLLM; only what README lists as native (the untrained sharing caches, a sliding window at inference)
# may say native; and the teacher, a MELT run and the dense baseline each ran in vLLM at least once
engine = cfg["eval"].get("engine", "native")
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402

evals = [r for r in last_run.values() if r.data.tags.get("stage") == "eval" and r.data.tags.get("rule") != "merge_eval"]
served = set()
for r in evals:
    m = ModelId.parse(r.data.tags["model"])
    native_ok = m.kind == "sharing" or m.window is not None
    got = r.data.tags.get("engine")
    if got != engine and not (native_ok and got == "native"):
        problems.append(f"eval run {r.info.run_name!r} ran on engine {got!r}, not eval.engine {engine!r}")
    if got == "vllm":
        served.add(m.kind)
if engine == "vllm" and not {"teacher", "trained", "dense"} <= served:
    problems.append(f"vLLM served evals of {sorted(served)} only; the teacher, trained MELT and the dense "
                    "baseline must each have run in it")
# Training ran sharded over the ranks the launcher asks for, and changed the weights it trains
launcher = cfg["launcher"]
world = str(launcher["nodes"] * launcher["tasks_per_node"])
if not trained:
    problems.append("no training run in MLflow")
for r in trained:
    got = (r.data.params.get("world_size"), r.data.params.get("sharded"))
    if got != (world, cfg["train"]["sharding"]):
        problems.append(f"training run {r.info.run_name!r} ran with world size, sharding {got}, not "
                        f"({world}, {cfg['train']['sharding']})")
from safetensors.torch import load_file  # noqa: E402

finals = sorted(out.glob("runs/seed*/**/final"))
if len(finals) < len(trained):
    problems.append(f"{len(finals)} trained checkpoints under {out / 'runs'} for {len(trained)} training runs")
for final in finals:
    run_cfg = yaml.safe_load((final.parent / "train_config.json").read_text())
    start_dir = Path(run_cfg.get("init_from") or run_cfg["student"])
    start_dir = start_dir if (start_dir / "model.safetensors").is_file() else start_dir / "final"
    before, after = load_file(str(start_dir / "model.safetensors")), load_file(str(final / "model.safetensors"))
    if all(before[k].equal(after[k]) for k in after if k in before):
        problems.append(f"{final}: training left every weight where it started ({start_dir})")

print(f"rehearsal: {sum(rehearsal.values())} jobs over {len(rehearsal)} rules (paper DAG: {sum(paper.values())}); "
      f"{len(runs)} MLflow runs; table1 columns {columns}")
if problems:
    print("REHEARSAL CHECK FAILED:\n- " + "\n- ".join(problems))
    sys.exit(1)
print("rehearsal check passed")
