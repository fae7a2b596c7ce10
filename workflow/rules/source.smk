# Stage 1: the Ouro teacher and the data. Embedded default: make the synthetic task and pretrain a
# tiny Ouro-architecture teacher on it (pretrain_teacher). Paper config: download the hub snapshot
# at a pinned revision and verify its checksums, or verify a local directory instead (download).


rule task_data:
    """The embedded default's synthetic task (train/test JSONL) and its tokenizer."""
    output:
        **{k: directory(v) if k == "tokenizer" else v for k, v in teacher_inputs().items()},
    params:
        task=config["source"].get("task"),
        mlflow=mlflow_spec("data"),
    # The teacher's two threads although it needs one, for the few seconds it runs: profiling (ready
    # from the start too) must not take a core now, or the teacher, which every training job waits
    # for, waits for the profiling job to end (it did: 1.2 min of the embedded DAG)
    threads: 2
    priority: 10
    log:
        f"{OUT}/logs/task_data.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/task_data.py"


if config["source"]["kind"] == "pretrain":

    _seed = "seed{seed}/" if PER_SEED_TEACHER else ""  # one teacher per training seed, or one

    rule pretrain_teacher:
        """The embedded default's teacher: a tiny Ouro-architecture LoopLM pretrained on the synthetic task
        (one per training seed with source.pretrain.per_seed)."""
        input:
            unpack(lambda wc: teacher_inputs()),
        output:
            directory(teacher_dir("{seed}")),
        params:
            pretrain=lambda wc: teacher_pretrain(getattr(wc, "seed", None)),
            mlflow=lambda wc: mlflow_spec("source", **({"seed": wc.seed} if PER_SEED_TEACHER else {})),
        # Two threads for one teacher; one each where every seed has its own, so two train side by side
        # on two cores (one teacher's step on two threads is ~1.7x, not 2x, as fast as on one). The pins
        # give the same bits at any thread count (docs/REPRODUCIBILITY.md)
        threads: 1 if PER_SEED_TEACHER else 2
        priority: 10  # every training job waits for it; profiling (which does not) comes after
        log:
            f"{OUT}/logs/{_seed}pretrain_teacher.log",
        benchmark:
            f"{OUT}/benchmarks/{_seed}pretrain_teacher.tsv"
        conda:
            "../../envs/melt.yaml"
        script:
            "../scripts/pretrain_teacher.py"


# Downloads run where snakemake runs (a login node with internet), not on compute nodes; every
# other job runs with HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 (workflow/scripts/common.py).
localrules:
    download,
    benchmark_data,
    train_data,


rule train_data:
    """The paper's SFT mixture (config train_data), fetched, sampled and normalised to chat records
    on the login node, so training jobs read one local JSONL and never the hub."""
    output:
        records=f"{OUT}/data/sft_mixture.jsonl",
        manifest=f"{OUT}/data/sft_mixture.json",
    params:
        train_data=config.get("train_data"),  # an optional block (the paper's); the rule runs only with it
        mlflow=mlflow_spec("data"),
    log:
        f"{OUT}/logs/train_data.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/train_data.py"


rule download:
    """A hub checkpoint at its pinned revision, checked against its sha256 manifest: the Ouro teacher
    (source.kind hub, or a verified local directory) and the dense baselines (Qwen3-1.7B)."""
    output:
        directory(f"{OUT}/checkpoints/{{name}}"),
    wildcard_constraints:
        name=one_of(DOWNLOADS) if DOWNLOADS else "(?!)",
    params:
        source=lambda wc: DOWNLOADS[wc.name],
        mlflow=lambda wc: mlflow_spec("source", model=wc.name),
    log:
        f"{OUT}/logs/download-{{name}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/download.py"


rule benchmark_data:
    """Every lighteval benchmark's dataset fetched into the Hugging Face cache on the login node."""
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
