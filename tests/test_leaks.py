"""No leaks: memory stays flat over many calls, arguments keep their
reference counts, and the error paths leak no more than the good ones.

Resident memory is read from /proc/self/statm (Linux only), after a warm-up
that fills NumPy's and the allocator's caches, and the heap in use from
glibc's mallinfo2 where there is one: the second sees a leak of a few bytes
a call, which resident memory (rounded to pages and shared with everything
else in the process) would miss.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

import numpy as np
import pytest

import rmsnorm

CALLS = 30_000
RSS_BUDGET = 2 * 1024 * 1024  # bytes over CALLS calls
HEAP_BUDGET = 256 * 1024  # bytes over CALLS calls: less than 9 bytes a call
REFCOUNT_CALLS = 1_000

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                reason="reads resident memory from /proc/self/statm")

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _heap_in_use():
    """Bytes glibc's malloc has handed out and not had back, or None."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name)
    if not hasattr(libc, "mallinfo2") or UNDER_ASAN:
        return None  # no mallinfo2 (old glibc, musl), or ASan owns malloc
    libc.mallinfo2.restype = _Mallinfo2

    def in_use() -> int:
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd
    return in_use


heap_in_use = _heap_in_use()

# ---------------------------------------------------------------------------
# The entry points, each with small arguments made once. Every public name
# of rmsnorm is here, and a few calls that raise, since error paths are
# where references are most often dropped.
# ---------------------------------------------------------------------------

RNG = np.random.default_rng(11)
X = RNG.standard_normal((4, 64)).astype(np.float32)
X64 = RNG.standard_normal((4, 64))
WEIGHT = RNG.standard_normal(64).astype(np.float32)
GRAD = RNG.standard_normal((4, 64)).astype(np.float32)
EPS = np.float32(1e-5)
OUT = np.empty_like(X)
GRAD_WEIGHT_OUT = np.empty_like(WEIGHT)
INT_X = np.ones((4, 64), np.int64)
LAYER = rmsnorm.RMSNorm(64)
LAYER_EMPTY = rmsnorm.RMSNorm(64)
GEMMA_LAYER = rmsnorm.RMSNorm(64, weight_offset=1.0)
RESIDUAL = RNG.standard_normal((4, 64)).astype(np.float32)
RESIDUAL_OUT = np.empty_like(X)


def _raises(call):
    def run():
        try:
            call()
        except (TypeError, ValueError):
            return
        raise AssertionError("expected an error")
    return run


def _layer_round_trip():
    LAYER(X)
    LAYER.backward(GRAD)
    LAYER.zero_grad()


def _residual_layer_round_trip():
    GEMMA_LAYER(X, RESIDUAL)
    GEMMA_LAYER.backward(GRAD, GRAD)
    GEMMA_LAYER.zero_grad()


ENTRY_POINTS = {
    "forward": lambda: rmsnorm.forward(X, WEIGHT, EPS),
    "forward_out": lambda: rmsnorm.forward(X, WEIGHT, EPS, out=OUT),
    "forward_float64": lambda: rmsnorm.forward(X64, np.ones(64), 1e-5),
    "backward": lambda: rmsnorm.backward(GRAD, X, WEIGHT, EPS),
    "backward_out": lambda: rmsnorm.backward(GRAD, X, WEIGHT, EPS, out=(OUT, GRAD_WEIGHT_OUT)),
    "rms_norm": lambda: rmsnorm.rms_norm(X, 64, WEIGHT, 1e-5),
    "rms_norm_no_weight": lambda: rmsnorm.rms_norm(X, (64,)),
    "rms_norm_backward": lambda: rmsnorm.rms_norm_backward(GRAD, X, 64, WEIGHT, 1e-5),
    "add_forward": lambda: rmsnorm.add_forward(X, RESIDUAL, WEIGHT, EPS),
    "add_forward_out": lambda: rmsnorm.add_forward(X, RESIDUAL, WEIGHT, EPS,
                                                   out=(OUT, RESIDUAL_OUT)),
    "add_backward": lambda: rmsnorm.add_backward(GRAD, GRAD, X, WEIGHT, EPS),
    "forward_offset": lambda: rmsnorm.forward_offset(X, WEIGHT, 1.0, EPS),
    "backward_offset": lambda: rmsnorm.backward_offset(GRAD, X, WEIGHT, 1.0, EPS),
    "add_forward_offset": lambda: rmsnorm.add_forward_offset(X, RESIDUAL, WEIGHT, 1.0, EPS),
    "add_backward_offset": lambda: rmsnorm.add_backward_offset(GRAD, GRAD, X, WEIGHT, 1.0, EPS),
    "add_rms_norm": lambda: rmsnorm.add_rms_norm(X, RESIDUAL, 64, WEIGHT, 1e-5,
                                                 weight_offset=1.0),
    "add_rms_norm_backward": lambda: rmsnorm.add_rms_norm_backward(GRAD, GRAD, X, 64, WEIGHT),
    "rms_norm_weight_offset": lambda: rmsnorm.rms_norm(X, 64, WEIGHT, weight_offset=1.0),
    "RMSNorm_forward_backward": _layer_round_trip,
    "RMSNorm_residual_forward_backward": _residual_layer_round_trip,
    "RMSNorm_state_dict": lambda: LAYER.load_state_dict(LAYER.state_dict()),
    "RMSNorm_repr": lambda: repr(LAYER),
    "get_num_threads": rmsnorm.get_num_threads,
    "set_num_threads": lambda: rmsnorm.set_num_threads(rmsnorm.get_num_threads()),
    "error_forward_int_dtype_gufunc": _raises(lambda: rmsnorm.forward(
        X, WEIGHT, EPS, out=INT_X)),
    "error_rms_norm_dtype": _raises(lambda: rmsnorm.rms_norm(INT_X, 64)),
    "error_rms_norm_shape": _raises(lambda: rmsnorm.rms_norm(X, 65)),
    "error_add_rms_norm_residual_dtype": _raises(lambda: rmsnorm.add_rms_norm(X, X64, 64)),
    "error_add_rms_norm_out_overlap": _raises(lambda: rmsnorm.add_rms_norm(
        X, RESIDUAL, 64, out=(OUT, OUT))),
    "error_weight_offset_type": _raises(lambda: rmsnorm.rms_norm(
        X, 64, WEIGHT, weight_offset="1")),
    "error_backward_shape": _raises(lambda: rmsnorm.rms_norm_backward(X[:2], X, 64)),
    "error_module_backward": _raises(lambda: LAYER_EMPTY.backward(GRAD)),
    "error_set_num_threads": _raises(lambda: rmsnorm.set_num_threads(0)),
    "error_set_num_threads_type": _raises(lambda: rmsnorm.set_num_threads("2")),
}


def test_every_public_name_has_an_entry_point():
    callables = {name for name in rmsnorm.__all__
                 if callable(getattr(rmsnorm, name)) and not name.startswith("_")}
    covered = {key.split("_")[0] if key.startswith("RMSNorm") else key for key in ENTRY_POINTS}
    assert callables <= covered, f"not leak-tested: {sorted(callables - covered)}"


@pytest.mark.skipif(UNDER_ASAN, reason="ASan's quarantine keeps freed memory resident; "
                    "LeakSanitizer checks the same run for leaks instead")
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_30000_calls_keep_memory_flat(name, restore_num_threads):
    call = ENTRY_POINTS[name]
    for _ in range(2_000):  # warm-up: NumPy's caches, the allocator's free lists
        call()
    gc.collect()
    rss_before = resident_bytes()
    heap_before = heap_in_use() if heap_in_use else 0
    for _ in range(CALLS):
        call()
    gc.collect()
    rss_growth = resident_bytes() - rss_before
    assert rss_growth < RSS_BUDGET, (
        f"{name}: resident memory grew by {rss_growth / 1024:.0f} KiB over {CALLS} calls")
    if heap_in_use:
        heap_growth = heap_in_use() - heap_before
        assert heap_growth < HEAP_BUDGET, (
            f"{name}: the malloc heap grew by {heap_growth} bytes over {CALLS} calls "
            f"({heap_growth / CALLS:.1f} bytes a call)")


def _counted_arguments():
    """Fresh arguments, so that no other reference moves their counts."""
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    return {
        "x": x,
        "weight": RNG.standard_normal(64).astype(np.float32),
        "grad": RNG.standard_normal((4, 64)).astype(np.float32),
        "eps_scalar": np.float32(1e-5),
        "eps_float": float("1e-5"),
        "out": np.empty_like(x),
        "grad_weight_out": np.empty(64, np.float32),
        "normalized_shape": (64,),
        "threads": int("1000"),  # not one of the small ints Python caches
    }


def _error_rms_norm_shape(a):
    try:
        rmsnorm.rms_norm(a["x"], (65,), a["weight"])
    except ValueError:
        pass


def _error_forward_out_shape(a):
    try:
        rmsnorm.forward(a["x"], a["weight"], a["eps_scalar"], out=a["grad_weight_out"])
    except ValueError:
        pass


def _error_set_num_threads(a):
    try:
        rmsnorm.set_num_threads(-a["threads"])
    except ValueError:
        pass


REFCOUNT_CALLS_BY_NAME = {
    "forward": lambda a: rmsnorm.forward(a["x"], a["weight"], a["eps_scalar"]),
    "forward_out": lambda a: rmsnorm.forward(a["x"], a["weight"], a["eps_scalar"], out=a["out"]),
    "backward": lambda a: rmsnorm.backward(a["grad"], a["x"], a["weight"], a["eps_scalar"]),
    "backward_out": lambda a: rmsnorm.backward(a["grad"], a["x"], a["weight"], a["eps_scalar"],
                                               out=(a["out"], a["grad_weight_out"])),
    "rms_norm": lambda a: rmsnorm.rms_norm(a["x"], a["normalized_shape"], a["weight"],
                                           a["eps_float"]),
    "rms_norm_backward": lambda a: rmsnorm.rms_norm_backward(
        a["grad"], a["x"], a["normalized_shape"], a["weight"], a["eps_float"]),
    "set_num_threads": lambda a: rmsnorm.set_num_threads(a["threads"]),
    "error_rms_norm_shape": _error_rms_norm_shape,
    "error_forward_out_shape": _error_forward_out_shape,
    "error_set_num_threads": _error_set_num_threads,
}


@pytest.mark.parametrize("name", list(REFCOUNT_CALLS_BY_NAME))
def test_argument_refcounts_unchanged_after_1000_calls(name, restore_num_threads):
    call = REFCOUNT_CALLS_BY_NAME[name]
    arguments = _counted_arguments()
    call(arguments)  # any first-call caching happens here
    gc.collect()
    before = {key: sys.getrefcount(value) for key, value in arguments.items()}
    functions = {key: sys.getrefcount(getattr(rmsnorm, key))
                 for key in ("forward", "backward", "rms_norm", "rms_norm_backward")}
    for _ in range(REFCOUNT_CALLS):
        call(arguments)
    gc.collect()
    after = {key: sys.getrefcount(value) for key, value in arguments.items()}
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    assert not changed, f"{name}: reference counts (before, after) changed: {changed}"
    functions_after = {key: sys.getrefcount(getattr(rmsnorm, key)) for key in functions}
    assert functions_after == functions, f"{name}: the gufuncs' own counts changed"
