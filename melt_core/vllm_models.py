"""Ouro and MELT as vLLM models: melt_core's own modules, attending over vLLM's paged KV cache.

Only the cache differs from melt_core's forward (``LoopedLM.forward`` runs unchanged, with
``PagedCache`` in place of its own cache); the weights, the gates and the loop are melt_core's:

* Ouro: one vLLM ``Attention`` (and so one paged cache) per (loop, layer), as its release
  computes: at loop t a token reads every earlier token's loop-t row. Prefill in parallel is
  exact, so vLLM's chunked prefill and prefix caching apply as to any model.
* MELT: one ``Attention`` per layer, called at every loop. Each loop's gated memory is projected to
  K/V and written into the token's slot (the write overwrites the loop before), so later tokens
  read the final row, as ``SharedKVCache`` does. A decode step (one token per sequence) is
  exact as vLLM schedules it. A prompt is not: parallel prefill would let every prompt token read
  the other prompt tokens' current-loop rows. So a MELT prompt is computed by melt_core itself
  (token by token, or in the configured ``prefill_chunk``, as the native engine does), its final
  rows are handed to vLLM's cache in the same step, and its last state is what vLLM samples from:
  the result does not depend on how vLLM batches or schedules prompts. This needs each prompt in
  one step (no chunked prefill) and no prefix-cache hits; ``melt_core.serving`` sets both, and a
  step that breaks it raises.

Not expressible here, refused by name: MELT's sliding window (v3: the last W tokens keep per-loop
rows; vLLM's cache holds one row per token and layer). Early exit is not done: every token runs
every loop (the exit gate is loaded and unused, as in Ouro's release under vLLM).

Imported only where vLLM is installed (the serving environment, envs/requirements-vllm-cpu.txt);
``melt_core.vllm_plugin`` registers these classes with vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention

from . import checkpoint as ck
from .cache import KV, KVCache
from .config import ConfigError, ModelConfig
from .model import LoopedLM
from .serving import PREFILL_CHUNK_KEY


class PagedCache(KVCache):
    """melt_core's cache interface over vLLM's paged attention for one engine step: the step's
    tokens (every sequence's, flattened) are one chunk; vLLM's metadata keeps sequences apart.
    ``rows``: (token slice, per-layer final K/V) of MELT prompts computed by melt_core this step,
    written in place of what the loop computes for those tokens."""

    def __init__(self, cfg: ModelConfig, layers: nn.ModuleList, rows: list[tuple[slice, list[KV]]]):
        super().__init__(cfg.num_hidden_layers, cfg.total_ut_steps, capacity=None)
        self.cfg, self.layers, self.prompt_rows = cfg, layers, rows

    def read(self, layer, loop, kv, base=None, alpha=1.0):
        raise RuntimeError("PagedCache attends in vLLM's kernel; melt_core calls attend()")

    def nbytes(self) -> int:
        return 0  # vLLM owns the memory

    def attend(self, q: Tensor, layer: int, loop: int, kv: KV, base: KV | None = None,
               alpha: float = 1.0) -> Tensor:
        if alpha < 1.0:
            raise ConfigError("alpha < 1 (Phase-1 interpolation) is training only")
        k, v = kv  # (1, H_kv, n, D)
        if self.prompt_rows:
            k, v = k.clone(), v.clone()
            for sl, rows in self.prompt_rows:
                k[:, :, sl], v[:, :, sl] = rows[layer]
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
        hf = vllm_config.model_config.hf_config
        cfg = ck.read_config(self.path)
        if cfg.is_melt and cfg.window:
            raise ConfigError(f"{self.path}: MELT's sliding window (window={cfg.window}) keeps per-loop rows of "
                              "the last W tokens, which vLLM's one-row-per-token cache cannot hold; evaluate "
                              "it with eval.engine: native")
        self.cfg = cfg
        self.prefill_chunk = getattr(hf, PREFILL_CHUNK_KEY, None)
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
        prompts = self._prompts(input_ids) if self.cfg.is_melt else []
        cache = PagedCache(self.cfg, self.attn, [(sl, rows) for sl, rows, _ in prompts])
        hidden = self.lm(input_ids[None], cache=cache, positions=positions[None], chunk_size=input_ids.shape[0],
                         logits="none").hidden[0]
        for sl, _, last in prompts:
            hidden[sl.stop - 1] = last  # what vLLM samples from: the prompt's last state, as melt_core computed it
        return hidden

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        return self.lm.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """The checkpoint as melt_core loads it (shapes against the headers, sha256 manifest, no NaN/inf);
        vLLM's own reading of the same files is drained unused."""
        for _ in weights:
            pass
        first = next(self.lm.parameters())
        loaded = ck.load_pretrained(self.path, dtype=first.dtype, device=first.device)
        self.lm.load_state_dict(loaded.state_dict())
        self.lm.inv_freq = loaded.inv_freq.to(first.device)
        return {name for name, _ in self.named_parameters()}

    # -- MELT prompts ----------------------------------------------------------------------------
    def _prompts(self, input_ids: Tensor) -> list[tuple[slice, list[KV], Tensor]]:
        """Each sequence of this step with more than one new token is a whole prompt (the engine
        settings make it so): melt_core computes it with its own cache, as configured."""
        meta = get_forward_context().attn_metadata
        if not meta:  # vLLM's profiling and warm-up runs: no sequences
            return []
        meta = meta[self.attn[0].layer_name] if isinstance(meta, dict) else meta
        if meta.max_query_len <= 1:  # a decode step: no prompt (and no device sync, so CUDA graphs capture it)
            return []
        starts = meta.query_start_loc.tolist()
        seq_lens = meta.seq_lens.tolist()
        out = []
        for i, seq_len in enumerate(seq_lens):
            lo, hi = starts[i], starts[i + 1]
            if hi - lo <= 1:
                continue  # a decode token (or a one-token prompt): exact as vLLM runs it
            if seq_len != hi - lo:
                raise RuntimeError(
                    f"MELT in vLLM: a sequence got {hi - lo} new tokens after {seq_len - (hi - lo)} cached ones "
                    "(chunked prefill or a prefix-cache hit); its prompt must be computed in one step. Build the "
                    "engine with melt_core.serving.engine_args, which turns both off for MELT")
            cache = self.lm.new_cache()
            out_lm = self.lm(input_ids[None, lo:hi], cache=cache, chunk_size=self.prefill_chunk or 1,
                             align_chunks_to_end=True, logits="none")
            rows = [cache.final[layer].read() for layer in range(self.cfg.num_hidden_layers)]
            out.append((slice(lo, hi), rows, out_lm.hidden[0, -1]))
        return out
