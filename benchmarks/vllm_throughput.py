"""vLLM against melt_core's native engine on an eval's workload, Ouro and MELT, at equal KV memory.

The workload is benchmarks/eval_throughput.py's: prompts of mixed length, several samples each,
completions of skewed (geometric) length as reasoning traces have, random weights of a real
shape's proportions. The native engine draws the lengths (its stop-token hook); vLLM then
generates exactly those lengths for the same (prompt, sample) pairs (per-request budgets, stop
ignored), so both engines produce the same number of tokens of each sequence and tok/s compare like
for like. Memory: the native engine plans its batches from eval_throughput's budget (MELT's weights +
``--ouro-rows`` of Ouro's sequences: caches, refill caches, activations); vLLM gets the same budget,
less the model's weights, as its paged KV cache (activations are outside it: vLLM is given a little
more). The rounds interleave the four configurations, so a change of machine load hits all alike.

    python benchmarks/vllm_throughput.py            # cpu-mid shape (head dim 64), 8 prompts of 4-8 chunks x 4 samples
    python benchmarks/vllm_throughput.py --quick    # tiny shape (head dim 32), 4 prompts of 4-8 chunks x 3 samples
    python benchmarks/vllm_throughput.py --lengths fixed --prompts 32 --samples 2 --mean-new 256 --max-new 256 --admit 1
        # vLLM only, no tail: 64 sequences of equal length, far more than Ouro's KV holds at once

The paper's shape of work: prompts of at least 4 chunks of CHUNK, several samples a prompt (in vLLM
each sample is its own request: they share the prompt's cached blocks), completions of skewed
length, the same memory for both models, small enough that Ouro holds only a few sequences. Each
vLLM row also gives the preemptions and prefix-cache hit tokens of its engine (totals over the run),
the engine steps and their tokens of one workload run (the last round's), and ``kv_sequences``: how
many sequences of the workload's longest length its KV memory holds.

Reports tok/s (median of the rounds, with the range), vLLM / native per model, and MELT / Ouro within
each engine (the issue's goal: >= 2x at equal memory in vLLM).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from eval_throughput import STOP, default_budget, stop_with_probability, workload  # noqa: I001

from melt_core import ModelConfig, melt_from_ouro, save_pretrained
from melt_core.generation import generate as gen
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.profiler import build_random, save_benchmark, weight_bytes
from melt_core.serving.vllm_engine import VllmEngine

CHUNK = 64  # MELT's prompt chunk in both engines (eval_throughput's)


def compare(models: dict, prompts: list[list[int]], samples: int, max_new: int, mean_new: float, budget: int,
            rounds: int, dtype: str = "float32", chunk: int = CHUNK, log=None,
            fixed_new: int | None = None, admit: float | None = None) -> list[dict]:
    """Rows of tok/s per (model, engine), the engines taking turns each round; ``models``: name -> a
    loaded Ouro or MELT model (random weights). vLLM replays the native run's lengths, or, given
    ``fixed_new``, generates that many tokens a sequence (``max_new`` then that too) and the native
    engine does not run.
    Also vLLM's prefill alone (one new token a sequence): prompt tok/s. ``admit``: None, vLLM's
    scheduler takes up to 256 sequences at once and preempts when the pool runs out; k, at most k
    times as many as the model's KV memory holds at the workload's longest length (``max_num_seqs``;
    1: no preemption, the setting a server is run with to keep it away)."""
    max_new = fixed_new or max_new
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, n=samples, seed=0, stop_token_ids=(STOP,))
    max_len = max(map(len, prompts)) + max_new
    each = [p for p in prompts for _ in range(samples)]
    seconds: dict[tuple[str, str], list[float]] = {}
    tokens: dict[str, int] = {}
    counters: dict[str, dict] = {}
    kv_bytes = {name: max(budget - weight_bytes(model), 4 << 20) for name, model in models.items()}
    kv_sequences = {name: kv_bytes[name] // gen.cache_bytes_per_sequence(model, max_len)
                    for name, model in models.items()}
    seqs = {name: 256 if admit is None else max(int(admit * n), 1) for name, n in kv_sequences.items()}
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        try:
            for name, model in models.items():
                path = save_pretrained(model, Path(tmp) / name)
                engines[name] = VllmEngine(path, dtype=dtype, max_model_len=max_len, max_num_seqs=seqs[name],
                                           # at least 4 MiB: vLLM's least (a whole sequence in 16-token
                                           # blocks) is more than a tiny shape's budget leaves
                                           kv_cache_bytes=kv_bytes[name],
                                           log=log or open(Path(tmp) / "log", "a"),
                                           prefill_chunk=chunk if model.config.is_melt else None)
            for _ in range(rounds):
                for name, model in models.items():
                    each_len = [fixed_new] * len(each) if fixed_new else native_lengths(
                        model, prompts, params, chunk, budget, mean_new, seconds.setdefault((name, "native"), []))
                    tokens[name] = sum(each_len)
                    one = SamplingParams(max_new_tokens=max_new, temperature=1.0, n=1, seed=0)
                    before = getattr(engines[name], "counters", None) or {}
                    t0 = time.perf_counter()
                    got = engines[name].generate(each, one, max_new_tokens_each=each_len)
                    seconds.setdefault((name, "vLLM"), []).append(time.perf_counter() - t0)
                    after = engines[name].counters  # totals since the engine started; its steps: this run's
                    counters[name] = after | {k: after[k] - before.get(k, 0) for k in ("engine_steps", "step_tokens")}
                    if [len(r[0].token_ids) for r in got] != each_len:
                        raise SystemExit(f"{name}: vLLM did not generate the lengths asked for")
                    t0 = time.perf_counter()
                    engines[name].generate(each, SamplingParams(max_new_tokens=1, greedy=True))
                    seconds.setdefault((name, "vLLM prefill"), []).append(time.perf_counter() - t0)
        finally:
            for engine in engines.values():
                engine.close()
    rows = []
    prompt_tokens = sum(map(len, each))
    for (name, engine), secs in seconds.items():
        n = prompt_tokens if engine == "vLLM prefill" else tokens[name]
        rates = sorted(n / s for s in secs)
        rows.append({"model": name, "engine": engine, "tokens": n, "rounds": len(secs), "sequences": len(each),
                     "memory_bytes": budget, "seconds": round(statistics.median(secs), 2),
                     "tok_s": round(statistics.median(rates), 1), "tok_s_min": round(rates[0], 1),
                     "tok_s_max": round(rates[-1], 1)})
        if engine == "vLLM":
            rows[-1] |= {**counters[name], "kv_bytes": kv_bytes[name], "kv_sequences": kv_sequences[name],
                         "admit": admit, "max_num_seqs": seqs[name]}
    return rows


def native_lengths(model, prompts, params, chunk, budget, mean_new, seconds: list[float]) -> list[int]:
    """The native engine's run of the workload (timed into ``seconds``): its completions' lengths, the
    stop token drawn with probability 1 / ``mean_new`` a step."""
    hook = stop_with_probability(model, 1 / mean_new)
    try:
        t0 = time.perf_counter()
        out = generate(model, prompts, params, prefill_chunk=chunk if model.config.is_melt else None,
                       memory_budget_bytes=budget)
        seconds.append(time.perf_counter() - t0)
    finally:
        hook.remove()
    return [len(s.token_ids) for row in out for s in row]


def table(rows: list[dict]) -> str:
    by = {(r["model"], r["engine"]): r["tok_s"] for r in rows}
    names = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | engine | tokens | seconds (median) | tok/s (median) | tok/s range |",
             "|---|---|---:|---:|---:|---|"]
    lines += [f"| {r['model']} | {r['engine']} | {r['tokens']} | {r['seconds']:.2f} | {r['tok_s']:.1f} | "
              f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f} |" for r in rows]
    lines += ["", *(f"vLLM {m}: {r['preemptions']} preemptions, {r['prefix_cache_hits']} prefix-cache hit tokens, KV "
                    f"memory for {r['kv_sequences']} sequences of the longest length; {r['engine_steps']} engine "
                    f"steps, {r['step_tokens'] / max(r['engine_steps'], 1):.1f} tokens a step, "
                    f"{1000 * r['seconds'] / max(r['engine_steps'], 1):.1f} ms a step" for r in rows
                    if r["engine"] == "vLLM" for m in [r["model"]])]
    lines += ["", *(f"vLLM / native, {m}: {by[m, 'vLLM'] / by[m, 'native']:.2f}" for m in names
                    if (m, "native") in by)]
    if len(names) == 2:
        ouro, melt = names
        lines += [f"{melt} / {ouro}, {e}: {by[melt, e] / by[ouro, e]:.2f}" for e in ("native", "vLLM")
                  if (ouro, e) in by]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SPEED_SHAPES), default="cpu-mid")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=8 * CHUNK, help="prompts of half this to this many tokens")
    p.add_argument("--mean-new", type=float, default=192)
    p.add_argument("--max-new", type=int, default=1024)
    p.add_argument("--ouro-rows", type=float, default=2.5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lengths", choices=["native", "fixed"], default="native",
                   help="native: the native engine runs and draws geometric lengths, vLLM replays them; "
                        "fixed: every completion --mean-new tokens, vLLM only (no tail: a pool-bound run)")
    p.add_argument("--admit", type=float, default=None,
                   help="vLLM's max_num_seqs: unset, 256 (it preempts when its pool runs out); k, k times the "
                        "sequences of the longest length each model's KV memory holds (1: no preemption)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/vllm_throughput"))
    a = p.parse_args()
    if a.quick:
        a.shape, a.prompts, a.samples, a.mean_new, a.max_new, a.rounds = "tiny", 4, 3, 48, 192, 2
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES[a.shape]), torch.float32)
    models = {"Ouro": ouro, "MELT": melt_from_ouro(ouro)}
    prompts = workload(ouro.config.vocab_size, a.prompts, a.prompt_len)
    budget = default_budget(ouro, models["MELT"], prompts, a.max_new, a.ouro_rows)
    fixed = a.lengths == "fixed"
    if fixed and a.mean_new > a.max_new:
        raise SystemExit(f"--lengths fixed: --mean-new {a.mean_new:g} is above --max-new {a.max_new}; lower it")
    rows = compare(models, prompts, a.samples, a.max_new, a.mean_new, budget, a.rounds,
                   fixed_new=int(a.mean_new) if fixed else None, admit=a.admit)
    drawn = (f"every completion {int(a.mean_new)} tokens, vLLM only" if fixed else
             f"lengths geometric (mean {a.mean_new:g}, cap {a.max_new}) drawn by the native run and replayed in vLLM")
    admits = "up to 256 sequences" if a.admit is None else f"{a.admit:g} x what its KV holds at full length"
    head = (f"shape {a.shape}, float32, CPU; memory {budget / 1e6:.0f} MB for each model (native: weights + caches "
            f"+ activations; vLLM: its KV cache = that less the weights); {a.prompts} prompts of "
            f"{a.prompt_len // 2}-{a.prompt_len} tokens x {a.samples} samples, {drawn}; MELT prefill in "
            f"chunks of {CHUNK} in both; {a.rounds} rounds interleaved; vLLM prefill: one new token a sequence; "
            f"vLLM admits {admits}")
    stem = a.shape + "-fixed" * fixed + ("" if a.admit is None else f"-admit{a.admit:g}")
    save_benchmark(a.out, stem, rows, head + "\n\n" + table(rows))


if __name__ == "__main__":
    main()
