"""Protects faithfulness to Ouro: our loader + forward must reproduce the reference code's
outputs stored with the tiny fixture, in every way we run Ouro (full, chunked, cached)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import melt_core
from melt_core.modeling.checkpoint import write_checksums
from melt_core.modeling.model import exit_distribution

ATOL = 1e-4


def test_full_forward_matches_reference(ouro, reference):
    with torch.no_grad():
        out = ouro(reference["input_ids"])
    torch.testing.assert_close(out.per_loop_logits, reference["per_loop_logits"], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.exit_logits, reference["exit_gate_logits"], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logits, reference["final_logits"], atol=ATOL, rtol=0)
    assert out.logits.shape == (2, 12, 97) and out.per_loop_logits.shape == (4, 2, 12, 97)


@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_any_chunk_size_is_exact_for_ouro(ouro, reference, chunk):
    with torch.no_grad():
        out = ouro(reference["input_ids"], chunk_size=chunk)
    torch.testing.assert_close(out.per_loop_logits, reference["per_loop_logits"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("capacity", [None, 12])
def test_incremental_decoding_with_per_loop_cache(ouro, reference, capacity):
    ids = reference["input_ids"]
    cache = ouro.new_cache(capacity=capacity)
    with torch.no_grad():
        steps = [ouro(ids[:, :8], cache=cache).logits]
        steps += [ouro(ids[:, i:i + 1], cache=cache).logits for i in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), reference["final_logits"], atol=ATOL, rtol=0)


def test_exit_distribution_sums_to_one_and_follows_definition(reference):
    logits = reference["exit_gate_logits"]
    p = exit_distribution(logits)
    lam = torch.sigmoid(logits)
    torch.testing.assert_close(p.sum(0), torch.ones_like(p[0]))
    torch.testing.assert_close(p[1], lam[1] * (1 - lam[0]))
    torch.testing.assert_close(p[-1], (1 - lam[:-1]).prod(0))


def test_sharded_checkpoint_loads_identically(ouro, fixture_dir, tmp_path, reference):
    state = load_file(str(fixture_dir / "model.safetensors"))
    keys = sorted(state)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half],
              "model-00002-of-00002.safetensors": keys[half:]}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(tmp_path / name))
    index = {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(fixture_dir / "config.json", tmp_path / "config.json")
    write_checksums(tmp_path)  # as the download rule leaves a sharded hub snapshot
    sharded = melt_core.load_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(sharded(reference["input_ids"]).logits, reference["final_logits"],
                                   atol=ATOL, rtol=0)
