"""The floor under the float16 forward: its arithmetic alone, beside a copy.

    python benchmarks/forward_floor.py [--rows R] [--n N] [--repeats K]

Builds forward_floor.c with the system C compiler (``cc``, or ``$CC``) and
runs it on R rows of N float16 values (32x4096 by default: the in-cache
shape of the speed goals, 256 KiB each way). Each of its loops is written in
the kernels' own AVX-512 vocabulary and does only what an exactly rounded
float16 output needs: the double sums of squares ("reduce"), the two
roundings to float16 and their compare ("write"), and both in one loop as
the kernel runs them ("forward"). Nothing else is in them: no calls, row
set-up, partial blocks or second passes. The real kernel
(``rmsnorm.forward`` with ``out=``) and ``np.copyto`` are timed beside them
on the same shape, interleaved as bench.py times its candidates.

What to read from it: "forward / copy" is the least that the float16
forward's time over a copy's can be in this design on this CPU, and the
kernel's own ratio says how much of its time the rest takes. The issue's
goal for the in-cache forward is 3x a copy. Needs an x86-64 CPU with
AVX-512 (F, BW, DQ, VL), F16C and FMA, and prints why not where there is
none.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench import interleaved_medians

import rmsnorm

HERE = Path(__file__).resolve().parent
# setup.py's flags, and the instruction sets of csrc/kernels/isa_avx512.c
FLAGS = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wextra",
         "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mf16c"]


def build(out: Path) -> Path:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        sys.exit(f"no C compiler: {compiler!r} (set CC)")
    binary = out / "forward_floor"
    subprocess.run([compiler, *FLAGS, str(HERE / "forward_floor.c"), "-o", str(binary)],
                   check=True)
    return binary


def skeleton_seconds(binary: Path, rows: int, n: int, repeats: int) -> dict[str, float]:
    """Median seconds of each of the skeleton's loops over all rows."""
    result = subprocess.run([str(binary), str(rows), str(n), str(repeats)],
                            check=True, capture_output=True, text=True)
    return {name: float(value)
            for name, value in (line.split() for line in result.stdout.splitlines())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--n", type=int, default=4096, help="a multiple of 64")
    parser.add_argument("--repeats", type=int, default=201,
                        help="timings of the skeleton's loops, and interleaved repeats "
                        "(10 ms each) of the copy and the kernel; medians of each")
    args = parser.parse_args(argv)
    if args.rows <= 0 or args.n <= 0 or args.n % 64 or args.repeats <= 0:
        parser.error("--rows and --repeats must be positive, --n a positive multiple of 64")
    isa, available = rmsnorm._core._isa()
    if "avx512" not in available:
        print(f"this CPU has no AVX-512 kernels (it has {', '.join(available)}): "
              "the skeleton is written in their vocabulary")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        skeleton = skeleton_seconds(binary, args.rows, args.n, args.repeats)
    rmsnorm.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, (args.rows, args.n)).astype(np.float16)
    w = rng.uniform(0.5, 1.5, args.n).astype(np.float16)
    y, scratch = np.empty_like(x), np.empty_like(x)
    eps = np.float32(1e-6)
    timed = interleaved_medians({"copy": lambda: np.copyto(scratch, x),
                                 "kernel": lambda: rmsnorm.forward(x, w, eps, out=y)},
                                args.repeats, 0.01)
    copy, kernel = timed["copy"], timed["kernel"]
    elements = args.rows * args.n
    print(f"float16, {args.rows}x{args.n}, 1 thread, kernels: {isa}; medians of "
          f"{args.repeats}\n")
    print("| loop | ns an element | / skeleton copy | / np.copyto |")
    print("| --- | --- | --- | --- |")
    rows = [(f"skeleton {name}", seconds) for name, seconds in skeleton.items()]
    rows += [("np.copyto", copy), ("rmsnorm.forward, out=", kernel)]
    for name, seconds in rows:
        print(f"| {name} | {seconds / elements * 1e9:.3f} | {seconds / skeleton['copy']:.2f} "
              f"| {seconds / copy:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
