"""float16, bfloat16 and mixed precision against torch; accuracy against the exact result.

The accuracy corpus and its error measures live in accuracy_corpus.py, from
which benchmarks/accuracy.py prints the README's table; here each case
asserts the goals:
the forward within 1 ULP (2 for float64) of the exact result and never
further than torch's, the gradients never less accurate than torch's.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import rmsnorm
from closeness import assert_forward_close, assert_grad_close
from supported_dtypes import DTYPE_NAMES, DTYPE_PAIR_NAMES

torch = pytest.importorskip("torch", reason="the parity suite compares with torch")
import accuracy_corpus as accuracy  # noqa: E402  (tests/accuracy_corpus.py)

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
BF16 = rmsnorm._dtypes.BF16
needs_bfloat16 = pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")
CASES = list(accuracy.cases())
GOAL_ULP = {"float64": 2.0, "float32": 1.0, "float16": 1.0, "bfloat16": 1.0}


def _tensor(a):
    if BF16 is not None and a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _numpy(t):
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy().view(BF16)
    return t.detach().numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.dtype}-{c.name}")
def test_forward_is_within_its_ulp_goal_and_never_worse_than_torch(case):
    (ours, _, _), theirs, _ = accuracy.measure(case)
    print(f"\n{case.dtype:8} {case.name:24} forward max ULP: ours {ours:.3f}, torch {theirs[0]:.3f}")
    assert ours <= GOAL_ULP[case.dtype], f"{ours:.3f} ULP from the exact result"
    # 1e-3 ULP: the same rounding measured twice, not a real difference
    assert ours <= theirs[0] + 1e-3, f"ours {ours:.3f} ULP, torch {theirs[0]:.3f}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.dtype}-{c.name}")
def test_gradients_are_never_less_accurate_than_torchs(case):
    ours, theirs, rounded = accuracy.measure(case)
    print(f"\n{case.dtype:8} {case.name:24} grad_input {ours[1]:.2e} (torch {theirs[1]:.2e}), "
          f"grad_weight {ours[2]:.2e} (torch {theirs[2]:.2e})")
    for k, name in ((1, "grad_input"), (2, "grad_weight")):
        # Where torch is at the format's own limit (the exact gradient rounded
        # to float16 or bfloat16), so are we: no implementation does better.
        bound = max(theirs[k], rounded[k]) * (1 + 1e-3)
        assert ours[k] <= bound, f"{name}: ours {ours[k]:.3e}, torch {theirs[k]:.3e}"


@pytest.mark.parametrize(
    "dtype, magnitude, eps",
    [("float32", 1e25, 1e-6), ("float32", 1e-30, 0.0), ("float64", 1e160, 1e-6)],
    ids=["float32-1e25-squares-overflow", "float32-1e-30-squares-underflow",
         "float64-1e160-squares-overflow"],
)
def test_extreme_rows_are_exact_where_torch_is_not(dtype, magnitude, eps):
    # A deliberate difference from torch: its x**2 leaves the format's range,
    # so it returns zeros or NaN; we return the exact result (docs/accuracy.md).
    x = (np.linspace(0.5, 2.0, 64) * magnitude).astype(dtype)
    ours = rmsnorm.rms_norm(x, 64, eps=eps)
    theirs = torch.nn.functional.rms_norm(torch.from_numpy(x), [64], eps=eps).numpy()
    exact = np.linspace(0.5, 2.0, 64) / np.sqrt(np.mean(np.linspace(0.5, 2.0, 64) ** 2))
    np.testing.assert_allclose(ours, exact.astype(dtype), rtol=4 * np.finfo(dtype).eps)
    assert not np.allclose(theirs, exact, rtol=1e-3, equal_nan=False)


SPECIAL_ROWS = {
    "nan": [1.0, np.nan, -2.0, 3.0],
    "plus-inf": [1.0, np.inf, -2.0, 3.0],
    "minus-inf": [1.0, -np.inf, -2.0, 0.0],
    "zero-row": [0.0, 0.0, 0.0, 0.0],
    "negative-zero-row": [-0.0, 0.0, -0.0, 0.0],
}
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("row", SPECIAL_ROWS, ids=str)
@pytest.mark.parametrize("eps", [0.0, 1e-6, float("nan")], ids=["eps=0", "eps=1e-6", "eps=nan"])
def test_special_values_match_torch_element_by_element(dtype, row, eps):
    x = np.array([SPECIAL_ROWS[row], [0.5, -1.5, 2.5, 1.0]]).astype(rmsnorm._dtypes.resolve_dtype(dtype))
    w = np.array([1.0, -2.0, 0.5, 3.0]).astype(x.dtype)
    ours = rmsnorm.rms_norm(x, 4, w, eps)
    theirs = _numpy(torch.nn.functional.rms_norm(_tensor(x), [4], _tensor(w), eps))
    # NaN where torch has NaN, inf where it has inf, equal numbers elsewhere
    # (a zero's sign may differ: see docs/accuracy.md)
    assert_forward_close(ours, theirs, what=f"{row} row, eps={eps}")


def test_inputs_near_the_largest_float16_match_torch():
    x = np.array([[65504.0, -65504.0, 60000.0, 1.0]], np.float16)
    ours = rmsnorm.rms_norm(x, 4)
    theirs = torch.nn.functional.rms_norm(torch.from_numpy(x), [4]).numpy()
    assert np.all(np.isfinite(ours))
    assert_forward_close(ours, theirs)


# The 16-bit dtypes, and every weight of another dtype than the input.
MIXED = [(x, weight) for x, weight in DTYPE_PAIR_NAMES if x.endswith("16") or weight != x]


@pytest.mark.parametrize("x_dtype, weight_dtype", MIXED, ids=lambda d: d)
@pytest.mark.parametrize("shape", [(3, 7), (4, 2, 64), (2, 1000)], ids=str)
def test_half_and_mixed_precision_match_torch(x_dtype, weight_dtype, shape, rng):
    resolve = rmsnorm._dtypes.resolve_dtype
    x = rng.standard_normal(shape).astype(resolve(x_dtype))
    w = rng.uniform(0.5, 1.5, shape[-1]).astype(resolve(weight_dtype))
    dy = rng.standard_normal(shape).astype(resolve(x_dtype))
    tx, tw = _tensor(x).requires_grad_(), _tensor(w).requires_grad_()
    ty = torch.nn.functional.rms_norm(tx, [shape[-1]], tw, 1e-5)
    ty.backward(_tensor(dy))

    y = rmsnorm.rms_norm(x, shape[-1], w, 1e-5)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(dy, x, shape[-1], w, 1e-5)
    assert (y.dtype, grad_input.dtype, grad_weight.dtype) == (x.dtype, x.dtype, w.dtype)
    assert_forward_close(y, _numpy(ty), what="output")
    assert_grad_close(grad_input, _numpy(tx.grad), what="grad_input")
    assert_grad_close(grad_weight, _numpy(tw.grad), what="grad_weight")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_subnormal_inputs_are_kept_and_flush_to_zero_stays_off(dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    x = (np.array([[3.0, 4.0]]) * tiny).astype(dtype)
    y = rmsnorm.rms_norm(x, 2, eps=0.0)
    np.testing.assert_allclose(y, np.array([[3.0, 4.0]]) / np.sqrt(12.5), rtol=2e-3)
    # the process still computes subnormals: nothing set flush-to-zero
    half = np.array([tiny], dtype) / np.array([2.0], dtype)
    assert np.array([np.finfo(dtype).smallest_normal], dtype)[0] / 2 > 0
    assert half[0] in (0, tiny)  # rounds to nearest even, not flushed by FTZ bits


def test_missing_ml_dtypes_gives_a_message_that_says_how_to_get_it():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import rmsnorm\n"
        "for attempt in (lambda: rmsnorm.RMSNorm(4, dtype='bfloat16'), lambda: rmsnorm.bfloat16):\n"
        "    try:\n"
        "        attempt()\n"
        "    except ImportError as error:\n"
        "        assert \"pip install 'rmsnorm[bfloat16]'\" in str(error), error\n"
        "    else:\n"
        "        raise SystemExit('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@needs_bfloat16
def test_bfloat16_module_end_to_end():
    layer = rmsnorm.RMSNorm(8, dtype="bfloat16")
    assert layer.weight.dtype == BF16
    x = np.linspace(-2, 2, 16).reshape(2, 8).astype(BF16)
    y = layer(x)
    assert y.dtype == BF16
    grad_input = layer.backward(np.ones_like(x))
    assert grad_input.dtype == BF16 and layer.weight_grad.dtype == BF16
    expected = rmsnorm.reference.rms_norm(x, 8)
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=2 ** -8)
