"""Every kernel path gives the same answer: instruction sets, streamed stores, threads."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes, ulp_distance
from supported_dtypes import DTYPE_PAIRS, DTYPES, NUMPY_DTYPES, WIDE_DTYPES

SUPPORTED_ISAS = rmsnorm._core._isa()[1]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 64, 1000, 4099])
def test_every_instruction_set_is_within_one_ulp_of_the_baseline(isa, dtype, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((5, n)).astype(dtype)
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    dy = rng.standard_normal((5, n)).astype(dtype)
    rmsnorm._core._set_isa("baseline")
    expected = rmsnorm.rms_norm(x, n, w, 1e-6)
    expected_grads = rmsnorm.rms_norm_backward(dy, x, n, w, 1e-6)
    rmsnorm._core._set_isa(isa)
    assert rmsnorm._core._isa()[0] == isa
    assert np.max(ulp_distance(rmsnorm.rms_norm(x, n, w, 1e-6), expected, dtype)) <= 1
    for ours, baseline in zip(rmsnorm.rms_norm_backward(dy, x, n, w, 1e-6), expected_grads):
        # gradients: within 1 ULP of the tensor's largest element (they cancel)
        scale = np.spacing(np.max(np.abs(baseline)).astype(dtype)).astype(np.float64)
        assert np.max(np.abs(ours.astype(np.float64) - baseline.astype(np.float64))) <= scale


def test_rmsnorm_isa_environment_variable_forces_the_baseline_kernels():
    code = "import rmsnorm; print(rmsnorm._core._isa()[0])"
    env = dict(os.environ, RMSNORM_ISA="baseline")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "baseline"


def test_rmsnorm_isa_cannot_ask_for_more_than_the_cpu_has():
    # An unknown name leaves the widest instruction set this CPU runs (not
    # the active one, which RMSNORM_ISA may have narrowed for this very run).
    env = dict(os.environ, RMSNORM_ISA="no-such-isa")
    out = subprocess.run([sys.executable, "-c", "import rmsnorm; print(rmsnorm._core._isa()[0])"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == SUPPORTED_ISAS[-1]


@pytest.mark.parametrize("threads", [1, 2], ids=lambda n: f"threads={n}")
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_outputs_too_large_for_cache_give_the_same_bytes_as_small_calls(dtype, threads,
                                                                        restore_num_threads):
    # Past 16 MiB the kernels write with non-temporal stores, and ask for the
    # rows ahead (past each chunk's end, on one thread); row by row the
    # arithmetic must not change. 4099 columns also leave rows unaligned.
    rmsnorm.set_num_threads(threads)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1100 if dtype == np.float32 else 550, 4099)).astype(dtype)
    w = rng.uniform(0.5, 1.5, 4099).astype(dtype)
    eps = dtype(1e-6)
    assert x.nbytes >= 16 << 20
    y = rmsnorm.forward(x, w, eps)
    grad_input, grad_weight = rmsnorm.backward(x, x, w, eps)
    pieces = range(0, x.shape[0], 100)
    small_y = [rmsnorm.forward(x[i:i + 100], w, eps) for i in pieces]
    small_grad_input = [rmsnorm.backward(x[i:i + 100], x[i:i + 100], w, eps)[0] for i in pieces]
    assert_same_bytes(y, np.concatenate(small_y), what="y")
    assert_same_bytes(grad_input, np.concatenate(small_grad_input), what="grad_input")
    np.testing.assert_allclose(grad_weight, sum(rmsnorm.backward(x[i:i + 100], x[i:i + 100], w, eps)[1]
                                                for i in pieces), rtol=1e-5)


@pytest.mark.parametrize(("x_dtype", "w_dtype"),
                         [(x, w) for x, w in DTYPE_PAIRS if x in NUMPY_DTYPES])  # all but bfloat16
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 4099])
def test_a_row_gives_the_same_bytes_alone_as_among_others(x_dtype, w_dtype, n):
    # Contiguous rows reduce the next row while writing this one; one row
    # alone, and strided rows, do not. None of that may show in the bytes.
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((6, n)) * rng.uniform(0.1, 10.0, (6, 1))).astype(x_dtype)
    w = rng.uniform(0.5, 1.5, n).astype(w_dtype)
    eps = np.float64(1e-6) if x_dtype == np.float64 else np.float32(1e-6)
    together = rmsnorm.forward(x, w, eps)
    alone = np.stack([rmsnorm.forward(row, w, eps) for row in x])
    strided_x = np.zeros((6, 2 * n), x_dtype)[:, ::2]
    strided_x[...] = x
    strided_y = np.zeros((6, 2 * n), x_dtype)[:, ::2]
    rmsnorm.forward(strided_x, w, eps, out=strided_y)
    assert_same_bytes(alone, together, what="rows one at a time")
    assert_same_bytes(strided_y, together, what="strided rows")


def _at_byte_offset(shape: tuple[int, ...], dtype: type, offset: int) -> np.ndarray:
    """An empty C-contiguous array whose data starts `offset` bytes past a
    64-byte boundary, in a buffer of 0xA5 bytes that reaches 64 bytes
    either side of it."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buffer = np.full(size + 256, 0xA5, np.uint8)
    start = -buffer.ctypes.data % 64 + 64 + offset
    return buffer[start:start + size].view(dtype).reshape(shape)


def _bytes_around(array: np.ndarray) -> np.ndarray:
    """The bytes of _at_byte_offset's buffer outside `array`."""
    buffer = array.base.base if array.base.base is not None else array.base
    start = array.ctypes.data - buffer.ctypes.data
    return np.concatenate([buffer[:start], buffer[start + array.nbytes:]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 60])
@pytest.mark.parametrize("shape", [(3, 301), (5, 1552)], ids=str)
def test_where_the_arrays_lie_in_memory_changes_no_byte(dtype, offset, shape):
    # Write passes go element by element, or with masked moves, until the
    # output reaches a vector's alignment, and a row's last block is partial
    # too; float32 rows of 1552 columns (a whole number of 64-byte lines)
    # are also written four rows and 1024 columns at a time. None of that may
    # show in the results, or write a byte outside the outputs.
    rng = np.random.default_rng(offset)
    x, dy, dh = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    w = rng.uniform(0.5, 1.5, shape[1]).astype(dtype)
    eps = np.float64(1e-6) if dtype == np.float64 else np.float32(1e-6)
    expected = rmsnorm.forward(x, w, eps)
    expected_grads = rmsnorm.backward(dy, x, w, eps)
    expected_fused = rmsnorm.add_backward(dy, dh, x, w, eps)

    moved = {}
    for name, value in (("x", x), ("dy", dy), ("dh", dh)):
        moved[name] = _at_byte_offset(shape, dtype, offset)
        moved[name][...] = value
    y, grad_input, fused_grad_input = (_at_byte_offset(shape, dtype, offset) for _ in range(3))
    rmsnorm.forward(moved["x"], w, eps, out=y)
    grad_weight, fused_grad_weight = np.empty_like(w), np.empty_like(w)
    rmsnorm.backward(moved["dy"], moved["x"], w, eps, out=(grad_input, grad_weight))
    rmsnorm.add_backward(moved["dy"], moved["dh"], moved["x"], w, eps,
                         out=(fused_grad_input, fused_grad_weight))
    assert_same_bytes(y, expected, what="y")
    assert_same_bytes(grad_input, expected_grads[0], what="grad_input")
    assert_same_bytes(grad_weight, expected_grads[1], what="grad_weight")
    assert_same_bytes(fused_grad_input, expected_fused[0], what="fused grad_input")
    assert_same_bytes(fused_grad_weight, expected_fused[1], what="fused grad_weight")
    for output in (y, grad_input, fused_grad_input):
        assert (_bytes_around(output) == 0xA5).all()


@pytest.mark.parametrize(("x_dtype", "w_dtype"), DTYPE_PAIRS)
@pytest.mark.parametrize("shape", [(7,), (1, 4096), (3, 5), (2, 3, 70), (0, 4)], ids=str)
def test_rms_norms_direct_call_gives_the_gufuncs_bytes(x_dtype, w_dtype, shape):
    # rms_norm skips the ufunc machinery for plain arrays; it runs the same
    # loop, so the result must be the gufunc's, dtype and layout included.
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(x_dtype)
    w = rng.uniform(0.5, 1.5, shape[-1]).astype(w_dtype)
    eps = np.float64(1e-6) if np.dtype(x_dtype) == np.float64 else np.float32(1e-6)
    direct = rmsnorm._core._forward_direct(x, w, eps)
    expected = rmsnorm.forward(x, w, eps)
    assert direct is not None
    assert direct.dtype == expected.dtype and direct.flags.c_contiguous
    assert_same_bytes(direct, expected, what="direct call")


class _Subclass(np.ndarray):
    pass


_F32 = np.ones((2, 8), np.float32)
_W32 = np.ones(8, np.float32)
_EPS32 = np.float32(1e-6)


@pytest.mark.parametrize("args", [
    pytest.param((_F32[:, ::2], _W32[::2], _EPS32), id="strided x"),
    pytest.param((_F32.T.copy().T, _W32, _EPS32), id="fortran x"),
    pytest.param((_F32.astype(">f4"), _W32, _EPS32), id="byte-swapped x"),
    pytest.param((_F32, _W32.astype(">f4"), _EPS32), id="byte-swapped weight"),
    pytest.param((_F32.view(_Subclass), _W32, _EPS32), id="subclass x"),
    pytest.param((_F32, _W32.astype(np.float16), _EPS32), id="no loop for the weight dtype"),
    pytest.param((_F32, np.ones(7, np.float32), _EPS32), id="weight of another length"),
    pytest.param((_F32, np.ones((1, 8), np.float32), _EPS32), id="2-d weight"),
    pytest.param((_F32, _W32, 1e-6), id="python float eps"),
    pytest.param((_F32, _W32, np.float64(1e-6)), id="eps of another dtype"),
    pytest.param((_F32, _W32, np.array(1e-6, np.float32)), id="0-d array eps"),
    pytest.param((np.ones((2, 0), np.float32), np.ones(0, np.float32), _EPS32), id="empty rows"),
    pytest.param((np.float32(1.0), _W32, _EPS32), id="scalar x"),
    pytest.param((_F32.tolist(), _W32, _EPS32), id="list x"),
])
def test_rms_norms_direct_call_leaves_everything_else_to_the_gufunc(args):
    assert rmsnorm._core._forward_direct(*args) is None
