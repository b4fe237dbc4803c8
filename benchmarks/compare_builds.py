"""Two builds of the kernels side by side: is a change faster or slower?

    python benchmarks/compare_builds.py OTHER_CORE_SO [--repeats N] [--fused]
        [--offset OFFSET] [--dtypes D,...] [--shapes ROWSxN,...] [--threads T]

OTHER_CORE_SO is the ``rmsnorm/_core*.so`` of another build, for example one
of an older commit made with ``git worktree add /tmp/old COMMIT`` and
``python setup.py build_ext --inplace`` there. It is loaded beside the
installed rmsnorm, and each shape's forward and backward gufuncs (``out=``
given, one thread unless ``--threads`` says otherwise) are timed in both
builds, interleaved repeat by repeat (the two builds' calls of a kind back
to back, each build first every other repeat), with ``np.copyto`` of the
same bytes (one thread): the ratios are of one run, on the same arrays, so
machine noise hits both builds alike. With
``--fused``, the fused residual add's gufuncs instead: ``add_forward``
(``out=(y, h)``, h an array of its own) and ``add_backward``. With
``--offset``, the gufuncs that take a weight offset (``forward_offset``
and the rest), with that one; ``--shapes 1x4096`` times a single row's path.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
from functools import partial
from pathlib import Path

import numpy as np
from bench import at_page_offset, page_aligned, sample_seconds

import rmsnorm
from rmsnorm._dtypes import BF16, resolve_dtype

SHAPES = [(32, 4096), (2048, 4096), (4096, 8192)]
DTYPES = ["float32", "float64", "float16", "bfloat16"]


def load_other(path: Path):
    """The other build's extension module, under a name of its own."""
    loader = importlib.machinery.ExtensionFileLoader("_core", str(path))
    spec = importlib.util.spec_from_file_location("_core", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def time_shape(other, rows: int, n: int, dtype, repeats: int, fused: bool,
               offset: float | None = None) -> dict:
    """Median seconds of the copy and of each build's forward and backward
    (with fused, add_forward and add_backward; with an offset, the
    gufuncs that take one)."""
    rng = np.random.default_rng(0)
    x, dy, residual, dh = (page_aligned(rng.standard_normal((rows, n)).astype(dtype))
                           for _ in range(4))
    w = page_aligned(rng.uniform(0.5, 1.5, n).astype(dtype))
    eps = np.float64(1e-6) if dtype == np.float64 else np.float32(1e-6)
    y, h, dx, scratch = (at_page_offset(x.shape, dtype, 0) for _ in range(4))
    dw = at_page_offset(w.shape, dtype, 0)
    candidates = {"copy": lambda: np.copyto(scratch, x)}
    suffix, factor = ("", ()) if offset is None else ("_offset", (np.float64(offset),))
    for name, build in (("this", rmsnorm), ("other", other)):
        if fused:
            candidates[f"fwd {name}"] = partial(getattr(build, "add_forward" + suffix), x,
                                                residual, w, *factor, eps, out=(y, h))
            candidates[f"bwd {name}"] = partial(getattr(build, "add_backward" + suffix), dy, dh,
                                                x, w, *factor, eps, out=(dx, dw))
        else:
            candidates[f"fwd {name}"] = partial(getattr(build, "forward" + suffix), x, w,
                                                *factor, eps, out=y)
            candidates[f"bwd {name}"] = partial(getattr(build, "backward" + suffix), dy, x, w,
                                                *factor, eps, out=(dx, dw))
    for fn in candidates.values():  # warm-up
        sample_seconds(fn, 0.01)
    samples = {name: [] for name in candidates}
    for repeat in range(repeats):
        # The two builds' calls of a kind run back to back, the first of
        # them each build in turn, so that each finds the caches as the
        # other left them as often: in one fixed order, or the whole order
        # reversed every other repeat, one build was favoured at shapes
        # that fit in L3 (the fused backward at 2048x4096 by 4%).
        builds = ("this", "other") if repeat % 2 == 0 else ("other", "this")
        for name in ["copy"] + [f"{kind} {build}" for kind in ("fwd", "bwd") for build in builds]:
            samples[name].append(sample_seconds(candidates[name], 0.05))
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other build's rmsnorm/_core*.so")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median)")
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help=f"comma-separated dtypes (default {','.join(DTYPES)})")
    parser.add_argument("--fused", action="store_true",
                        help="time add_forward and add_backward instead")
    parser.add_argument("--offset", type=float, default=None,
                        help="time the gufuncs that take a weight offset, with this one")
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES),
                        help="comma-separated ROWSxN shapes (default the benchmark's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of both builds (default 1)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    other = load_other(args.other)
    dtypes = [resolve_dtype(name) for name in args.dtypes.split(",")]
    if BF16 is not None and BF16 in dtypes:
        other._register_bfloat16(BF16)
    rmsnorm.set_num_threads(args.threads)
    other.set_num_threads(args.threads)
    print(f"this build: {rmsnorm._core.__file__}\nother build: {args.other}\n"
          f"threads: {args.threads}"
          + ("" if args.offset is None else f", weight offset {args.offset}") + "\n")
    fwd, bwd = ("add_forward", "add_backward") if args.fused else ("fwd", "bwd")
    print(f"| shape | dtype | {fwd} / copy: this | other | {bwd} / copy: this | other |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rows, n in shapes:
        for dtype in dtypes:
            t = time_shape(other, rows, n, dtype, args.repeats, args.fused, args.offset)
            c = t["copy"]
            print(f"| {rows}x{n} | {dtype.name} | {t['fwd this'] / c:.2f} "
                  f"| {t['fwd other'] / c:.2f} | {t['bwd this'] / c:.2f} "
                  f"| {t['bwd other'] / c:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
