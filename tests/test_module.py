"""rmsnorm.RMSNorm mirrors torch.nn.RMSNorm: repr, init, parameters,
gradient accumulation, state_dict. Values it computes are checked against
torch (parity) or the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rmsnorm
from rmsnorm import reference
from closeness import assert_close_ulp, assert_forward_close, assert_grad_close

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
DTYPES = [np.float32, np.float64]


def dtype_id(dtype):
    return np.dtype(dtype).name


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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
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
