"""Triton kernel: ``C = A @ W.T`` with a fixed tile shape and one sequential K loop (no split-K,
no autotuning), so every output element is reduced in the same order whatever M is: the
batch-invariant GEMM of ``--deterministic`` (``flashrec.kernels.invariant``).

``SCALED``: A and W are e4m3 codes, and the fp32 accumulator is multiplied by the row scale of
A and the row scale of W (W8A8 per token x per channel) before the cast.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def matmul_nt_kernel(
    a_ptr, w_ptr, c_ptr, bias_ptr, a_scale_ptr, w_scale_ptr,
    M, N, K, stride_am, stride_wn, stride_cm,
    HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One program per ``BLOCK_M x BLOCK_N`` output tile (grouped along M for L2 reuse); K is
    walked from 0 in ``BLOCK_K`` steps by this program alone."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    w_ptrs = w_ptr + rn[None, :] * stride_wn + rk[:, None]  # [BLOCK_K, BLOCK_N] view of W.T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(rn[None, :] < N) & (rk[:, None] < k_left), other=0.0)
        if IEEE:  # fp32 operands: full-precision products, as torch's fp32 matmul
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SCALED:
        sa = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
        sw = tl.load(w_scale_ptr + rn, mask=rn < N, other=0.0)
        acc = acc * sa[:, None] * sw[None, :]
    c = acc.to(c_ptr.dtype.element_ty)
    if HAS_BIAS:  # added after the cast, in the output dtype, as the default path does
        c = c + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(c_ptr.dtype.element_ty)
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], c, mask=c_mask)
