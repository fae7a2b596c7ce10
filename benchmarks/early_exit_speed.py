"""Decode tokens/s against loops per token with real early exit, Ouro and MELT side by side.

Every decoded token is forced to stop after loop d (d = 1..T; d = T is today's decoding, the
standard path): the skipped loops are not run, so a stop after d of T loops should approach
T / d times the tokens/s at batch 1, less what each step spends outside the loops (embedding,
lm_head, sampling, Python). Weights are random: speed depends on shapes, not values; the default
shape is the real Ouro-1.4B (MELT-1.6B with its gates) in bfloat16.

    python benchmarks/early_exit_speed.py                     # real 1.4B shape, batch 1, context 64
    python benchmarks/early_exit_speed.py --shape cpu-mid --dtype float32 --contexts 256 1024
    python benchmarks/early_exit_speed.py --quick             # tiny shape, a few seconds
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from melt_core import ModelConfig, melt_from_ouro
from melt_core.modeling.early_exit import ExitRule
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, compare_decode, save_benchmark


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="ouro-1.4b", help="a real preset (ouro-1.4b, ouro-2.6b) or a CPU shape")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--contexts", type=int, nargs="+", default=[64])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--quick", action="store_true", help="tiny shape, float32, short run")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/early_exit_speed"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.dtype, a.contexts, a.steps, a.rounds = "tiny", "float32", [64], 8, 1
    cfg = (ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]) if a.shape in SPEED_SHAPES
           else ModelConfig.from_name(a.shape))
    ouro = build_random(cfg, getattr(torch, a.dtype))
    base = {"ouro": ouro, "melt": melt_from_ouro(ouro)}
    T = cfg.total_ut_steps
    models, rules = {}, {}
    for name, model in base.items():
        for depth in range(1, T + 1):
            key = f"{name}@{depth}"
            models[key] = model
            if depth < T:  # d = T: the standard decoding path, the reference
                rules[key] = ExitRule(exit_at_loop=depth)
    rows = compare_decode(models, [a.batch], a.contexts, a.steps, a.rounds, prefill_chunk=64, exit_rules=rules)
    by = {(r["model"], r["context"]): r["decode_tok_s"] for r in rows}
    lines = [f"shape {a.shape}, {a.dtype}, batch {a.batch}, {torch.get_num_threads()} threads; every decoded token "
             f"stops after loop d of {T}", "",
             "| model | context | loops per token | decode tok/s | speedup vs all loops | ideal (T / d) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        name, depth = r["model"].split("@")
        r["loops"], r["speedup"] = int(depth), r["decode_tok_s"] / by[f"{name}@{T}", r["context"]]
        lines.append(f"| {name} | {r['context']} | {depth} | {r['decode_tok_s']:.2f} | {r['speedup']:.2f} | "
                     f"{T / int(depth):.2f} |")
    save_benchmark(a.out, a.shape, rows, "\n".join(lines))


if __name__ == "__main__":
    main()
