"""Protects the static-shape decode step (melt_core/generation/static_decode.py), the form a GPU captures in a
CUDA graph: over the same prefilled cache it computes the ordinary decode step's logits within
float32 rounding and picks the same greedy tokens, for Ouro and MELT, with and without left
padding, and for last-loop sharing; it refuses caches whose reads change per step and a cache it
cannot grow into."""

import pytest
import torch
from helpers import make_melt
from numerics import assert_same_function

from melt_core import ConfigError
from melt_core.generation.static_decode import StaticDecode
from melt_core.modeling.cache import CacheCapacityError

STEPS = 6


def prefill(model, padded: bool, **cache_kw):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 97, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4], mask[2, :2] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache(capacity=7 + STEPS, **cache_kw)
    with torch.no_grad():
        out = model(ids, cache=cache, positions=positions, attention_mask=mask, logits="last")
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


@pytest.mark.parametrize("kind", ["ouro", "melt", "last-loop"])
@pytest.mark.parametrize("padded", [False, True])
def test_static_step_equals_ordinary_step(ouro, kind, padded):
    model = make_melt(ouro) if kind == "melt" else ouro
    kw = {"mode": "last-loop"} if kind == "last-loop" else {}
    ordinary, token = prefill(model, padded, **kw)
    static_cache, static_token = prefill(model, padded, **kw)
    static = StaticDecode(model, static_cache)
    with torch.no_grad():
        for _ in range(STEPS):
            positions = ordinary.valid.sum(1, keepdim=True) if ordinary.valid is not None else \
                torch.full_like(token, ordinary.seen)
            want = model(token, cache=ordinary, positions=positions, logits="last").logits[:, -1]
            got = static.decode(static_token)
            assert_same_function(got, want, model.config)
            token, static_token = want.argmax(-1, keepdim=True), got.argmax(-1, keepdim=True)
            assert torch.equal(token, static_token)
    assert static_cache.seen == ordinary.seen == 7 + STEPS
    with pytest.raises(CacheCapacityError, match="capacity"):
        static.decode(static_token)


def test_static_step_can_fail(ouro):
    """The comparison sees a wrong slot: writing the token's rows one slot late changes the logits."""
    cache, token = prefill(ouro, False)
    ordinary, _ = prefill(ouro, False)
    static = StaticDecode(ouro, cache)
    static.view.slot += 1
    with torch.no_grad():
        got = static.step(token, torch.full_like(token, 7))
        want = ouro(token, cache=ordinary, logits="last").logits[:, -1]
    with pytest.raises(AssertionError):
        assert_same_function(got, want, ouro.config)


def test_refuses_caches_it_does_not_cover(ouro):
    melt = make_melt(ouro, window=2)
    cache, _ = prefill(melt, False)
    with pytest.raises(ConfigError, match="sliding window"):
        StaticDecode(melt, cache)
    for kw in ({"mode": "first-loop"}, {"mode": "last-loop", "keep_prompt": True}):
        with pytest.raises(ConfigError, match="first-loop sharing, a kept prompt"):
            StaticDecode(ouro, prefill(ouro, False, **kw)[0])
    with pytest.raises(ConfigError, match="prefilled"):
        StaticDecode(ouro, ouro.new_cache(capacity=8))
