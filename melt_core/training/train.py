"""Chunk-wise MELT training (docs/METHOD.md section 3): ``train(cfg)`` runs the same in a test, in a
local process and in a SLURM job (see melt_core/training/launch.py).

Student = Ouro weights + gates (a converted MELT checkpoint); teacher = the original Ouro,
frozen. Each step:

    teacher: Ouro forward over the whole sequence (parallel, exact), no grad
    student: MELT forward in chunks of C tokens (chunks in order; the tokens of a chunk in
             parallel through all T loops, reading earlier chunks' final rows)
    loss   = KD (KL teacher_t || student_t, averaged over loops)  + beta * alignment

Phases run back to back, each with an alpha schedule (Phase 1: 0 -> 1, the interpolated
transition) and an alignment weight beta (Phase 2: 0.1); a run can also be one phase that
continues from the run of the phases before it (``init_from``, the workflow's phase rules).
The paper's ablations are switches: ``kd_loops: final``, ``chunk_size: null`` (fully
parallel), ``alpha 1 -> 1`` (no interpolation), one phase only (no alignment).

Checkpoints (every ``checkpoint_every`` steps, written then renamed) hold the student,
optimizer, step, RNG states; the data position is a function of the step. A restarted run
resumes from the newest complete checkpoint and ends bitwise equal (CPU) to an
uninterrupted one.

The run's pieces live beside it: its settings (melt_core.training.train_config), its state across ranks
and restarts (melt_core.training.trainer_state) and the shared teacher logits (melt_core.training.teacher_cache);
this module is the loop.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from tqdm.auto import tqdm

from ..data import PackedData, load_mixture, load_tokenizer
from ..modeling import checkpoint as ck
from ..modeling.config import ConfigError
from ..modeling.losses import alignment_loss_sum, kd_loss_sum, token_count
from ..tracking import NullLogger, make_logger, stamp
from .teacher_cache import TeacherCache, teacher_forward
from .train_config import TrainConfig
from .trainer_state import (
    DIVERGED,
    STATE,
    Dist,
    all_reduce_sum,
    init_distributed,
    latest_checkpoint,
    mark_diverged,
    phase_handoff,
    prune_checkpoints,
    restore,
    retuned_after_divergence,
    save_checkpoint,
    set_aside_superseded,
)


def _device(cfg: TrainConfig, d: Dist) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", d.local_rank if torch.cuda.is_available() else 0)
    return torch.device("cpu")


def _lr_factor(step: int, warmup: int) -> float:
    return min(1.0, (step + 1) / warmup) if warmup else 1.0


def build_optimizer(student, cfg: TrainConfig) -> torch.optim.Optimizer:
    gate_ids = {id(p) for p in student.melt_parameters()}
    groups = [{"params": [p for p in student.parameters() if id(p) not in gate_ids], "lr": cfg.lr_model,
               "name": "model"}]
    if gate_ids:
        groups.append({"params": student.melt_parameters(), "lr": cfg.lr_gate, "name": "gate"})
    return torch.optim.AdamW(groups, betas=cfg.betas, weight_decay=cfg.weight_decay)


@torch.enable_grad()  # whatever the caller's grad mode (lighteval, for one, turns it off globally)
def train(cfg: TrainConfig | dict, logger=None, step_delay: float | None = None) -> Path:
    """Run (or resume) training; returns the final MELT checkpoint directory ``out_dir/final``.
    ``step_delay``: seconds to sleep after each step, so the interruption tests can kill a run
    mid-way (default: MELT_TRAIN_STEP_DELAY, which those tests set for the processes they start)."""
    if step_delay is None:
        step_delay = float(os.environ.get("MELT_TRAIN_STEP_DELAY", "0"))
    if isinstance(cfg, dict):
        cfg = TrainConfig.from_dict(cfg)
    cfg.validate()
    out_dir = Path(cfg.out_dir)
    student_cfg, teacher_cfg = ck.read_config(cfg.student), ck.read_config(cfg.teacher)
    cfg.validate_models(student_cfg, teacher_cfg)
    device = _device(cfg, Dist())
    d = init_distributed(device)
    device = _device(cfg, d)
    if cfg.batch_size % d.world:
        raise ConfigError(f"train config field `batch_size`: {cfg.batch_size} is not divisible by "
                          f"the {d.world} data-parallel ranks")
    per_rank = cfg.batch_size // d.world
    sharded = cfg.sharding if d.world > 1 else "none"
    if d.main:
        stamp(f"{cfg.run_name}: world size {d.world}, sharding {sharded}")
    micro = cfg.micro_batch_size or per_rank
    if per_rank % micro:
        raise ConfigError(f"train config field `micro_batch_size`: {micro} does not divide the "
                          f"{per_rank} sequences per rank")

    data = _training_data(cfg)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    set_aside_superseded(out_dir, cfg, d)
    resume = latest_checkpoint(out_dir, cfg)  # this run's own, interrupted
    handoff = phase_handoff(cfg) if resume is None and cfg.init_from else None  # the previous phase's end
    student, teacher = _models(cfg, d, device, resume or handoff or cfg.student)
    optimizer = build_optimizer(student, cfg)
    start = restore(student, optimizer, cfg, d, resume, handoff)

    shared_teacher = TeacherCache.open(cfg, d, device, micro)
    logger = logger or (make_logger(cfg.mlflow, cfg.run_name, {"stage": "train"}) if d.main else NullLogger())
    if d.main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        logger.log_params({**cfg.to_dict(), "resumed_from_step": start, "world_size": d.world, "sharded": sharded})
    metrics_path = out_dir / "metrics.jsonl"
    if d.main:  # rows of this run up to where it starts: none when fresh, a resume's rows kept, not doubled
        kept = [line for line in metrics_path.read_text().splitlines() if json.loads(line)["step"] <= start] \
            if resume is not None and metrics_path.is_file() else []
        metrics_path.write_text("".join(line + "\n" for line in kept))
    progress = StepLog(cfg.run_name, start, cfg.total_steps, cfg.progress and d.main, cfg.print_every)
    # bf16 autocast on any device (CPU too, so the cluster's code path can be rehearsed without a GPU)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)
    grad_scale = d.world if (cfg.sharding == "fsdp" and d.world > 1) else 1  # FSDP averages; we want sums
    bad_steps = 0
    try:
        for step in range(start, cfg.total_steps):
            phase, in_phase = cfg.phase_at(step)
            row = _step(student, teacher, optimizer, data, step, cfg, d, device, micro,
                        lambda m0, step=step: shared_teacher and shared_teacher.file(step, m0), autocast, grad_scale)
            finite = row.pop("finite")
            if d.main:
                progress.step(row, optimizer.param_groups[0]["lr"], phase_end=in_phase == phase.steps - 1)
                if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.total_steps or not finite:
                    with metrics_path.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    # the step is MLflow's x-axis, not a metric; each parameter group's learning rate
                    # is logged beside the losses
                    lrs = {f"lr_{g['name']}": g["lr"] for g in optimizer.param_groups}
                    logger.log_metrics({**{k: v for k, v in row.items() if k not in ("phase", "step")}, **lrs},
                                       step=step + 1)
            if not finite:
                bad_steps += 1
                _nonfinite(row, cfg, d, out_dir, optimizer, bad_steps)
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.total_steps:
                saved = save_checkpoint(out_dir / "checkpoints" / f"step-{step + 1:07d}", step + 1, student,
                                         optimizer, cfg, d)
                if d.main:
                    prune_checkpoints(out_dir, cfg.keep_checkpoints)
                    stamp(f"{cfg.run_name} checkpoint saved: {saved}")
            if step_delay:
                time.sleep(step_delay)
            if d.world > 1:
                dist.barrier()
    except BaseException:
        if d.main:  # the MLflow run says it failed; the exception goes on to the rule
            progress.close()
            logger.close("FAILED")
        raise
    # the final checkpoint keeps the trainer state too, so a later phase can continue from it
    progress.close()
    final = save_checkpoint(out_dir / "final", cfg.total_steps, student, optimizer, cfg, d,
                             extra={"trained_steps": cfg.total_steps, **retuned_after_divergence(out_dir)})
    if d.main:
        stamp(f"{cfg.run_name} finished: {final}")
        (out_dir / DIVERGED).unlink(missing_ok=True)  # recorded in final's config.json, if there was one
        logger.log_artifact(out_dir / "train_config.json")
        logger.log_artifact(metrics_path)
        logger.set_tags({"final_checkpoint": str(final.resolve())})
        logger.close()
    if d.world > 1:
        dist.barrier()
    return final


class TrainingDiverged(RuntimeError):
    """A step's loss or gradient norm was not finite (more often than ``skip_nonfinite_steps`` allows)."""


def _nonfinite(row: dict, cfg: TrainConfig, d: Dist, out_dir: Path, optimizer, bad_steps: int) -> None:
    """A step that was not finite (its optimizer step not taken): skipped while the config allows,
    else the run stops here with one error naming the phase, step, value and learning rate; its
    checkpoints stay and ``final`` is never written."""
    what = ", ".join(f"{k} {row[k]}" for k in ("loss", "grad_norm") if not math.isfinite(row[k]))
    lrs = ", ".join(f"lr_{g['name']} {g['lr']:g}" for g in optimizer.param_groups)
    where = f"{cfg.run_name}: phase {row['phase']}, step {row['step']}/{cfg.total_steps}: {what} ({lrs})"
    if bad_steps <= cfg.skip_nonfinite_steps:
        if d.main:
            stamp(f"WARNING {where}: step skipped, {bad_steps} of the {cfg.skip_nonfinite_steps} "
                  "skip_nonfinite_steps allows")
        return
    kept = [p for p in (out_dir / "checkpoints").glob("step-*") if (p / STATE).is_file()]
    last = max(kept, key=lambda p: int(p.name.split("-")[1]), default=None)
    if d.main:
        mark_diverged(out_dir, cfg, {"step": row["step"], "phase": row["phase"], "what": what,
                                     "checkpoint": str(last) if last else None})
    resume = (f"the last finite checkpoint, {last}, is kept; rerun with a lower learning rate (train.lr_model / "
              "train.lr_gate in the config) and training resumes from it" if last else
              "no checkpoint was saved before it; rerun with a lower learning rate to start the phase over")
    raise TrainingDiverged(f"training diverged: {where}. `final` was not written; {resume} (or allow a few "
                           "bad steps with train.skip_nonfinite_steps)")


def _training_data(cfg: TrainConfig) -> PackedData:
    """The packed rows every step draws its batch from (a function of the step: resumable)."""
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    records = load_mixture(cfg.data.sources, seed=cfg.seed) if cfg.data.total is None else \
        load_mixture([{**s, "total": cfg.data.total} for s in cfg.data.sources], seed=cfg.seed)
    data = PackedData.build(records, tokenizer, cfg.data.template, cfg.data.seq_len, seed=cfg.seed)
    if cfg.data.loss_on == "all":
        data.loss_mask = torch.ones_like(data.loss_mask)
    return data


def _models(cfg: TrainConfig, d: Dist, device: torch.device, start_from) -> tuple:
    """The student (from ``start_from``, sharded over the ranks under FSDP) and the frozen teacher."""
    student = ck.load_pretrained(start_from, dtype=torch.float32, device=device).train()
    teacher = ck.load_pretrained(cfg.teacher, dtype=torch.float32, device=device).eval()
    teacher.requires_grad_(False)
    student.checkpoint_mlp = cfg.activation_checkpointing
    if cfg.sharding == "fsdp" and d.world > 1:  # before the optimizer: fully_shard swaps the parameters
        for layer in student.model.layers:
            fully_shard(layer)
        fully_shard(student)
    return student, teacher


def _step(student, teacher, optimizer, data: PackedData, step: int, cfg: TrainConfig, d: Dist,
          device: torch.device, micro: int, shared_file, autocast, grad_scale: int) -> dict:
    """One optimizer step over the global batch of ``step`` (micro-batches of ``micro`` rows, losses
    as sums over the global token count, gradients summed over the ranks); returns its log row.
    ``shared_file(m0)``: the TeacherCache file of the micro-batch starting at row m0, or None."""
    phase, in_phase = cfg.phase_at(step)
    alpha = phase.alpha(in_phase)
    for g in optimizer.param_groups:
        g["lr"] = (cfg.lr_model if g["name"] == "model" else cfg.lr_gate) * _lr_factor(step, cfg.warmup_steps)
    ids, mask = data.batch(step, cfg.batch_size, d.rank, d.world)
    ids, mask = ids.to(device), mask.to(device)
    n_tokens = all_reduce_sum(token_count(mask).to(device), d)
    n_positions = all_reduce_sum(torch.tensor(float(mask.numel()), dtype=torch.float64, device=device), d)
    t0 = time.perf_counter()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss, kd, align
    optimizer.zero_grad(set_to_none=True)
    for m0 in range(0, ids.shape[0], micro):
        mb_ids, mb_mask = ids[m0:m0 + micro], mask[m0:m0 + micro]
        with autocast:
            t_out = teacher_forward(teacher, mb_ids[:, :-1], phase.align_beta > 0, shared_file(m0))
            kd, align = _losses(student, t_out, mb_ids, mb_mask, alpha, phase.align_beta, cfg)
            kd_part = kd / n_tokens
            align_part = phase.align_beta * align / n_positions if phase.align_beta else kd_part * 0
            loss = kd_part + align_part
        (loss * grad_scale).backward()
        totals += torch.stack([loss.detach(), kd_part.detach(), align_part.detach()]).double()
    if cfg.sharding == "ddp":
        _all_reduce_grads(student, d)
    grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.grad_clip or float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over the ranks
        grad_norm = grad_norm.full_tensor()
    totals = all_reduce_sum(totals, d)
    # the loss is summed over the ranks and the norm is of the gradients every rank holds after the
    # reduction (DDP) or of the gathered shards (FSDP): every rank sees the same values and agrees
    finite = math.isfinite(totals[0].item()) and math.isfinite(float(grad_norm))
    if finite:  # a non-finite step leaves the weights and the optimizer state as they were
        optimizer.step()
    tok_s = cfg.batch_size * data.seq_len / (time.perf_counter() - t0)
    return {"step": step + 1, "loss": totals[0].item(), "kd": totals[1].item(), "align": totals[2].item(),
            "alpha": alpha, "phase": phase.name, "grad_norm": float(grad_norm), "tokens_per_s": tok_s,
            "finite": finite}


class StepLog:
    """Training progress a person can follow: a tqdm bar in a terminal; elsewhere (a rule's log
    file, a SLURM job) one timestamped line every ``every`` steps, at phase ends and at the end."""

    def __init__(self, name: str, start: int, total: int, enabled: bool, every: int):
        self.name, self.start, self.total, self.enabled = name, start, total, enabled
        self.every = every or max(1, (total - start) // 50)
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total, initial=start, desc=name, dynamic_ncols=True) \
            if enabled and sys.stderr.isatty() else None

    def step(self, row: dict, lr: float, phase_end: bool) -> None:
        if not self.enabled:
            return
        loss = f"loss {row['loss']:.3g} kd {row['kd']:.3g} align {row['align']:.3g}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{row['phase']} {loss} alpha {row['alpha']:.2f} tok/s {row['tokens_per_s']:.0f}")
            return
        done = row["step"] - self.start
        if done == 1 or phase_end or row["step"] % self.every == 0 or row["step"] == self.total:
            left = (time.perf_counter() - self.t0) / done * (self.total - row["step"])
            stamp(f"{self.name} step {row['step']}/{self.total} [{row['phase']}] {loss} alpha {row['alpha']:.2f} "
                  f"lr {lr:.3g} tok/s {row['tokens_per_s']:.0f} grad_norm {row['grad_norm']:.3g} "
                  f"left {time.strftime('%H:%M:%S', time.gmtime(left))}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _losses(student, t_out, ids, mask, alpha, beta, cfg: TrainConfig):
    inp = ids[:, :-1]
    need_align = beta > 0
    cache = student.new_cache(detach_past=cfg.detach_past)
    chunk = cfg.chunk_size or inp.shape[1]
    s_out = student(inp, cache=cache, chunk_size=chunk, alpha=alpha, collect_attn_outputs=need_align)
    kd = kd_loss_sum(s_out.per_loop_logits, t_out.per_loop_logits, mask, cfg.kd_loops, cfg.kd_temperature)
    align = alignment_loss_sum(s_out.attn_outputs, t_out.attn_outputs) if need_align else None
    return kd, align


def _all_reduce_grads(model, d: Dist) -> None:
    """Sum gradients over ranks (each rank's loss is already divided by the global token count)."""
    if d.world == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main(argv: list[str] | None = None) -> None:
    import argparse

    import yaml

    p = argparse.ArgumentParser(description="Chunk-wise MELT training from a YAML/JSON config")
    p.add_argument("config", help="train config file (the `train` block of the workflow config)")
    a = p.parse_args(argv)
    raw = yaml.safe_load(Path(a.config).read_text())
    print(train(TrainConfig.from_dict(raw)))


if __name__ == "__main__":
    main()
