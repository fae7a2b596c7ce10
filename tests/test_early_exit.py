"""Protects real early exit (melt_core/modeling/early_exit.py): q = 1 is today's decoding; a token forced
to stop after loop t is that token run by the same model with T = t (same cache); mixed exits in a
batch give what each sequence gives alone; stopped rows are really not computed; caches that
cannot let a token stop say so."""

import copy

import pytest
import torch
from helpers import make_melt
from numerics import assert_same_function

from melt_core import ConfigError
from melt_core.generation.generate import SamplingParams, generate
from melt_core.modeling.early_exit import ExitRule, decode_step, exit_gate_loss, train_exit_gate

PROMPTS = [[5, 9, 13], [7, 1, 2, 3, 4, 8], [40, 41]]
KINDS = ["ouro", "melt", "last-loop"]


def build(ouro, kind):
    return (ouro if kind != "melt" else make_melt(ouro)), ("last-loop" if kind == "last-loop" else "default")


def prefilled(model, mode, prompts, capacity=32):
    """A left-padded batch prefilled through every loop; returns (cache, next positions, last logits)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache(capacity=capacity, mode=mode)
    chunk = None if model.config.is_melt or mode != "default" else width
    with torch.no_grad():
        out = model(ids, cache=cache, positions=positions, attention_mask=mask, chunk_size=chunk or 1,
                    logits="last")
    cache.end_prompt()
    return cache, positions[:, -1:] + 1, out.logits[:, -1]


@pytest.mark.parametrize("kind", KINDS)
def test_q_one_is_todays_decoding(ouro, kind):
    """decode_step with a rule that never stops early computes what the model's forward does."""
    model, mode = build(ouro, kind)
    ours, pos, logits = prefilled(model, mode, PROMPTS)
    theirs = copy.deepcopy(ours)
    for _ in range(5):
        token = logits.argmax(-1)[:, None]
        got, loops = decode_step(model, token, ours, pos, ExitRule(q=1.0))
        with torch.no_grad():
            want = model(token, cache=theirs, positions=pos, logits="last").logits[:, -1]
        assert_same_function(got, want, model.config)
        assert loops.tolist() == [model.num_loops] * len(PROMPTS)
        logits, pos = want, pos + 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop_after", [1, 2, 3])
def test_forced_exit_equals_the_same_model_with_fewer_loops(ouro, kind, stop_after):
    """Every token stops after loop t: the same as decoding with T = t over the same cache (MELT:
    each token's row is h_t; Ouro: rows of loops <= t, the copies forward never read)."""
    model, mode = build(ouro, kind)
    shallow = copy.deepcopy(model)
    shallow.config.total_ut_steps = stop_after
    ours, pos, logits = prefilled(model, mode, PROMPTS)
    theirs = copy.deepcopy(ours)
    theirs.T = stop_after
    for _ in range(5):
        token = logits.argmax(-1)[:, None]
        got, loops = decode_step(model, token, ours, pos, ExitRule(exit_at_loop=stop_after))
        with torch.no_grad():
            want = shallow(token, cache=theirs, positions=pos, logits="last").logits[:, -1]
        assert_same_function(got, want, model.config)
        assert loops.tolist() == [stop_after] * len(PROMPTS)
        logits, pos = want, pos + 1


class RowDepths:
    """A test rule: the row of prompt i stops after depth(i, step) loops."""

    def __init__(self, prompt_of_row, depth):
        self.prompt_of_row, self.depth, self.step = prompt_of_row, depth, -1

    def stops_early(self, num_loops):
        return True

    def exits(self, loop, cdf, rows):
        self.step += loop == 1
        return torch.tensor([loop >= self.depth(self.prompt_of_row[r], self.step) for r in rows.tolist()])


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_exits_in_a_batch_equal_each_sequence_alone(ouro, kind):
    model, mode = build(ouro, kind)
    T = model.num_loops

    def depth(prompt, step):  # differs across rows and steps, every depth from 1 to T
        return 1 + (3 * prompt + step) % T

    params = SamplingParams(max_new_tokens=8, greedy=True)
    batch = generate(model, PROMPTS, params, cache_mode=mode, exit_rule=RowDepths([0, 1, 2], depth))
    assert {d for c in batch for d in c[0].loops[1:]} == set(range(1, T + 1))  # truly mixed
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], params, cache_mode=mode, exit_rule=RowDepths([i], depth))[0][0]
        assert batch[i][0].token_ids == alone.token_ids
        assert batch[i][0].loops == alone.loops == [T] + [depth(i, s) for s in range(len(alone.loops) - 1)]


@pytest.mark.parametrize("kind", ["ouro", "melt"])
def test_q_exit_in_a_batch_equals_each_sequence_alone(ouro, kind):
    """Ouro's Q-exit on the exit gate's own probabilities: the batch decides as each row alone."""
    model, mode = build(ouro, kind)
    with torch.no_grad():  # an exit gate that stops some tokens early and not others
        model = copy.deepcopy(model)
        model.model.early_exit_gate.bias.fill_(-0.5)
    rule = ExitRule(q=0.6)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    batch = generate(model, PROMPTS, params, cache_mode=mode, exit_rule=rule)
    depths = {d for c in batch for d in c[0].loops[1:]}
    assert len(depths) > 1 and max(depths) <= model.num_loops
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], params, cache_mode=mode, exit_rule=rule)[0][0]
        assert (batch[i][0].token_ids, batch[i][0].loops) == (alone.token_ids, alone.loops)


def test_stopped_rows_are_not_computed(ouro):
    """At batch 1 the skipped loops do not run; in a batch each loop runs only the rows still
    looping (rows seen by layer 0, per loop)."""
    melt = make_melt(ouro)
    seen = []
    hook = melt.model.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    try:
        cache, pos, logits = prefilled(melt, "default", PROMPTS)
        seen.clear()
        decode_step(melt, logits.argmax(-1)[:, None], cache, pos, RowDepths([0, 1, 2], lambda p, s: p + 1))
    finally:
        hook.remove()
    assert seen == [3, 2, 1]  # rows stop after loops 1, 2, 3: loop 4 never runs
    single, pos, logits = prefilled(melt, "default", PROMPTS[:1])
    seen.clear()
    hook = melt.model.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    try:
        decode_step(melt, logits.argmax(-1)[:, None], single, pos, ExitRule(exit_at_loop=2))
    finally:
        hook.remove()
    assert seen == [1, 1]


def test_caches_that_cannot_stop_a_token_say_so(ouro):
    params = SamplingParams(max_new_tokens=3, greedy=True)
    with pytest.raises(ConfigError, match="first-loop sharing"):
        generate(ouro, PROMPTS, params, cache_mode="first-loop", exit_rule=ExitRule(exit_at_loop=2))
    with pytest.raises(ConfigError, match="sliding window"):
        generate(make_melt(ouro, window=4), PROMPTS, params, exit_rule=ExitRule(exit_at_loop=2))
    # a rule that can never stop early needs nothing of the cache
    assert generate(ouro, PROMPTS, params, cache_mode="first-loop", exit_rule=ExitRule(q=1.0))


@pytest.mark.parametrize("spec, message", [
    ({"q": 0}, "q must lie in"), ({"q": 1.5}, "q must lie in"), ({"exit_at_loop": 0}, "exit_at_loop"),
    ({"min_loops": 0}, "min_loops"), ({"threshold": 0.9}, "unknown setting"),
])
def test_bad_exit_rules_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        ExitRule.from_dict(spec)


def test_rules_stop_where_they_say():
    cdf, rows = torch.tensor([0.2, 0.55, 0.9]), torch.arange(3)
    assert ExitRule(q=0.5).exits(1, cdf, rows).tolist() == [False, True, True]
    assert ExitRule(q=0.5, min_loops=2).exits(1, cdf, rows).tolist() == [False, False, False]
    assert ExitRule(exit_at_loop=2).exits(2, cdf, rows).tolist() == [True, True, True]
    assert not ExitRule(q=1.0).exits(3, torch.ones(3), rows).any()  # q = 1 never stops early
    assert not ExitRule(exit_at_loop=4).stops_early(4) and ExitRule(exit_at_loop=3).stops_early(4)


def test_exit_gate_loss_teaches_stopping_where_loops_stop_helping():
    """Ouro's Stage-II objective: where a next loop lowers the loss the gate is pushed to go on,
    where it does not, to stop."""
    T, V = 3, 5
    targets = torch.tensor([[2]])
    helpful = torch.zeros(T, 1, 1, V)
    helpful[1:, ..., 2] = torch.tensor([2.0, 6.0])[:, None, None]  # each loop more sure of the answer
    flat = torch.zeros(T, 1, 1, V)
    flat[..., 2] = 4.0  # no loop adds anything
    lam = torch.zeros(T, 1, 1, requires_grad=True)
    with torch.enable_grad():  # importing lighteval turns grad off for the whole process
        exit_gate_loss(helpful, lam, targets, torch.ones(1, 1)).backward()
        assert (lam.grad[:-1] > 0).all()  # raising lambda (stopping) costs: go on
        lam.grad = None
        exit_gate_loss(flat, lam, targets, torch.ones(1, 1)).backward()
        assert (lam.grad[:-1] < 0).all()  # raising lambda helps: stop


def test_a_checkpoints_own_exit_defaults_are_used_not_ignored(ouro):
    """The reference code's early_exit_threshold / early_exit_step (a 0-based loop) are the exit a
    checkpoint asks for when the eval names none; the model's and the task's settings go over them."""
    from melt_core.evaluation.evaluate import TaskSpec, task_exit_rule
    from melt_core.serving.inference import ModelSpec, exit_rule

    spec, task = ModelSpec("ouro", "x"), TaskSpec(name="t", path="x")
    assert exit_rule(spec, task.exit, ouro.config) == ExitRule()  # the shipped 1.0: every loop
    stepped = ouro.config.replace(early_exit_step=1)
    assert exit_rule(spec, task.exit, stepped) == ExitRule(exit_at_loop=2)
    assert exit_rule(spec, task.exit, ouro.config.replace(early_exit_threshold=0.6)) == ExitRule(q=0.6)
    assert exit_rule(spec, {"exit_at_loop": 3}, stepped) == ExitRule(exit_at_loop=3)
    ouro.config = stepped
    assert task_exit_rule(ouro, spec, task) == ExitRule(exit_at_loop=2)
    for bad in ({"early_exit_threshold": 0.0}, {"early_exit_threshold": 1.5}, {"early_exit_step": 4},
                {"early_exit_step": -1}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            stepped.replace(**bad)


def _refit_step_by_step(model, batches, steps, lr):
    """The refit as its definition reads: each step the model's forward, the loss, one AdamW step."""
    gate = model.model.early_exit_gate
    model.requires_grad_(False)
    gate.requires_grad_(True)
    opt = torch.optim.AdamW(gate.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        ids, mask = batches(step)
        out = model(ids[:, :-1], logits="all")
        loss = exit_gate_loss(out.per_loop_logits, out.exit_logits, ids[:, 1:], mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["ouro", "melt"])
def test_exit_gate_refit_forward_in_groups_equals_step_by_step(ouro, kind):
    """train_exit_gate runs the frozen model once for several steps' batches and applies each step's
    current gate to the captured states: the same losses and fitted gate as a forward every step
    (group 1: the same ops on the same shapes, so the same bits; groups: other matmul shapes, so
    rounding apart at most), and the model's other weights untouched. In float64: AdamW divides each
    gradient by its own running magnitude, so a gate weight whose gradient is near zero carries its
    states' rounding into the fit many times over (float32 on an Intel Xeon: 1.8e-6 apart, 3.4e-5
    relative); float64's rounding, ~1e-16 a step, stays far inside the bound on any machine."""
    model = build(ouro.double(), kind)[0]
    g = torch.Generator().manual_seed(3)
    data = [(torch.randint(3, model.config.vocab_size, (2, 9), generator=g), torch.ones(2, 8)) for _ in range(5)]
    data[2][1][0, :4] = 0  # a masked stretch
    reference = copy.deepcopy(model)
    want = _refit_step_by_step(reference, data.__getitem__, 5, lr=0.05)
    for group in (1, 2, 8):
        fitted = copy.deepcopy(model)
        got = train_exit_gate(fitted, data.__getitem__, 5, lr=0.05, group=group)
        gate, ref_gate = fitted.model.early_exit_gate, reference.model.early_exit_gate
        if group == 1:
            assert got == want and gate.weight.equal(ref_gate.weight) and gate.bias.equal(ref_gate.bias)
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-10)
            torch.testing.assert_close(gate.weight, ref_gate.weight, rtol=1e-9, atol=1e-10)
        assert not gate.weight.equal(model.model.early_exit_gate.weight)  # it moved: a stale gate would show
        assert all(p.equal(q) for (n, p), (_, q) in zip(fitted.named_parameters(), model.named_parameters())
                   if "early_exit_gate" not in n)
        assert all(p.requires_grad for p in fitted.parameters())
