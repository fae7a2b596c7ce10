# Stage 7: memory and speed profiling at the paper's real shapes, random weights.


rule profile_memory:
    """Weights and KV-cache bytes of one real shape (random weights), measured off the tensors."""
    output:
        f"{OUT}/profile/memory/{{shape}}.json",
    params:
        profile=config["profile"],
        prefill_chunk=config["eval"]["prefill_chunk"],  # MELT prefills as the eval does
        mlflow=lambda wc: mlflow_spec("profile", shape=wc.shape),
    threads: 1  # bytes, not time: it may share the machine (profile_speed has it to itself)
    priority: 1  # after the teacher and training (workflow/rules/train.smk), before the evals
    resources:
        mem_mb=16000,
    log:
        f"{OUT}/logs/profile-memory-{{shape}}.log",
    benchmark:
        f"{OUT}/benchmarks/profile-memory-{{shape}}.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/profile_memory.py"


rule profile_speed:
    """Decode/prefill speed, loop and window sweeps, and training throughput, side by side."""
    output:
        speed=f"{OUT}/profile/speed.json",
        sweeps=f"{OUT}/profile/sweeps.json",
        train=f"{OUT}/profile/train_throughput.json",
    params:
        profile=config["profile"],
        prefill_chunk=config["eval"]["prefill_chunk"],  # MELT prefills as the eval does
        mlflow=mlflow_spec("profile", part="speed"),
    threads: 2
    priority: 1
    log:
        f"{OUT}/logs/profile-speed.log",
    benchmark:
        f"{OUT}/benchmarks/profile-speed.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/profile_speed.py"


rule profiles:
    input:
        profile_outputs(),
