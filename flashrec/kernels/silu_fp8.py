"""SiLU-and-multiply of a fused gate/up projection, optionally fused with per-token FP8 quant.

``gate_up`` is [M, 2I]: gate = ``gate_up[:, :I]``, up = ``gate_up[:, I:]``. Math, matching
HF transformers' ``act_fn(gate_proj(x)) * up_proj(x)`` in the activation dtype ``dt``::

    a = dt(silu(gate))     # in fp32
    y = dt(a * up)

The quantized variant returns ``per_token_quant_fp8(y)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrec.kernels.backend import interpreting, launch_warps, next_pow2, use_triton
from flashrec.kernels.fp8 import FP8_DTYPE, per_token_quant_fp8_ref

__all__ = [
    "silu_mul",
    "silu_mul_quant_fp8",
    "silu_mul_quant_fp8_ref",
    "silu_mul_quant_fp8_triton",
    "silu_mul_ref",
    "silu_mul_triton",
]

_MAX_BLOCK = 16384
"""Column tile of the Triton kernel. Rows up to this width are read once (the row stays in
registers); wider rows are walked in tiles (two passes when quantizing). 8192 covers the
1.7B-class intermediate sizes (6144, 8960) in one tile."""


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` over the last dim, in ``gate_up.dtype``: [..., 2I] -> [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    dt = gate_up.dtype
    act = F.silu(gate.float()).to(dt)
    return (act.float() * up.float()).to(dt)


def silu_mul_quant_fp8_ref(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`silu_mul_ref` followed by per-token e4m3: ``(y_fp8 [M, I], scale [M, 1])``."""
    return per_token_quant_fp8_ref(silu_mul_ref(gate_up))


def quant_row_warps(rows: int) -> int:
    """Warps of the quantizing launch when a whole row is one 8,192-lane tile (OneRec-1.7B's
    6,144 columns; other widths keep ``launch_warps``), by rows: 4 below 8,192 rows, 8 from
    there, the fastest of 4-32 in ``bench_kernels.py --silu-sweep`` (docs/baselines.md). The
    warp count changes only the launch, never the codes or scales written."""
    return 4 if rows < 8192 else 8


def _launch(
    gate_up: torch.Tensor, quant: bool, num_warps: int | None = None, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num_warps`` and ``block`` (the column tile, a power of two) are launch settings for
    tuning sweeps (``bench_kernels.py --silu-sweep``); None = the whole row in one tile up to
    ``_MAX_BLOCK`` and, for it, ``quant_row_warps`` when quantizing an 8,192-lane row, else
    ``launch_warps`` of the tile. Each program still owns one whole row, so the values
    written do not depend on them beyond the order of the absmax reduction."""
    from flashrec.kernels.tl.silu import silu_mul_kernel

    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"last dim of gate_up must be even, got {two_i}")
    inter = two_i // 2
    gu = gate_up.reshape(-1, two_i)
    if gu.stride(-1) != 1:
        raise ValueError("gate_up needs a unit last-dim stride")
    m = gu.shape[0]
    y = torch.empty((m, inter), dtype=FP8_DTYPE if quant else gate_up.dtype, device=gu.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=gu.device) if quant else None
    if m > 0:
        if block is None:
            block = min(next_pow2(inter), _MAX_BLOCK)
        elif block <= 0 or block & (block - 1):
            raise ValueError(f"block must be a power of two, got {block}")
        tiles = -(-inter // block)
        if num_warps is None:
            row_tile = quant and tiles == 1 and block == 8192  # the launch quant_row_warps tunes
            num_warps = quant_row_warps(m) if row_tile else launch_warps(block)
        silu_mul_kernel[(m,)](
            gu, gu.stride(0), y, y if scale is None else scale, inter,
            BLOCK=block, NUM_TILES=tiles, QUANT=quant, EMULATE=interpreting(),
            num_warps=num_warps,
        )  # fmt: skip
    lead = gate_up.shape[:-1]
    return y.view(*lead, inter), None if scale is None else scale.view(*lead, 1)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Triton version of :func:`silu_mul_ref` (one program per token)."""
    return _launch(gate_up, quant=False)[0]


def silu_mul_quant_fp8_triton(
    gate_up: torch.Tensor, num_warps: int | None = None, block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`silu_mul_quant_fp8_ref`; ``y`` never hits memory in bf16."""
    y, scale = _launch(gate_up, quant=True, num_warps=num_warps, block=block)
    assert scale is not None
    return y, scale


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``: Triton on CUDA when available, else :func:`silu_mul_ref`."""
    if use_triton(gate_up):
        return silu_mul_triton(gate_up)
    return silu_mul_ref(gate_up)


def silu_mul_quant_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``silu(gate) * up`` -> per-token e4m3: ``(y_fp8 [M, I], scale [M, 1] float32)``."""
    if use_triton(gate_up):
        return silu_mul_quant_fp8_triton(gate_up)
    return silu_mul_quant_fp8_ref(gate_up)
