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

from melt_core.evaluate import (
    ModelSpec,
    TaskSpec,
    evaluate,
    evaluate_lighteval,
    load_model,
    resolve_device,
    resolve_dtype,
    resolve_memory_budget,
)

sm = snakemake
model_id = sm.wildcards.model
spec = ModelSpec(name=model_id, path=sm.input.model, prefill_chunk=sm.params.prefill_chunk,
                 exit=sm.params.exit)
if model_id.startswith("ouro-"):
    mode = model_id.removeprefix("ouro-")
    spec.cache_mode, spec.keep_prompt = mode.removesuffix("+prompt"), mode.endswith("+prompt")
run = evaluate_lighteval if sm.params.backend == "lighteval" else evaluate

with rule_context(sm, "eval") as log:
    device = resolve_device(sm.params.device)
    dtype = resolve_dtype(sm.params.dtype, device)
    log.log_params({"model": model_id, "cache_mode": spec.cache_mode, "keep_prompt": spec.keep_prompt,
                    "prefill_chunk": spec.prefill_chunk, "backend": sm.params.backend, "device": device,
                    "dtype": str(dtype).removeprefix("torch.")})
    model = load_model(spec, device, dtype)
    spec.memory_budget_gb = resolve_memory_budget(sm.params.memory_budget_gb, device, model)
    log.log_params({"memory_budget_gb": spec.memory_budget_gb})
    out, task_name = sm.output[0], sm.wildcards.task
    task_cfg = dict(sm.params.task)
    task = TaskSpec(name=task_name, template=sm.params.template, **task_cfg)
    log.log_params({f"{task_name}.{k}": v for k, v in task_cfg.items()})
    result = run(spec, task, out, seed=sm.params.seed, batch_size=sm.params.batch_size, logger=log,
                 model=model, device=device)
    print(task_name, result["metrics"])
