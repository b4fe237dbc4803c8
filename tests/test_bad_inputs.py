"""The catalogue of bad inputs: each is refused with a TypeError or ValueError
whose message names the problem, and no caller array changes, bit for bit.

Every case builds its arguments through a :class:`Caller` (caller_state.py),
which snapshots each array (and the buffer it views) the moment the case
makes it, that is before the call. After the call has raised, every snapshot must still match.
A case that needs a library change first is marked ``xfail(strict=True)``
with the patch it waits for, so that it flips to a failure (and the mark is
removed) once the patch lands.

The odd-but-valid inputs, which must give right answers, are in
``test_odd_inputs.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import rmsnorm
from caller_state import Caller


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
for _name in ["complex128", "object", "str", "datetime64"]:
    # The gufunc itself: NumPy's own refusal, since no loop takes the type.
    bad("dtype", f"gufunc_{_name}", TypeError, ["forward", "input types"],
        lambda c, make=NON_FLOATING[_name]: rmsnorm.forward(
            c.keep(make(), "x"), c.keep(np.ones(3)), 1e-5))
bad("dtype", "backward_int64_input", TypeError, ["input", "int64"],
    lambda c: rmsnorm.rms_norm_backward(c.grad(), c.keep(np.ones((2, 3), np.int64)), 3))

# ---- normalized_shape ------------------------------------------------------
bad("normalized_shape", "float", TypeError, ["normalized_shape", "float"], _shape(3.0))
bad("normalized_shape", "float_element", TypeError, ["normalized_shape", "float"], _shape((3.0,)))
bad("normalized_shape", "non_integral", TypeError, ["normalized_shape", "float"], _shape([1.5]))
bad("normalized_shape", "negative", ValueError, ["normalized_shape=[-3]"], _shape(-3))
bad("normalized_shape", "negative_element", ValueError, ["normalized_shape=[2, -3]"],
    _shape((2, -3)))
bad("normalized_shape", "str", TypeError, ["normalized_shape", "str"], _shape("3"))
bad("normalized_shape", "str_element", TypeError, ["normalized_shape", "str"], _shape(("3",)))
bad("normalized_shape", "nested_tuple", TypeError, ["normalized_shape", "tuple"], _shape(((3,),)))
bad("normalized_shape", "nested_list", TypeError, ["normalized_shape", "list"], _shape([[2, 3]]))
bad("normalized_shape", "None", TypeError, ["normalized_shape", "NoneType"], _shape(None))
bad("normalized_shape", "None_element", TypeError, ["normalized_shape", "NoneType"],
    _shape((None,)))
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
bad("normalized_shape", "module_None", TypeError, ["normalized_shape"],
    lambda c: rmsnorm.RMSNorm(None))
bad("normalized_shape", "module_negative", ValueError, ["negative"],
    lambda c: rmsnorm.RMSNorm(-3))
bad("normalized_shape", "backward_float", TypeError, ["normalized_shape", "float"],
    lambda c: rmsnorm.rms_norm_backward(c.grad(), c.x(), 3.0))

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
bad("eps", "str", TypeError, ["eps", "str"], _eps("1e-5"))
bad("eps", "bytes", TypeError, ["eps", "bytes"], _eps(b"1e-5"))
bad("eps", "list", TypeError, ["eps", "list"], _eps([1e-5]))
bad("eps", "array", TypeError, ["eps", "ndarray"], _eps(np.array([1e-5, 1e-5])))
bad("eps", "0d_array", TypeError, ["eps", "ndarray"], _eps(np.array(1e-5)))
bad("eps", "complex", TypeError, ["eps", "complex"], _eps(1e-5j))
bad("eps", "numpy_complex", TypeError, ["eps", "complex"], _eps(np.complex128(1e-5)))
bad("eps", "bool", TypeError, ["eps", "bool"], _eps(True))
bad("eps", "dict", TypeError, ["eps", "dict"], _eps({"eps": 1e-5}))
bad("eps", "backward_str", TypeError, ["eps", "str"],
    lambda c: rmsnorm.rms_norm_backward(c.grad(), c.x(), 3, c.weight(), "1e-5"))
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


for _name, _value in [("zero", 0), ("negative", -1), ("huge_negative", -2**80)]:
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
