"""Trainer state across processes and restarts: the ranks of a run (``Dist``), checkpoints that
appear whole (student weights + optimizer, step and RNG states, FSDP shards gathered), resuming an
interrupted run bitwise, handing a finished phase to the next, and setting aside what a run with
other settings left behind."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from ..modeling import checkpoint as ck
from ..modeling.config import ConfigError
from ..tracking import config_hash, stamp
from .train_config import TrainConfig


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Dist:
    """Join the process group described by the environment (torchrun / submitit export)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t)
    return t


STATE = "trainer_state.pt"


def _checkpoints(out_dir: Path) -> list[Path]:
    root = out_dir / "checkpoints"
    return sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if root.is_dir() else []


def _state_options(d: Dist, **kw):
    # across ranks: full (unsharded) tensors on the CPU of rank 0; alone: the model's own tensors
    return StateDictOptions(full_state_dict=d.world > 1, cpu_offload=d.world > 1, **kw)


def full_model_state(student, d: Dist) -> dict:
    """The model's full state dict (FSDP shards gathered; a collective call on every rank)."""
    return get_model_state_dict(student, options=_state_options(d))


def full_optimizer_state(student, optimizer, d: Dist) -> dict:
    """The optimizer's full state, keyed by parameter name (so DDP and FSDP runs resume each other)."""
    return get_optimizer_state_dict(student, optimizer, options=_state_options(d))


def save_checkpoint(dest: Path, step: int, student, optimizer, cfg: TrainConfig, d: Dist,
                     extra: dict | None = None) -> Path:
    """Student weights + trainer state (optimizer, step, RNG) in one directory that appears whole.
    Every rank calls this (gathering FSDP shards is collective); rank 0 writes."""
    model_state, optim_state = full_model_state(student, d), full_optimizer_state(student, optimizer, d)
    if not d.main:
        return dest
    state = {"step": step, "optimizer": optim_state, "torch_rng": torch.get_rng_state(),
             "python_rng": random.getstate()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    copy_side_files = ck.side_file_copier(cfg.student)

    def write_extra(tmp: Path) -> None:
        copy_side_files(tmp)
        torch.save(state, tmp / STATE)  # its presence marks the checkpoint complete

    info = {"train_config_hash": config_hash(_resume_key(cfg)), "train_step": step,
            "phases": [dataclasses.asdict(p) for p in cfg.phases], **(extra or {})}
    ck.save_pretrained(student, dest, extra_config=info, write_extra=write_extra, state=model_state)
    return dest


def prune_checkpoints(out_dir: Path, keep: int) -> None:
    for old in _checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def phase_handoff(cfg: TrainConfig) -> Path:
    """``init_from``, checked to hold exactly the earlier phases of ``cfg.phases``, trained to the end."""
    src = Path(cfg.init_from)
    if not (src / STATE).is_file() or not (src / "config.json").is_file():
        raise ConfigError(f"train config field `init_from`: {src} is not a finished training run's checkpoint "
                          f"(config.json and {STATE} expected)")
    saved = json.loads((src / "config.json").read_text())
    done = saved.get("phases") or []
    ours = [dataclasses.asdict(p) for p in cfg.phases]
    if not done or len(done) >= len(ours) or ours[:len(done)] != done:
        raise ConfigError(f"train config field `init_from`: {src} trained phases {[p['name'] for p in done]} "
                          f"with other settings than the start of this run's {[p['name'] for p in ours]}; "
                          "retrain the earlier phase (its settings changed) or fix the phase list")
    if saved.get("train_step") != sum(p["steps"] for p in done):
        raise ConfigError(f"train config field `init_from`: {src} stopped at step {saved.get('train_step')}, "
                          f"before the end of its phases")
    return src


def _resume_key(cfg: TrainConfig) -> dict:
    """The fields a checkpoint must agree on to be resumed (not logging, not paths)."""
    d = cfg.to_dict()
    for k in ("out_dir", "progress", "mlflow", "log_every", "print_every", "run_name", "keep_checkpoints", "device",
              "teacher_cache"):
        d.pop(k, None)
    return d


# What a diverged run leaves beside its checkpoints (melt_core.training.train.TrainingDiverged): the step,
# the value and the settings it diverged with. A rerun whose config differs from the checkpoint's
# only in these settings (a lower learning rate, say) resumes from the last checkpoint instead of
# setting it aside; any other change starts over as usual.
DIVERGED = "diverged.json"
RETUNABLE = ("lr_model", "lr_gate", "warmup_steps", "grad_clip", "skip_nonfinite_steps")


def mark_diverged(out_dir: Path, cfg: TrainConfig, report: dict) -> None:
    """Rank 0: record the divergence (and the settings it happened with) for the rerun."""
    settings = {k: getattr(cfg, k) for k in RETUNABLE}
    (out_dir / DIVERGED).write_text(json.dumps({**report, "settings": settings}, indent=2, default=str))


def retuned_after_divergence(out_dir: Path) -> dict:
    """For the final checkpoint's config.json: the divergence this run resumed after, if any."""
    marker = out_dir / DIVERGED
    return {"resumed_after_divergence": json.loads(marker.read_text())} if marker.is_file() else {}


def _written_by(ckpt: Path, cfg: TrainConfig, out_dir: Path) -> str | None:
    """Whether ``ckpt`` may be resumed by ``cfg``: 'same' (the config that wrote it), 'retuned' (the
    config of a run that diverged, with only its RETUNABLE settings changed since), or None."""
    saved = json.loads((ckpt / "config.json").read_text()).get("train_config_hash")
    key = _resume_key(cfg)
    if saved == config_hash(key):
        return "same"
    marker = out_dir / DIVERGED
    if marker.is_file() and saved == config_hash({**key, **json.loads(marker.read_text())["settings"]}):
        return "retuned"
    return None


def latest_checkpoint(out_dir: Path, cfg: TrainConfig) -> Path | None:
    complete = [p for p in _checkpoints(out_dir) if (p / STATE).is_file()]
    if not complete:
        return None
    last = complete[-1]
    how = _written_by(last, cfg, out_dir)
    if how is None:
        raise ConfigError(f"{last}: this checkpoint was written by a different training config; "
                          f"use another out_dir or delete {out_dir / 'checkpoints'} to start over")
    if how == "retuned":
        old = json.loads((out_dir / DIVERGED).read_text())
        changed = {k: (old["settings"][k], getattr(cfg, k)) for k in RETUNABLE if old["settings"][k] != getattr(cfg, k)}
        stamp(f"{cfg.run_name}: diverged at step {old.get('step')} ({old.get('what')}); resuming from {last.name} "
              f"with {', '.join(f'{k} {a} -> {b}' for k, (a, b) in changed.items())}")
    return last


def set_aside_superseded(out_dir: Path, cfg: TrainConfig, d: Dist) -> None:
    """A run whose settings changed retrains cleanly: the checkpoints and metrics another config
    wrote here move to ``superseded/<their config hash>/`` (kept, never mixed with the new run's)."""
    complete = [p for p in _checkpoints(out_dir) if (p / STATE).is_file()]
    if complete and _written_by(complete[-1], cfg, out_dir) is None and d.main:
        saved = json.loads((complete[-1] / "config.json").read_text()).get("train_config_hash")
        dest = out_dir / "superseded" / f"{saved}-{time.strftime('%Y%m%d-%H%M%S')}"
        dest.mkdir(parents=True)
        for name in ("checkpoints", "metrics.jsonl", "train_config.json", DIVERGED):
            if (out_dir / name).exists():
                os.replace(out_dir / name, dest / name)
        stamp(f"{cfg.run_name}: the settings changed since the last run here; its checkpoints and metrics "
              f"were moved to {dest}, training starts over")
    if d.world > 1:
        dist.barrier()


def restore(student, optimizer, cfg: TrainConfig, d: Dist, resume: Path | None, handoff: Path | None) -> int:
    """Load the trainer state of ``resume`` (this run's own checkpoint) or ``handoff`` (the previous
    phase's end) into the optimizer and the RNGs; returns the step training continues from (0 for
    a fresh run). ``handoff: fresh_optimizer`` keeps a new optimizer state."""
    src = resume or handoff
    if src is None:
        return 0
    state = torch.load(src / STATE, map_location="cpu", weights_only=True)
    if resume is not None or cfg.handoff == "continue":
        # strict=False: parameters that never receive a gradient (the exit gate) have no Adam state
        set_optimizer_state_dict(student, optimizer, state["optimizer"], options=_state_options(d, strict=False))
    torch.set_rng_state(state["torch_rng"])
    random.setstate(_as_tuple(state["python_rng"]))
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    what = "resuming" if resume is not None else f"continuing ({cfg.handoff}) after the earlier phases"
    stamp(f"{cfg.run_name} {what} from step {state['step']} ({src})")
    return state["step"]


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x
