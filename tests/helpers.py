"""Small helpers shared by the tests."""

import melt_core


def make_melt(ouro, **kw):
    """A MELT model from the fixture's Ouro with gates far from trivial."""
    kw.setdefault("gate_init_std", 0.3)
    kw.setdefault("seed", 1)
    return melt_core.melt_from_ouro(ouro, **kw)
