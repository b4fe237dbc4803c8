"""Property tests: random shapes, strides, dtypes, values and eps against the
float64 reference (rmsnorm.reference), within the accuracy bounds.

- forward, float32: within 1 ULP of the float64 reference rounded to
  float32 (the kernels sum in double and round once);
- forward, float64: within 4 ULP (the reference is itself plain float64,
  a few roundings off);
- gradients: within 1 ULP (float32) or 4 ULP (float64) of the reference,
  plus a few double roundings of the terms they are made of, since
  grad_input is a difference that may cancel (closeness.reference_grad_scales).

Values span float32's whole finite range, subnormals included; float64
values stay within 1e+-150, where the reference's plain squares neither
overflow nor underflow (the kernels' own range is the fuzzer's and the
extreme-magnitude tests' business).

Runs are derandomised, so CI sees the same examples every time; set
RMSNORM_HYPOTHESIS_EXAMPLES=5000 RMSNORM_HYPOTHESIS_RANDOM=1 to explore.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import rmsnorm  # noqa: E402
from closeness import assert_close_ulp, reference_grad_scales  # noqa: E402
from rmsnorm import reference  # noqa: E402

PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("RMSNORM_HYPOTHESIS_EXAMPLES", "150")),
    derandomize=not os.environ.get("RMSNORM_HYPOTHESIS_RANDOM"),
    database=None,  # write nothing into the work tree
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

FORWARD_ULPS = {np.dtype(np.float32): 1, np.dtype(np.float64): 4}
DOUBLE_UNIT = 2.0**-53

# ---------------------------------------------------------------------------
# Strategies.
# ---------------------------------------------------------------------------

dtypes = st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)])
eps_values = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1e-12, 1e-6, 1e-5, 1e-3, 1.0]),
    st.floats(min_value=0.0, max_value=10.0),
)
steps = st.sampled_from([1, 1, 2, -1, -2, 3])


def elements(dtype, limit=None):
    if dtype == np.float32:
        bound = limit or float(np.finfo(np.float32).max)
        return st.floats(-bound, bound, width=32, allow_nan=False, allow_infinity=False)
    bound = limit or 1e150
    # Magnitudes under 1e-150 become 0: their squares would underflow in
    # the reference's plain float64 sum.
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False).map(
        lambda v: 0.0 if abs(v) < 1e-150 else v)


@st.composite
def strided(draw, dtype, shape, limit=None):
    """An array of ``shape`` that is a strided view (steps of -2..3 per axis,
    C or Fortran base) into a larger random array."""
    axis_steps = [draw(steps) for _ in shape]
    base_shape = tuple(size * abs(step) for size, step in zip(shape, axis_steps))
    base = draw(hnp.arrays(dtype, base_shape, elements=elements(dtype, limit)))
    if draw(st.booleans()):
        base = np.asfortranarray(base)
    view = base[tuple(slice(None, None, step) for step in axis_steps)]
    assert view.shape == tuple(shape)
    return view


def assert_within_ulps(actual, expected, ulps, what, extra_atol=0.0):
    """|actual - expected| <= ulps * spacing(expected) + extra_atol, elementwise,
    with the float64 ``expected`` first rounded to ``actual``'s dtype; NaN
    where the reference has NaN."""
    actual = np.asarray(actual)
    with np.errstate(over="ignore"):
        expected = np.asarray(expected).astype(actual.dtype).astype(np.float64)
    spacing = np.spacing(np.abs(expected).astype(actual.dtype)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        allowed = np.where(np.isfinite(spacing), ulps * spacing, 0.0) + extra_atol
    # assert_close_ulp takes one atol: express the elementwise bound as
    # "badness <= 1" by comparing scaled copies.
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(allowed > 0, allowed, 1.0)
    assert_close_ulp(actual.astype(np.float64) / scale, expected / scale, rtol=0.0, atol=1.0,
                     what=f"{what} (in units of the allowed error)", check_dtype=False)


# ---------------------------------------------------------------------------
# Forward.
# ---------------------------------------------------------------------------

@st.composite
def forward_problems(draw):
    dtype = draw(dtypes)
    rows = draw(st.integers(0, 4))
    n = draw(st.integers(1, 150))
    x = draw(strided(dtype, (rows, n)))
    weight = draw(strided(dtype, (n,), limit=1e4))
    eps = draw(eps_values)
    return x, weight, eps


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@PROPERTY_SETTINGS
@given(forward_problems())
def test_forward_gufunc_matches_reference(problem):
    x, weight, eps = problem
    eps = np.array(reference.reference_eps(x.dtype, eps), x.dtype)
    y = rmsnorm.forward(x, weight, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    expected = reference.rms_norm(x, (x.shape[-1],), weight, float(eps))
    assert_within_ulps(y, expected, FORWARD_ULPS[np.dtype(y.dtype)], "forward")


@st.composite
def tiny_float32_problems(draw):
    n = draw(st.integers(1, 80))
    tiny = st.floats(-2.0**-120, 2.0**-120, width=32, allow_nan=False)
    x = draw(hnp.arrays(np.float32, (2, n), elements=tiny))
    weight = draw(hnp.arrays(np.float32, (n,), elements=st.floats(
        -2.0**100, 2.0**100, width=32, allow_nan=False)))
    eps = draw(st.sampled_from([1e-6, 1e-3, 1.0, 3.0]))
    return x, weight, eps


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@PROPERTY_SETTINGS
@given(tiny_float32_problems())
def test_float32_forward_where_x_hat_or_y_is_tiny(problem):
    x, weight, eps = problem
    eps = np.float32(eps)
    y = rmsnorm.forward(x, weight, eps)
    expected = reference.rms_norm(x, (x.shape[-1],), weight, float(eps))
    assert_within_ulps(y, expected, 1, "forward, tiny float32")


@st.composite
def functional_problems(draw):
    dtype = draw(dtypes)
    batch = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    normalized = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=2)))
    if len(normalized) == 1:
        normalized = (draw(st.integers(1, 150)),)
    x = draw(strided(dtype, batch + normalized))
    weight = draw(st.one_of(st.none(), strided(dtype, normalized, limit=1e4)))
    eps = draw(eps_values)
    as_int = len(normalized) == 1 and draw(st.booleans())
    return x, normalized[0] if as_int else normalized, weight, eps


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@PROPERTY_SETTINGS
@given(functional_problems())
def test_rms_norm_matches_reference(problem):
    x, normalized_shape, weight, eps = problem
    y = rmsnorm.rms_norm(x, normalized_shape, weight, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    expected = reference.rms_norm(x, normalized_shape, weight, eps)
    assert_within_ulps(y, expected, FORWARD_ULPS[np.dtype(y.dtype)], "rms_norm")


# ---------------------------------------------------------------------------
# Backward. Values stay within 1e+-10 for float32 (and 1e+-150 for float64)
# so that the products and sums the gradients are made of stay finite.
# ---------------------------------------------------------------------------

@st.composite
def backward_problems(draw):
    dtype = draw(dtypes)
    limit = 1e10 if dtype == np.float32 else None
    m = draw(st.integers(0, 5))
    n = draw(st.integers(1, 150))
    x = draw(strided(dtype, (m, n), limit))
    grad = draw(strided(dtype, (m, n), limit=1e4))
    weight = draw(strided(dtype, (n,), limit=1e4))
    eps = draw(eps_values)
    return grad, x, weight, eps


def assert_gradients_close(grad_input, grad_weight, grad, x, weight, eps, normalized_shape):
    dtype = x.dtype
    gi_ref, gw_ref = reference.rms_norm_backward(grad, x, normalized_shape, weight, eps)
    gi_scale, gw_scale = reference_grad_scales(x, normalized_shape, weight, grad, eps)
    assume(np.isfinite(gi_scale) and np.isfinite(gw_scale))
    ulps = FORWARD_ULPS[dtype]
    rows = x.size // max(1, int(np.prod(normalized_shape)))
    assert_within_ulps(grad_input, gi_ref, ulps, "grad_input",
                       extra_atol=16 * DOUBLE_UNIT * gi_scale)
    if grad_weight is not None:
        assert_within_ulps(grad_weight, gw_ref, ulps, "grad_weight",
                           extra_atol=(rows + 4) * DOUBLE_UNIT * gw_scale)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@PROPERTY_SETTINGS
@given(backward_problems())
def test_backward_gufunc_matches_reference(problem):
    grad, x, weight, eps = problem
    eps = np.array(reference.reference_eps(x.dtype, eps), x.dtype)
    grad_input, grad_weight = rmsnorm.backward(grad, x, weight, eps)
    assert grad_input.dtype == x.dtype and grad_input.shape == x.shape
    assert grad_weight.shape == weight.shape
    assert_gradients_close(grad_input, grad_weight, grad, x, weight, float(eps), (x.shape[-1],))


@st.composite
def functional_backward_problems(draw):
    x, normalized_shape, weight, eps = draw(functional_problems())
    assume(np.all(np.abs(x) <= (1e10 if x.dtype == np.float32 else 1e150)))
    grad = draw(strided(x.dtype, x.shape, limit=1e4))
    return grad, x, normalized_shape, weight, eps


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@PROPERTY_SETTINGS
@given(functional_backward_problems())
def test_rms_norm_backward_matches_reference(problem):
    grad, x, normalized_shape, weight, eps = problem
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad, x, normalized_shape, weight, eps)
    assert (grad_weight is None) == (weight is None)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    assert_gradients_close(grad_input, grad_weight, grad, x, weight, eps, shape)
