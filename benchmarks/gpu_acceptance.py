"""GPU acceptance: what the cost plan assumes, measured on the device at hand, beside the limit the
hardware sets (melt_core/ops/plan.py's roofline). One command, under 10 minutes on one GPU:

    python benchmarks/gpu_acceptance.py                              # real shapes, bf16, cuda
    python benchmarks/gpu_acceptance.py --device cpu --shape tiny    # every code path, in seconds (the tests)

Random weights: speed and memory depend on shapes, not values. It measures, for Ouro-1.4B and
MELT-1.6B (at ``--shape real``; a CPU-sized shape of the same proportions otherwise):

* decode: tok/s of our own decode loop at batch 1 and at the batch the memory plan allows, at each
  context (4K and 32K), the models taking turns (melt_core.ops.profiler.compare_decode), beside the
  roofline (every loop's weights and every K/V row each loop attends to, over HBM bandwidth);
* prefill: tok/s of the same runs' prefill (MELT in chunks of ``--prefill-chunk``, as the paper
  config prefills), beside its FLOP roofline;
* memory: the plan's bytes for one generation at the planned batch (generate.plan_batch's terms:
  weights, caches, activations) against torch.cuda.max_memory_allocated (never under; within
  ``--memory-margin``); on CPU not measurable, and said so;
* training: a few chunk-wise training steps at the shape (tok/s, peak memory) beside the FLOP
  roofline, parallel Ouro distillation beside it;
* batching: continuous vs static on benchmarks/eval_throughput.py's skewed-length workload;
* vLLM: the same workload in vLLM (melt_core/serving/vllm_models.py) beside the native engine, at the same
  memory, with its prefill alone (benchmarks/vllm_throughput.py; ``--no-vllm`` skips it).

It writes ``<out>/gpu_acceptance.json`` and ``.md``; the JSON's ``plan_rates`` is what the cost
plan reads with ``plan: {measured: <that json>}`` in place of its assumed rates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import melt_core.generation.generate as gen
from melt_core import ModelConfig, melt_from_ouro
from melt_core.generation.generate import SamplingParams
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops.plan import ASSUMPTIONS, decode_step_bytes, forward_flops_per_token, train_flops_per_token
from melt_core.ops.profiler import build_random, compare_decode, train_throughput, with_static_twins

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval_throughput  # noqa: E402
import vllm_throughput  # noqa: E402

SETTINGS = {  # per shape: contexts, decode steps, prefill chunk, training (seq, batch, chunk), batching workload
    "real": dict(contexts=[4096, 32768], steps=8, prefill_chunk=500, train=(4096, 1, 500),
                 workload=dict(prompts=8, samples=4, prompt_len=256, mean_new=256, max_new=2048)),
    "cpu-mid": dict(contexts=[256, 1024], steps=8, prefill_chunk=128, train=(256, 2, 64),
                    workload=dict(prompts=6, samples=3, prompt_len=64, mean_new=64, max_new=256)),
    "tiny": dict(contexts=[32, 64], steps=4, prefill_chunk=16, train=(32, 2, 8),
                 workload=dict(prompts=3, samples=2, prompt_len=12, mean_new=8, max_new=24)),
}


def shape_configs(shape: str) -> tuple[ModelConfig, ModelConfig]:
    if shape == "real":
        return ModelConfig.from_name("ouro-1.4b"), ModelConfig.from_name("melt-1.6b")
    ouro = ModelConfig(model_type="ouro", **SPEED_SHAPES[shape])
    return ouro, ouro.replace(model_type="melt")


def device_limits(device: str, hw: dict) -> tuple[float, float, float]:
    """(HBM bytes/s, bf16 FLOP/s, memory bytes) the roofline uses: the plan's stated H100 figures,
    and the device's own memory (on CPU: the plan's GPU memory, for a like-for-like batch)."""
    memory = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else hw["gpu_memory_gb"] * 1e9
    return hw["hbm_bytes_per_s"], hw["peak_bf16_flops"], memory


def planned_batch(model, context: int, steps: int, prefill_chunk: int | None, memory: float, cap: int) -> int:
    prompt = [[1] * context]
    params = SamplingParams(max_new_tokens=steps + 1)
    return max(1, min(cap, gen.plan_batch(model, prompt, params, int(memory * 0.9), prefill_chunk=prefill_chunk)))


def decode_rows(models: dict, cfgs: dict, s: dict, memory: float, bw: float, flops: float, cap: int) -> list[dict]:
    rows = []
    for context in s["contexts"]:
        cells = [("batch 1", {name: 1 for name in models})]
        cells.append(("planned", {name: planned_batch(m, context, s["steps"], s["prefill_chunk"] if cfgs[name].is_melt
                                                      else None, memory, cap) for name, m in models.items()}))
        for label, batches in cells:
            if label == "batch 1":  # same batch: the models take turns within one run, each also with
                # the static-shape step (a CUDA graph replayed per token on a GPU)
                both, static = with_static_twins(models)
                measured = compare_decode(both, [1], [context], s["steps"], rounds=1, prefill_chunk=s["prefill_chunk"],
                                          static=static)
            else:  # each its own batch: one run each
                measured = [r for name, m in models.items()
                            for r in compare_decode({name: m}, [batches[name]], [context], s["steps"], rounds=1,
                                                    prefill_chunk=s["prefill_chunk"], warm_up=False)]
            for r in measured:
                cfg, b = cfgs[r["model"].removesuffix("-static")], r["batch"]
                step_limit = decode_step_bytes(cfg, b, context) / bw
                prefill_limit = b * context * forward_flops_per_token(cfg, context) / flops
                rows.append({"section": "decode", "model": r["model"], "batch_kind": label, "batch": b,
                             "context": context, "decode_tok_s": r["decode_tok_s"],
                             "decode_limit_tok_s": b / step_limit, "prefill_tok_s": r["prefill_tok_s"],
                             "prefill_limit_tok_s": b * context / prefill_limit})
    return rows


def memory_rows(models: dict, cfgs: dict, s: dict, memory: float, device: str, cap: int, margin: float) -> list[dict]:
    """The plan's bytes for one generation at the planned batch against the allocator's peak."""
    rows = []
    context = s["contexts"][-1]
    for name, model in models.items():
        chunk = s["prefill_chunk"] if cfgs[name].is_melt else None
        batch = planned_batch(model, context, s["steps"], chunk, memory, cap)
        weights = sum(t.numel() * t.element_size() for t in model.parameters())
        planned = weights + batch * (gen.cache_bytes_per_sequence(model, context + s["steps"])
                                     + gen.activation_bytes_per_sequence(model, context, chunk))
        peak = None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            prompts = [[1 + i % 7] * context for i in range(batch)]
            gen.generate(model, prompts, SamplingParams(max_new_tokens=s["steps"], temperature=0.0),
                         prefill_chunk=chunk, batch_size=batch, memory_budget_bytes=int(memory))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        ok = None if peak is None else planned >= peak and planned <= peak * (1 + margin)
        rows.append({"section": "memory", "model": name, "batch": batch, "context": context,
                     "planned_bytes": planned, "peak_bytes": peak, "within_margin": ok})
    return rows


def training_rows(ouro_cfg: ModelConfig, s: dict, device: str, dtype, flops: float) -> list[dict]:
    seq, batch, chunk = s["train"]
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rows = train_throughput(ouro_cfg, seq, batch, [chunk], steps=2, dtype=dtype, device=device)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    melt_cfg = ouro_cfg.replace(model_type="melt")
    limit = flops / train_flops_per_token(melt_cfg, ouro_cfg, seq)
    return [{"section": "training", "model": r["model"], "seq_len": seq, "batch": batch, "chunk": r["chunk"],
             "tok_s": r["tokens_per_s"], "limit_tok_s": limit, "peak_bytes": peak} for r in rows]


def batching_rows(ouro, melt, s: dict) -> list[dict]:
    w = s["workload"]
    prompts = eval_throughput.workload(ouro.config.vocab_size, w["prompts"], w["prompt_len"])
    params = SamplingParams(max_new_tokens=w["max_new"], temperature=1.0, n=w["samples"], seed=0,
                            stop_token_ids=(eval_throughput.STOP,))
    budget = eval_throughput.default_budget(ouro, melt, prompts, w["max_new"], 2.5)
    rows = eval_throughput.measure({"Ouro": ouro, "MELT": melt}, prompts, params, budget, w["mean_new"],
                                   s["prefill_chunk"], rounds=2)
    return [{"section": "batching", **{k: v for k, v in r.items() if k != "lengths"}} for r in rows]


def vllm_rows(ouro, melt, s: dict, dtype: str) -> list[dict]:
    """vLLM beside the native engine on the batching workload (benchmarks/vllm_throughput.py): tok/s of
    each, vLLM's prefill alone, at the same memory (vLLM's KV cache: the native budget less the weights)."""
    w = s["workload"]
    prompts = eval_throughput.workload(ouro.config.vocab_size, w["prompts"], w["prompt_len"])
    budget = eval_throughput.default_budget(ouro, melt, prompts, w["max_new"], 2.5)
    models = {"Ouro": ouro, "MELT": melt}
    rows = vllm_throughput.compare(models, prompts, w["samples"], w["max_new"], w["mean_new"],
                                   budget, rounds=2, dtype=dtype, chunk=s["prefill_chunk"])
    # no tail: every completion the mean length, each model admitting what its KV holds (a pool-bound run)
    bound = vllm_throughput.compare(models, prompts, w["samples"], w["max_new"], w["mean_new"], budget, rounds=2,
                                    dtype=dtype, chunk=s["prefill_chunk"], fixed_new=int(w["mean_new"]), admit=1)
    return [{"section": "vllm", "workload": "eval", **r} for r in rows] + \
        [{"section": "vllm", "workload": "pool-bound", **r} for r in bound]


def plan_rates(rows: list[dict], world_gpus: int = 1) -> dict:
    """The measured rates in the plan's terms: decode tok/s of one sequence at the planned batch
    and the longest context (the plan multiplies by its own batch), training tok/s per GPU."""
    longest = max(r["context"] for r in rows if r["section"] == "decode")
    decode = {("melt" if r["model"] == "melt" else "ouro"): r["decode_tok_s"] / r["batch"] for r in rows
              if r["section"] == "decode" and r["batch_kind"] == "planned" and r["context"] == longest}
    train = next(r["tok_s"] for r in rows if r["section"] == "training" and r["model"].startswith("melt-"))
    return {"decode_tok_s": decode, "train_tok_s_per_gpu": train / world_gpus}


def render(rows: list[dict], meta: dict) -> str:
    lines = [f"# GPU acceptance ({meta['device_name']}, shape {meta['shape']}, {meta['dtype']}, {meta['date']})", "",
             f"Limits from the plan's stated hardware: {meta['hbm_bytes_per_s'] / 1e12:.2f} TB/s HBM, "
             f"{meta['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16. measured / limit is the share of the hardware "
             "our code reaches.", "", "## Decode and prefill", "",
             "| model | batch | context | decode tok/s | limit | measured / limit | prefill tok/s | limit "
             "| measured / limit |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["section"] == "decode"):
        lines.append(f"| {r['model']} | {r['batch']} ({r['batch_kind']}) | {r['context']} | {r['decode_tok_s']:,.1f} | "
                     f"{r['decode_limit_tok_s']:,.0f} | {r['decode_tok_s'] / r['decode_limit_tok_s']:.3g} | "
                     f"{r['prefill_tok_s']:,.0f} | {r['prefill_limit_tok_s']:,.0f} | "
                     f"{r['prefill_tok_s'] / r['prefill_limit_tok_s']:.3g} |")
    lines += ["", "## Memory plan against the allocator", "", "| model | batch | context | planned GB | peak GB "
              "| planned >= peak, within margin |", "|---|---:|---:|---:|---:|---|"]
    for r in (r for r in rows if r["section"] == "memory"):
        peak = "not measurable on CPU" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 1e9:.2f}"
        lines.append(f"| {r['model']} | {r['batch']} | {r['context']} | {r['planned_bytes'] / 1e9:.2f} | {peak} | "
                     f"{'n/a' if r['within_margin'] is None else r['within_margin']} |")
    lines += ["", "## Training steps", "", "| run | seq | batch | tok/s | limit | measured / limit | peak GB |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["section"] == "training"):
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 1e9:.2f}"
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['batch']} | {r['tok_s']:,.0f} | {r['limit_tok_s']:,.0f} | "
                     f"{r['tok_s'] / r['limit_tok_s']:.3g} | {peak} |")
    lines += ["", "## Continuous vs static batching (eval_throughput's workload)", "",
              eval_throughput.table([r for r in rows if r["section"] == "batching"])]
    titles = {"eval": "vLLM beside the native engine (the same workload and lengths, the same memory)",
              "pool-bound": "vLLM, pool-bound (every completion the mean length, each model admitting what its "
                            "KV holds)"}
    for workload, title in titles.items():
        if served := [r for r in rows if r["section"] == "vllm" and r["workload"] == workload]:
            lines += ["", f"## {title}", "", f"{served[0]['sequences']} sequences, "
                      f"{served[0]['memory_bytes'] / 1e9:.2f} GB each model (vLLM: its KV cache, the weights aside)",
                      "", vllm_throughput.table(served)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=sorted(SETTINGS), default="real")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--batch-cap", type=int, default=16, help="the eval's batch_size: the planned batch's cap")
    p.add_argument("--memory-margin", type=float, default=0.25, help="the plan may exceed the peak by this share")
    p.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                   help="also vLLM beside the native engine (needs the serving environment, .venv-vllm)")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/gpu_acceptance"))
    a = p.parse_args(argv)
    started = time.time()
    dtype = getattr(torch, a.dtype)
    s = SETTINGS[a.shape]
    bw, flops, memory = device_limits(a.device, ASSUMPTIONS)
    ouro_cfg, melt_cfg = shape_configs(a.shape)
    torch.manual_seed(0)
    ouro = build_random(ouro_cfg, dtype, a.device)
    melt = melt_from_ouro(ouro).to(device=a.device, dtype=dtype).eval()
    models, cfgs = {"ouro": ouro, "melt": melt}, {"ouro": ouro_cfg, "melt": melt.config}
    rows = decode_rows(models, cfgs, s, memory, bw, flops, a.batch_cap)
    rows += memory_rows(models, cfgs, s, memory, a.device, a.batch_cap, a.memory_margin)
    rows += batching_rows(ouro, melt, s)
    if a.vllm:
        rows += vllm_rows(ouro, melt, s, a.dtype)
    del models, melt, ouro
    if a.device == "cuda":
        torch.cuda.empty_cache()
    rows += training_rows(ouro_cfg, s, a.device, dtype, flops)
    meta = {"device": a.device, "device_name": torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU",
            "shape": a.shape, "dtype": a.dtype, "date": time.strftime("%Y-%m-%d"),
            "hbm_bytes_per_s": bw, "peak_bf16_flops": flops, "seconds": round(time.time() - started, 1)}
    result = {"meta": meta, "rows": rows, "plan_rates": plan_rates(rows)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_acceptance.json").write_text(json.dumps(result, indent=2))
    text = render(rows, meta)
    (a.out / "gpu_acceptance.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
