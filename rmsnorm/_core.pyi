"""Types of the C extension rmsnorm._core (csrc/numpy/module.c)."""

from typing import Any

import numpy as np

# The gufuncs. np.ufunc's __call__ takes anything and returns Any: a gufunc
# dispatches to duck arrays through __array_ufunc__, so its result type
# depends on the operands. Their docstrings (help(rmsnorm.forward)) give
# the signatures (n),(n),()->(n) and (m,n),(m,n),(n),()->(m,n),(n).
forward: np.ufunc
backward: np.ufunc
# The pre-norm block's residual add fused with the norm:
# (n),(n),(n),()->(n),(n) and (m,n),(m,n),(m,n),(n),()->(m,n),(n).
add_forward: np.ufunc
add_backward: np.ufunc
# Each of the four with a float64 weight_offset operand after the weight.
forward_offset: np.ufunc
backward_offset: np.ufunc
add_forward_offset: np.ufunc
add_backward_offset: np.ufunc
# The (x, weight, eps) dtype names of every loop, in the order NumPy tries them.
dtype_pairs: tuple[tuple[str, str, str], ...]

def set_num_threads(n: int, /) -> None: ...
def get_num_threads() -> int: ...

# For the package and its tests: rms_norm's shortcut past the ufunc
# machinery (None where it does not apply), the active and supported
# instruction sets, a switch between them, and the bfloat16 loops for
# ml_dtypes.bfloat16.
def _forward_direct(
    x: np.ndarray[Any, Any], weight: np.ndarray[Any, Any], eps: np.generic, /
) -> np.ndarray[Any, Any] | None: ...
def _isa() -> tuple[str, list[str]]: ...
def _set_isa(name: str, /) -> None: ...
def _register_bfloat16(dtype: np.dtype[Any], /) -> None: ...

# For rmsnorm.torch: the kernels on raw buffers. A matrix is (address, row
# stride, stride) and a vector (address, stride), strides in bytes; type is
# an index into dtype_pairs.
_Matrix = tuple[int, int, int]
_Vector = tuple[int, int]

def _forward_buffers(
    type: int, rows: int, n: int, eps: float, weight_offset: float, x: _Matrix,
    weight: _Vector, y: _Matrix, residual: _Matrix | None, residual_out: _Matrix | None, /,
) -> None: ...
def _backward_buffers(
    type: int, rows: int, n: int, eps: float, weight_offset: float, grad_output: _Matrix,
    x: _Matrix, weight: _Vector, grad_input: _Matrix, grad_weight: _Vector,
    grad_residual_out: _Matrix | None, /,
) -> None: ...
def _advise_huge_pages(address: int, nbytes: int, /) -> None: ...
