"""``python -m rmsnorm``: RMSNorm forward and backward on a small batch, step by step.

Each step is printed, then checked against the float64 reference in
rmsnorm.reference and, when torch is installed, against torch.nn.RMSNorm and
torch autograd. Exits 1 if any check fails.
"""

from __future__ import annotations

import sys

import numpy as np

import rmsnorm
from rmsnorm import reference


def _show(title: str, array: np.ndarray) -> None:
    print(f"\n{title}  shape={array.shape} dtype={array.dtype}")
    print(np.array2string(np.asarray(array), precision=5, suppress_small=True, max_line_width=100))


def _check(name: str, ours, expected, rtol: float, atol: float) -> bool:
    ours64 = np.asarray(ours, np.float64)
    expected64 = np.asarray(expected, np.float64)
    diff = np.abs(ours64 - expected64)
    ok = bool(np.all(diff <= atol + rtol * np.abs(expected64)))
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<34} max |diff| = {diff.max():.3g}")
    return ok


def _torch_results(x, weight, eps, grad_output):
    try:
        import torch
    except ImportError:
        return None
    layer = torch.nn.RMSNorm(weight.shape, eps=eps)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
    tx = torch.from_numpy(x).requires_grad_()
    ty = layer(tx)
    ty.backward(torch.from_numpy(grad_output))
    return ty.detach().numpy(), tx.grad.numpy(), layer.weight.grad.numpy()


def main() -> int:
    rng = np.random.default_rng(2024)
    batch, tokens, hidden = 2, 3, 8
    eps = 1e-6
    x = rng.standard_normal((batch, tokens, hidden)).astype(np.float32)
    x[1, 2] *= 100.0  # one token a hundred times louder than the rest

    layer = rmsnorm.RMSNorm(hidden, eps=eps)
    layer.weight[:] = np.linspace(0.5, 1.5, hidden, dtype=np.float32)
    print(f"rmsnorm {rmsnorm.__version__}: {layer}")
    _show("input x", x)

    rms = np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1) + np.float32(eps))
    _show("RMS of each row: sqrt(mean(x^2) + eps)", rms)
    _show("normalised rows x / RMS (each row now has RMS ~ 1)", x / rms[..., None])
    _show("weight (gamma)", layer.weight)

    y = layer(x)
    _show("output y = x / RMS * weight", y)

    grad_output = rng.standard_normal(y.shape).astype(np.float32)
    grad_input = layer.backward(grad_output)
    _show("grad_input for a random grad_output", grad_input)
    _show("grad_weight (summed over all rows)", layer.weight_grad)

    # float32 results against float64 references: float32 rounding, nothing more.
    rtol, atol = 1.3e-6, 1e-5
    print("\nChecks against the float64 reference (rmsnorm.reference):")
    ref_y = reference.rms_norm(x, hidden, layer.weight, eps)
    ref_gi, ref_gw = reference.rms_norm_backward(grad_output, x, hidden, layer.weight, eps)
    ok = _check("output", y, ref_y, rtol, atol)
    ok &= _check("grad_input", grad_input, ref_gi, rtol, atol)
    ok &= _check("grad_weight", layer.weight_grad, ref_gw, rtol, atol)

    torch_results = _torch_results(x, layer.weight, eps, grad_output)
    if torch_results is None:
        print("\ntorch is not installed: the torch comparison is skipped (pip install torch==2.13.0).")
    else:
        print("\nChecks against torch.nn.RMSNorm and torch autograd:")
        ok &= _check("output vs torch", y, torch_results[0], rtol, atol)
        ok &= _check("grad_input vs torch", grad_input, torch_results[1], rtol, atol)
        ok &= _check("grad_weight vs torch", layer.weight_grad, torch_results[2], rtol, atol)

    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
