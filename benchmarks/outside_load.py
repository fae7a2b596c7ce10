"""How much one busy process beside it slows the embedded default's two kinds of long job, under
each OpenMP wait policy (config cpu_numerics.wait_policy; docs/REPRODUCIBILITY.md):

  teacher  the tiny teacher's training step (rule pretrain_teacher: 2 threads, batch 32 x 208)
  phase    a chunk-wise MELT training step at the embedded shapes (rule phase: 1 thread,
           batch 16 x 208, C = 16), beside parallel Ouro distillation as the profiler times it

Each (job, policy) is timed alone and beside `python -c "while True: pass"`, alternately, in fresh
processes; the table gives seconds per step and the slowdown. A second table prices the pinned
kernels (cpu_numerics.kernels): the teacher's step on one thread with ATen's AVX512, AVX2 and
unvectorised kernels (MKL's path as pinned: AVX2, strict). Writes results/benchmarks/outside_load.md.

    python benchmarks/outside_load.py            # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cpu_numerics import KERNELS  # noqa: E402

MKL_PINNED = {k: v for k, v in KERNELS["avx2"].items() if k.startswith("MKL")}  # MKL's path as the jobs run it

TEACHER = """
import os, sys, time, torch
from melt_core.modeling.config import ModelConfig
from melt_core.modeling.losses import lm_loss_sum
from melt_core.modeling.model import LoopedLM
from melt_core.modeling.shapes import SPEED_SHAPES
torch.set_num_threads(int(os.environ["TEACHER_THREADS"]))
torch.manual_seed(0)
cfg = ModelConfig(model_type="ouro", **SPEED_SHAPES["embedded"])
model = LoopedLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
times = []
for step in range(int(sys.argv[1]) + 1):
    ids = torch.randint(3, 24, (32, 209))
    t0 = time.perf_counter()
    out = model(ids[:, :-1], logits="all")
    mask = torch.ones_like(ids[:, 1:], dtype=torch.bool)
    loss = sum(lm_loss_sum(lo, ids[:, 1:], mask) for lo in out.per_loop_logits)
    opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t0)
print(sorted(times[1:])[len(times[1:]) // 2])
"""

PHASE = """
import sys, torch
from melt_core.modeling.config import ModelConfig
from melt_core.ops.profiler import train_throughput
from melt_core.modeling.shapes import SPEED_SHAPES
torch.set_num_threads(1)
cfg = ModelConfig(model_type="ouro", **SPEED_SHAPES["embedded"])
rows = train_throughput(cfg, 208, 16, [16], steps=int(sys.argv[1]))
print(16 * 208 / next(r for r in rows if r["model"] == "melt-C16")["tokens_per_s"])
"""


def seconds_per_step(code: str, steps: int, policy: str, busy: bool, kernels: str = "avx2", threads: int = 2) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": policy.upper(), "ATEN_CPU_CAPABILITY": kernels,
           **MKL_PINNED, "TEACHER_THREADS": str(threads)}
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run([sys.executable, "-c", code, str(steps)], env=env, capture_output=True, text=True,
                             check=True, timeout=900)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="alone/beside pairs per (job, policy), alternating")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "outside_load.md")
    a = ap.parse_args()
    lines = [f"Median seconds per step over {a.rounds} runs of {a.steps} steps, alone and beside one busy "
             f"process, {os.cpu_count()} CPUs. Command: `python benchmarks/outside_load.py`.", "",
             "| job | OMP_WAIT_POLICY | alone s/step | beside a busy process s/step | slowdown |",
             "|---|---|---:|---:|---:|"]
    for job, code in (("teacher (2 threads)", TEACHER), ("phase (1 thread)", PHASE)):
        for policy in ("active", "passive"):
            alone, beside = [], []
            for _ in range(a.rounds):
                alone.append(seconds_per_step(code, a.steps, policy, busy=False))
                beside.append(seconds_per_step(code, a.steps, policy, busy=True))
            m0, m1 = statistics.median(alone), statistics.median(beside)
            lines.append(f"| {job} | {policy} | {m0:.3f} | {m1:.3f} | {m1 / m0:.2f}x |")
            print(lines[-1], flush=True)
    lines += ["", "What the pinned kernels cost: the teacher's step, one thread, alone:", "",
              "| ATen kernels | s/step | vs AVX2 |", "|---|---:|---:|"]
    cost = {k: statistics.median(seconds_per_step(TEACHER, a.steps, "passive", False, k, 1) for _ in range(a.rounds))
            for k in ("avx512", "avx2", "default")}
    lines += [f"| {k} | {v:.3f} | {v / cost['avx2']:.2f}x |" for k, v in cost.items()]
    print("\n".join(lines[-3:]), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
