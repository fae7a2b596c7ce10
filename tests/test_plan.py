"""Protects the cost plan (melt_core/ops/plan.py): its arithmetic, and that it flags the jobs a cluster
user must not submit as they are (over the runtime limit, or not fitting one sequence)."""

from pathlib import Path

import pytest
import torch
import yaml

from melt_core.modeling.config import ModelConfig
from melt_core.ops.plan import plan, render, weights_gb
from melt_core.serving.engine_choice import vllm_refusal

ROOT = Path(__file__).resolve().parents[1]


def unsharded_paper():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    for task in cfg["eval"]["tasks"].values():
        task.pop("shards", None)
    return cfg


def test_paper_plan_arithmetic_and_flags():
    cfg = unsharded_paper()
    cfg["eval"]["engine"] = "native"
    jobs, a = plan(cfg, {"ouro": "ouro", "melt-elementwise__full": "melt"}, [("elementwise", "phase1", 500)])
    train = next(j for j in jobs if j.stage == "train")
    assert train.tokens == 500 * 32 * 10_000 and train.gpus == 8
    assert train.gpu_hours == pytest.approx(train.tokens / a["train_tok_s_per_gpu"] / 3600)
    aime = {j.name: j for j in jobs if j.name.endswith(" aime24")}
    ouro, melt = aime["ouro aime24"], aime["melt-elementwise__full aime24"]
    assert ouro.tokens == 30 * 16 * 0.5 * 32768
    # Ouro's 32K-token cache (0.786 MB/token) fits 2 sequences in 80 GB, MELT's (1/4 of it) 11
    assert ouro.note.startswith("batch 2") and melt.note.startswith("batch 11")
    assert ouro.peak_gb <= 80 and melt.peak_gb <= 80
    assert weights_gb(ModelConfig.from_name("ouro-1.4b")) == pytest.approx(2.87, abs=0.05)
    assert "over the 24 h limit" in ouro.note
    text = render(jobs, a, cfg["name"])
    assert "| ouro aime24 |" in text and "GPU-hours" in text


def test_vllm_evals_are_priced_by_the_tokens_held_and_the_sharing_caches_stay_native():
    """eval.engine vllm (config/paper.yaml): paged KV holds each running sequence's tokens, on average the
    prompt and half the mean answer (300 + 8,192 tokens): Ouro's 0.786 MB a token gives 8 sequences in
    60 GB, MELT's quarter 35; a sharing baseline stays native, a whole 32K cache a row (2)."""
    cfg = unsharded_paper()
    assert cfg["eval"]["engine"] == "vllm" and cfg["eval"]["vllm"]["kv_cache_gb"] == 60
    models = {"ouro": "ouro", "melt-elementwise__full": "melt", "ouro-last-loop": "ouro"}
    jobs, _ = plan(cfg, models, [], native_models={"ouro-last-loop"})
    aime = {j.name: j for j in jobs if j.name.endswith(" aime24")}
    assert aime["ouro aime24"].note.startswith("vLLM batch 8")
    assert aime["melt-elementwise__full aime24"].note.startswith("vLLM batch 35")
    assert aime["ouro-last-loop aime24"].note.startswith("batch 2")
    native, _ = plan({**cfg, "eval": {**cfg["eval"], "engine": "native"}}, models, [])
    hours = {j.name: j.gpu_hours for j in native}
    assert aime["ouro-last-loop aime24"].gpu_hours == pytest.approx(hours["ouro-last-loop aime24"])


def test_vllm_evals_are_priced_from_what_the_engine_does():
    """A vLLM job: decode steps of the running batch at the stated share of HBM bandwidth, prompts
    prefilled in the batch (Ouro's 30 AIME prompts once for their 16 samples; MELT's every sample's,
    since its prefix hits end at a chunk start on a block edge and 300 tokens are one chunk of 500),
    and every sequence recomputed once at the mean tokens held where memory sets the batch."""
    from melt_core.ops.plan import decode_step_bytes, forward_flops_per_token, kv_read_per_position

    cfg = unsharded_paper()
    jobs, a = plan(cfg, {"ouro": "ouro", "melt-elementwise__full": "melt"}, [])
    aime = {j.name: j for j in jobs if j.name.endswith(" aime24")}
    ouro = ModelConfig.from_name("ouro-1.4b")
    tokens, batch, held = 30 * 16 * 16_384, 8, 300 + 8_192
    decode = (decode_step_bytes(ouro, 0, 0) * tokens / batch + tokens * held * kv_read_per_position(ouro)) / 3.35e12
    # each prompt in full once, then its last partial block (300 - 288 tokens) again for every other sample
    prefill = (30 * 300 + 30 * 15 * 12) * forward_flops_per_token(ouro, 300)
    preempt = 30 * 16 * held * forward_flops_per_token(ouro, held)
    want = (decode / 0.5 + (prefill + preempt) / (0.4 * 989.4e12)) / 3600
    assert aime["ouro aime24"].gpu_hours == pytest.approx(want, rel=1e-9)
    assert "(30 prompts computed)" in aime["ouro aime24"].note
    assert "(480 prompts computed)" in aime["melt-elementwise__full aime24"].note
    for j in aime.values():  # the assumed shares put the estimate at about 1 / 0.5 of the roofline
        assert 2 <= j.gpu_hours / j.limit_gpu_hours < 2.5, j.name
    token_by_token = {**cfg, "eval": {**cfg["eval"], "prefill_chunk": None}}
    (melt_jobs, _) = plan(token_by_token, {"melt-elementwise__full": "melt"}, [])
    assert "(30 prompts computed)" in next(j for j in melt_jobs if j.name.endswith(" aime24")).note


def test_one_decision_says_what_stays_off_vllm_and_names_the_key():
    """melt_core.serving.engine_choice.vllm_refusal: used by rule plan (native_models), the eval jobs and
    the vLLM model; a model vLLM runs gets None, every other one reason and the config key."""
    assert vllm_refusal() is None and vllm_refusal(window=0) is None
    refused = [vllm_refusal("last-loop"), vllm_refusal("default", keep_prompt=True), vllm_refusal(window=8),
               vllm_refusal(early_exit="threshold 0.9")]
    assert all(r and "eval.engine: native" in r for r in refused)
    assert "last-loop" in refused[0] and "+ prompt" in refused[1] and "W = 8" in refused[2] and "0.9" in refused[3]
    # torch-free, so the Snakefile can ask it while it builds the DAG: the module imports nothing
    assert "import" not in (ROOT / "melt_core/serving/engine_choice.py").read_text().replace(
        "from __future__ import annotations", "")


def test_more_nodes_train_in_fewer_hours_at_the_same_gpu_hours():
    """Two nodes of 8 GPUs: 16 GPUs a training job, half the wall-clock, the same GPU-hours and limit."""
    cfg = unsharded_paper()
    cfg["eval"]["tasks"] = {}
    (one,), _ = plan(cfg, {}, [("elementwise", "phase1", 500)])
    cfg["launcher"]["nodes"] = 2
    (two,), _ = plan(cfg, {}, [("elementwise", "phase1", 500)])
    assert (one.gpus, two.gpus) == (8, 16) and two.hours == pytest.approx(one.hours / 2)
    assert two.gpu_hours == pytest.approx(one.gpu_hours) and two.limit_gpu_hours == pytest.approx(one.limit_gpu_hours)


def test_a_sequence_that_cannot_fit_is_flagged():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    cfg["eval"]["tasks"] = {"aime24": {"lighteval": "aime/aime24", "max_new_tokens": 200_000}}
    jobs, _ = plan(cfg, {"ouro": "ouro"}, [])
    assert "batch 0; DOES NOT FIT" in jobs[0].note


def test_shards_split_a_job_under_the_limit_at_the_same_cost():
    """The plan names the shards a job needs; with them, each shard's job fits the limit and the
    GPU-hours stay the same."""
    cfg = unsharded_paper()
    cfg["eval"]["engine"] = "native"  # its 24 h overrun needs the native engine's batch of 2
    cfg["eval"]["tasks"] = {"aime24": cfg["eval"]["tasks"]["aime24"]}
    (whole,), _ = plan(cfg, {"ouro": "ouro"}, [])
    need = int(whole.note.rsplit("set shards: ", 1)[1])
    assert need > 1 and whole.hours > 24
    cfg["eval"]["tasks"] = {"aime24": {**cfg["eval"]["tasks"]["aime24"], "shards": need}}
    (split,), a = plan(cfg, {"ouro": "ouro"}, [])
    assert split.hours <= 24 and "limit" not in split.note and split.count == need
    assert split.gpu_hours == pytest.approx(whole.gpu_hours)
    assert f"({need} shards)" in render([split], a, "x") and f"## eval: {need} jobs" in render([split], a, "x")


def test_the_paper_config_shards_every_eval_job_under_the_limit():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    models = {"ouro": "ouro", "ouro-first-loop": "ouro", "melt-elementwise__full": "melt", "dense-qwen3-1.7b": "dense"}
    jobs, _ = plan(cfg, models, [], {"ouro": "ouro", "melt-elementwise__full": "melt"})
    over = [j.name for j in jobs if "limit" in j.note]
    assert not over, over
    unsharded, _ = plan(unsharded_paper(), models, [])
    assert sum(j.gpu_hours for j in jobs if j.stage == "eval") == pytest.approx(sum(j.gpu_hours for j in unsharded))


# Hand-counted parameters of the real shapes (hidden 2048, 16 heads of 128, 24 layers, MLP 5632,
# vocab 49152, T = 4): a layer holds q, k, v, o (4 x 2048 x 2048 = 16,777,216), the MLP
# (3 x 2048 x 5632 = 34,603,008) and 4 norms (8,192): 51,388,416; MELT adds its gate
# (2 x 2048 x 2048 + 2048 = 8,390,656). lm_head is untied: 49152 x 2048 = 100,663,296, plus the
# final norm (2,048). Qwen3-1.7B's shape: 28 layers, 8 KV heads, MLP 6144, a tied head of 151936.
OURO_LAYERS, MELT_GATES, HEAD = 24 * 51_388_416, 24 * 8_390_656, 100_663_296 + 2_048


def test_decode_step_bytes_at_the_real_shapes():
    from melt_core.ops.plan import decode_step_bytes, kv_read_per_position

    ouro, melt = ModelConfig.from_name("ouro-1.4b"), ModelConfig.from_name("melt-1.6b")
    qwen = ModelConfig.from_name("qwen3-1.7b-shape")
    # weights: every loop reads the layers, the head once
    assert decode_step_bytes(ouro, 0, 0) == 2 * (4 * OURO_LAYERS + HEAD) == 10_067_906_560
    assert decode_step_bytes(melt, 0, 0) == 2 * (4 * (OURO_LAYERS + MELT_GATES) + HEAD)
    # K/V: 4 loops x 24 layers x (K + V) x 16 heads x 128 x 2 bytes = 786,432 bytes a position, for both
    assert kv_read_per_position(ouro) == kv_read_per_position(melt) == 786_432
    assert kv_read_per_position(qwen) == 28 * 2 * 8 * 128 * 2 == 114_688
    assert decode_step_bytes(ouro, 3, 1000) - decode_step_bytes(ouro, 0, 0) == 3 * 1000 * 786_432
    # Qwen3-1.7B's shape in the profiler's one-loop architecture: q, o; k, v (8 heads); MLP; 4 norms
    qwen_layer = 2 * 2048 * 2048 + 2 * 2048 * 1024 + 3 * 2048 * 6144 + 4 * 2048
    assert decode_step_bytes(qwen, 0, 0) == 2 * (28 * qwen_layer + 151_936 * 2048 + 2048) == 3_441_364_992


def test_kv_reads_are_the_bytes_the_caches_hold_times_the_loops_that_read_them(ouro):
    """Ouro's loops each read their own rows: its cache's bytes; MELT's every loop reads its one
    shared row: T times its cache's bytes (tests/test_cache_memory.py ties these to real caches)."""
    from helpers import make_melt

    from melt_core.ops.plan import kv_read_per_position

    melt = make_melt(ouro)
    T = ouro.config.total_ut_steps
    assert kv_read_per_position(ouro.config, 4) == ouro.config.kv_bytes_per_token(4)
    assert kv_read_per_position(melt.config, 4) == T * melt.config.kv_bytes_per_token(4)
    cache = melt.new_cache(capacity=5)
    with torch.no_grad():
        melt(torch.randint(1, 97, (1, 5)), cache=cache)
    assert cache.nbytes() * T == 5 * kv_read_per_position(melt.config, 4)


def test_training_flops_at_the_real_shapes():
    from melt_core.ops.plan import train_flops_per_token

    ouro, melt = ModelConfig.from_name("ouro-1.4b"), ModelConfig.from_name("melt-1.6b")
    attention = 4 * 24 * 16 * 128 * 10_000 / 2  # per loop, a token attending to 5,000 keys on average
    student = 4 * (6 * (OURO_LAYERS + MELT_GATES + HEAD) + 3 * attention)
    teacher = 4 * (2 * (OURO_LAYERS + HEAD) + attention)
    assert train_flops_per_token(melt, ouro, 10_000) == pytest.approx(student + teacher, rel=1e-12)


def test_the_plan_shows_estimate_limit_and_ratio_per_job_and_in_total():
    cfg = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    jobs, a = plan(cfg, {"ouro": "ouro", "melt-elementwise__full": "melt"}, [("elementwise", "phase1", 500)])
    train = next(j for j in jobs if j.stage == "train")
    from melt_core.ops.plan import train_flops_per_token

    flops = train_flops_per_token(ModelConfig.from_name("melt-1.6b"), ModelConfig.from_name("ouro-1.4b"), 10_000)
    assert train.limit_gpu_hours == pytest.approx(500 * 32 * 10_000 * flops / 989.4e12 / 3600)
    for j in jobs:  # no assumed rate may beat the hardware
        assert 1 < j.gpu_hours / j.limit_gpu_hours, j.name
    text = render(jobs, a, cfg["name"])
    assert "| limit GPU-hours | estimate / limit |" in text and "the hardware's limit" in text
    cfg["plan"] = {"hbm_bytes_per_s": 2 * 3.35e12, "peak_bf16_flops": 2 * 989.4e12}  # stated config values
    doubled, _ = plan(cfg, {"ouro": "ouro"}, [])
    assert doubled[0].limit_hours == pytest.approx(jobs[1].limit_hours / 2)
