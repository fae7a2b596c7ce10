"""Protects generation: seeded sampling is reproducible, greedy equals step-by-step argmax,
stop tokens / strings end completions, and batching prompts of different lengths gives the
same completions as generating them one at a time."""

import pytest
import torch
from helpers import make_melt

import melt_core
from melt_core import ConfigError
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.early_exit import ExitRule

PROMPTS = [[5, 9, 13], [7, 1, 2, 3, 4, 8], [40, 41]]


class CharTok:
    """Token i decodes to chr(65 + i % 26)."""

    def decode(self, ids, **_):
        return "".join(chr(65 + i % 26) for i in ids)


@pytest.mark.parametrize("kind", ["ouro", "melt", "melt-chunked-prefill", "last-loop"])
def test_batched_greedy_equals_single(ouro, kind):
    model = ouro if kind in ("ouro", "last-loop") else make_melt(ouro)
    kw = {"cache_mode": "last-loop"} if kind == "last-loop" else {}
    if kind == "melt-chunked-prefill":
        kw["prefill_chunk"] = 4
    params = SamplingParams(max_new_tokens=6, greedy=True)
    together = generate(model, PROMPTS, params, **kw)
    for prompt, got in zip(PROMPTS, together):
        assert got[0].token_ids == generate(model, [prompt], params, **kw)[0][0].token_ids


def _greedy_alone(model, prompt, chunk, first, steps):
    """Greedy tokens of one prompt prefilled by the model's own forward (chunks of ``chunk``, the first
    ``first`` long), then decoded a token at a time through the same cache."""
    cache = model.new_cache()
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache, chunk_size=chunk, first_chunk=first,
                       logits="last").logits[0, -1]
        cache.end_prompt()
        out = []
        for _ in range(steps):
            out.append(int(logits.argmax()))
            logits = model(torch.tensor([[out[-1]]]), cache=cache, logits="last").logits[0, -1]
    return out


def test_chunked_prefill_cuts_each_prompt_from_its_first_token_in_any_batch(ouro):
    """prefill_chunk C: every prompt of a batch (lengths 5-13, so their padding differs mod C) is cut in
    chunks of C from its first token, as the training forward cuts a sequence; the batch's greedy
    tokens are those of each prompt alone. A cut back from the prompt's last token gives other tokens,
    so the equality says which cut ran."""
    melt = make_melt(ouro).double()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 13, 9, 6, 11, 8, 3, 2)]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    got = [row[0].token_ids for row in generate(melt, prompts, params, prefill_chunk=4)]
    assert got == [_greedy_alone(melt, p, 4, None, 6) for p in prompts]
    assert got != [_greedy_alone(melt, p, 4, len(p) % 4 or 4, 6) for p in prompts]


def test_prompts_within_one_chunk_prefill_in_one_pass(ouro, monkeypatch):
    """Prompts of at most C tokens are each one chunk whatever their padding: a batch of them takes one
    prefill pass (the paper's prompts are under its chunk of 500), and each row's tokens are its own."""
    melt = make_melt(ouro)
    passes = []
    real = type(melt).forward
    monkeypatch.setattr(type(melt), "forward", lambda self, ids, *a, **k: passes.append(ids.shape) or real(
        self, ids, *a, **k))
    params = SamplingParams(max_new_tokens=1, greedy=True)
    got = [row[0].token_ids for row in generate(melt, PROMPTS, params, prefill_chunk=8)]
    assert len(passes) == 1 and passes[0][0] == len(PROMPTS), passes
    assert got == [_greedy_alone(melt, p, 8, None, 1) for p in PROMPTS]


def test_greedy_is_argmax_of_full_recompute(ouro):
    melt = make_melt(ouro)
    out = generate(melt, [PROMPTS[1]], SamplingParams(max_new_tokens=5, greedy=True))[0][0]
    seq = list(PROMPTS[1])
    with torch.no_grad():
        for _ in range(5):  # no cache reuse: recompute the whole sequence token by token
            seq.append(int(melt(torch.tensor([seq]), chunk_size=1).logits[0, -1].argmax()))
    assert out.token_ids == seq[len(PROMPTS[1]):]
    assert out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_seed_matters(ouro):
    p = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, n=4, seed=11)
    a = generate(ouro, PROMPTS, p)
    b = generate(ouro, PROMPTS, p)
    c = generate(ouro, PROMPTS, SamplingParams(max_new_tokens=8, top_p=0.9, n=4, seed=12))
    ids = lambda r: [[s.token_ids for s in per] for per in r]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert len(a) == 3 and all(len(per) == 4 for per in a)


def test_tiny_top_p_is_greedy(ouro):
    greedy = generate(ouro, PROMPTS, SamplingParams(max_new_tokens=5, greedy=True))
    nucleus = generate(ouro, PROMPTS, SamplingParams(max_new_tokens=5, top_p=1e-6, seed=3))
    assert [g[0].token_ids for g in greedy] == [s[0].token_ids for s in nucleus]


def test_sampling_draws_from_the_tempered_nucleus():
    """sample_next draws from softmax(logits / temperature), cut to the smallest set of tokens whose
    mass reaches top_p: 4,000 rows, each its own seeded generator (so the counts are fixed), land
    within 3 standard errors of the exact probabilities."""
    import math

    from melt_core.generation.generate import sample_next

    n = 4000
    logits = torch.tensor([0.0, math.log(3.0), -1.0]).expand(n, 3)
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(n)]  # noqa: E731
    for temperature, top_p, expected in ((1.0, 1.0, [1, 3, math.exp(-1)]), (2.0, 1.0, [1, 3 ** 0.5, math.exp(-0.5)]),
                                         (1.0, 0.5, [0, 1, 0]), (1.0, 0.7, [1, 3, 0]), (2.0, 0.7, [1, 3 ** 0.5, 0])):
        p = torch.tensor(expected, dtype=torch.float64) / sum(expected)
        drawn = sample_next(logits, SamplingParams(temperature=temperature, top_p=top_p), gens())
        freq = torch.bincount(drawn, minlength=3).double() / n
        assert ((freq - p).abs() <= 3 * (p * (1 - p) / n).sqrt() + 1e-12).all(), (temperature, top_p, freq, p)


def test_stop_token_and_stop_string(ouro):
    free = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=8, greedy=True))[0][0].token_ids
    stop = free[2]
    out = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=8, greedy=True,
                                                      stop_token_ids=(stop,)))[0][0]
    assert out.finish_reason == "stop" and out.token_ids == free[:free.index(stop) + 1]
    text = CharTok().decode(free)
    s = text[3:5]
    out = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=8, greedy=True, stop_strings=(s,)),
                   tokenizer=CharTok())[0][0]
    assert out.finish_reason == "stop" and out.text == text[:text.index(s)]
    assert out.token_ids == free[:text.index(s)]  # the tokens of the text kept, none of the stop string's


def test_bad_sampling_input(ouro):
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="stop_strings need a tokenizer"):
        generate(ouro, PROMPTS, SamplingParams(stop_strings=("x",)))
    with pytest.raises(ConfigError, match="exceeds max_position_embeddings=256"):
        generate(ouro, PROMPTS, SamplingParams(max_new_tokens=300))


class CountingTok(CharTok):
    """CharTok that counts the tokens it decodes."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, **_):
        self.decoded += len(ids)
        return super().decode(ids)


def test_stop_strings_cost_linear_work_on_long_generations(ouro):
    """Checking stop strings decodes only each step's tail (plus the whole text once at the stop):
    a 240-token generation decodes O(tokens) tokens, not O(tokens^2); the stop lands where the
    full-text search puts it."""
    n = 240
    free = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=n, greedy=True, seed=0),
                    tokenizer=CharTok())[0][0]
    text = CharTok().decode(free.token_ids)
    never = "@@"  # CharTok only writes letters: this stop string never appears
    tok = CountingTok()
    out = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=n, greedy=True, stop_strings=(never,)),
                   tokenizer=tok)[0][0]
    assert out.finish_reason == "length" and out.token_ids == free.token_ids
    window = 4 * len(never) + 8
    assert tok.decoded <= n * window + 2 * n  # quadratic would be ~n^2 / 2 = 28,800
    assert tok.decoded < n * n / 8
    late = text[200:203]
    out = generate(ouro, [PROMPTS[0]], SamplingParams(max_new_tokens=n, greedy=True, stop_strings=(late,)),
                   tokenizer=CharTok())[0][0]
    assert out.finish_reason == "stop" and out.text == text[:text.index(late)]
    assert CharTok().decode(out.token_ids).startswith(out.text)


def test_batches_are_sized_from_memory(ouro, monkeypatch):
    """With a budget that holds exactly k sequences beside the weights, generation runs batches of
    at most k and gives what unbounded batches give; MELT fits about T times more sequences than
    Ouro in the same memory on long generations; one sequence that cannot fit is an error before
    any generation, with the bytes and the options named."""
    import melt_core.generation.generate as gen

    params = SamplingParams(max_new_tokens=6, greedy=True)
    weights = sum(t.numel() * t.element_size() for t in ouro.parameters())
    per_seq = (gen.cache_bytes_per_sequence(ouro, max(map(len, PROMPTS)) + 6)
               + gen.activation_bytes_per_sequence(ouro, max(map(len, PROMPTS)), None))
    budget = weights + 2 * per_seq + per_seq // 2
    assert gen.plan_batch(ouro, PROMPTS, params, budget) == 2
    sizes = []
    real = gen._Decoder.prefill
    monkeypatch.setattr(gen._Decoder, "prefill",
                        lambda self, prompts, capacity: sizes.append(len(prompts)) or real(self, prompts, capacity))
    planned = generate(ouro, PROMPTS, params, memory_budget_bytes=budget, batching="static")
    assert sizes == [2, 1]
    assert [p[0].token_ids for p in planned] == [p[0].token_ids for p in generate(ouro, PROMPTS, params)]
    # continuous: a refilled row also holds its new prompt's own cache while it is prefilled
    refill = gen.cache_bytes_per_sequence(ouro, max(map(len, PROMPTS)))
    assert gen.plan_batch(ouro, PROMPTS, params, weights + 2 * (per_seq + refill), refill=True) == 2
    assert gen.plan_batch(ouro, PROMPTS, params, weights + 2 * (per_seq + refill) - 1, refill=True) == 1
    long = SamplingParams(max_new_tokens=200)
    big = weights + 64 * gen.cache_bytes_per_sequence(ouro, 210)
    ratio = gen.plan_batch(make_melt(ouro), [[1] * 10], long, big) / gen.plan_batch(ouro, [[1] * 10], long, big)
    assert 3 <= ratio <= ouro.config.total_ut_steps
    with pytest.raises(ConfigError, match=r"one sequence of 6 prompt \+ 6 new tokens needs .* GB .*memory_budget_gb"):
        generate(ouro, PROMPTS, params, memory_budget_bytes=weights + per_seq // 2)


def test_sampled_completions_do_not_depend_on_batching(ouro):
    """Each (prompt, sample) draws from its own seeded stream: the same samples whatever the batch
    size (hence whatever memory budget or shard they are generated in); another seed, others."""
    p = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, n=3, seed=5)
    ids = lambda r: [[s.token_ids for s in per] for per in r]  # noqa: E731
    together = ids(generate(ouro, PROMPTS, p))
    assert ids(generate(ouro, PROMPTS, p, batch_size=1)) == together
    assert ids(generate(ouro, PROMPTS, p, batch_size=4)) == together
    alone = [ids(generate(ouro, [prompt], p))[0] for prompt in PROMPTS]
    assert alone == together
    assert ids(generate(ouro, PROMPTS, SamplingParams(max_new_tokens=8, top_p=0.9, n=3, seed=6))) != together


def _skewed_prompts(n: int = 9) -> list[list[int]]:
    """Prompts of 1-20 tokens; a batch of 3 starts with the 2-token prompt's samples, so the 20-token
    prompt after them needs more slots than the batch has made yet."""
    g = torch.Generator().manual_seed(0)
    lengths = [2, 20] + [int(x) for x in torch.randint(1, 12, (n - 2,), generator=g)]
    return [torch.randint(3, 90, (k,), generator=g).tolist() for k in lengths]


STOPS = tuple(range(3, 97, 8))  # one token in eight ends a completion: lengths from 1 to 24


CONTINUOUS_KINDS = ["ouro", "melt", "melt-chunked-prefill", "melt-window", "last-loop", "first-loop",
                    "melt-early-exit", "ouro-early-exit", "keep-prompt"]


def _model_and_kwargs(ouro, kind):
    if kind == "melt-window":
        return melt_core.melt_from_ouro(ouro, gate_init_std=0.3, seed=1, window=3), {}
    model = ouro if kind.startswith("ouro") or kind in ("last-loop", "first-loop", "keep-prompt") else make_melt(ouro)
    kw = {"melt-chunked-prefill": {"prefill_chunk": 4}, "last-loop": {"cache_mode": "last-loop"},
          "first-loop": {"cache_mode": "first-loop"},
          "keep-prompt": {"cache_mode": "last-loop", "keep_prompt": True},
          "melt-early-exit": {"exit_rule": ExitRule(q=0.3)},
          "ouro-early-exit": {"exit_rule": ExitRule(exit_at_loop=2)}}.get(kind, {})
    return model, kw


@pytest.mark.parametrize("kind", CONTINUOUS_KINDS)
def test_continuous_batching_equals_one_at_a_time(ouro, kind, monkeypatch):
    """A finished row takes the next (prompt, sample) at once: with skewed completion lengths (one
    token in eight stops), a batch of 3 over 27 samples refills rows, makes room for a
    longer prompt, drops slots no row reads when its buffers are full, and lets rows go when
    nothing is pending; every completion (tokens, finish reason, loops per token) is what
    generating it alone gives. Prompts are prefilled in a cache of their own and adopted, or, where
    prefill is token by token (exact), fed through the batch's decode steps."""
    model, kw = _model_and_kwargs(ouro, kind)
    prompts = _skewed_prompts()
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=3, seed=4, stop_token_ids=STOPS)
    alone = [generate(model, [p], params, batching="static", **kw)[0] for p in prompts]
    calls = {"adopt": 0, "reset": 0, "left": 0, "right": 0, "select": 0}
    kind_of_cache = type(model.new_cache(capacity=1, mode=kw.get("cache_mode", "default"),
                                         keep_prompt=kw.get("keep_prompt", False)))
    for name in ("adopt", "reset", "shift", "select"):
        real = getattr(kind_of_cache, name)

        def spy(self, arg, *rest, _real=real, _name=name):
            calls[_name if _name != "shift" else ("left" if arg < 0 else "right")] += 1
            return _real(self, arg, *rest)
        monkeypatch.setattr(kind_of_cache, name, spy)
    together = generate(model, prompts, params, batching="continuous", batch_size=3, **kw)
    as_ids = lambda r: [[(s.token_ids, s.finish_reason, s.loops) for s in per] for per in r]  # noqa: E731
    assert as_ids(together) == as_ids(alone)
    lengths = sorted(len(s.token_ids) for per in alone for s in per)
    assert lengths[0] <= 2 and lengths[-1] >= 12  # skewed, or the test would not test refills
    assert calls["left"] >= 1 and calls["select"] >= 1, calls
    if kind in ("ouro", "melt-chunked-prefill", "ouro-early-exit", "keep-prompt"):  # prompts prefilled apart
        assert calls["adopt"] >= 10 and calls["right"] >= 1 and calls["reset"] == 0, calls
    else:  # exact token-by-token prefill: a refilled row feeds its prompt through the decode steps
        assert calls["reset"] >= 10 and calls["adopt"] == 0, calls


def test_continuous_batching_keeps_the_batch_full(ouro, monkeypatch):
    """The point of refilling: on skewed lengths continuous batching runs fewer decode steps than
    static batches of the same size, each with the same number of rows or fewer."""
    import melt_core.generation.generate as gen

    prompts = _skewed_prompts()
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=3, seed=4, stop_token_ids=STOPS)
    steps = {"static": [], "continuous": []}
    real = gen._Decoder.step
    for mode, rows in steps.items():
        monkeypatch.setattr(gen._Decoder, "step",
                            lambda self, tokens, *a, _rows=rows: _rows.append(len(tokens)) or real(self, tokens, *a))
        generate(ouro, prompts, params, batching=mode, batch_size=3)
    assert max(steps["continuous"]) == 3 and len(steps["continuous"]) < 0.7 * len(steps["static"]), \
        (len(steps["continuous"]), len(steps["static"]))


def test_bad_batching_mode(ouro):
    with pytest.raises(ConfigError, match="batching must be 'continuous' or 'static'"):
        generate(ouro, PROMPTS, SamplingParams(max_new_tokens=2), batching="dynamic")


def test_slots_opened_by_a_shift_are_zeroed():
    """Slots a right shift opens are masked out, yet attention multiplies their values by 0: memory
    never written (torch.empty) may hold NaN, and 0 * NaN would reach the output."""
    from melt_core.modeling.cache import RowStore

    store = RowStore(capacity=8)
    store.append((torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2)))
    for b in store._buf:
        b[..., 2:, :] = float("nan")  # what never-written memory may hold
    store.shift(3)
    k, v = store.read()
    assert k.shape[-2] == 5 and torch.isfinite(k).all() and torch.isfinite(v).all()
    assert (k[..., 3:, :] == 1).all()
