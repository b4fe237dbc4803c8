"""rmsnorm.torch's inputs: what it reads, what it takes and what it refuses.

1. A tensor's negative bit (``Tensor.is_neg()``, as ``.conj().imag`` of a
   complex tensor or ``torch._neg_view`` set it) is honoured for every
   operand of the forward and the backward, on every route.
2. Forward-mode AD (``torch.autograd.forward_ad``) gives the output its
   tangent: ``gradcheck(..., check_forward_ad=True)`` accepts it, and it
   matches ``torch.nn.functional.rms_norm``'s.
3. One validation for both APIs: the same bad residuals and weight offsets
   give the same errors through ``rmsnorm`` and ``rmsnorm.torch``, whatever
   the weight, and the same accepted offsets give the same results.
4. Sparse tensors and non-tensors are refused naming what is wrong; meta
   tensors give torch's shapes and dtypes.
5. ``normalized_shape`` takes the sizes torch takes, by ``operator.index``
   (NumPy integers, 0-d integer tensors), and refuses the rest (floats,
   strings, bools, None) with torch's TypeError, which names it.

Expected values come from torch (``torch.nn.functional.rms_norm``, its
autograd and forward AD, ``gradcheck``) or from math.
"""

from __future__ import annotations

import decimal
import fractions
import math

import numpy as np
import pytest
import torch

import rmsnorm
import rmsnorm.torch as rt

F = torch.nn.functional
N = 16


# ---------------------------------------------------------------------------
# 1. The negative bit.
# ---------------------------------------------------------------------------


def neg_bit_view(values, how: str):
    """A tensor equal to ``values`` whose memory holds their negation and
    whose negative bit is set."""
    if how == "_neg_view":
        tensor = torch._neg_view(-values)
    else:  # the imaginary part of a conjugated complex tensor
        complex_dtype = torch.complex128 if values.dtype == torch.float64 else torch.complex64
        tensor = torch.complex(torch.zeros_like(values), -values).to(complex_dtype).conj().imag
    assert torch.equal(tensor, values)
    return tensor


def route_context(route: str):
    return torch.no_grad() if route == "no_grad" else torch.enable_grad()


NEG_OPERANDS = ["input", "residual", "weight", "grad_output"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("how", ["_neg_view", "conj().imag"])
@pytest.mark.parametrize("operand", NEG_OPERANDS)
@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("route", ["no_grad", "autograd", "op"])
def test_negative_bit_of_each_operand_is_honoured(dtype, how, operand, fused, route):
    if operand == "residual" and not fused:
        pytest.skip("rms_norm has no residual")
    if operand == "grad_output" and route == "no_grad":
        pytest.skip("no backward without autograd")
    generator = torch.Generator().manual_seed(3)
    values = {
        "input": torch.randn(4, N, dtype=dtype, generator=generator),
        "residual": torch.randn(4, N, dtype=dtype, generator=generator),
        "weight": torch.rand(N, dtype=dtype, generator=generator) + 0.5,
        "grad_output": torch.randn(4, N, dtype=dtype, generator=generator),
    }
    ours_operands = dict(values)
    ours_operands[operand] = neg_bit_view(values[operand], how)
    assert ours_operands[operand].is_neg()

    def run(operands, call):
        grad = route != "no_grad"
        x = operands["input"].detach().clone().requires_grad_(grad)
        weight = operands["weight"].detach().clone().requires_grad_(grad)
        if operand == "input":
            x = operands["input"].requires_grad_(grad)  # the neg-bit tensor itself, a leaf
        if operand == "weight":
            weight = operands["weight"].requires_grad_(grad)
        with route_context(route):
            if fused:
                y, h = call(x, operands["residual"], weight)
            else:
                y, h = call(x, None, weight), None
            if grad:
                y.backward(operands["grad_output"])
        return y.detach(), h, None if not grad else (x.grad, weight.grad)

    def ours(x, residual, weight):
        if route == "op":
            if residual is None:
                return torch.ops.rmsnorm.rms_norm(x, [N], weight, 1e-6, 0.0)
            return torch.ops.rmsnorm.add_rms_norm(x, residual, [N], weight, 1e-6, 0.0)
        if residual is None:
            return rt.rms_norm(x, [N], weight, 1e-6)
        return rt.add_rms_norm(x, residual, [N], weight, 1e-6)

    def theirs(x, residual, weight):
        if residual is None:
            return F.rms_norm(x, [N], weight, 1e-6)
        h = x + residual
        return F.rms_norm(h, [N], weight, 1e-6), h

    got = run(ours_operands, ours)
    expected = run(values, theirs)
    torch.testing.assert_close(got[0], expected[0], msg=lambda m: f"output: {m}")
    if fused:
        torch.testing.assert_close(got[1].detach(), expected[1].detach(), msg=lambda m: f"sum: {m}")
    if got[2] is not None:
        for name, g, e in zip(("grad_input", "grad_weight"), got[2], expected[2]):
            torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


def test_negative_bit_of_a_16_bit_input_is_honoured():
    x = torch.randn(3, N).to(torch.bfloat16)
    weight = torch.rand(N)  # torch's mixed precision: a float32 weight
    flipped = torch._neg_view(-x)
    torch.testing.assert_close(rt.rms_norm(flipped, [N], weight), F.rms_norm(x, [N], weight))


# ---------------------------------------------------------------------------
# 2. Forward-mode AD.
# ---------------------------------------------------------------------------


def float64_leaves(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(3, 2, 7, dtype=torch.float64, generator=generator) for _ in range(2))
    weight = torch.randn(2, 7, dtype=torch.float64, generator=generator)
    return [t.requires_grad_() for t in (x, residual, weight)]


@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize("tangents", ["input", "weight", "input+weight", "input-unweighted"])
def test_forward_ad_of_rms_norm_passes_gradcheck(weight_offset, tangents):
    x, _, weight = float64_leaves()
    if tangents == "input-unweighted":
        if weight_offset:
            pytest.skip("an offset needs a weight")
        assert torch.autograd.gradcheck(
            lambda x: rt.rms_norm(x, (2, 7), None, 1e-5), (x,), check_forward_ad=True
        )
        return
    frozen = {"input": x.detach(), "weight": weight.detach()}

    def call(*leaves):
        operands = dict(frozen)
        operands.update(zip([t for t in ("input", "weight") if t in tangents], leaves))
        return rt.rms_norm(
            operands["input"], (2, 7), operands["weight"], 1e-5, weight_offset=weight_offset
        )

    leaves = tuple({"input": x, "weight": weight}[t] for t in ("input", "weight") if t in tangents)
    assert torch.autograd.gradcheck(call, leaves, check_forward_ad=True)


@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize(
    "tangents", ["input", "residual", "weight", "input+residual+weight", "input+residual"]
)
def test_forward_ad_of_add_rms_norm_passes_gradcheck(weight_offset, tangents):
    leaves_by_name = dict(zip(("input", "residual", "weight"), float64_leaves(1)))
    names = [t for t in ("input", "residual", "weight") if t in tangents]

    def call(*leaves):
        operands = {name: t.detach() for name, t in leaves_by_name.items()}
        operands.update(zip(names, leaves))
        return rt.add_rms_norm(
            operands["input"],
            operands["residual"],
            (2, 7),
            operands["weight"],
            1e-5,
            weight_offset=weight_offset,
        )

    leaves = tuple(leaves_by_name[name] for name in names)
    assert torch.autograd.gradcheck(call, leaves, check_forward_ad=True)


def torch_tangent(call, *pairs):
    """The output tangents of call on dual tensors made of (primal, tangent) pairs."""
    fwad = torch.autograd.forward_ad
    with fwad.dual_level():
        duals = [p if t is None else fwad.make_dual(p, t) for p, t in pairs]
        outputs = call(*duals)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return [(fwad.unpack_dual(o).primal, fwad.unpack_dual(o).tangent) for o in outputs]


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str
)
@pytest.mark.parametrize("grad_mode", ["no_grad", "requires_grad"])
@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_forward_ad_tangent_matches_torch(dtype, grad_mode, fused):
    generator = torch.Generator().manual_seed(5)
    x, residual, tx, tr = (torch.randn(5, N, generator=generator).to(dtype) for _ in range(4))
    weight, tw = torch.rand(N, generator=generator).to(dtype), torch.randn(N).to(dtype)
    if grad_mode == "requires_grad":
        x.requires_grad_()

    def ours_call(x, r, w):
        return rt.add_rms_norm(x, r, [N], w, 1e-6) if fused else rt.rms_norm(x, [N], w, 1e-6)

    def theirs_call(x, r, w):
        h = x + r
        return (F.rms_norm(h, [N], w, 1e-6), h) if fused else F.rms_norm(x, [N], w, 1e-6)

    context = torch.no_grad() if grad_mode == "no_grad" else torch.enable_grad()
    with context:
        ours = torch_tangent(ours_call, (x, tx), (residual, tr), (weight, tw))
        theirs = torch_tangent(theirs_call, (x, tx), (residual, tr), (weight, tw))
    for (_, got), (_, expected) in zip(ours, theirs):
        assert got is not None, "no tangent"
        assert got.dtype == expected.dtype
        # torch's tangent is rounded at each step in the input's dtype; ours once
        rtol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype)
        torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol)


def test_forward_ad_without_a_tangent_gives_none_as_torch_does():
    x = torch.randn(3, N)
    [(primal, tangent)] = torch_tangent(lambda x: rt.rms_norm(x, [N]), (x, None))
    assert tangent is None
    torch.testing.assert_close(primal, F.rms_norm(x, [N]))


class PassThroughMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_forward_ad_under_a_torch_function_mode_gives_torchs_tangent():
    # A mode sends calls to the op, whose autograd has no jvp: there torch serves them.
    x, tx = torch.randn(3, N, dtype=torch.float64), torch.randn(3, N, dtype=torch.float64)
    with PassThroughMode():
        [(_, ours)] = torch_tangent(lambda x: rt.rms_norm(x, [N]), (x, tx))
    [(_, theirs)] = torch_tangent(lambda x: F.rms_norm(x, [N]), (x, tx))
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_forward_ad_through_the_op_itself_is_refused_naming_what_to_use(fused):
    x, tx = torch.randn(3, N), torch.randn(3, N)
    name = "add_rms_norm" if fused else "rms_norm"

    def call(x):
        if fused:
            return torch.ops.rmsnorm.add_rms_norm(x, x, [N], None, None, 0.0)
        return torch.ops.rmsnorm.rms_norm(x, [N], None, None, 0.0)

    with pytest.raises(RuntimeError, match=rf"rmsnorm\.{name}.*forward-mode.*rmsnorm\.torch"):
        torch_tangent(call, (x, tx))


# ---------------------------------------------------------------------------
# 3. One validation for both APIs.
# ---------------------------------------------------------------------------

SHAPE = (3, 4)

# name -> (what to change, error type, message pattern): one bad thing each.
BAD_INPUTS = {
    "residual float64": (
        {"residual_dtype": "float64"},
        TypeError,
        r"residual must have the input's dtype float32, got float64",
    ),
    "residual float16": (
        {"residual_dtype": "float16"},
        TypeError,
        r"residual must have the input's dtype float32, got float16",
    ),
    "residual broadcast (4,)": (
        {"residual_shape": (4,)},
        ValueError,
        r"residual must have the input's shape \(3, 4\), got \(4,\)",
    ),
    "residual broadcast (1, 4)": (
        {"residual_shape": (1, 4)},
        ValueError,
        r"residual must have the input's shape \(3, 4\), got \(1, 4\)",
    ),
    "residual (2, 3, 4)": (
        {"residual_shape": (2, 3, 4)},
        ValueError,
        r"residual must have the input's shape \(3, 4\), got \(2, 3, 4\)",
    ),
    "offset str": (
        {"weight_offset": "1.0"},
        TypeError,
        "weight_offset must be a real number, got str",
    ),
    "offset bool": (
        {"weight_offset": True},
        TypeError,
        "weight_offset must be a real number, got bool",
    ),
    "offset Decimal": (
        {"weight_offset": decimal.Decimal(1)},
        TypeError,
        "weight_offset must be a real number, got Decimal",
    ),
    "offset complex": (
        {"weight_offset": 1 + 2j},
        TypeError,
        "weight_offset must be a real number, got complex",
    ),
    "offset np.complex128": (
        {"weight_offset": np.complex128(1 + 2j)},
        TypeError,
        "weight_offset must be a real number, got complex128",
    ),
    "offset one-element array": (
        {"weight_offset": "one-element"},
        TypeError,
        "weight_offset must be a real number, got (ndarray|Tensor)",
    ),
    "offset None": (
        {"weight_offset": None},
        TypeError,
        "weight_offset must be a real number, got NoneType",
    ),
}
BAD_WITHOUT_WEIGHT = {
    "offset 1 without weight": (
        {"weight_offset": 1.0},
        ValueError,
        r"weight_offset=1.0 needs a weight",
    ),
    "offset 10**400 without weight": (
        {"weight_offset": 10**400},
        ValueError,
        r"weight_offset=1000+ needs a weight",
    ),
}
# The weights the calls run with: none, the input's dtype, torch's mixed
# precision (the kernels' pairs) and a pair the torch bridge sends to torch.
WEIGHTS = [None, "float32", "float64", "float16"]


def make_call(api: str, function: str, change: dict, weight_dtype, requires_grad=False):
    """A call of ``function`` through ``api`` ("numpy" or "torch") on float32
    input of SHAPE, with ``change`` applied."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    residual = rng.standard_normal(change.get("residual_shape", SHAPE))
    residual = residual.astype(change.get("residual_dtype", "float32"))
    weight = (
        None if weight_dtype is None else rng.uniform(0.5, 1.5, SHAPE[-1:]).astype(weight_dtype)
    )
    offset = change.get("weight_offset", 0.0)
    if api == "torch":
        x, residual = torch.from_numpy(x), torch.from_numpy(residual)
        weight = None if weight is None else torch.from_numpy(weight)
        if requires_grad:
            x.requires_grad_()
        module = rt
        one_element = torch.tensor([1.0])
    else:
        module = rmsnorm
        one_element = np.array([1.0])
    if isinstance(offset, str) and offset == "one-element":
        offset = one_element
    if function == "rms_norm":
        return lambda: module.rms_norm(x, SHAPE[-1], weight, 1e-6, weight_offset=offset)
    return lambda: module.add_rms_norm(x, residual, SHAPE[-1], weight, 1e-6, weight_offset=offset)


def bad_cases():
    for name, case in {**BAD_INPUTS, **BAD_WITHOUT_WEIGHT}.items():
        weights = [None] if name in BAD_WITHOUT_WEIGHT else WEIGHTS
        fused_only = any(key.startswith("residual") for key in case[0])
        functions = ["add_rms_norm"] if fused_only else ["rms_norm", "add_rms_norm"]
        for weight in weights:
            for function in functions:
                yield pytest.param(case, weight, function, id=f"{name}-weight={weight}-{function}")


@pytest.mark.parametrize("case, weight_dtype, function", bad_cases())
def test_the_same_bad_input_gives_the_same_error_through_both_apis(case, weight_dtype, function):
    change, error, pattern = case
    for api, requires_grad in (("numpy", False), ("torch", False), ("torch", True)):
        call = make_call(api, function, change, weight_dtype, requires_grad)
        with pytest.raises(error, match=pattern):
            call()


@pytest.mark.parametrize("weight_dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "weight_offset, expected",
    [
        (1, 1.0),
        (fractions.Fraction(1, 2), 0.5),
        (np.float32(0.25), 0.25),
        (np.int64(2), 2.0),
        (10**400, math.inf),
        (-(10**400), -math.inf),
    ],
    ids=["int", "Fraction", "np.float32", "np.int64", "10**400", "-10**400"],
)
def test_both_apis_take_the_same_offsets_as_the_same_float(weight_dtype, weight_offset, expected):
    # One past float64's range is +-inf, as the same eps is.
    rng = np.random.default_rng(12)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, SHAPE[-1]).astype(weight_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        reference = rmsnorm.rms_norm(x, 4, weight, 1e-6, weight_offset=expected)
        got = rmsnorm.rms_norm(x, 4, weight, 1e-6, weight_offset=weight_offset)
        torch_got = rt.rms_norm(
            torch.from_numpy(x), 4, torch.from_numpy(weight), 1e-6, weight_offset=weight_offset
        )
    np.testing.assert_array_equal(got, reference)
    # the float16 weight goes to torch, which rounds the factor to float16 first
    rtol = 1e-3 if weight_dtype == "float16" else 1e-6
    np.testing.assert_allclose(torch_got.numpy(), reference, rtol=rtol)
    if math.isinf(expected):
        assert np.all(np.isinf(got) | np.isnan(got))
        eps_inf = rmsnorm.rms_norm(x, 4, weight, eps=10**400)
        assert np.all(eps_inf == 0)  # the same eps is inf too: x / inf


# ---------------------------------------------------------------------------
# 4. Sparse, meta and non-tensor operands.
# ---------------------------------------------------------------------------


def torch_type_error(call) -> str:
    with pytest.raises(TypeError) as error:
        call()
    return str(error.value)


@pytest.mark.parametrize(
    "not_a_tensor",
    [np.ones((3, N), np.float32), [[1.0] * N] * 3, 1.0],
    ids=["ndarray", "list", "float"],
)
def test_a_non_tensor_input_is_a_type_error_in_torchs_words(not_a_tensor):
    expected = torch_type_error(lambda: F.rms_norm(not_a_tensor, [N]))
    assert "must be Tensor" in expected
    assert torch_type_error(lambda: rt.rms_norm(not_a_tensor, [N])) == expected
    assert torch_type_error(lambda: rt.RMSNorm(N)(not_a_tensor)) == expected
    assert torch_type_error(lambda: rt.add_rms_norm(not_a_tensor, torch.ones(3, N), [N])) == (
        expected.replace("rms_norm()", "add_rms_norm()")
    )


@pytest.mark.parametrize(
    "not_a_tensor", [np.ones(N, np.float32), [1.0] * N], ids=["ndarray", "list"]
)
def test_a_non_tensor_weight_or_residual_is_a_type_error_naming_it(not_a_tensor):
    x = torch.randn(3, N)
    expected = torch_type_error(lambda: F.rms_norm(x, [N], not_a_tensor))
    assert torch_type_error(lambda: rt.rms_norm(x, [N], not_a_tensor)) == expected
    type_name = type(not_a_tensor).__name__
    with pytest.raises(TypeError, match=rf"argument 'weight' \(position 4\).*not .*{type_name}"):
        rt.add_rms_norm(x, x, [N], not_a_tensor)
    with pytest.raises(TypeError, match=rf"argument 'residual' \(position 2\).*not .*{type_name}"):
        rt.add_rms_norm(x, not_a_tensor, [N])
    with pytest.raises(TypeError, match=rf"argument 'residual' \(position 2\).*not .*{type_name}"):
        rt.RMSNorm(N)(x, not_a_tensor)


SPARSE = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.to_sparse_csr(),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", SPARSE)
@pytest.mark.parametrize("operand", ["input", "residual", "weight"])
def test_a_sparse_operand_is_refused_naming_its_layout(layout, operand):
    x, residual = torch.randn(3, N), torch.randn(3, N)
    weight = torch.rand(N)
    operands = {"input": x, "residual": residual, "weight": weight}
    if operand == "weight":
        if layout == "sparse_csr":
            pytest.skip("a CSR tensor is 2-D at least")
        operands["weight"] = SPARSE[layout](weight)
    else:
        operands[operand] = SPARSE[layout](operands[operand])
    pattern = rf"{operand} is a sparse tensor \(layout torch\.{layout}\).*to_dense\(\)"
    calls = [
        lambda: rt.add_rms_norm(operands["input"], operands["residual"], [N], operands["weight"])
    ]
    if operand != "residual":
        calls.append(lambda: rt.rms_norm(operands["input"], [N], operands["weight"]))
    for call in calls:
        with pytest.raises(NotImplementedError, match=pattern):
            call()


def test_the_op_names_a_sparse_inputs_layout():
    with pytest.raises(RuntimeError, match=r"layout torch\.sparse_coo"):
        torch.ops.rmsnorm.rms_norm(torch.randn(3, N).to_sparse(), [N], None, None, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_meta_tensors_give_torchs_shapes_and_dtypes(dtype):
    x, residual = (torch.empty(2, 3, N, device="meta", dtype=dtype) for _ in range(2))
    with torch.device("meta"):
        module = rt.RMSNorm(N, dtype=dtype)
    expected = F.rms_norm(x, [N], module.weight)
    results = [
        rt.rms_norm(x, [N], module.weight),
        rt.rms_norm(x, [N], module.weight, weight_offset=1.0),
        module(x),
        *rt.add_rms_norm(x, residual, [N], module.weight),
        *module(x, residual),
    ]
    for result in results:
        assert result.device.type == "meta"
        assert (result.shape, result.dtype) == (expected.shape, expected.dtype)
    with pytest.raises(ValueError, match=r"residual must have the input's shape"):
        rt.add_rms_norm(x, residual[0], [N])


# ---------------------------------------------------------------------------
# 5. normalized_shape.
# ---------------------------------------------------------------------------

# name -> (a normalized_shape torch takes, the plain shape it is)
INDEX_SHAPES = {
    # One integer, as rmsnorm.torch takes an int (torch's module takes
    # one, its functional only sequences).
    "np.int64": (np.int64(N), (N,)),
    "np.int64 element": ((np.int64(N),), (N,)),
    "np.int32 in a list": ([np.int32(N)], (N,)),
    "np.uint8 element": ((np.uint8(N),), (N,)),
    "int and np.int64": ((3, np.int64(N)), (3, N)),
    "1-d int array": (np.array([3, N]), (3, N)),
    "0-d int array element": ((np.array(N),), (N,)),
    "0-d int tensor element": ((torch.tensor(N),), (N,)),
}


@pytest.mark.parametrize("route", ["no_grad", "autograd"])
@pytest.mark.parametrize("entry", ["rms_norm", "add_rms_norm", "RMSNorm"])
@pytest.mark.parametrize("case", INDEX_SHAPES)
def test_integers_torch_takes_are_sizes_of_normalized_shape(case, entry, route):
    value, shape = INDEX_SHAPES[case]
    generator = torch.Generator().manual_seed(13)
    x, residual = (torch.randn(2, 3, N, dtype=torch.float64, generator=generator) for _ in range(2))
    weight = torch.rand(shape, dtype=torch.float64, generator=generator) + 0.5
    grad = route != "no_grad"

    def run(call, x):
        x = x.detach().clone().requires_grad_(grad)
        with route_context(route):
            y = call(x)
            if grad:
                y.sum().backward()
        return y.detach(), x.grad

    if entry == "RMSNorm":
        module = rt.RMSNorm(value, dtype=torch.float64)
        assert module.normalized_shape == shape
        with torch.no_grad():
            module.weight.copy_(weight)
        got = run(module, x)
    elif entry == "add_rms_norm":
        got = run(lambda x: rt.add_rms_norm(x, residual, value, weight)[0], x)
    else:
        got = run(lambda x: rt.rms_norm(x, value, weight), x)
    if entry == "add_rms_norm":
        expected = run(lambda x: F.rms_norm(x + residual, shape, weight), x)
    else:
        expected = run(lambda x: F.rms_norm(x, shape, weight), x)
    torch.testing.assert_close(got, expected)


# name -> a normalized_shape torch refuses with a TypeError
NOT_SHAPES = {
    "float": 4.0,
    "float element": (4.0,),
    "np.float64": np.float64(4),
    "str": "4",
    "str element": ("4",),
    "bytes": b"4",
    "bool": True,
    "bool element": (True,),
    "np.bool_ element": (np.bool_(True),),
    "None": None,
    "None element": (None,),
    "0-d int array": np.array(4),
    "0-d int tensor": torch.tensor(4),
    "float tensor element": (torch.tensor(4.0),),
    "1-d array element": (np.array([4]),),
}


@pytest.mark.parametrize("entry", ["rms_norm", "add_rms_norm", "RMSNorm"])
@pytest.mark.parametrize("case", NOT_SHAPES)
def test_a_normalized_shape_torch_refuses_is_a_type_error_in_its_words(case, entry):
    x = torch.randn(3, 4)
    expected = torch_type_error(lambda: F.rms_norm(x, NOT_SHAPES[case]))
    assert "argument 'normalized_shape' (position 2)" in expected
    # The same words, naming the function called and normalized_shape's place in it.
    if entry == "RMSNorm":
        expected = expected.replace("rms_norm()", "RMSNorm()").replace("(position 2)", "(position 1)")
        assert torch_type_error(lambda: rt.RMSNorm(NOT_SHAPES[case])) == expected
    elif entry == "add_rms_norm":
        expected = expected.replace("rms_norm()", "add_rms_norm()").replace("(position 2)",
                                                                            "(position 3)")
        assert torch_type_error(lambda: rt.add_rms_norm(x, x, NOT_SHAPES[case])) == expected
    else:
        assert torch_type_error(lambda: rt.rms_norm(x, NOT_SHAPES[case])) == expected
