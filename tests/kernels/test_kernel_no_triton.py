"""The kernels package imports and runs (reference paths) where Triton cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import sys

    class _NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("triton blocked for this test")
            return None

    sys.meta_path.insert(0, _NoTriton())

    import torch
    from flashrec.kernels import backend, fp8, qk_rope_kv, rms_fp8, silu_fp8

    assert not backend.triton_available()
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    fp8.per_token_quant_fp8(x)
    rms_fp8.rms_norm_quant_fp8(x, torch.ones(32, dtype=torch.bfloat16), 1e-6, residual=x)
    silu_fp8.silu_mul_quant_fp8(x)
    qkv = torch.randn(3, 4 * 8, dtype=torch.bfloat16)
    qk_rope_kv.qk_norm_rope_store(
        qkv, 2, 1, 8, torch.arange(3), qk_rope_kv.build_cos_sin(16, 8, 1e4), None, None, 1e-6,
        None, None, None,
    )
    assert not any(m == "triton" or m.startswith("triton.") for m in sys.modules)
    print("ok")
    """
)


def test_imports_and_runs_without_triton() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
