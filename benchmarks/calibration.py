"""Do two runs of the embedded default agree within their intervals? (docs/REPRODUCIBILITY.md)

Reads two results tables in the format `benchmarks/embedded_summary.py` writes (and docs/MEASURED.md
shows): each cell `mean [lo, hi]` (95% interval), and the verdict list `- claim: **verdict**`. Two
runs that differ only by a perturbation the intervals claim to cover (another seed draw, another
machine's rounding) should agree as calibrated intervals predict: one run's point estimate inside
the other's 95% interval about 83% of the time for two runs of equal width, disjoint intervals
almost never (~0.6% of cells), and no verdict that holds on one side and does not hold on the other.

    python benchmarks/calibration.py A.md B.md            # -> results/benchmarks/calibration.md
    python benchmarks/calibration.py <(git show 7445239:docs/MEASURED.md) results/benchmarks/embedded_summary.md
    python benchmarks/calibration.py --rerun              # after the main job: rerun it perturbed, compare

--rerun trains everything again under a perturbation of everything trained (other training seeds 2
and 3: the gates' init and the data order, and under `source.pretrain.per_seed` each seed's own
teacher, pretrained with seeds 2 and 3; with one teacher for every seed, its pretraining seed 1; the
same questions), as
`snakemake all` of an overlay on config/default.yaml into results/calibration/, then compares its
table with the finished main run's (`results/`, embedded_summary's table of each).

Cells whose interval is a single point on both sides (a model that scores 0 or 100 everywhere) are
counted apart: they agree or not, but say nothing of the intervals' width.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

CELL = re.compile(r"^(-?\d+(?:\.\d+)?) \[(-?\d+(?:\.\d+)?), (-?\d+(?:\.\d+)?)\]")
VERDICT = re.compile(r"^- (.+?): \*\*(.+?)\*\*\s*$", re.M)
DECIDED = ("holds", "does not hold")


@dataclass(frozen=True)
class Estimate:
    mean: float
    lo: float
    hi: float

    @property
    def point(self) -> bool:
        return self.lo == self.hi

    def covers(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def read_table(text: str) -> dict[tuple[str, str], Estimate]:
    """{(model, column): estimate} from every markdown table whose cells are `mean [lo, hi]`."""
    cells: dict[tuple[str, str], Estimate] = {}
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if not header:
            header = parts
            continue
        if set(parts[0]) <= set("-: "):
            continue
        for column, value in zip(header[1:], parts[1:]):
            m = CELL.match(value)
            if m:
                cells[(parts[0], column.split(" (")[0])] = Estimate(*(float(g) for g in m.groups()))
    return cells


def read_verdicts(text: str) -> dict[str, str]:
    """{claim: verdict}; a claim's numbers (e.g. how many rules a sweep tried) are not part of its name."""
    return {re.sub(r"\d+(?:[.,]\d+)*", "#", claim): verdict.split(" (")[0] for claim, verdict in VERDICT.findall(text)}


def compare(a_text: str, b_text: str) -> dict:
    a, b = read_table(a_text), read_table(b_text)
    both = sorted(set(a) & set(b))
    if not both:
        raise SystemExit("no table cell (model, column) is in both files: are they embedded_summary tables?")
    informative = [k for k in both if not (a[k].point and b[k].point)]
    a_in_b = [k for k in informative if b[k].covers(a[k].mean)]
    b_in_a = [k for k in informative if a[k].covers(b[k].mean)]
    disjoint = [k for k in informative if a[k].hi < b[k].lo or b[k].hi < a[k].lo]
    va, vb = read_verdicts(a_text), read_verdicts(b_text)
    claims = sorted(set(va) & set(vb))
    flips = [c for c in claims if {va[c], vb[c]} == set(DECIDED)]
    one_side = [c for c in claims if va[c] != vb[c] and c not in flips]
    return {"cells": len(both), "informative": len(informative),
            "points equal": sum(a[k] == b[k] for k in both if a[k].point and b[k].point),
            "points": sum(a[k].point and b[k].point for k in both),
            "differ": sum(a[k] != b[k] for k in both), "a_in_b": len(a_in_b), "b_in_a": len(b_in_a),
            "coverage": (len(a_in_b) + len(b_in_a)) / (2 * len(informative)) if informative else float("nan"),
            "disjoint": [(k, a[k], b[k]) for k in disjoint], "claims": len(claims), "flips": flips,
            "one_side": [(c, va[c], vb[c]) for c in one_side]}


def render(r: dict, a_name: str, b_name: str) -> str:
    lines = [f"A: {a_name}", f"B: {b_name}", "",
             f"- cells in both: {r['cells']}, of which differ: {r['differ']}",
             f"- cells whose interval is one point on both sides: {r['points']} ({r['points equal']} equal)",
             f"- the other {r['informative']}: A's mean inside B's interval {r['a_in_b']}, B's inside A's "
             f"{r['b_in_a']}: coverage {100 * r['coverage']:.0f}% (two calibrated runs of equal width: ~83%)",
             f"- disjoint intervals: {len(r['disjoint'])} (calibrated: ~{0.006 * r['informative']:.1f})"]
    lines += [f"  - {m} / {c}: A {x.mean} [{x.lo}, {x.hi}], B {y.mean} [{y.lo}, {y.hi}]"
              for (m, c), x, y in r["disjoint"]]
    lines += [f"- claims in both: {r['claims']}; decided differently on one side only: {len(r['one_side'])}"]
    lines += [f"  - {c}: A {x}, B {y}" for c, x, y in r["one_side"]]
    lines += ["", f"verdict flips: {len(r['flips'])}"]
    lines += [f"- {c}" for c in r["flips"]]
    return "\n".join(lines) + "\n"


ROOT = Path(__file__).resolve().parents[1]
# the perturbation --rerun applies: everything trained drawn again, the questions kept
SEEDS = [2, 3]


def perturbation(default: Path) -> dict:
    """The overlay's changes: other training seeds, and where one teacher serves every seed (no
    source.pretrain.per_seed), another teacher; per seed, seeds 2 and 3 draw their own teachers."""
    import yaml

    pretrain = yaml.safe_load(default.read_text())["source"]["pretrain"]
    return {"seeds": SEEDS} if pretrain.get("per_seed") else {"seeds": SEEDS, "source": {"pretrain": {"seed": 1}}}


def rerun(base: Path, out: Path) -> tuple[Path, Path]:
    """Run the embedded default again under ``perturbation`` into out/perturbed; each run's summary table."""
    import subprocess

    import yaml

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from cross_machine import overlay, stamp

    if not (base / "claims.md").is_file():
        raise SystemExit(f"{base}/claims.md: missing; run the main job first (snakemake --profile local all)")
    out.mkdir(parents=True, exist_ok=True)
    change = perturbation(ROOT / "config" / "default.yaml")
    layer = overlay(out, "perturbed", ROOT / "config" / "default.yaml", change["seeds"],
                    {"name": "embedded-calibration", **{k: v for k, v in change.items() if k != "seeds"}})
    outdir = ROOT / yaml.safe_load(layer.read_text())["outdir"]
    stamp(f"calibration: snakemake all under {change} into {outdir} (log {out / 'perturbed.log'})")
    with open(out / "perturbed.log", "w") as log:
        done = subprocess.run([str(ROOT / ".venv/bin/snakemake"), "all", "--profile", "profiles/local",
                               "--configfile", str(layer)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"the perturbed run failed (exit {done.returncode}); see {out / 'perturbed.log'}")
    tables = []
    for results in (base, outdir):
        table = out / f"{results.name}-summary.md"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "embedded_summary.py"), "--results", str(results),
                        "--out", str(table)], cwd=ROOT, check=True, capture_output=True)
        tables.append(table)
    return tables[0], tables[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, nargs="?", help="a results table (embedded_summary's format)")
    ap.add_argument("b", type=Path, nargs="?")
    ap.add_argument("--rerun", action="store_true", help="rerun the embedded default perturbed and compare")
    ap.add_argument("--base", type=Path, default=ROOT / "results", help="--rerun: the finished main run")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "calibration.md")
    args = ap.parse_args(argv)
    if args.rerun:
        args.a, args.b = rerun(args.base.resolve(), ROOT / "results" / "calibration")
    elif not (args.a and args.b):
        ap.error("give two tables, or --rerun")
    text = render(compare(args.a.read_text(), args.b.read_text()), str(args.a), str(args.b))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
