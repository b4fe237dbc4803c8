"""Edge values where torch's answer is a defined number, inf or NaN: ours is
the same on every instruction set, forward and both gradients.

- eps at the ends of the range: inf (1 / sqrt(inf) is 0), a value past
  float32's range (which float32 eps rounds to inf, as torch's does), -inf;
- a negative eps that cancels mean(x^2) exactly, where 1 / sqrt(0) is inf;
- one infinity in grad_output or in the weight, which makes only the
  elements it reaches non-finite, not the whole row.

Each case is compared with torch.nn.functional.rms_norm and its autograd,
NaN for NaN, in torch's own dtype.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rmsnorm
from rmsnorm._dtypes import BF16
from supported_dtypes import DTYPE_NAMES

# Rows of x: ordinary, with a zero and a negative, and all zeros.
X = np.array([[3.0, 4.0, -1.0, 2.0], [0.0, -2.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
WEIGHT = np.array([1.0, -0.5, 2.0, 0.25])
# mean(x^2) of X's first row, exactly representable in every dtype.
FIRST_ROW_MEAN = 7.5

EPS_CASES = {
    "eps_inf": np.inf,
    "eps_past_float32_range": 1e300,
    "eps_minus_inf": -np.inf,
    "eps_cancelling_the_mean": -FIRST_ROW_MEAN,
}

GRAD_CASES = {
    "grad_output_one_inf": ("grad_output", 0, np.inf),
    "grad_output_one_minus_inf": ("grad_output", 2, -np.inf),
    "weight_one_inf": ("weight", 1, np.inf),
    "weight_one_minus_inf": ("weight", 3, -np.inf),
}


def _ours(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(BF16 if dtype == "bfloat16" else dtype)


def _torch(values: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(values.astype(np.float64)).to(getattr(torch, dtype))


def _as_torch(ours: np.ndarray, dtype: str) -> torch.Tensor:
    return _torch(ours.astype(np.float64), dtype)


def _torch_gradients(x, weight, grad_output, eps, dtype):
    tx = _torch(x, dtype).requires_grad_()
    tw = _torch(weight, dtype).requires_grad_()
    y = F.rms_norm(tx, (x.shape[-1],), tw, eps=eps)
    y.backward(_torch(grad_output, dtype))
    return y.detach(), tx.grad, tw.grad


def _assert_same(ours, theirs, dtype, what):
    torch.testing.assert_close(_as_torch(ours, dtype), theirs, equal_nan=True,
                               msg=lambda message: f"{what}: {message}")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("case", EPS_CASES)
def test_eps_at_the_ends_of_the_range_gives_torchs_result(case, dtype, isa):
    eps = EPS_CASES[case]
    with np.errstate(all="raise"):  # no warning escapes the package either
        y = rmsnorm.rms_norm(_ours(X, dtype), 4, _ours(WEIGHT, dtype), eps=eps)
    expected = F.rms_norm(_torch(X, dtype), (4,), _torch(WEIGHT, dtype), eps=eps)
    _assert_same(y, expected, dtype, f"y on {isa}")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_a_cancelling_eps_gives_signed_infinities_with_a_weight_offset_too(dtype, isa):
    """mean(x^2) + eps = 0 makes 1/rms infinite: y is inf of the sign of
    x * (1 + w), NaN where x or 1 + w is 0."""
    weight = np.array([0.0, -1.0, -3.0, 1.0])  # 1 + w: 1, 0, -2, 2
    y = rmsnorm.rms_norm(_ours(X[:1], dtype), 4, _ours(weight, dtype), eps=-FIRST_ROW_MEAN,
                         weight_offset=1.0)
    assert np.array_equal(y.astype(np.float64), [[np.inf, np.nan, np.inf, np.inf]],
                          equal_nan=True), f"on {isa}: {y}"


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("case", EPS_CASES)
def test_eps_at_the_ends_of_the_range_gives_torchs_gradients(case, dtype, isa):
    eps = EPS_CASES[case]
    grad_output = np.linspace(-1.0, 1.0, X.size).reshape(X.shape)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        _ours(grad_output, dtype), _ours(X, dtype), 4, _ours(WEIGHT, dtype), eps=eps)
    _, expected_input, expected_weight = _torch_gradients(X, WEIGHT, grad_output, eps, dtype)
    _assert_same(grad_input, expected_input, dtype, f"grad_input on {isa}")
    _assert_same(grad_weight, expected_weight, dtype, f"grad_weight on {isa}")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("case", GRAD_CASES)
def test_one_infinity_poisons_only_the_elements_it_reaches(case, dtype, isa):
    operand, index, value = GRAD_CASES[case]
    x, weight = X[:2], WEIGHT.copy()
    grad_output = np.ones_like(x)
    {"grad_output": grad_output[0], "weight": weight}[operand][index] = value
    y = rmsnorm.rms_norm(_ours(x, dtype), 4, _ours(weight, dtype), eps=1e-6)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        _ours(grad_output, dtype), _ours(x, dtype), 4, _ours(weight, dtype), eps=1e-6)
    expected_y, expected_input, expected_weight = _torch_gradients(
        x, weight, grad_output, 1e-6, dtype)
    assert not np.isnan(grad_input.astype(np.float64)).all(), f"a row of NaN on {isa}"
    _assert_same(y, expected_y, dtype, f"y on {isa}")
    _assert_same(grad_input, expected_input, dtype, f"grad_input on {isa}")
    _assert_same(grad_weight, expected_weight, dtype, f"grad_weight on {isa}")


# eps, and y for x = ones(4) with float32 and with float64 input.
QUIET_EPS = {
    "float32_scalar": (np.float32(1e-5), 1 / np.sqrt(1 + float(np.float32(1e-5)))),
    "1e300": (1e300, {"float32": 0.0, "float64": 1e-150}),
    "float64_scalar_1e300": (np.float64(1e300), {"float32": 0.0, "float64": 1e-150}),
    "int_1e400": (10**400, 0.0),
    "int_minus_1e400": (-(10**400), np.nan),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", QUIET_EPS)
def test_any_real_eps_is_taken_without_a_warning(case, dtype):
    """eps past the eps type's range is +-inf there, quietly: y is then 0
    (or NaN for -inf), as 1 / sqrt(+-inf) gives."""
    eps, expected = QUIET_EPS[case]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = rmsnorm.rms_norm(np.ones((1, 4), dtype), 4, eps=eps)
    expected = expected[dtype] if isinstance(expected, dict) else expected
    np.testing.assert_allclose(y, np.full((1, 4), expected), rtol=1e-6)
