"""Rule teacher: the Ouro checkpoint every later stage starts from.

source.kind = pretrain: pretrain the tiny teacher on the synthetic task (embedded default);
hub: download repo_id at a pinned revision and verify checksums; local: verify a directory.
"""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.download import fetch
from melt_core.pretrain import PretrainConfig, pretrain

source = snakemake.params.source
out = snakemake.output[0]
with rule_context(snakemake, "source") as log:
    kind = source["kind"]
    if kind == "pretrain":
        cfg = PretrainConfig(train_file=snakemake.input.train, test_file=snakemake.input.test,
                             tokenizer=snakemake.input.tokenizer, out_dir=out, **source["pretrain"])
        report = pretrain(cfg, log)
        print(f"teacher greedy exact-match on held-out: {report['exact_match']:.3f}")
    elif kind in ("hub", "local"):
        fetch(out, repo_id=source.get("repo_id"), revision=source.get("revision"),
              local_dir=source.get("local_dir"), sha256s=source.get("sha256"), cache_dir=source.get("cache_dir"))
        log.log_params({k: v for k, v in source.items() if k != "sha256"})
    else:
        raise ValueError(f"source.kind {kind!r} unknown; use pretrain, hub or local")
