"""The CPU dropout: drop rate, expectation, gradient, determinism, identity when off."""

import pytest
import torch

from tformer.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.3])
def test_drop_rate_and_expectation(p):
    x = torch.ones(1_000_003)  # odd size: the last element uses half of a 32-bit draw
    out = dropout(x, p)
    kept = out != 0
    sigma = (p * (1 - p) / x.numel()) ** 0.5
    assert abs(1 - kept.float().mean().item() - p) < 5 * sigma
    for half in (kept[0::2], kept[1::2]):  # both 16-bit halves of each draw are unbiased
        assert abs(1 - half.float().mean().item() - p) < 5 * sigma * 2**0.5
    assert abs(out.mean().item() - 1.0) < 5 * sigma / (1 - p)  # expectation preserved
    assert torch.allclose(out[kept], out[kept][0])  # kept values share one scale ~ 1 / (1 - p)
    assert out[kept][0].item() == pytest.approx(1 / (1 - p), rel=1e-4)


def test_gradient_is_the_mask_times_the_scale():
    x = torch.randn(64, 33, requires_grad=True)
    out = dropout(x, 0.2)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad * x.detach(), out.detach())


def test_seeded_and_off_when_not_training():
    x = torch.randn(1000)
    torch.manual_seed(5)
    a = dropout(x, 0.1)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x, 0.1))
    assert not torch.equal(a, dropout(x, 0.1))
    m = Dropout(0.1).eval()
    assert m(x) is x and dropout(x, 0.0) is x
    with pytest.raises(ValueError):
        Dropout(1.0)
