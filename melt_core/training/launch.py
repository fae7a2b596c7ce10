"""Run ``train(cfg)`` in-process, as a local submitit job, or as a SLURM job via submitit.

The submitit job is a ``Checkpointable``: on SLURM timeout or preemption submitit calls its
``checkpoint`` method, which requeues the same call; ``train`` then resumes from the newest
complete checkpoint. Multi-task jobs (one task per GPU) export the torch.distributed
environment from SLURM/submitit before training. The caller submits once and waits, so a
workflow rule sees one step that succeeds or fails.

    python -m melt_core.training.launch TRAIN_CONFIG --launcher LAUNCHER_CONFIG
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import submitit

from ..modeling.config import ConfigError
from .train import train

BACKENDS = ("inprocess", "local", "slurm")
# launcher keys -> submitit parameter names (AutoExecutor prefixes slurm-only ones itself)
SUBMITIT_KEYS = {
    "nodes": "nodes", "tasks_per_node": "tasks_per_node", "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task", "timeout_min": "timeout_min", "mem_gb": "mem_gb",
    "partition": "slurm_partition", "account": "slurm_account", "qos": "slurm_qos",
    "constraint": "slurm_constraint", "signal_delay_s": "slurm_signal_delay_s",
    "additional_parameters": "slurm_additional_parameters", "setup": "slurm_setup",
}
# launcher keys that configure the executor itself (its constructor), not the job
EXECUTOR_KEYS = {"max_num_timeout": "slurm_max_num_timeout"}


class TrainJob(submitit.helpers.Checkpointable):
    """Picklable entry point: the same ``train`` in every task of every (re)queued job."""

    def __call__(self, cfg: dict[str, Any]) -> str:
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        return str(train(cfg))


def build_executor(backend: str, launcher: dict[str, Any], folder: Path) -> submitit.AutoExecutor:
    """A submitit executor for ``launcher``'s fields; submitit validates them here, before any job."""
    unknown = sorted(set(launcher) - set(SUBMITIT_KEYS) - set(EXECUTOR_KEYS) - {"name"})
    if unknown:
        raise ConfigError(f"launcher: unknown field(s) {unknown}; known: {sorted({**SUBMITIT_KEYS, **EXECUTOR_KEYS})}")
    ctor = {EXECUTOR_KEYS[k]: launcher[k] for k in EXECUTOR_KEYS if launcher.get(k) is not None and backend == "slurm"}
    executor = submitit.AutoExecutor(folder=folder, cluster="local" if backend == "local" else "slurm", **ctor)
    # the local executor takes the cluster-independent fields and AutoExecutor drops the slurm_ ones
    params = {SUBMITIT_KEYS[k]: v for k, v in launcher.items() if k in SUBMITIT_KEYS and v is not None}
    executor.update_parameters(name=launcher.get("name", "melt-train"), **params)
    return executor


def launch(cfg: dict[str, Any], launcher: dict[str, Any] | None = None) -> Path:
    """Train under ``launcher`` ({backend, folder, nodes, tasks_per_node, ...}); returns final/."""
    launcher = dict(launcher or {})
    backend = launcher.pop("backend", "inprocess")
    if backend not in BACKENDS:
        raise ConfigError(f"launcher.backend {backend!r} unknown; choose one of {BACKENDS}")
    if backend == "inprocess":
        return Path(train(cfg))
    folder = Path(launcher.pop("folder", Path(cfg["out_dir"]) / "submitit"))
    executor = build_executor(backend, launcher, folder)
    job = executor.submit(TrainJob(), cfg)
    print(f"submitted training job {job.job_id} (logs: {folder})", flush=True)
    results = job.results()  # waits; raises if any task failed, after submitit's requeues
    return Path(results[0])


def main(argv: list[str] | None = None) -> None:
    import argparse

    import yaml

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="train config (YAML or JSON)")
    p.add_argument("--launcher", help="launcher config (YAML or JSON); default: in-process")
    a = p.parse_args(argv)
    cfg = yaml.safe_load(Path(a.config).read_text())
    launcher = yaml.safe_load(Path(a.launcher).read_text()) if a.launcher else None
    print(json.dumps({"final": str(launch(cfg, launcher))}))


if __name__ == "__main__":
    main()
