"""Rule plan: the config's cost plan (melt_core/ops/plan.py) as plan.md, and on the terminal."""

import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.ops.plan import plan, render

with rule_context(snakemake, "report") as log:
    jobs, assumptions = plan(snakemake.params.config, snakemake.params.models, snakemake.params.phase_jobs,
                             snakemake.params.exit_models, set(snakemake.params.native_models))
    text = render(jobs, assumptions, snakemake.params.config["name"])
    out = Path(snakemake.output[0])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    log.log_metrics({"gpu_hours": sum(j.gpu_hours for j in jobs)})
    print(text)
    print(text, file=sys.__stdout__)  # also where the user who asked for it looks
