"""``train.teacher_cache``: the teacher's per-loop logits of each training step, computed by the first
run that needs them and read by every other run of the same teacher on the same batches (bitwise
the same training; the embedded default's nine runs a seed read the same batches)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..tracking import config_hash, data_digest
from .train_config import TrainConfig
from .trainer_state import Dist


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


def teacher_forward(teacher, inp, need_align: bool, shared: Path | None):
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
