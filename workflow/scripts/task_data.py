"""Rule task_data: write the synthetic task (train/test JSONL) and its tokenizer."""

import shutil
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.data import make_digit_sum_task

TASKS = {"digit_sum": make_digit_sum_task}

with rule_context(snakemake, "data") as log:
    task = dict(snakemake.params.task)
    kind = task.pop("kind")
    if kind not in TASKS:
        raise ValueError(f"source.task.kind {kind!r} unknown; choose one of {sorted(TASKS)}")
    out = Path(snakemake.output.train).parent
    paths = TASKS[kind](out, **task)
    if Path(snakemake.output.tokenizer) != paths["tokenizer"]:
        shutil.copytree(paths["tokenizer"], snakemake.output.tokenizer, dirs_exist_ok=True)
    log.log_params({"task": kind, **task})
    print(f"wrote {paths}")
