"""Protects checkpoint I/O: conversion keeps every Ouro weight and round-trips exactly;
bad files and bad configs fail with one clear error naming the file, key or field;
a failed conversion leaves nothing behind."""

import json
import os
import shutil
import stat

import pytest
import torch
from numerics import assert_same_function, assert_tolerance_can_fail
from safetensors.torch import load_file, save_file

import melt_core
from melt_core import CheckpointError, ConfigError, ModelConfig
from melt_core.modeling.checkpoint import write_checksums
from melt_core.ops.download import fetch


def copy_fixture(fixture_dir, dst):
    shutil.copytree(fixture_dir, dst)
    (dst / "reference_outputs.safetensors").unlink()
    write_checksums(dst)  # the copy as the pipeline would hold it
    return dst


def test_conversion_round_trip(ouro, fixture_dir, tmp_path, reference):
    dst = melt_core.convert_ouro_to_melt(fixture_dir, tmp_path / "melt", gate="elementwise",
                                         window=2, gate_init_std=0.3, seed=7)
    melt = melt_core.load_pretrained(dst)
    assert melt.config.is_melt and melt.config.window == 2
    ours, theirs = melt.state_dict(), ouro.state_dict()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    again = melt_core.melt_from_ouro(ouro, gate="elementwise", window=2, gate_init_std=0.3, seed=7)
    for key, value in again.state_dict().items():
        assert torch.equal(ours[key], value), key  # same seed, same gates
    # two separately built models: the same function within float32 rounding, not bitwise
    run = lambda m: m(reference["input_ids"], chunk_size=3).logits  # noqa: E731
    with torch.no_grad():
        want = run(again)
        atol = assert_same_function(run(melt), want, again.config)
    assert_tolerance_can_fail(again, run, want, atol)
    saved = json.loads((dst / "config.json").read_text())
    assert saved["model_type"] == "melt" and "seed 7" in saved["gate_init"]
    assert melt.config.gate_parameters() == 3 * (2 * 64 * 64 + 64)


def test_conversion_carries_the_tokenizer_and_generation_files_along(fixture_dir, tmp_path):
    """The hub's side files (tokenizer, chat template, generation config) reach the MELT checkpoint
    unchanged and under its checksums: the evals read the tokenizer and template from there."""
    src = copy_fixture(fixture_dir, tmp_path / "ouro")
    for i, name in enumerate(melt_core.modeling.checkpoint.SIDE_FILES):
        (src / name).write_text(json.dumps({"file": name, "i": i}))
    dst = melt_core.convert_ouro_to_melt(src, tmp_path / "melt", gate="scalar")
    sums = json.loads((dst / "checksums.json").read_text())
    for name in melt_core.modeling.checkpoint.SIDE_FILES:
        assert (dst / name).read_bytes() == (src / name).read_bytes() and name in sums, name
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"} <= set(sums)


def test_gate_parameter_count_at_paper_scale():
    assert ModelConfig.from_name("melt-1.6b").gate_parameters() == 24 * (2 * 2048**2 + 2048)  # ~0.2B
    assert ModelConfig.from_name("melt-3.1b").gate_parameters() == 48 * (2 * 2048**2 + 2048)


def test_conversion_draws_the_gates_as_configured(ouro):
    """W_z and U_z ~ N(0, gate_init_std^2) from the seed's own generator, b_z = gate_bias_init; every
    weight that is Ouro's is copied untouched."""
    a = melt_core.melt_from_ouro(ouro, gate="elementwise", gate_init_std=0.5, gate_bias_init=-2.0, seed=3)
    again = melt_core.melt_from_ouro(ouro, gate="elementwise", gate_init_std=0.5, gate_bias_init=-2.0, seed=3)
    other = melt_core.melt_from_ouro(ouro, gate="elementwise", gate_init_std=0.5, gate_bias_init=-2.0, seed=4)
    w = torch.cat([p.detach().flatten() for layer in a.model.layers for p in (layer.gate.input_proj.weight,
                                                                      layer.gate.state_proj.weight)])
    # thousands of draws: the sample std of N(0, 0.25) is within 5% of 0.5, its mean near 0
    assert w.numel() > 2000 and abs(float(w.std()) - 0.5) < 0.025 and abs(float(w.mean())) < 0.05
    assert all(bool((layer.gate.input_proj.bias == -2.0).all()) for layer in a.model.layers)
    ours, sa, sb, so = ouro.state_dict(), a.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # the seed decides
    assert any(not torch.equal(sa[k], so[k]) for k in sa if ".gate." in k)
    assert all(torch.equal(sa[k], v) for k, v in ours.items())


@pytest.mark.parametrize("variant", ["elementwise", "scalar", "mean", "ema", "last"])
def test_every_gate_variant_round_trips(ouro, tmp_path, variant, reference):
    """A round trip keeps every tensor bitwise (names, dtypes, values) and the function within
    float32 rounding (tests/numerics.py): the reloaded model is a separately built object whose
    kernels may sum in another order."""
    melt = melt_core.melt_from_ouro(ouro, gate=variant, seed=3)
    back = melt_core.load_pretrained(melt_core.save_pretrained(melt, tmp_path / variant))
    saved, loaded = melt.state_dict(), back.state_dict()
    assert saved.keys() == loaded.keys()
    for key, value in saved.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    run = lambda m: m(reference["input_ids"]).logits  # noqa: E731
    with torch.no_grad():
        want = run(melt)
        atol = assert_same_function(run(back), want, melt.config)
    assert_tolerance_can_fail(melt, run, want, atol)


def test_loaded_weights_live_in_torch_allocated_memory(ouro, tmp_path):
    """safetensors hands out tensors at the file's 8-byte-aligned offsets; BLAS picks other kernels
    (another summation order) for such operands, which made a reloaded model differ from the saved
    one in the last bits on some machines. The loader copies into torch's 64-byte-aligned storage."""
    back = melt_core.load_pretrained(melt_core.save_pretrained(ouro, tmp_path / "o"))
    unaligned = [n for n, p in back.named_parameters() if p.data_ptr() % 64]
    assert not unaligned, unaligned


def test_missing_weights_file(fixture_dir, tmp_path):
    d = copy_fixture(fixture_dir, tmp_path / "ck")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing weights file"):
        melt_core.load_pretrained(d)


def test_truncated_weights_file(fixture_dir, tmp_path):
    d = copy_fixture(fixture_dir, tmp_path / "ck")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        melt_core.load_pretrained(d)


def test_missing_and_misshapen_keys(fixture_dir, tmp_path):
    d = copy_fixture(fixture_dir, tmp_path / "ck")
    state = load_file(str(d / "model.safetensors"))
    bad = dict(state)
    bad.pop("model.layers.1.mlp.up_proj.weight")
    save_file(bad, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing key\(s\) \['model\.layers\.1\.mlp\.up_proj"):
        melt_core.load_pretrained(d)
    bad = dict(state)
    bad["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 64)
    save_file(bad, str(d / "model.safetensors"))
    shape_msg = r"k_proj\.weight has shape \(32, 64\) but the config implies \(64, 64\)"
    with pytest.raises(CheckpointError, match=shape_msg):
        melt_core.load_pretrained(d)


def test_non_ouro_model_type(fixture_dir, tmp_path):
    d = copy_fixture(fixture_dir, tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config\.json: model_type 'llama' is not an Ouro or MELT"):
        melt_core.load_pretrained(d)


def test_not_a_checkpoint_dir(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        melt_core.load_pretrained(tmp_path / "nope")


@pytest.mark.parametrize("field,value,pattern", [
    ("gate", "lstm", "unknown gate variant 'lstm'"),
    ("window", -1, "sliding window W must be an integer >= 0"),
    ("num_key_value_heads", 3, "must divide num_attention_heads"),
])
def test_bad_model_config_fields(field, value, pattern):
    with pytest.raises(ConfigError, match=f"`{field}`: .*{pattern}"):
        ModelConfig(model_type="melt", **{field: value})


def test_bad_chunk_and_alpha(ouro, reference):
    with pytest.raises(ConfigError, match="chunk_size must be >= 1"):
        ouro(reference["input_ids"], chunk_size=0)
    with pytest.raises(ConfigError, match="alpha < 1 .* needs a MELT model"):
        ouro(reference["input_ids"], alpha=0.5)
    with pytest.raises(ConfigError, match="beyond max_position_embeddings=256"):
        ouro(reference["input_ids"][:, :2], positions=torch.tensor([[255, 256]] * 2))


def test_failed_conversion_leaves_nothing(fixture_dir, tmp_path, monkeypatch):
    import melt_core.modeling.checkpoint as ck

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        melt_core.convert_ouro_to_melt(fixture_dir, tmp_path / "melt")
    assert list(tmp_path.iterdir()) == []


def test_conversion_cli(fixture_dir, tmp_path):
    from melt_core.modeling.convert import main

    main([str(fixture_dir), str(tmp_path / "m"), "--gate", "scalar", "--window", "5", "--seed", "2"])
    cfg = melt_core.load_pretrained(tmp_path / "m").config
    assert (cfg.gate, cfg.window) == ("scalar", 5)


def test_a_flipped_bit_in_a_saved_checkpoint_is_refused(ouro, tmp_path):
    """Our checkpoints carry a sha256 manifest written at save and verified at every load."""
    path = melt_core.save_pretrained(ouro, tmp_path / "ck")
    sums = json.loads((path / "checksums.json").read_text())
    assert {"model.safetensors", "config.json"} <= set(sums)
    melt_core.load_pretrained(path)  # intact: loads
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-100] ^= 0x01  # one bit inside the tensor data: safetensors itself would not notice
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 .* differs from checksums\.json"):
        melt_core.load_pretrained(path)


def test_a_checkpoint_with_non_finite_weights_is_refused_by_name(fixture_dir, tmp_path):
    d = copy_fixture(fixture_dir, tmp_path / "ck")
    state = load_file(str(d / "model.safetensors"))
    state["model.layers.2.mlp.down_proj.weight"][3, 5] = float("nan")
    state["model.layers.2.mlp.down_proj.weight"][0, 0] = float("inf")
    save_file(state, str(d / "model.safetensors"))
    write_checksums(d)  # the manifest agrees: only the values are wrong
    with pytest.raises(CheckpointError, match=r"weight model\.layers\.2\.mlp\.down_proj\.weight holds 2 non-finite"):
        melt_core.load_pretrained(d)
    with pytest.raises(CheckpointError, match="non-finite"):  # nor does the download rule take such weights
        fetch(tmp_path / "fetched", local_dir=d)
    assert not (tmp_path / "fetched").exists()


ABSURD = """
import sys, time
from melt_core import CheckpointError, load_pretrained
t0 = time.perf_counter()
try:
    load_pretrained(sys.argv[1])
except CheckpointError as err:
    print(f"{time.perf_counter() - t0:.3f}", err)
"""


def test_an_absurd_layer_count_is_refused_from_the_header_before_allocating(fixture_dir, tmp_path):
    """10^9 layers: refused from the weight file's header, before a key list or a model of that size
    is built (it ran on past 30 s). In a child capped at 4 GB of address space and 120 s, so a broken
    check fails here instead of filling the machine; the 2-second bound only guards against that."""
    import resource
    import subprocess
    import sys

    d = copy_fixture(fixture_dir, tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1_000_000_000}))
    cap = 4 << 30
    out = subprocess.run([sys.executable, "-c", ABSURD, str(d)], capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert out.returncode == 0 and "num_hidden_layers=1000000000 but the weights hold 3 layer" in out.stdout, \
        (out.stdout, out.stderr[-1000:])
    assert float(out.stdout.split()[0]) < 2.0, out.stdout


def test_a_checkpoint_without_its_manifest_is_refused_until_rewritten_on_purpose(ouro, tmp_path, capsys):
    path = melt_core.save_pretrained(ouro, tmp_path / "ck")
    (path / "checksums.json").unlink()
    with pytest.raises(CheckpointError, match=r"checksums\.json: missing.*python -m melt_core\.modeling\.checkpoint "
                                              r"write-checksums"):
        melt_core.load_pretrained(path)
    melt_core.load_pretrained(path, require_checksums=False)  # a raw hub snapshot, opened on purpose
    from melt_core.modeling.checkpoint import main

    main(["write-checksums", str(path)])  # the command the error names
    assert "checksums.json: 2 file(s) recorded" in capsys.readouterr().out  # config.json, model.safetensors
    melt_core.load_pretrained(path)


def test_checkpoints_follow_the_umask(ouro, tmp_path):
    old = os.umask(0o022)
    try:
        path = melt_core.save_pretrained(ouro, tmp_path / "ck")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert {stat.S_IMODE(f.stat().st_mode) for f in path.iterdir()} == {0o644}


def test_a_dense_checkpoint_that_does_not_match_its_architecture_is_refused(fixture_dir, tmp_path):
    """An Ouro checkpoint relabelled `llama` would load as a Llama with six weight groups dropped
    and the rest random: refused, naming the keys."""
    from melt_core.modeling.dense import DenseLM

    d = copy_fixture(fixture_dir, tmp_path / "ck")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (d / "config.json").write_text(json.dumps(cfg))
    write_checksums(d)  # relabelled on purpose: the manifest agrees, the weights do not
    with pytest.raises(CheckpointError, match=r"weights do not match .*\(llama\): missing .*unexpected"):
        DenseLM.from_pretrained(d)


def test_a_dense_checkpoint_with_a_misshapen_weight_is_refused_and_a_tied_head_is_not_missing(tmp_path):
    """A Qwen3 checkpoint with a tied head (no lm_head.weight stored) loads; the same checkpoint with
    one weight of the wrong shape is refused with our error, naming the weight (transformers alone
    raises without saying which checkpoint or how to fix it)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from melt_core.modeling.dense import DenseLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "q", safe_serialization=True)
    assert "lm_head.weight" not in load_file(str(tmp_path / "q" / "model.safetensors"))
    write_checksums(tmp_path / "q")  # as the download rule leaves a hub snapshot
    DenseLM.from_pretrained(tmp_path / "q")
    state = load_file(str(tmp_path / "q" / "model.safetensors"))
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(70, 32)
    save_file(state, str(tmp_path / "q" / "model.safetensors"), metadata={"format": "pt"})
    write_checksums(tmp_path / "q")
    with pytest.raises(CheckpointError, match=r"\(qwen3\): missing \[\], unexpected \[\], misshapen "
                                              r"\['model.layers.0.mlp.up_proj.weight'\]"):
        DenseLM.from_pretrained(tmp_path / "q")
