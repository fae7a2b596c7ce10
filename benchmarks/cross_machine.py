"""Does the embedded default reach the same conclusions on any machine? (docs/REPRODUCIBILITY.md)

Runs the workflow (default: `all`, so the teacher, every trained run, the gate and recipe
ablations, their evals and claims) under two settings that emulate two machines, side by side:

  A  this CPU's own kernels (AVX512 here), two cores: a two-thread job gets two threads
  B  ATen's unvectorised kernels, MKL asked for its SSE4.2 path, one core: one thread per job

then compares what they produced: every checkpoint's bytes, every eval's per-question completions
and scores, each model's accuracy and each claim's verdict, and writes
results/benchmarks/cross_machine.md, whose last line is `verdict flips: N` (a flip: holds on one
side, does not hold on the other; a verdict inconclusive on one side only is listed, not counted).
Timing claims (decode and training speed) are measurements of the machine and are listed apart.

Unless --no-control, it also trains the teacher alone under A and B with the pins off
(cpu_numerics.pinned: false): where the two first differ, how the difference grows, and which
checkpoint each one's early stop keeps, the trail behind the pins.

    python benchmarks/cross_machine.py                 # the embedded default, its seeds (two)
    python benchmarks/cross_machine.py --seeds 0       # one training seed (about half the time)
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import PINNED_VARS  # noqa: E402

MACHINES = {
    "A": ("this CPU's own kernels, 2 cores (two threads for a two-thread job)", {}, 2),
    "B": ("ATen's unvectorised kernels, MKL's SSE4.2 path, 1 core (one thread per job)",
          {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "1"}, 1),
}
DECIDED = {"holds", "does not hold"}
TIMING = re.compile(r"decodes|slower than parallel|tok/s", re.I)


def stamp(msg: str) -> None:
    print(f"{datetime.now():%Y-%m-%d %H:%M:%S} {msg}", flush=True)


def overlay(out: Path, name: str, base: Path, seeds, extra: dict | None = None) -> Path:
    """A config overlay on `base` that only moves the outputs (and MLflow store) to out/name."""
    outdir = Path(os.path.relpath(out / name, ROOT))  # as a user's config says it: relative to the repository
    layer = {"overlays": os.path.relpath(base, out), "name": f"cross-machine-{name}", "outdir": str(outdir),
             "mlflow": {"tracking_uri": f"sqlite:///{outdir}/mlflow.db", "experiment": f"melt-cross-machine-{name}"},
             **({"seeds": seeds} if seeds else {}), **(extra or {})}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(layer, sort_keys=False))
    return path


def run_machines(out: Path, runs: dict[str, tuple[Path, list[str]]]) -> dict[str, float]:
    """Run snakemake for each (machine name -> (overlay, targets)) at once; their wall seconds."""
    procs, started, walls = {}, {}, {}
    for name, (layer, targets) in runs.items():
        _, env, cores = MACHINES[name.split("-")[0]]
        env = {**{k: v for k, v in os.environ.items() if k not in PINNED_VARS}, **env}
        log = open(out / f"{name}.log", "w")
        cmd = [str(ROOT / ".venv/bin/snakemake"), *targets, "--profile", "profiles/local", "--configfile",
               str(layer), "--cores", str(cores)]
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        started[name] = time.perf_counter()
        stamp(f"{name}: started ({' '.join(cmd[1:])}), log {out / f'{name}.log'}")
    while procs:
        time.sleep(30)
        for name, (p, log) in list(procs.items()):
            done = re.findall(r"(\d+) of (\d+) steps", (out / f"{name}.log").read_text(errors="replace"))
            if p.poll() is None:
                stamp(f"{name}: {done[-1][0] + ' of ' + done[-1][1] if done else 0} jobs done")
                continue
            log.close()
            walls[name] = time.perf_counter() - started[name]
            del procs[name]
            if p.returncode:
                raise SystemExit(f"{name}: snakemake failed (exit {p.returncode}); see {out / f'{name}.log'}")
            stamp(f"{name}: finished in {walls[name] / 60:.1f} min")
    return walls


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


EXIT_TIMINGS = ("seconds", "tokens_per_s")  # an early-exit sweep row's measurements of the machine


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def artifacts(outdir: Path) -> dict[str, str]:
    """What a run computed, by relative path: weights' bytes, each eval's per-question completions
    and scores, and each early-exit sweep's rows (accuracy, loops used, every question's score, from
    the refit exit gate); timings left out: a machine's speed, not its arithmetic."""
    found = {str(p.relative_to(outdir)): sha(p) for p in sorted(outdir.glob("**/*.safetensors"))}
    for p in sorted((outdir / "eval").glob("**/*.json")):
        d = json.loads(p.read_text())
        found[str(p.relative_to(outdir))] = _digest({"metrics": d.get("metrics"), "details": d.get("details")})
    for p in sorted((outdir / "early_exit").glob("*.json")):
        rows = json.loads(p.read_text())["rows"]
        found[str(p.relative_to(outdir))] = _digest([{k: v for k, v in r.items() if k not in EXIT_TIMINGS}
                                                     for r in rows])
    return found


def accuracies(outdir: Path) -> dict[tuple[str, str, str], float]:
    """(model, task, metric) -> mean over seeds, from the gathered summary."""
    sums: dict = {}
    with open(outdir / "summary" / "evals.csv") as f:
        for row in csv.DictReader(f):
            key = (row["model"], row["task"], row["metric"])
            sums.setdefault(key, []).append(float(row["value"]))
    return {k: sum(v) / len(v) for k, v in sums.items()}  # the summary's values are percent already


def verdicts(outdir: Path) -> dict[str, str]:
    """claim -> verdict, from claims.md's table."""
    rows = {}
    for line in (outdir / "claims.md").read_text().splitlines():
        m = re.match(r"\| (.+?) \| .* \| \*\*(.+?)\*\* \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def compare_verdicts(ver_a: dict[str, str], ver_b: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """The verdict table's rows, the flips (a claim that holds on one side and does not hold on the
    other) and the claims decided on one side only (inconclusive, not measurable or missing on the
    other). Timing claims measure the machine, not the method: listed, never counted."""
    rows, flips, one_sided = [], [], []
    for claim in sorted(ver_a.keys() | ver_b.keys(), key=lambda c: (bool(TIMING.search(c)), c)):
        va, vb = ver_a.get(claim, "-"), ver_b.get(claim, "-")
        timing = bool(TIMING.search(claim))
        rows.append(f"| {claim}{' (timing: a measurement of the machine)' if timing else ''} | {va} | {vb} |")
        decided = [v.split(" (")[0] in DECIDED for v in (va, vb)]
        if timing or va == vb or not any(decided):
            continue
        (flips if all(decided) else one_sided).append(claim)
    return rows, flips, one_sided


def teacher_trail(outdir: Path) -> dict:
    """The unpinned teacher's loss every 10 steps (MLflow), its dev checks and kept step (its log)."""
    with sqlite3.connect(outdir / "mlflow.db") as db:
        loss = dict(db.execute("select step, value from metrics where key = 'pretrain/loss' order by step"))
    log = (outdir / "logs" / "pretrain_teacher.log").read_text(errors="replace")
    checks = {int(s): (float(a), float(c)) for s, a, c in
              re.findall(r"step (\d+): dev greedy exact-match exact_match ([\d.]+), chain/exact_match ([\d.]+)", log)}
    kept = re.search(r"teacher: the state after step (\d+)", log)
    weights = next(outdir.glob("checkpoints/ouro/*.safetensors"))
    return {"loss": loss, "checks": checks, "kept": int(kept.group(1)) if kept else None, "sha": sha(weights)}


def control_section(a: dict, b: dict) -> list[str]:
    steps = sorted(set(a["loss"]) & set(b["loss"]))
    first = next((s for s in steps if a["loss"][s] != b["loss"][s]), None)
    lines = ["## Control: the teacher with the pins off", "",
             f"First logged step whose loss differs: {first if first is not None else 'none'} (losses are "
             f"logged every 10 steps; teacher weights {'identical' if a['sha'] == b['sha'] else 'differ'}).",
             "", "| step | loss A | loss B | abs difference |", "|---:|---:|---:|---:|"]
    for s in [x for x in steps if x in (0, 10, 50, first) or x % 100 == 0]:
        lines.append(f"| {s} | {a['loss'][s]!r} | {b['loss'][s]!r} | {abs(a['loss'][s] - b['loss'][s]):.2e} |")
    lines += ["", "Dev-half greedy exact-match at each check (digit_sum / chain_sum), and the step each early "
              "stop kept:", "", "| step | A | B |", "|---:|---:|---:|"]
    for s in sorted(set(a["checks"]) | set(b["checks"])):
        cell = [f"{100 * x['checks'][s][0]:.1f} / {100 * x['checks'][s][1]:.1f}" if s in x["checks"] else "-"
                for x in (a, b)]
        lines.append(f"| {s} | {cell[0]} | {cell[1]} |")
    lines += [f"| kept | step {a['kept']} | step {b['kept']} |", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "default.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", help="training seeds (default: the config's)")
    ap.add_argument("--targets", nargs="+", default=["all"])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cross_machine")
    ap.add_argument("--report", type=Path, default=ROOT / "results" / "benchmarks" / "cross_machine.md")
    ap.add_argument("--no-control", dest="control", action="store_false")
    ap.add_argument("--report-only", action="store_true", help="compare the outputs of an earlier run again")
    a = ap.parse_args()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    runs = {m: (overlay(a.out, m, a.config.resolve(), a.seeds), a.targets) for m in MACHINES}
    if a.control:
        runs |= {f"{m}-unpinned": (overlay(a.out, f"{m}-unpinned", a.config.resolve(), a.seeds,
                                           {"cpu_numerics": {"pinned": False},  # one teacher: rule target
                                            "source": {"pretrain": {"per_seed": False}}}), ["pretrain_teacher"])
                 for m in MACHINES}
    walls = json.loads((a.out / "walls.json").read_text()) if a.report_only else run_machines(a.out, runs)
    (a.out / "walls.json").write_text(json.dumps(walls))

    (da, db) = (a.out / m for m in MACHINES)
    fa, fb = artifacts(da), artifacts(db)
    differ = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
    acc_a, acc_b = accuracies(da), accuracies(db)
    ver_a, ver_b = verdicts(da), verdicts(db)
    lines = ["# The embedded default on two emulated machines", "",
             f"{datetime.now():%Y-%m-%d %H:%M}, config {os.path.relpath(a.config.resolve(), ROOT)}, seeds "
             f"{a.seeds or 'of the config'}, targets {' '.join(a.targets)}, pinned as the config says "
             "(cpu_numerics). Command: `python benchmarks/cross_machine.py"
             + (f" --seeds {' '.join(map(str, a.seeds))}" if a.seeds else "") + "`.", ""]
    lines += [f"- {m}: {desc}; {walls[m] / 60:.1f} min" for m, (desc, _, _) in MACHINES.items()]
    lines += ["", f"Compared: {len(fa.keys() | fb.keys())} artifacts (every checkpoint's weights, every eval's "
              f"per-question completions and scores, every early-exit sweep's rows): "
              + ("**bitwise identical**." if not differ
                 else f"**{len(differ)} differ**: " + ", ".join(differ[:20])), ""]
    lines += ["## Accuracy (mean over seeds, %)", "", "| model | task | metric | A | B |", "|---|---|---|---:|---:|"]
    for k in sorted(acc_a.keys() | acc_b.keys()):
        lines.append(f"| {' | '.join(k)} | {acc_a.get(k, float('nan')):.1f} | {acc_b.get(k, float('nan')):.1f} |")
    rows, flips, one_sided = compare_verdicts(ver_a, ver_b)
    lines += ["", "## Verdicts", "", "| claim | A | B |", "|---|---|---|", *rows]
    lines += ["", f"Decided on one side only (listed, not counted): {one_sided or 'none'}", ""]
    if a.control:
        lines += control_section(teacher_trail(a.out / "A-unpinned"), teacher_trail(a.out / "B-unpinned"))
    lines.append(f"verdict flips: {len(flips)}" + (f" ({'; '.join(flips)})" if flips else ""))
    a.report.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.report.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(a.report)
    stamp(f"wrote {a.report}: verdict flips {len(flips)}, {len(differ)} artifacts differ")


if __name__ == "__main__":
    main()
