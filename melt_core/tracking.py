"""Experiment tracking. Library code is handed a logger and never asks whether logging is on:
``NullLogger`` does nothing, ``MlflowLogger`` mirrors params, metrics and artifacts to MLflow.

Tracking URI: ``MLFLOW_TRACKING_URI`` when set (a team's server), else the embedded SQLite
store given by the caller (the workflow uses ``results/mlflow.db``).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

INVOCATION_ENV = "MELT_MLFLOW_INVOCATION_RUN"  # the workflow invocation's parent run, for its jobs' runs


def stamp(msg: str) -> None:
    """A timestamped line for logs people read with tail -f or less."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}", flush=True)


class NullLogger:
    run_id: str | None = None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def find_run(self, tags: dict[str, str]) -> str | None:
        """The newest finished run of this experiment carrying all ``tags``, or None."""
        return None

    def log_dataset(self, path: str | Path, context: str, name: str | None = None) -> None:
        """Record a file or folder this run read, with its digest, as an MLflow dataset input."""

    def close(self, status: str = "FINISHED") -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close("FAILED" if exc_type else "FINISHED")
        return False


_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_key(name: str) -> str:
    """MLflow accepts alphanumerics, _ - . space and /; map anything else to _."""
    return _BAD_KEY.sub("_", name)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[metric_key(key)] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def data_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's (relative path, file digest) pairs in order."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if f != path:
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def git_commit(cwd: str | Path | None = None) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def resolve_uri(tracking_uri: str | None) -> str | None:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking_uri
    if uri and uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def artifact_root(tracking_uri: str | None) -> str | None:
    """Artifacts beside a SQLite store (``<store dir>/mlartifacts``, absolute), so copying the
    results folder keeps them and two stores never share a folder; a server decides for itself."""
    uri = resolve_uri(tracking_uri)
    if uri and uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


def experiment_id(client, name: str, tracking_uri: str | None = None) -> str:
    """The id of experiment ``name``, creating it if needed. Two jobs that start together may
    both find it missing; the loser's create fails on the unique name, and it reads the winner's."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root(tracking_uri))
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def ensure_store(tracking_uri: str | None, experiment: str | None = None) -> None:
    """Create the tracking store's schema (and the experiment) once, before parallel jobs race to
    create them (SQLite migrations run on first use, and two first users collide)."""
    import mlflow

    uri = resolve_uri(tracking_uri)
    if uri:
        client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
        if experiment:
            experiment_id(client, experiment, uri)


class MlflowLogger(NullLogger):
    """One MLflow run. ``parent_run_id`` nests it under a parent (a stage with parts)."""

    def __init__(self, experiment: str, run_name: str, tracking_uri: str | None = None,
                 tags: dict[str, str] | None = None, parent_run_id: str | None = None,
                 system_metrics: bool = False):
        """``system_metrics``: sample CPU/GPU/memory use into the run every 10 s (training runs)."""
        import mlflow

        self._mlflow = mlflow
        uri = resolve_uri(tracking_uri)
        # the client gets the URI; mlflow.set_tracking_uri would also export MLFLOW_TRACKING_URI,
        # which then overrides every later logger's store in this process
        self._client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        exp_id = experiment_id(self._client, experiment, uri)
        commit = git_commit()
        # MLflow's own columns (User, Source, Version) and our filters (stage, rule, config_hash, ...)
        all_tags = {"mlflow.runName": run_name, "mlflow.user": getpass.getuser(),
                    "mlflow.source.name": Path(sys.argv[0]).name or "python", "mlflow.source.type": "JOB",
                    "mlflow.source.git.commit": commit, "git_commit": commit, **process_tags(), **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        self._exp_id = exp_id
        self.run_id = self._client.create_run(exp_id, tags=all_tags).info.run_id
        self._monitor = None
        if system_metrics:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, sampling_interval=10, tracking_uri=uri)
            self._monitor.start()

    def log_params(self, params):  # one batched request (MLflow takes up to 100 params per batch)
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics, step=None):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_key(k), float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 1000):
            self._client.log_batch(self.run_id, metrics=items[i:i + 1000])

    def log_dataset(self, path, context, name=None):
        from mlflow.entities import Dataset, DatasetInput, InputTag

        path = Path(path).resolve()
        dataset = Dataset(name=name or path.name, digest=data_digest(path)[:16], source_type="local",
                          source=json.dumps({"uri": path.as_uri()}))
        self._client.log_inputs(self.run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", context)])])

    def find_run(self, tags):
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        runs = self._client.search_runs([self._exp_id], f"{query} and attributes.status = 'FINISHED'",
                                        order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None

    def log_artifact(self, path, artifact_path=None):
        path = Path(path)
        if path.is_dir():
            self._client.log_artifacts(self.run_id, str(path), artifact_path)
        elif path.exists():
            self._client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags):
        for k, v in tags.items():
            self._client.set_tag(self.run_id, k, v)

    def close(self, status="FINISHED"):
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        if self.run_id:
            self._client.set_terminated(self.run_id, status)
            self.run_id = None


def process_tags() -> dict[str, str]:
    """Where a run's process lives, so a later invocation can tell a dead run from a live one."""
    tags = {"host": socket.gethostname(), "pid": str(os.getpid())}
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    return tags


def _alive(tags: dict[str, str]) -> bool | None:
    """Whether the process behind a run still runs: its SLURM job in squeue, or its pid on this
    host; None when that cannot be told from here (another host, no squeue)."""
    if tags.get("slurm_job_id"):
        try:
            out = subprocess.run(["squeue", "-h", "-j", tags["slurm_job_id"]], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return bool(out.stdout.strip()) if out.returncode == 0 else False
    if tags.get("host") == socket.gethostname() and tags.get("pid", "").isdigit():
        try:
            os.kill(int(tags["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return None


def mark_dead_runs(tracking_uri: str | None, experiment: str) -> list[str]:
    """Runs left RUNNING by a killed job (kill -9, a lost node) are marked KILLED, when their
    process is known to be gone; runs of live or unknown processes are left alone."""
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=resolve_uri(tracking_uri))
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    killed = []
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'", max_results=5000):
        if _alive(run.data.tags) is False:
            client.set_terminated(run.info.run_id, "KILLED")
            killed.append(run.info.run_id)
    return killed


class BestEffortLogger(NullLogger):
    """Tracking never stops the work it records (the results files are the truth): a failing
    MLflow call is reported loudly on stderr, once per kind of call, and the work goes on."""

    def __init__(self, make):
        self._inner, self._warned = None, set()
        self._call("connect", lambda: setattr(self, "_inner", make()))

    @property
    def run_id(self):
        return getattr(self._inner, "run_id", None)

    def _call(self, what, fn):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - tracking must not kill training or evaluation
            if what not in self._warned:
                self._warned.add(what)
                print(f"WARNING: MLflow {what} failed, continuing without it: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
            return None

    def log_params(self, params):
        if self._inner:
            self._call("log_params", lambda: self._inner.log_params(params))

    def log_metrics(self, metrics, step=None):
        if self._inner:
            self._call("log_metrics", lambda: self._inner.log_metrics(metrics, step))

    def log_artifact(self, path, artifact_path=None):
        if self._inner:
            self._call("log_artifact", lambda: self._inner.log_artifact(path, artifact_path))

    def set_tags(self, tags):
        if self._inner:
            self._call("set_tags", lambda: self._inner.set_tags(tags))

    def log_dataset(self, path, context, name=None):
        if self._inner:
            self._call("log_dataset", lambda: self._inner.log_dataset(path, context, name))

    def find_run(self, tags):
        return self._call("find_run", lambda: self._inner.find_run(tags)) if self._inner else None

    def close(self, status="FINISHED"):
        if self._inner:
            self._call("close", lambda: self._inner.close(status))


def make_logger(spec: dict[str, Any] | None, run_name: str, tags: dict[str, str] | None = None):
    """A logger from a config block ``{experiment, tracking_uri, parent_run_id}``; None -> NullLogger.
    A run made inside a SLURM job carries its id (tag ``slurm_job_id``): proof of where it ran."""
    if not spec or not spec.get("enabled", True):
        return NullLogger()
    where = {"slurm_job_id": os.environ["SLURM_JOB_ID"]} if os.environ.get("SLURM_JOB_ID") else {}
    return BestEffortLogger(lambda: MlflowLogger(
        spec.get("experiment", "melt"), run_name, spec.get("tracking_uri"),
        {**(spec.get("tags") or {}), **(tags or {}), **where}, spec.get("parent_run_id"),
        spec.get("system_metrics", False)))
