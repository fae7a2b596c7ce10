"""Rule early_exit: one model decodes the sweep's task under every exit rule; per rule its
accuracy (with every question's score), loops per generated token and tokens/s (of the whole
generation, prefill included, after a discarded warm-up). For MELT with
``exit_gate_steps`` > 0 the sweep runs again with the exit gate refit to MELT's own hidden states
(Ouro's Stage-II objective on the training records), since the converted gate was fit to Ouro's."""

import copy
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, snakemake.scriptdir)
from common import rule_context
from eval_common import load_eval_model

from melt_core.data import PackedData, load_tokenizer, read_jsonl
from melt_core.evaluation.evaluate import TaskSpec
from melt_core.modeling.early_exit import ExitRule, train_exit_gate
from melt_core.tracking import stamp

sm = snakemake
sweep = sm.params.sweep

with rule_context(sm, "early_exit") as log:
    (task_name, task_cfg), = sm.params.tasks.items()
    (model_id, member), = sm.params.models.items()
    # each rule sets its exit; real early exit is melt_core's engine (vLLM runs every loop of every token)
    spec, model, device, run = load_eval_model(sm, log, task_cfg, model_id, member, engine="native")
    limit = sweep["limit"] or task_cfg.get("limit")  # the sweep's, else the task's own (if it has one)
    task = TaskSpec(name=task_name, template=sm.params.template, **{**task_cfg, "limit": limit})
    rules = [ExitRule.from_dict(r) for r in sweep["rules"]]  # refused here, before any decoding
    variants = [("converted gate" if model.config.is_melt else "trained gate", model)]
    steps = sweep["exit_gate_steps"]
    if steps and model.config.is_melt:
        tok = load_tokenizer(sm.input.model)
        data = PackedData.build(read_jsonl(sm.input.train), tok, sm.params.template, sm.params.seq_len,
                                seed=sm.params.seed)
        refit = copy.deepcopy(model).to(device)
        batch = sweep["exit_gate_batch"]
        # exit_gate_group: the frozen model's forward over that many steps' batches at once, the same
        # fit (melt_core.modeling.early_exit.train_exit_gate)
        losses = train_exit_gate(refit, lambda s: tuple(t.to(device) for t in data.batch(s, batch)), steps,
                                 sweep["exit_gate_lr"], log, prefix="early_exit/exit_gate",
                                 group=sweep["exit_gate_group"])
        stamp(f"exit gate refit: {steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        refit.eval()
        variants.append(("refit gate", refit))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # a discarded warm-up on two questions, so the first rule timed does not pay for start-up
        run(spec, replace(task, limit=2), Path(tmp) / "warm-up.json", seed=sm.params.seed,
            batch_size=sm.params.batch_size, model=model, device=device)
        for variant, m in variants:
            for rule in rules:
                res = run(replace(spec, exit=rule.as_dict()), task, Path(tmp) / "result.json", seed=sm.params.seed,
                          batch_size=sm.params.batch_size, model=m, device=device)
                metric = f"pass@{min(task.ks)}"
                rows.append({"model": spec.name, "variant": variant, "rule": rule.as_dict(), "label": rule.label(),
                             "metric": metric, "accuracy": 100 * res["metrics"][metric],
                             "mean_loops": res["mean_loops"], "loops": model.num_loops,
                             "generated_tokens": res["generated_tokens"], "seconds": res["seconds"],
                             "tokens_per_s": res["generated_tokens"] / res["seconds"],
                             "per_question": [100 * d["scores"][metric] for d in res["details"]]})
                stamp(f"{spec.name} [{variant}] {rule.label()}: {metric} {rows[-1]['accuracy']:.1f}%, "
                      f"{res['mean_loops']:.2f} loops/token, {rows[-1]['tokens_per_s']:.1f} tok/s")
                log.log_metrics({f"{variant}/{rule.label()}/accuracy": rows[-1]["accuracy"],
                                 f"{variant}/{rule.label()}/mean_loops": res["mean_loops"]})
    out = Path(sm.output[0])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model": spec.name, "task": task.name, "batch_size": sm.params.batch_size,
                               "device": device, "rows": rows}, indent=1))
    tmp.replace(out)
    log.log_artifact(out, "results")
