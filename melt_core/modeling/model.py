"""Ouro's LoopLM and MELT in one file, read top to bottom.

    x = embed(ids)
    for t in 1..T:                              # the same N layers every loop
        for l in 1..N:
            a = input_layernorm(x)
            q = rope(q_proj(a))
            m = a                  (Ouro)       # what K/V are projected from
            m = gate(a, m_prev)    (MELT)       # latent memory, melt_core/modeling/gate.py
            k, v = rope(k_proj(m)), v_proj(m)
            o = attention(q, cache.read(l, t, k, v))          # melt_core/modeling/cache.py
            x = x + input_layernorm_2(o_proj(o))              # "sandwich" norms
            x = x + post_attention_layernorm_2(mlp(post_attention_layernorm(x)))
        x = norm(x)               # final norm after EVERY loop; the next loop starts from it
        logits_t = lm_head(x);  exit_t = early_exit_gate(x)

Sequences run in chunks of C tokens (chunks in order, the tokens of a chunk in parallel
through all T loops). For Ouro any C gives the same result; for MELT C = 1 is exact
autoregressive inference and larger C is the training/prefill approximation.

Module and parameter names equal the hub's state-dict keys (``model.layers.0.self_attn.q_proj``),
so a checkpoint loads without renaming; MELT adds ``model.layers.{i}.gate.*``.

Shapes: B batch, L tokens, C chunk, T loops, N layers, H heads, H_kv KV heads, D head dim,
d hidden, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .cache import KeptPromptSharedKVCache, KVCache, LoopKVCache, SharedKVCache
from .config import ConfigError, ModelConfig
from .gate import LatentGate


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))  # bf16 computes in float32; float64 stays
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (B, 1, L, D) for integer positions (B, L); computed in float32."""
    freqs = positions[..., None].float() * inv_freq  # (B, L, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, L, D)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, H, Hkv, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = nn.Linear(d, H * D, bias=False)
        self.k_proj = nn.Linear(d, Hkv * D, bias=False)
        self.v_proj = nn.Linear(d, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, d, bias=False)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, C, _ = x.shape
        return x.view(B, C, n, self.D).transpose(1, 2)  # (B, n, C, D)

    def query(self, a: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return apply_rope(self._heads(self.q_proj(a), self.H), cos, sin)

    def key_value(self, m: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        k = apply_rope(self._heads(self.k_proj(m), self.Hkv), cos, sin)
        return k, self._heads(self.v_proj(m), self.Hkv)

    def output(self, o: Tensor) -> Tensor:
        B, _, C, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, C, self.H * self.D))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LoopBlock(nn.Module):
    """One of the N layers, applied once per loop."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.input_layernorm_2 = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm_2 = RMSNorm(cfg.hidden_size, eps)
        # the one difference from Ouro's layer: K/V come from a gated latent memory carried across
        # loops instead of from each loop's own hidden state
        self.gate = LatentGate(cfg.gate, cfg.hidden_size, cfg.gate_h0, cfg.ema_z) if cfg.is_melt else None

    def forward(self, x: Tensor, step: LoopStep, layer: int, loop: int) -> Tensor:
        attn = self.self_attn
        a = self.input_layernorm(x)
        q = attn.query(a, step.cos, step.sin)
        if self.gate is not None:
            step.memory[layer] = self.gate(a, step.memory[layer], loop)
            kv = attn.key_value(step.memory[layer], step.cos, step.sin)
            base = attn.key_value(a, step.cos, step.sin) if step.alpha < 1.0 else None
        else:
            kv, base = attn.key_value(a, step.cos, step.sin), None
        o = attn.output(step.cache.attend(q, layer, loop, kv, base=base, alpha=step.alpha))
        if step.attn_outputs is not None:
            step.attn_outputs.append(o)
        x = x + self.input_layernorm_2(o)
        if step.checkpoint_mlp and torch.is_grad_enabled():  # recompute in backward; no side effects here
            return x + checkpoint(self._mlp_half, x, use_reentrant=False)
        return x + self._mlp_half(x)

    def _mlp_half(self, x: Tensor) -> Tensor:
        return self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(x)))


class LoopStep:
    """What the layers of one chunk share while it runs through the loops.

    A plain class on purpose: the layers write into it (``memory``, ``attn_outputs``), and FSDP
    rebuilds dataclass arguments of a sharded module's forward, so writes would land in a copy.
    """

    __slots__ = ("cache", "cos", "sin", "alpha", "memory", "attn_outputs", "checkpoint_mlp")

    def __init__(self, cache: KVCache, cos: Tensor, sin: Tensor, alpha: float, memory: list[Tensor | None],
                 attn_outputs: list[Tensor] | None = None, checkpoint_mlp: bool = False):
        self.cache, self.cos, self.sin, self.alpha = cache, cos, sin, alpha
        self.memory = memory  # per layer: the chunk's latent memory h (MELT)
        self.attn_outputs = attn_outputs  # o^(l,t) in order t*N + l, when collected
        self.checkpoint_mlp = checkpoint_mlp


@dataclass
class LoopOutput:
    """``logits`` (B, L, V) are the last loop's; ``per_loop_logits`` (T, B, L, V); ``hidden``
    (B, C, d): the last chunk's states after the last loop's final norm (what ``lm_head`` reads)."""

    logits: Tensor | None
    per_loop_logits: Tensor | None
    exit_logits: Tensor  # (T, B, L) early_exit_gate before the sigmoid
    cache: KVCache
    attn_outputs: list[Tensor] | None = field(default=None, repr=False)  # t*N + l -> (B, L, d)
    hidden: Tensor | None = field(default=None, repr=False)


def exit_distribution(exit_logits: Tensor) -> Tensor:
    """Ouro's exit pdf over loops: p_t = lambda_t * prod_{s<t}(1 - lambda_s), p_T = the rest."""
    lam = torch.sigmoid(exit_logits.float())
    remaining = torch.ones_like(lam[0])
    probs = []
    for t in range(lam.shape[0]):
        p = remaining if t == lam.shape[0] - 1 else lam[t] * remaining
        remaining = remaining * (1 - lam[t])
        probs.append(p)
    return torch.stack(probs)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LoopBlock(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.early_exit_gate = nn.Linear(cfg.hidden_size, 1)


class LoopedLM(nn.Module):
    """Ouro (``model_type="ouro"``) or MELT (``"melt"``), decided by the config."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.checkpoint_mlp = False  # activation checkpointing of each layer's MLP half (training)

    @property
    def num_loops(self) -> int:
        return self.config.total_ut_steps

    def new_cache(self, capacity: int | None = None, mode: str = "default",
                  keep_prompt: bool = False, detach_past: bool = False) -> KVCache:
        """A fresh cache. ``capacity`` (max tokens) preallocates buffers for inference;
        None gives the growing, autograd-safe storage used in training.

        mode: ``default`` (Ouro: per-loop; MELT: gated shared rows), or for Ouro the
        untrained sharing baselines ``first-loop`` / ``last-loop`` (Appendix B), with
        ``keep_prompt`` keeping the prompt's full per-loop cache.
        """
        cfg, N, T = self.config, self.config.num_hidden_layers, self.num_loops
        if mode == "default" and not keep_prompt:
            if cfg.is_melt:
                return SharedKVCache(N, T, capacity, window=cfg.window, detach_past=detach_past)
            return LoopKVCache(N, T, capacity)
        if cfg.is_melt or mode not in ("first-loop", "last-loop"):
            raise ConfigError(f"cache mode {mode!r} (keep_prompt={keep_prompt}) is not defined for "
                              f"a {cfg.model_type} model; Ouro accepts first-loop / last-loop")
        cache = KeptPromptSharedKVCache if keep_prompt else SharedKVCache
        return cache(N, T, capacity, write_every_loop=mode == "last-loop")

    def forward(self, input_ids: Tensor, cache: KVCache | None = None,
                positions: Tensor | None = None, attention_mask: Tensor | None = None,
                chunk_size: int | None = None, alpha: float = 1.0, first_chunk: int | None = None,
                logits: str = "all", collect_attn_outputs: bool = False, exit_gate: bool = True) -> LoopOutput:
        """Run ``input_ids`` (B, L) after what ``cache`` already holds.

        positions: (B, L) RoPE positions (default: continue from the cache);
        attention_mask: (B, L) 1 for real tokens, 0 for (left) padding;
        chunk_size: C (default: L for Ouro, which is exact; 1 for MELT, which is exact);
        alpha: Phase-1 interpolation between MELT and Ouro K/V (1 = pure MELT);
        first_chunk: the first chunk's length (default C), so that rows left-padded by a multiple
            of C plus ``first_chunk`` are cut from their first token, as alone (chunks of C from
            position 0: how training cuts a sequence and every engine cuts a prompt);
        logits: ``all`` (every loop, every position), ``last`` (last loop, last position) or
            ``none`` (no logits: ``hidden`` only, for a caller that applies ``lm_head`` itself);
        exit_gate: compute the exit gate's logits (False: ``exit_logits`` is None, for a caller
            that runs every loop whatever the gate says).
        """
        cfg = self.config
        B, L = input_ids.shape
        if chunk_size is None:
            chunk_size = 1 if cfg.is_melt else L
        if chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha must lie in [0, 1], got {alpha}")
        if logits not in ("all", "last", "none"):
            raise ValueError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        if alpha < 1.0 and not cfg.is_melt:
            raise ConfigError("alpha < 1 interpolates MELT with Ouro K/V; it needs a MELT model")
        cache = cache if cache is not None else self.new_cache()
        if positions is None:
            positions = torch.arange(cache.seen, cache.seen + L, device=input_ids.device).expand(B, L)
            top = cache.seen + L - 1
        else:  # reading a GPU tensor's max would stall every decode step on the host; generate() checks
            top = int(positions.max()) if positions.device.type == "cpu" else None  # prompt + new tokens once
        if top is not None and top >= cfg.max_position_embeddings:
            raise ConfigError(f"position {top} is beyond max_position_embeddings="
                              f"{cfg.max_position_embeddings} of this model")
        valid = attention_mask.bool() if attention_mask is not None and not attention_mask.all() else None
        x_all = self.model.embed_tokens(input_ids)
        per_loop, exits, attn_outputs = [], [], [] if collect_attn_outputs else None
        first = chunk_size if first_chunk is None else first_chunk
        if not 1 <= first <= chunk_size:
            raise ValueError(f"first_chunk must lie in [1, chunk_size={chunk_size}], got {first_chunk}")
        for start in [0, *range(first, L, chunk_size)]:
            sl = slice(start, min(start + (first if start == 0 else chunk_size), L))
            cos, sin = rope_tables(positions[:, sl], self.inv_freq, x_all.dtype)
            cache.begin_chunk(sl.stop - sl.start, None if valid is None else valid[:, sl])
            step = LoopStep(cache, cos, sin, alpha, [None] * cfg.num_hidden_layers,
                            [] if collect_attn_outputs else None, self.checkpoint_mlp)
            lo, ex, hidden = self._run_chunk(x_all[:, sl], step, "none" if logits == "none" else
                                             "last" if logits == "last" and sl.stop == L else "all", exit_gate)
            cache.end_chunk()
            per_loop.append(lo)
            exits.append(ex)
            if collect_attn_outputs:
                attn_outputs.append(step.attn_outputs)
        exit_logits = torch.cat(exits, dim=-1) if exit_gate else None
        if logits == "none":
            return LoopOutput(None, None, exit_logits, cache, hidden=hidden)
        if logits == "last":
            return LoopOutput(per_loop[-1][-1], None, exit_logits, cache, hidden=hidden)
        per_loop_logits = torch.cat(per_loop, dim=2)  # (T, B, L, V)
        if collect_attn_outputs:  # per (t, l): join the chunks along L
            attn_outputs = [torch.cat(parts, dim=1) for parts in zip(*attn_outputs)]
        return LoopOutput(per_loop_logits[-1], per_loop_logits, exit_logits, cache, attn_outputs, hidden)

    def _run_chunk(self, x: Tensor, step: LoopStep, logits: str, exit_gate: bool = True
                   ) -> tuple[Tensor | None, Tensor | None, Tensor]:
        """The chunk through every loop: per-loop logits (``all``), the last position's (``last``) or
        none; the exit gate's logits; the last loop's states."""
        per_loop, exits = [], []
        for t in range(self.num_loops):
            for layer_idx, layer in enumerate(self.model.layers):
                x = layer(x, step, layer_idx, t)
            x = self.model.norm(x)
            if exit_gate:
                exits.append(self.model.early_exit_gate(x).squeeze(-1))  # (B, C)
            if logits == "all":
                per_loop.append(self.lm_head(x))
        if logits == "last":
            per_loop.append(self.lm_head(x[:, -1:]))
        return torch.stack(per_loop) if per_loop else None, torch.stack(exits) if exits else None, x

    def melt_parameters(self) -> list[nn.Parameter]:
        """The gates' parameters (trained with their own learning rate)."""
        return [p for layer in self.model.layers if layer.gate is not None for p in layer.gate.parameters()]
