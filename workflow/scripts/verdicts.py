"""Verdicts on accuracy claims that can fail and can abstain, on intervals shaped like the data.

A **cell** is one model's per-question scores in one column (percent; a question's score is the
mean over its samples), one row per replicate (a training seed: with ``source.pretrain.per_seed``
each seed pretrains its own teacher, so a row is a rerun of everything trained). At the embedded
default's size a student's training is two-valued: it escapes its first plateau (KD ~2.4, the
loss of the task's marginal distribution) or it stays there, and its scores follow. So a trained
student's cell carries, per replicate, whether that run escaped (read off its KD loss by the
report: ``report.escape_kd``) and its interval is a **mixture**'s:

* the escape rate pi, k of n replicates: exact (Clopper-Pearson) at level 1 - alpha/2;
* each mode's mean (the escaped replicates', the stuck ones'): Student's t over that mode's
  replicates and the questions, its degrees of freedom Welch-Satterthwaite's from the two variance
  parts (replicates: m - 1; questions: Q - 1) capped at the fewer of the two (uncapped, two
  replicates covered 86% where 95% was promised), each mode at level 1 - alpha/4; a mode seen in fewer
  than two replicates is only known to lie in [0, 100];
* the cell's mean pi * mean_escaped + (1 - pi) * mean_stuck, bounded over those ranges (Bonferroni:
  the three parts miss together at most alpha).

Two seeds that both escaped therefore cannot rule out that most seeds stay stuck: the interval's
low end is pi's exact bound (2 of 2: pi >= 11%) times the escaped mode's. A cell without escape
flags (the teacher, its sharing baselines and the untrained conversion: nothing was trained, and
``escape_kd: null``, the paper config) is one mode. Where every score of a one-mode cell is 0 (or
100) the t interval has no width; its interval is the questions' exact one instead (0 of Q).

**Comparisons.** Two cells with the same replicates that are views of the same weights (the same
``weights`` key: the main run and its prefill or window variants) or are both one-mode cells (the
teacher, its sharing caches, the untrained conversion: row i of each is seed i's teacher) are
compared replicate by replicate and question by question: a t interval for the paired
difference, Satterthwaite degrees of freedom. Cells of separately trained weights are compared
through their own intervals, each at level 1 - alpha/2: [lo_a - hi_b, hi_a - lo_b].

With ``test="permutation"`` (``report.separate_test``; the evidence target's registered method,
docs/PREREGISTRATION.md) cells of separately trained weights are compared instead by an exact
two-sample **permutation test** on the replicates' means (each replicate's mean over the
questions): the statistic is the difference of the two arms' means, its null distribution every
split of the pooled replicates into arms of the same sizes (all of them up to ``EXACT_SPLITS``,
else that many drawn), and "a beats b" (or "a - b stays within the margin") is tested as a shift
of a by the threshold. It makes no assumption about the scores' distribution, so two-valued
reruns cost it nothing, but it cannot decide below its resolution: its smallest two-sided p-value
is 2 / C(n_a + n_b, n_a), 1/3 at two replicates a side, 0.0022 at six. The arms of one replicate
share that replicate's teacher; a shared teacher makes the arms' means correlate positively, which
narrows the true spread of their difference below the permutation distribution's (the test is
conservative then; tests/test_verdicts.py simulates it).

Each comparison has a **p-value**: the smallest alpha at which its interval leaves the claim's
threshold (0 for "beats", the margin for "stays near"), found by bisection. A family of
comparisons (every accuracy claim's parts in one report) is corrected with **Holm**'s step-down:
the i-th smallest p-value is judged at alpha / (m - i + 1) until one is not decided. A claim

* **holds** when its interval, at its corrected level, lies on the claimed side (for "stays
  near": inside the margin);
* **does not hold** when it lies on the other side;
* is **inconclusive** otherwise (ties and overlaps included), with the interval shown;
* is **not measurable** when data are missing or the reference model (the Ouro teacher) scores
  below the floor: if the teacher cannot do the task, nothing about its student can be judged.

So a run where every model scores 0 judges nothing, and a tie never counts as a win.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from math import comb

import numpy as np
from scipy import stats

HOLDS, FAILS, INCONCLUSIVE, NA = "holds", "does not hold", "inconclusive", "not measurable"
FLOOR = 50.0   # percent the reference model must reach before its students can be judged
ALPHA = 0.05   # family-wise error rate of one report's accuracy claims
BOUNDS = (0.0, 100.0)
CAP_DOF = True  # t's degrees of freedom: Satterthwaite's, at most the fewest of any variance part
TESTS = ("interval", "permutation")  # how separately trained cells are compared (report.separate_test)
EXACT_SPLITS = 200_000  # a permutation test enumerates every split up to this many, else draws this many


@dataclass(frozen=True)
class Cell:
    """One model's scores in one column: ``scores`` (replicates, questions) in percent;
    ``escaped``: per replicate, whether its training left the plateau (None: not a trained student,
    or the config models no escape); ``weights``: which weights the cell evaluates (cells with the
    same key are views of one set of weights and are compared replicate by replicate)."""

    scores: np.ndarray
    escaped: tuple[bool, ...] | None = None
    weights: str = ""

    def __post_init__(self):
        x = np.atleast_2d(np.asarray(self.scores, dtype=float))
        if x.ndim != 2 or x.size == 0:
            raise ValueError(f"a cell needs (replicates, questions) scores, got shape {x.shape}")
        if self.escaped is not None and len(self.escaped) != len(x):
            raise ValueError(f"a cell of {len(x)} replicates got {len(self.escaped)} escape flags")
        object.__setattr__(self, "scores", x)

    @property
    def mean(self) -> float:
        return float(self.scores.mean())

    @property
    def escapes(self) -> tuple[int, int] | None:
        """(k, n): how many of the replicates escaped, or None for a one-mode cell."""
        return None if self.escaped is None else (int(sum(self.escaped)), len(self.escaped))


def as_cell(x) -> Cell:
    return x if isinstance(x, Cell) else Cell(np.asarray(x, dtype=float))


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """The exact two-sided interval for a binomial rate, k successes of n."""
    a = 1 - level
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def satterthwaite(parts: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite's degrees of freedom of a sum of variance parts."""
    return sum(v for v, _ in parts) ** 2 / sum(v * v / df for v, df in parts)


def _t_half(parts: list[tuple[float, int]], level: float) -> float:
    """Half-width of a t interval from variance parts (variance of the mean, degrees of freedom); 0
    when no part has a variance. Degrees of freedom: Satterthwaite's, capped at the fewest of any part
    with a variance (CAP_DOF; Satterthwaite's alone covered 86% at two replicates, 93% at three:
    tests/test_verdicts.py)."""
    parts = [(v, df) for v, df in parts if v > 0 and df > 0]
    total = sum(v for v, _ in parts)
    if total == 0:
        return 0.0
    dof = min(satterthwaite(parts), min(df for _, df in parts)) if CAP_DOF else satterthwaite(parts)
    return float(stats.t.ppf(0.5 + level / 2, dof)) * total ** 0.5


def _parts(x: np.ndarray) -> list[tuple[float, int]]:
    """The two variance parts of the mean of x (replicates, questions): how far the replicates'
    means spread, and how far the questions' (their mean over the replicates) do."""
    m, q = x.shape
    parts = [(float(np.var(x.mean(1), ddof=1)) / m, m - 1)] if m > 1 else []
    if q > 1:
        parts.append((float(np.var(x.mean(0), ddof=1)) / q, q - 1))
    return parts


def _mode_interval(x: np.ndarray, level: float) -> tuple[float, float]:
    """One mode's mean: t over its replicates and questions; at 0 or 100 throughout, the questions'
    exact interval (0 or Q of Q)."""
    mean, q = float(x.mean()), x.shape[1]
    if mean in BOUNDS and np.all(x == mean):
        lo, hi = clopper_pearson(int(round(mean / 100 * q)), q, level)
        return 100 * lo, 100 * hi
    half = _t_half(_parts(x), level)
    return max(BOUNDS[0], mean - half), min(BOUNDS[1], mean + half)


def cell_interval(cell, level: float = 1 - ALPHA) -> tuple[float, float, float]:
    """A cell's mean and its interval (the module's docstring: one mode, or the escape mixture)."""
    cell = as_cell(cell)
    x = cell.scores
    if cell.escaped is None:
        return (cell.mean, *_mode_interval(x, level))
    a = 1 - level
    k, n = cell.escapes
    pi_lo, pi_hi = clopper_pearson(k, n, 1 - a / 2)
    flags = np.asarray(cell.escaped, dtype=bool)
    modes = [_mode_interval(x[f], 1 - a / 4) if f.sum() > 1 else BOUNDS for f in (flags, ~flags)]
    (e_lo, e_hi), (s_lo, s_hi) = modes
    lo = min(p * e_lo + (1 - p) * s_lo for p in (pi_lo, pi_hi))
    hi = max(p * e_hi + (1 - p) * s_hi for p in (pi_lo, pi_hi))
    return cell.mean, max(BOUNDS[0], lo), min(BOUNDS[1], hi)


def interval(a, level: float = 1 - ALPHA) -> tuple[float, float, float]:
    """One model's mean score with its interval, within [0, 100] (a table's cell)."""
    return cell_interval(a, level)


def paired(a: Cell, b: Cell) -> bool:
    """Whether a and b are compared replicate by replicate: the same replicates, and either views of
    the same weights or both one-mode cells (nothing trained: row i of each is seed i's teacher)."""
    if a.scores.shape[0] != b.scores.shape[0]:
        return False
    return (a.escaped is None and b.escaped is None) or (bool(a.weights) and a.weights == b.weights)


def difference_interval(a, b, level: float = 1 - ALPHA) -> tuple[float, float, float]:
    """Mean of a - b and its interval (the module's docstring: paired, or through each cell's own)."""
    a, b = as_cell(a), as_cell(b)
    if a.scores.shape[1] != b.scores.shape[1]:
        raise ValueError(f"compared scores need the same questions, got {a.scores.shape} and {b.scores.shape}")
    mean = a.mean - b.mean
    if paired(a, b):
        half = _t_half(_parts(a.scores - b.scores), level)
        return mean, max(-100.0, mean - half), min(100.0, mean + half)
    _, a_lo, a_hi = cell_interval(a, 1 - (1 - level) / 2)
    _, b_lo, b_hi = cell_interval(b, 1 - (1 - level) / 2)
    return mean, a_lo - b_hi, a_hi - b_lo


def permutation_p(a, b, threshold: float = 0.0) -> tuple[float, float]:
    """One-sided p-values of the difference of the replicates' means, a - b, against ``threshold``:
    (p that it is above, p that it is below), each the share of splits of the pooled replicates
    (a shifted down by the threshold) whose difference is at least (at most) as extreme as the
    observed one. Exact over every split up to EXACT_SPLITS; beyond that a fixed draw of that
    many, with the observed split counted once ((hits + 1) / (draws + 1))."""
    x = np.concatenate([as_cell(a).scores.mean(1) - threshold, as_cell(b).scores.mean(1)])
    n_a, n = len(as_cell(a).scores), len(x)
    if n_a == 0 or n_a == n:
        return 1.0, 1.0
    observed = x[:n_a].mean() - x[n_a:].mean()
    total = x.sum()
    if comb(n, n_a) <= EXACT_SPLITS:
        sums = np.asarray([x[list(idx)].sum() for idx in combinations(range(n), n_a)])
        extra = 0
    else:
        rng = np.random.default_rng(0)
        sums = np.asarray([x[rng.permutation(n)[:n_a]].sum() for _ in range(EXACT_SPLITS)])
        extra = 1
    diffs = sums / n_a - (total - sums) / (n - n_a)
    tol = 1e-9 * max(1.0, float(np.abs(x).max()))  # equal splits of floats count as ties
    above = (np.sum(diffs >= observed - tol) + extra) / (len(diffs) + extra)
    below = (np.sum(diffs <= observed + tol) + extra) / (len(diffs) + extra)
    return float(above), float(below)


def fmt(mean: float, lo: float, hi: float, level: float = 1 - ALPHA) -> str:
    return f"{mean:+.1f} pts [{100 * level:.4g}% CI {lo:+.1f}, {hi:+.1f}]"


@dataclass
class Comparison:
    """One hypothesis: ``a - b`` against ``threshold`` (0: a beats b; a margin: b - a stays within
    it, with a and b given as the gap's sides). ``level`` is set by the family's correction."""

    a: Cell
    b: Cell
    threshold: float
    kind: str                       # "beats" (a > b) | "near" (a - b <= threshold)
    na: str | None = None           # not measurable, and why
    level: float = 1 - ALPHA
    test: str = "interval"          # separately trained cells: "interval" | "permutation" (TESTS)

    def interval(self, level: float | None = None) -> tuple[float, float, float]:
        return difference_interval(self.a, self.b, self.level if level is None else level)

    @property
    def permutes(self) -> bool:
        """Whether this comparison is judged by the permutation test: asked for, and not paired."""
        return self.test == "permutation" and not paired(self.a, self.b)

    @cached_property
    def sides(self) -> tuple[float, float]:
        """The permutation test's one-sided p-values: a - b above the threshold, below it (computed
        once: p, the verdict, the CI text and Holm's sort all read them)."""
        return permutation_p(self.a, self.b, self.threshold)

    @property
    def p(self) -> float:
        """The smallest alpha at which the interval leaves the threshold (1 if none does); under the
        permutation test, its two-sided p-value."""
        if self.na:
            return 1.0
        if self.permutes:
            return min(1.0, 2 * min(self.sides))

        def leaves(alpha: float) -> bool:
            _, lo, hi = self.interval(1 - alpha)
            return lo > self.threshold or hi < self.threshold or (self.kind == "near" and hi == self.threshold)

        if not leaves(1 - 1e-9):
            return 1.0
        lo_a, hi_a = 1e-12, 1 - 1e-9
        if leaves(lo_a):
            return lo_a
        for _ in range(50):
            mid = (lo_a + hi_a) / 2
            lo_a, hi_a = (lo_a, mid) if leaves(mid) else (mid, hi_a)
        return hi_a

    @property
    def ci(self) -> str:
        if self.permutes:
            n_a, n_b = len(self.a.scores), len(self.b.scores)
            return (f"{self.a.mean - self.b.mean:+.1f} pts, permutation p = {self.p:.3g} two-sided "
                    f"({n_a} vs {n_b} seeds; decided at p <= {1 - self.level:.3g})")
        return fmt(*self.interval(), self.level)

    @property
    def verdict(self) -> str:
        if self.na:
            return self.na
        if self.permutes:
            above, below = self.sides
            decided = self.p <= 1 - self.level + 1e-12
            up, down = (HOLDS, FAILS) if self.kind == "beats" else (FAILS, HOLDS)
            return (up if above < below else down) if decided else INCONCLUSIVE
        _, lo, hi = self.interval()
        if self.kind == "beats":
            return HOLDS if lo > 0 else FAILS if hi < 0 else INCONCLUSIVE
        return HOLDS if hi <= self.threshold else FAILS if lo > self.threshold else INCONCLUSIVE


@dataclass
class Family:
    """Every accuracy comparison of one report, corrected together (Holm) by ``correct``."""

    alpha: float = ALPHA
    members: list[Comparison] = field(default_factory=list)
    test: str = "interval"  # how its separately trained cells are compared (TESTS)

    def __post_init__(self):
        if self.test not in TESTS:
            raise ValueError(f"report.separate_test is {self.test!r}; use one of {', '.join(TESTS)}")

    def add(self, c: Comparison) -> Comparison:
        c.test = self.test
        self.members.append(c)
        return c

    def correct(self) -> None:
        """Holm's step-down: the i-th smallest p-value (of m) is judged at alpha / (m - i + 1); from
        the first that is not decided there on, every later one at that same level, so none is
        decided (a step-down stops at its first retained hypothesis)."""
        live = sorted((c for c in self.members if not c.na), key=lambda c: c.p)
        m, stopped = len(live), None
        for i, c in enumerate(live):
            alpha = self.alpha / (m - i)
            if stopped is None and c.p > alpha:
                stopped = alpha
            c.level = 1 - (stopped if stopped is not None else alpha)


def _gate(reference, floor: float) -> str | None:
    """NA with the reason, or None when the comparison can be judged."""
    if reference is None:
        return f"{NA} (no reference scores)"
    mean = as_cell(reference).mean  # the mean over its seeds and questions
    if mean < floor:
        return f"{NA} (the reference scores {mean:.1f}% < {floor:.0f}%: it cannot do the task here)"
    return None


def beats(a, b, reference, floor: float = FLOOR, family: Family | None = None) -> Comparison | None:
    """Claim: model a scores higher than model b. None when either is missing."""
    if a is None or b is None:
        return None
    c = Comparison(as_cell(a), as_cell(b), 0.0, "beats", _gate(reference, floor))
    return family.add(c) if family is not None else c


def near(a, b, margin: float, reference, floor: float = FLOOR, family: Family | None = None,
         level: float = 1 - ALPHA) -> Comparison | None:
    """Claim: model a stays within ``margin`` points below model b (b - a <= margin)."""
    if a is None or b is None:
        return None
    c = Comparison(as_cell(b), as_cell(a), margin, "near", _gate(reference, floor), level)
    return family.add(c) if family is not None else c


def verdict_of(c: Comparison | None) -> str:
    return f"{NA} (missing results)" if c is None else c.verdict


def ci_of(c: Comparison | None) -> str:
    return "" if c is None else c.ci


def all_of(verdicts: list[str]) -> str:
    """A claim made of parts: holds if every part holds, fails if any fails, else the weakest."""
    if any(v.startswith(NA) for v in verdicts):
        return next(v for v in verdicts if v.startswith(NA))
    if any(v == FAILS for v in verdicts):
        return FAILS
    return HOLDS if verdicts and all(v == HOLDS for v in verdicts) else INCONCLUSIVE
