"""Two builds of the kernels side by side: do they write the same bytes?

    python benchmarks/same_bytes.py OTHER_CORE_SO [--isas baseline,avx2,avx512]
        [--threads 1,2] [--seed S]

OTHER_CORE_SO is another build's ``rmsnorm/_core*.so``, as for
compare_builds.py, loaded beside the installed rmsnorm. Every gufunc (the
forward, the backward, their fused residual add and weight offset forms)
runs in both builds on the same inputs, for every dtype pair, instruction
set and thread count asked for, and every output is compared byte for byte:
-0.0 is not 0.0, and a NaN's sign and payload count. The inputs are meant
to reach every path of the row kernels: lengths around the vector widths
and the tiled backward's 4096 columns, strided, transposed, reversed and
broadcast operands, outputs written over inputs, ordinary values beside
zeros, infinities, NaNs, subnormals and extreme magnitudes, and eps from 0
to large. A change that is meant to leave the results alone (a refactor, a
new code layout, a faster loop) passes only with no difference at all.
Exits 1 on any difference, naming the call and the first differing element.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
from compare_builds import load_other

import rmsnorm
from rmsnorm import _core
from rmsnorm._dtypes import BF16

# (rows, n): a row shorter than a vector, around the widths of each
# instruction set's blocks and steps (16, 32, 64 elements), past the
# tiled backward's 4096 columns, and one of enough elements (two chunks,
# 131072) that more than one thread shares it.
SHAPES = [(3, 1), (5, 7), (4, 33), (9, 64), (6, 100), (40, 257), (300, 96), (3, 4100),
          (36, 4100)]


def dtype_of(name: str):
    return BF16 if name == "bfloat16" else np.dtype(name)


def values(rng, kind: str, shape, dtype) -> np.ndarray:
    """Float64 values of one kind, then rounded to dtype."""
    info = np.finfo(dtype if dtype in (np.float16, np.float64) else np.float32)
    with np.errstate(all="ignore"):
        return np.asarray(float64_values(rng, kind, shape, info, dtype)).astype(dtype)


def float64_values(rng, kind, shape, info, dtype) -> np.ndarray:
    if kind == "normal":
        v = rng.standard_normal(shape)
    elif kind == "wide":  # magnitudes over the whole exponent range of the kind
        top = 300 if dtype == np.float64 else 30
        v = rng.standard_normal(shape) * 10.0 ** rng.uniform(-top, top, shape)
    elif kind == "special":  # zeros of both signs, infinities, NaNs among normal values
        v = rng.standard_normal(shape)
        picks = rng.integers(0, 12, shape)
        v[picks == 0] = 0.0
        v[picks == 1] = -0.0
        v[picks == 2] = np.inf
        v[picks == 3] = -np.inf
        v[picks == 4] = np.nan
    elif kind == "tiny":  # subnormal in the kind, and rows of them
        v = rng.standard_normal(shape) * float(info.smallest_subnormal) * 64
    else:  # "huge": past the square root of the largest value
        v = rng.standard_normal(shape) * float(info.max) / 8
    return v


def layout(rng, a: np.ndarray, how: str) -> np.ndarray:
    """The same values, laid out another way in memory."""
    if how == "contiguous":
        return a
    if how == "strided":  # every other element of a wider array
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    if how == "transposed":
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    return np.ascontiguousarray(a[..., ::-1])[..., ::-1]  # "reversed"


def cases(rng):
    """Each case's name and its row count, length, value kind, layout and eps."""
    for (rows, n), kind in itertools.product(SHAPES, ["normal", "wide", "special", "tiny", "huge"]):
        for how in ["contiguous", "strided", "transposed", "reversed"]:
            for eps in [1e-6, 0.0, 1e30 if kind == "huge" else 0.5]:
                yield f"{rows}x{n} {kind} {how} eps={eps:g}", rows, n, kind, how, eps


def arguments(ufunc, pair, rows, n, kind, how, eps, rng):
    """The inputs of one call of ufunc, by its core signature: (m,n) and
    (n) operands of x's dtype, the one weight-like (n) operand of the
    weight's, an offset of 1.5 where there is one, then eps."""
    x_dtype, w_dtype, eps_dtype = (dtype_of(name) for name in pair)
    cores = ufunc.signature.split("->")[0].replace("),(", ")|(").split("|")
    weight_at = max(i for i, core in enumerate(cores) if core == "(n)")
    scalars = [i for i, core in enumerate(cores) if core == "()"]
    args = []
    for i, core in enumerate(cores):
        if i == weight_at:
            w = values(rng, "normal" if kind != "special" else kind, (n,), w_dtype)
            args.append(layout(rng, w[None], how)[0])
        elif core == "()":
            is_offset = len(scalars) == 2 and i == scalars[0]
            args.append(np.float64(1.5) if is_offset else np.asarray(eps).astype(eps_dtype)[()])
        else:
            args.append(layout(rng, values(rng, kind, (rows, n), x_dtype), how))
    return args


def aligned_empty(like) -> np.ndarray:
    """An array like `like` whose data starts on a 64-byte boundary: a row's
    first blocks are written by the partial-block path up to the first
    aligned one, so both builds get outputs of the same alignment."""
    like = np.asarray(like)
    raw = np.empty(like.nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + like.nbytes].view(like.dtype).reshape(like.shape)


def as_bytes(a, nan_bits: bool) -> bytes:
    """The array's dtype, shape and bytes; every NaN made the same one where
    nan_bits is False (a NaN's sign and payload come from whichever operand
    the instruction that made it took, and the kernels' paths for one input
    differ in that)."""
    a = np.array(a, copy=True)
    if not nan_bits and (a.dtype.kind == "f" or a.dtype == BF16):
        a[np.isnan(a.astype(np.float32) if a.dtype == BF16 else a)] = np.nan
    return a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()


def first_difference(a, b) -> str:
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shapes {a.shape} {a.dtype} and {b.shape} {b.dtype}"
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    ab, bb = np.ascontiguousarray(a).view(bits), np.ascontiguousarray(b).view(bits)
    where = tuple(int(i) for i in np.argwhere(ab != bb)[0])
    return (f"at {where}: {a[where]!r} (0x{int(ab[where]):x}) against "
            f"{b[where]!r} (0x{int(bb[where]):x})")


def compare(other, isas, thread_counts, seed) -> int:
    """Runs every call in both builds; returns the number of differences."""
    compared = differences = nan_differences = 0
    pairs = [p for p in _core.dtype_pairs if BF16 is not None or "bfloat16" not in p]
    names = ["forward", "forward_offset", "add_forward", "add_forward_offset",
             "backward", "backward_offset", "add_backward", "add_backward_offset"]
    for isa, threads in itertools.product(isas, thread_counts):
        _core._set_isa(isa)
        other._set_isa(isa)
        rmsnorm.set_num_threads(threads)
        other.set_num_threads(threads)
        for name, pair in itertools.product(names, pairs):
            rng = np.random.default_rng(seed)
            for label, rows, n, kind, how, eps in cases(rng):
                args = arguments(getattr(_core, name), pair, rows, n, kind, how, eps, rng)
                with np.errstate(all="ignore"):
                    shapes = getattr(_core, name)(*args)
                    shapes = shapes if isinstance(shapes, tuple) else (shapes,)
                    ours = tuple(aligned_empty(a) for a in shapes)
                    theirs = tuple(aligned_empty(a) for a in shapes)
                    getattr(_core, name)(*args, out=ours)
                    getattr(other, name)(*args, out=theirs)
                for k, (a, b) in enumerate(zip(ours, theirs)):
                    compared += 1
                    nan_differences += as_bytes(a, True) != as_bytes(b, True)
                    if as_bytes(a, False) != as_bytes(b, False):
                        differences += 1
                        if differences <= 20:
                            print(f"DIFFERENT {isa} threads={threads} {name} {pair} {label} "
                                  f"output {k}: {first_difference(a, b)}")
        print(f"{isa}, {threads} thread(s): {compared} outputs compared, "
              f"{differences} different so far; {nan_differences} with NaNs of other bits",
              flush=True)
    return differences


def in_place(other, isas, seed) -> int:
    """The forward with y written over x, and the fused forward with its
    sum written over the residual: each build on its own copy."""
    differences = 0
    rng = np.random.default_rng(seed)
    for isa, pair in itertools.product(isas, _core.dtype_pairs):
        if BF16 is None and "bfloat16" in pair:
            continue
        _core._set_isa(isa)
        other._set_isa(isa)
        for rows, n in SHAPES:
            x = values(rng, "normal", (rows, n), dtype_of(pair[0]))
            r = values(rng, "normal", (rows, n), dtype_of(pair[0]))
            w = values(rng, "normal", (n,), dtype_of(pair[1]))
            eps = np.asarray(1e-6).astype(dtype_of(pair[2]))[()]
            results = []
            for build in (_core, other):
                xc, rc = x.copy(), r.copy()
                build.forward(xc, w, eps, out=xc)
                build.add_forward(x, rc, w, eps, out=(np.empty_like(x), rc))
                results.append(as_bytes(xc, False) + as_bytes(rc, False))
            if results[0] != results[1]:
                differences += 1
                print(f"DIFFERENT in place {isa} {pair} {rows}x{n}")
    print(f"in place: {differences} different")
    return differences


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other build's rmsnorm/_core*.so")
    parser.add_argument("--isas", default=",".join(_core._isa()[1]),
                        help="comma-separated instruction sets (default: every one this CPU has)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    other = load_other(args.other)
    if BF16 is not None:
        other._register_bfloat16(BF16)
    isas = args.isas.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    print(f"this build: {_core.__file__}\nother build: {args.other}")
    differences = compare(other, isas, threads, args.seed) + in_place(other, isas, args.seed)
    print("same bytes" if differences == 0 else f"{differences} calls differ")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
