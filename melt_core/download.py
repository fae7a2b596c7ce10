"""Stage 1 of the paper configuration: fetch an Ouro checkpoint from the hub at a pinned
revision, or take a local directory, and verify it against a checksum manifest.

Only config, safetensors and tokenizer files are fetched; nothing is executed or unpickled
(the hub repos also ship modeling code, which we never download or run).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .checkpoint import CheckpointError, _atomic_dir, read_config, read_state_dict

ALLOW = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
         "chat_template.jinja", "added_tokens.json"]


def sha256(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def manifest(path: str | Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint directory (to pin in config after a first download)."""
    path = Path(path)
    return {f.name: sha256(f) for f in sorted(path.iterdir()) if f.is_file()}


def verify(path: str | Path, expected: dict[str, str] | None) -> None:
    """Checksums (when given) and a structural check: config + every tensor readable and consistent."""
    path = Path(path)
    for name, digest in (expected or {}).items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: listed in the checksum manifest but missing")
        got = sha256(f)
        if got != digest:
            raise CheckpointError(f"{f}: sha256 {got} does not match the manifest's {digest}; the download "
                                  "is corrupt or the revision changed — delete it and fetch again")
    from .checkpoint import check_state_dict

    cfg = read_config(path)
    check_state_dict(read_state_dict(path), cfg, str(path))


def fetch(dest: str | Path, repo_id: str | None = None, revision: str | None = None,
          local_dir: str | Path | None = None, sha256s: dict[str, str] | None = None) -> Path:
    """Materialise a verified checkpoint at ``dest`` (atomically) from the hub or a local directory."""
    dest = Path(dest)
    with _atomic_dir(dest) as tmp:
        if local_dir is not None:
            for f in Path(local_dir).iterdir():
                if f.is_file() and any(f.match(p) for p in ALLOW):
                    shutil.copy2(f, tmp / f.name)
        else:
            if not revision:
                raise CheckpointError(f"source.revision is required for {repo_id}: pin a commit so reruns "
                                      "download the same weights")
            from huggingface_hub import snapshot_download

            snapshot_download(repo_id=repo_id, revision=revision, local_dir=tmp, allow_patterns=ALLOW)
            for junk in tmp.glob(".cache"):
                shutil.rmtree(junk, ignore_errors=True)
        verify(tmp, sha256s)
        (tmp / "source.json").write_text(json.dumps({"repo_id": repo_id, "revision": revision,
                                                     "local_dir": str(local_dir) if local_dir else None,
                                                     "sha256": manifest(tmp)}, indent=2))
    return dest
