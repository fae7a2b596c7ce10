"""Rule benchmark_data: fetch every lighteval benchmark's dataset into the Hugging Face cache
(where the hub is reachable) and record what was fetched, so the eval jobs can run offline."""

import json
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.evaluation.lighteval_tasks import prefetch

with rule_context(snakemake, "data") as log:
    manifest = prefetch(snakemake.params.tasks)
    for name, rows in manifest.items():
        print(name, rows)
    log.log_params({name: json.dumps(v) for name, v in manifest.items()})
    out = Path(snakemake.output[0])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(out)
