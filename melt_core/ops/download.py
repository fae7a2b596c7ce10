"""Stage 1 of the paper configuration: fetch an Ouro checkpoint from the hub at a pinned
revision, or take a local directory, and verify it against a checksum manifest.

Only config, safetensors and tokenizer files are fetched; nothing is executed or unpickled
(the hub repos also ship modeling code, which we never download or run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..modeling.checkpoint import (
    CheckpointError,
    _atomic_dir,
    check_digests,
    check_finite,
    check_shapes,
    read_config,
    read_shapes,
    read_state_dict,
    sha256_file,
    write_checksums,
)

ALLOW = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
         "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
         "chat_template.jinja", "added_tokens.json"]


def manifest(path: str | Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint directory (to pin in config after a first download)."""
    path = Path(path)
    return {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file()}


def verify(path: str | Path, expected: dict[str, str] | None) -> None:
    """Checksums (when given) and a structural check: config + every tensor readable and consistent."""
    path = Path(path)
    check_digests(path, expected or {}, "the config's sha256 manifest",
                  "the download is corrupt or the revision changed; delete it and fetch again")
    model_type = json.loads((path / "config.json").read_text()).get("model_type") \
        if (path / "config.json").is_file() else None
    ours = model_type in ("ouro", "melt", None)
    if ours:  # names and shapes against the config too, from the headers before any tensor is read
        check_shapes(read_shapes(path), read_config(path), str(path))
    state = read_state_dict(path)  # every tensor readable
    if ours:
        check_finite(state, str(path))


def fetch(dest: str | Path, repo_id: str | None = None, revision: str | None = None,
          local_dir: str | Path | None = None, sha256s: dict[str, str] | None = None,
          cache_dir: str | Path | None = None) -> Path:
    """Materialise a verified checkpoint at ``dest`` (atomically) from the hub or a local directory.

    Hub snapshots go through the Hugging Face cache (``cache_dir``, default the user's HF cache):
    online they are downloaded into it, offline (``HF_HUB_OFFLINE=1``) a snapshot already there at
    the pinned revision is used. Only then are the allowed files copied to ``dest`` and verified.
    """
    dest = Path(dest)
    if local_dir is None and not revision:
        raise CheckpointError(f"source.revision is required for {repo_id}: pin a commit so reruns "
                              "download the same weights")
    if local_dir is None:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            local_dir = snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=ALLOW,
                                          cache_dir=str(cache_dir) if cache_dir else None)
        except LocalEntryNotFoundError as err:
            raise CheckpointError(f"{repo_id}@{revision}: not in the Hugging Face cache "
                                  f"({cache_dir or 'default location'}) and the hub is unreachable or "
                                  f"HF_HUB_OFFLINE=1 ({err}); download it where the hub is reachable") from None
    with _atomic_dir(dest) as tmp:
        for f in Path(local_dir).iterdir():
            if f.is_file() and any(f.match(p) for p in ALLOW):
                shutil.copyfile(f, tmp / f.name)  # the cache's files are symlinks to blobs: copy content
        verify(tmp, sha256s)
        (tmp / "source.json").write_text(json.dumps({"repo_id": repo_id, "revision": revision,
                                                     "local_dir": str(local_dir) if repo_id is None else None,
                                                     "sha256": manifest(tmp)}, indent=2))
        write_checksums(tmp)  # every later load verifies the copy against these
    return dest
