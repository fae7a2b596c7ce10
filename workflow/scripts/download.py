"""Rule download: a hub checkpoint at a pinned revision (through the Hugging Face cache), or a
local directory, copied into place and verified against its sha256 manifest."""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.ops.download import fetch

source = snakemake.params.source
with rule_context(snakemake, "source") as log:
    if source["kind"] not in ("hub", "local"):
        raise ValueError(f"source.kind {source['kind']!r} cannot be downloaded; use hub or local")
    fetch(snakemake.output[0], repo_id=source.get("repo_id"), revision=source.get("revision"),
          local_dir=source.get("local_dir"), sha256s=source.get("sha256"), cache_dir=source.get("cache_dir"))
    log.log_params({k: v for k, v in source.items() if k != "sha256"})
