"""Which kernel implementation runs: Triton on CUDA tensors when Triton imports, else the reference.

Triton is optional. Nothing in ``flashrec.kernels`` imports it at module import time; the
Triton kernels live in ``flashrec.kernels.tl`` and are imported on first use.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

__all__ = ["interpreting", "launch_warps", "next_pow2", "triton_available", "use_triton"]


@functools.cache
def triton_available() -> bool:
    """True when ``import triton`` succeeds (cached for the process)."""
    try:
        importlib.import_module("triton")
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether the dispatching wrappers should take the Triton path for these inputs."""
    return all(t.is_cuda for t in tensors) and triton_available()


def launch_warps(block: int) -> int:
    """Warps for a one-row-per-program kernel whose row tile has ``block`` elements."""
    return max(1, min(16, block // 256))


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for n <= 1): Triton tile sizes must be powers of 2."""
    return 1 << max(0, (n - 1).bit_length())
