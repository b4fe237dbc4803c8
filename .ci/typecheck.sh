#!/usr/bin/env bash
# Type checks, in the environment that is active (PYTHON overrides "python"):
#  1. mypy --strict on typical user code, tests/typing_example.py, which
#     reaches the package through its stubs (rmsnorm/*.pyi, py.typed);
#  2. stubtest, which compares those stubs with the built package at run
#     time, so that a changed signature in functional.py, module.py or the C
#     module cannot leave a stale stub behind.
# Needs mypy and an importable rmsnorm (pip install -e ".[test]").
# Exits non-zero on the first failure; takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"

# mypy's cache goes to a temporary directory, not into the working tree.
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
printf '[mypy]\ncache_dir = %s\n' "$cache" >"$cache/mypy.ini"

"$python" -m mypy --version
echo "+ mypy --strict tests/typing_example.py"
"$python" -m mypy --config-file "$cache/mypy.ini" --strict tests/typing_example.py
echo "+ stubtest rmsnorm._core rmsnorm.functional rmsnorm.module rmsnorm.reference"
"$python" -m mypy.stubtest --mypy-config-file "$cache/mypy.ini" \
    rmsnorm._core rmsnorm.functional rmsnorm.module rmsnorm.reference
