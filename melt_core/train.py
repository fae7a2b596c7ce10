"""Chunk-wise MELT training (docs/METHOD.md section 3): ``train(cfg)`` runs the same in a test, in a
local process and in a SLURM job (see melt_core/launch.py).

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from . import checkpoint as ck
from .config import ConfigError, ModelConfig
from .data import PackedData, load_mixture, load_tokenizer
from .losses import alignment_loss_sum, kd_loss_sum, token_count
from .tracking import NullLogger, config_hash, data_digest, make_logger, stamp


@dataclass
class PhaseConfig:
    name: str
    steps: int
    alpha_start: float = 1.0  # Phase 1 (v2): 0.0 -> 1.0 linearly over the phase
    alpha_end: float = 1.0
    align_beta: float = 0.0  # Phase 2: 0.1

    def alpha(self, step_in_phase: int) -> float:
        if self.steps <= 1:
            return self.alpha_end
        frac = step_in_phase / (self.steps - 1)
        return self.alpha_start + (self.alpha_end - self.alpha_start) * frac


@dataclass
class DataConfig:
    sources: list[dict[str, Any]]  # see melt_core.data.load_mixture
    tokenizer: str
    template: str = "chatml-thinking"
    seq_len: int = 10_000
    total: int | None = None  # records drawn from the mixture (paper: ~32K)
    loss_on: str = "all"  # KD on every token ("all") or on assistant tokens only ("assistant")


@dataclass
class TrainConfig:
    student: str  # MELT checkpoint directory (melt_core.convert)
    teacher: str  # Ouro checkpoint directory
    out_dir: str
    data: DataConfig
    phases: list[PhaseConfig]
    chunk_size: int | None = 500  # C; null = fully parallel (the "-chunking" ablation)
    batch_size: int = 32  # sequences per optimizer step, over all ranks
    micro_batch_size: int | None = None  # per rank per forward; None = batch_size / world
    lr_model: float = 8e-6
    lr_gate: float | None = 5e-4  # None for gates without parameters (mean / ema / last)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 0
    grad_clip: float | None = 1.0
    kd_loops: str = "all"  # all | final
    kd_temperature: float = 1.0
    detach_past: bool = False  # True: no gradient into earlier chunks' rows (truncated BPTT)
    seed: int = 0
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    device: str = "auto"  # auto | cpu | cuda
    autocast_bf16: bool = False  # bf16 autocast (GPU, or CPU for rehearsals)
    activation_checkpointing: bool = False  # recompute each layer's MLP half in backward
    sharding: str = "ddp"  # ddp (replicate) | fsdp (shard student + optimizer over ranks)
    log_every: int = 1  # metrics.jsonl / MLflow every N steps
    progress: bool = True
    print_every: int = 0  # a log line every N steps when not in a terminal; 0: about 50 lines a run
    mlflow: dict[str, Any] | None = None  # {experiment, tracking_uri, tags, parent_run_id}
    run_name: str = "train"
    # Phase by phase: ``phases`` lists the whole path so far and ``init_from`` is the final checkpoint
    # of the run that trained all but the last of them (weights + trainer state); only the last
    # phase's steps run here. ``handoff``: what continues from it. ``continue`` (default, the paper's
    # single run): optimizer state, step counter (so data order and LR schedule position), RNG;
    # ``fresh_optimizer``: the same but a new AdamW state.
    init_from: str | None = None
    handoff: str = "continue"
    # A folder where the teacher's per-loop logits of each step are kept and read by every run of
    # the same teacher on the same batches (the embedded default: nine runs a seed read the same
    # batches in the same order; the teacher's forward is a fifth of a step there). Bitwise the same
    # training (the same forward, computed once); not for Phase 2's alignment, which needs the
    # teacher's attention outputs. None: the teacher runs in every step (the paper's scale: 32 x 10K
    # tokens x 49K vocab x 4 loops of logits a step, far beyond any disk).
    teacher_cache: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        raw = dict(raw)
        _reject_unknown(cls, raw, "train")
        _reject_unknown(DataConfig, raw.get("data", {}), "train.data")
        for i, p in enumerate(raw.get("phases", [])):
            _reject_unknown(PhaseConfig, p, f"train.phases[{i}]")
        raw["data"] = DataConfig(**raw["data"])
        raw["phases"] = [PhaseConfig(**p) for p in raw["phases"]]
        if "betas" in raw:
            raw["betas"] = tuple(raw["betas"])
        cfg = cls(**raw)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    def phase_at(self, step: int) -> tuple[PhaseConfig, int]:
        for p in self.phases:
            if step < p.steps:
                return p, step
            step -= p.steps
        raise IndexError(step)

    def validate(self) -> None:
        """As strict as the workflow's schema; every bad field gets its own line in one error."""
        problems: list[str] = []

        def need(cond, name, msg):
            if not cond:
                problems.append(f"train config field `{name}`: {msg}")

        def integer(v):  # bool is an int to Python, never to a config
            return isinstance(v, int) and not isinstance(v, bool)

        def number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        need(self.chunk_size is None or (integer(self.chunk_size) and self.chunk_size >= 1),
             "chunk_size", f"must be an integer >= 1 or null (fully parallel), got {self.chunk_size!r}")
        need(bool(self.phases), "phases", "at least one phase is needed")
        for i, p in enumerate(self.phases):
            need(integer(p.steps) and p.steps >= 1, f"phases[{i}].steps", f"must be an integer >= 1, got {p.steps!r}")
            for name in ("alpha_start", "alpha_end"):
                v = getattr(p, name)
                need(number(v) and 0.0 <= v <= 1.0, f"phases[{i}].{name}",
                     f"the alpha schedule must stay in [0, 1], got {v!r}")
            need(number(p.align_beta) and p.align_beta >= 0, f"phases[{i}].align_beta",
                 f"must be a number >= 0, got {p.align_beta!r}")
        need(self.kd_loops in ("all", "final"), "kd_loops", f"must be 'all' or 'final', got {self.kd_loops!r}")
        need(number(self.kd_temperature) and self.kd_temperature > 0, "kd_temperature",
             f"must be > 0 (it divides the logits), got {self.kd_temperature!r}")
        need(self.sharding in ("ddp", "fsdp"), "sharding", f"must be ddp or fsdp, got {self.sharding!r}")
        need(self.device in ("auto", "cpu", "cuda"), "device", f"must be auto, cpu or cuda, got {self.device!r}")
        need(integer(self.batch_size) and self.batch_size >= 1, "batch_size",
             f"must be an integer >= 1, got {self.batch_size!r}")
        need(self.micro_batch_size is None or (integer(self.micro_batch_size) and self.micro_batch_size >= 1),
             "micro_batch_size", f"must be an integer >= 1 or null, got {self.micro_batch_size!r}")
        need(number(self.lr_model) and self.lr_model >= 0, "lr_model", f"must be a number >= 0, got {self.lr_model!r}")
        need(self.lr_gate is None or (number(self.lr_gate) and self.lr_gate >= 0), "lr_gate",
             f"must be a number >= 0 or null, got {self.lr_gate!r}")
        need(number(self.weight_decay) and self.weight_decay >= 0, "weight_decay",
             f"must be a number >= 0, got {self.weight_decay!r}")
        need(self.grad_clip is None or (number(self.grad_clip) and self.grad_clip > 0), "grad_clip",
             f"must be a number > 0 or null (no clipping), got {self.grad_clip!r}")
        need(integer(self.warmup_steps) and self.warmup_steps >= 0, "warmup_steps",
             f"must be an integer >= 0, got {self.warmup_steps!r}")
        need(len(self.betas) == 2 and all(number(b) and 0 <= b < 1 for b in self.betas), "betas",
             f"must be two numbers in [0, 1), got {self.betas!r}")
        need(integer(self.data.seq_len) and self.data.seq_len >= 2, "data.seq_len",
             f"must be an integer >= 2 (an input and a target), got {self.data.seq_len!r}")
        need(self.data.loss_on in ("assistant", "all"), "data.loss_on",
             f"must be 'assistant' or 'all', got {self.data.loss_on!r}")
        need(self.data.total is None or (integer(self.data.total) and self.data.total >= 1), "data.total",
             f"must be an integer >= 1 or null, got {self.data.total!r}")
        need(integer(self.checkpoint_every) and self.checkpoint_every >= 1, "checkpoint_every",
             f"must be an integer >= 1, got {self.checkpoint_every!r}")
        need(integer(self.keep_checkpoints) and self.keep_checkpoints >= 1, "keep_checkpoints",
             f"must be an integer >= 1, got {self.keep_checkpoints!r}")
        need(self.handoff in ("continue", "fresh_optimizer"), "handoff",
             f"must be 'continue' or 'fresh_optimizer', got {self.handoff!r}")
        need(self.teacher_cache is None or (isinstance(self.teacher_cache, str) and self.teacher_cache),
             "teacher_cache", f"must be a folder path or null, got {self.teacher_cache!r}")
        if problems:
            raise ConfigError("\n".join(problems))

    def validate_models(self, student: ModelConfig, teacher: ModelConfig) -> None:
        """Checks that need the checkpoints' configs; run before any compute."""
        if not student.is_melt:
            raise ConfigError(f"train.student {self.student}: model_type {student.model_type!r}; "
                              "convert the Ouro checkpoint first (python -m melt_core.convert)")
        if teacher.is_melt:
            raise ConfigError(f"train.teacher {self.teacher}: the teacher must be the original Ouro")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "total_ut_steps"):
            if getattr(student, f) != getattr(teacher, f):
                raise ConfigError(f"teacher and student differ in {f}: {getattr(teacher, f)} vs "
                                  f"{getattr(student, f)}; the student must be converted from this teacher")
        has_gate_params = student.gate in ("elementwise", "scalar")
        if self.lr_gate is not None and not has_gate_params:
            raise ConfigError(f"train config field `lr_gate`: set to {self.lr_gate} but gate "
                              f"{student.gate!r} has no parameters; set lr_gate: null")
        if self.lr_gate is None and has_gate_params:
            raise ConfigError(f"train config field `lr_gate`: the {student.gate} gate has parameters; "
                              "give them a learning rate (paper: 5e-4)")
        if self.data.seq_len > student.max_position_embeddings:
            raise ConfigError(f"train config field `data.seq_len`: {self.data.seq_len} is longer than "
                              f"the model's max_position_embeddings={student.max_position_embeddings}")


def _reject_unknown(cls, raw: dict, where: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; known fields are {sorted(known)}")


# ------------------------------------------------------------------------ distributed
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


def _all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t)
    return t


# ------------------------------------------------------------------------ checkpoints
STATE = "trainer_state.pt"
# Seconds to sleep after each step: lets the interruption tests kill a run mid-way.
_STEP_DELAY = float(os.environ.get("MELT_TRAIN_STEP_DELAY", "0"))


def _checkpoints(out_dir: Path) -> list[Path]:
    root = out_dir / "checkpoints"
    return sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if root.is_dir() else []


def _state_options(d: Dist, **kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # across ranks: full (unsharded) tensors on the CPU of rank 0; alone: the model's own tensors
    return StateDictOptions(full_state_dict=d.world > 1, cpu_offload=d.world > 1, **kw)


def full_model_state(student, d: Dist) -> dict:
    """The model's full state dict (FSDP shards gathered; a collective call on every rank)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(student, options=_state_options(d))


def full_optimizer_state(student, optimizer, d: Dist) -> dict:
    """The optimizer's full state, keyed by parameter name (so DDP and FSDP runs resume each other)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(student, optimizer, options=_state_options(d))


def _save_checkpoint(dest: Path, step: int, student, optimizer, cfg: TrainConfig, d: Dist,
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


def _prune_checkpoints(out_dir: Path, keep: int) -> None:
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


def latest_checkpoint(out_dir: Path, cfg: TrainConfig) -> Path | None:
    complete = [p for p in _checkpoints(out_dir) if (p / STATE).is_file()]
    if not complete:
        return None
    last = complete[-1]
    saved = json.loads((last / "config.json").read_text()).get("train_config_hash")
    if saved != config_hash(_resume_key(cfg)):
        raise ConfigError(f"{last}: this checkpoint was written by a different training config; "
                          f"use another out_dir or delete {out_dir / 'checkpoints'} to start over")
    return last


def set_aside_superseded(out_dir: Path, cfg: TrainConfig, d: Dist) -> None:
    """A run whose settings changed retrains cleanly: the checkpoints and metrics another config
    wrote here move to ``superseded/<their config hash>/`` (kept, never mixed with the new run's)."""
    complete = [p for p in _checkpoints(out_dir) if (p / STATE).is_file()]
    saved = json.loads((complete[-1] / "config.json").read_text()).get("train_config_hash") if complete else None
    if saved is not None and saved != config_hash(_resume_key(cfg)) and d.main:
        dest = out_dir / "superseded" / f"{saved}-{time.strftime('%Y%m%d-%H%M%S')}"
        dest.mkdir(parents=True)
        for name in ("checkpoints", "metrics.jsonl", "train_config.json"):
            if (out_dir / name).exists():
                os.replace(out_dir / name, dest / name)
        stamp(f"{cfg.run_name}: the settings changed since the last run here; its checkpoints and metrics "
              f"were moved to {dest}, training starts over")
    if d.world > 1:
        dist.barrier()


# ------------------------------------------------------------------------ training
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
def train(cfg: TrainConfig | dict, logger=None) -> Path:
    """Run (or resume) training; returns the final MELT checkpoint directory ``out_dir/final``."""
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

    tokenizer = load_tokenizer(cfg.data.tokenizer)
    records = load_mixture(cfg.data.sources, seed=cfg.seed) if cfg.data.total is None else \
        load_mixture([{**s, "total": cfg.data.total} for s in cfg.data.sources], seed=cfg.seed)
    data = PackedData.build(records, tokenizer, cfg.data.template, cfg.data.seq_len, seed=cfg.seed)
    if cfg.data.loss_on == "all":
        data.loss_mask = torch.ones_like(data.loss_mask)

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    set_aside_superseded(out_dir, cfg, d)
    resume = latest_checkpoint(out_dir, cfg)  # this run's own, interrupted
    handoff = phase_handoff(cfg) if resume is None and cfg.init_from else None  # the previous phase's end
    student = ck.load_pretrained(resume or handoff or cfg.student, dtype=torch.float32, device=device).train()
    teacher = ck.load_pretrained(cfg.teacher, dtype=torch.float32, device=device).eval()
    teacher.requires_grad_(False)
    student.checkpoint_mlp = cfg.activation_checkpointing
    if cfg.sharding == "fsdp" and d.world > 1:  # before the optimizer: fully_shard swaps the parameters
        from torch.distributed.fsdp import fully_shard

        for layer in student.model.layers:
            fully_shard(layer)
        fully_shard(student)
    optimizer = build_optimizer(student, cfg)
    start = 0
    if resume is not None or handoff is not None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        state = torch.load((resume or handoff) / STATE, map_location="cpu", weights_only=True)
        if resume is not None or cfg.handoff == "continue":
            # strict=False: parameters that never receive a gradient (the exit gate) have no Adam state
            set_optimizer_state_dict(student, optimizer, state["optimizer"],
                                     options=_state_options(d, strict=False))
        torch.set_rng_state(state["torch_rng"])
        random.setstate(_as_tuple(state["python_rng"]))
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        start = state["step"]
        what = "resuming" if resume is not None else f"continuing ({cfg.handoff}) after the earlier phases"
        stamp(f"{cfg.run_name} {what} from step {start} ({resume or handoff})")

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
    for step in range(start, cfg.total_steps):
        phase, in_phase = cfg.phase_at(step)
        alpha = phase.alpha(in_phase)
        for g in optimizer.param_groups:
            g["lr"] = (cfg.lr_model if g["name"] == "model" else cfg.lr_gate) * _lr_factor(step, cfg.warmup_steps)
        ids, mask = data.batch(step, cfg.batch_size, d.rank, d.world)
        ids, mask = ids.to(device), mask.to(device)
        n_tokens = _all_reduce_sum(token_count(mask).to(device), d)
        n_positions = _all_reduce_sum(torch.tensor(float(mask.numel()), dtype=torch.float64, device=device), d)
        t0 = time.perf_counter()
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss, kd, align
        optimizer.zero_grad(set_to_none=True)
        for m0 in range(0, ids.shape[0], micro):
            mb_ids, mb_mask = ids[m0:m0 + micro], mask[m0:m0 + micro]
            with autocast:
                t_out = _teacher_forward(teacher, mb_ids[:, :-1], phase.align_beta > 0,
                                         shared_teacher and shared_teacher.file(step, m0))
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
        optimizer.step()
        totals = _all_reduce_sum(totals, d)
        elapsed = time.perf_counter() - t0
        tok_s = cfg.batch_size * data.seq_len / elapsed
        row = {"step": step + 1, "loss": totals[0].item(), "kd": totals[1].item(), "align": totals[2].item(),
               "alpha": alpha, "phase": phase.name, "grad_norm": float(grad_norm), "tokens_per_s": tok_s}
        if d.main:
            progress.step(row, optimizer.param_groups[0]["lr"], phase_end=in_phase == phase.steps - 1)
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.total_steps:
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                # the step is MLflow's x-axis, not a metric; each parameter group's learning rate is
                # logged beside the losses
                lrs = {f"lr_{g['name']}": g["lr"] for g in optimizer.param_groups}
                logger.log_metrics({**{k: v for k, v in row.items() if k not in ("phase", "step")}, **lrs},
                                   step=step + 1)
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.total_steps:
            saved = _save_checkpoint(out_dir / "checkpoints" / f"step-{step + 1:07d}", step + 1, student, optimizer,
                                     cfg, d)
            if d.main:
                _prune_checkpoints(out_dir, cfg.keep_checkpoints)
                stamp(f"{cfg.run_name} checkpoint saved: {saved}")
        if _STEP_DELAY:
            time.sleep(_STEP_DELAY)
        if d.world > 1:
            dist.barrier()
    # the final checkpoint keeps the trainer state too, so a later phase can continue from it
    progress.close()
    final = _save_checkpoint(out_dir / "final", cfg.total_steps, student, optimizer, cfg, d,
                             extra={"trained_steps": cfg.total_steps})
    if d.main:
        stamp(f"{cfg.run_name} finished: {final}")
        logger.log_artifact(out_dir / "train_config.json")
        logger.log_artifact(metrics_path)
        logger.set_tags({"final_checkpoint": str(final.resolve())})
        logger.close()
    if d.world > 1:
        dist.barrier()
    return final


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


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x


class TeacherCache:
    """``train.teacher_cache``: the teacher's per-loop logits, one file per (step, rank, micro-batch),
    in a subfolder keyed by everything that decides them (the teacher's and the data's bytes, the
    batch order, the ranks, the arithmetic), so a run never reads another teacher's or batch's."""

    def __init__(self, root: Path, rank: int):
        self.root, self.rank = root, rank

    @classmethod
    def open(cls, cfg: TrainConfig, d: Dist, device: torch.device, micro: int) -> TeacherCache | None:
        if not cfg.teacher_cache:
            return None
        data = dataclasses.asdict(cfg.data)
        data.pop("loss_on")  # a mask on the loss, not on the teacher's logits
        for s in data["sources"]:
            if "path" in s:
                s["digest"] = data_digest(s["path"])
        key = {"teacher": data_digest(cfg.teacher), "data": data, "tokenizer": data_digest(cfg.data.tokenizer),
               "seed": cfg.seed, "batch_size": cfg.batch_size, "micro": micro, "world": d.world,
               "autocast_bf16": cfg.autocast_bf16, "device": device.type, "torch": torch.__version__}
        root = Path(cfg.teacher_cache) / config_hash(key)
        root.mkdir(parents=True, exist_ok=True)
        if d.main and not (root / "key.json").is_file():
            (root / "key.json").write_text(json.dumps(key, indent=2))
        return cls(root, d.rank)

    def file(self, step: int, m0: int) -> Path:
        return self.root / f"step-{step:07d}-rank{self.rank}-row{m0}.pt"


def _teacher_forward(teacher, inp, need_align: bool, shared: Path | None):
    """The teacher's output on ``inp``; with ``shared`` (a TeacherCache file) its per-loop logits are
    read from there when another run already computed them, else computed and left there (written
    then renamed: a reader never sees half a file)."""
    if shared is not None and not need_align and shared.is_file():
        return TeacherLogits(torch.load(shared, map_location=inp.device, weights_only=True))
    with torch.no_grad():
        out = teacher(inp, collect_attn_outputs=need_align)
    if shared is not None and not need_align:
        tmp = shared.with_name(f"{shared.name}.{os.getpid()}.tmp")
        torch.save(out.per_loop_logits, tmp)
        os.replace(tmp, shared)
    return out


@dataclass
class TeacherLogits:
    per_loop_logits: torch.Tensor
    attn_outputs: None = None


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
