"""The accuracy corpus: cases, their exact results and the error measures.

tests/test_dtypes_accuracy.py asserts the accuracy goals on it, and
benchmarks/accuracy.py prints the README's table from it; it lives here so
that the tests import nothing from benchmarks/.

The forward error is the largest distance, in ULPs of the output dtype, of
any element from the exact result. The exact result is computed from the
same (already rounded) inputs in long double for float64 inputs and in
float64 for the narrower ones, whose products and sums that precision holds
exactly enough. Gradients are compared norm-wise: ||ours - exact|| / ||exact||.

A case with a weight offset (Gemma's, 1 + weight, with weights near 0) takes
the exact factor offset + weight, which rmsnorm forms exactly, and compares
torch's Gemma code, which rounds 1 + weight in float32 before the product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import rmsnorm
from rmsnorm._dtypes import BF16, resolve_dtype

# (significand bits, smallest normal exponent) of each format, for ULPs.
FORMATS = {"float16": (11, -14), "bfloat16": (8, -126), "float32": (24, -126), "float64": (53, -1022)}
DTYPES = ["float32", "float16", "bfloat16", "float64"]


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str
    eps: float
    weight_offset: float = 0.0


def ulp(exact: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of `dtype` at each exact value (its subnormal spacing at least)."""
    bits, min_exponent = FORMATS[dtype]
    _, exponent = np.frexp(np.abs(exact).astype(np.float64))
    exponent = np.maximum(exponent - 1, min_exponent)
    return np.ldexp(np.longdouble(1), (exponent - (bits - 1)).astype(np.int64))


# Gemma's norm: normal data, offset 1, weights near 0 (near_zero_weights).
GEMMA = "Gemma: offset 1, weight near 0"


def near_zero_weights(n: int, rng: np.random.Generator) -> np.ndarray:
    """Weights of magnitude 2^-24 to 1/2, both signs: a Gemma weight is
    small beside its offset of 1, and 1 + w in float32 loses its low bits."""
    return rng.uniform(1, 2, n) * np.exp2(rng.integers(-24, -1, n)) * rng.choice([-1.0, 1.0], n)


def make_rows(case: str, dtype: str, rng: np.random.Generator, rows=16, n=1024) -> np.ndarray:
    """The inputs of one case, already rounded to `dtype`, as float64 (exactly)."""
    big, small = (1e4, 1e-4) if dtype == "float16" else (1e6, 1e-6)
    if case in ("normal", GEMMA):
        x = rng.standard_normal((rows, n))
    elif case == "uniform ±1000":
        x = rng.uniform(-1000, 1000, (rows, n))
    elif case == f"mixed {big:g} and {small:g}":
        x = np.where(rng.random((rows, n)) < 0.5, big, small) * rng.uniform(0.5, 2, (rows, n))
        x *= rng.choice([-1.0, 1.0], (rows, n))
    elif case == "huge":  # squares overflow the naive computation
        x = rng.uniform(0.5, 2, (rows, n)) * (1e160 if dtype == "float64" else 1e25)
    elif case == "tiny, eps=0":  # squares underflow the naive computation
        x = rng.uniform(0.5, 2, (rows, n)) * (1e-170 if dtype == "float64" else 1e-30)
    elif case == "near float16 max":
        x = rng.uniform(6e4, 65504, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n))
    else:
        raise ValueError(case)
    return x.astype(resolve_dtype(dtype)).astype(np.float64)


def cases():
    for dtype in DTYPES:
        if dtype == "bfloat16" and BF16 is None:
            continue
        mixed = "mixed 10000 and 0.0001" if dtype == "float16" else "mixed 1e+06 and 1e-06"
        names = ["normal", "uniform ±1000", mixed]
        names += ["near float16 max"] if dtype == "float16" else ["huge", "tiny, eps=0"]
        for name in names:
            yield Case(name, dtype, 0.0 if name.startswith("tiny") else 1e-6)
        yield Case(GEMMA, dtype, 1e-6, weight_offset=1.0)


def exact_forward_backward(x64, w64, dy64, eps: float, dtype: str, weight_offset: float = 0.0):
    """y, grad_input and grad_weight from the rounded inputs, in extended
    precision; the factor is weight_offset + w (exact in float64 for the
    narrow dtypes' weights, to 2^-64 in long double for float64's)."""
    wide = np.longdouble if dtype == "float64" else np.float64
    # eps as the kernels see it: float32 unless the input is float64
    eps = wide(eps) if dtype == "float64" else wide(np.float32(eps))
    x, dy = (a.astype(wide) for a in (x64, dy64))
    w = wide(weight_offset) + w64.astype(wide)
    n = x.shape[-1]
    scale = np.max(np.abs(x), axis=-1, keepdims=True)  # keeps long double squares in range
    scale[scale == 0] = 1
    xs = x / scale
    mean_square = np.mean(xs * xs, axis=-1, keepdims=True) + eps / (scale * scale)
    inv_rms = 1 / (np.sqrt(mean_square) * scale)
    x_hat = x * inv_rms
    g = dy * w
    grad_input = inv_rms * (g - x_hat * np.sum(g * x_hat, axis=-1, keepdims=True) / n)
    grad_weight = np.sum(dy * x_hat, axis=0)
    return x_hat * w, grad_input, grad_weight


def cast(array64: np.ndarray, dtype: str) -> np.ndarray:
    return array64.astype(resolve_dtype(dtype))


def torch_forward_backward(x, w, dy, eps: float, weight_offset: float = 0.0):
    """torch's y, grad_input and grad_weight, as float64 arrays (None without
    torch): F.rms_norm, or with a weight offset Gemma's code, in float32 (in
    float64 for float64, which its .float() would narrow)."""
    try:
        import torch
    except ImportError:
        return None

    def tensor(a):
        if a.dtype == BF16:  # torch reads no ml_dtypes array: go through the bits
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a))

    def to64(t):
        return t.detach().to(torch.float64).numpy()

    tx, tw = tensor(x).requires_grad_(), tensor(w).requires_grad_()
    if weight_offset:
        wide = torch.promote_types(tx.dtype, torch.float32)
        xf = tx.to(wide)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = (y * (weight_offset + tw.to(wide))).to(tx.dtype)
    else:
        y = torch.nn.functional.rms_norm(tx, [x.shape[-1]], tw, eps)
    y.backward(tensor(dy))
    return to64(y), to64(tx.grad), to64(tw.grad)


def errors(ours, exact, dtype: str):
    """(max ULP error of the forward, norm-wise errors of the two gradients)."""
    # in long double: rounding the exact values first would hide fractions of a ULP
    y, gi, gw = (np.asarray(a, np.longdouble) for a in ours)
    ey, egi, egw = (np.asarray(a, np.longdouble) for a in exact)
    with np.errstate(invalid="ignore", over="ignore"):
        ulps = np.abs(y - ey) / ulp(ey, dtype)
    forward = math.inf if not np.all(np.isfinite(ulps)) else float(np.max(ulps))

    def normwise(a, e):
        scale = np.max(np.abs(e))  # keeps the norms of 1e170-sized values finite
        diff = np.linalg.norm((a - e) / scale)
        return math.inf if not np.isfinite(diff) else float(diff / np.linalg.norm(e / scale))

    return forward, normwise(gi, egi), normwise(gw, egw)


def measure(case: Case, seed: int = 0):
    """Errors of ours, of torch (None without torch) and of the exact result
    rounded to the dtype (the best any implementation can return)."""
    rng = np.random.default_rng(seed)
    x64 = make_rows(case.name, case.dtype, rng)
    n, offset = x64.shape[-1], case.weight_offset
    w64 = near_zero_weights(n, rng) if offset else rng.uniform(0.5, 1.5, n)
    w64 = cast(w64, case.dtype).astype(np.float64)
    dy64 = cast(rng.standard_normal(x64.shape), case.dtype).astype(np.float64)
    x, w, dy = (cast(a, case.dtype) for a in (x64, w64, dy64))
    exact = exact_forward_backward(x64, w64, dy64, case.eps, case.dtype, offset)
    y = rmsnorm.rms_norm(x, n, w, case.eps, weight_offset=offset)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(dy, x, n, w, case.eps, weight_offset=offset)
    ours = errors((y, grad_input, grad_weight), exact, case.dtype)
    theirs = torch_forward_backward(x, w, dy, case.eps, offset)
    rounded = errors([cast(np.asarray(e, np.float64), case.dtype) for e in exact], exact, case.dtype)
    return ours, None if theirs is None else errors(theirs, exact, case.dtype), rounded
