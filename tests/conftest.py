"""Shared fixtures. The assertions themselves live in ``closeness.py``."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

# Make ``import closeness`` work whatever pytest's import mode is.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)


def pytest_make_parametrize_id(config, val, argname):
    """A dtype parameter's id is its name ("float16", not "dtype2")."""
    if isinstance(val, np.dtype) or (isinstance(val, type) and issubclass(val, np.generic)):
        return np.dtype(val).name
    return None


@pytest.fixture
def rng():
    """A fresh, seeded generator per test, so every test is reproducible alone."""
    return np.random.default_rng(20240613)


@pytest.fixture
def restore_num_threads():
    """Puts the thread count back after a test that changes it."""
    import rmsnorm

    before = rmsnorm.get_num_threads()
    yield
    rmsnorm.set_num_threads(before)


@pytest.fixture(params=__import__("rmsnorm")._core._isa()[1])
def isa(request):
    """Runs the test once per instruction set this CPU has, then puts the
    active one back."""
    import rmsnorm

    active = rmsnorm._core._isa()[0]
    rmsnorm._core._set_isa(request.param)
    yield request.param
    rmsnorm._core._set_isa(active)
