"""rmsnorm.forward and rmsnorm.backward behave as real NumPy gufuncs.

Signatures, loop-dimension broadcasting, ``out=``, ``axes=``, ``dtype=``,
``casting=``, and strided operands, which must give bit-identical results to
contiguous copies of themselves (the contiguous fast path and the strided
path are checked against each other). Values are checked against the
float64 reference; no torch here.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsnorm
from rmsnorm import reference
from closeness import assert_close_ulp, assert_same_bytes, reference_grad_scales
from layouts import column_slice
from supported_dtypes import DTYPES, WIDE_DTYPES

# Row lengths around typical SIMD widths and tails, and a long row.
ROW_LENGTHS = [1, 3, 8, 17, 64, 1000]


def reference_tolerance(dtype):
    """``(rtol, atol)`` of a forward result against the float64 reference.

    A few ULPs of dtype; for float64 the reference is itself a plain float64
    computation a few ULPs off, hence 8.
    """
    eps = float(np.finfo(dtype).eps)
    return (4 * eps if dtype == np.float32 else 8 * eps), 4 * eps


def assert_grads_match_reference(grad_input, grad_weight, grad_output, x, weight, eps, what=""):
    """Both gradients of one (m, n) problem against the float64 reference.

    The absolute tolerance is a few ULPs of the scale of the terms that make
    up each gradient (closeness.reference_grad_scales), since grad_input is
    a difference of two such terms and may cancel to far below them.
    """
    n = x.shape[-1]
    gi_ref, gw_ref = reference.rms_norm_backward(grad_output, x, (n,), weight, eps)
    gi_scale, gw_scale = reference_grad_scales(x, (n,), weight, grad_output, eps)
    unit = float(np.finfo(x.dtype).eps)
    assert_close_ulp(grad_input, gi_ref, rtol=4 * unit, atol=8 * unit * gi_scale,
                     check_dtype=False, what=f"grad_input{what}")
    assert_close_ulp(grad_weight, gw_ref, rtol=4 * unit, atol=8 * unit * gw_scale,
                     check_dtype=False, what=f"grad_weight{what}")


def make_rows(shape, dtype, seed=0):
    rng = np.random.default_rng([seed, *shape])
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# Identity.
# ---------------------------------------------------------------------------

def test_forward_is_a_gufunc_with_the_documented_signature():
    assert isinstance(rmsnorm.forward, np.ufunc)
    assert rmsnorm.forward.signature == "(n),(n),()->(n)"
    assert (rmsnorm.forward.nin, rmsnorm.forward.nout) == (3, 1)


def test_backward_is_a_gufunc_with_the_documented_signature():
    assert isinstance(rmsnorm.backward, np.ufunc)
    assert rmsnorm.backward.signature == "(m,n),(m,n),(n),()->(m,n),(n)"
    assert (rmsnorm.backward.nin, rmsnorm.backward.nout) == (4, 2)


@pytest.mark.parametrize("ufunc, loops", [
    ("forward", ["fff->f", "ddd->d"]),
    ("backward", ["ffff->ff", "dddd->dd"]),
])
def test_gufunc_has_float32_and_float64_loops(ufunc, loops):
    types = getattr(rmsnorm, ufunc).types
    for loop in loops:
        assert loop in types, f"{loop} missing from {types}"


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_forward_gufunc_matches_reference(n, dtype):
    x = make_rows((5, n), dtype)
    weight = make_rows((n,), dtype, seed=1)
    y = rmsnorm.forward(x, weight, 1e-5)
    assert y.dtype == dtype
    rtol, atol = reference_tolerance(dtype)
    assert_close_ulp(y, reference.rms_norm(x, (n,), weight, 1e-5), rtol=rtol, atol=atol,
                     check_dtype=False, what="forward")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_backward_gufunc_matches_reference(n, dtype):
    x = make_rows((6, n), dtype)
    grad_output = make_rows((6, n), dtype, seed=1)
    weight = make_rows((n,), dtype, seed=2)
    grad_input, grad_weight = rmsnorm.backward(grad_output, x, weight, 1e-5)
    assert grad_input.dtype == dtype and grad_weight.dtype == dtype
    assert grad_weight.shape == (n,)
    assert_grads_match_reference(grad_input, grad_weight, grad_output, x, weight, 1e-5)


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_python_float_eps_keeps_the_input_loop(dtype):
    # NEP 50: a Python float is a weak scalar and must not promote float32.
    x = make_rows((2, 4), dtype)
    assert rmsnorm.forward(x, np.ones(4, dtype), 1e-5).dtype == dtype
    grad_input, grad_weight = rmsnorm.backward(x, x, np.ones(4, dtype), 1e-5)
    assert grad_input.dtype == dtype and grad_weight.dtype == dtype


# ---------------------------------------------------------------------------
# Broadcasting over loop dimensions.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_broadcasts_eps_over_loop_dims(dtype):
    n = 9
    x = make_rows((2, 3, n), dtype)
    weight = make_rows((n,), dtype, seed=1)
    eps = np.array([[1e-5], [0.75]], dtype)
    y = rmsnorm.forward(x, weight, eps)
    assert y.shape == (2, 3, n)
    for i in range(2):
        for j in range(3):
            assert_same_bytes(y[i, j], rmsnorm.forward(x[i, j], weight, eps[i, 0]),
                              what=f"row ({i}, {j})")
    rtol, atol = reference_tolerance(dtype)
    for i in range(2):
        expected = reference.rms_norm(x[i], (n,), weight, float(eps[i, 0]))
        assert_close_ulp(y[i], expected, rtol=rtol, atol=atol, check_dtype=False,
                         what=f"batch {i} with eps {eps[i, 0]}")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_broadcasts_weight_over_loop_dims(dtype):
    n = 5
    x = make_rows((2, 3, n), dtype)
    weights = make_rows((3, n), dtype, seed=1)
    y = rmsnorm.forward(x, weights, 1e-6)
    assert y.shape == (2, 3, n)
    for i in range(2):
        for j in range(3):
            assert_same_bytes(y[i, j], rmsnorm.forward(x[i, j], weights[j], 1e-6),
                              what=f"row ({i}, {j})")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_broadcasts_one_row_against_many_weights(dtype):
    n = 6
    x = make_rows((n,), dtype)
    weights = make_rows((4, 1, n), dtype, seed=1)
    y = rmsnorm.forward(x, weights, 1e-5)
    assert y.shape == (4, 1, n)
    for k in range(4):
        assert_same_bytes(y[k, 0], rmsnorm.forward(x, weights[k, 0], 1e-5), what=f"weight {k}")


# The forward makes the weight as its write passes read it (as floats for
# 16-bit x, as offset + weight in double-double with an offset) once per
# call where every row shares it, and per chunk of rows, row by row, where
# rows have weights or offsets of their own: the two ways must agree.
OWN = {
    "weight": lambda rows, n, w, rng: (rng.uniform(-1, 1, (rows, n)), None),
    "weight+offset": lambda rows, n, w, rng: (rng.uniform(-1, 1, (rows, n)), 0.5),
    "offset": lambda rows, n, w, rng: (np.broadcast_to(w, (rows, n)), np.linspace(-1, 2, rows)),
    "both": lambda rows, n, w, rng: (rng.uniform(-1, 1, (rows, n)), np.linspace(-1, 2, rows)),
}


@pytest.mark.parametrize("own", OWN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_with_weights_or_offsets_of_their_own_give_each_rows_bytes_alone(dtype, own):
    rows, n = 20, 4097  # two chunks of rows
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, n)).astype(dtype)
    weights, offsets = OWN[own](rows, n, rng.uniform(-1, 1, n), rng)
    weights = weights.astype(dtype)
    eps = np.float64(1e-6) if dtype == np.float64 else np.float32(1e-6)
    if offsets is None:
        y = rmsnorm.forward(x, weights, eps)
        alone = [rmsnorm.forward(x[r], weights[r], eps) for r in range(rows)]
    else:
        y = rmsnorm.forward_offset(x, weights, offsets, eps)
        row_offsets = np.broadcast_to(offsets, (rows,))
        alone = [rmsnorm.forward_offset(x[r], weights[r], row_offsets[r], eps) for r in range(rows)]
    for r in range(rows):
        assert_same_bytes(y[r], alone[r], what=f"row {r}")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_broadcasts_over_a_leading_batch_dim_with_per_batch_grad_weight(dtype):
    b, m, n = 3, 4, 11
    x = make_rows((b, m, n), dtype)
    grad_output = make_rows((b, m, n), dtype, seed=1)
    weight = make_rows((n,), dtype, seed=2)
    eps = np.array([1e-5, 0.5, 2.0], dtype)
    grad_input, grad_weight = rmsnorm.backward(grad_output, x, weight, eps)
    assert grad_input.shape == (b, m, n)
    assert grad_weight.shape == (b, n)
    for k in range(b):
        gi_k, gw_k = rmsnorm.backward(grad_output[k], x[k], weight, eps[k])
        assert_same_bytes(grad_input[k], gi_k, what=f"grad_input of batch {k}")
        assert_same_bytes(grad_weight[k], gw_k, what=f"grad_weight of batch {k}")
    # grad_weight[k] is batch k's own sum over its m rows, not a sum over batches.
    assert_grads_match_reference(grad_input[1], grad_weight[1], grad_output[1], x[1], weight,
                                 float(eps[1]), what=" of batch 1")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_grad_weight_is_the_sum_over_rows(dtype):
    m, n = 7, 13
    x = make_rows((m, n), dtype)
    grad_output = make_rows((m, n), dtype, seed=1)
    weight = make_rows((n,), dtype, seed=2)
    _, grad_weight = rmsnorm.backward(grad_output, x, weight, 1e-5)
    # Each row alone (m = 1), summed in float64: the same up to rounding.
    per_row = [rmsnorm.backward(grad_output[i:i + 1], x[i:i + 1], weight, 1e-5)[1]
               for i in range(m)]
    per_row_sum = np.sum(np.array(per_row, np.float64), axis=0)
    rtol, atol = reference_tolerance(dtype)
    assert_close_ulp(grad_weight, per_row_sum, rtol=rtol * m,
                     atol=atol * m * max(1, np.abs(per_row_sum).max()),
                     check_dtype=False, what="grad_weight vs sum of one-row grad_weights")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_with_no_rows_gives_zero_grad_weight(dtype):
    empty = np.zeros((0, 5), dtype)
    grad_input, grad_weight = rmsnorm.backward(empty, empty, np.ones(5, dtype), 1e-5)
    assert grad_input.shape == (0, 5)
    assert_same_bytes(grad_weight, np.zeros(5, dtype), what="grad_weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_with_no_rows_gives_empty_result(dtype):
    y = rmsnorm.forward(np.zeros((0, 5), dtype), np.ones(5, dtype), 1e-5)
    assert y.shape == (0, 5) and y.dtype == dtype


# ---------------------------------------------------------------------------
# out=, axes=, dtype=, casting=.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("out_layout", ["contiguous", "strided", "tuple"])
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_out_gives_the_same_result_in_place(dtype, out_layout):
    x = make_rows((4, 10), dtype)
    weight = make_rows((10,), dtype, seed=1)
    expected = rmsnorm.forward(x, weight, 1e-5)
    if out_layout == "strided":
        out = np.full((4, 20), -7.0, dtype)[:, ::2]
    else:
        out = np.full((4, 10), -7.0, dtype)
    result = rmsnorm.forward(x, weight, 1e-5, out=(out,) if out_layout == "tuple" else out)
    assert result is out
    assert_same_bytes(out, expected, what="out")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_out_gives_the_same_results_in_place(dtype):
    x = make_rows((4, 10), dtype)
    grad_output = make_rows((4, 10), dtype, seed=1)
    weight = make_rows((10,), dtype, seed=2)
    gi_expected, gw_expected = rmsnorm.backward(grad_output, x, weight, 1e-5)
    # grad_weight is written, not accumulated: a non-zero start must not leak in.
    gi_out = np.full((4, 10), 3.0, dtype)
    gw_out = np.full((10,), 3.0, dtype)
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5, out=(gi_out, gw_out))
    assert gi is gi_out and gw is gw_out
    assert_same_bytes(gi_out, gi_expected, what="grad_input out")
    assert_same_bytes(gw_out, gw_expected, what="grad_weight out")


def test_forward_out_may_alias_the_input():
    x = make_rows((3, 17), np.float64)
    weight = make_rows((17,), np.float64, seed=1)
    expected = rmsnorm.forward(x, weight, 1e-5)
    rmsnorm.forward(x, weight, 1e-5, out=x)
    assert_same_bytes(x, expected, what="in-place forward")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_forward_axes_normalises_along_axis_0(dtype):
    x = make_rows((12, 5), dtype)  # rows of length 12 along axis 0
    weight = make_rows((12,), dtype, seed=1)
    y = rmsnorm.forward(x, weight, 1e-5, axes=[(0,), (0,), (), (0,)])
    assert y.shape == (12, 5)
    assert_same_bytes(y, rmsnorm.forward(np.ascontiguousarray(x.T), weight, 1e-5).T,
                      what="forward with axes")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_axes_normalises_along_axis_0(dtype):
    n, m = 12, 5
    x = make_rows((n, m), dtype)
    grad_output = make_rows((n, m), dtype, seed=1)
    weight = make_rows((n,), dtype, seed=2)
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5,
                              axes=[(1, 0), (1, 0), (0,), (), (1, 0), (0,)])
    gi_t, gw_t = rmsnorm.backward(np.ascontiguousarray(grad_output.T), np.ascontiguousarray(x.T),
                                  weight, 1e-5)
    assert_same_bytes(gi, gi_t.T, what="grad_input with axes")
    assert_same_bytes(gw, gw_t, what="grad_weight with axes")


def test_forward_dtype_float64_upcasts_float32_operands():
    x = make_rows((3, 7), np.float32)
    weight = make_rows((7,), np.float32, seed=1)
    y = rmsnorm.forward(x, weight, 1e-5, dtype=np.float64)
    assert y.dtype == np.float64
    assert_same_bytes(y, rmsnorm.forward(x.astype(np.float64), weight.astype(np.float64), 1e-5),
                      what="forward with dtype=float64")


def test_backward_dtype_float64_upcasts_float32_operands():
    x = make_rows((3, 7), np.float32)
    grad_output = make_rows((3, 7), np.float32, seed=1)
    weight = make_rows((7,), np.float32, seed=2)
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5, dtype=np.float64)
    gi64, gw64 = rmsnorm.backward(grad_output.astype(np.float64), x.astype(np.float64),
                                  weight.astype(np.float64), 1e-5)
    assert_same_bytes(gi, gi64, what="grad_input with dtype=float64")
    assert_same_bytes(gw, gw64, what="grad_weight with dtype=float64")


def test_float64_weight_with_float32_input_keeps_float32_output():
    # torch's mixed precision: the output has the input's dtype.
    x = make_rows((2, 5), np.float32)
    weight = make_rows((5,), np.float64, seed=1)
    y = rmsnorm.forward(x, weight, 1e-5)
    assert y.dtype == np.float32
    expected = rmsnorm.forward(x.astype(np.float64), weight, np.float64(np.float32(1e-5)))
    assert_same_bytes(y, expected.astype(np.float32), what="rounded once from float64")


def test_float32_weight_with_float64_input_promotes_to_float64():
    x = make_rows((2, 5), np.float64)
    weight = make_rows((5,), np.float32, seed=1)
    y = rmsnorm.forward(x, weight, 1e-5)
    assert y.dtype == np.float64
    assert_same_bytes(y, rmsnorm.forward(x, weight.astype(np.float64), 1e-5), what="promoted")


def test_casting_no_rejects_mixed_dtypes():
    x = make_rows((2, 5), np.float64)
    with pytest.raises(TypeError):
        rmsnorm.forward(x, np.ones(5, np.float32), np.float64(1e-5), casting="no")
    with pytest.raises(TypeError):
        rmsnorm.backward(x, x, np.ones(5, np.float32), np.float64(1e-5), casting="no")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_casting_no_accepts_matching_dtypes(dtype):
    x = make_rows((2, 5), dtype)
    eps = np.array(1e-5, dtype)
    y = rmsnorm.forward(x, np.ones(5, dtype), eps, casting="no")
    assert_same_bytes(y, rmsnorm.forward(x, np.ones(5, dtype), eps), what="casting='no'")
    rmsnorm.backward(x, x, np.ones(5, dtype), eps, casting="no")


def test_casting_safe_rejects_float64_output_into_float32_out():
    x = make_rows((2, 5), np.float64)
    with pytest.raises(TypeError):
        rmsnorm.forward(x, np.ones(5), 1e-5, out=np.empty((2, 5), np.float32), casting="safe")


# ---------------------------------------------------------------------------
# Strided operands: bit-identical to contiguous copies.
# ---------------------------------------------------------------------------

STRIDED = {
    "column_slice": column_slice,
    "negative_strides": lambda a: np.ascontiguousarray(a[:, ::-1])[:, ::-1],
    "fortran_order": np.asfortranarray,
    "row_slice": lambda a: np.repeat(a, 2, axis=0)[::2],
    "broadcast_rows": lambda a: np.broadcast_to(a[:1], a.shape),
}

STRIDED_WEIGHT = {
    "contiguous": lambda w: w,
    "stride_0_scalar": lambda w: np.broadcast_to(w[:1], w.shape),
    "column_slice": lambda w: column_slice(w[None])[0],
    "negative_stride": lambda w: np.ascontiguousarray(w[::-1])[::-1],
}


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("n", [3, 17, 1000])
@pytest.mark.parametrize("x_layout", list(STRIDED))
def test_forward_strided_input_is_bit_identical_to_contiguous(x_layout, n, dtype):
    x = STRIDED[x_layout](make_rows((5, n), dtype))
    weight = make_rows((n,), dtype, seed=1)
    assert not x.flags.c_contiguous
    assert_same_bytes(rmsnorm.forward(x, weight, 1e-5),
                      rmsnorm.forward(np.ascontiguousarray(x), weight, 1e-5),
                      what=f"forward on {x_layout} input")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("n", [3, 17, 1000])
@pytest.mark.parametrize("weight_layout", [k for k in STRIDED_WEIGHT if k != "contiguous"])
def test_forward_strided_weight_is_bit_identical_to_contiguous(weight_layout, n, dtype):
    x = make_rows((5, n), dtype)
    weight = STRIDED_WEIGHT[weight_layout](make_rows((n,), dtype, seed=1))
    assert not weight.flags.c_contiguous
    assert_same_bytes(rmsnorm.forward(x, weight, 1e-5),
                      rmsnorm.forward(x, np.ascontiguousarray(weight), 1e-5),
                      what=f"forward with {weight_layout} weight")


def test_forward_with_stride_0_weight_of_a_scalar_matches_reference():
    x = make_rows((4, 9), np.float64)
    weight = np.broadcast_to(np.float64(1.5), (9,))
    assert weight.strides == (0,)
    y = rmsnorm.forward(x, weight, 1e-5)
    rtol, atol = reference_tolerance(np.float64)
    assert_close_ulp(y, reference.rms_norm(x, (9,), np.full(9, 1.5), 1e-5), rtol=rtol,
                     atol=atol, what="forward with stride-0 weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("n", [3, 17, 1000])
@pytest.mark.parametrize("layout", list(STRIDED))
def test_backward_strided_operands_are_bit_identical_to_contiguous(layout, n, dtype):
    x = STRIDED[layout](make_rows((5, n), dtype))
    grad_output = STRIDED[layout](make_rows((5, n), dtype, seed=1))
    weight = make_rows((n,), dtype, seed=2)
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5)
    gi_c, gw_c = rmsnorm.backward(np.ascontiguousarray(grad_output), np.ascontiguousarray(x),
                                  weight, 1e-5)
    assert_same_bytes(gi, gi_c, what=f"grad_input on {layout} operands")
    assert_same_bytes(gw, gw_c, what=f"grad_weight on {layout} operands")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("weight_layout", [k for k in STRIDED_WEIGHT if k != "contiguous"])
def test_backward_strided_weight_is_bit_identical_to_contiguous(weight_layout, dtype):
    n = 33
    x = make_rows((5, n), dtype)
    grad_output = make_rows((5, n), dtype, seed=1)
    weight = STRIDED_WEIGHT[weight_layout](make_rows((n,), dtype, seed=2))
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5)
    gi_c, gw_c = rmsnorm.backward(grad_output, x, np.ascontiguousarray(weight), 1e-5)
    assert_same_bytes(gi, gi_c, what=f"grad_input with {weight_layout} weight")
    assert_same_bytes(gw, gw_c, what=f"grad_weight with {weight_layout} weight")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_strided_grad_weight_out_is_bit_identical(dtype):
    x = make_rows((5, 9), dtype)
    grad_output = make_rows((5, 9), dtype, seed=1)
    weight = make_rows((9,), dtype, seed=2)
    gw_out = np.zeros(18, dtype)[::-2]
    gi_out = np.zeros((9, 5), dtype).T
    rmsnorm.backward(grad_output, x, weight, 1e-5, out=(gi_out, gw_out))
    gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5)
    assert_same_bytes(gi_out, gi, what="strided grad_input out")
    assert_same_bytes(gw_out, gw, what="strided grad_weight out")


# ---------------------------------------------------------------------------
# Threads.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2, 3])
def test_set_num_threads_is_read_back(threads, restore_num_threads):
    rmsnorm.set_num_threads(threads)
    assert rmsnorm.get_num_threads() == threads


# Many chunks of rows, and the two chunks of the smallest problem that
# threads share (csrc/kernels/rms_norm.c).
@pytest.mark.parametrize("shape", [(1031, 257), (32, 4096)])
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_results_do_not_depend_on_the_thread_count(dtype, shape, restore_num_threads):
    x = make_rows(shape, dtype)
    grad_output = make_rows(shape, dtype, seed=1)
    weight = make_rows(shape[1:], dtype, seed=2)
    results = []
    for threads in (1, 2, 4):
        rmsnorm.set_num_threads(threads)
        y = rmsnorm.forward(x, weight, 1e-5)
        results.append((y, *rmsnorm.backward(grad_output, x, weight, 1e-5)))
    for threads, other in zip((2, 4), results[1:]):
        for name, a, b in zip(("y", "grad_input", "grad_weight"), other, results[0]):
            assert_same_bytes(a, b, what=f"{name} with {threads} threads vs 1")


# ---------------------------------------------------------------------------
# Instruction sets: every kernel variant this CPU runs gives the same answers.
# ---------------------------------------------------------------------------

def _supported_isas():
    core = rmsnorm._core
    if not hasattr(core, "_isa"):
        return []
    return list(core._isa()[1])


@pytest.fixture
def restore_isa():
    core = rmsnorm._core
    active = core._isa()[0]
    yield core
    core._set_isa(active)


@pytest.mark.skipif(not _supported_isas(), reason="the build exposes no instruction-set switch")
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("isa", _supported_isas() or ["none"])
def test_every_instruction_set_matches_reference_and_its_own_strided_path(isa, dtype, restore_isa):
    restore_isa._set_isa(isa)
    assert restore_isa._isa()[0] == isa
    rtol, atol = reference_tolerance(dtype)
    for n in (1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 1000):
        x = make_rows((3, n), dtype, seed=n)
        grad_output = make_rows((3, n), dtype, seed=n + 1)
        weight = make_rows((n,), dtype, seed=n + 2)
        y = rmsnorm.forward(x, weight, 1e-5)
        assert_close_ulp(y, reference.rms_norm(x, (n,), weight, 1e-5), rtol=rtol, atol=atol,
                         check_dtype=False, what=f"forward on {isa}, n={n}")
        gi, gw = rmsnorm.backward(grad_output, x, weight, 1e-5)
        assert_grads_match_reference(gi, gw, grad_output, x, weight, 1e-5,
                                     what=f" on {isa}, n={n}")
        # The strided path of the same instruction set agrees bit for bit.
        x_strided = column_slice(x)
        assert_same_bytes(rmsnorm.forward(x_strided, weight, 1e-5), y,
                          what=f"strided forward on {isa}, n={n}")
        gi_s, gw_s = rmsnorm.backward(column_slice(grad_output), x_strided, weight, 1e-5)
        assert_same_bytes(gi_s, gi, what=f"strided grad_input on {isa}, n={n}")
        assert_same_bytes(gw_s, gw, what=f"strided grad_weight on {isa}, n={n}")
