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
