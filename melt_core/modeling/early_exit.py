"""Real early exit: a token stops looping when its exit rule says so, and the loops it skips are
never computed (Ouro's released code and vLLM run every loop and only pick which loop's logits to
use; docs/METHOD.md section 1, the paper's appendix F.2).

Exit rules (``ExitRule``), checked after each loop t = 1..T of a decoded token:
    q              Ouro's Q-exit: stop at the first loop whose cumulative exit probability
                   sum_{s<=t} p_s reaches q (p from early_exit_gate, ``model.exit_distribution``);
                   q >= 1 never stops early (Ouro's shipped threshold 1.0).
    exit_at_loop   every token stops after this loop (a fixed depth; None = off).
    min_loops      no token stops before this many loops.
The last loop always stops. Logits come from the loop a token stopped at.

What later tokens read for an exited token (the cache semantics):
    MELT   a token keeps one K/V row, projected from its latent memory h. A token that stops
           after loop t leaves h_t's row: exactly what the architecture defines, nothing copied.
    Ouro   later tokens read loop-t' rows that an exited token never computed. We copy its last
           computed loop's K/V forward into the deeper loops' slots (the choice some engines
           make); ``LoopKVCache.exit_rows``.
The untrained last-loop sharing baseline behaves as MELT (one row, overwritten per loop).

Where it applies: decoding, one token per row per step (``decode_step``; generate() uses it when
a rule is set). A prompt is prefilled through all T loops (Ouro prefills it in parallel, where
per-token exits would save nothing), so both models are compared on the same footing. In a
batch, the rows still looping are gathered and only they are computed at the next loop.

``exit_gate_loss`` is Ouro's Stage-II adaptive-exit objective, used to train the exit gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError
from .model import LoopStep, rope_tables


@dataclass(frozen=True)
class ExitRule:
    q: float = 1.0
    exit_at_loop: int | None = None
    min_loops: int = 1

    def __post_init__(self):
        if not 0.0 < self.q <= 1.0:
            raise ConfigError(f"exit rule: q must lie in (0, 1] (1 = never exit early), got {self.q}")
        if self.exit_at_loop is not None and (isinstance(self.exit_at_loop, bool) or self.exit_at_loop < 1):
            raise ConfigError(f"exit rule: exit_at_loop must be a loop number >= 1 or null, got {self.exit_at_loop}")
        if isinstance(self.min_loops, bool) or self.min_loops < 1:
            raise ConfigError(f"exit rule: min_loops must be >= 1, got {self.min_loops}")

    @classmethod
    def from_dict(cls, spec: dict | None) -> ExitRule:
        spec = dict(spec or {})
        unknown = set(spec) - {"q", "exit_at_loop", "min_loops"}
        if unknown:
            raise ConfigError(f"exit rule: unknown setting(s) {sorted(unknown)}; known: q, exit_at_loop, min_loops")
        return cls(**spec)

    @classmethod
    def of_checkpoint(cls, config) -> dict:
        """The exit a checkpoint's config asks for by default (the reference code's defaults:
        ``early_exit_threshold`` q, ``early_exit_step`` a 0-based loop), as rule settings."""
        out = {"q": config.early_exit_threshold or 1.0}
        if config.early_exit_step is not None:
            out["exit_at_loop"] = config.early_exit_step + 1
        return out

    def as_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        parts = [f"exit at loop {self.exit_at_loop}"] if self.exit_at_loop is not None else []
        parts += [f"q={self.q:g}"] if self.q < 1 else []
        parts += [f"min {self.min_loops}"] if self.min_loops > 1 else []
        return ", ".join(parts) or "all loops"

    def stops_early(self, num_loops: int) -> bool:
        """Whether any token can stop before the last of ``num_loops`` loops."""
        if self.min_loops >= num_loops:
            return False
        return self.q < 1.0 or (self.exit_at_loop is not None and self.exit_at_loop < num_loops)

    def exits(self, loop: int, cdf: Tensor, rows: Tensor) -> Tensor:
        """Which still-looping rows stop after ``loop`` (1-based): cdf (R,) their cumulative exit
        probability so far, rows (R,) their indices in the batch (rules that depend on the row,
        as tests use, may read it)."""
        stop = torch.zeros_like(cdf, dtype=torch.bool)
        if loop < self.min_loops:
            return stop
        if self.exit_at_loop is not None and loop >= self.exit_at_loop:
            return ~stop
        return cdf >= self.q if self.q < 1.0 else stop


@torch.no_grad()
def decode_step(model, token: Tensor, cache, positions: Tensor, rule: ExitRule,
                hold: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One decoding step of ``token`` (B, 1) at ``positions`` (B, 1) after what ``cache`` holds;
    ``hold`` (B,) True for rows that run every loop (a prompt's tokens, fed through decode steps).
    Returns (logits (B, V) of each row's exit loop, loops (B,) how many loops each row ran)."""
    cfg = model.config
    B, T, N = token.shape[0], model.num_loops, cfg.num_hidden_layers
    if token.shape[1] != 1:
        raise ConfigError(f"decode_step takes one token per row, got {token.shape[1]}")
    cache.check_exits()
    x = model.model.embed_tokens(token)
    cos, sin = rope_tables(positions, model.inv_freq, x.dtype)
    rows = torch.arange(B, device=token.device)  # batch indices of the rows still looping
    memory: list[Tensor | None] = [None] * N
    remaining = torch.ones(B, device=token.device)  # exit-probability mass not yet spent
    cdf = torch.zeros(B, device=token.device)
    logits = torch.empty(B, model.lm_head.out_features, dtype=x.dtype, device=token.device)
    loops = torch.full((B,), T, dtype=torch.long, device=token.device)
    cache.begin_chunk(1, None)
    for t in range(T):
        cache.rows = None if len(rows) == B else rows
        step = LoopStep(cache, cos, sin, 1.0, memory)
        for layer_idx, layer in enumerate(model.model.layers):
            x = layer(x, step, layer_idx, t)
        x = model.model.norm(x)
        lam = torch.sigmoid(model.model.early_exit_gate(x)[:, -1, 0].float())
        cdf = cdf + (remaining if t == T - 1 else lam * remaining)
        remaining = remaining * (1 - lam)
        stop = torch.ones_like(cdf, dtype=torch.bool) if t == T - 1 else rule.exits(t + 1, cdf, rows)
        if hold is not None and t < T - 1:
            stop = stop & ~hold[rows]
        if not bool(stop.any()):
            continue
        logits[rows[stop]] = model.lm_head(x[stop, -1])
        loops[rows[stop]] = t + 1
        if t < T - 1:
            cache.exit_rows(rows[stop], t)
        keep = ~stop
        if not bool(keep.any()):
            break
        rows, x, cos, sin, remaining, cdf = rows[keep], x[keep], cos[keep], sin[keep], remaining[keep], cdf[keep]
        memory = [m[keep] if m is not None else None for m in step.memory]
    cache.rows = None
    cache.end_chunk()
    return logits, loops


def exit_gate_loss(per_loop_logits: Tensor, exit_logits: Tensor, targets: Tensor, mask: Tensor,
                   slope: float = 50.0, threshold: float = 0.005) -> Tensor:
    """Ouro's Stage-II adaptive-exit objective, as we read the Ouro paper: after loop t a token
    should go on when the next loop still lowers its loss. With I_t = max(0, CE_t - CE_{t+1})
    (detached) the target continuation is w_t = sigmoid(slope * (I_t - threshold)), and the gate
    lambda_t (the probability of stopping) is fit by binary cross-entropy to 1 - w_t.

    per_loop_logits (T, B, L, V), exit_logits (T, B, L), targets (B, L), mask (B, L) 1 where the
    token is scored. Only loops 1..T-1 have a decision to learn."""
    T = per_loop_logits.shape[0]
    with torch.no_grad():
        ce = torch.stack([F.cross_entropy(per_loop_logits[t].flatten(0, 1).float(), targets.flatten(),
                                          reduction="none").view_as(targets) for t in range(T)])
        gain = (ce[:-1] - ce[1:]).clamp(min=0)
        go_on = torch.sigmoid(slope * (gain - threshold))
    bce = F.binary_cross_entropy_with_logits(exit_logits[:-1].float(), 1 - go_on, reduction="none")
    weight = mask[None].float().expand_as(bce)
    return (bce * weight).sum() / weight.sum().clamp(min=1)


@torch.enable_grad()
def train_exit_gate(model, batches, steps: int, lr: float = 1e-2, logger=None,
                    prefix: str = "exit_gate", group: int = 1) -> list[float]:
    """Fit only ``model.model.early_exit_gate`` with ``exit_gate_loss`` (Ouro's Stage II), the rest
    frozen. ``batches(step)`` gives (ids (B, L), mask (B, L-1): 1 where the next token is scored).
    Returns the loss per step; the model's trainable flags are restored.

    ``group``: the frozen model runs forward over this many steps' batches at once. The gate reads
    the model's hidden states and feeds nothing back, so those states are the same whatever the
    gate's weights; each step then applies its current gate to its own rows of the captured
    states, in the shapes the forward applies it in. Worth it for MELT's token-by-token forward,
    whose cost per op barely grows with the rows (a 16-row step 1.65 s, eight steps' 128 rows
    0.72 s a step here); on the AMD EPYC's pinned kernels the early-exit job's losses and fitted gate
    were bitwise those of ``group`` = 1, and tests/test_early_exit.py holds them to float64 rounding
    (float32 on an Intel Xeon: 1.8e-6 apart)."""
    gate = model.model.early_exit_gate
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for p in gate.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(gate.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    try:
        for first in range(0, steps, group):
            got = [batches(step) for step in range(first, min(first + group, steps))]
            per_loop, gate_inputs = _frozen_forward(model, torch.cat([ids[:, :-1] for ids, _ in got]))
            start = 0
            for ids, mask in got:
                rows = slice(start, start + ids.shape[0])
                start = rows.stop
                # per chunk: (T, B, C) as the forward stacks it; the chunks joined along L
                exit_logits = torch.cat([torch.stack([gate(x[rows]).squeeze(-1) for x in chunk])
                                         for chunk in gate_inputs], dim=-1)
                loss = exit_gate_loss(per_loop[:, rows], exit_logits, ids[:, 1:], mask)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                step = len(losses) - 1
                if logger is not None and (step % 10 == 0 or step == steps - 1):
                    logger.log_metrics({f"{prefix}/loss": losses[-1]}, step=step)
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return losses


@torch.no_grad()
def _frozen_forward(model, ids: Tensor) -> tuple[Tensor, list[list[Tensor]]]:
    """The frozen model's per-loop logits over ``ids`` and, per chunk and loop, the hidden state
    its exit gate reads (captured at the gate's input)."""
    seen = []
    hook = model.model.early_exit_gate.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    try:
        out = model(ids, logits="all")
    finally:
        hook.remove()
    T = out.per_loop_logits.shape[0]
    return out.per_loop_logits, [seen[i:i + T] for i in range(0, len(seen), T)]
