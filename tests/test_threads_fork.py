"""Threads and fork: the same bytes from any number of callers and threads,
and a forked child that computes correctly.

The shapes are large enough for the kernels' thread pool to take part
(256 x 4096 = 1M elements a call), so these tests exercise the pool: its
hand-off between Python callers, its deterministic grad_weight sum, and its
re-creation in a forked child.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes
from supported_dtypes import DTYPE_PAIRS, WIDE_DTYPES

SHAPE = (256, 4096)
SECONDS = 1.0


def problem(dtype, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(dtype)
    weight = rng.standard_normal(SHAPE[1]).astype(dtype)
    grad = rng.standard_normal(SHAPE).astype(dtype)
    return x, weight, grad, dtype(1e-5)


def run_both(x, weight, grad, eps):
    """forward's y, backward's grad_input and grad_weight."""
    y = rmsnorm.forward(x, weight, eps)
    grad_input, grad_weight = rmsnorm.backward(grad, x, weight, eps)
    return y, grad_input, grad_weight


def assert_same_results(got, expected, where):
    """run_both's three results, each the same bytes as expected's."""
    for name, one, other in zip(("y", "grad_input", "grad_weight"), got, expected):
        assert_same_bytes(one, other, what=f"{name} {where}")


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"threads={n}")
def with_threads(request, restore_num_threads):
    rmsnorm.set_num_threads(request.param)
    return request.param


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_one_two_and_three_threads_give_the_same_bytes(dtype, restore_num_threads):
    args = problem(dtype)
    results = {}
    for threads in (1, 2, 3):
        rmsnorm.set_num_threads(threads)
        assert rmsnorm.get_num_threads() == threads
        results[threads] = run_both(*args)
    for threads in (2, 3):
        assert_same_results(results[threads], results[1], f"on {threads} threads vs 1")


# No offset; one that is a float (float32 adds it in floats); one that is
# not (it adds it in doubles).
OFFSETS = [None, 1.0, 0.1]


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("dtype, weight_dtype", DTYPE_PAIRS)
def test_the_weight_made_by_each_thread_gives_one_threads_bytes(
        dtype, weight_dtype, offset, restore_num_threads):
    # Where threads share a call, each makes the weight as the kernels read
    # it for itself: the forward's 16-bit weight as floats and its offset +
    # weight, the backward's offset + weight as doubles. With one thread,
    # the calling thread makes it once.
    x, _, grad, _ = problem(dtype)
    weight = np.random.default_rng(4).standard_normal(SHAPE[1]).astype(weight_dtype)
    eps = np.asarray(1e-5).astype(np.float64 if dtype == np.float64 else np.float32)[()]
    residual = np.random.default_rng(5).standard_normal(SHAPE).astype(dtype)

    def results():
        if offset is None:
            return (rmsnorm.forward(x, weight, eps), *rmsnorm.add_forward(x, residual, weight, eps),
                    *rmsnorm.backward(grad, x, weight, eps))
        return (rmsnorm.forward_offset(x, weight, offset, eps),
                *rmsnorm.add_forward_offset(x, residual, weight, offset, eps),
                *rmsnorm.backward_offset(grad, x, weight, offset, eps))

    by_threads = {}
    for threads in (1, 2, 3):
        rmsnorm.set_num_threads(threads)
        by_threads[threads] = results()
    names = ("y", "fused y", "residual_out", "grad_input", "grad_weight")
    for threads in (2, 3):
        for name, got, expected in zip(names, by_threads[threads], by_threads[1]):
            assert_same_bytes(got, expected, what=f"{name} on {threads} threads vs 1")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_four_python_threads_at_once_give_one_threads_bytes(dtype, with_threads):
    args = problem(dtype)
    expected = run_both(*args)
    start = threading.Barrier(4)
    deadline = time.monotonic() + SECONDS
    failures, calls = [], [0] * 4

    def caller(index):
        start.wait()
        while time.monotonic() < deadline and not failures:
            got = run_both(*args)
            calls[index] += 1
            try:
                assert_same_results(got, expected, f"in thread {index}, call {calls[index]}")
            except AssertionError as failure:
                failures.append(str(failure))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a caller hung"
    assert not failures, failures[0]
    assert all(count >= 1 for count in calls), f"calls per thread: {calls}"


@pytest.mark.parametrize("gufunc", ["forward", "backward"])
def test_kernels_release_the_gil(gufunc, restore_num_threads):
    # A Python thread ticks while the main thread is inside one long call.
    # Had the call kept the GIL, no tick could land inside it: with a long
    # switch interval the main thread gives the GIL up only when it asks to.
    rmsnorm.set_num_threads(1)
    x, weight, grad, eps = problem(np.float64)
    x, grad = np.tile(x, (8, 1)), np.tile(grad, (8, 1))  # tens of ms a call
    call = ((lambda: rmsnorm.forward(x, weight, eps)) if gufunc == "forward"
            else (lambda: rmsnorm.backward(grad, x, weight, eps)))
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    thread = threading.Thread(target=ticker)
    try:
        thread.start()
        time.sleep(0.01)  # the main thread now holds a fresh GIL
        began = time.perf_counter()
        call()
        ended = time.perf_counter()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    inside = sum(began < tick < ended for tick in ticks)
    assert inside > 100, f"{inside} ticks in a {1e3 * (ended - began):.0f} ms call"


# ---------------------------------------------------------------------------
# Fork. The pool's threads do not exist in a forked child; the pool must
# forget them there and start new ones, and the child must not wait on a
# lock that a parent's thread held at the fork.
# ---------------------------------------------------------------------------

FORK = multiprocessing.get_context("fork")
CHILD_TIMEOUT = 60


def _child_computes(queue, dtype, threads):
    try:
        rmsnorm.set_num_threads(threads)
        queue.put(("ok", run_both(*problem(dtype))))
    except BaseException as error:  # report anything, never hang the parent
        queue.put(("error", repr(error)))


def _run_in_child(dtype, threads):
    queue = FORK.Queue()
    child = FORK.Process(target=_child_computes, args=(queue, dtype, threads))
    child.start()
    try:
        status, payload = queue.get(timeout=CHILD_TIMEOUT)
    except Exception:
        status, payload = "timeout", f"no answer from the child in {CHILD_TIMEOUT} s"
    child.join(timeout=10)
    if child.is_alive():
        child.kill()
        child.join()
    assert status == "ok", payload
    assert child.exitcode == 0, f"child exit code {child.exitcode}"
    return payload


@pytest.mark.parametrize("child_threads", [1, 2], ids=lambda n: f"child_threads={n}")
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_child_forked_after_the_pool_ran_computes_correctly(dtype, child_threads,
                                                            restore_num_threads):
    rmsnorm.set_num_threads(2)
    expected = run_both(*problem(dtype))  # the pool's workers now exist
    assert_same_results(_run_in_child(dtype, child_threads), expected, "in the child")
    assert_same_results(run_both(*problem(dtype)), expected, "in the parent after the fork")


def test_child_forked_while_another_thread_uses_the_pool(restore_num_threads):
    # Forks land at random points of a busy pool: a lock may be held, a task
    # half done. Each child must still compute correctly on its own.
    rmsnorm.set_num_threads(2)
    args = problem(np.float32)
    expected = run_both(*args)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            run_both(*args)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        for _ in range(3):
            time.sleep(0.05)
            assert_same_results(_run_in_child(np.float32, 2), expected, "in the child")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
