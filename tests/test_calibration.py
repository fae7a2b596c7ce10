"""benchmarks/calibration.py on embedded_summary's real format: what it counts as covered, disjoint
and flipped, and that point intervals (a model at 0 or 100 everywhere) are counted apart."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from calibration import compare, render  # noqa: E402

HEAD = ("| model | MATH-500 (digit_sum/pass@1) [95% CI] (seeds) | long answers (chain_sum/pass@1) [95% CI] (seeds) |\n"
        "|---|---:|---:|\n")


def run(rows: list[str], verdicts: list[str]) -> str:
    return "Run: x\n\n" + HEAD + "\n".join(rows) + "\n\nVerdicts of claims.md:\n\n" + "\n".join(verdicts) + "\n"


A = run(["| Ouro teacher | 100.0 [100.0, 100.0] | 92.2 [85.9, 98.4] |",
         "| MELT main | 86.7 [71.9, 98.4] (96.1, 77.3) | 50.0 [35.9, 64.8] (56.2, 43.8) |",
         "| MELT mean | 9.8 [3.9, 16.4] (7.0, 12.5) | 0.0 [0.0, 0.0] (0.0, 0.0) |"],
        ["- The gate wins (3 rules tried): **holds**", "- Memory: **holds**", "- Window: **inconclusive**"])
B = run(["| Ouro teacher | 100.0 [100.0, 100.0] | 98.4 [95.3, 100.0] |",
         "| MELT main | 90.2 [84.4, 95.3] (88.3, 92.2) | 39.1 [23.4, 54.7] (46.9, 31.2) |",
         "| MELT mean | 51.6 [32.8, 70.3] (50.0, 53.1) | 0.0 [0.0, 0.0] (0.0, 0.0) |"],
        ["- The gate wins (5 rules tried): **does not hold**", "- Memory: **holds**",
         "- Window: **does not hold**"])


def test_coverage_disjoint_cells_and_flips_on_the_summary_format():
    r = compare(A, B)
    assert r["cells"] == 6 and r["points"] == 2 and r["points equal"] == 2 and r["informative"] == 4
    # the teacher's long answers: A's 92.2 outside B's [95.3, 100], B's 98.4 inside A's (edges count);
    # the main run: inside both ways on both columns; the mean gate: outside both ways (disjoint)
    assert (r["a_in_b"], r["b_in_a"]) == (2, 3)
    assert r["coverage"] == pytest.approx(5 / 8)
    assert [k for k, _, _ in r["disjoint"]] == [("MELT mean", "MATH-500")]
    assert r["flips"] == ["The gate wins (# rules tried)"]  # the same claim, whatever its counts
    assert r["one_side"] == [("Window", "inconclusive", "does not hold")]
    text = render(r, "a", "b")
    assert text.rstrip().splitlines()[-2] == "verdict flips: 1" and "coverage 62%" in text


def test_tables_with_nothing_in_common_are_refused():
    with pytest.raises(SystemExit, match="no table cell"):
        compare(A, "nothing here\n")
