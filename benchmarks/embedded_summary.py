"""The embedded default's results as docs/MEASURED.md shows them, from a finished run's `results/`:
every model's score per report column (the mean over training seeds with its 95% interval over
seeds and questions, and each seed's own score), how far into the long answers each model stays
right, the verdicts of claims.md, and the run's wall time from Snakemake's own log.

    snakemake --profile local all                 # the main job, from an empty results/
    python benchmarks/embedded_summary.py         # -> results/benchmarks/embedded_summary.md
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from model_id import ModelId  # noqa: E402
from report_common import Results  # noqa: E402

PAPER_VALUES = ROOT / "workflow" / "resources" / "paper_values.yaml"


def label(model: str, main: str) -> str:
    m = ModelId.parse(model)
    if m.kind == "teacher":
        return "Ouro teacher (per-loop cache)"
    if m.kind == "sharing":
        return f"Ouro, untrained {m.name} sharing"
    if m.kind == "untrained":
        return "MELT, converted, untrained"
    if m.variant:
        return f"... same, {m.variant}"
    return f"MELT {m.gate} gate, recipe {m.recipe}" + (" (main run)" if model == main else "")


def models(r: Results) -> list[str]:
    cfg = r.config
    gates = [r.run_model(g, cfg["ablations"]["gate_recipe"]) for g in cfg["ablations"]["gates"]]
    recipes = [r.run_model(cfg["main_run"]["gate"], x) for x in cfg["ablations"]["recipes"]]
    ordered = ["ouro", *r.sharing_models(), r.untrained, r.main_model, *r.main_variants(), *gates, *recipes]
    return [m for m in dict.fromkeys(ordered) if r.estimate(m, next(iter(r.columns))) is not None]


def cell(r: Results, model: str, column: str, per_seed: bool) -> str:
    est = r.estimate(model, column)
    if est is None:
        return "-"
    text = f"{est.mean:.1f} [{est.lo:.1f}, {est.hi:.1f}]"
    seeds = r.per_seed(model, column) if per_seed else []
    if seeds:
        text += " (" + ", ".join(f"{v:.1f}" for v in seeds) + ")"
    return text


def wall_time(out: Path) -> str:
    """Start and end of the newest Snakemake log that ran every job of `all` to the end."""
    logs = sorted(Path(".snakemake/log").glob("*.snakemake.log"))
    for log in reversed(logs):
        text = log.read_text()
        if "(100%) done" not in text or "rule all:" not in text or f"output: {out}/claims.md" not in text:
            continue
        stamps = re.findall(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", text, re.M)
        start = datetime.strptime(re.search(r"Date: ([\d-]+ [\d:]+)", text)[1], "%Y-%m-%d %H:%M:%S")
        end = datetime.strptime(stamps[-1], "%a %b %d %H:%M:%S %Y")
        jobs = re.search(r"(\d+) of \1 steps \(100%\) done", text)[1]
        minutes = (end - start).total_seconds() / 60
        return f"{log.name}: {jobs} jobs, started {start}, last job done {end}: {minutes:.1f} min"
    return "no complete run found in .snakemake/log"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    config = yaml.safe_load((a.results / "config.resolved.yaml").read_text())
    r = Results(config, str(PAPER_VALUES))
    columns = list(r.columns)
    lines = [f"Run: {wall_time(a.results)}", "",
             "| model | " + " | ".join(f"{c} ({r.columns[c]}) [95% CI] (seeds)" for c in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for m in models(r):
        lines.append(f"| {label(m, r.main_model)} | "
                     + " | ".join(cell(r, m, c, per_seed=True) for c in columns) + " |")
    if r.long_column:
        longest, term = r.answer_length(r.long_column), 17
        ks = list(range(term, longest, term))
        lines += ["", f"Percent of the {r.long_column} questions right through the first k characters "
                      "(mean over seeds):", "",
                  "| model | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---:|" * len(ks)]
        for m in models(r):
            shares = [r.prefix_match(m, r.long_column, k) for k in ks]
            if all(s is not None for s in shares):
                lines.append(f"| {label(m, r.main_model)} | " + " | ".join(f"{s.mean():.0f}" for s in shares) + " |")
    claims = (a.results / "claims.md").read_text()
    lines += ["", "Verdicts of claims.md:", ""]
    for row in re.findall(r"^\| (.+?) \| .+? \| \*\*(.+?)\*\* \|$", claims, re.M):
        lines.append(f"- {row[0]}: **{row[1]}**")
    text = "\n".join(lines) + "\n"
    out = a.out or a.results / "benchmarks" / "embedded_summary.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
