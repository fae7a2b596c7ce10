"""What the CPU pins cost a training step (config cpu_numerics; docs/REPRODUCIBILITY.md): the
embedded default's two training steps, timed under each pin set of benchmarks/numerics_probe.py in
fresh interpreters, the pin sets interleaved round by round so that a slow moment of the machine
falls on all of them alike:

  teacher  source.pretrain's step: batch 32 x 208 tokens, 4 loops, per-loop LM loss, AdamW, 2 threads
  phase    a MELT phase step: batch 16 x 208, chunk-wise C = 16, KD on every loop, AdamW, 1 thread

    python benchmarks/pin_cost.py              # 3 rounds of 4 timed steps each
    python benchmarks/pin_cost.py --rounds 5

Writes results/benchmarks/pin_cost/{pin_cost.json,pin_cost.md}: each set's median step and its
ratio to the unpinned step (this machine's own kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from numerics_probe import PIN_SETS, PINNED_VARS, machine  # noqa: E402

CHILD = r'''
import json, sys, time, torch
from melt_core.modeling.checkpoint import melt_from_ouro
from melt_core.modeling.config import ModelConfig
from embedded_steps import phase_step, teacher_step
from melt_core.modeling.model import LoopedLM
from melt_core.modeling.shapes import SPEED_SHAPES
which, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
teacher = LoopedLM(ModelConfig(model_type="ouro", total_ut_steps=4, **SPEED_SHAPES["embedded"]))
if which == "teacher":
    torch.set_num_threads(2)
    opt = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    def step():
        teacher_step(teacher, opt, torch.randint(3, 24, (32, 209), generator=g))
else:
    torch.set_num_threads(1)
    teacher.eval()
    student = melt_from_ouro(teacher, gate="elementwise").train()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    def step():
        phase_step(teacher, student, opt, torch.randint(3, 24, (16, 208), generator=g))
step()  # warm-up
times = []
for _ in range(steps):
    t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
print("JSON" + json.dumps(times))
'''


def time_steps(pins: dict[str, str], which: str, steps: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_VARS and not k.startswith(("MKL_", "ONEDNN_"))}
    env.update(pins, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    done = subprocess.run([sys.executable, "-c", CHILD, which, str(steps)], env=env, capture_output=True,
                          text=True, timeout=900, check=True)
    return json.loads(done.stdout.split("JSON", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round (after one warm-up step)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "pin_cost")
    args = ap.parse_args()
    times = {(name, which): [] for name in PIN_SETS for which in ("teacher", "phase")}
    for r in range(args.rounds):
        for (name, which), got in times.items():
            got += time_steps(PIN_SETS[name], which, args.steps)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    med = {key: statistics.median(v) for key, v in times.items()}
    rows = [{"pins": name, "step": which, "median_s": med[(name, which)], "min_s": min(times[(name, which)]),
             "max_s": max(times[(name, which)]), "ratio_to_unpinned": med[(name, which)] / med[("unpinned", which)],
             "env": PIN_SETS[name]} for name, which in times]
    lines = ["| step | pins | median s | min-max s | / unpinned |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['step']} | {r['pins']} | {r['median_s']:.3f} | {r['min_s']:.3f}-{r['max_s']:.3f} "
              f"| {r['ratio_to_unpinned']:.2f} |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    (args.out / "pin_cost.json").write_text(json.dumps({**info, "rounds": args.rounds, "steps": args.steps,
                                                        "rows": rows}, indent=1))
    text = (f"{info['cpu']} ({', '.join(info['vendor isa'])}); {args.rounds} rounds x {args.steps} steps, "
            "pin sets interleaved\n\n" + "\n".join(lines) + "\n")
    (args.out / "pin_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
