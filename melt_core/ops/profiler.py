"""Memory and speed profiling (the paper's Tables 2/3, 10, 11). Memory and speed depend on
shapes, not weights, so the real Ouro-1.4B / MELT-1.6B / Qwen3-1.7B shapes are built with
random weights.

Every figure is labelled ``measured`` (read off real tensors or clocks) or ``analytic``
(from the formula), and the analytic value is printed beside each measurement:

* weights: bytes of the parameter storage actually allocated for the model;
* KV cache: bytes held by the cache tensors after L tokens, pushed through the real-shape
  cache exactly as the model writes it (on a GPU: also through the model at 32K tokens);
* peak: CUDA max allocated while generating; on CPU, weights + cache bytes held (the
  tensors we can account for; activations excluded), labelled as such;
* largest batch under a memory cap: analytic on CPU, found by trying on a GPU.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..generation.static_decode import StaticDecode
from ..modeling.cache import KVCache
from ..modeling.checkpoint import melt_from_ouro
from ..modeling.config import ConfigError, ModelConfig
from ..modeling.early_exit import ExitRule, decode_step
from ..modeling.losses import kd_loss_sum
from ..modeling.model import LoopedLM

GB = 1e9  # decimal GB, as the paper's tables


def build_random(cfg: ModelConfig, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> LoopedLM:
    """A model of this shape with random weights, allocated directly in ``dtype`` (no fp32 detour)."""
    with torch.device("meta"):
        model = LoopedLM(cfg).to(dtype)  # dtype on meta: the fp32 copy is never allocated
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty gives each module its own tensor: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    # N(0, 0.02^2) values drawn once and tiled over every weight: the same bytes and arithmetic as
    # i.i.d. weights (speed and memory depend on shapes, not values), where drawing 1.6B numbers
    # took ~20 s of a CPU profiling job
    gen = torch.Generator(device=device).manual_seed(seed)
    pool = torch.empty(1 << 20, dtype=dtype, device=device).normal_(0.0, 0.02, generator=gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
                continue
            flat = p.view(-1)
            for start in range(0, flat.numel(), pool.numel()):
                part = flat[start:start + pool.numel()]
                part.copy_(pool[:part.numel()])
    model.inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)).to(device)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        key = p.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += p.untyped_storage().nbytes()
    return total


def fill_cache(cache: KVCache, cfg: ModelConfig, tokens: int, dtype: torch.dtype, batch: int = 1,
               device: str = "cpu") -> int:
    """Push ``tokens`` decode steps of real-shape K/V through ``cache``; returns the bytes it holds."""
    H, D = cfg.num_key_value_heads, cfg.head_dim
    kv = (torch.zeros(batch, H, 1, D, dtype=dtype, device=device), torch.zeros(batch, H, 1, D, dtype=dtype,
                                                                                device=device))
    for _ in range(tokens):
        cache.begin_chunk(1, None)
        for t in range(cfg.total_ut_steps):
            for layer in range(cfg.num_hidden_layers):
                cache.read(layer, t, kv)
        cache.end_chunk()
    return cache.nbytes()


def new_cache_for(cfg: ModelConfig, capacity: int) -> KVCache:
    with torch.device("meta"):
        model = LoopedLM(cfg)  # only its cache factory is used; nothing is allocated
    return model.new_cache(capacity=capacity)


@dataclass
class MemoryReport:
    shape: str
    dtype: str
    parameters: int
    weights_bytes_measured: int
    weights_bytes_analytic: int
    kv_tokens: int
    kv_bytes_measured: int
    kv_bytes_analytic: int
    kv_mb_per_token_measured: float
    kv_mb_per_token_analytic: float
    context: int
    total_gb_analytic: float  # weights + KV at `context` tokens, batch 1
    peak_gb: float
    peak_kind: str  # "measured: cuda max allocated" | "measured: tensors held (weights + cache)"
    memory_cap_gb: float
    max_batch: int
    max_batch_kind: str
    speed: dict | None = None  # batch-1 prefill/decode at this real shape, measured (short context on CPU)


def profile_memory(shape: str, dtype: torch.dtype = torch.bfloat16, kv_tokens: int = 64, context: int = 32768,
                   cap_gb: float = 80.0, device: str = "cpu", speed_context: int = 0, speed_steps: int = 3,
                   prefill_chunk: int | None = None, **overrides) -> MemoryReport:
    """``prefill_chunk``: how MELT prefills for the speed figures, as the eval does (None: token by
    token, exact; C: chunks of C tokens). Ouro prefills the whole context at once either way."""
    cfg = ModelConfig.from_name(shape, **overrides)
    if context > cfg.max_position_embeddings:
        raise ConfigError(f"profile context {context} is beyond max_position_embeddings="
                          f"{cfg.max_position_embeddings} of {shape}")
    nbytes = torch.empty(0, dtype=dtype).element_size()
    model = build_random(cfg, dtype, device)
    w_measured = weight_bytes(model)
    n_params = sum(p.numel() for p in model.parameters())  # parameters() lists a tied tensor once
    w_analytic = n_params * nbytes
    cache = model.new_cache(capacity=kv_tokens)
    kv_measured = fill_cache(cache, cfg, kv_tokens, dtype, device=device)
    kv_analytic = cfg.kv_bytes(kv_tokens, nbytes)
    per_token = cfg.kv_bytes_per_token(nbytes)
    total = (w_analytic + cfg.kv_bytes(context, nbytes)) / GB
    if cap_gb * GB <= w_analytic:
        raise ConfigError(f"memory cap {cap_gb} GB is smaller than the {shape} weights "
                          f"({w_analytic / GB:.2f} GB); raise profile.memory_cap_gb")
    if device == "cuda":
        peak, peak_kind = _cuda_peak(model, context), "measured: cuda max allocated"
        max_batch, batch_kind = _cuda_max_batch(model, context, cap_gb), "measured: largest batch that ran"
    else:
        peak, peak_kind = (w_measured + kv_measured) / GB, f"measured: tensors held (weights + {kv_tokens}-token cache)"
        max_batch = int((cap_gb * GB - w_analytic) // cfg.kv_bytes(context, nbytes))
        batch_kind = "analytic: (cap - weights) / KV(context)"
    speed = None
    if speed_context:  # batch 1 at the real shape: few steps, labelled with the context used
        speed = decode_speed(model, 1, speed_context, speed_steps, prefill_chunk=prefill_chunk)
        mode = "MELT prefill token by token" if prefill_chunk is None else f"prefill chunk {prefill_chunk}"
        speed["kind"] = f"measured on {device}, {speed_context}-token context, {speed_steps} decode steps, {mode}"
        speed["prefill_chunk"] = prefill_chunk
    del model, cache
    return MemoryReport(shape, str(dtype).removeprefix("torch."), n_params, w_measured, w_analytic, kv_tokens,
                        kv_measured, kv_analytic, kv_measured / kv_tokens / 1e6, per_token / 1e6, context,
                        total, peak, peak_kind, cap_gb, max_batch, batch_kind, speed)


def _cuda_peak(model: LoopedLM, context: int) -> float:
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(1, model.config.vocab_size, (1, context), device="cuda")
    cache = model.new_cache(capacity=context + 1)
    with torch.no_grad():
        model(ids, cache=cache, chunk_size=2048 if model.config.is_melt else None, logits="last")
        model(ids[:, -1:], cache=cache, logits="last")
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / GB


def _cuda_max_batch(model: LoopedLM, context: int, cap_gb: float) -> int:
    lo, hi = 0, 256
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            cache = model.new_cache(capacity=context)
            fill_cache(cache, model.config, 1, model.lm_head.weight.dtype, batch=mid, device="cuda")
            fits = torch.cuda.memory_allocated() + cache.nbytes() * (context - 1) <= cap_gb * GB
            del cache
        except torch.OutOfMemoryError:
            fits = False
        torch.cuda.empty_cache()
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return lo


# ------------------------------------------------------------------------------- speed
@torch.no_grad()
def _prefill(model: LoopedLM, batch: int, context: int, steps: int, prefill_chunk: int | None):
    """Fill a fresh cache with ``context`` random tokens; returns (cache, next token, seconds)."""
    ids = torch.randint(1, model.config.vocab_size, (batch, context), device=model.lm_head.weight.device)
    cache = model.new_cache(capacity=context + steps + 1)
    t0 = time.perf_counter()
    out = model(ids, cache=cache, chunk_size=prefill_chunk if model.config.is_melt else None, logits="last")
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    _sync(ids)
    return cache, token, time.perf_counter() - t0


def _decode_step(model: LoopedLM, cache, token: Tensor,
                 exit_rule: ExitRule | None = None) -> tuple[Tensor, float]:
    t0 = time.perf_counter()
    if isinstance(cache, StaticDecode):
        logits = cache.decode(token)
    elif exit_rule is None:
        logits = model(token, cache=cache, logits="last").logits[:, -1]
    else:  # real early exit: the loops a token skips are not run
        positions = torch.full_like(token, cache.seen)
        logits, _ = decode_step(model, token, cache, positions, exit_rule)
    token = logits.argmax(-1, keepdim=True)
    _sync(token)
    return token, time.perf_counter() - t0


def _sync(t: Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize()


def decode_speed(model: LoopedLM, batch: int, context: int, steps: int, prefill_chunk: int | None = None) -> dict:
    """Prefill tok/s, time to first token and decode tok/s after ``context`` tokens."""
    row = compare_decode({"m": model}, [batch], [context], steps, rounds=1, prefill_chunk=prefill_chunk,
                         warm_up=False)[0]
    del row["model"]
    return row


def with_static_twins(models: dict[str, LoopedLM]) -> tuple[dict[str, LoopedLM], frozenset[str]]:
    """``models`` and, beside each, ``<name>-static``: the same model decoded with the static-shape
    step; the second value is compare_decode's ``static``."""
    twins = {f"{name}-static": m for name, m in models.items()}
    return {**models, **twins}, frozenset(twins)


def compare_decode(models: dict[str, LoopedLM], batches: list[int], contexts: list[int], steps: int,
                   rounds: int = 2, prefill_chunk: int | None = 256, warm_up: bool = True,
                   burst: int = 4, exit_rules: dict[str, ExitRule] | None = None,
                   static: frozenset[str] = frozenset(), prefill_budget_s: float = 2.0) -> list[dict]:
    """Every model at every (batch, context), side by side: each round prefills every model (or, past
    ``prefill_budget_s``, copies its prefilled cache), then the models take turns decoding ``burst`` steps
    each, so a change in machine load hits all of them alike. Bursts rather than single steps: a model
    decoding keeps its weights and cache in the CPU's caches, and the median step of a burst sees that, as
    real decoding does (strict one-step alternation evicts them and hides MELT's smaller cache). Medians over
    steps and rounds; one discarded warm-up pass first (allocator, kernel set-up). ``exit_rules``: per model
    name, decode with real early exit (melt_core/modeling/early_exit.py). ``static``: the model names that decode with
    the static-shape step (melt_core/generation/static_decode.py), captured on a CUDA graph on a GPU. One model under
    several names (its exit rules, its static twin) is prefilled once a round and each name decodes its own
    copy of that cache: their prefill is the same computation, and at a real shape on a CPU it is what a run
    spends most of its time on. ``prefill_budget_s``: a model is prefilled again in a later round only while
    its prefills at this (batch, context) took less than this many seconds in all; after that each round
    decodes from a copy of its last prefilled cache (decode time depends on the cache's shape, not its
    tokens). A long prefill (MELT's exact token-by-token prefill of 512 tokens: 512 sequential steps, ~30 s on
    a CPU) is already the sum of many timed steps, so repeating it buys no precision and costs the whole
    prefill each round; a short one (Ouro's, a fraction of a second) is timed every round, its median over
    them."""
    exit_rules = exit_rules or {}
    paths: dict[int, list[str]] = {}  # one model under several names (exit rules, static twins): one prefill
    for name, model in models.items():
        paths.setdefault(id(model), []).append(name)
    if warm_up:
        compare_decode(models, [min(batches)], [min(contexts)], 2, 1, prefill_chunk, warm_up=False,
                       exit_rules=exit_rules, static=static)
    rows = []
    for batch in batches:
        for context in contexts:
            prefill = {name: [] for name in models}
            step_s = {name: [] for name in models}
            round_step_s = {name: [] for name in models}  # each round's median step
            kept = {}  # per model: its prefilled (cache, token) while later rounds decode from copies of it
            for r in range(rounds):
                state = {}
                for key, names in paths.items():
                    model = models[names[0]]
                    if key not in kept:
                        prefilled, token, seconds = _prefill(model, batch, context, steps, prefill_chunk)
                        for name in names:
                            prefill[name].append(seconds)
                    else:
                        prefilled, token = kept[key]
                    reused = r + 1 < rounds and sum(prefill[names[0]]) >= prefill_budget_s
                    if reused:
                        kept[key] = (prefilled, token)
                    for i, name in enumerate(names):  # each decode path of the model its own copy
                        cache = prefilled if i == len(names) - 1 and not reused else copy.deepcopy(prefilled)
                        if name in static:
                            cache = StaticDecode(model, cache)
                            if token.is_cuda:
                                cache.capture(token)
                        state[name] = (cache, token)
                this_round = {name: [] for name in models}
                for start in range(0, steps, burst):
                    for name, model in models.items():
                        cache, token = state[name]
                        for _ in range(min(burst, steps - start)):
                            token, seconds = _decode_step(model, cache, token, exit_rules.get(name))
                            this_round[name].append(seconds)
                        state[name] = (cache, token)
                for name, times in this_round.items():
                    step_s[name] += times
                    round_step_s[name].append(statistics.median(times))
            for name in models:
                ttft, step = statistics.median(prefill[name]), statistics.median(step_s[name])
                rows.append({"model": name, "batch": batch, "context": context, "prefill_tok_s": batch * context / ttft,
                             "ttft_s": ttft, "decode_tok_s": batch / step, "decode_step_s": step,
                             "decode_tok_s_rounds": [batch / s for s in round_step_s[name]]})
    return rows


def save_benchmark(out: Path, stem: str, rows: list[dict], text: str) -> None:
    """A benchmark's rows (``<stem>.json``) and its Markdown table (``<stem>.md``) under ``out``;
    the table is printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)


def decode_ratio_table(rows: list[dict], base: str, other: str, labels: tuple[str, str] | None = None) -> str:
    """compare_decode rows as a Markdown table: tok/s of ``base`` and ``other`` and their ratio."""
    b_label, o_label = labels or (base, other)
    by = {(r["model"], r["batch"], r["context"]): r["decode_tok_s"] for r in rows}
    cells = sorted({(r["batch"], r["context"]) for r in rows})
    lines = [f"| batch | context | {b_label} tok/s | {o_label} tok/s | {o_label} / {b_label} |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {b} | {c} | {by[base, b, c]:.1f} | {by[other, b, c]:.1f} | {by[other, b, c] / by[base, b, c]:.2f} |"
              for b, c in cells]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sweeps
def loop_and_window_sweeps(shape: str = "melt-1.6b", loops=(1, 2, 4, 8), windows=(0, 50, 200),
                           context: int = 256, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Cache bytes per token vs T (MELT flat, Ouro linear) and vs W at a fixed context (measured)."""
    nbytes = torch.empty(0, dtype=dtype).element_size()
    out = {"loops": [], "windows": [], "context": context, "shape": shape}
    base = ModelConfig.from_name(shape)
    for T in loops:
        for kind in ("ouro", "melt"):
            cfg = base.replace(model_type=kind, total_ut_steps=T, window=0)
            measured = fill_cache(new_cache_for(cfg, 16), cfg, 16, dtype)
            out["loops"].append({"model": kind, "T": T, "kv_mb_per_token": measured / 16 / 1e6,
                                 "analytic_mb_per_token": cfg.kv_bytes_per_token(nbytes) / 1e6})
    for W in windows:
        cfg = base.replace(model_type="melt", window=W)
        measured = fill_cache(new_cache_for(cfg, context), cfg, context, dtype)
        out["windows"].append({"W": W, "kv_mb_per_token": measured / context / 1e6,
                               "analytic_mb_per_token": cfg.kv_bytes(context, nbytes) / context / 1e6})
    return out


# -------------------------------------------------------------------- training throughput
@torch.enable_grad()  # whatever the caller's grad mode (importing lighteval turns it off process-wide)
def train_throughput(shape_cfg: ModelConfig, seq_len: int, batch: int, chunk_sizes: list[int],
                     steps: int = 3, dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[dict]:
    """Tokens/s of one training step (forward + KD + backward) of chunk-wise MELT at each C against
    parallel Ouro distillation of the same shape, sequence length and batch, side by side: each of
    ``steps`` rounds times every model in turn. ``ratio_rounds``: each round's ratio to Ouro's step
    (a spread to judge on); ``tokens_per_s`` and ``ratio_to_ouro`` come from the median step."""
    teacher = build_random(shape_cfg, dtype, device)
    ouro_student = build_random(shape_cfg, dtype, device, seed=1).train()
    melt = melt_from_ouro(teacher).to(device=device, dtype=dtype).train()
    ids = torch.randint(1, shape_cfg.vocab_size, (batch, seq_len), device=device)
    mask = torch.ones(batch, seq_len, device=device)

    def one_step(student, chunk):
        with torch.no_grad():
            t_logits = teacher(ids).per_loop_logits
        s = student(ids, cache=student.new_cache(), chunk_size=chunk)
        loss = kd_loss_sum(s.per_loop_logits, t_logits, mask) / mask.sum()
        loss.backward()
        student.zero_grad(set_to_none=True)

    runs = [("ouro-parallel", ouro_student, seq_len)] + [(f"melt-C{c}", melt, c) for c in chunk_sizes]
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _ in range(steps):
        for name, model, chunk in runs:
            t0 = time.perf_counter()
            one_step(model, chunk)
            times[name].append(time.perf_counter() - t0)
    base = batch * seq_len / statistics.median(times["ouro-parallel"])
    rows = []
    for name, _, chunk in runs:
        tok_s = batch * seq_len / statistics.median(times[name])
        rows.append({"model": name, "chunk": chunk, "seq_len": seq_len, "batch": batch, "tokens_per_s": tok_s,
                     "ratio_to_ouro": tok_s / base,
                     "ratio_rounds": [o / t for o, t in zip(times["ouro-parallel"], times[name])]})
    return rows
