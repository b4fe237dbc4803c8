"""Bad inputs: each is refused with a TypeError or ValueError whose message
names the problem, and no caller array changes, bit for bit.

The catalogue holds the cases, by argument. Beside it: shape problems carry
torch 2.13's exact texts (taken from torch at test time), load_state_dict
refuses what torch's refuses, and the raw-buffer entry points refuse
malformed arguments.

Every case of the catalogue builds its arguments through a :class:`Caller`
(caller_state.py), which snapshots each array (and the buffer it views) the
moment the case makes it, that is before the call. After the call has
raised, every snapshot must still match. A case that needs a library change
first is marked ``xfail(strict=True)`` with the patch it waits for, so that
it flips to a failure (and the mark is removed) once the patch lands.

The odd-but-valid inputs, which must give right answers, are in
``test_edge_values.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import rmsnorm
from caller_state import Caller

try:  # torch's own error texts are the expected ones; the catalogue needs no torch
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="the expected texts come from torch")


# ---------------------------------------------------------------------------
# The catalogue.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BadInput:
    call: Callable[[Caller], object]
    error: type[BaseException]
    names: tuple[str, ...]  # what the message must mention (case-insensitive)


CATALOGUE: dict[str, list] = {}


def bad(category, name, error, names, call, needs_patch=None):
    """Adds a case: ``call(caller)`` must raise ``error`` naming all of ``names``."""
    marks = ()
    if needs_patch:
        marks = pytest.mark.xfail(strict=True, reason=f"needs patch: {needs_patch}")
    CATALOGUE.setdefault(category, []).append(
        pytest.param(BadInput(call, error, tuple(names)), id=f"{category}-{name}", marks=marks))


F32 = np.float32

# The arguments of one rms_norm call, for cases that spoil one of them.
def _eps(value):
    return lambda c: rmsnorm.rms_norm(c.x(), 3, c.weight(), eps=c.keep(value, "eps"))


def _shape(normalized_shape, x_shape=(2, 3)):
    return lambda c: rmsnorm.rms_norm(c.x(x_shape), normalized_shape)


def _weight(make_weight, normalized_shape=3, x_shape=(2, 3)):
    return lambda c: rmsnorm.rms_norm(c.x(x_shape), normalized_shape,
                                      c.keep(make_weight(), "weight"))


# ---- input: what is not an array of numbers -------------------------------
bad("input", "None", TypeError, ["input"], lambda c: rmsnorm.rms_norm(None, 3))
bad("input", "str", TypeError, ["input", "<U3"], lambda c: rmsnorm.rms_norm("abc", 3))
bad("input", "bytes", TypeError, ["input", "S3"], lambda c: rmsnorm.rms_norm(b"abc", 3))
bad("input", "dict", TypeError, ["input", "object"],
    lambda c: rmsnorm.rms_norm({"a": 1.0, "b": 2.0, "c": 3.0}, 3))
bad("input", "ragged_list", ValueError, ["inhomogeneous"],
    lambda c: rmsnorm.rms_norm([[1.0, 2.0], [3.0]], 2))
bad("input", "list_of_str", TypeError, ["input", "<U1"],
    lambda c: rmsnorm.rms_norm(["a", "b", "c"], 3))
bad("input", "0d_array", ValueError, ["at least 1 dimension", "got 0"],
    lambda c: rmsnorm.rms_norm(c.keep(np.array(3.0, F32)), 1))
bad("input", "numpy_scalar", ValueError, ["at least 1 dimension", "got 0"],
    lambda c: rmsnorm.rms_norm(np.float32(3.0), 1))
bad("input", "backward_None", TypeError, ["input"],
    lambda c: rmsnorm.rms_norm_backward(c.grad(), None, 3))
bad("input", "module_str", TypeError, ["input"], lambda c: c.module(3)("abc"))
bad("input", "gufunc_None", TypeError, ["forward", "input types"],
    lambda c: rmsnorm.forward(None, c.weight(), F32(1e-5)))
bad("input", "gufunc_0d", ValueError, ["operand 0", "enough dimensions"],
    lambda c: rmsnorm.forward(c.keep(np.array(2.0, F32)), c.weight(), F32(1e-5)))

# ---- masked: masked arrays, which would count their masked values ----------

def _masked(c, array):
    """array with its first element masked, kept (data and mask) by the caller."""
    return c.keep(np.ma.masked_array(array, mask=np.arange(array.size).reshape(array.shape) == 0))


MASKED_CALLS = {
    "rms_norm_input": (["input", ".filled", ".data"],
                       lambda c: rmsnorm.rms_norm(_masked(c, c.x()), 3)),
    "rms_norm_weight": (["weight", ".filled"],
                        lambda c: rmsnorm.rms_norm(c.x(), 3, _masked(c, c.weight()))),
    "backward_input": (["input", ".filled"],
                       lambda c: rmsnorm.rms_norm_backward(c.grad(), _masked(c, c.x()), 3)),
    "backward_grad_output": (["grad_output", ".filled"],
                             lambda c: rmsnorm.rms_norm_backward(_masked(c, c.grad()), c.x(), 3)),
    "add_residual": (["residual", ".filled"],
                     lambda c: rmsnorm.add_rms_norm(c.x(), _masked(c, c.x()), 3)),
    "add_backward_grad_residual_out": (
        ["grad_residual_out", ".filled"],
        lambda c: rmsnorm.add_rms_norm_backward(c.grad(), _masked(c, c.grad()), c.x(), 3)),
    "module_forward": (["input", ".filled"], lambda c: c.module(3)(_masked(c, c.x()))),
}
for _name, (_words, _call) in MASKED_CALLS.items():
    bad("masked", _name, TypeError, ["masked array", *_words], _call)

# ---- dtype: arrays of the wrong element type -------------------------------
NON_FLOATING = {
    "int32": lambda: np.arange(6, dtype=np.int32).reshape(2, 3),
    "int64": lambda: np.arange(6, dtype=np.int64).reshape(2, 3),
    "uint8": lambda: np.arange(6, dtype=np.uint8).reshape(2, 3),
    "bool": lambda: np.ones((2, 3), bool),
    "complex64": lambda: np.ones((2, 3), np.complex64),
    "complex128": lambda: np.ones((2, 3), np.complex128),
    "longdouble": lambda: np.ones((2, 3), np.longdouble),
    "object": lambda: np.ones((2, 3), object),
    "str": lambda: np.full((2, 3), "abc"),
    "bytes": lambda: np.full((2, 3), b"abc"),
    "datetime64": lambda: np.full((2, 3), np.datetime64("2024-01-01", "D")),
    "timedelta64": lambda: np.ones((2, 3), "m8[s]"),
}


def _dtype_names(make):
    return ["input", str(make().dtype)]


for _name, _make in NON_FLOATING.items():
    bad("dtype", _name, TypeError, _dtype_names(_make),
        lambda c, make=_make: rmsnorm.rms_norm(c.keep(make(), "x"), 3))
    bad("dtype", f"backward_{_name}", TypeError, _dtype_names(_make),
        lambda c, make=_make: rmsnorm.rms_norm_backward(c.grad(), c.keep(make(), "x"), 3))
for _name in ["int64", "bool", "complex128", "str"]:
    bad("dtype", f"module_{_name}", TypeError, _dtype_names(NON_FLOATING[_name]),
        lambda c, make=NON_FLOATING[_name]: c.module(3)(c.keep(make(), "x")))
for _name in ["complex128", "object", "str", "datetime64"]:
    # The gufunc itself: NumPy's own refusal, since no loop takes the type.
    bad("dtype", f"gufunc_{_name}", TypeError, ["forward", "input types"],
        lambda c, make=NON_FLOATING[_name]: rmsnorm.forward(
            c.keep(make(), "x"), c.keep(np.ones(3)), 1e-5))
bad("dtype", "python_int_list", TypeError, ["input", str(np.asarray([[1, 2, 3]]).dtype)],
    lambda c: rmsnorm.rms_norm([[1, 2, 3]], (3,)))

# ---- normalized_shape ------------------------------------------------------
# name -> (a normalized_shape that is not ints, the type the message names)
NOT_INTS = {
    "float": (3.0, "float"),
    "float_element": ((3.0,), "float"),
    "non_integral": ([1.5], "float"),
    "str": ("3", "str"),
    "str_element": (("3",), "str"),
    "None": (None, "NoneType"),
    "None_element": ((None,), "NoneType"),
}
for _name, (_value, _type) in NOT_INTS.items():
    bad("normalized_shape", _name, TypeError, ["normalized_shape", _type], _shape(_value))
    bad("normalized_shape", f"backward_{_name}", TypeError, ["normalized_shape", _type],
        lambda c, value=_value: rmsnorm.rms_norm_backward(c.grad(), c.x(), value))
    bad("normalized_shape", f"module_{_name}", TypeError, ["normalized_shape", _type],
        lambda c, value=_value: c.module(value)(c.x()))
bad("normalized_shape", "negative", ValueError, ["normalized_shape=[-3]"], _shape(-3))
bad("normalized_shape", "negative_element", ValueError, ["normalized_shape=[2, -3]"],
    _shape((2, -3)))
bad("normalized_shape", "nested_tuple", TypeError, ["normalized_shape", "tuple"], _shape(((3,),)))
bad("normalized_shape", "nested_list", TypeError, ["normalized_shape", "list"], _shape([[2, 3]]))
bad("normalized_shape", "bool", TypeError, ["normalized_shape", "bool"], _shape(True))
bad("normalized_shape", "longer_than_input_rank", ValueError,
    ["at least 3 dimensions", "got 2"], _shape((1, 2, 3)))
bad("normalized_shape", "empty_tuple", ValueError, ["normalized_shape", "at least 1-dimensional"],
    _shape(()))
bad("normalized_shape", "empty_list", ValueError, ["normalized_shape", "at least 1-dimensional"],
    _shape([]))
bad("normalized_shape", "wrong_size", ValueError, ["normalized_shape=[4]", "size[2, 3]"],
    _shape(4))
bad("normalized_shape", "dict", TypeError, ["normalized_shape", "dict"], _shape({3: 1}))
bad("normalized_shape", "set", TypeError, ["normalized_shape", "set"], _shape({3}))
bad("normalized_shape", "module_negative", ValueError, ["negative"],
    lambda c: rmsnorm.RMSNorm(-3))

# ---- weight ----------------------------------------------------------------
bad("weight", "rank_2", ValueError, ["weight of shape [1, 3]"],
    _weight(lambda: np.ones((1, 3), F32)))
bad("weight", "too_long", ValueError, ["weight of shape [4]"], _weight(lambda: np.ones(4, F32)))
bad("weight", "empty", ValueError, ["weight of shape [0]"], _weight(lambda: np.ones(0, F32)))
bad("weight", "scalar", ValueError, ["weight of shape []"], _weight(lambda: 1.0))
bad("weight", "transposed", ValueError, ["weight of shape [3, 2]"],
    _weight(lambda: np.ones((3, 2), F32), (2, 3), (4, 2, 3)))
bad("weight", "int64", TypeError, ["weight", "int64"], _weight(lambda: np.ones(3, np.int64)))
bad("weight", "bool", TypeError, ["weight", "bool"], _weight(lambda: np.ones(3, bool)))
bad("weight", "complex", TypeError, ["weight", "complex128"],
    _weight(lambda: np.ones(3, np.complex128)))
bad("weight", "str_array", TypeError, ["weight", "<U1"],
    _weight(lambda: np.array(["a", "b", "c"])))
bad("weight", "str", TypeError, ["weight", "<U3"], _weight(lambda: "abc"))
bad("weight", "object", TypeError, ["weight", "object"], _weight(lambda: object()))
bad("weight", "dict", TypeError, ["weight", "object"], _weight(lambda: {"w": 1.0}))
bad("weight", "backward_too_long", ValueError, ["weight of shape [4]"],
    lambda c: rmsnorm.rms_norm_backward(c.grad(), c.x(), 3, c.weight((4,))))
bad("weight", "gufunc_too_long", ValueError, ["operand 1", "core dimension"],
    lambda c: rmsnorm.forward(c.x(), c.weight((4,)), F32(1e-5)))

# ---- eps -------------------------------------------------------------------
# name -> (an eps that is not a real number, the type the message names)
NOT_REAL = {
    "str": ("1e-5", "str"),
    "bytes": (b"1e-5", "bytes"),
    "list": ([1e-5], "list"),
    "array": (np.array([1e-5, 1e-5]), "ndarray"),
    "0d_array": (np.array(1e-5), "ndarray"),
    "complex": (1e-5j, "complex"),
    "numpy_complex": (np.complex128(1e-5), "complex"),
    "bool": (True, "bool"),
    "dict": ({"eps": 1e-5}, "dict"),
    "object": (object(), "object"),
}
for _name, (_value, _type) in NOT_REAL.items():
    bad("eps", _name, TypeError, ["eps", _type], _eps(_value))
    bad("eps", f"backward_{_name}", TypeError, ["eps", _type],
        lambda c, value=_value: rmsnorm.rms_norm_backward(
            c.grad(), c.x(), 3, c.weight(), eps=c.keep(value, "eps")))
bad("eps", "module_str", TypeError, ["eps", "str"], lambda c: c.module(3, eps="1e-5")(c.x()))
bad("eps", "gufunc_str", TypeError, ["forward", "input types"],
    lambda c: rmsnorm.forward(c.x(), c.weight(), "1e-5"))
bad("eps", "gufunc_per_row_wrong_length", ValueError, ["broadcast"],
    lambda c: rmsnorm.forward(c.x(), c.weight(), c.keep(np.full(3, 1e-5, F32))))

# ---- out= --------------------------------------------------------------------
def _forward_out(make_out):
    return lambda c: rmsnorm.forward(c.x(), c.weight(), F32(1e-5), out=make_out(c))


bad("out", "core_length", ValueError, ["output operand 0", "core dimension"],
    _forward_out(lambda c: c.out((2, 4))))
bad("out", "loop_shape", ValueError, ["broadcast", "(3,3)"],
    _forward_out(lambda c: c.out((3, 3))))
bad("out", "int32", TypeError, ["cast", "int32"], _forward_out(lambda c: c.out(dtype=np.int32)))
bad("out", "bool", TypeError, ["cast", "bool"], _forward_out(lambda c: c.out(dtype=bool)))
bad("out", "read_only", ValueError, ["read-only"],
    _forward_out(lambda c: c.read_only(np.zeros((2, 3), F32))))
bad("out", "list", TypeError, ["arrays"], lambda c: rmsnorm.forward(
    c.x(), c.weight(), F32(1e-5), out=[0.0] * 3))
bad("out", "backward_grad_input_read_only", ValueError, ["read-only"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight(), F32(0),
                               out=(c.read_only(np.zeros((2, 3), F32)), None)))
bad("out", "backward_grad_weight_length", ValueError, ["output operand 1", "core dimension"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight(), F32(0), out=(None, c.out((4,)))))
bad("out", "backward_grad_weight_int", TypeError, ["cast", "int64"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight(), F32(0),
                               out=(None, c.out((3,), np.int64))))
bad("out", "backward_three_outputs", ValueError, ["out", "one entry per ufunc output"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight(), F32(0),
                               out=(c.out(), c.out((3,)), c.out((3,)))))

# ---- grad_output -------------------------------------------------------------
for _shape_ in [(2, 4), (3, 3), (2, 3, 1), (3,), (1, 3)]:
    bad("grad_output", "shape_" + "x".join(map(str, _shape_)), ValueError,
        ["grad_output", str(_shape_)],
        lambda c, s=_shape_: rmsnorm.rms_norm_backward(c.grad(s), c.x(), 3, c.weight()))
bad("grad_output", "int64", TypeError, ["grad_output", "int64"],
    lambda c: rmsnorm.rms_norm_backward(c.keep(np.ones((2, 3), np.int64)), c.x(), 3))
bad("grad_output", "None", TypeError, ["grad_output"],
    lambda c: rmsnorm.rms_norm_backward(None, c.x(), 3))
bad("grad_output", "str", TypeError, ["grad_output", "<U3"],
    lambda c: rmsnorm.rms_norm_backward("abc", c.x(), 3))
bad("grad_output", "module_shape", ValueError, ["grad_output"],
    lambda c: (lambda layer: (layer(c.x()), layer.backward(c.grad((4, 3)))))(c.module(3)))
bad("grad_output", "gufunc_rows", ValueError, ["core dimension"],
    lambda c: rmsnorm.backward(c.grad((3, 3)), c.x(), c.weight(), F32(0)))

# ---- module: RMSNorm's own methods -----------------------------------------
bad("module", "backward_before_forward", ValueError, ["backward", "before forward"],
    lambda c: c.module(3).backward(c.grad()))
bad("module", "backward_before_forward_no_affine", ValueError, ["backward", "before forward"],
    lambda c: c.module(3, elementwise_affine=False).backward(c.grad()))
for _shape_ in [(4,), (1, 3), ()]:
    bad("module", "load_state_dict_shape_" + ("x".join(map(str, _shape_)) or "scalar"),
        ValueError, ["size mismatch for weight", str(_shape_)],
        lambda c, s=_shape_: c.module(3).load_state_dict({"weight": c.keep(np.ones(s, F32))}))
bad("module", "load_state_dict_missing_key", ValueError, ["missing key", '"weight"'],
    lambda c: c.module(3).load_state_dict({}))
bad("module", "load_state_dict_wrong_key", ValueError, ["missing key", "unexpected key", '"w"'],
    lambda c: c.module(3).load_state_dict({"w": c.keep(np.ones(3, F32))}))
bad("module", "load_state_dict_complex", ValueError, ["weight", "complex"],
    lambda c: c.module(3).load_state_dict({"weight": c.keep(np.ones(3, np.complex64))}))
bad("module", "load_state_dict_None", TypeError, ["state_dict", "NoneType"],
    lambda c: c.module(3).load_state_dict(None))
bad("module", "load_state_dict_list", TypeError, ["state_dict", "list"],
    lambda c: c.module(3).load_state_dict([1.0, 2.0, 3.0]))
bad("module", "dtype_int", TypeError, ["dtype", "int32"],
    lambda c: rmsnorm.RMSNorm(3, dtype=np.int32))
bad("module", "dtype_complex", TypeError, ["dtype", "complex"],
    lambda c: rmsnorm.RMSNorm(3, dtype=np.complex64))


# ---- threads: set_num_threads --------------------------------------------------
def _set_threads(value):
    def call(c):
        c.watch("get_num_threads()", rmsnorm.get_num_threads)
        return rmsnorm.set_num_threads(value)
    return call


for _name, _value in [("zero", 0), ("negative", -1), ("minus_8", -8), ("huge_negative", -2**80)]:
    bad("threads", _name, ValueError, ["set_num_threads", "positive"], _set_threads(_value))
for _name, _value in [("str", "2"), ("float", 2.0), ("non_integral", 1.5), ("None", None),
                      ("bool", True), ("list", [2])]:
    bad("threads", _name, TypeError, ["set_num_threads", "int", type(_value).__name__],
        _set_threads(_value))

# ---- gufunc: calling the gufuncs themselves wrongly --------------------------
bad("gufunc", "forward_missing_eps", TypeError, ["forward", "positional"],
    lambda c: rmsnorm.forward(c.x(), c.weight()))
bad("gufunc", "backward_missing_eps", TypeError, ["backward", "positional"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight()))
bad("gufunc", "backward_input_rows", ValueError, ["backward", "operand 1", "core dimension"],
    lambda c: rmsnorm.backward(c.grad(), c.x((3, 3)), c.weight(), F32(0)))
bad("gufunc", "backward_weight_too_long", ValueError, ["backward", "operand 2", "core dimension"],
    lambda c: rmsnorm.backward(c.grad(), c.x(), c.weight((4,)), F32(0)))
bad("gufunc", "backward_1d_input", ValueError, ["backward", "enough dimensions"],
    lambda c: rmsnorm.backward(c.grad((3,)), c.x((3,)), c.weight(), F32(0)))
bad("gufunc", "forward_bad_axes", ValueError, ["axes"],
    lambda c: rmsnorm.forward(c.x(), c.weight(), F32(0), axes=[(0,), (0,)]))
bad("gufunc", "forward_bad_casting", ValueError, ["casting"],
    lambda c: rmsnorm.forward(c.x(), c.weight(), F32(0), casting="sometimes"))


BAD_CASES = [case for cases in CATALOGUE.values() for case in cases]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_raises_naming_the_problem_and_changes_nothing(case, restore_num_threads):
    caller = Caller()
    with pytest.raises(case.error) as raised:
        case.call(caller)
    message = str(raised.value)
    missing = [name for name in case.names if name.lower() not in message.lower()]
    assert not missing, f"{type(raised.value).__name__}({message!r}) does not mention {missing}"
    caller.assert_unchanged()


def test_catalogue_has_at_least_40_cases_in_every_listed_category():
    assert len(BAD_CASES) >= 40
    listed = {"input", "dtype", "normalized_shape", "weight", "eps", "out", "grad_output",
              "module", "threads", "masked"}
    assert listed <= set(CATALOGUE), f"categories missing: {listed - set(CATALOGUE)}"


def test_caller_notices_a_changed_array():
    # The check itself must be able to fail: a write through a view shows.
    caller = Caller()
    buffer = np.zeros(4, F32)
    view = caller.keep(buffer[1:3])
    buffer[0] = 1.0
    with pytest.raises(AssertionError, match="buffer under"):
        caller.assert_unchanged()
    view[0] = 1.0
    with pytest.raises(AssertionError, match="was changed"):
        caller.assert_unchanged()


# ---------------------------------------------------------------------------
# torch's texts: a shape problem raises ValueError with torch 2.13's exact
# message, taken from torch at test time by making the same call on torch.
# ---------------------------------------------------------------------------

# (input shape, normalized_shape, weight shape or None): each is rejected by
# torch.nn.functional.rms_norm with a RuntimeError.
SHAPE_ERROR_CASES = [
    pytest.param((2, 3), [], None, id="empty_normalized_shape_list"),
    pytest.param((2, 3), (), None, id="empty_normalized_shape_tuple"),
    pytest.param((2, 3), [], (3,), id="empty_normalized_shape_with_weight"),
    pytest.param((2, 2, 3), [1, 2, 3], (1, 2), id="weight_1x2_for_normalized_shape_1x2x3"),
    pytest.param((2, 3), [3], (4,), id="weight_too_long"),
    pytest.param((2, 3), [3], (1, 3), id="weight_extra_dim"),
    pytest.param((2, 3), [2, 3], (3, 2), id="weight_transposed"),
    pytest.param((2, 3), [2, 3], (6,), id="weight_flattened"),
    pytest.param((2, 2, 3), [2, 2], None, id="input_not_ending_in_2x2"),
    pytest.param((2, 3), [4], None, id="input_last_dim_too_short"),
    pytest.param((3,), [2, 3], None, id="input_fewer_dims_than_normalized_shape"),
    pytest.param((2, 3, 4), [3], None, id="input_wrong_last_dim_3d"),
    pytest.param((), [1], None, id="scalar_input"),
    pytest.param((2, 3), [3, 1], (3, 1), id="input_without_trailing_1"),
    pytest.param((2,), [1, 2, 3], None, id="1d_input_for_3d_normalized_shape"),
    pytest.param((), [], None, id="scalar_input_empty_normalized_shape"),
    # Two problems at once: torch checks the weight before the input.
    pytest.param((2,), [1, 2, 3], (1, 2), id="bad_weight_and_too_few_input_dims"),
]


def torch_error_text(shape, normalized_shape, weight_shape):
    x = torch.zeros(shape)
    weight = None if weight_shape is None else torch.ones(weight_shape)
    # torch raises RuntimeError for most of these, but ValueError ("Input
    # tensor must have at least k dimensions") when the input has fewer dims
    # than normalized_shape; either way its text is what we must reproduce.
    with pytest.raises((RuntimeError, ValueError)) as torch_error:
        torch.nn.functional.rms_norm(x, list(normalized_shape), weight)
    return str(torch_error.value)


def _numpy_args(shape, weight_shape):
    x = np.zeros(shape, np.float32)
    weight = None if weight_shape is None else np.ones(weight_shape, np.float32)
    return x, weight


@needs_torch
@pytest.mark.parametrize("shape, normalized_shape, weight_shape", SHAPE_ERROR_CASES)
def test_rms_norm_shape_error_has_torchs_text(shape, normalized_shape, weight_shape):
    expected = torch_error_text(shape, normalized_shape, weight_shape)
    x, weight = _numpy_args(shape, weight_shape)
    with pytest.raises(ValueError) as ours:
        rmsnorm.rms_norm(x, normalized_shape, weight)
    assert str(ours.value) == expected


@needs_torch
@pytest.mark.parametrize("shape, normalized_shape, weight_shape", SHAPE_ERROR_CASES)
def test_rms_norm_backward_shape_error_has_torchs_text(shape, normalized_shape, weight_shape):
    expected = torch_error_text(shape, normalized_shape, weight_shape)
    x, weight = _numpy_args(shape, weight_shape)
    with pytest.raises(ValueError) as ours:
        rmsnorm.rms_norm_backward(np.ones_like(x), x, normalized_shape, weight)
    assert str(ours.value) == expected


@needs_torch
def test_documented_error_texts_are_torchs():
    # The three texts of the spec, as torch 2.13 actually words them.
    assert torch_error_text((2, 3), [], None) == (
        "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least "
        "one element, but got normalized_shape = []")
    assert torch_error_text((2, 2, 3), [1, 2, 3], (1, 2)) == (
        "Expected weight to be of same shape as normalized_shape, but got weight of shape "
        "[1, 2] and normalized_shape = [1, 2, 3]")
    assert torch_error_text((2, 2, 3), [2, 2], None).startswith(
        "Given normalized_shape=[2, 2], expected input with shape [*")
    assert torch_error_text((2, 2, 3), [2, 2], None).endswith("but got input of size[2, 2, 3]")


@needs_torch
@pytest.mark.parametrize("normalized_shape, input_shape", [
    pytest.param([], (2, 3), id="empty_normalized_shape"),
    pytest.param((4,), (2, 3), id="input_last_dim_mismatch"),
    pytest.param((2, 3), (3,), id="input_fewer_dims"),
])
def test_module_forward_shape_error_has_torchs_text(normalized_shape, input_shape):
    with pytest.raises((RuntimeError, ValueError)) as torch_error:
        torch.nn.RMSNorm(normalized_shape)(torch.zeros(input_shape))
    with pytest.raises(ValueError) as ours:
        module = rmsnorm.RMSNorm(normalized_shape)
        module(np.zeros(input_shape, np.float32))
    assert str(ours.value) == str(torch_error.value)


# ---------------------------------------------------------------------------
# load_state_dict refuses what torch's refuses, in torch's words.
# ---------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("bad_shape", [(4,), (1, 5), (5, 1), ()])
def test_load_state_dict_rejects_a_weight_of_another_shape(bad_shape):
    module = rmsnorm.RMSNorm(5)
    with pytest.raises(RuntimeError) as torch_error:
        torch.nn.RMSNorm(5).load_state_dict({"weight": torch.ones(bad_shape)})
    assert "size mismatch for weight" in str(torch_error.value)
    with pytest.raises(ValueError, match="size mismatch for weight"):
        module.load_state_dict({"weight": np.ones(bad_shape, np.float32)})
    assert np.array_equal(module.weight, np.ones(5, np.float32)), "weight changed by a failed load"


@needs_torch
def test_load_state_dict_rejects_a_torch_weight_of_another_shape():
    module = rmsnorm.RMSNorm((2, 3))
    with pytest.raises(ValueError, match="size mismatch for weight"):
        module.load_state_dict(torch.nn.RMSNorm((3, 2)).state_dict())


@needs_torch
def test_load_state_dict_without_weight_key_reports_missing_keys():
    with pytest.raises(RuntimeError) as torch_error:
        torch.nn.RMSNorm(5).load_state_dict({})
    assert "Missing key(s)" in str(torch_error.value)
    with pytest.raises(ValueError, match=r"Missing key\(s\)"):
        rmsnorm.RMSNorm(5).load_state_dict({})


# ---------------------------------------------------------------------------
# The raw-buffer entry points that rmsnorm.torch calls (csrc/numpy/buffers.c)
# trust the addresses they are given, but refuse malformed arguments before
# any kernel runs: none of these reaches an address.
# ---------------------------------------------------------------------------

_FORWARD_ARGS = (2, 1, 4, 1e-6, 0.0, 0, 0, 0, None, None)  # float32, 1 row of 4
_BACKWARD_ARGS = (2, 1, 4, 1e-6, 0.0, 0, 0, 0, 0, 0, None)


def _with(args, index, value):
    return args[:index] + (value,) + args[index + 1 :]


@pytest.mark.parametrize(
    "name, args, error, text",
    [
        pytest.param("_forward_buffers", _FORWARD_ARGS[:-1], TypeError,
                     r"takes 10 arguments \(9 given\)", id="forward_one_argument_short"),
        pytest.param("_backward_buffers", _BACKWARD_ARGS + (None,), TypeError,
                     r"takes 11 arguments \(12 given\)", id="backward_one_argument_over"),
        pytest.param("_forward_buffers", _with(_FORWARD_ARGS, 0, 99), ValueError,
                     "no kernel problem: type 99", id="unknown_type"),
        pytest.param("_forward_buffers", _with(_FORWARD_ARGS, 1, -1), ValueError,
                     "no kernel problem", id="negative_rows"),
        pytest.param("_backward_buffers", _with(_BACKWARD_ARGS, 2, 0), ValueError,
                     "no kernel problem", id="rows_of_no_elements"),
        pytest.param("_forward_buffers", _with(_FORWARD_ARGS, 3, "1e-6"), TypeError,
                     "real number", id="eps_a_string"),
        pytest.param("_forward_buffers", _with(_FORWARD_ARGS, 5, (0, 16)), TypeError,
                     "a matrix is an address or", id="matrix_without_its_element_stride"),
        pytest.param("_forward_buffers", _with(_FORWARD_ARGS, 6, (0, 4, 4)), TypeError,
                     "a vector is an address or", id="vector_with_a_row_stride"),
        pytest.param("_backward_buffers", _with(_BACKWARD_ARGS, 5, (0, "16", 4)), TypeError,
                     "integer", id="stride_not_an_integer"),
        pytest.param("_advise_huge_pages", (0,), TypeError,
                     r"takes 2 arguments \(1 given\)", id="advice_without_its_size"),
        pytest.param("_advise_huge_pages", (0, -1), OverflowError,
                     "negative", id="advice_of_a_negative_size"),
    ],
)
def test_raw_buffer_entry_points_refuse_malformed_arguments(name, args, error, text):
    with pytest.raises(error, match=text):
        getattr(rmsnorm._core, name)(*args)
