"""RMSNorm with an optional fused residual add, optionally fused with per-token FP8 quant.

Math, matching HF transformers' ``Qwen3RMSNorm`` and its decoder layer (``dt`` is the
activation dtype, every arrow into ``dt`` one rounding)::

    s   = dt(x + residual)                  # or s = x when residual is None
    n   = dt(s * rsqrt(mean(s**2) + eps))   # in fp32
    y   = dt(n * weight)
    out = (y, s)                            # s is the new residual stream

The quantized variant returns ``per_token_quant_fp8(y)`` instead of ``y``.
"""

from __future__ import annotations

import torch

from flashrec.kernels.backend import interpreting, launch_warps, next_pow2, use_triton
from flashrec.kernels.fp8 import FP8_DTYPE, per_token_quant_fp8_ref

__all__ = [
    "rms_norm",
    "rms_norm_quant_fp8",
    "rms_norm_quant_fp8_ref",
    "rms_norm_quant_fp8_triton",
    "rms_norm_ref",
    "rms_norm_triton",
]


def _residual_out(res_out: torch.Tensor, m: int, h: int, dtype: torch.dtype) -> torch.Tensor:
    """``res_out`` as the [m, h] contiguous rows the new residual is written to."""
    if res_out.dtype != dtype or res_out.numel() != m * h or not res_out.is_contiguous():
        raise ValueError(f"res_out must be {m} x {h} contiguous {dtype}")
    return res_out.view(m, h)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Residual add +) RMSNorm over the last dim. Returns ``(y, residual_out)``.

    ``residual_out`` is ``x + residual`` rounded to ``x.dtype``, or ``x`` itself when
    ``residual`` is None. ``y`` has ``x.dtype``. ``res_out`` (with a residual): the tensor
    the new residual is written to and returned as (it may be ``residual`` itself).
    """
    dt = x.dtype
    s = x if residual is None else (x.float() + residual.float()).to(dt)
    sf = s.float()
    normed = (sf * torch.rsqrt(sf.square().mean(dim=-1, keepdim=True) + eps)).to(dt)
    y = (normed.float() * weight.float()).to(dt)
    if residual is not None and res_out is not None:
        h = x.shape[-1]
        _residual_out(res_out, s.numel() // h, h, dt).copy_(s.reshape(-1, h))
        s = res_out.view(s.shape)
    return y, s


def rms_norm_quant_fp8_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rms_norm_ref` followed by per-token e4m3 quantization.

    Returns ``(y_fp8 [M, H], scale [M, 1] float32, residual_out [M, H])``.
    """
    y, res_out = rms_norm_ref(x, weight, eps, residual, res_out)
    y_fp8, scale = per_token_quant_fp8_ref(y)
    return y_fp8, scale, res_out


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    quant: bool,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    from flashrec.kernels.tl.rms import rms_norm_kernel

    h = x.shape[-1]
    if weight.shape != (h,):
        raise ValueError(f"weight shape {tuple(weight.shape)} != ({h},)")
    x2 = x.reshape(-1, h)
    r2 = None if residual is None else residual.reshape(-1, h)
    if x2.stride(-1) != 1 or (r2 is not None and r2.stride(-1) != 1):
        raise ValueError("x and residual need a unit last-dim stride")
    m = x2.shape[0]
    y = torch.empty((m, h), dtype=FP8_DTYPE if quant else x.dtype, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device) if quant else None
    if r2 is None:
        res_out = x2
    elif res_out is None:
        res_out = torch.empty((m, h), dtype=x.dtype, device=x.device)
    else:  # one program reads its whole row before it writes it: ``residual`` itself may do
        res_out = _residual_out(res_out, m, h, x.dtype)
    if m > 0:
        block = next_pow2(h)
        rms_norm_kernel[(m,)](
            x2, x2.stride(0),
            x2 if r2 is None else r2, 0 if r2 is None else r2.stride(0),
            weight, y, res_out, y if scale is None else scale,
            h, eps,
            BLOCK=block, HAS_RESIDUAL=r2 is not None, QUANT=quant, EMULATE=interpreting(),
            num_warps=launch_warps(block),
        )  # fmt: skip
    lead = x.shape[:-1]
    res_out = x if r2 is None else res_out.reshape(*lead, h)
    return y.view(*lead, h), None if scale is None else scale.view(*lead, 1), res_out


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`rms_norm_ref` (one program per token)."""
    y, _, res_out = _launch(x, weight, eps, residual, quant=False, res_out=res_out)
    return y, res_out


def rms_norm_quant_fp8_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of :func:`rms_norm_quant_fp8_ref`: one pass, ``y`` never hits memory."""
    y, scale, res_out = _launch(x, weight, eps, residual, quant=True, res_out=res_out)
    assert scale is not None
    return y, scale, res_out


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Residual add +) RMSNorm: Triton on CUDA when available, else :func:`rms_norm_ref`."""
    if use_triton(x):
        return rms_norm_triton(x, weight, eps, residual, res_out)
    return rms_norm_ref(x, weight, eps, residual, res_out)


def rms_norm_quant_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    res_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused (residual add +) RMSNorm -> per-token e4m3: ``(y_fp8, scale, residual_out)``
    (``res_out``: as in :func:`rms_norm_ref`)."""
    if use_triton(x):
        return rms_norm_quant_fp8_triton(x, weight, eps, residual, res_out)
    return rms_norm_quant_fp8_ref(x, weight, eps, residual, res_out)
