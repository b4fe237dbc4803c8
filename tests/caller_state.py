"""The caller's state: what a call got from its caller, snapshotted before it
runs, so that a test can check afterwards that nothing changed, bit for bit.

The bad-input catalogue (test_bad_inputs.py) checks that a call that raises
changes nothing; the odd-input catalogue (test_edge_values.py) that a call
that succeeds changes nothing but its outputs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import rmsnorm


def _root(array: np.ndarray) -> np.ndarray:
    """The outermost ndarray a view reaches through ``.base``."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


class Caller:
    """The arrays and state one call gets from its caller.

    ``keep`` snapshots an array when it is made, so a case written as
    ``rmsnorm.rms_norm(caller.x(), 3, caller.keep(weight))`` has every
    argument recorded before ``rms_norm`` runs. ``watch`` records any other
    state (the thread count, a module's weight) through a getter.
    """

    def __init__(self, seed: int = 5):
        self.rng = np.random.default_rng(seed)
        self._kept: list[tuple[str, np.ndarray, bytes, bytes]] = []
        self._watched: list[tuple[str, Callable[[], object], object]] = []

    def keep(self, array, name: str | None = None):
        if isinstance(array, np.ndarray):
            name = name or f"argument #{len(self._kept)}"
            self._kept.append((name, array, array.tobytes(), _root(array).tobytes()))
        return array

    def watch(self, name: str, getter: Callable[[], object]) -> None:
        self._watched.append((name, getter, getter()))

    # Arrays most cases need: random, so that a stray write shows.
    def x(self, shape=(2, 3), dtype=np.float32) -> np.ndarray:
        return self.keep(self.rng.standard_normal(shape).astype(dtype), "x")

    def weight(self, shape=(3,), dtype=np.float32) -> np.ndarray:
        return self.keep(self.rng.standard_normal(shape).astype(dtype), "weight")

    def grad(self, shape=(2, 3), dtype=np.float32) -> np.ndarray:
        return self.keep(self.rng.standard_normal(shape).astype(dtype), "grad_output")

    def out(self, shape=(2, 3), dtype=np.float32) -> np.ndarray:
        return self.keep(np.full(shape, 7, dtype), "out")

    def read_only(self, array: np.ndarray) -> np.ndarray:
        array.flags.writeable = False
        return self.keep(array, "read-only array")

    def module(self, *args, **kwargs) -> rmsnorm.RMSNorm:
        """An RMSNorm whose weight (made random) and weight_grad are watched."""
        layer = rmsnorm.RMSNorm(*args, **kwargs)
        if layer.weight is not None:
            layer.weight[...] = self.rng.standard_normal(layer.weight.shape)
            self.keep(layer.weight, "module weight")
        self.watch("module weight_grad",
                   lambda: None if layer.weight_grad is None else layer.weight_grad.tobytes())
        return layer

    def assert_unchanged(self) -> None:
        for name, array, data, root in self._kept:
            assert array.tobytes() == data, f"{name} was changed by a call that raised"
            assert _root(array).tobytes() == root, (
                f"the buffer under {name} was changed by a call that raised")
        for name, getter, before in self._watched:
            assert getter() == before, f"{name} changed from {before!r} to {getter()!r}"
