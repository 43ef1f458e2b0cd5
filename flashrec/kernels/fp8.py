"""FP8 (e4m3) quantization and the FP8 linear layer.

Weights are quantized once at load time with one scale per output channel; activations are
quantized per token at run time. The GEMM on CUDA is ``torch._scaled_mm`` with row-wise
scales (Hopper / Ada); everywhere else it is the float32 reference below.

Layout (NOTE): ``w_fp8`` stays row-major ``[N, K]``; ``w_fp8.t()`` is then the column-major
``[K, N]`` operand that ``_scaled_mm`` wants, without a copy. ``_scaled_mm`` needs K and N to
be multiples of 16; M (tokens) is free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from flashrec.kernels.backend import interpreting, launch_warps, next_pow2, use_triton

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "SCALE_FLOOR",
    "dequantize",
    "fp8_gemm_supported",
    "fp8_linear",
    "fp8_linear_ref",
    "fp8_linear_scaled_mm",
    "per_token_quant_fp8",
    "per_token_quant_fp8_ref",
    "per_token_quant_fp8_triton",
    "quantize_weight_per_channel",
    "quantize_rows",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_FLOOR = 1e-12
"""Smallest scale; an all-zero row gets this scale (and zero codes) instead of 0 and inf."""


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``x`` [M, K] to e4m3 with scale = max(absmax / 448, SCALE_FLOOR).

    Returns ``(codes [M, K] float8_e4m3fn, scale [M, 1] float32)``; ``codes * scale ~= x``.
    The fp32 steps are exactly those of the Triton kernels: ``scale = absmax * fp32(1/448)``,
    ``codes = e4m3(clamp(x * (1 / scale), +-448))`` (IEEE multiply and reciprocal).
    """
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) * (1.0 / FP8_MAX)).clamp_min(SCALE_FLOOR)
    codes = (xf * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel e4m3 quantization of a linear weight ``w`` [N, K] (load time).

    Returns ``(w_fp8 [N, K] row-major, scale [N, 1] float32)``.
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    codes, scale = quantize_rows(w)
    return codes.contiguous(), scale.contiguous()


def dequantize(
    codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``codes * scale`` in float32, returned in ``dtype`` (scale broadcasts, e.g. [N, 1])."""
    return (codes.float() * scale.float()).to(dtype)


# ----------------------------------------------------------------------------- per-token quant


def per_token_quant_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of activations ``x`` [M, K] (reference)."""
    return quantize_rows(x)


def per_token_quant_fp8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`per_token_quant_fp8_ref` (one program per token)."""
    from flashrec.kernels.tl.quant import per_token_quant_kernel

    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("x must be 2-D with a unit last-dim stride")
    m, k = x.shape
    out = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return out, scale
    block = next_pow2(k)
    per_token_quant_kernel[(m,)](
        x, x.stride(0), out, scale, k,
        BLOCK=block, EMULATE=interpreting(), num_warps=launch_warps(block),
    )  # fmt: skip
    return out, scale


def e4m3_probe_values(n: int, seed: int = 0) -> torch.Tensor:
    """fp32 values (CPU) that test an fp32 -> e4m3 conversion: ``n`` random bit patterns with
    |x| in [2**-12, 480] (subnormal, normal and saturating ranges), every e4m3 midpoint (a tie)
    and its fp32 neighbours on both sides, each with both signs, clamped to +-448 as the
    kernels clamp before converting."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0x39800000, 0x43F00000, (n,), generator=g, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    codes = codes[torch.isfinite(codes)].unique()
    mid = (codes[1:] + codes[:-1]) / 2
    up = torch.nextafter(mid, torch.full_like(mid, 1e9))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    x = torch.cat([x, mid, up, down])
    return torch.cat([x, -x]).clamp(-FP8_MAX, FP8_MAX)


def to_fp8_triton(x: torch.Tensor, emulate: bool = True, hw: bool = False) -> torch.Tensor:
    """``x`` (fp32) clamped to +-448 and converted to e4m3 elementwise by the kernels' shared
    ``to_fp8``: ``emulate`` rounds in integer arithmetic (what the CPU interpreter needs and
    the q/k RoPE kernel's emulated form uses), ``hw`` (GPU) takes the hardware conversion even
    so. For checks against PyTorch's conversion (tests/kernels and the e4m3 conversion probe)."""
    from flashrec.kernels.tl.quant import to_fp8_kernel

    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32, got {x.dtype}")
    if hw and interpreting():
        raise ValueError("hw needs a GPU: the CPU interpreter runs no hardware conversion")
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if x.numel():
        block = 1024
        to_fp8_kernel[(-(-x.numel() // block),)](
            x, out, x.numel(), EMULATE=emulate, HW=hw, BLOCK=block
        )
    return out


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token e4m3 quantization: ``(x_fp8 [M, K], scale [M, 1] float32)``."""
    if use_triton(x):
        return per_token_quant_fp8_triton(x)
    return per_token_quant_fp8_ref(x)


# ----------------------------------------------------------------------------- linear


def fp8_linear_ref(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    matmul_nt: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``(x_fp8 * x_scale) @ (w_fp8 * w_scale).T`` in float32, cast to ``out_dtype``, + bias.

    Shapes: x_fp8 [M, K], x_scale [M, 1], w_fp8 [N, K], w_scale [N, 1] -> [M, N]. The bias is
    added after the cast, in ``out_dtype``, exactly as :func:`fp8_linear_scaled_mm` does.
    ``matmul_nt(a, b)``: the fp32 product ``a @ b.T`` (default one library GEMM; the
    batch-invariant path passes its fixed-order one).
    """
    x, w = dequantize(x_fp8, x_scale), dequantize(w_fp8, w_scale)
    out = (x @ w.t() if matmul_nt is None else matmul_nt(x, w)).to(out_dtype)
    if bias is not None:
        out = out + bias.to(out_dtype)
    return out


def fp8_linear_scaled_mm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`fp8_linear_ref` on CUDA through ``torch._scaled_mm`` with row-wise scales.

    Requirements: K and N multiples of 16 (checked), ``w_fp8`` row-major [N, K] (so its
    transpose is column-major), fp32 scales. ``use_fast_accum=True``. Row-wise scaling is
    documented for bf16 output; other ``out_dtype`` values are passed to torch as they are.
    ``out``: a contiguous [M, N] tensor the GEMM writes (without a bias: no copy).
    """
    m, k = x_fp8.shape
    n = w_fp8.shape[0]
    if k % 16 or n % 16:
        raise ValueError(f"_scaled_mm needs K and N to be multiples of 16, got K={k}, N={n}")
    if w_fp8.shape[1] != k:
        raise ValueError(f"shape mismatch: x {tuple(x_fp8.shape)} vs w {tuple(w_fp8.shape)}")
    if m == 0:
        return torch.empty((0, n), dtype=out_dtype, device=x_fp8.device)
    args = (x_fp8.contiguous(), w_fp8.contiguous().t())
    kw = {
        "scale_a": x_scale.float().reshape(m, 1).contiguous(),
        "scale_b": w_scale.float().reshape(1, n).contiguous(),
        "out_dtype": out_dtype,
        "use_fast_accum": True,
    }
    if out is not None and bias is None:
        return torch._scaled_mm(*args, **kw, out=out)
    res = torch._scaled_mm(*args, **kw)
    if bias is not None:
        res = res + bias.to(out_dtype)
    return res if out is None else out.copy_(res)


def fp8_linear(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 linear: ``_scaled_mm`` on FP8-capable GPUs (sm_89+) for bf16 output, else the
    float32 reference (CPU, older GPUs, other output dtypes). ``out``: the [M, N] result
    goes there (written by the GEMM on the fast path, copied otherwise). The library picks its
    GEMM kernel by shape, so a row's bits may depend on the batch; ``--deterministic`` takes
    :func:`flashrec.kernels.invariant.fp8_linear_batch_invariant` instead."""
    fast = out_dtype == torch.bfloat16 and x_fp8.is_cuda
    if fast and fp8_gemm_supported(x_fp8.device.index):
        return fp8_linear_scaled_mm(x_fp8, x_scale, w_fp8, w_scale, bias, out_dtype, out)
    res = fp8_linear_ref(x_fp8, x_scale, w_fp8, w_scale, bias, out_dtype)
    return res if out is None else out.copy_(res)


@functools.cache
def fp8_gemm_supported(device_index: int | None) -> bool:
    """Whether CUDA device ``device_index`` runs FP8 GEMMs (sm_89+: Ada, Hopper and later)."""
    return torch.cuda.get_device_capability(device_index) >= (8, 9)
