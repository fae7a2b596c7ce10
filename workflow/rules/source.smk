# Stage 1: the Ouro teacher. Embedded default: make the synthetic task and pretrain a tiny
# Ouro-architecture teacher on it. Paper config: download the hub snapshot at a pinned
# revision and verify its checksums, or verify a local directory instead.


rule task_data:
    output:
        train=f"{OUT}/data/train.jsonl",
        test=f"{OUT}/data/test.jsonl",
        tokenizer=directory(f"{OUT}/data/tokenizer"),
    params:
        task=config["source"].get("task"),
        mlflow=mlflow_spec("data"),
    log:
        f"{OUT}/logs/task_data.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/task_data.py"


rule teacher:
    input:
        unpack(lambda wc: teacher_inputs()),
    output:
        directory(f"{OUT}/checkpoints/ouro"),
    params:
        source=config["source"],
        mlflow=mlflow_spec("source"),
    threads: 2
    # a hub download runs where snakemake runs (the login node, with internet); pretraining is compute
    localrule: config["source"]["kind"] != "pretrain"
    log:
        f"{OUT}/logs/teacher.log",
    benchmark:
        f"{OUT}/benchmarks/teacher.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/teacher.py"


# Downloads run where snakemake runs (a login node with internet), not on compute nodes; every
# other job runs with HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 (workflow/scripts/common.py).
localrules:
    dense_baseline,
    benchmark_data,
    train_data,


rule train_data:
    """The paper's SFT mixture (config train_data), fetched, sampled and normalised to chat records
    on the login node, so training jobs read one local JSONL and never the hub."""
    output:
        records=f"{OUT}/data/sft_mixture.jsonl",
        manifest=f"{OUT}/data/sft_mixture.json",
    params:
        train_data=config.get("train_data"),
        seed=config["train"]["seed"],
        mlflow=mlflow_spec("data"),
    log:
        f"{OUT}/logs/train_data.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/train_data.py"


rule dense_baseline:
    output:
        directory(f"{OUT}/checkpoints/dense-{{dense}}"),
    params:
        source=lambda wc: {"kind": "hub", **DENSE[wc.dense]},
        mlflow=lambda wc: mlflow_spec("source", model=f"dense-{wc.dense}"),
    log:
        f"{OUT}/logs/dense-{{dense}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/teacher.py"


rule benchmark_data:
    output:
        f"{OUT}/data/benchmarks.json",
    params:
        tasks=LIGHTEVAL_TASKS,
        mlflow=mlflow_spec("data"),
    log:
        f"{OUT}/logs/benchmark_data.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/benchmark_data.py"
