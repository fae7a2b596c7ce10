"""What every workflow script shares: logging into the rule's log file, thread count, and an
MLflow logger tagged with stage, rule, ablation, config hash and git commit."""

import contextlib
import logging
import os
import sys
import traceback

import __main__

# Only the login-node rules may reach the hub; every other job is offline before any Hugging Face
# library is imported (they read these variables at import), so a compute job that reaches for the
# network fails at once instead of downloading behind the cluster's back.
LOGIN_NODE_RULES = {"download", "benchmark_data", "train_data"}
_rule = getattr(getattr(__main__, "snakemake", None), "rule", None)
if _rule is not None and _rule not in LOGIN_NODE_RULES:
    for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[_var] = "1"

import torch  # noqa: E402
from cpu_numerics import check as check_numerics  # noqa: E402
from cpu_numerics import mkl_branch  # noqa: E402

from melt_core.tracking import INVOCATION_ENV, config_hash, make_logger, stamp


@contextlib.contextmanager
def rule_context(snakemake, stage: str, run_name: str | None = None, log_index: int = 0,
                 tags: dict[str, str] | None = None):
    """Send stdout/stderr to the rule's log, set torch threads, yield an MLflow logger.

    A job with several results, each its own log and MLflow run (rule eval_model), enters one
    context per result: ``log_index`` picks its log, ``tags`` go over the rule's."""
    log_path = snakemake.log[log_index] if snakemake.log else None
    stream = open(log_path, "w") if log_path else sys.stderr
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream
    logging.basicConfig(stream=stream, level=logging.INFO, force=True)
    torch.set_num_threads(max(1, snakemake.threads))
    # a job's log says how it was threaded and which kernels computed it (a slow or differing job)
    stamp(f"rule {snakemake.rule}: {torch.get_num_threads()} torch thread(s), OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          + check_numerics(torch.backends.cpu.get_cpu_capability(), mkl_branch()))
    spec = dict(getattr(snakemake.params, "mlflow", None) or {})
    spec.setdefault("parent_run_id", os.environ.get(INVOCATION_ENV))  # a child of this invocation's run
    tags = {**spec.get("tags", {}), **(tags or {}), "rule": snakemake.rule,
            "config_hash": config_hash(snakemake.config), "mlflow.source.name": f"Snakefile rule {snakemake.rule}"}
    # short, distinct names: "phase elementwise phase1/phase2", "eval melt-scalar__full aime24", "gather"
    name = run_name or " ".join([snakemake.rule, *(str(v) for _, v in snakemake.wildcards.items() if str(v))])
    logger = make_logger(spec, name, tags)
    try:
        with logger:
            try:
                yield logger
            except BaseException:
                traceback.print_exc(file=stream)  # into the rule's log, where show-failed-logs finds it
                raise
            finally:  # the rule's log beside its run, a failed run's included
                stream.flush()
                if log_path:
                    logger.log_artifact(log_path, "logs")
    finally:
        sys.stdout, sys.stderr = old_out, old_err
        if log_path:
            stream.close()
