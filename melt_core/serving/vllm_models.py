"""Ouro and MELT as vLLM models: melt_core's own modules, attending over vLLM's paged KV cache.

Only the cache differs from melt_core's forward (``LoopedLM.forward`` runs unchanged, with
``PagedCache`` in place of its own cache); the weights, the gates and the loop are melt_core's:

* Ouro: one vLLM ``Attention`` (and so one paged cache) per (loop, layer), as its release
  computes: at loop t a token reads every earlier token's loop-t row. Prefill in parallel is
  exact, so vLLM's chunked prefill and prefix caching apply as to any model.
* MELT: one ``Attention`` per layer, called at every loop. Each loop's gated memory is projected to
  K/V and written into the step's slots (the write overwrites the loop before), and the step's
  tokens attend causally: a sequence's piece of this step reads its own current-loop rows and the
  final rows of what earlier steps computed, which is MELT's chunk semantics when the piece is one
  chunk. ``melt_core.serving.vllm_scheduler.MeltScheduler`` makes every piece one chunk (the prompt cut as
  the native engine cuts it, every later token alone, after a preemption too), so vLLM batches and
  schedules MELT prompts with other sequences' decode steps, with chunked prefill and prefix caching
  on; this model refuses to run under another scheduler.

Not expressible here, refused by name: MELT's sliding window (v3: the last W tokens keep per-loop
rows; vLLM's cache holds one row per token and layer). Early exit is not done: every token runs
every loop, and the exit gate, loaded with the checkpoint, is not computed.

Imported only where vLLM is installed (the serving environment, envs/requirements-vllm-cpu.txt);
``melt_core.serving.vllm_plugin`` registers these classes with vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention

from ..modeling import checkpoint as ck
from ..modeling.cache import KV, KVCache
from ..modeling.config import ConfigError, ModelConfig
from ..modeling.model import LoopedLM
from .engine_choice import vllm_refusal
from .vllm_engine import MELT_SCHEDULER
from .vllm_scheduler import MeltScheduler


class PagedCache(KVCache):
    """melt_core's cache interface over vLLM's paged attention for one engine step: the step's
    tokens (every sequence's, flattened) are one chunk; vLLM's metadata keeps sequences apart, and
    vLLM owns the memory (so there is nothing to ``read`` or count here: only ``attend``)."""

    def __init__(self, cfg: ModelConfig, layers: nn.ModuleList):
        super().__init__(cfg.num_hidden_layers, cfg.total_ut_steps, capacity=None)
        self.cfg, self.layers = cfg, layers

    def attend(self, q: Tensor, layer: int, loop: int, kv: KV, base: KV | None = None,
               alpha: float = 1.0) -> Tensor:
        if alpha < 1.0:
            raise ConfigError("alpha < 1 (Phase-1 interpolation) is training only")
        k, v = kv  # (1, H_kv, n, D)
        index = layer if self.cfg.is_melt else loop * self.N + layer
        n = q.shape[2]
        flat = lambda t: t[0].transpose(0, 1).reshape(n, -1)  # noqa: E731  (1, h, n, D) -> (n, h*D)
        out = self.layers[index](flat(q), flat(k), flat(v))  # writes k, v into the tokens' slots
        return out.view(n, q.shape[1], q.shape[3]).transpose(0, 1)[None]


class LoopedForCausalLM(nn.Module):
    """An Ouro or MELT checkpoint directory of melt_core's (or the hub's Ouro) served by vLLM."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        self.path = Path(vllm_config.model_config.model)
        cfg = ck.read_config(self.path)
        if refusal := vllm_refusal(window=cfg.window if cfg.is_melt else None):
            raise ConfigError(f"{self.path}: {refusal}")
        scheduler = vllm_config.scheduler_config.get_scheduler_cls()
        if cfg.is_melt and not issubclass(scheduler, MeltScheduler):
            raise ConfigError(f"{self.path}: a MELT checkpoint needs vLLM's scheduler_cls {MELT_SCHEDULER} (it cuts "
                              f"prompts into MELT's chunks; {scheduler.__name__} would compute other "
                              "rows). Use melt_core.serving.vllm_engine.engine_args, or `vllm serve` with the "
                              "flags the README gives")
        self.cfg = cfg
        self.lm = LoopedLM(cfg)
        count = cfg.num_hidden_layers * (1 if cfg.is_melt else cfg.total_ut_steps)
        self.attn = nn.ModuleList(
            Attention(cfg.num_attention_heads, cfg.head_dim, cfg.head_dim**-0.5, num_kv_heads=cfg.num_key_value_heads,
                      cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn.{i}" if prefix else f"attn.{i}")
            for i in range(count))

    # -- vLLM's model interface ------------------------------------------------------------------
    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.lm.model.embed_tokens(input_ids)

    def forward(self, input_ids: Tensor, positions: Tensor, intermediate_tensors=None,
                inputs_embeds: Tensor | None = None) -> Tensor:
        if inputs_embeds is not None:
            raise ConfigError("Ouro/MELT in vLLM take token ids, not input embeddings")
        cache = PagedCache(self.cfg, self.attn)
        return self.lm(input_ids[None], cache=cache, positions=positions[None], chunk_size=input_ids.shape[0],
                       logits="none", exit_gate=False).hidden[0]

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        return self.lm.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """vLLM's one reading of the checkpoint's files, with melt_core's load checks: the config's
        dimensions against the files' headers and the sha256 manifest before a tensor is taken, and no
        NaN or inf in any (as ``checkpoint.load_pretrained``)."""
        ck.check_shapes(ck.read_shapes(self.path), self.cfg, str(self.path))
        ck.verify_checksums(self.path)
        state = dict(weights)
        ck.check_finite(state, str(self.path))
        missing, unexpected = self.lm.load_state_dict(state, strict=False)  # copies into the model's own storage
        tied = {"lm_head.weight"} if self.cfg.tie_word_embeddings else set()
        if set(missing) - tied or unexpected:
            raise ck.CheckpointError(f"{self.path}: weights missing {sorted(set(missing) - tied)}, "
                                     f"unexpected {sorted(unexpected)}")
        return {name for name, _ in self.named_parameters()}
