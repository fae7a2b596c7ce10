"""Protects claims.md's verdicts that are not plain accuracy comparisons
(workflow/scripts/claims.py), fed fabricated results: the "~10x slower" training claim against a
stated margin around the paper's 0.105x, and the early-exit claim corrected for the number of rules
the sweep tried (a rule that holds on its own 95% interval by luck of many tries must not)."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
import claims  # noqa: E402
from verdicts import FAILS, HOLDS, INCONCLUSIVE  # noqa: E402


@pytest.mark.parametrize("rounds,expected", [
    ([0.105] * 5, HOLDS), ([0.07, 0.09, 0.2, 0.1, 0.12], HOLDS), ([0.34, 0.3, 0.5, 0.25, 0.4], FAILS),
    ([0.03, 0.04, 0.02, 0.05, 0.03], FAILS), ([1.0] * 5, FAILS), ([0.14, 0.26, 0.18, 0.2, 0.22], INCONCLUSIVE),
    ([0.04, 0.06, 0.05, 0.07, 0.06], INCONCLUSIVE)])
def test_training_slowdown_is_judged_on_its_rounds_against_the_papers_ratio(rounds, expected):
    """profiler.train_throughput's rows (as gather writes them: the rounds as a JSON list); the
    slowest MELT run decides, every round inside the band holds, every round outside fails."""
    median = sorted(rounds)[2]
    tt = pd.DataFrame({"model": ["ouro-parallel", "melt-C16", "melt-C64"],
                       "ratio_to_ouro": [1.0, median, median + 0.3],
                       "ratio_rounds": [json.dumps([1.0] * 5), json.dumps(rounds),
                                        json.dumps([x + 0.3 for x in rounds])]})
    (_, evidence, verdict), = claims.train_speed_claim(tt)
    assert verdict.startswith(expected), verdict
    assert f"{median:.2f}x" in evidence
    assert f"melt-C16: 5 rounds in turn, {min(rounds):.2f}-{max(rounds):.2f}x" in evidence


def sweep(gap_questions: int, n_rules: int, n: int = 400) -> pd.DataFrame:
    """MELT's every-loop run solves every question; each early-exit rule loses ``gap_questions``."""
    full = [100.0] * n
    rows = [{"model": "melt-elementwise__full-seed0", "variant": "converted", "rule": "all loops", "loop_fraction": 1.0,
             "per_question": json.dumps(full), "accuracy": 100.0, "mean_loops": 4.0, "loops": 4, "speedup": 1.0}]
    for k in range(n_rules):
        scores = [0.0 if (i + 7 * k) % n < gap_questions else 100.0 for i in range(n)]
        rows.append({"model": "melt-elementwise__full-seed0", "variant": "converted", "rule": f"q={k}",
                     "loop_fraction": 0.5, "per_question": json.dumps(scores), "accuracy": sum(scores) / n,
                     "mean_loops": 2.0, "loops": 4, "speedup": 1.8})
    return pd.DataFrame(rows)


class R:
    def __init__(self, df):
        self.early_exit = df


def test_early_exit_holds_on_a_clear_margin_and_fails_on_a_clear_loss():
    (_, _, verdict), = claims.early_exit_claims(R(sweep(gap_questions=4, n_rules=3)))  # 1 pt of a 5 pt margin
    assert verdict == HOLDS
    (_, _, verdict), = claims.early_exit_claims(R(sweep(gap_questions=60, n_rules=3)))  # 15 pts lost
    assert verdict == FAILS


def test_early_exit_is_corrected_for_the_rules_tried():
    """A gap whose 95% interval just clears the margin holds for one rule tried, not among twenty."""
    one = claims.early_exit_claims(R(sweep(gap_questions=12, n_rules=1)))[0]
    many = claims.early_exit_claims(R(sweep(gap_questions=12, n_rules=20)))[0]
    assert one[2] == HOLDS and "1 rules tried" in one[0]
    assert many[2] == INCONCLUSIVE and "20 rules tried" in many[0] and "99.75% interval" in many[0]


@pytest.mark.parametrize("melt_rounds,expected", [([8.0, 8.5, 9.0], HOLDS), ([14.0, 15.0, 16.0], FAILS),
                                                  ([12.0, 13.0, 14.5], INCONCLUSIVE)])
def test_decode_speed_is_judged_on_the_rounds_interleaved(melt_rounds, expected):
    """Ouro decodes 13.5 tok/s in every round: MELT always under it holds, always over it fails,
    rounds on both sides are not judged either way."""
    speed = pd.DataFrame({"model": ["ouro", "melt", "ouro"], "batch": [1, 1, 1], "context": [128, 128, 512],
                          "decode_tok_s_rounds": [json.dumps([13.5] * 3), json.dumps(melt_rounds), "[1.0]"]})
    memory = pd.DataFrame({"shape": ["ouro-1.4b"]})
    (_, evidence, verdict), = claims.decode_speed_claim(speed, memory, "cpu-mid")
    assert verdict.startswith(expected) and "3 rounds in turn" in evidence and "context 128" in evidence
