"""The embedded default's two training steps as the CPU benchmarks run them in their child
processes (numerics_probe.py digests them, pin_cost.py times them): the same operations in the same
order as source.pretrain's and a MELT phase's step at config/default.yaml's shapes."""

import torch

from melt_core.modeling.losses import kd_loss_sum, lm_loss_sum


def teacher_step(teacher, opt, ids: torch.Tensor) -> torch.Tensor:
    """source.pretrain's step: the per-loop LM loss on packed rows (``ids``: batch x (L + 1) tokens)."""
    per_loop = teacher(ids[:, :-1], logits="all").per_loop_logits
    loss = sum(lm_loss_sum(x, ids[:, 1:], torch.ones_like(ids[:, 1:], dtype=torch.bool)) for x in per_loop)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def phase_step(teacher, student, opt, ids: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """A MELT phase step: the student chunk-wise (``chunk`` tokens a chunk), KD on every loop's logits
    against the teacher's, every token counted."""
    mask = torch.ones(ids.shape)
    with torch.no_grad():
        t_logits = teacher(ids, logits="all").per_loop_logits
    s = student(ids, cache=student.new_cache(), chunk_size=chunk, logits="all")
    loss = kd_loss_sum(s.per_loop_logits, t_logits, mask) / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
