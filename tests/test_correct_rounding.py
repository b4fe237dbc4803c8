"""Every forward output is the exact result of its inputs, rounded once.

Rounded once means to nearest, ties to even, straight from the exact value
of ``x * w / sqrt(mean(x**2) + eps)``: never to float first and then to 16
bits, which turns a value just off a 16-bit tie into the tie itself.

The cases are built to sit on ties and just off them, on purpose. A row
``c * [3, 3, 1, 1, 0]`` has mean(x**2) = 4 c**2, so with eps = 0 its
inv_rms is exactly 1 / (2 c) and ``y = 1.5 w`` where x = 3c: an exact tie
of the output dtype whenever w's last bit is 1. A tiny eps > 0 moves every
such y just below its tie in magnitude, and eps < 0 just above it, from
far more than a float's rounding step to far less. The 16-bit dtypes are
also checked with a float32 weight. Random rows of normal data add the
ordinary case. The reference is computed in long double (64-bit mantissa)
and rounded here, by comparing the neighbours of its value; where long
double cannot tell two neighbours apart (the float64 cases built on ties
land within 2^-64 of some), the side of the midpoint is settled exactly,
in rationals.
"""

from __future__ import annotations

import functools
import os
from fractions import Fraction

import numpy as np
import pytest

import rmsnorm
from rmsnorm._dtypes import BF16, ml_dtypes

ISAS = rmsnorm._core._isa()[1]
LD = np.longdouble
# (x dtype, weight dtype): each dtype with its own weight, and the 16-bit
# ones with a float32 weight, whose product with x is no longer exact in float.
PAIRS = [("float16", "float16"), ("float16", "float32"), ("float32", "float32"),
         ("float64", "float64")]
if BF16 is not None:
    PAIRS[2:2] = [("bfloat16", "bfloat16"), ("bfloat16", "float32")]

# Scales c of the constructed rows (powers of two, so c * x stays exact)
# and eps as a fraction of mean(x**2) = 4 c**2.
# The smallest scales keep eps * 4 c**2 a normal float32. The fractions
# put y from 2^-19 to 2^-35 (relative) off its tie: through the width of
# the 16-bit kernels' check for being far from a rounding boundary.
SCALES = {"float16": (-8, 0, 8), "bfloat16": (-40, 0, 60), "float32": (-40, 0, 60),
          "float64": (-500, 0, 500)}
EPS_FRACTIONS = (0.0, 2.0**-18, -(2.0**-18), 2.0**-23, -(2.0**-23), 2.0**-34, -(2.0**-34))
RANDOM_ELEMENTS = 2 * 1024 * 1024
# Constructed rows are 41 copies of [3, 3, 1, 1, 0] * c: whole vector
# blocks, a partial one, and a row that is not a multiple of the lanes.
ROW = 5 * 41
BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


def _finfo(dtype):
    return ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)


def _eps_dtype(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _odd_weights(dtype, count, rng):
    """Weights whose last mantissa bit is 1 (1.5 w is then a tie), both signs.

    Every finite 16-bit value; for float32 and float64, random ones of
    magnitude 2^-60 to 2^60 (test_float32_forward_where_x_hat_or_y_is_tiny,
    in test_properties.py, takes float32 results far below that).
    """
    bits = BITS[dtype.itemsize]
    if dtype.itemsize == 2:
        values = np.arange(1 << 16, dtype=np.uint32).astype(bits).view(dtype)
        values = values[np.isfinite(values.astype(np.float32))]
        if dtype == BF16:
            values = values[np.abs(values.astype(np.float32)) >= 2.0**-60]
    else:
        magnitude = rng.uniform(1.0, 2.0, count) * np.exp2(rng.integers(-60, 61, count))
        values = (magnitude * rng.choice([-1.0, 1.0], count)).astype(dtype)
    values = (values.view(bits) | bits(1)).view(dtype)
    return values[: len(values) // ROW * ROW]


@functools.cache
def _problems(dtype_name, weight_name):
    """(x, weight, eps per row, constructed, exact in long double) for the
    constructed and the random rows. With eps = 0 the constructed rows'
    long double values are exact (mean and square root included)."""
    dtype = _dtype(dtype_name)
    rng = np.random.default_rng(2026)
    problems = []
    # odd in x's dtype: 1.5 w is a tie of x's dtype, whatever w's dtype
    weights = _odd_weights(dtype, 200_000, rng).reshape(-1, ROW).astype(_dtype(weight_name))
    for exponent in SCALES[dtype_name]:
        c = 2.0**exponent
        row = np.tile(np.array([3, 3, 1, 1, 0], np.float64) * c, ROW // 5)
        x = np.tile(row, (len(weights), 1)).astype(dtype)
        for fraction in EPS_FRACTIONS:
            eps = np.full(len(weights), fraction * 4 * c * c, _eps_dtype(dtype))
            problems.append((x, weights, eps, True, fraction == 0.0))
    # float64 rows are short, so that the long double reference stays close
    n = 256 if dtype == np.float64 else 4096
    rows = (RANDOM_ELEMENTS // 32 if dtype == np.float64 else RANDOM_ELEMENTS) // n
    x = rng.standard_normal((rows, n)).astype(dtype)
    w = rng.uniform(0.5, 2.0, n).astype(_dtype(weight_name))
    problems.append((x, np.broadcast_to(w, x.shape), np.full(len(x), 1e-6, _eps_dtype(dtype)),
                     False, False))
    return problems


def _step(values, dtype, toward_positive):
    """The neighbour of each value in dtype, toward +inf or -inf (by bits)."""
    bits = BITS[dtype.itemsize]
    raw = values.astype(dtype).view(bits).astype(np.uint64)
    sign_bit = np.uint64(1) << np.uint64(8 * dtype.itemsize - 1)
    negative = (raw & sign_bit) != 0
    magnitude = raw & (sign_bit - np.uint64(1))
    grow = negative != toward_positive  # away from zero, in the direction asked
    crossing = ~grow & (magnitude == 0)  # from a zero to the smallest value of the other sign
    magnitude = np.where(grow | crossing, magnitude + np.uint64(1), magnitude - np.uint64(1))
    negative = np.where(crossing, ~negative, negative)
    stepped = np.where(negative, magnitude | sign_bit, magnitude)
    return stepped.astype(bits).view(dtype)


def _round_once(x, w, eps, exact, exact_ld, dtype):
    """exact (long double, from x, w and eps) rounded to nearest even in dtype;
    exact_ld: whether the long double values are exact."""
    with np.errstate(over="ignore"):
        guess = exact.astype(np.float64).astype(dtype)
    candidates = [guess, _step(guess, dtype, True), _step(guess, dtype, False)]
    with np.errstate(invalid="ignore", over="ignore"):
        distance = np.stack([np.abs(c.astype(LD) - exact) for c in candidates])
    order = np.argsort(distance, axis=0, kind="stable")
    best, second = np.take_along_axis(distance, order[:2], axis=0)
    stacked = np.stack(candidates)
    first = np.take_along_axis(stacked, order[:1], axis=0)[0]
    other = np.take_along_axis(stacked, order[1:2], axis=0)[0]
    rounded = first.copy()
    # long double is good to about 2^-62 here: closer to a midpoint than
    # 2^-58, the side is settled in rationals
    even = (first.view(BITS[dtype.itemsize]) & 1) == 0
    if exact_ld:  # equal distances are true ties
        rounded = np.where((best == second) & ~even, other, first)
    else:
        close = ~(second - best > np.abs(exact) * LD(2.0**-58))
        sums = {}
        for i, j in zip(*np.nonzero(close)):
            if i not in sums:
                sums[i] = sum(Fraction(float(v)) ** 2 for v in x[i]) / len(x[i])
            rounded[i, j] = _nearer_exactly(sums[i] + Fraction(float(eps[i])), x[i, j], w[i, j],
                                            first[i, j], other[i, j])
    # past the largest finite value by half its spacing or more: infinity
    largest = np.array(_finfo(dtype).max, dtype).astype(LD)
    below_largest = _step(np.array([largest]), dtype, False).astype(LD)[0]
    overflow = np.abs(exact) >= largest + (largest - below_largest) / 2
    infinity = np.copysign(np.inf, exact.astype(np.float64)).astype(dtype)
    return np.where(overflow, infinity, rounded).astype(dtype)


def _nearer_exactly(s, x, w, a, b):
    """Of the neighbours a and b, the nearer to x w / sqrt(s), in exact
    rationals; ties to even."""
    p = Fraction(float(x)) * Fraction(float(w))
    m = (Fraction(float(a)) + Fraction(float(b))) / 2
    if p * p == m * m * s and (p > 0) == (m > 0):
        bits = BITS[np.asarray(a).dtype.itemsize]
        return a if (np.asarray(a).view(bits) & 1) == 0 else b
    # y = p / sqrt(s) lies above m where p > 0 and |y| > |m|, or where
    # p > 0 and m <= 0; below it in the mirrored cases
    if (p > 0) != (m > 0) or m == 0:
        above = p > 0
    else:
        above = (p * p > m * m * s) == (p > 0)
    return a if (Fraction(float(a)) > m) == above else b


def _rounded_reference(x, w, eps, exact_ld):
    """x * w / sqrt(mean(x**2) + eps) per row, in long double, rounded once
    to x's dtype; exact_ld: whether the long double values are exact."""
    x_ld, w_ld = x.astype(LD), w.astype(LD)
    mean = np.mean(x_ld * x_ld, axis=1, keepdims=True) + eps.astype(LD)[:, None]
    w = np.broadcast_to(w, x.shape)
    return _round_once(x, w, eps, x_ld * w_ld / np.sqrt(mean), exact_ld, x.dtype)


@functools.cache
def _expected(dtype_name, weight_name):
    return [_rounded_reference(x, w, eps, exact_ld)
            for x, w, eps, _, exact_ld in _problems(dtype_name, weight_name)]


@pytest.fixture
def restore_isa():
    active = rmsnorm._core._isa()[0]
    yield
    rmsnorm._core._set_isa(active)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("dtype", "weight"), PAIRS, ids=[f"{x}-{w}" for x, w in PAIRS])
def test_forward_is_the_exact_result_rounded_once(dtype, weight, isa, restore_isa):
    rmsnorm._core._set_isa(isa)
    checked = ties = 0
    for (x, w, eps, constructed, _), expected in zip(_problems(dtype, weight),
                                                     _expected(dtype, weight)):
        y = rmsnorm.forward(x, w, eps)
        assert y.dtype == _dtype(dtype)
        bits = BITS[y.dtype.itemsize]
        wrong = y.view(bits) != expected.view(bits)
        if np.any(wrong):
            i = tuple(np.argwhere(wrong)[0])
            raise AssertionError(
                f"{np.count_nonzero(wrong)} of {y.size} outputs not rounded "
                f"once on {isa}; first at {i}: x row {x[i[0]].astype(np.float64)}, "
                f"w {float(w[i])!r}, eps {float(eps[i[0]])!r}: got {float(y[i])!r}, "
                f"expected {float(expected[i])!r}")
        checked += y.size
        ties += x.size * 2 // 5 if constructed else 0  # where x = 3c: y = 1.5 w near a tie
    # The test can fail only if it met the ties it is about, and many outputs.
    assert ties > 50_000 and checked > 1_000_000


@pytest.mark.parametrize("isa", ISAS)
def test_float32_output_a_hair_from_a_midpoint_is_rounded_once(isa, restore_isa):
    """One of 134 million random float32 outputs (normal data, 4096 wide)
    lies 2^-49 (relative) from a rounding midpoint: closer than a float
    computation of x * inv_rms * w carries it, so a write that rounds its
    float result without checking it rounds the other way here."""
    rmsnorm._core._set_isa(isa)
    data = np.load(os.path.join(os.path.dirname(__file__), "data", "float32_near_midpoint.npz"))
    x, w, eps = data["x"][None, :], data["weight"], np.array([data["eps"]])
    expected = _rounded_reference(x, w, eps, False)
    y = rmsnorm.forward(x, w, eps[0])
    column = int(data["column"])
    assert y[0, column].view(np.uint32) == expected[0, column].view(np.uint32), (
        f"column {column}: got {float(y[0, column])!r}, expected {float(expected[0, column])!r}")
    assert np.array_equal(y.view(np.uint32), expected.view(np.uint32))
