"""Label smoothing against F.cross_entropy and the explicit smoothed distribution; LR schedules."""

import pytest
import torch
import torch.nn.functional as F

from tformer.config import TrainConfig
from tformer.metrics import token_accuracy
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


@pytest.mark.filterwarnings("error")  # e.g. an out= buffer of the wrong size, resized behind our back
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
    torch.testing.assert_close(plain.nll, want_nll)
    assert int(plain.n_tokens) == 9 and int(plain.correct) == int(got.correct)
    # the chunked backward computes the loss's gradient only: its nll must not offer one (it would be the loss's)
    assert got.loss.requires_grad and not got.nll.requires_grad


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


def test_chunked_generator_loss_counts_correct_predictions_in_every_chunk(monkeypatch):
    import tformer.training.loss as loss_mod

    monkeypatch.setattr(loss_mod, "CHUNK_ROWS", 4)
    V = 9
    gen = torch.nn.Linear(V, V, bias=False)
    with torch.no_grad():
        gen.weight.copy_(torch.eye(V))  # logits = hidden: row i predicts its own largest entry
    target = torch.tensor([3, 0, 5, 8, 1, 2, 0, 4, 4, 7, 6])
    predicted = torch.tensor([3, 3, 5, 1, 1, 2, 5, 4, 2, 7, 6])  # right at 3, 5, 1, 2, 4, 7, 6: in all 3 chunks
    hidden = (torch.nn.functional.one_hot(predicted, V).float() * 5).requires_grad_()
    got = loss_mod.generator_loss(hidden, gen, target, 0.1, PAD)
    assert got.correct == 7 == token_accuracy(hidden.detach(), target, PAD)[0]


@pytest.mark.parametrize("which", ["loss", "nll"])
def test_each_output_alone_has_its_own_gradient(which):
    """Only one of (loss, nll) reaches the objective: the other's upstream gradient is None."""
    logits = torch.randn(7, 6, dtype=torch.double, requires_grad=True)
    target = torch.tensor([3, 0, 5, 1, 2, 4, 4])
    getattr(label_smoothed_nll_loss(logits, target, 0.2, PAD), which).backward()
    got, logits.grad = logits.grad.clone(), None
    lp = torch.log_softmax(logits, -1)
    onehot = torch.nn.functional.one_hot(target, 6).double() * (target != PAD).double()[:, None]
    q = smoothed_targets(target, 6, 0.2, PAD).double() if which == "loss" else onehot
    (-(q * lp).sum()).backward()
    torch.testing.assert_close(got, logits.grad)


def test_bfloat16_logits_get_a_bfloat16_gradient_computed_in_float32():
    logits = torch.randn(6, 11).bfloat16().requires_grad_()
    target = torch.tensor([3, 0, 5, 10, 2, 4])
    out = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    wide = logits.detach().float().requires_grad_()
    label_smoothed_nll_loss(wide, target, 0.1, PAD).loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad, wide.grad.bfloat16())


def test_losses_follow_their_inputs_device(monkeypatch):
    import tformer.training.loss as loss_mod
    from helpers.models import assert_follows_input_device

    monkeypatch.setattr(loss_mod, "CHUNK_ROWS", 4)
    gen = torch.nn.Linear(5, 9).double()
    hidden, logits = torch.randn(11, 5, dtype=torch.double), torch.randn(11, 9, dtype=torch.double)
    target = torch.tensor([3, 0, 5, 8, 1, 2, 0, 4, 4, 7, 6])

    def train_step(x):
        x = x.clone().requires_grad_()
        out = loss_mod.generator_loss(x, gen, target, 0.1, PAD)
        out.loss.backward()
        gen.zero_grad()
        return out.loss, out.nll, out.n_tokens, out.correct, x.grad

    def smoothed(x):
        x = x.clone().requires_grad_()
        out = label_smoothed_nll_loss(x, target, 0.1, PAD)
        (out.loss + out.nll).backward()
        return *out, x.grad

    assert_follows_input_device(train_step, hidden)
    assert_follows_input_device(smoothed, logits)
    with torch.no_grad():  # evaluation: the logits built whole
        assert_follows_input_device(lambda: loss_mod.generator_loss(hidden, gen, target, 0.1, PAD)[:3])


@pytest.mark.parametrize("grad", [True, False])
def test_label_smoothing_needs_three_classes_and_says_so(grad):
    """eps / (V - 2) needs a class that is neither the target nor <pad>: a vocabulary of 2 is refused, on the
    logits and through the generator (chunked with gradients, whole without); 3 is the smallest one smoothed,
    its loss the explicit distribution's. Two positions, so that the row count is not the vocabulary."""
    import tformer.training.loss as loss_mod

    torch.manual_seed(0)
    for V in (2, 3):
        gen = torch.nn.Linear(4, V).double()
        hidden = torch.randn(2, 4, dtype=torch.double, requires_grad=grad)
        target = torch.tensor([1, V - 1])
        with torch.set_grad_enabled(grad):
            if V == 2:
                for call in (lambda: label_smoothed_nll_loss(gen(hidden), target, 0.1, PAD),
                             lambda: loss_mod.generator_loss(hidden, gen, target, 0.1, PAD)):
                    with pytest.raises(ValueError, match="label smoothing needs a vocabulary of more than 2 entries, got 2"):
                        call()
                continue
            want = -(smoothed_targets(target, V, 0.1, PAD).double() * torch.log_softmax(gen(hidden), -1)).sum()
            torch.testing.assert_close(label_smoothed_nll_loss(gen(hidden), target, 0.1, PAD).loss, want)
            torch.testing.assert_close(loss_mod.generator_loss(hidden, gen, target, 0.1, PAD).loss, want)


def test_a_bfloat16_generator_without_autocast_computes_its_loss_in_float32():
    """A model cast to bfloat16 and trained without autocast: the logits are built whole in bfloat16 and the loss
    taken in float32 (the chunked path sums in the hidden states' dtype, so it is kept to float32/float64)."""
    import tformer.training.loss as loss_mod

    torch.manual_seed(0)
    gen = torch.nn.Linear(16, 50).bfloat16()
    hidden = torch.randn(40, 16).bfloat16().requires_grad_()
    target = torch.randint(1, 50, (40,))
    got = loss_mod.generator_loss(hidden, gen, target, 0.1, PAD)
    want = label_smoothed_nll_loss(gen(hidden), target, 0.1, PAD)
    assert got.loss.dtype == got.nll.dtype == torch.float32
    torch.testing.assert_close(got.loss, want.loss)
    torch.testing.assert_close(got.nll, want.nll)
