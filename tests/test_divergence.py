"""Fail fast (melt_core.training.train.TrainingDiverged): a run whose loss or gradient norm stops being finite
stops at that step with one error, keeps its finite checkpoints, never writes `final`, marks its
MLflow run failed, and a rerun with a lower learning rate resumes from the last checkpoint."""

import json
import math

import pytest
import torch
from test_train import cfg_for, read_metrics, start_ranks, weights
from train_helpers import tiny_setup

import melt_core.training.train
from melt_core.modeling import checkpoint as ck
from melt_core.training.train import TrainingDiverged, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("diverge")
    return root, *tiny_setup(root)


STEPS = [{"name": "phase1", "steps": 6, "alpha_start": 0.0, "alpha_end": 1.0},
         {"name": "phase2", "steps": 4, "align_beta": 0.1}]


class Logger:
    """An MLflow logger's surface, keeping what train() tells it."""

    run_id = None

    def __init__(self):
        self.metrics, self.status = [], None

    def log_params(self, params): ...
    def log_artifact(self, path, *a): ...
    def set_tags(self, tags): ...

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, metrics))

    def close(self, status="FINISHED"):
        self.status = self.status or status


def test_a_diverged_run_stops_at_its_first_nonfinite_step(setup):
    """The tiny run at lr 100 (loss ~1e-9, then ~7e3 with an infinite gradient norm, then NaN had it
    gone on): it must stop at the first non-finite value, naming the phase, step, value and learning
    rate, with no `final` and its checkpoints intact."""
    log = Logger()
    cfg = cfg_for(setup, "diverged", phases=STEPS, lr_model=100.0, checkpoint_every=1, keep_checkpoints=20)
    with pytest.raises(TrainingDiverged) as err:
        train(cfg, logger=log)
    out = setup[0] / "diverged"
    rows = read_metrics(out)
    bad = rows[-1]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows[:-1]), rows
    assert not (math.isfinite(bad["loss"]) and math.isfinite(bad["grad_norm"])), bad
    msg = str(err.value)
    assert f"phase {bad['phase']}, step {bad['step']}/10" in msg and "lr_model 100" in msg, msg
    assert ("loss nan" in msg or "grad_norm nan" in msg or "inf" in msg) and "`final` was not written" in msg
    assert not (out / "final").exists()
    kept = sorted((out / "checkpoints").iterdir())
    assert [int(p.name.split("-")[1]) for p in kept] == list(range(1, bad["step"]))  # every step before it
    for p in kept:  # each loads: finite weights, checksums intact
        ck.load_pretrained(p)
    assert f"the last finite checkpoint, {kept[-1]}, is kept" in msg
    marker = json.loads((out / "diverged.json").read_text())
    assert marker["step"] == bad["step"] and marker["settings"]["lr_model"] == 100.0
    assert log.status == "FAILED" and log.metrics[-1][0] == bad["step"]  # the bad step is logged, then failed


def test_a_rerun_with_a_lower_learning_rate_resumes_from_the_kept_checkpoint(setup, monkeypatch):
    """A divergence planted at step 5 (at lr 100 the first step already ruins the weights, so the
    kept checkpoint would diverge again: docs/OPERATIONS.md says to delete it then); the rerun with another
    learning rate resumes from step 4, not from step 0, and its final records what it resumed after."""
    real_step, real_losses = melt_core.training.train._step, melt_core.training.train._losses
    monkeypatch.setattr(melt_core.training.train, "_losses", _nan_at({4}))
    cfg = cfg_for(setup, "retuned", phases=STEPS, checkpoint_every=2)
    with pytest.raises(TrainingDiverged, match="step 5/10"):
        train(cfg)
    out = setup[0] / "retuned"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000002", "step-0000004"]
    monkeypatch.setattr(melt_core.training.train, "_losses", real_losses)
    ran = []
    monkeypatch.setattr(melt_core.training.train, "_step", lambda *a, **k: ran.append(a[4]) or real_step(*a, **k))
    final = train({**cfg, "lr_model": cfg["lr_model"] / 10})
    assert ran == list(range(4, 10)), f"the rerun computed steps {ran}, not 5-10 from the kept checkpoint"
    info = json.loads((final / "config.json").read_text())
    assert info["resumed_after_divergence"]["step"] == 5
    assert info["resumed_after_divergence"]["settings"]["lr_model"] == cfg["lr_model"]
    assert not (out / "diverged.json").exists()
    assert all(torch.isfinite(w).all() for w in weights(final).values())


def test_after_a_divergence_any_other_change_still_starts_over(setup, monkeypatch):
    cfg = cfg_for(setup, "changed", phases=STEPS, lr_model=100.0, checkpoint_every=1)
    with pytest.raises(TrainingDiverged):
        train(cfg)
    ran = []
    real_step = melt_core.training.train._step
    monkeypatch.setattr(melt_core.training.train, "_step", lambda *a, **k: ran.append(a[4]) or real_step(*a, **k))
    train({**cfg, "lr_model": 1e-3, "kd_temperature": 2.0})  # not only the learning rate changed
    assert ran[0] == 0
    assert list((setup[0] / "changed" / "superseded").iterdir())  # the diverged run set aside, kept


def _nan_at(steps):
    """_losses returning NaN at the given 0-based steps (a planted, bounded divergence)."""
    real = melt_core.training.train._losses
    seen = {"n": -1}

    def losses(*a, **k):
        seen["n"] += 1  # one micro-batch a step in these configs
        kd, align = real(*a, **k)
        return (kd * float("nan"), align) if seen["n"] in steps else (kd, align)

    return losses


def test_skipped_steps_leave_the_weights_untouched_up_to_the_allowance(setup, monkeypatch):
    real_losses = melt_core.training.train._losses
    monkeypatch.setattr(melt_core.training.train, "_losses", _nan_at({2, 5}))
    final = train(cfg_for(setup, "skip2", phases=STEPS, skip_nonfinite_steps=2, checkpoint_every=100))
    rows = read_metrics(setup[0] / "skip2")
    assert [r["step"] for r in rows if not math.isfinite(r["loss"])] == [3, 6]
    assert all(torch.isfinite(w).all() for w in weights(final).values())
    monkeypatch.setattr(melt_core.training.train, "_losses", _nan_at({2, 5}))
    with pytest.raises(TrainingDiverged, match="step 6/10"):  # the second bad step is one too many
        train(cfg_for(setup, "skip1", phases=STEPS, skip_nonfinite_steps=1, checkpoint_every=100))
    # a skipped step takes no optimizer step: one bad step early leaves the weights where step 2 left them
    monkeypatch.setattr(melt_core.training.train, "_losses", _nan_at({2}))
    one = [{"name": "phase1", "steps": 3, "alpha_start": 1.0, "alpha_end": 1.0}]
    skipped = train(cfg_for(setup, "skip_last", phases=one, skip_nonfinite_steps=1, checkpoint_every=100))
    monkeypatch.setattr(melt_core.training.train, "_losses", real_losses)
    two = train(cfg_for(setup, "two_steps", phases=[{**one[0], "steps": 2}], checkpoint_every=100))
    a, b = weights(skipped), weights(two)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_every_fsdp_rank_stops_at_the_same_step(setup, tmp_path):
    cfg = cfg_for(setup, "fsdp_diverged", phases=STEPS, lr_model=100.0, sharding="fsdp", checkpoint_every=2)
    procs = start_ranks(cfg, tmp_path / "cfg.json")
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), outs
    said = [next((line for line in o.splitlines() if "TrainingDiverged: training diverged" in line), "") for o in outs]
    steps = {s.split("step ")[1].split(":")[0] for s in said if "step " in s}
    assert len(steps) == 1 and all(said), said  # both ranks, the same step, the same error
    assert not (setup[0] / "fsdp_diverged" / "final").exists()
