"""Protects MELT's semantics (docs/METHOD.md section 2): chunk = 1 equals token-by-token decoding
and a literal re-statement of the method; alpha = 0 equals Ouro whatever the gates; the
window and the untrained sharing modes read the rows they should; padding changes nothing."""

import pytest
import torch
from helpers import make_melt
from naive_reference import naive_decode

from melt_core.modeling.gate import LatentGate

# The equivalences below run in float64: two computations of the same definition then agree to
# ~1e-14 here (float64 rounding, amplified by 4 loops x 2 layers as float32's 6e-8 grows to ~1.5e-5),
# so 1e-10 leaves a margin of thousands on any machine while a change of the method (a row from
# the wrong loop, a mixing weight off by 1e-3) moves the logits by more than 1e-4.
EXACT = dict(atol=1e-10, rtol=0)


def decode_one_by_one(model, ids, **cache_kw):
    cache = model.new_cache(capacity=ids.shape[1], **cache_kw)
    with torch.no_grad():
        return torch.cat([model(ids[:, i:i + 1], cache=cache).per_loop_logits
                          for i in range(ids.shape[1])], dim=2)


@pytest.mark.parametrize("gate", ["elementwise", "scalar", "mean", "ema", "last"])
@pytest.mark.parametrize("window", [0, 3])
def test_chunk1_equals_token_by_token_equals_definition(ouro, reference, gate, window):
    melt = make_melt(ouro, gate=gate, window=window).double()
    ids = reference["input_ids"]
    with torch.no_grad():
        chunked = melt(ids, chunk_size=1).per_loop_logits  # growing (training) storage
    stepped = decode_one_by_one(melt, ids)  # preallocated (inference) storage
    torch.testing.assert_close(chunked, stepped, **EXACT)
    for b in range(ids.shape[0]):
        torch.testing.assert_close(chunked[:, b], naive_decode(melt, ids[b], "melt"), **EXACT)


def test_larger_chunks_are_an_approximation(ouro, reference):
    """C > 1 must differ (tokens of a chunk see each other's current-loop rows): if it did
    not, the chunk-1 test above would not be testing anything."""
    melt = make_melt(ouro).double()
    ids = reference["input_ids"]
    with torch.no_grad():
        exact = melt(ids, chunk_size=1).per_loop_logits
        approx = melt(ids, chunk_size=6).per_loop_logits
    assert (exact - approx).abs().max() > 1e-2
    torch.testing.assert_close(exact[:, :, 0], approx[:, :, 0], **EXACT)  # token 0 sees only itself


def test_truncated_bptt_cuts_exactly_the_gradient_into_earlier_chunks(ouro):
    """train.detach_past: a later chunk's loss reaches earlier tokens only through the cache rows,
    so with the rows detached the earlier tokens' embeddings get exactly no gradient, and without
    they get one; the forward values are the same either way."""
    melt = make_melt(ouro).double()
    ids = torch.cat((torch.arange(1, 7), torch.arange(50, 56)))[None]  # two chunks of 6, no id in both
    grads, logits = [], []
    for detach in (True, False):
        melt.zero_grad()
        with torch.enable_grad():  # lighteval, once imported, turns grad off process-wide
            out = melt(ids, cache=melt.new_cache(detach_past=detach), chunk_size=6)
            out.per_loop_logits[:, :, 6:].square().sum().backward()  # the second chunk's loss only
        grads.append(melt.model.embed_tokens.weight.grad[1:7].abs().max().item())
        logits.append(out.per_loop_logits.detach())
    assert grads[0] == 0.0 and grads[1] > 1e-6, grads
    torch.testing.assert_close(logits[0], logits[1], **EXACT)


@pytest.mark.parametrize("chunk", [1, 4, 12])
@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("seed", [1, 2])
def test_alpha_zero_reproduces_ouro(ouro, reference, chunk, window, seed):
    melt = make_melt(ouro, window=window, seed=seed, gate_init_std=1.0)
    with torch.no_grad():
        out = melt(reference["input_ids"], chunk_size=chunk, alpha=0.0)
    torch.testing.assert_close(out.per_loop_logits, reference["per_loop_logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("alpha", [0.3, 0.7])
@pytest.mark.parametrize("window", [0, 3])
def test_alpha_between_mixes_the_rows_as_defined(ouro, reference, alpha, window):
    """Phase 1's interpolation: attention reads alpha * KV_MELT + (1 - alpha) * KV_Ouro of every
    token, past and own (docs/METHOD.md section 3), as the slow definition does, and lands between
    the ends (neither Ouro nor pure MELT)."""
    melt = make_melt(ouro, window=window).double()
    ids = reference["input_ids"]
    with torch.no_grad():
        mid = melt(ids, chunk_size=1, alpha=alpha).per_loop_logits
        pure = melt(ids, chunk_size=1, alpha=1.0).per_loop_logits
    for b in range(ids.shape[0]):
        torch.testing.assert_close(mid[:, b], naive_decode(melt, ids[b], "melt", alpha=alpha), **EXACT)
    assert (mid - reference["per_loop_logits"]).abs().max() > 1e-3
    assert (mid - pure).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["first-loop", "last-loop"])
@pytest.mark.parametrize("prompt_len", [0, 5])
def test_untrained_sharing_modes_match_definition(ouro, reference, mode, prompt_len):
    ids = reference["input_ids"]
    ouro = ouro.double()
    cache = ouro.new_cache(capacity=12, mode=mode, keep_prompt=prompt_len > 0)
    with torch.no_grad():
        parts = []
        if prompt_len:
            parts.append(ouro(ids[:, :prompt_len], cache=cache).per_loop_logits)
        cache.end_prompt()
        parts += [ouro(ids[:, i:i + 1], cache=cache).per_loop_logits for i in range(prompt_len, 12)]
    got = torch.cat(parts, dim=2)
    for b in range(ids.shape[0]):
        torch.testing.assert_close(got[:, b], naive_decode(ouro, ids[b], mode, prompt_len), **EXACT)
    assert (got[-1] - reference["final_logits"]).abs().max() > 1e-2  # sharing is not Ouro


def test_last_loop_sharing_is_melt_with_last_gate(ouro, reference):
    ids = reference["input_ids"]
    melt, ouro = make_melt(ouro, gate="last").double(), ouro.double()
    torch.testing.assert_close(decode_one_by_one(melt, ids),
                               decode_one_by_one(ouro, ids, mode="last-loop"), **EXACT)


@pytest.mark.parametrize("kind", ["ouro", "melt", "melt-window", "first-loop-prompt"])
def test_batched_left_padded_equals_one_at_a_time(ouro, kind):
    model = make_melt(ouro, window=2) if kind == "melt-window" else (
        make_melt(ouro) if kind == "melt" else ouro)
    cache_kw = dict(mode="first-loop", keep_prompt=True) if kind == "first-loop-prompt" else {}
    g = torch.Generator().manual_seed(3)
    lengths = [3, 7, 5]
    seqs = [torch.randint(1, 97, (n + 4,), generator=g) for n in lengths]
    width = max(lengths)

    def run(prompts_and_tails, batch):
        B = len(prompts_and_tails)
        ids = torch.zeros(B, width, dtype=torch.long)
        mask = torch.zeros(B, width, dtype=torch.long)
        for r, (p, _) in enumerate(prompts_and_tails):
            ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = model.new_cache(capacity=width + 4, **cache_kw)
        with torch.no_grad():
            outs = [model(ids, cache=cache, positions=pos, attention_mask=mask,
                          chunk_size=None if kind in ("ouro", "first-loop-prompt") else 1).logits[:, -1]]
            cache.end_prompt()
            nxt = pos[:, -1:] + 1
            for j in range(4):
                tok = torch.stack([t[j] for _, t in prompts_and_tails])[:, None]
                outs.append(model(tok, cache=cache, positions=nxt + j).logits[:, -1])
        return torch.stack(outs, 1)

    pairs = [(s[:n], s[n:]) for s, n in zip(seqs, lengths)]
    batched = run(pairs, True)
    for r, pair in enumerate(pairs):
        single = run([pair], False)
        # masked and unmasked SDPA sum in different orders: rounding, not semantics
        torch.testing.assert_close(batched[r], single[0], atol=1e-4, rtol=1e-5)


def test_gate_variants_follow_their_formulas():
    torch.manual_seed(0)
    a = [torch.randn(1, 1, 8) for _ in range(3)]
    ema = LatentGate("ema", 8, ema_z=0.2)
    h = None
    for t in range(3):
        h = ema(a[t], h, t)
    # docs/METHOD.md section 2: h_3 = 0.008 h_0 + 0.032 a_1 + 0.16 a_2 + 0.8 a_3 with h_0 = 0
    torch.testing.assert_close(h, 0.032 * a[0] + 0.16 * a[1] + 0.8 * a[2])
    mean = LatentGate("mean", 8)
    h = None
    for t in range(3):
        h = mean(a[t], h, t)
    torch.testing.assert_close(h, (a[0] + a[1] + a[2]) / 3)
    assert LatentGate("last", 8)(a[2], a[1], 1) is a[2]
    gate = LatentGate("elementwise", 8)
    gate.reset_parameters(0.5, 0.1, torch.Generator().manual_seed(0))
    hp = torch.randn(1, 1, 8)
    z = torch.sigmoid(a[0] @ gate.input_proj.weight.T + gate.input_proj.bias + hp @ gate.state_proj.weight.T)
    torch.testing.assert_close(gate(a[0], hp, 1), z * hp + (1 - z) * a[0])
    z1 = torch.sigmoid(a[0] @ gate.input_proj.weight.T + gate.input_proj.bias)  # h_0 = 0: U_z h_0 = 0
    torch.testing.assert_close(gate(a[0], None, 0), z1 * 0 + (1 - z1) * a[0])
    first = LatentGate("elementwise", 8, h0="first")
    assert first(a[0], None, 0) is a[0]
    scalar = LatentGate("scalar", 8)
    scalar.reset_parameters(0.5, 0.1, torch.Generator().manual_seed(1))
    zs = torch.sigmoid(a[0] @ scalar.input_proj.weight.T + scalar.input_proj.bias + hp @ scalar.state_proj.weight.T)
    assert zs.shape == (1, 1, 1)  # one z for all d features
    torch.testing.assert_close(scalar(a[0], hp, 1), zs * hp + (1 - zs) * a[0])
