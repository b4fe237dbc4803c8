#!/usr/bin/env bash
# Sanitizers: builds rmsnorm._core with -fsanitize=address,undefined in a
# temporary copy of the work tree (the checkout's own build is left alone),
# then runs the test suite (less the files named below, whose C is the rest's)
# against that build with the ASan runtime preloaded into Python. Any
# AddressSanitizer, UndefinedBehaviorSanitizer or LeakSanitizer report fails
# the step: ASan and UBSan halt on the first error, and LeakSanitizer makes
# the interpreter exit non-zero at its end (subprocesses that tests start
# inherit all of it).
#
# Suppressed (leaks only), and why:
# - Python objects that CPython's own object allocators (_PyObject_New,
#   _PyObject_GC_New[Var], PyUnicode_New, PyFloat_FromDouble, and
#   _PyType_AllocNoTrack: one 32-byte object after tests/test_torch_op.py)
#   made and that are alive when the interpreter exits: NumPy's import leaves a few dozen
#   (its string ufuncs and promoters), and CPython does not free everything
#   at exit.
# - CPython's tracemalloc tables (traceback_new), left by tests that trace
#   allocations.
# - Strings that CPython resized in place (resize_compact, a realloc of its
#   own object allocator's memory), alive at exit: transformers' import
#   leaves a few hundred.
# - 208-byte blocks that NumPy's ufunc_generic_fastcall allocates when a
#   two-output gufunc (rmsnorm.backward) defers to an __array_ufunc__
#   override such as dask's, and does not free by exit (a handful a run; the
#   heap stays flat over 10,000 such calls).
# Allocation stacks are cut to 4 frames (malloc_context_size), so these names
# can only match an allocation that CPython or NumPy makes itself within 3
# calls of malloc: every allocation of the extension's own C has its own
# frames there and is still checked. Python objects the extension might leak
# are the reference-count and memory tests' business (tests/test_leaks.py).
#
#   PYTHON  the interpreter with the test dependencies (default: python3, or
#           the active virtual environment's python)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

python="${PYTHON:-python}"
command -v "$python" >/dev/null || python=python3

# What this step needs: gcc with the ASan and UBSan runtimes, and the tests'
# Python packages (no-ops when .ci/run's environment has them).
asan_runtime="$(gcc -print-file-name=libasan.so 2>/dev/null || true)"
if ! command -v gcc >/dev/null || [ ! -e "$asan_runtime" ]; then
    echo "+ apt-get install gcc (with libasan and libubsan)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq gcc libasan8 libubsan1 >/dev/null
    asan_runtime="$(gcc -print-file-name=libasan.so)"
fi
cxx_runtime="$(gcc -print-file-name=libstdc++.so)"
"$python" -m pip install -q --disable-pip-version-check "setuptools>=64" numpy pytest hypothesis

work="$(mktemp -d -t rmsnorm-asan.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# The work tree as git sees it (tracked and untracked, less ignored files and
# tool caches), without any built extension.
git ls-files -z --cached --others --exclude-standard |
    "$python" -c '
import os, shutil, sys
work = sys.argv[1]
for path in sys.stdin.buffer.read().decode().split("\0"):
    if not path or not os.path.isfile(path) or path.endswith(".so"):
        continue
    if path.split("/")[0] in {".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}:
        continue
    os.makedirs(os.path.join(work, os.path.dirname(path)), exist_ok=True)
    shutil.copy2(path, os.path.join(work, path))
' "$work"

# -g1: line tables, enough for the reports' stacks. RMS_NO_FORCED_INLINE
# (csrc/kernels/simd/common.h says why): the build takes seconds, not 14
# minutes.
echo "+ [${SECONDS}s] build rmsnorm._core with -fsanitize=address,undefined in $work"
(
    cd "$work"
    RMSNORM_EXTRA_CFLAGS="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -DRMS_NO_FORCED_INLINE" \
    RMSNORM_EXTRA_LDFLAGS="-fsanitize=address,undefined" \
        "$python" setup.py -q build_ext --inplace --build-temp "$work/.build" >"$work/build.log" 2>&1 ||
        { cat "$work/build.log"; exit 1; }
)

cat >"$work/lsan.supp" <<'EOF'
# CPython's object allocators: objects alive at interpreter exit.
leak:_PyObject_New
leak:_PyObject_GC_New
leak:PyUnicode_New
leak:PyFloat_FromDouble
leak:resize_compact
leak:_PyType_AllocNoTrack
# CPython's tracemalloc tables.
leak:traceback_new
# NumPy: a two-output gufunc's first __array_ufunc__ override (see above).
leak:ufunc_generic_fastcall
# transformers' tokenizers (Rust, pyo3): type objects made at import, kept
# for the process's life.
leak:tokenizers.abi3.so
EOF

# libstdc++ is preloaded with the ASan runtime so that ASan finds the real
# __cxa_throw when torch's C++ throws (Python itself does not link it).
export LD_PRELOAD="$asan_runtime $cxx_runtime"
export PYTHONMALLOC=malloc # every Python allocation through malloc, so ASan sees them
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:detect_stack_use_after_return=0:malloc_context_size=4"
export LSAN_OPTIONS="suppressions=$work/lsan.supp:print_suppressions=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONDONTWRITEBYTECODE=1
export RMSNORM_SANITIZED=1 # tests that start a C++ compiler choose a path without one

cd "$work"
"$python" - <<'EOF'
import os, subprocess, rmsnorm._core as core
assert core.__file__.startswith(os.getcwd()), f"not the sanitized build: {core.__file__}"
linked = subprocess.run(["ldd", core.__file__], capture_output=True, text=True,
                        env={**os.environ, "LD_PRELOAD": ""}).stdout
assert "libasan" in linked and "libubsan" in linked, linked
print("sanitized build:", core.__file__)
EOF

# Left out (paths from $work, pytest's root), since the README's test command
# runs them, and what C they reach the rest of the suite reaches with more
# cases: files that run whole programs in fresh interpreters (the README's
# and docs' examples, the demo and its plot, the figures, import in a new
# process) or whole transformers models, 235 of the 810 seconds this step's
# tests took under the sanitizers (2026-12-06, a Xeon VM); and mypy's two
# checks of the stubs, which run no C of ours beyond the import.
echo "+ [${SECONDS}s] pytest under ASan + UBSan + LeakSanitizer"
status=0
"$python" -m pytest -q -p no:cacheprovider "$work/tests" \
    --ignore "tests/test_readme_examples.py" \
    --ignore "tests/test_demo.py" \
    --ignore "tests/test_make_figures.py" \
    --ignore "tests/test_docs_figures.py" \
    --ignore "tests/test_import.py" \
    --ignore "tests/test_transformers.py" \
    --deselect "tests/test_typing.py::test_mypy_strict_accepts_the_typing_example" \
    --deselect "tests/test_typing.py::test_stubs_match_the_package_at_run_time" \
    "$@" || status=$?
unset LD_PRELOAD
if [ "$status" -ne 0 ]; then
    echo "sanitizer run failed (exit $status; 23 is LeakSanitizer's)" >&2
    exit "$status"
fi
echo "sanitizers: no reports (${SECONDS}s)"
cd "$repo"
