"""float16 and bfloat16 outputs are the correctly rounded result, ties included.

The 16-bit forward writes most blocks from a float product checked to be far
from a 16-bit rounding boundary, and the rest in double. Rows [3, 3, 1, 1, 0]
* c have mean(x^2) = 4 c^2, so with eps = 0, inv_rms = 1 / (2c) exactly and
y = 1.5 w is an exact tie wherever w's last bit is set; a small eps puts y a
relative eps / (8 c^2) below the tie (above for eps < 0), from 2^-17 down to
2^-40 over the scales here, through the width of the fast path's check.
Every output must be y rounded once to nearest even, on every instruction
set, for a weight of x's kind or float32.
"""

from __future__ import annotations

import numpy as np
import pytest

import rmsnorm
from rmsnorm._dtypes import BF16

ACTIVE_ISA, SUPPORTED_ISAS = rmsnorm._core._isa()
LONG = np.longdouble
KINDS = [np.float16] + ([BF16] if BF16 is not None else [])


@pytest.fixture
def restore_isa():
    yield
    rmsnorm._core._set_isa(ACTIVE_ISA)


def rounded_to_nearest_even(dtype, y):
    """y (long double, finite) rounded once to dtype, by the midpoint between
    its two neighbours: no rounding through float or double on the way. Past
    the largest finite value, the next one up is inf, 2^16 or 2^128 away."""
    bits = np.arange(0x8000, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        values = bits.view(dtype).astype(np.float64)
    finite = np.isfinite(values)
    bits, values = bits[finite], values[finite].astype(LONG)
    inf_bits = np.array([np.inf], dtype).view(np.uint16)
    bits = np.append(bits, inf_bits)
    values = np.append(values, 2 * values[-1] - values[-2])
    magnitude = np.abs(y)
    below = np.clip(np.searchsorted(values, magnitude, side="right") - 1, 0, len(values) - 2)
    midpoint = (values[below] + values[below + 1]) / 2  # exact in long double
    up = (magnitude > midpoint) | ((magnitude == midpoint) & (bits[below + 1] % 2 == 0))
    out = np.where(up, bits[below + 1], bits[below]).astype(np.uint16)
    return np.where(np.signbit(y), out | 0x8000, out).astype(np.uint16)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="needs an 80-bit long double")
@pytest.mark.parametrize("isa", SUPPORTED_ISAS)
@pytest.mark.parametrize("weight_kind", ["same", "float32"])
@pytest.mark.parametrize("dtype", KINDS, ids=lambda d: np.dtype(d).name)
def test_16_bit_outputs_round_once_to_nearest_even_at_and_near_ties(
    isa, weight_kind, dtype, restore_isa
):
    rmsnorm._core._set_isa(isa)
    rng = np.random.default_rng(16)
    pattern = np.tile([3.0, 3.0, 1.0, 1.0, 0.0], 820)  # n = 4100: whole blocks, head and tail
    scales = 2.0 ** np.arange(-4, 5) if dtype is np.float16 else 2.0 ** np.arange(-8, 9, 2)
    x = np.concatenate([pattern * rng.choice([-1.0, 1.0], (4, pattern.size)) * c for c in scales])
    x = x.astype(dtype)
    w_bits = rng.integers(0, 0x10000, pattern.size, dtype=np.uint32).astype(np.uint16)
    w = w_bits.view(dtype)
    w[~np.isfinite(w.astype(np.float32))] = 1.0
    if weight_kind == "float32":
        w = w.astype(np.float32)
    mean_squares = LONG(4) * (scales.astype(LONG) ** 2).repeat(4)
    for eps in [0.0, 1e-7, -1e-7, 2.0**-21, -(2.0**-21), 2.0**-30]:
        e = np.float32(eps)
        y = rmsnorm.forward(x, w, e)
        inv_rms = 1 / np.sqrt(mean_squares + LONG(float(e)))
        exact = x.astype(np.float64).astype(LONG) * inv_rms[:, None] * w.astype(np.float64)
        want = rounded_to_nearest_even(dtype, exact)
        wrong = np.flatnonzero(y.view(np.uint16) != want)
        assert wrong.size == 0, (
            f"eps={eps:g}: {wrong.size} outputs not correctly rounded, first at "
            f"{np.unravel_index(wrong[0], y.shape)}"
        )
