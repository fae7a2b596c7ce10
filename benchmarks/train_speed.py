"""Training tokens/s of chunk-wise MELT against parallel Ouro distillation of the same shape,
sequence length and batch, measured side by side in one run (the paper's Table 11:
2,168 vs 20,646 tok/s = 0.105x), and how it scales with the chunk size C.

    python benchmarks/train_speed.py                 # cpu-mid shape, 2 layers, L = 512
    python benchmarks/train_speed.py --quick
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from melt_core import ModelConfig
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import save_benchmark, train_throughput


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/train_speed"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.seq_len, a.chunks, a.steps = "tiny", 128, [16, 128], 2
    cfg = ModelConfig(model_type="ouro", **{**SPEED_SHAPES[a.shape], "num_hidden_layers": a.layers})
    rows = train_throughput(cfg, a.seq_len, a.batch, a.chunks, a.steps, torch.float32)
    lines = ["| model | C | tokens/s | ratio to Ouro |", "|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['chunk']} | {r['tokens_per_s']:.0f} | {r['ratio_to_ouro']:.2f} |" for r in rows]
    save_benchmark(a.out, a.shape, rows,
                   f"shape {a.shape}, {a.layers} layers, L={a.seq_len}, batch {a.batch}\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
