"""RMSNorm forward and backward in C, as NumPy generalized ufuncs.

- ``forward`` and ``backward``: the gufuncs, ``(n),(n),()->(n)`` and
  ``(m,n),(m,n),(n),()->(m,n),(n)``.
- ``rms_norm`` and ``rms_norm_backward``: torch.nn.functional's contract.
- ``RMSNorm``: torch.nn.RMSNorm's contract.
- ``set_num_threads`` and ``get_num_threads``: the kernels' thread pool.
- ``reference``: a plain float64 NumPy implementation, the independent check.

float16, float32 and float64 arrays work as they are; bfloat16 works when the
optional package ml_dtypes is installed (``pip install 'rmsnorm[bfloat16]'``),
and ``rmsnorm.bfloat16`` is then its scalar type. ``help(rmsnorm.forward)``
lists every loop, as (x, weight, eps) dtypes. ``forward.types`` cannot show the
bfloat16 ones: NumPy lists only its built-in dtypes there.
"""

try:
    from ._core import backward, forward, get_num_threads, set_num_threads
except ModuleNotFoundError as _error:
    if _error.name != __name__ + "._core":
        raise
    # A source tree whose extension was never built in place, typically the
    # repository root shadowing an installed rmsnorm: say so, not just
    # "No module named 'rmsnorm._core'".
    raise ImportError(
        f"rmsnorm's C extension (rmsnorm._core) is not built: {__path__[0]} "
        "holds rmsnorm's Python sources without the compiled extension for this Python, as "
        "a source tree does. Build it in place with `pip install -e .` from the repository "
        "root, or import rmsnorm from outside the source tree to use an installed copy.",
        name=_error.name,
    ) from None

from . import reference
from ._version import __version__
from .functional import rms_norm, rms_norm_backward
from .module import RMSNorm


def __getattr__(name: str):
    """``rmsnorm.bfloat16``: ml_dtypes.bfloat16, looked up on first use.

    Without ml_dtypes it raises an ImportError that says how to get it,
    rather than failing ``import rmsnorm``. Python calls this module-level
    ``__getattr__`` (PEP 562) only for names the module does not define.
    """
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
