"""Decode tokens/s of MELT vs Ouro at the same shape, measured side by side in one run.

For each batch size and context length: fill the cache with a context (Ouro: one parallel
pass; MELT: chunked prefill), then time decode steps; within each round the models
alternate so drift in machine load hits both equally. Writes a Markdown table with the
MELT/Ouro ratio. Weights are random: speed depends on shapes, not on values.

    python benchmarks/decode_speed.py                  # the issue's grid (batch 1, 8; ctx 256-4096)
    python benchmarks/decode_speed.py --quick          # a short smoke run
    python benchmarks/decode_speed.py --kv-budget-mb 800 --contexts 4096
        # equal KV memory: each model decodes the largest batch whose cache fits the budget
    python benchmarks/decode_speed.py --paths static --contexts 256 1024
        # each model's ordinary decode step against the static-shape step (melt_core/generation/static_decode.py;
        # captured on a CUDA graph on a GPU), all four in turn in one run

Per decode step MELT reads as many K/V rows as Ouro (T loops x N layers x L rows); what it
saves is the footprint (T times smaller), which buys batch. The budget mode measures that.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from melt_core import ModelConfig, melt_from_ouro
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, compare_decode, decode_ratio_table, save_benchmark, with_static_twins


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prefill-chunk", type=int, default=256)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--quick", action="store_true", help="tiny shape, short contexts")
    p.add_argument("--kv-budget-mb", type=float, help="equal-memory mode: batch = budget // KV(context)")
    p.add_argument("--paths", choices=["static"], help="also each model with the static-shape decode step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/decode_speed"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.contexts, a.steps, a.rounds = "tiny", [64, 256], 8, 1
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), getattr(torch, a.dtype), a.device)
    models = {"ouro": ouro, "melt": melt_from_ouro(ouro)}
    if a.kv_budget_mb:
        return budget_mode(models, a)
    if a.paths:
        return paths_mode(models, a)
    rows = compare_decode(models, a.batches, a.contexts, a.steps, a.rounds, a.prefill_chunk)
    table = decode_ratio_table(rows, "ouro", "melt", ("Ouro", "MELT"))
    save_benchmark(a.out, a.shape, rows, f"shape {a.shape}, {a.dtype}\n\n{table}")


def paths_mode(models: dict, a) -> None:
    """Each model's ordinary decode step against its static-shape step, the four in turn per round."""
    both, static = with_static_twins(models)
    rows = compare_decode(both, a.batches, a.contexts, a.steps, a.rounds, a.prefill_chunk, static=static)
    tables = [decode_ratio_table(rows, name, f"{name}-static", (name, f"{name} static")) for name in models]
    graph = "captured on a CUDA graph" if a.device.startswith("cuda") else "eager (no graph on CPU)"
    save_benchmark(a.out, f"{a.shape}-paths", rows, f"shape {a.shape}, {a.dtype}, {a.device}, "
                   f"{torch.get_num_threads()} threads; static step {graph}\n\n" + "\n\n".join(tables))


def budget_mode(models: dict, a) -> None:
    """Aggregate decode tok/s of each model at the largest batch its cache allows in the budget."""
    nbytes = next(iter(models.values())).lm_head.weight.element_size()
    lines = [f"KV budget {a.kv_budget_mb:.0f} MB", "",
             "| context | Ouro batch | Ouro tok/s | MELT batch | MELT tok/s | MELT / Ouro |",
             "|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for context in a.contexts:
        got = {}
        for name, model in models.items():
            batch = int(a.kv_budget_mb * 1e6 // model.config.kv_bytes(context, nbytes))
            if batch < 1:
                raise SystemExit(f"{name}: one {context}-token sequence needs "
                                 f"{model.config.kv_bytes(context, nbytes) / 1e6:.0f} MB > the budget")
            got[name] = compare_decode({name: model}, [batch], [context], a.steps, a.rounds, a.prefill_chunk)[0]
            rows.append(got[name])
        o, m = got["ouro"], got["melt"]
        lines.append(f"| {context} | {o['batch']} | {o['decode_tok_s']:.1f} | {m['batch']} | {m['decode_tok_s']:.1f} "
                     f"| {m['decode_tok_s'] / o['decode_tok_s']:.2f} |")
    save_benchmark(a.out, f"{a.shape}-budget", rows, "\n".join(lines))


if __name__ == "__main__":
    main()
