"""Protects the rehearsal of the paper configuration (config/rehearsal.yaml): its fixtures are
built deterministically and match the pins in the overlay; the overlay changes only sizes and
where bytes come from; jobs other than the login-node downloads run offline."""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
import rehearsal  # noqa: E402


def _load(name):
    return yaml.safe_load((ROOT / "config" / name).read_text())


def test_fixtures_are_deterministic_and_pinned(tmp_path):
    """Built twice, the published files hash the same, and equal the overlay's pinned revisions and
    sha256 manifests (rebuild and paste the printed pins after changing workflow/rehearsal.py)."""
    pins = rehearsal.build(tmp_path / "a")
    assert rehearsal.build(tmp_path / "b") == pins
    over = _load("rehearsal.yaml")
    dense = over["dense_baselines"]["qwen3-1.7b"]
    for got, want in ((pins["source"], over["source"]), (pins["dense"], dense)):
        assert {k: want[k] for k in ("repo_id", "revision", "sha256")} == got
    snapshot = tmp_path / "a" / "hub" / "models--melt-rehearsal--Ouro-tiny-Thinking" / "snapshots"
    assert (snapshot / pins["source"]["revision"] / "model.safetensors").is_symlink()  # the hub's layout


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# what a rehearsal may change: sizes, where bytes come from (and its own name and outputs), and how
# the tasks its sizes leave unsharded are packed into jobs (eval.group_tasks, eval.group_models)
ALLOWED = [r"overlays", r"name", r"outdir", r"mlflow\..*",
           r"source\.(repo_id|revision|cache_dir|sha256\..*)",
           r"dense_baselines\..+\.(repo_id|revision|cache_dir|sha256\..*)",
           r"train_data\.(sources|total)",
           r"train\.(chunk_size|seq_len|batch_size|micro_batch_size|checkpoint_every)",
           r"phases\.[^.]+\.steps",
           r"launcher\.(tasks_per_node|gpus_per_node|cpus_per_task|timeout_min|mem_gb)",
           r"eval\.(batch_size|group_tasks|group_models)",
           r"eval\.tasks\.[^.]+\.(data_dir|samples|ks|max_new_tokens|select\.n|shards)",
           r"early_exit\.(limit|exit_gate_steps|exit_gate_batch)",
           r"profile\.(shapes|kv_tokens|speed_shape|real_shape_speed_context|speed_contexts|loops_sweep"
           r"|window_sweep)"]


def test_rehearsal_changes_only_sizes_and_sources():
    paper, over = _flat(_load("paper.yaml")), _flat(_load("rehearsal.yaml"))
    changed = [k for k in over if k not in paper or paper[k] != over[k]]
    bad = [k for k in changed if not any(re.fullmatch(p, k) for p in ALLOWED)]
    assert not bad, f"the rehearsal overlay changes more than sizes and sources: {bad}"
    assert "eval.tasks.hle.select.n" in changed and "train.chunk_size" in changed  # the check sees changes
    for src in _load("rehearsal.yaml")["train_data"]["sources"]:  # same kinds and schemas as the paper's
        assert src["kind"] == "hub" and src["schema"] in ("acereason", "openthoughts")


# what the CPU overlay (config/rehearsal_cpu.yaml, which CI runs) may change beyond that: the hardware
HARDWARE = [r"train\.device", r"eval\.(device|dtype)", r"eval\.vllm\.(kv_cache_gb|max_num_seqs|cuda_graphs)",
            r"launcher\.(gpus_per_node|cpus_per_task|partition|mem_gb)"]


def test_the_cpu_overlay_changes_only_the_hardware():
    rehearsal, cpu = _flat(_load("rehearsal.yaml")), _flat(_load("rehearsal_cpu.yaml"))
    paper = _flat(_load("paper.yaml"))
    changed = [k for k in cpu if k != "overlays" and rehearsal.get(k, paper.get(k)) != cpu[k]]
    bad = [k for k in changed if not any(re.fullmatch(p, k) for p in HARDWARE)]
    assert not bad, f"config/rehearsal_cpu.yaml changes more than the hardware: {bad}"
    assert "train.device" in changed  # the check sees changes


def test_compute_jobs_are_offline_and_downloads_are_not():
    """workflow/scripts/common.py, imported first by every rule script, makes the Hugging Face
    libraries offline for every rule but the login-node downloads."""
    code = ("import __main__, types; __main__.snakemake = types.SimpleNamespace(rule={rule!r});"
            "import sys; sys.path.insert(0, 'workflow/scripts'); import common;"
            "import huggingface_hub.constants as c; print(c.HF_HUB_OFFLINE)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    for rule, offline in (("eval", "True"), ("phase", "True"), ("pretrain_teacher", "True"), ("download", "False"),
                          ("train_data", "False"), ("benchmark_data", "False")):
        r = subprocess.run([sys.executable, "-c", code.format(rule=rule)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == offline, (rule, r.stdout, r.stderr[-500:])


def _schema(rows: list[dict]) -> dict[str, set[str]]:
    """Each column and the JSON types its values take."""
    out: dict[str, set[str]] = {}
    for row in rows:
        for k, v in row.items():
            out.setdefault(k, set()).add(type(v).__name__)
    return out


def test_benchmark_copies_have_the_real_datasets_columns_and_types():
    """The rehearsal's benchmark copies read like the hub datasets (tests/fixtures/benchmarks): the
    same columns with values of the same types (AIME26's int answers, AMC23's floats, GPQA's 47
    columns, OlympiadBench's lists), and HumanEval+ tests of evalplus's input/output shape."""
    import json

    from melt_core.evaluation.code_tasks import parse_tests

    fixtures = ROOT / "tests" / "fixtures" / "benchmarks"
    copies = rehearsal.benchmark_datasets()
    for task, files in copies.items():
        real_dir = fixtures / ("humanevalplus" if task == "humaneval" else task)
        real_rows = [json.loads(line) for path in sorted(real_dir.rglob("*.jsonl"))
                     for line in path.read_text().splitlines()]
        copy_rows = [row for rows in files.values() for row in rows]
        assert _schema(copy_rows) == _schema(real_rows), task
    for row in copies["humaneval"]["test.jsonl"]:
        assert parse_tests(row["test"], row["prompt"]).kind == "io" and "import numpy as np" in row["test"]


def test_every_shard_of_a_sharded_task_has_questions(tmp_path):
    """A shard job of the rehearsal asks at least one question (an empty shard rehearses nothing of
    the eval): each sharded task's copy, read through `datasets` as the eval reads it, split by the
    eval's own filter (melt_core.evaluation.lighteval_tasks.InShard)."""
    import json

    from datasets import load_dataset

    from melt_core.evaluation.lighteval_tasks import InShard

    tasks = _load("rehearsal.yaml")["eval"]["tasks"]
    sharded = {t: s["shards"] for t, s in tasks.items() if s["shards"] > 1}
    assert sharded and set(sharded.values()) == {rehearsal.REHEARSAL_SHARDS}
    copies = rehearsal.benchmark_datasets()
    for task, n in sharded.items():
        for rel, rows in copies[task].items():
            path = tmp_path / task / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            data = load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
            asked = [sum(InShard([k, n])(row) for row in data) for k in range(n)]
            assert all(asked) and sum(asked) == len(rows), (task, rel, asked)
