# The glue between the config and the rules: validate it, pin the CPU arithmetic, and bind the names
# the rules use. What those names mean (runs, models, paths, params) is workflow/scripts/pipeline.py, plain
# Python with its own tests (tests/test_pipeline.py).
import sys
from pathlib import Path

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml", set_default=True)  # fills every default, once

# Every job's CPU arithmetic pinned (config cpu_numerics): set here, in the environment every job
# inherits, before any job imports torch (workflow/scripts/cpu_numerics.py).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))
from cpu_numerics import pin  # noqa: E402
from pipeline import TABLES, Pipeline, one_of, open_invocation  # noqa: E402  (the rules use one_of)
from model_id import ModelId  # noqa: E402  the one grammar of model and run ids

pin(config.get("cpu_numerics"))

PIPELINE = Pipeline(config)  # checks the names and task settings the schema cannot: one clear error before any job

# the names the rules read
OUT = PIPELINE.out
SEEDS = PIPELINE.seeds
PER_SEED_TEACHER = PIPELINE.per_seed_teacher
TASKS = PIPELINE.tasks
LIGHTEVAL_TASKS = PIPELINE.lighteval_tasks
DOWNLOADS = PIPELINE.downloads
RUNS = PIPELINE.runs
MAIN_RUN = PIPELINE.main_run
GATE_RUNS = PIPELINE.gate_runs
RECIPE_RUNS = PIPELINE.recipe_runs
MODELS = PIPELINE.models
TEACHER_MODELS = PIPELINE.teacher_models_all
EXIT_MODELS = PIPELINE.exit_models
SHARDED_TASKS = PIPELINE.sharded_tasks
GROUPED_TASKS = PIPELINE.grouped_tasks
GROUPED_MODELS = PIPELINE.grouped_models
FIGURES = PIPELINE.figures  # with report.long_column, the accuracy-by-length figure

recipe_path = PIPELINE.recipe_path
phase_dir = PIPELINE.phase_dir
run_dir = PIPELINE.run_dir
run_phase_dirs = PIPELINE.run_phase_dirs
init_dir = PIPELINE.init_dir
last_phase = PIPELINE.last_phase
phase_start = PIPELINE.phase_start
path_phases = PIPELINE.path_phases
trained_model = PIPELINE.trained_model
seed_models = PIPELINE.seed_models
teacher_models = PIPELINE.teacher_models
vllm_refusal_of = PIPELINE.vllm_refusal_of
model_tags = PIPELINE.model_tags
teacher_dir = PIPELINE.teacher_dir
teacher_pretrain = PIPELINE.teacher_pretrain
teacher_inputs = PIPELINE.teacher_inputs
train_records = PIPELINE.train_records
task_shards = PIPELINE.task_shards
eval_params = PIPELINE.eval_params
eval_task_settings = PIPELINE.eval_task_settings
eval_inputs = PIPELINE.eval_inputs
eval_outputs = PIPELINE.eval_outputs
profile_outputs = PIPELINE.profile_outputs
report_outputs = PIPELINE.report_outputs
report_settings = PIPELINE.report_settings
mlflow_spec = PIPELINE.mlflow_spec


wildcard_constraints:
    **PIPELINE.wildcard_constraints(),


INVOCATION = None  # the MLflow parent run of this invocation (onstart), closed by onsuccess / onerror


def init_tracking():
    global INVOCATION
    targets = getattr(getattr(workflow, "dag_settings", None), "targets", None)
    INVOCATION = open_invocation(PIPELINE, list(targets or []))


def finish_tracking(status):
    if INVOCATION is not None:
        INVOCATION.close(status)
