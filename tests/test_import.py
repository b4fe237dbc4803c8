"""``import rmsnorm`` and ``python -m rmsnorm`` need no torch, and an unbuilt
source tree says what to do.

Each check runs a fresh interpreter in which ``import torch`` fails
(``sys.modules['torch'] = None`` before anything else runs), as if torch
were not installed, or one that sees only NumPy and a copy of the package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rmsnorm

# The directory that holds the rmsnorm package being tested, so that the
# subprocess imports the same build (in-place or installed).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(rmsnorm.__file__)))

BLOCK_TORCH = textwrap.dedent("""\
    import sys
    sys.modules["torch"] = None  # any "import torch" now raises ImportError
    """)


def run_python(code, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=PACKAGE_PARENT)


def test_torch_blocker_really_blocks_torch():
    result = run_python(BLOCK_TORCH + "import torch\n")
    assert result.returncode != 0
    assert "ImportError" in result.stderr or "ModuleNotFoundError" in result.stderr


def test_import_rmsnorm_works_without_torch():
    code = BLOCK_TORCH + textwrap.dedent("""\
        import numpy as np
        import rmsnorm
        assert isinstance(rmsnorm.forward, np.ufunc)
        assert rmsnorm.forward.signature == "(n),(n),()->(n)"
        assert rmsnorm.backward.signature == "(m,n),(m,n),(n),()->(m,n),(n)"
        module = rmsnorm.RMSNorm(3)
        y = module(np.array([[3.0, 0.0, 4.0]], np.float32))
        # rms of [3, 0, 4] is sqrt(25 / 3)
        assert np.allclose(y, np.array([3.0, 0.0, 4.0]) / np.sqrt(25.0 / 3.0), rtol=1e-6)
        module.backward(np.ones((1, 3), np.float32))
        module.load_state_dict({"weight": [1.0, 2.0, 3.0]})
        print("OK", rmsnorm.__version__)
        """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK")


def test_import_rmsnorm_does_not_import_torch():
    result = run_python("import sys, rmsnorm\nprint('torch' in sys.modules)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_import_rmsnorm_torch_without_torch_names_the_extra():
    result = run_python(BLOCK_TORCH + "import rmsnorm.torch\n")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "pip install 'rmsnorm[torch]'" in result.stderr


def test_demo_runs_without_torch_and_says_so():
    code = BLOCK_TORCH + textwrap.dedent("""\
        import runpy
        sys.argv = ["rmsnorm"]
        runpy.run_module("rmsnorm", run_name="__main__", alter_sys=True)
        """)
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch" in result.stdout.lower(), "the demo should say that torch is not installed"


def test_demo_runs_with_torch():
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-m", "rmsnorm"], capture_output=True, text=True,
                            timeout=120, cwd=PACKAGE_PARENT,
                            env={**os.environ, "PYTHONPATH": PACKAGE_PARENT})
    assert result.returncode == 0, result.stdout + result.stderr


def test_version_is_a_non_empty_string():
    assert isinstance(rmsnorm.__version__, str)
    assert rmsnorm.__version__.strip()


def test_import_from_an_unbuilt_source_tree_says_how_to_build_it(tmp_path):
    """The repository root after ``pip install .``: its rmsnorm/ shadows the installed one."""
    shutil.copytree(os.path.dirname(os.path.abspath(rmsnorm.__file__)), tmp_path / "rmsnorm",
                    ignore=shutil.ignore_patterns("_core.*.so", "_core.*.pyd", "__pycache__"))
    assert not list((tmp_path / "rmsnorm").glob("_core.*.so"))
    # -S: no site module, so no .pth file (an editable install's import hook
    # among them) can supply rmsnorm._core; NumPy comes from PYTHONPATH, and
    # the copy from the working directory, first on the path.
    numpy_parent = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    result = subprocess.run([sys.executable, "-S", "-c", "import rmsnorm"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": numpy_parent})
    assert result.returncode == 1, result.stdout + result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: rmsnorm's C extension (rmsnorm._core) is not built"), (
        result.stderr)
    assert str(tmp_path / "rmsnorm") in message
    assert "`pip install -e .`" in message and "outside the source tree" in message
    assert "ModuleNotFoundError" not in result.stderr
