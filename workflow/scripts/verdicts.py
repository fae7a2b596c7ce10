"""Verdicts on accuracy claims that can fail and can abstain.

Each comparison uses per-question scores (percent; a question's score is the mean over its
samples) of two models on the same questions, one row per replicate (a training seed: with
``source.pretrain.per_seed`` each seed pretrains its own teacher too, so a row is an independent
rerun of everything trained), and a 95% interval for their difference with two parts: how far the
replicates' means spread (a rerun's variation: paired between the models where both have the same
replicates, each model's own where one has a single row, e.g. a downloaded teacher), and how far
the questions' spread moves the mean (question sampling). Both are added as variances and the
interval is Student's t at the fewest degrees of freedom of the two. The replicates' spread is the
cell's own (replicates - 1 degrees of freedom: t = 12.7 with two) or, where the report passes a
column's ``Spread``, the larger of the cell's own and the column's pooled model (as many degrees of
freedom as the column's cells give). A claim

* **holds** when the whole interval lies on the claimed side (for "stays near": inside the margin);
* **does not hold** when the whole interval lies on the other side;
* is **inconclusive** otherwise (ties and overlaps included), with the interval shown;
* is **not measurable** when data are missing or the reference model (the Ouro teacher) scores
  below the floor: if the teacher cannot do the task, nothing about its student can be judged.

So a run where every model scores 0 judges nothing, and a tie never counts as a win.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

HOLDS, FAILS, INCONCLUSIVE, NA = "holds", "does not hold", "inconclusive", "not measurable"
FLOOR = 50.0  # percent the reference model must reach before its students can be judged


@dataclass(frozen=True)
class Spread:
    """How far a rerun moves a score, pooled over the cells of one table column: the variance of one
    replicate's score is ``k * p (1 - p)`` (percent squared; ``p`` the cell's mean as a fraction, the
    shape of an outcome that lands near 0 or near 100), ``k`` fitted to every cell's observed spread
    between its replicates, with ``dof`` degrees of freedom (the cells' replicates - 1, summed). Two
    replicates give a cell's own spread one degree of freedom (t = 12.7); the column's cells together
    give many, at the price of assuming they share ``k``. A cell's own spread still counts where it is
    larger (max of the two)."""

    k: float
    dof: int

    def variance(self, mean: float) -> float:
        """One replicate's variance (percent squared) at a cell mean of ``mean`` percent."""
        return self.k * _two_valued(mean)


def _two_valued(mean: float) -> float:
    """p (1 - p) in percent squared at a mean of ``mean`` percent: the variance shape of Spread."""
    p = min(max(mean / 100.0, 0.0), 1.0)
    return p * (1 - p) * 1e4


def pooled_spread(cells) -> Spread | None:
    """A column's Spread from its cells, each (replicates, questions) per-question scores of one
    model; cells with one replicate, or at 0 or 100 (no spread possible under the model), add
    nothing. None when no cell has two replicates."""
    squares = expected = 0.0
    dof = 0
    for x in cells:
        x = np.atleast_2d(np.asarray(x, dtype=float))
        if len(x) < 2:
            continue
        shape = _two_valued(float(x.mean()))
        if shape == 0:
            continue
        squares += np.var(x.mean(1), ddof=1) * (len(x) - 1)
        expected += shape * (len(x) - 1)
        dof += len(x) - 1
    return Spread(squares / expected, dof) if dof else None


def _t_interval(mean: float, parts: list[tuple[float, int]], level: float, bounds: tuple[float, float]):
    """``mean`` +- t * sqrt(sum of the variances); ``parts``: (variance of the mean, degrees of
    freedom) each. The t quantile takes the fewest degrees of freedom of any part that has a
    variance: with two replicates and no pooled Spread, t(1) = 12.7 whatever the questions say.
    (Welch-Satterthwaite degrees of freedom would be larger where two replicates happen to agree, and
    covered the truth in only 87% of simulated two-replicate runs: tests/test_verdicts.py.) Clipped to
    ``bounds`` (a score cannot leave [0, 100])."""
    parts = [(v, df) for v, df in parts if v > 0 and df > 0]
    total = sum(v for v, _ in parts)
    if total == 0:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, min(df for _, df in parts))) * total ** 0.5
    return mean, max(bounds[0], mean - half), min(bounds[1], mean + half)


def paired_interval(a, b, level: float = 0.95, bounds=(-100.0, 100.0),
                    spread: Spread | None = None) -> tuple[float, float, float]:
    """Mean of ``a - b`` and its interval. ``a``, ``b``: per-question scores (percent), (questions,)
    or (replicates, questions). Replicates are paired where both have the same number (row i of
    each is the same seed, so the same teacher and data order), or compared with a single row (which
    then counts as fixed: one downloaded teacher). ``spread``: the column's pooled Spread; without
    it, the replicates' own spread at their own degrees of freedom."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.size == 0 or b.size == 0:
        raise ValueError(f"paired scores need the same non-empty questions, got {a.shape} and {b.shape}")
    n = a.shape[1]
    replicated = [x for x in (a, b) if len(x) > 1]  # the sides whose rows are draws of a rerun
    if a.shape[0] == b.shape[0] or 1 in (a.shape[0], b.shape[0]):
        sides = [(a - b, replicated)]  # paired, or one side a single row: the other side's spread alone
    else:
        sides = [(a, [a]), (b, [b])]   # unpaired replicates: each side's spread
    parts = []
    for x, draws in sides:
        if len(x) < 2:
            continue
        observed = np.var(x.mean(1), ddof=1)
        if spread is None:
            parts.append((observed / len(x), len(x) - 1))
        else:
            model = sum(spread.variance(float(d.mean())) for d in draws)
            parts.append((max(observed, model) / len(x), spread.dof))
    per_question = a.mean(0) - b.mean(0)
    if n > 1:
        parts.append((np.var(per_question, ddof=1) / n, n - 1))
    return _t_interval(float(a.mean() - b.mean()), parts, level, bounds)


def interval(a, level: float = 0.95, spread: Spread | None = None) -> tuple[float, float, float]:
    """One model's mean score with its interval over replicates and questions, within [0, 100]."""
    a = np.atleast_2d(np.asarray(a, dtype=float))
    return paired_interval(a, np.zeros((1, a.shape[1])), level, bounds=(0.0, 100.0), spread=spread)


def _gate(reference, floor: float) -> str | None:
    """NA with the reason, or None when the comparison can be judged."""
    if reference is None:
        return f"{NA} (no reference scores)"
    if float(np.mean(reference)) < floor:  # the mean over its seeds and questions
        return f"{NA} (the reference scores {np.mean(reference):.1f}% < {floor:.0f}%: it cannot do the task here)"
    return None


def fmt(mean: float, lo: float, hi: float, level: float = 0.95) -> str:
    return f"{mean:+.1f} pts [{100 * level:.4g}% CI {lo:+.1f}, {hi:+.1f}]"


def beats(a, b, reference, floor: float = FLOOR, spread: Spread | None = None) -> tuple[str, str]:
    """Claim: model a scores higher than model b. Returns (verdict, interval text)."""
    if a is None or b is None:
        return f"{NA} (missing results)", ""
    na = _gate(reference, floor)
    mean, lo, hi = paired_interval(a, b, spread=spread)
    if na:
        return na, fmt(mean, lo, hi)
    return (HOLDS if lo > 0 else FAILS if hi < 0 else INCONCLUSIVE), fmt(mean, lo, hi)


def near(a, b, margin: float, reference, floor: float = FLOOR, level: float = 0.95,
         spread: Spread | None = None) -> tuple[str, str]:
    """Claim: model a stays within ``margin`` points below model b (a >= b - margin), judged on a
    ``level`` interval (raise it to correct for a claim chosen among several tries)."""
    if a is None or b is None:
        return f"{NA} (missing results)", ""
    na = _gate(reference, floor)
    mean, lo, hi = paired_interval(b, a, level, spread=spread)  # the gap b - a
    if na:
        return na, fmt(mean, lo, hi, level)
    return (HOLDS if hi <= margin else FAILS if lo > margin else INCONCLUSIVE), fmt(mean, lo, hi, level)


def all_of(verdicts: list[str]) -> str:
    """A claim made of parts: holds if every part holds, fails if any fails, else the weakest."""
    if any(v.startswith(NA) for v in verdicts):
        return next(v for v in verdicts if v.startswith(NA))
    if any(v == FAILS for v in verdicts):
        return FAILS
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else INCONCLUSIVE
