# Stage 8: gather every result into tidy tables, then render the paper's tables, figures and
# the claims check. Each table and figure is a target of its own (see README).

PAPER_VALUES = "workflow/resources/paper_values.yaml"  # an input: a corrected paper number rerenders

# The report renders where Snakemake runs (on a cluster, the login node): seconds of pandas and
# matplotlib each, which as cluster jobs would wait in the queue behind GPU work and pay a job's
# start-up (~6 s of in-job Snakemake on the CI cluster) for every one of its ~16 jobs.
localrules:
    gather,
    table,
    figure,
    claims,


rule gather:
    """Every eval, profile and training record gathered into tidy CSVs under summary/."""
    input:
        evals=eval_outputs(),
        profiles=profile_outputs(),
        runs=[f"{run_dir(r, s)}/final" for r in RUNS for s in SEEDS],
        early_exit=expand(f"{OUT}/early_exit/{{model}}.json", model=EXIT_MODELS),
    output:
        evals=f"{OUT}/summary/evals.csv",
        memory=f"{OUT}/summary/memory.csv",
        speed=f"{OUT}/summary/speed.csv",
        train_throughput=f"{OUT}/summary/train_throughput.csv",
        curves=f"{OUT}/summary/training_curves.csv",
        gates=f"{OUT}/summary/gate_values.csv",
        sweeps=f"{OUT}/summary/sweeps.json",
        early_exit=f"{OUT}/summary/early_exit.csv",
    params:
        # each (gate, recipe) run and seed: its final checkpoint, and the run dirs of its phases in order
        runs={trained_model(r, s): {"final": f"{run_dir(r, s)}/final", "run": r, "seed": s,
                                    "phases": run_phase_dirs(r, s)}
              for r in RUNS for s in SEEDS},
        untrained={s: init_dir(config["main_run"]["gate"], s) for s in SEEDS},
        settings=report_settings(),
        mlflow=mlflow_spec("report"),
    log:
        f"{OUT}/logs/gather.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/gather.py"


rule table:
    """One paper table (Markdown, LaTeX, CSV): ours beside the paper's numbers."""
    input:
        rules.gather.output,
        paper=PAPER_VALUES,
    output:
        md=f"{OUT}/tables/{{table}}.md",
        tex=f"{OUT}/tables/{{table}}.tex",
        csv=report(f"{OUT}/tables/{{table}}.csv", caption="../report/table.rst", category="Tables",
                   labels={"table": "{table}"}),
    wildcard_constraints:
        table=one_of(TABLES),
    params:
        settings=report_settings(),
        mlflow=lambda wc: mlflow_spec("report", table=wc.table),
    log:
        f"{OUT}/logs/table-{{table}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/render_tables.py"


rule figure:
    """One paper figure (PNG, and PDF beside it)."""
    input:
        rules.gather.output,
        paper=PAPER_VALUES,
    output:
        png=report(f"{OUT}/figures/{{figure}}.png", caption="../report/figure.rst", category="Figures",
                   labels={"figure": "{figure}"}),
        pdf=f"{OUT}/figures/{{figure}}.pdf",
    wildcard_constraints:
        figure=one_of(FIGURES),
    params:
        settings=report_settings(),
        mlflow=lambda wc: mlflow_spec("report", figure=wc.figure),
    log:
        f"{OUT}/logs/figure-{{figure}}.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/render_figures.py"


rule claims:
    """The paper's claims, our evidence, and a verdict each (claims.md)."""
    input:
        rules.gather.output,
        paper=PAPER_VALUES,
        tables=expand(f"{OUT}/tables/{{t}}.{{ext}}", t=TABLES, ext=["md", "tex", "csv"]),
        figures=expand(f"{OUT}/figures/{{f}}.png", f=FIGURES),
    output:
        report(f"{OUT}/claims.md", caption="../report/claims.rst", category="Claims"),
    params:
        settings=report_settings(),
        mlflow=mlflow_spec("report"),
    log:
        f"{OUT}/logs/claims.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/claims.py"


rule tables:
    input:
        expand(f"{OUT}/tables/{{t}}.{{ext}}", t=TABLES, ext=["md", "tex", "csv"]),


rule figures:
    input:
        expand(f"{OUT}/figures/{{f}}.png", f=FIGURES),



# One named target per paper table and figure, e.g. `snakemake --profile local table3_gates`.
for _name in TABLES + FIGURES:

    rule:
        name:
            _name
        input:
            (expand(f"{OUT}/tables/{_name}.{{ext}}", ext=["md", "tex", "csv"]) if _name in TABLES
             else [f"{OUT}/figures/{_name}.png"]),


localrules:
    resolved_config,


rule resolved_config:
    """The config this run resolved to after layering: the record of what ran, and what tests check."""
    output:
        f"{OUT}/config.resolved.yaml",
    params:
        config=config,
        mlflow=mlflow_spec("report"),
    log:
        f"{OUT}/logs/resolved_config.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/resolved_config.py"


localrules:
    plan,


rule plan:
    """The cost plan to read before submitting: tokens, peak memory and GPU-hours per job (plan.md)."""
    output:
        f"{OUT}/plan.md",
    params:
        config=config,
        models={m: ModelId.parse(m).family for m in MODELS},  # whose shape each is costed at
        exit_models={m: ModelId.parse(m).family for m in EXIT_MODELS},
        native_models=sorted(m for m in MODELS if vllm_refusal_of(m)),  # under eval.engine vllm, what stays native
        phase_jobs=PIPELINE.phase_jobs(),
        mlflow=mlflow_spec("report"),
    log:
        f"{OUT}/logs/plan.log",
    conda:
        "../../envs/melt.yaml"
    script:
        "../scripts/plan.py"
