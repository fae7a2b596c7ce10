# Stage 3 + 5: chunk-wise training. One generic rule trains any (gate, recipe) run; the gate
# (Table 3) and recipe (Table 4) ablations are the runs listed by training_runs().
# On SLURM the rule runs locally and submits one submitit job (see profiles/slurm).


rule train:
    input:
        student=f"{OUT}/checkpoints/melt-init-{{gate}}",
        teacher=teacher_dir(),
        data=lambda wc: train_records(),
    output:
        directory(f"{OUT}/runs/{{gate}}__{{recipe}}/final"),
    params:
        run_dir=f"{OUT}/runs/{{gate}}__{{recipe}}",
        # everything that shapes the run, so a changed setting retrains it
        train=config["train"],
        recipe=lambda wc: config["recipes"][wc.recipe],
        phases=lambda wc: {p: config["phases"][p] for p in config["recipes"][wc.recipe]["phases"]},
        launcher=config["launcher"],
        mlflow=lambda wc: mlflow_spec("train", gate=wc.gate, recipe=wc.recipe,
                                      ablation=f"{wc.gate}__{wc.recipe}"),
    threads: 2
    # With the slurm launcher the rule itself stays on the submit node: it submits one submitit
    # job (multi-GPU, checkpoint-and-requeue) and waits for it.
    localrule: config["launcher"]["backend"] == "slurm"
    log:
        f"{OUT}/logs/train-{{gate}}__{{recipe}}.log",
    benchmark:
        f"{OUT}/benchmarks/train-{{gate}}__{{recipe}}.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/train.py"


rule main_run:
    input:
        f"{OUT}/runs/{config['main_run']['gate']}__{config['main_run']['recipe']}/final",


rule gate_ablation:
    input:
        expand(f"{OUT}/runs/{{gate}}__{config['ablations']['gate_recipe']}/final", gate=GATES),


rule recipe_ablation:
    input:
        expand(f"{OUT}/runs/{config['main_run']['gate']}__{{recipe}}/final",
               recipe=config["ablations"]["recipes"]),
