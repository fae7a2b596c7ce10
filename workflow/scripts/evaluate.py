"""Rule eval: one model on one task -> one results JSON (per-sample details + metrics).

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

with rule_context(sm, "eval") as log:
    spec, model, device, run = load_eval_model(sm, log, exit=sm.params.exit)
    out, task_name = sm.output[0], sm.wildcards.task
    task_cfg = dict(sm.params.task)
    task = TaskSpec(name=task_name, template=sm.params.template, **task_cfg)
    log.log_params({f"{task_name}.{k}": v for k, v in task_cfg.items()})
    result = run(spec, task, out, seed=sm.params.seed, batch_size=sm.params.batch_size, logger=log,
                 model=model, device=device)
    log.log_artifact(out, "results")  # every question's prompt, completions and scores
    print(task_name, result["metrics"])
