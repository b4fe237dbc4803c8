"""Two builds of the kernels side by side: is a change faster or slower?

    python benchmarks/compare_builds.py OTHER_CORE_SO [--repeats N] [--fused]
        [--offset OFFSET] [--dtypes D,...] [--shapes ROWSxN,...] [--threads T]
        [--processes N] [--placement BYTES]

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

Both builds run on the instruction set rmsnorm chose (``RMSNORM_ISA``
applies to both). With ``--processes N``, each build is instead timed in
processes of its own, N of each, taking turns, and the table gives the
median of their ratios: loaded into one process, two builds have timed
alike where, each alone, one was a tenth faster (docs/performance.md).
Every array starts on a page, as in bench.py; ``--placement BYTES``
starts them that far into their pages instead (64 as a torch tensor's may,
16 as NumPy's large arrays do), where a change may move otherwise.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import statistics
import subprocess
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


def time_shape(builds: dict, rows: int, n: int, dtype, repeats: int, fused: bool,
               offset: float | None = None, placement: int = 0) -> dict:
    """Median seconds of the copy and of each build's forward and backward
    (with fused, add_forward and add_backward; with an offset, the
    gufuncs that take one), every array starting placement bytes into a page."""
    rng = np.random.default_rng(0)
    x, dy, residual, dh = (page_aligned(rng.standard_normal((rows, n)).astype(dtype), placement)
                           for _ in range(4))
    w = page_aligned(rng.uniform(0.5, 1.5, n).astype(dtype), placement)
    eps = np.float64(1e-6) if dtype == np.float64 else np.float32(1e-6)
    y, h, dx, scratch = (at_page_offset(x.shape, dtype, placement) for _ in range(4))
    dw = at_page_offset(w.shape, dtype, placement)
    candidates = {"copy": lambda: np.copyto(scratch, x)}
    suffix, factor = ("", ()) if offset is None else ("_offset", (np.float64(offset),))
    for name, build in builds.items():
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
        order = list(builds) if repeat % 2 == 0 else list(builds)[::-1]
        for name in ["copy"] + [f"{kind} {build}" for kind in ("fwd", "bwd") for build in order]:
            samples[name].append(sample_seconds(candidates[name], 0.05))
    return {name: statistics.median(v) for name, v in samples.items()}


def parse_args(argv):
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
    parser.add_argument("--processes", type=int, default=0,
                        help="time each build in N processes of its own (default: both in this one)")
    parser.add_argument("--placement", type=int, default=0,
                        help="bytes into its page at which every array starts (default 0)")
    parser.add_argument("--only", choices=("this", "other"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def loaded_builds(args, names) -> dict:
    """The builds named ("this", "other"), on rmsnorm's instruction set and threads."""
    rmsnorm.set_num_threads(args.threads)
    builds = {}
    for name in names:
        if name == "this":
            builds[name] = rmsnorm
            continue
        other = load_other(args.other)
        if BF16 is not None:
            other._register_bfloat16(BF16)
        # RMSNORM_ISA is read by rmsnorm's Python layer, not by the module
        other._set_isa(rmsnorm._core._isa()[0])
        other.set_num_threads(args.threads)
        builds[name] = other
    return builds


def ratios_here(args, names) -> dict:
    """Each cell's times over the copy's, of the builds named, timed in this process."""
    builds = loaded_builds(args, names)
    ratios = {}
    for rows, n in args.shape_list:
        for dtype in args.dtype_list:
            t = time_shape(builds, rows, n, dtype, args.repeats, args.fused, args.offset,
                           args.placement)
            ratios[f"{rows}x{n} {dtype.name}"] = {
                key: value / t["copy"] for key, value in t.items() if key != "copy"}
    return ratios


def ratios_in_processes(args, argv) -> dict:
    """The medians of each build's ratios over args.processes processes of
    its own, the two builds taking turns to go first."""
    runs = []
    for turn in range(args.processes):
        for name in ("this", "other") if turn % 2 == 0 else ("other", "this"):
            child = subprocess.run([sys.executable, __file__, *argv, "--only", name],
                                   check=True, capture_output=True, text=True)
            runs.append(json.loads(child.stdout))
    return {cell: {key: statistics.median(run[cell][key] for run in runs if key in run[cell])
                   for key in ("fwd this", "fwd other", "bwd this", "bwd other")}
            for cell in runs[0]}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.shape_list = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    args.dtype_list = [resolve_dtype(name) for name in args.dtypes.split(",")]
    if args.only is not None:
        print(json.dumps(ratios_here(args, [args.only])))
        return 0
    print(f"this build: {rmsnorm._core.__file__}\nother build: {args.other}\n"
          f"threads: {args.threads}, kernels: {rmsnorm._core._isa()[0]}"
          + ("" if args.offset is None else f", weight offset {args.offset}")
          + (f", {args.processes} processes of each build" if args.processes else "")
          + (f", arrays {args.placement} bytes into their pages" if args.placement else "")
          + "\n")
    fwd, bwd = ("add_forward", "add_backward") if args.fused else ("fwd", "bwd")
    print(f"| shape | dtype | {fwd} / copy: this | other | {bwd} / copy: this | other |")
    print("| --- | --- | --- | --- | --- | --- |")
    if args.processes:
        ratios = ratios_in_processes(args, argv)
    else:
        ratios = ratios_here(args, ["this", "other"])
    for cell, r in ratios.items():
        print(f"| {cell.replace(' ', ' | ')} | {r['fwd this']:.2f} | {r['fwd other']:.2f} "
              f"| {r['bwd this']:.2f} | {r['bwd other']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
