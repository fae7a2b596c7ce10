"""Protects the profiler's numbers (KV bytes read off real-shape caches equal the paper's
analytic figures; the Ouro/MELT ratio is T; bad requests give clear errors) and the stage-1
checkpoint fetch (checksums verified, a corrupt file refused, nothing half-written)."""

import json
import shutil

import pytest
import torch

from melt_core.modeling.checkpoint import CheckpointError
from melt_core.modeling.config import ConfigError
from melt_core.ops.download import fetch, manifest
from melt_core.ops.profiler import loop_and_window_sweeps, profile_memory


def test_profile_memory_real_shape_small_depth():
    # The full 24-layer shape is profiled by the workflow; here 2 layers keep the test fast while
    # every per-layer dimension (d=2048, 16 heads of 128, vocab 49152) is the real one.
    r = profile_memory("melt-1.6b", torch.bfloat16, kv_tokens=4, context=32768, cap_gb=80, num_hidden_layers=2)
    assert r.kv_bytes_measured == r.kv_bytes_analytic == 4 * 2 * 2 * 16 * 128 * 2
    assert r.weights_bytes_measured == r.weights_bytes_analytic == 2 * r.parameters
    o = profile_memory("ouro-1.4b", torch.bfloat16, kv_tokens=4, context=32768, cap_gb=80, num_hidden_layers=2)
    assert o.kv_bytes_measured == 4 * r.kv_bytes_measured
    assert r.parameters - o.parameters == 2 * (2 * 2048 * 2048 + 2048)  # the gates
    for m in (r, o):  # the largest batch whose weights and 32K-token caches fit in the 80 GB cap
        kv_context = m.kv_bytes_analytic / m.kv_tokens * m.context
        assert m.weights_bytes_analytic + m.max_batch * kv_context <= 80e9
        assert m.weights_bytes_analytic + (m.max_batch + 1) * kv_context > 80e9


def test_tied_weights_count_once_and_the_total_grows_with_the_context():
    """Qwen3-1.7B ties its head to its embedding: one tensor, counted once in bytes held as in
    parameters; the planned total is the weights plus the KV of the context asked for."""
    q = profile_memory("qwen3-1.7b-shape", torch.bfloat16, kv_tokens=2, context=1024, num_hidden_layers=1)
    assert q.weights_bytes_measured == q.weights_bytes_analytic == 2 * q.parameters
    longer = profile_memory("qwen3-1.7b-shape", torch.bfloat16, kv_tokens=2, context=4096, num_hidden_layers=1)
    assert (longer.total_gb_analytic - q.total_gb_analytic) * 1e9 == pytest.approx(3072 * q.kv_bytes_analytic / 2)


def test_the_measured_kv_figure_is_what_the_cache_holds(monkeypatch):
    """The table's "KV MB/token (measured)" comes from the bytes the filled cache holds, not from the
    formula it is checked against (a cache holding a row too many shows)."""
    import melt_core.ops.profiler as profiler

    fill = profiler.fill_cache
    monkeypatch.setattr(profiler, "fill_cache", lambda *a, **k: fill(*a, **k) + 4096)
    r = profile_memory("melt-1.6b", torch.bfloat16, kv_tokens=4, context=1024, num_hidden_layers=1)
    assert r.kv_bytes_measured == r.kv_bytes_analytic + 4096
    assert r.kv_mb_per_token_measured == pytest.approx((r.kv_bytes_analytic + 4096) / 4 / 1e6)


def test_profile_bad_requests():
    with pytest.raises(ConfigError, match="beyond max_position_embeddings=65536"):
        profile_memory("ouro-1.4b", context=70000, num_hidden_layers=1)
    with pytest.raises(ConfigError, match="memory cap 0.1 GB is smaller than the ouro-1.4b weights"):
        profile_memory("ouro-1.4b", cap_gb=0.1, num_hidden_layers=1, kv_tokens=1)


def test_sweeps_flat_in_loops_linear_for_ouro():
    s = loop_and_window_sweeps("melt-1.6b", loops=(1, 2, 4), windows=(0, 8), context=16)
    melt = {p["T"]: p["kv_mb_per_token"] for p in s["loops"] if p["model"] == "melt"}
    ouro = {p["T"]: p["kv_mb_per_token"] for p in s["loops"] if p["model"] == "ouro"}
    assert melt[1] == melt[2] == melt[4] == pytest.approx(0.196608)
    assert ouro[4] == pytest.approx(4 * ouro[1]) and ouro[2] == pytest.approx(2 * ouro[1])
    w = {p["W"]: p["kv_mb_per_token"] for p in s["windows"]}
    assert w[8] == pytest.approx(0.196608 * (16 + 8 * 4) / 16)  # N*(L + W*T) rows


def test_fetch_local_verifies_checksums(fixture_dir, tmp_path):
    good = manifest(fixture_dir)
    out = fetch(tmp_path / "ck", local_dir=fixture_dir, sha256s={"model.safetensors": good["model.safetensors"]})
    assert json.loads((out / "source.json").read_text())["sha256"]["model.safetensors"] == good["model.safetensors"]
    bad = tmp_path / "bad"
    shutil.copytree(fixture_dir, bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="differs from the config.s sha256 manifest"):
        fetch(tmp_path / "ck2", local_dir=bad, sha256s={"model.safetensors": good["model.safetensors"]})
    assert not (tmp_path / "ck2").exists() and not list(tmp_path.glob(".ck2.tmp-*"))


def test_fetch_takes_no_pickle_and_no_code(fixture_dir, tmp_path):
    """The hub repos ship modeling code and may ship pickled weights: neither is copied (never run,
    never unpickled); the weights come from safetensors only."""
    src = tmp_path / "snapshot"
    shutil.copytree(fixture_dir, src)
    (src / "reference_outputs.safetensors").unlink()  # the fixture's, not a hub file
    for name in ("pytorch_model.bin", "modeling_ouro.py", "configuration_ouro.py", "training_args.bin"):
        (src / name).write_bytes(b"\x80\x04not for us")
    out = fetch(tmp_path / "ck", local_dir=src)
    assert {f.name for f in out.iterdir()} == {"config.json", "model.safetensors", "source.json", "checksums.json"}


def test_hub_fetch_needs_a_pinned_revision(tmp_path):
    with pytest.raises(CheckpointError, match="pin a commit"):
        fetch(tmp_path / "x", repo_id="ByteDance/Ouro-1.4B-Thinking", revision=None)
