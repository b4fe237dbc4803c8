"""Typical user code, checked by ``mypy --strict`` in CI (.ci/typecheck.sh).

It is also run by tests/test_typing.py, so every line here is real,
working code. ``assert_type`` pins the types the stubs give; each
``# type: ignore[...]`` marks a mistake the stubs must reject: under
``--strict`` an ignore that is no longer needed is itself an error, so the
check fails if a stub grows too loose.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

import rmsnorm

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # pragma: no cover - the typed example targets 3.11+

    def assert_type(value: object, _type: object) -> object:
        return value


def normalise(x: NDArray[np.float32], weight: NDArray[np.float32]) -> NDArray[np.float32]:
    """The functional API keeps the input's dtype in its type."""
    return rmsnorm.rms_norm(x, x.shape[-1], weight, eps=1e-6)


def gradients(
    grad_output: NDArray[np.float64], x: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    grad_input, grad_weight = rmsnorm.rms_norm_backward(
        grad_output, x, (x.shape[-1],), np.ones(x.shape[-1]), None
    )
    return grad_input, grad_weight


def gufuncs(x: NDArray[np.float32], weight: NDArray[np.float32]) -> NDArray[np.float32]:
    # The gufuncs are np.ufunc: they dispatch on their operands (a dask array
    # in gives a dask array out), so their results are Any.
    assert_type(rmsnorm.forward, np.ufunc)
    y: NDArray[np.float32] = rmsnorm.forward(x, weight, np.float32(1e-6))
    grad_input, grad_weight = rmsnorm.backward(np.ones_like(x), x, weight, np.float32(1e-6))
    # (m, n) core: grad_weight is summed over the rows of each (m, n) matrix.
    assert grad_input.shape == x.shape and grad_weight.shape == x.shape[:-2] + weight.shape
    assert rmsnorm.forward.signature == "(n),(n),()->(n)"
    return y


def layer_step(x: NDArray[np.float32]) -> float:
    layer = rmsnorm.RMSNorm(x.shape[-1], eps=1e-6, elementwise_affine=True, dtype=np.float32)
    y = layer(x)
    assert_type(y, NDArray[np.float32])
    assert_type(layer.forward(x), NDArray[np.float32])
    grad_input = layer.backward(np.ones_like(y))
    weight: Optional[NDArray[np.floating[Any]]] = layer.weight
    if weight is not None and layer.weight_grad is not None:
        weight -= 0.1 * layer.weight_grad
    layer.load_state_dict(layer.state_dict())
    layer.zero_grad()
    shape: tuple[int, ...] = layer.normalized_shape
    assert shape == (x.shape[-1],)
    return float(np.abs(grad_input).max())


def layer_as_a_torch_module(x: NDArray[np.float64]) -> int:
    # torch.nn.Module's methods that return the module keep its type.
    layer = rmsnorm.RMSNorm(x.shape[-1]).double().eval().requires_grad_(False)
    assert_type(layer, rmsnorm.RMSNorm)
    assert not layer.training and not layer.weight_requires_grad
    layer.backward(np.ones_like(layer(x)))
    layer.zero_grad(set_to_none=False)
    count = len(list(layer.parameters()))
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    layer.weight = None
    return count + len(list(layer.parameters()))


def threads() -> int:
    before: int = rmsnorm.get_num_threads()
    rmsnorm.set_num_threads(1)
    rmsnorm.set_num_threads(before)
    return before


def half_precision(x: NDArray[np.float16]) -> NDArray[np.float16]:
    # Mixed precision, as torch: a float32 weight with float16 input.
    return rmsnorm.rms_norm(x, x.shape[-1], np.ones(x.shape[-1], np.float32))


def against_the_reference(x: NDArray[np.float32]) -> float:
    # rmsnorm.reference: the float64 version written from the math.
    expected = rmsnorm.reference.rms_norm(x, x.shape[-1], None, 1e-6)
    assert_type(expected, NDArray[np.float64])
    return float(np.max(np.abs(rmsnorm.rms_norm(x, x.shape[-1], eps=1e-6) - expected)))


def untyped_inputs() -> None:
    # A list (or a duck array such as dask's) in: the result is Any.
    y = rmsnorm.rms_norm([[3.0, 4.0]], 2)
    assert_type(y, Any)
    grad_input, grad_weight = rmsnorm.rms_norm_backward(np.ones((1, 2)), np.ones((1, 2)), 2)
    assert_type(grad_weight, None)


def mistakes_the_stubs_reject() -> None:
    """Never called: each line is wrong, and mypy must say so."""
    rmsnorm.set_num_threads("4")  # type: ignore[arg-type]
    rmsnorm.get_num_threads(4)  # type: ignore[call-arg]
    rmsnorm.rms_norm(np.ones(3), "3")  # type: ignore[arg-type]
    rmsnorm.RMSNorm(3, elementwise_affine="yes")  # type: ignore[arg-type]
    count: str = rmsnorm.get_num_threads()  # type: ignore[assignment]
    rmsnorm.RMSNorm(3).train("yes")  # type: ignore[arg-type]
    rmsnorm.RMSNorm(3).weight = [1.0, 2.0, 3.0]  # type: ignore[assignment]
    del count


def main() -> None:
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((2, 3, 8)).astype(np.float32)
    x64 = rng.standard_normal((4, 8))
    ones32 = np.ones(8, np.float32)
    assert normalise(x32, ones32).dtype == np.float32
    grad_input, grad_weight = gradients(np.ones_like(x64), x64)
    assert grad_input.dtype == np.float64 and grad_weight.shape == (8,)
    assert gufuncs(x32, ones32).shape == x32.shape
    assert layer_step(x32) >= 0.0
    assert layer_as_a_torch_module(x64) == 1
    assert threads() >= 1
    assert half_precision(x32.astype(np.float16)).dtype == np.float16
    assert against_the_reference(x32) < 1e-5
    untyped_inputs()


if __name__ == "__main__":
    main()
