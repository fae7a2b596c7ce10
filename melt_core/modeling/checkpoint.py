"""Checkpoint I/O: hub-format Ouro and MELT directories, and the Ouro -> MELT conversion.

A checkpoint directory is ``config.json`` + ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), exactly as the hub lays out Ouro. Only safetensors are
read: no pickle, no remote code. Writes go to a temporary sibling directory that is
renamed into place when complete, so a failure never leaves a half-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import ARCHITECTURES, LEARNED_GATES, ConfigError, ModelConfig
from .model import LoopedLM

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CHECKSUMS = "checksums.json"  # sha256 of every file, written with the checkpoint, verified on load

# The checkpoint layout as data: every key of an Ouro checkpoint and the shape it must have.
# MELT checkpoints hold the same keys plus the gate's. The model's parameter names equal these
# keys, so conversion copies by name.
GLOBAL_KEYS = {
    "model.embed_tokens.weight": ("vocab_size", "hidden_size"),
    "model.norm.weight": ("hidden_size",),
    "model.early_exit_gate.weight": (1, "hidden_size"),
    "model.early_exit_gate.bias": (1,),
    "lm_head.weight": ("vocab_size", "hidden_size"),
}
LAYER_KEYS = {
    "self_attn.q_proj.weight": ("q_width", "hidden_size"),
    "self_attn.k_proj.weight": ("kv_width", "hidden_size"),
    "self_attn.v_proj.weight": ("kv_width", "hidden_size"),
    "self_attn.o_proj.weight": ("hidden_size", "q_width"),
    "mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
    "mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
    "mlp.down_proj.weight": ("hidden_size", "intermediate_size"),
    "input_layernorm.weight": ("hidden_size",),
    "input_layernorm_2.weight": ("hidden_size",),
    "post_attention_layernorm.weight": ("hidden_size",),
    "post_attention_layernorm_2.weight": ("hidden_size",),
}
GATE_KEYS = {  # MELT only, for the learned gate variants
    "gate.input_proj.weight": ("gate_width", "hidden_size"),  # W_z
    "gate.input_proj.bias": ("gate_width",),  # b_z
    "gate.state_proj.weight": ("gate_width", "hidden_size"),  # U_z
}


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or does not match its config."""


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    dims = {**{k: v for k, v in vars(cfg).items() if isinstance(v, int)},
            "q_width": cfg.num_attention_heads * cfg.head_dim,
            "kv_width": cfg.num_key_value_heads * cfg.head_dim,
            "gate_width": cfg.hidden_size if cfg.gate == "elementwise" else 1}

    def shape(spec):
        return tuple(s if isinstance(s, int) else dims[s] for s in spec)

    keys = {k: shape(s) for k, s in GLOBAL_KEYS.items()}
    if cfg.tie_word_embeddings:
        keys.pop("lm_head.weight")
    layer_keys = dict(LAYER_KEYS)
    if cfg.is_melt and cfg.gate in LEARNED_GATES:
        layer_keys.update(GATE_KEYS)
    for i in range(cfg.num_hidden_layers):
        keys.update({f"model.layers.{i}.{k}": shape(s) for k, s in layer_keys.items()})
    return keys


def read_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (expected config.json + "
                              f"{WEIGHTS} inside)")
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing; a melt_core checkpoint directory needs "
                              "config.json beside its safetensors")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({err})") from None
    return ModelConfig.from_dict(raw, source=str(cfg_file))


def _weight_files(path: Path) -> list[Path]:
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index}: unreadable shard index ({err!r})") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = [path / WEIGHTS]
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing weights file (expected {WEIGHTS} or the shards "
                                  f"listed in {INDEX})")
    return files


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, from safetensors only."""
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(Path(path)):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    state[key] = fh.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{f}: cannot read safetensors ({err}); the file may be "
                                  "truncated — download or convert it again") from None
    return state


def read_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the safetensors headers alone: no tensor is read or allocated."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in _weight_files(Path(path)):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    shapes[key] = tuple(fh.get_slice(key).get_shape())
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{f}: cannot read safetensors ({err}); the file may be "
                                  "truncated — download or convert it again") from None
    return shapes


def check_shapes(shapes: dict[str, tuple[int, ...]], cfg: ModelConfig, source: str) -> None:
    """The config's every dimension against the weights' shapes. The layer count first, from the
    keys, so that an absurd one (10^9 layers) is refused before a key list of that length is built."""
    layers = {k.split(".")[2] for k in shapes if k.startswith("model.layers.")}
    in_file = max((int(i) for i in layers if i.isdigit()), default=-1) + 1
    if in_file != cfg.num_hidden_layers:
        raise CheckpointError(f"{source}: config.json says num_hidden_layers={cfg.num_hidden_layers} but the "
                              f"weights hold {in_file} layer(s); the config does not belong to these weights")
    expected = expected_shapes(cfg)
    missing = sorted(set(expected) - set(shapes))
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"{source}: missing key(s) {missing[:3]}{more} that a "
                              f"{cfg.model_type} model with this config.json needs")
    unexpected = sorted(set(shapes) - set(expected))
    if unexpected:
        raise CheckpointError(f"{source}: unexpected key(s) {unexpected[:3]} for a {cfg.model_type} "
                              f"model with gate={cfg.gate!r} and {cfg.num_hidden_layers} layers")
    for key, shape in expected.items():
        if tuple(shapes[key]) != shape:
            raise CheckpointError(f"{source}: {key} has shape {tuple(shapes[key])} but the "
                                  f"config implies {shape}")


def check_finite(state: dict[str, torch.Tensor], source: str) -> None:
    """Every floating-point weight finite: a NaN or inf one would load and compute garbage. One
    min-max reduction a tensor (NaN propagates through it; an inf is its min or max), no tensor-sized
    mask: at the 1.4B shape a fraction of the sha256 pass that reads the same bytes (MEASURED.md)."""
    for key, t in state.items():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{source}: weight {key} holds {bad} non-finite value(s) (NaN or inf) of "
                                  f"{t.numel()}; the run that wrote it diverged, or the file was damaged — "
                                  "load an earlier checkpoint or retrain")


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_checksums(path: str | Path) -> dict[str, str]:
    """Record the sha256 of every file of a checkpoint directory in ``checksums.json``."""
    path = Path(path)
    sums = {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file() and f.name != CHECKSUMS}
    (path / CHECKSUMS).write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n")
    return sums


def verify_checksums(path: str | Path, required: bool = True) -> None:
    """Every file ``checksums.json`` lists must hash as recorded. Every checkpoint the pipeline
    loads has one: it writes one with each checkpoint, and the download rule writes one into its
    copy of a hub snapshot after checking the snapshot against the pinned sha256 manifest. So a
    missing one means a partial copy or a hand edit, and is refused unless ``required`` is false
    (a raw hub snapshot opened on purpose, outside the pipeline)."""
    path = Path(path)
    if (path / CHECKSUMS).is_file():
        check_digests(path, json.loads((path / CHECKSUMS).read_text()), CHECKSUMS,
                      "the file changed or is corrupt since it was written; rerun the rule that made it")
    elif required:
        raise CheckpointError(f"{path / CHECKSUMS}: missing. Every checkpoint the pipeline writes or downloads has "
                              "one, so this directory is a partial copy or was edited by hand; copy it again, or "
                              "rerun the rule that made it. If you changed its files on purpose, record them: "
                              f"python -m melt_core.modeling.checkpoint write-checksums {path}")


def check_digests(path: Path, expected: dict[str, str], manifest: str, fix: str) -> None:
    """Every file named in ``expected`` exists in ``path`` and has that sha256."""
    for name, digest in expected.items():
        f = Path(path) / name
        if not f.is_file():
            raise CheckpointError(f"{f}: listed in {manifest} but missing; {fix}")
        got = sha256_file(f)
        if got != digest:
            raise CheckpointError(f"{f}: sha256 {got[:16]}... differs from {manifest}'s {digest[:16]}...: {fix}")


def load_pretrained(path: str | Path, dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu", require_checksums: bool = True) -> LoopedLM:
    """The Ouro or MELT model stored in a checkpoint directory (by its ``model_type``): its config's
    dimensions checked against the weight files' headers before anything is allocated, its files
    against the checkpoint's sha256 manifest (``require_checksums``: see verify_checksums), and its
    weights for NaN and inf."""
    path = Path(path)
    cfg = read_config(path)
    check_shapes(read_shapes(path), cfg, str(path))
    verify_checksums(path, required=require_checksums)
    state = read_state_dict(path)
    check_finite(state, str(path))
    if dtype is None:
        dtype = state["model.embed_tokens.weight"].dtype
    with torch.device("meta"):
        model = LoopedLM(cfg).to(dtype)
    # Copy into storage from torch's own allocator (64-byte aligned), never assign safetensors'
    # tensors: they sit at the file's 8-byte-aligned offsets, and BLAS takes other code paths
    # (another summation order) for unaligned operands, so a reloaded model computed a different
    # function in the last bits than the model that was saved.
    model = model.to_empty(device=device)
    model.load_state_dict(state, strict=False)
    model.inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float()
                                               / cfg.head_dim)).to(device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()


def follow_umask(root: Path) -> None:
    """Directories 0777 and files 0666, less the process's umask, as ``mkdir``/``open`` would make them."""
    mask = os.umask(0)
    os.umask(mask)
    root.chmod(0o777 & ~mask)
    for p in root.rglob("*"):
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def _atomic_dir(dest: Path):
    """Context manager yielding a temp dir renamed to ``dest`` on success, removed on failure."""

    class _Ctx:
        def __enter__(self):
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
            return self.tmp

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                return False
            follow_umask(self.tmp)  # mkdtemp makes it 0700: the group would not read a checkpoint
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(self.tmp, dest)
            return False

    return _Ctx()


def save_pretrained(model: LoopedLM, path: str | Path, extra_config: dict | None = None,
                    write_extra=None, state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` atomically (hub layout).

    ``write_extra(tmp_dir)`` may add files (a tokenizer, a report) before the rename.
    ``state``: the full state dict when ``model``'s own holds shards (FSDP gathers it first).
    """
    path = Path(path)
    cfg = model.config.to_dict()
    state = {k: v.detach().contiguous().cpu() for k, v in (state or model.state_dict()).items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    cfg["torch_dtype"] = str(state["model.embed_tokens.weight"].dtype).removeprefix("torch.")
    cfg["architectures"] = [ARCHITECTURES[model.config.model_type]]  # any vLLM entry point loads it by name
    cfg.update(extra_config or {})
    with _atomic_dir(path) as tmp:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        if write_extra is not None:
            write_extra(tmp)
        write_checksums(tmp)
    return path


def melt_from_ouro(ouro: LoopedLM, gate: str = "elementwise", window: int = 0,
                   gate_h0: str = "zeros", ema_z: float = 0.2, gate_init_std: float = 0.02,
                   gate_bias_init: float = 0.0, seed: int = 0) -> LoopedLM:
    """A MELT model holding every Ouro weight plus freshly initialised gates."""
    if ouro.config.is_melt:
        raise ConfigError("melt_from_ouro expects an Ouro model; this one is already MELT")
    cfg = ouro.config.replace(model_type="melt", gate=gate, window=window, gate_h0=gate_h0,
                              ema_z=ema_z, gate_init_std=gate_init_std, gate_bias_init=gate_bias_init)
    dtype = ouro.lm_head.weight.dtype
    melt = LoopedLM(cfg).to(dtype)
    missing, unexpected = melt.load_state_dict(ouro.state_dict(), strict=False)
    assert not unexpected and all(".gate." in k for k in missing), (missing, unexpected)
    gen = torch.Generator().manual_seed(seed)
    for layer in melt.model.layers:
        layer.gate.reset_parameters(gate_init_std, gate_bias_init, gen)
    return melt.to(dtype).eval()


def convert_ouro_to_melt(src: str | Path, dst: str | Path, **gate_options) -> Path:
    """Load an Ouro checkpoint directory, add gates, save a MELT checkpoint directory.

    The tokenizer, chat template and generation config beside the weights are copied along.
    """
    src = Path(src)
    melt = melt_from_ouro(load_pretrained(src), **gate_options)
    record = {"converted_from": str(src), "gate_init": f"normal(0, {melt.config.gate_init_std}^2), "
              f"bias {melt.config.gate_bias_init}, seed {gate_options.get('seed', 0)}"}
    return save_pretrained(melt, dst, extra_config=record, write_extra=side_file_copier(src))


SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
              "added_tokens.json", "chat_template.jinja", "generation_config.json")


def side_file_copier(src: str | Path):
    """``write_extra`` for save_pretrained: carry the tokenizer and generation files of ``src`` along."""
    def copy(tmp: Path) -> None:
        for name in SIDE_FILES:
            if (Path(src) / name).is_file():
                shutil.copy2(Path(src) / name, tmp / name)
    return copy


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m melt_core.modeling.checkpoint",
                                 description="Checkpoint maintenance. write-checksums: record the sha256 of "
                                             "every file of a checkpoint directory whose files you changed on "
                                             "purpose (every load verifies them).")
    ap.add_argument("command", choices=["write-checksums"])
    ap.add_argument("dirs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for d in args.dirs:
        cfg = read_config(d)
        check_shapes(read_shapes(d), cfg, str(d))  # only a loadable checkpoint gets a manifest
        check_finite(read_state_dict(d), str(d))
        sums = write_checksums(d)
        print(f"{d / CHECKSUMS}: {len(sums)} file(s) recorded")


if __name__ == "__main__":
    main()
