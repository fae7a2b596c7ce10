"""Rules eval, eval_model, eval_seed and eval_teacher: each of the job's models (eval_seed: a training
seed's; eval_teacher: the teacher and its sharing baselines; else one) on each of its tasks (eval: one
task or shard), a model loaded once for its tasks -> one results JSON, log and MLflow run per (model,
task), with per-sample details and metrics.

Model ids as workflow/scripts/model_id.py writes them (the teacher, its untrained sharing
baselines, converted and trained MELT, dense baselines sampled by the same code).
Tasks: a local JSONL (`path`, or the embedded task's `split`) or lighteval's own definition
(`lighteval: <module>/<task>`, data fetched by rule benchmark_data).
"""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from eval_common import load_eval_model

from melt_core.evaluation.evaluate import TaskSpec

sm = snakemake
shard = sm.wildcards.get("shard", "")
tasks = list(sm.params.tasks.items())
for m, (model_id, member) in enumerate(sm.params.models.items()):
    model = None  # loaded by the model's first task, reused by the others
    for i, (task_name, task_cfg) in enumerate(tasks):
        name = " ".join(p for p in ("eval", model_id, task_name, shard) if p)
        with rule_context(sm, "eval", run_name=name, log_index=m * len(tasks) + i,
                          tags={**member["tags"], "task": task_name}) as log:
            spec, model, device, run = load_eval_model(sm, log, task_cfg, model_id, member, model=model,
                                                       exit=sm.params.exit)
            out, task_cfg = sm.output[m * len(tasks) + i], dict(task_cfg)
            task = TaskSpec(name=task_name, template=sm.params.template, **task_cfg)
            log.log_params({f"{task_name}.{k}": v for k, v in task_cfg.items()})
            result = run(spec, task, out, seed=sm.params.seed, batch_size=sm.params.batch_size, logger=log,
                         model=model, device=device)
            log.log_artifact(out, "results")  # every question's prompt, completions and scores
            print(model_id, task_name, result["metrics"])
    if hasattr(model, "close"):  # a vLLM engine: its worker ends with the model's tasks
        model.close()
