"""RMSNORM_NUM_THREADS and RMSNORM_ISA: read once, at import; a value that
cannot be used gives a RuntimeWarning naming the variable, the value and
what is used instead, never silence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import rmsnorm

SUPPORTED_ISAS = rmsnorm._core._isa()[1]
KNOWN_ISAS = ["baseline", "avx2", "avx512"]

REPORT = (
    "import json, warnings\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    import rmsnorm\n"
    "print(json.dumps({'threads': rmsnorm.get_num_threads(), 'isa': rmsnorm._core._isa()[0],\n"
    "                  'warnings': [str(w.message) for w in caught\n"
    "                               if issubclass(w.category, RuntimeWarning)]}))\n"
)


def _import_with(**variables) -> dict:
    """What a fresh interpreter that imports rmsnorm with these variables sees."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RMSNORM_NUM_THREADS", "RMSNORM_ISA")}
    env.update(variables)
    out = subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout)


DEFAULT = _import_with()


@pytest.mark.parametrize("value, threads",
                         [("3", 3), (" 3 ", 3), ("1", 1), ("400", 256), ("9" * 40, 256)])
def test_num_threads_takes_a_whole_number_quietly(value, threads):
    seen = _import_with(RMSNORM_NUM_THREADS=value)
    assert seen["threads"] == threads
    assert seen["warnings"] == []


@pytest.mark.parametrize("variable", ["RMSNORM_NUM_THREADS", "RMSNORM_ISA"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_variable_is_as_good_as_none(variable, value):
    seen = _import_with(**{variable: value})
    assert seen == DEFAULT


@pytest.mark.parametrize("value", ["3abc", "abc", "-3", "0", "2.5", "+3"])
def test_num_threads_that_is_not_a_count_warns_and_uses_the_cpus(value):
    seen = _import_with(RMSNORM_NUM_THREADS=value)
    assert seen["threads"] == DEFAULT["threads"]
    [message] = seen["warnings"]
    assert "RMSNORM_NUM_THREADS" in message and repr(value) in message
    assert f"using {DEFAULT['threads']} threads" in message


@pytest.mark.parametrize("value", ["baseline", "Baseline", "AVX2", " avx2 ", "avx512"])
def test_isa_is_case_insensitive(value):
    if value.strip().lower() not in SUPPORTED_ISAS:
        pytest.skip(f"this CPU cannot run {value.strip().lower()}")
    seen = _import_with(RMSNORM_ISA=value)
    assert seen["isa"] == value.strip().lower()
    assert seen["warnings"] == []


@pytest.mark.parametrize("value", ["garbage", "avx-512", "sse2", "avx\udcff"])
def test_unknown_isa_warns_and_keeps_the_widest(value):
    seen = _import_with(RMSNORM_ISA=value)
    assert seen["isa"] == SUPPORTED_ISAS[-1]
    [message] = seen["warnings"]
    assert "RMSNORM_ISA" in message and repr(value) in message and "unknown" in message
    assert f"using {SUPPORTED_ISAS[-1]} instead" in message


@pytest.mark.parametrize("name", KNOWN_ISAS)
def test_an_isa_the_cpu_lacks_warns_that_it_lacks_it(name):
    if name in SUPPORTED_ISAS:
        pytest.skip(f"this CPU runs {name}: nothing to refuse")
    seen = _import_with(RMSNORM_ISA=name)
    assert seen["isa"] == SUPPORTED_ISAS[-1]
    [message] = seen["warnings"]
    assert "cannot run" in message and name in message


def test_variables_are_read_once_at_import_not_at_first_use():
    code = ("import os, rmsnorm, numpy as np\n"
            "os.environ['RMSNORM_NUM_THREADS'] = '1'\n"
            "os.environ['RMSNORM_ISA'] = 'baseline'\n"
            "rmsnorm.rms_norm(np.ones((4, 4), np.float32), 4)\n"
            "print(rmsnorm.get_num_threads(), rmsnorm._core._isa()[0])\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RMSNORM_NUM_THREADS", "RMSNORM_ISA")}
    env["RMSNORM_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.split() == ["2", SUPPORTED_ISAS[-1]]
