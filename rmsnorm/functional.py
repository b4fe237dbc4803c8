"""The functional API: torch.nn.functional.rms_norm's contract over the gufuncs.

This layer validates and folds shapes; the arithmetic is all in C. Shape
errors are ``ValueError`` with torch's own texts (torch raises RuntimeError
for them); dtype and argument-type errors are ``TypeError``.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import numbers

import numpy as np

from ._core import _forward_direct, backward, forward
from ._dtypes import DEFAULT_EPS, EPS_DTYPE, WEIGHT_DTYPES, loop_weight_dtype


def _as_array(obj):
    """ndarrays and duck arrays (dask, ...) as they are, anything else via NumPy.

    Duck arrays that implement ``__array_ufunc__`` reach the gufunc intact, so
    it dispatches to them exactly as a NumPy ufunc would.
    """
    if isinstance(obj, np.ndarray) or (
        hasattr(obj, "__array_ufunc__") and hasattr(obj, "shape") and hasattr(obj, "dtype")
    ):
        return obj
    return np.asarray(obj)


def _compute_dtype(array, what: str) -> np.dtype:
    """The native dtype of the loop for ``array``, or TypeError naming its dtype."""
    dtype = np.dtype(array.dtype)
    native = dtype.newbyteorder("=")
    if native not in WEIGHT_DTYPES:
        names = ", ".join(str(d) for d in WEIGHT_DTYPES)
        raise TypeError(
            f'"rms_norm" not implemented for {what} dtype {dtype}: '
            f"expected a floating-point array ({names})"
        )
    return native


def normalized_shape_tuple(normalized_shape) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints, as torch.nn.RMSNorm stores it."""
    if isinstance(normalized_shape, np.ndarray) and normalized_shape.ndim == 0:
        normalized_shape = normalized_shape[()]  # a 0-d array is its scalar, as NumPy treats it
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        return (int(normalized_shape),)
    if isinstance(normalized_shape, (str, bytes)) or not isinstance(
        normalized_shape, (collections.abc.Sequence, np.ndarray)
    ):
        raise TypeError(
            "normalized_shape must be an int or a sequence of ints, "
            f"got {type(normalized_shape).__name__}"
        )
    shape = tuple(normalized_shape)
    for size in shape:
        if not isinstance(size, numbers.Integral) or isinstance(size, bool):
            raise TypeError(
                "normalized_shape must be an int or a sequence of ints, "
                f"got an element of type {type(size).__name__}"
            )
    return tuple(int(size) for size in shape)


def _torch_list(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def weight_shape_error(weight_shape, normalized_shape) -> ValueError:
    """The error, in torch's words, for a weight whose shape is not normalized_shape."""
    return ValueError(
        "Expected weight to be of same shape as normalized_shape, but got weight of shape "
        f"{_torch_list(weight_shape)} and normalized_shape = {_torch_list(normalized_shape)}"
    )


def _resolve_eps(eps, dtype: np.dtype) -> np.floating:
    """eps as the loops take it, float32 unless the input is float64 (so a
    given eps is rounded to float32 there, as torch does); None is the
    compute type's machine epsilon. A NumPy scalar, not a Python float: a
    duck array may turn a Python float into a float64 array (dask does),
    which would pick the float64 loop for float32 input."""
    eps_type = EPS_DTYPE[dtype].type
    if type(eps) is float:
        return eps_type(eps)
    if eps is None:
        return eps_type(DEFAULT_EPS[dtype])
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a real number or None, got {type(eps).__name__}")
    return eps_type(eps)


@functools.lru_cache(maxsize=64)
def _unit_weight(n: int, dtype: np.dtype) -> np.ndarray:
    # A row of ones: multiplying by 1 is exact, so this is the unweighted
    # norm without a second code path. Contiguous (not a stride-0 view), so
    # the kernels take their vectorised path; read-only, as it is shared.
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def _prepare(input, normalized_shape, weight, eps):
    """Validates the arguments and folds the normalised dims into one.

    Returns (x, dtype, shape, n, weight_row, weight_dtype, eps): dtype is the
    compute dtype of x, weight_row the weight as one row of n in the dtype of
    the loop that serves it (ones when weight is None), and weight_dtype the
    weight's own dtype, native order: grad_weight's dtype, as in torch. The
    common case, ndarrays of a supported dtype and an int normalized_shape,
    takes the fewest steps: in a decoding step this overhead is most of the
    call.
    """
    x = input if type(input) is np.ndarray else _as_array(input)
    dtype = x.dtype
    if dtype not in WEIGHT_DTYPES:
        dtype = _compute_dtype(x, "input")
    if type(normalized_shape) is int:
        shape = (normalized_shape,)
    elif (
        type(normalized_shape) in (tuple, list)
        and len(normalized_shape) == 1
        and type(normalized_shape[0]) is int
    ):
        shape = (normalized_shape[0],)  # torch's usual [hidden]
    else:
        shape = normalized_shape_tuple(normalized_shape)
        if not shape:
            raise ValueError(
                "Expected normalized_shape to be at least 1-dimensional, i.e., containing at "
                f"least one element, but got normalized_shape = {_torch_list(shape)}"
            )
    k = len(shape)
    if weight is None:
        weight_dtype = dtype
    else:
        if type(weight) is not np.ndarray:
            weight = _as_array(weight)
        # The type first: a str or an object is a wrong type, not a weight of shape [].
        loop_dtype = weight.dtype
        if loop_dtype not in WEIGHT_DTYPES[dtype]:
            loop_dtype = loop_weight_dtype(dtype, _compute_dtype(weight, "weight"))
        if tuple(weight.shape) != shape:
            raise weight_shape_error(weight.shape, shape)
    x_shape = tuple(x.shape)
    if len(x_shape) < k:
        raise ValueError(f"Input tensor must have at least {k} dimensions, but got {len(x_shape)}")
    if x_shape[len(x_shape) - k :] != shape:
        raise ValueError(
            f"Given normalized_shape={_torch_list(shape)}, expected input with shape "
            f"[*{', '.join(str(s) for s in shape)}], but got input of size{_torch_list(x_shape)}"
        )
    n = shape[0] if k == 1 else math.prod(shape)
    if weight is None:
        weight_row = _unit_weight(n, dtype)
    else:
        weight_row = weight if k == 1 else weight.reshape(n)
        if weight_row.dtype != loop_dtype:
            weight_row = weight_row.astype(loop_dtype)
        weight_dtype = weight.dtype.newbyteorder("=")
    return x, dtype, shape, n, weight_row, weight_dtype, _resolve_eps(eps, dtype)


def _rows(array, shape: tuple[int, ...], n: int):
    """``array`` with its last len(shape) dims folded into one of n (a view
    when the layout allows)."""
    if len(shape) == 1:
        return array
    return array.reshape(tuple(array.shape[: array.ndim - len(shape)]) + (n,))


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMSNorm over the last ``len(normalized_shape)`` dimensions of ``input``.

    Mirrors ``torch.nn.functional.rms_norm``::

        y = input / sqrt(mean(input**2) + eps) * weight

    ``eps=None`` is the machine epsilon of the compute type (float64's for
    float64 input, float32's for the rest). The result has ``input``'s dtype.
    A float32 weight with float16 or bfloat16 input, or a float64 weight with
    float32 input, is used as it is, as torch does in mixed precision.

    >>> import numpy as np, rmsnorm
    >>> rmsnorm.rms_norm(np.array([[3.0, 4.0]]), 2, eps=0.0)
    array([[0.84852814, 1.13137085]])
    """
    x, dtype, shape, n, weight_row, weight_dtype, eps = _prepare(
        input, normalized_shape, weight, eps
    )
    # Operands in their loop's dtypes pick that loop by themselves (a
    # byte-swapped x too), so no signature= is passed: a duck array's
    # __array_ufunc__ need not take one (dask's apply_gufunc has a signature
    # argument of its own, and hands dtype= to blockwise, not to the blocks).
    rows = _rows(x, shape, n)
    y = _forward_direct(rows, weight_row, eps)  # plain arrays: skips the ufunc machinery
    if y is None:
        y = forward(rows, weight_row, eps)
    return y if len(shape) == 1 else y.reshape(x.shape)


def rms_norm_backward(grad_output, input, normalized_shape, weight=None, eps=None):
    """Gradients of :func:`rms_norm`: ``(grad_input, grad_weight)``.

    ``grad_weight`` is summed over every batch dimension, in the weight's
    shape, or None when ``weight`` is None. The arguments are those of the
    forward call, plus ``grad_output`` in the output's shape.

    >>> import numpy as np, rmsnorm
    >>> x = np.array([[3.0, 4.0]])
    >>> grad_input, grad_weight = rmsnorm.rms_norm_backward(np.ones((1, 2)), x, 2, np.ones(2), 0.0)
    >>> grad_weight
    array([0.84852814, 1.13137085])
    """
    x, dtype, shape, n, weight_row, weight_dtype, eps = _prepare(
        input, normalized_shape, weight, eps
    )
    grad = _as_array(grad_output)
    _compute_dtype(grad, "grad_output")
    if tuple(grad.shape) != tuple(x.shape):
        raise ValueError(
            f"Mismatch in shape: grad_output has a shape of {tuple(grad.shape)} "
            f"and input has a shape of {tuple(x.shape)}"
        )
    rows = (math.prod(x.shape[: x.ndim - len(shape)]), n)
    # As in rms_norm: the operands' dtypes, not a signature=, pick the loop.
    if grad.dtype != dtype:
        grad = grad.astype(dtype)
    grad_input, grad_weight = backward(grad.reshape(rows), x.reshape(rows), weight_row, eps)
    grad_input = grad_input.reshape(x.shape)
    if weight is None:
        return grad_input, None
    # torch gives each gradient its tensor's dtype, also where the loop's
    # weight dtype differs (a float16 weight with float32 input, say).
    return grad_input, grad_weight.reshape(shape).astype(weight_dtype, copy=False)
