"""Scoring: answer extraction, exact match and the unbiased pass@k estimator (Chen et al., 2021)."""

from __future__ import annotations

import math
import re


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct:
    1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per question, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def extract_answer(text: str, style: str = "exact") -> str:
    """``exact``: the completion stripped; ``boxed``: the last \\boxed{...} (math benchmarks)."""
    if style == "exact":
        return text.strip()
    if style == "boxed":
        found = _BOXED.findall(text)
        return found[-1].strip() if found else ""
    raise ValueError(f"unknown answer style {style!r}; use exact or boxed")
