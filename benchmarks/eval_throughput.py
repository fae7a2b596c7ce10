"""Eval throughput of Ouro and MELT under one memory budget, static vs continuous batches, side by side.

The workload is an eval's: prompts of mixed length, several samples each, completions of skewed
length as reasoning traces have (most short, a few long). Weights are random, so the lengths are
set by the stop token: a hook on lm_head gives it probability p = 1 / mean at every step, whatever
the other logits, which makes completion lengths geometric (mean ``--mean-new``, capped at
``--max-new``; the longest of a batch of 8 is ~2.7x the mean). Each model's batches are planned
from the same budget (weights + caches + activations, ``generate.plan_batch``): MELT's T-times
smaller cache buys it about T times the rows. For each model, static and continuous batching
generate the very same completions (checked here), so their tokens/s compare like for like; the
two models sample different lengths, so each model's token count is shown.

    python benchmarks/eval_throughput.py           # cpu-mid shape, 32 samples, mean 192, cap 1024 tokens, 3 rounds
    python benchmarks/eval_throughput.py --quick   # tiny shape, a few seconds
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import melt_core.generation.generate as gen
from melt_core import ModelConfig, melt_from_ouro
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, save_benchmark

STOP = 0  # the stop token id


def stop_with_probability(model, p: float):
    """Make the stop token's probability exactly ``p`` at every step (temperature 1, top-p 1): its
    logit becomes logit(p) + logsumexp of the others. Returns the hook's handle."""
    def hook(_module, _inputs, logits):
        others = logits.float().clone()
        others[..., STOP] = -math.inf
        logits[..., STOP] = (math.log(p / (1 - p)) + others.logsumexp(-1)).to(logits.dtype)
        return logits
    return model.lm_head.register_forward_hook(hook)


def count_steps(fn):
    """Wrap _Decoder.step to count decode steps (one per call, whatever the batch)."""
    calls = [0]

    def step(self, *a, **kw):
        calls[0] += 1
        return fn(self, *a, **kw)
    return step, calls


def workload(vocab: int, prompts: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    """``prompts`` random prompts of between half ``prompt_len`` and ``prompt_len`` tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist()
            for n in torch.randint(prompt_len // 2, prompt_len + 1, (prompts,), generator=g)]


def default_budget(ouro, melt, prompts: list[list[int]], max_new: int, ouro_rows: float) -> int:
    """MELT's weights plus ``ouro_rows`` of Ouro's sequences (cache + refill cache + activations)."""
    longest = max(map(len, prompts))
    per_row = (gen.cache_bytes_per_sequence(ouro, longest + max_new) + gen.cache_bytes_per_sequence(ouro, longest)
               + gen.activation_bytes_per_sequence(ouro, longest, None))
    return int(sum(t.numel() * t.element_size() for t in melt.parameters()) + ouro_rows * per_row)


def measure(models: dict, prompts: list[list[int]], params: SamplingParams, budget: int, mean_new: float,
            prefill_chunk: int, rounds: int = 3) -> list[dict]:
    """Every (model, batching) generates the workload once a round, the configurations taking turns
    within each round so a change in machine load hits all alike; tok/s as the median over rounds
    with its min and max. Static and continuous batching must give each model the same completions."""
    configs = [(name, mode) for name in models for mode in ("static", "continuous")]
    seconds = {c: [] for c in configs}
    info: dict = {}
    handles = {name: stop_with_probability(model, 1 / mean_new) for name, model in models.items()}
    try:
        for _ in range(rounds):
            for name, mode in configs:
                model = models[name]
                chunk = prefill_chunk if model.config.is_melt else None
                batch = gen.plan_batch(model, prompts, params, budget, prefill_chunk=chunk,
                                       refill=mode == "continuous")
                step, steps = count_steps(gen._Decoder.step)
                real, gen._Decoder.step = gen._Decoder.step, step
                try:
                    t0 = time.perf_counter()
                    out = generate(model, prompts, params, prefill_chunk=chunk, memory_budget_bytes=budget,
                                   batching=mode)
                    seconds[name, mode].append(time.perf_counter() - t0)
                finally:
                    gen._Decoder.step = real
                info[name, mode] = (batch, steps[0], [[s.token_ids for s in per] for per in out])
    finally:
        for handle in handles.values():
            handle.remove()
    for name in models:
        if info[name, "static"][2] != info[name, "continuous"][2]:
            raise SystemExit(f"{name}: continuous batching changed the completions (a bug: they must not depend "
                             "on batching)")
    rows = []
    for name, mode in configs:
        batch, steps, completions = info[name, mode]
        tokens = sum(len(s) for per in completions for s in per)
        rates = sorted(tokens / t for t in seconds[name, mode])
        rows.append({"model": name, "batching": mode, "batch": batch, "sequences": sum(map(len, completions)),
                     "tokens": tokens, "decode_steps": steps,
                     "seconds": round(statistics.median(seconds[name, mode]), 2),
                     "tok_s": round(statistics.median(rates), 1), "tok_s_min": round(rates[0], 1),
                     "tok_s_max": round(rates[-1], 1), "rounds": rounds,
                     "lengths": sorted(len(s) for per in completions for s in per)})
    return rows


def table(rows: list[dict]) -> str:
    by = {(r["model"], r["batching"]): r for r in rows}
    lines = ["| model | batching | rows | tokens | decode steps | seconds (median) | tok/s (median) | tok/s range "
             "| continuous / static |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        ratio = r["tok_s"] / by[r["model"], "static"]["tok_s"]
        lines.append(f"| {r['model']} | {r['batching']} | {r['batch']} | {r['tokens']} | {r['decode_steps']} | "
                     f"{r['seconds']:.1f} | {r['tok_s']:.1f} | {r['tok_s_min']:.1f}-{r['tok_s_max']:.1f} "
                     f"| {ratio:.2f} |")
    if {"MELT", "Ouro"} <= {r["model"] for r in rows}:
        lines += [""] + [f"MELT / Ouro tok/s, {mode}: {by['MELT', mode]['tok_s'] / by['Ouro', mode]['tok_s']:.2f}"
                         for mode in ("static", "continuous")]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=64, help="prompts have between half this and this many tokens")
    p.add_argument("--mean-new", type=float, default=192, help="mean completion length (geometric)")
    p.add_argument("--max-new", type=int, default=1024)
    p.add_argument("--ouro-rows", type=float, default=2.5,
                   help="default budget: MELT's weights + this many of Ouro's sequences (cache + activations)")
    p.add_argument("--budget-mb", type=float, help="the memory budget (overrides --ouro-rows)")
    p.add_argument("--prefill-chunk", type=int, default=64, help="MELT prefills in chunks (the paper config's mode)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every configuration in turn")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/eval_throughput"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.prompts, a.samples, a.prompt_len, a.mean_new, a.max_new = "tiny", 4, 3, 16, 24, 96
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), getattr(torch, a.dtype))
    models = {"Ouro": ouro, "MELT": melt_from_ouro(ouro)}
    prompts = workload(ouro.config.vocab_size, a.prompts, a.prompt_len)
    params = SamplingParams(max_new_tokens=a.max_new, temperature=1.0, n=a.samples, seed=0, stop_token_ids=(STOP,))
    budget = int(a.budget_mb * 1e6) if a.budget_mb else default_budget(ouro, models["MELT"], prompts, a.max_new,
                                                                        a.ouro_rows)
    rows = measure(models, prompts, params, budget, a.mean_new, a.prefill_chunk, a.rounds)
    weights = {name: sum(t.numel() * t.element_size() for t in m.parameters()) for name, m in models.items()}
    lengths = next(r["lengths"] for r in rows if r["model"] == "Ouro")
    head = (f"shape {a.shape}, {a.dtype}; memory budget {budget / 1e6:.0f} MB (weights: Ouro "
            f"{weights['Ouro'] / 1e6:.0f} MB, MELT {weights['MELT'] / 1e6:.0f} MB); {a.prompts} prompts of "
            f"{a.prompt_len // 2}-{a.prompt_len} tokens x {a.samples} samples; completions geometric, mean "
            f"{a.mean_new:g}, cap {a.max_new} (Ouro's: median {lengths[len(lengths) // 2]}, max {lengths[-1]}); "
            f"MELT prefill chunk {a.prefill_chunk}; {a.rounds} rounds, the configurations in turn")
    save_benchmark(a.out, a.shape, [{k: v for k, v in r.items() if k != "lengths"} for r in rows],
                   head + "\n\n" + table(rows))


if __name__ == "__main__":
    main()
