"""rmsnorm inside torch models: the kernels as torch custom ops, with autograd.

- ``rms_norm(input, normalized_shape, weight=None, eps=None, *,
  weight_offset=0.0)``: ``torch.nn.functional.rms_norm``, through the op
  ``torch.ops.rmsnorm.rms_norm``.
- ``add_rms_norm(input, residual, normalized_shape, weight=None, eps=None,
  *, weight_offset=0.0)``: a pre-norm block's ``(rms_norm(input + residual),
  input + residual)`` in one pass, through ``torch.ops.rmsnorm.add_rms_norm``.
- ``RMSNorm``: ``torch.nn.RMSNorm`` whose forward calls the op; the same
  constructor (and ``weight_offset``), parameters, ``state_dict`` keys and
  repr.
- ``replace(model)``: turns every ``torch.nn.RMSNorm`` of a model, and the
  RMSNorm modules of transformers' Llama and Gemma families, into an
  ``RMSNorm`` in place and returns how many it turned.

Three layers, as in torch: the functions validate and dispatch, the ops
(``torch.library`` custom ops, with fake implementations for
``torch.compile`` and autograd formulas that call the backward ops) run the
C kernels on the tensors' memory, and the kernels do the arithmetic.

What goes to the kernels: CPU tensors of float16, bfloat16, float32 and
float64 with a weight of the input's dtype or of torch's mixed precision (a
float32 weight with 16-bit input, a float64 weight with float32 input), or
no weight. Anything else (another device, complex numbers, another pair of
dtypes, meta tensors) goes to ``torch.nn.functional.rms_norm``, with its
result type. Sparse tensors are refused with a NotImplementedError naming
the layout, and what is not a tensor with torch's TypeError. The residual
and ``weight_offset`` are checked as ``rmsnorm.add_rms_norm`` checks them,
with the same errors, wherever the call runs. The kernels read the tensors'
memory with their strides: nothing the size of the input is copied for a
contiguous tensor, and a non-contiguous one is copied only where its batch
dims cannot be folded into rows (``Tensor.reshape``'s rule). In eager
calls, an input whose rows are contiguous in another order of its batch
dims (a transposed view of attention heads) is read in place too, and the
output takes its layout, as torch's elementwise ops do. A tensor with its
negative bit set (``Tensor.is_neg()``) is resolved first. bfloat16 needs
no ml_dtypes here.

Eager calls skip the dispatcher, whose Python custom-op path costs more
than torch's whole eager composite at a decoding step's size. Where no
tracer is involved (no ``torch.compile``, ``torch.export``, jit trace,
dispatch or torch-function mode, or tensor subclass other than Parameter),
a call that records no autograd (under ``torch.no_grad()`` or
``torch.inference_mode()``, or with no input that requires grad) runs the
op's CPU implementation directly, and one that does runs a
``torch.autograd.Function`` over the same implementation and the same
autograd formulas. The same kernels either way, so the same bytes.

Inside torch.func's transforms (``grad``, ``vmap``, ``jacrev``, ...) the
functions call ``torch.nn.functional.rms_norm``: torch 2.13's custom-op
autograd does not support those transforms.

Forward-mode AD (``torch.autograd.forward_ad``): in eager mode the
autograd.Functions' ``jvp`` gives the outputs their tangents, computed with
torch's ops in the compute type. The ops' autograd (``torch.library``'s)
has no jvp: where a call would go through the op (a mode or tensor
subclass) it goes to ``torch.nn.functional.rms_norm``, and an operand with
a tangent passed to the op itself is refused, naming what to call.

Threads: the kernels run on rmsnorm's own thread pool, sized by
``rmsnorm.set_num_threads`` (default ``RMSNORM_NUM_THREADS``, else the CPUs
this process may use), not on torch's intra-op pool
(``torch.set_num_threads``). The thread that calls the op waits for the
pool, so the two pools never run at once from one call; to give the whole
model one thread budget, call ``rmsnorm.set_num_threads(
torch.get_num_threads())``. Every result is the same bytes for any number
of threads of either pool: rows are never split, and grad_weight's
per-chunk sums are added in chunk order.

Not supported: second derivatives (``create_graph=True`` then a second
backward raises, naming ``torch.nn.functional.rms_norm`` as the way), and
``torch.jit.script`` of ``RMSNorm`` (it raises: TorchScript cannot compile
the dispatch in Python, and a scripted module would silently fall back to
torch's numbers; use ``torch.compile`` or ``torch.export``).
"""

import functools
import math
import numbers
import operator
import warnings

import numpy as np

try:
    import torch
except ImportError as _error:
    raise ImportError(
        "rmsnorm.torch needs torch: pip install 'rmsnorm[torch]'", name="torch"
    ) from _error

from . import _core
from .functional import (
    _resolve_weight_offset,
    input_shape_error,
    residual_error,
    weight_shape_error,
)

__all__ = ["RMSNorm", "add_rms_norm", "replace", "rms_norm"]

# input dtype -> weight dtype -> the kernels' type index, from the C type
# list (csrc/kernels/types.h) in its order. Nested, as two lookups of a
# dtype cost less than one of a tuple at a decoding step's size.
_KERNEL_TYPES: dict = {}
for _index, (_x, _weight, _eps) in enumerate(_core.dtype_pairs):
    _KERNEL_TYPES.setdefault(getattr(torch, _x), {})[getattr(torch, _weight)] = _index
del _index, _x, _weight, _eps
_NO_KERNEL_TYPES: dict = {}
_STRIDED = torch.strided
# By type index: the bytes of an input element, and eps=None's value (the
# machine epsilon of the compute type, float64's for float64 input and
# float32's for the rest, as torch's default). A given eps goes to the C as
# it is, which rounds it to float32 unless the input is float64, as torch
# does.
_ITEM_SIZES = [getattr(torch, x).itemsize for x, _, _ in _core.dtype_pairs]
_DEFAULT_EPS = [torch.finfo(getattr(torch, eps)).eps for _, _, eps in _core.dtype_pairs]


def _kernel_type(input, weight):
    """The kernels' type index for these tensors, or None where torch serves them."""
    if not (input.is_cpu and input.layout is _STRIDED):
        return None
    x_dtype = input.dtype
    if weight is None:
        weight_dtype = x_dtype
    elif weight.is_cpu and weight.layout is _STRIDED:
        weight_dtype = weight.dtype
    else:
        return None
    return _KERNEL_TYPES.get(x_dtype, _NO_KERNEL_TYPES).get(weight_dtype)


def _served_type(input, weight):
    """The kernels' type index for these tensors, or the error that says
    which tensors they take."""
    kernel_type = _kernel_type(input, weight)
    if kernel_type is None:
        raise RuntimeError(
            f"rmsnorm's kernels take dense (torch.strided) CPU tensors of "
            f"{sorted(str(x) for x in _KERNEL_TYPES)} with a weight of a matching dtype; got "
            f"input {_describe(input)} and weight {_describe(weight)}. "
            "rmsnorm.torch.rms_norm sends these to torch.nn.functional.rms_norm"
        )
    return kernel_type


def _describe(tensor) -> str:
    """A tensor's dtype, device and, where it is not strided, layout."""
    if tensor is None:
        return "None"
    layout = "" if tensor.layout is _STRIDED else f" of layout {tensor.layout}"
    return f"{tensor.dtype} on {tensor.device}{layout}"


# Layouts whose tensors have no dense memory to read; torch's rms_norm
# refuses them too, in words that do not name the layout.
_SPARSE_LAYOUTS = frozenset(
    (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
)


def _check_operands(function: str, operands) -> None:
    """The errors for operands that are not dense tensors, where the kernels
    do not take them: ``operands`` holds (position, name, value) triples,
    None standing for an absent weight. A TypeError in torch's words for
    what is not a tensor; a NotImplementedError (a RuntimeError, as torch
    raises for some sparse layouts) naming a sparse layout."""
    for position, name, value in operands:
        if value is None and name == "weight":
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{function}(): argument '{name}' (position {position}) must be Tensor, "
                f"not {_type_name(value)}"
            )
        if value.layout in _SPARSE_LAYOUTS:
            raise NotImplementedError(
                f"{function}(): {name} is a sparse tensor (layout {value.layout}); RMSNorm "
                f"takes dense tensors: pass {name}.to_dense()"
            )


def _type_name(value) -> str:
    """``value``'s type as torch's argument errors name it: numpy.int64, float, Tensor."""
    kind = type(value)
    if kind.__module__ == "builtins" or isinstance(value, torch.Tensor):
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _shape_tuple(normalized_shape, function: str, position: int) -> tuple:
    """``normalized_shape`` as a tuple of ints, or torch's TypeError naming it.

    Each size is taken as torch takes it, by ``operator.index``: NumPy
    integers and 0-d integer tensors are sizes, floats, strings and bools
    are not. A single integer is a shape of one dimension, as
    ``torch.nn.RMSNorm`` takes it (torch's functional takes only sequences).
    """
    kind = type(normalized_shape)
    if kind is int:
        return (normalized_shape,)
    # Lists and tuples first, without isinstance against numbers.Integral
    # (an abstract class, slow to test): a module passes its tuple each call.
    if kind is not tuple and kind is not list:
        if isinstance(normalized_shape, numbers.Integral) and kind is not bool:
            return (operator.index(normalized_shape),)
        # A string is iterable, and bytes iterate as ints: neither is a shape.
        if isinstance(normalized_shape, (str, bytes)):
            raise TypeError(_not_a_shape(function, position, normalized_shape))
    try:
        sizes = tuple(normalized_shape)
    except TypeError:  # a float, None, a 0-d array or tensor
        raise TypeError(_not_a_shape(function, position, normalized_shape)) from None
    for size in sizes:
        if type(size) is not int:
            return tuple(_size(s, function, position, pos) for pos, s in enumerate(sizes))
    return sizes


def _not_a_shape(function: str, position: int, value, pos=None) -> str:
    """torch's words for a normalized_shape, or its element at ``pos``, that is no shape."""
    argument = f"{function}(): argument 'normalized_shape' (position {position})"
    expected = f"{argument} must be tuple of ints"
    if pos is None:
        return f"{expected}, not {_type_name(value)}"
    return f"{expected}, but found element of type {_type_name(value)} at pos {pos}"


def _size(size, function: str, position: int, pos: int):
    """One size of a normalized_shape, by operator.index. Under torch.compile
    each size goes to the op as it is, whose SymInt[] takes and checks it as
    torch does: operator.index would pin a symbolic size (dynamic shapes) to
    its current value, and read a NumPy integer, which Dynamo traces as a
    tensor, out of the graph (a graph break)."""
    if _is_compiling():
        return size
    # operator.index takes True, and a bool tensor, as 1; torch refuses them.
    if not (
        isinstance(size, (bool, np.bool_))
        or (isinstance(size, torch.Tensor) and size.dtype == torch.bool)
    ):
        try:
            return operator.index(size)
        except TypeError:
            pass
    raise TypeError(_not_a_shape(function, position, size, pos))


def _check_shapes(input, shape: tuple, weight, same_shape=()) -> None:
    """The checks that keep the kernels inside the tensors' memory, with
    torch's errors (RuntimeError, or ValueError where torch raises it).
    ``same_shape`` holds (name, tensor) pairs that must have the input's
    shape and dtype, with the NumPy API's errors for its residual (torch
    has no such operand): ValueError for the shape, TypeError for the dtype."""
    if not shape:
        raise RuntimeError(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least "
            "one element, but got normalized_shape = []"
        )
    input_shape = input.shape
    # the common one-dimensional shape first: indexing a torch.Size costs
    # less than slicing one
    fits = (
        len(input_shape) >= 1 and input_shape[-1] == shape[0]
        if len(shape) == 1
        else input_shape[-len(shape) :] == shape
    )
    if not fits:
        error = input_shape_error(tuple(input_shape), shape)
        if input.dim() < len(shape):
            raise error  # a ValueError in torch too
        raise RuntimeError(str(error))
    if weight is not None and weight.shape != shape:
        raise RuntimeError(str(weight_shape_error(tuple(weight.shape), shape)))
    for name, tensor in same_shape:
        if tensor.shape != input_shape or tensor.dtype != input.dtype:
            raise residual_error(input_shape, input.dtype, tensor.shape, tensor.dtype, name)


@functools.lru_cache(maxsize=None)  # one per dtype the kernels take
def _one(dtype):
    # The unweighted norm is the weighted one with ones (multiplying by 1 is
    # exact): one code path. The kernels read this one 1 with stride 0 as a
    # row of ones of any length, which takes no memory.
    return torch.ones(1, dtype=dtype)


# Outputs from this size up ask the OS for transparent huge pages
# (madvise), as NumPy does for its large arrays; torch's CPU allocator
# does not unless THP_MEM_ALLOC_ENABLE=1. Writing a fresh 32 MiB output in
# 4 KiB pages takes 8192 page faults, which cost as much as the kernel
# itself at 2048x4096 float32 (20 ms against 10 ms, measured on 2 CPUs).
# The memory stays torch's own, so the outputs grow, share and free as
# any tensor's do.
_HUGE_PAGES_MIN_BYTES = 4 << 20


def _empty_like(tensor, nbytes: int):
    """A new contiguous tensor of ``tensor``'s shape and dtype (``nbytes``
    bytes), as the fake implementations describe the outputs; the kernels
    take its address."""
    if tensor.is_contiguous():  # the shorter call, when it keeps the layout anyway
        empty = torch.empty_like(tensor)
    else:
        empty = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if nbytes >= _HUGE_PAGES_MIN_BYTES:
        _core._advise_huge_pages(empty.data_ptr(), nbytes)
    return empty


# The kernels read an operand as its address alone where it is contiguous,
# else as (address, row stride, stride) in bytes (csrc/numpy/buffers.c).
# These return the tensor the caller must hold while the kernels read it
# (a folded copy, where there is one) and the argument that describes it.
def _operand(tensor, rows: int, n: int):
    """A (rows, n) operand: a contiguous tensor in place, another folded by
    Tensor.reshape (a view, or a copy where its layout does not fold)."""
    if tensor.is_contiguous():
        return tensor, tensor.data_ptr()
    folded = tensor.reshape(rows, n)
    if folded.is_contiguous():
        return folded, folded.data_ptr()
    item = folded.element_size()
    return folded, (folded.data_ptr(), folded.stride(0) * item, folded.stride(1) * item)


def _memory_order(tensor, normalized_dims: int):
    """The permutation of ``tensor``'s batch dims (the normalised dims stay
    last) that makes it contiguous, or None where there is none. A
    transposed view of attention heads, (batch, heads, tokens, head_dim)
    over (batch, tokens, heads, head_dim) memory, has one: its rows are
    contiguous, in another order, and need no copy."""
    batch_dims = tensor.dim() - normalized_dims
    strides = tensor.stride()
    order = sorted(range(batch_dims), key=lambda dim: -strides[dim])
    order += range(batch_dims, tensor.dim())
    return order if tensor.permute(order).is_contiguous() else None


def _weight_operand(weight, input, n: int):
    """The weight as one row of n (ones of the input's dtype without a weight)."""
    if weight is None:
        one = _one(input.dtype)
        return one, (one.data_ptr(), 0)
    if weight.is_contiguous():
        return weight, weight.data_ptr()
    row = weight.reshape(n)
    if row.is_contiguous():
        return row, row.data_ptr()
    return row, (row.data_ptr(), row.stride(0) * row.element_size())


def _resolve_neg(*tensors):
    """The tensors with their negative bits resolved. A tensor whose
    negative bit is set (``Tensor.is_neg()``: ``.conj().imag`` of a complex
    tensor, ``torch._neg_view``) holds the negation of its values in memory,
    which the kernels read as it is; the conjugate bit is set on complex
    tensors only, which the kernels do not take."""
    return tuple(t if t is None or not t.is_neg() else t.resolve_neg() for t in tensors)


def _forward(
    kernel_type, input, shape: tuple, weight, eps, weight_offset, residual=None, keep_layout=False
):
    """The ops' CPU implementation: y, or (y, residual_out) with a residual,
    for tensors of the kernels' type ``kernel_type`` (from _served_type).

    The outputs are new contiguous tensors; the operands are read where they
    are, folded into rows of n where their layout allows it. At a decoding
    step's size this Python is most of the call, so it makes few calls.
    With ``keep_layout`` (the eager calls: the op's outputs are contiguous,
    as its fake implementation says) y takes the layout of an input whose
    rows are contiguous in another order of its batch dims (a transposed
    view of heads), as torch's elementwise ops do, and the input is read
    where it is instead of copied.
    """
    _check_shapes(input, shape, weight, () if residual is None else (("residual", residual),))
    if (
        input.is_neg()
        or (weight is not None and weight.is_neg())
        or (residual is not None and residual.is_neg())
    ):
        input, weight, residual = _resolve_neg(input, weight, residual)
    n = shape[0] if len(shape) == 1 else math.prod(shape)
    numel = input.numel()
    rows = numel // n if n else 0
    nbytes = numel * _ITEM_SIZES[kernel_type]
    # A decoding step's operands, small and contiguous, are taken inline
    # (the first branch of _empty_like, _operand and _weight_operand): at
    # that size each Python call costs a tenth of the kernels.
    contiguous = input.is_contiguous()
    order = None
    if keep_layout and not contiguous and residual is None:
        order = _memory_order(input, len(shape))
        if order is not None:  # rows in memory order: the same address, contiguous
            input, contiguous = input.permute(order), True
    small = nbytes < _HUGE_PAGES_MIN_BYTES and contiguous
    y = torch.empty_like(input) if small else _empty_like(input, nbytes)
    residual_out = None if residual is None else _empty_like(input, nbytes)
    if rows:
        x, x_arg = (input, input.data_ptr()) if contiguous else _operand(input, rows, n)
        weight_row, weight_arg = (
            (weight, weight.data_ptr())
            if weight is not None and weight.is_contiguous()
            else _weight_operand(weight, input, n)
        )
        residual_rows, residual_arg = (
            (None, None) if residual is None else _operand(residual, rows, n)
        )
        _core._forward_buffers(
            kernel_type,
            rows,
            n,
            _DEFAULT_EPS[kernel_type] if eps is None else eps,
            weight_offset,
            x_arg,
            weight_arg,
            y.data_ptr(),
            residual_arg,
            None if residual is None else residual_out.data_ptr(),
        )
        del x, weight_row, residual_rows  # held until the kernels returned: copies live only here
    if order is not None:
        y = y.permute(sorted(range(len(order)), key=order.__getitem__))  # back to the input's dims
    return y if residual is None else (y, residual_out)


def _backward(
    kernel_type,
    grad_output,
    input,
    shape: tuple,
    weight,
    eps,
    weight_offset,
    grad_residual_out=None,
):
    """The backward ops' CPU implementation: (grad_input, grad_weight).

    grad_weight has the weight's dtype and shape (the input's dtype without
    a weight, where it is not needed: the kernels form it anyway). With
    grad_residual_out, input is residual_out and grad_input also takes
    grad_residual_out, the gradient of both terms of the sum.
    """
    same_shape = (("grad_output", grad_output),)
    if grad_residual_out is not None:
        same_shape += (("grad_residual_out", grad_residual_out),)
    _check_shapes(input, shape, weight, same_shape)
    grad_output, input, weight, grad_residual_out = _resolve_neg(
        grad_output, input, weight, grad_residual_out
    )
    n = shape[0] if len(shape) == 1 else math.prod(shape)
    numel = input.numel()
    rows = numel // n if n else 0
    grad_input = _empty_like(input, numel * _ITEM_SIZES[kernel_type])
    grad_weight = torch.empty(shape, dtype=input.dtype if weight is None else weight.dtype)
    if not rows:
        if grad_residual_out is not None:
            grad_input.copy_(grad_residual_out)
        return grad_input, grad_weight.zero_()
    grad_rows, grad_arg = _operand(grad_output, rows, n)
    x, x_arg = _operand(input, rows, n)
    weight_row, weight_arg = _weight_operand(weight, input, n)
    grad_residual_rows, grad_residual_arg = (
        (None, None) if grad_residual_out is None else _operand(grad_residual_out, rows, n)
    )
    _core._backward_buffers(
        kernel_type,
        rows,
        n,
        _DEFAULT_EPS[kernel_type] if eps is None else eps,
        weight_offset,
        grad_arg,
        x_arg,
        weight_arg,
        grad_input.data_ptr(),
        grad_weight.data_ptr(),
        grad_residual_arg,
    )
    del grad_rows, x, weight_row, grad_residual_rows  # held until the kernels returned
    return grad_input, grad_weight


# The ops. Their schemas are written out, next to their implementations.
@torch.library.custom_op(
    "rmsnorm::rms_norm",
    mutates_args=(),
    schema="(Tensor input, SymInt[] normalized_shape, Tensor? weight, float? eps, "
    "float weight_offset) -> Tensor",
)
def _rms_norm_op(input, normalized_shape, weight, eps, weight_offset):
    _refuse_tangents("rms_norm", input, weight)
    kernel_type = _served_type(input, weight)
    return _forward(kernel_type, input, tuple(normalized_shape), weight, eps, weight_offset)


@torch.library.custom_op(
    "rmsnorm::rms_norm_backward",
    mutates_args=(),
    schema="(Tensor grad_output, Tensor input, SymInt[] normalized_shape, Tensor? weight, "
    "float? eps, float weight_offset) -> (Tensor, Tensor)",
)
def _rms_norm_backward_op(grad_output, input, normalized_shape, weight, eps, weight_offset):
    _refuse_tangents("rms_norm_backward", grad_output, input, weight)
    shape = tuple(normalized_shape)
    kernel_type = _served_type(input, weight)
    return _backward(kernel_type, grad_output, input, shape, weight, eps, weight_offset)


@torch.library.custom_op(
    "rmsnorm::add_rms_norm",
    mutates_args=(),
    schema="(Tensor input, Tensor residual, SymInt[] normalized_shape, Tensor? weight, "
    "float? eps, float weight_offset) -> (Tensor, Tensor)",
)
def _add_rms_norm_op(input, residual, normalized_shape, weight, eps, weight_offset):
    _refuse_tangents("add_rms_norm", input, residual, weight)
    shape = tuple(normalized_shape)
    kernel_type = _served_type(input, weight)
    return _forward(kernel_type, input, shape, weight, eps, weight_offset, residual)


@torch.library.custom_op(
    "rmsnorm::add_rms_norm_backward",
    mutates_args=(),
    schema="(Tensor grad_output, Tensor grad_residual_out, Tensor residual_out, "
    "SymInt[] normalized_shape, Tensor? weight, float? eps, float weight_offset) "
    "-> (Tensor, Tensor)",
)
def _add_rms_norm_backward_op(
    grad_output, grad_residual_out, residual_out, normalized_shape, weight, eps, weight_offset
):
    _refuse_tangents("add_rms_norm_backward", grad_output, grad_residual_out, residual_out, weight)
    shape = tuple(normalized_shape)
    kernel_type = _served_type(residual_out, weight)
    return _backward(
        kernel_type,
        grad_output,
        residual_out,
        shape,
        weight,
        eps,
        weight_offset,
        grad_residual_out,
    )


# Fake implementations: the outputs' shapes, dtypes and (contiguous) layout,
# after the same checks, for torch.compile and torch.export.
@_rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps, weight_offset):
    _check_shapes(input, tuple(normalized_shape), weight)
    _served_type(input, weight)
    return input.new_empty(input.shape)


@_add_rms_norm_op.register_fake
def _(input, residual, normalized_shape, weight, eps, weight_offset):
    _check_shapes(input, tuple(normalized_shape), weight, (("residual", residual),))
    _served_type(input, weight)
    return input.new_empty(input.shape), input.new_empty(input.shape)


def _fake_gradients(input, shape, weight):
    weight_dtype = input.dtype if weight is None else weight.dtype
    return input.new_empty(input.shape), input.new_empty(shape, dtype=weight_dtype)


@_rms_norm_backward_op.register_fake
def _(grad_output, input, normalized_shape, weight, eps, weight_offset):
    shape = tuple(normalized_shape)
    _check_shapes(input, shape, weight, (("grad_output", grad_output),))
    _served_type(input, weight)
    return _fake_gradients(input, shape, weight)


@_add_rms_norm_backward_op.register_fake
def _(grad_output, grad_residual_out, residual_out, normalized_shape, weight, eps, weight_offset):
    shape = tuple(normalized_shape)
    same_shape = (("grad_output", grad_output), ("grad_residual_out", grad_residual_out))
    _check_shapes(residual_out, shape, weight, same_shape)
    _served_type(residual_out, weight)
    return _fake_gradients(residual_out, shape, weight)


# How a call the kernels serve runs, by _route.
_DIRECT = 0  # the implementation, called directly: nothing records or traces it
_AUTOGRAD = 1  # an autograd.Function over the implementation: eager autograd records it
_THROUGH_OP = 2  # the op, through torch's dispatcher: something else must see it
_TORCH = 3  # torch.nn.functional.rms_norm: forward-mode AD where the op would run


def _route(*tensors) -> int:
    """How a call on these tensors runs. Through the op where something
    other than eager autograd must see it: a compiler or tracer, a dispatch
    or torch-function mode, or a tensor subclass (FakeTensor among them).
    Forward-mode AD (a ``torch.autograd.forward_ad.dual_level`` open, where
    an operand may carry a tangent) takes the autograd.Function, whose jvp
    serves it; the op's autograd has none, so there torch's composite
    serves it."""
    if _is_compiling():  # first: torch.compile reads it as True, and traces nothing after
        return _THROUGH_OP
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSORS:
            return _TORCH if _forward_ad._current_level >= 0 else _THROUGH_OP
    if _dispatch_modes() > 0 or _torch_function_mode_enabled() or _tracing_state() is not None:
        return _TORCH if _forward_ad._current_level >= 0 else _THROUGH_OP
    if _forward_ad._current_level >= 0:
        return _AUTOGRAD
    if _is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return _AUTOGRAD
    return _DIRECT


# What _route takes for a tensor no tracer or subclass stands behind: a
# module's weight is a Parameter.
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# Looked up once: _route runs on every call, where each attribute lookup counts.
_functorch_transforms_active = torch._C._are_functorch_transforms_active  # torch.func
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_tracing_state = torch._C._get_tracing_state  # torch.jit.trace's
_forward_ad = torch.autograd.forward_ad  # its _current_level is -1 outside a dual level
_is_grad_enabled = torch.is_grad_enabled


# Autograd: the forward saves its input (for add_rms_norm, the sum it
# normalised) and the weight; the backward computes both gradients in one
# pass over the rows. The same formulas serve the ops (under torch.compile
# and other tracers) and, in eager mode, autograd.Functions that call the
# implementations directly: a Python custom op's dispatch costs more than
# the whole of eager torch's composite at a decoding step's size.
def _setup_rms_norm(ctx, inputs, output):
    input, normalized_shape, weight, eps, weight_offset = inputs
    ctx.save_for_backward(input, weight)
    ctx.shape, ctx.eps, ctx.weight_offset = tuple(normalized_shape), eps, weight_offset


def _rms_norm_grads(ctx, grad_output):
    input, weight = ctx.saved_tensors
    arguments = (grad_output, input, ctx.shape, weight, ctx.eps, ctx.weight_offset)
    # Through the op where autograd records this backward (create_graph=True)
    # or a tracer sees it: there the second backward meets its refusal.
    if _is_grad_enabled() or _route(grad_output, input, weight) >= _THROUGH_OP:
        grad_input, grad_weight = _rms_norm_backward_op(*arguments)
    else:
        grad_input, grad_weight = _backward(_served_type(input, weight), *arguments)
    return grad_input, None, None if weight is None else grad_weight, None, None


def _setup_add_rms_norm(ctx, inputs, output):
    _input, _residual, normalized_shape, weight, eps, weight_offset = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.shape, ctx.eps, ctx.weight_offset = tuple(normalized_shape), eps, weight_offset


def _add_rms_norm_grads(ctx, grad_output, grad_residual_out):
    residual_out, weight = ctx.saved_tensors
    tensors = (grad_output, grad_residual_out, residual_out, weight)
    if _is_grad_enabled() or _route(*tensors) >= _THROUGH_OP:
        grad_input, grad_weight = _add_rms_norm_backward_op(
            grad_output,
            grad_residual_out,
            residual_out,
            ctx.shape,
            weight,
            ctx.eps,
            ctx.weight_offset,
        )
    else:
        grad_input, grad_weight = _backward(
            _served_type(residual_out, weight),
            grad_output,
            residual_out,
            ctx.shape,
            weight,
            ctx.eps,
            ctx.weight_offset,
            grad_residual_out,
        )
    # x and residual enter the sum alike: one gradient for both.
    return grad_input, grad_input, None, None if weight is None else grad_weight, None, None


_SECOND_ORDER = (
    "rmsnorm.torch computes first derivatives only: its backward ops have no backward. "
    "For second derivatives (create_graph=True, gradgradcheck, Hessians) use "
    "torch.nn.functional.rms_norm"
)


def _no_second_order(ctx, *grads):
    raise RuntimeError(_SECOND_ORDER)


torch.library.register_autograd(_rms_norm_op, _rms_norm_grads, setup_context=_setup_rms_norm)
torch.library.register_autograd(
    _add_rms_norm_op, _add_rms_norm_grads, setup_context=_setup_add_rms_norm
)
for _backward_op in (_rms_norm_backward_op, _add_rms_norm_backward_op):
    torch.library.register_autograd(_backward_op, _no_second_order)


# Forward-mode AD: y = x * r * w with r = 1 / sqrt(mean(x^2) + eps) over
# the normalised dims has the tangent
#     dy = w * (dx * r - x * r^3 * mean(x * dx)) + dw * x * r
# (w the factor weight_offset + weight, whose tangent is the weight's). It is
# formed with torch's ops in the compute type (float32 for 16-bit input, as
# torch's own rms_norm computes), rounded once to the input's dtype: a
# tangent, unlike the output, is not the kernels' exact result.
def _rms_norm_jvp(input, input_tangent, shape, weight, weight_tangent, eps, weight_offset):
    compute = torch.promote_types(input.dtype, torch.float32)
    if weight is not None:
        compute = torch.promote_types(compute, weight.dtype)
    if eps is None:
        eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
    elif input.dtype != torch.float64:
        eps = float(np.float32(eps))  # as the kernels round it
    dims = tuple(range(-len(shape), 0))
    x = input.to(compute)
    inv_rms = torch.rsqrt(x.square().mean(dims, keepdim=True) + eps)
    tangent = torch.zeros_like(x)
    if input_tangent is not None:
        dx = input_tangent.to(compute)
        tangent = dx * inv_rms - x * inv_rms**3 * (x * dx).mean(dims, keepdim=True)
        if weight is not None:
            tangent = tangent * (weight.to(compute) + weight_offset)
    if weight_tangent is not None:
        tangent = tangent + weight_tangent.to(compute) * (x * inv_rms)
    return tangent.to(input.dtype)


def _sum_tangent(input_tangent, residual_tangent):
    """The tangent of input + residual, either tangent None for zeros."""
    if input_tangent is None or residual_tangent is None:
        return input_tangent if residual_tangent is None else residual_tangent
    return input_tangent + residual_tangent


def _refuse_tangents(op: str, *tensors) -> None:
    """The ops' autograd (torch.library's) has no jvp: an operand with a
    tangent is refused, naming what serves forward-mode AD."""
    if _forward_ad._current_level < 0:
        return
    for t in tensors:
        if t is not None and _forward_ad.unpack_dual(t).tangent is not None:
            raise RuntimeError(
                f"torch.ops.rmsnorm.{op} has no forward-mode derivative (jvp): for "
                f"forward-mode AD call rmsnorm.torch.{op.removesuffix('_backward')}, which "
                "has one, or torch.nn.functional.rms_norm"
            )


# forward(ctx, ...), not a separate setup_context: torch binds the default
# arguments of a Function that has setup_context through inspect.signature on
# every call, which cost more than the kernels at 1x4096.
class _EagerRMSNorm(torch.autograd.Function):
    """rmsnorm::rms_norm's autograd in eager mode, without the dispatcher,
    and its forward-mode derivative."""

    @staticmethod
    def forward(ctx, input, shape, weight, eps, weight_offset):
        kernel_type = _served_type(input, weight)
        output = _forward(kernel_type, input, shape, weight, eps, weight_offset, keep_layout=True)
        _setup_rms_norm(ctx, (input, shape, weight, eps, weight_offset), output)
        if _forward_ad._current_level >= 0:
            ctx.save_for_forward(input, weight)
        return output

    backward = staticmethod(_rms_norm_grads)

    @staticmethod
    def jvp(ctx, input_tangent, _shape, weight_tangent, _eps, _weight_offset):
        input, weight = ctx.saved_tensors
        return _rms_norm_jvp(
            input, input_tangent, ctx.shape, weight, weight_tangent, ctx.eps, ctx.weight_offset
        )


class _EagerAddRMSNorm(torch.autograd.Function):
    """rmsnorm::add_rms_norm's autograd in eager mode, without the
    dispatcher, and its forward-mode derivative: the sum's tangent is the
    sum of the tangents, and the output's that of rms_norm of the sum."""

    @staticmethod
    def forward(ctx, input, residual, shape, weight, eps, weight_offset):
        kernel_type = _served_type(input, weight)
        outputs = _forward(kernel_type, input, shape, weight, eps, weight_offset, residual)
        _setup_add_rms_norm(ctx, (input, residual, shape, weight, eps, weight_offset), outputs)
        if _forward_ad._current_level >= 0:
            ctx.save_for_forward(outputs[1], weight)
        return outputs

    backward = staticmethod(_add_rms_norm_grads)

    @staticmethod
    def jvp(ctx, input_tangent, residual_tangent, _shape, weight_tangent, _eps, _weight_offset):
        residual_out, weight = ctx.saved_tensors
        sum_tangent = _sum_tangent(input_tangent, residual_tangent)
        output_tangent = _rms_norm_jvp(
            residual_out,
            sum_tangent,
            ctx.shape,
            weight,
            weight_tangent,
            ctx.eps,
            ctx.weight_offset,
        )
        if sum_tangent is None:
            sum_tangent = torch.zeros_like(residual_out)
        return output_tangent, sum_tangent


def _weight_offset_float(weight_offset, weight) -> float:
    """weight_offset as the ops take it, after the NumPy API's checks: the
    same values are taken and the same errors raised."""
    offset = _resolve_weight_offset(weight_offset, weight)
    return 0.0 if offset is None else float(offset)


def _factor(weight, weight_offset):
    """weight_offset + weight for torch's functional, which has no offset (rounded there)."""
    return weight if weight_offset == 0 else weight + weight_offset


def _torch_rms_norm(input, shape, weight, eps, weight_offset):
    """rms_norm by torch.nn.functional.rms_norm, for what the kernels do not serve."""
    _check_operands("rms_norm", ((1, "input", input), (3, "weight", weight)))
    return torch.nn.functional.rms_norm(input, shape, _factor(weight, weight_offset), eps)


def _torch_add_rms_norm(input, residual, shape, weight, eps, weight_offset):
    """add_rms_norm by torch's add and rms_norm, for what the kernels do not
    serve, with the kernels' checks of the residual (no broadcasting, no
    promotion)."""
    operands = ((1, "input", input), (2, "residual", residual), (4, "weight", weight))
    _check_operands("add_rms_norm", operands)
    error = residual_error(input.shape, input.dtype, residual.shape, residual.dtype)
    if error is not None:
        raise error
    residual_out = input + residual
    factor = _factor(weight, weight_offset)
    return torch.nn.functional.rms_norm(residual_out, shape, factor, eps), residual_out


def rms_norm(input, normalized_shape, weight=None, eps=None, *, weight_offset=0.0):
    """``torch.nn.functional.rms_norm`` on rmsnorm's kernels, with autograd.

    ``weight_offset`` (0 in torch) is Gemma's 1 in ``(1 + weight)``: the
    factor ``weight_offset + weight`` is formed exactly on the kernels'
    path (torch's fallback rounds it first). It is a real number, checked
    as ``rmsnorm.rms_norm`` checks it (one past float64's range is +-inf).
    Tensors the kernels do not serve go to ``torch.nn.functional.rms_norm``;
    sparse tensors and non-tensors are refused, naming them. Under
    ``torch.autograd.forward_ad`` the output has its tangent.

    >>> import torch, rmsnorm.torch
    >>> rmsnorm.torch.rms_norm(torch.tensor([[3.0, 4.0]]), [2], eps=0.0)
    tensor([[0.8485, 1.1314]])
    """
    shape = _shape_tuple(normalized_shape, "rms_norm", 2)
    if type(weight_offset) is not float or weight_offset:
        weight_offset = _weight_offset_float(weight_offset, weight)
    try:
        kernel_type = _kernel_type(input, weight)
    except AttributeError:  # an operand that is not a tensor, named by _torch_rms_norm
        kernel_type = None
    if kernel_type is not None and not _functorch_transforms_active():
        route = _route(input, weight)
        if route == _DIRECT:
            return _forward(
                kernel_type, input, shape, weight, eps, weight_offset, keep_layout=True
            )
        if route == _AUTOGRAD:
            return _EagerRMSNorm.apply(input, shape, weight, eps, weight_offset)
        if route == _THROUGH_OP:
            return _rms_norm_op(input, shape, weight, eps, weight_offset)
    return _torch_rms_norm(input, shape, weight, eps, weight_offset)


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None, *, weight_offset=0.0):
    """A pre-norm block's residual add and RMSNorm, fused: ``(output, residual_out)``.

    ``residual_out = input + residual``, rounded to the input's dtype, and
    ``output = rms_norm(residual_out, ...)``: the same bytes as the two
    steps, in one pass. ``residual`` must have the input's shape
    (ValueError) and dtype (TypeError), whatever the weight and wherever
    the call runs, as in ``rmsnorm.add_rms_norm``. Autograd gives ``input``
    and ``residual`` the same gradient.

    >>> import torch, rmsnorm.torch
    >>> x, residual = torch.tensor([[1.0, 3.0]]), torch.tensor([[2.0, 1.0]])
    >>> rmsnorm.torch.add_rms_norm(x, residual, [2], eps=0.0)
    (tensor([[0.8485, 1.1314]]), tensor([[3., 4.]]))
    """
    shape = _shape_tuple(normalized_shape, "add_rms_norm", 3)
    if type(weight_offset) is not float or weight_offset:
        weight_offset = _weight_offset_float(weight_offset, weight)
    try:
        kernel_type = _kernel_type(input, weight)
        if kernel_type is not None and _kernel_type(residual, weight) is None:
            kernel_type = None
    except AttributeError:  # an operand that is not a tensor, named by _torch_add_rms_norm
        kernel_type = None
    if kernel_type is not None and not _functorch_transforms_active():
        route = _route(input, residual, weight)
        if route == _DIRECT:
            return _forward(kernel_type, input, shape, weight, eps, weight_offset, residual)
        if route == _AUTOGRAD:
            return _EagerAddRMSNorm.apply(input, residual, shape, weight, eps, weight_offset)
        if route == _THROUGH_OP:
            return _add_rms_norm_op(input, residual, shape, weight, eps, weight_offset)
    return _torch_add_rms_norm(input, residual, shape, weight, eps, weight_offset)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` computed by rmsnorm's kernels.

    The same constructor, ``weight`` parameter, ``state_dict`` keys and
    repr, so checkpoints load either way; ``forward(x)`` calls
    :func:`rms_norm`. ``forward(x, residual)`` is a pre-norm block's step:
    ``(RMSNorm(x + residual), x + residual)``, fused (:func:`add_rms_norm`).

    ``weight_offset`` (keyword; 0 in torch) makes the factor
    ``weight_offset + weight``, Gemma's ``1 + weight``, formed exactly; the
    weight then starts as zeros, so that with an offset of 1 the layer
    starts as plain normalisation. The repr names it when it is not 0. It
    is configuration, not state: ``state_dict`` holds the weight alone.
    """

    # A torch.nn.RMSNorm that replace() turned into this class has no
    # weight_offset of its own: it reads these.
    weight_offset = 0.0
    # Llama's RMSNorm returns ``weight * normalised``, whose dtype is the
    # wider of the input's and the weight's; torch's, and Gemma's, return
    # the input's dtype. replace() sets it where the module it turned did.
    _promotes_to_weight_dtype = False

    def __init__(
        self,
        normalized_shape,
        eps=None,
        elementwise_affine=True,
        device=None,
        dtype=None,
        *,
        weight_offset=0.0,
    ):
        # Checked as the NumPy module checks it: a real number, and not without a weight.
        _resolve_weight_offset(weight_offset, True if elementwise_affine else None)
        self.weight_offset = float(weight_offset)  # before reset_parameters reads it
        # Checked here, where torch.nn.RMSNorm's own error would name torch.empty's size.
        normalized_shape = _shape_tuple(normalized_shape, "RMSNorm", 1)
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def reset_parameters(self) -> None:
        """Sets the weight to ones, or zeros with a weight offset."""
        if self.weight is not None:
            if self.weight_offset:
                torch.nn.init.zeros_(self.weight)
            else:
                torch.nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        offset = f", weight_offset={self.weight_offset}" if self.weight_offset else ""
        return super().extra_repr() + offset

    def forward(self, x, residual=None):
        weight = self.weight
        if (
            self._promotes_to_weight_dtype
            and weight is not None
            and weight.dtype != x.dtype
        ):
            x, weight, residual = _promoted(x, weight, residual)
        if residual is None:
            return rms_norm(
                x, self.normalized_shape, weight, self.eps, weight_offset=self.weight_offset
            )
        return add_rms_norm(
            x, residual, self.normalized_shape, weight, self.eps, weight_offset=self.weight_offset
        )

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module before compiling it.
        raise RuntimeError(
            "rmsnorm.torch.RMSNorm does not support torch.jit.script: its forward dispatches "
            "in Python, which TorchScript cannot compile. Use torch.compile or torch.export, "
            "or script a model with torch.nn.RMSNorm"
        )


def _promoted(x, weight, residual):
    """The operands in the wider dtype of x and the weight, as Llama's
    ``weight * normalised`` returns it. The conversion is exact, and the
    norm is then rounded once in that dtype."""
    dtype = torch.promote_types(x.dtype, weight.dtype)
    return x.to(dtype), weight.to(dtype), None if residual is None else residual.to(dtype)


# transformers' RMSNorm classes (LlamaRMSNorm, GemmaRMSNorm and their copies
# in other models) are plain modules, not torch.nn.RMSNorm. replace()
# recognises one by what it computes: a module with a one-dimensional weight
# and an eps attribute and nothing else, whose forward on a probe gives the
# norm with the factor weight (Llama's family) or 1 + weight (Gemma's).
_EPS_ATTRIBUTES = ("variance_epsilon", "eps")  # Llama's name, then Gemma's and torch's


def _probe_input(n: int, eps: float):
    """Rows at the scales where eps does not matter, where it does (mean
    square eps: half or twice the eps moves the result by 15% or more), and
    large, in float64."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(3, n, generator=generator, dtype=torch.float64)
    rows /= rows.square().mean(-1, keepdim=True).sqrt()  # mean square 1
    scales = [1.0, math.sqrt(eps) if eps > 0 else 0.5, 64.0]
    return rows * torch.tensor(scales, dtype=torch.float64).unsqueeze(-1)


def _stand_in(module, weight):
    """A shallow copy of ``module`` that holds ``weight`` in place of its
    own: the probe runs on it, and the module itself is never changed."""
    stand_in = object.__new__(type(module))
    stand_in.__dict__.update(module.__dict__)
    stand_in.__dict__["_parameters"] = {"weight": weight}
    return stand_in


def _recognise(module):
    """``(eps, weight_offset, promotes_to_weight_dtype)`` where ``module``
    computes an RMSNorm over its last dim as transformers' RMSNorm classes
    do, else None.

    The probe calls the class's forward directly, so no hook runs, on a
    stand-in that holds a probe weight of the module's dtype and device
    (values that every float dtype holds exactly: a zero-initialised
    Gemma weight, or a ones Llama one, could not tell the two factors
    apart). It runs on float32 rows, where both families compute in
    float32, and compares with float64 references for both factors; a
    second call, on 16-bit rows, tells whether the result takes the
    weight's wider dtype.
    """
    if isinstance(module, torch.nn.RMSNorm) or module._buffers or module._modules:
        return None
    parameters = module._parameters
    weight = parameters.get("weight")
    if len(parameters) != 1 or weight is None or weight.dim() != 1:
        return None
    if not weight.is_floating_point() or weight.numel() == 0:
        return None
    for name in _EPS_ATTRIBUTES:
        eps = module.__dict__.get(name)
        if isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0:
            break
    else:
        return None
    n = weight.shape[0]
    probe_weight = torch.arange(n, dtype=torch.float64) % 13 / 8 - 0.75
    rows = _probe_input(n, float(eps))
    rms = rows.square().mean(-1, keepdim=True).add(eps).sqrt()
    stand_in = _stand_in(module, probe_weight.to(weight.dtype).to(weight.device))
    forward = type(module).forward
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = forward(stand_in, rows.to(torch.float32).to(weight.device))
            narrow = torch.float16 if weight.dtype == torch.bfloat16 else torch.bfloat16
            y_narrow = forward(stand_in, rows[:1].to(narrow).to(weight.device))
    except Exception:  # a forward that takes other arguments, or runs nowhere (meta)
        return None
    if not (isinstance(y, torch.Tensor) and isinstance(y_narrow, torch.Tensor)):
        return None
    if y.shape != rows.shape or y.is_meta:
        return None
    y = y.to("cpu", torch.float64)
    offsets = [
        offset
        for offset in (0.0, 1.0)
        if torch.allclose(y, rows / rms * (offset + probe_weight), rtol=1e-4, atol=1e-5)
    ]
    if len(offsets) != 1:
        return None
    if y_narrow.dtype == narrow:
        promotes = False
    elif y_narrow.dtype == torch.promote_types(narrow, weight.dtype):
        promotes = True
    else:
        return None
    return float(eps), offsets[0], promotes


def replace(model) -> int:
    """Turns every RMSNorm module of ``model`` (itself included) into
    :class:`RMSNorm`, in place, and returns how many it turned.

    It turns ``torch.nn.RMSNorm`` and the RMSNorm modules of Hugging Face
    transformers models, which it recognises by what they compute: the
    Llama family's (``LlamaRMSNorm`` and its copies in Mistral, Qwen2,
    Qwen3 and others: the factor is the weight, eps in
    ``variance_epsilon``) and the Gemma family's (``GemmaRMSNorm``,
    Gemma2, Gemma3: the factor is ``1 + weight``, ``weight_offset=1.0``).
    Each module keeps its identity, parameters (the same Parameter
    objects), ``state_dict`` keys, dtype, device, buffers and hooks: only
    its class changes, and it gains RMSNorm's configuration
    (``normalized_shape``, ``eps``, ``elementwise_affine``,
    ``weight_offset``). A transformers module keeps its own attributes
    too, and its output dtype: a Llama one's is the wider of the input's
    and the weight's.

    Anything else is left alone: other subclasses of ``torch.nn.RMSNorm``,
    whose forward may differ, and modules whose forward does not compute
    one of the two norms. Turning none warns.
    """
    replaced = 0
    for module in model.modules():
        if type(module) is torch.nn.RMSNorm:
            module.__class__ = RMSNorm
            replaced += 1
            continue
        recognised = _recognise(module)
        if recognised is not None:
            eps, weight_offset, promotes = recognised
            module.__class__ = RMSNorm
            module.normalized_shape = tuple(module.weight.shape)
            module.eps = eps
            module.elementwise_affine = True
            module.weight_offset = weight_offset
            module._promotes_to_weight_dtype = promotes
            replaced += 1
    if not replaced:
        warnings.warn(
            f"rmsnorm.torch.replace found no RMSNorm module it recognises in "
            f"{type(model).__name__}: it turned none (it turns torch.nn.RMSNorm and "
            "transformers' Llama- and Gemma-style RMSNorm modules)",
            stacklevel=2,
        )
    return replaced
