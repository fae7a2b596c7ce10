"""Rule phase: one phase of a (gate, recipe path) run, resolved into a TrainConfig and launched
(in-process, submitit local, or one submitit SLURM job that this rule waits for). The phase
continues from the previous phase's final checkpoint (``init_from``), the first from the
converted model."""

import json
import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.modeling.config import LEARNED_GATES
from melt_core.tracking import config_hash
from melt_core.training.launch import launch

sm = snakemake
gate, path, seed = sm.wildcards.gate, sm.wildcards.path, sm.params.seed
base = dict(sm.params.train)
template = base.pop("template")
seq_len = base.pop("seq_len")
loss_on = base.pop("loss_on")
base.pop("share_teacher_logits", None)  # the rule's teacher_cache param says where, when set
first = "/" not in path
train_cfg = {
    **base,
    "student": sm.input.start,
    "init_from": None if first else sm.input.start,
    "teacher": sm.input.teacher,
    "out_dir": sm.params.run_dir,
    "seed": seed,  # data order, dropout-free RNG streams; the gates' init came from this seed's conversion
    "run_name": f"training {gate} {path} seed {seed}",
    "teacher_cache": sm.params.teacher_cache,
    "progress": True,
    # rule train_data's mixture or the embedded task's split; the tokenizer is the teacher's own
    "data": {"sources": [{"kind": "jsonl", "path": sm.input.data, "schema": "chat"}],
             "tokenizer": sm.input.teacher, "template": template, "seq_len": seq_len, "loss_on": loss_on},
    "phases": sm.params.phases,
    **sm.params.switches,  # the recipe's switches: kd_loops, chunk_size
}
if gate not in LEARNED_GATES:
    train_cfg["lr_gate"] = None  # parameter-free gates have nothing to give a learning rate to

with rule_context(sm, "train") as log:
    Path(sm.params.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(sm.params.run_dir) / "resolved_train_config.json").write_text(json.dumps(train_cfg, indent=2))
    tags = {**sm.params.mlflow.get("tags", {}), "rule": sm.rule, "config_hash": config_hash(sm.config)}
    # the training child, sampling CPU/GPU/memory use while it trains
    train_cfg["mlflow"] = {**sm.params.mlflow, "parent_run_id": log.run_id, "tags": tags, "system_metrics": True}
    log.log_dataset(sm.input.data, "training")
    final = launch(train_cfg, sm.params.launcher)
    log.log_metrics({"done": 1})
    print(f"final checkpoint: {final}")
