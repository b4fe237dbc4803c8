"""``python -m rmsnorm``: its help, its figure, and what it says without matplotlib.

Each check runs the demo in a fresh interpreter, as a newcomer would. That it
runs at all, with and without torch, is checked in test_import.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import rmsnorm

# The directory that holds the rmsnorm package being tested, so that the
# subprocess imports the same build (in-place or installed).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_demo(*args, cwd, python_code=None, timeout=180):
    """``python -m rmsnorm *args``, or ``python -c python_code`` with sys.argv set to them."""
    env = {**os.environ,
           "PYTHONPATH": PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "rmsnorm", *args]
    if python_code is not None:
        command = [sys.executable, "-c", python_code, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=cwd)


def test_help_explains_the_demo_and_its_options(tmp_path):
    result = run_demo("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m rmsnorm")
    for words in ("forward and backward", "grad_output", "rmsnorm.reference", "torch",
                  "--plot FILE", "heatmaps", 'pip install "rmsnorm[plots]"'):
        assert words in result.stdout, f"{words!r} missing from --help:\n{result.stdout}"
    # --help explains and exits: the demo itself does not run.
    assert "Checks against" not in result.stdout


def test_an_unknown_option_is_an_error_not_ignored(tmp_path):
    result = run_demo("--no-such-option", cwd=tmp_path)
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-option" in result.stderr


def test_demo_prints_the_random_grad_output(tmp_path):
    result = run_demo(cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\ngrad_output (random" in result.stdout


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (the plots extra)")
def test_plot_writes_a_png(tmp_path):
    result = run_demo("--plot", "tmp.png", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    figure = tmp_path / "tmp.png"
    assert figure.is_file(), result.stdout
    assert figure.read_bytes()[:8] == PNG_SIGNATURE
    assert "all checks passed" in result.stdout


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    hide_matplotlib = (
        "import runpy, sys\n"
        "sys.modules['matplotlib'] = None  # any 'import matplotlib' now raises ImportError\n"
        "sys.argv[0] = 'rmsnorm'\n"
        "runpy.run_module('rmsnorm', run_name='__main__', alter_sys=True)\n"
    )
    result = run_demo("--plot", "tmp.png", cwd=tmp_path, python_code=hide_matplotlib)
    assert result.returncode == 1
    assert 'pip install "rmsnorm[plots]"' in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "tmp.png").exists()
