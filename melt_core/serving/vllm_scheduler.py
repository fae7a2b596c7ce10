"""vLLM's scheduler, made to cut MELT's prompts the way melt_core does (``scheduler_cls``).

vLLM's paged attention computes MELT's chunk semantics by itself when each engine step's piece of a
sequence is one whole chunk: the model writes the chunk's loop-t rows into its slots at every loop
and attends causally, so the chunk reads its own loop-t rows and the final rows earlier steps left.
So this scheduler only decides how many tokens each MELT sequence gets in a step:

* a prompt of P tokens in chunks of C from its first token (the last chunk takes what is left), as
  training cuts a sequence and the native engine cuts a prompt; C = 1 (the default:
  ``prefill_chunk`` unset) is token by token;
* every token after the prompt alone, also when vLLM recomputes a preempted sequence (prompt plus
  the tokens it had generated): they are recomputed as they were first computed, one at a time;
* a piece that does not fit this step's token budget waits for a later step whole (never cut short);
* prefix caching: a sequence's cache salt carries (C, P): C fixes the cut, P where its chunks end and
  rows decoded one at a time begin, so only sequences computed alike share blocks (n samples of one
  prompt; a preempted sequence its own blocks; not a follow-up that holds an answer); a hit is kept
  up to the last chunk boundary that is also a block boundary, and never over a block some sequence
  writes in this step (its rows are still being looped there). A sample whose prompt a sibling is
  still prefilling waits for it where a hit can be kept (and so do the requests queued behind it, as
  vLLM keeps its queue's order), then hits its blocks: n samples compute their prompt once, up to its
  last aligned chunk start, at the cost of starting one prompt's prefill later. Where no chunk start
  falls on a block edge (``shareable_tokens`` 0) the samples prefill side by side.

Every other model runs vLLM's own scheduling unchanged. Imported only in the serving environment.
"""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from .chunk_cut import is_chunk_start, next_chunk_end, shareable_tokens
from .vllm_engine import PREFILL_CHUNK_KEY


class MeltScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hf = self.vllm_config.model_config.hf_config
        self.melt = getattr(hf, "model_type", "") == "melt"
        self.chunk = getattr(hf, PREFILL_CHUNK_KEY, None) or 1
        self.preemptions = self.prefix_hit_tokens = 0
        self._writing: list[tuple[str, int, int]] = []  # (request, first, end) of the pieces scheduled this step

    def add_request(self, request) -> None:
        if self.melt:
            request.cache_salt = f"{request.cache_salt or ''}|melt-cut:{self.chunk}:{request.num_prompt_tokens}"
            request.block_hashes = []  # hashed again under the salt
            request.update_block_hashes()
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        self._writing = []
        return super().schedule(*args, **kwargs)

    def _preempt_request(self, request, *args, **kwargs):
        self.preemptions += 1
        return super()._preempt_request(request, *args, **kwargs)

    def _reserve_prefill_lookahead(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if not self.melt or num_new_tokens == 0:
            return num_new_tokens
        piece = next_chunk_end(num_computed_tokens, request.num_prompt_tokens, self.chunk) - num_computed_tokens
        if piece > request.num_tokens - num_computed_tokens:  # waiting would never end: fail loudly instead
            raise RuntimeError(f"MELT in vLLM: the chunk after {num_computed_tokens} tokens needs {piece} tokens, "
                               f"and only {request.num_tokens - num_computed_tokens} are known")
        if num_new_tokens < piece or self._sibling_computing(request):
            return 0  # the whole chunk in a later step
        self._writing.append((request.request_id, num_computed_tokens, num_computed_tokens + piece))
        return piece

    def _sibling_computing(self, request) -> bool:
        """A request not yet running whose first block another running request is still prefilling
        (a sample of the same prompt, cut alike): it waits for that prompt's blocks to hit them, where
        a hit can be kept at all (some chunk start inside the prompt on a block edge); else waiting
        would only start its prefill later."""
        if request.status == RequestStatus.RUNNING or not request.block_hashes:
            return False
        if shareable_tokens(request.num_prompt_tokens, self.chunk, self.block_size) == 0:
            return False
        first = request.block_hashes[0]
        return any(r is not request and r.num_computed_tokens < r.num_prompt_tokens and r.block_hashes[:1] == [first]
                   for r in self.running)

    def _written_blocks(self) -> set[int]:
        size = self.block_size
        out = set()
        for req_id, lo, hi in self._writing:
            if req_id in self.requests:
                ids = self.kv_cache_manager.get_block_ids(req_id)[0]
                out.update(ids[lo // size:-(-hi // size)])
        return out

    def _get_local_prefix_cache_hit(self, request):
        blocks, hit, boundary, diverged = super()._get_local_prefix_cache_hit(request)
        if not self.melt or hit == 0:
            return blocks, hit, boundary, diverged
        size, written = self.block_size, self._written_blocks()
        group = blocks.blocks[0]
        keep = 0
        for n in range(size, hit + 1, size):  # the longest clean block prefix ending where a chunk starts
            if group[n // size - 1].block_id in written:
                break
            if is_chunk_start(n, request.num_prompt_tokens, self.chunk):
                keep = n
        if keep < hit:
            blocks = self.kv_cache_manager.truncate_computed_blocks(blocks, keep)
        self.prefix_hit_tokens += keep
        return blocks, keep, min(boundary, keep) if boundary else 0, diverged
