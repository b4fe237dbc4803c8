"""The element types rmsnorm computes on, and how each pairs with a weight.

float16, float32 and float64 are NumPy's own. bfloat16 comes from the
optional package ml_dtypes: when it is installed, importing rmsnorm adds the
bfloat16 loops to the gufuncs; when it is not, asking for bfloat16 raises an
ImportError that says how to get it.
"""

from __future__ import annotations

import numpy as np

from . import _core

try:
    import ml_dtypes
except ImportError:  # bfloat16 stays unavailable; everything else works
    ml_dtypes = None

BFLOAT16_MISSING = (
    "bfloat16 needs the optional package ml_dtypes: pip install 'rmsnorm[bfloat16]' "
    "(or pip install ml_dtypes)"
)

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = None if ml_dtypes is None else np.dtype(ml_dtypes.bfloat16)
if BF16 is not None:
    _core._register_bfloat16(BF16)

# The loops' (input, weight, eps) dtypes come from the C extension's type
# list, in the order NumPy tries them: for each input dtype, its weight
# dtypes narrowest first. float32 weights with half inputs and a float64
# weight with float32 input compute as torch does in mixed precision. eps,
# and its default, come from the compute type: float64 for float64 input,
# float32 for everything else (torch's "opmath" type).
_NAMED = {"float16": F16, "float32": F32, "float64": F64, "bfloat16": BF16}
WEIGHT_DTYPES: dict = {}
EPS_DTYPE: dict = {}
for _x, _weight, _eps in _core.dtype_pairs:
    if _NAMED[_x] is None or _NAMED[_weight] is None:
        continue  # bfloat16 without ml_dtypes
    WEIGHT_DTYPES[_NAMED[_x]] = WEIGHT_DTYPES.get(_NAMED[_x], ()) + (_NAMED[_weight],)
    EPS_DTYPE[_NAMED[_x]] = _NAMED[_eps]
DEFAULT_EPS = {dtype: float(np.finfo(EPS_DTYPE[dtype]).eps) for dtype in WEIGHT_DTYPES}


def resolve_dtype(dtype) -> np.dtype:
    """np.dtype(dtype), where the name "bfloat16" also works (via ml_dtypes)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        if BF16 is None:
            raise ImportError(BFLOAT16_MISSING)
        return BF16
    return np.dtype(dtype)


def loop_weight_dtype(x_dtype: np.dtype, weight_dtype: np.dtype) -> np.dtype:
    """The weight dtype of the loop that serves this input and weight.

    The narrowest the weight casts to safely; a weight wider than every
    loop's (float64 with half input) is rounded to the widest.
    """
    candidates = WEIGHT_DTYPES[x_dtype]
    for candidate in candidates:
        if np.can_cast(weight_dtype, candidate, casting="safe"):
            return candidate
    return candidates[-1]
