# Stage 4 + 6: benchmark evaluation of every model (teacher, untrained sharing baselines,
# untrained MELT, every trained run) on every task: one job per (model, task), so on a cluster the
# ten benchmarks of a model run side by side on ten GPUs (one job per model ran them in sequence,
# days of 32K-token sampling against the profile's 24-hour limit), and a changed task setting
# reruns only that task's jobs. A task with `shards: n` splits its questions over n jobs
# ({task}.shard-i-of-n.json, by a hash of each question) that rule merge_eval joins.
# `eval.group_tasks: true` (the embedded default) runs every unsharded task of a model in one job
# (rule eval_model) instead: there a task takes 1-3 s and a job's start (lighteval's import) ~10 s.
# `eval.group_models: true` (the embedded default) goes further: every model of one training seed in
# one job (rule eval_seed; a job ~13 s of imports and MLflow set-up, a model's tasks ~7 s), the teacher
# and its sharing baselines in another (rule eval_teacher). They run after training anyway (the
# phases come first, workflow/rules/train.smk), so nothing waits longer for them.
# Either way each (model, task) is its own results JSON, log and MLflow run.


localrules:
    merge_eval,


ruleorder: merge_eval > eval


rule eval:
    """Evaluate one model on one task (or one shard of its questions): one results JSON."""
    input:
        unpack(lambda wc: eval_inputs(wc.model)),
    output:
        f"{OUT}/eval/{{model}}/{{task}}{{shard}}.json",
    wildcard_constraints:
        shard=r"(|\.shard-\d+-of-\d+)",
    params:
        **eval_params(lambda wc: {wc.task: eval_task_settings(wc.task, wc.shard)}, lambda wc: [wc.model]),
        mlflow=mlflow_spec("eval"),
    threads: 1
    log:
        f"{OUT}/logs/eval-{{model}}/{{task}}{{shard}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval-{{model}}/{{task}}{{shard}}.tsv"
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/evaluate.py"


if GROUPED_TASKS:

    ruleorder: eval_model > eval

    rule eval_model:
        """Evaluate one model on every unsharded task in one job (eval.group_tasks): a JSON, a log
        and an MLflow run per task, as rule eval writes them."""
        input:
            unpack(lambda wc: eval_inputs(wc.model)),
        output:
            [f"{OUT}/eval/{{model}}/{t}.json" for t in GROUPED_TASKS],
        params:
            **eval_params({t: eval_task_settings(t) for t in GROUPED_TASKS}, lambda wc: [wc.model]),
            mlflow=mlflow_spec("eval"),
        threads: 1
        log:
            [f"{OUT}/logs/eval-{{model}}/{t}.log" for t in GROUPED_TASKS],
        benchmark:
            f"{OUT}/benchmarks/eval-{{model}}/all-tasks.tsv"
        conda:
            "../../envs/melt.yaml"
        script:
            "../scripts/evaluate.py"


if GROUPED_MODELS:

    ruleorder: eval_teacher > eval_seed > eval_model > eval

    # one teacher: {seed} is not in its outputs (teacher_models(None)); a teacher per seed: one job a seed,
    # which needs only that seed's teacher (the sharing_baselines target trains no student)
    _teacher = "{seed}" if PER_SEED_TEACHER else None

    rule eval_teacher:
        """The teacher and its untrained sharing baselines on every unsharded task, in one job (one a
        training seed with source.pretrain.per_seed)."""
        input:
            unpack(lambda wc: eval_inputs(*teacher_models(getattr(wc, "seed", None)))),
        output:
            [f"{OUT}/eval/{m}/{t}.json" for m in teacher_models(_teacher) for t in GROUPED_TASKS],
        params:
            **eval_params({t: eval_task_settings(t) for t in GROUPED_TASKS},
                          lambda wc: teacher_models(getattr(wc, "seed", None))),
            mlflow=mlflow_spec("eval"),
        threads: 1
        log:
            [f"{OUT}/logs/eval-{m}/{t}.log" for m in teacher_models(_teacher) for t in GROUPED_TASKS],
        benchmark:
            f"{OUT}/benchmarks/{'seed{seed}/' if PER_SEED_TEACHER else ''}eval-teacher.tsv"
        conda:
            "../../envs/melt.yaml"
        script:
            "../scripts/evaluate.py"

    rule eval_seed:
        """Every model of one training seed (converted, trained, the main run's variants) on every
        unsharded task, in one job."""
        input:
            unpack(lambda wc: eval_inputs(*seed_models(wc.seed))),
        output:
            [f"{OUT}/eval/{m}/{t}.json" for m in seed_models("{seed}") for t in GROUPED_TASKS],
        params:
            **eval_params({t: eval_task_settings(t) for t in GROUPED_TASKS}, lambda wc: seed_models(wc.seed)),
            mlflow=mlflow_spec("eval"),
        threads: 1
        log:
            [f"{OUT}/logs/eval-{m}/{t}.log" for m in seed_models("{seed}") for t in GROUPED_TASKS],
        benchmark:
            f"{OUT}/benchmarks/seed{{seed}}/eval.tsv"
        conda:
            "../../envs/melt.yaml"
        script:
            "../scripts/evaluate.py"


rule merge_eval:
    """A sharded task's results joined: every question once, pass@k over all of them."""
    input:
        lambda wc: [f"{OUT}/eval/{wc.model}/{wc.task}.shard-{i}-of-{n}.json"
                    for n in [task_shards(wc.task)] for i in range(n)],
    output:
        f"{OUT}/eval/{{model}}/{{task}}.json",
    wildcard_constraints:
        task=one_of(SHARDED_TASKS) if SHARDED_TASKS else "(?!)",
    params:
        mlflow=lambda wc: mlflow_spec("eval", task=wc.task, **model_tags(wc.model)),
    log:
        f"{OUT}/logs/eval-{{model}}/{{task}}.merge.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/merge_eval.py"


rule sharing_baselines:
    input:
        expand(f"{OUT}/eval/{{m}}/{{task}}.json", task=TASKS,
               m=[m for m in TEACHER_MODELS if ModelId.parse(m).kind == "sharing"]),


rule evals:
    input:
        eval_outputs(),
