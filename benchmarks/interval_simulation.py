"""How often do the tables' intervals hold the truth when a cell's outcome is two-valued?

Simulates a table column like the embedded default's: stable cells (each rerun moves the score by a
few points around its truth), two-valued cells (a student escapes its plateau and scores ~90%, or
does not and scores ~2%, with a given chance), and cells at 0. Each simulated run draws two
replicates (seeds) of every cell, 64 questions each, and computes every cell's 95% interval as
the report does (`workflow/scripts/verdicts.py`), with the column's pooled spread and with each
cell's own two seeds. Prints, per cell, how often the interval holds the cell's true mean, and how
often a 90%-vs-0% comparison is decided. docs/REPRODUCIBILITY.md quotes it.

    python benchmarks/interval_simulation.py [--runs 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))
from verdicts import HOLDS, beats, interval, pooled_spread  # noqa: E402

QUESTIONS, REPLICATES = 64, 2
# (label, kind, parameter): stable cells sit at a truth +-3 points; two-valued ones escape with a chance
CELLS = [("stable 98%", "stable", 98), ("stable 35%", "stable", 35), ("stable 88%", "stable", 88),
         ("stable 60%", "stable", 60), ("escapes 90% of runs", "two-valued", 0.9),
         ("escapes 50% of runs", "two-valued", 0.5), ("escapes 30% of runs", "two-valued", 0.3),
         ("escapes 60% of runs", "two-valued", 0.6), ("always 0%", "zero", 0), ("always 0%", "zero", 0)]


def score(rng, kind: str, parameter: float) -> float:
    """One replicate's accuracy (percent)."""
    if kind == "stable":
        return float(np.clip(rng.normal(parameter, 3), 0, 100))
    if kind == "zero":
        return 0.0
    escaped = rng.random() < parameter
    return float(np.clip(rng.normal(90, 4) if escaped else rng.normal(2, 2), 0, 100))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    truth = [np.mean([score(rng, k, p) for _ in range(40_000)]) for _, k, p in CELLS]
    hits = {"pooled": np.zeros(len(CELLS)), "own": np.zeros(len(CELLS))}
    decided = {"pooled": 0, "own": 0}
    for _ in range(a.runs):
        cells = []
        for _, kind, parameter in CELLS:
            acc = np.array([score(rng, kind, parameter) for _ in range(REPLICATES)]) / 100
            cells.append(100.0 * (rng.random((REPLICATES, QUESTIONS)) < acc[:, None]))
        for method, spread in (("pooled", pooled_spread(cells)), ("own", None)):
            for i, x in enumerate(cells):
                _, lo, hi = interval(x, spread=spread)
                hits[method][i] += lo <= truth[i] <= hi
            decided[method] += beats(cells[2], cells[8], [np.full(QUESTIONS, 100.0)], spread=spread)[0] == HOLDS
    print(f"{a.runs} simulated columns, {REPLICATES} replicates, {QUESTIONS} questions; "
          "share of runs whose 95% interval holds the cell's true mean")
    print("| cell | true mean | pooled spread (default) | each cell's own seeds |\n|---|---:|---:|---:|")
    for (label, _, _), t, p, o in zip(CELLS, truth, hits["pooled"], hits["own"]):
        print(f"| {label} | {t:.1f} | {100 * p / a.runs:.0f}% | {100 * o / a.runs:.0f}% |")
    print(f"\nstable 88% beats always 0%: decided in {100 * decided['pooled'] / a.runs:.0f}% of runs (pooled), "
          f"{100 * decided['own'] / a.runs:.0f}% (own seeds)")


if __name__ == "__main__":
    main()
