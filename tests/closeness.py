"""Element-by-element comparisons whose failure message is worth reading.

Every numeric assertion of the suite goes through :func:`assert_close_ulp`.
When it fails, it names the worst element (the one furthest outside its
tolerance): its index, both values, the absolute difference and the distance
in ULPs of the compared dtype, plus how many elements failed in all.

A test that claims the same bytes goes through :func:`assert_same_bytes`
instead, which compares bits, not values: -0.0 is not 0.0 there, nor is one
NaN another with a different payload.
"""

from __future__ import annotations

import sys

import numpy as np

# torch.testing.assert_close's default (rtol, atol) per dtype. The forward
# parity checks use them as they are.
TORCH_DEFAULT_TOLERANCES = {
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-7),
}
try:
    import ml_dtypes

    TORCH_DEFAULT_TOLERANCES[np.dtype(ml_dtypes.bfloat16)] = (1.6e-2, 1e-5)
except ImportError:  # the bfloat16 tests skip themselves
    pass


def torch_default_tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` that torch.testing.assert_close uses for ``dtype``."""
    return TORCH_DEFAULT_TOLERANCES[np.dtype(dtype)]


def ulp_distance(actual, expected, dtype) -> np.ndarray:
    """``|actual - expected|`` in units of ``dtype``'s spacing at ``expected``.

    ``expected`` is first rounded to ``dtype``, so a float64 reference is
    measured in float32 ULPs when a float32 result is checked against it.
    Fractional values are kept: 0.5 means half an ULP away.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    spacing = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(actual - expected) / spacing


def assert_close_ulp(actual, expected, *, rtol, atol, what="result",
                     check_dtype=True, equal_nan=True):
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` everywhere.

    Shapes must be equal, and dtypes too unless ``check_dtype`` is false.
    NaNs must sit in the same places (when ``equal_nan``); infinities must
    be equal. ULPs are measured in ``actual``'s dtype.
    """
    actual_arr = np.asarray(actual)
    expected_arr = np.asarray(expected)
    assert actual_arr.shape == expected_arr.shape, (
        f"{what}: shape {actual_arr.shape} != expected shape {expected_arr.shape}")
    if check_dtype:
        assert actual_arr.dtype == expected_arr.dtype, (
            f"{what}: dtype {actual_arr.dtype} != expected dtype {expected_arr.dtype}")
    if actual_arr.size == 0:
        return
    ulp_dtype = actual_arr.dtype if np.issubdtype(actual_arr.dtype, np.floating) \
        else expected_arr.dtype

    a = actual_arr.astype(np.float64)
    e = expected_arr.astype(np.float64)
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(a - e)
        allowed = atol + rtol * np.abs(e)
        # How far outside its tolerance each element is; the worst is reported.
        badness = np.where(allowed > 0, diff / allowed, np.where(diff > 0, np.inf, 0.0))
    same_inf = np.isinf(a) & np.isinf(e) & (a == e)
    badness = np.where(same_inf, 0.0, badness)
    if equal_nan:
        badness = np.where(a_nan & e_nan, 0.0, badness)
    # A NaN on one side only is as bad as it gets.
    badness = np.where(a_nan ^ e_nan, np.inf, badness)
    if not equal_nan:
        badness = np.where(a_nan & e_nan, np.inf, badness)
    badness = np.where(np.isnan(badness), np.inf, badness)

    failing = badness > 1.0
    if not failing.any():
        return
    worst = np.unravel_index(int(np.argmax(badness)), badness.shape)
    ulps = ulp_distance(a[worst], e[worst], ulp_dtype)
    finite = ~(a_nan | e_nan) & np.isfinite(diff)
    max_ulps = np.max(ulp_distance(a[finite], e[finite], ulp_dtype)) if finite.any() else np.nan
    raise AssertionError(
        f"{what}: {int(failing.sum())} of {failing.size} elements differ beyond "
        f"rtol={rtol:g}, atol={atol:g}.\n"
        f"  worst element at index {tuple(int(i) for i in worst)}: "
        f"actual {a[worst]!r}, expected {e[worst]!r}, "
        f"abs diff {diff[worst]:.6g} (allowed {allowed[worst]:.6g}), "
        f"{ulps:.4g} ULP ({np.dtype(ulp_dtype).name})\n"
        f"  largest ULP distance over all finite elements: {max_ulps:.4g}")


def _bit_pattern(element: np.ndarray) -> str:
    """The bits of a one-element array as hex, most significant first."""
    byteorder = {"<": "little", ">": "big"}.get(element.dtype.byteorder, sys.byteorder)
    raw = element.tobytes()
    return f"0x{int.from_bytes(raw, byteorder):0{2 * len(raw)}x}"


def assert_same_bytes(actual, expected, *, what="result", nan_bits=True):
    """Assert the same dtype, the same shape and the same bytes everywhere.

    Bits, not values, are compared, so that a claim of identical results
    also covers the sign of zeros and the payload of NaNs. With
    ``nan_bits=False`` a NaN must meet a NaN, of any sign and payload, and
    every other element must have the same bytes. Layout does not
    count: both sides are compared as C-contiguous copies. The failure
    message names the first differing element, both values and their bits.
    """
    actual_arr = np.asarray(actual)
    expected_arr = np.asarray(expected)
    assert actual_arr.dtype == expected_arr.dtype, (
        f"{what}: dtype {actual_arr.dtype} != expected dtype {expected_arr.dtype}")
    assert actual_arr.shape == expected_arr.shape, (
        f"{what}: shape {actual_arr.shape} != expected shape {expected_arr.shape}")
    if actual_arr.size == 0:
        return
    itemsize = actual_arr.dtype.itemsize
    a = np.ascontiguousarray(actual_arr).reshape(-1)
    e = np.ascontiguousarray(expected_arr).reshape(-1)
    differs = (a.view(np.uint8).reshape(-1, itemsize)
               != e.view(np.uint8).reshape(-1, itemsize)).any(axis=1)
    if not nan_bits:
        a_nan = np.isnan(a.astype(np.float64))
        differs &= ~(a_nan & np.isnan(e.astype(np.float64)))
    if not differs.any():
        return
    first = int(np.argmax(differs))
    index = tuple(int(i) for i in np.unravel_index(first, actual_arr.shape))
    raise AssertionError(
        f"{what}: {int(differs.sum())} of {differs.size} elements differ in their bytes "
        f"({actual_arr.dtype}).\n"
        f"  first at index {index}: actual {a[first]!r} ({_bit_pattern(a[first:first + 1])}), "
        f"expected {e[first]!r} ({_bit_pattern(e[first:first + 1])})")


def assert_forward_close(actual, expected, *, what="output"):
    """Forward parity: torch.testing.assert_close's defaults for the dtype."""
    rtol, atol = torch_default_tolerance(np.asarray(expected).dtype)
    assert_close_ulp(actual, expected, rtol=rtol, atol=atol, what=what)


def grad_tolerance(expected, dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for a gradient, with atol scaled to the tensor.

    Why scaled: torch computes the gradient in the input dtype as a
    difference of two terms, ``inv_rms * g`` and
    ``x_hat * mean(g * x_hat) * inv_rms``, of the size of the whole row.
    Where they nearly cancel, an element of grad_input is small but carries
    the rounding error of those large terms, so torch's error is relative to
    the scale of the tensor, not to each element. grad_weight is a sum over
    all rows and grows with the batch. So the default atol, meant for values
    of order one, is multiplied by the tensor's largest magnitude (and never
    made smaller than the default).
    """
    rtol, atol = torch_default_tolerance(dtype)
    expected = np.asarray(expected, dtype=np.float64)
    finite = expected[np.isfinite(expected)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    return rtol, atol * max(1.0, scale)


def assert_grad_close(actual, expected, *, what="gradient"):
    """Gradient parity with an absolute tolerance scaled to the tensor."""
    expected = np.asarray(expected)
    rtol, atol = grad_tolerance(expected, expected.dtype)
    assert_close_ulp(actual, expected, rtol=rtol, atol=atol, what=what)


def reference_grad_scales(x, normalized_shape, weight, grad_output, eps):
    """The scales that bound the rounding error of each gradient.

    grad_input = inv_rms * g - x_hat * mean(g * x_hat) * inv_rms: two terms
    that can cancel (for n = 1 they cancel exactly when eps = 0), so an
    element's error is relative to the size of those terms, not of the
    element. grad_weight sums dy * x_hat over rows: its error is relative to
    the sum of the magnitudes. Both scales are computed here in float64.
    """
    n = int(np.prod(normalized_shape))
    rows = np.asarray(x, np.float64).reshape(-1, n)
    dy = np.asarray(grad_output, np.float64).reshape(-1, n)
    w = np.ones(n) if weight is None else np.asarray(weight, np.float64).reshape(-1)
    from rmsnorm import reference

    eps64 = reference.reference_eps(np.asarray(x).dtype, eps)
    inv_rms = 1.0 / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps64)
    x_hat = rows * inv_rms
    g = dy * w
    term1 = np.abs(g * inv_rms)
    term2 = np.abs(x_hat * np.mean(np.abs(g * x_hat), axis=1, keepdims=True) * inv_rms)
    gi_scale = float(np.max(term1 + term2)) if rows.size else 0.0
    gw_scale = float(np.max(np.sum(np.abs(dy * x_hat), axis=0))) if rows.size else 0.0
    return gi_scale, gw_scale
