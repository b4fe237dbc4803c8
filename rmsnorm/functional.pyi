"""Types of rmsnorm.functional (the implementation is functional.py).

An ndarray of float16, float32 or float64 in gives an ndarray of the same
dtype out. Anything else (a list, a bfloat16 array, a dask array or another
duck array) is typed Any: a duck array in may give a duck array out.
"""

from typing import Any, Sequence, SupportsIndex, TypeVar, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

_Float = TypeVar("_Float", np.float16, np.float32, np.float64)

# normalized_shape: an int or a sequence of ints (NumPy integers included).
_ShapeLike = SupportsIndex | Sequence[SupportsIndex]
# eps: a real number, or None for the machine epsilon of the compute type.
_Eps = float | np.floating[Any] | None

def normalized_shape_tuple(normalized_shape: _ShapeLike) -> tuple[int, ...]: ...
def weight_shape_error(
    weight_shape: tuple[int, ...], normalized_shape: tuple[int, ...]
) -> ValueError: ...
def input_shape_error(
    input_shape: tuple[int, ...], normalized_shape: tuple[int, ...]
) -> ValueError: ...
def residual_error(
    input_shape: Sequence[int],
    input_dtype: Any,
    shape: Sequence[int],
    dtype: Any,
    what: str = "residual",
) -> ValueError | TypeError | None: ...
@overload
def rms_norm(
    input: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: ArrayLike | None = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> NDArray[_Float]: ...
@overload
def rms_norm(
    input: Any,
    normalized_shape: _ShapeLike,
    weight: Any = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> Any: ...
@overload
def rms_norm_backward(
    grad_output: ArrayLike,
    input: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: None = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[NDArray[_Float], None]: ...
@overload
def rms_norm_backward(
    grad_output: ArrayLike,
    input: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: ArrayLike,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
@overload
def rms_norm_backward(
    grad_output: Any,
    input: Any,
    normalized_shape: _ShapeLike,
    weight: Any = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[Any, Any]: ...
@overload
def add_rms_norm(
    input: NDArray[_Float],
    residual: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: ArrayLike | None = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
    out: tuple[NDArray[_Float] | None, NDArray[_Float] | None] | None = None,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
@overload
def add_rms_norm(
    input: Any,
    residual: Any,
    normalized_shape: _ShapeLike,
    weight: Any = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
    out: tuple[Any, Any] | None = None,
) -> tuple[Any, Any]: ...
@overload
def add_rms_norm_backward(
    grad_output: ArrayLike,
    grad_residual_out: ArrayLike | None,
    residual_out: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: None = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[NDArray[_Float], None]: ...
@overload
def add_rms_norm_backward(
    grad_output: ArrayLike,
    grad_residual_out: ArrayLike | None,
    residual_out: NDArray[_Float],
    normalized_shape: _ShapeLike,
    weight: ArrayLike,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[NDArray[_Float], NDArray[_Float]]: ...
@overload
def add_rms_norm_backward(
    grad_output: Any,
    grad_residual_out: Any,
    residual_out: Any,
    normalized_shape: _ShapeLike,
    weight: Any = None,
    eps: _Eps = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[Any, Any]: ...
