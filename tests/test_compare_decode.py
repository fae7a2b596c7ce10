"""melt_core.ops.profiler.compare_decode: the side-by-side timing loop every decode benchmark uses.
One model under several names (exit rules, static twins) is prefilled once a round; each name must
still decode its own cache, from the prefilled state, as if it had prefilled alone."""

from types import SimpleNamespace

import torch

from melt_core.modeling.config import ModelConfig
from melt_core.modeling.early_exit import ExitRule
from melt_core.modeling.shapes import SPEED_SHAPES
from melt_core.ops import profiler
from melt_core.ops.profiler import build_random, compare_decode, with_static_twins


def test_one_prefill_per_model_each_name_its_own_cache(monkeypatch):
    torch.manual_seed(0)
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["tiny"]), torch.float32)
    melt = profiler.melt_from_ouro(ouro)
    models, static = with_static_twins({"ouro": ouro, "melt": melt})
    models["melt@1"] = melt
    rules = {"melt@1": ExitRule(exit_at_loop=1)}
    prefills, caches, seen = [], [], {}  # caches: held, so no two share an id
    real_prefill, real_step = profiler._prefill, profiler._decode_step

    def prefill(model, *a, **k):
        prefills.append(model)
        return real_prefill(model, *a, **k)

    def step(model, cache, token, exit_rule=None):
        rows = cache.cache.seen if isinstance(cache, profiler.StaticDecode) else cache.seen
        if not any(c is cache for c in caches):
            caches.append(cache)
        seen.setdefault(id(cache), []).append(rows)
        return real_step(model, cache, token, exit_rule)

    monkeypatch.setattr(profiler, "_prefill", prefill)
    monkeypatch.setattr(profiler, "_decode_step", step)
    rows = compare_decode(models, [1], [12], steps=5, rounds=2, prefill_chunk=4, warm_up=False,
                          exit_rules=rules, static=static)
    assert [m is ouro for m in prefills] == [True, False, True, False]  # two models, two rounds
    assert len(seen) == 2 * len(models)  # every name a cache of its own, every round
    assert all(v == [12, 13, 14, 15, 16] for v in seen.values())  # each from the prefilled 12 rows on
    by = {r["model"]: r for r in rows}
    assert by["melt"]["ttft_s"] == by["melt-static"]["ttft_s"] == by["melt@1"]["ttft_s"]


def test_a_prefill_past_its_budget_is_timed_once_and_every_round_decodes_a_copy(monkeypatch):
    """A model whose prefill took its budget is not prefilled again: later rounds decode from a copy
    of that one prefilled cache, each from the prefilled rows on, and each round still times decode."""
    torch.manual_seed(0)
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["tiny"]), torch.float32)
    models = {"ouro": ouro, "melt": profiler.melt_from_ouro(ouro)}
    prefills, caches, seen = [], [], []
    real_prefill, real_step = profiler._prefill, profiler._decode_step

    def prefill(model, *a, **k):
        prefills.append(model)
        return real_prefill(model, *a, **k)

    def step(model, cache, token, exit_rule=None):
        if not any(c is cache for c in caches):
            caches.append(cache)
            seen.append(cache.seen)
        return real_step(model, cache, token, exit_rule)

    monkeypatch.setattr(profiler, "_prefill", prefill)
    monkeypatch.setattr(profiler, "_decode_step", step)
    rows = compare_decode(models, [1], [12], steps=3, rounds=3, prefill_chunk=4, warm_up=False, prefill_budget_s=0.0)
    assert [m is ouro for m in prefills] == [True, False]  # once each, not once a round
    assert seen == [12] * 6  # two models x three rounds, each a fresh copy of the 12 prefilled rows
    assert all(len(r["decode_tok_s_rounds"]) == 3 for r in rows)


def test_the_shared_prefill_decodes_what_a_prefill_of_its_own_does():
    """Greedy tokens after a copied cache equal those after a fresh prefill of the same prompt."""
    torch.manual_seed(0)
    melt = profiler.melt_from_ouro(build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["tiny"]), torch.float32))
    ids = torch.randint(1, melt.config.vocab_size, (2, 10))

    def greedy(cache, token, n=4):
        out = []
        for _ in range(n):
            token = melt(token, cache=cache, logits="last").logits[:, -1].argmax(-1, keepdim=True)
            out.append(token)
        return torch.cat(out, 1)

    with torch.no_grad():
        cache = melt.new_cache(capacity=20)
        token = melt(ids, cache=cache, chunk_size=4, logits="last").logits[:, -1].argmax(-1, keepdim=True)
        copied = profiler.copy.deepcopy(cache)
        first = greedy(copied, token)
        fresh = melt.new_cache(capacity=20)
        melt(ids, cache=fresh, chunk_size=4, logits="last")
        assert first.equal(greedy(fresh, token)) and first.equal(greedy(cache, token))


def test_rates_are_rows_times_tokens_over_the_measured_seconds(monkeypatch):
    """On a clock the test controls (prefill 0.5 s, a decode step 0.01 s whatever the batch), the
    rows report batch x context / 0.5 prefill tokens/s and batch / 0.01 decode tokens/s."""
    torch.manual_seed(0)
    ouro = build_random(ModelConfig(model_type="ouro", **SPEED_SHAPES["tiny"]), torch.float32)
    real_prefill, real_step = profiler._prefill, profiler._decode_step
    monkeypatch.setattr(profiler, "_prefill", lambda *a, **k: (*real_prefill(*a, **k)[:2], 0.5))
    monkeypatch.setattr(profiler, "_decode_step", lambda *a, **k: (real_step(*a, **k)[0], 0.01))
    (row,) = compare_decode({"ouro": ouro}, [3], [8], steps=4, rounds=2, prefill_chunk=4, warm_up=False)
    assert row["ttft_s"] == 0.5 and row["prefill_tok_s"] == 3 * 8 / 0.5
    assert row["decode_step_s"] == 0.01 and row["decode_tok_s"] == 3 / 0.01
    assert row["decode_tok_s_rounds"] == [300.0, 300.0]


def test_training_ratios_are_ouros_step_time_over_melts(monkeypatch):
    """train_throughput on a clock the test controls: Ouro's parallel step takes 1 s, MELT's
    chunk-wise one 4 s, so MELT trains at 0.25x Ouro's tokens/s in every round."""
    reads = iter([0.0, 1.0, 1.0, 5.0] * 3)  # per round: Ouro's step from 0 to 1 s, then MELT's from 1 to 5 s
    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=lambda: next(reads)))
    cfg = ModelConfig(model_type="ouro", **SPEED_SHAPES["tiny"])
    with torch.no_grad():  # as a caller that imported lighteval has it: the steps still backpropagate
        rows = {r["model"]: r for r in profiler.train_throughput(cfg, seq_len=8, batch=2, chunk_sizes=[4], steps=3)}
    assert rows["ouro-parallel"]["tokens_per_s"] == 16.0 and rows["melt-C4"]["tokens_per_s"] == 4.0
    assert rows["melt-C4"]["ratio_to_ouro"] == 0.25 and rows["melt-C4"]["ratio_rounds"] == [0.25] * 3
