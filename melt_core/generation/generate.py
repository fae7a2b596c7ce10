"""Batched sampling for Ouro (any cache mode) and MELT (token-by-token or chunked prefill).

Prompts of different lengths are left-padded; padding is masked out of attention and RoPE
positions start at each prompt's first real token, so a batch decodes exactly as its
prompts would one at a time. Each (prompt, sample) draws from its own ``torch.Generator``, seeded
from ``SamplingParams.seed``, the prompt and the sample's number: same seed, same completions,
whatever the batch.

Batches are continuous by default: a row whose completion ends takes the next pending
(prompt, sample) at once; its prompt is prefilled in a cache of its own and adopted into the
row's slots of the batch's cache (``KVCache.adopt``), or, where prefill is exact (token by token),
fed through the batch's next decode steps; so the batch stays full until the work runs
out, instead of waiting for its longest completion (reasoning traces run from hundreds to tens of
thousands of tokens). Static batches remain an option (``batching="static"``).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..modeling.cache import KVCache
from ..modeling.config import ConfigError
from ..modeling.early_exit import ExitRule, decode_step
from ..modeling.model import LoopedLM


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1  # samples per prompt
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()  # need a tokenizer to decode
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (or set greedy=True), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ConfigError(f"n must be >= 1, got {self.n}")


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str  # "stop" or "length"
    text: str | None = None
    loops: list[int] | None = None  # per token: the loops run for the step that produced it
    logprobs: list[float] | None = None  # per token, where the engine reports them (vLLM, on request)


def sample_seed(seed: int, prompt: Sequence[int], sample: int) -> int:
    """The random stream of one (prompt, sample): the same whatever batch, shard or memory budget
    the sample is generated in."""
    key = hashlib.sha256(f"{seed}|{sample}|{','.join(map(str, prompt))}".encode()).digest()
    return int.from_bytes(key[:8], "little") & ((1 << 63) - 1)


def sample_next(logits: Tensor, params: SamplingParams, generators: list[torch.Generator]) -> Tensor:
    """One token per row from logits (B, V): greedy, or temperature + nucleus (top-p), each row
    drawn from its own generator."""
    if params.greedy:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > params.top_p  # keep the smallest set reaching p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.cat([torch.multinomial(probs[i:i + 1], 1, generator=g) for i, g in enumerate(generators)]).squeeze(-1)


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, p in enumerate(prompts):
        if len(p):
            ids[row, width - len(p):] = torch.tensor(list(p), device=device)
            mask[row, width - len(p):] = 1
    return ids, mask


def cache_bytes_per_sequence(model, tokens: int, cache_mode: str = "default", keep_prompt: bool = False) -> int:
    """KV-cache bytes one sequence of ``tokens`` tokens holds (the formula the cache tests verify):
    Ouro T rows per token and layer, MELT one (plus its window), a sharing mode one (its prompt
    T-fold with keep_prompt: bounded here by Ouro's), a dense model one per layer."""
    cfg = model.config
    dtype_bytes = model.lm_head.weight.element_size()
    if hasattr(cfg, "kv_bytes"):  # Ouro / MELT
        if cache_mode != "default" and not keep_prompt:
            return tokens * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes
        return cfg.kv_bytes(tokens, dtype_bytes)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return tokens * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * dtype_bytes


def activation_bytes_per_sequence(model, prompt_tokens: int, prefill_chunk: int | None) -> int:
    """A stated over-estimate of the transient memory one sequence adds beside its cache: float32
    logits and sampling buffers over the vocabulary (x8), and one prefill chunk's hidden and MLP
    activations (x4, float32)."""
    cfg = model.config
    chunk = min(prompt_tokens, prefill_chunk or prompt_tokens)
    return 4 * (8 * cfg.vocab_size + 4 * chunk * (cfg.hidden_size + cfg.intermediate_size))


def plan_batch(model, prompts: Sequence[Sequence[int]], params: SamplingParams, budget_bytes: int,
               cache_mode: str = "default", keep_prompt: bool = False, prefill_chunk: int | None = None,
               where: str = "", refill: bool = False) -> int:
    """The most sequences of this request that fit ``budget_bytes`` beside the weights; an error
    naming the bytes needed when not even one does. ``refill`` (continuous batching): a row that
    takes a new prompt also holds that prompt's own cache while it is prefilled."""
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    longest = max(len(p) for p in prompts)
    per_seq = (cache_bytes_per_sequence(model, longest + params.max_new_tokens, cache_mode, keep_prompt)
               + activation_bytes_per_sequence(model, longest, prefill_chunk)
               + (cache_bytes_per_sequence(model, longest, cache_mode, keep_prompt) if refill else 0))
    fits = (budget_bytes - weights) // per_seq
    if fits < 1:
        raise ConfigError(
            f"{where or 'generation'}: one sequence of {longest} prompt + {params.max_new_tokens} new tokens needs "
            f"{per_seq / 1e9:.2f} GB of cache and activations beside {weights / 1e9:.2f} GB of weights, but the "
            f"memory budget is {budget_bytes / 1e9:.2f} GB. Shorten max_new_tokens, use a sliding window "
            "(convert.window) or a cache that shares rows, or raise eval.memory_budget_gb on a bigger device")
    return int(fits)


@torch.no_grad()
def generate(model: LoopedLM, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
             cache_mode: str = "default", keep_prompt: bool = False,
             prefill_chunk: int | None = None, tokenizer=None, batch_size: int | None = None,
             memory_budget_bytes: int | None = None, progress: bool = False,
             exit_rule: ExitRule | None = None, batching: str = "continuous") -> list[list[Completion]]:
    """``params.n`` completions for each prompt (lists of token ids).

    prefill_chunk: MELT and the sharing modes default to 1 (token-by-token prefill, exact);
    an int C prefills in chunks of C tokens (fast, the training approximation), cut from the
    prompt's first token as training cuts a sequence, whatever batch the prompt is in. Ouro's
    default cache prefills the whole prompt at once, which is exact.
    memory_budget_bytes: size the batches so weights + caches + activations fit (plan_batch).
    exit_rule: stop each decoded token's loops early (melt_core/modeling/early_exit.py); the prompt runs
    every loop. Each completion's ``loops`` says how many loops each of its tokens took.
    batching: ``continuous`` (a finished row takes the next pending (prompt, sample) at once, so
    the batch stays full; rows leave when none is pending) or ``static`` (each batch runs until
    its longest completion ends). A cache that cannot take rows in (a dense model's
    transformers cache) runs static batches. Completions do not depend on it: each (prompt, sample) samples
    from its own seeded stream and is masked and positioned as if alone.
    """
    if any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token (prepend BOS to an empty prompt)")
    if params.stop_strings and tokenizer is None:
        raise ConfigError("stop_strings need a tokenizer to decode the completions")
    if batching not in ("continuous", "static"):
        raise ConfigError(f"batching must be 'continuous' or 'static', got {batching!r}")
    longest = max(len(p) for p in prompts)
    if longest + params.max_new_tokens > model.config.max_position_embeddings:
        raise ConfigError(f"prompt ({longest}) + max_new_tokens ({params.max_new_tokens}) exceeds "
                          f"max_position_embeddings={model.config.max_position_embeddings}")
    rows = [list(p) for p in prompts for _ in range(params.n)]
    batch_size = batch_size or len(rows)
    if memory_budget_bytes is not None:  # no larger than what fits: the batch is sized from memory
        batch_size = min(batch_size, plan_batch(model, prompts, params, memory_budget_bytes, cache_mode,
                                                keep_prompt, prefill_chunk, refill=batching == "continuous"))
    device = model.lm_head.weight.device
    generators = [torch.Generator(device=device).manual_seed(sample_seed(params.seed, p, j))
                  for p in prompts for j in range(params.n)]
    decoder = _Decoder(model, params, cache_mode, keep_prompt, prefill_chunk, tokenizer, exit_rule)
    done = decoder.run(rows, generators, batch_size, batching == "continuous", progress)
    return [done[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]


class _Row:
    """One (prompt, sample) being decoded: its tokens so far and why it ended."""

    __slots__ = ("index", "generator", "tokens", "loops", "reason", "text", "feed", "in_prompt")

    def __init__(self, index: int, generator: torch.Generator, prompt: Sequence[int] = ()):
        self.index, self.generator = index, generator
        # a refilled row whose prompt goes through the batch's decode steps: the prompt tokens
        # not yet fed, and whether this step's input is one of its prompt's
        self.feed = deque(prompt[1:])
        self.in_prompt = bool(prompt)
        self.tokens: list[int] = []
        self.loops: list[int] = []  # per token: the loops behind it
        self.reason: str | None = None  # None while decoding, then "stop" or "length"
        self.text: str | None = None  # cut before a stop string

    def push(self, token: int, loops: int, params: SamplingParams, tokenizer, stop_window: int) -> bool:
        """Take the next token; True when the row has ended."""
        self.tokens.append(token)
        self.loops.append(loops)
        if token in params.stop_token_ids:
            self.reason = "stop"
        elif params.stop_strings:  # only the new tail can complete a stop string: linear in all
            tail = tokenizer.decode(self.tokens[-stop_window:])
            if any(s in tail for s in params.stop_strings):
                text = tokenizer.decode(self.tokens)  # once per row, at its stop
                cut = min(text.find(s) for s in params.stop_strings if s in text)
                self.reason, self.text = "stop", text[:cut]
        if self.reason is None and len(self.tokens) == params.max_new_tokens:
            self.reason = "length"
        return self.reason is not None

    def completion(self, tokenizer) -> Completion:
        tokens, text = self.tokens, self.text
        if text is not None:
            tokens = trim_to_text(tokens, text, tokenizer)
        elif tokenizer is not None:
            text = tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(tokens, self.reason, text, self.loops[:len(tokens)])


class _Decoder:
    """Prefills and decodes batches of rows for generate()."""

    def __init__(self, model, params, cache_mode, keep_prompt, prefill_chunk, tokenizer, exit_rule):
        cfg = model.config
        self.model, self.params, self.tokenizer = model, params, tokenizer
        self.cache_mode, self.keep_prompt = cache_mode, keep_prompt
        if prefill_chunk is None and (cfg.is_melt or cache_mode != "default") and not keep_prompt:
            prefill_chunk = 1
        self.prefill_chunk = prefill_chunk
        # exact (token-by-token) prefill is decoding with known tokens: a refilled row feeds its
        # prompt through the batch's decode steps instead of prefilling it in passes of its own
        self.feed_prompts = prefill_chunk == 1
        self.exit_rule = exit_rule if exit_rule is not None and exit_rule.stops_early(model.num_loops) else None
        self.pad = cfg.pad_token_id or 0
        self.device = model.lm_head.weight.device
        # tokens whose decoding surely holds a stop string that the newest token completed (every
        # token decodes to >= 1 character except byte pieces of one character, <= 4 per character)
        self.stop_window = 4 * max(map(len, params.stop_strings), default=0) + 8

    def prefill(self, prompts: list[list[int]], capacity: int) -> tuple[KVCache, Tensor, Tensor]:
        """A cache holding the left-padded ``prompts``, the next-token logits (B, V) and the next
        positions (B, 1). MELT's prompt chunks of C start at the prompt's first token, as training
        cuts a sequence and vLLM's scheduler cuts a prompt (melt_core/serving/chunk_cut.py): rows
        whose padding differs mod C take a pass of their own, its first chunk cut to their padding,
        and the passes' caches are gathered into one."""
        ids, mask = _left_pad(prompts, self.pad, self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        C, width = self.prefill_chunk, ids.shape[1]
        groups: dict[int | None, list[int]] = {}
        for row, p in enumerate(prompts):  # the first chunk's length for this row (None: C, or no chunks)
            # a prompt of at most C tokens is one chunk under any cut with no chunk start inside it:
            # the pass of the rows padded by a multiple of C (one pass where every prompt fits a chunk)
            pad = width - len(p) if C and len(p) > C else width
            groups.setdefault(pad % C or C if C and C > 1 else None, []).append(row)
        parts = []
        for first, rows in groups.items():
            index = torch.tensor(rows, device=self.device)
            cache = self.model.new_cache(capacity=capacity, mode=self.cache_mode, keep_prompt=self.keep_prompt)
            if self.exit_rule is not None and not parts:  # the cache's kind, alike in every pass
                try:
                    cache.check_exits()  # before any work
                except RuntimeError as err:
                    raise ConfigError(f"early exit with cache mode {self.cache_mode!r}: {err}") from None
            out = self.model(ids[index], cache=cache, positions=positions[index], attention_mask=mask[index],
                             chunk_size=C, first_chunk=first, logits="last")
            cache.end_prompt()
            parts.append((index, cache, out.logits[:, -1]))
        if len(parts) == 1:
            return parts[0][1], parts[0][2], positions[:, -1:] + 1
        (index, cache, first_logits), rest = parts[0], parts[1:]
        logits = first_logits.new_empty(len(prompts), first_logits.shape[-1])
        logits[index] = first_logits
        order = torch.zeros(len(prompts), dtype=torch.long, device=self.device)  # rows of the others: filled next
        order[index] = torch.arange(len(index), device=self.device)
        cache.select(order)
        for index, other, other_logits in rest:
            cache.adopt(index, other)
            logits[index] = other_logits
        return cache, logits, positions[:, -1:] + 1

    def step(self, tokens: list[int], cache, positions: Tensor, rows: list[_Row]) -> tuple[Tensor, Tensor | None]:
        """Decode one token per row: the next logits (B, V) and the loops each row ran (a prompt's
        token runs every loop)."""
        token = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        if self.exit_rule is not None:
            hold = torch.tensor([r.in_prompt for r in rows], device=self.device)
            return decode_step(self.model, token, cache, positions, self.exit_rule, hold=hold)
        return self.model(token, cache=cache, positions=positions, logits="last").logits[:, -1], None

    def sample(self, logits: Tensor, rows: list[_Row], loops: Tensor | None) -> tuple[list[int], list[int]]:
        """The next token of each row; a row still feeding its prompt takes its next prompt token
        (and draws nothing from its generator)."""
        for r in rows:
            r.in_prompt = bool(r.feed)
        want = [j for j, r in enumerate(rows) if not r.in_prompt]
        drawn = sample_next(logits[want], self.params, [rows[j].generator for j in want]).tolist() if want else []
        tokens = [r.feed.popleft() if r.in_prompt else 0 for r in rows]
        for j, token in zip(want, drawn):
            tokens[j] = token
        return tokens, [self.model.num_loops] * len(rows) if loops is None else loops.tolist()

    def run(self, prompts: list[list[int]], generators: list[torch.Generator], batch_size: int,
            continuous: bool, progress: bool) -> list[Completion]:
        done: list[Completion | None] = [None] * len(prompts)
        pending = deque(range(len(prompts)))
        probe = self.model.new_cache(capacity=1, mode=self.cache_mode, keep_prompt=self.keep_prompt)
        continuous = continuous and getattr(probe, "supports_refill", False)
        bar = tqdm(total=len(prompts), desc="generate", unit="seq", disable=not progress, leave=False)
        while pending:
            take = [pending.popleft() for _ in range(min(batch_size, len(pending)))]
            # a continuous batch's slots must hold any prompt that may come; a static one's, its own
            capacity = max(len(prompts[i]) for i in (range(len(prompts)) if continuous else take))
            cache, logits, positions = self.prefill([prompts[i] for i in take], capacity + self.params.max_new_tokens)
            rows = [_Row(i, generators[i]) for i in take]
            tokens, loops = self.sample(logits, rows, None)
            while True:
                for j, row in enumerate(rows):
                    if row.in_prompt:  # a prompt token to feed, not an output
                        continue
                    if row.reason is None and row.push(tokens[j], loops[j], self.params, self.tokenizer,
                                                       self.stop_window):
                        done[row.index] = row.completion(self.tokenizer)
                        bar.update()
                if continuous:
                    rows, tokens, loops, positions = self._refill(
                        cache, rows, tokens, loops, positions, prompts, generators, pending, done, bar)
                if all(r.reason is not None for r in rows):
                    break
                if continuous and cache.full():  # each row reads fewer slots than the capacity
                    cache.compact()
                tokens = [self.pad if r.reason is not None else t for r, t in zip(rows, tokens)]
                logits, step_loops = self.step(tokens, cache, positions, rows)
                positions = positions + 1
                tokens, loops = self.sample(logits, rows, step_loops)
        bar.close()
        return done

    def _refill(self, cache, rows, tokens, loops, positions, prompts, generators, pending, done, bar):
        """Ended rows take pending (prompt, sample)s; rows left ended when nothing is pending leave
        the batch."""
        if self.feed_prompts:
            positions = self._feed(cache, rows, tokens, positions, prompts, generators, pending)
        else:
            positions = self._adopt(cache, rows, tokens, loops, positions, prompts, generators, pending, done, bar)
        keep = [j for j, r in enumerate(rows) if r.reason is None]
        if 0 < len(keep) < len(rows):
            index = torch.tensor(keep, device=self.device)
            cache.select(index)
            rows, tokens, loops = [rows[j] for j in keep], [tokens[j] for j in keep], [loops[j] for j in keep]
            positions = positions.index_select(0, index)
        return rows, tokens, loops, positions

    def _feed(self, cache, rows, tokens, positions, prompts, generators, pending) -> Tensor:
        """Exact prefill: an ended row restarts at the next slot and feeds its new prompt through
        the next decode steps."""
        free = [j for j, r in enumerate(rows) if r.reason is not None]
        take = [pending.popleft() for _ in range(min(len(free), len(pending)))]
        if take:
            slots = torch.tensor(free[:len(take)], device=self.device)
            cache.reset(slots)
            positions = positions.index_fill(0, slots, 0)
        for j, i in zip(free, take):
            rows[j], tokens[j] = _Row(i, generators[i], prompts[i]), prompts[i][0]
        return positions

    def _adopt(self, cache, rows, tokens, loops, positions, prompts, generators, pending, done, bar) -> Tensor:
        """Ended rows' new prompts are prefilled together and adopted into their slots; their first
        tokens are sampled at once, which may end them again."""
        while pending and (free := [j for j, r in enumerate(rows) if r.reason is not None]):
            take = [pending.popleft() for _ in range(min(len(free), len(pending)))]
            free = free[:len(take)]
            new_cache, new_logits, new_positions = self.prefill([prompts[i] for i in take],
                                                                max(len(prompts[i]) for i in take))
            slots = torch.tensor(free, device=self.device)
            cache.adopt(slots, new_cache)
            positions = positions.index_put((slots,), new_positions)
            new_rows = [_Row(i, generators[i]) for i in take]
            new_tokens, new_loops = self.sample(new_logits, new_rows, None)
            for j, row, token, n in zip(free, new_rows, new_tokens, new_loops):
                rows[j], tokens[j], loops[j] = row, token, n
                if row.push(token, n, self.params, self.tokenizer, self.stop_window):
                    done[row.index] = row.completion(self.tokenizer)
                    bar.update()
        return positions


def trim_to_text(tokens: list[int], text: str, tokenizer) -> list[int]:
    """The shortest token prefix whose decoding covers ``text`` (the stop string excluded); a
    binary search, since a longer prefix never decodes shorter."""
    lo, hi = 0, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(tokens[:mid])) >= len(text):
            hi = mid
        else:
            lo = mid + 1
    return tokens[:lo]
