"""The caller's floating-point environment does not change the results.

Flush-to-zero and denormals-are-zero (``torch.set_flush_denormal(True)``, or
any library that sets them on the calling thread) and a rounding mode other
than to nearest (``fesetround``) leave every output the same bytes as in the
default environment, at one thread and at two: the kernels set the mode they
need on each thread that runs them and restore the caller's after, exception
flags included.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import rmsnorm
from closeness import assert_same_bytes
from rmsnorm._dtypes import BF16
from supported_dtypes import DTYPE_NAMES

ROWS, N = 512, 1024  # enough rows for the pool to share them between threads
SMALLEST_SUBNORMAL = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149,
                      "float64": 2.0**-1074}


def _subnormal_rows(dtype: str) -> np.ndarray:
    """Rows of the dtype's subnormals (odd multiples of the smallest one),
    every other row ordinary numbers, for x and for grad_output alike."""
    numpy_dtype = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    tiny = SMALLEST_SUBNORMAL[dtype]
    rng = np.random.default_rng(7)
    steps = rng.integers(-31, 32, size=(ROWS, N)) | 1
    values = steps * tiny
    values[1::2] = rng.standard_normal((ROWS // 2, N))
    return values.astype(numpy_dtype)


@contextmanager
def _flush_denormals():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode for torch to set")
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@contextmanager
def _rounding_upward():
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("FE_UPWARD's value is x86's here")
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    fe_upward, fe_tonearest = 0x800, 0
    assert libm.fesetround(fe_upward) == 0
    try:
        yield
    finally:
        libm.fesetround(fe_tonearest)


ENVIRONMENTS = {"flush_to_zero": _flush_denormals, "rounding_upward": _rounding_upward}


def _outputs(operation: str, x: np.ndarray, weight: np.ndarray, threads: int) -> list[np.ndarray]:
    """Made in the environment under test: nothing here but rmsnorm's calls
    (NumPy's own conversions would round or flush by the mode too)."""
    rmsnorm.set_num_threads(threads)
    if operation == "forward":
        return [rmsnorm.rms_norm(x, N, weight)]
    return list(rmsnorm.rms_norm_backward(x[::-1], x, N, weight))


def test_torch_really_flushes_subnormals_here():
    """The premise: with the mode on, NumPy's own arithmetic flushes."""
    tiny = np.array([np.finfo(np.float32).smallest_subnormal] * 4, np.float32)
    with _flush_denormals():
        assert not np.any(tiny * np.float32(1.0)), "flush-to-zero had no effect"


@pytest.mark.parametrize("environment", ENVIRONMENTS)
@pytest.mark.parametrize("operation", ["forward", "backward"])
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_results_are_the_default_environments_bytes_at_any_thread_count(
        environment, operation, dtype, isa, restore_num_threads):
    x = _subnormal_rows(dtype)
    weight = np.linspace(0.5, 2.0, N).astype(x.dtype)
    expected = _outputs(operation, x, weight, threads=1)
    with ENVIRONMENTS[environment]():
        seen = {threads: _outputs(operation, x, weight, threads) for threads in (1, 2)}
    for threads, outputs in seen.items():
        for index, (output, expected_output) in enumerate(zip(outputs, expected)):
            assert_same_bytes(output, expected_output, what=f"output {index} under "
                              f"{environment}, {threads} thread(s), on {isa}")


def test_the_callers_mode_is_given_back_after_a_call(restore_num_threads):
    x = _subnormal_rows("float32")
    tiny = np.array([SMALLEST_SUBNORMAL["float32"]] * 4, np.float32)
    with _flush_denormals():
        for threads in (1, 2):
            _outputs("forward", x, np.ones(N, np.float32), threads)
            _outputs("backward", x, np.ones(N, np.float32), threads)
            assert not np.any(tiny * np.float32(1.0)), f"flush-to-zero lost at {threads} threads"


FE_DIVBYZERO, FE_OVERFLOW, FE_ALL_EXCEPT = 0x04, 0x08, 0x3D  # x86's values


@pytest.mark.parametrize("threads", [1, 2])
def test_the_callers_exception_flags_are_given_back_as_they_were(threads, restore_num_threads):
    """Through rmsnorm.torch's raw-buffer path, where NumPy neither clears
    nor reads the flags: a flag the caller had stays raised, and the overflow
    of the kernels' own intermediate squares (rows near 1e200, whose
    squares pass DBL_MAX before the rescaled sum replaces them) does not
    reach the caller."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the FE_ flags' values are x86's here")
    import rmsnorm.torch

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    x = torch.full((64, 4096), 1e200, dtype=torch.float64)
    rmsnorm.set_num_threads(threads)
    libm.feclearexcept(FE_ALL_EXCEPT)
    libm.feraiseexcept(FE_DIVBYZERO)
    y = rmsnorm.torch.rms_norm(x, [4096], eps=1e-6)
    flags = libm.fetestexcept(FE_ALL_EXCEPT)
    libm.feclearexcept(FE_ALL_EXCEPT)
    assert torch.equal(y, torch.ones_like(x)), "the test's premise: an exact, finite result"
    assert flags & (FE_DIVBYZERO | FE_OVERFLOW) == FE_DIVBYZERO, f"flags after the call: {flags:#x}"
