"""The ordinary decode step against the early-exit path, side by side in one run: MELT's
``LoopedLM.forward`` on one token, ``early_exit.decode_step`` forced to run every loop, and the same
stopped after loop 1 (whose ideal ratio to all loops is T). Rounds in turn, so load drift hits all
three alike; medians over every step. Random weights (speed depends on shapes, not values).

    python benchmarks/decode_paths.py                    # cpu-mid shape, fp32, context 256, 1 thread
    python benchmarks/decode_paths.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from melt_core import ModelConfig, melt_from_ouro
from melt_core.modeling.early_exit import ExitRule, decode_step
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="decode steps per path per round")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), torch.float32)
    melt = melt_from_ouro(ouro).eval()
    T = melt.num_loops
    ids = torch.randint(1, melt.config.vocab_size, (1, a.context))
    token = torch.tensor([[5]])

    def cache():
        c = melt.new_cache(capacity=a.context + a.rounds * a.steps + 1)
        with torch.no_grad():
            melt(ids, cache=c, chunk_size=64, logits="last")
        return c

    @torch.no_grad()
    def ordinary(c):
        melt(token, cache=c, logits="last")

    def stopped_at(loop):
        @torch.no_grad()
        def run(c):
            decode_step(melt, token, c, torch.full_like(token, c.seen), ExitRule(exit_at_loop=loop))
        return run

    paths = {"ordinary forward": ordinary, f"early-exit path, all {T} loops": stopped_at(T),
             "early-exit path, stopped after loop 1": stopped_at(1)}
    caches = {name: cache() for name in paths}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(a.rounds):
        for name, run in paths.items():
            for _ in range(a.steps):
                t0 = time.perf_counter()
                run(caches[name])
                times[name].append(time.perf_counter() - t0)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    full = ms[f"early-exit path, all {T} loops"]
    print(f"shape {a.shape}, fp32, MELT, context {a.context}, {a.threads} thread(s), "
          f"{a.rounds} rounds x {a.steps} steps")
    print("| path | ms per step (median) | all-loops early-exit path / this |\n|---|---:|---:|")
    for name, v in ms.items():
        print(f"| {name} | {v:.2f} | {full / v:.2f} |")


if __name__ == "__main__":
    main()
