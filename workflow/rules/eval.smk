# Stage 4 + 6: benchmark evaluation of every model (teacher, untrained sharing baselines,
# untrained MELT, every trained run) on every task: one job per (model, task), so on a cluster the
# ten benchmarks of a model run side by side on ten GPUs (one job per model ran them in sequence,
# days of 32K-token sampling against the profile's 24-hour limit), and a changed task setting
# reruns only that task's jobs.


rule eval:
    """Evaluate one model on one task: one results JSON (metrics and every question's samples)."""
    input:
        unpack(lambda wc: eval_inputs(wc.model)),
    output:
        f"{OUT}/eval/{{model}}/{{task}}.json",
    params:
        task=lambda wc: eval_task_settings(wc.task),  # as params: a changed setting reruns it
        prefill_chunk=lambda wc: model_prefill(wc.model),
        backend=config["eval"].get("backend", "lighteval"),
        device=config["eval"].get("device", "auto"),
        dtype=config["eval"].get("dtype", "auto"),
        seed=config["eval"].get("seed", 0),
        batch_size=config["eval"].get("batch_size", 64),  # at most; fewer where memory says so
        memory_budget_gb=config["eval"].get("memory_budget_gb"),
        template=config["train"]["template"],
        exit=config["eval"].get("exit"),  # early exit of decoded tokens; a task's own `exit` goes over it
        mlflow=lambda wc: mlflow_spec("eval", task=wc.task, **model_tags(wc.model)),
    threads: 1
    log:
        f"{OUT}/logs/eval-{{model}}/{{task}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval-{{model}}/{{task}}.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/evaluate.py"


rule sharing_baselines:
    input:
        expand(f"{OUT}/eval/ouro-{{s}}/{{task}}.json", s=SHARING, task=TASKS),


rule evals:
    input:
        eval_outputs(),
