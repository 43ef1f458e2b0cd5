"""Calibrate a synthetic model's next-SID confidence to a target mean per-step entropy.

A trained generative recommender's next-SID-code distribution has a few nats of entropy over
thousands of codes; a random-init model's is whatever its init gives. Logits are linear in
the final RMSNorm weight (``model.norm.weight``), so scaling it by ``g`` scales every logit by
``g`` and leaves the argmax alone. ``calibrate_sid_entropy`` runs the model (float32 draws of the
checkpoint's own weights, computed in float64 so the result does not depend on the device) on a
few synthetic prompts, collects each SID level's logits under the level scope (log-softmax over
that level's codebook rows of the LM head, the engine's default ``--logprob-scope level``) after
the prompt and after the greedy codes of the earlier levels, and bisects ``g`` so the mean
entropy over prompts and levels equals the target. ``g`` is rounded to ``G_DIGITS`` significant
digits, so float64 noise between devices does not change the checkpoint's bytes; the weights are
drawn in float32 before any dtype cast, so float32, bf16 and fp8 builds of a seed get the same g.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from flashrec.synth.presets import SynthPreset
from flashrec.synth.prompts import synth_prompts
from flashrec.synth.tokenizer import SID_BEGIN, TokenLayout, build_tokenizer
from flashrec.synth.weights import TensorSpec, _blocks

NORM_NAME = "model.norm.weight"
NUM_PROMPTS = 8
# median user-history length of the calibration prompts (bytes = tokens): the parity and
# quality matrices' prompt length, since the entropy grows with the history's length
PROMPT_TOKENS = 512
G_DIGITS = 5  # significant digits kept of the norm scale
G_RANGE = (1e-4, 1e4)  # bisection bracket of g
BISECT_STEPS = 80


@dataclass(frozen=True)
class Calibration:
    """The norm scale found and the entropies (nats) it gives, before and after."""

    target: float
    scale: float  # g: model.norm.weight is multiplied by this
    before: float  # mean per-step entropy of the uncalibrated model (g = 1)
    achieved: float  # mean per-step entropy at g
    per_level: list[float]  # mean entropy at g of each SID level
    before_per_level: list[float]
    num_prompts: int

    def info(self) -> dict:
        """The ``sid_entropy`` record of synth_info.json."""
        return {
            "target": self.target,
            "scale": self.scale,
            "achieved": round(self.achieved, 6),
            "achieved_per_level": [round(h, 6) for h in self.per_level],
            "uncalibrated": round(self.before, 6),
            "uncalibrated_per_level": [round(h, 6) for h in self.before_per_level],
            "num_prompts": self.num_prompts,
            "prompt_tokens": PROMPT_TOKENS,
            "logprob_scope": "level",
        }


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _draw(spec: TensorSpec, seed: int, rows: int | None = None) -> torch.Tensor:
    """The tensor's float32 values (only its first ``rows`` rows when given)."""
    want = spec.shape[0] if rows is None else min(rows, spec.shape[0])
    parts, have = [], 0
    for block in _blocks(spec, seed):
        parts.append(block[: want - have])
        have += parts[-1].shape[0]
        if have >= want:
            break
    return torch.cat(parts)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on ``x`` [heads, T, d] at positions ``pos`` [T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    ang = pos.to(x.dtype)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class _Model:
    """A plain float64 forward of a synthetic checkpoint over packed sequences with a KV cache.

    Tokens of several sequences travel in one pass (weights are cast to float64 once per pass);
    a token attends to the cached and new tokens of its own sequence at positions <= its own.
    """

    def __init__(self, p: SynthPreset, specs: list[TensorSpec], seed: int, rows: int) -> None:
        self.p, self.dev = p, _device()
        heads = ("model.embed_tokens.weight", "lm_head.weight")
        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:  # draws drop the GIL
            futs = {
                s.name: pool.submit(_draw, s, seed, rows if s.name in heads else None)
                for s in specs
            }
            self.w = {name: f.result().to(self.dev) for name, f in futs.items()}
        self.head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.seg = torch.empty(0, dtype=torch.long, device=self.dev)  # sequence of each cached key
        self.pos = torch.empty(0, dtype=torch.long, device=self.dev)  # its position

    def _get(self, name: str) -> torch.Tensor | None:
        w = self.w.get(name)
        return None if w is None else w.double()

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ self._get(name + ".weight").T
        b = self._get(name + ".bias")
        return y if b is None else y + b

    def forward(self, ids: list[int], seg: list[int], pos: list[int]) -> torch.Tensor:
        """Final-normed hidden states (g = 1) of tokens ``ids`` of sequences ``seg`` at ``pos``."""
        p, dev = self.p, self.dev
        seg_t, pos_t = torch.tensor(seg, device=dev), torch.tensor(pos, device=dev)
        self.seg, self.pos = torch.cat([self.seg, seg_t]), torch.cat([self.pos, pos_t])
        allowed = (seg_t[:, None] == self.seg[None, :]) & (pos_t[:, None] >= self.pos[None, :])
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids, device=dev)].double()
        nh, nkv, d, eps = p.num_attention_heads, p.num_key_value_heads, p.head_dim, p.rms_norm_eps
        T = len(ids)
        for i in range(p.num_hidden_layers):
            pre = f"model.layers.{i}."
            h = _rms(x, self._get(pre + "input_layernorm.weight"), eps)
            q = self._lin(h, pre + "self_attn.q_proj").view(T, nh, d).transpose(0, 1)
            k = self._lin(h, pre + "self_attn.k_proj").view(T, nkv, d).transpose(0, 1)
            v = self._lin(h, pre + "self_attn.v_proj").view(T, nkv, d).transpose(0, 1)
            if p.arch.qk_norm:
                q = _rms(q, self._get(pre + "self_attn.q_norm.weight"), eps)
                k = _rms(k, self._get(pre + "self_attn.k_norm.weight"), eps)
            q, k = _rope(q, pos_t, p.rope_theta), _rope(k, pos_t, p.rope_theta)
            if i < len(self.cache):
                k = torch.cat([self.cache[i][0], k], 1)
                v = torch.cat([self.cache[i][1], v], 1)
                self.cache[i] = (k, v)
            else:
                self.cache.append((k, v))
            rep = nh // nkv
            kk, vv = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
            att = (q @ kk.transpose(1, 2) / math.sqrt(d)).masked_fill(~allowed, float("-inf"))
            a = (att.softmax(-1) @ vv).transpose(0, 1).reshape(T, nh * d)
            x = x + self._lin(a, pre + "self_attn.o_proj")
            h = _rms(x, self._get(pre + "post_attention_layernorm.weight"), eps)
            gate = self._lin(h, pre + "mlp.gate_proj")
            up = self._lin(h, pre + "mlp.up_proj")
            x = x + self._lin(torch.nn.functional.silu(gate) * up, pre + "mlp.down_proj")
        return _rms(x, self._get(NORM_NAME), eps)

    def level_logits(self, h: torch.Tensor, layout: TokenLayout, level: int) -> torch.Tensor:
        lo = layout.code_id(level, 0)
        return h @ self.head[lo : lo + layout.codebook_size].double().T


def prompt_ids(layout: TokenLayout, num: int, seed: int) -> list[list[int]]:
    """Token ids of ``num`` synthetic chat prompts (thinking off), each ending with sid_begin."""
    tok = build_tokenizer(layout.codebook_size, layout.num_levels)
    out = []
    for messages in synth_prompts(num, median_tokens=PROMPT_TOKENS, seed=seed):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        text += "<|im_start|>assistant\n<think>\n\n</think>\n\n" + SID_BEGIN
        out.append(tok.encode(text, add_special_tokens=False).ids)
    return out


def sid_logits(p: SynthPreset, specs: list[TensorSpec], seed: int) -> torch.Tensor:
    """Level-scope logits at g = 1, [prompts, levels, codebook_size] float64 on the CPU.

    Level 0 follows the prompt; level l > 0 follows the greedy codes of levels 0..l-1.
    """
    layout = TokenLayout(p.codebook_size, p.num_levels)
    model = _Model(p, specs, seed, layout.size)
    prompts = prompt_ids(layout, NUM_PROMPTS, seed)
    seg = [i for i, ids in enumerate(prompts) for _ in ids]
    pos = [j for ids in prompts for j in range(len(ids))]
    last = torch.tensor([len(ids) for ids in prompts]).cumsum(0) - 1
    levels = []
    with torch.no_grad():
        h = model.forward([t for ids in prompts for t in ids], seg, pos)[last.to(model.dev)]
        for level in range(p.num_levels):
            z = model.level_logits(h, layout, level)
            levels.append(z.cpu())
            if level + 1 < p.num_levels:
                codes = [layout.code_id(level, int(c)) for c in z.argmax(-1)]
                steps = [len(ids) + level for ids in prompts]
                h = model.forward(codes, list(range(len(prompts))), steps)
    return torch.stack(levels, 1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax over the last dimension."""
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def _round(g: float) -> float:
    return float(f"{g:.{G_DIGITS - 1}e}")


def solve_scale(logits: torch.Tensor, target: float) -> float:
    """The g (rounded to G_DIGITS digits) whose mean entropy of ``g * logits`` is ``target``."""
    k = logits.shape[-1]
    if not 0.0 < target < math.log(k):
        raise ValueError(f"sid_entropy must be in (0, ln {k} = {math.log(k):.3f}) nats")
    lo, hi = (math.log(g) for g in G_RANGE)

    def mean_h(log_g: float) -> float:
        return float(entropy(logits * math.exp(log_g)).mean())

    if not mean_h(hi) <= target <= mean_h(lo):
        raise ValueError(f"sid_entropy {target} is out of reach with a norm scale in {G_RANGE}")
    for _ in range(BISECT_STEPS):  # entropy falls as g grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_h(mid) > target else (lo, mid)
    return _round(math.exp((lo + hi) / 2))


def calibrate_sid_entropy(
    p: SynthPreset, specs: list[TensorSpec], seed: int, target: float
) -> Calibration:
    """Find the ``model.norm.weight`` scale that gives mean per-step SID entropy ``target``."""
    z = sid_logits(p, specs, seed)
    g = solve_scale(z, float(target))
    before, after = entropy(z), entropy(z * g)
    return Calibration(
        target=float(target),
        scale=g,
        before=float(before.mean()),
        achieved=float(after.mean()),
        per_level=[float(h) for h in after.mean(0)],
        before_per_level=[float(h) for h in before.mean(0)],
        num_prompts=z.shape[0],
    )
