"""A readable float64 RMSNorm, written straight from the math.

It is the independent check used by the demo and the tests: plain NumPy,
no C, no torch. It follows the same conventions as :mod:`rmsnorm`
(``eps=None`` is the machine epsilon of the compute type, a given eps is
rounded to float32 unless the input is float64), but computes everything in
float64 and never rounds back to the input's dtype.

Forward, over the last ``len(normalized_shape)`` dimensions of ``x``::

    inv_rms = 1 / sqrt(mean(x**2) + eps)
    y       = x * inv_rms * weight

Backward, with ``g = grad_output * weight`` and ``x_hat = x * inv_rms``::

    grad_input  = inv_rms * (g - x_hat * mean(g * x_hat))
    grad_weight = sum over rows of grad_output * x_hat
"""

from __future__ import annotations

import numpy as np


def reference_eps(dtype: np.dtype, eps: float | None) -> float:
    """The eps a computation on ``dtype`` actually adds, as a float64."""
    if np.dtype(dtype) == np.float64:
        return float(np.finfo(np.float64).eps) if eps is None else float(eps)
    if eps is None:
        return float(np.finfo(np.float32).eps)
    return float(np.float32(eps))


def _rows(x: np.ndarray, normalized_shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(normalized_shape))
    return np.asarray(x, dtype=np.float64).reshape(-1, n)


def rms_norm(x, normalized_shape, weight=None, eps=None) -> np.ndarray:
    """RMSNorm of ``x`` in float64."""
    x = np.asarray(x)
    shape = tuple(np.atleast_1d(normalized_shape).tolist())
    eps64 = reference_eps(x.dtype, eps)
    rows = _rows(x, shape)
    inv_rms = 1.0 / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps64)
    y = rows * inv_rms
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64).reshape(-1)
    return y.reshape(x.shape)


def rms_norm_backward(grad_output, x, normalized_shape, weight=None, eps=None):
    """``(grad_input, grad_weight)`` of :func:`rms_norm`, in float64.

    ``grad_weight`` is None when ``weight`` is None.
    """
    x = np.asarray(x)
    shape = tuple(np.atleast_1d(normalized_shape).tolist())
    eps64 = reference_eps(x.dtype, eps)
    rows = _rows(x, shape)
    grad_output = _rows(grad_output, shape)
    n = rows.shape[1]
    w = np.ones(n) if weight is None else np.asarray(weight, np.float64).reshape(-1)
    inv_rms = 1.0 / np.sqrt(np.mean(rows * rows, axis=1, keepdims=True) + eps64)
    x_hat = rows * inv_rms
    g = grad_output * w
    grad_input = inv_rms * (g - x_hat * np.mean(g * x_hat, axis=1, keepdims=True))
    grad_weight = None
    if weight is not None:
        grad_weight = np.sum(grad_output * x_hat, axis=0).reshape(shape)
    return grad_input.reshape(x.shape), grad_weight
