"""Model configuration: one dataclass for Ouro (the LoopLM) and MELT, with named presets.

Notation used across melt_core: B batch, L tokens, T loops (Ouro's ``total_ut_steps``),
N layers, H query heads, H_kv key/value heads, D head dim, d hidden width, V vocab.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MODEL_TYPES = ("ouro", "melt")
GATE_VARIANTS = ("elementwise", "scalar", "mean", "ema", "last")
LEARNED_GATES = ("elementwise", "scalar")  # the gates with parameters (W_z, U_z, b_z); the rest have none
GATE_H0 = ("zeros", "first")

# melt_core's own provenance records, written beside the model fields of a checkpoint's
# ``config.json`` (conversion, pretraining, training: melt_core/training/trainer_state.py) and kept on load.
_PROVENANCE_KEYS = {"converted_from", "gate_init", "train_config_hash", "train_step", "trained_steps",
                    "pretrain_report", "phases"}

# The architecture each model type's config.json names (as hub checkpoints do), which vLLM resolves
# to melt_core's classes (melt_core/serving/vllm_plugin.py)
ARCHITECTURES = {"ouro": "OuroForCausalLM", "melt": "MeltForCausalLM"}

# Fields of a hub ``config.json`` that describe bookkeeping or features Ouro does not
# use; they are accepted and dropped. Anything else unknown is logged, not silently lost.
_HF_IGNORED_KEYS = {
    "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype",
    "initializer_range", "use_cache", "layer_types", "sliding_window", "max_window_layers",
    "attention_dropout", "attention_bias", "_name_or_path", "chunk_size",
    "use_sliding_window", "hidden_act", "rope_scaling",
}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and the fix."""


@dataclass
class ModelConfig:
    """Shape and behaviour of an Ouro LoopLM or a MELT model.

    The Ouro fields keep the hub's names so that a hub ``config.json`` maps one to one.
    The MELT fields are ignored when ``model_type == "ouro"``.
    """

    model_type: str = "ouro"
    vocab_size: int = 49152
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    max_position_embeddings: int = 65536
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    total_ut_steps: int = 4
    tie_word_embeddings: bool = False
    # the reference code's default exit: the threshold q on the cumulative exit probability (1.0,
    # as shipped: never early) and a fixed exit loop (0-based; None: none). The eval's exit rule
    # starts from them (melt_core.modeling.early_exit.ExitRule.of_checkpoint)
    early_exit_threshold: float | None = 1.0
    early_exit_step: int | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 0
    pad_token_id: int | None = 0
    # --- MELT (docs/METHOD.md section 2) ---
    gate: str = "elementwise"  # elementwise | scalar | mean | ema | last
    gate_h0: str = "zeros"  # h_prev at loop 1: zeros (Eq. 1 with h_0 = 0) or first (h_1 = a)
    ema_z: float = 0.2  # fixed z of the `ema` gate (EMA-0.2 in Table 3)
    window: int = 0  # v3 sliding window W: last W tokens keep per-loop K/V (0 = v2)
    gate_init_std: float = 0.02  # W_z, U_z ~ N(0, std^2) at conversion (paper: "random")
    gate_bias_init: float = 0.0  # b_z at conversion; 0 gives z ~ 0.5 at the start
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"model config field `{name}`: {msg}")

        need(self.model_type in MODEL_TYPES, "model_type",
             f"got {self.model_type!r}; melt_core loads only {MODEL_TYPES} checkpoints")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "total_ut_steps",
                     "max_position_embeddings"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name,
                 f"must be a positive integer, got {getattr(self, name)!r}")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
             f"{self.num_key_value_heads} must divide num_attention_heads="
             f"{self.num_attention_heads} (grouped-query attention)")
        need(self.gate in GATE_VARIANTS, "gate", f"unknown gate variant {self.gate!r}; "
             f"choose one of {GATE_VARIANTS}")
        need(self.gate_h0 in GATE_H0, "gate_h0", f"got {self.gate_h0!r}; choose one of {GATE_H0}")
        need(self.early_exit_threshold is None or 0 < self.early_exit_threshold <= 1, "early_exit_threshold",
             f"the exit threshold q must lie in (0, 1] (1 = never exit early), got {self.early_exit_threshold!r}")
        need(self.early_exit_step is None or (isinstance(self.early_exit_step, int)
                                              and 0 <= self.early_exit_step < self.total_ut_steps),
             "early_exit_step", f"a 0-based loop below total_ut_steps={self.total_ut_steps}, or null; got "
                                f"{self.early_exit_step!r}")
        need(isinstance(self.window, int) and self.window >= 0, "window",
             f"the sliding window W must be an integer >= 0 (0 = v2, no window), got {self.window!r}")
        need(0.0 < self.ema_z < 1.0, "ema_z", f"must lie in (0, 1), got {self.ema_z}")

    # ------------------------------------------------------------ derived sizes
    @property
    def is_melt(self) -> bool:
        return self.model_type == "melt"

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Cache bytes one token adds (no window): T*N*2*H_kv*D*bytes for Ouro, 1/T of it for MELT."""
        per_row = self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * dtype_bytes
        return per_row if self.is_melt else per_row * self.total_ut_steps

    def kv_bytes(self, num_tokens: int, dtype_bytes: int = 2, batch: int = 1) -> int:
        """Analytic bytes held by a cache after ``num_tokens`` tokens (MELT adds the window's T-fold rows)."""
        rows = num_tokens
        if self.is_melt and self.window > 0:
            rows += min(self.window, num_tokens) * self.total_ut_steps
        return batch * rows * self.kv_bytes_per_token(dtype_bytes)

    def gate_parameters(self) -> int:
        d = self.hidden_size
        per_layer = {"elementwise": 2 * d * d + d, "scalar": 2 * d + 1}.get(self.gate, 0)
        return per_layer * self.num_hidden_layers if self.is_melt else 0

    # ---------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        if not self.is_melt:
            for name in ("gate", "gate_h0", "ema_z", "window", "gate_init_std", "gate_bias_init"):
                out.pop(name)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> ModelConfig:
        """Build from a hub or melt_core ``config.json`` dict; ``source`` names it in errors."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if raw.get("model_type") not in MODEL_TYPES:
            raise ConfigError(f"{source}: model_type {raw.get('model_type')!r} is not an Ouro or "
                              f"MELT checkpoint (expected one of {MODEL_TYPES})")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act {raw['hidden_act']!r} unsupported (Ouro uses silu)")
        if raw.get("rope_scaling") not in (None, {}):
            raise ConfigError(f"{source}: rope_scaling {raw['rope_scaling']!r} unsupported "
                              "(Ouro checkpoints use plain RoPE)")
        if raw.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window=true is not Ouro's architecture")
        for key, value in raw.items():
            if key in known:
                kwargs[key] = value
            elif key in _PROVENANCE_KEYS:
                extra[key] = value
            elif key in _HF_IGNORED_KEYS:
                continue
            else:
                log.warning("%s: unknown field %r kept as-is but unused", source, key)
                extra[key] = value
        try:
            return cls(**kwargs, extra=extra)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ModelConfig:
        """Named presets: the paper's real shapes, and the tiny shapes of the embedded default."""
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


_OURO_1_4B = dict(model_type="ouro", num_hidden_layers=24)
PRESETS: dict[str, dict[str, Any]] = {
    "ouro-1.4b": _OURO_1_4B,
    "ouro-2.6b": dict(model_type="ouro", num_hidden_layers=48),
    "melt-1.6b": dict(_OURO_1_4B, model_type="melt"),
    "melt-3.1b": dict(model_type="melt", num_hidden_layers=48),
    # A dense GQA baseline with Qwen3-1.7B's attention/cache shape (28 layers, 8 KV heads,
    # head dim 128), expressed as a one-loop model for the memory/speed profiler.
    "qwen3-1.7b-shape": dict(model_type="ouro", vocab_size=151936, hidden_size=2048,
                             intermediate_size=6144, num_hidden_layers=28,
                             num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                             total_ut_steps=1, max_position_embeddings=40960, tie_word_embeddings=True),
}
