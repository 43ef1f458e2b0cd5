"""RMSNorm with the residual dual stream: ``norm(x, residual) -> (normed, new_residual)``."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF semantics: normalise in fp32, cast back to the input dtype, then scale by weight."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        fused: bool = False,
        res_out: torch.Tensor | None = None,
    ):
        """Without residual: returns the normed tensor. With residual: adds it first and returns
        ``(normed, x + residual)`` (the sum is the next residual). ``fused``: one Triton kernel
        (``flashrec.kernels.rms_fp8.rms_norm_triton``, same rounding points) instead of ~6 ops.
        ``res_out``: where the new residual is written (it may be ``residual`` itself)."""
        if fused:
            from flashrec.kernels.rms_fp8 import rms_norm_triton

            y, res = rms_norm_triton(x, self.weight, self.eps, residual, res_out)
            return y if residual is None else (y, res)
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        if res_out is None:
            residual = x + residual
        else:
            residual = torch.add(x, residual, out=res_out)
        return rms_norm(residual, self.weight, self.eps), residual

    def quant_fp8(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        res_out: torch.Tensor | None = None,
    ):
        """Fused (add +) RMSNorm -> per-token FP8: ``(x_fp8, scale, new_residual)``
        (``res_out`` as in ``forward``)."""
        from flashrec.kernels.rms_fp8 import rms_norm_quant_fp8

        return rms_norm_quant_fp8(x, self.weight, self.eps, residual, res_out)
