"""Arrays with the same values as a given one, laid out in memory otherwise.

The kernels have a contiguous path and a strided one; a test runs an
operand through both by giving it once as it is and once in such a layout.
"""

from __future__ import annotations

import numpy as np


def column_slice(array: np.ndarray) -> np.ndarray:
    """Same values, every other column of a wider array: a last-axis stride
    of two elements, so the rows are not contiguous."""
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    wide[..., ::2] = array
    return wide[..., ::2]
