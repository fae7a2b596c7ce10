"""The training losses of docs/METHOD.md section 3.

* Distillation at every loop: mean over loops t of KL(teacher_t || student_t) per target
  token (ablation: the final loop only).
* Attention alignment (Phase 2): beta/(N*T) * sum_{l,t} ||o_MELT^(l,t) - sg(o_LoopLM^(l,t))||^2,
  o being the attention block's output (after o_proj, before the sandwich norm), the
  squared L2 norm taken per token.

Both return *sums over tokens*; the trainer divides by the global token count so that
micro-batches and data-parallel ranks add up to exactly the full-batch mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def kd_loss_sum(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor, loops: str = "all",
                temperature: float = 1.0) -> Tensor:
    """Sum over masked tokens of the loop-averaged KL(teacher || student).

    student_logits, teacher_logits: (T, B, L, V); mask: (B, L) 1 where the loss applies.
    """
    if loops == "final":
        student_logits, teacher_logits = student_logits[-1:], teacher_logits[-1:]
    elif loops != "all":
        raise ValueError(f"kd loops must be 'all' or 'final', got {loops!r}")
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="none").sum(-1)  # (T', B, L)
    return (kl.mean(0) * mask).sum() * temperature**2


def alignment_loss_sum(student_outs: list[Tensor], teacher_outs: list[Tensor]) -> Tensor:
    """Sum over tokens of (1/(N*T)) sum_{l,t} ||o_s - sg(o_t)||^2 (multiply by beta outside)."""
    if len(student_outs) != len(teacher_outs):
        raise ValueError("student and teacher must report the same (loop, layer) attention outputs")
    total = 0
    for o_s, o_t in zip(student_outs, teacher_outs):
        total = total + (o_s.float() - o_t.detach().float()).pow(2).sum(-1).sum()  # over d, then tokens
    return total / len(student_outs)


def lm_loss_sum(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """Summed cross-entropy over masked tokens (teacher pretraining)."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum()


def token_count(mask: Tensor) -> Tensor:
    return mask.sum().to(torch.float64)
