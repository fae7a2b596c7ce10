# MELT reproduction: every stage of the paper as dependent rules (see README.md).
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"  # snakemake --report results/report.html


include: "workflow/rules/layers.smk"  # which config files: the default, or exactly those given
include: "workflow/rules/common.smk"
include: "workflow/rules/source.smk"
include: "workflow/rules/convert.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/early_exit.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/report.smk"


onstart:
    init_tracking()


onsuccess:
    finish_tracking("FINISHED")


onerror:
    finish_tracking("FAILED")


rule all:
    input:
        report_outputs(),
    default_target: True
