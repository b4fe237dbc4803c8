"""The suite's own assertion helper must fail, and say why."""

import numpy as np
import pytest

from closeness import assert_close_ulp, assert_same_bytes, grad_tolerance


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


def _float32_from_bits(*bits):
    return np.array(bits, np.uint32).view(np.float32)


@pytest.mark.parametrize("actual_bits, expected_bits", [
    pytest.param(0x80000000, 0x00000000, id="minus_zero_vs_zero"),
    pytest.param(0x7FC00001, 0x7FC00000, id="nan_payloads"),
    pytest.param(0xFFC00000, 0x7FC00000, id="nan_signs"),
])
def test_same_bytes_assertion_fails_where_values_compare_equal(actual_bits, expected_bits):
    """-0.0 == 0.0 and NaNs compare equal under equal_nan: the bytes do not."""
    one = 0x3F800000
    actual, expected = _float32_from_bits(one, actual_bits), _float32_from_bits(one, expected_bits)
    assert np.array_equal(actual, expected, equal_nan=True), "the values should compare equal"
    with pytest.raises(AssertionError) as failure:
        assert_same_bytes(actual, expected, what="y")
    message = str(failure.value)
    assert "y: 1 of 2 elements differ in their bytes (float32)" in message
    assert "index (1,)" in message
    assert f"(0x{actual_bits:08x})" in message and f"(0x{expected_bits:08x})" in message


def test_same_bytes_assertion_accepts_equal_bits_in_any_layout():
    values = _float32_from_bits(0x7FC00001, 0x80000000, 0x3F800000)
    assert_same_bytes(np.repeat(values, 2)[::2], values.copy())


def test_same_bytes_assertion_checks_shape_and_dtype():
    with pytest.raises(AssertionError, match="shape"):
        assert_same_bytes(np.zeros(3), np.zeros((3, 1)))
    with pytest.raises(AssertionError, match="dtype"):
        assert_same_bytes(np.zeros(3, np.float32), np.zeros(3))
    with pytest.raises(AssertionError, match="dtype"):
        assert_same_bytes(np.zeros(3, ">f4"), np.zeros(3, "<f4"))
