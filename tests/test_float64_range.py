"""float64 rows and gradients at either end of the range: exact, or within a
few ULP for the gradients, where torch's composite overflows, underflows or
gives NaN.

mean(x^2) of a row near 2^-1000 underflows double, and of one near 2^1000
overflows it; 1 / rms of a subnormal row with eps = 0 is past the largest
double, and of a row near 2^1023 is subnormal; sum(grad_output * w * x)
leaves the range when grad_output is near either end too. The exact values
are none of these: y = x / rms lies within sqrt(n) of 0 for every row.

The reference is decimal arithmetic at 2,000 digits, which holds every
double and its square exactly (so terms past DBL_MAX that cancel still
cancel), with an exponent range far past double's, rounded once to the
nearest double (float() of a Decimal is correctly rounded): no float64
step of its own can overflow.
"""

from __future__ import annotations

import functools
import math
from decimal import Context, Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes

N = 7
WIDE = Context(prec=2000, Emin=-99999, Emax=99999)

# Rows by the binade of their largest element, from the smallest subnormal
# to the largest finite double.
ROW_SCALES = {
    "smallest_subnormals": 2.0**-1074,
    "subnormal": 2.0**-1040,
    "just_below_normal": 2.0**-1023,
    "near_2_to_minus_1000": 2.0**-1000,
    "near_2_to_1000": 2.0**1000,
    "near_2_to_1022": 2.0**1022,
    "near_the_largest_double": 2.0**1023,
}
GRAD_SCALES = {
    "grad_output_subnormal": 2.0**-1050,
    "grad_output_near_the_smallest": 2.0**-1068,
    "grad_output_tiny": 2.0**-1000,
    "grad_output_ordinary": 1.0,
    "grad_output_huge": 2.0**1000,
}


def _row(scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    signs = np.where(rng.random((3, N)) < 0.5, -1.0, 1.0)
    if scale < 2.0**-1060:
        # a few ULPs of the smallest subnormal: 1 to 7 times 2^-1074
        return signs * rng.integers(1, 8, (3, N)) * scale
    # largest element in [scale, 2 scale), the largest double at most
    values = signs * (1.0 + rng.random((3, N))) * scale
    return np.clip(values, -np.finfo(np.float64).max, np.finfo(np.float64).max)


def _weight(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.25, 4.0, N) * np.array([1, -1, 1, 1, -1, 1, 1])


def _exact_forward(x, weight, eps, offset=0.0):
    out = np.empty_like(x)
    with localcontext(WIDE):
        for r, row in enumerate(x):
            values = [Decimal(v) for v in row]
            mean = sum(v * v for v in values) / len(values) + Decimal(eps)
            inv = 1 / mean.sqrt()
            out[r] = [float(v * inv * (Decimal(offset) + Decimal(w)))
                      for v, w in zip(values, weight)]
    return out


def _exact_backward(grad_output, x, weight, eps):
    """grad_input and grad_weight, and the size of the two terms grad_input
    is the difference of, where it cancels."""
    grad_input, terms = np.empty_like(x), np.empty_like(x)
    grad_weight = [Decimal(0)] * x.shape[1]
    with localcontext(WIDE):
        for r, (g_row, row) in enumerate(zip(grad_output, x)):
            g = [Decimal(v) for v in g_row]
            values = [Decimal(v) for v in row]
            w = [Decimal(v) for v in weight]
            n = len(values)
            inv = 1 / (sum(v * v for v in values) / n + Decimal(eps)).sqrt()
            dot = sum(a * b * c for a, b, c in zip(g, w, values))
            grad_input[r] = [float(inv * a * b - c * inv**3 * dot / n)
                             for a, b, c in zip(g, w, values)]
            terms[r] = [float(max(abs(inv * a * b), abs(c * inv**3 * dot / n)))
                        for a, b, c in zip(g, w, values)]
            grad_weight = [s + a * c * inv for s, a, c in zip(grad_weight, g, values)]
        return grad_input, np.array([float(s) for s in grad_weight]), terms


def _assert_close_to_exact(ours, exact, what, ulps=8, terms=None):
    """Equal infinities where the exact value overflows; elsewhere within
    `ulps` ULPs of the row's largest exact element, or of the terms it is
    the difference of where those are larger (a cancelling gradient)."""
    assert np.array_equal(np.isinf(ours), np.isinf(exact)), f"{what}: {ours} vs {exact}"
    assert not np.isnan(ours).any(), f"{what}: NaN in {ours}"
    finite = np.isfinite(exact)
    scale = np.max(np.abs(np.where(finite, exact, 0.0)), axis=-1, keepdims=True)
    if terms is not None:
        scale = np.maximum(scale, np.where(np.isfinite(terms), terms, 0.0))
    bound = ulps * np.spacing(scale) + np.finfo(np.float64).smallest_subnormal
    bound = np.broadcast_to(bound, exact.shape)
    error = np.abs(np.subtract(ours, exact, out=np.zeros_like(ours), where=finite))
    assert (error <= bound).all(), f"{what}: {ours} vs {exact}"


@pytest.mark.parametrize("eps", [0.0, 1e-300], ids=["eps_0", "eps_tiny"])
@pytest.mark.parametrize("case", ROW_SCALES)
def test_forward_is_the_exact_result_rounded_once(case, eps, isa):
    x = _row(ROW_SCALES[case], seed=1)
    weight = _weight(2)
    with np.errstate(all="raise"):
        y = rmsnorm.rms_norm(x, N, weight, eps=eps)
    np.testing.assert_array_equal(y, _exact_forward(x, weight, eps))


@pytest.mark.parametrize("case", ROW_SCALES)
def test_forward_with_a_weight_offset_is_the_exact_result_rounded_once(case, isa):
    x = _row(ROW_SCALES[case], seed=3)
    weight = _weight(4) - 1.0
    y = rmsnorm.rms_norm(x, N, weight, eps=0.0, weight_offset=1.0)
    np.testing.assert_array_equal(y, _exact_forward(x, weight, 0.0, offset=1.0))


@pytest.mark.parametrize("grad_case", GRAD_SCALES)
@pytest.mark.parametrize("case", ROW_SCALES)
def test_gradients_are_near_the_exact_ones(case, grad_case, isa):
    x = _row(ROW_SCALES[case], seed=5)
    weight = _weight(6)
    grad_output = _row(GRAD_SCALES[grad_case], seed=7)
    with np.errstate(all="raise"):
        grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, N, weight, eps=0.0)
    exact_input, exact_weight, terms = _exact_backward(grad_output, x, weight, 0.0)
    _assert_close_to_exact(grad_input, exact_input, "grad_input", terms=terms)
    _assert_close_to_exact(grad_weight, exact_weight, "grad_weight")


# Rows once found wrong, by the fuzzer (tests/fuzz/fuzz_rms_norm.c) or by
# review, each a different step: (grad_output, x, weight, eps).
ROWS_ONCE_WRONG = {
    # a row of zeros with a subnormal eps: 1 / sqrt(eps) squared overflowed
    "zeros_with_subnormal_eps": ([[1.0, 1.0]], [[0.0, 0.0]], [1.0, 1.0], 5e-324),
    # a zero element: its exponent scaled the other term away
    "a_zero_factor": ([[1.0, 2.0**-60]], [[2.0**-1022, 0.0]], [1.0, 1.0], 0.0),
    "a_zero_factor_nearer": ([[1.0, 2.0**-30]], [[2.0**-1022, 0.0]], [1.0, 1.0], 0.0),
    # eps dominating mean(x^2): the scaled 1 / rms far from 1, its cube lost
    "eps_dominates_a_tiny_row": ([[1.0, 0.0]], [[2.0**-1021, -2.0**-1050]], [1.0, 1.0],
                                 2.0**-1045),
    "eps_dominates_a_huge_gradient": (
        [[-5.5897119541143962e301, 8.3353324245899226e303]],
        [[-6.098281499952841e-60, 1.549914853115986e117]],
        [-509.359375, -0.0062578916549682617], 1e300),
    "eps_dominates_a_subnormal_row": ([[1.0, 1.0]], [[2.0**-1060, 2.0**-1070]], [1.0, 1.0],
                                      1e-300),
    # eps = inf: every gradient is 0, though sum(g w x) passes DBL_MAX
    "eps_inf_with_an_overflowing_sum": ([[1e300, 1e300]], [[1e300, 1e300]], [1.0, 1.0],
                                        np.inf),
    "eps_inf_with_an_overflowing_product": ([[1e300]], [[1.0]], [1e10], np.inf),
    # a rescaled row whose every g * w * x underflows: sum(g w x) is 0
    "a_dot_that_underflows_whole": ([[2.0**-600, 0.0]], [[2.0**-600, 2.0**-601]], [1.0, 1.0],
                                    0.0),
    # a row of normal numbers whose every g * w * x underflows: the sum is 0
    # in double, but mean(g * x_hat) is not (exactly [[2^-1061, -2^-1061]])
    "a_dot_that_underflows_in_a_plain_row": ([[2.0**-1070, 0.0]], [[2.0**-10, 2.0**-10]],
                                             [1.0, 1.0], 0.0),
    "a_dot_that_underflows_in_a_long_row": ([[2.0**-1070] + [0.0] * 99],
                                            [[2.0**-10] * 100], [1.0] * 100, 0.0),
    # inv_rms and sum(g w x) each in range, their product past DBL_MAX
    "a_mean_past_the_largest_double": ([[2.0**1023] * 4], [[2.0**-960] * 4], [1.0] * 4, 0.0),
}


@pytest.mark.parametrize("case", ROWS_ONCE_WRONG)
def test_rows_once_found_wrong(case, isa):
    grad_output, x, weight, eps = (np.array(v, dtype=np.float64) if isinstance(v, list) else v
                                   for v in ROWS_ONCE_WRONG[case])
    n = x.shape[-1]
    with np.errstate(all="raise"):
        y = rmsnorm.rms_norm(x, n, weight, eps=eps)
        grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, n, weight, eps=eps)
    if np.isinf(eps):
        np.testing.assert_array_equal(y, np.zeros_like(x))
        np.testing.assert_array_equal(grad_input, np.zeros_like(x))
        np.testing.assert_array_equal(grad_weight, np.zeros_like(weight))
        return
    np.testing.assert_array_equal(y, _exact_forward(x, weight, eps))
    exact_input, exact_weight, terms = _exact_backward(grad_output, x, weight, eps)
    _assert_close_to_exact(grad_input, exact_input, "grad_input", terms=terms)
    _assert_close_to_exact(grad_weight, exact_weight, "grad_weight")


@pytest.mark.parametrize("t", [2.0**-40, 2.0**-70], ids=["t=2**-40", "t=2**-70"])
def test_gradients_stay_near_the_exact_ones_where_eps_cancels_all_but_a_sliver_of_the_mean(t, isa):
    """mean(x**2) of [1, 2, 1, 2, 2, 0, t] is 2 + t**2 / 7, and eps = -2
    leaves t**2 / 7, below the last bits of a double-double sum of squares:
    the backward's inv_rms comes from the exact sum, as the forward's does."""
    x = np.array([[1.0, 2.0, 1.0, 2.0, 2.0, 0.0, t]])
    grad_output = np.random.default_rng(5).uniform(-1.0, 1.0, x.shape)
    weight = _weight(5)
    grad_input, grad_weight = rmsnorm.backward(grad_output, x, weight, -2.0)
    exact_input, exact_weight, terms = _exact_backward(grad_output, x, weight, -2.0)
    _assert_close_to_exact(grad_input, exact_input, "grad_input", terms=terms)
    _assert_close_to_exact(grad_weight, exact_weight, "grad_weight")


def test_a_long_subnormal_row_keeps_its_gradients_within_a_few_ulp(isa):
    # mean(g * x_hat) over many elements: the per-element path's sum is
    # compensated, so its error does not grow with n.
    rng = np.random.default_rng(11)
    x = np.ldexp(rng.uniform(-1.0, 1.0, (1, 212)), -1040)
    grad_output = rng.standard_normal((1, 212))
    weight = rng.uniform(0.5, 2.0, 212)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, 212, weight, eps=0.0)
    exact_input, exact_weight, terms = _exact_backward(grad_output, x, weight, 0.0)
    _assert_close_to_exact(grad_input, exact_input, "grad_input", ulps=4, terms=terms)
    _assert_close_to_exact(grad_weight, exact_weight, "grad_weight", ulps=4)


# Outputs below double's normal range, hunted on purpose: the exact y,
# rounded once to the subnormal grid. Each case puts y (or x * inv_rms, on
# the way to it) there a different way; each runs with and without a
# weight offset and a residual, in rows shorter than a vector step and
# longer than several, so that both the write and the reduction that rides
# in it meet the tiny values.
SUBNORMAL_ROWS = 24
SUBNORMAL_LENGTHS = [37, 300]


def _signs(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def _subnormal_x_with_eps(rng, shape):
    """x a few thousand ULPs of the smallest subnormal, eps > 0 from 1e-12
    to 1e3: inv_rms is 1 / sqrt(eps), and x * inv_rms mostly subnormal."""
    x = _signs(rng, shape) * rng.integers(1, 1 << 20, shape) * 2.0**-1074
    w = _signs(rng, shape[-1]) * rng.uniform(0.25, 4.0, shape[-1])
    return x, w, 10.0 ** rng.uniform(-12, 3, shape[0]), 0.5


def _subnormal_weights(rng, shape):
    x = rng.standard_normal(shape)
    w = _signs(rng, shape[-1]) * rng.integers(1, 1 << 52, shape[-1]) * 2.0**-1074
    return x, w, np.where(rng.random(shape[0]) < 0.5, 0.0, 1e-6), 2.0**-1050


def _huge_eps_tiny_weights(rng, shape):
    """eps = 1e30 puts inv_rms near 1e-15, and weights near 1e-300 put y
    below 1e-308."""
    x = rng.standard_normal(shape)
    w = _signs(rng, shape[-1]) * rng.uniform(0.5, 2.0, shape[-1]) * 1e-300
    return x, w, np.full(shape[0], 1e30), 0.5e-300


def _tiny_values_huge_weights(rng, shape):
    """Values near 1 and down to the smallest subnormal in one row: x *
    inv_rms underflows where the weight, up to 2^1000, brings y back."""
    exponents = np.where(rng.random(shape) < 0.25, rng.integers(0, 4, shape),
                         rng.integers(950, 1075, shape))
    x = _signs(rng, shape) * np.maximum(
        rng.uniform(1.0, 2.0, shape) * np.exp2(-exponents.astype(float)), 2.0**-1074)
    w = _signs(rng, shape[-1]) * rng.uniform(1.0, 2.0, shape[-1]) * np.exp2(
        rng.integers(0, 1001, shape[-1]).astype(float))
    return x, w, np.zeros(shape[0]), 1.0


def _around_the_smallest_normal(rng, shape):
    """y within a few binades of 2^-1022 either way, some rows with zeros."""
    x = rng.standard_normal(shape)
    x[::3, ::5] = 0.0
    w = _signs(rng, shape[-1]) * rng.uniform(0.5, 2.0, shape[-1]) * 2.0**-1022
    return x, w, np.full(shape[0], 1e-6), 2.0**-1023


SUBNORMAL_CASES = {
    "subnormal_x_with_eps": _subnormal_x_with_eps,
    "subnormal_weights": _subnormal_weights,
    "huge_eps_tiny_weights": _huge_eps_tiny_weights,
    "tiny_values_huge_weights": _tiny_values_huge_weights,
    "around_the_smallest_normal": _around_the_smallest_normal,
}


def _nearest_double_to_root(square: Fraction) -> float:
    """The double nearest sqrt(square), ties to even, subnormals included:
    k = floor(sqrt(square) / step) in integers, with step the spacing of
    doubles in sqrt(square)'s binade, then k + 1/2 against it, squared."""
    if square == 0:
        return 0.0
    exponent = (square.numerator.bit_length() - square.denominator.bit_length()) // 2
    while Fraction(4) ** exponent > square:
        exponent -= 1
    while Fraction(4) ** (exponent + 1) <= square:
        exponent += 1
    step = max(exponent - 52, -1074)
    scaled = square / Fraction(4) ** step
    k = math.isqrt(scaled.numerator // scaled.denominator)
    halfway = Fraction(2 * k + 1, 2) ** 2
    if scaled > halfway or (scaled == halfway and k % 2 == 1):
        k += 1
    return math.ldexp(k, step)


def _exact_rounded_forward(x, w, eps, offset):
    """x * (offset + w) / sqrt(mean(x^2) + eps) in rationals, rounded once."""
    out = np.empty_like(x)
    factors = [Fraction(offset) + Fraction(v) for v in w]
    for r, row in enumerate(x):
        values = [Fraction(v) for v in row]
        mean = sum(v * v for v in values) / len(values) + Fraction(eps[r])
        for i, (v, factor) in enumerate(zip(values, factors)):
            product = v * factor
            magnitude = _nearest_double_to_root(product * product / mean)
            sign = math.copysign(1.0, row[i]) * (1.0 if factor > 0 else -1.0)
            out[r, i] = sign * magnitude
    return out


@functools.cache
def _subnormal_problem(case, n, offset, residual):
    rng = np.random.default_rng([n, list(SUBNORMAL_CASES).index(case)])
    x, w, eps, case_offset = SUBNORMAL_CASES[case](rng, (SUBNORMAL_ROWS, n))
    offset = case_offset if offset else 0.0
    x_in = None
    if residual:
        # x = x_in + residual, rounded once, mostly inexactly
        x_in = x * rng.uniform(0.25, 0.75, x.shape)
        x = np.add(x_in, x - x_in)
    return x_in, x, w, eps, offset, _exact_rounded_forward(x, w, eps, offset)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("offset", [False, True], ids=["no_offset", "offset"])
@pytest.mark.parametrize("n", SUBNORMAL_LENGTHS)
@pytest.mark.parametrize("case", SUBNORMAL_CASES)
def test_outputs_below_the_normal_range_are_rounded_once(case, n, offset, residual, isa):
    x_in, x, w, eps, weight_offset, expected = _subnormal_problem(case, n, offset, residual)
    # the case hunts them: y, or x * inv_rms on the way, below the normal range
    wide = x.astype(np.longdouble)
    x_hat = wide / np.sqrt(np.mean(wide * wide, axis=-1, keepdims=True) + eps[:, None])
    below = (np.abs(expected) < 2.0**-1022) | (np.abs(x_hat) < 2.0**-1022)
    assert np.count_nonzero(below) > x.size // 4
    if residual:
        r = x - x_in
        if offset:
            y, h = rmsnorm.add_forward_offset(x_in, r, w, weight_offset, eps)
        else:
            y, h = rmsnorm.add_forward(x_in, r, w, eps)
        assert_same_bytes(h, np.add(x_in, r), what="residual_out")
    elif offset:
        y = rmsnorm.forward_offset(x, w, weight_offset, eps)
    else:
        y = rmsnorm.forward(x, w, eps)
    wrong = y.view(np.uint64) != expected.view(np.uint64)
    if wrong.any():
        at = tuple(int(i) for i in np.argwhere(wrong)[0])
        raise AssertionError(
            f"{int(wrong.sum())} of {wrong.size} outputs not rounded once; first at {at}: "
            f"{y[at]!r}, exact rounded {expected[at]!r}: "
            f"{abs(int(y.view(np.int64)[at]) - int(expected.view(np.int64)[at]))} ULP apart")


# Rows of ordinary weights but one, subnormal, at any column: the rows
# have weights of their own, so that each row's least weight is looked for
# anew, and are long enough for whole steps of every instruction set and a
# tail. About one output in seven that y = x * inv_rms * w rounds twice
# comes out wrong, so a column the search skips fails here.
ONE_TINY_WEIGHT_COLUMNS = 300
ONE_TINY_WEIGHT_ROWS_PER_COLUMN = 4


def test_one_subnormal_weight_anywhere_in_a_row_gives_its_output_rounded_once(isa):
    n, per_column = ONE_TINY_WEIGHT_COLUMNS, ONE_TINY_WEIGHT_ROWS_PER_COLUMN
    rng = np.random.default_rng(1074)
    rows = n * per_column
    column = np.repeat(np.arange(n), per_column)
    x = rng.standard_normal((rows, n))
    w = rng.uniform(0.5, 2.0, (rows, n))
    w[np.arange(rows), column] = _signs(rng, rows) * rng.integers(1, 1 << 52, rows) * 2.0**-1074
    eps = np.where(rng.random(rows) < 0.5, 0.0, 1e-6)
    y = rmsnorm.forward(x, w, eps)
    wrong = []
    for r, k in enumerate(column):
        values = [Fraction(v) for v in x[r]]
        mean = sum(v * v for v in values) / n + Fraction(eps[r])
        product = values[k] * Fraction(w[r, k])
        expected = math.copysign(_nearest_double_to_root(product * product / mean),
                                 x[r, k] * w[r, k])
        if y[r, k] != expected:
            wrong.append((r, int(k), float(y[r, k]), expected))
    assert not wrong, (
        f"{len(wrong)} of {rows} subnormal outputs not rounded once on {isa}: {wrong[:3]}")
