"""Why do some students stay on their plateau? Train a finished run's phase again under other data
orders and settings and count how many seeds escape (docs/PREREGISTRATION.md: KD, mean of the last
``report.escape_last`` steps, below ``report.escape_kd``).

Each trial replays one phase job of the main job from its ``resolved_train_config.json`` (same
converted student, the same teacher, the same data file), with the data-order seed and any
TrainConfig field changed, in a fresh interpreter on one thread under the workflow's CPU pins.
Only the training loss is read: no test question is seen. A data seed is the data order and the
training RNG; the gates' random init is the main job's conversion unless ``--gate-seeds`` converts
the same teacher again with other seeds (rule convert's options, ``convert:`` of the run's config).

    python benchmarks/escape_sweep.py --gates ema last scalar elementwise --data-seeds 0 1 2 3
    python benchmarks/escape_sweep.py --gates last --variant default: --variant long:steps=300 --judge-at 150
    python benchmarks/escape_sweep.py --gates scalar --gate-seeds 0 1 2 3 --data-seeds 0

A variant is ``NAME:key=value,key=value``: a TrainConfig field (``lr_model``, ``warmup_steps``,
``kd_temperature``, ...) or ``steps`` (the last phase's steps), ``alpha_start`` (its interpolation
start); ``default:`` changes nothing and is the only variant when none is given. A trial is judged
at its last step and at each ``--judge-at`` step (the learning rate is constant after its warm-up,
so a 300-step trial's first 150 steps are the 150-step run). Writes
results/benchmarks/escape_sweep/{escape_sweep.json, escape_sweep.md}: per trial the KD at a few
steps and the step its 10-step mean first fell below the threshold; per (run, variant, step judged)
k of n seeds escaped with the exact 95% interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import yaml

from melt_core.training.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import pinned_env  # noqa: E402
from report_common import escapes  # noqa: E402
from verdicts import clopper_pearson  # noqa: E402

CHILD = ("import json, sys, torch; torch.set_num_threads(1); "
         "from melt_core.training.train import train; train(json.load(open(sys.argv[1])))")
PHASE_KEYS = {"steps", "alpha_start", "alpha_end", "align_beta"}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
READ_AT = (10, 30, 75, 150, 300)


def scalar(text: str):
    """A variant's value: a number where it reads as one (YAML takes 3e-3 for a string), else YAML."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def parse_variant(text: str) -> tuple[str, dict]:
    """'NAME:key=value,...' -> (NAME, {key: value})."""
    name, _, body = text.partition(":")
    if not name or (body and "=" not in body):
        raise SystemExit(f"--variant {text!r}: write NAME:key=value[,key=value] (e.g. long:steps=300)")
    sets = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        sets[key.strip()] = scalar(value.strip())
    return name, sets


def trial_config(resolved: dict, data_seed: int, sets: dict, out_dir: Path, teacher_cache: Path) -> dict:
    """The phase job's own config with the data order and the variant's fields changed; no MLflow."""
    cfg = json.loads(json.dumps(resolved))
    cfg.update(seed=data_seed, out_dir=str(out_dir), teacher_cache=str(teacher_cache), mlflow=None,
               progress=False, print_every=10_000, run_name=f"escape sweep {out_dir.name}")
    for key, value in sets.items():
        if key in PHASE_KEYS:
            cfg["phases"][-1][key] = value
        elif key in TRAIN_FIELDS:
            cfg[key] = value
        else:
            raise SystemExit(f"variant field {key!r} is neither a TrainConfig field nor one of {sorted(PHASE_KEYS)}")
    return cfg


def convert_again(teacher: str, gate: str, seed: int, options: dict, out: Path) -> str:
    """The teacher converted as rule convert converts it, the gates drawn with ``seed`` (kept)."""
    from melt_core.modeling.checkpoint import convert_ouro_to_melt

    if not (out / "config.json").is_file():
        convert_ouro_to_melt(teacher, out, gate=gate, **{**options, "seed": seed})
    return str(out)


def curve(metrics: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows)


def escape_step(kd: pd.Series, threshold: float, last: int) -> int | None:
    """The first step whose ``last``-step mean KD is below the threshold (None: never)."""
    rolled = kd.rolling(last).mean()
    below = rolled[rolled < threshold]
    return None if below.empty else int(below.index[0]) + 1


def run_trial(cfg: dict, env: dict) -> float:
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_config.json").write_text(json.dumps(cfg, indent=2))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(out / "sweep_config.json")], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"trial {out} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def summarize(rows: list[dict]) -> list[dict]:
    """Per (run, variant, judged at step S): k of n seeds escaped by S, the exact 95% interval."""
    out = []
    for (run, variant), g in pd.DataFrame(rows).groupby(["run", "variant"], sort=False):
        judged = {int(k.split("@")[1]) for r in g.to_dict("records") for k, v in r.items()
                  if k.startswith("escaped@") and v == v}  # a column of another variant's steps is NaN here
        for at in sorted(judged):
            flags = [bool(f) for f in g[f"escaped@{at}"] if f == f]
            k, n = sum(flags), len(flags)
            lo, hi = clopper_pearson(k, n, 0.95)
            steps = [s for s in g.escape_step if s == s and s is not None and s <= at]
            out.append({"run": run, "variant": variant, "at": at, "escaped": k, "seeds": n, "rate_lo": 100 * lo,
                        "rate_hi": 100 * hi, "median_escape_step": statistics.median(steps) if steps else None,
                        "final_kd": [round(v, 2) for v in g[f"kd_last@{at}"] if v == v]})
    return out


def render(summary: list[dict], rows: list[dict], meta: dict) -> str:
    lines = ["# Escape sweep", "", f"{meta['command']}", "",
             f"teacher seed {meta['teacher_seed']}; escape: KD, mean of the last {meta['last']} steps, below "
             f"{meta['threshold']}; {meta['machine']}; {meta['wall_s']:.0f} s wall, {meta['jobs']} at a time", "",
             "| run | variant | judged at step | escaped | rate, exact 95% CI | median escape step | "
             "KD, mean of the last steps (data seeds) |", "|---|---|---:|---:|---|---:|---|"]
    for s in summary:
        step = "-" if s["median_escape_step"] is None else f"{s['median_escape_step']:.0f}"
        lines.append(f"| {s['run']} | {s['variant']} | {s['at']} | {s['escaped']} of {s['seeds']} | "
                     f"[{s['rate_lo']:.0f}%, {s['rate_hi']:.0f}%] | {step} | {', '.join(map(str, s['final_kd']))} |")
    lines += ["", "| run | variant | gates' seed | data seed | " + " | ".join(f"KD @{s}" for s in READ_AT)
              + " | escape step | s |", "|---|---|---:|---:|" + "---:|" * (len(READ_AT) + 2)]
    for r in rows:
        kd = " | ".join("-" if r.get(f"kd@{s}") is None else f"{r[f'kd@{s}']:.2f}" for s in READ_AT)
        gates = "job's" if r.get("gate_seed") is None else r["gate_seed"]
        lines.append(f"| {r['run']} | {r['variant']} | {gates} | {r['data_seed']} | {kd} | "
                     f"{'-' if r['escape_step'] is None else r['escape_step']} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="the finished main job's outdir")
    ap.add_argument("--teacher-seed", type=int, default=0, help="the training seed whose teacher and conversion")
    ap.add_argument("--gates", nargs="+", default=["ema", "last", "scalar", "elementwise"])
    ap.add_argument("--path", default="phase1_no_interp",
                    help="the phase job: its folder under runs/seed<n>/<gate>/ (default: the gates' recipe)")
    ap.add_argument("--data-seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--gate-seeds", nargs="*", type=int, default=None,
                    help="convert the teacher again with these seeds (the gates' init); default: the job's own")
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (repeatable)")
    ap.add_argument("--judge-at", nargs="*", type=int, default=[150],
                    help="also judge the escape at these steps (the LR is constant: a longer trial's first S steps "
                         "are the S-step run); the trial's last step always")
    ap.add_argument("--jobs", type=int, default=2, help="trials at once, one thread each")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    resolved_cfg = args.results / "config.resolved.yaml"  # rule resolved_config's record of what ran
    config = yaml.safe_load((resolved_cfg if resolved_cfg.is_file() else ROOT / "config/default.yaml").read_text())
    threshold, last = config["report"]["escape_kd"], config["report"].get("escape_last", 10)
    variants = [parse_variant(v) for v in args.variant or ["default:"]]
    out = args.out or args.results / "benchmarks" / "escape_sweep"
    env = {**os.environ, **pinned_env(config.get("cpu_numerics")), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    trials = []
    for gate in args.gates:
        run_dir = args.results / "runs" / f"seed{args.teacher_seed}" / gate / args.path
        resolved_path = run_dir / "resolved_train_config.json"
        if not resolved_path.is_file():
            raise SystemExit(f"{resolved_path} is missing: run the main job first (snakemake --profile local all)")
        resolved = json.loads(resolved_path.read_text())
        for gate_seed in args.gate_seeds if args.gate_seeds is not None else [None]:
            start = dict(resolved)
            if gate_seed is not None:
                if resolved.get("init_from"):
                    raise SystemExit(f"--gate-seeds: {args.path} continues an earlier phase (init_from), whose "
                                     "weights hold the gates; give the path of a first phase")
                start["student"] = convert_again(resolved["teacher"], gate, gate_seed, config["convert"],
                                                 out / "converted" / f"{gate}-gates{gate_seed}")
            for name, sets in variants:
                for seed in args.data_seeds:
                    tag = "" if gate_seed is None else f"-gates{gate_seed}"
                    trial_dir = out / "trials" / f"{gate}-{args.path}-{name}{tag}-data{seed}"
                    trials.append(({"run": f"{gate} {args.path}", "variant": name,
                                    "gate_seed": gate_seed, "data_seed": seed},
                                   trial_config(start, seed, sets, trial_dir, out / "teacher_logits")))
    t0 = time.perf_counter()
    print(f"{len(trials)} trials, {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        walls = list(pool.map(lambda t: run_trial(t[1], env), trials))
    rows = []
    for (row, cfg), wall in zip(trials, walls):
        c = curve(Path(cfg["out_dir"]) / "metrics.jsonl").sort_values("step").reset_index(drop=True)
        c["run"], c["seed"] = row["run"], row["data_seed"]
        for at in sorted({*args.judge_at, len(c)}):  # the report's rule on the curve up to step `at`
            if at <= len(c):
                (row[f"escaped@{at}"], row[f"kd_last@{at}"]), = escapes(c[c.step <= at], threshold, last).values()
        flag, final = row[f"escaped@{len(c)}"], row[f"kd_last@{len(c)}"]  # judged at its last step
        row.update(escaped=flag, final_kd=final, escape_step=escape_step(c.kd, threshold, last), wall_s=wall,
                   **{f"kd@{s}": float(c.kd.iloc[s - 1]) for s in READ_AT if s <= len(c)})
        rows.append(row)
        print(f"{row['run']} {row['variant']} data {row['data_seed']}: final KD {final:.2f}, "
              f"escape step {row['escape_step']}", flush=True)
    summary = summarize(rows)
    from numerics_probe import machine  # benchmarks/: the CPU model line every benchmark records
    meta = {"command": "python benchmarks/escape_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "teacher_seed": args.teacher_seed, "threshold": threshold, "last": last, "jobs": args.jobs,
            "wall_s": time.perf_counter() - t0, "machine": "{vendor} {cpu}, torch {torch}".format(**machine())}
    out.mkdir(parents=True, exist_ok=True)
    (out / "escape_sweep.json").write_text(json.dumps({"meta": meta, "summary": summary, "trials": rows}, indent=2))
    (out / "escape_sweep.md").write_text(render(summary, rows, meta))
    print(render(summary, rows, meta))


if __name__ == "__main__":
    main()
