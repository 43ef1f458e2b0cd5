"""Random, seed-deterministic weights streamed into one ``model.safetensors`` file.

Each tensor draws from its own ``torch.Generator`` seeded by sha256(seed, name), so a tensor's
values do not depend on which other tensors exist (e.g. overriding ``num_hidden_layers`` keeps
layer 0 identical) nor on the storage dtype (a bf16 and an fp8 build share the same float32
draws). Tensors are drawn in row blocks by a few worker threads and written in order: peak memory
is a few tensors, not the model.

Init scales keep the model well conditioned but not flat: Linear weights ~ N(0, 1/fan_in), so
every projection preserves activation scale; norm weights ~ U(0.8, 1.2); embeddings and the
untied lm_head ~ N(0, (LOGIT_STD / sqrt(hidden))^2), so next-token logits have a spread of a
few nats whatever the hidden size. q and k are scaled by QK_GAIN (through q_norm/k_norm, or
q_proj/k_proj where there is no qk-norm) so attention scores have std ~QK_GAIN^2: with unit
scores attention over a long prompt averages to nearly the same vector for every prompt, and
the next-SID distribution would barely depend on the user history.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from flashrec.synth.presets import SynthPreset

LOGIT_STD = 4.0
NORM_RANGE = (0.8, 1.2)
BIAS_STD = 0.2
QK_GAIN = 1.5
FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK_ELEMS = 1 << 24  # float32 elements generated at once

DTYPES = {
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp8": torch.bfloat16,
}  # fp8: Linear weights FP8 + scale, everything else bf16
_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3"}


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: HF name, shape and how its values are drawn."""

    name: str
    shape: tuple[int, ...]
    init: str  # "normal": N(0, std^2); "norm": U(NORM_RANGE) * gain
    std: float = 0.0
    gain: float = 1.0
    quantizable: bool = False  # decoder-layer Linear weight: stored FP8 when dtype == "fp8"
    layer: int | None = None
    scale: float = 1.0  # multiplies the drawn values (the sid_entropy calibration's norm scale)


def canonical_dtype(dtype: str) -> str:
    """``bfloat16`` -> ``bf16``; raises on unknown dtypes."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    return "bf16" if dtype == "bfloat16" else dtype


def _linear(
    prefix: str, out: int, fan_in: int, bias: bool, layer: int, gain: float = 1.0
) -> list[TensorSpec]:
    std = gain / math.sqrt(fan_in)
    w = TensorSpec(prefix + ".weight", (out, fan_in), "normal", std, quantizable=True, layer=layer)
    b = TensorSpec(prefix + ".bias", (out,), "normal", BIAS_STD, layer=layer)
    return [w, b] if bias else [w]


def tensor_specs(p: SynthPreset, vocab_size: int) -> list[TensorSpec]:
    """All tensors of the checkpoint, in file order."""
    h, d = p.hidden_size, p.head_dim
    q, kv, inter = p.num_attention_heads * d, p.num_key_value_heads * d, p.intermediate_size
    qk_gain = 1.0 if p.arch.qk_norm else QK_GAIN  # with qk-norm the gain sits in q/k_norm
    emb_std = LOGIT_STD / math.sqrt(h)
    specs = [TensorSpec("model.embed_tokens.weight", (vocab_size, h), "normal", emb_std)]
    for i in range(p.num_hidden_layers):
        pre = f"model.layers.{i}."
        specs.append(TensorSpec(pre + "input_layernorm.weight", (h,), "norm", layer=i))
        specs += _linear(pre + "self_attn.q_proj", q, h, p.qkv_bias, i, qk_gain)
        specs += _linear(pre + "self_attn.k_proj", kv, h, p.qkv_bias, i, qk_gain)
        specs += _linear(pre + "self_attn.v_proj", kv, h, p.qkv_bias, i)
        specs += _linear(pre + "self_attn.o_proj", h, q, p.o_bias, i)
        if p.arch.qk_norm:
            for name in ("q_norm", "k_norm"):
                norm = f"{pre}self_attn.{name}.weight"
                specs.append(TensorSpec(norm, (d,), "norm", gain=QK_GAIN, layer=i))
        specs.append(TensorSpec(pre + "post_attention_layernorm.weight", (h,), "norm", layer=i))
        specs += _linear(pre + "mlp.gate_proj", inter, h, False, i)
        specs += _linear(pre + "mlp.up_proj", inter, h, False, i)
        specs += _linear(pre + "mlp.down_proj", h, inter, False, i)
    specs.append(TensorSpec("model.norm.weight", (h,), "norm"))
    if not p.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (vocab_size, h), "normal", emb_std))
    return specs


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel FP8: returns (float8_e4m3fn [out, in], float32 scale [out, 1])."""
    scale = (w.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    q = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _blocks(spec: TensorSpec, seed: int) -> Iterator[torch.Tensor]:
    """float32 row blocks of the tensor's values, in row order."""
    gen = _generator(seed, spec.name)
    rows, cols = spec.shape[0], math.prod(spec.shape[1:])
    step = max(1, BLOCK_ELEMS // max(cols, 1))
    for start in range(0, rows, step):
        block = torch.empty((min(step, rows - start), *spec.shape[1:]), dtype=torch.float32)
        if spec.init == "norm":
            block.uniform_(NORM_RANGE[0] * spec.gain, NORM_RANGE[1] * spec.gain, generator=gen)
        else:
            block.normal_(0.0, spec.std, generator=gen)
        yield block if spec.scale == 1.0 else block.mul_(spec.scale)


def _entries(spec: TensorSpec, dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    if dtype == "fp8" and spec.quantizable:
        return [
            (spec.name, "F8_E4M3", spec.shape),
            (spec.name + "_scale", "F32", (spec.shape[0], 1)),
        ]
    return [(spec.name, _ST_DTYPE[DTYPES[dtype]], spec.shape)]


_ITEMSIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1}


def _encoded(spec: TensorSpec, seed: int, dtype: str) -> list:
    """The tensor's bytes as stored (numpy views, in file order); an fp8 weight's scales last."""
    parts, scales = [], []
    for block in _blocks(spec, seed):
        if dtype == "fp8" and spec.quantizable:
            block, scale = quantize_fp8(block)
            scales.append(scale.numpy())
        else:
            block = block.to(DTYPES[dtype])
        parts.append(block.contiguous().view(torch.uint8).numpy())
    return parts + scales


def write_safetensors(
    path: Path, specs: list[TensorSpec], seed: int, dtype: str, progress: bool = False
) -> None:
    """Stream the tensors of ``specs`` into a safetensors file at ``path``.

    The header is computed from the shapes first, then each tensor is drawn and written block by
    block; an fp8 weight's ``_scale`` tensor follows it.
    """
    dtype = canonical_dtype(dtype)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        for name, st_dtype, shape in _entries(spec, dtype):
            size = math.prod(shape) * _ITEMSIZE[st_dtype]
            header[name] = {
                "dtype": st_dtype,
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    layer, num_layers = None, 1 + max((s.layer for s in specs if s.layer is not None), default=-1)
    tmp = path.with_name(path.name + ".partial")
    # Tensors are drawn in worker threads (the draws release the GIL; each tensor has its own
    # generator, so the bytes do not depend on the order) and written in spec order; at most
    # `ahead` tensors are held encoded at once.
    workers = max(1, min(8, os.cpu_count() or 1))
    ahead = 2 * workers
    with open(tmp, "wb") as f, ThreadPoolExecutor(workers) as pool:
        f.write(len(blob).to_bytes(8, "little") + blob)
        todo = ((spec, pool.submit(_encoded, spec, seed, dtype)) for spec in specs)
        pending = deque(islice(todo, ahead))
        while pending:
            spec, fut = pending.popleft()
            pending.extend(islice(todo, 1))  # keep `ahead` tensors in flight
            if progress and spec.layer is not None and spec.layer != layer:
                layer = spec.layer
                print(f"synth: layer {layer + 1}/{num_layers}", file=sys.stderr, flush=True)
            for part in fut.result():
                f.write(part.data)
        written = f.tell() - 8 - len(blob)
    if written != offset:
        raise AssertionError(f"{tmp}: wrote {written} data bytes, header says {offset}")
    tmp.replace(path)
