"""The module API: torch.nn.RMSNorm's contract, holding weight and its gradient."""

from __future__ import annotations

import collections.abc
from typing import NamedTuple

import numpy as np

from ._dtypes import WEIGHT_DTYPES, resolve_dtype
from .functional import (
    _resolve_weight_offset,
    add_rms_norm,
    add_rms_norm_backward,
    normalized_shape_tuple,
    rms_norm,
    rms_norm_backward,
    weight_shape_error,
)

# What backward() finds where forward() saved its input, once an earlier
# backward() has freed it: a second backward is an error, as in torch.
_FREED_BY_BACKWARD = object()

_SECOND_BACKWARD = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed): RMSNorm.backward() frees the input that forward() "
    "saved. Call forward() again before the next backward()."
)


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` returns: the keys it missed and did not expect."""

    missing_keys: list[str]
    unexpected_keys: list[str]

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"  # as torch says it
        return (
            f"IncompatibleKeys(missing_keys={self.missing_keys}, "
            f"unexpected_keys={self.unexpected_keys})"
        )


def _weight_dtype(dtype) -> np.dtype:
    """``dtype`` in native byte order if a weight can have it, else TypeError."""
    weight_dtype = resolve_dtype(dtype).newbyteorder("=")
    if weight_dtype not in WEIGHT_DTYPES:
        names = ", ".join(str(d) for d in WEIGHT_DTYPES)
        raise TypeError(f"RMSNorm's dtype must be one of {names}, got {weight_dtype}")
    return weight_dtype


def _type_name(value) -> str:
    """The type's name as torch.typename writes it: ``list``, ``torch.Tensor``."""
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


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
    ``backward`` frees it, so a second ``backward`` needs another
    ``forward``. ``backward`` uses the weight as it is then: a weight
    assigned or converted (``to``) since the forward is the one it uses.

    ``forward(x, residual)`` is a pre-norm block's step, as vLLM's layer
    takes it: it normalises ``residual_out = x + residual`` and returns
    ``(y, residual_out)``; ``backward(grad_output, grad_residual_out)`` then
    returns the gradient of
    both x and the residual. ``weight_offset`` makes the factor
    ``weight_offset + weight`` (Gemma's ``1 + weight``); the weight then
    starts as zeros, so that with an offset of 1 the layer starts as plain
    normalisation.

    Of ``torch.nn.Module`` it has what makes sense without autograd or
    devices: ``parameters``/``named_parameters``, ``requires_grad_`` (kept in
    ``weight_requires_grad``), ``train``/``eval`` (the ``training`` flag;
    RMSNorm computes the same in both), ``to(dtype)`` and
    ``half``/``float``/``double``/``bfloat16``, ``zero_grad``,
    ``state_dict``/``load_state_dict``, and pickling and ``copy``, which
    keep the configuration and the weight but neither ``weight_grad`` nor
    the saved input, as torch keeps neither ``.grad`` nor saved tensors.

    >>> import numpy as np, rmsnorm
    >>> layer = rmsnorm.RMSNorm(2, eps=0.0)
    >>> layer
    RMSNorm((2,), eps=0.0, elementwise_affine=True)
    >>> layer(np.array([[3.0, 4.0]], dtype=np.float32))
    array([[0.84852815, 1.1313709 ]], dtype=float32)
    """

    def __init__(
        self, normalized_shape, eps=None, elementwise_affine=True, *, weight_offset=0.0, dtype=None
    ):
        self.normalized_shape = normalized_shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        # Checked as the functions check it: a real number, and not without a weight.
        _resolve_weight_offset(weight_offset, True if elementwise_affine else None)
        self.weight_offset = float(weight_offset)
        self.training = True
        self.weight_requires_grad = True
        self._weight = None
        if elementwise_affine:
            weight_dtype = _weight_dtype(np.float32 if dtype is None else dtype)
            self._weight = np.empty(self.normalized_shape, weight_dtype)
        self.weight_grad = None
        self._saved_input = None
        self._saved_with_residual = False
        self.reset_parameters()

    @property
    def weight(self):
        """The affine weight, an ndarray of shape ``normalized_shape``, or None.

        It is the module's own array: update it in place (``weight -= lr *
        weight_grad``). Assigning an ndarray stores a copy in native byte
        order, so the caller's array is never changed through the module;
        it must have shape ``normalized_shape`` (ValueError) and a dtype
        RMSNorm computes with (TypeError). Anything else but None is a
        TypeError, in torch's words. The new weight has no gradient yet:
        ``weight_grad`` becomes None. As in torch, a layer made with
        ``elementwise_affine=False`` takes a weight too.
        """
        return self._weight

    @weight.setter
    def weight(self, value) -> None:
        if value is not None:
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"cannot assign '{_type_name(value)}' as parameter 'weight' "
                    "(numpy.ndarray or None expected)"
                )
            dtype = _weight_dtype(value.dtype)
            if value.shape != self.normalized_shape:
                raise weight_shape_error(value.shape, self.normalized_shape)
            value = np.array(value, dtype=dtype, order="C")
        self._weight = value
        self.weight_grad = None

    def reset_parameters(self) -> None:
        """Sets the weight to ones, or zeros with a weight offset: the single
        place it is initialised."""
        if self.weight is not None:
            self.weight[...] = 0 if self.weight_offset != 0 else 1

    def forward(self, x, residual=None):
        """Normalises ``x``, or with a residual ``residual_out = x + residual``,
        returning ``(y, residual_out)``.

        Keeps what was normalised (``x``, or ``residual_out``) for :meth:`backward`.
        """
        if residual is None:
            y = rms_norm(
                x, self.normalized_shape, self._weight, self.eps, weight_offset=self.weight_offset
            )
            self._saved_input, self._saved_with_residual = x, False
            return y
        y, residual_out = add_rms_norm(
            x,
            residual,
            self.normalized_shape,
            self._weight,
            self.eps,
            weight_offset=self.weight_offset,
        )
        self._saved_input, self._saved_with_residual = residual_out, True
        return y, residual_out

    __call__ = forward

    def backward(self, grad_output, grad_residual_out=None):
        """The input's gradient for the last forward; adds into ``weight_grad``.

        After ``forward(x, residual)``, ``grad_residual_out`` is the gradient
        of the returned ``residual_out`` (None for zeros), and the result is the gradient
        of both x and the residual. The weight's gradient is added only
        while ``weight_requires_grad``. The input saved by forward is
        freed: a second backward raises RuntimeError until forward runs
        again.
        """
        if self._saved_input is None:
            raise ValueError("RMSNorm.backward() called before forward(): there is no input")
        if self._saved_input is _FREED_BY_BACKWARD:
            raise RuntimeError(_SECOND_BACKWARD)
        if grad_residual_out is not None and not self._saved_with_residual:
            raise ValueError(
                "RMSNorm.backward() got grad_residual_out, but the last forward() had no residual"
            )
        args = (self.normalized_shape, self._weight, self.eps)
        if self._saved_with_residual:
            grad_input, grad_weight = add_rms_norm_backward(
                grad_output,
                grad_residual_out,
                self._saved_input,
                *args,
                weight_offset=self.weight_offset,
            )
        else:
            grad_input, grad_weight = rms_norm_backward(
                grad_output, self._saved_input, *args, weight_offset=self.weight_offset
            )
        self._saved_input = _FREED_BY_BACKWARD
        if grad_weight is not None and self.weight_requires_grad:
            if self.weight_grad is None:
                self.weight_grad = grad_weight
            else:
                self.weight_grad += grad_weight
        return grad_input

    def parameters(self, recurse: bool = True):
        """An iterator over the parameters: the weight, if there is one.

        ``recurse`` is torch's; RMSNorm has no submodules to recurse into.
        """
        for _, parameter in self.named_parameters(recurse=recurse):
            yield parameter

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """An iterator over ``(name, parameter)``: ``("weight", weight)``, if there is one.

        A ``prefix`` is joined to the name with a dot, as in torch.
        """
        if self._weight is not None:
            yield (f"{prefix}.weight" if prefix else "weight"), self._weight

    def requires_grad_(self, requires_grad: bool = True):
        """Sets ``weight_requires_grad``: whether backward accumulates ``weight_grad``.

        With it False, backward still returns the input's gradient and
        leaves ``weight_grad`` as it is. torch keeps the flag on the
        parameter (``weight.requires_grad``); here it is the module's, and
        stays when a new weight is assigned. Returns the module.
        """
        if not isinstance(requires_grad, bool):
            raise TypeError(
                "requires_grad_(): argument 'requires_grad' (position 1) must be bool, "
                f"not {type(requires_grad).__name__}"
            )
        self.weight_requires_grad = requires_grad
        return self

    def train(self, mode: bool = True):
        """Sets the ``training`` flag; returns the module.

        RMSNorm computes the same in training and in eval mode; the flag is
        there for code that sets and reads it, as on any torch module.
        """
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        return self

    def eval(self):
        """``train(False)``: returns the module."""
        return self.train(False)

    def to(self, dtype):
        """Converts the weight and ``weight_grad`` to ``dtype`` in place; returns the module.

        ``dtype`` is anything ``np.dtype`` takes, or ``"bfloat16"``, and
        must be one RMSNorm computes with (TypeError otherwise; ImportError
        for bfloat16 without ml_dtypes). The weight becomes a new array
        unless it has the dtype already. The input saved by forward keeps
        its dtype, as torch's graph does: a backward after ``to`` returns
        the input's gradient in the input's dtype, computed with the
        converted weight. torch's devices and other arguments have no
        counterpart here.
        """
        dtype = _weight_dtype(dtype)
        if self._weight is not None:
            self._weight = self._weight.astype(dtype, copy=False)
        if self.weight_grad is not None:
            self.weight_grad = self.weight_grad.astype(dtype, copy=False)
        return self

    def half(self):
        """``to(numpy.float16)``: returns the module."""
        return self.to(np.float16)

    def float(self):
        """``to(numpy.float32)``: returns the module."""
        return self.to(np.float32)

    def double(self):
        """``to(numpy.float64)``: returns the module."""
        return self.to(np.float64)

    def bfloat16(self):
        """``to("bfloat16")``, which needs ml_dtypes: returns the module."""
        return self.to("bfloat16")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Sets ``weight_grad`` to None, or with ``set_to_none=False`` zeroes it in place."""
        if set_to_none:
            self.weight_grad = None
        elif self.weight_grad is not None:
            self.weight_grad[...] = 0

    def state_dict(self) -> dict:
        """``{"weight": weight}``, or ``{}`` without an affine weight."""
        return dict(self.named_parameters())

    def load_state_dict(
        self, state_dict, strict: bool = True, assign: bool = False
    ) -> IncompatibleKeys:
        """Copies ``state_dict["weight"]`` (anything np.asarray takes) into weight.

        As in torch: with ``strict=False``, missing and unexpected keys are
        tolerated, and either way they are returned as ``missing_keys`` and
        ``unexpected_keys``; a weight of the wrong shape is an error always.
        A bool or integer weight is taken as its values. With
        ``assign=True``, a weight of a dtype RMSNorm computes with is
        assigned (copied, as assigning ``weight`` is) and keeps its dtype,
        rather than being cast into the current weight.
        """
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        expected = set(self.state_dict())
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        problems = []
        if missing and strict:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if unexpected and strict:
            problems.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected)
            )
        loads_weight = self.weight is not None and "weight" in state_dict
        if loads_weight:
            value = np.asarray(state_dict["weight"])
            if value.shape != self.weight.shape:
                problems.append(
                    f"size mismatch for weight: copying a param with shape {value.shape} from "
                    f"checkpoint, the shape in current model is {self.weight.shape}."
                )
            elif value.dtype.kind not in "biuf" and value.dtype not in WEIGHT_DTYPES:
                problems.append(f"weight must be a real array, got dtype {value.dtype}")
        if problems:
            raise ValueError("Error(s) in loading state_dict for RMSNorm: " + "; ".join(problems))
        if loads_weight:
            if assign and value.dtype.newbyteorder("=") in WEIGHT_DTYPES:
                self.weight = value
            else:
                np.copyto(self.weight, value, casting="unsafe")
        return IncompatibleKeys(missing, unexpected)

    def __getstate__(self) -> dict:
        """What pickle and copy keep: the configuration, flags and weight.

        Not the input saved by forward (it may be a whole batch), nor
        ``weight_grad``: torch's pickle and deepcopy keep neither saved
        tensors nor ``.grad``.
        """
        state = self.__dict__.copy()
        del state["_saved_input"], state["_saved_with_residual"], state["weight_grad"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.weight_grad = None
        self._saved_input = None
        self._saved_with_residual = False

    def extra_repr(self) -> str:
        """The text inside ``RMSNorm(...)`` in the repr, as torch's extra_repr."""
        text = (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}"
        )
        return text + (f", weight_offset={self.weight_offset}" if self.weight_offset else "")

    def __repr__(self) -> str:
        return f"RMSNorm({self.extra_repr()})"
