"""Rule train: resolve one (gate, recipe) run into a TrainConfig and launch it (in-process,
submitit local, or one submitit SLURM job that this rule waits for)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.launch import launch

sm = snakemake
cfg = sm.config
gate, recipe_name = sm.wildcards.gate, sm.wildcards.recipe
recipe = dict(sm.params.recipe)
base = dict(sm.params.train)
template = base.pop("template")
seq_len = base.pop("seq_len")
loss_on = base.pop("loss_on")
sources = [{"kind": "jsonl", "path": sm.input.data, "schema": "chat"}]  # rule train_data's or task_data's
train_cfg = {
    **base,
    "student": sm.input.student,
    "teacher": sm.input.teacher,
    "out_dir": sm.params.run_dir,
    "run_name": f"train:{gate}__{recipe_name}",
    "progress": True,
    "data": {"sources": sources, "tokenizer": cfg.get("train_data", {}).get("tokenizer", sm.input.teacher),
             "template": template, "seq_len": seq_len, "loss_on": loss_on},
    "phases": [{"name": p, **sm.params.phases[p]} for p in recipe.pop("phases")],
    **recipe,  # the recipe's switches: kd_loops, chunk_size
}
if gate not in ("elementwise", "scalar"):
    train_cfg["lr_gate"] = None  # parameter-free gates have nothing to give a learning rate to
train_cfg["mlflow"] = sm.params.mlflow

with rule_context(sm, "train") as log:
    Path(sm.params.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(sm.params.run_dir) / "resolved_train_config.json").write_text(json.dumps(train_cfg, indent=2))
    train_cfg["mlflow"] = {**sm.params.mlflow, "parent_run_id": log.run_id}
    final = launch(train_cfg, sm.params.launcher)
    log.log_metrics({"done": 1})
    print(f"final checkpoint: {final}")
