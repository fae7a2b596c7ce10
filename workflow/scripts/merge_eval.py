"""Rule merge_eval: a sharded task's shard results -> one result JSON, as an unsharded run writes it."""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.evaluation.evaluate import merge_shards

with rule_context(snakemake, "eval") as log:
    result = merge_shards(list(snakemake.input), snakemake.output[0], log)
    log.log_artifact(snakemake.output[0], "results")
    print(snakemake.wildcards.task, result["metrics"], f"{result['shards']} shards")
