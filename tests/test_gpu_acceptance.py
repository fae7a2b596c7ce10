"""Protects benchmarks/gpu_acceptance.py, the script a GPU day runs: every code path of it executes
here at a tiny shape on CPU (decode at batch 1 and the planned batch, prefill, the memory plan,
training steps, continuous vs static batching, vLLM beside the native engine), each figure beside its
roofline, and the cost plan reads its measured rates."""

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_acceptance  # noqa: E402

from melt_core.ops.plan import plan, render  # noqa: E402


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("ga")
    gpu_acceptance.main(["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--out", str(out)])
    return out, json.loads((out / "gpu_acceptance.json").read_text())


def test_every_section_runs_and_stands_beside_its_limit(result):
    out, data = result
    rows = data["rows"]
    decode = [r for r in rows if r["section"] == "decode"]
    assert {(r["model"], r["batch_kind"], r["context"]) for r in decode} == {
        (m, k, c) for m in ("ouro", "melt") for k in ("batch 1", "planned") for c in (32, 64)} | {
        (f"{m}-static", "batch 1", c) for m in ("ouro", "melt") for c in (32, 64)}  # the static step beside
    for r in decode:  # a CPU is far below an H100's limits: measured / limit < 1, and both positive
        assert 0 < r["decode_tok_s"] < r["decode_limit_tok_s"] and 0 < r["prefill_tok_s"] < r["prefill_limit_tok_s"]
    planned = {r["model"]: r["batch"] for r in decode if r["batch_kind"] == "planned"}
    assert planned["melt"] >= planned["ouro"] >= 1  # MELT's smaller cache never buys a smaller batch
    memory = [r for r in rows if r["section"] == "memory"]
    assert len(memory) == 2 and all(r["planned_bytes"] > 0 and r["peak_bytes"] is None for r in memory)
    training = [r for r in rows if r["section"] == "training"]
    assert {r["model"] for r in training} == {"ouro-parallel", "melt-C8"}
    assert all(0 < r["tok_s"] < r["limit_tok_s"] for r in training)
    batching = [r for r in rows if r["section"] == "batching"]
    assert {(r["model"], r["batching"]) for r in batching} == {(m, b) for m in ("Ouro", "MELT")
                                                               for b in ("static", "continuous")}
    served = [r for r in rows if r["section"] == "vllm" and r["workload"] == "eval"]
    assert {(r["model"], r["engine"]) for r in served} == {(m, e) for m in ("Ouro", "MELT")
                                                          for e in ("native", "vLLM", "vLLM prefill")}
    bound = [r for r in rows if r["section"] == "vllm" and r["workload"] == "pool-bound"]  # vLLM alone, no tail
    assert {(r["model"], r["engine"]) for r in bound} == {(m, e) for m in ("Ouro", "MELT")
                                                         for e in ("vLLM", "vLLM prefill")}
    generated = [r for r in bound if r["engine"] == "vLLM"]
    assert all(r["admit"] == 1 and r["max_num_seqs"] == max(r["kv_sequences"], 1) for r in generated)
    assert all(r["tok_s"] > 0 and r["tokens"] > 0 for r in served + bound)
    text = (out / "gpu_acceptance.md").read_text()
    for heading in ("## Decode and prefill", "## Memory plan", "## Training steps", "## Continuous vs static",
                    "## vLLM beside the native engine", "## vLLM, pool-bound"):
        assert heading in text
    assert "not measurable on CPU" in text


def test_the_plan_reads_the_measured_rates(result, tmp_path):
    out, data = result
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    cfg["eval"]["engine"] = "native"  # the measured decode rates are melt_core's engine's (vLLM's: its own model)
    assumed, _ = plan(cfg, {"ouro": "ouro"}, [("elementwise", "phase1", 500)])
    cfg["plan"] = {"measured": str(out / "gpu_acceptance.json")}
    measured, a = plan(cfg, {"ouro": "ouro"}, [("elementwise", "phase1", 500)])
    assert a["decode_tok_s"]["ouro"] == data["plan_rates"]["decode_tok_s"]["ouro"]
    assert a["train_tok_s_per_gpu"] == data["plan_rates"]["train_tok_s_per_gpu"]
    rate = a["decode_tok_s"]["ouro"] / 13.5  # against the paper's assumed 13.5 tok/s
    assert measured[1].hours == pytest.approx(assumed[1].hours / rate)
    assert measured[1].limit_hours == assumed[1].limit_hours  # the hardware's limit does not move
    assert "measured by benchmarks/gpu_acceptance.py" in render(measured, a, "x")
