"""``docs/make_figures.py``: it writes where it is told, and says what it needs.

Each check runs the script in a fresh interpreter, as a reader of the docs
would. Its helper functions are checked by the doctests in docs/*.md.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import rmsnorm

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "docs", "make_figures.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_script(*args, python_code=None, cwd, timeout=300):
    """``python docs/make_figures.py *args``, or ``python -c python_code`` with those arguments."""
    env = {**os.environ,
           "PYTHONPATH": PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, SCRIPT, *args]
    if python_code is not None:
        command = [sys.executable, "-c", python_code, SCRIPT, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


def test_help_names_the_default_folder_and_the_tracked_one(tmp_path):
    result = run_script("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "build/figures" in result.stdout and "docs/figures" in result.stdout


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (the plots extra)")
def test_writes_the_seeded_figures_into_the_folder_given(tmp_path):
    out = tmp_path / "figures"
    result = run_script("--skip-timing", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    written = sorted(path.name for path in out.iterdir())
    assert written == ["attention_ln_vs_rms.png", "jacobian_singular_values.png"]
    for name in written:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE


def test_without_matplotlib_names_the_plots_extra(tmp_path):
    hide_matplotlib = (
        "import runpy, sys\n"
        "sys.modules['matplotlib'] = None  # any 'import matplotlib' now raises ImportError\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    out = tmp_path / "figures"
    result = run_script("--skip-timing", "--out", str(out), python_code=hide_matplotlib, cwd=tmp_path)
    assert result.returncode == 1
    assert 'pip install "rmsnorm[plots]"' in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
