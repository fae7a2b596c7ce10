"""Rules eval and eval_model: one model on one task (eval_model: on each of its tasks in turn,
the model loaded once) -> one results JSON per task (per-sample details + metrics).

Model ids: ouro (teacher, per-loop cache), ouro-{first,last}-loop[+prompt] (the untrained
sharing baselines of Table 5), melt-untrained (converted, no training), melt-{gate}__{recipe},
dense-{name} (a dense hub baseline such as Qwen3-1.7B, sampled by the same code).
Tasks: a local JSONL (`path`, or the embedded task's `split`) or lighteval's own definition
(`lighteval: <module>/<task>`, data fetched by rule benchmark_data).
"""

import sys

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from eval_common import load_eval_model

from melt_core.evaluate import TaskSpec

sm = snakemake
model = None  # loaded by the first task, reused by the others (rule eval_model)
shard = sm.wildcards.get("shard", "")
for i, (task_name, task_cfg) in enumerate(sm.params.tasks.items()):  # rule eval: one task (or shard)
    name = " ".join(p for p in ("eval", sm.wildcards.model, task_name, shard) if p)
    with rule_context(sm, "eval", run_name=name, log_index=i, tags={"task": task_name}) as log:
        spec, model, device, run = load_eval_model(sm, log, task_cfg, model=model, exit=sm.params.exit)
        out, task_cfg = sm.output[i], dict(task_cfg)
        task = TaskSpec(name=task_name, template=sm.params.template, **task_cfg)
        log.log_params({f"{task_name}.{k}": v for k, v in task_cfg.items()})
        result = run(spec, task, out, seed=sm.params.seed, batch_size=sm.params.batch_size, logger=log,
                     model=model, device=device)
        log.log_artifact(out, "results")  # every question's prompt, completions and scores
        print(task_name, result["metrics"])
