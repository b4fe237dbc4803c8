"""Backward rows longer than the tile of grad_weight's partial sums.

Past one chunk of rows, each thread sums its chunk's grad_weight into a
partial on its stack of at most 4096 columns (RMS_TILE_COLUMNS in
csrc/kernels/rms_norm.c), so that the scratch does not grow with the thread
count. Longer rows are reduced first and then written a tile at a time.
Every row's grad_input must be the bytes the row gives alone, whichever way
it was written (plain, through infinities, past the range of double), and
grad_weight the same bytes at any thread count.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes
from supported_dtypes import DTYPES

TILE = 4096
# rows x n: 15 rows a chunk (two chunks), 7 a chunk, and one row a chunk;
# none of the lengths a multiple of a vector
SHAPES = [(20, TILE + 1), (9, 2 * TILE + 5), (8, 17 * TILE + 3)]
VARIANTS = ["plain", "residual", "offset", "strided"]


def eps_of(dtype, value):
    return np.float64(value) if dtype == np.float64 else np.float32(value)


def make_problem(shape, dtype, seed=0):
    rng = np.random.default_rng([seed, *shape])
    x = rng.standard_normal(shape).astype(dtype)
    grad_output = rng.standard_normal(shape).astype(dtype)
    weight = rng.uniform(-1.5, 1.5, shape[1]).astype(dtype)
    grad_residual = rng.standard_normal(shape).astype(dtype)
    return x, grad_output, weight, grad_residual


def backward(variant, grad_output, x, weight, eps, grad_residual):
    """(grad_input, grad_weight) of one variant of the backward gufunc."""
    if variant == "residual":
        return rmsnorm.add_backward(grad_output, grad_residual, x, weight, eps)
    if variant == "offset":
        return rmsnorm.backward_offset(grad_output, x, weight, 1.0, eps)
    if variant == "strided":
        # every row operand read element by element, not as contiguous rows
        x_strided = np.repeat(x, 2, axis=1)[:, ::2]
        grad_output_strided = np.repeat(grad_output, 2, axis=1)[:, ::2]
        return rmsnorm.backward(grad_output_strided, x_strided, weight, eps)
    return rmsnorm.backward(grad_output, x, weight, eps)


def with_special_rows(x, grad_output, dtype):
    """Rows that take each write path other than the plain vector one."""
    x, grad_output = x.copy(), grad_output.copy()
    x[1] = 0  # mean(x^2) + eps is eps
    grad_output[2, 5] = np.inf  # one infinity: only the elements it touches
    x[3, 7] = np.nan
    if dtype == np.float64:
        x[4] *= 2.0**-1040  # a subnormal row: inv_rms past double's range
        grad_output[5] *= 2.0**-1060  # every g w x underflows
        x[6] *= 2.0**1000  # sum(g w x) past 2^900
    return x, grad_output


def row_by_row(variant, grad_output, x, weight, eps, grad_residual):
    """grad_input, each row computed alone (one row: one chunk, no tiles)."""
    return np.concatenate([
        backward(variant, grad_output[r:r + 1], x[r:r + 1], weight, eps,
                 grad_residual[r:r + 1])[0]
        for r in range(x.shape[0])
    ])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_grad_input_of_a_long_row_is_the_bytes_it_gives_alone(isa, shape, dtype, variant):
    x, grad_output, weight, grad_residual = make_problem(shape, dtype)
    x, grad_output = with_special_rows(x, grad_output, dtype)
    eps = eps_of(dtype, 0.0 if dtype == np.float64 else 1e-6)
    with np.errstate(all="ignore"):
        grad_input = backward(variant, grad_output, x, weight, eps, grad_residual)[0]
        alone = row_by_row(variant, grad_output, x, weight, eps, grad_residual)
    assert_same_bytes(grad_input, alone, what="grad_input")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_infinite_eps_zeroes_every_tile(isa, dtype, variant):
    # eps = +inf makes inv_rms 0: grad_input is 0 (plus grad_residual_out)
    x, grad_output, weight, grad_residual = make_problem(SHAPES[1], dtype)
    eps = eps_of(dtype, np.inf)
    grad_input, grad_weight = backward(variant, grad_output, x, weight, eps, grad_residual)
    expected = grad_residual if variant == "residual" else np.zeros_like(x)
    np.testing.assert_array_equal(grad_input.astype(np.float64), expected.astype(np.float64))
    np.testing.assert_array_equal(grad_weight.astype(np.float64), 0.0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_grad_weight_of_long_rows_is_the_same_bytes_at_any_thread_count(
        isa, shape, dtype, variant, restore_num_threads):
    # rows enough for several chunks per thread, so that threads commit
    # tiles out of step
    rows = 4 * shape[0]
    x, grad_output, weight, grad_residual = make_problem((rows, shape[1]), dtype, seed=1)
    eps = eps_of(dtype, 1e-6)
    results = {}
    for threads in (1, 2, 3, 8):
        rmsnorm.set_num_threads(threads)
        grad_input, grad_weight = backward(variant, grad_output, x, weight, eps, grad_residual)
        results[threads] = grad_input, grad_weight
    for threads in (2, 3, 8):
        assert_same_bytes(results[threads][0], results[1][0],
                          what=f"grad_input, {threads} threads vs 1")
        assert_same_bytes(results[threads][1], results[1][1],
                          what=f"grad_weight, {threads} threads vs 1")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_grad_weight_of_long_rows_is_the_sum_over_rows(isa, shape, dtype):
    # against the sum of grad_output * x_hat in float64: every column of
    # every tile gains every row once
    x, grad_output, weight, _ = make_problem(shape, dtype, seed=2)
    grad_weight = rmsnorm.backward(grad_output, x, weight, eps_of(dtype, 1e-6))[1]
    x64, grad_output64 = x.astype(np.float64), grad_output.astype(np.float64)
    x_hat = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-6)
    terms = grad_output64 * x_hat
    expected = terms.sum(axis=0)
    # rounded once to the dtype, plus the double sum's error, which is far less
    bound = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64) + \
        1e-12 * np.abs(terms).sum(axis=0)
    assert np.all(np.abs(grad_weight.astype(np.float64) - expected) <= bound)
