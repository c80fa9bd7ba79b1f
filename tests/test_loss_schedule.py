"""Label smoothing against F.cross_entropy and the explicit smoothed distribution; LR schedules."""

import pytest
import torch
import torch.nn.functional as F

from tformer.config import TrainConfig
from tformer.training.loss import label_smoothed_nll_loss, smoothed_targets
from tformer.training.schedule import inverse_sqrt, learning_rate, noam

PAD = 0


def test_eps_zero_equals_cross_entropy_ignoring_pad():
    logits = torch.randn(12, 9)
    target = torch.tensor([3, 0, 5, 8, 0, 1, 2, 4, 4, 0, 7, 6])
    out = label_smoothed_nll_loss(logits, target, 0.0, PAD)
    want = F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(out.nll, want)
    assert int(out.n_tokens) == 9


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_smoothed_loss_equals_explicit_distribution(eps):
    logits = torch.randn(10, 7)
    target = torch.tensor([3, 0, 5, 6, 1, 2, 4, 4, 0, 5])
    q = smoothed_targets(target, 7, eps, PAD)
    real = target != PAD
    torch.testing.assert_close(q[real].sum(-1), torch.ones(int(real.sum())))  # a distribution per position
    assert torch.all(q[:, PAD] == 0) and torch.all(q[~real] == 0)
    assert torch.all(q[real].gather(1, target[real][:, None]) == 1 - eps)
    want = -(q * torch.log_softmax(logits, -1)).sum()
    torch.testing.assert_close(label_smoothed_nll_loss(logits, target, eps, PAD).loss, want)


def test_loss_on_a_batch_without_padding():
    logits, target = torch.randn(5, 6), torch.tensor([1, 2, 3, 4, 5])
    out = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    assert int(out.n_tokens) == 5 and torch.isfinite(out.loss)
    torch.testing.assert_close(out.nll, F.cross_entropy(logits, target, reduction="sum"))


def test_noam_peaks_at_warmup():
    lrs = [noam(s, 512, 1.0, 4000) for s in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000
    assert lrs[3999] == pytest.approx(512**-0.5 * 4000**-0.5)
    assert lrs[0] == pytest.approx(512**-0.5 * 4000**-1.5)  # linear warm-up from step 1
    assert lrs[15999] == pytest.approx(512**-0.5 * 16000**-0.5)  # inverse-sqrt decay


def test_inverse_sqrt_and_dispatch():
    assert inverse_sqrt(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt(400, 1e-3, 100) == pytest.approx(5e-4)
    cfg = TrainConfig(schedule="constant", lr=0.3)
    assert learning_rate(1, cfg, 512) == learning_rate(9999, cfg, 512) == 0.3


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_hand_written_gradient_equals_autograd_of_the_explicit_formula(eps):
    logits = torch.randn(9, 6, dtype=torch.double, requires_grad=True)
    target = torch.tensor([3, 0, 5, 1, 2, 4, 4, 0, 5])
    w_loss, w_nll = 0.7, 0.3  # exercise both outputs' gradients
    out = label_smoothed_nll_loss(logits, target, eps, PAD)
    (w_loss * out.loss + w_nll * out.nll).backward()
    got = logits.grad.clone()
    logits.grad = None
    lp = torch.log_softmax(logits, -1)
    real = (target != PAD).double()
    q = smoothed_targets(target, 6, eps, PAD).double()
    want_loss = -(q * lp).sum()
    want_nll = -(lp.gather(1, target[:, None])[:, 0] * real).sum()
    (w_loss * want_loss + w_nll * want_nll).backward()
    torch.testing.assert_close(got, logits.grad)
    assert torch.all(got[target == PAD] == 0)


def test_loss_passes_gradcheck():
    logits = torch.randn(5, 7, dtype=torch.double, requires_grad=True)
    target = torch.tensor([1, 2, 0, 6, 4])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll_loss(x, target, 0.2, PAD).loss, (logits,))


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_chunked_generator_loss_equals_the_explicit_formula_and_its_autograd(monkeypatch, eps, bias):
    """Oracle: logits = hidden W^T + b built whole, the smoothed loss from the explicit distribution, autograd
    for the gradients of hidden, W and b. Chunks of 4 rows over 11 positions (a partial last chunk), padding
    targets inside chunks, float64 so that the comparison is tight."""
    import tformer.training.loss as loss_mod

    monkeypatch.setattr(loss_mod, "CHUNK_ROWS", 4)
    torch.manual_seed(0)
    V, D = 9, 5
    gen = torch.nn.Linear(D, V, bias=bias).double()
    hidden = torch.randn(11, D, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([3, 0, 5, 8, 1, 2, 0, 4, 4, 7, 6])
    got = loss_mod.generator_loss(hidden, gen, target, eps, PAD)
    (2.5 * got.loss).backward()  # a non-unit upstream gradient
    mine = [hidden.grad.clone(), gen.weight.grad.clone()] + ([gen.bias.grad.clone()] if bias else [])
    hidden.grad = None
    gen.zero_grad()

    logits = gen(hidden)
    lp = torch.log_softmax(logits, -1)
    real = target != PAD
    want_loss = -(smoothed_targets(target, V, eps, PAD).double() * lp).sum()
    want_nll = -lp[real].gather(1, target[real][:, None]).sum()
    (2.5 * want_loss).backward()
    torch.testing.assert_close(got.loss, want_loss)
    torch.testing.assert_close(got.nll, want_nll)
    assert int(got.n_tokens) == 9
    assert int(got.correct) == int(((logits.argmax(-1) == target) & real).sum())
    want = [hidden.grad, gen.weight.grad] + ([gen.bias.grad] if bias else [])
    for a, b in zip(mine, want):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # evaluation builds the logits whole: same numbers
        plain = loss_mod.generator_loss(hidden, gen, target, eps, PAD)
    torch.testing.assert_close(plain.loss, want_loss)
    assert int(plain.correct) == int(got.correct)


@pytest.mark.parametrize("step", [1, 3, 100, 250, 4000])
def test_learning_rate_dispatches_each_schedule_to_its_formula(step):
    d, lr, warmup = 64, 2.0, 250
    noam_cfg = TrainConfig(schedule="noam", lr=lr, warmup=warmup)
    assert learning_rate(step, noam_cfg, d) == pytest.approx(lr * d**-0.5 * min(step**-0.5, step * warmup**-1.5))
    sqrt_cfg = TrainConfig(schedule="inverse_sqrt", lr=lr, warmup=warmup)
    want = lr * step / warmup if step < warmup else lr * (warmup / step) ** 0.5
    assert learning_rate(step, sqrt_cfg, d) == pytest.approx(want)


def test_inverse_sqrt_from_step_zero_and_without_warmup():
    assert inverse_sqrt(0, 1.0, 100) == pytest.approx(0.01)  # step 0 counts as the first update
    assert noam(0, 64, 1.0, 100) == pytest.approx(64**-0.5 * 100**-1.5)
    for warmup in (0, 1):  # no warm-up: peak / sqrt(step) from the first update
        assert inverse_sqrt(4, 1.0, warmup) == pytest.approx(0.5)
        assert inverse_sqrt(1, 1.0, warmup) == pytest.approx(1.0)
