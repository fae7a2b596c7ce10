# Stage 4 + 6: benchmark evaluation of every model (teacher, untrained sharing baselines,
# untrained MELT, every trained run) on every task.


rule eval:
    input:
        model=lambda wc: model_checkpoint(wc.model),
        data=lambda wc: teacher_inputs().get("test", []),
    output:
        f"{OUT}/eval/{{model}}/{{task}}.json",
    params:
        task=lambda wc: config["eval"]["tasks"][wc.task],  # as params: a changed setting reruns the eval
        prefill_chunk=config["eval"].get("prefill_chunk"),
        backend=config["eval"].get("backend", "lighteval"),
        mlflow=lambda wc: mlflow_spec("eval", model=wc.model, task=wc.task),
    threads: 1
    log:
        f"{OUT}/logs/eval-{{model}}-{{task}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval-{{model}}-{{task}}.tsv"
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
