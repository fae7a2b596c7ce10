"""Protects the SLURM path against a real cluster (started by `.ci/slurm-cluster.sh start`; CI does
this): training submitted through submitit as a 2-task gloo job equals the in-process run, and a
job requeued mid-run (`scontrol requeue`, as on preemption) resumes from its checkpoint and ends
with bitwise the same weights. Skipped, with the reason shown, where no cluster answers."""

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import tiny_setup, train_config

from melt_core.training.launch import launch


def _cluster_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    return r.returncode == 0 and "idle" in r.stdout or "mix" in r.stdout


pytestmark = pytest.mark.skipif(not _cluster_up(), reason="no SLURM cluster answers (bash .ci/slurm-cluster.sh start)")
SLURM = {"backend": "slurm", "cpus_per_task": 1, "timeout_min": 10, "partition": "debug"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    return root, *tiny_setup(root)


def weights(path):
    return load_file(str(path / "model.safetensors"))


def test_two_task_gloo_job_equals_inprocess(setup):
    root, paths, teacher, student = setup
    local = launch(train_config(root, paths, teacher, student, "local"), {"backend": "inprocess"})
    job = launch(train_config(root, paths, teacher, student, "sbatch"), {**SLURM, "tasks_per_node": 2})
    assert (root / "sbatch" / "submitit").is_dir()
    a, b = weights(local), weights(job)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-4, rtol=1e-4)


def test_requeued_job_resumes_bitwise(setup, monkeypatch):
    root, paths, teacher, student = setup
    phases = [{"name": "phase1", "steps": 4, "alpha_start": 0.0, "alpha_end": 1.0},
              {"name": "phase2", "steps": 4, "align_beta": 0.1}]
    # the reference runs as an uninterrupted job of the same shape, so both see the same kernels
    # and thread count (a job's environment differs from this process's): bitwise is then owed
    ref = launch(train_config(root, paths, teacher, student, "ref", phases=phases), {**SLURM, "tasks_per_node": 1})
    monkeypatch.setenv("MELT_TRAIN_STEP_DELAY", "1.0")  # exported to the job: slow steps to requeue mid-run
    out = root / "requeued"
    ck4 = out / "checkpoints" / "step-0000004" / "trainer_state.pt"
    requeued = {}

    def requeue_when_checkpointed():
        deadline = time.time() + 240
        while not ck4.exists() and time.time() < deadline:
            time.sleep(0.2)
        for script in (out / "submitit").glob("*_submission.sh"):  # this launch's job, not earlier ones
            jid = script.name.split("_")[0]
            requeued[jid] = subprocess.run(["scontrol", "requeue", jid], capture_output=True, text=True).returncode
            # a requeued job waits ~2 min (begin-time hold) before it may start again: lift that once
            # it is pending again (while it completes, SLURM sets the hold after our update)
            until = time.time() + 60
            while time.time() < until:
                time.sleep(0.5)
                state = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True, text=True)
                if state.stdout.strip() == "PENDING" and subprocess.run(
                        ["scontrol", "update", f"JobId={jid}", "StartTime=now"], capture_output=True).returncode == 0:
                    break

    watcher = threading.Thread(target=requeue_when_checkpointed)
    watcher.start()
    final = launch(train_config(root, paths, teacher, student, "requeued", phases=phases),
                   {**SLURM, "tasks_per_node": 1})
    watcher.join()
    assert requeued and all(rc == 0 for rc in requeued.values()), requeued
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 8
    logs = "".join(p.read_text() for p in (out / "submitit").glob("*_log.out"))
    assert "resuming from step 4" in logs or "resuming from step 6" in logs, logs[-2000:]
    a, b = weights(ref), weights(final)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_planted_divergence_fails_its_phase_job_and_nothing_after_it_runs(tmp_path):
    """The paper configuration's rehearsal with an absurd learning rate (an overlay), asked for the
    main run's AIME24 eval: each phase job whose step goes non-finite (a Phase 2's first step here:
    Phase 1's two steps at lr 1e4 ruin the weights but stay finite), a 2-rank FSDP job submitted
    through submitit, stops with TrainingDiverged and no `final`; no phase after it begins,
    Snakemake fails, and no eval runs."""
    import os

    import yaml

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "workflow"))
    import rehearsal

    rehearsal.build(root / "results" / "rehearsal" / "fixtures")  # deterministic and pinned: what .ci/run builds
    out = tmp_path / "diverged"
    layer = tmp_path / "diverge.yaml"
    layer.write_text(yaml.safe_dump({
        "overlays": os.path.relpath(root / "config" / "rehearsal_cpu.yaml", tmp_path), "name": "rehearsal-diverge",
        "outdir": str(out), "mlflow": {"tracking_uri": f"sqlite:///{out}/mlflow.db", "experiment": "diverge"},
        "train": {"lr_model": 1.0e4}}))
    layers = [str(root / "config" / f) for f in ("paper.yaml", "rehearsal.yaml", "rehearsal_cpu.yaml")]
    target = out / "eval" / "melt-elementwise__full-seed0" / "aime24.json"
    cmd = [str(root / ".venv" / "bin" / "snakemake"), str(target), "--profile", "profiles/slurm-ci",
           "--configfile", *layers, str(layer)]  # as .ci/run names them, and the divergence last
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode != 0, r.stdout[-3000:]
    diverged = [p.parent for p in (out / "runs").rglob("diverged.json")]  # the eval's group trains several runs
    assert diverged, r.stderr[-3000:]
    for run in diverged:
        logs = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.*"))
        assert "TrainingDiverged: training diverged" in logs and "lr_model 10000" in logs, logs[-3000:]
        assert not (run / "final").exists(), run
        assert not [p for p in run.rglob("metrics.jsonl") if p.parent != run], run  # no later phase began
    assert not target.exists() and not list(out.glob("eval/**/*.json")), sorted(out.glob("eval/**/*"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
