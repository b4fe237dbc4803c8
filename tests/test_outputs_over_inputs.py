"""Outputs written over the inputs they are computed from.

NumPy makes a defensive copy of an input that an output overlaps, except
where the output *is* that input: then it trusts the loop to read each
element before writing it. The kernels read the weight while they write
(and again, for the rows whose rounding they check a second time), so an
output that is the weight must give the same bytes as one that is not. The
rows are long and their weights wide, so that some of their outputs take
that second pass.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes
from supported_dtypes import DTYPES

N = 65536


def _operands(dtype, rows: int | None, seed: int = 39):
    """x, a residual, and a weight of the same dtype: a row each, or per-row
    weights of shape (rows, N)."""
    rng = np.random.default_rng(seed)
    shape = (N,) if rows is None else (rows, N)
    x = rng.standard_normal(shape).astype(dtype)
    weight = rng.uniform(-2.0, 2.0, shape).astype(dtype)
    residual = rng.standard_normal(shape).astype(dtype)
    return x, residual, weight


def _eps(dtype):
    return np.float64(1e-6) if dtype == np.float64 else np.float32(1e-6)


@pytest.mark.parametrize("rows", [None, 3], ids=["one-row", "per-row-weights"])
@pytest.mark.parametrize("offset", [None, 1.0], ids=["plain", "offset"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_output_that_is_the_weight_gives_the_same_bytes(dtype, offset, rows, isa):
    x, _, weight = _operands(dtype, rows)
    eps = _eps(dtype)
    if offset is None:
        expected = rmsnorm.forward(x, weight, eps)
        result = rmsnorm.forward(x, weight, eps, out=weight)
    else:
        expected = rmsnorm.forward_offset(x, weight, np.float64(offset), eps)
        result = rmsnorm.forward_offset(x, weight, np.float64(offset), eps, out=weight)
    assert result is weight
    assert_same_bytes(weight, expected, what="y written over the weight")


@pytest.mark.parametrize("over", ["residual_out", "y"])
@pytest.mark.parametrize("offset", [None, 1.0], ids=["plain", "offset"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_output_that_is_the_weight_gives_the_same_bytes(dtype, offset, over, isa):
    x, residual, weight = _operands(dtype, None)
    eps = _eps(dtype)
    extra = () if offset is None else (np.float64(offset),)
    gufunc = rmsnorm.add_forward if offset is None else rmsnorm.add_forward_offset
    expected_y, expected_sum = gufunc(x, residual, weight, *extra, eps)
    out = (None, weight) if over == "residual_out" else (weight, None)
    y, residual_out = gufunc(x, residual, weight, *extra, eps, out=out)
    assert_same_bytes(y, expected_y, what="y")
    assert_same_bytes(residual_out, expected_sum, what="residual_out")


def test_the_smallest_fused_case_is_not_normalised_against_its_own_sum():
    # residual_out over the weight: read back as the weight, the sum made
    # y = h * inv_rms * h.
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    residual = np.full(4, 0.5, np.float32)
    weight = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    expected = rmsnorm.rms_norm(x + residual, 4, weight.copy(), 1e-6)
    y, _ = rmsnorm.add_rms_norm(x, residual, 4, weight, 1e-6, out=(None, weight))
    assert_same_bytes(y, expected, what="y")


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_grad_weight_that_is_the_weight_gives_the_same_bytes(dtype, isa):
    x, grad_output, weight = _operands(dtype, None)
    x, grad_output = x[None], grad_output[None]
    eps = _eps(dtype)
    expected_gi, expected_gw = rmsnorm.backward(grad_output, x, weight, eps)
    grad_input, grad_weight = rmsnorm.backward(grad_output, x, weight, eps,
                                               out=(None, weight))
    assert grad_weight is weight
    assert_same_bytes(grad_input, expected_gi, what="grad_input")
    assert_same_bytes(grad_weight, expected_gw, what="grad_weight over the weight")
