"""Dense baselines (Qwen3-1.7B and the like): a transformers causal LM behind the interface
``melt_core.generation.generate`` drives, so a baseline is sampled by exactly the same code as Ouro and
MELT (same seeded sampler, nucleus filter, stop handling, batching).

Loading never runs remote code and reads only safetensors: the architecture must be one that
transformers itself implements (``model_type`` in its registry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .checkpoint import CheckpointError, verify_checksums
from .config import ConfigError

MELT_TYPES = ("ouro", "melt")


def checkpoint_kind(path: str | Path) -> str:
    """``melt`` for an Ouro/MELT checkpoint directory, ``dense`` for a transformers one."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} is not a model checkpoint directory (no config.json); "
                              "train, convert or download it first")
    try:
        model_type = json.loads(cfg_file.read_text()).get("model_type")
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({err})") from None
    return "melt" if model_type in MELT_TYPES else "dense"


@dataclass
class _Out:
    logits: Tensor


class DenseCache:
    """transformers' DynamicCache plus the attention mask seen so far (HF wants the whole mask)."""

    def __init__(self):
        from transformers import DynamicCache

        self.kv = DynamicCache()
        self.mask: Tensor | None = None

    def end_prompt(self) -> None: ...

    def extend_mask(self, new: Tensor) -> Tensor:
        self.mask = new if self.mask is None else torch.cat((self.mask, new), dim=1)
        return self.mask


class DenseLM(torch.nn.Module):
    """A transformers causal LM with LoopedLM's generation interface (one loop, one cache)."""

    num_loops = 1

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model.eval()
        c = hf_model.config
        self.config = c
        self.config.is_melt = False
        self.lm_head = hf_model.get_output_embeddings()

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None) -> DenseLM:
        from transformers import AutoConfig, AutoModelForCausalLM

        path = Path(path)
        if not any(path.glob("*.safetensors")):
            raise CheckpointError(f"{path}: no safetensors weights (pickled weights are never loaded)")
        try:
            AutoConfig.from_pretrained(path, trust_remote_code=False)
        except ValueError as err:
            raise CheckpointError(f"{path}: transformers does not implement this architecture without remote "
                                  f"code, which melt_core never runs ({err})") from None
        verify_checksums(path)
        # transformers fills missing weights with random ones and drops unexpected ones, with a
        # warning at most, and raises on misshapen ones without naming a fix: all three are
        # collected (a tied head is not reported missing) and a checkpoint that does not match its
        # declared architecture is refused here, naming the keys
        hf, info = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, use_safetensors=True,
                                                        dtype=dtype or "auto", output_loading_info=True,
                                                        ignore_mismatched_sizes=True)
        missing = sorted(info.get("missing_keys", []))
        unexpected = sorted(info.get("unexpected_keys", []))
        mismatched = sorted(str(m[0]) if isinstance(m, tuple) else str(m) for m in info.get("mismatched_keys", []))
        if missing or unexpected or mismatched:
            raise CheckpointError(f"{path}: its weights do not match its config.json's architecture "
                                  f"({hf.config.model_type}): missing {missing[:5]}, unexpected {unexpected[:5]}, "
                                  f"misshapen {mismatched[:5]}; fix the config or fetch the checkpoint again")
        return cls(hf.to(device))

    def new_cache(self, capacity: int | None = None, mode: str = "default", keep_prompt: bool = False,
                  **_) -> DenseCache:
        if mode != "default" or keep_prompt:
            raise ConfigError(f"cache mode {mode!r} (keep_prompt={keep_prompt}) is for Ouro; a dense model "
                              "has one cache")
        return DenseCache()

    def forward(self, input_ids: Tensor, cache: DenseCache | None = None, positions: Tensor | None = None,
                attention_mask: Tensor | None = None, chunk_size: int | None = None,
                first_chunk: int | None = None, logits: str = "all") -> _Out:
        """``chunk_size`` is accepted and ignored: a dense model's prefill is exact at any chunking."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if cache is not None:
            attention_mask = cache.extend_mask(attention_mask)
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                      cache=cache.kv if cache is not None else None, use_cache=cache is not None,
                      logits_to_keep=1 if logits == "last" else 0)
        return _Out(out.logits)
