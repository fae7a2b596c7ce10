"""What a config will cost before it is submitted: tokens to train, tokens to generate, peak
memory and estimated H100-hours per job, each job's wall-clock against the cluster's limit.

Everything here is arithmetic on the config plus stated assumptions (``ASSUMPTIONS``): benchmark
sizes, the mean length of a generated answer, and throughputs (the paper's own figures unless
``profile_speed`` measured ours). Rule ``plan`` writes it to ``<outdir>/plan.md``:

    snakemake plan --configfile config/paper.yaml --cores 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .checkpoint import expected_shapes
from .config import ModelConfig

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
    "job_limit_hours": 24.0,  # profiles/slurm: the eval rule's runtime
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

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus * self.count


def weights_gb(cfg: ModelConfig, dtype_bytes: int = 2) -> float:
    return sum(math.prod(s) for s in expected_shapes(cfg).values()) * dtype_bytes / 1e9


def _family(model: str) -> str:
    return "melt" if model.startswith("melt") else "dense" if model.startswith("dense") else "ouro"


def plan(config: dict, models: list[str], phase_jobs: list[tuple[str, str, int]],
         exit_models: list[str] = ()) -> tuple[list[Job], dict]:
    """Jobs of the DAG with their costs. ``phase_jobs``: (gate, path, steps) of every phase job;
    ``exit_models``: the early-exit sweep's models (one job each, every rule in turn, costed at
    every loop: an upper bound)."""
    a = {**ASSUMPTIONS, **(config.get("plan") or {})}
    jobs = []
    train, launcher = config["train"], config["launcher"]
    gpus = launcher.get("nodes", 1) * (launcher.get("gpus_per_node") or launcher.get("tasks_per_node", 1))
    for gate, path, steps in phase_jobs:
        tokens = steps * train["batch_size"] * train["seq_len"]
        jobs.append(Job("train", f"{gate}/{path}", tokens, gpus, tokens / (a["train_tok_s_per_gpu"] * gpus) / 3600))
    for model in models:
        for task, spec in config["eval"]["tasks"].items():
            job = _decode_job("eval", model, task, spec, a["questions"].get(task), 1, config, a)
            jobs += [job] if job else []
    sweep = config.get("early_exit") or {}
    for model in exit_models:
        task = sweep["task"]
        n = a["questions"].get(task)
        n = min(n, sweep["limit"]) if n is not None and sweep.get("limit") else n
        job = _decode_job("early_exit", model, task, config["eval"]["tasks"][task], n, len(sweep["rules"]), config, a)
        jobs += [job] if job else []
    return jobs, a


def _decode_job(stage: str, model: str, task: str, spec: dict, questions: int | None, passes: int, config: dict,
                a: dict) -> Job | None:
    """One generation job: ``questions`` x samples x ``passes`` answers at the assumed length, in
    the batch the memory allows; None where the benchmark's size is not known."""
    if questions is None:
        return None
    family = _family(model)
    cfg = ModelConfig.from_name(a["shapes"][family])
    budget = a["gpu_memory_gb"] * 1e9 - weights_gb(cfg) * 1e9
    max_new = spec.get("max_new_tokens", 32768)
    per_seq = cfg.kv_bytes(a["prompt_tokens"] + max_new, 2)
    batch = max(0, min(config["eval"].get("batch_size", 16), int(budget // per_seq)))
    tokens = questions * spec.get("samples", 1) * passes * a["mean_new_fraction"] * max_new
    shards = spec.get("shards", 1) if stage == "eval" else 1
    hours = tokens / (a["decode_tok_s"][family] * max(batch, 1)) / 3600 / shards  # each shard's job
    need = math.ceil(hours * shards / a["job_limit_hours"])
    note = "DOES NOT FIT one sequence" if batch == 0 else (
        f"over the {a['job_limit_hours']:.0f} h limit: "
        + (f"set shards: {need}" if stage == "eval" else "sweep fewer problems or rules")
        if hours > a["job_limit_hours"] else "")
    name = f"{model} {task}" + (f" x {passes} rules" if passes > 1 else "")
    name += f" ({shards} shards)" if shards > 1 else ""
    return Job(stage, name, tokens, 1, hours, weights_gb(cfg) + max(batch, 1) * per_seq / 1e9,
               f"batch {batch}; {note}".strip("; "), count=shards)


def render(jobs: list[Job], assumptions: dict, config_name: str) -> str:
    lines = [f"# Cost plan: {config_name}", "",
             "Estimates from the config and stated assumptions (melt_core/plan.py; override in `plan:`): "
             f"training at {assumptions['train_tok_s_per_gpu']:.0f} tokens/s per H100 (the paper's main run), "
             f"decoding at the paper's batch-1 rates {assumptions['decode_tok_s']} tok/s times the batch that fits "
             f"in {assumptions['gpu_memory_gb']:.0f} GB, answers averaging {assumptions['mean_new_fraction']:.0%} of "
             "max_new_tokens.", ""]
    for stage in ("train", "eval", "early_exit"):
        part = [j for j in jobs if j.stage == stage]
        if not part:
            continue
        lines += [f"## {stage}: {sum(j.count for j in part)} jobs, {sum(j.tokens for j in part) / 1e6:,.0f}M tokens, "
                  f"{sum(j.gpu_hours for j in part):,.0f} GPU-hours", "",
                  "| job | tokens (M) | GPUs | wall-clock h (per job) | GPU-hours | peak GB | note |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {j.name} | {j.tokens / 1e6:,.1f} | {j.gpus} | {j.hours:,.1f} | {j.gpu_hours:,.1f} | "
                  f"{'' if j.peak_gb is None else f'{j.peak_gb:.1f}'} | {j.note} |" for j in part]
        lines.append("")
    total = sum(j.gpu_hours for j in jobs)
    over = [j.name for j in jobs if "limit" in j.note or "FIT" in j.note]
    lines += [f"**Total: {total:,.0f} GPU-hours.** Jobs over the limit or not fitting: {len(over)}."]
    return "\n".join(lines) + "\n"
