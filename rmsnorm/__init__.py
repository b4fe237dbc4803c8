"""RMSNorm forward and backward in C, as NumPy generalized ufuncs.

- ``forward`` and ``backward``: the gufuncs, ``(n),(n),()->(n)`` and
  ``(m,n),(m,n),(n),()->(m,n),(n)``.
- ``add_forward`` and ``add_backward``: a pre-norm block's residual add
  fused with the norm, ``(n),(n),(n),()->(n),(n)`` and
  ``(m,n),(m,n),(m,n),(n),()->(m,n),(n)``.
- ``forward_offset``, ``backward_offset``, ``add_forward_offset`` and
  ``add_backward_offset``: the same with a weight offset (Gemma's
  ``1 + weight``), a float64 operand after the weight.
- ``rms_norm`` and ``rms_norm_backward``: torch.nn.functional's contract,
  with a ``weight_offset`` keyword; ``add_rms_norm`` and
  ``add_rms_norm_backward``: the fused residual add in the same style.
- ``RMSNorm``: torch.nn.RMSNorm's contract, plus ``forward(x, residual)``
  and ``weight_offset``.
- ``set_num_threads`` and ``get_num_threads``: the kernels' thread pool.
- ``reference``: a plain float64 NumPy implementation, the independent check.
- ``rmsnorm.torch`` (imported on its own, needs torch): the kernels as torch
  custom ops with autograd and torch.compile support, ``RMSNorm`` and
  ``replace(model)``. ``import rmsnorm`` never imports torch.

float16, float32 and float64 arrays work as they are; bfloat16 works when the
optional package ml_dtypes is installed (``pip install 'rmsnorm[bfloat16]'``),
and ``rmsnorm.bfloat16`` is then its scalar type. ``help(rmsnorm.forward)``
lists every loop, as (x, weight, eps) dtypes. ``forward.types`` cannot show the
bfloat16 ones: NumPy lists only its built-in dtypes there.
"""

try:
    from ._core import (
        add_backward,
        add_backward_offset,
        add_forward,
        add_forward_offset,
        backward,
        backward_offset,
        forward,
        forward_offset,
        get_num_threads,
        set_num_threads,
    )
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

from . import _environment, reference
from ._version import __version__
from .functional import add_rms_norm, add_rms_norm_backward, rms_norm, rms_norm_backward
from .module import RMSNorm

_environment.apply()


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
