"""torch.autograd.gradcheck of the C gradients, in float64.

The bridge below is a test-only torch.autograd.Function: its forward calls
the ``rmsnorm.forward`` gufunc on NumPy views of the tensors and its backward
calls the ``rmsnorm.backward`` gufunc. gradcheck compares that analytical
backward against finite differences of the forward, so a wrong formula in
either direction of the C core fails here independently of torch's own
rms_norm.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rmsnorm


class GufuncRMSNorm(torch.autograd.Function):
    """y = rmsnorm.forward(x, weight, eps) over the last dimension of x."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        y = rmsnorm.forward(x.detach().numpy(), weight.detach().numpy(), eps)
        return torch.from_numpy(np.asarray(y))

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        n = x.shape[-1]
        # The backward gufunc's core is (m, n): fold every leading dim into m.
        grad_input, grad_weight = rmsnorm.backward(
            grad_output.detach().numpy().reshape(-1, n),
            x.detach().numpy().reshape(-1, n),
            weight.detach().numpy(),
            ctx.eps,
        )
        grad_input = torch.from_numpy(np.asarray(grad_input)).reshape(x.shape)
        grad_weight = torch.from_numpy(np.asarray(grad_weight)) if ctx.needs_input_grad[1] else None
        return grad_input, grad_weight, None


def _inputs(shape, seed, weight_requires_grad):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_()
    weight = torch.randn(shape[-1], dtype=torch.float64, generator=generator)
    weight.requires_grad_(weight_requires_grad)
    return x, weight


SHAPES = [(1,), (3,), (2, 5), (4, 7), (2, 3, 4)]


@pytest.mark.parametrize("eps", [1e-5, 0.5])
@pytest.mark.parametrize("weight_requires_grad", [True, False],
                         ids=["with_grad_weight", "without_grad_weight"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x" + str(s).replace(" ", ""))
def test_gufunc_gradients_pass_torch_gradcheck(shape, weight_requires_grad, eps):
    x, weight = _inputs(shape, seed=len(shape) * 10 + shape[-1], weight_requires_grad=weight_requires_grad)
    assert torch.autograd.gradcheck(GufuncRMSNorm.apply, (x, weight, eps),
                                    eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_with_negative_eps_away_from_the_singularity():
    generator = torch.Generator().manual_seed(11)
    x = (2.0 + torch.rand((3, 6), dtype=torch.float64, generator=generator)).requires_grad_()
    weight = torch.randn(6, dtype=torch.float64, generator=generator).requires_grad_()
    assert torch.autograd.gradcheck(GufuncRMSNorm.apply, (x, weight, -0.5),
                                    eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_catches_a_wrong_gradient():
    """The check above can fail: a bridge with a perturbed backward must not pass."""

    class Broken(GufuncRMSNorm):
        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight, _ = GufuncRMSNorm.backward(ctx, grad_output)
            return grad_input * 1.001, grad_weight, None

    x, weight = _inputs((2, 5), seed=3, weight_requires_grad=True)
    assert not torch.autograd.gradcheck(Broken.apply, (x, weight, 1e-5), eps=1e-6, atol=1e-8,
                                        rtol=1e-6, raise_exception=False)
