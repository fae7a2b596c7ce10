"""MELT against Ouro inside vLLM at the same batch: is MELT's step in vLLM what costs it?

Both models (cpu-mid shape, random weights) get ample KV memory (2 GiB), so vLLM runs all BATCH
sequences of each at once; prompts of one chunk (PROMPT tokens), NEW generated tokens each, the
models taking turns over the rounds. Prints tok/s per (round, model), with and without the prefill.
benchmarks/vllm_throughput.py is the equal-memory comparison; this one holds the batch equal.

    .venv-vllm/bin/python benchmarks/vllm_equal_batch.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from melt_core import ModelConfig, melt_from_ouro, save_pretrained
from melt_core.generation.generate import SamplingParams
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random
from melt_core.serving.vllm_engine import VllmEngine

BATCH, PROMPT, NEW, ROUNDS, CHUNK = 14, 64, 256, 2, 64


def main() -> None:
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["cpu-mid"]), torch.float32)
    models = {"Ouro": ouro, "MELT": melt_from_ouro(ouro)}
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, ouro.config.vocab_size, (PROMPT,), generator=g).tolist() for _ in range(BATCH)]
    sampled = SamplingParams(max_new_tokens=NEW, temperature=1.0, n=1, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        try:
            for name, model in models.items():
                engines[name] = VllmEngine(save_pretrained(model, Path(tmp) / name), dtype="float32",
                                           max_model_len=PROMPT + NEW + 8, max_num_seqs=256, kv_cache_bytes=2 << 30,
                                           log=open(Path(tmp) / "log", "a"),
                                           prefill_chunk=CHUNK if model.config.is_melt else None)
                engines[name].generate(prompts[:2], SamplingParams(max_new_tokens=4, greedy=True))  # warm-up
            for rnd in range(ROUNDS):
                for name, engine in engines.items():
                    t0 = time.perf_counter()
                    engine.generate(prompts, SamplingParams(max_new_tokens=1, greedy=True))
                    prefill = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    out = engine.generate(prompts, sampled, max_new_tokens_each=[NEW] * BATCH)
                    seconds = time.perf_counter() - t0
                    n = sum(len(r[0].token_ids) for r in out)
                    print(f"round {rnd} {name}: batch {BATCH}, {n} tokens in {seconds:.1f} s = {n / seconds:.1f} "
                          f"tok/s (less the prefill: {n / (seconds - prefill):.1f}); prefill of {BATCH} x {PROMPT} "
                          f"{prefill:.2f} s", flush=True)
        finally:
            for engine in engines.values():
                engine.close()

if __name__ == "__main__":
    main()
