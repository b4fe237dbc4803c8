"""The package is typed: its stubs accept typical user code under
``mypy --strict`` and match the package at run time.

tests/typing_example.py is that user code. Here it also runs, so it stays
working code; mypy and stubtest run when mypy is installed (it is in the
``test`` extra). .ci/typecheck.sh runs the same two checks.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

import rmsnorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.dirname(os.path.abspath(rmsnorm.__file__))
EXAMPLE = os.path.join(ROOT, "tests", "typing_example.py")


def test_typing_example_runs():
    runpy.run_path(EXAMPLE, run_name="__main__")


@pytest.mark.parametrize("name", ["py.typed", "__init__.pyi", "_core.pyi", "functional.pyi",
                                  "module.pyi", "reference.pyi", "torch.pyi"])
def test_package_ships_its_type_information(name):
    assert os.path.isfile(os.path.join(PACKAGE_DIR, name)), f"rmsnorm/{name} is missing"


def mypy_config(tmp_path):
    """A config that keeps mypy's cache out of the working tree."""
    pytest.importorskip("mypy", reason="mypy is optional (in the test extra)")
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\ncache_dir = {tmp_path / 'cache'}\n")
    return str(config)


def run(command):
    return subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_mypy_strict_accepts_the_typing_example(tmp_path):
    result = run(["mypy", "--config-file", mypy_config(tmp_path), "--strict", EXAMPLE])
    assert result.returncode == 0, result.stdout + result.stderr


def test_stubs_match_the_package_at_run_time(tmp_path):
    result = run(["mypy.stubtest", "--mypy-config-file", mypy_config(tmp_path),
                  "rmsnorm._core", "rmsnorm.functional", "rmsnorm.module", "rmsnorm.reference",
                  "rmsnorm.torch"])
    assert result.returncode == 0, result.stdout + result.stderr
