"""Protects the cost plan (melt_core/plan.py): its arithmetic, and that it flags the jobs a cluster
user must not submit as they are (over the runtime limit, or not fitting one sequence)."""

from pathlib import Path

import pytest
import yaml

from melt_core.config import ModelConfig
from melt_core.plan import plan, render, weights_gb

ROOT = Path(__file__).resolve().parents[1]


def unsharded_paper():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    for task in cfg["eval"]["tasks"].values():
        task.pop("shards", None)
    return cfg


def test_paper_plan_arithmetic_and_flags():
    cfg = unsharded_paper()
    jobs, a = plan(cfg, ["ouro", "melt-elementwise__full"], [("elementwise", "phase1", 500)])
    train = next(j for j in jobs if j.stage == "train")
    assert train.tokens == 500 * 32 * 10_000 and train.gpus == 8
    assert train.gpu_hours == pytest.approx(train.tokens / a["train_tok_s_per_gpu"] / 3600)
    aime = {j.name: j for j in jobs if j.name.endswith(" aime24")}
    ouro, melt = aime["ouro aime24"], aime["melt-elementwise__full aime24"]
    assert ouro.tokens == 30 * 16 * 0.5 * 32768
    # Ouro's 32K-token cache (0.786 MB/token) fits 2 sequences in 80 GB, MELT's (1/4 of it) 11
    assert ouro.note.startswith("batch 2") and melt.note.startswith("batch 11")
    assert ouro.peak_gb <= 80 and melt.peak_gb <= 80
    assert weights_gb(ModelConfig.from_name("ouro-1.4b")) == pytest.approx(2.87, abs=0.05)
    assert "over the 24 h limit" in ouro.note
    text = render(jobs, a, cfg["name"])
    assert "| ouro aime24 |" in text and "GPU-hours" in text


def test_a_sequence_that_cannot_fit_is_flagged():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    cfg["eval"]["tasks"] = {"aime24": {"lighteval": "aime/aime24", "max_new_tokens": 200_000}}
    jobs, _ = plan(cfg, ["ouro"], [])
    assert jobs[0].note.startswith("batch 0; DOES NOT FIT")


def test_shards_split_a_job_under_the_limit_at_the_same_cost():
    """The plan names the shards a job needs; with them, each shard's job fits the limit and the
    GPU-hours stay the same."""
    cfg = unsharded_paper()
    cfg["eval"]["tasks"] = {"aime24": cfg["eval"]["tasks"]["aime24"]}
    (whole,), _ = plan(cfg, ["ouro"], [])
    need = int(whole.note.rsplit("set shards: ", 1)[1])
    assert need > 1 and whole.hours > 24
    cfg["eval"]["tasks"] = {"aime24": {**cfg["eval"]["tasks"]["aime24"], "shards": need}}
    (split,), a = plan(cfg, ["ouro"], [])
    assert split.hours <= 24 and "limit" not in split.note and split.count == need
    assert split.gpu_hours == pytest.approx(whole.gpu_hours)
    assert f"({need} shards)" in render([split], a, "x") and f"## eval: {need} jobs" in render([split], a, "x")


def test_the_paper_config_shards_every_eval_job_under_the_limit():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    models = ["ouro", "ouro-first-loop", "melt-elementwise__full", "dense-qwen3-1.7b"]
    jobs, _ = plan(cfg, models, [], ["ouro", "melt-elementwise__full"])
    over = [j.name for j in jobs if "limit" in j.note]
    assert not over, over
    unsharded, _ = plan(unsharded_paper(), models, [])
    assert sum(j.gpu_hours for j in jobs if j.stage == "eval") == pytest.approx(sum(j.gpu_hours for j in unsharded))
