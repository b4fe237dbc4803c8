"""Types of the rmsnorm package: the public API, re-exported from its stubs.

A stub rather than the package's own annotations, so that mypy --strict on
user code sees exactly this surface (and not the package's internals).
tests/typing_example.py is the typed user code; .ci/typecheck.sh runs
mypy --strict on it and stubtest, which compares these stubs with the
package at run time.
"""

from typing import Any

from . import reference as reference
from ._core import add_backward as add_backward
from ._core import add_backward_offset as add_backward_offset
from ._core import add_forward as add_forward
from ._core import add_forward_offset as add_forward_offset
from ._core import backward as backward
from ._core import backward_offset as backward_offset
from ._core import forward as forward
from ._core import forward_offset as forward_offset
from ._core import get_num_threads as get_num_threads
from ._core import set_num_threads as set_num_threads
from .functional import add_rms_norm as add_rms_norm
from .functional import add_rms_norm_backward as add_rms_norm_backward
from .functional import rms_norm as rms_norm
from .functional import rms_norm_backward as rms_norm_backward
from .module import RMSNorm as RMSNorm

__version__: str

# rmsnorm.bfloat16 is ml_dtypes.bfloat16 (a NumPy scalar type), or an
# ImportError that says how to get it when ml_dtypes is not installed.
bfloat16: type[Any]

__all__ = [
    "RMSNorm",
    "__version__",
    "add_backward",
    "add_backward_offset",
    "add_forward",
    "add_forward_offset",
    "add_rms_norm",
    "add_rms_norm_backward",
    "backward",
    "backward_offset",
    "forward",
    "forward_offset",
    "get_num_threads",
    "rms_norm",
    "rms_norm_backward",
    "set_num_threads",
]
