"""benchmarks/escape_sweep.py: a phase job replayed from its resolved config trains the same run
(data seed unchanged: the same final loss as the original), variants change only what they name,
and the escape is read as the report reads it."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from melt_core.training.train import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import escape_sweep  # noqa: E402
from train_helpers import tiny_setup, train_config  # noqa: E402

RESOLVED = {"student": "s", "teacher": "t", "out_dir": "o", "seed": 0, "lr_model": 1e-3, "lr_gate": 1e-2,
            "phases": [{"name": "phase1_no_interp", "steps": 150, "alpha_start": 1.0, "alpha_end": 1.0}]}


def test_a_variant_changes_only_what_it_names(tmp_path):
    name, sets = escape_sweep.parse_variant("long:steps=300,lr_model=3e-3")
    assert name == "long" and sets == {"steps": 300, "lr_model": 3e-3}
    cfg = escape_sweep.trial_config(RESOLVED, 5, sets, tmp_path / "trial", tmp_path / "logits")
    assert cfg["seed"] == 5 and cfg["phases"][0]["steps"] == 300 and cfg["lr_model"] == 3e-3
    assert cfg["lr_gate"] == 1e-2 and cfg["mlflow"] is None and cfg["out_dir"] == str(tmp_path / "trial")
    assert RESOLVED["phases"][0]["steps"] == 150  # the original is not touched
    with pytest.raises(SystemExit, match="neither a TrainConfig field"):
        escape_sweep.trial_config(RESOLVED, 0, {"lr_modle": 1.0}, tmp_path, tmp_path)
    with pytest.raises(SystemExit, match="NAME:key=value"):
        escape_sweep.parse_variant("long:steps")


def test_the_escape_step_is_the_first_window_below_the_threshold():
    kd = pd.Series([2.4] * 20 + [0.5] * 20)
    assert escape_sweep.escape_step(kd, 1.2, 10) == 27  # steps 18-27: three at 2.4, seven at 0.5 -> 1.07 (26: 1.26)
    assert escape_sweep.escape_step(pd.Series([2.4] * 40), 1.2, 10) is None


def test_a_replayed_phase_job_trains_the_same_run(tmp_path):
    """The sweep's trial of data seed 0 and no variant is the phase job itself: the same loss at every
    step as the run it replays, while another data seed trains another run."""
    paths, teacher, student = tiny_setup(tmp_path, gate="scalar")
    cfg = train_config(tmp_path, paths, teacher, student, "runs/seed0/scalar/phase1_no_interp",
                       phases=[{"name": "phase1_no_interp", "steps": 12}], checkpoint_every=50, mlflow=None)
    train(cfg)
    run_dir = tmp_path / "runs/seed0/scalar/phase1_no_interp"
    (run_dir / "resolved_train_config.json").write_text(json.dumps(cfg))
    report = {"report": {"escape_kd": 1.2, "escape_last": 4}, "cpu_numerics": {"pinned": True}}
    (tmp_path / "config.resolved.yaml").write_text(yaml.safe_dump(report))
    escape_sweep.main(["--results", str(tmp_path), "--gates", "scalar", "--data-seeds", "0", "1",
                       "--variant", "default:", "--variant", "short:steps=6", "--judge-at", "3", "6"])
    out = json.loads((tmp_path / "benchmarks/escape_sweep/escape_sweep.json").read_text())
    original = escape_sweep.curve(run_dir / "metrics.jsonl")
    trials = tmp_path / "benchmarks/escape_sweep/trials"
    again = escape_sweep.curve(trials / "scalar-phase1_no_interp-default-data0" / "metrics.jsonl")
    other = escape_sweep.curve(trials / "scalar-phase1_no_interp-default-data1" / "metrics.jsonl")
    short = escape_sweep.curve(trials / "scalar-phase1_no_interp-short-data0" / "metrics.jsonl")
    assert len(again) == 12 and again.kd.tolist() == pytest.approx(original.kd.tolist(), rel=1e-4)
    assert other.kd.tolist() != pytest.approx(original.kd.tolist(), rel=1e-3)
    assert len(short) == 6  # and its steps are the 12-step trial's first six (a constant learning rate)
    assert short.kd.tolist() == pytest.approx(again.kd.tolist()[:6], rel=1e-6)
    assert {(s["variant"], s["at"], s["seeds"]) for s in out["summary"]} == {
        ("default", 3, 2), ("default", 6, 2), ("default", 12, 2), ("short", 3, 2), ("short", 6, 2)}
    judged = {(r["variant"], r["data_seed"]): r for r in out["trials"]}
    assert judged[("default", 0)]["kd_last@6"] == pytest.approx(judged[("short", 0)]["final_kd"], rel=1e-6)
    assert all(r["final_kd"] == pytest.approx(float(escape_sweep.curve(
        trials / f"scalar-phase1_no_interp-{r['variant']}-data{r['data_seed']}" / "metrics.jsonl").kd.tail(4).mean()))
        for r in out["trials"])
    table = (tmp_path / "benchmarks/escape_sweep/escape_sweep.md").read_text()
    assert "| scalar phase1_no_interp | default | " in table


def test_gate_seeds_convert_the_teacher_again(tmp_path):
    """--gate-seeds converts the job's teacher as rule convert does: the job's own seed gives the job's
    own run again, another seed other gates and another run."""
    paths, teacher, student = tiny_setup(tmp_path, gate="scalar")  # converted with seed 0, init std 0.1
    cfg = train_config(tmp_path, paths, teacher, student, "runs/seed0/scalar/phase1_no_interp",
                       phases=[{"name": "phase1_no_interp", "steps": 8}], checkpoint_every=50, mlflow=None)
    train(cfg)
    run_dir = tmp_path / "runs/seed0/scalar/phase1_no_interp"
    (run_dir / "resolved_train_config.json").write_text(json.dumps(cfg))
    report = {"report": {"escape_kd": 1.2, "escape_last": 4}, "convert": {"gate_init_std": 0.1, "window": 0}}
    (tmp_path / "config.resolved.yaml").write_text(yaml.safe_dump(report))
    escape_sweep.main(["--results", str(tmp_path), "--gates", "scalar", "--data-seeds", "0", "--gate-seeds", "0", "1"])
    trials = tmp_path / "benchmarks/escape_sweep/trials"
    original = escape_sweep.curve(run_dir / "metrics.jsonl").kd.tolist()
    same = escape_sweep.curve(trials / "scalar-phase1_no_interp-default-gates0-data0" / "metrics.jsonl").kd.tolist()
    other = escape_sweep.curve(trials / "scalar-phase1_no_interp-default-gates1-data0" / "metrics.jsonl").kd.tolist()
    assert same == pytest.approx(original, rel=1e-4) and other != pytest.approx(original, rel=1e-3)
    out = json.loads((tmp_path / "benchmarks/escape_sweep/escape_sweep.json").read_text())
    assert [(s["variant"], s["at"], s["seeds"]) for s in out["summary"]] == [("default", 8, 2)]
