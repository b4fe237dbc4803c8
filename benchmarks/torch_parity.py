"""The largest differences from torch over a grid of parity cases, per dtype.

    python benchmarks/torch_parity.py        # the NumPy functions
    python benchmarks/torch_parity.py --op   # rmsnorm.torch's op, autograd

The first compares rmsnorm.rms_norm and rms_norm_backward, on float32 and
float64 arrays, with torch.nn.functional.rms_norm and its autograd. The
second compares rmsnorm.torch.rms_norm, its gradients taken by
torch.autograd, with the same, on tensors of every dtype the kernels serve.

For the forward: the largest absolute difference and the largest distance in
ULPs of the dtype. For each gradient: the largest absolute difference, and
that difference over max(1, the largest |element| of torch's gradient), the
scale torch's own rounding error follows. The tests assert that all of these
stay within torch.testing.assert_close's tolerances; this prints how close
they come.
"""

from __future__ import annotations

import argparse
import itertools
import warnings

import numpy as np
import torch

import rmsnorm

# (input shape, number of normalised dims)
SHAPES = [((7,), 1), ((5, 1), 1), ((3, 5), 1), ((3, 127), 1), ((2, 3, 64), 1),
          ((2, 2, 3, 1000), 1), ((4, 8192), 1), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 3)]
EPS = [None, 1e-6, 1e-5, 0.5, -0.5]


def worst_differences(dtype, rng) -> dict[str, float]:
    worst = dict.fromkeys(["forward abs", "forward ULP", "grad_input abs", "grad_input scaled",
                           "grad_weight abs", "grad_weight scaled"], 0.0)
    for (shape, dims), eps, affine in itertools.product(SHAPES, EPS, [True, False]):
        # eps = -0.5 needs mean(x^2) > 0.5: scale the rows up
        x = rng.standard_normal(shape).astype(dtype) * (3 if eps == -0.5 else 1)
        normalized_shape = list(shape[-dims:])
        weight = rng.uniform(0.5, 1.5, normalized_shape).astype(dtype) if affine else None
        grad_output = rng.standard_normal(shape).astype(dtype)

        tx = torch.from_numpy(x).requires_grad_()
        tw = torch.from_numpy(weight).requires_grad_() if affine else None
        torch.nn.functional.rms_norm(tx, normalized_shape, tw, eps).backward(
            torch.from_numpy(grad_output))
        expected_y = torch.nn.functional.rms_norm(
            torch.from_numpy(x), normalized_shape, None if tw is None else tw.detach(), eps).numpy()

        y = rmsnorm.rms_norm(x, normalized_shape, weight, eps)
        grad_input, grad_weight = rmsnorm.rms_norm_backward(
            grad_output, x, normalized_shape, weight, eps)

        diff = np.abs(y.astype(np.float64) - expected_y)
        worst["forward abs"] = max(worst["forward abs"], diff.max())
        ulps = diff / np.spacing(np.abs(expected_y).astype(dtype))
        worst["forward ULP"] = max(worst["forward ULP"], ulps.max())
        pairs = [("grad_input", grad_input, tx.grad.numpy())]
        if affine:
            pairs.append(("grad_weight", grad_weight, tw.grad.numpy()))
        for name, ours, theirs in pairs:
            diff = np.abs(ours.astype(np.float64) - theirs).max()
            worst[f"{name} abs"] = max(worst[f"{name} abs"], diff)
            scaled = diff / max(1.0, np.abs(theirs).max())
            worst[f"{name} scaled"] = max(worst[f"{name} scaled"], scaled)
    return worst


# Significant bits and the smallest normal exponent of each tensor dtype.
FORMATS = {torch.float16: (11, -14), torch.bfloat16: (8, -126), torch.float32: (24, -126),
           torch.float64: (53, -1022)}


def ulps_of(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The spacing of dtype at each of values (float64), subnormals included."""
    bits, min_exponent = FORMATS[dtype]
    _, exponent = np.frexp(np.abs(values))  # |v| = m 2^exponent, 0.5 <= m < 1
    return np.ldexp(1.0, np.maximum(exponent - 1, min_exponent) - (bits - 1))


def op_worst_differences(dtype: torch.dtype, rng) -> dict[str, float]:
    """As worst_differences, through rmsnorm.torch.rms_norm and autograd."""
    import rmsnorm.torch

    worst = dict.fromkeys(["forward abs", "forward ULP", "grad_input abs", "grad_input scaled",
                           "grad_weight abs", "grad_weight scaled"], 0.0)
    for (shape, dims), eps, affine in itertools.product(SHAPES, EPS, [True, False]):
        x = torch.from_numpy(rng.standard_normal(shape) * (3 if eps == -0.5 else 1)).to(dtype)
        normalized_shape = list(shape[-dims:])
        weight = (torch.from_numpy(rng.uniform(0.5, 1.5, normalized_shape)).to(dtype)
                  if affine else None)
        grad_output = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
        results = []
        for rms_norm in (torch.nn.functional.rms_norm, rmsnorm.torch.rms_norm):
            tx = x.clone().requires_grad_()
            tw = weight.clone().requires_grad_() if affine else None
            y = rms_norm(tx, normalized_shape, tw, eps)
            y.backward(grad_output)
            results.append((y.detach(), tx.grad, None if tw is None else tw.grad))
        (expected_y, *theirs), (y, *ours) = results
        expected = expected_y.double().numpy()
        diff = np.abs(y.double().numpy() - expected)
        worst["forward abs"] = max(worst["forward abs"], diff.max())
        worst["forward ULP"] = max(worst["forward ULP"], (diff / ulps_of(expected, dtype)).max())
        for name, mine, torch_grad in zip(["grad_input", "grad_weight"], ours, theirs):
            if torch_grad is None:
                continue
            torch_grad = torch_grad.double().numpy()
            diff = np.abs(mine.double().numpy() - torch_grad).max()
            worst[f"{name} abs"] = max(worst[f"{name} abs"], diff)
            worst[f"{name} scaled"] = max(worst[f"{name} scaled"],
                                          diff / max(1.0, np.abs(torch_grad).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", action="store_true",
                        help="through rmsnorm.torch's op and autograd, every dtype")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Mismatch dtype")
    rng = np.random.default_rng(0)
    if args.op:
        for dtype in FORMATS:
            worst = op_worst_differences(dtype, rng)
            print(str(dtype).removeprefix("torch.") + ": "
                  + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
        return
    for dtype in (np.float32, np.float64):
        worst = worst_differences(dtype, rng)
        print(np.dtype(dtype).name + ": " + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
