"""Protects the claims' verdicts (workflow/scripts/verdicts.py): fed fabricated per-question
results for each case, a claim holds only on a clear win, fails on a clear loss, is inconclusive on
ties and overlaps, and is not measurable when the reference (the teacher) cannot do the task, so
a run where every model scores 0 judges nothing. The intervals hold what they promise when reruns
are two-valued (a student escapes its plateau or not), cells at 0 get an exact interval, views of
the same weights are compared seed by seed, and Holm corrects the report's family of claims."""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import rate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
import verdicts as v  # noqa: E402

FAILS, HOLDS, INCONCLUSIVE, NA, Cell, Family = v.FAILS, v.HOLDS, v.INCONCLUSIVE, v.NA, v.Cell, v.Family
all_of, beats, near, interval, verdict_of = v.all_of, v.beats, v.near, v.interval, v.verdict_of
cell_interval, clopper_pearson, difference_interval = v.cell_interval, v.clopper_pearson, v.difference_interval

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
    c = beats(a, b, reference)
    assert verdict_of(c).startswith(expected), (verdict_of(c), c and c.ci)


@pytest.mark.parametrize("student,expected", [(rate(0.98), HOLDS), (rate(0.5), FAILS), (rate(0.93), INCONCLUSIVE)])
def test_near(student, expected):
    c = near(student, rate(1.0), 5.0, TEACHER)
    assert c.verdict == expected, (c.verdict, c.ci)


def test_all_zero_near_is_not_measurable():
    assert near([0.0] * N, [0.0] * N, 5.0, [0.0] * N).verdict.startswith(NA)


def test_interval_and_combination():
    mean, lo, hi = difference_interval(rate(0.9), rate(0.2))
    assert lo < mean < hi and 60 < mean < 80
    assert difference_interval(rate(0.9), rate(0.2)) == (mean, lo, hi)
    assert all_of([HOLDS, HOLDS]) == HOLDS and all_of([HOLDS, FAILS]) == FAILS
    assert all_of([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE and all_of([]) == INCONCLUSIVE
    assert all_of([HOLDS, f"{NA} (x)"]).startswith(NA)
    with pytest.raises(ValueError, match="same questions"):
        difference_interval([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 replicates got 1 escape flags"):
        Cell([rate(0.5), rate(0.5)], (True,))


def test_the_interval_has_the_width_its_level_says():
    """2,000 questions half solved: the mean's standard error is 50 / sqrt(2000) = 1.12 points, so a
    95% interval is about +-2.19 points wide and a 90% one +-1.84 (t with 1,999 degrees of freedom)."""
    scores = rate(0.5, n=2000)
    for level, half in ((0.95, 1.96 * 50 / 2000 ** 0.5), (0.90, 1.645 * 50 / 2000 ** 0.5)):
        mean, lo, hi = interval(scores, level)
        assert mean == 50.0 and (hi - lo) / 2 == pytest.approx(half, abs=0.02), (level, lo, hi)



def test_a_cell_at_zero_gets_the_questions_exact_interval():
    """Every seed and question at 0: not [0, 0] but 0 of 64 questions' exact (Clopper-Pearson)
    bound, 5.6%; at 100, its mirror."""
    lo, hi = clopper_pearson(0, 64, 0.95)
    assert lo == 0 and hi == pytest.approx(0.0560, abs=1e-3)
    assert interval(np.zeros((2, 64))) == (0.0, 0.0, pytest.approx(100 * hi))
    assert interval(np.full((2, 64), 100.0))[1] == pytest.approx(100 * (1 - hi))


def test_two_seeds_that_both_escaped_cannot_rule_out_a_plateau():
    """Two students that both escaped and scored 90%: two draws of a two-valued outcome, so the
    escape rate is only known to be >= 11% (2 of 2, exact at 97.5%) and the cell's low end is near
    that share of 90; twenty such seeds narrow it to >= 60."""
    two = Cell([rate(0.9, 64)] * 2, (True, True))
    _, lo, hi = cell_interval(two)
    pi_lo = clopper_pearson(2, 2, 0.975)[0]
    assert pi_lo == pytest.approx(0.112, abs=1e-3) and lo < 12 and hi > 95
    _, lo20, _ = cell_interval(Cell([rate(0.9, 64)] * 20, (True,) * 20))
    assert lo20 > 60
    # as one mode (nothing trained), the same rows would be narrow: the flags are what widen it
    assert interval(two.scores)[1] > 80


def test_seeds_of_the_same_weights_are_paired():
    """The main run and its prefill variant: the seeds far apart (90%, 10%: one escaped) and the
    variant 10 questions behind in each. Paired seed by seed the 10-point gap is decided; two
    separately trained runs with those scores are not (their cells' own intervals span the seeds)."""
    exact = [rate(0.9, 100), rate(0.1, 100)]
    chunked = []
    for scores in exact:
        solved = [i for i, x in enumerate(scores) if x == 100.0][:10]
        chunked.append([0.0 if i in solved else x for i, x in enumerate(scores)])
    flags = (True, False)
    a, b = Cell(exact, flags, "melt-elementwise__full"), Cell(chunked, flags, "melt-elementwise__full")
    mean, lo, hi = difference_interval(a, b)
    assert mean == pytest.approx(10.0) and 0 < lo < 10 < hi < 20
    assert beats(a, b, TEACHER).verdict == HOLDS
    apart = beats(Cell(exact, flags, "run-a"), Cell(chunked, flags, "run-b"), TEACHER)
    assert apart.verdict == INCONCLUSIVE


def test_separately_trained_students_with_two_seeds_decide_nothing():
    """100% against 0% on two seeds each, flags set: the escape rates (2 of 2, 0 of 2) are exact
    intervals that overlap, so the gap is not decided, nor at eight seeds each (the unseen mode may
    score anything); at twelve it is."""
    for n, expected in ((2, INCONCLUSIVE), (8, INCONCLUSIVE), (12, HOLDS)):
        a = Cell(np.full((n, 64), 100.0), (True,) * n, "a")
        b = Cell(np.zeros((n, 64)), (False,) * n, "b")
        assert beats(a, b, TEACHER).verdict == expected, n


def test_a_mode_of_one_seed_bounds_nothing():
    """Seven seeds escaped, one stayed on the plateau: one draw says nothing of how far stuck seeds
    spread, so the stuck mode is only known to lie in [0, 100] and the lone seed's score, 2% or 30%,
    does not move the cell's bounds (taken as known, its questions' spread alone would narrow them)."""
    escaped = [rate(0.9, 64)] * 7
    cells = [Cell(escaped + [rate(p, 64)], (True,) * 7 + (False,)) for p in (0.02, 0.3)]
    (_, lo_a, hi_a), (_, lo_b, hi_b) = (cell_interval(c) for c in cells)
    assert (lo_a, hi_a) == pytest.approx((lo_b, hi_b))
    pi_lo, pi_hi = clopper_pearson(7, 8, 0.975)
    assert lo_a < pi_lo * 90 and hi_a > pi_hi * 90 + (1 - pi_hi) * 99


@pytest.mark.parametrize("seeds", [2, 4, 8])
def test_mixture_intervals_hold_the_truth_when_reruns_are_two_valued(seeds):
    """Simulated columns as the embedded default's training makes them: a seed escapes with
    probability pi (0.1 to 1), then scores ~N(88, 6) points, else ~N(1, 1); 64 questions solved or not
    at that accuracy. Each cell's 95% interval holds its true mean (pi * 88 + (1 - pi) * 1) in at
    least 95% of 300 draws for every pi at 2, 4 and 8 seeds, where the one-mode t interval of the
    same rows (no escape flags) misses two-valued cells far more often."""
    rng = np.random.default_rng(seeds)
    for pi in (0.1, 0.3, 0.5, 0.9, 1.0):
        truth = pi * 88 + (1 - pi) * 1
        hits = naive = 0
        for _ in range(300):
            esc = rng.random(seeds) < pi
            acc = np.where(esc, rng.normal(88, 6, seeds), rng.normal(1, 1, seeds)).clip(0, 100) / 100
            x = 100.0 * (rng.random((seeds, 64)) < acc[:, None])
            _, lo, hi = cell_interval(Cell(x, tuple(esc)))
            hits += lo <= truth <= hi
            _, lo, hi = interval(x)
            naive += lo <= truth <= hi
        assert hits / 300 >= 0.95, (pi, hits / 300)
        if 0.1 < pi < 0.9 and seeds == 2:
            assert naive / 300 < 0.9, (pi, naive / 300)


def test_holm_decides_less_than_each_claim_alone_and_stops_at_the_first_retained():
    """Five comparisons each just decided at 95% alone are not decided together (their p-values near
    0.03 > 0.05 / 5); a clear one stays decided; after the first retained, none is decided."""
    def just(gap):  # a paired comparison on 200 questions whose 95% interval just clears 0
        return Cell(np.asarray([rate(0.5 + gap)]), None), Cell(np.asarray([rate(0.5)]), None)

    alone = [beats(*just(0.11), TEACHER) for _ in range(5)]
    assert all(c.verdict == HOLDS for c in alone) and all(0.01 < c.p < 0.05 for c in alone), [c.p for c in alone]
    family = Family()
    clear = beats(Cell(np.asarray([rate(0.95)])), Cell(np.asarray([rate(0.1)])), TEACHER, family=family)
    borderline = [beats(*just(0.11), TEACHER, family=family) for _ in range(5)]
    family.correct()
    assert clear.verdict == HOLDS and clear.level == pytest.approx(1 - 0.05 / 6)
    assert all(c.verdict == INCONCLUSIVE for c in borderline)
    assert all(c.level == pytest.approx(1 - 0.05 / 5) for c in borderline)


def test_a_p_value_is_where_the_interval_leaves_the_threshold():
    c = beats(rate(0.62), rate(0.5), TEACHER)
    p = c.p
    assert 0 < p < 0.05
    assert difference_interval(c.a, c.b, 1 - p * 1.01)[1] > 0 > difference_interval(c.a, c.b, 1 - p * 0.99)[1]
    assert beats(rate(0.5), rate(0.5), TEACHER).p == 1.0  # a tie leaves at no level


@pytest.mark.parametrize("replicates", [2, 3, 5])
def test_one_mode_intervals_cover_a_rerun_as_often_as_they_say(replicates):
    """Reruns that move a score smoothly (~N(60, 20) points a replicate, 64 questions solved or not at
    that accuracy), the case of a one-mode cell: the 95% interval holds the true mean in 95-99.5% of
    1,000 runs at 2, 3 and 5 replicates (Satterthwaite's degrees of freedom uncapped: 86% at 2)."""
    rng = np.random.default_rng(replicates)
    expected = np.clip(rng.normal(60, 20, 200_000), 0, 100).mean()  # the clipped truth
    hits = 0
    for _ in range(1000):
        acc = np.clip(rng.normal(60, 20, replicates), 0, 100) / 100
        _, lo, hi = interval(100.0 * (rng.random((replicates, 64)) < acc[:, None]))
        hits += lo <= expected <= hi
    assert 0.95 <= hits / 1000 <= 0.995, hits / 1000


def _arms(a, b, questions=64):
    """Two arms of separately trained seeds: each seed's questions all at that seed's score."""
    return (Cell(np.repeat(np.asarray(a, float)[:, None], questions, 1), tuple(x > 50 for x in a), "a"),
            Cell(np.repeat(np.asarray(b, float)[:, None], questions, 1), tuple(x > 50 for x in b), "b"))


def test_the_permutation_test_enumerates_every_split():
    """Six seeds a side, every one of a above every one of b: of the C(12, 6) = 924 splits only the
    observed one is as extreme, so each one-sided p-value is 1/924 or 1; reversed, the other side."""
    a, b = _arms([90, 88, 95, 91, 87, 93], [1, 0, 3, 2, 0, 1])
    assert v.permutation_p(a, b) == pytest.approx((1 / 924, 1.0))
    assert v.permutation_p(b, a) == pytest.approx((1.0, 1 / 924))
    # a threshold is a shift of a: a - 89 is no longer above b everywhere
    assert v.permutation_p(a, b, 89.0)[0] > 0.05


@pytest.mark.parametrize("n,expected", [(2, INCONCLUSIVE), (5, INCONCLUSIVE), (6, HOLDS)])
def test_the_permutation_test_decides_from_six_seeds_a_side_under_holm(n, expected):
    """Complete separation, judged in a family of 17 like the report's: two and five seeds a side
    cannot be decided (smallest two-sided p 1/3 and 2/252 against 0.05/17), six can."""
    family = Family(test="permutation")
    c = beats(*_arms([90.0] * n, [1.0] * n), TEACHER, family=family)
    rest = [beats(rate(0.5), rate(0.5), TEACHER, family=family) for _ in range(16)]
    family.correct()
    assert c.verdict == expected and all(x.verdict == INCONCLUSIVE for x in rest)
    assert ("permutation p" in c.ci) and ("6 vs 6" in c.ci) == (n == 6)


def test_the_permutation_test_judges_both_directions_and_margins():
    """A clear loss fails; a near claim (a stays within 5 of b) holds when every seed of a is within
    5 of every seed of b, fails when every seed is 20 below; ties are inconclusive."""
    loss = beats(*_arms([1.0] * 6, [90.0] * 6), TEACHER)
    loss.test = "permutation"
    assert loss.verdict == FAILS
    for a, b, expected in (([89.0] * 6, [90.0] * 6, HOLDS), ([70.0] * 6, [90.0] * 6, FAILS),
                           ([90.0, 1.0] * 3, [1.0, 90.0] * 3, INCONCLUSIVE)):
        c = near(*_arms(a, b), 5.0, TEACHER)
        c.test = "permutation"
        assert c.verdict == expected, (a, b)


def test_the_permutation_test_leaves_paired_cells_to_the_paired_interval():
    """Views of the same weights, and untrained one-mode cells, keep the paired t interval."""
    x = np.asarray([rate(0.9, 64)] * 6)
    c = beats(Cell(x, None), Cell(x * 0, None), TEACHER)
    c.test = "permutation"
    assert not c.permutes and "CI" in c.ci and c.verdict == HOLDS
    with pytest.raises(ValueError, match="separate_test"):
        Family(test="bootstrap")


def test_a_shared_teacher_keeps_the_permutation_test_within_its_level():
    """Under the null (the arm does not matter) with each seed's teacher deciding both arms' escape
    (probability 0.5) and its score, six seeds a side: the two-sided test at 5% rejects in at most 5%
    of 2,000 draws, and a real difference (escape 0.9 against 0.1) is found most of the time."""
    rng = np.random.default_rng(0)

    def draw(pa, pb):
        teacher = rng.random(6)
        esc_a, esc_b = teacher < pa, teacher < pb  # one draw per seed decides both arms (shared teacher)
        score = lambda e: np.where(e, rng.normal(88, 4, 6), rng.normal(1, 1, 6)).clip(0, 100)  # noqa: E731
        return _arms(score(esc_a), score(esc_b), questions=1)

    null = [min(1.0, 2 * min(v.permutation_p(*draw(0.5, 0.5)))) <= 0.05 for _ in range(2000)]
    assert np.mean(null) <= 0.05, np.mean(null)
    power = [min(1.0, 2 * min(v.permutation_p(*draw(0.9, 0.1)))) <= 0.05 for _ in range(300)]
    assert np.mean(power) > 0.5, np.mean(power)
