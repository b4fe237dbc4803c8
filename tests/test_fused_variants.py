"""The fused residual add and the weight offset (issue 14), as a specification.

A pre-norm block computes ``h = x + residual`` and normalises ``h``;
``add_forward``/``add_rms_norm`` do both in one pass and return ``(y, h)``,
and ``add_backward``/``add_rms_norm_backward`` return the gradient that x
and the residual share. A weight offset makes the factor
``weight_offset + weight`` (Gemma's ``1 + weight``), formed exactly.

What is pinned here, section by section:

1. parity with torch, element by element: the pre-norm block, Gemma's
   formula and the two combined, forward and gradients via autograd;
2. the fused gufuncs give the unfused pair's bytes (np.add, then forward),
   for every dtype pair, odd row lengths, strided inputs, every ISA;
3. ``out=(y, residual)`` updates the residual in place, without a temporary;
4. the same bytes for every thread count;
5. every instruction set gives the same bytes (forward) or agrees within an
   ULP of the largest gradient (backward);
6. the offset's semantics: a small weight keeps its bits, grad_weight is
   the stored weight's gradient, offset 0 is the plain path;
7. bad input is refused with errors that name the problem, and no caller
   array is written to except the residual ``out=`` names;
8. dask arrays stay lazy;
9. the module's ``forward(x, residual)`` and ``backward(grad, grad_residual_out)``.
"""

from __future__ import annotations

import contextlib
import mmap
import pickle
import re
import sys
import threading
import tracemalloc

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import rmsnorm
from closeness import assert_forward_close, assert_grad_close, assert_same_bytes
from lazy_sources import lazy
from supported_dtypes import DTYPE_NAMES, LOOP_PAIR_NAMES, NUMPY_DTYPES
from rmsnorm._dtypes import BF16

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # only the parity tests need torch
    torch = F = None
try:
    import dask
    import dask.array as da
except ImportError:  # only the laziness tests need dask
    dask = da = None

needs_torch = pytest.mark.skipif(torch is None, reason="the parity tests compare with torch")
needs_dask = pytest.mark.skipif(da is None,
                                reason="dask[array] is optional (pip install rmsnorm[dask])")
needs_bfloat16 = pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")

# torch warns when input and weight dtypes differ, as the mixed pairs do on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")


# (input dtype, weight dtype) of every loop; the bfloat16 ones skip without ml_dtypes.
PAIRS = [pytest.param(pair, id="-".join(pair), marks=[needs_bfloat16] if "bfloat16" in pair else [])
         for pair in LOOP_PAIR_NAMES]
ROW_LENGTHS = [1, 7, 127, 1000, 4096]
EPS = 1e-5


def _dtype(name):
    return rmsnorm._dtypes.resolve_dtype(name)


def _eps(x_dtype, value=EPS):
    """eps as the gufuncs take it: float64 for float64 input, float32 otherwise."""
    return np.float64(value) if np.dtype(x_dtype) == np.float64 else np.float32(value)


def _random(rng, shape, dtype, low=None, high=None):
    values = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
    return values.astype(_dtype(dtype) if isinstance(dtype, str) else dtype)


def block_arrays(pair, shape, normalized_shape=None, seed=0):
    """Seeded x, residual, weight, grad_output and grad_residual_out for one case."""
    x_dtype, w_dtype = pair
    normalized_shape = shape[-1:] if normalized_shape is None else normalized_shape
    rng = np.random.default_rng([seed, *shape, len(x_dtype), len(w_dtype)])
    return {
        "x": _random(rng, shape, x_dtype),
        "residual": _random(rng, shape, x_dtype),
        "weight": _random(rng, normalized_shape, w_dtype, -1.5, 1.5),
        "grad_output": _random(rng, shape, x_dtype),
        "grad_residual_out": _random(rng, shape, x_dtype),
        "eps": _eps(_dtype(x_dtype)),
    }


@contextlib.contextmanager
def left_unchanged(**arrays):
    """Asserts that the block wrote to none of ``arrays``: each is copied before
    and compared byte for byte after."""
    before = {name: np.array(array, copy=True) for name, array in arrays.items()}
    yield
    for name, array in arrays.items():
        assert_same_bytes(array, before[name],
                          what=f"{name} after the call (it must not be written)")


# ---------------------------------------------------------------------------
# 1. Parity with torch.
# ---------------------------------------------------------------------------

# block: (with a residual, weight_offset)
BLOCKS = {"pre-norm": (True, 0.0), "gemma": (False, 1.0), "gemma-pre-norm": (True, 1.0)}
# (input shape, normalized_shape): odd and long rows, a 3-D batch, and two
# normalised dimensions.
PARITY_CASES = [((5, 1), (1,)), ((4, 7), (7,)), ((2, 3, 127), (127,)), ((3, 1000), (1000,)),
                ((2, 4096), (4096,)), ((2, 3, 4, 5), (4, 5))]


def _case_id(case):
    shape, normalized_shape = case
    return f"x{shape}-ns{normalized_shape}".replace(" ", "")


def _tensor(array):
    """A torch tensor with its own copy of ``array`` (bfloat16 through its bits)."""
    array = np.ascontiguousarray(array).copy()
    if BF16 is not None and array.dtype == BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _numpy(tensor):
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BF16)
    return tensor.numpy()


def torch_block(arrays, normalized_shape, block, *, gradients_in_float32):
    """The block written in torch, and its gradients from autograd.

    pre-norm: ``h = x + residual; y = F.rms_norm(h, ...)``; Gemma:
    ``(h.float() * rsqrt(h.float().pow(2).mean(-1) + eps) * (1 + w.float())).to(h.dtype)``
    (in float64 where the input or the weight is float64). The loss uses
    both outputs: ``grad_output`` reaches y and ``grad_residual_out`` reaches h.

    ``gradients_in_float32``: float16 and bfloat16 tensors become float32
    leaves and h is rounded to the input's dtype (as the fused kernel stores
    it); each gradient is then rounded to 16 bits once, where autograd casts
    it back to the leaf's dtype. Why: torch's own 16-bit autograd rounds the
    gradient of h twice, once leaving the norm's backward and once more when
    it adds grad_residual_out to it, and where the two nearly cancel that is
    several ULPs of the element, far outside assert_close's rtol. rmsnorm
    rounds the sum once, so torch's float32 result rounded once is the
    comparison that can hold element by element.
    """
    with_residual, offset = BLOCKS[block]
    x_dtype = _tensor(arrays["x"][:0]).dtype
    w_dtype = _tensor(arrays["weight"][:0]).dtype
    half = (torch.float16, torch.bfloat16)
    upcast = gradients_in_float32 and x_dtype in half

    def leaf(name):
        tensor = _tensor(arrays[name])
        if upcast and tensor.dtype in half:
            tensor = tensor.float()
        return tensor.requires_grad_()

    x, weight = leaf("x"), leaf("weight")
    h = x
    if with_residual:
        residual = leaf("residual")
        h = x + residual
        if upcast:
            # float32's sum of two 16-bit numbers rounded to 16 bits is the
            # 16-bit sum (24 >= 2 * 11 + 2 bits: the double rounding is harmless).
            h = h.to(x_dtype).float()
    eps = float(arrays["eps"])
    if offset:
        opmath = torch.float64 if torch.float64 in (h.dtype, weight.dtype) else torch.float32
        dims = tuple(range(-len(normalized_shape), 0))
        hf = h.to(opmath)
        y = (hf * torch.rsqrt(hf.pow(2).mean(dims, keepdim=True) + eps)
             * (offset + weight.to(opmath))).to(h.dtype)
    else:
        y = F.rms_norm(h, list(normalized_shape), weight, eps)
    outputs, grads = [y], [_tensor(arrays["grad_output"]).to(y.dtype)]
    if with_residual:
        outputs.append(h)
        grads.append(_tensor(arrays["grad_residual_out"]).to(h.dtype))
    torch.autograd.backward(outputs, grads)
    result = {"output": _numpy(y.to(x_dtype)), "grad_input": _numpy(x.grad.to(x_dtype)),
              "grad_weight": _numpy(weight.grad.to(w_dtype))}
    if with_residual:
        result["residual_out"] = _numpy(h.to(x_dtype))
        result["grad_residual"] = _numpy(residual.grad.to(x_dtype))
    return result


def rmsnorm_block(arrays, normalized_shape, block):
    """The same block through rmsnorm's functional API."""
    with_residual, offset = BLOCKS[block]
    a = arrays
    eps = float(a["eps"])
    if with_residual:
        y, h = rmsnorm.add_rms_norm(a["x"], a["residual"], normalized_shape, a["weight"], eps,
                                    weight_offset=offset)
        grad_input, grad_weight = rmsnorm.add_rms_norm_backward(
            a["grad_output"], a["grad_residual_out"], h, normalized_shape, a["weight"], eps,
            weight_offset=offset)
        # x and the residual reach h through a sum: they share one gradient.
        return {"output": y, "residual_out": h, "grad_input": grad_input,
                "grad_residual": grad_input, "grad_weight": grad_weight}
    y = rmsnorm.rms_norm(a["x"], normalized_shape, a["weight"], eps, weight_offset=offset)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        a["grad_output"], a["x"], normalized_shape, a["weight"], eps, weight_offset=offset)
    return {"output": y, "grad_input": grad_input, "grad_weight": grad_weight}


parametrize_parity = pytest.mark.parametrize(
    "block, pair, case",
    [pytest.param(block, pair.values[0], case, marks=pair.marks,
                  id=f"{block}-{pair.id}-{_case_id(case)}")
     for block in BLOCKS for pair in PAIRS for case in PARITY_CASES])


@needs_torch
@parametrize_parity
def test_forward_matches_torchs_block_element_by_element(block, pair, case):
    # Forward: torch's own result in the input's dtype. Its 16-bit rms_norm
    # and the Gemma formula both compute in float32 and round once; torch
    # rounds 1 + w to float32 first, which assert_close's tolerance absorbs.
    shape, normalized_shape = case
    arrays = block_arrays(pair, shape, normalized_shape)
    expected = torch_block(arrays, normalized_shape, block, gradients_in_float32=False)
    ours = rmsnorm_block(arrays, normalized_shape, block)
    assert np.isfinite(expected["output"].astype(np.float64)).all()
    assert_forward_close(ours["output"], expected["output"], what=f"{block} output")
    if "residual_out" in expected:
        # One correctly rounded sum on both sides: the same bytes.
        assert_same_bytes(ours["residual_out"], expected["residual_out"], what="residual_out")


@needs_torch
@parametrize_parity
def test_gradients_match_torch_autograd_element_by_element(block, pair, case):
    # 16-bit inputs: torch's float32 gradients rounded once (see torch_block
    # for why not torch's 16-bit autograd); float32 and float64: torch's own.
    shape, normalized_shape = case
    arrays = block_arrays(pair, shape, normalized_shape, seed=1)
    expected = torch_block(arrays, normalized_shape, block, gradients_in_float32=True)
    ours = rmsnorm_block(arrays, normalized_shape, block)
    for name in ("grad_input", "grad_residual", "grad_weight"):
        if name in expected:
            assert_grad_close(ours[name], expected[name], what=f"{block} {name}")


# ---------------------------------------------------------------------------
# 2. The fused gufuncs give the unfused pair's bytes.
# ---------------------------------------------------------------------------

def _column_strided(array):
    """Same values, every other column of a wider array."""
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    wide[..., ::2] = array
    return wide[..., ::2]


def _negative_strides(array):
    flipped = np.ascontiguousarray(array[..., ::-1, ::-1] if array.ndim > 1 else array[::-1])
    return flipped[..., ::-1, ::-1] if array.ndim > 1 else flipped[::-1]


def _fortran(array):
    return np.asfortranarray(array)


# layout -> (x, residual, weight, out) from contiguous x, residual, weight
LAYOUTS = {
    "contiguous": lambda x, r, w: (x, r, w, None),
    "column-strided": lambda x, r, w: (_column_strided(x), _column_strided(r),
                                       _column_strided(w[None])[0], None),
    "negative-strides": lambda x, r, w: (_negative_strides(x), _negative_strides(r),
                                         _negative_strides(w), None),
    "fortran": lambda x, r, w: (_fortran(x), _fortran(r), w, None),
    # the gufunc broadcasts a single residual row over the batch, as np.add does
    "broadcast-residual": lambda x, r, w: (x, r[0], w, None),
    "strided-out": lambda x, r, w: (x, r, w, (_column_strided(np.zeros_like(x)),
                                              _column_strided(np.zeros_like(x)))),
}


def _layout_inputs(pair, n, layout, seed=0):
    arrays = block_arrays(pair, (6, n), seed=seed)
    x, r, w, out = LAYOUTS[layout](arrays["x"], arrays["residual"], arrays["weight"])
    if layout not in ("contiguous", "strided-out") and n > 1:
        assert not (x.flags.c_contiguous and np.shape(r) == x.shape and r.flags.c_contiguous
                    and w.flags.c_contiguous), f"{layout} gave contiguous arrays"
    return x, r, w, out, arrays["eps"]


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_add_forward_gives_the_bytes_of_np_add_then_forward(isa, pair, n, layout):
    x, r, w, out, eps = _layout_inputs(pair, n, layout)
    h_expected = np.add(x, r)
    y_expected = rmsnorm.forward(h_expected, w, eps)
    if out is None:
        y, h = rmsnorm.add_forward(x, r, w, eps)
    else:
        y, h = rmsnorm.add_forward(x, r, w, eps, out=out)
        assert y is out[0] and h is out[1]
    assert_same_bytes(h, h_expected, what="residual_out")
    assert_same_bytes(y, y_expected, what="output")


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("n", [4096, 4099], ids=["4096", "4099-unaligned-rows"])
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"threads={t}")
@pytest.mark.parametrize("sums_to", ["new-array", "over-the-residual", "over-x"])
def test_add_forward_past_16_mib_gives_the_bytes_of_small_calls(isa, dtype, n, threads, sums_to,
                                                               restore_num_threads):
    # Past 16 MiB the output is streamed, and the float32 kernels make each
    # row's sums twice, writing them beside y in the write pass; small calls
    # do neither, and the bytes must be theirs. Rows with an infinity, a
    # NaN, sums past the type's range and zeros take the rescaled pass,
    # which reads the sums back.
    rmsnorm.set_num_threads(threads)
    rng = np.random.default_rng(11)
    rows = (16 << 20) // (n * np.dtype(dtype).itemsize) + 3
    x = rng.standard_normal((rows, n)).astype(dtype)
    r = rng.standard_normal((rows, n)).astype(dtype)
    largest = np.finfo(dtype).max
    x[3, 5], x[7, 100], x[17, 9], r[17, 9] = np.inf, np.nan, -np.inf, np.inf
    x[11], r[11] = largest, largest
    x[13], r[13] = 0, 0
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    eps = dtype(1e-6)
    with np.errstate(over="ignore", invalid="ignore"):
        h_expected = np.add(x, r)
    y_expected = np.concatenate([rmsnorm.forward(h_expected[i:i + 64], w, eps)
                                 for i in range(0, rows, 64)])
    if sums_to == "new-array":
        y, h = rmsnorm.add_forward(x, r, w, eps)
    else:
        over = r if sums_to == "over-the-residual" else x
        y, h = rmsnorm.add_forward(x, r, w, eps, out=(np.empty_like(x), over))
        assert h is over
    assert_same_bytes(h, h_expected, what="residual_out")
    assert_same_bytes(y, y_expected, what="output")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("offset", [0.0, 1.0, -0.75], ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("layout", ["contiguous", "column-strided", "broadcast-residual"])
def test_add_forward_offset_gives_the_bytes_of_np_add_then_forward_offset(
        isa, pair, n, offset, layout):
    x, r, w, _, eps = _layout_inputs(pair, n, layout, seed=2)
    h_expected = np.add(x, r)
    y, h = rmsnorm.add_forward_offset(x, r, w, offset, eps)
    assert_same_bytes(h, h_expected, what="residual_out")
    assert_same_bytes(y, rmsnorm.forward_offset(h_expected, w, offset, eps), what="output")
    if offset == 0.0:
        for got, plain in zip((y, h), rmsnorm.add_forward(x, r, w, eps)):
            assert_same_bytes(got, plain, what="add_forward_offset with offset 0 vs add_forward")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("layout", ["contiguous", "column-strided", "negative-strides"])
def test_forward_offset_of_zero_gives_forwards_bytes(isa, pair, n, layout):
    x, _, w, _, eps = _layout_inputs(pair, n, layout, seed=3)
    assert_same_bytes(rmsnorm.forward_offset(x, w, 0.0, eps), rmsnorm.forward(x, w, eps),
                      what="forward_offset(offset=0)")


def _special_rows(dtype):
    """x and residual whose sums hit every special case of the add."""
    finfo = rmsnorm._dtypes.ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)
    big, tiny = float(finfo.max), float(finfo.smallest_subnormal)
    x = [[np.inf, 1, 2, 3], [np.inf, 1, 2, 3], [np.nan, 1, 2, 3], [big, 1, 2, 3],
         [-0.0, -0.0, 0.0, 1.0], [tiny, -tiny, tiny, 0.0], [1, 2, 3, 4]]
    r = [[-np.inf, 1, 2, 3], [1, 1, 2, 3], [1, 1, 2, 3], [big, 1, 2, 3],
         [-0.0, 0.0, -0.0, 1.0], [tiny, tiny, tiny, 0.0], [-1, -2, -3, -4]]
    return np.array(x).astype(dtype), np.array(r).astype(dtype)


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("eps", [0.0, 1e-6], ids=lambda e: f"eps={e}")
def test_add_forward_gives_np_adds_bytes_for_inf_nan_overflow_signed_zero_and_subnormals(pair, eps):
    # inf - inf, nan + 1, max + max (overflow to inf), -0 + -0 (stays -0),
    # subnormal sums, and a row whose sum is all zeros (0/0 with eps=0).
    x, r = _special_rows(_dtype(pair[0]))
    w = np.array([1.0, -2.0, 0.5, 3.0]).astype(_dtype(pair[1]))
    eps = _eps(x.dtype, eps)
    with np.errstate(all="ignore"):
        h_expected = np.add(x, r)
        y_expected = rmsnorm.forward(h_expected, w, eps)
        y, h = rmsnorm.add_forward(x, r, w, eps)
    assert_same_bytes(h, h_expected, what="residual_out")
    assert_same_bytes(y, y_expected, what="output")


def _nans(rng, dtype, count):
    """count NaNs of dtype with random signs and payloads, quiet and signalling."""
    dtype = np.dtype(dtype)
    bits = 8 * dtype.itemsize
    mantissa = np.finfo(dtype).nmant
    exponent = ((1 << (bits - 1 - mantissa)) - 1) << mantissa
    payload = rng.integers(1, 1 << mantissa, size=count, dtype=np.uint64)
    sign = rng.integers(0, 2, size=count, dtype=np.uint64) << np.uint64(bits - 1)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    return (np.uint64(exponent) | payload | sign).astype(unsigned).view(dtype)


def _nan_rows(dtype, n, seed=12):
    """Rows of x and residual: NaNs in x, NaNs in the residual, NaNs in
    both, and inf + -inf."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, n)).astype(dtype)
    r = rng.standard_normal((4, n)).astype(dtype)
    x[0] = _nans(rng, dtype, n)
    r[1] = _nans(rng, dtype, n)
    x[2], r[2] = _nans(rng, dtype, n), _nans(rng, dtype, n)
    x[3, ::2], r[3, ::2] = np.inf, -np.inf
    return x, r


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [7, 1000])
def test_add_forward_keeps_np_adds_nan_bytes_where_one_addend_is_nan(isa, dtype, n):
    # A NaN plus a number is that NaN, quieted, and inf + -inf the
    # hardware's default NaN, on every instruction set: the bytes np.add
    # gives. (Where both addends are NaN, which one survives is the
    # compiler's choice of operand order; see the test below.)
    x, r = _nan_rows(np.dtype(dtype), n)
    with np.errstate(invalid="ignore"):
        h_expected = np.add(x, r)
        _, h = rmsnorm.add_forward(x, r, np.ones(n, x.dtype), _eps(x.dtype))
    for row in (0, 1, 3):
        assert_same_bytes(h[row], h_expected[row], what=f"residual_out row {row}")


@pytest.mark.parametrize("pair", PAIRS)
def test_add_forward_gives_np_adds_values_with_nan_payloads_aside(isa, pair):
    # What the documentation promises for every NaN: a NaN where np.add
    # then forward has one, of whatever sign and payload, and the same bytes
    # elsewhere.
    x, _ = _nan_rows(_dtype(pair[0]), 9)
    r = x[::-1].copy()
    w = np.linspace(-1.5, 1.5, 9).astype(_dtype(pair[1]))
    eps = _eps(x.dtype)
    with np.errstate(invalid="ignore"):
        h_expected = np.add(x, r)
        y_expected = rmsnorm.forward(h_expected, w, eps)
        y, h = rmsnorm.add_forward(x, r, w, eps)
    assert_same_bytes(h, h_expected, what="residual_out", nan_bits=False)
    assert_same_bytes(y, y_expected, what="output", nan_bits=False)


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_add_backward_with_zero_grad_residual_out_gives_backwards_bytes(pair, n):
    a = block_arrays(pair, (6, n), seed=4)
    zeros = np.zeros_like(a["grad_residual_out"])
    fused = rmsnorm.add_backward(a["grad_output"], zeros, a["x"], a["weight"], a["eps"])
    plain = rmsnorm.backward(a["grad_output"], a["x"], a["weight"], a["eps"])
    assert_same_bytes(fused[0], plain[0], what="grad_input")
    assert_same_bytes(fused[1], plain[1], what="grad_weight")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", ROW_LENGTHS)
def test_add_backward_adds_grad_residual_out_to_backwards_grad_input(pair, n):
    # grad_input = backward(...)[0] + grad_residual_out, rounded once: within
    # the gradient tolerance of the float64 reference; grad_weight does not
    # see grad_residual_out at all, so it is backward's, byte for byte.
    a = block_arrays(pair, (6, n), seed=5)
    grad_input, grad_weight = rmsnorm.add_backward(
        a["grad_output"], a["grad_residual_out"], a["x"], a["weight"], a["eps"])
    exact_input, _ = rmsnorm.reference.rms_norm_backward(
        a["grad_output"], a["x"], (n,), a["weight"], float(a["eps"]))
    expected = (exact_input + a["grad_residual_out"].astype(np.float64)).astype(grad_input.dtype)
    assert_grad_close(grad_input, expected, what="grad_input")
    assert_same_bytes(grad_weight, rmsnorm.backward(a["grad_output"], a["x"], a["weight"],
                                                    a["eps"])[1], what="grad_weight")


# ---------------------------------------------------------------------------
# 3. out=(y, residual): the residual is updated in place, without a temporary.
# ---------------------------------------------------------------------------

# (input shape, normalized_shape, layout of the out arrays)
OUT_CASES = {
    "rows": ((6, 127), (127,), "C"),
    "3-d batch": ((2, 3, 64), (64,), "C"),
    "two normalised dims": ((3, 4, 5), (4, 5), "C"),
    "two normalised dims, fortran out": ((3, 4, 5), (4, 5), "F"),
}


def _out_case(pair, case, seed=6):
    shape, normalized_shape, order = OUT_CASES[case]
    a = block_arrays(pair, shape, normalized_shape, seed=seed)
    return a, normalized_shape, order


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("case", OUT_CASES)
def test_out_y_and_residual_updates_the_residual_in_place_with_the_out_of_place_values(
        pair, offset, case):
    a, ns, order = _out_case(pair, case)
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], ns, a["weight"], EPS,
                                                  weight_offset=offset)
    residual = np.array(a["residual"], order=order)
    y = np.zeros_like(a["x"], order=order)
    with left_unchanged(x=a["x"], weight=a["weight"]):
        result = rmsnorm.add_rms_norm(a["x"], residual, ns, a["weight"], EPS,
                                      weight_offset=offset, out=(y, residual))
    assert_same_bytes(residual, h_expected, what="the residual, updated to x + residual")
    assert_same_bytes(y, y_expected, what="out's output")
    # out='s own objects, as NumPy's ufuncs return them, whatever normalized_shape
    assert result[0] is y and result[1] is residual
    assert_same_bytes(result[0], y_expected, what="returned output")
    assert_same_bytes(result[1], h_expected, what="returned residual_out")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("case", OUT_CASES)
def test_out_none_and_x_writes_the_sum_over_x_with_the_out_of_place_values(pair, case):
    a, ns, order = _out_case(pair, case, seed=7)
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], ns, a["weight"], EPS)
    x = np.array(a["x"], order=order)
    with left_unchanged(residual=a["residual"], weight=a["weight"]):
        y, h = rmsnorm.add_rms_norm(x, a["residual"], ns, a["weight"], EPS, out=(None, x))
    assert_same_bytes(x, h_expected, what="x, overwritten with x + residual")
    assert h is x and not np.shares_memory(y, x)
    assert_same_bytes(y, y_expected, what="output")


@pytest.mark.parametrize("pair", PAIRS)
def test_out_y_and_none_writes_only_the_output(pair):
    a, ns, _ = _out_case(pair, "rows", seed=8)
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], ns, a["weight"], EPS)
    y = np.empty_like(a["x"])
    with left_unchanged(x=a["x"], residual=a["residual"], weight=a["weight"]):
        y_got, h = rmsnorm.add_rms_norm(a["x"], a["residual"], ns, a["weight"], EPS, out=(y, None))
    assert y_got is y
    assert_same_bytes(y, y_expected, what="output")
    assert_same_bytes(h, h_expected, what="residual_out")


@pytest.mark.parametrize("out", ["x-and-residual", "residual-and-x"])
def test_out_may_alias_both_inputs(out):
    # y over x and h over the residual (or the other way round): each row is
    # read before it is written, so the values are the out-of-place ones.
    a = block_arrays(("float32", "float32"), (300, 4096), seed=9)
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], 4096, a["weight"], EPS)
    x, residual = a["x"].copy(), a["residual"].copy()
    targets = (x, residual) if out == "x-and-residual" else (residual, x)
    rmsnorm.add_rms_norm(x, residual, 4096, a["weight"], EPS, out=targets)
    assert_same_bytes(targets[0], y_expected, what="output")
    assert_same_bytes(targets[1], h_expected, what="residual_out")


def test_out_arrays_interleaved_in_one_buffer_do_not_overlap_and_are_accepted():
    a = block_arrays(("float32", "float32"), (4, 8), seed=10)
    buffer = np.zeros((8, 8), np.float32)
    out = (buffer[0::2], buffer[1::2])
    y, h = rmsnorm.add_rms_norm(a["x"], a["residual"], 8, a["weight"], EPS, out=out)
    assert y is out[0] and h is out[1]
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], 8, a["weight"], EPS)
    assert np.shares_memory(y, buffer) and np.shares_memory(h, buffer)
    assert_same_bytes(buffer[0::2], y_expected, what="output rows")
    assert_same_bytes(buffer[1::2], h_expected, what="residual_out rows")


def _peak_bytes(call) -> int:
    """Peak traced memory during ``call`` (NumPy reports its arrays to tracemalloc)."""
    call()  # warm caches (loop resolution, the unit weight) outside the measurement
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_tracemalloc_sees_an_input_sized_temporary():
    # The premise of the next test: without it its bound holds trivially.
    x = np.ones((512, 4096), np.float32)
    assert _peak_bytes(lambda: np.add(x, x)) >= x.nbytes


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("normalized_shape", [4096, (64, 64)], ids=["4096", "(64,64)"])
def test_in_place_residual_update_makes_no_input_sized_temporary(offset, normalized_shape):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((512, 4096)).astype(np.float32)
    residual = rng.standard_normal((512, 4096)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, 4096).astype(np.float32)
    y = np.empty_like(x)
    if normalized_shape != 4096:
        x, residual, y = (a.reshape(512, 64, 64) for a in (x, residual, y))
        weight = weight.reshape(64, 64)
    peak = _peak_bytes(lambda: rmsnorm.add_rms_norm(
        x, residual, normalized_shape, weight, EPS, weight_offset=offset, out=(y, residual)))
    assert peak < x.nbytes / 4, (
        f"peak {peak / 2**20:.2f} MiB updating an {x.nbytes / 2**20:.0f} MiB residual in place")


# ---------------------------------------------------------------------------
# 4. The same bytes for every thread count.
# ---------------------------------------------------------------------------

# name -> call on the arrays of block_arrays
VARIANTS = {
    "add_forward": lambda a: rmsnorm.add_forward(a["x"], a["residual"], a["weight"], a["eps"]),
    "forward_offset": lambda a: rmsnorm.forward_offset(a["x"], a["weight"], 1.0, a["eps"]),
    "add_forward_offset": lambda a: rmsnorm.add_forward_offset(
        a["x"], a["residual"], a["weight"], 1.0, a["eps"]),
    "add_backward": lambda a: rmsnorm.add_backward(
        a["grad_output"], a["grad_residual_out"], a["x"], a["weight"], a["eps"]),
    "backward_offset": lambda a: rmsnorm.backward_offset(
        a["grad_output"], a["x"], a["weight"], 1.0, a["eps"]),
    "add_backward_offset": lambda a: rmsnorm.add_backward_offset(
        a["grad_output"], a["grad_residual_out"], a["x"], a["weight"], 1.0, a["eps"]),
}
FORWARD_VARIANTS = [name for name in VARIANTS if "forward" in name]
BACKWARD_VARIANTS = [name for name in VARIANTS if "backward" in name]


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pair", [PAIRS[2], PAIRS[1]])  # float32, float16 with a float32 weight
def test_every_thread_count_gives_the_same_bytes(variant, pair, restore_num_threads):
    # 256 x 4096 = 2**20 elements: four times the size below which the kernels
    # stay on the calling thread, cut into 16 chunks that the threads share;
    # grad_weight's partial sums must be added in the same order whoever made them.
    a = block_arrays(pair, (256, 4096), seed=12)
    rmsnorm.set_num_threads(1)
    expected = _outputs(VARIANTS[variant](a))
    for threads in (2, 3, 4):
        rmsnorm.set_num_threads(threads)
        for i, (got, want) in enumerate(zip(_outputs(VARIANTS[variant](a)), expected)):
            assert_same_bytes(got, want, what=f"{variant} output {i} with {threads} threads")


# ---------------------------------------------------------------------------
# 5. Every instruction set agrees.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", [7, 1000, 4099])
@pytest.mark.parametrize("variant", FORWARD_VARIANTS)
def test_forward_variants_give_the_same_bytes_on_every_instruction_set(
        isa, pair, n, variant):
    # Correctly rounded results leave no room for the instruction set to show.
    a = block_arrays(pair, (5, n), seed=13)
    rmsnorm._core._set_isa("baseline")
    expected = _outputs(VARIANTS[variant](a))
    rmsnorm._core._set_isa(isa)
    assert rmsnorm._core._isa()[0] == isa
    for i, (got, want) in enumerate(zip(_outputs(VARIANTS[variant](a)), expected)):
        assert_same_bytes(got, want, what=f"{variant} output {i} on {isa}")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("n", [7, 1000, 4099])
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
def test_backward_variants_agree_within_an_ulp_of_the_largest_gradient_on_every_instruction_set(
        isa, pair, n, variant):
    # As for backward in test_kernel_paths: gradients cancel, so the bound is
    # one ULP of the tensor's largest element. One exception: a float64
    # grad_weight (the float32-float64 pair) is a sum over the rows kept in
    # float64 itself, with no wider format to absorb the order in which an
    # instruction set adds and fuses: one float64 ULP per row summed. (plain
    # backward shows the same, up to 2 ULP here on avx512.)
    rows = 5
    a = block_arrays(pair, (rows, n), seed=14)
    rmsnorm._core._set_isa("baseline")
    expected = VARIANTS[variant](a)
    rmsnorm._core._set_isa(isa)
    assert rmsnorm._core._isa()[0] == isa
    for name, got, want in zip(("grad_input", "grad_weight"), VARIANTS[variant](a), expected):
        assert got.dtype == want.dtype
        ulps = rows if name == "grad_weight" and want.dtype == np.float64 else 1
        scale = ulps * float(np.spacing(np.max(np.abs(want))))
        difference = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
        assert difference <= scale, f"{variant} {name} on {isa}: {difference} > {scale}"


# ---------------------------------------------------------------------------
# 6. What the weight offset means.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("w_dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_offset_keeps_the_bits_of_a_weight_too_small_for_one_plus_weight_in_float32(
        w_dtype, with_residual):
    # weight ~ 2**-30: 1 + weight rounds to 1 in float32, but its bits move
    # the exact result across a float32 rounding boundary here and there.
    # The factor is formed exactly, so every element is the float64 formula
    # rounded once.
    rng = np.random.default_rng(15)
    n = 4096
    x = rng.standard_normal((8, n)).astype(np.float32)
    residual = rng.standard_normal((8, n)).astype(np.float32)
    weight = (2.0**-30 * rng.uniform(0.5, 1.0, n)).astype(w_dtype)
    if with_residual:
        y, h = rmsnorm.add_rms_norm(x, residual, n, weight, EPS, weight_offset=1.0)
        assert_same_bytes(h, np.add(x, residual), what="residual_out")
    else:
        y, h = rmsnorm.rms_norm(x, n, weight, EPS, weight_offset=1.0), x
    h64 = h.astype(np.float64)
    normalised = h64 / np.sqrt(np.mean(h64 * h64, axis=1, keepdims=True) + float(np.float32(EPS)))
    expected = (normalised * (1.0 + weight.astype(np.float64))).astype(np.float32)
    without_weight = normalised.astype(np.float32)
    assert (expected != without_weight).any(), (
        "the weight's bits must matter, or this proves nothing")
    assert_same_bytes(y, expected, what="output with weight_offset=1.0 and a tiny weight")
    if torch is not None:
        # torch's Gemma formula rounds 1 + w to float32 and loses those bits.
        ht = torch.from_numpy(h)
        theirs = (ht.float() * torch.rsqrt(ht.float().pow(2).mean(-1, keepdim=True) + EPS)
                  * (1.0 + torch.from_numpy(weight).float())).to(ht.dtype).numpy()
        assert (theirs != expected).any()


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("offset", [1.0, -0.5, 3.0], ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("with_residual", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_offset_plus_an_exactly_representable_sum_is_the_plain_norm_with_that_weight(
        pair, offset, with_residual):
    # weight is a multiple of 2**-6 with |weight| <= 1/2, so offset + weight
    # is exact in every dtype: the plain norm with that weight must give the
    # same (correctly rounded) bytes, and gradients within tolerance.
    a = block_arrays(pair, (6, 300), seed=16)
    rng = np.random.default_rng(17)
    weight = (rng.integers(-32, 33, 300) / 64).astype(a["weight"].dtype)
    summed = (offset + weight.astype(np.float64)).astype(weight.dtype)
    assert np.array_equal(summed.astype(np.float64) - offset, weight.astype(np.float64))
    if with_residual:
        args = (a["x"], a["residual"], 300)
        offset_result = rmsnorm.add_rms_norm(*args, weight, EPS, weight_offset=offset)
        plain_result = rmsnorm.add_rms_norm(*args, summed, EPS)
        h = plain_result[1]
        grads = rmsnorm.add_rms_norm_backward(a["grad_output"], a["grad_residual_out"], h, 300,
                                              weight, EPS, weight_offset=offset)
        plain_grads = rmsnorm.add_rms_norm_backward(a["grad_output"], a["grad_residual_out"], h,
                                                    300, summed, EPS)
    else:
        offset_result = (rmsnorm.rms_norm(a["x"], 300, weight, EPS, weight_offset=offset),)
        plain_result = (rmsnorm.rms_norm(a["x"], 300, summed, EPS),)
        grads = rmsnorm.rms_norm_backward(a["grad_output"], a["x"], 300, weight, EPS,
                                          weight_offset=offset)
        plain_grads = rmsnorm.rms_norm_backward(a["grad_output"], a["x"], 300, summed, EPS)
    for got, want in zip(offset_result, plain_result):
        assert_same_bytes(got, want, what=f"weight_offset={offset} vs weight {offset} + w")
    assert_grad_close(grads[0], plain_grads[0], what="grad_input")
    assert_grad_close(grads[1], plain_grads[1], what="grad_weight")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("offset", [1.0, -0.5], ids=lambda o: f"offset={o}")
@pytest.mark.parametrize("variant", ["backward_offset", "add_backward_offset"])
def test_offset_gradients_are_the_float64_gradients_of_weight_plus_offset(pair, offset, variant):
    # grad_weight is the stored weight's gradient, which equals the factor's
    # (d(offset + w)/dw = 1); grad_input is the plain one with factor offset + w.
    a = block_arrays(pair, (7, 257), seed=18)
    gy, x, w, eps = a["grad_output"], a["x"], a["weight"], a["eps"]
    if variant == "backward_offset":
        grad_input, grad_weight = rmsnorm.backward_offset(gy, x, w, offset, eps)
        extra = 0.0
    else:
        grad_input, grad_weight = rmsnorm.add_backward_offset(
            gy, a["grad_residual_out"], x, w, offset, eps)
        extra = a["grad_residual_out"].astype(np.float64)
    exact_input, exact_weight = rmsnorm.reference.rms_norm_backward(
        gy, x, (257,), w.astype(np.float64) + offset, float(eps))
    assert (grad_input.dtype, grad_weight.dtype) == (x.dtype, w.dtype)
    assert_grad_close(grad_input, (exact_input + extra).astype(x.dtype), what="grad_input")
    assert_grad_close(grad_weight, exact_weight.astype(w.dtype), what="grad_weight")


@pytest.mark.parametrize("pair", PAIRS)
def test_grad_weight_is_the_same_bytes_for_every_offset(pair):
    # sum over rows of grad_output * x_hat: no weight, so no offset, in it.
    a = block_arrays(pair, (7, 257), seed=19)
    gy, x, w, eps = a["grad_output"], a["x"], a["weight"], a["eps"]
    plain = rmsnorm.backward(gy, x, w, eps)[1]
    for offset in (0.0, 1.0, -2.5):
        assert_same_bytes(rmsnorm.backward_offset(gy, x, w, offset, eps)[1], plain,
                          what=f"grad_weight with offset {offset}")
        assert_same_bytes(
            rmsnorm.add_backward_offset(gy, a["grad_residual_out"], x, w, offset, eps)[1], plain,
            what=f"add_backward_offset grad_weight with offset {offset}")


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("offset", [0, 0.0, -0.0, np.float32(0)], ids=repr)
def test_offset_zero_is_the_plain_path(pair, offset):
    a = block_arrays(pair, (5, 129), seed=20)
    x, r, w, gy, gh = (a[k] for k in ("x", "residual", "weight", "grad_output",
                                      "grad_residual_out"))
    assert_same_bytes(rmsnorm.rms_norm(x, 129, w, EPS, weight_offset=offset),
                      rmsnorm.rms_norm(x, 129, w, EPS), what="rms_norm")
    for got, want in zip(rmsnorm.add_rms_norm(x, r, 129, w, EPS, weight_offset=offset),
                         rmsnorm.add_rms_norm(x, r, 129, w, EPS)):
        assert_same_bytes(got, want, what="add_rms_norm")
    for got, want in zip(rmsnorm.rms_norm_backward(gy, x, 129, w, EPS, weight_offset=offset),
                         rmsnorm.rms_norm_backward(gy, x, 129, w, EPS)):
        assert_same_bytes(got, want, what="rms_norm_backward")
    for got, want in zip(rmsnorm.add_rms_norm_backward(gy, gh, x, 129, w, EPS,
                                                       weight_offset=offset),
                         rmsnorm.add_rms_norm_backward(gy, gh, x, 129, w, EPS)):
        assert_same_bytes(got, want, what="add_rms_norm_backward")
    # and the gufuncs, whose offset is an operand
    for got, want in zip(rmsnorm.backward_offset(gy, x, w, float(offset), a["eps"]),
                         rmsnorm.backward(gy, x, w, a["eps"])):
        assert_same_bytes(got, want, what="backward_offset(offset=0)")


@pytest.mark.parametrize("offset", [1, np.float32(1.0), np.int64(1), np.float64(1.0)],
                         ids=lambda o: type(o).__name__)
def test_offset_takes_any_real_number(offset):
    a = block_arrays(("float32", "float32"), (3, 16), seed=21)
    assert_same_bytes(rmsnorm.rms_norm(a["x"], 16, a["weight"], EPS, weight_offset=offset),
                      rmsnorm.rms_norm(a["x"], 16, a["weight"], EPS, weight_offset=1.0),
                      what=f"weight_offset={offset!r}")


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_module_with_offset_one_starts_as_plain_normalisation(dtype):
    layer = rmsnorm.RMSNorm(33, eps=EPS, weight_offset=1.0, dtype=dtype)
    assert layer.weight.dtype == _dtype(dtype)
    assert not layer.weight.any() and not np.signbit(layer.weight.astype(np.float64)).any()
    a = block_arrays((dtype, dtype), (4, 33), seed=22)
    assert_same_bytes(layer(a["x"]), rmsnorm.rms_norm(a["x"], 33, eps=EPS), what="output")
    y, h = layer(a["x"], a["residual"])
    assert_same_bytes(h, np.add(a["x"], a["residual"]), what="residual_out")
    assert_same_bytes(y, rmsnorm.rms_norm(h, 33, eps=EPS), what="output")
    layer.weight[...] = 3
    layer.reset_parameters()
    assert not layer.weight.any(), "reset_parameters must put the weight back to zeros"


# ---------------------------------------------------------------------------
# 7. Bad input, and no caller array written to.
# ---------------------------------------------------------------------------

N = 8


@pytest.fixture
def arrays():
    rng = np.random.default_rng(23)
    return {name: rng.standard_normal((4, N)).astype(np.float32)
            for name in ("x", "residual", "grad_output", "grad_residual_out")} | {
        "weight": rng.uniform(0.5, 1.5, N).astype(np.float32)}


def _functional(name, a, weight="given", **kwargs):
    """Calls one functional entry point on ``a``, with ``weight`` None when asked."""
    w = a["weight"] if weight == "given" else weight
    if name == "rms_norm":
        return rmsnorm.rms_norm(a["x"], N, w, EPS, **kwargs)
    if name == "rms_norm_backward":
        return rmsnorm.rms_norm_backward(a["grad_output"], a["x"], N, w, EPS, **kwargs)
    if name == "add_rms_norm":
        return rmsnorm.add_rms_norm(a["x"], a["residual"], N, w, EPS, **kwargs)
    if name == "add_rms_norm_backward":
        return rmsnorm.add_rms_norm_backward(a["grad_output"], a["grad_residual_out"], a["x"], N,
                                             w, EPS, **kwargs)
    raise AssertionError(name)


FUNCTIONS = ["rms_norm", "rms_norm_backward", "add_rms_norm", "add_rms_norm_backward"]


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=lambda o: f"offset={o}")
def test_no_argument_is_written_to(function, offset, arrays):
    with left_unchanged(**arrays):
        _functional(function, arrays, weight_offset=offset)


@pytest.mark.parametrize("residual_shape", [(2, N), (N,), (4, 1, N), (4, N + 1)], ids=str)
@pytest.mark.parametrize("caller", ["add_rms_norm", "RMSNorm"])
def test_residual_of_another_shape_is_a_value_error_naming_both_shapes(
        residual_shape, caller, arrays):
    residual = np.zeros(residual_shape, np.float32)
    shown = re.escape(str(residual_shape))
    message = rf"residual.*shape.*\(4, {N}\).*{shown}"
    with left_unchanged(**arrays), pytest.raises(ValueError, match=message):
        if caller == "RMSNorm":
            rmsnorm.RMSNorm(N)(arrays["x"], residual)
        else:
            rmsnorm.add_rms_norm(arrays["x"], residual, N, arrays["weight"], EPS)


@pytest.mark.parametrize("residual_dtype", ["float64", "float16", "int32"])
@pytest.mark.parametrize("caller", ["add_rms_norm", "RMSNorm"])
def test_residual_of_another_dtype_is_a_type_error_naming_both_dtypes(
        residual_dtype, caller, arrays):
    residual = arrays["residual"].astype(residual_dtype)
    with left_unchanged(**arrays), pytest.raises(TypeError,
                                                 match=f"residual.*float32.*{residual_dtype}"):
        if caller == "RMSNorm":
            rmsnorm.RMSNorm(N)(arrays["x"], residual)
        else:
            rmsnorm.add_rms_norm(arrays["x"], residual, N, arrays["weight"], EPS)


def test_grad_residual_out_of_another_shape_is_a_value_error(arrays):
    with left_unchanged(**arrays), pytest.raises(ValueError, match=r"grad_residual_out.*\(2, 8\)"):
        rmsnorm.add_rms_norm_backward(arrays["grad_output"], np.zeros((2, N), np.float32),
                                      arrays["x"], N, arrays["weight"], EPS)


@pytest.mark.parametrize("offset", ["1", None, [1.0], True, 1j], ids=repr)
@pytest.mark.parametrize("caller", FUNCTIONS + ["RMSNorm"])
def test_weight_offset_that_is_not_a_real_number_is_a_type_error(offset, caller, arrays):
    with left_unchanged(**arrays), pytest.raises(TypeError, match="weight_offset"):
        if caller == "RMSNorm":
            rmsnorm.RMSNorm(N, weight_offset=offset)
        else:
            _functional(caller, arrays, weight_offset=offset)


@pytest.mark.parametrize("caller", FUNCTIONS)
def test_weight_offset_without_a_weight_is_a_value_error(caller, arrays):
    with left_unchanged(**arrays), pytest.raises(ValueError, match="weight_offset.*needs a weight"):
        _functional(caller, arrays, weight=None, weight_offset=1.0)
    _functional(caller, arrays, weight=None, weight_offset=0.0)  # no offset, no weight: fine


def test_module_with_weight_offset_and_no_affine_weight_is_a_value_error():
    with pytest.raises(ValueError, match="weight_offset.*needs a weight"):
        rmsnorm.RMSNorm(N, elementwise_affine=False, weight_offset=1.0)
    assert rmsnorm.RMSNorm(N, elementwise_affine=False, weight_offset=0.0).weight is None


def _out_cases(a):
    y, r = np.empty_like(a["x"]), a["residual"]
    read_only = np.empty_like(a["x"])
    read_only.flags.writeable = False
    buffer = np.empty((4, N + 1), np.float32)
    return {
        # not a 2-tuple: TypeError
        "list": (TypeError, "out must be a tuple", [y, r]),
        "1-tuple": (TypeError, "out must be a tuple", (y,)),
        "3-tuple": (TypeError, "out must be a tuple", (y, r, None)),
        "an array": (TypeError, "out must be a tuple", y),
        "a nested list": (TypeError, "output must be an ndarray", (y.tolist(), None)),
        # arrays that do not fit: ValueError
        "wrong shape": (ValueError, r"output must have the input's shape \(4, 8\)",
                        (np.empty((4, N - 1), np.float32), None)),
        "wrong dtype": (ValueError, "residual_out must have .*dtype float32.*float64",
                        (None, np.empty((4, N), np.float64))),
        "read-only": (ValueError, "read-only", (read_only, None)),
        "the same array twice": (ValueError, "overlap", (y, y)),
        "the residual twice": (ValueError, "overlap", (r, r)),
        "overlapping views": (ValueError, "overlap", (buffer[:, :N], buffer[:, 1:])),
    }


@pytest.mark.parametrize("case", list(_out_cases(
    {"x": np.zeros((4, N), np.float32), "residual": np.zeros((4, N), np.float32)})))
def test_bad_out_is_refused_before_anything_is_written(case, arrays):
    error, message, out = _out_cases(arrays)[case]
    targets = [a for a in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(a, np.ndarray)]
    outs = {f"out[{i}]": a for i, a in enumerate(targets)}
    with left_unchanged(**arrays, **outs), pytest.raises(error, match=message):
        rmsnorm.add_rms_norm(arrays["x"], arrays["residual"], N, arrays["weight"], EPS, out=out)


# Linux's MAP_NORESERVE (Python's mmap has no name for it): address space
# that takes no memory until it is written.
_MAP_NORESERVE = 0x4000


def _subset_sum_out(dims: int):
    """out=(y, h) for an input of shape (2,) * dims + (1,), in one reserved
    span: y's strides are random, 2**30 to 2**31 elements each, and h is one
    element midway along y's span, under every index. Whether they overlap
    is whether some of y's strides sum to h's offset, a subset sum: NumPy's
    exact answer takes hours at 40 dimensions."""
    steps = [int(s) for s in np.random.default_rng(1).integers(2**30, 2**31, dims)]
    size = (sum(steps) + 16) * 8
    try:
        span = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except OSError as error:  # vm.overcommit_memory=2 reserves nothing unbacked
        pytest.skip(f"cannot reserve {size} bytes of address space: {error}")
    memory = np.frombuffer(span, np.float64)
    shape = (2,) * dims + (1,)
    y = as_strided(memory, shape, tuple(8 * s for s in steps) + (8,))
    h = as_strided(memory[sum(steps) // 2 :], shape, (0,) * dims + (8,))
    return y, h


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reserves with MAP_NORESERVE")
@pytest.mark.parametrize("order", ["y-then-h", "h-then-y"])
def test_out_too_intricate_to_rule_out_overlap_is_refused_at_once(order):
    y, h = _subset_sum_out(40)
    out = (y, h) if order == "y-then-h" else (h, y)
    x = np.broadcast_to(np.ones(1), y.shape)
    outcome = []

    def call():
        try:
            outcome.append(rmsnorm.add_rms_norm(x, x, 1, out=out))
        except Exception as error:  # noqa: BLE001 -- reported by the assertions below
            outcome.append(error)

    # In a thread, so that an unbounded search fails the test rather than
    # hanging it: NumPy's search releases the GIL.
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "add_rms_norm was still checking out= for overlap after 10 s"
    assert isinstance(outcome[0], ValueError), outcome[0]
    assert re.search("output and residual_out may overlap", str(outcome[0])), outcome[0]


@pytest.mark.parametrize("normalized_shape", [(N,), (2, N // 2)], ids=str)
@pytest.mark.parametrize("out", ["y-and-h", "y-and-none", "none-and-h", "strided-y-and-h"])
def test_every_overlap_check_of_out_bounds_its_work(out, normalized_shape, arrays, monkeypatch):
    # max_work -1 (np.shares_memory's default) asks for the exact answer,
    # whose cost is exponential in the dimensions; None in
    # np.may_share_memory compares bounds alone.
    asked = []

    def recording(check, default):
        def check_recording(a, b, max_work=None):
            asked.append((check.__name__, default if max_work is None else max_work))
            return check(a, b, max_work=max_work)
        return check_recording

    monkeypatch.setattr(np, "shares_memory", recording(np.shares_memory, -1))
    monkeypatch.setattr(np, "may_share_memory", recording(np.may_share_memory, 0))
    shape = arrays["x"].shape[:-1] + normalized_shape
    x, residual = arrays["x"].reshape(shape), arrays["residual"].reshape(shape)
    y, h = np.empty_like(x), np.empty_like(x)
    if out == "strided-y-and-h":  # rows that fold into copies, not views
        y = np.empty(shape[:-1] + (2 * shape[-1],), np.float32)[..., ::2]
    outs = {"y-and-none": (y, None), "none-and-h": (None, h)}.get(out, (y, h))
    rmsnorm.add_rms_norm(x, residual, normalized_shape, eps=EPS, out=outs)
    assert asked, "add_rms_norm checked nothing for overlap"
    unbounded = [name for name, max_work in asked if max_work < 0]
    assert not unbounded, f"unbounded overlap checks: {unbounded}"


def test_module_backward_with_grad_residual_after_a_plain_forward_is_a_value_error(arrays):
    layer = rmsnorm.RMSNorm(N)
    layer(arrays["x"])
    with left_unchanged(**arrays), pytest.raises(ValueError, match="grad_residual.*no residual"):
        layer.backward(arrays["grad_output"], arrays["grad_residual_out"])
    # the failed call kept what forward saved: a correct backward still works
    expected, _ = rmsnorm.rms_norm_backward(arrays["grad_output"], arrays["x"], N, layer.weight)
    assert_same_bytes(layer.backward(arrays["grad_output"]), expected, what="grad_input")


def test_module_forward_and_backward_with_residual_write_to_no_argument(arrays):
    layer = rmsnorm.RMSNorm(N, weight_offset=1.0)
    with left_unchanged(**arrays):
        layer(arrays["x"], arrays["residual"])
        layer.backward(arrays["grad_output"], arrays["grad_residual_out"])


# ---------------------------------------------------------------------------
# 8. dask arrays stay lazy.
# ---------------------------------------------------------------------------

@needs_dask
@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[2], PAIRS[4]])
@pytest.mark.parametrize("call", ["add_forward", "add_forward_offset", "add_rms_norm",
                                  "add_rms_norm-offset"])
def test_fused_forward_on_dask_arrays_is_lazy_and_computes_to_the_numpy_bytes(pair, call):
    a = block_arrays(pair, (20, 3, 48), seed=24)
    calls = {
        "add_forward": lambda x, r: rmsnorm.add_forward(x, r, a["weight"], a["eps"]),
        "add_forward_offset": lambda x, r: rmsnorm.add_forward_offset(
            x, r, a["weight"], 1.0, a["eps"]),
        "add_rms_norm": lambda x, r: rmsnorm.add_rms_norm(x, r, 48, a["weight"], EPS),
        "add_rms_norm-offset": lambda x, r: rmsnorm.add_rms_norm(
            x, r, 48, a["weight"], EPS, weight_offset=1.0),
    }
    dx, x_source = lazy(a["x"], (7, 3, 48))
    dr, r_source = lazy(a["residual"], (7, 3, 48))
    with dask.config.set(scheduler="threads", num_workers=4):
        y, h = calls[call](dx, dr)
        assert isinstance(y, da.Array) and isinstance(h, da.Array), (type(y), type(h))
        assert x_source.reads == r_source.reads == 0, "the inputs were read before compute()"
        assert y.dtype == h.dtype == a["x"].dtype
        computed = dask.compute(y, h)
    eager = calls[call](a["x"], a["residual"])
    for name, got, want in zip(("output", "residual_out"), computed, eager):
        assert isinstance(got, np.ndarray)
        assert_same_bytes(got, want, what=f"{call} {name} on dask")


# ---------------------------------------------------------------------------
# 9. The module.
# ---------------------------------------------------------------------------

def _layer(pair, n, offset, seed):
    w_dtype = pair[1]
    layer = rmsnorm.RMSNorm(n, eps=EPS, weight_offset=offset, dtype=w_dtype)
    layer.weight[...] = _random(np.random.default_rng(seed), n, w_dtype, -1.0, 1.0)
    return layer


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=lambda o: f"offset={o}")
def test_module_residual_step_is_add_rms_norm_and_its_backward(pair, offset):
    a = block_arrays(pair, (3, 5, 64), seed=25)
    layer = _layer(pair, 64, offset, seed=26)
    y, h = layer.forward(a["x"], a["residual"])
    y_expected, h_expected = rmsnorm.add_rms_norm(a["x"], a["residual"], 64, layer.weight, EPS,
                                                  weight_offset=offset)
    assert_same_bytes(y, y_expected, what="output")
    assert_same_bytes(h, h_expected, what="residual_out")
    grad_input = layer.backward(a["grad_output"], a["grad_residual_out"])
    expected_input, expected_weight = rmsnorm.add_rms_norm_backward(
        a["grad_output"], a["grad_residual_out"], h_expected, 64, layer.weight, EPS,
        weight_offset=offset)
    assert_same_bytes(grad_input, expected_input, what="grad_input")
    assert_same_bytes(layer.weight_grad, expected_weight, what="weight_grad")


def test_module_backward_without_grad_residual_takes_it_as_zeros():
    a = block_arrays(("float32", "float32"), (4, 64), seed=27)
    layer = _layer(("float32", "float32"), 64, 1.0, seed=28)
    _, h = layer(a["x"], a["residual"])
    grad_input = layer.backward(a["grad_output"])
    expected = rmsnorm.add_rms_norm_backward(a["grad_output"], np.zeros_like(h), h, 64,
                                             layer.weight, EPS, weight_offset=1.0)
    assert_same_bytes(grad_input, expected[0], what="grad_input")
    assert_same_bytes(layer.weight_grad, expected[1], what="weight_grad")


@pytest.mark.parametrize("pair", [PAIRS[2], PAIRS[1]])
def test_module_weight_grad_accumulates_over_residual_steps(pair):
    layer = _layer(pair, 64, 1.0, seed=29)
    total = None
    for seed in (30, 31, 32):
        a = block_arrays(pair, (4, 64), seed=seed)
        _, h = layer(a["x"], a["residual"])
        layer.backward(a["grad_output"], a["grad_residual_out"])
        _, step = rmsnorm.add_rms_norm_backward(a["grad_output"], a["grad_residual_out"], h, 64,
                                                layer.weight, EPS, weight_offset=1.0)
        total = step.copy() if total is None else total + step
        assert_same_bytes(layer.weight_grad, total,
                          what=f"weight_grad after the step with seed {seed}")


def test_module_pickled_after_a_residual_forward_drops_the_saved_sum_and_keeps_the_rest():
    layer = _layer(("float32", "float32"), 64, 1.0, seed=33)
    a = block_arrays(("float32", "float32"), (4, 64), seed=34)
    y, h = layer(a["x"], a["residual"])
    copied = pickle.loads(pickle.dumps(layer))
    assert len(pickle.dumps(layer)) < layer.weight.nbytes + 2048, "the saved sum was pickled"
    assert copied.weight_offset == 1.0 and copied.weight_grad is None
    assert_same_bytes(copied.weight, layer.weight, what="weight")
    with pytest.raises(ValueError, match="before forward"):
        copied.backward(a["grad_output"], a["grad_residual_out"])
    # the copy works from a fresh forward, and the original still has its sum
    for got, want in zip(copied(a["x"], a["residual"]), (y, h)):
        assert_same_bytes(got, want, what="the copy's forward")
    expected, _ = rmsnorm.add_rms_norm_backward(a["grad_output"], a["grad_residual_out"], h, 64,
                                                layer.weight, EPS, weight_offset=1.0)
    assert_same_bytes(layer.backward(a["grad_output"], a["grad_residual_out"]), expected,
                      what="the original's backward")


def test_module_plain_forward_after_a_residual_forward_uses_its_own_input():
    # the saved input is what the last forward normalised, h or x
    layer = _layer(("float64", "float64"), 16, 0.0, seed=35)
    a = block_arrays(("float64", "float64"), (3, 16), seed=36)
    layer(a["x"], a["residual"])
    layer(a["x"])
    expected, _ = rmsnorm.rms_norm_backward(a["grad_output"], a["x"], 16, layer.weight, EPS)
    assert_same_bytes(layer.backward(a["grad_output"]), expected, what="grad_input")
    with pytest.raises(ValueError, match="grad_residual"):
        layer(a["x"])
        layer.backward(a["grad_output"], a["grad_residual_out"])


@needs_torch
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=lambda o: f"offset={o}")
def test_module_residual_step_matches_torch(offset):
    # the module end to end against the torch block (float64: torch's own gradients)
    pair = ("float64", "float64")
    a = block_arrays(pair, (2, 3, 40), seed=37)
    block = "pre-norm" if offset == 0.0 else "gemma-pre-norm"
    expected = torch_block(a, (40,), block, gradients_in_float32=True)
    layer = rmsnorm.RMSNorm(40, eps=float(a["eps"]), weight_offset=offset, dtype=np.float64)
    layer.weight[...] = a["weight"]
    y, h = layer(a["x"], a["residual"])
    assert_forward_close(y, expected["output"])
    assert_same_bytes(h, expected["residual_out"], what="residual_out")
    assert_grad_close(layer.backward(a["grad_output"], a["grad_residual_out"]),
                      expected["grad_input"], what="grad_input")
    assert_grad_close(layer.weight_grad, expected["grad_weight"], what="weight_grad")
