"""Verdicts on accuracy claims that can fail and can abstain.

Each comparison uses per-question scores (percent; a question's score is the mean over its
samples) of two models on the same questions, one row per training seed, and a bootstrap over
seeds and questions (questions paired between the models; seeds paired where both have the same
seeds, drawn independently where one has a single row, e.g. the teacher) for the 95% interval of
their difference. A claim

* **holds** when the whole interval lies on the claimed side (for "stays near": inside the margin);
* **does not hold** when the whole interval lies on the other side;
* is **inconclusive** otherwise (ties and overlaps included), with the interval shown;
* is **not measurable** when data are missing or the reference model (the Ouro teacher) scores
  below the floor: if the teacher cannot do the task, nothing about its student can be judged.

So a run where every model scores 0 judges nothing, and a tie never counts as a win.
"""

from __future__ import annotations

import numpy as np

HOLDS, FAILS, INCONCLUSIVE, NA = "holds", "does not hold", "inconclusive", "not measurable"
FLOOR = 50.0  # percent the reference model must reach before its students can be judged
BOOTSTRAP = 2000


def paired_interval(a, b, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` and its bootstrap percentile interval. ``a``, ``b``: per-question scores,
    (questions,) or (seeds, questions). Each bootstrap draw resamples the questions (the same for
    both) and the seeds (the same draw for both where their seed counts agree), and averages."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.size == 0 or b.size == 0:
        raise ValueError(f"paired scores need the same non-empty questions, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    counts = rng.multinomial(n, np.full(n, 1 / n), size=BOOTSTRAP)  # questions drawn with replacement
    sa = rng.integers(0, a.shape[0], size=(BOOTSTRAP, a.shape[0]))
    sb = sa if b.shape[0] == a.shape[0] else rng.integers(0, b.shape[0], size=(BOOTSTRAP, b.shape[0]))

    def draws(x, s):  # (BOOTSTRAP,): the mean over drawn seeds of each seed's mean over drawn questions
        per_seed = x @ counts.T / n  # (seeds, BOOTSTRAP)
        return np.take_along_axis(per_seed.T, s, 1).mean(1)

    means = draws(a, sa) - draws(b, sb)
    tail = (1 - level) / 2 * 100
    return (float(a.mean() - b.mean()), float(np.percentile(means, tail)),
            float(np.percentile(means, 100 - tail)))


def interval(a, level: float = 0.95) -> tuple[float, float, float]:
    """One model's mean score with its 95% interval over seeds and questions."""
    a = np.atleast_2d(np.asarray(a, dtype=float))
    return paired_interval(a, np.zeros((1, a.shape[1])), level)


def _gate(reference, floor: float) -> str | None:
    """NA with the reason, or None when the comparison can be judged."""
    if reference is None:
        return f"{NA} (no reference scores)"
    if float(np.mean(reference)) < floor:  # the mean over its seeds and questions
        return f"{NA} (the reference scores {np.mean(reference):.1f}% < {floor:.0f}%: it cannot do the task here)"
    return None


def fmt(mean: float, lo: float, hi: float, level: float = 0.95) -> str:
    return f"{mean:+.1f} pts [{100 * level:.4g}% CI {lo:+.1f}, {hi:+.1f}]"


def beats(a, b, reference, floor: float = FLOOR) -> tuple[str, str]:
    """Claim: model a scores higher than model b. Returns (verdict, interval text)."""
    if a is None or b is None:
        return f"{NA} (missing results)", ""
    na = _gate(reference, floor)
    mean, lo, hi = paired_interval(a, b)
    if na:
        return na, fmt(mean, lo, hi)
    return (HOLDS if lo > 0 else FAILS if hi < 0 else INCONCLUSIVE), fmt(mean, lo, hi)


def near(a, b, margin: float, reference, floor: float = FLOOR, level: float = 0.95) -> tuple[str, str]:
    """Claim: model a stays within ``margin`` points below model b (a >= b - margin), judged on a
    ``level`` interval (raise it to correct for a claim chosen among several tries)."""
    if a is None or b is None:
        return f"{NA} (missing results)", ""
    na = _gate(reference, floor)
    mean, lo, hi = paired_interval(b, a, level)  # the gap b - a
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
