"""NeoX-style rotary embedding (rotate_half pairs i and i + D/2), HF default RoPE frequencies."""

from __future__ import annotations

import torch


def build_cos_sin(max_pos: int, head_dim: int, theta: float, device=None) -> torch.Tensor:
    """[max_pos, head_dim] float32: cos in the first D/2 columns, sin in the last D/2."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    t = torch.arange(max_pos, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> rotated copy. cos/sin are cast to x's dtype first (as HF does)."""
    half = x.shape[-1] // 2
    cs = cos_sin[positions]
    cos = cs[:, :half].to(x.dtype)
    sin = cs[:, half:].to(x.dtype)
    cos = torch.cat([cos, cos], dim=-1).unsqueeze(1)
    sin = torch.cat([sin, sin], dim=-1).unsqueeze(1)
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin
