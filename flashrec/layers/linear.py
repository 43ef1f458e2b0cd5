"""Linear layers: unquantized (bf16/fp32) or FP8 W8A8 per channel.

The FP8 path keeps ``weight`` as float8_e4m3fn [out, in] with ``weight_scale`` [out, 1] fp32
and quantizes activations per token on the fly. ``forward_fp8`` takes an activation that an
upstream fused kernel already quantized (the "FP8 dual path"), so no extra quant kernel runs.
"""

from __future__ import annotations

import torch
from torch import nn

from flashrec.kernels import fp8 as fp8k
from flashrec.kernels import gemm_choice, invariant


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight_scale: torch.Tensor | None = None
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    @property
    def is_fp8(self) -> bool:
        return self.weight.dtype == fp8k.FP8_DTYPE

    def load(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor | None = None,
        quantize_fp8: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Set the weight from a checkpoint tensor (shape checked by the loader)."""
        if weight.dtype == fp8k.FP8_DTYPE:
            if weight_scale is None:
                raise ValueError("FP8 weight without weight_scale")
            self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
            self.weight_scale = weight_scale.float().reshape(-1, 1).contiguous()
        elif quantize_fp8:
            w8, scale = fp8k.quantize_weight_per_channel(weight.float())
            self.weight = nn.Parameter(w8, requires_grad=False)
            self.weight_scale = scale
        else:
            self.weight = nn.Parameter(
                weight.to(dtype or weight.dtype).contiguous(), requires_grad=False
            )
            self.weight_scale = None

    def _apply(self, fn, recurse=True):  # keep weight_scale on the module's device
        super()._apply(fn, recurse)
        if self.weight_scale is not None:
            self.weight_scale = self.weight_scale.to(self.weight.device)
        return self

    def _tile(self, x: torch.Tensor, dtype: torch.dtype) -> gemm_choice.Tile | None:
        """The Triton tile ``FLASHREC_DECODE_GEMM=tuned`` chose for this GEMM's shape, if any."""
        return gemm_choice.choice(x.shape[0], self.out_features, self.in_features, dtype)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.is_fp8:
            return fp8k.dequantize(self.weight, self.weight_scale).to(dtype)
        return self.weight.to(dtype)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ b)``; ``out``: a contiguous tensor of the result's shape that receives
        it (the plain GEMM without a bias and the FP8 GEMM write it; other paths copy)."""
        if not self.is_fp8:
            if invariant.active():  # --deterministic decode: a fixed reduction order per row
                res = invariant.linear(x, self.weight, self.bias)
            elif self.bias is None and x.dim() == 2 and (tile := self._tile(x, x.dtype)):
                return gemm_choice.triton_linear(x, self.weight, tile, out=out)
            elif out is not None and self.bias is None and x.dim() == 2:
                return torch.mm(x, self.weight.t(), out=out)
            else:
                res = nn.functional.linear(x, self.weight, self.bias)
            return res if out is None else out.copy_(res)
        x_fp8, scale = fp8k.per_token_quant_fp8(x)
        return self.forward_fp8(x_fp8, scale, out_dtype=x.dtype, out=out)

    def forward_fp8(
        self,
        x_fp8: torch.Tensor,
        a_scale: torch.Tensor,
        out_dtype: torch.dtype = torch.bfloat16,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """GEMM on an activation that was already quantized per token upstream."""
        assert self.is_fp8, "forward_fp8 on an unquantized Linear"
        w, s, b = self.weight, self.weight_scale, self.bias
        if b is None and x_fp8.dim() == 2 and not invariant.active():
            tile = self._tile(x_fp8, fp8k.FP8_DTYPE)
            if tile is not None:
                return gemm_choice.triton_linear(
                    x_fp8, w, tile, a_scale.float(), s, out_dtype=out_dtype, out=out
                )
        linear = invariant.fp8_linear_batch_invariant if invariant.active() else fp8k.fp8_linear
        return linear(x_fp8, a_scale, w, s, b, out_dtype=out_dtype, out=out)
