"""Rule resolved_config: write the config this run resolved to (after layering), atomically."""

import sys
from pathlib import Path

import yaml

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

with rule_context(snakemake, "report") as log:
    out = Path(snakemake.output[0])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(snakemake.params.config, sort_keys=False))
    tmp.replace(out)
    log.log_artifact(out)
