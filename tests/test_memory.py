"""The forward and the backward allocate nothing input-sized beyond their outputs.

NumPy reports its array allocations to tracemalloc, so the peak of traced
memory during a call bounds every temporary array the call made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes

ROWS, N = 256, 4096  # 4 MiB of float32: far above any per-row or per-thread scratch
SLACK = 64 * 1024  # Python objects, the cached unit weight, NumPy's bookkeeping


def peak_bytes(call) -> int:
    call()  # warm caches (the unit weight, loop resolution) outside the measurement
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    del result
    return peak


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, N)).astype(np.float32)
    return x, rng.standard_normal(N).astype(np.float32), rng.standard_normal(x.shape).astype(np.float32)


def test_tracemalloc_sees_numpy_allocations():
    # the premise of this file: without it every bound below holds trivially
    assert peak_bytes(lambda: np.empty((ROWS, N), np.float32)) >= ROWS * N * 4


def test_forward_gufunc_with_out_allocates_nothing_input_sized(arrays):
    x, w, _ = arrays
    out = np.empty_like(x)
    assert peak_bytes(lambda: rmsnorm.forward(x, w, np.float32(1e-6), out=out)) < SLACK


def test_backward_gufunc_with_out_allocates_nothing_input_sized(arrays):
    x, w, dy = arrays
    out = (np.empty_like(x), np.empty_like(w))
    assert peak_bytes(lambda: rmsnorm.backward(dy, x, w, np.float32(1e-6), out=out)) < SLACK


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no-weight"])
def test_rms_norm_allocates_only_its_output(arrays, weighted):
    x, w, _ = arrays
    weight = w if weighted else None
    assert peak_bytes(lambda: rmsnorm.rms_norm(x, N, weight, 1e-6)) < x.nbytes + SLACK


def test_rms_norm_over_several_dims_folds_them_without_a_copy(arrays):
    x, _, _ = arrays
    x3 = x.reshape(ROWS, 64, 64)
    assert peak_bytes(lambda: rmsnorm.rms_norm(x3, (64, 64), eps=1e-6)) < x.nbytes + SLACK


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no-weight"])
def test_rms_norm_backward_allocates_only_its_outputs(arrays, weighted):
    x, w, dy = arrays
    weight = w if weighted else None
    peak = peak_bytes(lambda: rmsnorm.rms_norm_backward(dy, x, N, weight, 1e-6))
    assert peak < x.nbytes + w.nbytes + SLACK


@pytest.mark.parametrize("function", ["rms_norm", "rms_norm_backward"])
def test_weightless_calls_make_no_row_of_ones(function):
    """weight=None reaches the kernels as a stride-0 view of one 1: a row of
    ones of the input's length would double a one-row call's memory."""
    n = 1 << 20
    x = np.ones((1, n))
    if function == "rms_norm":
        peak, outputs = peak_bytes(lambda: rmsnorm.rms_norm(x, n)), 1
    else:
        peak, outputs = peak_bytes(lambda: rmsnorm.rms_norm_backward(x, x, n)), 2
    assert peak < outputs * x.nbytes + SLACK


@pytest.mark.parametrize("function", ["rms_norm", "rms_norm_backward"])
def test_weightless_calls_keep_no_memory_once_their_arrays_are_gone(function):
    """weight=None uses a row of ones; no cache keeps rows of a caller's
    size after the call (it kept up to 64 of any size: gigabytes)."""
    def call(n):
        x = np.ones((1, n))
        if function == "rms_norm":
            return rmsnorm.rms_norm(x, n)
        return rmsnorm.rms_norm_backward(x, x, n)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(8):
            result = call((1 << 20) + k)  # 8 MiB of float64 each, each n its own
            del result
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 4 * 1024 * 1024, f"{kept} bytes kept after 8 calls of 8 MiB rows"


# A row of 2^40 elements: x, the weight and the outputs are stride-0 views
# (no memory), but the scratch the kernels ask for (16 TiB or more) is more
# than any machine this runs on can give, so the call must refuse.
HUGE_N = 2**40

# The scratch's bytes an element, as docs/internals.md gives them: the
# backward's 2n doubles (the weight and grad_weight's sum); the float32
# forward's offset + weight as 2n doubles (hi + lo) and 2n floats (its fast
# write's pair).
SCRATCH_BYTES_AN_ELEMENT = {"backward": 2 * 8, "forward_offset": 2 * 8 + 2 * 4}


def _writable_stride_0(shape, dtype):
    base = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=(0,) * len(shape),
                                           writeable=True)


def _overcommits_always() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as setting:
            return setting.read().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(_overcommits_always(), reason="with vm.overcommit_memory=1 malloc gives "
                    "16 TiB, and the kernels would then write through it until the OOM killer")
@pytest.mark.parametrize("function", ["forward_offset", "backward"])
def test_scratch_that_cannot_be_had_raises_a_memory_error_saying_how_much(function):
    x = np.broadcast_to(np.float32(1.0), (1, HUGE_N))
    weight = np.broadcast_to(np.float32(1.0), (HUGE_N,))
    eps = np.float32(1e-6)
    with pytest.raises(MemoryError) as error:
        if function == "forward_offset":
            rmsnorm.forward_offset(x, weight, 1.0, eps, out=_writable_stride_0(x.shape, np.float32))
        else:
            rmsnorm.backward(x, x, weight, eps, out=(_writable_stride_0(x.shape, np.float32),
                                                   _writable_stride_0((HUGE_N,), np.float32)))
    message = str(error.value)
    assert f"{SCRATCH_BYTES_AN_ELEMENT[function] * HUGE_N} bytes" in message, message
    assert f"rows of {HUGE_N} elements" in message and "weight" in message, message


@pytest.mark.skipif(_overcommits_always(), reason="with vm.overcommit_memory=1 malloc gives "
                    "16 TiB, and the kernels would then write through it until the OOM killer")
@pytest.mark.parametrize("threads", [1, 2, 8, 16], ids=lambda t: f"threads={t}")
@pytest.mark.parametrize("rows", [1, 16], ids=lambda r: f"rows={r}")
def test_backward_scratch_is_two_doubles_per_weight_element_whatever_the_threads(
        rows, threads, restore_num_threads):
    """The weight and grad_weight's sum as doubles, and no partial sum of
    the row's length per thread (16 rows of 2^40 make 16 chunks); the bytes
    asked for are what the MemoryError reports."""
    rmsnorm.set_num_threads(threads)
    x = np.broadcast_to(np.float32(1.0), (rows, HUGE_N))
    weight = np.broadcast_to(np.float32(1.0), (HUGE_N,))
    with pytest.raises(MemoryError) as error:
        rmsnorm.backward(x, x, weight, np.float32(1e-6),
                         out=(_writable_stride_0(x.shape, np.float32),
                              _writable_stride_0((HUGE_N,), np.float32)))
    asked = int(str(error.value).split(" bytes")[0].split()[-1])
    assert 2 * HUGE_N * 8 <= asked <= 2 * HUGE_N * 8 * 1.001, str(error.value)


@pytest.mark.parametrize("function", ["forward_offset", "backward"])
def test_scratch_past_any_address_space_raises_a_memory_error(function):
    """A stride-0 float16 row of 2^61 elements (NumPy's limit is 2^63 bytes):
    its scratch size does not fit a size_t."""
    n = 2**61
    x = np.broadcast_to(np.float16(1.0), (1, n))
    weight = np.broadcast_to(np.float16(1.0), (n,))
    with pytest.raises(MemoryError, match="could not allocate"):
        if function == "forward_offset":
            rmsnorm.forward_offset(x, weight, 1.0, np.float16(1e-6),
                                   out=_writable_stride_0(x.shape, np.float16))
        else:
            rmsnorm.backward(x, x, weight, np.float16(1e-6),
                             out=(_writable_stride_0(x.shape, np.float16),
                                  _writable_stride_0((n,), np.float16)))


# An aligned_alloc that refuses one size, preloaded into a child Python: the
# forward's weight scratch (kernels.h, rms_forward_weight_scratch_alloc) is
# at most a few hundred KiB, which no machine refuses on its own.
_REFUSING_ALLOC_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>

long refusals;
static size_t refused_bytes;
static void *(*next_aligned_alloc)(size_t, size_t);

__attribute__((constructor)) static void read_refused_bytes(void)
{
    const char *bytes = getenv("RMSNORM_TEST_REFUSED_BYTES");
    refused_bytes = bytes != NULL ? strtoull(bytes, NULL, 10) : 0;
    next_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
}

void *aligned_alloc(size_t alignment, size_t size)
{
    if (size == refused_bytes && refused_bytes != 0) {
        __atomic_fetch_add(&refusals, 1, __ATOMIC_RELAXED);
        errno = ENOMEM;
        return NULL;
    }
    if (next_aligned_alloc == NULL) { /* called before the constructor ran */
        next_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    }
    return next_aligned_alloc(alignment, size);
}
"""

# In the child: the forward of _weight_scratch_case's arrays at each thread
# count, each result saved, or its MemoryError's message; then how many
# allocations the shim refused.
_REFUSED_FORWARD_CHILD = r"""
import ctypes, json, sys
import numpy as np
import rmsnorm
sys.path.insert(0, sys.argv[1])
from test_memory import _weight_scratch_case
x_dtype, offset, folder = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
call = _weight_scratch_case(x_dtype, offset)
messages = {}
for threads in (1, 2, 3):
    rmsnorm.set_num_threads(threads)
    try:
        np.save(f"{folder}/threads{threads}.npy", call())
    except MemoryError as error:
        messages[threads] = str(error)
refusals = ctypes.c_long.in_dll(ctypes.CDLL(sys.argv[5]), "refusals").value
print(json.dumps({"messages": messages, "refusals": refusals}))
"""

WEIGHT_SCRATCH_ROWS, WEIGHT_SCRATCH_N = 96, 4100  # several chunks a thread


def _weight_scratch_case(x_dtype: str, offset):
    """The forward (with offset where it is not None) of fixed arrays, as a call."""
    rng = np.random.default_rng(40)
    x = rng.standard_normal((WEIGHT_SCRATCH_ROWS, WEIGHT_SCRATCH_N)).astype(x_dtype)
    weight = rng.standard_normal(WEIGHT_SCRATCH_N).astype(x_dtype)
    eps = x.dtype.type(1e-6)
    if offset is None:
        return lambda: rmsnorm.forward(x, weight, eps)
    return lambda: rmsnorm.forward_offset(x, weight, np.float64(offset), eps)


def _weight_scratch_bytes(x_dtype: str, offset) -> tuple[int, int]:
    """(bytes asked of aligned_alloc, bytes an offset's doubles make the
    MemoryError report, 0 where none are needed): floats for 16-bit x and
    two for float32 with an offset; 2n doubles where the offset is not a
    float, or, for float32, where the kernels have no fused multiply-add
    (the baseline's): the float32 pair and the 16-bit floats stand in for
    them."""
    n = WEIGHT_SCRATCH_N
    floats = 1 if np.dtype(x_dtype).itemsize == 2 else 2 if offset is not None else 0
    offset_is_float = offset is not None and float(np.float32(offset)) == offset
    pair_in_floats = x_dtype != "float32" or rmsnorm._core._isa()[0] != "baseline"
    doubles = 2 if offset is not None and not (offset_is_float and pair_in_floats) else 0
    bytes_needed = 4 * floats * n + 8 * doubles * n
    return -(-bytes_needed // 64) * 64, bytes_needed if doubles else 0


@pytest.fixture(scope="module")
def refusing_alloc(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build the refusing aligned_alloc")
    folder = tmp_path_factory.mktemp("refusing_alloc")
    (folder / "refusing_alloc.c").write_text(_REFUSING_ALLOC_C)
    library = folder / "refusing_alloc.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library),
                    str(folder / "refusing_alloc.c"), "-ldl"], check=True)
    return library


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="ASan's aligned_alloc, preloaded first, would hide the shim's")
@pytest.mark.parametrize("x_dtype, offset", [
    ("float16", None),  # the 16-bit write's floats: rows go in double
    ("float32", 1.0),   # float32's offset pair: rows go in double (doubles on the baseline)
    ("float16", 0.1),   # floats and doubles: a MemoryError
    ("float32", 0.1),
], ids=lambda v: repr(v))
def test_weight_scratch_refused_gives_the_same_bytes_or_a_memory_error(
        refusing_alloc, tmp_path, x_dtype, offset):
    """Refused the weight's scratch, the forward writes its rows another way
    where only floats were asked for, and raises a MemoryError naming the
    bytes where an offset's doubles were, at any thread count: never a
    crash (a thread that failed once read a NULL weight on its next chunk)."""
    asked, reported = _weight_scratch_bytes(x_dtype, offset)
    env = dict(os.environ, LD_PRELOAD=str(refusing_alloc),
               RMSNORM_TEST_REFUSED_BYTES=str(asked))
    child = subprocess.run(
        [sys.executable, "-c", _REFUSED_FORWARD_CHILD, str(Path(__file__).parent), x_dtype,
         json.dumps(offset), str(tmp_path), str(refusing_alloc)],
        env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, f"the child exited {child.returncode}: {child.stderr[-3000:]}"
    report = json.loads(child.stdout.splitlines()[-1])
    assert report["refusals"] >= 3, f"no scratch of {asked} bytes was asked for: {report}"
    expected = _weight_scratch_case(x_dtype, offset)()
    for threads in ("1", "2", "3"):
        if reported:
            message = report["messages"].get(threads, "no MemoryError")
            assert f"{reported} bytes" in message, f"{threads} threads: {message}"
        else:
            assert threads not in report["messages"], report["messages"][threads]
            assert_same_bytes(np.load(tmp_path / f"threads{threads}.npy"), expected,
                              what=f"{threads} threads, scratch refused")
