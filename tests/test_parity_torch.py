"""Parity with torch 2.13 on CPU, element by element.

The expected values come from ``torch.nn.functional.rms_norm`` and
``torch.nn.RMSNorm`` with torch autograd: ``requires_grad_()`` on input and
weight, then ``backward`` with a seeded random grad_output. Forward results
use torch.testing.assert_close's default tolerances for the dtype; gradients
use an absolute tolerance scaled to the tensor (see ``closeness.grad_tolerance``).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import rmsnorm
from closeness import assert_forward_close, assert_grad_close
from layouts import column_slice
from supported_dtypes import WIDE_DTYPES

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
EPSILONS = [None, 1e-6, 1e-5, 0.5, -0.5]
SIZES = [1, 3, 7, 64, 127, 1000, 4096, 8192]

# (input shape, normalized_shape): inputs 1-D to 4-D, normalized_shape of 1
# to 3 dimensions, row lengths from 1 to 69635 with odd ones among them.
SHAPE_CASES = (
    [((n,), (n,)) for n in SIZES]
    + [((5, n), (n,)) for n in SIZES]
    + [
        ((4, 64), (4, 64)),
        ((2, 3, 7), (7,)),
        ((2, 3, 127), (3, 127)),
        ((2, 3, 4), (2, 3, 4)),
        ((3, 2, 4096), (2, 4096)),
        ((2, 3, 4, 5), (5,)),
        ((2, 3, 4, 5), (4, 5)),
        ((2, 3, 4, 5), (3, 4, 5)),
        ((2, 1, 3, 1000), (3, 1000)),
        ((1, 2, 1, 1), (1, 1)),
        # rows past the backward's tile of 4096 columns, in two and in
        # three chunks of rows (csrc/kernels/rms_norm.c)
        ((20, 4097), (4097,)),
        ((3, 69635), (69635,)),
    ]
)


def _id(value):
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return repr(value)


def shape_case_id(case):
    shape, normalized_shape = case
    return f"x{_id(shape)}-ns{_id(normalized_shape)}"


def eps_id(eps):
    return f"eps={eps!r}"


def make_inputs(shape, normalized_shape, dtype, eps, seed=0):
    """Seeded x, weight and grad_output for one case.

    For a negative eps, x is kept away from zero so that every row has
    mean(x**2) >= 1 > 0.5 and the result is finite, as in torch's own tests.
    """
    rng = np.random.default_rng([seed, *shape, *normalized_shape])
    if eps is not None and eps < 0:
        x = rng.uniform(1.0, 3.0, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        x = rng.standard_normal(shape)
    weight = rng.standard_normal(normalized_shape)
    grad_output = rng.standard_normal(shape)
    return x.astype(dtype), weight.astype(dtype), grad_output.astype(dtype)


def torch_rms_norm(x, normalized_shape, weight, eps, grad_output):
    """``(y, grad_input, grad_weight)`` from torch's functional and autograd."""
    x_t = torch.from_numpy(np.ascontiguousarray(x)).clone().requires_grad_()
    w_t = None
    if weight is not None:
        w_t = torch.from_numpy(np.ascontiguousarray(weight)).clone().requires_grad_()
    y_t = torch.nn.functional.rms_norm(x_t, list(normalized_shape), w_t, eps)
    y_t.backward(torch.from_numpy(np.ascontiguousarray(grad_output)).clone())
    grad_weight = None if w_t is None else w_t.grad.numpy()
    return y_t.detach().numpy(), x_t.grad.numpy(), grad_weight


@functools.lru_cache(maxsize=None)
def torch_case(shape, normalized_shape, dtype, eps, affine):
    """Inputs and torch's results for one parametrised case, computed once
    and shared by the forward, grad_input and grad_weight tests."""
    x, weight, grad_output = make_inputs(shape, normalized_shape, dtype, eps)
    if not affine:
        weight = None
    expected = torch_rms_norm(x, normalized_shape, weight, eps, grad_output)
    for array in (x, weight, grad_output, *expected):
        if array is not None:
            array.setflags(write=False)
    return (x, weight, grad_output), expected


# ---------------------------------------------------------------------------
# The functional API over shapes, eps, affine and dtypes.
# ---------------------------------------------------------------------------

parametrize_functional = pytest.mark.parametrize(
    "dtype, case, eps, affine",
    [
        pytest.param(dtype, case, eps, affine,
                     id=f"{_id(dtype)}-{shape_case_id(case)}-{eps_id(eps)}-"
                        f"{'affine' if affine else 'no_weight'}")
        for dtype in WIDE_DTYPES
        for case in SHAPE_CASES
        for eps in EPSILONS
        for affine in (True, False)
    ],
)


@parametrize_functional
def test_forward_matches_torch_functional(dtype, case, eps, affine):
    shape, normalized_shape = case
    (x, weight, _), (y_torch, _, _) = torch_case(shape, normalized_shape, dtype, eps, affine)
    y = rmsnorm.rms_norm(x, normalized_shape, weight, eps)
    assert np.isfinite(y_torch).all()
    assert_forward_close(y, y_torch, what="rms_norm output")


@parametrize_functional
def test_grad_input_matches_torch_autograd(dtype, case, eps, affine):
    shape, normalized_shape = case
    (x, weight, grad_output), (_, grad_input_torch, _) = torch_case(
        shape, normalized_shape, dtype, eps, affine)
    grad_input, _ = rmsnorm.rms_norm_backward(grad_output, x, normalized_shape, weight, eps)
    assert_grad_close(grad_input, grad_input_torch, what="grad_input")


@parametrize_functional
def test_grad_weight_matches_torch_autograd(dtype, case, eps, affine):
    shape, normalized_shape = case
    (x, weight, grad_output), (_, _, grad_weight_torch) = torch_case(
        shape, normalized_shape, dtype, eps, affine)
    _, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, normalized_shape, weight, eps)
    if not affine:
        assert grad_weight is None
        return
    assert grad_weight is not None
    assert_grad_close(grad_weight, grad_weight_torch, what="grad_weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_int_normalized_shape_matches_torch_list(dtype, n):
    x, weight, grad_output = make_inputs((3, n), (n,), dtype, 1e-5)
    y_torch, gi_torch, gw_torch = torch_rms_norm(x, [n], weight, 1e-5, grad_output)
    assert_forward_close(rmsnorm.rms_norm(x, n, weight, 1e-5), y_torch)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, n, weight, 1e-5)
    assert_grad_close(grad_input, gi_torch, what="grad_input")
    assert_grad_close(grad_weight, gw_torch, what="grad_weight")


# ---------------------------------------------------------------------------
# Memory layouts: the same values as a contiguous array, laid out otherwise.
# ---------------------------------------------------------------------------

def _transposed(a):
    """Same values, Fortran order (a transposed view of a contiguous array)."""
    return np.ascontiguousarray(a.T).T


def _row_slice(a):
    """Same values, every other row of a taller array."""
    tall = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
    tall[::2] = a
    return tall[::2]


def _reversed(a):
    """Same values through negative strides on both axes."""
    return np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1]


def _broadcast_row(a):
    """Every row the same: the first row with stride 0 over the batch."""
    return np.broadcast_to(a[:1], a.shape)


LAYOUTS = {
    "contiguous": lambda a: a,
    "transposed": _transposed,
    "column_slice": column_slice,
    "row_slice": _row_slice,
    "negative_strides": _reversed,
    "broadcast": _broadcast_row,
}


def _check_layout(layout, array):
    if layout == "contiguous":
        assert array.flags.c_contiguous
    else:
        assert not array.flags.c_contiguous, f"{layout} layout produced a contiguous array"


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
@pytest.mark.parametrize("n", [7, 127])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_forward_and_grads_match_torch_for_layout(layout, n, dtype, affine):
    x, weight, grad_output = make_inputs((6, n), (n,), dtype, 1e-5, seed=1)
    x = LAYOUTS[layout](x)
    grad_output = LAYOUTS[layout](grad_output)
    _check_layout(layout, x)
    if not affine:
        weight = None
    y_torch, gi_torch, gw_torch = torch_rms_norm(x, (n,), weight, 1e-5, grad_output)

    assert_forward_close(rmsnorm.rms_norm(x, (n,), weight, 1e-5), y_torch)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, (n,), weight, 1e-5)
    assert_grad_close(grad_input, gi_torch, what="grad_input")
    if affine:
        assert_grad_close(grad_weight, gw_torch, what="grad_weight")
    else:
        assert grad_weight is None


@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
@pytest.mark.parametrize("weight_layout", ["column_slice", "negative_stride"])
def test_forward_and_grads_match_torch_for_strided_weight(weight_layout, dtype):
    n = 33
    x, weight, grad_output = make_inputs((4, n), (n,), dtype, None, seed=2)
    if weight_layout == "column_slice":
        strided_weight = column_slice(weight[None, :])[0]
    else:
        strided_weight = np.ascontiguousarray(weight[::-1])[::-1]
    assert not strided_weight.flags.c_contiguous
    y_torch, gi_torch, gw_torch = torch_rms_norm(x, (n,), weight, None, grad_output)

    assert_forward_close(rmsnorm.rms_norm(x, (n,), strided_weight), y_torch)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, (n,), strided_weight)
    assert_grad_close(grad_input, gi_torch, what="grad_input")
    assert_grad_close(grad_weight, gw_torch, what="grad_weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
def test_forward_and_grads_match_torch_for_permuted_3d_input(dtype):
    # A (3, 4, 5) view of a (5, 4, 3) array: the two normalised dims cannot be
    # folded without a copy.
    x, weight, grad_output = make_inputs((3, 4, 5), (4, 5), dtype, 1e-6, seed=3)
    x_view = np.ascontiguousarray(x.transpose(2, 1, 0)).transpose(2, 1, 0)
    assert not x_view.flags.c_contiguous
    y_torch, gi_torch, gw_torch = torch_rms_norm(x, (4, 5), weight, 1e-6, grad_output)

    assert_forward_close(rmsnorm.rms_norm(x_view, (4, 5), weight, 1e-6), y_torch)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        _transposed(grad_output), x_view, (4, 5), weight, 1e-6)
    assert_grad_close(grad_input, gi_torch, what="grad_input")
    assert_grad_close(grad_weight, gw_torch, what="grad_weight")


# ---------------------------------------------------------------------------
# Edge cases.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
@pytest.mark.parametrize("case", [((0, 1), (1,)), ((0, 7), (7,)), ((2, 0, 5), (5,)),
                                  ((0, 3, 4), (3, 4))], ids=shape_case_id)
def test_empty_batch_matches_torch(case, dtype, affine):
    shape, normalized_shape = case
    x, weight, grad_output = make_inputs(shape, normalized_shape, dtype, None)
    if not affine:
        weight = None
    y_torch, gi_torch, gw_torch = torch_rms_norm(x, normalized_shape, weight, None, grad_output)

    y = rmsnorm.rms_norm(x, normalized_shape, weight)
    assert y.shape == shape and y.dtype == dtype
    assert_forward_close(y, y_torch)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, normalized_shape, weight)
    assert_grad_close(grad_input, gi_torch, what="grad_input")
    if affine:
        # No rows: torch's grad_weight is all zeros, of the weight's shape.
        assert_grad_close(grad_weight, gw_torch, what="grad_weight")
    else:
        assert grad_weight is None


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
def test_all_zero_row_with_zero_eps_gives_nan_like_torch(dtype, affine):
    x, weight, grad_output = make_inputs((3, 6), (6,), dtype, 0.0, seed=4)
    x[1] = 0.0
    if not affine:
        weight = None
    y_torch, _, _ = torch_rms_norm(x, (6,), weight, 0.0, grad_output)
    assert np.isnan(y_torch[1]).all() and np.isfinite(y_torch[[0, 2]]).all()

    y = rmsnorm.rms_norm(x, (6,), weight, 0.0)
    assert_forward_close(y, y_torch)


@pytest.mark.parametrize("dtype", WIDE_DTYPES, ids=_id)
def test_output_dtype_is_input_dtype(dtype):
    x, weight, grad_output = make_inputs((2, 5), (5,), dtype, None)
    assert rmsnorm.rms_norm(x, (5,), weight).dtype == dtype
    grad_input, grad_weight = rmsnorm.rms_norm_backward(grad_output, x, (5,), weight)
    assert grad_input.dtype == dtype and grad_weight.dtype == dtype


# ---------------------------------------------------------------------------
# The module against torch.nn.RMSNorm.
# ---------------------------------------------------------------------------

MODULE_CASES = [
    ((5,), 5),
    ((2, 3, 5), (5,)),
    ((2, 3, 5), [3, 5]),
    ((2, 3, 4, 6), (3, 4, 6)),
    ((4, 1000), 1000),
]


def _make_modules(normalized_shape, eps, affine, dtype, weight):
    theirs = torch.nn.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine,
                              dtype=TORCH_DTYPE[np.dtype(dtype)])
    ours = rmsnorm.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(weight))
        ours.weight[...] = weight
    return ours, theirs


parametrize_module = pytest.mark.parametrize(
    "dtype, case, eps, affine",
    [
        pytest.param(dtype, case, eps, affine,
                     id=f"{_id(dtype)}-x{_id(case[0])}-ns{case[1]!r}-{eps_id(eps)}-"
                        f"{'affine' if affine else 'no_weight'}")
        for dtype in WIDE_DTYPES
        for case in MODULE_CASES
        for eps in (None, 1e-5, -0.5)
        for affine in (True, False)
    ],
)


@parametrize_module
def test_module_matches_torch_module(dtype, case, eps, affine):
    shape, normalized_shape = case
    ns_tuple = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    x, weight, grad_output = make_inputs(shape, ns_tuple, dtype, eps, seed=5)
    ours, theirs = _make_modules(normalized_shape, eps, affine, dtype, weight)

    x_t = torch.from_numpy(x).clone().requires_grad_()
    y_t = theirs(x_t)
    y_t.backward(torch.from_numpy(grad_output))

    assert_forward_close(ours(x), y_t.detach().numpy(), what="RMSNorm.__call__ output")
    assert_forward_close(ours.forward(x), y_t.detach().numpy(), what="RMSNorm.forward output")
    grad_input = ours.backward(grad_output)
    assert_grad_close(grad_input, x_t.grad.numpy(), what="RMSNorm.backward grad_input")
    if affine:
        assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="weight_grad")
    else:
        assert ours.weight_grad is None

