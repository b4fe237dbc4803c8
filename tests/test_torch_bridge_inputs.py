"""rmsnorm.torch's inputs: what it reads, what it takes and what it refuses.

1. A tensor's negative bit (``Tensor.is_neg()``, as ``.conj().imag`` of a
   complex tensor or ``torch._neg_view`` set it) is honoured for every
   operand of the forward and the backward, on every route.

Expected values come from torch (``torch.nn.functional.rms_norm`` and its
autograd).
"""

from __future__ import annotations

import pytest
import torch

import rmsnorm.torch as rt

F = torch.nn.functional
N = 16


# ---------------------------------------------------------------------------
# 1. The negative bit.
# ---------------------------------------------------------------------------


def neg_bit_view(values, how: str):
    """A tensor equal to ``values`` whose memory holds their negation and
    whose negative bit is set."""
    if how == "_neg_view":
        tensor = torch._neg_view(-values)
    else:  # the imaginary part of a conjugated complex tensor
        complex_dtype = torch.complex128 if values.dtype == torch.float64 else torch.complex64
        tensor = torch.complex(torch.zeros_like(values), -values).to(complex_dtype).conj().imag
    assert torch.equal(tensor, values)
    return tensor


def route_context(route: str):
    return torch.no_grad() if route == "no_grad" else torch.enable_grad()


NEG_OPERANDS = ["input", "residual", "weight", "grad_output"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("how", ["_neg_view", "conj().imag"])
@pytest.mark.parametrize("operand", NEG_OPERANDS)
@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("route", ["no_grad", "autograd", "op"])
def test_negative_bit_of_each_operand_is_honoured(dtype, how, operand, fused, route):
    if operand == "residual" and not fused:
        pytest.skip("rms_norm has no residual")
    if operand == "grad_output" and route == "no_grad":
        pytest.skip("no backward without autograd")
    generator = torch.Generator().manual_seed(3)
    values = {
        "input": torch.randn(4, N, dtype=dtype, generator=generator),
        "residual": torch.randn(4, N, dtype=dtype, generator=generator),
        "weight": torch.rand(N, dtype=dtype, generator=generator) + 0.5,
        "grad_output": torch.randn(4, N, dtype=dtype, generator=generator),
    }
    ours_operands = dict(values)
    ours_operands[operand] = neg_bit_view(values[operand], how)
    assert ours_operands[operand].is_neg()

    def run(operands, call):
        grad = route != "no_grad"
        x = operands["input"].detach().clone().requires_grad_(grad)
        weight = operands["weight"].detach().clone().requires_grad_(grad)
        if operand == "input":
            x = operands["input"].requires_grad_(grad)  # the neg-bit tensor itself, a leaf
        if operand == "weight":
            weight = operands["weight"].requires_grad_(grad)
        with route_context(route):
            if fused:
                y, h = call(x, operands["residual"], weight)
            else:
                y, h = call(x, None, weight), None
            if grad:
                y.backward(operands["grad_output"])
        return y.detach(), h, None if not grad else (x.grad, weight.grad)

    def ours(x, residual, weight):
        if route == "op":
            if residual is None:
                return torch.ops.rmsnorm.rms_norm(x, [N], weight, 1e-6, 0.0)
            return torch.ops.rmsnorm.add_rms_norm(x, residual, [N], weight, 1e-6, 0.0)
        if residual is None:
            return rt.rms_norm(x, [N], weight, 1e-6)
        return rt.add_rms_norm(x, residual, [N], weight, 1e-6)

    def theirs(x, residual, weight):
        if residual is None:
            return F.rms_norm(x, [N], weight, 1e-6)
        h = x + residual
        return F.rms_norm(h, [N], weight, 1e-6), h

    got = run(ours_operands, ours)
    expected = run(values, theirs)
    torch.testing.assert_close(got[0], expected[0], msg=lambda m: f"output: {m}")
    if fused:
        torch.testing.assert_close(got[1].detach(), expected[1].detach(), msg=lambda m: f"sum: {m}")
    if got[2] is not None:
        for name, g, e in zip(("grad_input", "grad_weight"), got[2], expected[2]):
            torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


def test_negative_bit_of_a_16_bit_input_is_honoured():
    x = torch.randn(3, N).to(torch.bfloat16)
    weight = torch.rand(N)  # torch's mixed precision: a float32 weight
    flipped = torch._neg_view(-x)
    torch.testing.assert_close(rt.rms_norm(flipped, [N], weight), F.rms_norm(x, [N], weight))
