"""The training losses (melt_core/modeling/losses.py) against their definitions, restated token by token in
float64 (tests/naive_reference.py): loop-averaged KL(teacher || student) with its temperature,
the Phase-2 attention alignment, the teacher's language-model loss. test_train checks that the
trainer logs exactly these at its first step."""

import pytest
import torch
from naive_reference import naive_alignment, naive_kd, naive_lm_loss

from melt_core.modeling.losses import alignment_loss_sum, kd_loss_sum, lm_loss_sum, token_count

T, B, L, V = 3, 2, 5, 7


@pytest.fixture(autouse=True)
def _grad_on():
    """Gradients on, whatever an earlier test left (lighteval turns them off process-wide)."""
    with torch.enable_grad():
        yield


def logits(seed: int) -> torch.Tensor:
    return torch.randn(T, B, L, V, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.fixture
def mask():
    m = torch.ones(B, L)
    m[0, :2] = 0  # a prompt's tokens: not learned
    m[1, 4] = 0
    return m


@pytest.mark.parametrize("loops", ["all", "final"])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_kd_is_the_loop_mean_of_kl_teacher_to_student(mask, loops, temperature):
    s, t = logits(0), logits(1)
    got = float(kd_loss_sum(s, t, mask, loops, temperature))
    # float32 log-softmax over 7 logits against float64: agreement to ~1e-6 relative
    assert got == pytest.approx(naive_kd(s, t, mask, loops, temperature), rel=1e-5)
    # direction: KL is not symmetric, and the student is the second argument
    assert got != pytest.approx(naive_kd(t, s, mask, loops, temperature), rel=1e-3)


def test_kd_distills_every_loop_or_only_the_last(mask):
    s, t = logits(0), logits(1)
    s_last_right = s.clone()
    s_last_right[-1] = t[-1]  # the last loop matches the teacher, the others do not
    assert float(kd_loss_sum(s_last_right, t, mask, "final")) == pytest.approx(0.0, abs=1e-5)
    assert float(kd_loss_sum(s_last_right, t, mask, "all")) > 0.1
    with pytest.raises(ValueError, match="kd loops must be 'all' or 'final'"):
        kd_loss_sum(s, t, mask, "last")


def test_kd_trains_the_student_only(mask):
    s, t = logits(0).requires_grad_(), logits(1)
    kd_loss_sum(s, t, mask).backward()
    assert s.grad.abs().sum() > 0
    assert s.grad[:, 0, :2].abs().sum() == 0  # masked tokens give no gradient
    assert float(kd_loss_sum(t, t, mask)) == pytest.approx(0.0, abs=1e-5)


def test_alignment_is_the_mean_over_layer_loop_pairs_of_squared_distances():
    g = torch.Generator().manual_seed(2)
    pairs = 4  # N * T
    student = [torch.randn(B, L, 6, generator=g, requires_grad=True) for _ in range(pairs)]
    teacher = [torch.randn(B, L, 6, generator=g, requires_grad=True) for _ in range(pairs)]
    got = alignment_loss_sum(student, teacher)
    assert float(got.detach()) == pytest.approx(naive_alignment(student, teacher), rel=1e-5)
    got.backward()
    assert all(o.grad is not None for o in student)
    assert all(o.grad is None for o in teacher)  # sg(o_LoopLM): the teacher is a fixed target
    with pytest.raises(ValueError, match="same \\(loop, layer\\)"):
        alignment_loss_sum(student, teacher[:-1])


def test_lm_loss_is_masked_cross_entropy(mask):
    x = logits(3)[0]
    targets = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(4))
    assert float(lm_loss_sum(x, targets, mask)) == pytest.approx(naive_lm_loss(x, targets, mask), rel=1e-5)
    assert float(token_count(mask)) == 7.0  # 10 tokens, 3 masked
