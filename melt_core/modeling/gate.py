"""MELT's latent-memory gate (docs/METHOD.md section 2, Eq. 1) and its Table-3 variants.

For one layer, loop t and token i, with a = input_layernorm(x) (what Ouro feeds to q/k/v):

    z = sigmoid(a W_z + h_prev U_z + b_z)      # elementwise: z in (0,1)^d; scalar: one z
    h = z * h_prev + (1 - z) * a               # the token's latent memory after loop t

K and V are then projected from h instead of from a. Parameter-free variants:
``mean`` (h_t = mean of a_1..a_t), ``ema`` (fixed z) and ``last`` (h_t = a_t).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import GATE_VARIANTS, LEARNED_GATES, ConfigError


class LatentGate(nn.Module):
    """Updates a token's latent memory h across loops. One instance per layer."""

    def __init__(self, variant: str, hidden_size: int, h0: str = "zeros", ema_z: float = 0.2):
        super().__init__()
        if variant not in GATE_VARIANTS:
            raise ConfigError(f"unknown gate variant {variant!r}; choose one of {GATE_VARIANTS}")
        self.variant, self.h0, self.ema_z = variant, h0, ema_z
        if variant in LEARNED_GATES:
            width = hidden_size if variant == "elementwise" else 1
            self.input_proj = nn.Linear(hidden_size, width, bias=True)  # W_z, b_z
            self.state_proj = nn.Linear(hidden_size, width, bias=False)  # U_z

    @property
    def learned(self) -> bool:
        return self.variant in LEARNED_GATES

    def reset_parameters(self, std: float, bias: float, generator: torch.Generator | None = None) -> None:
        if not self.learned:
            return
        with torch.no_grad():
            for lin in (self.input_proj, self.state_proj):
                w = torch.randn(lin.weight.shape, generator=generator, dtype=torch.float32) * std
                lin.weight.copy_(w)
            self.input_proj.bias.fill_(bias)

    def retain(self, a: Tensor, h_prev: Tensor) -> Tensor:
        """z, the share of h_prev kept: (B, L, d) for elementwise, (B, L, 1) for scalar/ema."""
        if self.variant == "ema":
            return torch.full_like(a[..., :1], self.ema_z)
        return torch.sigmoid(self.input_proj(a) + self.state_proj(h_prev))

    def forward(self, a: Tensor, h_prev: Tensor | None, loop: int) -> Tensor:
        """a: (B, L, d) this loop's normed input; h_prev: memory after the previous loop or None."""
        if self.variant == "last":
            return a
        if self.variant == "mean":  # running mean over loops; h_0 plays no part
            return a if h_prev is None else h_prev + (a - h_prev) / (loop + 1)
        if h_prev is None:
            if self.h0 == "first":
                return a
            if self.variant == "ema":
                return (1 - self.ema_z) * a
            # h_0 = 0: U_z h_0 vanishes and so does z * h_0 (saves a matmul per layer at loop 1)
            return (1 - torch.sigmoid(self.input_proj(a))) * a
        z = self.retain(a, h_prev)  # bf16 under autocast, while a and h_prev stay float32
        return torch.lerp(a, h_prev, z.to(a.dtype))  # z * h_prev + (1 - z) * a


@torch.no_grad()
def mean_retention(model, input_ids: Tensor, chunk_size: int = 1) -> Tensor:
    """Mean gate value z (share of h_prev kept) per layer and loop, (N, T), over ``input_ids``.

    NaN where a gate has no z (``mean``/``last``, or loop 1 with h0 = first).
    """
    cfg = model.config
    stats = torch.full((cfg.num_hidden_layers, cfg.total_ut_steps), float("nan"))
    sums: dict[tuple[int, int], list[float]] = {}
    hooks = []
    for layer_idx, layer in enumerate(model.model.layers):
        gate = layer.gate
        if gate is None or gate.variant in ("mean", "last"):
            continue

        def hook(module, args, _out, layer_idx=layer_idx):
            a, h_prev, loop = args
            if h_prev is None:
                if module.h0 == "first":
                    return
                h_prev = torch.zeros_like(a)
            sums.setdefault((layer_idx, loop), []).append(float(module.retain(a, h_prev).mean()))

        hooks.append(gate.register_forward_hook(hook))
    try:
        model(input_ids, chunk_size=chunk_size, logits="last")
    finally:
        for h in hooks:
            h.remove()
    for (layer_idx, loop), values in sums.items():
        stats[layer_idx, loop] = sum(values) / len(values)
    return stats
