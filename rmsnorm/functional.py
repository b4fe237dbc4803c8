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

from ._core import (
    _forward_direct,
    add_backward,
    add_backward_offset,
    add_forward,
    add_forward_offset,
    backward,
    backward_offset,
    forward,
    forward_offset,
)
from ._dtypes import DEFAULT_EPS, EPS_DTYPE, WEIGHT_DTYPES, loop_weight_dtype


def _as_array(obj, what: str):
    """ndarrays and duck arrays (dask, ...) as they are, anything else via NumPy.

    Duck arrays that implement ``__array_ufunc__`` reach the gufunc intact, so
    it dispatches to them exactly as a NumPy ufunc would. Masked arrays are
    refused: the kernels would count the masked elements in the RMS, and
    the result would still look masked.
    """
    if isinstance(obj, np.ma.MaskedArray):
        raise TypeError(
            f"{what} is a masked array, which rmsnorm does not honour (masked elements would "
            f"count in the RMS): pass {what}.filled(value) or {what}.data instead"
        )
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


def input_shape_error(input_shape, normalized_shape) -> ValueError:
    """The error, in torch's words, for an input whose last dims are not normalized_shape."""
    k = len(normalized_shape)
    if len(input_shape) < k:
        return ValueError(
            f"Input tensor must have at least {k} dimensions, but got {len(input_shape)}"
        )
    return ValueError(
        f"Given normalized_shape={_torch_list(normalized_shape)}, expected input with shape "
        f"[*{', '.join(str(s) for s in normalized_shape)}], but got input of "
        f"size{_torch_list(input_shape)}"
    )


# The largest eps each eps type takes without overflowing to inf.
_LARGEST_EPS = {t.type: float(np.finfo(t).max) for t in set(EPS_DTYPE.values())}


def _real_as_float(value, expected: str) -> float:
    """A real number as a float, one past float64's range as +-inf (as a
    float rounds it: 10**400 is inf), or TypeError saying what is
    ``expected``: bools, strings, complex numbers, Decimals, arrays and
    tensors are not real numbers here, even of one element."""
    if type(value) is float:
        return value
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{expected}, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int or Fraction past float64's range
        return math.inf if value > 0 else -math.inf


def _resolve_eps(eps, dtype: np.dtype) -> np.floating:
    """eps as the loops take it, float32 unless the input is float64 (so a
    given eps is rounded to float32 there, as torch does); None is the
    compute type's machine epsilon. A NumPy scalar, not a Python float: a
    duck array may turn a Python float into a float64 array (dask does),
    which would pick the float64 loop for float32 input."""
    eps_type = EPS_DTYPE[dtype].type
    if eps is None:
        return eps_type(DEFAULT_EPS[dtype])
    value = _real_as_float(eps, "eps must be a real number or None")
    if abs(value) <= _LARGEST_EPS[eps_type]:
        return eps_type(eps)
    with np.errstate(over="ignore"):  # rounded, past float32's range to inf, as torch casts
        return eps_type(eps if math.isfinite(value) else value)


def _unit_weight(n: int, dtype: np.dtype) -> np.ndarray:
    # A row of ones: multiplying by 1 is exact, so this is the unweighted
    # norm without a second code path. A stride-0 view of one element, so a
    # row of any length takes no memory; the kernels copy a strided weight
    # once per call into a packed row of their own, freed with the call, and
    # serve it at full speed.
    return np.broadcast_to(_one(dtype), (n,))


@functools.lru_cache(maxsize=None)  # one entry per dtype the loops serve
def _one(dtype: np.dtype) -> np.ndarray:
    one = np.ones(1, dtype)
    one.flags.writeable = False
    return one


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
    x = input if type(input) is np.ndarray else _as_array(input, "input")
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
            weight = _as_array(weight, "weight")
        # The type first: a str or an object is a wrong type, not a weight of shape [].
        loop_dtype = weight.dtype
        if loop_dtype not in WEIGHT_DTYPES[dtype]:
            loop_dtype = loop_weight_dtype(dtype, _compute_dtype(weight, "weight"))
        if tuple(weight.shape) != shape:
            raise weight_shape_error(weight.shape, shape)
    x_shape = tuple(x.shape)
    if len(x_shape) < k or x_shape[len(x_shape) - k :] != shape:
        raise input_shape_error(x_shape, shape)
    n = shape[0] if k == 1 else math.prod(shape)
    if weight is None:
        weight_row = _unit_weight(n, dtype)
    else:
        weight_row = weight if k == 1 else weight.reshape(n)
        if weight_row.dtype != loop_dtype:
            weight_row = weight_row.astype(loop_dtype)
        weight_dtype = weight.dtype.newbyteorder("=")
    return x, dtype, shape, n, weight_row, weight_dtype, _resolve_eps(eps, dtype)


def _resolve_weight_offset(weight_offset, weight) -> np.float64 | None:
    """The offset as the *_offset gufuncs take it, or None for 0 (the plain ones).

    A real number, as eps: one past float64's range is +-inf, as eps is.
    rmsnorm.torch checks it here too, so that both APIs take the same
    values and raise the same errors.
    """
    offset = _real_as_float(weight_offset, "weight_offset must be a real number")
    if offset == 0:
        return None
    if weight is None:
        raise ValueError(
            f"weight_offset={weight_offset} needs a weight: the factor is weight_offset + "
            "weight, and there is no weight"
        )
    return np.float64(offset)


def residual_error(input_shape, input_dtype, shape, dtype, what: str = "residual"):
    """The error for an operand (``what``) that must have the input's shape
    and dtype but does not, or None: ValueError for the shape (no
    broadcasting), TypeError for the dtype. rmsnorm.torch raises these too,
    with the dtypes named as NumPy names them."""
    input_shape, shape = tuple(input_shape), tuple(shape)
    if shape != input_shape:
        return ValueError(f"{what} must have the input's shape {input_shape}, got {shape}")
    if dtype != input_dtype:
        return TypeError(
            f"{what} must have the input's dtype {_dtype_name(input_dtype)}, got "
            f"{_dtype_name(dtype)}: cast one of them first"
        )
    return None


def _dtype_name(dtype) -> str:
    """A NumPy or torch dtype's name, as NumPy spells it (float32, not torch.float32)."""
    return str(dtype).removeprefix("torch.")


def _check_residual(residual, x, what: str):
    """``residual`` as an array of x's shape and dtype, or the error that names the mismatch."""
    residual = _as_array(residual, "residual")
    error = residual_error(x.shape, x.dtype, residual.shape, residual.dtype, what)
    if error is not None:
        raise error
    return residual


def _rows(array, shape: tuple[int, ...], n: int):
    """``array`` with its last len(shape) dims folded into one of n (a view
    when the layout allows)."""
    if len(shape) == 1:
        return array
    return array.reshape(tuple(array.shape[: array.ndim - len(shape)]) + (n,))


def rms_norm(input, normalized_shape, weight=None, eps=None, *, weight_offset=0.0):
    """RMSNorm over the last ``len(normalized_shape)`` dimensions of ``input``.

    Mirrors ``torch.nn.functional.rms_norm``::

        y = input / sqrt(mean(input**2) + eps) * (weight_offset + weight)

    ``weight_offset`` (0 in torch) is Gemma's 1 in ``(1 + weight)``: the
    factor ``weight_offset + weight`` is formed exactly, with no rounding
    before the output's one rounding. It needs a weight.

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
    offset = _resolve_weight_offset(weight_offset, weight)
    # Operands in their loop's dtypes pick that loop by themselves (a
    # byte-swapped x too), so no signature= is passed: a duck array's
    # __array_ufunc__ need not take one (dask's apply_gufunc has a signature
    # argument of its own, and hands dtype= to blockwise, not to the blocks).
    rows = _rows(x, shape, n)
    if offset is not None:
        y = forward_offset(rows, weight_row, offset, eps)
    else:
        y = _forward_direct(rows, weight_row, eps)  # plain arrays: skips the ufunc machinery
        if y is None:
            y = forward(rows, weight_row, eps)
    return y if len(shape) == 1 else y.reshape(x.shape)


def rms_norm_backward(
    grad_output, input, normalized_shape, weight=None, eps=None, *, weight_offset=0.0
):
    """Gradients of :func:`rms_norm`: ``(grad_input, grad_weight)``.

    ``grad_weight`` is summed over every batch dimension, in the weight's
    shape, or None when ``weight`` is None. The arguments are those of the
    forward call, plus ``grad_output`` in the output's shape. With a
    ``weight_offset``, ``grad_weight`` is the stored weight's gradient (the
    same as the factor's).

    >>> import numpy as np, rmsnorm
    >>> x = np.array([[3.0, 4.0]])
    >>> grad_input, grad_weight = rmsnorm.rms_norm_backward(np.ones((1, 2)), x, 2, np.ones(2), 0.0)
    >>> grad_weight
    array([0.84852814, 1.13137085])
    """
    x, dtype, shape, n, weight_row, weight_dtype, eps = _prepare(
        input, normalized_shape, weight, eps
    )
    offset = _resolve_weight_offset(weight_offset, weight)
    grad = _backward_grad(grad_output, x, dtype, "grad_output")
    rows = (math.prod(x.shape[: x.ndim - len(shape)]), n)
    operands = (_fold(grad, rows), _fold(x, rows), weight_row)
    # As in rms_norm: the operands' dtypes, not a signature=, pick the loop.
    if offset is None:
        grad_input, grad_weight = backward(*operands, eps)
    else:
        grad_input, grad_weight = backward_offset(*operands, offset, eps)
    return _gradients(grad_input.reshape(x.shape), grad_weight, weight, shape, weight_dtype)


def _fold(array, rows: tuple[int, int]):
    """``array`` as the backward's (rows, n) operand. np.reshape, not the
    method: it dispatches a duck array that has one (dask) to it, and goes
    through NumPy for one that has none (a pandas Series)."""
    return np.reshape(array, rows)


def _backward_grad(grad_output, x, dtype: np.dtype, what: str):
    """A gradient argument of the backward: x's shape, as an array of the compute dtype."""
    grad = _as_array(grad_output, what)
    _compute_dtype(grad, what)
    if tuple(grad.shape) != tuple(x.shape):
        raise ValueError(
            f"Mismatch in shape: {what} has a shape of {tuple(grad.shape)} "
            f"and input has a shape of {tuple(x.shape)}"
        )
    return grad if grad.dtype == dtype else grad.astype(dtype)


def _gradients(grad_input, grad_weight, weight, shape, weight_dtype):
    """(grad_input, grad_weight) as the functional backward functions return them."""
    if weight is None:
        return grad_input, None
    # torch gives each gradient its tensor's dtype, also where the loop's
    # weight dtype differs (a float16 weight with float32 input, say).
    return grad_input, grad_weight.reshape(shape).astype(weight_dtype, copy=False)


# np.shares_memory's exact answer is exponential in the arrays' dimensions
# (crafted strides take hours): this bounds it to under a millisecond.
# Arrays it cannot tell apart within that are refused as overlapping, as
# NumPy's ufuncs copy operands they cannot rule out (with max_work=1).
_OVERLAP_MAX_WORK = 10_000
_TooHardError = getattr(np, "exceptions", np).TooHardError  # np.exceptions from NumPy 1.25


def _check_out(out, x):
    """out= of add_rms_norm: a pair of arrays (or Nones) of x's shape and dtype
    that do not share memory with each other."""
    if out is None:
        return None, None
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(
            "out must be a tuple (output, residual_out) of arrays or None, "
            f"got {type(out).__name__}"
        )
    for name, array in zip(("output", "residual_out"), out):
        if array is None:
            continue
        if not isinstance(array, np.ndarray):
            raise TypeError(f"out's {name} must be an ndarray or None, got {type(array).__name__}")
        if array.shape != tuple(x.shape) or array.dtype != x.dtype:
            raise ValueError(
                f"out's {name} must have the input's shape {tuple(x.shape)} and dtype "
                f"{x.dtype}, got shape {array.shape} and dtype {array.dtype}"
            )
        if not array.flags.writeable:
            raise ValueError(f"out's {name} is read-only")
    output, residual_out = out
    if output is not None and residual_out is not None:
        try:
            overlap = np.shares_memory(output, residual_out, max_work=_OVERLAP_MAX_WORK)
        except _TooHardError:
            raise ValueError(
                "out's output and residual_out may overlap: their strides are too intricate "
                "to rule it out in bounded time, and where they overlap the output would "
                "overwrite the sum it is computed from. Pass separate arrays (out=(y, residual) "
                "updates the residual in place)"
            ) from None
        if overlap:
            raise ValueError(
                "out's output and residual_out overlap: the output would overwrite the sum it "
                "is computed from. Pass separate arrays (out=(y, residual) updates the residual "
                "in place)"
            )
    return output, residual_out


def add_rms_norm(
    input, residual, normalized_shape, weight=None, eps=None, *, weight_offset=0.0, out=None
):
    """The residual add and RMSNorm of a pre-norm block, fused: ``(output, residual_out)``.

    ``residual_out = input + residual``, rounded to the input's dtype, and
    ``output = rms_norm(residual_out, normalized_shape, weight, eps,
    weight_offset=weight_offset)``, the same bytes as the two steps unfused
    (a NaN's sign and payload aside), in one pass over memory. ``residual`` must have the input's shape and
    dtype. ``out=(output, residual_out)`` takes arrays to write into, either
    None; ``out=(y, residual)`` updates the residual in place, as vLLM's
    ``fused_add_rms_norm`` does, without a temporary. The two must not
    overlap.

    >>> import numpy as np, rmsnorm
    >>> y, residual_out = rmsnorm.add_rms_norm(
    ...     np.array([[1.0, 3.0]]), np.array([[2.0, 1.0]]), 2, eps=0.0)
    >>> residual_out
    array([[3., 4.]])
    >>> y
    array([[0.84852814, 1.13137085]])
    """
    x, dtype, shape, n, weight_row, weight_dtype, eps = _prepare(
        input, normalized_shape, weight, eps
    )
    offset = _resolve_weight_offset(weight_offset, weight)
    residual = _check_residual(residual, x, "residual")
    output, residual_out = _check_out(out, x)
    # Folding out= into rows must give views, or the results would land in
    # copies. A view lies within its array's bounds and a copy is fresh
    # memory outside them, so the bounds tell them apart, at a cost linear in
    # the dimensions (np.shares_memory's exact answer is exponential in them).
    outs = tuple(None if a is None else _rows(a, shape, n) for a in (output, residual_out))
    folded = all(
        a is None or np.may_share_memory(a, r) for a, r in zip((output, residual_out), outs)
    )
    operands = (_rows(x, shape, n), _rows(residual, shape, n), weight_row)
    operands += (eps,) if offset is None else (offset, eps)
    gufunc = add_forward if offset is None else add_forward_offset
    results = gufunc(*operands, out=outs if folded and out is not None else (None, None))
    results = tuple(r if len(shape) == 1 else r.reshape(x.shape) for r in results)
    if not folded:
        for target, result in zip((output, residual_out), results):
            if target is not None:
                np.copyto(target, result)
    # out='s own objects, as NumPy's ufuncs return them, not views of them
    return tuple(r if t is None else t for t, r in zip((output, residual_out), results))


def add_rms_norm_backward(
    grad_output,
    grad_residual_out,
    residual_out,
    normalized_shape,
    weight=None,
    eps=None,
    *,
    weight_offset=0.0,
):
    """Gradients of :func:`add_rms_norm`: ``(grad_input, grad_weight)``.

    ``residual_out`` is the forward's second output, the sum that was
    normalised; ``grad_output`` is the gradient of the forward's output and
    ``grad_residual_out`` that of ``residual_out`` (None for zeros, where the
    sum is not used further). ``grad_input`` is the gradient of both the
    input and the residual::

        grad_input = rms_norm_backward(grad_output, residual_out, ...)[0] + grad_residual_out

    >>> import numpy as np, rmsnorm
    >>> residual_out = np.array([[3.0, 4.0]])
    >>> grad_input, grad_weight = rmsnorm.add_rms_norm_backward(
    ...     np.zeros((1, 2)), np.ones((1, 2)), residual_out, 2, np.ones(2), 0.0)
    >>> grad_input
    array([[1., 1.]])
    """
    if grad_residual_out is None:
        return rms_norm_backward(
            grad_output, residual_out, normalized_shape, weight, eps, weight_offset=weight_offset
        )
    residual_out, dtype, shape, n, weight_row, weight_dtype, eps = _prepare(
        residual_out, normalized_shape, weight, eps
    )
    offset = _resolve_weight_offset(weight_offset, weight)
    grad = _backward_grad(grad_output, residual_out, dtype, "grad_output")
    grad_residual_out = _backward_grad(grad_residual_out, residual_out, dtype, "grad_residual_out")
    rows = (math.prod(residual_out.shape[: residual_out.ndim - len(shape)]), n)
    operands = (
        _fold(grad, rows), _fold(grad_residual_out, rows), _fold(residual_out, rows), weight_row
    )
    if offset is None:
        grad_input, grad_weight = add_backward(*operands, eps)
    else:
        grad_input, grad_weight = add_backward_offset(*operands, offset, eps)
    return _gradients(
        grad_input.reshape(residual_out.shape), grad_weight, weight, shape, weight_dtype
    )
