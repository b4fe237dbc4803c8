"""The environment variables rmsnorm reads: once, when it is imported.

- ``RMSNORM_NUM_THREADS``: the most threads a call uses, a positive whole
  number (as ``set_num_threads`` takes); else the CPUs this process may run on.
- ``RMSNORM_ISA``: the instruction set the kernels run on, ``baseline``,
  ``avx2`` or ``avx512`` in any case, at most what the CPU has; else the
  widest it has.

An empty value is as good as none. A value that cannot be used is not
passed over in silence: a RuntimeWarning names the variable, the value, why,
and what is used instead.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from . import _core


def _unusable(variable: str, value: str, why: str, instead: str) -> None:
    warnings.warn(
        f"{variable}={value!r} {why}; using {instead} instead", RuntimeWarning, stacklevel=3
    )


def _whole_number(text: str) -> int | None:
    if not text.isdecimal():
        return None
    try:
        return int(text)
    except ValueError:  # past the digits int() converts
        return None


def apply_num_threads(environ: Mapping[str, str]) -> None:
    value = environ.get("RMSNORM_NUM_THREADS", "")
    if not value.strip():
        return
    count = _whole_number(value.strip())  # " 3 " is 3, as int() reads it
    if count is not None and count >= 1:
        _core.set_num_threads(count)  # the pool caps it
        return
    _unusable(
        "RMSNORM_NUM_THREADS",
        value,
        "is not a whole number of threads of at least 1",
        f"{_core.get_num_threads()} threads (the CPUs this process may run on)",
    )


def apply_isa(environ: Mapping[str, str]) -> None:
    value = environ.get("RMSNORM_ISA", "")
    if not value.strip():
        return
    try:
        # undecodable bytes come as lone surrogates, which the C cannot take
        _core._set_isa(value.strip().lower().encode("ascii", "replace").decode("ascii"))
    except ValueError as error:  # an unknown name, or one this CPU cannot run
        active, supported = _core._isa()
        _unusable("RMSNORM_ISA", value, f"is refused ({error}; this CPU runs "
                  f"{', '.join(supported)})", active)


def apply(environ: Mapping[str, str] = os.environ) -> None:
    """Applies both variables, as importing rmsnorm does."""
    apply_num_threads(environ)
    apply_isa(environ)
