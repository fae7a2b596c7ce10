"""MELT against Ouro inside vLLM at the same batch, over a range of batches: what a step costs each
model, and how far more sequences at once buy more tokens a second on this machine.

Both models (cpu-mid shape, random weights) get ample KV memory (2 GiB), so vLLM runs all B
sequences of each at once (B from ``--batches``); prompts of one chunk (PROMPT tokens), ``--new``
generated tokens each (exact: stop ignored), the models taking turns within each round. Prints
tok/s per (batch, model), MELT / Ouro at equal batch, and each model's tok/s against its rate at the
smallest batch; the JSON also has tok/s less a separate prefill run's seconds.

What the curve decides: at equal KV memory MELT holds T times Ouro's sequences, so in a run where
Ouro's pool binds MELT/Ouro is at most ``melt(T x B) / ouro(B)`` read off this curve at Ouro's batch
B. Where a model's tok/s has stopped growing with the batch (the machine's compute is spent), more
sequences buy nothing and the ratio cannot reach 2 however small the cache.
benchmarks/vllm_throughput.py is the equal-memory comparison on an eval's workload.

    .venv-vllm/bin/python benchmarks/vllm_equal_batch.py                   # batches 1 2 4 8 16 32 64
    .venv-vllm/bin/python benchmarks/vllm_equal_batch.py --batches 14 --new 256 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from melt_core import ModelConfig, melt_from_ouro, save_pretrained
from melt_core.generation.generate import SamplingParams
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, save_benchmark
from melt_core.serving.vllm_engine import VllmEngine

PROMPT, CHUNK = 64, 64


def sweep(engines: dict, vocab: int, batches: list[int], new: int, rounds: int, log=print) -> list[dict]:
    """tok/s of every (batch, model), the models taking turns within each round: median over rounds,
    with and without each round's prefill (one new token a sequence, timed on its own)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (PROMPT,), generator=g).tolist() for _ in range(max(batches))]
    sampled = SamplingParams(max_new_tokens=new, temperature=1.0, n=1, seed=0)
    rows = []
    for batch in batches:
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
        for _ in range(rounds):
            for name, engine in engines.items():
                t0 = time.perf_counter()
                engine.generate(prompts[:batch], SamplingParams(max_new_tokens=1, greedy=True))
                prefill = time.perf_counter() - t0
                t0 = time.perf_counter()
                out = engine.generate(prompts[:batch], sampled, max_new_tokens_each=[new] * batch)
                seconds = time.perf_counter() - t0
                if sum(len(r[0].token_ids) for r in out) != batch * new:
                    raise SystemExit(f"{name}: vLLM did not generate {new} tokens a sequence")
                runs[name].append((seconds, prefill))
                log(f"batch {batch} {name}: {batch * new / seconds:.1f} tok/s ({seconds:.1f} s, prefill "
                    f"{prefill:.2f} s)")
        for name, secs in runs.items():
            tokens = batch * new
            rows.append({"model": name, "batch": batch, "new_tokens": new, "rounds": rounds,
                         "tok_s": round(statistics.median(tokens / s for s, _ in secs), 1),
                         "tok_s_less_prefill": round(statistics.median(tokens / max(s - p, 1e-9)
                                                                       for s, p in secs), 1),
                         "tok_s_min": round(min(tokens / s for s, _ in secs), 1),
                         "tok_s_max": round(max(tokens / s for s, _ in secs), 1)})
    return rows


def table(rows: list[dict]) -> str:
    row = {(r["model"], r["batch"]): r for r in rows}
    names = list(dict.fromkeys(r["model"] for r in rows))
    batches = sorted({r["batch"] for r in rows})
    head = " | ".join(f"{m} tok/s (range) | {m} / its batch {batches[0]}" for m in names)
    lines = [f"| batch | {head} | {names[-1]} / {names[0]} |", "|---:|" + "---:|" * (2 * len(names) + 1)]
    for b in batches:
        cells = " | ".join(f"{row[m, b]['tok_s']:.1f} ({row[m, b]['tok_s_min']:.1f}-{row[m, b]['tok_s_max']:.1f}) | "
                           f"{row[m, b]['tok_s'] / row[m, batches[0]]['tok_s']:.2f}" for m in names)
        lines.append(f"| {b} | {cells} | {row[names[-1], b]['tok_s'] / row[names[0], b]['tok_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--new", type=int, default=128, help="generated tokens a sequence")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/vllm_equal_batch"))
    a = p.parse_args()
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["cpu-mid"]), torch.float32)
    models = {"Ouro": ouro, "MELT": melt_from_ouro(ouro)}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        try:
            for name, model in models.items():
                engines[name] = VllmEngine(save_pretrained(model, Path(tmp) / name), dtype="float32",
                                           max_model_len=PROMPT + a.new + 8, max_num_seqs=max(256, *a.batches),
                                           kv_cache_bytes=2 << 30, log=open(Path(tmp) / "log", "a"),
                                           prefill_chunk=CHUNK if model.config.is_melt else None)
                engines[name].generate([[5] * PROMPT] * 2, SamplingParams(max_new_tokens=4, greedy=True))  # warm-up
            rows = sweep(engines, ouro.config.vocab_size, a.batches, a.new, a.rounds,
                         log=lambda s: print(time.strftime("%H:%M:%S"), s, flush=True))
        finally:
            for engine in engines.values():
                engine.close()
    head = (f"shape cpu-mid, float32, CPU, vLLM with 2 GiB of KV each (every sequence at once); prompts of "
            f"{PROMPT} tokens, {a.new} new tokens each (stop ignored), MELT prefill in chunks of {CHUNK}; "
            f"{a.rounds} round(s), models interleaved")
    save_benchmark(a.out, "cpu-mid", rows, head + "\n\n" + table(rows))


if __name__ == "__main__":
    main()
