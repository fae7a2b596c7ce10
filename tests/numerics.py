"""Tolerances for comparing outputs of two separately built or separately run models.

Two computations of the same float32 function may sum in different orders: another kernel,
another operand alignment, another split across threads. Probabilistic rounding analysis
(Higham & Mary 2019) bounds the relative error of n accumulated roundings by lambda * sqrt(n) * u
with high probability (u = 2^-24, lambda a small constant; the worst case n * u is never reached in
practice). A forward pass accumulates n = K * depth roundings on the residual stream, with K the
longest reduction (hidden or MLP width) and depth = T * N * REDUCTIONS_PER_BLOCK, so logits of
magnitude max|z| agree within

    atol = sqrt(K * depth) * u * max|z|      (lambda = 1).

For the fixture (d = 64, MLP 160, N = 3, T = 4, max|z| ~ 4.5) that is ~2.7e-5; differences seen
between kernels are <= 4e-6. ``assert_tolerance_can_fail`` shows the bound still sees a real
change: scaling layer 0's input norm by 1 + 1e-3 moves the logits by ~4e-3.
"""

from __future__ import annotations

import copy
import math

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32
# per layer and loop: q/k/v projections, attention scores, weighted values, o_proj, MLP up/gate,
# MLP down; MELT's gate projections feed a sigmoid and stay within this count.
REDUCTIONS_PER_BLOCK = 6


def logit_atol(config, logits: torch.Tensor) -> float:
    k = max(config.hidden_size, config.intermediate_size)
    depth = config.total_ut_steps * config.num_hidden_layers * REDUCTIONS_PER_BLOCK
    return math.sqrt(k * depth) * UNIT_ROUNDOFF * float(logits.detach().abs().max())


def assert_same_function(got: torch.Tensor, want: torch.Tensor, config) -> float:
    """``got`` equals ``want`` within float32 rounding at the model's depth; returns the atol."""
    atol = logit_atol(config, want)
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    return atol


def assert_tolerance_can_fail(model, run, want: torch.Tensor, atol: float) -> None:
    """``run(copy)`` of a copy of ``model`` with layer 0's input norm scaled by 1 + 1e-3 must
    differ from ``want`` by more than ``atol``: the comparison is able to fail."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].input_layernorm.weight.mul_(1 + 1e-3)
        diff = float((run(other) - want).abs().max())
    assert diff > atol, f"a 0.1% weight change moved the output by {diff:.2e}, within atol {atol:.2e}"
