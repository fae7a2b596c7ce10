"""Does torch.compile speed up the decode step? Eager vs compiled pieces, side by side, outputs compared.

Variants per model (Ouro, MELT; random weights): each layer's MLP half compiled, or each whole
layer (the cache's Python bookkeeping breaks the graph, and the growing cache length recompiles
it). Median decode step after a warm-up; the logits of every step are compared with eager's.

    python benchmarks/compile_decode.py                  # cpu-mid, fp32, batch 1, context 256
    python benchmarks/compile_decode.py --context 1024
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from melt_core import ModelConfig, melt_from_ouro
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, save_benchmark


def compiled(model, how: str):
    m = copy.deepcopy(model)
    for layer in m.model.layers:
        if how == "mlp":
            layer._mlp_half = torch.compile(layer._mlp_half, dynamic=False)
        elif how == "layer":
            layer.forward = torch.compile(layer.forward, dynamic=False)
    return m


@torch.no_grad()
def decode(model, context: int, steps: int, warm_up: int) -> tuple[float, torch.Tensor]:
    ids = torch.randint(1, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(capacity=context + steps + 1)
    out = model(ids, cache=cache, chunk_size=64 if model.config.is_melt else None, logits="last")
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    times, logits = [], []
    for _ in range(steps):
        t = time.perf_counter()
        lo = model(token, cache=cache, logits="last").logits[:, -1]
        times.append(time.perf_counter() - t)
        logits.append(lo)
        token = lo.argmax(-1, keepdim=True)
    return statistics.median(times[warm_up:]), torch.cat(logits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/compile_decode"))
    a = p.parse_args()
    torch.manual_seed(0)
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), torch.float32)
    rows, lines = [], [f"shape {a.shape}, fp32, batch 1, context {a.context}, {torch.get_num_threads()} threads", "",
                       "| model | variant | decode tok/s | ratio to eager | max abs logit difference |",
                       "|---|---|---:|---:|---:|"]
    for name, model in (("ouro", ouro), ("melt", melt_from_ouro(ouro))):
        eager_s, eager = decode(model, a.context, a.steps, warm_up=10)
        for how in ("eager", "mlp", "layer"):
            variant = model if how == "eager" else compiled(model, how)
            step_s, logits = (eager_s, eager) if how == "eager" else decode(variant, a.context, a.steps, 10)
            diff = float((logits - eager).abs().max())
            rows.append({"model": name, "variant": how, "decode_tok_s": 1 / step_s, "ratio": eager_s / step_s,
                         "max_abs_diff": diff})
            lines.append(f"| {name} | {how} | {1 / step_s:.1f} | {eager_s / step_s:.2f} | {diff:.1e} |")
    save_benchmark(a.out, f"{a.shape}-ctx{a.context}", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
