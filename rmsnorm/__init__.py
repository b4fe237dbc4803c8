"""RMSNorm forward and backward in C, as NumPy generalized ufuncs.

- ``forward`` and ``backward``: the gufuncs, ``(n),(n),()->(n)`` and
  ``(m,n),(m,n),(n),()->(m,n),(n)``.
- ``rms_norm`` and ``rms_norm_backward``: torch.nn.functional's contract.
- ``RMSNorm``: torch.nn.RMSNorm's contract.
- ``set_num_threads`` and ``get_num_threads``: the kernels' thread pool.
- ``reference``: a plain float64 NumPy implementation, the independent check.

float16, float32 and float64 arrays work as they are; bfloat16 works when the
optional package ml_dtypes is installed (``pip install 'rmsnorm[bfloat16]'``).
"""

from . import reference
from ._core import backward, forward, get_num_threads, set_num_threads
from ._version import __version__
from .functional import rms_norm, rms_norm_backward
from .module import RMSNorm


def __getattr__(name: str):
    # rmsnorm.bfloat16 is ml_dtypes.bfloat16, or an ImportError saying how to get it.
    if name == "bfloat16":
        from ._dtypes import resolve_dtype

        return resolve_dtype("bfloat16").type
    raise AttributeError(f"module 'rmsnorm' has no attribute {name!r}")


__all__ = [
    "RMSNorm",
    "__version__",
    "backward",
    "forward",
    "get_num_threads",
    "rms_norm",
    "rms_norm_backward",
    "set_num_threads",
]
