"""Decode tokens/s of MELT vs Ouro at the same shape, measured side by side in one run.

For each batch size and context length: fill the cache with a context (Ouro: one parallel
pass; MELT: chunked prefill), then time greedy decode steps of each model in alternation
(A, B, A, B, ...) so drift in machine load hits both equally. Writes a Markdown table with
the MELT/Ouro ratio. Weights are random: speed depends on shapes, not on values.

    python benchmarks/decode_speed.py                  # the issue's grid
    python benchmarks/decode_speed.py --quick          # a 1-minute smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from melt_core import LoopedLM, ModelConfig, melt_from_ouro

SHAPES = {
    # CPU-sized shape with Ouro's proportions (MHA, 4 loops, SwiGLU 2.75x)
    "cpu-mid": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                    num_attention_heads=8, num_key_value_heads=8, vocab_size=4096),
    "tiny": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=512),
}


@torch.no_grad()
def decode_rate(model: LoopedLM, batch: int, context: int, steps: int, prefill_chunk: int) -> list[float]:
    """Seconds per decode step (one token per row) after a context of ``context`` tokens."""
    ids = torch.randint(1, model.config.vocab_size, (batch, context))
    cache = model.new_cache(capacity=context + steps + 1)
    out = model(ids, cache=cache, chunk_size=prefill_chunk if model.config.is_melt else None,
                logits="last")
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(token, cache=cache, logits="last")
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    return times


def run(shape: str, batches: list[int], contexts: list[int], steps: int, dtype: torch.dtype,
        prefill_chunk: int, rounds: int) -> list[dict]:
    cfg = ModelConfig(model_type="ouro", max_position_embeddings=65536, **SHAPES[shape])
    torch.manual_seed(0)
    ouro = LoopedLM(cfg).to(dtype).eval()
    melt = melt_from_ouro(ouro).to(dtype)
    rows = []
    for batch in batches:
        for context in contexts:
            per = {"ouro": [], "melt": []}
            for _ in range(rounds):  # alternate so both see the same machine state
                for name, model in (("ouro", ouro), ("melt", melt)):
                    per[name] += decode_rate(model, batch, context, steps, prefill_chunk)
            o, m = statistics.median(per["ouro"]), statistics.median(per["melt"])
            rows.append(dict(shape=shape, batch=batch, context=context,
                             ouro_tok_s=batch / o, melt_tok_s=batch / m, ratio=o / m))
            print(f"batch {batch:2d} context {context:5d}: Ouro {batch / o:8.1f} tok/s  "
                  f"MELT {batch / m:8.1f} tok/s  MELT/Ouro {o / m:.2f}", flush=True)
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = ["| batch | context | Ouro tok/s | MELT tok/s | MELT / Ouro |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['context']} | {r['ouro_tok_s']:.1f} | {r['melt_tok_s']:.1f} | "
              f"{r['ratio']:.2f} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="cpu-mid")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prefill-chunk", type=int, default=256)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--quick", action="store_true", help="tiny shape, short contexts")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/decode_speed"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.contexts, a.steps, a.rounds = "tiny", [64, 256], 8, 1
    rows = run(a.shape, a.batches, a.contexts, a.steps, getattr(torch, a.dtype), a.prefill_chunk, a.rounds)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.shape}.json").write_text(json.dumps(rows, indent=2))
    table = to_markdown(rows)
    (a.out / f"{a.shape}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
