"""What a config will cost before it is submitted: tokens to train, tokens to generate, peak
memory and estimated H100-hours per job, each job's wall-clock against the cluster's limit.

Everything here is arithmetic on the config plus stated assumptions (``ASSUMPTIONS``): benchmark
sizes, the mean length of a generated answer, and throughputs (the paper's own figures unless
``profile_speed`` measured ours). Beside each estimate stands the time the GPU cannot beat (its
roofline): a decode step must read every loop's weights and every cached K/V row each loop attends
to from HBM (``decode_step_bytes``), training must do its FLOPs (``train_flops_per_token``); over
the hardware's stated bandwidth and peak (``hbm_bytes_per_s``, ``peak_bf16_flops``), and the
ratio estimate / limit says how far the assumed rates are from the hardware. Rule ``plan`` writes
it to ``<outdir>/plan.md``:

    snakemake plan --configfile config/paper.yaml --cores 1
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..modeling.checkpoint import expected_shapes
from ..modeling.config import ModelConfig
from ..serving.chunk_cut import shareable_tokens

# Stated assumptions; each one can be overridden by the config's `plan:` block.
ASSUMPTIONS = {
    # questions per benchmark (the datasets' sizes; HLE as the paper's 300-question subset)
    "questions": {"aime24": 30, "aime25": 30, "aime26": 30, "amc23": 40, "math500": 500, "olympiadbench": 675,
                  "gpqa": 198, "hle": 300, "mmlu_redux": 5700, "humaneval": 164},
    "prompt_tokens": 300,  # a benchmark prompt in the chat template
    "mean_new_fraction": 0.5,  # a reasoning trace uses on average half of max_new_tokens
    # decode tokens/s of ONE sequence at batch 1 on an H100 (paper v3 Table 10); a batch of b
    # sequences is assumed to decode b times as many (memory-bound decoding; optimistic at large b),
    # the batch kept full by continuous batching (eval.batching; static batches wait for their longest)
    "decode_tok_s": {"ouro": 13.5, "melt": 8.5, "dense": 41.6},
    # training: the paper's main run, 320M tokens in 720 H100-hours (v3, Appendix C)
    "train_tok_s_per_gpu": 320e6 / (720 * 3600),
    "gpu_memory_gb": 80.0,  # H100
    # the hardware's limits (NVIDIA H100 SXM5 datasheet): HBM3 bandwidth and dense bf16 tensor-core peak
    "hbm_bytes_per_s": 3.35e12,
    "peak_bf16_flops": 989.4e12,
    "job_limit_hours": 24.0,  # profiles/slurm: the eval rule's runtime
    # vLLM (eval.engine: vllm), priced from what its engine does: decode steps of the whole running batch
    # at this share of the HBM bandwidth, prompts prefilled in its batch at this share of the bf16 peak
    # (ASSUMED, not measured: no GPU was lent; benchmarks/gpu_acceptance.py's vLLM rows measure them)
    "vllm_bandwidth_share": 0.5,
    "vllm_flops_share": 0.4,
    "vllm_block_size": 16,  # vLLM's default KV block on a GPU: prefix caching shares whole blocks
    "shapes": {"ouro": "ouro-1.4b", "melt": "melt-1.6b", "dense": "qwen3-1.7b-shape"},
}


@dataclass
class Job:
    stage: str
    name: str
    tokens: float  # trained, or generated (decode)
    gpus: int
    hours: float  # wall-clock
    peak_gb: float | None = None
    note: str = ""
    count: int = 1  # identical jobs (a task's shards), each ``hours`` long
    limit_hours: float | None = None  # the roofline: wall-clock no GPU of the stated limits can beat

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus * self.count

    @property
    def limit_gpu_hours(self) -> float | None:
        return None if self.limit_hours is None else self.limit_hours * self.gpus * self.count


def weights_gb(cfg: ModelConfig, dtype_bytes: int = 2) -> float:
    return sum(math.prod(s) for s in expected_shapes(cfg).values()) * dtype_bytes / 1e9


def _params(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters one loop applies: the layers, MELT's gates included; parameters applied once a
    step: the head, i.e. lm_head (the embedding when tied) and the final norm). The embedding
    lookup reads one row a token and the exit gate one vector a loop: left out."""
    shapes = {k: math.prod(v) for k, v in expected_shapes(cfg).items()}
    per_loop = sum(n for k, n in shapes.items() if ".layers." in k)
    head = shapes.get("lm_head.weight", shapes["model.embed_tokens.weight"]) + shapes["model.norm.weight"]
    return per_loop, head


def kv_read_per_position(cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """Bytes of cached K/V one position costs a decode step to read: T loops x N layers x K and V.
    Ouro's loop t reads its own rows, MELT's every loop reads the one shared row (and, with a
    window, a loop's own rows stand in for the shared ones): the same T rows either way; MELT
    holds 1/T of the bytes (``ModelConfig.kv_bytes``), it does not read fewer."""
    per_loop_row = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes
    return cfg.total_ut_steps * per_loop_row


def decode_step_bytes(cfg: ModelConfig, batch: int, context: int, dtype_bytes: int = 2) -> int:
    """HBM bytes one decode step of ``batch`` sequences at ``context`` cached positions must read:
    each loop's weights once for the batch, the head once, every sequence's cached K/V per loop."""
    per_loop, head = _params(cfg)
    weights = (cfg.total_ut_steps * per_loop + head) * dtype_bytes
    return weights + batch * context * kv_read_per_position(cfg, dtype_bytes)


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs of one token's forward pass in a sequence of ``seq_len``: 2 per parameter applied (every
    loop's layers, the head every loop, as per-loop logits need) and causal attention (4 x heads x
    head_dim per key attended, on average seq_len / 2 keys), all T loops."""
    per_loop, head = _params(cfg)
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq_len / 2
    return cfg.total_ut_steps * (2 * (per_loop + head) + attention)


def train_flops_per_token(student: ModelConfig, teacher: ModelConfig, seq_len: int) -> float:
    """FLOPs one trained token needs: the student's forward and backward (3 forwards' worth) and the
    teacher's forward. A lower bound: no recomputation (activation checkpointing), no optimizer."""
    return 3 * forward_flops_per_token(student, seq_len) + forward_flops_per_token(teacher, seq_len)


def plan(config: dict, models: dict[str, str], phase_jobs: list[tuple[str, str, int]],
         exit_models: dict[str, str] | None = None, native_models: set[str] | frozenset = frozenset()
         ) -> tuple[list[Job], dict]:
    """Jobs of the DAG with their costs. ``models``: each evaluated model id -> its family (``ouro``,
    ``melt`` or ``dense``: whose shape it is costed at); ``phase_jobs``: (gate, path, steps) of every
    phase job; ``exit_models``: the early-exit sweep's models, the same way (one job each, every
    rule in turn, costed at every loop: an upper bound); ``native_models``: the evaluated models that
    stay on the native engine under ``eval.engine: vllm`` (the sharing caches, a window at inference)."""
    a = {**ASSUMPTIONS, **(config.get("plan") or {})}
    if a.get("measured"):  # benchmarks/gpu_acceptance.py's JSON: measured rates replace the assumed ones
        rates = json.loads(Path(a["measured"]).read_text())["plan_rates"]
        a["decode_tok_s"] = {**a["decode_tok_s"], **rates["decode_tok_s"]}
        a["train_tok_s_per_gpu"] = rates["train_tok_s_per_gpu"]
    jobs = []
    train, launcher = config["train"], config["launcher"]
    gpus = launcher.get("nodes", 1) * (launcher.get("gpus_per_node") or launcher.get("tasks_per_node", 1))
    shapes = {family: ModelConfig.from_name(name) for family, name in a["shapes"].items()}
    flops = train_flops_per_token(shapes["melt"], shapes["ouro"], train["seq_len"])
    for gate, path, steps in phase_jobs:
        tokens = steps * train["batch_size"] * train["seq_len"]
        jobs.append(Job("train", f"{gate}/{path}", tokens, gpus, tokens / (a["train_tok_s_per_gpu"] * gpus) / 3600,
                        limit_hours=tokens * flops / (a["peak_bf16_flops"] * gpus) / 3600))
    for model, family in models.items():
        for task, spec in config["eval"]["tasks"].items():
            paged = config["eval"].get("engine") == "vllm" and model not in native_models
            job = _decode_job("eval", model, family, task, spec, a["questions"].get(task), 1, config, a, paged)
            jobs += [job] if job else []
    sweep = config.get("early_exit") or {}
    for model, family in (exit_models or {}).items():
        task = sweep["task"]
        n = a["questions"].get(task)
        n = min(n, sweep["limit"]) if n is not None and sweep.get("limit") else n
        job = _decode_job("early_exit", model, family, task, config["eval"]["tasks"][task], n, len(sweep["rules"]),
                          config, a)
        jobs += [job] if job else []
    return jobs, a


def _decode_job(stage: str, model: str, family: str, task: str, spec: dict, questions: int | None, passes: int,
                config: dict, a: dict, paged: bool = False) -> Job | None:
    """One generation job: ``questions`` x samples x ``passes`` answers at the assumed length, in
    the batch the memory allows; None where the benchmark's size is not known. Native engine: each
    row holds a cache of prompt + max_new_tokens (melt_core's buffers are preallocated). ``paged``
    (vLLM): memory for the tokens held, so the batch follows the mean tokens a running sequence holds
    (prompt + half the mean answer; skewed lengths hold more), up to eval.vllm.max_num_seqs, in
    eval.vllm.kv_cache_gb, as long as one whole sequence fits."""
    if questions is None:
        return None
    cfg = ModelConfig.from_name(a["shapes"][family])
    budget = a["gpu_memory_gb"] * 1e9 - weights_gb(cfg) * 1e9
    max_new = spec.get("max_new_tokens", 32768)
    answer = a["mean_new_fraction"] * max_new
    per_seq = cfg.kv_bytes(a["prompt_tokens"] + max_new, 2)
    if paged:
        vllm = config["eval"].get("vllm") or {}
        budget = min(budget, vllm.get("kv_cache_gb", budget / 1e9) * 1e9)
        held = cfg.kv_bytes(int(a["prompt_tokens"] + answer / 2), 2)
        batch = 0 if per_seq > budget else min(vllm.get("max_num_seqs", 256), int(budget // held))
        per_seq = held
    else:
        batch = max(0, min(config["eval"].get("batch_size", 16), int(budget // per_seq)))
    tokens = questions * spec.get("samples", 1) * passes * answer
    shards = spec.get("shards", 1) if stage == "eval" else 1
    # the roofline: tokens / batch steps, each reading the weights, and every token's K/V reads at
    # its mean context (prompt + half its answer), over the HBM bandwidth
    steps = tokens / max(batch, 1)
    bytes_read = (decode_step_bytes(cfg, 0, 0) * steps
                  + tokens * (a["prompt_tokens"] + answer / 2) * kv_read_per_position(cfg))
    limit = bytes_read / a["hbm_bytes_per_s"] / 3600 / shards
    factors = ""
    if paged:
        memory_bound = batch < (config["eval"].get("vllm") or {}).get("max_num_seqs", 256)
        cost = vllm_costs(cfg, family, questions * passes, spec.get("samples", 1), batch, memory_bound,
                          int(a["prompt_tokens"] + answer / 2), config["eval"].get("prefill_chunk"), a)
        hours = (bytes_read / (a["hbm_bytes_per_s"] * a["vllm_bandwidth_share"]) / 3600
                 + cost["prefill_hours"] + cost["preempt_hours"]) / shards
        limit += cost["prefill_limit_hours"] / shards
        factors = (f"; decode at {a['vllm_bandwidth_share']:.0%} of HBM, prefill {cost['prefill_hours']:.2f} h "
                   f"({cost['prefills']:,} prompts computed), preemption <= {cost['preempt_hours']:.2f} h")
    else:
        hours = tokens / (a["decode_tok_s"][family] * max(batch, 1)) / 3600 / shards  # each shard's job
    need = math.ceil(hours * shards / a["job_limit_hours"])
    note = "DOES NOT FIT one sequence" if batch == 0 else (
        f"over the {a['job_limit_hours']:.0f} h limit: "
        + (f"set shards: {need}" if stage == "eval" else "sweep fewer problems or rules")
        if hours > a["job_limit_hours"] else "")
    name = f"{model} {task}" + (f" x {passes} rules" if passes > 1 else "")
    name += f" ({shards} shards)" if shards > 1 else ""
    note = f"{'vLLM ' if paged else ''}batch {batch}; {note}".strip("; ") + factors
    return Job(stage, name, tokens, 1, hours, weights_gb(cfg) + max(batch, 1) * per_seq / 1e9, note, count=shards,
               limit_hours=limit)


def vllm_costs(cfg: ModelConfig, family: str, prompts: int, samples: int, batch: int, memory_bound: bool,
               held_tokens: int, chunk: int | None, a: dict) -> dict:
    """What vLLM's engine spends beside the decode steps on one eval job, in hours:

    - prefill, in vLLM's batch at ``vllm_flops_share`` of the bf16 peak. Prefix caching computes a
      prompt once for its n samples where the cached blocks reach: Ouro's every whole block; MELT's
      only up to its last chunk start on a block edge (melt_core/serving/vllm_scheduler.py: a hit must
      end where a chunk starts), so at the paper's chunk of 500 and 300-token prompts every sample
      computes its prompt again (``prefills``: the prompts computed in full). The limit: each prompt
      once, at the peak.
    - preemption, an upper bound: where the KV memory, not max_num_seqs, sets the batch
      (``memory_bound``), a sequence longer than the mean overflows the pool and vLLM recomputes a
      preempted one as a prefill: bounded by every sequence recomputed once at the mean tokens held."""
    p, block = a["prompt_tokens"], a["vllm_block_size"]
    shared = shareable_tokens(p, chunk if family == "melt" and chunk else 1, block)
    rate = a["peak_bf16_flops"] * a["vllm_flops_share"]
    computed = prompts * p + prompts * (samples - 1) * (p - shared)
    sequences = prompts * samples
    recompute = sequences * held_tokens if memory_bound and batch else 0
    preempt = recompute * forward_flops_per_token(cfg, held_tokens)
    return {"prefills": prompts + (prompts * (samples - 1) if p - shared >= block else 0),
            "prefill_hours": computed * forward_flops_per_token(cfg, p) / rate / 3600,
            "prefill_limit_hours": prompts * p * forward_flops_per_token(cfg, p) / a["peak_bf16_flops"] / 3600,
            "preempt_hours": preempt / rate / 3600}


def render(jobs: list[Job], assumptions: dict, config_name: str) -> str:
    source = (f"measured by benchmarks/gpu_acceptance.py ({assumptions['measured']})" if assumptions.get("measured")
              else "the paper's")
    lines = [f"# Cost plan: {config_name}", "",
             "Estimates from the config and stated assumptions (melt_core/ops/plan.py; override in `plan:`): "
             f"training at {assumptions['train_tok_s_per_gpu']:.0f} tokens/s per H100 ({source}), "
             f"native decoding at {source} per-sequence rates {assumptions['decode_tok_s']} tok/s times the batch "
             f"that fits in {assumptions['gpu_memory_gb']:.0f} GB (a whole prompt + max_new_tokens cache a row); vLLM "
             "decoding, where the eval runs there, priced from what its engine does: the batch the paged KV holds "
             "(the tokens a running sequence holds on average, prompt + half the mean answer, within "
             "eval.vllm.kv_cache_gb and max_num_seqs), each decode step at "
             f"{assumptions['vllm_bandwidth_share']:.0%} of the HBM bandwidth, prompts prefilled in the batch at "
             f"{assumptions['vllm_flops_share']:.0%} of the bf16 peak (shared by a prompt's samples as far as "
             "prefix caching reaches), and preemption's recompute as an upper bound (the two shares are "
             "assumed, not measured); answers averaging "
             f"{assumptions['mean_new_fraction']:.0%} of "
             "max_new_tokens. Beside each estimate, its limit: the wall-clock no GPU of "
             f"{assumptions['hbm_bytes_per_s'] / 1e12:.2f} TB/s HBM and {assumptions['peak_bf16_flops'] / 1e12:.0f} "
             "bf16 TFLOP/s can beat (decode: the weights every loop reads and the K/V rows every loop attends to; "
             "training: its FLOPs), and the ratio estimate / limit.", ""]
    for stage in ("train", "eval", "early_exit"):
        part = [j for j in jobs if j.stage == stage]
        if not part:
            continue
        est, lim = sum(j.gpu_hours for j in part), sum(j.limit_gpu_hours or 0 for j in part)
        lines += [f"## {stage}: {sum(j.count for j in part)} jobs, {sum(j.tokens for j in part) / 1e6:,.0f}M tokens, "
                  f"{est:,.0f} GPU-hours (limit {lim:,.1f}, {_ratio(est, lim)})", ""]
        engines = {kind: [j for j in part if j.note.startswith("vLLM ") == (kind == "vLLM")]
                   for kind in ("vLLM", "native")}
        if stage != "train" and all(engines.values()):  # where the GPU-hours go, engine by engine
            lines += ["By engine: " + "; ".join(
                f"{kind} {sum(j.count for j in js)} jobs, {sum(j.gpu_hours for j in js):,.0f} GPU-hours (limit "
                f"{sum(j.limit_gpu_hours or 0 for j in js):,.1f}, "
                f"{_ratio(sum(j.gpu_hours for j in js), sum(j.limit_gpu_hours or 0 for j in js))})"
                for kind, js in engines.items()) + ".", ""]
        lines += ["| job | tokens (M) | GPUs | wall-clock h (per job) | GPU-hours | limit GPU-hours | estimate / limit "
                  "| peak GB | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {j.name} | {j.tokens / 1e6:,.1f} | {j.gpus} | {j.hours:,.1f} | {j.gpu_hours:,.1f} | "
                  f"{j.limit_gpu_hours or 0:,.2f} | {_ratio(j.gpu_hours, j.limit_gpu_hours)} | "
                  f"{'' if j.peak_gb is None else f'{j.peak_gb:.1f}'} | {j.note} |" for j in part]
        lines.append("")
    total, limit = sum(j.gpu_hours for j in jobs), sum(j.limit_gpu_hours or 0 for j in jobs)
    over = [j.name for j in jobs if "limit" in j.note or "FIT" in j.note]
    lines += [f"**Total: {total:,.0f} GPU-hours; the hardware's limit {limit:,.1f} GPU-hours "
              f"({_ratio(total, limit)}).** Jobs over the runtime limit or not fitting: {len(over)}."]
    return "\n".join(lines) + "\n"


def _ratio(estimate: float, limit: float | None) -> str:
    return f"{estimate / limit:,.1f}x" if limit else "n/a"
