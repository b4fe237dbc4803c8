"""rmsnorm.RMSNorm mirrors torch.nn.RMSNorm: repr, init, parameters,
gradient accumulation, state_dict. Values it computes are checked against
torch (parity) or the float64 reference."""

from __future__ import annotations

import copy
import gc
import pickle
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch

import rmsnorm
from rmsnorm import reference
from closeness import assert_close_ulp, assert_forward_close, assert_grad_close
from supported_dtypes import NUMPY_DTYPES, WIDE_DTYPES

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


REPR_CONFIGS = [
    pytest.param(dict(normalized_shape=5), id="int"),
    pytest.param(dict(normalized_shape=[2, 3], eps=1e-5, elementwise_affine=False),
                 id="list-eps=1e-5-no_weight"),
    pytest.param(dict(normalized_shape=(2, 3, 4), eps=1e-6), id="tuple3-eps=1e-6"),
    pytest.param(dict(normalized_shape=7, eps=-0.5), id="eps=-0.5"),
    pytest.param(dict(normalized_shape=(3,), eps=0.5, elementwise_affine=True), id="eps=0.5"),
    pytest.param(dict(normalized_shape=1000, eps=None, elementwise_affine=False),
                 id="eps=None-no_weight"),
]


@pytest.mark.parametrize("config", REPR_CONFIGS)
def test_repr_is_exactly_torchs(config):
    ours = rmsnorm.RMSNorm(**config)
    theirs = torch.nn.RMSNorm(**config)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("config", REPR_CONFIGS)
def test_extra_repr_is_exactly_torchs(config):
    assert rmsnorm.RMSNorm(**config).extra_repr() == torch.nn.RMSNorm(**config).extra_repr()


def test_repr_of_the_documented_example():
    assert repr(rmsnorm.RMSNorm(5)) == "RMSNorm((5,), eps=None, elementwise_affine=True)"


def test_repr_with_float64_dtype_is_torchs():
    ours = rmsnorm.RMSNorm((2, 3), eps=1e-5, dtype=np.float64)
    theirs = torch.nn.RMSNorm((2, 3), eps=1e-5, dtype=torch.float64)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("normalized_shape, expected", [
    (5, (5,)), ([2, 3], (2, 3)), ((4,), (4,)), ((2, 3, 4), (2, 3, 4)),
])
def test_normalized_shape_is_stored_as_a_tuple_like_torch(normalized_shape, expected):
    ours = rmsnorm.RMSNorm(normalized_shape)
    assert ours.normalized_shape == expected
    assert type(ours.normalized_shape) is tuple
    assert ours.normalized_shape == torch.nn.RMSNorm(normalized_shape).normalized_shape


@pytest.mark.parametrize("eps", [None, 1e-6, -0.5])
@pytest.mark.parametrize("affine", [True, False])
def test_attributes_hold_the_configuration(eps, affine):
    ours = rmsnorm.RMSNorm(4, eps=eps, elementwise_affine=affine)
    assert ours.eps == eps
    assert ours.elementwise_affine is affine


@pytest.mark.parametrize("normalized_shape", [5, (2, 3)])
def test_weight_starts_as_float32_ones_like_torch(normalized_shape):
    ours = rmsnorm.RMSNorm(normalized_shape)
    theirs = torch.nn.RMSNorm(normalized_shape).weight.detach().numpy()
    assert isinstance(ours.weight, np.ndarray)
    assert ours.weight.dtype == np.float32 == theirs.dtype
    assert ours.weight.shape == theirs.shape
    assert np.array_equal(ours.weight, theirs)


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_weight_takes_the_dtype_argument(dtype):
    ours = rmsnorm.RMSNorm((2, 3), dtype=dtype)
    assert ours.weight.dtype == dtype
    assert np.array_equal(ours.weight, np.ones((2, 3)))


def test_weight_is_none_without_elementwise_affine():
    ours = rmsnorm.RMSNorm(5, elementwise_affine=False)
    assert ours.weight is None
    assert ours.weight_grad is None


def test_weight_grad_is_none_before_any_backward():
    assert rmsnorm.RMSNorm(5).weight_grad is None


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_reset_parameters_sets_weight_back_to_ones(dtype):
    ours = rmsnorm.RMSNorm((2, 3), dtype=dtype)
    ours.weight[...] = np.arange(6).reshape(2, 3)
    ours.reset_parameters()
    assert ours.weight.dtype == dtype
    assert ours.weight.shape == (2, 3)
    assert np.array_equal(ours.weight, np.ones((2, 3)))


def test_reset_parameters_without_weight_keeps_weight_none():
    ours = rmsnorm.RMSNorm(3, elementwise_affine=False)
    ours.reset_parameters()
    assert ours.weight is None


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_call_and_forward_match_the_functional(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(dtype)
    ours = rmsnorm.RMSNorm((4, 5), eps=1e-5, dtype=dtype)
    ours.weight[...] = rng.standard_normal((4, 5))
    expected = rmsnorm.rms_norm(x, (4, 5), ours.weight, 1e-5)
    assert np.array_equal(ours(x), expected)
    assert np.array_equal(ours.forward(x), expected)


# ---------------------------------------------------------------------------
# backward: gradient accumulation and zero_grad, against torch.
# ---------------------------------------------------------------------------

def _torch_module_pair(normalized_shape, dtype, eps=None, affine=True, seed=0):
    rng = np.random.default_rng(seed)
    ours = rmsnorm.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine, dtype=dtype)
    theirs = torch.nn.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine,
                              dtype=TORCH_DTYPE[np.dtype(dtype)])
    if affine:
        weight = rng.standard_normal(ours.weight.shape).astype(dtype)
        ours.weight[...] = weight
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(weight))
    return ours, theirs


def _torch_step(module, x, grad_output):
    x_t = torch.from_numpy(x).clone().requires_grad_()
    module(x_t).backward(torch.from_numpy(grad_output))
    return x_t.grad.numpy()


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_accumulates_weight_grad_over_two_calls_like_torch(dtype):
    ours, theirs = _torch_module_pair(6, dtype, eps=1e-5)
    rng = np.random.default_rng(1)
    steps = [(rng.standard_normal((4, 6)).astype(dtype), rng.standard_normal((4, 6)).astype(dtype))
             for _ in range(2)]
    for step, (x, grad_output) in enumerate(steps):
        grad_input_torch = _torch_step(theirs, x, grad_output)
        ours(x)
        grad_input = ours.backward(grad_output)
        assert_grad_close(grad_input, grad_input_torch, what=f"grad_input of step {step}")
        assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(),
                          what=f"accumulated weight_grad after step {step}")

    # After two steps it is the sum of two different gradients, not the last one.
    _, last_only = reference.rms_norm_backward(steps[1][1], steps[1][0], (6,), ours.weight, 1e-5)
    assert not np.allclose(ours.weight_grad, last_only, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_zero_grad_clears_weight_grad_and_the_next_backward_starts_fresh(dtype):
    ours, theirs = _torch_module_pair((2, 3), dtype)
    rng = np.random.default_rng(2)
    x1, g1, x2, g2 = (rng.standard_normal((5, 2, 3)).astype(dtype) for _ in range(4))
    ours(x1)
    ours.backward(g1)
    assert ours.weight_grad is not None
    ours.zero_grad()
    assert ours.weight_grad is None

    _torch_step(theirs, x1, g1)
    theirs.zero_grad()
    assert theirs.weight.grad is None
    _torch_step(theirs, x2, g2)
    ours(x2)
    ours.backward(g2)
    assert ours.weight_grad.shape == (2, 3) and ours.weight_grad.dtype == dtype
    assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="weight_grad")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_backward_uses_the_most_recent_forward(dtype):
    ours = rmsnorm.RMSNorm(8, eps=1e-5, dtype=dtype)
    rng = np.random.default_rng(3)
    x_old, x_new, grad_output = (rng.standard_normal((3, 8)).astype(dtype) for _ in range(3))
    ours(x_old)
    ours(x_new)
    grad_input = ours.backward(grad_output)
    expected, expected_gw = reference.rms_norm_backward(grad_output, x_new, (8,), ours.weight, 1e-5)
    rtol, atol = (1e-5, 1e-5) if dtype == np.float32 else (1e-12, 1e-12)
    assert_close_ulp(grad_input, expected, rtol=rtol, atol=atol, check_dtype=False,
                     what="grad_input for the latest forward")
    assert_close_ulp(ours.weight_grad, expected_gw, rtol=rtol, atol=atol, check_dtype=False,
                     what="weight_grad for the latest forward")


def test_backward_without_weight_returns_grad_input_and_leaves_weight_grad_none():
    ours, theirs = _torch_module_pair(5, np.float32, affine=False)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    grad_output = rng.standard_normal((2, 5)).astype(np.float32)
    ours(x)
    grad_input = ours.backward(grad_output)
    assert_grad_close(grad_input, _torch_step(theirs, x, grad_output), what="grad_input")
    assert ours.weight_grad is None


# ---------------------------------------------------------------------------
# state_dict round trips with torch.
# ---------------------------------------------------------------------------

def test_state_dict_holds_the_weight_under_key_weight():
    ours = rmsnorm.RMSNorm((2, 3))
    state = ours.state_dict()
    assert list(state) == ["weight"]
    assert isinstance(state["weight"], np.ndarray)
    assert np.array_equal(state["weight"], np.ones((2, 3), np.float32))
    assert state["weight"].dtype == np.float32


def test_state_dict_is_empty_without_weight_like_torch():
    assert dict(rmsnorm.RMSNorm(3, elementwise_affine=False).state_dict()) == {}
    assert dict(torch.nn.RMSNorm(3, elementwise_affine=False).state_dict()) == {}


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_torch_state_dict_loads_into_ours(dtype):
    theirs = torch.nn.RMSNorm((3, 4), eps=1e-5, dtype=TORCH_DTYPE[np.dtype(dtype)])
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
    ours = rmsnorm.RMSNorm((3, 4), eps=1e-5, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    assert isinstance(ours.weight, np.ndarray)
    assert ours.weight.dtype == dtype
    assert np.array_equal(ours.weight, theirs.weight.detach().numpy())

    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(dtype)
    assert_forward_close(ours(x), theirs(torch.from_numpy(x)).detach().numpy(),
                         what="output after loading torch's state_dict")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_our_state_dict_loads_into_torch(dtype):
    ours = rmsnorm.RMSNorm(6, dtype=dtype)
    weight = np.random.default_rng(6).standard_normal(6).astype(dtype)
    ours.weight[...] = weight
    theirs = torch.nn.RMSNorm(6, dtype=TORCH_DTYPE[np.dtype(dtype)])
    result = theirs.load_state_dict({"weight": torch.from_numpy(ours.state_dict()["weight"])})
    assert not result.missing_keys and not result.unexpected_keys
    assert np.array_equal(theirs.weight.detach().numpy(), weight)


def test_state_dict_round_trip_through_torch_is_lossless():
    ours = rmsnorm.RMSNorm((2, 5), eps=1e-6)
    weight = np.random.default_rng(7).standard_normal((2, 5)).astype(np.float32)
    ours.weight[...] = weight
    theirs = torch.nn.RMSNorm((2, 5), eps=1e-6)
    theirs.load_state_dict({"weight": torch.from_numpy(ours.state_dict()["weight"])})
    back = rmsnorm.RMSNorm((2, 5), eps=1e-6)
    back.load_state_dict(theirs.state_dict())
    assert np.array_equal(back.weight, weight)


@pytest.mark.parametrize("source", ["list", "float64_array", "tuple"])
def test_load_state_dict_accepts_anything_asarray_takes_and_keeps_the_dtype(source):
    values = [0.5, -1.25, 3.0]
    weight = {"list": values, "float64_array": np.array(values), "tuple": tuple(values)}[source]
    ours = rmsnorm.RMSNorm(3)
    ours.load_state_dict({"weight": weight})
    assert ours.weight.dtype == np.float32
    assert np.array_equal(ours.weight, np.array(values, np.float32))


def test_load_state_dict_copies_the_weight():
    source = np.array([1.0, 2.0, 3.0], np.float32)
    ours = rmsnorm.RMSNorm(3)
    ours.load_state_dict({"weight": source})
    source[0] = 99.0
    assert ours.weight[0] == 1.0


# Each case: the layer's affine flag, the state dict (as NumPy arrays), strict.
LOAD_CASES = {
    "all_keys": (True, {"weight": np.array([0.5, 2.0, -1.0], np.float32)}, True),
    "missing_weight_not_strict": (True, {}, False),
    "unexpected_key_not_strict": (
        True, {"weight": np.array([0.5, 2.0, -1.0], np.float32), "bias": np.zeros(3)}, False),
    "renamed_key_not_strict": (True, {"w": np.ones(3, np.float32)}, False),
    "weight_into_weightless_not_strict": (False, {"weight": np.ones(3, np.float32)}, False),
    "bool_weight": (True, {"weight": np.array([True, False, True])}, True),
    "int_weight": (True, {"weight": np.array([3, -2, 0], np.int64)}, True),
}


@pytest.mark.parametrize("case", LOAD_CASES)
def test_load_state_dict_returns_and_loads_what_torch_does(case):
    affine, state, strict = LOAD_CASES[case]
    theirs = torch.nn.RMSNorm(3, elementwise_affine=affine)
    ours = rmsnorm.RMSNorm(3, elementwise_affine=affine)
    expected = theirs.load_state_dict(
        {key: torch.from_numpy(value) for key, value in state.items()}, strict=strict)
    result = ours.load_state_dict(state, strict=strict)
    assert result.missing_keys == expected.missing_keys
    assert result.unexpected_keys == expected.unexpected_keys
    assert repr(result).endswith(repr(expected).removeprefix("_"))
    if affine:
        assert np.array_equal(ours.weight, theirs.weight.detach().numpy())
        assert ours.weight.dtype == np.float32


def test_load_state_dict_strict_still_refuses_a_missing_key_that_strict_false_allows():
    with pytest.raises(ValueError, match=r"Missing key\(s\)"):
        rmsnorm.RMSNorm(3).load_state_dict({}, strict=True)
    assert rmsnorm.RMSNorm(3).load_state_dict({}, strict=False).missing_keys == ["weight"]


def test_load_state_dict_assign_takes_the_checkpoint_dtype_like_torch():
    theirs = torch.nn.RMSNorm(3)
    theirs.load_state_dict({"weight": torch.ones(3, dtype=torch.float64)}, assign=True)
    ours = rmsnorm.RMSNorm(3)
    ours.load_state_dict({"weight": np.ones(3, np.float64)}, assign=True)
    assert str(ours.weight.dtype) == str(theirs.weight.dtype).removeprefix("torch.")

# ---------------------------------------------------------------------------
# torch.nn.Module's surface without autograd, side by side with torch:
# parameters, requires_grad_, train/eval, dtype conversions, zero_grad,
# the checked weight, one backward per forward, pickling and copying.
# ---------------------------------------------------------------------------

BF16 = rmsnorm._dtypes.BF16
needs_bfloat16 = pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes")


def _step_both(ours, theirs, seed, shape=(4, 6)):
    """One forward and backward of each module on the same random batch."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if ours.weight is None else ours.weight.dtype
    x = rng.standard_normal(shape).astype(dtype)
    grad_output = rng.standard_normal(shape).astype(dtype)
    ours(x)
    return ours.backward(grad_output), _torch_step(theirs, x, grad_output)


def _raised(call):
    """The exception ``call()`` raises (the test fails if it raises none)."""
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("prefix", ["", "norm", "model.layers.0"])
def test_named_parameters_have_torchs_names_and_values(affine, prefix):
    ours, theirs = _torch_module_pair((2, 3), np.float32, affine=affine)
    named = list(ours.named_parameters(prefix=prefix))
    named_torch = list(theirs.named_parameters(prefix=prefix))
    assert [name for name, _ in named] == [name for name, _ in named_torch]
    for (_, value), (_, value_torch) in zip(named, named_torch):
        assert value is ours.weight
        assert np.array_equal(value, value_torch.detach().numpy())


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
def test_parameters_are_the_weight_like_torch(affine):
    ours, theirs = _torch_module_pair(5, np.float32, affine=affine)
    parameters = list(ours.parameters())
    assert len(parameters) == len(list(theirs.parameters()))
    assert all(parameter is ours.weight for parameter in parameters)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
def test_state_dict_keys_are_the_parameter_names_like_torch(affine):
    ours, theirs = _torch_module_pair(5, np.float32, affine=affine)
    assert list(ours.state_dict()) == [name for name, _ in ours.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.parametrize("requires_grad", [False, True])
def test_requires_grad_sets_the_flag_and_returns_the_module_like_torch(requires_grad):
    ours, theirs = _torch_module_pair(4, np.float32)
    assert ours.weight_requires_grad is theirs.weight.requires_grad is True
    assert ours.requires_grad_(requires_grad) is ours
    assert theirs.requires_grad_(requires_grad) is theirs
    assert ours.weight_requires_grad is theirs.weight.requires_grad is requires_grad
    assert ours.requires_grad_() is ours and ours.weight_requires_grad is True


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_without_requires_grad_backward_accumulates_no_weight_grad_like_torch(dtype):
    ours, theirs = _torch_module_pair(6, dtype, eps=1e-5)
    ours.requires_grad_(False)
    theirs.requires_grad_(False)
    grad_input, grad_input_torch = _step_both(ours, theirs, seed=10)
    assert ours.weight_grad is None and theirs.weight.grad is None
    assert_grad_close(grad_input, grad_input_torch, what="grad_input without requires_grad")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_requires_grad_off_keeps_the_gradient_so_far_and_on_again_adds_to_it_like_torch(dtype):
    ours, theirs = _torch_module_pair(6, dtype, eps=1e-5)
    _step_both(ours, theirs, seed=11)
    first = ours.weight_grad.copy()
    ours.requires_grad_(False)
    theirs.requires_grad_(False)
    _step_both(ours, theirs, seed=12)
    assert np.array_equal(ours.weight_grad, first)
    assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="kept weight_grad")
    ours.requires_grad_(True)
    theirs.requires_grad_(True)
    _step_both(ours, theirs, seed=13)
    assert not np.array_equal(ours.weight_grad, first)
    assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="weight_grad again")


@pytest.mark.parametrize("requires_grad", [1, 0, None, "yes"], ids=repr)
def test_requires_grad_rejects_a_non_bool_like_torch(requires_grad):
    ours, theirs = _torch_module_pair(4, np.float32)
    error = _raised(lambda: ours.requires_grad_(requires_grad))
    error_torch = _raised(lambda: theirs.requires_grad_(requires_grad))
    assert type(error) is type(error_torch) is TypeError
    assert str(error) == str(error_torch)
    assert ours.weight_requires_grad is True


TRAIN_EVAL_SEQUENCES = {
    "eval": [("eval",)],
    "train": [("train",)],
    "train(False)": [("train", False)],
    "eval-train": [("eval",), ("train",)],
    "train(False)-train(True)": [("train", False), ("train", True)],
    "eval-eval-train(True)-train(False)": [("eval",), ("eval",), ("train", True),
                                           ("train", False)],
}


@pytest.mark.parametrize("sequence", TRAIN_EVAL_SEQUENCES.values(), ids=TRAIN_EVAL_SEQUENCES)
def test_training_flag_follows_torchs_through_train_and_eval(sequence):
    ours, theirs = rmsnorm.RMSNorm(3), torch.nn.RMSNorm(3)
    assert ours.training is theirs.training is True
    for method, *args in sequence:
        assert getattr(ours, method)(*args) is ours
        getattr(theirs, method)(*args)
        assert ours.training is theirs.training, f"after {method}{tuple(args)}"


@pytest.mark.parametrize("mode", [1, 0, None, "yes", 1.0, np.True_], ids=repr)
def test_train_rejects_a_non_bool_mode_like_torch(mode):
    ours, theirs = rmsnorm.RMSNorm(3), torch.nn.RMSNorm(3)
    error = _raised(lambda: ours.train(mode))
    error_torch = _raised(lambda: theirs.train(mode))
    assert type(error) is type(error_torch) is ValueError
    assert str(error) == str(error_torch) == "training mode is expected to be boolean"
    assert ours.training is True


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_eval_mode_computes_what_training_mode_does_like_torch(dtype):
    ours, theirs = _torch_module_pair(6, dtype, eps=1e-5)
    x = np.random.default_rng(14).standard_normal((3, 6)).astype(dtype)
    training = ours(x)
    assert np.array_equal(ours.eval()(x), training)
    assert_forward_close(training, theirs.eval()(torch.from_numpy(x)).detach().numpy(),
                         what="output in eval mode")


def _torch_dtype_name(tensor):
    return str(tensor.dtype).removeprefix("torch.")


CONVERSIONS = {
    "half": (lambda m: m.half(), lambda m: m.half()),
    "float": (lambda m: m.float(), lambda m: m.float()),
    "double": (lambda m: m.double(), lambda m: m.double()),
    "bfloat16": (lambda m: m.bfloat16(), lambda m: m.bfloat16()),
    "to(float16)": (lambda m: m.to(np.float16), lambda m: m.to(torch.float16)),
    "to(float32)": (lambda m: m.to("float32"), lambda m: m.to(torch.float32)),
    "to(float64)": (lambda m: m.to(np.dtype(np.float64)), lambda m: m.to(torch.float64)),
    "to(bfloat16)": (lambda m: m.to("bfloat16"), lambda m: m.to(torch.bfloat16)),
}
parametrize_conversion = pytest.mark.parametrize("conversion", [
    pytest.param(name, marks=[needs_bfloat16] if "bfloat16" in name else [])
    for name in CONVERSIONS
])


@parametrize_conversion
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_conversion_gives_the_weight_torchs_dtype_and_values(conversion, dtype):
    ours, theirs = _torch_module_pair((2, 3), dtype)
    convert, convert_torch = CONVERSIONS[conversion]
    assert convert(ours) is ours
    assert convert_torch(theirs) is theirs
    assert isinstance(ours.weight, np.ndarray)
    assert ours.weight.dtype.name == _torch_dtype_name(theirs.weight)
    assert np.array_equal(ours.weight.astype(np.float64),
                          theirs.weight.detach().double().numpy())


@parametrize_conversion
def test_conversion_converts_weight_grad_like_torch(conversion):
    ours, theirs = _torch_module_pair(6, np.float32, eps=1e-5)
    _step_both(ours, theirs, seed=15)
    convert, convert_torch = CONVERSIONS[conversion]
    convert(ours)
    convert_torch(theirs)
    assert ours.weight_grad.dtype.name == _torch_dtype_name(theirs.weight.grad)
    assert ours.weight_grad.dtype == ours.weight.dtype
    assert_close_ulp(ours.weight_grad.astype(np.float64),
                     theirs.weight.grad.double().numpy(), rtol=1e-5, atol=1e-5,
                     what="converted weight_grad")


@parametrize_conversion
def test_conversion_without_weight_returns_the_module_like_torch(conversion):
    ours = rmsnorm.RMSNorm(3, elementwise_affine=False)
    theirs = torch.nn.RMSNorm(3, elementwise_affine=False)
    convert, convert_torch = CONVERSIONS[conversion]
    assert convert(ours) is ours and convert_torch(theirs) is theirs
    assert ours.weight is None and theirs.weight is None


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_conversion_to_the_same_dtype_keeps_the_weight_like_torch(dtype):
    ours, theirs = _torch_module_pair(4, dtype)
    before, before_torch = ours.weight, theirs.weight.data_ptr()
    ours.to(dtype)
    theirs.to(TORCH_DTYPE[np.dtype(dtype)])
    assert ours.weight is before
    assert theirs.weight.data_ptr() == before_torch


def test_conversion_leaves_a_weight_held_outside_unchanged():
    ours = rmsnorm.RMSNorm(3)
    ours.weight[...] = [0.1, 0.2, 0.3]
    held = ours.weight
    ours.half()
    assert held.dtype == np.float32
    assert np.array_equal(held, np.array([0.1, 0.2, 0.3], np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_conversion_to_a_non_floating_dtype_is_a_type_error_like_torch(dtype):
    ours, theirs = _torch_module_pair(3, np.float32)
    error = _raised(lambda: ours.to(dtype))
    error_torch = _raised(lambda: theirs.to(getattr(torch, np.dtype(dtype).name)))
    assert type(error) is type(error_torch) is TypeError
    name = np.dtype(dtype).name
    assert name in str(error) and name in str(error_torch)
    assert ours.weight.dtype == np.float32


def test_conversion_to_complex_is_a_type_error_as_the_kernels_are_real():
    # torch takes it (complex modules are experimental there); RMSNorm's loops are real.
    with pytest.raises(TypeError, match="complex64"):
        rmsnorm.RMSNorm(3).to(np.complex64)


def test_bfloat16_without_ml_dtypes_says_how_to_get_it():
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import rmsnorm\n"
        "layer = rmsnorm.RMSNorm(4)\n"
        "for convert in (layer.bfloat16, lambda: layer.to('bfloat16')):\n"
        "    try:\n"
        "        convert()\n"
        "    except ImportError as error:\n"
        "        assert 'ml_dtypes' in str(error), error\n"
        "    else:\n"
        "        raise SystemExit('no ImportError')\n"
        "assert layer.weight.dtype == 'float32'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("conversion", ["double", "half"])
def test_backward_after_a_conversion_uses_the_saved_input_like_torch(conversion):
    ours, theirs = _torch_module_pair(6, np.float32, eps=1e-5)
    rng = np.random.default_rng(16)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    grad_output = rng.standard_normal((4, 6)).astype(np.float32)
    x_t = torch.from_numpy(x).clone().requires_grad_()
    y_t = theirs(x_t)
    ours(x)
    getattr(ours, conversion)()
    getattr(theirs, conversion)()
    y_t.backward(torch.from_numpy(grad_output))
    grad_input = ours.backward(grad_output)
    # The input's gradient keeps the input's dtype in both; ours is computed
    # with the converted weight (rounded, for half), torch's with the one the
    # forward used.
    assert grad_input.dtype == np.float32 == x_t.grad.numpy().dtype
    tolerance = 1e-5 if conversion == "double" else 2e-3
    assert_close_ulp(grad_input, x_t.grad.numpy(), rtol=tolerance, atol=tolerance,
                     what=f"grad_input after {conversion}()")
    # torch gives the gradient the forward's weight dtype; ours has the weight's.
    assert ours.weight_grad.dtype == ours.weight.dtype
    assert_close_ulp(ours.weight_grad.astype(np.float64), theirs.weight.grad.double().numpy(),
                     rtol=tolerance, atol=tolerance, what=f"weight_grad after {conversion}()")


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_zero_grad_matches_torch(dtype, set_to_none):
    ours, theirs = _torch_module_pair((2, 3), dtype)
    _step_both(ours, theirs, seed=17, shape=(5, 2, 3))
    before, before_torch = ours.weight_grad, theirs.weight.grad
    assert ours.zero_grad(set_to_none=set_to_none) is None
    theirs.zero_grad(set_to_none=set_to_none)
    if set_to_none:
        assert ours.weight_grad is None and theirs.weight.grad is None
    else:
        assert ours.weight_grad is before and theirs.weight.grad is before_torch
        assert np.array_equal(ours.weight_grad, theirs.weight.grad.numpy())
        assert np.array_equal(ours.weight_grad, np.zeros((2, 3)))
    _step_both(ours, theirs, seed=18, shape=(5, 2, 3))
    assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="weight_grad after zero")


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_before_any_backward_leaves_none_like_torch(set_to_none):
    ours, theirs = _torch_module_pair(3, np.float32)
    ours.zero_grad(set_to_none=set_to_none)
    theirs.zero_grad(set_to_none=set_to_none)
    assert ours.weight_grad is None and theirs.weight.grad is None


NOT_ARRAYS = {
    "list": [1.0, 2.0, 3.0],
    "tuple": (1.0, 2.0, 3.0),
    "str": "abc",
    "int": 3,
    "float": 1.5,
    "dict": {"weight": 1.0},
}


@pytest.mark.parametrize("value", NOT_ARRAYS.values(), ids=NOT_ARRAYS)
def test_assigning_a_weight_that_is_not_an_array_is_torchs_type_error(value):
    ours, theirs = _torch_module_pair(3, np.float32)
    before = ours.weight
    error = _raised(lambda: setattr(ours, "weight", value))
    error_torch = _raised(lambda: setattr(theirs, "weight", value))
    assert type(error) is type(error_torch) is TypeError
    # torch expects a Parameter where we expect an ndarray; the rest is the same.
    assert str(error).split(" (")[0] == str(error_torch).split(" (")[0]
    assert str(error).startswith(f"cannot assign '{type(value).__name__}' as parameter 'weight'")
    assert "numpy.ndarray or None expected" in str(error)
    assert ours.weight is before


def test_assigning_a_torch_tensor_names_its_type():
    with pytest.raises(TypeError, match=r"cannot assign 'torch\.Tensor' as parameter 'weight'"):
        rmsnorm.RMSNorm(3).weight = torch.ones(3)


@pytest.mark.parametrize("shape", [(4,), (1, 3), (3, 1), ()], ids=str)
def test_assigning_a_weight_of_another_shape_is_a_value_error_in_torchs_words(shape):
    ours, theirs = _torch_module_pair(3, np.float32)
    before = ours.weight.copy()
    error = _raised(lambda: setattr(ours, "weight", np.ones(shape, np.float32)))
    # torch takes the parameter and fails in the forward, with the same text.
    theirs.weight = torch.nn.Parameter(torch.ones(shape))
    error_torch = _raised(lambda: theirs(torch.ones(2, 3)))
    assert type(error) is ValueError and type(error_torch) is RuntimeError
    assert str(error) == str(error_torch)
    assert np.array_equal(ours.weight, before)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_assigning_a_weight_of_a_non_floating_dtype_is_rejected_like_torch(dtype):
    ours = rmsnorm.RMSNorm(3)
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        ours.weight = np.ones(3, dtype)
    with pytest.raises(RuntimeError, match="floating point"):
        torch.nn.Parameter(torch.ones(3, dtype=getattr(torch, np.dtype(dtype).name)))
    assert ours.weight.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.complex64, np.longdouble, object])
def test_assigning_a_weight_of_a_dtype_rmsnorm_does_not_compute_with_is_a_type_error(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        rmsnorm.RMSNorm(3).weight = np.ones(3, dtype)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
def test_assigning_none_removes_the_weight_like_torch(affine):
    ours, theirs = _torch_module_pair(4, np.float32, affine=affine)
    _step_both(ours, theirs, seed=19, shape=(2, 4))
    ours.weight = None
    theirs.weight = None
    assert ours.weight is None and theirs.weight is None
    assert list(ours.named_parameters()) == list(theirs.named_parameters()) == []
    assert dict(ours.state_dict()) == dict(theirs.state_dict()) == {}
    x = np.random.default_rng(20).standard_normal((2, 4)).astype(np.float32)
    assert_forward_close(ours(x), theirs(torch.from_numpy(x)).detach().numpy(),
                         what="output without weight")


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_an_assigned_weight_is_used_and_differentiated_like_torch(affine, dtype):
    ours, theirs = _torch_module_pair(6, np.float32, eps=1e-5, affine=affine)
    weight = np.random.default_rng(21).standard_normal(6).astype(dtype)
    ours.weight = weight
    theirs.weight = torch.nn.Parameter(torch.from_numpy(weight.copy()))
    assert ours.weight.dtype == dtype
    assert [name for name, _ in ours.named_parameters()] == ["weight"]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    grad_input, grad_input_torch = _step_both(ours, theirs, seed=22)
    assert_grad_close(grad_input, grad_input_torch, what="grad_input with an assigned weight")
    assert ours.weight_grad.dtype == theirs.weight.grad.numpy().dtype == dtype
    assert_close_ulp(ours.weight_grad.astype(np.float64), theirs.weight.grad.double().numpy(),
                     rtol=1e-2 if dtype == np.float16 else 1e-5, atol=1e-2,
                     what="weight_grad of an assigned weight")


def test_assigning_a_weight_starts_a_new_gradient_like_torch():
    ours, theirs = _torch_module_pair(3, np.float32)
    _step_both(ours, theirs, seed=23, shape=(2, 3))
    ours.weight = np.full(3, 2.0, np.float32)
    theirs.weight = torch.nn.Parameter(torch.full((3,), 2.0))
    assert ours.weight_grad is None and theirs.weight.grad is None


def test_an_assigned_weight_is_a_copy_the_module_never_writes_through():
    caller = np.array([0.5, -1.0, 2.0], np.float32)
    caller.flags.writeable = False  # any write through the module would raise
    ours = rmsnorm.RMSNorm(3)
    ours.weight = caller
    assert ours.weight is not caller and not np.shares_memory(ours.weight, caller)
    assert np.array_equal(ours.weight, caller)
    ours.reset_parameters()
    ours.load_state_dict({"weight": np.full(3, 4.0)})
    ours.weight -= 1
    assert np.array_equal(caller, [0.5, -1.0, 2.0])
    assert np.array_equal(ours.weight, [3.0, 3.0, 3.0])


def test_an_assigned_weight_in_another_byte_order_is_stored_in_native_order():
    caller = np.array([0.5, -1.0, 2.0], np.dtype(np.float32).newbyteorder())
    ours = rmsnorm.RMSNorm(3)
    ours.weight = caller
    assert ours.weight.dtype == np.float32 and ours.weight.dtype.isnative
    assert np.array_equal(ours.weight, caller)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_weight"])
def test_second_backward_raises_like_torch(affine):
    ours, theirs = _torch_module_pair(5, np.float32, affine=affine)
    rng = np.random.default_rng(24)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    grad_output = rng.standard_normal((3, 5)).astype(np.float32)
    y_t = theirs(torch.from_numpy(x).requires_grad_())
    y_t.backward(torch.from_numpy(grad_output))
    ours(x)
    ours.backward(grad_output)
    weight_grad = None if ours.weight_grad is None else ours.weight_grad.copy()
    error = _raised(lambda: ours.backward(grad_output))
    error_torch = _raised(lambda: y_t.backward(torch.from_numpy(grad_output)))
    assert type(error) is type(error_torch) is RuntimeError
    fragment = "Trying to backward through the graph a second time"
    assert fragment in str(error) and fragment in str(error_torch)
    if affine:
        assert np.array_equal(ours.weight_grad, weight_grad)


def test_forward_again_allows_another_backward_like_torch():
    ours, theirs = _torch_module_pair(5, np.float32, eps=1e-5)
    for seed in (25, 26):
        grad_input, grad_input_torch = _step_both(ours, theirs, seed=seed, shape=(3, 5))
        assert_grad_close(grad_input, grad_input_torch, what=f"grad_input of seed {seed}")
    assert_grad_close(ours.weight_grad, theirs.weight.grad.numpy(), what="two steps' weight_grad")


def test_a_failed_backward_keeps_the_saved_input_like_torch():
    ours, theirs = _torch_module_pair(3, np.float32)
    x = np.random.default_rng(27).standard_normal((2, 3)).astype(np.float32)
    x_t = torch.from_numpy(x).clone().requires_grad_()
    y_t = theirs(x_t)
    ours(x)
    assert type(_raised(lambda: ours.backward(np.ones((4, 3), np.float32)))) is ValueError
    assert type(_raised(lambda: y_t.backward(torch.ones(4, 3)))) is RuntimeError
    grad_input = ours.backward(np.ones((2, 3), np.float32))
    y_t.backward(torch.ones(2, 3))
    assert_grad_close(grad_input, x_t.grad.numpy(), what="grad_input after a failed backward")


def test_backward_lets_go_of_the_saved_input():
    ours = rmsnorm.RMSNorm(3)
    x = np.ones((2, 3), np.float32)
    saved = weakref.ref(x)
    ours(x)
    ours.backward(np.ones((2, 3), np.float32))
    del x
    gc.collect()
    assert saved() is None, "the module still holds the input after backward"


ROUND_TRIPS = {"pickle": lambda module: pickle.loads(pickle.dumps(module)),
               "deepcopy": copy.deepcopy}

# (normalized_shape, dtype, eps, elementwise_affine, calls made before the copy)
ROUND_TRIP_CONFIGS = {
    "float32": ((2, 3), np.float32, 1e-5, True, ()),
    "float64-eval": (6, np.float64, None, True, ("eval",)),
    "no_weight": (6, np.float32, None, False, ()),
    "requires_grad_off-eval": ((3, 2), np.float32, 1e-6, True, ("eval", "requires_grad_off")),
}


def _configured_pair(name):
    normalized_shape, dtype, eps, affine, calls = ROUND_TRIP_CONFIGS[name]
    ours, theirs = _torch_module_pair(normalized_shape, dtype, eps=eps, affine=affine, seed=28)
    for module in (ours, theirs):
        if "eval" in calls:
            module.eval()
        if "requires_grad_off" in calls:
            module.requires_grad_(False)
    return ours, theirs


@pytest.mark.parametrize("config", ROUND_TRIP_CONFIGS)
@pytest.mark.parametrize("round_trip", ROUND_TRIPS)
def test_round_trip_keeps_configuration_flags_and_weight_like_torch(round_trip, config):
    ours, theirs = _configured_pair(config)
    copied, copied_torch = ROUND_TRIPS[round_trip](ours), ROUND_TRIPS[round_trip](theirs)
    assert repr(copied) == repr(copied_torch) == repr(ours)
    assert copied.training is copied_torch.training is ours.training
    weight_torch = copied_torch.weight
    assert copied.weight_requires_grad is (weight_torch is None or weight_torch.requires_grad)
    if ours.weight is None:
        assert copied.weight is None and weight_torch is None
    else:
        assert copied.weight is not ours.weight
        assert copied.weight.dtype == ours.weight.dtype
        assert np.array_equal(copied.weight, ours.weight)
        assert np.array_equal(copied.weight, weight_torch.detach().numpy())
    x = np.random.default_rng(29).standard_normal((4,) + ours.normalized_shape)
    x = x.astype(np.float32 if ours.weight is None else ours.weight.dtype)
    assert np.array_equal(copied(x), ours(x))


@pytest.mark.parametrize("round_trip", ROUND_TRIPS)
def test_round_trip_drops_weight_grad_like_torch(round_trip):
    ours, theirs = _torch_module_pair(4, np.float32)
    _step_both(ours, theirs, seed=30, shape=(2, 4))
    assert ours.weight_grad is not None and theirs.weight.grad is not None
    assert ROUND_TRIPS[round_trip](ours).weight_grad is None
    assert ROUND_TRIPS[round_trip](theirs).weight.grad is None
    assert ours.weight_grad is not None


@pytest.mark.parametrize("round_trip", ROUND_TRIPS)
def test_round_trip_drops_the_saved_input_and_the_original_keeps_it(round_trip):
    ours = rmsnorm.RMSNorm(4)
    x = np.random.default_rng(31).standard_normal((2, 4)).astype(np.float32)
    ours(x)
    copied = ROUND_TRIPS[round_trip](ours)
    with pytest.raises(ValueError, match="before forward"):
        copied.backward(np.ones((2, 4), np.float32))
    expected, _ = rmsnorm.rms_norm_backward(np.ones((2, 4), np.float32), x, 4, ours.weight)
    assert np.array_equal(ours.backward(np.ones((2, 4), np.float32)), expected)


def test_shallow_copy_shares_the_weight_like_torch():
    ours, theirs = _torch_module_pair(4, np.float32)
    assert copy.copy(ours).weight is ours.weight
    assert copy.copy(theirs).weight is theirs.weight


def test_pickle_after_a_forward_on_a_large_batch_is_small():
    ours = rmsnorm.RMSNorm(1024)
    x = np.ones((4096, 1024), np.float32)  # 16 MiB
    ours(x)
    ours.backward(x)  # a weight_grad as large as the weight, which pickle leaves out too
    ours(x)
    size = len(pickle.dumps(ours))
    # The weight (4 KiB) and a little configuration: neither x nor weight_grad.
    assert size < ours.weight.nbytes + 2048, f"pickled RMSNorm is {size} bytes"
