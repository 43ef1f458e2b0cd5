"""Fixtures for the kernel tests: where Triton kernels run, and ulp-aware comparisons.

``triton_backend`` is parametrized over
  * ``cuda``: compiled Triton on the GPU (marked ``gpu``; skipped without CUDA),
  * ``interpret``: Triton's CPU interpreter. ``triton.jit`` picks interpreted vs compiled when
    a function is decorated, and Triton is imported at collection time (transformers imports
    it), so these cases run only in a process started with ``TRITON_INTERPRET=1``;
    ``test_kernel_interpreter.py`` starts one. Kernels round like the references there, so
    only reduction order and the last bit of fp32 ``exp`` can flip a rounding: the allowed
    fraction of differing elements is tighter than on the GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class TritonBackend:
    """Where the Triton kernels of one test run."""

    device: str
    max_frac: float  # fraction of elements allowed to differ (by ~1 ulp) from the reference


def _interpreted() -> bool:
    """Whether Triton and our kernels were loaded in interpreter mode."""
    from triton.runtime.interpreter import InterpretedFunction

    std = importlib.import_module("triton.language.standard")
    if not isinstance(std.max, InterpretedFunction):
        return False
    for name, mod in list(sys.modules.items()):
        if name.startswith("flashrec.kernels.tl.") and mod is not None:
            for obj in vars(mod).values():
                if hasattr(obj, "fn") and hasattr(obj, "run"):
                    return isinstance(obj, InterpretedFunction)
    return True


@pytest.fixture(
    params=[
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs CUDA + triton"),
            ],
        ),
        pytest.param(
            "interpret",
            marks=pytest.mark.skipif(
                HAS_CUDA or not HAS_TRITON or not INTERPRET,
                reason="needs TRITON_INTERPRET=1, triton and no GPU (test_kernel_interpreter.py)",
            ),
        ),
    ]
)
def triton_backend(request: pytest.FixtureRequest) -> Iterator[TritonBackend]:
    """The device Triton kernels run on in this test (see the module docstring)."""
    if request.param == "cuda":
        yield TritonBackend(device="cuda", max_frac=0.02)
        return
    if not _interpreted():
        pytest.skip("Triton was imported in compiled mode before TRITON_INTERPRET was set")
    yield TritonBackend(device="cpu", max_frac=0.002)


def _ulp_check(
    actual: torch.Tensor, expected: torch.Tensor, exact: bool, rel: float, max_frac: float
) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    a, e = actual.float(), expected.float()
    assert bool(torch.isfinite(a).all()) == bool(torch.isfinite(e).all())
    if exact:
        torch.testing.assert_close(a, e, rtol=0, atol=0)
        return
    differ = a != e
    frac = differ.float().mean().item() if a.numel() else 0.0
    assert frac <= max_frac, f"{frac:.4%} of elements differ (allowed {max_frac:.2%})"
    # A differing element is off by at most ~one rounding step of the largest value around.
    bound = rel * e.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    err = (a - e).abs()
    worst = (err - bound).max().item() if a.numel() else 0.0
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the per-row bound"


@pytest.fixture
def assert_act_close() -> Callable[..., None]:
    """Compare activations (bf16/fp16/fp32): exact, or few elements off by ~1 ulp of the row."""

    def check(
        actual: torch.Tensor, expected: torch.Tensor, exact: bool = False, max_frac: float = 0.02
    ) -> None:
        rel = {torch.bfloat16: 2**-6, torch.float16: 2**-9}.get(expected.dtype, 1e-5)
        _ulp_check(actual, expected, exact, rel, max_frac)

    return check


@pytest.fixture
def assert_fp8_close() -> Callable[..., None]:
    """Compare per-token e4m3 quantizations ``(codes, scale)`` via their dequantized values."""

    def check(
        actual: tuple[torch.Tensor, torch.Tensor],
        expected: tuple[torch.Tensor, torch.Tensor],
        exact: bool = False,
        max_frac: float = 0.02,
    ) -> None:
        (qa, sa), (qe, se) = actual, expected
        assert qa.dtype == qe.dtype == torch.float8_e4m3fn
        assert sa.dtype == se.dtype == torch.float32 and sa.shape == se.shape
        torch.testing.assert_close(sa, se, rtol=0 if exact else 2**-7, atol=0)
        # One e4m3 step is 2**-3 relative at the top of a binade; the row max is 448 * scale.
        _ulp_check(qa.float() * sa, qe.float() * se, exact, 2**-3 + 2**-7, max_frac)

    return check
