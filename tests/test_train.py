"""Protects the training loop: configs that contradict themselves fail before any compute;
alpha = 0 starts from exactly the teacher (zero KD); the losses fall; gradient accumulation
and 2-process data parallelism give the full-batch result; a killed run resumes to
bitwise the same weights; checkpoints are never half-written."""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from naive_reference import naive_alignment, naive_kd
from safetensors.torch import load_file
from train_helpers import tiny_setup, train_config

import melt_core.training.train
from melt_core import ConfigError
from melt_core.data import DataError
from melt_core.modeling import checkpoint as ck
from melt_core.training.train import TrainConfig, _training_data, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    return root, *tiny_setup(root)


def cfg_for(setup, out, **over):
    root, paths, teacher, student = setup
    return train_config(root, paths, teacher, student, out, **over)


def weights(path):
    return load_file(str(path / "model.safetensors"))


def read_metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_losses(a, b):
    """Step 1 sees identical weights: its loss must agree to float32 summation order. Later steps
    drift by rounding that Adam amplifies; a wrong normalisation would be off by far more."""
    assert len(a) == len(b)
    for i, (ra, rb) in enumerate(zip(a, b)):
        tol = 1e-6 if i < 2 else 1e-4  # steps 1-2: alpha = 0 then 0.5, weights barely moved
        assert math.isclose(ra["loss"], rb["loss"], rel_tol=tol, abs_tol=1e-9), (i, ra["loss"], rb["loss"])
        assert math.isclose(ra["align"], rb["align"], rel_tol=1e-4, abs_tol=1e-9), (i, ra["align"], rb["align"])


def assert_same_weights(a, b):
    """Adam turns rounding-level gradient differences in near-zero entries into updates of up to
    lr; 1e-4 is a tenth of one step at the test's lr 1e-3, far below a real difference."""
    for k, v in a.items():
        torch.testing.assert_close(b[k], v, atol=1e-4, rtol=1e-4)


def test_alpha_zero_starts_at_the_teacher_and_losses_fall(setup):
    cfg = cfg_for(setup, "basic", phases=[
        {"name": "phase1", "steps": 12, "alpha_start": 0.0, "alpha_end": 1.0},
        {"name": "phase2", "steps": 6, "align_beta": 0.1}])
    final = train(cfg)
    rows = read_metrics(setup[0] / "basic")
    assert rows[0]["kd"] < 1e-6 and rows[0]["alpha"] == 0.0  # student == teacher at alpha = 0
    # Phase 1's alpha rises linearly from 0 to 1 over its 12 steps (docs/METHOD.md section 3)
    assert [r["alpha"] for r in rows[:12]] == pytest.approx([i / 11 for i in range(12)], abs=1e-12)
    assert rows[11]["alpha"] == 1.0 and rows[12]["phase"] == "phase2" and rows[12]["align"] > 0
    assert rows[-1]["kd"] < rows[12]["kd"]  # Phase 2 learns
    assert (final / "config.json").is_file() and json.loads((final / "config.json").read_text())["model_type"] == "melt"
    saved = json.loads((setup[0] / "basic" / "train_config.json").read_text())
    assert saved["chunk_size"] == 4  # the resolved config sits beside the checkpoint


def test_logged_losses_are_the_definitions_at_the_first_step(setup):
    """Step 1 (weights not yet updated) logs kd = loop-mean KL(teacher_t || student_t) over the batch's
    learned tokens / their count, with the temperature, and align = beta/(N T) sum ||o_s - o_t||^2 over
    all positions / their count: recomputed here from the two checkpoints on the step's batch with the
    token-by-token definitions (tests/naive_reference.py), micro-batched in the run and not here."""
    cfg = cfg_for(setup, "first_step", phases=[{"name": "phase2", "steps": 1, "align_beta": 0.1}],
                  kd_temperature=2.0, micro_batch_size=2)
    cfg["data"]["loss_on"] = "assistant"  # KD on the answers only: tokens and positions differ in number
    train(cfg)
    row = read_metrics(setup[0] / "first_step")[0]
    ids, mask = _training_data(TrainConfig.from_dict(cfg)).batch(0, cfg["batch_size"])
    student, teacher = (ck.load_pretrained(cfg[k], dtype=torch.float32) for k in ("student", "teacher"))
    with torch.no_grad():
        t = teacher(ids[:, :-1], collect_attn_outputs=True)
        s = student(ids[:, :-1], cache=student.new_cache(), chunk_size=cfg["chunk_size"], alpha=1.0,
                    collect_attn_outputs=True)
    kd = naive_kd(s.per_loop_logits, t.per_loop_logits, mask, "all", 2.0) / float(mask.sum())
    align = 0.1 * naive_alignment(s.attn_outputs, t.attn_outputs) / mask.numel()
    assert row["step"] == 1 and kd > 0.01 and align > 1e-4 and 0 < mask.sum() < mask.numel()
    assert row["kd"] == pytest.approx(kd, rel=1e-4) and row["align"] == pytest.approx(align, rel=1e-4)
    assert row["loss"] == pytest.approx(kd + align, rel=1e-4)


def test_gradient_clipping_reaches_the_update(setup):
    """grad_clip rescales the gradient Adam sees: at a bound far below the gradient's norm (logged
    unclipped) the first update shrinks toward eps's floor; without a bound it is ~lr per weight."""
    one = [{"name": "phase1", "steps": 1, "alpha_start": 1.0, "alpha_end": 1.0}]
    start = weights(setup[3])
    moved = {}
    for clip in (None, 1e-9):
        out = train(cfg_for(setup, f"clip{clip}", phases=one, grad_clip=clip, checkpoint_every=100))
        after = weights(out)
        moved[clip] = max(float((after[k] - start[k]).abs().max()) for k in start)
        assert read_metrics(setup[0] / f"clip{clip}")[0]["grad_norm"] > 1e-3
    lr = cfg_for(setup, "x")["lr_gate"]  # the larger of the two rates
    assert moved[None] == pytest.approx(lr, rel=1e-3)  # Adam's first step: lr * g / (|g| + eps)
    assert moved[1e-9] < 0.5 * lr


def test_gradient_accumulation_equals_full_batch(setup):
    a = train(cfg_for(setup, "full_batch", checkpoint_every=100))
    b = train(cfg_for(setup, "micro", micro_batch_size=1, checkpoint_every=100))
    assert_same_losses(read_metrics(setup[0] / "full_batch"), read_metrics(setup[0] / "micro"))
    assert_same_weights(weights(a), weights(b))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(cfg: dict, cfg_file: Path, world: int = 2, env: dict | None = None) -> list[subprocess.Popen]:
    """``world`` gloo processes of melt_core.training.train on one config, as torchrun/submitit would start them."""
    cfg_file.write_text(json.dumps(cfg))
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-m", "melt_core.training.train", str(cfg_file)],
                             env={**os.environ, **(env or {}), "WORLD_SIZE": str(world), "RANK": str(rank),
                                  "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                  "OMP_NUM_THREADS": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(world)]


def run_ranks(cfg: dict, cfg_file: Path, world: int = 2, said: str | None = None) -> Path:
    """Runs the ranks to the end; ``said``: a line rank 0 must have printed."""
    procs = start_ranks(cfg, cfg_file, world)
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        outs.append(out)
    assert said is None or said in outs[0], (said, outs[0][-2000:])
    return Path(cfg["out_dir"]) / "final"


def test_two_gloo_processes_equal_one(setup, tmp_path):
    one = train(cfg_for(setup, "one_proc", checkpoint_every=100))
    two = run_ranks(cfg_for(setup, "two_proc", checkpoint_every=100), tmp_path / "cfg.json")
    assert_same_losses(read_metrics(setup[0] / "one_proc"), read_metrics(setup[0] / "two_proc"))
    assert_same_weights(weights(one), weights(two))


def test_fsdp_equals_ddp_equals_one_process(setup, tmp_path):
    """FSDP2 (fully_shard per layer and at the root) on 2 gloo ranks, through a checkpoint save
    (a gather of the shards) mid-run, ends where 2-rank DDP and the single process end, within
    the tolerance of assert_same_weights (reduction order differs: reduce-scatter vs all-reduce)."""
    one = train(cfg_for(setup, "fsdp_ref", checkpoint_every=2))
    ddp = run_ranks(cfg_for(setup, "ddp2", checkpoint_every=2), tmp_path / "ddp.json",
                    said="world size 2, sharding ddp")
    fsdp = run_ranks(cfg_for(setup, "fsdp2", checkpoint_every=2, sharding="fsdp"), tmp_path / "fsdp.json",
                     said="world size 2, sharding fsdp")
    ref = weights(one)
    assert_same_weights(ref, weights(ddp))
    assert_same_weights(ref, weights(fsdp))
    assert_same_losses(read_metrics(setup[0] / "fsdp_ref"), read_metrics(setup[0] / "fsdp2"))
    assert (setup[0] / "fsdp2" / "checkpoints" / "step-0000004" / "trainer_state.pt").is_file()
    moved = max(float((weights(fsdp)[k] - v).abs().max()) for k, v in weights(setup[2]).items())
    assert moved > 1e-3, "training changed nothing: the optimizer did not see the sharded parameters"


def test_fsdp_run_killed_midway_resumes(setup, tmp_path):
    """Both ranks SIGKILLed after the step-4 checkpoint; a new 2-rank FSDP launch resumes from it
    (weights and name-keyed optimizer state) and ends bitwise where an uninterrupted FSDP run ends
    (same kernels, same thread count, same shards)."""
    steps = [{"name": "phase1", "steps": 4, "alpha_start": 0.0, "alpha_end": 1.0},
             {"name": "phase2", "steps": 4, "align_beta": 0.1}]
    ref = run_ranks(cfg_for(setup, "fsdp_whole", phases=steps, sharding="fsdp"), tmp_path / "whole.json")
    cfg = cfg_for(setup, "fsdp_killed", phases=steps, sharding="fsdp")
    ck4 = setup[0] / "fsdp_killed" / "checkpoints" / "step-0000004" / "trainer_state.pt"
    procs = start_ranks(cfg, tmp_path / "killed.json", env={"MELT_TRAIN_STEP_DELAY": "0.5"})
    deadline = time.time() + 120
    while not ck4.exists() and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        p.kill()
        p.wait()
    assert ck4.exists() and not (setup[0] / "fsdp_killed" / "final").exists(), "the kill came too late"
    resumed = run_ranks(cfg, tmp_path / "resume.json", said="resuming from step 4")
    assert read_metrics(setup[0] / "fsdp_killed")[-1]["step"] == 8
    a, b = weights(ref), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_autocast_fsdp_trains_on_cpu(setup, tmp_path):
    """The cluster's code path (FSDP + bf16 autocast) runs on CPU/gloo: finite losses, a float32
    checkpoint, and weights within what 6 Adam steps can move of the float32 run's (bf16 only rounds
    the gradients). Adam's step is bounded by lr * max(1, (1 - beta1) / sqrt(1 - beta2)) (Kingma & Ba,
    sec. 2.1): 1.41 lr at betas (0.9, 0.95); twice that covers two runs moving apart."""
    fp32 = train(cfg_for(setup, "fp32_ref", checkpoint_every=100))
    bf16 = run_ranks(cfg_for(setup, "fsdp_bf16", checkpoint_every=100, sharding="fsdp", autocast_bf16=True),
                     tmp_path / "bf16.json")
    assert all(math.isfinite(r["loss"]) for r in read_metrics(setup[0] / "fsdp_bf16"))
    a, b = weights(fp32), weights(bf16)
    assert all(v.dtype == torch.float32 for v in b.values())
    step_bound = max(1.0, 0.1 / math.sqrt(0.05))
    for k in a:
        lr = 1e-2 if ".gate." in k else 1e-3  # lr_gate, lr_model of train_config
        assert float((a[k] - b[k]).abs().max()) <= 2 * 6 * lr * step_bound, k
    assert any(not torch.equal(a[k], b[k]) for k in a)  # autocast really ran in bf16


def test_killed_run_resumes_bitwise(setup, tmp_path, monkeypatch, capsys):
    """Exact on purpose: both runs execute the same kernels on this machine (the worker inherits
    this process's environment and thread count, and every tensor, reloaded ones included, lives
    in torch-allocated memory), so a resume that changes any bit has lost state. And the resumed
    run computes only the steps after its checkpoint: a run that silently started over from step 0
    would reach the same weights and rewrite the same rows."""
    steps = [{"name": "phase1", "steps": 4, "alpha_start": 0.0, "alpha_end": 1.0},
             {"name": "phase2", "steps": 4, "align_beta": 0.1}]
    ref = train(cfg_for(setup, "uninterrupted", phases=steps))
    cfg = cfg_for(setup, "interrupted", phases=steps)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(cfg))
    env = {**os.environ, "MELT_TRAIN_STEP_DELAY": "0.5"}  # slow steps so the kill lands mid-run
    proc = subprocess.Popen([sys.executable, "-m", "melt_core.training.train", str(cfg_file)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck4 = setup[0] / "interrupted" / "checkpoints" / "step-0000004" / "trainer_state.pt"
    deadline = time.time() + 120
    while not ck4.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert ck4.exists() and not (setup[0] / "interrupted" / "final").exists(), "the kill came too late"
    ran = []
    real_step = melt_core.training.train._step
    monkeypatch.setattr(melt_core.training.train, "_step", lambda *a, **k: ran.append(a[4]) or real_step(*a, **k))
    capsys.readouterr()
    resumed = train(cfg)
    assert ran and ran[0] in (4, 6) and ran == list(range(ran[0], 8)), f"steps the resumed run computed: {ran}"
    assert f"resuming from step {ran[0]}" in capsys.readouterr().out
    rows = read_metrics(setup[0] / "interrupted")
    assert [r["step"] for r in rows] == list(range(1, 9))  # the resumed steps logged once, not twice
    a, b = weights(ref), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    for run in ("uninterrupted", "interrupted"):  # checkpoints at steps 2, 4, 6 (8 is final); keep_checkpoints 2
        assert sorted(p.name for p in (setup[0] / run / "checkpoints").iterdir()) == ["step-0000004", "step-0000006"]


def test_a_checkpoint_restores_the_random_streams_for_its_own_config_only(setup, tmp_path):
    """Our trainer draws no random numbers while it steps, so the resume test above cannot see the
    RNG states; a method that adds dropout or sampling would. They round-trip through the checkpoint.
    And a checkpoint is resumed only by the config that wrote it (the run sets others aside first:
    test_changed_settings_retrain_cleanly; this is the guard behind that)."""
    import random

    from melt_core.training.train import build_optimizer
    from melt_core.training.trainer_state import Dist, latest_checkpoint, restore, save_checkpoint

    cfg = TrainConfig.from_dict(cfg_for(setup, "rng"))
    student = ck.load_pretrained(cfg.student)
    optimizer = build_optimizer(student, cfg)
    torch.manual_seed(123)
    random.seed(5)
    save_checkpoint(tmp_path / "ck", 3, student, optimizer, cfg, Dist())
    want_torch, want_python = torch.rand(4), random.random()
    torch.manual_seed(999)
    random.seed(999)
    assert restore(student, optimizer, cfg, Dist(), resume=tmp_path / "ck", handoff=None) == 3
    assert torch.equal(torch.rand(4), want_torch) and random.random() == want_python
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints" / "step-0000003", 3, student, optimizer, cfg, Dist())
    assert latest_checkpoint(run, cfg) == run / "checkpoints" / "step-0000003"
    with pytest.raises(ConfigError, match="different training config"):
        latest_checkpoint(run, TrainConfig.from_dict(cfg_for(setup, "rng", lr_model=2e-3)))


def test_a_resume_agrees_on_every_setting_but_paths_and_logging(setup):
    """A checkpoint is resumed only under the settings that wrote it: every TrainConfig field is in
    the resume key (a field added later joins it by itself) except those that change no number."""
    from melt_core.training.trainer_state import _resume_key

    cfg = TrainConfig.from_dict(cfg_for(setup, "key"))
    untracked = {"out_dir", "progress", "mlflow", "log_every", "print_every", "run_name", "keep_checkpoints",
                 "device", "teacher_cache"}
    assert set(_resume_key(cfg)) == set(cfg.to_dict()) - untracked
    assert {"seed", "phases", "student", "teacher", "data", "lr_model", "chunk_size"} <= set(_resume_key(cfg))


def test_phase_by_phase_equals_one_run(setup, caplog):
    """Phase 2 as its own run, continuing from Phase 1's final checkpoint (weights, optimizer state,
    step, RNG), ends bitwise where one run over both phases ends (same process, same kernels).
    Every checkpoint's provenance (its phases, steps) loads as such, without an unknown-field warning."""
    both = train(cfg_for(setup, "both_phases", checkpoint_every=100))
    p1, p2 = cfg_for(setup, "x")["phases"]
    first = train(cfg_for(setup, "p1_only", phases=[p1], checkpoint_every=100))
    second = train(cfg_for(setup, "p2_after", phases=[p1, p2], init_from=str(first), checkpoint_every=100))
    a, b = weights(both), weights(second)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_metrics(setup[0] / "p2_after")] == [4, 5, 6]  # its own steps only
    caplog.clear()
    saved = ck.read_config(second)
    assert [p["name"] for p in saved.extra["phases"]] == ["phase1", "phase2"] and saved.extra["train_step"] == 6
    assert "unknown field" not in caplog.text
    untimed = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]  # noqa: E731
    assert untimed(read_metrics(setup[0] / "both_phases")[3:]) == untimed(read_metrics(setup[0] / "p2_after"))
    fresh = train(cfg_for(setup, "p2_fresh", phases=[p1, p2], init_from=str(first), checkpoint_every=100,
                          handoff="fresh_optimizer"))
    assert any(not torch.equal(a[k], weights(fresh)[k]) for k in a)  # the handoff choice matters
    changed = [dict(p1, alpha_end=0.5), p2]
    with pytest.raises(ConfigError, match=r"init_from.*trained phases \['phase1'\] with other settings"):
        train(cfg_for(setup, "p2_stale", phases=changed, init_from=str(first)))
    train(cfg_for(setup, "p1_midway", phases=[p1], checkpoint_every=2))
    midway = setup[0] / "p1_midway" / "checkpoints" / "step-0000002"  # Phase 1 is 3 steps
    with pytest.raises(ConfigError, match=r"init_from.*stopped at step 2, before the end of its phases"):
        train(cfg_for(setup, "p2_early", phases=[p1, p2], init_from=str(midway)))


def test_shared_teacher_logits_train_bitwise_the_same(setup, tmp_path):
    """train.teacher_cache: a run that computes the teacher's logits and leaves them, and a run that
    reads them, both end bitwise where a run without the cache ends; Phase 2 (alignment) computes
    the teacher itself; another teacher or another seed never reads these files."""
    shared = str(tmp_path / "teacher_logits")
    plain = weights(train(cfg_for(setup, "tc_plain", checkpoint_every=100)))
    writer = weights(train(cfg_for(setup, "tc_writer", checkpoint_every=100, teacher_cache=shared)))
    (key_dir,) = (tmp_path / "teacher_logits").iterdir()
    files = sorted(p.name for p in key_dir.glob("*.pt"))
    assert files == [f"step-{s:07d}-rank0-row0.pt" for s in range(3)]  # Phase 1's 3 steps; Phase 2 aligns
    stamps = {p: p.stat().st_mtime_ns for p in key_dir.glob("*.pt")}
    reader = weights(train(cfg_for(setup, "tc_reader", checkpoint_every=100, teacher_cache=shared)))
    assert {p: p.stat().st_mtime_ns for p in key_dir.glob("*.pt")} == stamps  # read, not written again
    for other in (writer, reader):
        assert all(torch.equal(plain[k], other[k]) for k in plain)
    train(cfg_for(setup, "tc_seed1", checkpoint_every=100, teacher_cache=shared, seed=1))
    assert len(list((tmp_path / "teacher_logits").iterdir())) == 2  # another batch order: its own folder
    other = ck.load_pretrained(setup[2])  # another teacher: the same shapes, one weight changed
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    other_dir = ck.save_pretrained(other, tmp_path / "other_teacher", write_extra=ck.side_file_copier(setup[2]))
    train(cfg_for(setup, "tc_teacher2", checkpoint_every=100, teacher_cache=shared, teacher=str(other_dir)))
    assert len(list((tmp_path / "teacher_logits").iterdir())) == 3  # its own folder too
    # Phase 2 needs the teacher's attention outputs, which no file holds: it computes them even where
    # a file for its step lies there
    shutil.copy(key_dir / files[0], key_dir / "step-0000003-rank0-row0.pt")
    beside = weights(train(cfg_for(setup, "tc_phase2_file", checkpoint_every=100, teacher_cache=shared)))
    assert all(torch.equal(plain[k], beside[k]) for k in plain)
    (key_dir / "step-0000003-rank0-row0.pt").unlink()
    # a file that is not what the teacher computes changes the run: the reader really reads them
    first = key_dir / "step-0000000-rank0-row0.pt"
    torch.save(torch.zeros_like(torch.load(first, weights_only=True)), first)
    poisoned = weights(train(cfg_for(setup, "tc_poisoned", checkpoint_every=100, teacher_cache=shared)))
    assert any(not torch.equal(plain[k], poisoned[k]) for k in plain)


def test_logs_read_line_by_line_off_a_terminal(setup, capsys):
    """Off a terminal (a rule's log, a SLURM job) progress is timestamped lines, not one tqdm line
    joined by carriage returns; tiny losses keep their digits; checkpoints are announced."""
    train(cfg_for(setup, "logged", progress=True, print_every=2, checkpoint_every=3))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = [ln for ln in out.splitlines() if " step " in ln]
    assert len(lines) >= 3 and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", ln) for ln in lines)
    assert re.search(r"step 1/6 \[phase1\] loss -?\d\.\d+e-\d\d", out)  # ~±1e-9 (rounding), not 0.0000
    assert "left " in lines[-1] and "checkpoint saved:" in out and "finished:" in out


def test_changed_settings_retrain_cleanly(setup):
    """The same run directory under another config: the old run's checkpoints and metrics are set
    aside (kept), and the new run starts from step 1 with only its own rows."""
    train(cfg_for(setup, "other", checkpoint_every=2))
    changed = cfg_for(setup, "other", checkpoint_every=2, lr_model=5e-4)
    train(changed)
    out = setup[0] / "other"
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 7))
    kept = list((out / "superseded").iterdir())
    assert len(kept) == 1 and (kept[0] / "metrics.jsonl").is_file() and (kept[0] / "checkpoints").is_dir()
    assert json.loads((out / "train_config.json").read_text())["lr_model"] == 5e-4


@pytest.mark.parametrize("override,pattern", [
    ({"chunk_size": 0}, "`chunk_size`: must be an integer >= 1 or null"),
    ({"phases": [{"name": "p", "steps": 2, "alpha_start": -0.5}]}, r"`phases\[0\]\.alpha_start`: .*\[0, 1\]"),
    ({"kd_loops": "some"}, "`kd_loops`"),
    ({"lr_mdoel": 1e-3}, r"unknown field\(s\) \['lr_mdoel'\]"),
    ({"kd_temperature": 0}, "`kd_temperature`: must be > 0"),
    ({"lr_model": -1e-3}, "`lr_model`: must be a number >= 0"),
    ({"grad_clip": -1.0}, "`grad_clip`: must be a number > 0 or null"),
    ({"chunk_size": True}, "`chunk_size`: must be an integer >= 1 or null"),
    ({"device": "tpu"}, "`device`: must be auto, cpu or cuda"),
    ({"phases": [{"name": "p", "steps": "3"}]}, r"`phases\[0\]\.steps`: must be an integer >= 1, got '3'"),
])
def test_contradictory_configs_fail_before_compute(setup, override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        train(cfg_for(setup, "bad", **override))
    assert not (setup[0] / "bad").exists()


def test_every_bad_field_is_named_in_one_error(setup):
    cfg = cfg_for(setup, "bad_many", kd_temperature=0, lr_model=-1.0, device="tpu")
    cfg["data"]["seq_len"] = 1
    with pytest.raises(ConfigError) as err:
        train(cfg)
    lines = str(err.value).splitlines()
    assert len(lines) == 4 and all(line.startswith("train config field `") for line in lines), lines
    assert any("`data.seq_len`: must be an integer >= 2" in line for line in lines)


def test_model_mismatches_fail_before_compute(setup, tmp_path):
    root, paths, teacher, student = setup
    with pytest.raises(ConfigError, match="seq_len`: 4096 is longer than the model's max_position_embeddings=128"):
        train(cfg_for(setup, "bad", data={**cfg_for(setup, "x")["data"], "seq_len": 4096}))
    with pytest.raises(ConfigError, match="gate 'mean' has no parameters; set lr_gate: null"):
        mean_student = tiny_setup(tmp_path, gate="mean")[2]
        train(cfg_for(setup, "bad", student=str(mean_student)))
    other = tiny_setup(tmp_path / "wide", digits=4)
    cfgw = json.loads((other[1] / "config.json").read_text())
    cfgw["num_hidden_layers"] = 3
    (other[1] / "config.json").write_text(json.dumps(cfgw))
    with pytest.raises(ConfigError, match="teacher and student differ in num_hidden_layers: 3 vs 2"):
        train(cfg_for(setup, "bad", teacher=str(other[1])))
    with pytest.raises(ConfigError, match="convert the Ouro checkpoint first"):
        train(cfg_for(setup, "bad", student=str(teacher)))


def test_empty_and_malformed_datasets(setup, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    data = cfg_for(setup, "x")["data"]
    with pytest.raises(DataError, match="empty.jsonl: no records"):
        train(cfg_for(setup, "bad", data={**data, "sources": [{"kind": "jsonl", "path": str(empty)}]}))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [{"role": "user", "content": "1+1="}]}\n')
    with pytest.raises(DataError, match=r"broken.jsonl:1: record has no assistant message"):
        train(cfg_for(setup, "bad", data={**data, "sources": [{"kind": "jsonl", "path": str(broken)}]}))


def test_train_config_round_trips():
    raw = {"student": "s", "teacher": "t", "out_dir": "o",
           "data": {"sources": [], "tokenizer": "tok", "seq_len": 8},
           "phases": [{"name": "p1", "steps": 2, "alpha_start": 0.0}]}
    cfg = TrainConfig.from_dict(raw)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.phases[0].alpha(0) == 0.0 and cfg.phases[0].alpha(1) == 1.0


def test_mlflow_gets_each_learning_rate_and_the_step_as_its_axis(setup, tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = cfg_for(setup, "mlflow", phases=[{"name": "phase1", "steps": 3, "alpha_start": 1.0, "alpha_end": 1.0}],
                  mlflow={"experiment": "melt-lr", "tracking_uri": uri}, warmup_steps=2)
    train(cfg)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run, = client.search_runs([client.get_experiment_by_name("melt-lr").experiment_id])
    assert {"lr_model", "lr_gate", "kd", "loss"} <= set(run.data.metrics) and "step" not in run.data.metrics
    assert [m.step for m in client.get_metric_history(run.info.run_id, "kd")] == [1, 2, 3]
    # linear warmup over 2 steps, then each group's own rate
    for name, lr in (("lr_model", cfg["lr_model"]), ("lr_gate", cfg["lr_gate"])):
        history = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [m.value for m in history] == pytest.approx([lr / 2, lr, lr])
