"""MLflow tracking: parallel jobs share one SQLite store and one experiment."""

import mlflow

from melt_core.tracking import MlflowLogger, data_digest, ensure_store, experiment_id, make_logger


def test_experiment_created_by_another_job_in_between_is_reused(tmp_path):
    """Job A looks the experiment up (missing), job B creates it, then A creates it too: A must
    get B's experiment instead of failing on the unique name (this failed a SLURM run)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_store(uri)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    other = mlflow.tracking.MlflowClient(tracking_uri=uri)
    real_get = client.get_experiment_by_name
    calls = []

    def stale_get(name):
        calls.append(name)
        if len(calls) == 1:  # A's first look: missing; B creates it right after
            other.create_experiment(name)
            return None
        return real_get(name)

    client.get_experiment_by_name = stale_get
    exp_id = experiment_id(client, "melt-race")
    assert exp_id == other.get_experiment_by_name("melt-race").experiment_id
    assert len(calls) == 2


def test_ensure_store_creates_the_experiment_and_loggers_share_it(tmp_path):
    uri = f"sqlite:///{tmp_path}/sub/mlflow.db"
    ensure_store(uri, "melt-x")
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("melt-x")
    assert exp is not None
    with MlflowLogger("melt-x", "a", uri) as a, MlflowLogger("melt-x", "b", uri) as b:
        a.log_metrics({"acc(%)": 1.0})
        assert client.get_run(a.run_id).info.experiment_id == exp.experiment_id
        assert client.get_run(b.run_id).info.experiment_id == exp.experiment_id
        a_id = a.run_id
    run = client.get_run(a_id)
    assert run.data.metrics == {"acc___": 1.0} and run.info.status == "FINISHED"


def test_artifacts_live_beside_the_store(tmp_path):
    """Not in ./mlruns of whatever directory a job runs in: copying results/ keeps them, and two
    stores never share an artifact folder."""
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    ensure_store(uri, "melt-art")
    exp = mlflow.tracking.MlflowClient(tracking_uri=uri).get_experiment_by_name("melt-art")
    assert exp.artifact_location == (tmp_path / "store" / "mlartifacts").as_uri()
    report = tmp_path / "report.txt"
    report.write_text("x")
    with MlflowLogger("melt-art", "a", uri) as run:
        run.log_artifact(report)
        run_id = run.run_id
    assert (tmp_path / "store" / "mlartifacts" / run_id / "artifacts" / "report.txt").is_file()


def test_a_tracking_failure_is_loud_but_not_fatal(tmp_path, capsys):
    logger = make_logger({"tracking_uri": "sqlite:////proc/melt-no-such-dir/mlflow.db", "experiment": "x"}, "run")
    logger.log_params({"a": 1})
    logger.log_metrics({"loss": 1.0}, step=1)
    logger.close()
    err = capsys.readouterr().err
    assert err.count("WARNING: MLflow connect failed, continuing without it") == 1


def test_runs_of_killed_processes_are_marked_killed(tmp_path):
    """kill -9 leaves a run RUNNING; the next invocation marks it KILLED once its process is gone,
    and leaves the runs of live processes alone."""
    import subprocess
    import sys

    from melt_core.tracking import mark_dead_runs

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_store(uri, "melt-dead")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = MlflowLogger("melt-dead", "live", uri)
    gone = MlflowLogger("melt-dead", "gone", uri, tags={"pid": str(dead.pid)})
    assert mark_dead_runs(uri, "melt-dead") == [gone.run_id]
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(gone.run_id).info.status == "KILLED"
    assert client.get_run(live.run_id).info.status == "RUNNING"
    live.close()


def test_params_and_metrics_go_in_batches_and_runs_are_found_by_tags(tmp_path):
    """Hundreds of params in a few requests; an eval finds the newest finished training run of its
    checkpoint by tags (a running or failed one is not its source)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_store(uri, "melt-find")
    with MlflowLogger("melt-find", "old", uri, tags={"rule": "phase", "gate": "g", "path": "p1/p2"}) as old:
        old.log_params({f"p{i}": i for i in range(250)})
        old.log_metrics({f"m{i}": i for i in range(5)}, step=3)
        old_id = old.run_id
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run = client.get_run(old_id)
    assert len(run.data.params) == 250 and run.data.metrics["m4"] == 4.0
    assert [m.step for m in client.get_metric_history(old_id, "m4")] == [3]
    with MlflowLogger("melt-find", "new", uri, tags={"rule": "phase", "gate": "g", "path": "p1/p2"}) as new:
        new_id = new.run_id
    failed = MlflowLogger("melt-find", "failed", uri, tags={"rule": "phase", "gate": "g", "path": "p1/p2"})
    failed.close("FAILED")
    with MlflowLogger("melt-find", "eval", uri) as evaluation:
        assert evaluation.find_run({"rule": "phase", "gate": "g", "path": "p1/p2"}) == new_id
        assert evaluation.find_run({"rule": "phase", "gate": "other"}) is None


def test_datasets_are_logged_as_inputs_with_digests_and_training_samples_the_system(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ensure_store(uri, "melt-data")
    data = tmp_path / "train.jsonl"
    data.write_text('{"x": 1}\n')
    folder = tmp_path / "bench"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "test.jsonl").write_text("q\n")
    with MlflowLogger("melt-data", "train", uri, system_metrics=True) as run:
        run.log_dataset(data, "training")
        run.log_dataset(folder, "evaluation")
        run_id = run.run_id
    inputs = mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(run_id).inputs.dataset_inputs
    got = {(d.dataset.name, d.tags[0].value): d.dataset.digest for d in inputs}
    assert got[("train.jsonl", "training")] == data_digest(data)[:16]
    assert got[("bench", "evaluation")] == data_digest(folder)[:16]
    (folder / "a" / "test.jsonl").write_text("changed\n")
    assert data_digest(folder)[:16] != got[("bench", "evaluation")]  # the digest follows the content


def test_a_folder_digest_follows_its_file_names_as_well_as_their_bytes(tmp_path):
    """The teacher-logits cache is keyed by the teacher folder's digest: two files swapping their
    bytes, or one renamed, is another folder."""
    folder = tmp_path / "teacher"
    folder.mkdir()
    (folder / "a.json").write_text("1")
    (folder / "b.json").write_text("2")
    before = data_digest(folder)
    (folder / "a.json").write_text("2")
    (folder / "b.json").write_text("1")
    swapped = data_digest(folder)
    (folder / "b.json").rename(folder / "c.json")
    assert len({before, swapped, data_digest(folder)}) == 3
