"""Protects the launcher: the same train() runs through submitit's local executor as a real
job (a separate process, with its own job folder) and ends with the same weights as in-process."""

import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from train_helpers import tiny_setup, train_config

from melt_core.modeling.config import ConfigError
from melt_core.training.launch import build_executor, launch

ROOT = Path(__file__).resolve().parents[1]


def test_submitit_local_equals_inprocess(tmp_path):
    """Exact on purpose: the job is a child process with this process's environment (same kernels,
    same thread count) and the same torch-allocated memory layout, so any difference is a bug."""
    paths, teacher, student = tiny_setup(tmp_path)
    inproc = launch(train_config(tmp_path, paths, teacher, student, "inproc"), {"backend": "inprocess"})
    job = launch(train_config(tmp_path, paths, teacher, student, "job"), {"backend": "local", "timeout_min": 10})
    assert (tmp_path / "job" / "submitit").is_dir()  # it really went through submitit
    a, b = load_file(str(inproc / "model.safetensors")), load_file(str(job / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_launcher_fields(tmp_path):
    with pytest.raises(ConfigError, match="launcher.backend 'k8s' unknown"):
        launch({"out_dir": str(tmp_path)}, {"backend": "k8s"})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['gpus'\]"):
        launch({"out_dir": str(tmp_path)}, {"backend": "local", "gpus": 8})


@pytest.mark.parametrize("config", ["paper.yaml", "rehearsal.yaml"])
def test_the_configs_launchers_are_valid_submitit_slurm_parameters(tmp_path, config):
    """Every launcher field of the paper config maps onto a parameter submitit's SLURM executor
    takes (the paper's `max_num_timeout` is an executor argument, and was once passed as a job
    parameter, failing every paper training job at submission)."""
    if not shutil.which("srun"):  # submitit's SLURM executor refuses to exist without SLURM's tools
        msg = "no `srun` on this machine (CI starts a one-node cluster: bash .ci/slurm-cluster.sh start)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)  # under CI a missing tool is a failure, never a silent skip
        pytest.skip(msg)
    launcher = dict(yaml.safe_load((ROOT / "config" / config).read_text())["launcher"])
    if config != "paper.yaml":
        base = dict(yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["launcher"])
        launcher = {**base, **launcher}
    backend = launcher.pop("backend")
    executor = build_executor(backend, launcher, tmp_path)
    assert executor._executor.max_num_timeout == launcher["max_num_timeout"]
    assert executor._executor.parameters["ntasks_per_node"] == launcher["tasks_per_node"]
