"""The module API: torch.nn.RMSNorm's contract, holding weight and its gradient."""

from __future__ import annotations

import collections.abc

import numpy as np

from ._dtypes import WEIGHT_DTYPES, resolve_dtype
from .functional import normalized_shape_tuple, rms_norm, rms_norm_backward


class RMSNorm:
    """RMSNorm over the last ``len(normalized_shape)`` dimensions.

    Mirrors ``torch.nn.RMSNorm``: ``weight`` starts as ones (so the layer
    starts as plain RMS normalisation), ``eps=None`` means the machine
    epsilon of the compute type. There is no autograd: ``backward`` takes
    the gradient of the most recent ``forward``'s output, returns the
    input's gradient and adds the weight's into ``weight_grad``, as torch
    accumulates ``.grad``.

    The input is kept by reference for ``backward``, as torch saves it:
    changing it in place between the two calls changes the gradient.

    >>> import numpy as np, rmsnorm
    >>> layer = rmsnorm.RMSNorm(2, eps=0.0)
    >>> layer
    RMSNorm((2,), eps=0.0, elementwise_affine=True)
    >>> layer(np.array([[3.0, 4.0]], dtype=np.float32))
    array([[0.84852815, 1.1313709 ]], dtype=float32)
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, *, dtype=None):
        self.normalized_shape = normalized_shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = None
        if elementwise_affine:
            weight_dtype = np.dtype(np.float32) if dtype is None else resolve_dtype(dtype)
            if weight_dtype not in WEIGHT_DTYPES:
                names = ", ".join(str(d) for d in WEIGHT_DTYPES)
                raise TypeError(f"RMSNorm's dtype must be one of {names}, got {weight_dtype}")
            self.weight = np.empty(self.normalized_shape, weight_dtype)
        self.weight_grad = None
        self._input = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Sets the weight to ones: the single place it is initialised."""
        if self.weight is not None:
            self.weight[...] = 1

    def forward(self, x):
        """Normalises ``x`` and keeps it for :meth:`backward`."""
        y = rms_norm(x, self.normalized_shape, self.weight, self.eps)
        self._input = x
        return y

    __call__ = forward

    def backward(self, grad_output):
        """The input's gradient for the last forward; adds into ``weight_grad``."""
        if self._input is None:
            raise ValueError("RMSNorm.backward() called before forward(): there is no input")
        grad_input, grad_weight = rms_norm_backward(
            grad_output, self._input, self.normalized_shape, self.weight, self.eps
        )
        if grad_weight is not None:
            if self.weight_grad is None:
                self.weight_grad = grad_weight
            else:
                self.weight_grad += grad_weight
        return grad_input

    def zero_grad(self) -> None:
        """Forgets the accumulated weight gradient (torch's set_to_none)."""
        self.weight_grad = None

    def state_dict(self) -> dict:
        """``{"weight": weight}``, or ``{}`` without an affine weight."""
        return {} if self.weight is None else {"weight": self.weight}

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Copies ``state_dict["weight"]`` (anything np.asarray takes) into weight."""
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        expected = set(self.state_dict())
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        problems = []
        if missing:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if unexpected and strict:
            problems.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected)
            )
        if self.weight is not None and not missing:
            value = np.asarray(state_dict["weight"])
            if value.shape != self.weight.shape:
                problems.append(
                    f"size mismatch for weight: copying a param with shape {value.shape} from "
                    f"checkpoint, the shape in current model is {self.weight.shape}."
                )
            elif value.dtype.kind not in "fiu" and value.dtype not in WEIGHT_DTYPES:
                problems.append(f"weight must be a real array, got dtype {value.dtype}")
        if problems:
            raise ValueError("Error(s) in loading state_dict for RMSNorm: " + "; ".join(problems))
        if self.weight is not None:
            np.copyto(self.weight, value, casting="unsafe")

    def extra_repr(self) -> str:
        """The text inside ``RMSNorm(...)`` in the repr, as torch's extra_repr."""
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}"
        )

    def __repr__(self) -> str:
        return f"RMSNorm({self.extra_repr()})"
