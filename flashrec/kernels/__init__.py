"""Fused kernels, each a plain-PyTorch reference (also the CPU path) beside a Triton kernel.

Every op ``<name>`` comes as ``<name>_ref``, ``<name>_triton`` and the dispatcher ``<name>``
(Triton for CUDA tensors when Triton imports, else the reference):

- ``fp8``: e4m3 weight / per-token quantization, ``fp8_linear`` (``torch._scaled_mm``)
- ``rms_fp8``: (residual add +) RMSNorm, optionally fused with per-token FP8 quant
- ``silu_fp8``: SiLU(gate) * up, optionally fused with per-token FP8 quant
- ``qk_rope_kv``: per-head q/k RMSNorm + NeoX RoPE in place + KV-cache write
- ``beam_attention``: shared-prompt beam-decode attention
- ``invariant``: the batch-invariant GEMMs of ``--deterministic`` (``matmul_nt``, ``linear``,
  ``fp8_linear_batch_invariant``)
- ``backend``: Triton availability and dispatch; ``tl/``: the Triton kernels (lazy imports)
"""
