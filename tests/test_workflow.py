"""Protects the workflow's front door: the Snakefile lints clean, bad configs are refused with
one clear message before any job, the paper config plans through the SLURM profile, and a
stage run against a real MLflow server shows up there with its tags, params and metrics."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def smk(*args, env=None, cwd=ROOT, timeout=300):
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_lint_is_clean():
    r = smk("--lint", "--configfile", "config/smoke.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Lints for" not in r.stdout, r.stdout


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c["train"].update(lr_modle=1.0), "Additional properties are not allowed ('lr_modle' was unexpected)"),
    (lambda c: c["train"].update(chunk_size="big"), "'big' is not of type 'integer', 'null'"),
    (lambda c: c["ablations"].update(recipes=["full", "no_magic"]), "unknown recipe name(s) ['no_magic']"),
    (lambda c: c["ablations"].update(gates=["elementwise", "lstm"]), "'lstm' is not one of"),
    (lambda c: c["eval"]["tasks"].update(aime={"lighteval": "aime24"}), "'aime24' does not match"),
    (lambda c: c["eval"]["tasks"]["digit_sum_sampled"].update(ks=[1, 20]),
     "eval.tasks.digit_sum_sampled: ks [1, 20] asks pass@20 from 16 sample(s)"),
    (lambda c: c["eval"]["tasks"].update(extra={"path": "/nonexistent/test.jsonl"}),
     "eval.tasks.extra.path: /nonexistent/test.jsonl does not exist"),
])
def test_bad_config_fails_before_any_job(tmp_path, mutate, message):
    cfg = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    mutate(cfg)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    r = smk("-n", "--configfile", str(bad), "--directory", str(ROOT))
    assert r.returncode != 0
    assert message in r.stdout + r.stderr, r.stdout + r.stderr


def test_paper_config_plans_through_the_slurm_profile():
    r = smk("--profile", "profiles/slurm", "-n", "all", "--quiet", "rules")
    assert r.returncode == 0, r.stdout + r.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", r.stdout, re.M))
    # the stages as rules: download -> convert -> phase (one job per phase) -> eval
    assert {"download", "convert", "phase", "eval", "benchmark_data", "train_data"} <= set(counts)
    assert "pretrain_teacher" not in counts and "task_data" not in counts
    assert counts["download"] == "2"  # the Ouro teacher and the dense Qwen3 baseline
    r = smk("--profile", "profiles/slurm", "-n", "results/paper/eval/dense-qwen3-1.7b/aime24.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rule download:" in r.stdout and "rule benchmark_data:" in r.stdout


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_stage_logs_to_a_real_mlflow_server(tmp_path):
    port = _free_port()
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    server = subprocess.Popen([mlflow, "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
                               "--default-artifact-root", str(tmp_path / "artifacts"), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job workers
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        out = tmp_path / "out"
        r = smk(f"{out}/data/train.jsonl", "--profile", "profiles/local", "--configfile", "config/smoke.yaml",
                "--config", f"outdir={out}", env={"MLFLOW_TRACKING_URI": uri})
        assert r.returncode == 0, r.stdout + r.stderr
        exp = _post(f"{uri}/api/2.0/mlflow/experiments/search",
                    {"max_results": 10, "filter": "name = 'melt-smoke'"})["experiments"][0]
        runs = _post(f"{uri}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        run = next(r for r in runs if {"key": "stage", "value": "data"} in r["data"]["tags"])
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        assert tags["rule"] == "task_data" and len(tags["config_hash"]) == 12 and tags["git_commit"]
        # MLflow's own columns filled, and a short name (a rule without wildcards: just its name)
        assert tags["mlflow.source.git.commit"] == tags["git_commit"] and tags["mlflow.user"]
        assert tags["mlflow.source.name"] == "Snakefile rule task_data" and run["info"]["run_name"] == "task_data"
        assert params["task"] == "digit_sum" and params["digits"] == "6"
        assert run["info"]["status"] == "FINISHED"
        listed = urllib.request.urlopen(f"{uri}/api/2.0/mlflow/artifacts/list?run_id={run['info']['run_id']}"
                                        "&path=logs", timeout=30)
        assert [f["path"] for f in json.loads(listed.read())["files"]] == ["logs/task_data.log"]  # its log attached
        # every rule's run is a child of one run per workflow invocation, closed when it ends
        parent = next(r for r in runs if r["info"]["run_id"] == tags["mlflow.parentRunId"])
        assert parent["info"]["run_name"].startswith("invocation ") and parent["info"]["status"] == "FINISHED"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve(tmp_path, *configfiles):
    """The config Snakemake resolves for these --configfile arguments (rule resolved_config)."""
    out = tmp_path / "out"
    tmp_path.mkdir(parents=True, exist_ok=True)
    local = tmp_path / "local.yaml"  # where this test writes, and no tracking store
    local.write_text(yaml.safe_dump({"outdir": str(out), "mlflow": {"enabled": False}}))
    r = smk(f"{out}/config.resolved.yaml", "--cores", "1", "--configfile", *configfiles, str(local))
    assert r.returncode == 0, r.stdout + r.stderr
    return yaml.safe_load((out / "config.resolved.yaml").read_text())


PAPER_BENCHMARKS = {"aime24", "aime25", "aime26", "amc23", "math500", "olympiadbench", "gpqa", "hle",
                    "mmlu_redux", "humaneval"}


@pytest.mark.parametrize("files", [["config/paper.yaml"], ["config/paper.yaml", "config/paper_v3.yaml"],
                                   ["config/paper_v3.yaml"]])
def test_paper_config_is_exactly_its_files(tmp_path, files):
    """Nothing of the embedded default merges under the paper config: the resolved config is the
    paper files merged (the v3 overlay pulls in paper.yaml itself when given alone), with the
    schema's defaults filled in where they leave a setting out."""
    from snakemake.utils import validate

    got = _resolve(tmp_path, *files)
    layers = [yaml.safe_load((ROOT / f).read_text()) for f in ["config/paper.yaml", *files[1:]]]
    if files == ["config/paper_v3.yaml"]:
        layers.append(yaml.safe_load((ROOT / files[0]).read_text()))
    want = {}
    for layer in layers:
        want = _merge(want, layer)
    want.pop("overlays", None)
    want["outdir"], want["mlflow"] = got["outdir"], {**want["mlflow"], "enabled": False}
    validate(want, str(ROOT / "workflow/schemas/config.schema.yaml"), set_default=True)
    assert got == want
    assert set(got["eval"]["tasks"]) == PAPER_BENCHMARKS
    assert got["source"]["kind"] == "hub" and got["source"]["repo_id"] == "ByteDance/Ouro-1.4B-Thinking"
    assert "pretrain" not in got["source"] and "task" not in got["source"]


def test_the_default_applies_only_without_configfiles(tmp_path):
    got = _resolve(tmp_path, "config/smoke.yaml")  # an overlay of the default: pulls it in
    assert got["name"] == "smoke" and got["source"]["kind"] == "pretrain" and "recipes" in got
    r = smk("-n", "--configfile", "config/paper.yaml", "--config", "outdir=/nonexistent/x", "--quiet", "rules")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "task_data" not in r.stdout  # the embedded task's data rule is not in the paper plan


def test_the_three_seed_overlay_is_the_default_with_a_third_seed(tmp_path):
    """config/three_seeds.yaml changes the seed list and nothing else: seeds 0 and 1 keep their
    outputs (and their bits) when a user adds seed 2 after the default's run."""
    three = _resolve(tmp_path / "three", "config/three_seeds.yaml")
    default = _resolve(tmp_path / "default", "config/default.yaml")
    assert three["seeds"] == [0, 1, 2] and default["seeds"] == [0, 1]
    apart = ("seeds", "outdir")  # outdir: each resolution's own
    assert {k: v for k, v in three.items() if k not in apart} == {k: v for k, v in default.items() if k not in apart}


def test_the_evidence_overlay_is_the_default_with_six_seeds_and_the_permutation_test(tmp_path):
    """config/evidence.yaml changes the seed list and how separately trained arms are compared, and
    nothing that trains: seeds 0 and 1 keep the default's outputs."""
    evidence = _resolve(tmp_path / "evidence", "config/evidence.yaml")
    default = _resolve(tmp_path / "default", "config/default.yaml")
    assert evidence["seeds"] == list(range(6)) and evidence["report"]["separate_test"] == "permutation"
    assert default["report"]["separate_test"] == "interval"
    apart = ("seeds", "outdir", "report")
    assert {k: v for k, v in evidence.items() if k not in apart} == {k: v for k, v in default.items() if k not in apart}
    assert {k: v for k, v in evidence["report"].items() if k != "separate_test"} == \
        {k: v for k, v in default["report"].items() if k != "separate_test"}


def _planned_jobs(r):
    """(rule, wildcards) of every job in a dry run's plan."""
    jobs, rule = [], None
    for line in r.stdout.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            rule = m.group(1)
        m = re.match(r"^\s+wildcards: (.*)$", line)
        if m and rule:
            jobs.append((rule, m.group(1)))
            rule = None
    return jobs


def test_phases_are_rules_and_a_changed_phase_reruns_only_itself(tmp_path):
    """Phase 1 and Phase 2 are separate jobs; the no_align run is Phase 1 of the full run (trained
    once); changing Phase 2's beta replans only Phase 2, changing Phase 1 replans both."""
    cfg = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    cfg.update(outdir=str(tmp_path / "out"), mlflow={"enabled": False}, overlays=str(ROOT / "config/default.yaml"))
    cfg["phases"] = {k: dict(v, steps=1) for k, v in cfg["phases"].items()}
    cfg["source"]["pretrain"].update(steps=2, warmup_steps=1)
    cfg["source"]["task"].update(n_train=64)
    files = []
    for name, over in (("base", {}), ("beta", {"phase2": {"align_beta": 0.3}}),
                       ("alpha", {"phase1": {"alpha_end": 0.5}})):
        c = yaml.safe_load(yaml.safe_dump(cfg))
        for phase, settings in over.items():
            c["phases"][phase].update(settings)
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump(c))
    full, no_align = (str(tmp_path / "out/runs/seed0/elementwise/phase1/phase2/final"),
                      str(tmp_path / "out/runs/seed0/elementwise/phase1/final"))
    plan = smk("-n", full, no_align, "--configfile", str(files[0]))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    phases = [w for rule, w in _planned_jobs(plan) if rule == "phase"]
    assert sorted(phases) == ["seed=0, gate=elementwise, path=phase1", "seed=0, gate=elementwise, path=phase1/phase2"]
    r = smk(full, no_align, "--cores", "2", "--configfile", str(files[0]), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    beta = _planned_jobs(smk("-n", full, no_align, "--configfile", str(files[1])))
    assert beta == [("phase", "seed=0, gate=elementwise, path=phase1/phase2")]
    alpha = _planned_jobs(smk("-n", full, no_align, "--configfile", str(files[2])))
    assert sorted(w for _, w in alpha) == ["seed=0, gate=elementwise, path=phase1",
                                           "seed=0, gate=elementwise, path=phase1/phase2"]


@pytest.mark.parametrize("configfile,before,after", [("config/default.yaml", 1425, 1275),
                                                      ("config/paper.yaml", 4800, 4300)])
def test_shared_phases_train_once(configfile, before, after):
    """Steps the DAG trains per training seed: per (gate, recipe) run before phases were rules, per
    phase node now; every seed trains them all."""
    cfg = yaml.safe_load((ROOT / configfile).read_text())
    runs = {(cfg["main_run"]["gate"], cfg["main_run"]["recipe"])}
    runs |= {(g, cfg["ablations"]["gate_recipe"]) for g in cfg["ablations"]["gates"]}
    runs |= {(cfg["main_run"]["gate"], r) for r in cfg["ablations"]["recipes"]}
    steps = lambda recipe: [cfg["phases"][p]["steps"] for p in cfg["recipes"][recipe]["phases"]]  # noqa: E731
    assert sum(sum(steps(r)) for _, r in runs) == before
    plan = smk("-n", "all", "--configfile", configfile, "--config", "outdir=/nonexistent/plan")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    trained = 0
    for rule, wildcards in _planned_jobs(plan):
        if rule == "phase":
            path = wildcards.split("path=")[1]
            trained += cfg["phases"][path.split("/")[-1].split("+")[0]]["steps"]
    assert trained == after * len(cfg["seeds"])


def _planned_blocks(r):
    """Every job of a dry run's plan as {rule, input, output, wildcards} (the plan's own lines)."""
    jobs = []
    for line in r.stdout.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            jobs.append({"rule": m.group(1)})
        m = re.match(r"^\s+(input|output|wildcards): (.*)$", line)
        if m and jobs:
            jobs[-1][m.group(1)] = m.group(2)
    return jobs


def test_each_seed_reruns_everything_trained_from_its_own_teacher(tmp_path):
    """source.pretrain.per_seed (the embedded default): one teacher per training seed, and everything
    of seed s (conversions, every phase, its eval job with the teacher and sharing baselines) reads seed
    s's teacher and no other, so a seed is an independent rerun; the sharing baselines alone train no
    student; without it, one teacher for all."""
    plan = smk("-n", "all", "--configfile", "config/default.yaml", "--config", "outdir=/nonexistent/plan")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    jobs = _planned_blocks(plan)
    seeds = yaml.safe_load((ROOT / "config/default.yaml").read_text())["seeds"]
    teachers = {j["wildcards"]: j["output"] for j in jobs if j["rule"] == "pretrain_teacher"}
    assert teachers == {f"seed={s}": f"/nonexistent/plan/checkpoints/seed{s}/ouro" for s in seeds}
    checked = 0
    for job in jobs:
        seed = re.search(r"\bseed=(\d+)", job.get("wildcards", ""))
        if job["rule"] not in ("convert", "phase", "eval_teacher") or not seed:
            continue
        read = set(re.findall(r"checkpoints/seed(\d+)/ouro", job["input"]))
        assert read == {seed.group(1)}, job
        if job["rule"] == "eval_teacher":
            assert f"eval/ouro-seed{seed.group(1)}/" in job["output"] and "eval/ouro/" not in job["output"]
            assert f"eval/ouro-first-loop-seed{seed.group(1)}/" in job["output"]
        checked += 1
    assert checked >= len(seeds) * 3
    assert sorted(j["wildcards"] for j in jobs if j["rule"] == "eval_teacher") == [f"seed={s}" for s in seeds]
    alone = smk("-n", "sharing_baselines", "--configfile", "config/default.yaml",
                "--config", "outdir=/nonexistent/plan")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert {j["rule"] for j in _planned_blocks(alone)} == {"task_data", "pretrain_teacher", "eval_teacher",
                                                           "sharing_baselines"}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({"overlays": str(ROOT / "config/default.yaml"),
                                                       "source": {"pretrain": {"per_seed": False}}}))
    one = smk("-n", "all", "--configfile", str(tmp_path / "one.yaml"), "--config", "outdir=/nonexistent/plan")
    assert one.returncode == 0, one.stdout + one.stderr
    single = [j for j in _planned_blocks(one) if j["rule"] == "pretrain_teacher"]
    assert [j["output"] for j in single] == ["/nonexistent/plan/checkpoints/ouro"]
    assert any(j["rule"] == "eval_teacher" for j in _planned_blocks(one))


def test_a_sharded_task_runs_as_shard_jobs_merged_into_the_unsharded_result(tmp_path):
    """eval.tasks.<t>.shards: n splits a task over n eval jobs and rule merge_eval joins them; the
    result equals the same task run in one job (same questions, completions and pass@k). The
    unsharded task runs in the model's grouped job (eval.group_tasks, rule eval_model), so this
    also holds a grouped job's results to a per-task job's."""
    cfg = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())
    cfg.update(outdir=str(tmp_path / "out"), mlflow={"enabled": False}, overlays=str(ROOT / "config/default.yaml"))
    cfg["source"]["pretrain"].update(steps=2, warmup_steps=1, exit_gate_steps=0)
    cfg["source"]["task"].update(n_train=64)
    task = dict(cfg["eval"]["tasks"]["digit_sum_sampled"], limit=8)
    cfg["eval"]["tasks"] = {"whole": task, "split": dict(task, shards=3)}
    cfg["eval"]["group_models"] = False  # a model's own grouped job (rule eval_model), not its seed's
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    teacher = "ouro-seed0"  # seed 0's own teacher (source.pretrain.per_seed)
    targets = [str(tmp_path / f"out/eval/{teacher}/{t}.json") for t in ("whole", "split")]
    plan = _planned_jobs(smk("-n", *targets, "--configfile", str(tmp_path / "c.yaml")))
    evals = sorted(w for rule, w in plan if rule == "eval")
    assert [w for w in evals if "split" in w] == [f"model={teacher}, task=split, shard=.shard-{i}-of-3"
                                                  for i in range(3)]
    assert ("merge_eval", f"model={teacher}, task=split") in plan
    assert ("eval_model", f"model={teacher}") in plan and not [w for w in evals if "whole" in w]
    r = smk(*targets, "--cores", "2", "--configfile", str(tmp_path / "c.yaml"), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    whole, split = (json.loads(Path(t).read_text()) for t in targets)
    assert split["shards"] == 3 and split["metrics"] == whole["metrics"]
    assert [d["completions"] for d in split["details"]] == [d["completions"] for d in whole["details"]]
