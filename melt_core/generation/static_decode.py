"""A decode step with static shapes, for CUDA-graph capture.

The ordinary decode step (``model(token, cache=cache)``) reads ``buffer[..., :seen, :]``, a view
whose length changes with every token, and keeps its counts in Python ints, so a captured graph
replayed for the next token would read and write the wrong slots. ``StaticDecode`` runs the same
model forward over the cache's own preallocated buffers through ``StaticView``, a cache whose
shapes are fixed by the capacity:

* the token's K/V rows are written at a slot held in a device tensor (``index_copy_``);
* every query reads the whole buffer, masked to the slots written so far and to the rows' left
  padding; unwritten slots are zeroed once, so a masked slot adds exactly 0;
* RoPE positions arrive as a tensor; nothing in the step reads a tensor on the host.

So a step can be captured once (``capture``: ``torch.cuda.CUDAGraph``) and replayed per token,
``advance`` moving the slot and the cache's counts between replays. MELT writes its one row per
(layer, token) at every loop, overwriting it in place as ``SharedKVCache`` stages it (so does
last-loop sharing); Ouro writes loop t's row into loop t's store. Early exit, a sliding window,
first-loop sharing, a kept prompt and interpolation are not covered (there the cache decides per
step what a query reads).

On CPU it computes what the ordinary step computes up to rounding (attention sums over more keys,
masked): ``tests/test_static_decode.py``; ``benchmarks/decode_speed.py --paths`` times the two.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..modeling.cache import Block, CacheCapacityError, KVCache, LoopKVCache, SharedKVCache
from ..modeling.config import ConfigError
from ..modeling.model import LoopedLM


class StaticView(KVCache):
    """A prefilled preallocated cache seen with static shapes: one token per step, every read the
    whole buffer under a mask built from the ``slot`` tensor."""

    def __init__(self, cache: KVCache):
        super().__init__(cache.N, cache.T, cache.capacity)
        if not isinstance(cache, (LoopKVCache, SharedKVCache)) or not cache.writes_in_place:
            raise ConfigError("a static decode step covers MELT's cache, Ouro's per-loop cache and last-loop "
                              "sharing, not a sliding window, first-loop sharing, a kept prompt or Phase-1 "
                              "interpolation")
        if cache.capacity is None or cache._stores()[0]._buf is None:
            raise ConfigError("a static decode step needs a preallocated cache (new_cache(capacity=...)), "
                              "prefilled with the prompt first")
        self.cache, self.melt, self.stores = cache, isinstance(cache, SharedKVCache), cache._stores()
        buf = self.stores[0]._buf[0]
        for store in self.stores:  # never-written memory may hold NaN, and 0 * NaN is not 0
            for b in store._buf:
                b[..., store.length:, :] = 0
        self.slot = torch.tensor([cache.seen], device=buf.device)  # where the next token's rows go
        self._slots = torch.arange(cache.capacity, device=buf.device)
        valid = torch.ones(buf.shape[0], cache.capacity, dtype=torch.bool, device=buf.device)
        if cache.valid is not None:
            valid[:, :cache.seen] = cache.valid
        self._valid = valid
        self.seen = cache.seen

    def begin_chunk(self, chunk_len, valid):
        if chunk_len != 1 or valid is not None:
            raise ValueError("a static decode step takes one token per row, no padding")
        self._mask_now = ((self._slots <= self.slot) & self._valid)[:, None, None, :]  # (B, 1, 1, capacity)

    def end_chunk(self):
        """Counts move in advance(), outside a captured graph."""

    def read(self, layer, loop, kv, base=None, alpha=1.0):
        kb, vb = self.stores[layer if self.melt else loop * self.N + layer]._buf
        kb.index_copy_(2, self.slot, kv[0])
        vb.index_copy_(2, self.slot, kv[1])
        return [Block(kb, vb, self._mask_now)]

    def _stores(self):
        return self.stores


class StaticDecode:
    """Decode steps of ``model`` over a prefilled, preallocated ``cache``."""

    def __init__(self, model: LoopedLM, cache: KVCache):
        self.model, self.cache, self.view = model, cache, StaticView(cache)
        self.graph: torch.cuda.CUDAGraph | None = None

    def positions(self) -> Tensor:
        """The next token's RoPE positions (B, 1): each row's count of valid slots so far."""
        cache, dev = self.cache, self.view.slot.device
        if cache.valid is None:
            return torch.full((self.view._valid.shape[0], 1), cache.seen, dtype=torch.long, device=dev)
        return cache.valid.sum(dim=1, keepdim=True)

    def step(self, token: Tensor, positions: Tensor) -> Tensor:
        """token, positions: (B, 1); the last loop's logits (B, V). Static shapes, no host reads on
        a GPU: capturable. ``advance()`` after it."""
        return self.model(token, cache=self.view, positions=positions, logits="last").logits[:, -1]

    def advance(self) -> None:
        """The token's rows are committed: the stores' lengths, the cache's count and validity (its
        own chunk bookkeeping, as after an ordinary one-token step), and the slot tensor in place."""
        cache = self.cache
        for store in self.view.stores:
            store.length += 1
        cache.begin_chunk(1, None)
        cache.end_chunk()
        self.view.seen = cache.seen
        self.view.slot += 1

    def decode(self, token: Tensor) -> Tensor:
        """One step and its commit, eagerly (or by replay once captured): the logits (B, V)."""
        if self.cache.seen >= self.cache.capacity:
            raise CacheCapacityError(f"KV cache capacity {self.cache.capacity} tokens exceeded; create the "
                                     "cache with capacity >= prompt length + max_new_tokens")
        if self.graph is not None:
            self._token.copy_(token)
            self._positions.copy_(self.positions())
            logits = self.replay()
        else:
            logits = self.step(token, self.positions())
        self.advance()
        return logits

    # ---------------------------------------------------------------- CUDA graphs
    def capture(self, token: Tensor) -> None:
        """Record one step on a CUDA graph; ``decode`` then replays it per token."""
        if token.device.type != "cuda":
            raise ConfigError("CUDA-graph capture needs a CUDA device; on CPU decode() runs the step eagerly")
        self._token, self._positions = token.clone(), self.positions().clone()
        slot = self.view.slot.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph: allocator and kernel choice
            self.step(self._token, self._positions)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._out = self.step(self._token, self._positions)
        self.view.slot.copy_(slot)  # the slot's rows are written again by the first replay

    def replay(self) -> Tensor:
        self.graph.replay()
        return self._out
