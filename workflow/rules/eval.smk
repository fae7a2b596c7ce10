# Stage 4 + 6: benchmark evaluation of every model (teacher, untrained sharing baselines,
# untrained MELT, every trained run) on every task. One job per model writes one JSON per task
# (the model is loaded once; on a GPU cluster, one job per model is also the natural unit).


rule eval:
    input:
        unpack(lambda wc: eval_inputs(wc.model)),
    output:
        expand(f"{OUT}/eval/{{{{model}}}}/{{task}}.json", task=TASKS),
    params:
        tasks=config["eval"]["tasks"],  # as params: a changed setting reruns the eval
        prefill_chunk=config["eval"].get("prefill_chunk"),
        backend=config["eval"].get("backend", "lighteval"),
        device=config["eval"].get("device", "auto"),
        dtype=config["eval"].get("dtype", "auto"),
        seed=config["eval"].get("seed", 0),
        batch_size=config["eval"].get("batch_size", 64),
        template=config["train"]["template"],
        mlflow=lambda wc: mlflow_spec("eval", model=wc.model),
    threads: 1
    log:
        f"{OUT}/logs/eval-{{model}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval-{{model}}.tsv"
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
