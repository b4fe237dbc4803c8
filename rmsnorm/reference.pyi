"""Types of rmsnorm.reference (the implementation is reference.py): the
float64 RMSNorm written from the math, the independent check."""

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from .functional import _ShapeLike

def reference_eps(dtype: DTypeLike, eps: float | None) -> float: ...
def rms_norm(
    x: ArrayLike,
    normalized_shape: _ShapeLike,
    weight: ArrayLike | None = None,
    eps: float | None = None,
) -> NDArray[np.float64]: ...
def rms_norm_backward(
    grad_output: ArrayLike,
    x: ArrayLike,
    normalized_shape: _ShapeLike,
    weight: ArrayLike | None = None,
    eps: float | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]: ...
