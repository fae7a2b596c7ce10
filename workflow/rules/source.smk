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
    log:
        f"{OUT}/logs/teacher.log",
    benchmark:
        f"{OUT}/benchmarks/teacher.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/teacher.py"


# Downloads run where snakemake runs (a login node with internet), not on compute nodes.
localrules:
    dense_baseline,
    benchmark_data,


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
