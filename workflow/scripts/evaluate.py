"""Rule eval: one (model, task) pair -> one results JSON (per-sample details + metrics).

Model ids: ouro (teacher, per-loop cache), ouro-{first,last}-loop[+prompt] (the untrained
sharing baselines of Table 5), melt-untrained (converted, no training), melt-{gate}__{recipe}.
"""

import sys
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context

from melt_core.evaluate import ModelSpec, TaskSpec, evaluate, evaluate_lighteval

sm = snakemake
model_id, task_name = sm.wildcards.model, sm.wildcards.task
ev = sm.config["eval"]
task_cfg = dict(sm.params.task)
split = task_cfg.pop("split", "test")
path = task_cfg.pop("path", None) or str(Path(sm.config["outdir"]) / "data" / f"{split}.jsonl")
task = TaskSpec(name=task_name, path=path, template=sm.config["train"]["template"], **task_cfg)

spec = ModelSpec(name=model_id, path=sm.input.model, prefill_chunk=sm.params.prefill_chunk)
if model_id.startswith("ouro-"):
    mode = model_id.removeprefix("ouro-")
    spec.cache_mode, spec.keep_prompt = mode.removesuffix("+prompt"), mode.endswith("+prompt")

with rule_context(sm, "eval") as log:
    log.log_params({"model": model_id, "task": task_name, "cache_mode": spec.cache_mode,
                    "keep_prompt": spec.keep_prompt, "prefill_chunk": spec.prefill_chunk, **task_cfg})
    backend = getattr(sm.params, "backend", "lighteval")
    run = evaluate_lighteval if backend == "lighteval" else evaluate
    result = run(spec, task, sm.output[0], seed=ev.get("seed", 0), batch_size=ev.get("batch_size", 64), logger=log)
    print(result["metrics"])
