"""Qwen3 dense decoder, declarative. Fused ``qkv_proj`` / ``gate_up_proj`` (merged by the
loader), per-head q/k RMSNorm before NeoX RoPE, residual dual stream, FP8 dual path.

The same module serves Llama and Qwen2 (registered as thin subclasses): no q/k norm, and
Qwen2's q/k/v biases, come from ``ModelConfig.qk_norm`` / ``qkv_bias`` / ``o_bias``. Without
q/k norm the fused kernel is called with no norm weights (it skips the norm) and the eager
path skips it too; no weight is ever substituted.
"""

from __future__ import annotations

import torch
from torch import nn

from flashrec.config import ModelConfig
from flashrec.layers.linear import Linear
from flashrec.layers.norm import RMSNorm
from flashrec.layers.rotary import apply_rope
from flashrec.profiler import trace_range


class Attention(nn.Module):
    """No ``forward``: the layer runs ``project`` -> ``attend`` -> ``o_proj`` (the piecewise
    prefill graphs are cut between them)."""

    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def project(self, x, positions, meta, ctx, x_fp8=None, a_scale=None, qkv_out=None):
        """QKV projection, q/k norm and RoPE (plus the KV write, when the fused kernel does it):
        ``(q, k, v, stored)``. ``qkv_out``: the [T, (Hq + 2 Hkv) D] rows the GEMM writes (the
        fused kernel then works in place there, so q/k/v are views of it)."""
        qkv = (
            self.qkv_proj(x, out=qkv_out)
            if x_fp8 is None
            else self.qkv_proj.forward_fp8(x_fp8, a_scale, x.dtype, out=qkv_out)
        )
        t = qkv.shape[0]
        # zero-copy per-head views into the fused GEMM output
        q = qkv[:, : self.hq * self.d].view(t, self.hq, self.d)
        k = qkv[:, self.hq * self.d : (self.hq + self.hkv) * self.d].view(t, self.hkv, self.d)
        v = qkv[:, (self.hq + self.hkv) * self.d :].view(t, self.hkv, self.d)
        if ctx.fused_qk_rope_kv is not None:
            return ctx.fused_qk_rope_kv(self, qkv, positions, meta)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions, ctx.cos_sin)
        k = apply_rope(k, positions, ctx.cos_sin)
        return q, k, v, False

    def attend(self, q, k, v, stored, meta, ctx, out=None) -> torch.Tensor:
        """Attention through the context's backend: ``[T, Hq*D]`` (before ``o_proj``); in
        ``out`` where the backend can write there (``AttentionBackend.forward``)."""
        q = q if ctx.attn.takes_strided_q(meta) else q.contiguous()
        return ctx.attn.forward(q, k, v, self.layer_id, meta, skip_store=stored, out=out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x, ctx, x_fp8=None, a_scale=None) -> torch.Tensor:
        gu = (
            self.gate_up_proj(x)
            if x_fp8 is None
            else self.gate_up_proj.forward_fp8(x_fp8, a_scale, x.dtype)
        )
        if ctx.fused_silu_fp8 and self.down_proj.is_fp8:
            from flashrec.kernels.silu_fp8 import silu_mul_quant_fp8

            y8, s = silu_mul_quant_fp8(gu)
            return self.down_proj.forward_fp8(y8, s, x.dtype)
        if ctx.fused_silu:
            from flashrec.kernels.silu_fp8 import silu_mul_triton

            return self.down_proj(silu_mul_triton(gu))
        gate, up = gu[:, : self.inter], gu[:, self.inter :]
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def _use_fused_quant(self, ctx) -> bool:
        return ctx.fused_rms_fp8 and self.self_attn.qkv_proj.is_fp8

    def pre(self, x, residual, positions, meta, ctx, qkv_out=None, residual_out=None):
        """The layer up to attention: (residual add +) input norm, QKV, q/k norm, RoPE (and KV
        write). Returns ``(q, k, v, stored, residual)``. ``x``: the previous layer's MLP output
        (the embeddings for layer 0, with ``residual`` None). ``qkv_out`` / ``residual_out``:
        static rows that receive the QKV output and the new residual (the piecewise graphs')."""
        if self._use_fused_quant(ctx):
            x8, s, residual = self.input_layernorm.quant_fp8(x, residual, residual_out)
            # ``residual`` only carries the activation dtype here: the GEMM reads the FP8 input
            q, k, v, stored = self.self_attn.project(
                residual, positions, meta, ctx, x8, s, qkv_out=qkv_out
            )
            return q, k, v, stored, residual
        f = ctx.fused_rms
        if residual is None:
            residual = x
            x = self.input_layernorm(x, fused=f)
        else:
            x, residual = self.input_layernorm(x, residual, fused=f, res_out=residual_out)
        return (*self.self_attn.project(x, positions, meta, ctx, qkv_out=qkv_out), residual)

    def post(self, attn, residual, ctx, residual_out=None):
        """The layer after attention: ``o_proj``, residual add + norm, MLP. Returns
        ``(mlp_out, residual)`` (the residual in ``residual_out`` when given)."""
        h = self.self_attn.o_proj(attn)
        if self._use_fused_quant(ctx):
            # h only carries the activation dtype below: the GEMMs read the FP8 inputs
            x8, s, residual = self.post_attention_layernorm.quant_fp8(h, residual, residual_out)
            return self.mlp(h, ctx, x8, s), residual
        h, residual = self.post_attention_layernorm(
            h, residual, fused=ctx.fused_rms, res_out=residual_out
        )
        return self.mlp(h, ctx), residual

    def forward(self, x, residual, positions, meta, ctx, rows: torch.Tensor | None = None):
        """``rows``: after attention, only these rows go on (o_proj, norm, MLP); every token's
        q/k/v and K/V are still computed (the last layer of a prefill, whose other rows no
        logit reads)."""
        q, k, v, stored, residual = self.pre(x, residual, positions, meta, ctx)
        attn = self.self_attn.attend(q, k, v, stored, meta, ctx)
        if rows is not None:
            attn, residual = attn[rows], residual[rows]
        return self.post(attn, residual, ctx)


class Qwen3ForCausalLM(nn.Module):
    """``forward`` returns the final-normed hidden states of the rows in ``select`` (all rows
    when None); the LM head is applied by ``RestrictedLMHead`` on ``lm_head()`` rows. With
    ``ctx.last_rows`` the rows are selected in the last layer, right after attention (a
    prefill then runs that layer's o_proj and MLP on one row per prompt)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head_weight = (
            None
            if cfg.tie_word_embeddings
            else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        )

    def lm_head(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head_weight is None else self.lm_head_weight

    def forward(self, input_ids, positions, meta, ctx, select: torch.Tensor | None = None):
        x = self.embed_tokens(input_ids)
        residual = None
        # with ctx.last_rows the last layer drops the unselected rows right after attention
        rows = select if ctx.last_rows and self.layers else None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            with trace_range("flashrec.layer"):
                x, residual = layer(x, residual, positions, meta, ctx, rows if i == last else None)
        return self.final(x, residual, ctx, select if rows is None else None)

    def final(self, x, residual, ctx, select: torch.Tensor | None = None) -> torch.Tensor:
        """The final residual add + norm over the rows in ``select`` (all when None)."""
        if select is not None:
            x, residual = x[select], residual[select]
        x, _ = self.norm(x, residual, fused=ctx.fused_rms)
        return x


class LlamaForCausalLM(Qwen3ForCausalLM):
    """Llama dense decoder: no q/k norm (from the config), otherwise the same modules."""


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    """Qwen2 dense decoder: q/k/v biases, no q/k norm (from the config)."""
