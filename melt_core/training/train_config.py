"""What a training run is (``TrainConfig``): the student and teacher, the data, the phases with
their alpha schedules and alignment weights, the optimiser, checkpointing and sharding, validated
as strictly as the workflow's schema before any compute (docs/METHOD.md section 3)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..modeling.config import LEARNED_GATES, ConfigError, ModelConfig


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
    student: str  # MELT checkpoint directory (melt_core.modeling.convert)
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
    # A step whose loss or gradient norm is not finite stops the run (melt_core.training.train.TrainingDiverged);
    # up to this many such steps are skipped first (no optimizer step taken; off by default, as in
    # large-scale trainers' NaN checks). The checkpoints before it stay; resuming with a lower
    # learning rate continues from the last one (melt_core.training.trainer_state.DIVERGED).
    skip_nonfinite_steps: int = 0
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
        need(integer(self.skip_nonfinite_steps) and self.skip_nonfinite_steps >= 0, "skip_nonfinite_steps",
             f"must be an integer >= 0 (0: stop at the first non-finite step), got {self.skip_nonfinite_steps!r}")
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
                              "convert the Ouro checkpoint first (python -m melt_core.modeling.convert)")
        if teacher.is_melt:
            raise ConfigError(f"train.teacher {self.teacher}: the teacher must be the original Ouro")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "total_ut_steps"):
            if getattr(student, f) != getattr(teacher, f):
                raise ConfigError(f"teacher and student differ in {f}: {getattr(teacher, f)} vs "
                                  f"{getattr(student, f)}; the student must be converted from this teacher")
        has_gate_params = student.gate in LEARNED_GATES
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
