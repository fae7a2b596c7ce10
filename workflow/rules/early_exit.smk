# Real early exit (melt_core/modeling/early_exit.py; the paper names it future work for MELT): each model
# of early_exit.models decodes early_exit.task under every rule of early_exit.rules, measuring
# accuracy, loops per token and tokens/s; for MELT optionally again with its exit gate refit to its
# own hidden states (Ouro's Stage-II objective). One job per model.


rule early_exit:
    """A threshold sweep of real early exit for one model: accuracy, mean loops, tokens/s per rule."""
    input:
        unpack(lambda wc: {**eval_inputs(wc.model), "train": train_records()}),
    output:
        f"{OUT}/early_exit/{{model}}.json",
    wildcard_constraints:
        model=one_of(EXIT_MODELS),
    params:
        **eval_params({config["early_exit"]["task"]: eval_task_settings(config["early_exit"]["task"])},
                      lambda wc: [wc.model]),
        sweep={k: v for k, v in config["early_exit"].items() if k not in ("models", "task")},
        seq_len=config["train"]["seq_len"],
        mlflow=lambda wc: mlflow_spec("early_exit", **model_tags(wc.model)),
    threads: 1
    priority: 4  # minutes, and it waits for the main run: it starts the moment that run ends
    log:
        f"{OUT}/logs/early_exit-{{model}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/early_exit.py"


rule early_exit_sweeps:
    input:
        expand(f"{OUT}/early_exit/{{model}}.json", model=EXIT_MODELS),
