"""Protects the claims' verdicts (workflow/scripts/verdicts.py): fed fabricated per-question
results for each case, a claim holds only on a clear win, fails on a clear loss, is inconclusive on
ties and overlaps, and is not measurable when the reference (the teacher) cannot do the task, so
a run where every model scores 0 judges nothing."""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
from verdicts import FAILS, HOLDS, INCONCLUSIVE, NA, all_of, beats, interval, near, paired_interval, pooled_spread  # noqa: E402

N = 200
TEACHER = [100.0] * N


@pytest.mark.parametrize("a,b,reference,expected", [
    ([0.0] * N, [0.0] * N, [0.0] * N, NA),              # everything zero: the teacher fails too
    (rate(0.9), rate(0.2), [10.0] * N, NA),              # a clear gap, but the teacher is below the floor
    (rate(0.5), rate(0.5), TEACHER, INCONCLUSIVE),       # a tie is not a win
    (rate(0.9), rate(0.2), TEACHER, HOLDS),              # clear win
    (rate(0.2), rate(0.9), TEACHER, FAILS),              # clear loss
    (rate(0.52), rate(0.48), TEACHER, INCONCLUSIVE),     # overlapping intervals
    (None, rate(0.5), TEACHER, NA),                      # missing results
])
def test_beats(a, b, reference, expected):
    verdict, interval = beats(a, b, reference)
    assert verdict.startswith(expected), (verdict, interval)


@pytest.mark.parametrize("student,expected", [(rate(0.98), HOLDS), (rate(0.5), FAILS), (rate(0.93), INCONCLUSIVE)])
def test_near(student, expected):
    verdict, interval = near(student, rate(1.0), 5.0, TEACHER)
    assert verdict == expected, (verdict, interval)


def test_all_zero_near_is_not_measurable():
    assert near([0.0] * N, [0.0] * N, 5.0, [0.0] * N)[0].startswith(NA)


def test_interval_and_combination():
    mean, lo, hi = paired_interval(rate(0.9), rate(0.2))
    assert lo < mean < hi and 60 < mean < 80
    assert paired_interval(rate(0.9), rate(0.2)) == (mean, lo, hi)  # seeded: reproducible
    assert all_of([HOLDS, HOLDS]) == HOLDS and all_of([HOLDS, FAILS]) == FAILS
    assert all_of([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE and all_of([]) == INCONCLUSIVE
    assert all_of([HOLDS, f"{NA} (x)"]).startswith(NA)
    with pytest.raises(ValueError, match="same non-empty questions"):
        paired_interval([1.0], [1.0, 2.0])


def test_the_interval_has_the_width_its_level_says():
    """2,000 questions half solved: the mean's standard error is 50 / sqrt(2000) = 1.12 points, so a
    95% interval is about +-2.19 points wide and a 90% one +-1.84 (t with 1,999 degrees of freedom)."""
    scores = rate(0.5, n=2000)
    for level, half in ((0.95, 1.96 * 50 / 2000 ** 0.5), (0.90, 1.645 * 50 / 2000 ** 0.5)):
        mean, lo, hi = paired_interval(scores, [0.0] * 2000, level)
        assert mean == 50.0 and (hi - lo) / 2 == pytest.approx(half, abs=0.02), (level, lo, hi)


@pytest.mark.parametrize("replicates", [2, 3, 5])
def test_intervals_cover_a_rerun_as_often_as_they_say(replicates):
    """Simulated reruns: each replicate (a teacher and its student) scores the same 64 questions, its
    accuracy drawn around the truth with a spread of 20 points between replicates (what a rerun moves)
    and each question solved or not at that accuracy. The 95% interval must hold the true mean in
    ~95% of 2,000 runs at 2, 3 and 5 replicates (measured 98.4, 98.3, 96.2%: a little wide, as the
    questions' spread is counted on top of the replicates', which already hold it; Welch-Satterthwaite's
    degrees of freedom covered 87% at 2), and two runs' means must land in each other's intervals at
    least the ~83% of two calibrated runs (measured 98, 95, 89%)."""
    rng = np.random.default_rng(replicates)
    truth, spread, n, runs = 60.0, 20.0, 64, 2000

    def run():
        acc = np.clip(rng.normal(truth, spread, replicates), 0, 100) / 100
        return 100.0 * (rng.random((replicates, n)) < acc[:, None])

    expected = np.clip(rng.normal(truth, spread, 200_000), 0, 100).mean()  # the clipped truth
    hits, cross = 0, 0
    for _ in range(runs):
        (m, lo, hi), (m2, lo2, hi2) = interval(run()), interval(run())
        hits += int(lo <= expected <= hi)
        cross += int(lo <= m2 <= hi) + int(lo2 <= m <= hi2)
    assert 0.93 <= hits / runs <= 0.99, hits / runs
    assert cross / (2 * runs) >= 0.83, cross / (2 * runs)


def test_replicates_that_disagree_widen_the_interval_by_students_t():
    """Two replicates at 90% and 10% of the same questions: the spread between them (their mean's
    standard error 40 points) with 1 degree of freedom (t = 12.7) spans every possible score, where
    the questions alone would give a few points; two that agree keep it narrower."""
    mean, lo, hi = interval([rate(0.9), rate(0.1)])
    assert mean == pytest.approx(50.0, abs=1) and (lo, hi) == (0.0, 100.0)
    agree = interval([rate(0.9), rate(0.9)])
    assert agree[1] > 50


def test_interval_spans_seeds():
    """Three seeds that disagree (90%, 10%, 90%) make a wide interval that one seed's questions
    alone would hide: against a constant 50% the claim is inconclusive, not a win."""
    seeds = [rate(0.9), rate(0.1), rate(0.9)]
    mean, lo, hi = paired_interval(seeds, rate(0.5))
    assert mean == pytest.approx(100 * (0.9 + 0.1 + 0.9) / 3 - 50, abs=1)
    one_lo = paired_interval(seeds[0], rate(0.5))[1]
    assert lo < 0 < hi and one_lo > 30
    assert beats(seeds, rate(0.5), TEACHER)[0] == INCONCLUSIVE
    # seeds that agree keep a narrow interval; paired seeds (same count) cancel a shared shift
    agree = [rate(0.9)] * 3
    assert beats(agree, [rate(0.2)] * 3, [TEACHER])[0] == HOLDS
    with pytest.raises(ValueError, match="same non-empty questions"):
        paired_interval([rate(0.9)] * 3, [rate(0.5, n=N - 1)])


def test_seeds_are_paired_between_models():
    """Two models trained on the same three seeds, the seeds far apart (90%, 50%, 10%) and model a
    solving 10 more questions than b in every seed: drawn together, the seeds cancel and the 5-point
    gain holds; drawn apart, the seed spread (+-80 points) would swamp it."""
    b = [rate(p) for p in (0.9, 0.5, 0.1)]
    a = []
    for scores in b:
        unsolved = [i for i, x in enumerate(scores) if x == 0.0][:10]
        a.append([100.0 if i in unsolved else x for i, x in enumerate(scores)])
    mean, lo, hi = paired_interval(a, b)
    assert mean == pytest.approx(5.0) and 0 < lo < 5 < hi < 10
    assert beats(a, b, TEACHER)[0] == HOLDS
    # the teacher has one row: its seeds cannot be paired and are drawn on their own
    assert beats([rate(0.9)] * 3, rate(0.2), TEACHER)[0] == HOLDS


def test_a_pooled_spread_covers_reruns_and_resolves_what_every_replicate_shows():
    """A column of ten cells (true accuracies 98% down to 0%), each rerun moving a cell's score with
    variance k p (1 - p) (k = 0.05: +-11 points at 50%), two replicates, 64 questions. Fitted over the
    column (verdicts.pooled_spread), the 95% intervals hold the truth in 93-99% of 300 simulated tables
    (measured 96.8%), and a 90% model beats a 0% one in every table, where each cell's own two
    replicates (t = 12.7) decide it in ~80%. A cell whose own replicates lie further apart than the
    column's fit (90% and 0%) keeps its own spread."""
    rng = np.random.default_rng(7)
    n, k, truths = 64, 0.05, [98, 90, 75, 60, 45, 35, 20, 8, 0, 0]

    def table():
        cells = []
        for p in truths:
            acc = np.clip(rng.normal(p, (k * p * (100 - p)) ** 0.5, 2), 0, 100) / 100
            cells.append(100.0 * (rng.random((2, n)) < acc[:, None]))
        return cells

    hits = informative = decided = own = 0
    for _ in range(300):
        cells = table()
        spread = pooled_spread(cells)
        for p, x in zip(truths, cells):
            _, lo, hi = interval(x, spread=spread)
            informative += int(lo < hi)
            hits += int(lo < hi and lo <= p <= hi)
        decided += beats(cells[1], cells[8], TEACHER, spread=spread)[0] == HOLDS
        own += beats(cells[1], cells[8], TEACHER)[0] == HOLDS
    assert 0.93 <= hits / informative <= 0.99, hits / informative
    assert decided == 300 and own < 280, (decided, own)
    split = np.asarray([rate(0.9), rate(0.0)])
    _, lo, hi = interval(split, spread=pooled_spread([split] + table() + table() + table()))  # 31 cells
    assert lo < 10 and hi > 80, (lo, hi)
