"""Rule train_data: the training mixture, fetched and sampled where the hub is reachable.

Each source (config train_data.sources) is read through ``datasets`` (a hub name, or a local copy
in the hub's format), normalised to chat records, mixed by weight over ``total`` records with the
training seed, and written as one JSONL that the training jobs read offline.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.data import load_mixture, write_jsonl

with rule_context(snakemake, "data") as log:
    spec = snakemake.params.train_data
    if not spec:
        raise ValueError("config has no train_data block: the embedded task's data comes from rule task_data")
    total, seed = spec["total"], spec["seed"]
    sources = [{**s, "total": total} for s in spec["sources"]] if total else spec["sources"]
    records = load_mixture(sources, seed=seed)
    out = Path(snakemake.output.records)
    write_jsonl(out, records)
    counts = {s.get("name") or s.get("path"): s.get("weight", 1.0) for s in spec["sources"]}
    manifest = {"records": len(records), "total": total, "sources": counts, "seed": seed}
    tmp = Path(snakemake.output.manifest).with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(snakemake.output.manifest)
    log.log_params({"records": len(records), "total": total})
    print(f"{len(records)} training records from {len(spec['sources'])} sources -> {out}")
