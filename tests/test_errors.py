"""Errors: shape problems carry torch 2.13's exact texts (as ValueError), bad
types raise TypeError. Every expected text is taken from torch at test time,
by making the same call on torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rmsnorm

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


@pytest.mark.parametrize("shape, normalized_shape, weight_shape", SHAPE_ERROR_CASES)
def test_rms_norm_shape_error_has_torchs_text(shape, normalized_shape, weight_shape):
    expected = torch_error_text(shape, normalized_shape, weight_shape)
    x, weight = _numpy_args(shape, weight_shape)
    with pytest.raises(ValueError) as ours:
        rmsnorm.rms_norm(x, normalized_shape, weight)
    assert str(ours.value) == expected


@pytest.mark.parametrize("shape, normalized_shape, weight_shape", SHAPE_ERROR_CASES)
def test_rms_norm_backward_shape_error_has_torchs_text(shape, normalized_shape, weight_shape):
    expected = torch_error_text(shape, normalized_shape, weight_shape)
    x, weight = _numpy_args(shape, weight_shape)
    with pytest.raises(ValueError) as ours:
        rmsnorm.rms_norm_backward(np.ones_like(x), x, normalized_shape, weight)
    assert str(ours.value) == expected


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
# Types.
# ---------------------------------------------------------------------------

NON_FLOATING_INPUTS = {
    "int64": lambda: np.arange(6, dtype=np.int64).reshape(2, 3),
    "int32": lambda: np.arange(6, dtype=np.int32).reshape(2, 3),
    "uint8": lambda: np.arange(6, dtype=np.uint8).reshape(2, 3),
    "bool": lambda: np.ones((2, 3), bool),
    "complex64": lambda: np.ones((2, 3), np.complex64),
    "complex128": lambda: np.ones((2, 3), np.complex128),
    "object": lambda: np.ones((2, 3), object),
    "str": lambda: np.full((2, 3), "abc"),
    "datetime64": lambda: np.full((2, 3), np.datetime64("2024-01-01", "D")),
    "timedelta64": lambda: np.ones((2, 3), "m8[s]"),
}


def _assert_names_dtype(message, dtype):
    names = {str(dtype), dtype.name, repr(dtype)}
    assert any(name in message for name in names), (
        f"message {message!r} names none of {sorted(names)}")


@pytest.mark.parametrize("kind", list(NON_FLOATING_INPUTS))
def test_rms_norm_rejects_non_floating_input_naming_its_dtype(kind):
    x = NON_FLOATING_INPUTS[kind]()
    with pytest.raises(TypeError) as ours:
        rmsnorm.rms_norm(x, (3,))
    _assert_names_dtype(str(ours.value), x.dtype)


@pytest.mark.parametrize("kind", list(NON_FLOATING_INPUTS))
def test_rms_norm_backward_rejects_non_floating_input_naming_its_dtype(kind):
    x = NON_FLOATING_INPUTS[kind]()
    with pytest.raises(TypeError) as ours:
        rmsnorm.rms_norm_backward(np.ones((2, 3)), x, (3,))
    _assert_names_dtype(str(ours.value), x.dtype)


@pytest.mark.parametrize("kind", ["int64", "bool", "complex128", "str"])
def test_module_rejects_non_floating_input_naming_its_dtype(kind):
    x = NON_FLOATING_INPUTS[kind]()
    with pytest.raises(TypeError) as ours:
        rmsnorm.RMSNorm(3)(x)
    _assert_names_dtype(str(ours.value), x.dtype)


def test_python_int_list_input_is_rejected_as_integer():
    with pytest.raises(TypeError) as ours:
        rmsnorm.rms_norm([[1, 2, 3]], (3,))
    _assert_names_dtype(str(ours.value), np.asarray([[1, 2, 3]]).dtype)


BAD_EPS = [
    pytest.param("1e-5", id="str"),
    pytest.param(1j, id="complex"),
    pytest.param(np.complex128(1e-5), id="numpy_complex"),
    pytest.param([1e-5], id="list"),
    pytest.param(object(), id="object"),
]


@pytest.mark.parametrize("eps", BAD_EPS)
def test_rms_norm_rejects_eps_that_is_not_a_real_number(eps):
    with pytest.raises(TypeError):
        rmsnorm.rms_norm(np.ones((2, 3), np.float32), (3,), eps=eps)


@pytest.mark.parametrize("eps", BAD_EPS)
def test_rms_norm_backward_rejects_eps_that_is_not_a_real_number(eps):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        rmsnorm.rms_norm_backward(x, x, (3,), eps=eps)


@pytest.mark.parametrize("eps", [np.float32(1e-5), np.float64(1e-5), 1, np.int64(0)])
def test_rms_norm_accepts_real_number_eps(eps):
    x = np.full((1, 4), 2.0)
    y = rmsnorm.rms_norm(x, (4,), eps=eps)
    expected = 2.0 / np.sqrt(4.0 + float(eps))
    assert np.allclose(y, expected, rtol=1e-15, atol=0)


BAD_NORMALIZED_SHAPES = [
    pytest.param((3.0,), id="float_element"),
    pytest.param([1.5], id="non_integral_float"),
    pytest.param(3.0, id="float"),
    pytest.param((None,), id="none_element"),
    pytest.param("3", id="str"),
    pytest.param(("3",), id="str_element"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("normalized_shape", BAD_NORMALIZED_SHAPES)
def test_rms_norm_rejects_normalized_shape_that_is_not_ints(normalized_shape):
    with pytest.raises(TypeError):
        rmsnorm.rms_norm(np.ones((2, 3), np.float32), normalized_shape)


@pytest.mark.parametrize("normalized_shape", BAD_NORMALIZED_SHAPES)
def test_rms_norm_backward_rejects_normalized_shape_that_is_not_ints(normalized_shape):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError):
        rmsnorm.rms_norm_backward(x, x, normalized_shape)


@pytest.mark.parametrize("normalized_shape", BAD_NORMALIZED_SHAPES)
def test_module_rejects_normalized_shape_that_is_not_ints(normalized_shape):
    with pytest.raises(TypeError):
        module = rmsnorm.RMSNorm(normalized_shape)
        module(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("normalized_shape", [np.int64(3), (np.int32(3),), [np.int64(3)]])
def test_numpy_integers_are_accepted_as_normalized_shape(normalized_shape):
    x = np.full((2, 3), 2.0)
    assert np.allclose(rmsnorm.rms_norm(x, normalized_shape, eps=0.0), 1.0, rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------
# grad_output, the module's backward, state_dict.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("grad_shape", [(2, 4), (3, 3), (2, 3, 1), (3,), (1, 3)])
def test_rms_norm_backward_rejects_grad_output_of_another_shape(grad_shape):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError):
        rmsnorm.rms_norm_backward(np.ones(grad_shape, np.float32), x, (3,), np.ones(3, np.float32))


def test_module_backward_rejects_grad_output_of_another_shape():
    module = rmsnorm.RMSNorm(3)
    module(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError):
        module.backward(np.ones((4, 3), np.float32))


@pytest.mark.parametrize("affine", [True, False])
def test_module_backward_before_any_forward_is_a_value_error(affine):
    module = rmsnorm.RMSNorm(3, elementwise_affine=affine)
    with pytest.raises(ValueError):
        module.backward(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("bad_shape", [(4,), (1, 5), (5, 1), ()])
def test_load_state_dict_rejects_a_weight_of_another_shape(bad_shape):
    module = rmsnorm.RMSNorm(5)
    with pytest.raises(RuntimeError) as torch_error:
        torch.nn.RMSNorm(5).load_state_dict({"weight": torch.ones(bad_shape)})
    assert "size mismatch for weight" in str(torch_error.value)
    with pytest.raises(ValueError, match="size mismatch for weight"):
        module.load_state_dict({"weight": np.ones(bad_shape, np.float32)})
    assert np.array_equal(module.weight, np.ones(5, np.float32)), "weight changed by a failed load"


def test_load_state_dict_rejects_a_torch_weight_of_another_shape():
    module = rmsnorm.RMSNorm((2, 3))
    with pytest.raises(ValueError, match="size mismatch for weight"):
        module.load_state_dict(torch.nn.RMSNorm((3, 2)).state_dict())


def test_load_state_dict_without_weight_key_reports_missing_keys():
    with pytest.raises(RuntimeError) as torch_error:
        torch.nn.RMSNorm(5).load_state_dict({})
    assert "Missing key(s)" in str(torch_error.value)
    with pytest.raises(ValueError, match=r"Missing key\(s\)"):
        rmsnorm.RMSNorm(5).load_state_dict({})


# ---------------------------------------------------------------------------
# Thread count and the gufuncs themselves.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [0, -1, -8])
def test_set_num_threads_rejects_less_than_one(threads, restore_num_threads):
    with pytest.raises(ValueError):
        rmsnorm.set_num_threads(threads)


@pytest.mark.parametrize("threads", ["2", 2.0, None, 1.5])
def test_set_num_threads_rejects_non_integers(threads, restore_num_threads):
    with pytest.raises(TypeError):
        rmsnorm.set_num_threads(threads)


def test_forward_gufunc_rejects_mismatched_core_dimensions():
    with pytest.raises(ValueError):
        rmsnorm.forward(np.ones((2, 3)), np.ones(4), 1e-5)


def test_backward_gufunc_rejects_mismatched_core_dimensions():
    with pytest.raises(ValueError):
        rmsnorm.backward(np.ones((2, 3)), np.ones((3, 3)), np.ones(3), 1e-5)
    with pytest.raises(ValueError):
        rmsnorm.backward(np.ones((2, 3)), np.ones((2, 3)), np.ones(4), 1e-5)


# The raw-buffer entry points that rmsnorm.torch calls (csrc/numpy/buffers.c)
# trust the addresses they are given, but refuse malformed arguments before
# any kernel runs: none of these reaches an address.
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
    ],
)
def test_raw_buffer_entry_points_refuse_malformed_arguments(name, args, error, text):
    with pytest.raises(error, match=text):
        getattr(rmsnorm._core, name)(*args)
