# Stage 2: Ouro -> MELT conversion, one initial checkpoint per gate variant and training seed
# (the seed draws the gates' random initialisation).


rule convert:
    """Ouro -> MELT: the teacher's weights plus freshly initialised gates of one variant."""
    input:
        lambda wc: teacher_dir(wc.seed),
    output:
        directory(init_dir("{gate}", "{seed}")),
    params:
        convert=config["convert"],
        seed=lambda wc: int(wc.seed),
        mlflow=lambda wc: mlflow_spec("convert", gate=wc.gate, seed=wc.seed),
    priority: 5  # seconds each, and training waits for them (priorities: workflow/rules/train.smk)
    log:
        f"{OUT}/logs/seed{{seed}}/convert-{{gate}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/convert.py"
