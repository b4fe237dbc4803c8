"""rmsnorm on dask arrays: lazy, block by block, the same bytes as NumPy.

``rmsnorm.forward`` is a real gufunc, so dask's ``Array.__array_ufunc__``
hands it to ``dask.array.apply_gufunc``; ``rms_norm`` and ``RMSNorm`` pass
duck arrays through to it untouched. Every test runs on dask's local
threaded scheduler, so blocks also run concurrently through the C thread
pool. Each row is computed alone and the kernels give the same bytes for any
thread count, so a dask result must be bit-identical to the eager NumPy one.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes
from lazy_sources import lazy
from supported_dtypes import NUMPY_DTYPES

da = pytest.importorskip("dask.array", reason="dask[array] is optional (pip install rmsnorm[dask])")
dask = pytest.importorskip("dask")


@pytest.fixture(autouse=True)
def threaded_scheduler():
    with dask.config.set(scheduler="threads", num_workers=4):
        yield

def assert_computed_same_bytes(actual, expected, what):
    """A computed dask result is a NumPy array with the eager result's bytes."""
    assert isinstance(actual, np.ndarray), f"{what}: computed to {type(actual)}"
    assert_same_bytes(actual, expected, what=what)


def make(shape, dtype, seed=0):
    return np.random.default_rng([seed, *shape]).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# The gufunc.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape, chunks", [
    ((64, 33), (7, 33)),            # rows in uneven blocks
    ((6, 10, 128), (4, 3, 128)),    # two batch dimensions, both chunked
    ((5, 1000), (1, -1)),           # one row a block
], ids=str)
def test_forward_on_dask_array_is_lazy_and_matches_numpy(shape, chunks, dtype):
    x = make(shape, dtype)
    weight = make(shape[-1:], dtype, seed=1)
    eps = dtype(1e-5)
    dx, source = lazy(x, chunks)

    y = rmsnorm.forward(dx, weight, eps)

    assert isinstance(y, da.Array), f"forward returned {type(y)}, not a dask array"
    assert source.reads == 0, "forward read its input before compute()"
    assert y.dtype == dtype
    assert y.chunks == dx.chunks, "the result should be chunked as the input"
    assert_computed_same_bytes(y.compute(), rmsnorm.forward(x, weight, eps), "forward on dask")
    assert source.reads == dx.npartitions, "each block should be read exactly once"


def test_forward_takes_weight_and_eps_as_dask_arrays():
    x = make((12, 16), np.float32)
    weight = make((16,), np.float32, seed=1)
    eps = np.linspace(1e-6, 1e-2, 12, dtype=np.float32)  # one eps per row
    y = rmsnorm.forward(da.from_array(x, chunks=(5, 16)), da.from_array(weight),
                        da.from_array(eps, chunks=5))
    assert isinstance(y, da.Array)
    assert_computed_same_bytes(y.compute(), rmsnorm.forward(x, weight, eps),
                               "forward, all dask operands")


def test_forward_takes_axes_on_dask_arrays():
    # axes= moves the core dimension, as for NumPy; dask transposes the blocks.
    x = make((16, 9), np.float64)
    weight = make((16,), np.float64, seed=1)
    dx = da.from_array(x, chunks=(16, 4))
    axes = [(0,), (0,), (), (0,)]
    y = rmsnorm.forward(dx, weight, 1e-6, axes=axes)
    assert isinstance(y, da.Array) and y.chunks == dx.chunks
    assert_computed_same_bytes(y.compute(), rmsnorm.forward(x, weight, 1e-6, axes=axes),
                               "forward over axis 0 on dask")


def test_dask_drops_dtype_given_to_a_gufunc():
    # A fact about dask, not rmsnorm, pinned here because the functional
    # layer must not rely on it: apply_gufunc hands dtype= to blockwise, which
    # takes it for itself, so the blocks never see it, and the graph claims
    # one dtype while computing another. (signature= fails outright: it
    # collides with apply_gufunc's own signature argument.)
    dx = da.from_array(make((8, 4), np.float64), chunks=(2, 4))
    y = rmsnorm.forward(dx, np.ones(4), 1e-6, dtype=np.float32)
    assert y.dtype == np.float32
    assert y.compute().dtype == np.float64


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_dtype_probe_builds_the_graph_quietly(dtype):
    # Without output_dtypes, dask learns the result dtype by calling the
    # gufunc on a one-element, zero-filled block. With eps=0 that row is 0/0:
    # the probe must neither raise nor warn, and must give the input's dtype.
    dx = da.zeros((8, 4), dtype=dtype, chunks=(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = rmsnorm.forward(dx, np.ones(4, dtype), dtype(0.0))
        grad_input, grad_weight = rmsnorm.backward(
            dx.reshape(4, 2, 4).rechunk((1, 2, 4)), dx.reshape(4, 2, 4).rechunk((1, 2, 4)),
            np.ones(4, dtype), dtype(0.0))
    assert (y.dtype, grad_input.dtype, grad_weight.dtype) == (dtype, dtype, dtype)
    assert np.isnan(y.compute()).all()


@pytest.mark.parametrize("call", ["forward", "rms_norm", "RMSNorm"])
def test_core_dimension_in_several_chunks_is_a_clear_error(call):
    x = make((6, 32), np.float32)
    split = da.from_array(x, chunks=(3, 16))
    functions = {
        "forward": lambda a: rmsnorm.forward(a, np.ones(32, np.float32), np.float32(1e-6)),
        "rms_norm": lambda a: rmsnorm.rms_norm(a, 32),
        "RMSNorm": lambda a: rmsnorm.RMSNorm(32)(a),
    }
    with pytest.raises(ValueError, match=r"(?i)core dimension.*multiple chunks.*rechunk"):
        functions[call](split)
    # The fix the message gives: one chunk along the core dimension.
    y = functions[call](split.rechunk({1: -1}))
    assert_computed_same_bytes(y.compute(), functions[call](x), f"{call} after rechunk")


def test_backward_gufunc_on_dask_blocks_of_rows():
    # (m,n) is the core: a block holds whole (m, n) matrices, and grad_weight
    # comes back per matrix, chunked as the loop dimension.
    grad = make((6, 5, 8), np.float64, seed=1)
    x = make((6, 5, 8), np.float64)
    weight = make((8,), np.float64, seed=2)
    chunks = (2, 5, 8)
    grad_input, grad_weight = rmsnorm.backward(
        da.from_array(grad, chunks=chunks), da.from_array(x, chunks=chunks), weight, 1e-6)
    assert isinstance(grad_input, da.Array) and isinstance(grad_weight, da.Array)
    assert grad_weight.chunks == ((2, 2, 2), (8,))
    expected_input, expected_weight = rmsnorm.backward(grad, x, weight, 1e-6)
    computed_input, computed_weight = dask.compute(grad_input, grad_weight)
    assert_computed_same_bytes(computed_input, expected_input, "grad_input on dask")
    assert_computed_same_bytes(computed_weight, expected_weight, "grad_weight on dask")


# ---------------------------------------------------------------------------
# The functional and module layers.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("normalized_shape, chunks", [
    (24, (3, 2, 24)),
    ((5, 24), (3, 5, 24)),          # two normalised dims: folded by reshape
], ids=str)
@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("eps", [None, 1e-3], ids=lambda e: f"eps={e}")
def test_rms_norm_on_dask_array_is_lazy_and_matches_numpy(
        normalized_shape, chunks, with_weight, eps, dtype):
    x = make((7, 5, 24), dtype)
    shape = normalized_shape if isinstance(normalized_shape, tuple) else (normalized_shape,)
    weight = make(shape, dtype, seed=1) if with_weight else None
    dx, source = lazy(x, chunks)

    y = rmsnorm.rms_norm(dx, normalized_shape, weight, eps)

    assert isinstance(y, da.Array), f"rms_norm returned {type(y)}: it must not call np.asarray"
    assert source.reads == 0, "rms_norm read its input before compute()"
    assert y.shape == x.shape and y.dtype == dtype
    assert y.chunks[0] == dx.chunks[0], "the result should stay chunked along the batch"
    assert_computed_same_bytes(y.compute(), rmsnorm.rms_norm(x, normalized_shape, weight, eps),
                               "rms_norm on dask")


@pytest.mark.parametrize("x_dtype, weight_dtype", [
    pytest.param(np.float32, np.float64, id="float32-input-float64-weight"),
    pytest.param(np.float64, np.float32, id="float64-input-float32-weight"),
    pytest.param(np.float16, np.float32, id="float16-input-float32-weight"),
])
def test_rms_norm_on_dask_keeps_the_input_dtype_with_a_weight_of_another(x_dtype, weight_dtype):
    # torch's contract: the output has the input's dtype, whatever the
    # weight's, and mixed precision uses the weight as it is.
    x = make((6, 8), x_dtype)
    weight = make((8,), weight_dtype, seed=1)
    y = rmsnorm.rms_norm(da.from_array(x, chunks=(2, 8)), 8, weight, 1e-5)
    assert y.dtype == x_dtype
    assert_computed_same_bytes(y.compute(), rmsnorm.rms_norm(x, 8, weight, 1e-5),
                               "rms_norm on dask, mixed dtypes")


def test_rms_norm_backward_on_dask_keeps_the_input_dtype_with_a_float64_grad():
    x = make((6, 8), np.float32)
    grad = make((6, 8), np.float64, seed=1)
    weight = np.ones(8, np.float32)
    grads = rmsnorm.rms_norm_backward(da.from_array(grad), da.from_array(x), 8, weight, 1e-5)
    expected = rmsnorm.rms_norm_backward(grad, x, 8, weight, 1e-5)
    for name, lazy_grad, eager_grad in zip(["grad_input", "grad_weight"], grads, expected):
        assert lazy_grad.dtype == np.float32
        assert_computed_same_bytes(lazy_grad.compute(), eager_grad,
                                   f"{name} on dask, float64 grad_output")


def test_rms_norm_checks_shapes_before_building_a_graph():
    dx = da.zeros((4, 8), dtype=np.float32, chunks=(2, 8))
    with pytest.raises(ValueError, match="expected input with shape"):
        rmsnorm.rms_norm(dx, 7)
    with pytest.raises(TypeError, match="int32"):
        rmsnorm.rms_norm(dx.astype(np.int32), 8)


def test_rmsnorm_layer_forward_on_dask_array_is_lazy():
    x = make((10, 3, 16), np.float32)
    layer = rmsnorm.RMSNorm(16, eps=1e-6)
    layer.weight[:] = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    dx, source = lazy(x, (4, 3, 16))
    y = layer(dx)
    assert isinstance(y, da.Array) and source.reads == 0
    assert_computed_same_bytes(y.compute(), layer(x), "RMSNorm on dask")


def test_rms_norm_backward_on_dask_array_with_rows_in_one_chunk():
    # rms_norm_backward sums grad_weight over every row inside one gufunc
    # call, so all rows form its core dimension m: lazy when the batch
    # dimensions are one chunk, and the same clear error when they are not.
    x = make((4, 3, 16), np.float32)
    grad = make((4, 3, 16), np.float32, seed=1)
    weight = make((16,), np.float32, seed=2)
    one_chunk = dict(chunks=(4, 3, 16))
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        da.from_array(grad, **one_chunk), da.from_array(x, **one_chunk), 16, weight, 1e-6)
    assert isinstance(grad_input, da.Array) and isinstance(grad_weight, da.Array)
    expected_input, expected_weight = rmsnorm.rms_norm_backward(grad, x, 16, weight, 1e-6)
    computed_input, computed_weight = dask.compute(grad_input, grad_weight)
    assert_computed_same_bytes(computed_input, expected_input,
                               "rms_norm_backward grad_input on dask")
    assert_computed_same_bytes(computed_weight, expected_weight,
                               "rms_norm_backward grad_weight on dask")

    split = dict(chunks=(2, 3, 16))
    with pytest.raises(ValueError, match=r"(?i)core dimension.*multiple chunks"):
        rmsnorm.rms_norm_backward(
            da.from_array(grad, **split), da.from_array(x, **split), 16, weight, 1e-6)


# ---------------------------------------------------------------------------
# Out of core: only a few blocks are ever in memory.
# ---------------------------------------------------------------------------

def test_forward_streams_an_array_through_memory_block_by_block():
    rows, hidden, block_rows = 16384, 1024, 256          # 64 MiB of float32, 1 MiB blocks
    total_bytes = rows * hidden * 4
    x = da.random.default_rng(0).standard_normal(
        (rows, hidden), chunks=(block_rows, hidden), dtype=np.float32)
    weight = np.ones(hidden, np.float32)
    out = np.empty((rows, hidden), np.float32)   # the destination, allocated up front

    y = rmsnorm.forward(x, weight, np.float32(1e-6))
    tracemalloc.start()
    try:
        da.store(y, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # 4 workers, each holding an input and an output block, and some slack.
    assert peak < total_bytes / 4, (
        f"peak memory {peak / 2**20:.1f} MiB while normalising {total_bytes / 2**20:.0f} MiB: "
        "the array was materialised instead of streamed")
    rms = np.sqrt(np.mean(out[::1000].astype(np.float64) ** 2, axis=1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-5)
