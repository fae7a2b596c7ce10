"""KV caches: Ouro's per-loop cache and the one-row-per-token cache of MELT.

The cache object decides *which* keys and values a query reads; the model only computes
q, k, v. This is where MELT differs from Ouro, so it is spelled out here:

* ``LoopKVCache`` (Ouro): one K/V row per (loop, layer) per token. At loop t a token
  reads every token's loop-t row. Bytes per token = T*N*2*H_kv*D*bytes.
* ``SharedKVCache`` (MELT and the untrained sharing baselines of Appendix B): one row per
  (layer, token). The rows of a chunk being processed are *staged* in the slots they will
  finally occupy and are overwritten in place at every loop; after loop T they are
  committed. Earlier tokens are read through their final rows. Options (the window, the kept
  prompt and the interpolation are each a class of their own):
    - ``SlidingWindow`` (``window`` W, v3): the last W tokens also keep their per-loop rows, so at
      loop t a query reads them at loop t and reads older tokens' final rows.
    - ``write_every_loop=False``: the row is written at loop 1 only ("first-loop sharing").
    - ``KeptPromptSharedKVCache``: the prompt is cached per loop as in Ouro; only tokens after
      ``end_prompt()`` share one row ("with prompt cache" in Table 5).
    - ``OuroRows`` (a read with ``alpha`` < 1: Phase-1 interpolation, training): attention reads
      alpha*KV_MELT + (1-alpha)*KV_base, KV_base being Ouro's per-loop K/V of the same
      tokens; alpha = 0 is exactly Ouro.

Storage comes in two kinds (``RowStore``): a preallocated buffer for inference
(``capacity`` given: no copies while decoding, and the bytes held match the analytic
formula) and a growing list for training (autograd-safe, nothing written in place).

Masks are boolean, True = may attend, shaped (B, 1, Q, K), built once per chunk.

Early exit (melt_core/modeling/early_exit.py): while ``rows`` is set, only those batch rows are written and
read (the others have stopped looping for this token); ``exit_rows`` is what a cache does for rows
that stop, and ``end_chunk`` then closes the step for every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError

KV = tuple[Tensor, Tensor]  # (k, v), each (B, H_kv, rows, D)


class CacheCapacityError(RuntimeError):
    pass


def _ones(b: int, n: int, like: Tensor) -> Tensor:
    return torch.ones(b, n, dtype=torch.bool, device=like.device)


class RowStore:
    """K/V rows growing along the sequence axis (dim -2)."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.length = 0
        self._buf: KV | None = None  # buffer mode
        self._parts: list[KV] = []  # list mode
        self._joined: KV | None = None

    def _write(self, rows: KV, batch: Tensor | None = None) -> int:
        """Buffer mode: copy rows into slots [length, length + C) (of batch rows ``batch`` only,
        when given); returns the end slot."""
        end = self.length + rows[0].shape[-2]
        if self._buf is None and batch is not None:
            raise RuntimeError("a store is first written for the whole batch (prefill), not a subset of rows")
        if self._buf is None:
            self._buf = tuple(
                torch.empty((*r.shape[:-2], self.capacity, r.shape[-1]), dtype=r.dtype, device=r.device)
                for r in rows)
        if end > self.capacity:
            raise CacheCapacityError(
                f"KV cache capacity {self.capacity} tokens exceeded (needs {end}); create the "
                "cache with capacity >= prompt length + max_new_tokens")
        for buf, r in zip(self._buf, rows):
            if batch is None:
                buf[..., self.length:end, :] = r
            else:
                buf[batch, :, self.length:end, :] = r
        return end

    def read(self, staged: KV | None = None, batch: Tensor | None = None) -> KV:
        """Committed rows followed by ``staged`` rows (which are not committed); of the batch rows
        ``batch`` only, when given (buffer mode)."""
        if self.capacity is not None:
            end = self._write(staged, batch) if staged is not None else self.length
            if batch is not None:
                return tuple(b[:, :, :end].index_select(0, batch) for b in self._buf)
            return tuple(b[..., :end, :] for b in self._buf)
        if batch is not None:
            raise RuntimeError("reading a subset of rows needs a preallocated cache (capacity)")
        if self._joined is None and self._parts:
            self._joined = self._parts[0] if len(self._parts) == 1 else tuple(
                torch.cat(x, dim=-2) for x in zip(*self._parts))
        if staged is None:
            return self._joined
        if self._joined is None:
            return staged
        return tuple(torch.cat((j, s), dim=-2) for j, s in zip(self._joined, staged))

    def append(self, rows: KV, batch: Tensor | None = None) -> None:
        if self.capacity is not None:
            self.length = self._write(rows, batch)
            return
        self._parts.append(rows)
        self._joined = None
        self.length += rows[0].shape[-2]

    # continuous batching (buffer mode): see KVCache.adopt / shift / select
    def shift(self, d: int) -> None:
        """Move every row's slots by ``d``: left (< 0) drops the first -d slots, right (> 0) opens
        d empty slots at the front."""
        if self._buf is None:
            raise RuntimeError("only a preallocated, written cache can be shifted")
        if not 0 <= self.length + d <= self.capacity:
            raise CacheCapacityError(f"cannot shift {self.length} slots by {d} within capacity {self.capacity}")
        for b in self._buf:
            if d < 0:
                b[..., :self.length + d, :] = b[..., -d:self.length, :].clone()
            elif d > 0:  # the opened slots are zeroed: masked out, but never-written memory may hold
                # NaN, and attention's 0 * NaN would still reach the output
                b[..., d:self.length + d, :] = b[..., :self.length, :].clone()
                b[..., :d, :] = 0
        self.length += d

    def adopt(self, rows: Tensor, other: RowStore) -> None:
        """Batch rows ``rows`` take ``other``'s rows (one per row, other.length slots) as their last
        slots."""
        n = other.length
        if n == 0:
            return
        for b, o in zip(self._buf, other._buf):
            b[rows, :, self.length - n:self.length] = o[:, :, :n]

    def select(self, keep: Tensor) -> None:
        """Keep batch rows ``keep`` only (the others' buffers are freed)."""
        if self._buf is not None:
            self._buf = tuple(b.index_select(0, keep) for b in self._buf)

    def nbytes(self) -> int:
        """Bytes of tensor storage this store holds (the whole buffer in buffer mode)."""
        if self._buf is not None:
            return sum(b.untyped_storage().nbytes() for b in self._buf)
        return sum(t.numel() * t.element_size() for part in self._parts for t in part)


@dataclass
class Block:
    """One set of keys/values a query reads, with its mask (None = attend to all)."""

    k: Tensor
    v: Tensor
    mask: Tensor | None


def attend(q: Tensor, blocks: list[Block]) -> Tensor:
    """Softmax attention of q (B, H, C, D) over the union of key blocks; returns (B, H, C, D).

    One block goes to SDPA. Several blocks (sliding window, kept prompt) share one softmax:
    their scores are concatenated, so no K/V is copied.
    """
    group = q.shape[1] // blocks[0].k.shape[1]
    if len(blocks) == 1:
        b = blocks[0]
        return F.scaled_dot_product_attention(q, b.k, b.v, attn_mask=b.mask, enable_gqa=group > 1)
    scale = q.shape[-1] ** -0.5
    scores, values = [], []
    for b in blocks:
        k, v = (b.k.repeat_interleave(group, 1), b.v.repeat_interleave(group, 1)) if group > 1 else (b.k, b.v)
        s = (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * scale  # (B, H, C, K_b)
        if b.mask is not None:
            s = s.masked_fill(~b.mask, float("-inf"))
        scores.append(s)
        values.append(v)
    probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(q.dtype)
    out, start = 0, 0
    for s, v in zip(scores, values):
        out = out + probs[..., start:start + s.shape[-1]] @ v
        start += s.shape[-1]
    return out


class KVCache:
    """What every cache shares: the token count, padding validity and per-chunk masks."""

    def __init__(self, num_layers: int, num_loops: int, capacity: int | None):
        self.N, self.T, self.capacity = num_layers, num_loops, capacity
        self.seen = 0  # tokens committed
        self.valid: Tensor | None = None  # (B, seen) False at left-padding slots
        self._chunk_valid: Tensor | None = None
        self._masks: dict[str, Tensor | None] = {}
        self.rows: Tensor | None = None  # early exit: the batch rows still looping (None = all)
        self._exited = False  # some rows stopped early in this chunk

    # ----------------------------------------------------------------- chunk life
    def begin_chunk(self, chunk_len: int, valid: Tensor | None) -> None:
        """Called by the model before a chunk of ``chunk_len`` tokens; valid: (B, C) or None."""
        self._chunk_len = chunk_len
        self._chunk_valid = valid
        self._masks = {}

    def end_chunk(self) -> None:
        if self._exited:  # every store closes this step for every row, looped to the end or not
            for store in self._stores():
                store.length = self.seen + self._chunk_len
            self._exited = False
        if self._chunk_valid is not None or self.valid is not None:
            ref = self._chunk_valid if self._chunk_valid is not None else self.valid
            past = self.valid if self.valid is not None else _ones(ref.shape[0], self.seen, ref)
            cur = self._chunk_valid if self._chunk_valid is not None else _ones(
                ref.shape[0], self._chunk_len, ref)
            self.valid = torch.cat((past, cur), dim=1)
        self.seen += self._chunk_len

    def end_prompt(self) -> None:
        """Generation calls this after prefill; only caches that treat the prompt apart care."""

    # ---------------------------------------------------------------- early exit
    @property
    def writes_in_place(self) -> bool:
        """Each (layer, loop) read writes the chunk's K/V into one store, in the slots where they
        stay, and reads that store alone: no per-loop side rows (a window), no prompt kept apart, no
        interpolation, and every loop writes (not first-loop sharing). Early exit needs it (a stopped
        token's rows are already where later tokens read them) and so does the static decode step."""
        return True

    def check_exits(self) -> None:
        """Raise unless this cache can let rows stop early (before a decode step with exits)."""
        if self.capacity is None:
            raise RuntimeError("early exit needs a preallocated cache (new_cache(capacity=...))")
        if not self.writes_in_place:
            raise ConfigError("early exit is implemented for MELT's cache and Ouro's (and last-loop sharing), "
                              "not with a sliding window, first-loop sharing, a kept prompt or alpha < 1")

    def exit_rows(self, rows: Tensor, loop: int) -> None:
        """Batch ``rows`` stopped after ``loop`` (0-based) of this step's token."""
        self._exited = True

    def _stores(self) -> list[RowStore]:
        raise NotImplementedError

    def _rows_of(self, mask: Tensor | None) -> Tensor | None:
        """A per-batch mask cut to the rows still looping."""
        if self.rows is None or mask is None or mask.shape[0] == 1:
            return mask
        return mask.index_select(0, self.rows)

    # ------------------------------------------------------- continuous batching
    # The rows of a batch share one slot axis: slot s is written for every row at the same step.
    # A row that finishes takes a new prompt, prefilled in a cache of its own: ``adopt`` copies
    # that cache's P slots into the row's last P slots [seen - P, seen) and marks its older slots
    # invalid (RoPE positions are per row, attention is masked per row, so the row decodes as it
    # would alone), shifting every row's slots right first when P > seen. When the buffers are
    # ``full``, ``compact`` drops the leading slots no row reads any more; ``select`` lets finished
    # rows go when no prompt is left to take their place.
    @property
    def supports_refill(self) -> bool:
        return self.capacity is not None

    def _buffered(self) -> list[RowStore]:
        return self._stores()

    def _valid_full(self) -> Tensor:
        """(B, seen) validity, materialized where no slot was padding."""
        if self.valid is not None:
            return self.valid
        buf = next(s._buf[0] for s in self._buffered() if s._buf is not None)
        return torch.ones(buf.shape[0], self.seen, dtype=torch.bool, device=buf.device)

    def _first_read(self, start: int = 0) -> int:
        """The first slot >= ``start`` that some row reads (seen if none does)."""
        valid = self._valid_full()[:, start:]
        first = torch.where(valid.any(dim=1), valid.int().argmax(dim=1), valid.shape[1])
        return start + int(first.min())

    def full(self) -> bool:
        """No slot left for the next token."""
        return self._stores()[0].length >= self.capacity

    def compact(self) -> None:
        self.shift(-self._first_read())

    def shift(self, d: int) -> None:
        """Move every row's slots by ``d``: right opens empty slots at the front, left drops slots."""
        if d < 0 and -d > self._first_read():
            raise RuntimeError(f"cannot drop {-d} slots: a row still reads slot {self._first_read()}")
        valid = self._valid_full()
        for store in self._stores():
            store.shift(d)
        self.valid = valid[:, -d:] if d < 0 else torch.cat((valid.new_zeros(valid.shape[0], d), valid), dim=1)
        self.seen += d

    def adopt(self, rows: Tensor, other: KVCache) -> None:
        """Batch rows ``rows`` take the sequences ``other`` holds (prefilled, one per row)."""
        if other.seen > self.seen:  # room for a prompt longer than the slots so far
            self.shift(other.seen - self.seen)
        for mine, theirs in zip(self._stores(), other._stores()):
            mine.adopt(rows, theirs)
        valid = self._valid_full().clone()
        valid[rows, :self.seen - other.seen] = False
        valid[rows, self.seen - other.seen:] = other._valid_full()
        self.valid = valid

    def reset(self, rows: Tensor) -> None:
        """Batch rows ``rows`` start a new sequence at the next slot (every slot so far unread)."""
        valid = self._valid_full().clone()
        valid[rows] = False
        self.valid = valid

    def select(self, keep: Tensor) -> None:
        for store in self._buffered():
            store.select(keep)
        if self.valid is not None:
            self.valid = self.valid.index_select(0, keep)

    # ------------------------------------------------------------------- masking
    def _mask(self, first_slot: int, window: int = 0, chunk_causal: bool = True) -> Tensor | None:
        """Mask of this chunk's queries over keys in slots [first_slot, seen + C).

        Past keys (slot < seen) are allowed when valid and, with a window W, older than
        the query by more than W; the chunk's own keys are causal. A query may always
        read itself, so left-padding rows stay finite.
        """
        key = f"{first_slot}:{window}:{chunk_causal}"
        if key in self._masks:
            return self._masks[key]
        C, P = self._chunk_len, self.seen
        if C == 1 and window == 0 and self.valid is None and self._chunk_valid is None:
            self._masks[key] = None
            return None
        dev = self.valid.device if self.valid is not None else (
            self._chunk_valid.device if self._chunk_valid is not None else None)
        q = torch.arange(P, P + C, device=dev)[:, None]  # (C, 1) query slots
        k = torch.arange(first_slot, P + C, device=dev)[None, :]  # (1, K) key slots
        past = k < P
        allowed = torch.where(past, (k < q - window) if window else torch.ones_like(past),
                              (k <= q) if chunk_causal else torch.ones_like(past))
        allowed = allowed[None, None]  # (1, 1, C, K)
        kv_valid = self._key_valid(first_slot)
        if kv_valid is not None:
            allowed = allowed & (kv_valid[:, None, None, :] | (k == q)[None, None])
        self._masks[key] = allowed
        return allowed

    def _key_valid(self, first_slot: int) -> Tensor | None:
        """(B, K) validity of keys in slots [first_slot, seen + C), or None if no padding."""
        if self.valid is None and self._chunk_valid is None:
            return None
        ref = self._chunk_valid if self._chunk_valid is not None else self.valid
        past = self.valid[:, first_slot:] if self.valid is not None else _ones(
            ref.shape[0], self.seen - first_slot, ref)
        cur = self._chunk_valid if self._chunk_valid is not None else _ones(
            ref.shape[0], self._chunk_len, ref)
        return torch.cat((past, cur), dim=1)

    # ------------------------------------------------------------------ memory
    def nbytes(self) -> int:
        raise NotImplementedError

    def read(self, layer: int, loop: int, kv: KV, base: KV | None = None,
             alpha: float = 1.0) -> list[Block]:
        """Store this chunk's rows for (layer, loop) as the policy says; return what to attend to.

        kv: the chunk's K/V at this loop (from h for MELT, from a for Ouro); base: Ouro's
        K/V of the same tokens (from a), needed only when alpha < 1.
        """
        raise NotImplementedError

    def attend(self, q: Tensor, layer: int, loop: int, kv: KV, base: KV | None = None,
               alpha: float = 1.0) -> Tensor:
        """Attention of the chunk's queries q (B, H, C, D) at (layer, loop): store the chunk's K/V
        (``read``) and attend to what the policy says. A serving engine's paged cache
        (melt_core/serving/vllm_models.py) stores and attends in one kernel instead."""
        return attend(q, self.read(layer, loop, kv, base, alpha))


class LoopKVCache(KVCache):
    """Ouro's cache: index t*N + l holds loop t, layer l; a loop-t query reads loop-t rows."""

    def __init__(self, num_layers: int, num_loops: int, capacity: int | None = None):
        super().__init__(num_layers, num_loops, capacity)
        self.stores = [RowStore(capacity) for _ in range(num_layers * num_loops)]

    def read(self, layer, loop, kv, base=None, alpha=1.0):
        store = self.stores[loop * self.N + layer]
        store.append(kv, self.rows)
        k, v = store.read(batch=self.rows)
        return [Block(k, v, self._rows_of(self._mask(0)))]

    def exit_rows(self, rows, loop):
        """Later tokens read loop-t' rows this token never computed: its last computed loop's K/V
        is copied forward into the deeper loops' slots."""
        super().exit_rows(rows, loop)
        slot = self.seen  # decode steps are one token
        for layer in range(self.N):
            src = self.stores[loop * self.N + layer]._buf
            for deeper in range(loop + 1, self.T):
                for dst, s in zip(self.stores[deeper * self.N + layer]._buf, src):
                    dst[rows, :, slot] = s[rows, :, slot]

    def _stores(self):
        return self.stores

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.stores)


class SlidingWindow:
    """v3's window: the last W tokens also keep their per-loop rows, so a loop-t query reads them at
    loop t (older tokens through their final rows). ``rows[layer][loop]``: (k, v, slots)."""

    def __init__(self, size: int, num_layers: int, num_loops: int):
        self.size = size
        self.rows: list[list[tuple[Tensor, Tensor, Tensor] | None]] = [
            [None] * num_loops for _ in range(num_layers)]

    def commit(self, layer: int, loop: int, cur: KV, seen: int) -> None:
        """The chunk's rows of (layer, loop), in slots [seen, seen + C), join the last W."""
        k, v = cur
        slots = torch.arange(seen, seen + k.shape[-2], device=k.device)
        old = self.rows[layer][loop]
        if old is not None:
            k, v, slots = torch.cat((old[0], k), dim=-2), torch.cat((old[1], v), dim=-2), torch.cat((old[2], slots))
        self.rows[layer][loop] = (k[..., -self.size:, :], v[..., -self.size:, :], slots[-self.size:])

    def _map(self, fn) -> None:
        for per_loop in self.rows:
            for t, entry in enumerate(per_loop):
                if entry is not None:
                    per_loop[t] = fn(*entry)

    # continuous batching: the per-loop rows follow their slots
    def shift(self, d: int) -> None:
        def moved(k, v, slots):
            slots, keep = slots + d, slots + d >= 0  # slots shifted out are dropped
            return k[..., keep, :], v[..., keep, :], slots[keep]
        self._map(moved)

    def adopt(self, rows: Tensor, other: SlidingWindow, seen: int) -> None:
        """Batch rows ``rows`` take ``other``'s per-loop rows (n of them) as their last n; ``seen``:
        the cache's slot count after adopting."""
        for mine, theirs in zip(self.rows, other.rows):
            for t, entry in enumerate(theirs):
                if entry is None:
                    continue
                (k, v, slots), (ok, ov, _) = mine[t], entry
                n, missing = ok.shape[-2], ok.shape[-2] - k.shape[-2]
                if missing > 0:  # after a right shift: slots no other row reads, zero-filled
                    pad = k.new_zeros((*k.shape[:-2], missing, k.shape[-1]))
                    k, v = torch.cat((pad, k), dim=-2), torch.cat((pad, v), dim=-2)
                    slots = torch.cat((torch.arange(seen - n, seen - n + missing, device=slots.device), slots))
                k[rows, :, -n:], v[rows, :, -n:] = ok, ov
                mine[t] = (k, v, slots)

    def select(self, keep: Tensor) -> None:
        self._map(lambda k, v, slots: (k.index_select(0, keep), v.index_select(0, keep), slots))

    def nbytes(self) -> int:
        return sum(e[0].numel() * e[0].element_size() * 2 for per_loop in self.rows for e in per_loop
                   if e is not None)


class OuroRows:
    """Phase-1 interpolation (alpha < 1, training): Ouro's per-loop K/V of the same tokens, kept beside
    MELT's rows, so that attention reads alpha*KV_MELT + (1-alpha)*KV_Ouro (alpha = 0 is Ouro)."""

    def __init__(self, num_layers: int, num_loops: int, capacity: int | None):
        self.stores = [[RowStore(capacity) for _ in range(num_loops)] for _ in range(num_layers)]

    def mix(self, layer: int, loop: int, melt: KV, base: KV, alpha: float) -> KV:
        """MELT's rows (past final rows, then the chunk's) mixed with Ouro's (past, then ``base``)."""
        ouro = self.stores[layer][loop].read(staged=base)
        return tuple(alpha * m + (1 - alpha) * o for m, o in zip(melt, ouro))

    def mix_slots(self, layer: int, loop: int, melt: KV, slots: Tensor, alpha: float) -> KV:
        """The same for rows of committed slots ``slots`` (the window's per-loop rows)."""
        ouro = self.stores[layer][loop].read()
        return tuple(alpha * m + (1 - alpha) * o[..., slots, :] for m, o in zip(melt, ouro))

    def append(self, layer: int, loop: int, base: KV) -> None:
        self.stores[layer][loop].append(base)

    def nbytes(self) -> int:
        return sum(s.nbytes() for per_loop in self.stores for s in per_loop)


class SharedKVCache(KVCache):
    """One K/V row per (layer, token), refined in place across loops (MELT; Appendix-B sharing).

    A chunk's rows are staged (``pending``) and overwritten at every loop (at loop 1 only with
    ``write_every_loop=False``), then committed after loop T. With ``window`` W a SlidingWindow keeps
    the last W tokens' per-loop rows; a read with alpha < 1 (Phase 1) keeps Ouro's rows beside
    (OuroRows). The prompt kept per loop is KeptPromptSharedKVCache.
    """

    def __init__(self, num_layers: int, num_loops: int, capacity: int | None = None,
                 window: int = 0, write_every_loop: bool = True, detach_past: bool = False):
        super().__init__(num_layers, num_loops, capacity)
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        if window and not write_every_loop:
            raise ValueError("a sliding window needs a row per loop; it cannot combine with "
                             "first-loop sharing (write_every_loop=False)")
        self.write_every_loop, self.detach_past = write_every_loop, detach_past
        self.final = [RowStore(capacity) for _ in range(num_layers)]
        self.pending: list[KV | None] = [None] * num_layers
        self.window = SlidingWindow(window, num_layers, num_loops) if window else None
        self.ouro: OuroRows | None = None  # made by the first read with alpha < 1

    def read(self, layer, loop, kv, base=None, alpha=1.0):
        if loop == 0 or self.write_every_loop:
            self.pending[layer] = kv
        cur = self.pending[layer]
        keys = self.final[layer].read(staged=cur, batch=self.rows)  # past final rows, then this chunk's
        if alpha < 1.0:
            keys = self._ouro_rows(layer, base).mix(layer, loop, keys, base, alpha)
        window = self.window.size if self.window is not None else 0
        blocks = [Block(*keys, self._rows_of(self._mask(self._first_shared(), window)))]
        recent = self.window.rows[layer][loop] if self.window is not None else None
        if recent is not None:
            rk, rv, slots = recent
            if alpha < 1.0:
                rk, rv = self.ouro.mix_slots(layer, loop, (rk, rv), slots, alpha)
            blocks.append(Block(rk, rv, self._window_mask(slots)))
        self._commit(layer, loop, cur, base)
        return blocks

    # ------------------------------------------------------------------ internals
    def _first_shared(self) -> int:
        """The slot of the first shared row."""
        return 0

    def _ouro_rows(self, layer: int, base: KV | None) -> OuroRows:
        if base is None:
            raise ValueError("alpha < 1 needs the base (Ouro) K/V of the chunk")
        if self.ouro is None:
            if self.final[layer].length:
                raise RuntimeError("interpolation must be on from the first chunk of a sequence")
            self.ouro = OuroRows(self.N, self.T, self.capacity)
        return self.ouro

    def _commit(self, layer: int, loop: int, cur: KV, base: KV | None) -> None:
        keep = (lambda kv: tuple(t.detach() for t in kv)) if self.detach_past else (lambda kv: kv)
        if self.ouro is not None and base is not None:
            self.ouro.append(layer, loop, keep(base))
        if self.window is not None:
            self.window.commit(layer, loop, keep(cur), self.seen)
        if loop == self.T - 1:
            self.final[layer].append(keep(cur), self.rows)
            self.pending[layer] = None

    def _window_mask(self, slots: Tensor) -> Tensor:
        key = "window"
        if key not in self._masks:
            q = torch.arange(self.seen, self.seen + self._chunk_len, device=slots.device)[:, None]
            allowed = ((slots[None, :] >= q - self.window.size) & (slots[None, :] < q))[None, None]
            if self.valid is not None:
                allowed = allowed & self.valid[:, slots][:, None, None, :]
            self._masks[key] = allowed
        return self._masks[key]

    @property
    def writes_in_place(self):
        """A stopped token keeps the row its slot holds, its current memory's (h_t for MELT), so
        exit_rows has nothing to copy: true of one row overwritten every loop."""
        return self.window is None and self.write_every_loop and self.ouro is None

    def _stores(self):
        return self.final

    # continuous batching: the window's per-loop rows follow their slots
    @property
    def supports_refill(self):
        return super().supports_refill and self.ouro is None

    def shift(self, d):
        super().shift(d)
        if self.window is not None:
            self.window.shift(d)

    def adopt(self, rows, other):
        super().adopt(rows, other)
        if self.window is not None:
            self.window.adopt(rows, other.window, self.seen)

    def select(self, keep):
        super().select(keep)
        if self.window is not None:
            self.window.select(keep)

    def nbytes(self) -> int:
        return (sum(s.nbytes() for s in self.final) + (self.window.nbytes() if self.window is not None else 0)
                + (self.ouro.nbytes() if self.ouro is not None else 0))


class KeptPromptSharedKVCache(SharedKVCache):
    """An Appendix-B sharing cache that keeps the prompt per loop as Ouro does ("with prompt cache",
    Table 5): chunks go to a per-loop LoopKVCache until ``end_prompt()``; only the tokens after it
    share one row. Slots [0, prompt_len) live in the prompt cache, the shared rows follow; under
    continuous batching each row's prompt is right-aligned in that region."""

    def __init__(self, num_layers: int, num_loops: int, capacity: int | None = None,
                 write_every_loop: bool = True):
        super().__init__(num_layers, num_loops, capacity, write_every_loop=write_every_loop)
        self.prompt = LoopKVCache(num_layers, num_loops, capacity)
        self.prompt_open = True
        self.prompt_len = 0

    def begin_chunk(self, chunk_len, valid):
        super().begin_chunk(chunk_len, valid)
        if self.prompt_open:
            self.prompt.begin_chunk(chunk_len, valid)

    def end_chunk(self):
        if self.prompt_open:
            self.prompt.end_chunk()
            self.prompt_len += self._chunk_len
        super().end_chunk()

    def end_prompt(self):
        self.prompt_open = False

    def read(self, layer, loop, kv, base=None, alpha=1.0):
        if alpha < 1.0:
            raise ValueError("interpolation (alpha < 1) is MELT's; a sharing baseline's cache does not take it")
        if self.prompt_open:
            return self.prompt.read(layer, loop, kv)
        blocks = super().read(layer, loop, kv)
        if self.prompt_len:
            pk, pv = self.prompt.stores[loop * self.N + layer].read()
            blocks.append(Block(pk, pv, self._prompt_mask()))
        return blocks

    def _first_shared(self):
        return self.prompt_len

    def _prompt_mask(self) -> Tensor | None:
        key = "prompt"
        if key not in self._masks:
            self._masks[key] = None if self.valid is None else \
                self.valid[:, None, None, :self.prompt_len].expand(-1, 1, self._chunk_len, -1)
        return self._masks[key]

    @property
    def writes_in_place(self):
        return False

    def _buffered(self):
        return self.final + self.prompt.stores

    def compact(self):
        self.shift(-(self._first_read(self.prompt_len) - self.prompt_len))

    def shift(self, d):
        """Right: the per-loop prompt region grows at its front (room for a longer prompt); left:
        the shared rows after it drop their first -d slots."""
        valid = self._valid_full()
        if d > 0:
            for store in self.prompt.stores:
                store.shift(d)
            self.prompt.seen += d
            self.prompt_len += d
            valid = torch.cat((valid.new_zeros(valid.shape[0], d), valid), dim=1)
        elif d < 0:
            for store in self.final:
                store.shift(d)
            valid = torch.cat((valid[:, :self.prompt_len], valid[:, self.prompt_len - d:]), dim=1)
        self.valid = valid
        self.seen += d

    def adopt(self, rows, other):
        if other.prompt_len > self.prompt_len:
            self.shift(other.prompt_len - self.prompt_len)
        for mine, theirs in zip(self.prompt.stores, other.prompt.stores):
            mine.adopt(rows, theirs)
        valid = self._valid_full().clone()
        valid[rows] = False  # the earlier occupant's prompt and shared rows
        valid[rows, self.prompt_len - other.prompt_len:self.prompt_len] = other._valid_full()
        self.valid = valid

    def nbytes(self):
        return super().nbytes() + self.prompt.nbytes()
