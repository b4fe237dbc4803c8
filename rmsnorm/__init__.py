"""RMSNorm forward and backward in C, as NumPy generalized ufuncs.

- ``forward`` and ``backward``: the gufuncs, ``(n),(n),()->(n)`` and
  ``(m,n),(m,n),(n),()->(m,n),(n)``.
- ``rms_norm`` and ``rms_norm_backward``: torch.nn.functional's contract.
- ``RMSNorm``: torch.nn.RMSNorm's contract.
- ``set_num_threads`` and ``get_num_threads``: the kernels' thread pool.
- ``reference``: a plain float64 NumPy implementation, the independent check.
"""

from ._core import backward, forward, get_num_threads, set_num_threads
from ._version import __version__
from .functional import rms_norm, rms_norm_backward
from .module import RMSNorm

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
