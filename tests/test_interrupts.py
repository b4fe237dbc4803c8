"""A KeyboardInterrupt during a long loop of calls leaves the module usable.

Python runs signal handlers between bytecodes, so the interrupt lands
between two calls or right after one returns, while the kernels' pool
threads may still be winding down. Afterwards every entry point must give
the same bytes as before, on one thread and on several.

In this process the interrupt comes from SIGALRM (a handler raising
KeyboardInterrupt, leaving pytest's own SIGINT handling alone); a
subprocess gets a real SIGINT from outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import rmsnorm
from closeness import assert_same_bytes

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))


def problem():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((256, 4096)).astype(np.float32)
    weight = rng.standard_normal(4096).astype(np.float32)
    grad = rng.standard_normal((256, 4096)).astype(np.float32)
    return x, weight, grad


def everything(x, weight, grad):
    """Every entry point's results on one problem."""
    layer = rmsnorm.RMSNorm(x.shape[1], eps=1e-5)
    layer.weight[...] = weight
    results = [
        rmsnorm.forward(x, weight, np.float32(1e-5)),
        *rmsnorm.backward(grad, x, weight, np.float32(1e-5)),
        rmsnorm.rms_norm(x, x.shape[1], weight, 1e-5),
        *rmsnorm.rms_norm_backward(grad, x, x.shape[1], weight, 1e-5),
        layer(x),
        layer.backward(grad),
    ]
    return results


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.parametrize("delay", [0.013, 0.05, 0.2], ids=lambda d: f"after_{d}s")
def test_keyboard_interrupt_in_a_loop_of_calls_leaves_the_module_usable(delay,
                                                                       restore_num_threads):
    rmsnorm.set_num_threads(2)
    x, weight, grad = problem()
    expected = everything(x, weight, grad)
    previous = signal.signal(signal.SIGALRM, _raise_keyboard_interrupt)
    interrupted, calls = False, 0
    try:
        signal.setitimer(signal.ITIMER_REAL, delay)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rmsnorm.forward(x, weight, np.float32(1e-5))
            rmsnorm.backward(grad, x, weight, np.float32(1e-5))
            rmsnorm.rms_norm(x, 4096, weight)
            calls += 1
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted, f"no interrupt arrived in {calls} loops"
    for threads in (1, 2, 3):
        rmsnorm.set_num_threads(threads)
        for index, (result, before) in enumerate(zip(everything(x, weight, grad), expected)):
            assert_same_bytes(result, before, what=f"result {index} on {threads} threads")


CHILD = textwrap.dedent("""\
    import signal, sys, time
    import numpy as np
    import rmsnorm

    # A process started in the background of a shell inherits SIGINT
    # ignored, and Python then leaves it so: take Python's own handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    rng = np.random.default_rng(9)
    x = rng.standard_normal((256, 4096)).astype(np.float32)
    weight = rng.standard_normal(4096).astype(np.float32)
    grad = rng.standard_normal((256, 4096)).astype(np.float32)
    rmsnorm.set_num_threads(2)

    def results():
        y = rmsnorm.forward(x, weight, np.float32(1e-5))
        grad_input, grad_weight = rmsnorm.backward(grad, x, weight, np.float32(1e-5))
        return y.tobytes() + grad_input.tobytes() + grad_weight.tobytes()

    expected = results()
    try:
        print("looping", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            results()
        print("never interrupted", flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
    assert results() == expected, "results changed after the interrupt"
    rmsnorm.set_num_threads(1)
    assert results() == expected, "results changed on one thread"
    print("usable", flush=True)
""")


def test_real_sigint_in_a_subprocess_leaves_the_module_usable():
    env = dict(os.environ,
               PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=PACKAGE_PARENT)
    try:
        assert child.stdout.readline().strip() == "looping", child.stderr.read()
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, f"exit {child.returncode}: {out}{err}"
    assert out.strip().endswith("usable"), out + err
