"""The C results against the float64 reference and against hand-computed
values, with no torch involved.

The implementation computes in double, so its float64 results sit within a
few ULPs of the reference and its float32 results within about one float32
ULP of the exact value. The hand-computed cases are written from the math.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest

import rmsnorm
from rmsnorm import reference
from closeness import assert_close_ulp, reference_grad_scales, ulp_distance
from supported_dtypes import WIDE_DTYPES


def forward_tolerance(dtype):
    """``(rtol, atol)`` of a forward result against the float64 reference.

    float32: the reference is exact to far below a float32 ULP, and a result
    computed in double and rounded once is within half an ULP of it, so 2
    float32 ULPs is ample. float64: the reference itself is a plain float64
    computation that is off by a few ULPs (sum, sqrt, division, two
    products), so the comparison allows 8.
    """
    eps = float(np.finfo(dtype).eps)
    return (2 * eps if dtype == np.float32 else 8 * eps), 0.0


def grad_tolerance(scale, dtype):
    # A few ULPs of the result itself, plus a few ULPs of the terms' scale
    # (see closeness.reference_grad_scales); the float64 reference adds its own few ULPs.
    eps = float(np.finfo(dtype).eps)
    return 4 * eps, 8 * eps * scale


CASES = [
    pytest.param((7,), (7,), id="x(7)-ns(7)"),
    pytest.param((4, 1), (1,), id="x(4,1)-ns(1)"),
    pytest.param((3, 127), (127,), id="x(3,127)-ns(127)"),
    pytest.param((2, 4096), (4096,), id="x(2,4096)-ns(4096)"),
    pytest.param((2, 3, 4, 5), (4, 5), id="x(2,3,4,5)-ns(4,5)"),
    pytest.param((2, 3, 4, 5), (3, 4, 5), id="x(2,3,4,5)-ns(3,4,5)"),
]
EPSILONS = [None, 0.0, 1e-6, 0.5, -0.5]


def _inputs(shape, normalized_shape, dtype, eps, seed=0):
    rng = np.random.default_rng([seed, *shape])
    if eps is not None and eps < 0:
        x = rng.uniform(1.0, 3.0, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        x = rng.standard_normal(shape)
    return (x.astype(dtype), rng.standard_normal(normalized_shape).astype(dtype),
            rng.standard_normal(shape).astype(dtype))


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("eps", EPSILONS, ids=lambda e: f"eps={e!r}")
@pytest.mark.parametrize("shape, normalized_shape", CASES)
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_matches_float64_reference(dtype, shape, normalized_shape, eps, affine):
    x, weight, _ = _inputs(shape, normalized_shape, dtype, eps)
    weight = weight if affine else None
    y = rmsnorm.rms_norm(x, normalized_shape, weight, eps)
    assert y.dtype == dtype
    rtol, atol = forward_tolerance(dtype)
    assert_close_ulp(y, reference.rms_norm(x, normalized_shape, weight, eps), rtol=rtol,
                     atol=atol, check_dtype=False, what="rms_norm vs reference")


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("eps", EPSILONS, ids=lambda e: f"eps={e!r}")
@pytest.mark.parametrize("shape, normalized_shape", CASES)
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_gradients_match_float64_reference(dtype, shape, normalized_shape, eps, affine):
    x, weight, grad_output = _inputs(shape, normalized_shape, dtype, eps)
    weight = weight if affine else None
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, normalized_shape,
                                                        weight, eps)
    gi_ref, gw_ref = reference.rms_norm_backward(grad_output, x, normalized_shape, weight, eps)
    assert grad_input.dtype == dtype
    gi_scale, gw_scale = reference_grad_scales(x, normalized_shape, weight, grad_output, eps)
    rtol, atol = grad_tolerance(gi_scale, dtype)
    assert_close_ulp(grad_input, gi_ref, rtol=rtol, atol=atol, check_dtype=False,
                     what="grad_input vs reference")
    if affine:
        assert grad_weight.dtype == dtype and grad_weight.shape == normalized_shape
        rtol, atol = grad_tolerance(gw_scale, dtype)
        assert_close_ulp(grad_weight, gw_ref, rtol=rtol, atol=atol, check_dtype=False,
                         what="grad_weight vs reference")
    else:
        assert grad_weight is None


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_reference_itself_matches_hand_computed_3_4(dtype):
    # Guards the guard: the reference is checked against the math too.
    y = reference.rms_norm(np.array([3.0, 4.0], dtype), (2,), eps=0.0)
    assert_close_ulp(y, np.array([0.6, 0.8]) * math.sqrt(2.0), rtol=1e-15, atol=0.0,
                     check_dtype=False, what="reference")


def _exact_forward(x_row, weight, eps):
    """y for one row in 60-digit decimal arithmetic, rounded to float64."""
    with decimal.localcontext() as context:
        context.prec = 60
        mean_square = sum(decimal.Decimal(float(v)) ** 2 for v in x_row) / len(x_row)
        inv_rms = 1 / (mean_square + decimal.Decimal(eps)).sqrt()
        return np.array([float(decimal.Decimal(float(v)) * inv_rms * decimal.Decimal(float(w)))
                         for v, w in zip(x_row, weight)])


# A double-precision computation rounded once to float32 is within half an
# ULP of the exact value (1 allowed). float64 has no wider type to hide its
# own rounding in: a careful double computation is within a few ULPs.
EXACT_ULP_BOUND = {np.dtype(np.float32): 1.0, np.dtype(np.float64): 8.0}


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5], ids=lambda e: f"eps={e!r}")
@pytest.mark.parametrize("n", [1, 3, 7, 64, 127, 1000, 4096])
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_is_within_a_few_ulps_of_the_exact_value(dtype, n, eps):
    rng = np.random.default_rng([9, n])
    x = rng.standard_normal((2, n)).astype(dtype)
    weight = rng.standard_normal(n).astype(dtype)
    y = rmsnorm.rms_norm(x, n, weight, eps)
    eps_used = reference.reference_eps(np.dtype(dtype), eps)
    expected = np.array([_exact_forward(row, weight, eps_used) for row in x])
    ulps = ulp_distance(y, expected, dtype)
    worst = np.unravel_index(int(np.argmax(ulps)), ulps.shape)
    assert ulps[worst] <= EXACT_ULP_BOUND[np.dtype(dtype)], (
        f"worst element at index {worst}: actual {float(y[worst])!r}, exact "
        f"{float(expected[worst])!r}, {ulps[worst]:.3g} ULP ({np.dtype(dtype).name})")


# ---------------------------------------------------------------------------
# Hand-computed cases.
# ---------------------------------------------------------------------------

def _exact_tolerance(dtype):
    """Within one ULP of dtype of the exact value."""
    return float(np.finfo(dtype).eps), 0.0


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_of_3_4_is_3_4_over_sqrt_12_5(dtype):
    # mean(x^2) = (9 + 16) / 2 = 12.5, rms = sqrt(12.5) = 5 / sqrt(2),
    # so y = [3, 4] * sqrt(2) / 5 = [0.6, 0.8] * sqrt(2).
    y = rmsnorm.rms_norm(np.array([3.0, 4.0], dtype), (2,), np.ones(2, dtype), eps=0.0)
    rtol, atol = _exact_tolerance(dtype)
    assert_close_ulp(y, np.array([0.6 * math.sqrt(2.0), 0.8 * math.sqrt(2.0)]), rtol=rtol,
                     atol=atol, check_dtype=False, what="y")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_gufunc_of_3_4_with_weight(dtype):
    # Same row, weight [2, -1]: y = [1.2, -0.8] * sqrt(2).
    y = rmsnorm.forward(np.array([3.0, 4.0], dtype), np.array([2.0, -1.0], dtype), 0.0)
    rtol, atol = _exact_tolerance(dtype)
    assert_close_ulp(y, np.array([1.2, -0.8]) * math.sqrt(2.0), rtol=rtol, atol=atol,
                     check_dtype=False, what="y")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_of_3_4_by_hand(dtype):
    # x = [3, 4], w = [1, 1], eps = 0, dy = [1, 0]; |x| = 5, inv_rms = sqrt(2)/5.
    # y_i = sqrt(2) x_i / |x|, so dy_0/dx_0 = sqrt(2) (|x|^2 - x_0^2) / |x|^3
    # = 16 sqrt(2) / 125 and dy_0/dx_1 = -sqrt(2) x_0 x_1 / |x|^3 = -12 sqrt(2) / 125.
    # grad_weight = dy * x * inv_rms = [3 sqrt(2) / 5, 0].
    x = np.array([[3.0, 4.0]], dtype)
    grad_output = np.array([[1.0, 0.0]], dtype)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, (2,), np.ones(2, dtype),
                                                        eps=0.0)
    root2 = math.sqrt(2.0)
    rtol, atol = _exact_tolerance(dtype)
    assert_close_ulp(grad_input, np.array([[16 * root2 / 125, -12 * root2 / 125]]),
                     rtol=2 * rtol, atol=atol, check_dtype=False, what="grad_input")
    assert_close_ulp(grad_weight, np.array([0.6 * root2, 0.0]), rtol=rtol, atol=atol,
                     check_dtype=False, what="grad_weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("value", [-2.0, 0.25, 7.0])
def test_single_element_row_normalises_to_its_sign_times_weight(value, dtype):
    # n = 1, eps = 0: rms = |x|, so y = sign(x) * w.
    y = rmsnorm.rms_norm(np.array([[value]], dtype), (1,), np.array([3.0], dtype), eps=0.0)
    assert_close_ulp(y, np.array([[math.copysign(3.0, value)]]), rtol=0.0, atol=0.0,
                     check_dtype=False, what="y")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_constant_row_with_eps_equal_to_mean_square(dtype):
    # x = [1, 1, 1, 1], eps = 1: mean(x^2) + eps = 2, y = 1 / sqrt(2).
    y = rmsnorm.rms_norm(np.ones((2, 4), dtype), 4, eps=1.0)
    rtol, atol = _exact_tolerance(dtype)
    assert_close_ulp(y, np.full((2, 4), 1.0 / math.sqrt(2.0)), rtol=rtol, atol=atol,
                     check_dtype=False, what="y")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_negative_eps_is_subtracted(dtype):
    # x = [2, 2], eps = -0.5: mean(x^2) + eps = 3.5, y = 2 / sqrt(3.5).
    y = rmsnorm.rms_norm(np.array([2.0, 2.0], dtype), (2,), eps=-0.5)
    rtol, atol = _exact_tolerance(dtype)
    assert_close_ulp(y, np.full(2, 2.0 / math.sqrt(3.5)), rtol=rtol, atol=atol,
                     check_dtype=False, what="y")


@pytest.mark.parametrize("dtype, machine_eps", [(np.float32, 2.0 ** -23), (np.float64, 2.0 ** -52)],
                         ids=["float32", "float64"])
def test_eps_none_is_the_machine_epsilon_of_the_input_dtype(dtype, machine_eps):
    # With x = 1e-4, mean(x^2) = 1e-8 is comparable to float32's eps, so the
    # default eps is visible in the result: y = x / sqrt(x^2 + eps).
    x = np.array([[1e-4, -1e-4]], dtype)
    x64 = float(x[0, 0])
    expected = np.array([[x64, -x64]]) / math.sqrt(x64 * x64 + machine_eps)
    rtol, atol = _exact_tolerance(dtype)
    for y in (rmsnorm.rms_norm(x, (2,)), rmsnorm.rms_norm(x, (2,), eps=None),
              rmsnorm.RMSNorm(2, dtype=dtype)(x)):
        assert_close_ulp(y, expected, rtol=rtol, atol=atol, check_dtype=False, what="y")


def test_given_eps_is_rounded_to_float32_for_float32_input():
    # eps = 2.5e-45 is not a float32: it rounds to 2 * 2**-149 (the nearest
    # subnormal). With x^2 = 1e-45 the two eps values give results 4% apart.
    eps = 2.5e-45
    eps32 = 2 * 2.0 ** -149
    assert float(np.float32(eps)) == eps32
    x = np.array([[math.sqrt(1e-45)]], np.float32)
    x64 = float(x[0, 0])
    expected = x64 / math.sqrt(x64 * x64 + eps32)
    y = rmsnorm.rms_norm(x, (1,), eps=eps)
    assert_close_ulp(y, np.array([[expected]]), rtol=2 * float(np.finfo(np.float32).eps),
                     atol=0.0, check_dtype=False, what="y with eps rounded to float32")
    # float64 input keeps eps exactly.
    y64 = rmsnorm.rms_norm(x.astype(np.float64), (1,), eps=eps)
    assert_close_ulp(y64, np.array([[x64 / math.sqrt(x64 * x64 + eps)]]), rtol=4e-16,
                     atol=0.0, what="y with float64 eps")


@pytest.mark.parametrize("scale", [1e30, 1e-30, 3e38, 1e-38], ids=lambda s: f"scale={s:g}")
def test_float32_extreme_magnitudes_are_exact(scale):
    # Squares of these overflow or underflow float32; accumulated in double
    # they do not, so y is as accurate as for ordinary values.
    rng = np.random.default_rng(8)
    x = (rng.uniform(0.5, 1.0, (3, 33)) * scale).astype(np.float32)
    x[:, ::2] *= -1
    assert np.isfinite(x).all() and (x != 0).all()
    y = rmsnorm.rms_norm(x, (33,), eps=0.0)
    expected = reference.rms_norm(x, (33,), eps=0.0)
    assert np.isfinite(expected).all()
    rtol, atol = forward_tolerance(np.float32)
    assert_close_ulp(y, expected, rtol=rtol, atol=atol, check_dtype=False, what="y")


def test_all_zero_row_with_zero_eps_is_nan_and_other_rows_are_not():
    x = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]])
    y = rmsnorm.rms_norm(x, (3,), eps=0.0)
    assert np.isnan(y[0]).all()
    # rms of [1, 2, 2] = sqrt(9 / 3) = sqrt(3)
    assert_close_ulp(y[1], np.array([1.0, 2.0, 2.0]) / math.sqrt(3.0), rtol=2.3e-16, atol=0.0,
                     what="second row")


def test_all_zero_row_with_positive_eps_is_zero():
    y = rmsnorm.rms_norm(np.zeros((2, 5), np.float32), (5,), eps=1e-5)
    assert np.array_equal(y, np.zeros((2, 5), np.float32))
    assert not np.signbit(y).any()
