"""Protects CI's eval check (.ci/check_evals.py): it fails when two checkpoints that must differ
gave the same completions to every question of a task (an eval that does not load the model it
names), not when a checkpoint's inference variants, the teacher's sharing caches or runs trained
briefly from the same conversion answer alike, and in its lenient form (the smoke run) passes when
the models differ on one task. On the embedded default's real results, a loader that kept the first
model of a job for every later one failed it on every task."""

import importlib.util
import json
from pathlib import Path

CHECK = Path(__file__).resolve().parents[1] / ".ci" / "check_evals.py"
spec = importlib.util.spec_from_file_location("check_evals", CHECK)
check_evals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_evals)


def write(outdir: Path, model: str, task: str, answers: list[str]) -> None:
    path = outdir / "v2" / "eval" / model / f"{task}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    details = [{"prompt": f"q{i}", "completions": [a]} for i, a in enumerate(answers)]
    path.write_text(json.dumps({"details": details}))


def test_two_checkpoints_that_answer_alike_fail(tmp_path):
    write(tmp_path, "ouro", "gsm8k", ["7", "12"])
    write(tmp_path, "melt-elementwise__full-seed0", "gsm8k", ["7", "13"])
    write(tmp_path, "melt-scalar__no_interp-seed0", "gsm8k", ["7", "13"])
    found = check_evals.problems(tmp_path)
    assert found == ["v2/eval/gsm8k: melt-elementwise__full-seed0 and melt-scalar__no_interp-seed0 gave the "
                     "same completions to every question"]


def test_variants_and_sharing_caches_may_answer_alike(tmp_path):
    for model in ("ouro", "ouro-last-loop", "ouro-first-loop+prompt"):
        write(tmp_path, model, "gsm8k", ["7", "12"])
    for model in ("melt-elementwise__full-seed0", "melt-elementwise__full-seed0@prefill-chunk16",
                  "melt-elementwise__full-seed0@window-34"):
        write(tmp_path, model, "gsm8k", ["7", "13"])
    assert check_evals.problems(tmp_path) == []


def test_runs_from_one_conversion_may_answer_alike(tmp_path):
    """The rehearsal trains a few steps at the paper's 8e-6: its recipes barely move the converted model."""
    for model in ("melt-untrained-seed0", "melt-elementwise__full-seed0", "melt-elementwise__no_align-seed0"):
        write(tmp_path, model, "gsm8k", ["7", "12"])
    write(tmp_path, "melt-scalar__no_align-seed0", "gsm8k", ["7", "13"])
    assert check_evals.problems(tmp_path) == []
    write(tmp_path, "melt-elementwise__full-seed1", "gsm8k", ["7", "12"])  # another seed: another conversion
    assert len(check_evals.problems(tmp_path)) == 3


def test_some_task_needs_models_that_differ_on_one_task(tmp_path):
    """The smoke run: greedy answers all empty, students barely trained; its sampled task must differ."""
    for model in ("ouro", "melt-elementwise__full-seed0", "melt-scalar__no_align-seed0"):
        write(tmp_path, model, "digit_sum", ["", ""])
        write(tmp_path, model, "digit_sum_sampled", ["1a", "b"])
    assert len(check_evals.problems(tmp_path, some_task=True)) == 2  # no task tells them apart
    write(tmp_path, "ouro", "digit_sum_sampled", ["1a", "c"])
    assert check_evals.problems(tmp_path, some_task=True) == []
    assert len(check_evals.problems(tmp_path)) == 4  # the strict form: 3 pairs alike on digit_sum, 1 on sampled


def test_nothing_compared_fails(tmp_path):
    write(tmp_path, "ouro", "gsm8k", ["7"])
    write(tmp_path, "ouro-last-loop", "gsm8k", ["7"])
    assert check_evals.problems(tmp_path) == [f"no task evaluated on two checkpoints or more under {tmp_path}"]
    assert check_evals.problems(tmp_path, some_task=True) == ["v2/eval/gsm8k: all 2 models gave the same "
                                                              "completions to every question"]
