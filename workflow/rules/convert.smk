# Stage 2: Ouro -> MELT conversion, one initial checkpoint per gate variant.


rule convert:
    """Ouro -> MELT: the teacher's weights plus freshly initialised gates of one variant."""
    input:
        teacher_dir(),
    output:
        directory(f"{OUT}/checkpoints/melt-init-{{gate}}"),
    params:
        convert=config["convert"],
        mlflow=lambda wc: mlflow_spec("convert", gate=wc.gate),
    log:
        f"{OUT}/logs/convert-{{gate}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/convert.py"
