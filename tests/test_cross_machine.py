"""benchmarks/cross_machine.py decides "bitwise identical" from ``artifacts``: what a run computed,
with the machine's timings left out. These tests hold it to that on the files' real formats (an
eval JSON and an early-exit sweep as the rules write them): a timing may differ, a score may not."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cross_machine  # noqa: E402


def _run(tmp: Path, name: str, seconds: float, exit_scores: list[float], weight_bytes: bytes = b"w") -> Path:
    out = tmp / name
    (out / "checkpoints" / "ouro").mkdir(parents=True)
    (out / "checkpoints" / "ouro" / "model.safetensors").write_bytes(weight_bytes)
    (out / "eval" / "m").mkdir(parents=True)
    (out / "eval" / "m" / "digit_sum.json").write_text(json.dumps({
        "model": {"name": "m"}, "task": {"name": "digit_sum"}, "seed": 0, "backend": "lighteval",
        "metrics": {"pass@1": 0.5}, "n_questions": 2, "generated_tokens": 34, "mean_loops": 4.0,
        "seconds": seconds, "shards": None,
        "details": [{"task": "digit_sum", "prompt": "1+2", "gold": "3", "completions": ["3"], "correct": [True],
                     "generated_tokens": [2], "loops": [4.0], "scores": {"pass@1": 1.0}}]}))
    (out / "early_exit").mkdir()
    row = {"model": "m", "variant": "refit gate", "rule": {"q": 0.5, "exit_at_loop": None, "min_loops": 1},
           "label": "q=0.5", "metric": "pass@1", "loops": 4, "generated_tokens": 34}
    (out / "early_exit" / "m.json").write_text(json.dumps({
        "model": "m", "task": "digit_sum", "batch_size": 128, "device": "cpu",
        "rows": [{**row, "accuracy": sum(exit_scores) / len(exit_scores), "mean_loops": 2.5,
                  "seconds": seconds, "tokens_per_s": 34 / seconds, "per_question": exit_scores}]}))
    return out


def _differ(a: Path, b: Path) -> list[str]:
    fa, fb = cross_machine.artifacts(a), cross_machine.artifacts(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


def test_timings_alone_do_not_make_runs_differ(tmp_path):
    a = _run(tmp_path, "A", 1.0, [100.0, 0.0])
    b = _run(tmp_path, "B", 7.5, [100.0, 0.0])
    assert len(cross_machine.artifacts(a)) == 3
    assert _differ(a, b) == []


def test_an_early_exit_score_or_a_weight_that_differs_is_reported(tmp_path):
    a = _run(tmp_path, "A", 1.0, [100.0, 0.0])
    assert _differ(a, _run(tmp_path, "B", 1.0, [0.0, 100.0])) == ["early_exit/m.json"]
    assert _differ(a, _run(tmp_path, "C", 1.0, [100.0, 0.0], b"v")) == ["checkpoints/ouro/model.safetensors"]


def _claims(tmp: Path, name: str, verdicts: dict[str, str]) -> Path:
    """A claims.md as the claims rule writes it."""
    out = tmp / name
    out.mkdir()
    lines = ["# Paper claims checked against our runs (embedded)", "", "| claim | evidence (ours) | verdict |",
             "|---|---|---|"] + [f"| {c} | gap +1.0 pts [95% CI -0.5, +2.5] | **{v}** |" for c, v in verdicts.items()]
    (out / "claims.md").write_text("\n".join(lines) + "\n")
    return out


def test_a_flip_is_holds_against_does_not_hold_and_nothing_else(tmp_path):
    """Read off claims.md in its real format: holds <-> does not hold counts (with or without a
    reason in brackets); a verdict decided on one side only is listed, not counted; two undecided
    verdicts are neither; timing claims (the machine's speed) never count."""
    a = {"gate": "holds", "recipe": "does not hold", "near": "holds", "window": "inconclusive",
         "chunking": "not measurable (the model compared with already scores 0, so no drop can show)",
         "sharing": "holds", "MELT decodes slower than Ouro at batch 1": "holds", "exit": "inconclusive"}
    b = {**a, "gate": "does not hold", "recipe": "holds", "near": "inconclusive",
         "chunking": "inconclusive", "MELT decodes slower than Ouro at batch 1": "does not hold (our decode path)",
         "exit": "does not hold (a reason)"}
    del b["sharing"]
    rows, flips, one_sided = cross_machine.compare_verdicts(cross_machine.verdicts(_claims(tmp_path, "A", a)),
                                                            cross_machine.verdicts(_claims(tmp_path, "B", b)))
    assert sorted(flips) == ["gate", "recipe"]
    assert sorted(one_sided) == ["exit", "near", "sharing"]
    assert len(rows) == len(a) and rows[-1].startswith("| MELT decodes slower")  # timing claims last
    assert cross_machine.compare_verdicts(cross_machine.verdicts(_claims(tmp_path, "C", a)), a)[1:] == ([], [])
