"""Types of rmsnorm.module (the implementation is module.py)."""

from typing import Any, Mapping, overload

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .functional import _Eps, _Float, _ShapeLike

class RMSNorm:
    normalized_shape: tuple[int, ...]
    eps: _Eps
    elementwise_affine: bool
    weight: NDArray[np.floating[Any]] | None
    weight_grad: NDArray[np.floating[Any]] | None
    def __init__(
        self,
        normalized_shape: _ShapeLike,
        eps: _Eps = None,
        elementwise_affine: bool = True,
        *,
        dtype: DTypeLike | None = None,
    ) -> None: ...
    def reset_parameters(self) -> None: ...
    @overload
    def forward(self, x: NDArray[_Float]) -> NDArray[_Float]: ...
    @overload
    def forward(self, x: Any) -> Any: ...
    @overload
    def __call__(self, x: NDArray[_Float]) -> NDArray[_Float]: ...
    @overload
    def __call__(self, x: Any) -> Any: ...
    # The input's gradient has the dtype of the last forward's input; for an
    # ndarray input it is an ndarray.
    def backward(self, grad_output: ArrayLike) -> NDArray[np.floating[Any]]: ...
    def zero_grad(self) -> None: ...
    def state_dict(self) -> dict[str, NDArray[np.floating[Any]]]: ...
    def load_state_dict(self, state_dict: Mapping[str, ArrayLike], strict: bool = True) -> None: ...
    def extra_repr(self) -> str: ...
