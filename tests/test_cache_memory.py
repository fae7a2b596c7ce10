"""Protects the memory claim: the bytes a cache actually holds after L tokens equal the
analytic formula (MELT: N*2*H_kv*D*bytes*L, plus the window's T-fold rows; Ouro: T times
MELT), at the tiny shape through the model and at the real Ouro-1.4B shape in bf16."""

import pytest
import torch
from helpers import make_melt

from melt_core import LoopKVCache, ModelConfig, SharedKVCache


@pytest.mark.parametrize("window", [0, 4])
def test_held_bytes_match_formula_tiny(ouro, window):
    L, B = 10, 2
    melt = make_melt(ouro, window=window)
    ids = torch.randint(1, 97, (B, L))
    for model in (ouro, melt):
        cache = model.new_cache(capacity=L)
        with torch.no_grad():
            model(ids[:, :6], cache=cache, chunk_size=3)
            for i in range(6, L):
                model(ids[:, i:i + 1], cache=cache)
        assert cache.nbytes() == model.config.kv_bytes(L, dtype_bytes=4, batch=B)
    assert ouro.config.kv_bytes(L, 4) == 4 * melt.config.replace(window=0).kv_bytes(L, 4)


def fill(cache, cfg, L, dtype=torch.bfloat16):
    """Feed L tokens of real-shape K/V through a cache exactly as the model would."""
    H, D = cfg.num_key_value_heads, cfg.head_dim
    for _ in range(L):
        cache.begin_chunk(1, None)
        for t in range(cfg.total_ut_steps):
            for l in range(cfg.num_hidden_layers):
                kv = (torch.randn(1, H, 1, D, dtype=dtype), torch.randn(1, H, 1, D, dtype=dtype))
                cache.read(l, t, kv)
        cache.end_chunk()
    return cache.nbytes()


def test_paper_shapes_bf16():
    ouro, melt = ModelConfig.from_name("ouro-1.4b"), ModelConfig.from_name("melt-1.6b")
    qwen = ModelConfig.from_name("qwen3-1.7b-shape")
    assert ouro.kv_bytes_per_token(2) == 786_432  # 0.786432 MB/token (Table 2)
    assert melt.kv_bytes_per_token(2) == 196_608  # 0.196608 MB/token
    assert qwen.kv_bytes_per_token(2) == 114_688  # 0.114688 MB/token
    L = 16
    assert fill(LoopKVCache(24, 4, capacity=L), ouro, L) == L * 786_432
    assert fill(SharedKVCache(24, 4, capacity=L), melt, L) == L * 196_608
    w = melt.replace(window=4)
    assert fill(SharedKVCache(24, 4, capacity=L, window=4), w, L) == (L + 4 * 4) * 196_608


@pytest.mark.parametrize("T", [1, 2, 6])
def test_melt_cache_flat_in_loops_ouro_linear(T):
    L = 8
    melt = ModelConfig.from_name("melt-1.6b", total_ut_steps=T, num_hidden_layers=2)
    ouro = ModelConfig.from_name("ouro-1.4b", total_ut_steps=T, num_hidden_layers=2)
    assert fill(SharedKVCache(2, T, capacity=L), melt, L) == L * 2 * 2 * 16 * 128 * 2
    assert fill(LoopKVCache(2, T, capacity=L), ouro, L) == T * L * 2 * 2 * 16 * 128 * 2
