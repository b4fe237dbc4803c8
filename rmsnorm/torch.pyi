"""Types of rmsnorm.torch: the kernels as torch custom ops, with autograd."""

from collections.abc import Sequence

import torch

__all__ = ["RMSNorm", "add_rms_norm", "replace", "rms_norm"]

def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
) -> torch.Tensor: ...
def add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]: ...

class RMSNorm(torch.nn.RMSNorm):
    weight_offset: float
    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: float = 0.0,
    ) -> None: ...
    def reset_parameters(self) -> None: ...
    def extra_repr(self) -> str: ...
    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
    def __prepare_scriptable__(self) -> torch.nn.Module: ...  # raises: no TorchScript

def replace(model: torch.nn.Module) -> int: ...
