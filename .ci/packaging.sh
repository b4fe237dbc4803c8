#!/usr/bin/env bash
# Packaging: build the sdist and the wheel as a release would, then install
# the wheel where the repository cannot help it.
#
#  1. Copies the working tree as a clean clone would have it (the files git
#     tracks or would track: no build/, no in-place .so, no egg-info) to a
#     temporary directory, and runs `python -m build` there: an sdist, then a
#     wheel built from that sdist alone, each in an isolated environment.
#  2. Checks what the two archives hold: the C headers and .inc files in the
#     sdist, the extension and the type information in the wheel, and the
#     metadata (licence, Requires-Python, numpy as the one requirement, torch
#     only in the test extra).
#  3. Installs the wheel into a fresh virtual environment (no torch), and
#     from a directory outside the repository imports rmsnorm, runs
#     `python -m rmsnorm`, and type-checks tests/typing_example.py against
#     the installed package with mypy --strict.
#  4. Where NumPy 1.23 has wheels (Python < 3.12), does the same import and
#     demo with NumPy 1.23, the lowest version the metadata allows.
#
# Needs `build` (and mypy for step 3's type check) in the active environment,
# and a package index for the build's and the venv's dependencies. Nothing is
# written into the working tree. PYTHON overrides "python". About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "+ working in $work"

# 1. A clean copy of the working tree, and the build.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' path; do [ -f "$path" ] && printf '%s\0' "$path"; done |
    tar --null -T - -cf - | tar -xf - -C "$work/src"
echo "+ [${SECONDS}s] python -m build"
"$python" -m build --outdir "$work/dist" "$work/src"
sdist=("$work"/dist/rmsnorm-*.tar.gz)
wheel=("$work"/dist/rmsnorm-*.whl)
if [ ! -f "${sdist[0]}" ] || [ ! -f "${wheel[0]}" ]; then
    echo "python -m build made no sdist or no wheel" >&2
    exit 1
fi

# 2. What the archives hold.
echo "+ checking ${sdist[0]##*/} and ${wheel[0]##*/}"
"$python" - "${sdist[0]}" "${wheel[0]}" "$work/src" <<'PY'
import email, os, sys, tarfile, zipfile

sdist_path, wheel_path, src = sys.argv[1:]
problems = []

with tarfile.open(sdist_path) as sdist:
    names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
# Every C source, header and .inc file of the tree must be in the sdist.
csrc = {os.path.relpath(os.path.join(d, f), src)
        for d, _, files in os.walk(os.path.join(src, "csrc")) for f in files}
for needed in sorted(csrc) + ["LICENSE", "README.md", "pyproject.toml", "setup.py",
                               "rmsnorm/py.typed", "rmsnorm/_core.pyi"]:
    if needed not in names:
        problems.append(f"sdist lacks {needed}")
problems += [f"sdist holds a build output: {n}" for n in names if n.endswith((".so", ".pyc"))]

with zipfile.ZipFile(wheel_path) as wheel:
    members = wheel.namelist()
    metadata_name = next(n for n in members if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(wheel.read(metadata_name))
for needed in ["rmsnorm/py.typed", "rmsnorm/__init__.pyi", "rmsnorm/_core.pyi",
               "rmsnorm/functional.pyi", "rmsnorm/module.pyi", "rmsnorm/reference.pyi",
               "rmsnorm/__main__.py"]:
    if needed not in members:
        problems.append(f"wheel lacks {needed}")
if not any(m.startswith("rmsnorm/_core.") and m.endswith((".so", ".pyd")) for m in members):
    problems.append("wheel lacks the extension rmsnorm._core")
if any(m.startswith(("tests/", "csrc/")) for m in members):
    problems.append("wheel holds tests/ or csrc/")

for field in ["Summary", "License-Expression", "Requires-Python"]:
    if not metadata.get(field):
        problems.append(f"wheel metadata lacks {field}")
if not metadata.get_all("Classifier"):
    problems.append("wheel metadata has no classifiers")
requires = metadata.get_all("Requires-Dist") or []
runtime = [r for r in requires if "extra ==" not in r]
if [r.split(";")[0].replace(" ", "") for r in runtime] != ["numpy>=1.23"]:
    problems.append(f"the runtime requirements should be numpy>=1.23 alone, got {runtime}")
for requirement in requires:
    if requirement.startswith("torch") and not any(
            f'extra == "{extra}"' in requirement for extra in ("test", "torch")):
        problems.append(f"torch outside the test and torch extras: {requirement}")
extras = set(metadata.get_all("Provides-Extra") or [])
if not {"test", "bfloat16", "dask"} <= extras:
    problems.append(f"extras should include test, bfloat16 and dask, got {sorted(extras)}")

print("\n".join(f"  {p}" for p in problems) or "  sdist, wheel and metadata as expected")
sys.exit(1 if problems else 0)
PY

# 3. The wheel in a fresh environment, used from outside the repository.
outside="$work/outside"
mkdir "$outside"
check_install() {  # venv directory, then extra pip arguments
    local venv="$1"
    shift
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "$@" "${wheel[0]}"
    "$venv/bin/python" -m pip check
    (
        cd "$outside"
        "$venv/bin/python" - <<'PY'
import os, sys
import numpy as np
import rmsnorm
where = os.path.dirname(rmsnorm.__file__)
assert "site-packages" in where, f"imported rmsnorm from {where}, not the installed wheel"
assert "torch" not in sys.modules, "importing rmsnorm imported torch"
y = rmsnorm.rms_norm(np.array([[3.0, 4.0]], np.float32), 2, eps=0.0)
assert y.dtype == np.float32 and abs(float(y[0, 1]) - 4 / 12.5 ** 0.5) < 1e-6
print(f"  imported rmsnorm {rmsnorm.__version__} from {where} with numpy {np.__version__}")
PY
        echo "+ python -m rmsnorm (from $outside)"
        "$venv/bin/python" -m rmsnorm >"$venv/demo.txt" ||
            { cat "$venv/demo.txt"; echo "the demo failed" >&2; exit 1; }
        tail -n 1 "$venv/demo.txt"
    )
}
echo "+ [${SECONDS}s] installing the wheel into a fresh venv"
check_install "$work/venv"
if "$work/venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "torch is installed in the fresh venv: it must not be a requirement" >&2
    exit 1
fi
if "$python" -c "import mypy" 2>/dev/null; then
    echo "+ mypy --strict on tests/typing_example.py against the installed wheel"
    cp tests/typing_example.py "$outside/"
    (cd "$outside" && "$python" -m mypy --strict --cache-dir "$work/mypy-cache" \
        --python-executable "$work/venv/bin/python" typing_example.py)
else
    echo "+ mypy is not installed: the installed wheel's types are not checked"
fi

# 4. The lowest NumPy the metadata allows.
if "$python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
    echo "+ the wheel with numpy 1.23"
    check_install "$work/venv-numpy-1.23" --only-binary=numpy "numpy==1.23.*"
else
    echo "+ numpy 1.23 has no wheels for this Python: the lowest-numpy check is skipped"
fi
echo "packaging checks passed"
