# Stage 3 + 5: chunk-wise training, one job per phase. A recipe is a path of phases
# (recipe_path: e.g. phase1/phase2); each phase continues from the previous phase's final
# checkpoint (weights, optimizer state, step: train.handoff), the first from the converted model.
# Runs whose recipes share a prefix share those phases' outputs: the element-wise gate's
# no_align run IS Phase 1 of its full run. A changed phase setting reruns that phase and what
# follows it, nothing upstream. Every run trains once per seed of `seeds` (runs/seed{seed}/...), from
# that seed's conversion, with that seed's data order and RNG. On SLURM a phase job runs on the submit node and submits one
# submitit job (multi-GPU, checkpoint-and-requeue) that it waits for.


rule phase:
    """Train one phase of a (gate, recipe path), continuing from the phase before it."""
    input:
        start=lambda wc: phase_start(wc.gate, wc.path, wc.seed),
        teacher=lambda wc: teacher_dir(wc.seed),
        data=lambda wc: train_records(),
    output:
        directory(f"{phase_dir('{gate}', '{path}', '{seed}')}/final"),
    params:
        run_dir=phase_dir("{gate}", "{path}", "{seed}"),
        # train.share_teacher_logits: where the seed's runs keep the teacher's logits (melt_core/training/train.py)
        teacher_cache=lambda wc: f"{OUT}/runs/seed{wc.seed}/teacher_logits"
        if config["train"]["share_teacher_logits"] else None,
        seed=lambda wc: int(wc.seed),
        # everything that shapes this phase (and, upstream, the phases before it)
        train=config["train"],
        phases=lambda wc: path_phases(wc.path),
        switches=lambda wc: last_phase(wc.path)[1],
        launcher=config["launcher"],
        mlflow=lambda wc: mlflow_spec("train", gate=wc.gate, phase=last_phase(wc.path)[0], path=wc.path, seed=wc.seed),
    # one thread: the tiny models gain nothing from a second (30 steps took 20.7 s either way here),
    # so on 2 cores two phases train side by side; on a cluster the submitit job sets its own
    threads: 1
    # Where jobs wait for cores: the long jobs first (teacher 10, conversions 5, the early-exit sweeps 4,
    # phases 3, profiling 1), the ~20 s evals (0) fill the gaps and the end, so the last minutes are
    # short jobs side by side rather than one phase training alone
    priority: 3
    localrule: config["launcher"]["backend"] == "slurm"
    log:
        f"{OUT}/logs/seed{{seed}}/phase-{{gate}}/{{path}}.log",
    benchmark:
        f"{OUT}/benchmarks/seed{{seed}}/phase-{{gate}}/{{path}}.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/train.py"


rule main_run:
    input:
        [f"{run_dir(MAIN_RUN, s)}/final" for s in SEEDS],


rule gate_ablation:
    input:
        [f"{run_dir(r, s)}/final" for r in GATE_RUNS for s in SEEDS],


rule recipe_ablation:
    input:
        [f"{run_dir(r, s)}/final" for r in RECIPE_RUNS for s in SEEDS],
