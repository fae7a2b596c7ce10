"""How often do the report's intervals hold the truth, and how many seeds decide its claims, when
reruns are drawn from a model fitted to a real run's per-seed results?

Reads a finished main job (`results/` by default: its summary tables, evals and curves, through
the report's own Results) and fits, per trained run, a two-valued model: the chance a seed escapes
its plateau (Jeffreys' estimate (k + 1/2) / (n + 1) of k of n), the accuracy of an escaped seed and
of a stuck one (the seeds' own means in that mode; a mode no seed showed takes the mean over every
run's seeds in it), and the spread between seeds within a mode (pooled over the runs). The untrained
models (teacher, sharing baselines) are fitted as one mode each. It then draws `--runs` tables of
`--seeds` seeds from the fit, computes every cell's 95% interval and the report's comparisons as
`workflow/scripts/verdicts.py` does, and prints per cell how often the interval holds the fitted
truth, and per comparison how often it is decided (at its plain 95% level: Holm's correction only
lowers that).

    python benchmarks/interval_simulation.py [--results results] [--column MATH-500] [--seeds 2 4 8 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402
from report_common import Results  # noqa: E402
from verdicts import HOLDS, Cell, beats, cell_interval  # noqa: E402


def fit(r: Results, column: str) -> dict[str, dict]:
    """{model: fitted parameters} for every model in the column."""
    models = sorted(r.evals[r.evals.task == r.columns[column].split("/")[0]].model.unique())
    fitted, modes = {}, {True: [], False: []}
    for model in models:
        x = r.per_question(model, column)
        if x is None:
            continue
        flags = r.escape_flags(model) if ModelId.parse(model).kind == "trained" else None
        means = x.mean(1)
        if flags is None:
            fitted[model] = {"pi": 1.0, "escaped": float(means.mean()), "stuck": 0.0, "one_mode": True,
                             "sd": float(means.std(ddof=1)) if len(means) > 1 else 0.0}
            continue
        f = np.asarray(flags)
        for mode in (True, False):
            modes[mode] += list(means[f == mode])
        fitted[model] = {"pi": (f.sum() + 0.5) / (len(f) + 1), "one_mode": False,
                         "escaped": float(means[f].mean()) if f.any() else None,
                         "stuck": float(means[~f].mean()) if (~f).any() else None}
    overall = {m: float(np.mean(v)) if v else (90.0 if m else 0.0) for m, v in modes.items()}
    sd = {m: float(np.std(v, ddof=1)) if len(v) > 1 else 5.0 for m, v in modes.items()}
    for p in fitted.values():
        if not p["one_mode"]:
            p["escaped"] = overall[True] if p["escaped"] is None else p["escaped"]
            p["stuck"] = overall[False] if p["stuck"] is None else p["stuck"]
            p["sd_escaped"], p["sd_stuck"] = sd[True], sd[False]
    return fitted


def accuracies(rng, p: dict, seeds: int) -> tuple[np.ndarray, tuple[bool, ...] | None]:
    """Each drawn seed's accuracy (a share) and, for a trained run, whether it escaped."""
    if p["one_mode"]:
        return np.clip(rng.normal(p["escaped"], p["sd"], seeds), 0, 100) / 100, None
    esc = rng.random(seeds) < p["pi"]
    acc = np.where(esc, rng.normal(p["escaped"], p["sd_escaped"], seeds), rng.normal(p["stuck"], p["sd_stuck"], seeds))
    return np.clip(acc, 0, 100) / 100, tuple(bool(e) for e in esc)


def draw(rng, p: dict, seeds: int, questions: int) -> tuple[np.ndarray, tuple[bool, ...] | None]:
    """A drawn cell: seeds x questions, each question solved or not at its seed's accuracy."""
    acc, flags = accuracies(rng, p, seeds)
    return 100.0 * (rng.random((seeds, questions)) < acc[:, None]), flags


def truth(p: dict, rng) -> float:
    """The fitted model's mean score (its clipping included), from 20,000 drawn seeds."""
    return 100.0 * float(accuracies(rng, p, 20_000)[0].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--config", default=str(ROOT / "config" / "default.yaml"))
    ap.add_argument("--column", default="MATH-500")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 4, 8, 12])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    config = {**yaml.safe_load(Path(a.config).read_text()), "outdir": a.results}
    r = Results(config, str(ROOT / "workflow" / "resources" / "paper_values.yaml"))
    fitted = fit(r, a.column)
    questions = r.per_question("ouro", a.column).shape[1]
    recipe, gate = config["ablations"]["gate_recipe"], config["main_run"]["gate"]
    steps = config["ablations"]["recipes"]
    pairs = [(r.run_model("elementwise", recipe), r.run_model(g, recipe)) for g in config["ablations"]["gates"]
             if g != "elementwise"] + [(r.run_model(gate, x), r.run_model(gate, y)) for x, y in zip(steps, steps[1:])]
    pairs = [(x, y) for x, y in pairs if x in fitted and y in fitted]
    rng = np.random.default_rng(a.seed)
    print(f"Fitted to {a.results} ({a.column}, {questions} questions); {a.runs} simulated tables per seed count.\n")
    print("| model | escape rate (fit) | true mean | " + " | ".join(f"covered, {n} seeds" for n in a.seeds)
          + " |\n|---|---:|---:|" + "---:|" * len(a.seeds))
    true = {m: truth(p, rng) for m, p in fitted.items()}
    cover = {m: [] for m in fitted}
    decided = {pair: [] for pair in pairs}
    for n in a.seeds:
        hits = dict.fromkeys(fitted, 0)
        wins = dict.fromkeys(pairs, 0)
        for _ in range(a.runs):
            cells = {}
            for model, p in fitted.items():
                x, flags = draw(rng, p, n, questions)
                cells[model] = Cell(x, flags, model)
                _, lo, hi = cell_interval(cells[model])
                hits[model] += lo <= true[model] <= hi
            for x, y in pairs:
                wins[(x, y)] += beats(cells[x], cells[y], cells["ouro"]).verdict == HOLDS
        for m in fitted:
            cover[m].append(hits[m] / a.runs)
        for pair in pairs:
            decided[pair].append(wins[pair] / a.runs)
    for m, p in fitted.items():
        rate = "-" if p["one_mode"] else f"{p['pi']:.2f}"
        print(f"| {m} | {rate} | {true[m]:.1f} | "
              + " | ".join(f"{100 * c:.0f}%" for c in cover[m]) + " |")
    print("\n| a beats b | " + " | ".join(f"decided, {n} seeds" for n in a.seeds) + " |\n|---|"
          + "---:|" * len(a.seeds))
    for (x, y), d in decided.items():
        print(f"| {x} > {y} | " + " | ".join(f"{100 * v:.0f}%" for v in d) + " |")


if __name__ == "__main__":
    main()
