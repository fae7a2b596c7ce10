"""Small helpers shared by the tests."""

import melt_core


def rate(p: float, n: int = 200) -> list[float]:
    """Per-question scores (percent) of n questions of which a share p are solved, in a fixed
    pattern (the verdict and claim tests fabricate results with it)."""
    return [100.0 if (i * p) % 1 + p >= 1 - 1e-9 else 0.0 for i in range(n)]


def make_melt(ouro, **kw):
    """A MELT model from the fixture's Ouro with gates far from trivial."""
    kw.setdefault("gate_init_std", 0.3)
    kw.setdefault("seed", 1)
    return melt_core.melt_from_ouro(ouro, **kw)
