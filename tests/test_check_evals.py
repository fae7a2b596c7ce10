"""Protects CI's eval check (.ci/check_evals.py): it fails when every model of a task gave the same
completions (an eval that does not load the model it names), and passes when they differ."""

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


def test_models_that_answer_alike_fail(tmp_path):
    for model in ("ouro", "melt-elementwise__full-seed0", "melt-scalar__no_interp-seed0"):
        write(tmp_path, model, "gsm8k", ["7", "12"])
    write(tmp_path, "ouro", "math500", ["1", "2"])
    write(tmp_path, "melt-elementwise__full-seed0", "math500", ["1", "3"])
    found = check_evals.problems(tmp_path)
    assert len(found) == 1 and found[0].startswith("v2/eval/gsm8k: all 3 models"), found


def test_models_that_differ_anywhere_pass(tmp_path):
    write(tmp_path, "ouro", "gsm8k", ["7", "12"])
    write(tmp_path, "melt-elementwise__full-seed0", "gsm8k", ["7", "13"])
    write(tmp_path, "ouro", "aime24", ["5"])  # one model alone says nothing either way
    assert check_evals.problems(tmp_path) == []


def test_no_results_fail(tmp_path):
    assert check_evals.problems(tmp_path) == [f"no eval results under {tmp_path}"]
