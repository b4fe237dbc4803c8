"""Speed of rmsnorm beside onnxruntime, torch.compile, torch, a NumPy composite and a copy.

    python benchmarks/bench.py               # full run, writes results.md and results.png
    python benchmarks/bench.py --quick       # a few repeats, to see that it runs
    python benchmarks/bench.py --only fused  # one section, printed, no files
    python benchmarks/bench.py --only torch  # rmsnorm.torch beside torch, printed, no files
    python benchmarks/bench.py --only offset # forward with weight_offset beside without

The peers are optional and each column reads n/a without its package. Install
them with ``pip install -e ".[bench]"`` (onnxruntime, onnx and matplotlib for
the plot); torch comes with the test extra, ``pip install -e ".[test]"``, which
pins the CPU build the tests target, and bfloat16 needs ml_dtypes
(``pip install -e ".[bfloat16]"``).

RMSNorm is memory-bound: the forward reads x and writes y, the traffic of a
copy of x, so ``np.copyto`` of the same bytes is the yardstick. Every
candidate is timed in the same process, interleaved repeat by repeat so that
noise from a shared machine hits them alike, and the median over repeats is
reported after a warm-up, as a ratio to the copy and as achieved GB/s.

The peers: onnxruntime runs the ONNX ``RMSNormalization`` operator (opset 23)
into an output bound in advance; ``torch.compile`` compiles
``torch.nn.functional.rms_norm`` with inductor for each shape, dtype and thread
count, and allocates its output on every call, as torch's functional API does.
torch.compile keeps its cache under the system's temporary directory, never in
this tree (TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, unless already set).

A second section times the fused residual add of a pre-norm block on one
thread: ``add_forward`` reads x and the residual and writes y and h, the
traffic of two copies of x, so two ``np.copyto`` calls are its yardstick,
beside ``np.add`` followed by ``forward``; ``add_backward`` is timed beside
``backward`` followed by ``np.add`` of the residual's gradient. The fused
outputs are checked against the unfused ones before anything is timed.

A third section times ``rmsnorm.torch.rms_norm`` (the custom op, its eager
shortcuts included) on one thread beside eager ``torch.nn.functional.rms_norm``
and ``torch.compile`` of it, on torch tensors: the forward under ``no_grad``,
and the forward plus autograd's backward. Its outputs and gradients are
checked against eager torch's first.

A fourth section times the forward with a weight offset (Gemma's 1 + weight)
beside the plain forward on one thread, at the first section's shapes: both
gufuncs with ``out=``, interleaved, and their ratio.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rmsnorm

try:
    # Before torch is imported: its compile cache and temporary files go under
    # the system's temporary directory, not into the project tree.
    _TORCH_CACHE = Path(tempfile.gettempdir()) / "rmsnorm-bench-torch-cache"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_TORCH_CACHE / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(_TORCH_CACHE / "triton"))
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters as dynamo_counters
except ImportError:  # the benchmark still runs, without the torch columns
    torch = None
else:
    # One compile per shape, dtype and thread count: none may fall back to
    # eager silently, so a compile limit that is hit raises instead.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 1024
    torch._dynamo.config.fail_on_recompile_limit_hit = True

try:
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper
except ImportError:  # the onnxruntime column reads n/a
    onnx = onnxruntime = None

try:
    import ml_dtypes
except ImportError:  # the bfloat16 rows are skipped
    ml_dtypes = None

HERE = Path(__file__).resolve().parent
EPS = 1e-6

# (rows, hidden, dtype): a decoding step, a short prompt, a batch, a big batch.
SHAPES = [
    (1, 4096, "float32"),
    (32, 4096, "float32"),
    (2048, 4096, "float32"),
    (4096, 8192, "float32"),
    (2048, 4096, "float64"),
    (32, 4096, "float16"),
    (2048, 4096, "float16"),
    (4096, 8192, "float16"),
    (32, 4096, "bfloat16"),
    (2048, 4096, "bfloat16"),
    (4096, 8192, "bfloat16"),
]
# The torch section's rows, on 1 thread: a decoding step and a batch, the
# shapes its goals name. bfloat16 needs no ml_dtypes here.
TORCH_SHAPES = [(rows, 4096, dtype) for dtype in ("float32", "bfloat16") for rows in (1, 2048)]
# The fused residual-add section's rows, on 1 thread: its goals are for these.
FUSED_SHAPES = [(rows, hidden, dtype) for dtype in ("float32", "float16", "bfloat16")
                for rows, hidden in ((2048, 4096), (4096, 8192))]
# The weight offset section's rows, on 1 thread: the first section's shapes.
OFFSET_SHAPES = SHAPES
# Gemma's: the factor is 1 + weight.
WEIGHT_OFFSET = 1.0
# Shapes this large take seconds per call for the slow candidates (the NumPy
# composite, torch eager in half precision): they run --large-repeats repeats.
LARGE = 4096 * 8192

# The peers that rows are judged against, forward, fastest one wins.
PEERS = ("onnxruntime", "torch.compile", "torch")

# Why a peer is n/a for a dtype, printed once and repeated under the table.
PEER_NOTES: dict[tuple[str, str], str] = {}


def note_peer(peer: str, dtype: str, reason: str) -> None:
    if (peer, dtype) not in PEER_NOTES:
        PEER_NOTES[peer, dtype] = reason
        print(f"{peer}, {dtype}: n/a: {reason}", flush=True)


def resolve_dtype(name: str):
    if name == "bfloat16":
        return ml_dtypes.bfloat16 if ml_dtypes is not None else None
    return np.dtype(name).type


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def sample_seconds(fn, min_seconds: float) -> float:
    """Seconds per call of fn, over enough calls to last min_seconds."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or calls >= 1 << 20:
            return elapsed / calls
        calls *= 2 if elapsed <= 0 else max(2, int(min_seconds / elapsed * 1.2))


def busy_cpu_seconds() -> float:
    """CPU-seconds the whole machine has spent busy (steal included), per Linux's /proc/stat."""
    try:
        ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def other_load(measure, *args):
    """measure(*args), and how many CPUs other processes kept busy meanwhile, on average.

    This machine may be shared: where others take a CPU, the threads here
    wait for it, and the figures with them.
    """
    before = busy_cpu_seconds(), sum(os.times()[:2]), time.perf_counter()
    result = measure(*args)
    after = busy_cpu_seconds(), sum(os.times()[:2]), time.perf_counter()
    others = (after[0] - before[0]) - (after[1] - before[1])
    return result, max(0.0, others / (after[2] - before[2]))


def interleaved_medians(candidates: dict, repeats: int, min_seconds: float) -> dict:
    for fn in candidates.values():  # warm-up: caches, page faults, thread start
        sample_seconds(fn, min_seconds / 4)
    samples = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            samples[name].append(sample_seconds(fn, min_seconds))
    return {name: statistics.median(values) for name, values in samples.items()}


def time_row(forward: dict, both: dict, repeats: int, min_seconds: float):
    # Inference code enters no_grad once, around the model, not per call.
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        fwd = interleaved_medians(forward, repeats, min_seconds)
    return fwd, interleaved_medians(both, repeats, min_seconds)


def numpy_forward(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS) * w


def numpy_forward_backward(x, w, dy):
    inv_rms = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS)
    x_hat = x * inv_rms
    y = x_hat * w
    g = dy * w
    dx = inv_rms * (g - x_hat * np.mean(g * x_hat, -1, keepdims=True))
    dw = np.sum(dy * x_hat, axis=0)
    return y, dx, dw


PAGE = 4096


def at_page_offset(shape: tuple[int, ...], dtype, offset: int) -> np.ndarray:
    """An empty array whose data starts `offset` bytes into a page."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buffer = np.empty(nbytes + 2 * PAGE, np.uint8)
    start = -buffer.ctypes.data % PAGE + offset
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def page_aligned(values: np.ndarray, offset: int = 0) -> np.ndarray:
    """A copy of ``values`` whose data starts on a page boundary (or
    ``offset`` bytes past one).

    Where an output starts a little past an input in their pages, loads wait
    on stores they do not depend on (4K aliasing; benchmarks/aliasing.py
    measures it). Where NumPy's allocator puts each array depends on the
    heap's history, so every array here starts on a page: the figures then
    do not move with it, for any candidate.
    """
    aligned = at_page_offset(values.shape, values.dtype, offset)
    aligned[...] = values
    return aligned


def split_copy(pool, threads: int, dst: np.ndarray, src: np.ndarray):
    """``np.copyto`` of src into dst, cut in `threads` pieces run at once.

    NumPy copies without the GIL, so this measures the memory bandwidth
    `threads` threads get from a plain copy: the yardstick for how well the
    kernels scale with threads.
    """
    pieces = list(zip(np.array_split(dst.reshape(-1), threads),
                      np.array_split(src.reshape(-1), threads)))
    return lambda: [f.result() for f in [pool.submit(np.copyto, d, s) for d, s in pieces]]


def assert_close(peer: str, got: np.ndarray, want: np.ndarray, addends=None) -> None:
    """Loosely, in float32: a peer that computes something else is not timed.

    Where got is a sum its peer rounds twice, once per addend, addends (the
    sum of their magnitudes) widens the absolute tolerance to match: near
    cancellation a rounded addend is off by far more than the sum's ulp.
    """
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    atol = 1e-2 if addends is None else 1e-2 * (1 + np.asarray(addends, np.float32))
    if not np.allclose(got, want, rtol=1e-2, atol=atol):
        worst = float(np.max(np.abs(got - want)))
        raise AssertionError(f"{peer}'s output differs from rmsnorm's (max abs diff {worst:.3g})")


def to_torch(a: np.ndarray):
    """A tensor sharing a's memory; bfloat16 through its uint16 bits."""
    if ml_dtypes is not None and a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_to_numpy_f32(t) -> np.ndarray:
    return t.detach().float().numpy()


def torch_graph_count() -> int:
    return dynamo_counters["stats"]["unique_graphs"]


ONNX_TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "BFLOAT16"}


def onnxruntime_forward(x: np.ndarray, w: np.ndarray, threads: int, want: np.ndarray):
    """A callable running ONNX RMSNormalization (opset 23) on x and w.

    It writes into a preallocated, page-aligned output bound with IO binding
    where onnxruntime takes that, else it calls ``run``. Raises what
    onnxruntime raises where it has no kernel for the dtype.
    """
    rows, hidden = x.shape
    elem = getattr(TensorProto, ONNX_TYPES[x.dtype.name])
    graph = helper.make_graph(
        [helper.make_node("RMSNormalization", ["X", "scale"], ["Y"],
                          axis=-1, epsilon=EPS, stash_type=1)],
        "rms_norm",
        [helper.make_tensor_value_info("X", elem, [rows, hidden]),
         helper.make_tensor_value_info("scale", elem, [hidden])],
        [helper.make_tensor_value_info("Y", elem, [rows, hidden])],
    )
    opsets = [helper.make_opsetid("", 23)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])

    def ort_value(a: np.ndarray):
        if a.dtype.name == "bfloat16":  # ml_dtypes': onnxruntime takes its bits
            return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), elem)
        return onnxruntime.OrtValue.ortvalue_from_numpy(a)

    y = page_aligned(np.zeros_like(x))
    try:
        binding = session.io_binding()
        binding.bind_ortvalue_input("X", ort_value(x))
        binding.bind_ortvalue_input("scale", ort_value(w))
        out = ort_value(y)
        binding.bind_ortvalue_output("Y", out)
        session.run_with_iobinding(binding)
        if out.data_ptr() != y.ctypes.data:
            raise RuntimeError("the bound output is not the preallocated array")
        assert_close("onnxruntime", y, want)
        return lambda: session.run_with_iobinding(binding)
    except AssertionError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure: fall back to run, which allocates
        note_peer("onnxruntime IO binding", x.dtype.name, f"{type(error).__name__}: {error}")
    feeds = {"X": x, "scale": w}
    assert_close("onnxruntime", session.run(["Y"], feeds)[0], want)
    return lambda: session.run(["Y"], feeds)


def candidates_for(rows, hidden, dtype, threads, pool):
    rng = np.random.default_rng(0)
    x = page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
    w = page_aligned(rng.standard_normal(hidden).astype(dtype))
    dy = page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
    eps = np.float64(EPS) if dtype == np.float64 else np.float32(EPS)
    y, dx, scratch = (page_aligned(np.zeros_like(x)) for _ in range(3))
    dw = page_aligned(np.zeros_like(w))
    rmsnorm.set_num_threads(threads)
    want = rmsnorm.forward(x, w, eps, out=y).copy()  # what every peer must match
    name = np.dtype(dtype).name

    forward = {
        "copy": lambda: np.copyto(scratch, x),
        "ours (gufunc, out=)": lambda: rmsnorm.forward(x, w, eps, out=y),
        "ours (rms_norm)": lambda: rmsnorm.rms_norm(x, [hidden], w, EPS),
        "numpy": lambda: numpy_forward(x, w),
    }
    if threads > 1:
        forward[f"copy on {threads} threads"] = split_copy(pool, threads, scratch, x)
    both = {
        "copy": lambda: np.copyto(scratch, x),
        "ours (backward gufunc, out=)": lambda: rmsnorm.backward(dy, x, w, eps, out=(dx, dw)),
        "ours (rms_norm + backward)": lambda: (
            rmsnorm.rms_norm(x, [hidden], w, EPS),
            rmsnorm.rms_norm_backward(dy, x, [hidden], w, EPS),
        ),
        "numpy": lambda: numpy_forward_backward(x, w, dy),
    }
    if onnxruntime is None:
        note_peer("onnxruntime", "all dtypes", 'not installed (pip install -e ".[bench]")')
    else:
        try:
            forward["onnxruntime"] = onnxruntime_forward(x, w, threads, want)
        except AssertionError:
            raise
        except Exception as error:  # noqa: BLE001 - no kernel, bad type...: the cell is n/a
            note_peer("onnxruntime", name, f"{type(error).__name__}: {error}")
    if torch is None:
        note_peer("torch and torch.compile", "all dtypes", "not installed")
    else:
        torch.set_num_threads(threads)
        tx, tw, tdy = (to_torch(a) for a in (x, w, dy))
        tx_grad = tx.clone().requires_grad_()
        tw_grad = tw.clone().requires_grad_()

        def torch_forward():  # timed under no_grad (see main)
            torch.nn.functional.rms_norm(tx, [hidden], tw, EPS)

        def torch_forward_backward():
            tx_grad.grad = None
            tw_grad.grad = None
            torch.nn.functional.rms_norm(tx_grad, [hidden], tw_grad, EPS).backward(tdy)

        forward["torch"] = torch_forward
        both["torch"] = torch_forward_backward

        # inductor's C++ kernels bake in torch.get_num_threads() at compile
        # time, and dynamo's guards do not look at it: start afresh, so that
        # each thread count gets its own compile.
        torch._dynamo.reset()
        compiled = torch.compile(torch.nn.functional.rms_norm, dynamic=False, fullgraph=True)
        graphs = torch_graph_count()
        with torch.no_grad():
            assert_close("torch.compile", torch_to_numpy_f32(compiled(tx, [hidden], tw, EPS)), want)
        compiled_grad = torch.compile(torch.nn.functional.rms_norm, dynamic=False, fullgraph=True)
        tx_grad.grad = tw_grad.grad = None
        compiled_grad(tx_grad, [hidden], tw_grad, EPS).backward(tdy)
        rmsnorm.backward(dy, x, w, eps, out=(dx, dw))
        assert_close("torch.compile's backward", torch_to_numpy_f32(tx_grad.grad), dx)
        if torch_graph_count() != graphs + 2:
            raise RuntimeError("torch.compile did not compile one graph per function")

        def compiled_forward():  # timed under no_grad, as it was compiled
            compiled(tx, [hidden], tw, EPS)

        def compiled_forward_backward():
            tx_grad.grad = None
            tw_grad.grad = None
            compiled_grad(tx_grad, [hidden], tw_grad, EPS).backward(tdy)

        forward["torch.compile"] = compiled_forward
        both["torch.compile"] = compiled_forward_backward
    return forward, both, x.nbytes


def fused_candidates(rows, hidden, dtype):
    """add_forward and add_backward beside their unfused pairs and two copies, on 1 thread.

    Raises AssertionError where a fused output differs from the unfused one:
    y and h byte for byte, the gradients as assert_close allows (the fused
    grad_input is rounded once, the unfused one twice).
    """
    rng = np.random.default_rng(0)
    x, residual, dy, dh = (page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
                           for _ in range(4))
    w = page_aligned(rng.standard_normal(hidden).astype(dtype))
    eps = np.float64(EPS) if dtype == np.float64 else np.float32(EPS)
    y, h, dx, copy_x, copy_residual = (page_aligned(np.zeros_like(x)) for _ in range(5))
    dw = page_aligned(np.zeros_like(w))
    rmsnorm.set_num_threads(1)

    candidates = {
        "2x copy": lambda: (np.copyto(copy_x, x), np.copyto(copy_residual, residual)),
        "add_forward": lambda: rmsnorm.add_forward(x, residual, w, eps, out=(y, h)),
        "np.add + forward": lambda: (np.add(x, residual, out=h), rmsnorm.forward(h, w, eps, out=y)),
        "add_backward": lambda: rmsnorm.add_backward(dy, dh, h, w, eps, out=(dx, dw)),
        "backward + np.add": lambda: (rmsnorm.backward(dy, h, w, eps, out=(dx, dw)),
                                      np.add(dx, dh, out=dx)),
    }
    candidates["add_forward"]()
    fused = y.copy(), h.copy()
    candidates["np.add + forward"]()
    for label, got, want in (("y", fused[0], y), ("h", fused[1], h)):
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            raise AssertionError(f"add_forward's {label} is not the bytes of np.add + forward")
    candidates["add_backward"]()
    fused = dx.copy(), dw.copy()
    rmsnorm.backward(dy, h, w, eps, out=(dx, dw))
    addends = np.abs(dx, dtype=np.float32) + np.abs(dh, dtype=np.float32)
    candidates["backward + np.add"]()
    assert_close("backward + np.add (grad_input)", dx, fused[0], addends)
    assert_close("backward + np.add (grad_weight)", dw, fused[1])
    return candidates, x.nbytes


def offset_candidates(rows, hidden, dtype):
    """forward and forward_offset (weight_offset=1) with out=, on 1 thread.

    Raises AssertionError where the offset's output is not close to the
    NumPy composite's with the factor 1 + w.
    """
    rng = np.random.default_rng(0)
    x = page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
    w = page_aligned((0.1 * rng.standard_normal(hidden)).astype(dtype))
    eps = np.float64(EPS) if dtype == np.float64 else np.float32(EPS)
    offset = np.float64(WEIGHT_OFFSET)
    y = page_aligned(np.zeros_like(x))
    rmsnorm.set_num_threads(1)
    rmsnorm.forward_offset(x, w, offset, eps, out=y)
    xf = x.astype(np.float64)
    assert_close("forward_offset", y, numpy_forward(xf, WEIGHT_OFFSET + w.astype(np.float64)))
    return {
        "forward": lambda: rmsnorm.forward(x, w, eps, out=y),
        "forward_offset": lambda: rmsnorm.forward_offset(x, w, offset, eps, out=y),
    }


def torch_op_candidates(rows, hidden, dtype_name):
    """(forward, both): rmsnorm.torch.rms_norm, eager torch and torch.compile on 1 thread.

    forward is timed under no_grad, both (forward and autograd's backward)
    with grad. Raises AssertionError where the op's output or gradients are
    not torch.testing.assert_close to eager torch's.
    """
    import rmsnorm.torch

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(rows, hidden, generator=generator).to(dtype) for _ in range(2))
    w = torch.rand(hidden, generator=generator).to(dtype) + 0.5
    x_grad, w_grad = x.clone().requires_grad_(), w.clone().requires_grad_()
    rmsnorm.set_num_threads(1)
    torch.set_num_threads(1)
    torch._dynamo.reset()  # inductor bakes in the thread count when it compiles
    compiled = torch.compile(torch.nn.functional.rms_norm, dynamic=False, fullgraph=True)
    compiled_grad = torch.compile(torch.nn.functional.rms_norm, dynamic=False, fullgraph=True)

    functions = {
        "torch": torch.nn.functional.rms_norm,
        "torch.compile": compiled,
        "rmsnorm.torch": rmsnorm.torch.rms_norm,
    }
    with torch.no_grad():
        want = torch.nn.functional.rms_norm(x, [hidden], w, EPS)
        for name in ("torch.compile", "rmsnorm.torch"):
            torch.testing.assert_close(functions[name](x, [hidden], w, EPS), want, msg=name)
    grads = {}
    for name, fn in functions.items():
        x_grad.grad = w_grad.grad = None
        (compiled_grad if name == "torch.compile" else fn)(x_grad, [hidden], w_grad, EPS).backward(dy)
        grads[name] = x_grad.grad, w_grad.grad
    for name in ("torch.compile", "rmsnorm.torch"):
        for got, expected in zip(grads[name], grads["torch"]):
            # grad_weight sums over the rows: an absolute tolerance of its size.
            atol = 1e-5 * max(1.0, float(expected.abs().max()))
            torch.testing.assert_close(got, expected, atol=atol, rtol=DEFAULT_RTOL[dtype_name],
                                       msg=f"{name}'s gradients")

    def forward_of(fn):
        return lambda: fn(x, [hidden], w, EPS)

    def both_of(fn):
        def forward_backward():
            x_grad.grad = w_grad.grad = None
            fn(x_grad, [hidden], w_grad, EPS).backward(dy)
        return forward_backward

    forward = {name: forward_of(fn) for name, fn in functions.items()}
    both = {name: both_of(compiled_grad if name == "torch.compile" else fn)
            for name, fn in functions.items()}
    return forward, both


# torch.testing.assert_close's default rtol per dtype.
DEFAULT_RTOL = {"float32": 1.3e-6, "bfloat16": 1.6e-2}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py", description=__doc__.splitlines()[0],
        epilog="A full run takes about 12 minutes on 2 CPUs and wants a quiet machine: it "
               "prints four tables and a checklist of the speed goals, and writes them to "
               "results.md, with results.png beside it. The first table (section 'peers') "
               "times rmsnorm beside its peers and a copy, on 1 thread and on all CPUs; the "
               "second (section 'fused', about a minute) times the fused residual add, "
               "add_forward and add_backward with out=, on 1 thread at 2048x4096 and "
               "4096x8192 in float32, float16 and bfloat16, beside two np.copyto calls (the "
               "same traffic), np.add then forward, and backward then np.add; the third "
               "(section 'torch', about a minute) times rmsnorm.torch.rms_norm beside torch "
               "eager and torch.compile on torch tensors, on 1 thread at 1x4096 and 2048x4096 "
               "in float32 and bfloat16, under no_grad and with autograd's backward; the fourth "
               "(section 'offset', about two minutes) times the forward with weight_offset=1 "
               "beside without, on 1 thread at the first table's shapes. Each "
               "candidate's times go to stdout as they are measured, with the load other "
               "processes put on the machine meanwhile. The peers need pip install -e "
               "\".[bench]\" and torch; without them their columns read n/a.")
    parser.add_argument("--quick", action="store_true",
                        help="2 repeats of short samples, to see that it runs (4 or 5 "
                             "minutes on 2 CPUs): overrides --repeats and --large-repeats, "
                             "prints the tables labelled as a quick run, and writes no files "
                             "and no goal checklist; with --only, of that section alone")
    parser.add_argument("--repeats", type=int, default=7, metavar="N",
                        help="interleaved repeats per candidate and shape; the median is "
                             "reported (default %(default)s)")
    parser.add_argument("--large-repeats", type=int, default=5, metavar="N",
                        help=f"repeats for shapes of {LARGE >> 20} Mi elements or more, whose "
                             "slow candidates take seconds per call; at most --repeats "
                             "(default %(default)s)")
    parser.add_argument("--only", choices=("peers", "fused", "torch", "offset"),
                        help="run one section: peers (rmsnorm beside its peers and a copy) "
                             "or fused (the fused residual add beside its unfused pair and "
                             "two copies) or torch (rmsnorm.torch's op beside torch eager and "
                             "torch.compile, on torch tensors) or offset (the forward with "
                             "weight_offset=1 beside without, at the first section's shapes); "
                             "prints its table and, unless "
                             "--quick, its goals, "
                             "and writes no files, as results.md holds both sections")
    parser.add_argument("--out", type=Path, default=HERE, metavar="DIR",
                        help="folder for results.md and results.png, created if need be "
                             "(default: benchmarks/, beside this script, where the published "
                             "results live)")
    args = parser.parse_args(argv)
    repeats, min_seconds = (2, 0.005) if args.quick else (args.repeats, 0.05)
    large_repeats = repeats if args.quick else min(args.large_repeats, args.repeats)
    all_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    thread_counts = sorted({1, all_threads})
    started = time.perf_counter()

    def runnable(section, shapes):
        if args.only not in (None, section):
            return []
        for rows, hidden, name in shapes:
            if resolve_dtype(name) is None:
                print(f"skipping {rows}x{hidden} {name} ({section}): ml_dtypes is not "
                      "installed (pip install -e \".[bfloat16]\")", flush=True)
        return [(rows, hidden, resolve_dtype(name)) for rows, hidden, name in shapes
                if resolve_dtype(name) is not None]

    rows_out, loads = [], []  # loads: (row's label, CPUs other processes kept busy)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=all_threads)
    for threads in thread_counts:
        for rows, hidden, dtype in runnable("peers", SHAPES):
            forward, both, nbytes = candidates_for(rows, hidden, dtype, threads, pool)
            n = large_repeats if rows * hidden >= LARGE else repeats
            graphs = torch_graph_count() if torch is not None else 0
            (fwd, bwd), load = other_load(time_row, forward, both, n, min_seconds)
            if torch is not None and torch_graph_count() != graphs:
                raise RuntimeError("torch.compile recompiled while it was timed")
            rows_out.append((threads, rows, hidden, np.dtype(dtype).name, nbytes, fwd, bwd))
            loads.append((f"{threads} thr {rows}x{hidden} {rows_out[-1][3]}", load))
            print_row(rows_out[-1])
            print(f"  other processes kept {load:.2f} CPUs busy meanwhile", flush=True)
            del forward, both
    fused_out = []
    for rows, hidden, dtype in runnable("fused", FUSED_SHAPES):
        candidates, nbytes = fused_candidates(rows, hidden, dtype)
        n = large_repeats if rows * hidden >= LARGE else repeats
        medians, load = other_load(interleaved_medians, candidates, n, min_seconds)
        fused_out.append((rows, hidden, np.dtype(dtype).name, nbytes, medians))
        loads.append((f"fused {rows}x{hidden} {fused_out[-1][2]}", load))
        print(f"fused, 1 thr {rows}x{hidden} {fused_out[-1][2]}: "
              + ", ".join(f"{k} {v * 1e6:.1f}us" for k, v in medians.items()), flush=True)
        print(f"  other processes kept {load:.2f} CPUs busy meanwhile", flush=True)
        del candidates
    torch_out = []
    for rows, hidden, dtype_name in (TORCH_SHAPES if args.only in (None, "torch") else []):
        if torch is None:
            print("skipping the torch section: torch is not installed", flush=True)
            break
        forward, both = torch_op_candidates(rows, hidden, dtype_name)
        n = large_repeats if rows * hidden >= LARGE else repeats
        (fwd, bwd), load = other_load(time_row, forward, both, n, min_seconds)
        torch_out.append((rows, hidden, dtype_name, fwd, bwd))
        loads.append((f"torch {rows}x{hidden} {dtype_name}", load))
        print(f"torch, 1 thr {rows}x{hidden} {dtype_name}: " + ", ".join(
            f"{k} {v * 1e6:.1f}us" for k, v in {**fwd, **{'fb ' + k: v for k, v in bwd.items()}}.items()
        ), flush=True)
        print(f"  other processes kept {load:.2f} CPUs busy meanwhile", flush=True)
        del forward, both
    offset_out = []
    for rows, hidden, dtype in runnable("offset", OFFSET_SHAPES):
        candidates = offset_candidates(rows, hidden, dtype)
        n = large_repeats if rows * hidden >= LARGE else repeats
        medians, load = other_load(interleaved_medians, candidates, n, min_seconds)
        offset_out.append((rows, hidden, np.dtype(dtype).name, medians))
        loads.append((f"offset {rows}x{hidden} {offset_out[-1][2]}", load))
        print(f"offset, 1 thr {rows}x{hidden} {offset_out[-1][2]}: "
              + ", ".join(f"{k} {v * 1e6:.1f}us" for k, v in medians.items())
              + f", ratio {medians['forward_offset'] / medians['forward']:.2f}", flush=True)
        print(f"  other processes kept {load:.2f} CPUs busy meanwhile", flush=True)
        del candidates
    rmsnorm.set_num_threads(all_threads)
    if torch is not None:
        torch.set_num_threads(all_threads)
    minutes = (time.perf_counter() - started) / 60

    table = markdown_table(rows_out) if rows_out else ""
    if fused_out:
        table += ("\n" if table else "") + fused_table(fused_out)
    if torch_out:
        table += ("\n" if table else "") + torch_table(torch_out)
    if offset_out:
        table += ("\n" if table else "") + offset_table(offset_out)
    versions = [f"NumPy {np.__version__}"]
    for label, module in (("torch", torch), ("onnxruntime", onnxruntime), ("ml_dtypes", ml_dtypes)):
        versions.append(f"{label} {module.__version__}" if module is not None
                        else f"{label} not installed")
    if args.quick:
        run = (f"**Quick run** (`--quick`: {repeats} repeats of short samples, to see that it "
               "runs; not for publishing) on ")
    else:
        # The command that reproduces this run: the options that differ from their defaults.
        options = "".join(f" --{name.replace('_', '-')} {getattr(args, name)}"
                          for name in ("repeats", "large_repeats", "only")
                          if getattr(args, name) != parser.get_default(name))
        run = f"`python benchmarks/bench.py{options}` on "
    header = (
        run + f"{datetime.date.today().isoformat()}, {cpu_model()}, {all_threads} CPUs, "
        + ", ".join(versions)
        + f", kernels: {rmsnorm._core._isa()[0]}; medians of {repeats} interleaved repeats "
        f"({large_repeats} at {LARGE >> 20} Mi elements and over), {minutes:.1f} minutes in all.\n"
    )
    busy = [f"{label} ({load:.2f})" for label, load in loads if load > 0.25]
    if busy:
        table += ("\nOther processes kept more than a quarter of a CPU busy, on average, while "
                  "these rows were timed; their figures are suspect: " + ", ".join(busy) + ".\n")
    report = header + "\n" + table
    if not args.quick:
        goals = [check_goals(rows_out)] if rows_out else []
        goals += [check_fused_goals(fused_out)] if fused_out else []
        goals += [check_torch_goals(torch_out)] if torch_out else []
        goals += [check_offset_goals(offset_out)] if offset_out else []
        report += "\n" + "\n".join(goals)
    print("\n" + report)
    if not args.quick and args.only is None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(report)
        try:
            plot(rows_out, args.out / "results.png")
        except ImportError:
            print("results.png not written: matplotlib is not installed "
                  "(pip install -e \".[bench]\")")
    return 0


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def times(ratio: float) -> str:
    return f"{ratio:.2f}" if ratio < 2 else f"{ratio:.1f}"


def versus(peer: str, peer_seconds: float | None, our_seconds: float) -> str:
    """'2.3x faster' where ours wins, else 'torch 1.6x faster'."""
    if peer_seconds is None:
        return "n/a"
    if peer_seconds >= our_seconds:
        return f"{times(peer_seconds / our_seconds)}x faster"
    return f"{peer} {times(our_seconds / peer_seconds)}x faster"


def ours_vs(peer: str, peer_seconds: float, our_seconds: float) -> str:
    """'ours 2.3x faster than torch', or 'torch 1.6x faster than ours'."""
    if peer_seconds >= our_seconds:
        return f"ours {times(peer_seconds / our_seconds)}x faster than {peer}"
    return f"{peer} {times(our_seconds / peer_seconds)}x faster than ours"


def best_peer(fwd: dict):
    """The fastest peer's forward, (name, seconds), or None where none ran."""
    measured = [(fwd[p], p) for p in PEERS if p in fwd]
    return min(measured)[::-1] if measured else None


def print_row(row) -> None:
    threads, rows, hidden, dtype, _, fwd, bwd = row
    print(f"{threads} thr {rows}x{hidden} {dtype}: " + ", ".join(
        f"{k} {v * 1e6:.1f}us" for k, v in {**fwd, **{'fb ' + k: v for k, v in bwd.items()}}.items()
    ), flush=True)


def markdown_table(rows_out) -> str:
    lines = [
        ("| threads | shape | dtype | copy GB/s | fwd / copy | fwd GB/s | bwd / copy "
         "| onnxruntime fwd / copy | torch.compile fwd / copy | ours faster than best peer (fwd) "
         "| rms_norm vs torch | fwd+bwd vs torch | fwd+bwd vs torch.compile | rms_norm vs numpy |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, rows, hidden, dtype, nbytes, fwd, bwd in rows_out:
        copy = fwd["copy"]
        ours = fwd["ours (gufunc, out=)"]
        ours_both = bwd["ours (rms_norm + backward)"]
        best = best_peer(fwd)
        if best is None:
            verdict = "n/a"
        elif best[1] > ours:
            verdict = f"yes, {times(best[1] / ours)}x faster than {best[0]}"
        else:
            verdict = f"no, {best[0]} {times(ours / best[1])}x faster"
        cells = [
            str(threads),
            f"{rows}x{hidden}",
            dtype,
            f"{gbps(2 * nbytes, copy):.1f}",
            f"{ours / copy:.2f}",
            f"{gbps(2 * nbytes, ours):.1f}",
            f"{bwd['ours (backward gufunc, out=)'] / copy:.2f}",
            f"{fwd['onnxruntime'] / copy:.2f}" if "onnxruntime" in fwd else "n/a",
            f"{fwd['torch.compile'] / copy:.2f}" if "torch.compile" in fwd else "n/a",
            verdict,
            versus("torch", fwd.get("torch"), fwd["ours (rms_norm)"]),
            versus("torch", bwd.get("torch"), ours_both),
            versus("torch.compile", bwd.get("torch.compile"), ours_both),
            versus("numpy", fwd["numpy"], fwd["ours (rms_norm)"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "GB/s counts the bytes a copy moves (read x, write y). The \"/ copy\" columns are "
        "times divided by the time of `np.copyto` of the same bytes on one thread (below 1 "
        "where several threads beat that copy); a \"vs\" cell names whichever side is "
        "faster, and by how much. fwd and bwd are the gufuncs "
        "with `out=`; the torch columns compare the functional API (`rms_norm`, then "
        "`rms_norm_backward`) with `torch.nn.functional.rms_norm` under `no_grad`, and with "
        "its forward plus autograd backward, at the same thread count. The peers' forwards: "
        "onnxruntime's `RMSNormalization` (opset 23, CPUExecutionProvider, "
        "`intra_op_num_threads` = threads) writes into an output bound in advance; "
        "`torch.compile(torch.nn.functional.rms_norm)` (inductor, `dynamic=False`, compiled "
        "for each row) allocates its output on every call, as torch's functional API has no "
        "`out=`. \"Best peer\" is the fastest of onnxruntime, torch.compile and torch eager "
        "against the gufunc with `out=`; fwd+bwd vs torch.compile times the compiled "
        "forward with autograd's compiled backward. rms_norm vs numpy compares `rms_norm` "
        "with the NumPy composite `x / sqrt(mean(x * x) + eps) * w`."
    )
    if PEER_NOTES:
        lines.append("")
        lines.append("n/a cells:")
        for (peer, dtype), reason in PEER_NOTES.items():
            lines.append(f"- {peer}, {dtype}: {reason}")
    return "\n".join(lines) + "\n"


def fused_table(fused_out) -> str:
    """The fused residual add's table: one row per shape and dtype, on 1 thread."""
    lines = [
        "Fused residual add, 1 thread, `out=` given:",
        "",
        ("| shape | dtype | 2x copy GB/s | add_forward / 2x copy | add_forward GB/s "
         "| fused forward speed-up | add_backward / 2x copy | fused backward speed-up |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rows, hidden, dtype, nbytes, t in fused_out:
        copy = t["2x copy"]
        cells = [
            f"{rows}x{hidden}",
            dtype,
            f"{gbps(4 * nbytes, copy):.1f}",
            f"{t['add_forward'] / copy:.2f}",
            f"{gbps(4 * nbytes, t['add_forward']):.1f}",
            f"{t['np.add + forward'] / t['add_forward']:.2f}x",
            f"{t['add_backward'] / copy:.2f}",
            f"{t['backward + np.add'] / t['add_backward']:.2f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "`add_forward(x, residual, w, eps, out=(y, h))` reads x and residual and writes h = "
        "x + residual and y = RMSNorm(h): the traffic of two copies of x, so \"2x copy\" is "
        "`np.copyto` of x and of residual, one after the other, and GB/s counts the bytes "
        "those two copies move. The fused forward's speed-up is over `np.add(x, residual, "
        "out=h)` then `forward(h, w, eps, out=y)`, whose bytes it matches; the fused "
        "backward's is `add_backward(dy, dh, h, w, eps, out=(dx, dw))` against "
        "`backward(dy, h, w, eps, out=(dx, dw))` then `np.add(dx, dh, out=dx)`. The five "
        "candidates of a row are timed interleaved, on the same page-aligned arrays."
    )
    return "\n".join(lines) + "\n"


def torch_table(torch_out) -> str:
    """rmsnorm.torch's table: one row per shape and dtype, on 1 thread."""
    lines = [
        "rmsnorm.torch beside torch, 1 thread, torch tensors:",
        "",
        ("| shape | dtype | torch fwd | torch.compile fwd | rmsnorm.torch fwd | fwd vs torch "
         "| fwd vs torch.compile | torch fwd+bwd | torch.compile fwd+bwd | rmsnorm.torch fwd+bwd "
         "| fwd+bwd vs torch | fwd+bwd vs torch.compile |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rows, hidden, dtype, fwd, bwd in torch_out:
        ours, ours_both = fwd["rmsnorm.torch"], bwd["rmsnorm.torch"]
        cells = [
            f"{rows}x{hidden}",
            dtype,
            *(f"{fwd[k] * 1e6:.1f} us" for k in ("torch", "torch.compile", "rmsnorm.torch")),
            versus("torch", fwd["torch"], ours),
            versus("torch.compile", fwd["torch.compile"], ours),
            *(f"{bwd[k] * 1e6:.1f} us" for k in ("torch", "torch.compile", "rmsnorm.torch")),
            versus("torch", bwd["torch"], ours_both),
            versus("torch.compile", bwd["torch.compile"], ours_both),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Medians per call, Python and the dispatcher included. fwd is "
        "`rmsnorm.torch.rms_norm(x, [hidden], w, eps)`, "
        "`torch.nn.functional.rms_norm` and `torch.compile` of it (inductor, "
        "`dynamic=False`) under `torch.no_grad()`; fwd+bwd is the same call on tensors that "
        "require grad, then `.backward(dy)`. `torch.set_num_threads(1)` and "
        "`rmsnorm.set_num_threads(1)`."
    )
    return "\n".join(lines) + "\n"


def offset_table(offset_out) -> str:
    """The weight offset's table: one row per shape and dtype, on 1 thread."""
    lines = [
        f"Weight offset, 1 thread, `out=` given (weight_offset={WEIGHT_OFFSET:g}):",
        "",
        "| shape | dtype | forward | forward_offset | offset / plain |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rows, hidden, dtype, t in offset_out:
        cells = [
            f"{rows}x{hidden}",
            dtype,
            f"{t['forward'] * 1e6:.1f} us",
            f"{t['forward_offset'] * 1e6:.1f} us",
            f"{t['forward_offset'] / t['forward']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "`forward_offset(x, w, 1.0, eps, out=y)`, whose factor is 1 + w formed exactly, beside "
        "`forward(x, w, eps, out=y)`, timed interleaved on the same page-aligned arrays; w is "
        "small (0.1 times normal), as Gemma's weights are around 0 with the 1 added."
    )
    return "\n".join(lines) + "\n"


def check_offset_goals(offset_out) -> str:
    """The weight offset's goal: float32 within 1.15x of the plain forward."""
    out = ["Goals of the weight offset (1 thread, `out=` given):"]
    for rows, hidden, dtype, t in offset_out:
        if dtype != "float32":
            continue
        ratio = t["forward_offset"] / t["forward"]
        out.append(f"- [{'x' if ratio <= 1.15 else ' '}] {rows}x{hidden} float32: with the "
                   f"offset {ratio:.2f}x the plain forward (<= 1.15)")
    return "\n".join(out) + "\n"


def check_torch_goals(torch_out) -> str:
    """rmsnorm.torch's goals (issue 15), each with its measured value."""
    out = ["Goals of rmsnorm.torch (1 thread):"]
    measured = {(rows, dtype): (fwd, bwd) for rows, _, dtype, fwd, bwd in torch_out}

    def goal(text, ok):
        out.append(f"- [{'x' if ok else ' '}] {text}")

    for dtype in ("float32", "bfloat16"):
        if (2048, dtype) in measured:
            fwd, bwd = measured[(2048, dtype)]
            ours, ours_both = fwd["rmsnorm.torch"], bwd["rmsnorm.torch"]
            goal(f"2048x4096 {dtype}: forward at least 5x faster than eager "
                 f"({times(fwd['torch'] / ours)}x)", fwd["torch"] >= 5 * ours)
            goal(f"2048x4096 {dtype}: forward plus backward at least 8x faster than eager "
                 f"({times(bwd['torch'] / ours_both)}x)", bwd["torch"] >= 8 * ours_both)
            goal(f"2048x4096 {dtype}: both faster than torch.compile "
                 f"({ours_vs('torch.compile', fwd['torch.compile'], ours)} forward, "
                 f"{ours_vs('torch.compile', bwd['torch.compile'], ours_both)} with backward)",
                 fwd["torch.compile"] > ours and bwd["torch.compile"] > ours_both)
        if (1, dtype) in measured:
            fwd, bwd = measured[(1, dtype)]
            ours, ours_both = fwd["rmsnorm.torch"], bwd["rmsnorm.torch"]
            goal(f"1x4096 {dtype}: at least 2x faster than eager under no_grad "
                 f"({times(fwd['torch'] / ours)}x)", fwd["torch"] >= 2 * ours)
            goal(f"1x4096 {dtype}: no slower than eager with autograd "
                 f"({ours_vs('torch', bwd['torch'], ours_both)})", bwd["torch"] >= ours_both)
    return "\n".join(out) + "\n"


def check_fused_goals(fused_out) -> str:
    """The fused residual add's goals, each with its measured value."""
    out = ["Goals of the fused residual add (1 thread, `out=` given):"]
    measured = {(rows, hidden, dtype): t for rows, hidden, dtype, _, t in fused_out}

    def goal(text, ok):
        out.append(f"- [{'x' if ok else ' '}] {text}")

    for rows, hidden, dtype in FUSED_SHAPES:
        shape = f"{rows}x{hidden} {dtype}"
        if (rows, hidden, dtype) not in measured:
            goal(f"{shape}: not measured", False)
            continue
        t = measured[rows, hidden, dtype]
        ratio = t["add_forward"] / t["2x copy"]
        goal(f"{shape}: add_forward {ratio:.2f}x two copies (<= 1.3)", ratio <= 1.3)
        speedup = t["np.add + forward"] / t["add_forward"]
        goal(f"{shape}: add_forward {speedup:.2f}x as fast as np.add then forward (>= 1.2)",
             speedup >= 1.2)
        # No slower anywhere, and faster from 2048x4096 up: every shape here.
        speedup = t["backward + np.add"] / t["add_backward"]
        goal(f"{shape}: add_backward {speedup:.2f}x as fast as backward then np.add (> 1)",
             speedup > 1)
    return "\n".join(out) + "\n"


def check_goals(rows_out) -> str:
    """The speed issue's goals, each with its measured value."""
    out = ["Goals (1 thread, `out=` given, unless a line says otherwise):"]
    by_key = {(t, r, h, d): (fwd, bwd) for t, r, h, d, _, fwd, bwd in rows_out}

    def goal(text, ok):
        out.append(f"- [{'x' if ok else ' '}] {text}")

    for dtype in ("float16", "bfloat16"):
        for rows, hidden, fwd_max, bwd_max in ((32, 4096, 3.0, 7.0), (2048, 4096, 1.3, 2.5),
                                               (4096, 8192, 1.3, 2.5)):
            if (1, rows, hidden, dtype) not in by_key:
                goal(f"{rows}x{hidden} {dtype}: not measured", False)
                continue
            fwd, bwd = by_key[1, rows, hidden, dtype]
            shape = f"{rows}x{hidden} {dtype}"
            ratio = fwd["ours (gufunc, out=)"] / fwd["copy"]
            goal(f"{shape}: forward {ratio:.2f}x copy (<= {fwd_max})", ratio <= fwd_max)
            ratio = bwd["ours (backward gufunc, out=)"] / bwd["copy"]
            goal(f"{shape}: backward {ratio:.2f}x copy (<= {bwd_max})", ratio <= bwd_max)
            if rows < 2048:
                continue
            if "torch" in bwd:
                ours_both = bwd["ours (rms_norm + backward)"]
                goal(f"{shape}: forward+backward: {ours_vs('torch eager', bwd['torch'], ours_both)} "
                     f"(>= 8x faster)", bwd["torch"] / ours_both >= 8)
            else:
                goal(f"{shape}: forward+backward against torch eager: torch not installed", False)

    for (threads, rows, hidden, dtype), (fwd, _) in by_key.items():
        if threads != 1 or dtype not in ("float32", "float16", "bfloat16"):
            continue
        ours = fwd["ours (gufunc, out=)"]
        parts, ok = [], True
        for peer in ("onnxruntime", "torch.compile") if dtype != "bfloat16" else ("torch.compile",):
            if peer in fwd:
                parts.append(ours_vs(peer, fwd[peer], ours))
                ok = ok and ours < fwd[peer]
            else:
                parts.append(f"vs {peer} not measured")
                ok = False
        goal(f"{rows}x{hidden} {dtype}: forward faster than the peers: " + "; ".join(parts), ok)

    threads_all = max(t for t, *_ in by_key)
    if threads_all == 1:
        out.append("- [ ] thread scaling: not measured, this machine gives the process 1 CPU")
    for (threads, rows, hidden, dtype), many in by_key.items():
        one = by_key.get((1, rows, hidden, dtype))
        if threads != threads_all or threads == 1 or rows < 2048 or one is None:
            continue
        copy_speedup = one[0]["copy"] / many[0][f"copy on {threads_all} threads"]
        for label, key, phase in (("forward", "ours (gufunc, out=)", 0),
                                  ("backward", "ours (backward gufunc, out=)", 1)):
            speedup = one[phase][key] / many[phase][key]
            goal(f"{rows}x{hidden} {dtype}: {label} on {threads_all} threads {speedup:.2f}x as fast "
                 f"as on 1, against {copy_speedup:.2f}x for np.copyto cut over {threads_all} "
                 f"threads (>= 0.9 of it: {speedup / copy_speedup:.2f})",
                 speedup >= 0.9 * copy_speedup)

    out.append("")
    out.append("Kept from the previous round (float32):")
    previous_round_goals(by_key, goal, out.append)
    return "\n".join(out) + "\n"


def previous_round_goals(by_key, goal, note) -> None:
    """The float32 goals of the round before, as that round checked them."""
    for (threads, rows, hidden, dtype), (fwd, bwd) in by_key.items():
        if threads != 1 or dtype != "float32" or rows < 32:
            continue
        shape = f"{rows}x{hidden}"
        copy = fwd["copy"]
        ratio = fwd["ours (gufunc, out=)"] / copy
        goal(f"{shape}: forward {ratio:.2f}x copy (<= 1.25)", ratio <= 1.25)
        ratio = bwd["ours (backward gufunc, out=)"] / copy
        goal(f"{shape}: backward {ratio:.2f}x copy (<= 2.0)", ratio <= 2.0)
        if "torch" in fwd:
            speedup = fwd["torch"] / fwd["ours (rms_norm)"]
            goal(f"{shape}: rms_norm: {ours_vs('torch', fwd['torch'], fwd['ours (rms_norm)'])} "
                 f"(>= 4x faster)", speedup >= 4)
            speedup = bwd["torch"] / bwd["ours (rms_norm + backward)"]
            goal(f"{shape}: forward+backward: "
                 f"{ours_vs('torch', bwd['torch'], bwd['ours (rms_norm + backward)'])} "
                 f"(>= 8x faster)", speedup >= 8)
    for (threads, rows, hidden, dtype), (fwd, _) in by_key.items():
        if rows == 1 and dtype == "float32" and "torch" in fwd:
            speedup = fwd["torch"] / fwd["ours (rms_norm)"]
            goal(f"{threads} thread(s), 1x{hidden}: rms_norm: "
                 f"{ours_vs('torch', fwd['torch'], fwd['ours (rms_norm)'])} (>= 3x faster)",
                 speedup >= 3)
    threads_all = max(t for t, *_ in by_key)
    for rows, hidden in [(2048, 4096), (4096, 8192)]:
        one = by_key.get((1, rows, hidden, "float32"))
        many = by_key.get((threads_all, rows, hidden, "float32"))
        if threads_all > 1 and one and many:
            for label, key, phase in (("forward", "ours (gufunc, out=)", 0),
                                      ("backward", "ours (backward gufunc, out=)", 1)):
                speedup = one[phase][key] / many[phase][key]
                goal(f"{rows}x{hidden}: {label} on {threads_all} threads {speedup:.2f}x as fast "
                     f"as on 1 (>= 1.6)", speedup >= 1.6)
            # The yardstick for that: how much more bandwidth the threads get from a plain copy.
            copy_speedup = one[0]["copy"] / many[0][f"copy on {threads_all} threads"]
            note(f"  - a plain copy cut over {threads_all} threads: {copy_speedup:.2f}x "
                 f"as fast as np.copyto on 1")


PLOT_SERIES = [  # (candidate, legend)
    ("ours (gufunc, out=)", "ours (gufunc, out=)"),
    ("onnxruntime", "onnxruntime"),
    ("torch.compile", "torch.compile"),
    ("torch", "torch eager"),
    ("numpy", "NumPy composite"),
]
PLOT_GROUPS = [("float32", "float64"), ("float16", "bfloat16")]


def plot(rows_out, path: Path) -> None:
    """Forward GB/s: a panel per thread count and dtype group, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    # Plain numbers on the log axis: 10, 20, 50, not 2x10^1.
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    twos_and_fives = FuncFormatter(
        lambda v, _: f"{v:g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 5) else "")

    thread_counts = sorted({r[0] for r in rows_out})
    fig, axes = plt.subplots(len(thread_counts), len(PLOT_GROUPS),
                             figsize=(7 * len(PLOT_GROUPS), 4.4 * len(thread_counts)),
                             sharey=True, squeeze=False,
                             gridspec_kw={"width_ratios": [
                                 max(1, sum(r[0] == thread_counts[0] and r[3] in g for r in rows_out))
                                 for g in PLOT_GROUPS]})
    width = 0.8 / len(PLOT_SERIES)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax_row, threads in zip(axes, thread_counts):
        for ax, group in zip(ax_row, PLOT_GROUPS):
            rows = [r for r in rows_out if r[0] == threads and r[3] in group]
            ax.set_title(f"forward, {', '.join(group)}, {threads} thread{'s' if threads > 1 else ''}")
            if not rows:
                ax.set_axis_off()
                continue
            xs = np.arange(len(rows))
            for i, (key, name) in enumerate(PLOT_SERIES):
                values = [gbps(2 * r[4], r[5][key]) if key in r[5] else np.nan for r in rows]
                ax.bar(xs + (i - (len(PLOT_SERIES) - 1) / 2) * width, values, width,
                       label=name, color=colors[i % len(colors)])
            # A yardstick, not a ceiling: the bars can pass it (with threads, for one).
            copy = [gbps(2 * r[4], r[5]["copy"]) for r in rows]
            ax.plot(xs, copy, "k_", markersize=38, markeredgewidth=2,
                    label="np.copyto of the same bytes, one thread")
            if threads > 1:
                copy = [gbps(2 * r[4], r[5][f"copy on {threads} threads"]) for r in rows]
                ax.plot(xs, copy, "_", color="0.5", markersize=38, markeredgewidth=2,
                        label=f"np.copyto of the same bytes, cut over {threads} threads")
            ax.set_xticks(xs, [f"{r[1]}x{r[2]}\n{r[3]}" for r in rows], fontsize=8)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(twos_and_fives)
            ax.set_ylabel("GB/s (bytes a copy moves), log scale")
            ax.tick_params(labelleft=True)
            ax.grid(axis="y", which="both", alpha=0.3)
    legend = {}  # label: handle, over every panel (the threaded copy is not in the first)
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    copies = [label for label in legend if label.startswith("np.copyto")]
    labels = [label for label in legend if label not in copies] + copies  # the bars first
    fig.legend([legend[label] for label in labels], labels, loc="lower center",
               ncol=(len(labels) + 1) // 2, fontsize=9, markerscale=0.3)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
