"""The embedded teacher's stopping rule: the dev halves (the second half of each held-out split;
the evals report the first) are checked every `check_every` steps, training stops once every split
reaches `stop_at`, the teacher is the checked state that scored best, and a teacher below
`min_exact_match` fails with nothing written."""

import math

import pytest
import torch
from safetensors.torch import load_file

import melt_core.training.pretrain as pt
from melt_core.data import load_tokenizer, make_digit_sum_task, read_jsonl
from melt_core.tracking import NullLogger


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    return make_digit_sum_task(root / "data", digits=3, n_train=200, n_test=8, seed=0,
                               chain={"n_train": 50, "n_test": 6, "min_terms": 2, "max_terms": 3})


def config(task, out, **over):
    over = {"min_exact_match": 0.0, **over}
    return pt.PretrainConfig(train_file=str(task["train"]), test_file=str(task["test"]),
                             tokenizer=str(task["tokenizer"]), out_dir=str(out),
                             extra_tests={"chain": str(task["test_chain"])}, hidden_size=16, intermediate_size=32,
                             total_ut_steps=2, steps=40, batch_size=4, seq_len=32, warmup_steps=2,
                             check_every=10, check_from=10, progress=False, **over)


def scripted(monkeypatch, scores_by_check):
    """Replace the greedy check by scripted scores; record what it was given and the state it saw."""
    seen = []

    def fake(model, dev, tok):
        i = len(seen)
        seen.append({"dev": dev, "state": {k: v.clone() for k, v in model.state_dict().items()}})
        return {k: scores_by_check[i][j] for j, k in enumerate(dev)}

    monkeypatch.setattr(pt, "_check", fake)
    return seen


def test_the_teacher_is_the_best_checked_state(task, tmp_path, monkeypatch):
    seen = scripted(monkeypatch, [(0.5, 0.5), (1.0, 0.9), (1.0, 0.2), (0.3, 0.1)])  # steps 10, 20, 30, 40
    report = pt.pretrain(config(task, tmp_path / "t"))
    assert len(seen) == 4 and report["steps"] == 20 and report["max_steps"] == 40
    assert report["exact_match"] == 1.0 and report["chain/exact_match"] == 0.9
    saved = load_file(str(tmp_path / "t" / "model.safetensors"))
    kept, last = seen[1]["state"], seen[3]["state"]
    exit_gate = {k for k in saved if "early_exit_gate" in k}  # refit after the choice
    assert all(torch.equal(saved[k], kept[k]) for k in saved if k not in exit_gate)
    assert any(not torch.equal(saved[k], last[k]) for k in saved if k not in exit_gate)
    # the dev halves: the second half of each held-out file, never the half the evals report
    test, chains = read_jsonl(task["test"]), read_jsonl(task["test_chain"])
    assert seen[0]["dev"] == {"exact_match": test[4:], "chain/exact_match": chains[3:]}


def test_training_stops_once_every_split_reaches_stop_at(task, tmp_path, monkeypatch):
    seen = scripted(monkeypatch, [(0.99, 0.5), (0.96, 0.95), (1.0, 1.0), (1.0, 1.0)])
    report = pt.pretrain(config(task, tmp_path / "t", stop_at=0.95))
    assert len(seen) == 2 and report["steps"] == 20


def test_a_teacher_below_the_bar_fails_and_writes_nothing(task, tmp_path, monkeypatch):
    scripted(monkeypatch, [(1.0, 0.5), (1.0, 0.8), (1.0, 0.7), (1.0, 0.6)])
    with pytest.raises(RuntimeError, match=r"chain/exact_match.*0\.8.*need >= 0\.9.*raise source\.pretrain\.steps"):
        pt.pretrain(config(task, tmp_path / "t", min_exact_match=0.9))
    assert not (tmp_path / "t").exists()


def test_the_loss_averages_the_loops_and_the_learning_rate_warms_up_then_decays(task, tmp_path, monkeypatch):
    """At initialisation (weights ~ N(0, 0.02^2)) every loop's logits are near zero, so each loop's
    cross-entropy is ln(vocab) and so is their mean; the learning rate rises linearly over the
    warm-up, then falls along a cosine to near zero at the last step."""
    scripted(monkeypatch, [(1.0, 1.0)] * 4)
    logged = {}

    class Recorder(NullLogger):
        def log_metrics(self, metrics, step=None):
            if "pretrain/loss" in metrics:
                logged[step] = metrics

    cfg = config(task, tmp_path / "t")
    pt.pretrain(cfg, logger=Recorder())
    assert sorted(logged) == [0, 10, 20, 30, 39]
    assert logged[0]["pretrain/loss"] == pytest.approx(math.log(len(load_tokenizer(cfg.tokenizer))), rel=0.02)
    lrs = [logged[s]["pretrain/lr"] for s in sorted(logged)]
    assert lrs[0] == pytest.approx(cfg.lr / cfg.warmup_steps)
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:])) and lrs[1] <= cfg.lr and lrs[-1] < 0.01 * cfg.lr
