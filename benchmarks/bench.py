"""Speed of rmsnorm beside torch, a NumPy composite and a plain copy.

    python benchmarks/bench.py            # full run, writes results.md and results.png
    python benchmarks/bench.py --quick    # a few repeats, to see that it runs

RMSNorm is memory-bound: the forward reads x and writes y, the traffic of a
copy of x, so ``np.copyto`` of the same bytes is the roof. Every candidate is
timed in the same process, interleaved repeat by repeat so that noise from a
shared machine hits them alike, and the median over repeats is reported
after a warm-up, as a ratio to the copy and as achieved GB/s.
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
import time
from pathlib import Path

import numpy as np

import rmsnorm

try:
    import torch
except ImportError:  # the benchmark still runs, without the torch columns
    torch = None

HERE = Path(__file__).resolve().parent
EPS = 1e-6

# (rows, hidden, dtype): a decoding step, a short prompt, a batch, a big batch.
SHAPES = [
    (1, 4096, np.float32),
    (32, 4096, np.float32),
    (2048, 4096, np.float32),
    (4096, 8192, np.float32),
    (2048, 4096, np.float64),
    (2048, 4096, np.float16),
]


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


def interleaved_medians(candidates: dict, repeats: int, min_seconds: float) -> dict:
    for fn in candidates.values():  # warm-up: caches, page faults, thread start
        sample_seconds(fn, min_seconds / 4)
    samples = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            samples[name].append(sample_seconds(fn, min_seconds))
    return {name: statistics.median(values) for name, values in samples.items()}


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


def page_aligned(values: np.ndarray) -> np.ndarray:
    """A copy of ``values`` whose data starts on a page boundary.

    Where an output starts a little past an input in their pages, loads wait
    on stores they do not depend on (4K aliasing; benchmarks/aliasing.py
    measures it). Where NumPy's allocator puts each array depends on the
    heap's history, so every array here starts on a page: the figures then
    do not move with it, for any candidate.
    """
    aligned = at_page_offset(values.shape, values.dtype, 0)
    aligned[...] = values
    return aligned


def split_copy(pool, threads: int, dst: np.ndarray, src: np.ndarray):
    """``np.copyto`` of src into dst, cut in `threads` pieces run at once.

    NumPy copies without the GIL, so this is the roof for `threads`
    threads: the memory bandwidth they can share.
    """
    pieces = list(zip(np.array_split(dst.reshape(-1), threads),
                      np.array_split(src.reshape(-1), threads)))
    return lambda: [f.result() for f in [pool.submit(np.copyto, d, s) for d, s in pieces]]


def candidates_for(rows, hidden, dtype, threads, pool):
    rng = np.random.default_rng(0)
    x = page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
    w = page_aligned(rng.standard_normal(hidden).astype(dtype))
    dy = page_aligned(rng.standard_normal((rows, hidden)).astype(dtype))
    eps = np.float64(EPS) if dtype == np.float64 else np.float32(EPS)
    y, dx, scratch = (page_aligned(np.zeros_like(x)) for _ in range(3))
    dw = page_aligned(np.zeros_like(w))
    rmsnorm.set_num_threads(threads)

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
    if torch is not None:
        torch.set_num_threads(threads)
        tx, tw, tdy = (torch.from_numpy(a) for a in (x, w, dy))
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
    return forward, both, x.nbytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats, no files written")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    repeats, min_seconds = (2, 0.005) if args.quick else (args.repeats, 0.05)
    all_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    thread_counts = sorted({1, all_threads})

    rows_out = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=all_threads)
    for threads in thread_counts:
        for rows, hidden, dtype in SHAPES:
            forward, both, nbytes = candidates_for(rows, hidden, dtype, threads, pool)
            # Inference code enters no_grad once, around the model, not per call.
            with torch.no_grad() if torch is not None else contextlib.nullcontext():
                fwd = interleaved_medians(forward, repeats, min_seconds)
            bwd = interleaved_medians(both, repeats, min_seconds)
            rows_out.append((threads, rows, hidden, np.dtype(dtype).name, nbytes, fwd, bwd))
            print_row(rows_out[-1])
    rmsnorm.set_num_threads(all_threads)

    table = markdown_table(rows_out)
    verdicts = check_goals(rows_out)
    header = (
        f"`python benchmarks/bench.py` on {datetime.date.today().isoformat()}, "
        f"{cpu_model()}, {all_threads} CPUs, NumPy {np.__version__}"
        + (f", torch {torch.__version__}" if torch is not None else ", torch not installed")
        + f", kernels: {rmsnorm._core._isa()[0]}.\n"
    )
    report = header + "\n" + table + "\n" + verdicts
    print("\n" + report)
    if not args.quick:
        (args.out / "results.md").write_text(report)
        plot(rows_out, args.out / "results.png")
    return 0


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def print_row(row) -> None:
    threads, rows, hidden, dtype, nbytes, fwd, bwd = row
    print(f"{threads} thr {rows}x{hidden} {dtype}: " + ", ".join(
        f"{k} {v * 1e6:.1f}us" for k, v in {**fwd, **{'fb ' + k: v for k, v in bwd.items()}}.items()
    ), flush=True)


def markdown_table(rows_out) -> str:
    lines = [
        "| threads | shape | dtype | copy GB/s | fwd / copy | fwd GB/s | bwd / copy "
        "| rms_norm vs torch | fwd+bwd vs torch | numpy fwd / ours |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, rows, hidden, dtype, nbytes, fwd, bwd in rows_out:
        copy = fwd["copy"]
        ours = fwd["ours (gufunc, out=)"]
        torch_fwd = fwd.get("torch")
        torch_both = bwd.get("torch")
        ours_both = bwd["ours (rms_norm + backward)"]
        cells = [
            str(threads),
            f"{rows}x{hidden}",
            dtype,
            f"{gbps(2 * nbytes, copy):.1f}",
            f"{ours / copy:.2f}",
            f"{gbps(2 * nbytes, ours):.1f}",
            f"{bwd['ours (backward gufunc, out=)'] / copy:.2f}",
            f"{torch_fwd / fwd['ours (rms_norm)']:.1f}x faster" if torch_fwd else "n/a",
            f"{torch_both / ours_both:.1f}x faster" if torch_both else "n/a",
            f"{fwd['numpy'] / fwd['ours (rms_norm)']:.1f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "GB/s counts the bytes a copy moves (read x, write y). fwd and bwd are the gufuncs "
        "with `out=`; the torch columns compare the functional API (`rms_norm`, then "
        "`rms_norm_backward`) with `torch.nn.functional.rms_norm` under `no_grad`, and with "
        "its forward plus autograd backward, at the same thread count."
    )
    return "\n".join(lines) + "\n"


def check_goals(rows_out) -> str:
    """The speed issue's goals, each with its measured value."""
    out = ["Goals:"]
    by_key = {(t, r, h, d): (fwd, bwd) for t, r, h, d, _, fwd, bwd in rows_out}

    def goal(text, ok):
        out.append(f"- [{'x' if ok else ' '}] {text}")

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
            goal(f"{shape}: rms_norm {speedup:.1f}x faster than torch (>= 4)", speedup >= 4)
            speedup = bwd["torch"] / bwd["ours (rms_norm + backward)"]
            goal(f"{shape}: forward+backward {speedup:.1f}x faster than torch (>= 8)", speedup >= 8)
    for (threads, rows, hidden, dtype), (fwd, _) in by_key.items():
        if rows == 1 and "torch" in fwd:
            speedup = fwd["torch"] / fwd["ours (rms_norm)"]
            goal(f"{threads} thread(s), 1x{hidden}: rms_norm {speedup:.1f}x faster than torch (>= 3)",
                 speedup >= 3)
    threads_all = max(t for t, *_ in by_key)
    for rows, hidden in [(2048, 4096), (4096, 8192)]:
        one = by_key.get((1, rows, hidden, "float32"))
        many = by_key.get((threads_all, rows, hidden, "float32"))
        if threads_all > 1 and one and many:
            for label, key, phase in (("forward", "ours (gufunc, out=)", 0),
                                      ("backward", "ours (backward gufunc, out=)", 1)):
                speedup = one[phase][key] / many[phase][key]
                goal(f"{rows}x{hidden}: {label} on {threads_all} threads {speedup:.2f}x faster "
                     f"than on 1 (>= 1.6)", speedup >= 1.6)
            # The roof for that: how much more bandwidth the threads get at all.
            copy_speedup = one[0]["copy"] / many[0][f"copy on {threads_all} threads"]
            out.append(f"  - a plain copy cut over {threads_all} threads: {copy_speedup:.2f}x "
                       f"faster than np.copyto on 1")
    return "\n".join(out) + "\n"


def plot(rows_out, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thread_counts = sorted({r[0] for r in rows_out})
    fig, axes = plt.subplots(1, len(thread_counts), figsize=(6 * len(thread_counts), 4.2),
                             sharey=True, squeeze=False)
    for ax, threads in zip(axes[0], thread_counts):
        rows = [r for r in rows_out if r[0] == threads]
        labels = [f"{r[1]}x{r[2]}\n{r[3]}" for r in rows]
        xs = np.arange(len(rows))
        series = [("ours (gufunc, out=)", "ours"), ("torch", "torch"), ("numpy", "NumPy composite")]
        width = 0.27
        for i, (key, name) in enumerate(series):
            values = [gbps(2 * r[4], r[5][key]) if key in r[5] else 0 for r in rows]
            ax.bar(xs + (i - 1) * width, values, width, label=name)
        roof = [gbps(2 * r[4], r[5]["copy"]) for r in rows]
        ax.plot(xs, roof, "k_", markersize=40, markeredgewidth=2, label="np.copyto (roof)")
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_title(f"forward, {threads} thread{'s' if threads > 1 else ''}")
        ax.set_ylabel("GB/s (bytes a copy moves)")
        ax.legend(fontsize=8, markerscale=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
