"""Batched sampling for Ouro (any cache mode) and MELT (token-by-token or chunked prefill).

Prompts of different lengths are left-padded; padding is masked out of attention and RoPE
positions start at each prompt's first real token, so a batch decodes exactly as its
prompts would one at a time. Sampling draws from one ``torch.Generator`` seeded by
``SamplingParams.seed``: same seed, same completions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import ConfigError
from .early_exit import ExitRule, decode_step
from .model import LoopedLM


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
               where: str = "") -> int:
    """The most sequences of this request that fit ``budget_bytes`` beside the weights; an error
    naming the bytes needed when not even one does."""
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    longest = max(len(p) for p in prompts)
    per_seq = (cache_bytes_per_sequence(model, longest + params.max_new_tokens, cache_mode, keep_prompt)
               + activation_bytes_per_sequence(model, longest, prefill_chunk))
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
             exit_rule: ExitRule | None = None) -> list[list[Completion]]:
    """``params.n`` completions for each prompt (lists of token ids).

    prefill_chunk: MELT and the sharing modes default to 1 (token-by-token prefill, exact);
    an int C prefills in chunks of C tokens (fast, the training approximation), cut back
    from the prompt's end so batching does not change the chunks. Ouro's
    default cache prefills the whole prompt at once, which is exact.
    memory_budget_bytes: size the batches so weights + caches + activations fit (plan_batch).
    exit_rule: stop each decoded token's loops early (melt_core/early_exit.py); the prompt runs
    every loop. Each completion's ``loops`` says how many loops each of its tokens took.
    """
    if any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token (prepend BOS to an empty prompt)")
    if params.stop_strings and tokenizer is None:
        raise ConfigError("stop_strings need a tokenizer to decode the completions")
    rows = [list(p) for p in prompts for _ in range(params.n)]
    batch_size = batch_size or len(rows)
    if memory_budget_bytes is not None:  # no larger than what fits: the batch is sized from memory
        batch_size = min(batch_size, plan_batch(model, prompts, params, memory_budget_bytes, cache_mode,
                                                keep_prompt, prefill_chunk))
    device = model.lm_head.weight.device
    generators = [torch.Generator(device=device).manual_seed(sample_seed(params.seed, p, j))
                  for p in prompts for j in range(params.n)]
    done: list[Completion] = []
    for start in range(0, len(rows), batch_size):
        done += _generate_batch(model, rows[start:start + batch_size], params, generators[start:start + batch_size],
                                cache_mode, keep_prompt, prefill_chunk, tokenizer, progress, exit_rule)
    return [done[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]


def _generate_batch(model, prompts, params, generators, cache_mode, keep_prompt, prefill_chunk,
                    tokenizer, progress, exit_rule) -> list[Completion]:
    cfg = model.config
    device = model.lm_head.weight.device
    longest = max(len(p) for p in prompts)
    if longest + params.max_new_tokens > cfg.max_position_embeddings:
        raise ConfigError(f"prompt ({longest}) + max_new_tokens ({params.max_new_tokens}) exceeds "
                          f"max_position_embeddings={cfg.max_position_embeddings}")
    ids, mask = _left_pad(prompts, cfg.pad_token_id or 0, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache(capacity=longest + params.max_new_tokens, mode=cache_mode,
                            keep_prompt=keep_prompt)
    exits = exit_rule is not None and exit_rule.stops_early(model.num_loops)
    if exits:
        try:
            cache.check_exits()  # before any work
        except RuntimeError as err:
            raise ConfigError(f"early exit with cache mode {cache_mode!r}: {err}") from None
    if prefill_chunk is None and (cfg.is_melt or cache_mode != "default") and not keep_prompt:
        prefill_chunk = 1
    out = model(ids, cache=cache, positions=positions, attention_mask=mask,
                chunk_size=prefill_chunk, align_chunks_to_end=True, logits="last")
    cache.end_prompt()
    logits = out.logits[:, -1]
    step_loops = torch.full((len(prompts),), model.num_loops, dtype=torch.long, device=device)
    loops = []  # per step: (B,) loops behind that step's token
    next_pos = positions[:, -1:] + 1
    stop_ids = torch.tensor(params.stop_token_ids or [-1], device=device)
    generated = torch.empty((len(prompts), 0), dtype=torch.long, device=device)
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    reasons = ["length"] * len(prompts)
    texts: list[str | None] = [None] * len(prompts)
    # tokens whose decoding surely holds a stop string that the newest token completed (every token
    # decodes to >= 1 character except byte pieces of one character, <= 4 per character)
    stop_window = 4 * max(map(len, params.stop_strings), default=0) + 8
    steps = tqdm(range(params.max_new_tokens), desc="decode", disable=not progress, leave=False)
    for step in steps:
        token = sample_next(logits, params, generators)
        loops.append(step_loops)
        token = torch.where(finished, torch.full_like(token, cfg.pad_token_id or 0), token)
        generated = torch.cat((generated, token[:, None]), dim=1)
        hit = ~finished & torch.isin(token, stop_ids)
        for row in hit.nonzero().flatten().tolist():
            reasons[row] = "stop"
        finished |= hit
        if params.stop_strings:  # only the new tail can complete a stop string: linear in all
            for row in (~finished).nonzero().flatten().tolist():
                tail = tokenizer.decode(generated[row, -stop_window:].tolist())
                if any(s in tail for s in params.stop_strings):
                    text = tokenizer.decode(generated[row].tolist())  # once per row, at its stop
                    cut = min(text.find(s) for s in params.stop_strings if s in text)
                    finished[row], reasons[row], texts[row] = True, "stop", text[:cut]
        if bool(finished.all()) or step == params.max_new_tokens - 1:
            break
        if exits:
            logits, step_loops = decode_step(model, token[:, None], cache, next_pos, exit_rule)
        else:
            logits = model(token[:, None], cache=cache, positions=next_pos, logits="last").logits[:, -1]
        next_pos = next_pos + 1
    loops = torch.stack(loops, dim=1).tolist()  # (B, steps)
    completions = []
    for row in range(len(prompts)):
        tokens = generated[row].tolist()
        if reasons[row] == "stop" and texts[row] is None:  # cut after the stop token
            first = next(i for i, t in enumerate(tokens) if t in params.stop_token_ids)
            tokens = tokens[:first + 1]
        elif texts[row] is not None:
            tokens = _trim_to_text(tokens, texts[row], tokenizer)
        text = texts[row] if texts[row] is not None else (
            tokenizer.decode(tokens, skip_special_tokens=True) if tokenizer is not None else None)
        completions.append(Completion(tokens, reasons[row], text, loops[row][:len(tokens)]))
    return completions


def _trim_to_text(tokens: list[int], text: str, tokenizer) -> list[int]:
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
