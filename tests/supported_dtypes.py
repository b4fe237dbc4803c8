"""The dtypes rmsnorm computes on, for the tests to parametrise over.

One definition, read from the C extension's list of loops
(``rmsnorm._core.dtype_pairs``), so that a loop added there reaches every
test that runs over all dtypes. The lists hold NumPy scalar types
(``np.float32``, ``ml_dtypes.bfloat16``): each is a valid ``dtype=``, is
callable to make a scalar of its type, and gets its name as a test id
(conftest.py).

bfloat16 needs the optional package ml_dtypes; without it, every list but
``LOOP_PAIR_NAMES`` leaves bfloat16 out.
"""

from __future__ import annotations

import rmsnorm
from rmsnorm._dtypes import BF16

# (input, weight) dtype names of every loop, in the extension's order: each
# dtype with its own weight, the 16-bit ones also with a float32 weight and
# float32 also with a float64 one (torch's mixed precision). The bfloat16
# loops are listed even without ml_dtypes, for tests that skip them.
LOOP_PAIR_NAMES = [(x, weight) for x, weight, _eps in rmsnorm._core.dtype_pairs]


def _available(name: str) -> bool:
    return name != "bfloat16" or BF16 is not None


def _scalar_type(name: str) -> type:
    return rmsnorm._dtypes.resolve_dtype(name).type


# What this installation has, in the same order.
DTYPE_PAIR_NAMES = [(x, weight) for x, weight in LOOP_PAIR_NAMES
                    if _available(x) and _available(weight)]
DTYPE_NAMES = list(dict.fromkeys(x for x, _ in DTYPE_PAIR_NAMES))
# The same, as scalar types: float16, float32, float64, and bfloat16.
DTYPE_PAIRS = [(_scalar_type(x), _scalar_type(weight)) for x, weight in DTYPE_PAIR_NAMES]
DTYPES = [_scalar_type(name) for name in DTYPE_NAMES]
# NumPy's own: every dtype but bfloat16, for what needs no ml_dtypes.
NUMPY_DTYPES = [_scalar_type(name) for name in DTYPE_NAMES if name != "bfloat16"]
# float32 and float64, whose results most tests check against torch and the
# float64 reference at full precision; the 16-bit dtypes, with tolerances
# of their own, run over DTYPES or NUMPY_DTYPES.
WIDE_DTYPES = [_scalar_type(name) for name in DTYPE_NAMES if name in ("float32", "float64")]
