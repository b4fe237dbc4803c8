"""The suite's own assertion helper must fail, and say why."""

import numpy as np
import pytest

from closeness import assert_close_ulp, grad_tolerance


def test_close_assertion_reports_worst_element_and_ulps():
    """The failure message the whole suite relies on names the worst element."""
    expected = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    actual = expected.copy()
    actual[1, 0] = np.nextafter(np.float32(3.0), np.float32(4.0))  # 1 ULP: within rtol
    actual[0, 1] = np.float32(2.001)  # far off
    with pytest.raises(AssertionError) as failure:
        assert_close_ulp(actual, expected, rtol=1.3e-6, atol=1e-5)
    message = str(failure.value)
    assert "1 of 4 elements" in message
    assert "index (0, 1)" in message
    assert repr(float(np.float32(2.001))) in message and "2.0" in message
    ulps = (np.float64(np.float32(2.001)) - 2.0) / np.spacing(np.float32(2.0))
    assert f"{ulps:.4g} ULP (float32)" in message


@pytest.mark.parametrize("actual, expected", [
    ([1.0, np.nan], [1.0, 2.0]),
    ([1.0, 2.0], [1.0, np.nan]),
    ([1.0, np.inf], [1.0, 2.0]),
    ([1.0, -np.inf], [1.0, np.inf]),
])
def test_close_assertion_fails_on_nan_or_inf_on_one_side(actual, expected):
    with pytest.raises(AssertionError, match="1 of 2 elements"):
        assert_close_ulp(np.array(actual), np.array(expected), rtol=1e-7, atol=1e-7)


def test_close_assertion_accepts_matching_nan_and_inf():
    values = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert_close_ulp(values.copy(), values, rtol=0.0, atol=0.0)


def test_close_assertion_checks_shape_and_dtype():
    with pytest.raises(AssertionError, match="shape"):
        assert_close_ulp(np.zeros(3), np.zeros((3, 1)), rtol=0.0, atol=0.0)
    with pytest.raises(AssertionError, match="dtype"):
        assert_close_ulp(np.zeros(3, np.float32), np.zeros(3), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("dtype, default_atol", [(np.float32, 1e-5), (np.float64, 1e-7)])
def test_grad_tolerance_scales_atol_with_largest_element_only_above_one(dtype, default_atol):
    assert grad_tolerance(np.array([0.5, -0.25], dtype), dtype)[1] == default_atol
    assert grad_tolerance(np.array([3.0, -40.0], dtype), dtype)[1] == pytest.approx(40 * default_atol)
