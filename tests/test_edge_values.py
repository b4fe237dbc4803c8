"""Odd but valid inputs, and edge values: each gives the right answer, and
leaves the caller's arrays alone.

Odd inputs: "right" is the same values as the same call on plain arrays:
C-contiguous, aligned, native byte order, nothing shared (the plain path is
itself checked against torch and the float64 reference by the parity
suites). Where there is no plain twin (an empty batch, a non-finite row, a
row of 2**31 elements) the expected values are written out from the math.

Edge values, where torch's answer is a defined number, inf or NaN: ours is
the same on every instruction set, forward and both gradients, compared
with torch.nn.functional.rms_norm and its autograd, NaN for NaN, in torch's
own dtype.

- eps at the ends of the range: inf (1 / sqrt(inf) is 0), a value past
  float32's range (which float32 eps rounds to inf, as torch's does), -inf;
- a negative eps that cancels mean(x^2) exactly, where 1 / sqrt(0) is inf;
- one infinity in grad_output or in the weight, which makes only the
  elements it reaches non-finite, not the whole row.

The bad inputs are in ``test_bad_inputs.py``; :class:`Caller` is in
``caller_state.py``.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from fractions import Fraction
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rmsnorm
from caller_state import Caller
from closeness import assert_close_ulp
from rmsnorm import reference
from rmsnorm._dtypes import BF16
from supported_dtypes import DTYPE_NAMES

F32, F64 = np.float32, np.float64
EPS = 1e-5


def plain(array) -> np.ndarray:
    """A C-contiguous, aligned, native-order copy with nothing shared."""
    array = np.asarray(array)
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def assert_same_values(actual, expected, what="result"):
    """Same shape, same dtype up to byte order, same values: NaN where NaN is
    expected, and zeros of the same sign."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), (
        f"{what}: dtype {actual.dtype} != {expected.dtype}")
    if not np.array_equal(actual, expected, equal_nan=True):
        assert_close_ulp(actual, expected, rtol=0.0, atol=0.0, what=what + " (expected equal)")
    if expected.dtype.kind == "f":
        numbers = ~np.isnan(expected)
        assert np.array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers])), (
            f"{what}: signed zeros differ")


def forward_pair(x, weight=None, normalized_shape=None, eps=EPS):
    """(rms_norm on x as given, rms_norm on plain copies)."""
    normalized_shape = np.shape(x)[-1] if normalized_shape is None else normalized_shape
    actual = rmsnorm.rms_norm(x, normalized_shape, weight, eps)
    expected = rmsnorm.rms_norm(plain(x), normalized_shape,
                                None if weight is None else plain(weight), eps)
    return actual, expected


def backward_pair(grad, x, weight=None, eps=EPS):
    """Both gradients on the arguments as given, and on plain copies."""
    n = np.shape(x)[-1]
    actual = rmsnorm.rms_norm_backward(grad, x, n, weight, eps)
    expected = rmsnorm.rms_norm_backward(plain(grad), plain(x), n,
                                         None if weight is None else plain(weight), eps)
    return actual, expected


def unaligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` one byte off its dtype's alignment."""
    buffer = np.zeros(array.nbytes + 1, np.uint8)
    view = buffer[1:].view(array.dtype).reshape(array.shape)
    view[...] = array
    assert not view.flags.aligned
    return view


def values(caller: Caller, shape, dtype=F32) -> np.ndarray:
    """Random values the case may overwrite (not snapshotted, unlike caller.x())."""
    return caller.rng.standard_normal(shape).astype(dtype)


def strided_out(base: np.ndarray, shape, strides) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=True)


# ---------------------------------------------------------------------------
# The catalogue: each case returns pairs (actual, expected) to compare.
# ---------------------------------------------------------------------------

CATALOGUE: dict[str, list] = {}


def odd(category, name, call: Callable[[Caller], list], needs_patch=None):
    marks = ()
    if needs_patch:
        marks = pytest.mark.xfail(strict=True, reason=f"needs patch: {needs_patch}")
    CATALOGUE.setdefault(category, []).append(
        pytest.param(call, id=f"{category}-{name}", marks=marks))


def _tuples(pair):
    """A forward pair is one comparison; a backward pair is two."""
    actual, expected = pair
    if isinstance(actual, tuple):
        return list(zip(actual, expected))
    return [(actual, expected)]


# ---- layout: the same numbers, laid out oddly --------------------------------
odd("layout", "list_of_lists",
    lambda c: _tuples(forward_pair(c.x((3, 5), F64).tolist(), eps=EPS)))
odd("layout", "tuple_of_tuples",
    lambda c: _tuples(forward_pair(tuple(map(tuple, c.x((3, 5), F64).tolist())))))
odd("layout", "read_only",
    lambda c: _tuples(forward_pair(c.read_only(c.x((3, 5))), c.read_only(c.weight((5,))))))
odd("layout", "read_only_backward",
    lambda c: _tuples(backward_pair(c.read_only(c.grad((3, 5))), c.read_only(c.x((3, 5))),
                                    c.read_only(c.weight((5,))))))
odd("layout", "big_endian_float32",
    lambda c: _tuples(forward_pair(c.keep(c.x((3, 5)).astype(">f4")), c.weight((5,)))))
odd("layout", "big_endian_float64_backward",
    lambda c: _tuples(backward_pair(c.keep(c.grad((3, 5), F64).astype(">f8")),
                                    c.keep(c.x((3, 5), F64).astype(">f8")),
                                    c.keep(c.weight((5,), F64).astype(">f8")))))
odd("layout", "unaligned",
    lambda c: _tuples(forward_pair(c.keep(unaligned(c.x((3, 5)))),
                                   c.keep(unaligned(c.weight((5,)))))))
odd("layout", "unaligned_backward",
    lambda c: _tuples(backward_pair(c.keep(unaligned(c.grad((3, 70), F64))),
                                    c.keep(unaligned(c.x((3, 70), F64))), c.weight((70,), F64))))
odd("layout", "negative_strides",
    lambda c: _tuples(forward_pair(c.x((4, 37))[::-1, ::-1], c.weight((74,))[::-2])))
odd("layout", "negative_strides_backward",
    lambda c: _tuples(backward_pair(c.grad((4, 37))[::-1, ::-1], c.x((4, 37))[::-1, ::-1],
                                    c.weight((37,))[::-1])))
odd("layout", "fortran_order",
    lambda c: _tuples(forward_pair(c.keep(np.asfortranarray(c.x((2, 3, 40)))), c.weight((40,)))))
odd("layout", "fortran_order_two_normalized_dims",
    lambda c: _tuples(forward_pair(c.keep(np.asfortranarray(c.x((2, 3, 40)))),
                                   c.weight((3, 40)), (3, 40))))
odd("layout", "every_other_element",
    lambda c: _tuples(forward_pair(c.x((6, 80), F64)[::2, ::2], c.weight((80,), F64)[::2])))
odd("layout", "broadcast_stride_0",
    lambda c: _tuples(forward_pair(np.broadcast_to(c.x((1, 33)), (5, 33)), c.weight((33,)))))


def _memmap(c):
    values = c.x((3, 5))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "x.f32")
        values.tofile(path)
        mapped = np.memmap(path, F32, "r", shape=(3, 5))
        pairs = _tuples(forward_pair(mapped, c.weight((5,))))
        pairs += _tuples(backward_pair(mapped, mapped, c.weight((5,))))
        result = [(np.array(a), np.array(e)) for a, e in pairs]
        del mapped
    return result


odd("layout", "memmap_read_only", _memmap)


def _pandas_series_backward(c):
    # A Series reaches the gufuncs as a duck array (it has __array_ufunc__),
    # but has no reshape method for the backward's folding into rows.
    pd = pytest.importorskip("pandas", reason="pandas is optional: the Series case needs it")
    grad, x, grad_sum = c.grad((5,), F64), c.x((5,), F64), c.grad((5,), F64)
    weight = c.weight((5,), F64)
    pairs = _tuples(backward_pair(pd.Series(grad), pd.Series(x), weight))
    pairs += zip(
        rmsnorm.add_rms_norm_backward(pd.Series(grad), pd.Series(grad_sum), pd.Series(x), 5,
                                      weight, EPS),
        rmsnorm.add_rms_norm_backward(plain(grad), plain(grad_sum), plain(x), 5, plain(weight),
                                      EPS))
    return pairs


odd("layout", "pandas_series_backward", _pandas_series_backward)

# ---- conventions: NumPy's casting and Python's number types ------------------
odd("conventions", "gufunc_int_input_is_cast_to_float64",
    lambda c: [(rmsnorm.forward(c.keep(np.arange(12).reshape(3, 4)), np.ones(4), 0.0),
                rmsnorm.forward(np.arange(12.0).reshape(3, 4), np.ones(4), 0.0))])
def _float64_weight(c):
    # Either way of mixing (weight rounded to float32 first, or the product
    # taken in double) is within 1 ULP of float32 of the exact result.
    x, weight = c.x((3, 5)), c.weight((5,), F64)
    exact = reference.rms_norm(x, 5, weight, EPS)
    return [(rmsnorm.rms_norm(x, 5, weight, EPS), exact, 1)]


odd("conventions", "float64_weight_for_float32_input", _float64_weight)
odd("conventions", "numpy_integer_normalized_shape",
    lambda c: _tuples(forward_pair(c.x((3, 5)), None, np.int64(5))))
odd("conventions", "numpy_integer_elements_normalized_shape",
    lambda c: _tuples(forward_pair(c.x((3, 5)), None, (np.int32(5),))))
odd("conventions", "ndarray_normalized_shape",
    lambda c: _tuples(forward_pair(c.x((2, 3, 5)), None, np.array([3, 5]))))
odd("conventions", "0d_ndarray_normalized_shape",
    lambda c: _tuples(forward_pair(c.x((3, 5)), None, np.array(5))))


def _eps_types(c):
    x = c.x((3, 5))
    pairs = []
    for eps in [np.float32(1e-3), np.float64(1e-3), 1, np.int64(1)]:
        pairs.append((rmsnorm.rms_norm(x, 5, eps=eps),
                      rmsnorm.rms_norm(plain(x), 5, eps=float(eps))))
    return pairs


odd("conventions", "eps_numpy_and_int_types", _eps_types)


def _threads_numpy_int(c):
    rmsnorm.set_num_threads(np.int64(2))
    return [(np.asarray(rmsnorm.get_num_threads()), np.asarray(2))]


odd("conventions", "set_num_threads_numpy_int", _threads_numpy_int)

# ---- empty: no rows, or rows of no elements ---------------------------------
odd("empty", "empty_batch",
    lambda c: [(rmsnorm.rms_norm(c.x((0, 5)), 5, c.weight((5,))), np.zeros((0, 5), F32))])
odd("empty", "empty_batch_backward",
    lambda c: list(zip(rmsnorm.rms_norm_backward(c.grad((0, 5)), c.x((0, 5)), 5, c.weight((5,))),
                       (np.zeros((0, 5), F32), np.zeros(5, F32)))))
odd("empty", "empty_batch_3d",
    lambda c: [(rmsnorm.rms_norm(c.x((2, 0, 5), F64), 5), np.zeros((2, 0, 5)))])
odd("empty", "rows_of_length_0",
    lambda c: [(rmsnorm.rms_norm(c.x((3, 0)), 0, c.weight((0,))), np.zeros((3, 0), F32))])
odd("empty", "rows_of_length_0_backward",
    lambda c: list(zip(rmsnorm.rms_norm_backward(c.grad((3, 0)), c.x((3, 0)), 0, c.weight((0,))),
                       (np.zeros((3, 0), F32), np.zeros(0, F32)))))
odd("empty", "normalized_shape_with_a_0",
    lambda c: [(rmsnorm.rms_norm(c.x((2, 0, 4)), (0, 4)), np.zeros((2, 0, 4), F32))])
odd("empty", "gufunc_backward_no_outer_loops",
    lambda c: list(zip(rmsnorm.backward(c.grad((0, 2, 3)), c.x((0, 2, 3)), c.weight((3,)), F32(0)),
                       (np.zeros((0, 2, 3), F32), np.zeros((0, 3), F32)))))
odd("empty", "rows_of_length_1",
    lambda c: [(rmsnorm.rms_norm(c.keep(np.array([[-3.0], [2.0]])), 1, eps=0.0),
                np.array([[-1.0], [1.0]]))])


# ---- aliasing: out= over the inputs ----------------------------------------
def _in_place(c):
    x, weight = values(c, (4, 50)), c.weight((50,))
    expected = rmsnorm.forward(plain(x), weight, F32(EPS))
    result = rmsnorm.forward(x, weight, F32(EPS), out=x)
    assert result is x
    return [(x, expected)]


def _partial_overlap(shift):
    def call(c):
        values = c.x((4, 50))
        weight = c.weight((50,))
        expected = rmsnorm.forward(values, weight, F32(EPS))
        buffer = np.zeros(values.size + shift, F32)
        x = buffer[: values.size].reshape(4, 50)
        x[...] = values
        out = buffer[shift:].reshape(4, 50)
        rmsnorm.forward(x, weight, F32(EPS), out=out)
        return [(out, expected), (buffer[:shift], values.ravel()[:shift])]
    return call


def _partial_overlap_columns(c):
    values, weight = c.x((4, 50)), c.weight((50,))
    expected = rmsnorm.forward(values, weight, F32(EPS))
    buffer = np.zeros((4, 51), F32)
    buffer[:, :50] = values
    rmsnorm.forward(buffer[:, :50], weight, F32(EPS), out=buffer[:, 1:])
    return [(buffer[:, 1:], expected), (buffer[:, 0], values[:, 0])]


def _backward_into(which):
    def call(c):
        grad, x, weight = values(c, (4, 50), F64), values(c, (4, 50), F64), c.weight((50,), F64)
        expected = rmsnorm.backward(plain(grad), plain(x), weight, 1e-5)
        target = grad if which == "grad_output" else x
        grad_input, grad_weight = rmsnorm.backward(grad, x, weight, 1e-5, out=(target, None))
        assert grad_input is target
        return [(grad_input, expected[0]), (grad_weight, expected[1])]
    return call


def _out_is_weight(c):
    x, weight = c.x((50,)), values(c, (50,))
    expected = rmsnorm.forward(x, plain(weight), F32(EPS))
    rmsnorm.forward(x, weight, F32(EPS), out=weight)
    return [(weight, expected)]


odd("aliasing", "out_is_input", _in_place)
odd("aliasing", "out_overlaps_input_by_1", _partial_overlap(1))
odd("aliasing", "out_overlaps_input_by_37", _partial_overlap(37))
odd("aliasing", "out_overlaps_input_columns", _partial_overlap_columns)
odd("aliasing", "backward_grad_input_is_grad_output", _backward_into("grad_output"))
odd("aliasing", "backward_grad_input_is_input", _backward_into("input"))
odd("aliasing", "out_is_weight", _out_is_weight)


def _out_of(dtype):
    def call(c):
        x, weight = c.x((3, 20)), c.weight((20,))
        out = np.zeros((3, 20), dtype)
        rmsnorm.forward(x, weight, F32(EPS), out=out)
        return [(out, rmsnorm.forward(x, weight, F32(EPS)).astype(dtype))]
    return call


odd("aliasing", "out_float64_for_float32", _out_of(F64))
odd("aliasing", "out_big_endian", _out_of(">f4"))
odd("aliasing", "out_complex64", _out_of(np.complex64))


def _out_strided(c):
    x, weight = c.x((3, 20)), c.weight((20,))
    buffer = np.full((6, 40), 7.0, F32)
    rmsnorm.forward(x, weight, F32(EPS), out=buffer[::2, ::2])
    untouched = np.ones(buffer.shape, bool)
    untouched[::2, ::2] = False
    return [(buffer[::2, ::2], rmsnorm.forward(x, weight, F32(EPS))),
            (buffer[untouched], np.full(untouched.sum(), 7.0, F32))]


odd("aliasing", "out_strided", _out_strided)


# ---- non-finite: torch's answers for NaN, inf, zero rows and huge values ---------
def _row_with(value):
    def call(c):
        x = c.keep(np.array([[1.0, value, 2.0], [3.0, 4.0, 5.0]]))
        y = rmsnorm.rms_norm(x, 3, eps=0.0)
        second = rmsnorm.rms_norm(x[1:], 3, eps=0.0)
        if math.isnan(value):
            first = np.full((1, 3), np.nan)
        else:  # torch: the sum is inf, inv_rms 0, and inf * 0 is NaN
            first = np.array([[0.0, np.nan, 0.0]])
        return [(y, np.concatenate([first, second]))]
    return call


odd("non_finite", "nan_in_a_row", _row_with(np.nan))
odd("non_finite", "inf_in_a_row", _row_with(np.inf))
odd("non_finite", "zero_row_eps_0_is_nan",
    lambda c: [(rmsnorm.rms_norm(c.keep(np.zeros((2, 3), F32)), 3, eps=0.0),
                np.full((2, 3), np.nan, F32))])
odd("non_finite", "zero_row_eps_positive_is_0",
    lambda c: [(rmsnorm.rms_norm(c.keep(np.zeros((2, 3), F32)), 3, eps=EPS),
                np.zeros((2, 3), F32))])


def _huge_float64_rows(c):
    # Scaling a row by a power of two does not change its RMS-normalised
    # value (eps = 0), and both scalings are exact.
    x = c.x((3, 40), F64)
    expected = rmsnorm.rms_norm(x, 40, eps=0.0)
    pairs = []
    for exponent in (520, 1000, -520, -1000):
        scaled = c.keep(np.ldexp(x, exponent))
        pairs.append((rmsnorm.rms_norm(scaled, 40, eps=0.0), expected))
    return pairs


odd("non_finite", "float64_rows_near_1e300_and_1e-300", _huge_float64_rows)


def _float64_rows_with_eps_0(x):
    """rms_norm of float64 rows with eps = 0, beside the exact values from
    long double (64-bit mantissa, and a range that holds every double's
    square as a normal number)."""
    wide = x.astype(np.longdouble)
    exact = wide / np.sqrt(np.mean(wide * wide, axis=1, keepdims=True))
    return [(rmsnorm.rms_norm(x, x.shape[-1], eps=0.0), exact.astype(F64), 1)]


def _rows_near_float64_max(c):
    # An RMS past 2**1022 makes 1 / RMS subnormal: x * inv_rms must not
    # inherit its lost bits.
    return _float64_rows_with_eps_0(c.keep(
        np.ldexp(1.0 + c.rng.random((3, 22)), 1022) * np.sign(c.rng.standard_normal((3, 22)))))


odd("non_finite", "float64_rows_near_max", _rows_near_float64_max)


def _subnormal_float64_row(c):
    # The mirror image: a row of subnormals with eps = 0 has 1 / RMS past the
    # largest double.
    return _float64_rows_with_eps_0(c.keep(np.array([[5e-324, 1e-320, -3e-310]])))


odd("non_finite", "float64_subnormal_row_eps_0", _subnormal_float64_row)


def _infinite_weight(c):
    # torch: x_hat * inf is +-inf for a non-zero x_hat.
    x = c.keep(np.array([[3.0, 4.0, 0.5, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    weight = c.keep(np.array([1.0, -np.inf, np.inf, 2.0]))
    pairs = []
    for eps in (0.0, 1e-5):
        with np.errstate(invalid="ignore"):
            expected = reference.rms_norm(x, 4, weight, eps)
        pairs.append((rmsnorm.rms_norm(x, 4, weight, eps), expected, 2))
    return pairs


odd("non_finite", "infinite_weight", _infinite_weight)


CASES = [case for cases in CATALOGUE.values() for case in cases]


@pytest.mark.parametrize("call", CASES)
def test_odd_input_gives_the_plain_answer_and_changes_no_input(call, restore_num_threads):
    caller = Caller()
    pairs = call(caller)
    assert pairs, "the case compared nothing"
    for index, (actual, expected, *ulps) in enumerate(pairs):
        if ulps:  # (actual, float64 expected, ULPs of actual's dtype allowed)
            with np.errstate(invalid="ignore"):
                unit = np.spacing(np.abs(expected).astype(actual.dtype)).astype(F64)
            atol = float(np.max(ulps[0] * unit, where=np.isfinite(unit), initial=0.0))
            assert_close_ulp(actual, expected, rtol=0.0, atol=atol, what=f"comparison {index}",
                             check_dtype=False)
        else:
            assert_same_values(actual, expected, what=f"comparison {index}")
    caller.assert_unchanged()


def test_catalogue_has_at_least_10_cases():
    assert len(CASES) >= 10


# ---------------------------------------------------------------------------
# Python's and NumPy's numbers, against the formula.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [np.float32(1e-5), np.float64(1e-5), 1, np.int64(0)])
def test_rms_norm_accepts_real_number_eps(eps):
    x = np.full((1, 4), 2.0)
    y = rmsnorm.rms_norm(x, (4,), eps=eps)
    expected = 2.0 / np.sqrt(4.0 + float(eps))
    assert np.allclose(y, expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("normalized_shape", [np.int64(3), (np.int32(3),), [np.int64(3)]])
def test_numpy_integers_are_accepted_as_normalized_shape(normalized_shape):
    x = np.full((2, 3), 2.0)
    assert np.allclose(rmsnorm.rms_norm(x, normalized_shape, eps=0.0), 1.0, rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------
# Edge values: torch's answers for eps at the ends of its range and for one
# infinity in grad_output or the weight.
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# Sizes: core sizes past 2**31 elements must not overflow an index.
#
# The inputs are stride-0 broadcasts and the outputs stride-0 views, so no
# call allocates more than a few rows. Each takes a few seconds: the rows are
# long and the stride-0 operands keep the kernels on their strided path.
# ---------------------------------------------------------------------------

PAST_INT32 = 2**31 + 3
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
skip_under_asan = pytest.mark.skipif(
    UNDER_ASAN, reason="minutes under ASan; the same C runs uninstrumented in the plain suite")


def _stride_0_out(rows, n, dtype, row_stride=True):
    """A writable (rows, n) output of ``rows`` NaNs: every element of a row
    is the same memory, so a row written at all no longer holds NaN."""
    base = np.full(rows if row_stride else 1, np.nan, dtype)
    return strided_out(base, (rows, n), (base.itemsize if row_stride else 0, 0))


@skip_under_asan
def test_forward_row_past_2_31_elements():
    # Two rows (one per thread), with eps 0 and 1. Every element is 2, so
    # the sum of squares is 4 * n exactly; a loop that stopped early or a
    # row length cut to 32 bits would change the mean, or leave the NaN.
    n = PAST_INT32
    x = np.broadcast_to(F32(2.0), (2, n))
    weight = np.broadcast_to(F32(1.5), (n,))
    eps = np.array([0.0, 1.0], F32)
    out = _stride_0_out(2, n, F32)
    result = rmsnorm.forward(x, weight, eps, out=out)
    assert result is out
    expected = np.array([1.5, 1.5 * 2.0 / math.sqrt(5.0)], F32)
    assert_close_ulp(out[:, 0], expected, rtol=float(np.finfo(F32).eps), atol=0.0,
                     what="y of a 2**31 + 3 element row")


@skip_under_asan
def test_backward_core_past_2_31_elements():
    # m * n = 2**31 + 2**11: the (m, n) core of one backward call. grad_input
    # is 0 for a constant row with grad_output proportional to it, and
    # grad_weight sums x_hat * grad_output = 1 * 3 over the m rows exactly.
    m, n = 2**20 + 1, 2**11
    x = np.broadcast_to(F32(2.0), (m, n))
    grad = np.broadcast_to(F32(3.0), (m, n))
    grad_input = _stride_0_out(m, n, F32, row_stride=False)
    grad_weight = np.full(n, np.nan, F32)
    rmsnorm.backward(grad, x, np.ones(n, F32), F32(0.0), out=(grad_input, grad_weight))
    assert grad_input[0, 0] == 0.0
    assert np.all(grad_weight == F32(3.0 * m)), grad_weight[:4]


# ---------------------------------------------------------------------------
# Every instruction set: rows near the top of float64's range. The kernels
# without FMA split x by Dekker's method, which would overflow past 2**996
# unless the factor is scaled down first.
# ---------------------------------------------------------------------------

def _rows_near_the_top():
    rng = np.random.default_rng(4)
    x, grad = rng.standard_normal((2, 40)), rng.standard_normal((2, 40))
    return x, np.ldexp(x, 1000), grad  # the scaling is exact, and eps = 0 below


def test_float64_forward_past_2_996_on_every_instruction_set(isa):
    x, huge, _ = _rows_near_the_top()
    assert_same_values(rmsnorm.rms_norm(huge, 40, eps=0.0), rmsnorm.rms_norm(x, 40, eps=0.0),
                       what=f"y on {isa}")


def test_float64_backward_past_2_996_on_every_instruction_set(isa):
    x, huge, grad = _rows_near_the_top()
    grad_input, _ = rmsnorm.rms_norm_backward(grad, huge, 40, eps=0.0)
    expected, _ = rmsnorm.rms_norm_backward(grad, x, 40, eps=0.0)
    unit = float(np.finfo(F64).eps)
    assert_close_ulp(np.ldexp(grad_input, 1000), expected, rtol=4 * unit,
                     atol=4 * unit * np.abs(expected).max(), what=f"grad_input on {isa}")


# ---------------------------------------------------------------------------
# Infinite weights in mixed precision, and 16-bit products past float's
# range: each instruction set's kernels take their own path here.
# ---------------------------------------------------------------------------

def test_float32_input_with_infinite_float64_weights_gives_signed_infinities(isa):
    """y = x_hat * w is +-inf for an infinite weight where x_hat != 0, as in
    torch (whose float64 weight promotes the output; ours keeps float32)."""
    x = np.array([[1.0, 2.0, -3.0, 4.0]], F32)
    weight = np.array([-np.inf, np.inf, np.inf, 1.0])
    y = rmsnorm.forward(x, weight, F32(1e-6))
    finite = rmsnorm.forward(x, np.ones(4), F32(1e-6))
    assert y[0, :3].tolist() == [-np.inf, np.inf, -np.inf], f"on {isa}: {y}"
    assert y[0, 3] == finite[0, 3]


DOUBLE_MAX = float(np.finfo(F64).max)


def _past_the_top(variant: str, x, weight):
    """The forward variant of x (one row) with `weight`; forward_offset
    takes weight - 1 with an offset of 1 (exact for these weights: 1 and
    huge ones), add_forward x - 1 with a residual of 1 (exact too)."""
    eps = x.dtype.type(0.0) if x.dtype == F64 else F32(0.0)
    if variant == "forward":
        return rmsnorm.forward(x, weight, eps)
    if variant == "forward_offset":
        return rmsnorm.forward_offset(x, weight - 1.0, 1.0, eps)
    return rmsnorm.add_forward(x - x.dtype.type(1.0), np.ones_like(x), weight, eps)[0]


@pytest.mark.parametrize("variant", ["forward", "forward_offset", "add_forward"])
@pytest.mark.parametrize("x_dtype, sign", [(F64, 1.0), (F64, -1.0), (F32, 1.0), (F32, -1.0)],
                         ids=["float64", "float64-negative", "float32", "float32-negative"])
def test_an_output_past_double_range_is_an_infinity_of_its_sign(isa, variant, x_dtype, sign):
    """x * w * inv_rms past DBL_MAX, with a float64 weight: y = 0.8 sqrt(2)
    DBL_MAX rounds to an infinity, as torch's does; the product's error,
    inf - inf, made NaN of it where the write splits the product (the
    portable kernels for float64, every kernel for float32 x)."""
    x = np.array([3.0, 4.0], x_dtype)
    weight = np.array([1.0, sign * DOUBLE_MAX])
    y = _past_the_top(variant, x, weight)
    within_range = _past_the_top(variant, x, np.ones(2))
    assert y[1] == sign * np.inf, f"{variant} on {isa}: {y}"
    assert y[0] == within_range[0], f"{variant} on {isa}: {y} against {within_range}"


@pytest.mark.parametrize("n, weight_hex", [(3, "0x1.279a74590331cp+1023"),
                                            (7, "0x1.83091e6a7f7e6p+1022"),
                                            (22, "0x1.b4a293c1d954fp+1021")])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("scale", [1.0, 2.0**-600], ids=["x-1", "x-2^-600"])
def test_an_output_a_hair_under_the_overflow_threshold_is_finite(isa, n, weight_hex, sign, scale):
    """y = w sqrt(n) for the row [1, 0, ..., 0] with eps = 0 lies just under
    the threshold past which a float64 rounds to an infinity (DBL_MAX plus
    half its ulp), so it rounds to DBL_MAX; the rounded u_hi * w lies past
    that threshold, and the portable kernels, without fused multiply-adds,
    wrote an infinity. At 2^-600 the row's plain sum of squares underflows
    and is made again on a rescaled row."""
    weight = np.ones(n)
    weight[0] = sign * float.fromhex(weight_hex)
    y_squared = Fraction(weight[0]) ** 2 * n
    below, above = Fraction(DOUBLE_MAX) - 2**970, Fraction(DOUBLE_MAX) + 2**970  # half an ulp
    assert below**2 < y_squared < above**2, "the case's y does not round to DBL_MAX"
    x = np.zeros(n)
    x[0] = scale
    y = rmsnorm.forward(x, weight, F64(0.0))
    assert y[0] == sign * DOUBLE_MAX, f"on {isa}: {y[0]!r}"


@pytest.mark.parametrize("variant", ["forward_offset", "add_forward_offset"])
@pytest.mark.parametrize("weight_hex, offset", [("0x1.5555555555555p+1022", -1.0),
                                                ("0x1.5555555555555p-950", -(2.0**-1074)),
                                                ("0x1.5555555555555p-950", -(2.0**-1060))],
                         ids=["near-overflow", "subnormal-offset", "tiny-offset"])
def test_an_offsets_last_bits_settle_a_tie_of_the_rest(isa, variant, weight_hex, offset):
    """With 1/RMS = 1, y = 3 (w + offset) lies a few units of 2^-1074 below
    the tie that 3 w sits on, near DBL_MAX (where the tie is the one with
    2^1024) or near 2^-948 (below 2^-900, where rows are written element by
    element); the element-by-element write dropped the offset's part, and
    rounded the tie up (to inf near the top, on the portable kernels)."""
    weight = np.full(25, float.fromhex(weight_hex))
    x = np.array([3.0, 4.0] + [0.0] * 23)  # mean(x**2) = 1
    expected = float(3 * (Fraction(weight[0]) + Fraction(offset)))
    if variant == "forward_offset":
        y = rmsnorm.forward_offset(x, weight, F64(offset), F64(0.0))
    else:
        y, _ = rmsnorm.add_forward_offset(x, np.zeros(25), weight, F64(offset), F64(0.0))
    assert y[0] == expected, f"{variant} on {isa}: {y[0].hex()}, expected {expected.hex()}"


# bfloat16 rows whose grad_input is a normal bfloat16 while a factor the
# vector kernels' float backward forms is not a normal float: (x,
# grad_output, weight); the vector kernels write them in double.
BFLOAT16_FACTORS_PAST_FLOAT = {
    # g = grad_output * w = 2^129 passes FLT_MAX; grad_input = 2^116
    "g-overflows": ([2.0**13] * 4, [2.0**63, -(2.0**63), 0.0, 0.0], [2.0**66] * 4),
    # g = 2^-155 underflows to 0; inv_rms = 2^90 makes grad_input 2^-65
    "g-underflows": ([2.0**-90] * 4, [2.0**-80, -(2.0**-80), 0.0, 0.0], [2.0**-75] * 4),
    # g in float's subnormals, where it keeps a few bits
    "g-subnormal": ([2.0**-90] * 4, [2.0**-70 * 1.0078125, -(2.0**-70), 0.0, 0.0],
                    [2.0**-72 * 1.9921875] * 4),
    # x_hat of the 2^-133 is about 2^-150.4, 0 in float; its grad_input,
    # about -2^-68.7, is not
    "x_hat-underflows": ([2.0**18, 2.0**17, 2.0**-133], [2.0**100, 0.0, 0.0], [1.0] * 3),
    # g near 2^-132 keeps its bits in float's subnormals, and with
    # inv_rms = 2^8 the float path's error stays far below grad_input's ulp
    "g-subnormal-small-inv_rms": ([2.0**-8] * 4, [2.0**-120 * 1.0078125, -(2.0**-120),
                                                  2.0**-120, -(2.0**-120) * 1.0078125],
                                  [2.0**-12 * 1.5] * 4),
    # mean(g x_hat) about 1.75 * 2^-151, subnormal as a float; times
    # inv_rms |x_hat| = 2^14 its grad_input is -1.75 * 2^-126, which came out 0
    "mean-subnormal": ([8.0, 2.0**-40] + [0.0] * 14, [0.0, 1.75 * 2.0**-118] + [0.0] * 14,
                       [1.0] * 16, -(4.0 - 2.0**-22)),
    "mean-subnormal-two": ([2.0, 2.0**-40], [0.0, 1.5 * 2.0**-119], [1.0] * 2, -(2.0 - 2.0**-22)),
}


@pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")
@pytest.mark.parametrize("case", BFLOAT16_FACTORS_PAST_FLOAT)
def test_bfloat16_grad_input_where_a_factor_leaves_floats_normal_range(isa, case):
    """grad_output * w and x * inv_rms are floats in the vector kernels'
    16-bit backward; a row where one could pass float's range, or lose bits
    below its normals that grad_input would show, goes in double, and its
    grad_input, a normal bfloat16, is neither infinite, 0 nor bits off."""
    x_values, grad_values, weight_values, *eps = BFLOAT16_FACTORS_PAST_FLOAT[case]
    eps = F32(eps[0] if eps else 0.0)
    x = np.array([x_values]).astype(BF16)
    grad = np.array([grad_values]).astype(BF16)
    weight = np.array(weight_values).astype(BF16)
    assert np.array_equal(x.astype(F64), [x_values]), "the case's x is not bfloat16"
    grad_input, _ = rmsnorm.backward(grad, x, weight, eps)
    expected, _ = reference.rms_norm_backward(grad.astype(F64), x.astype(F64), x.shape[1],
                                              weight.astype(F64), float(eps))
    assert np.all(np.abs(expected) < float(np.finfo(F32).max)), "the case's grad_input overflows"
    assert_close_ulp(grad_input.astype(F64), expected, rtol=2.0**-8, atol=0.0,
                     what=f"grad_input on {isa}")


# 16-bit rows whose gradient g = grad_output * w lies along x, so that
# grad_input = (g - x_hat * mean) / RMS is far smaller than its terms:
# (name, x, grad_output, eps). Float's roundings of the terms, 2^-24 of
# them, would outweigh such a grad_input; the float64 reference's, 2^-53,
# do not.
_ROWS_ALONG_X = np.random.default_rng(16).uniform(0.5, 2.0, 300)
GRADIENTS_THAT_CANCEL = {
    "constant_row": (np.ones(4096), np.ones(4096), 1e-8),
    "constant_short_row": (np.full(37, 0.75), np.full(37, 0.75), 1e-7),
    "grad_output_equal_to_x": (_ROWS_ALONG_X, _ROWS_ALONG_X, 1e-5),
    "grad_output_a_multiple_of_x": (_ROWS_ALONG_X, 4.0 * _ROWS_ALONG_X, 1e-4),
}


@pytest.mark.parametrize("case", sorted(GRADIENTS_THAT_CANCEL))
@pytest.mark.parametrize("weight_kind", ["own", "float32"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_16bit_grad_input_stays_within_an_ulp_where_the_gradient_cancels(
        isa, dtype_name, weight_kind, case):
    """A gradient along x leaves grad_input a small difference of large
    terms; the vector kernels, which write 16-bit gradients in float, see
    it in the row's sums and write that row in double, within an ulp of
    the exact gradient."""
    if dtype_name == "bfloat16" and BF16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    dtype = np.dtype(np.float16) if dtype_name == "float16" else np.dtype(BF16)
    x_values, grad_values, eps = GRADIENTS_THAT_CANCEL[case]
    x = x_values[None].astype(dtype)
    grad = grad_values[None].astype(dtype)
    weight = np.ones(x.shape[1], dtype if weight_kind == "own" else F32)
    grad_input, _ = rmsnorm.backward(grad, x, weight, F32(eps))
    expected, _ = reference.rms_norm_backward(grad.astype(F64), x.astype(F64), x.shape[1],
                                              weight.astype(F64), float(F32(eps)))
    terms = np.abs(grad.astype(F64)).max()
    assert np.abs(expected).max() < 2.0**-8 * terms, "the case's gradient does not cancel"
    ulp = np.abs(expected.astype(dtype).astype(F64) - np.nextafter(
        expected.astype(dtype), np.array(np.inf, dtype)).astype(F64))
    assert np.all(np.abs(grad_input.astype(F64) - expected) <= ulp), (
        f"grad_input on {isa}: {grad_input.astype(F64)[0, :4]}, exact {expected[0, :4]}")


@pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")
def test_an_element_that_cancels_alone_in_its_row_stays_within_an_ulp(isa, request):
    """The row-wise test above misses one element whose terms cancel in a
    row whose others do not: x = [1, 1, 1], grad_output = [1, 0, 2], where
    the first gradient is about 1e-8 and its terms 1. The vector kernels
    keep such a row in float, whose roundings of the terms make it 0;
    docs/accuracy.md names the gap. The portable kernels write it in
    double."""
    request.applymarker(pytest.mark.xfail(
        isa != "baseline", strict=True,
        reason="the float path's cancellation test is the row's, not each element's"))
    x = np.array([[1.0, 1.0, 1.0]]).astype(BF16)
    grad = np.array([[1.0, 0.0, 2.0]]).astype(BF16)
    weight = np.ones(3, BF16)
    grad_input, _ = rmsnorm.backward(grad, x, weight, F32(1e-8))
    expected, _ = reference.rms_norm_backward(grad.astype(F64), x.astype(F64), 3,
                                              np.ones(3), float(F32(1e-8)))
    assert_close_ulp(grad_input.astype(F64), expected, rtol=2.0**-8, atol=0.0,
                     what=f"grad_input on {isa}")


@pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")
def test_bfloat16_grad_weight_where_grad_output_times_x_passes_float_range(isa):
    """grad_output * x = 2^140 does not fit a float, yet grad_weight =
    grad_output * x_hat (about 2^69.5) does."""
    x = np.array([[2.0**70, 2.0**70, 1.0]]).astype(BF16)
    grad = np.array([[2.0**70, 1.0, 1.0]]).astype(BF16)
    _, grad_weight = rmsnorm.backward(grad, x, np.ones(3).astype(BF16), F32(1e-6))
    _, expected = reference.rms_norm_backward(grad.astype(F64), x.astype(F64), 3,
                                              np.ones(3), 1e-6)
    assert np.all(np.isfinite(grad_weight.astype(F64))), f"on {isa}: {grad_weight}"
    assert_close_ulp(grad_weight.astype(F64), expected, rtol=2.0**-7, atol=0.0,
                     what=f"grad_weight on {isa}")
