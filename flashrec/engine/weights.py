"""New weights without a restart (``POST /update_weights_from_disk``).

    any thread (a call thread)          engine thread, between steps
    stage_weights(path)                 nothing running: the swap
      directory, config.json, SID        copy_ every staged tensor INTO the served one
      layout + vocabulary, every         (same storage: CUDA graphs and the LM head's
      tensor's shape and dtype,          views stay valid), flush the radix cache,
      content hash, the model built      the new identity
      on the CPU as at start-up
      (FP8 quantized the same way)

A checkpoint that differs from the served one in anything but its values is refused with a
``ValueError`` naming the first difference; the served weights keep serving. The swap waits
until no request runs (``EngineLoop.call_when_idle``): requests in flight finish on the
weights they started with, requests admitted after it see the new ones. One update at a time:
a second one while the first runs is refused (``ReloadBusyError``, HTTP 409).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import torch

from flashrec import boundedread
from flashrec.config import EngineConfig, ModelConfig
from flashrec.config.flags import env_choice
from flashrec.engine import weights_child
from flashrec.engine.swaps import SwapGuard, release_host_memory
from flashrec.models.loader import (
    build_model,
    checkpoint_hash,
    checkpoint_signature,
    model_tensors,
)
from flashrec.prompt import load_tokenizer
from flashrec.sid.layout import SidLayout, resolve_sid_layout

log = logging.getLogger("flashrec")

HASH_METHOD = "sha256 over each safetensors file's name and bytes, in file order"
# ModelConfig fields that may differ: how the tensors are stored, checked tensor by tensor
_STORAGE_FIELDS = {"torch_dtype", "quantization_config"}
STAGE_CHUNK_BYTES = 16 << 20  # host-to-device staging copies in pieces of this many bytes
# how staging copies to the device: "pinned" (pieces through two small page-locked buffers,
# the copies asynchronous; the least stall of the three in a served A/B, docs/baselines.md),
# "paced" (pieces from pageable memory, each waited for) or "whole" (one copy per tensor); the
# environment variable is for same-run A/Bs on a GPU
STAGE_COPY = env_choice("FLASHREC_STAGE_COPY", "pinned", ("paced", "pinned", "whole"))
# after a swap, the staging's device blocks: "free" (back to the driver, ``empty_cache``) or
# "keep" (left in torch's cache, the next update's staging reuses them with no cudaMalloc or
# cudaFree, either of which may wait for the device); for same-run A/Bs on a GPU
STAGE_RELEASE = env_choice("FLASHREC_STAGE_RELEASE", "free", ("free", "keep"))
STAGING_HEADROOM = 0.1  # device memory left free beside staged weights, as their fraction
LOAD_FORMATS = (None, "auto", "safetensors")  # SGLang's ``load_format`` values we read


# the files ``AutoTokenizer.from_pretrained`` may read from a checkpoint directory
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "chat_template.jinja", "chat_template.json",
)  # fmt: skip


def tokenizer_files_digest(model_path: str | Path) -> str:
    """sha256 over the tokenizer files ``model_path`` holds (name and bytes, ``TOKENIZER_FILES``
    order) and config.json's ``model_type`` / ``tokenizer_class``: equal digests load the same
    tokenizer. A weight update whose digest equals the served one's skips loading it (a
    tokenizer load holds the interpreter lock beside the engine thread)."""
    path = Path(model_path)
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = path / name
        if f.exists():
            h.update(name.encode() + b"\0" + boundedread.read_bytes(f, "tokenizer file") + b"\0")
    try:
        cfg = json.loads(boundedread.read_bytes(path / "config.json", "config.json"))
    except (OSError, ValueError):
        cfg = {}
    if not isinstance(cfg, dict):
        cfg = {}
    h.update(json.dumps([cfg.get("model_type"), cfg.get("tokenizer_class")]).encode())
    return h.hexdigest()


def vocab_digest(tokenizer: Any) -> str:
    """A digest of the tokenizer's vocabulary (token -> id) and added tokens ("" without a
    tokenizer): equal digests build the same prompt ids."""
    if tokenizer is None:
        return ""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class WeightsVersion:
    """The served weights' identity: directory, content hash, update count (0: start-up) and
    the label an update was given (SGLang's ``weight_version``)."""

    path: str
    hash: str
    version: int = 0
    label: str | None = None
    signature: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def info(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hash": self.hash,
            "hash_method": HASH_METHOD,
            "version": self.version,
            "weight_version": self.label,
        }


def identify(model_path: str) -> WeightsVersion:
    """The start-up weights' identity (their files hashed once)."""
    return WeightsVersion(model_path, checkpoint_hash(model_path), 0, None,
                          checkpoint_signature(model_path))  # fmt: skip


class WeightsHolder(Protocol):
    """What a weight update reads of the engine (``Engine`` has it; named here, not imported,
    since the engine imports this module)."""

    config: EngineConfig
    model_config: ModelConfig
    layout: SidLayout
    weights: WeightsVersion
    vocab_digest: str
    tokenizer_files: str  # tokenizer_files_digest of the served checkpoint
    runner: Any  # ModelRunner: .model, .dtype, .use_fp8, .device

    def swap_weights(self, staged: StagedWeights) -> float: ...


@dataclasses.dataclass
class StagedWeights:
    """A checked checkpoint ready to swap in: its identity and the model's tensors (in device
    memory where they fit beside the served model, else on the host), named as
    ``model_tensors`` names them."""

    version: WeightsVersion
    tensors: dict[str, torch.Tensor]
    load_ms: float
    hash_ms: float
    staged_on: str = "cpu"  # "device" / "host" on CUDA (``_place``), "cpu" on the CPU
    built_in: str = "here"  # "child": hashed and built by a child process (weights_child)
    copy_ms: float = 0.0  # the last part of load_ms: the copy to the device (``_place``)


def _differences(new: dict, old: dict, what: str) -> None:
    """ValueError naming the first of ``new``'s entries missing from, extra to or unequal to
    ``old``'s (and how many differ), if any."""
    missing = sorted(set(old) - set(new))
    extra = sorted(set(new) - set(old))
    unequal = sorted(k for k in set(new) & set(old) if new[k] != old[k])
    count = len(missing) + len(extra) + len(unequal)
    if not count:
        return
    if missing:
        first = f"{what} {missing[0]!r} is missing"
    elif extra:
        first = f"{what} {extra[0]!r} is not in the served checkpoint"
    else:
        k = unequal[0]
        first = f"{what} {k!r}: {_fmt(new[k])}, served {_fmt(old[k])}"
    raise ValueError(f"{first} ({count} difference{'s' if count > 1 else ''} in all)")


def _fmt(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tuple):
        return f"shape {list(v[0])} dtype {v[1]}"
    return repr(v)


def _layout_fields(layout: SidLayout) -> dict[str, Any]:
    return {
        "sid": layout.to_arg(),
        "sid_begin": layout.sid_begin,
        "sid_end": layout.sid_end,
        "code_start": layout.code_start,
        "codebook_size": layout.codebook_size,
        "num_levels": layout.num_levels,
    }


def stage_weights(
    engine: WeightsHolder, model_path: str, version: int, label: str | None
) -> StagedWeights:
    """Read and check ``model_path`` against what ``engine`` serves, then build its tensors on
    the CPU (in a child process under ``--weights-build``: ``weights_child``) and stage them
    (``_place``); ValueError naming the first difference (nothing served changes). Any
    thread."""
    t0 = time.perf_counter()
    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"model_path {model_path!r}: no such directory")
    served: WeightsVersion = engine.weights
    try:
        mc = ModelConfig.from_path(path)
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"model_path {model_path!r}: unreadable config.json ({exc})") from None
    keep = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in _STORAGE_FIELDS]
    try:
        _differences(
            {k: getattr(mc, k) for k in keep},
            {k: getattr(engine.model_config, k) for k in keep},
            "config.json field",
        )
        if tokenizer_files_digest(path) != getattr(engine, "tokenizer_files", None):
            _check_tokenizer(engine, path)  # else: the served tokenizer's very files
        _differences(checkpoint_signature(path), served.signature, "tensor")
    except ValueError as exc:
        raise ValueError(f"model_path {model_path!r}: {exc}") from None
    t1 = time.perf_counter()
    runner = engine.runner
    served_tensors = model_tensors(runner.model)
    need = sum(t.numel() * t.element_size() for t in served_tensors.values())
    if weights_child.builds_in_child(engine.config.weights_build):
        try:
            tensors, digest, build_ms, hash_ms = weights_child.build_in_child(
                str(path), runner.dtype, runner.use_fp8, need
            )
        except ValueError as exc:
            raise ValueError(f"model_path {model_path!r}: {exc}") from None
        where = "child"
    else:
        t2 = time.perf_counter()
        digest = checkpoint_hash(path)
        t3 = time.perf_counter()
        tensors = model_tensors(build_model(mc, path, runner.dtype, runner.use_fp8))
        build_ms, hash_ms, where = (time.perf_counter() - t3) * 1e3, (t3 - t2) * 1e3, "here"
    want = {k: (tuple(t.shape), t.dtype) for k, t in served_tensors.items()}
    got = {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()}
    try:
        _differences(got, want, "model tensor")
    except ValueError as exc:
        raise ValueError(f"model_path {model_path!r}: {exc}") from None
    t4 = time.perf_counter()
    tensors, staged_on = _place(tensors, runner.device, need)
    ident = WeightsVersion(str(path), digest, version, label, served.signature)
    copy_ms = (time.perf_counter() - t4) * 1e3
    load_ms = (t1 - t0) * 1e3 + build_ms + copy_ms
    return StagedWeights(ident, tensors, load_ms, hash_ms, staged_on, where, copy_ms)


def device_room(device: torch.device) -> int:
    """Bytes a staging may take on ``device``: the driver's free memory and the blocks torch
    holds in its cache unused (a kept staging's among them)."""
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return torch.cuda.mem_get_info(device)[0] + max(0, cached)


def stages_on_device(need_bytes: int, free_bytes: int) -> bool:
    """Whether a checkpoint of ``need_bytes`` is staged in device memory: only with
    ``STAGING_HEADROOM`` of it (at least 1 GiB) still free beside it."""
    return free_bytes - need_bytes >= max(1 << 30, int(need_bytes * STAGING_HEADROOM))


def _place(
    tensors: dict[str, torch.Tensor], device: torch.device, need: int
) -> tuple[dict[str, torch.Tensor], str]:
    """Where the staged tensors wait for the swap. On CUDA, in device memory when it fits
    (copied on a side stream here, off the engine thread, so the swap is a device-to-device
    copy of milliseconds; ``STAGE_COPY`` says how); else in pageable host memory, copied during
    the swap. Never page-locked as a whole: pinning or unpinning a checkpoint's size of host
    memory holds the driver for seconds and stalls the engine's launches on every thread.
    ``need``: their bytes."""
    if device.type != "cuda":
        return tensors, "cpu"
    if not stages_on_device(need, device_room(device)):
        return tensors, "host"
    stream = torch.cuda.Stream(device)
    if STAGE_COPY == "pinned":
        return _to_device_pinned(tensors, device, stream), "device"
    on_device = {k: _to_device_paced(t, device, stream) for k, t in tensors.items()}
    return on_device, "device"


def _to_device_paced(
    t: torch.Tensor, device: torch.device, stream: torch.cuda.Stream
) -> torch.Tensor:
    """``t`` copied to ``device`` on ``stream`` in pieces of ``STAGE_CHUNK_BYTES``, each waited
    for before the next: a copy from pageable memory occupies the copy engine (and the driver)
    for its whole length, and the engine's own small host-to-device copies queue behind it; in
    pieces they wait for one piece at most. Done when it returns."""
    chunk = STAGE_CHUNK_BYTES if STAGE_COPY != "whole" else 0
    src = t.contiguous()
    with torch.cuda.stream(stream):
        out = torch.empty_like(src, device=device)
        if chunk <= 0 or src.numel() * src.element_size() <= chunk:
            out.copy_(src)
        else:
            a, b = src.view(-1).view(torch.uint8), out.view(-1).view(torch.uint8)
            for i in range(0, a.numel(), chunk):
                b[i : i + chunk].copy_(a[i : i + chunk])
                stream.synchronize()
    stream.synchronize()  # the swap's stream reads it with no event between
    return out


def _to_device_pinned(
    tensors: dict[str, torch.Tensor], device: torch.device, stream: torch.cuda.Stream
) -> dict[str, torch.Tensor]:
    """Every tensor copied to ``device`` in pieces of ``STAGE_CHUNK_BYTES`` through two small
    page-locked buffers (pinned once, kept by the host allocator): a piece is copied into one
    on this thread while the other's asynchronous copy to the device runs, so the driver never
    stages pageable memory and the engine's copies wait for one piece at most."""
    chunk = STAGE_CHUNK_BYTES
    bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    done: list[torch.cuda.Event | None] = [None, None]
    out, k = {}, 0
    with torch.cuda.stream(stream):
        for name, t in tensors.items():
            src = t.contiguous()
            dst = torch.empty_like(src, device=device)
            a, b = src.reshape(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
            for i in range(0, a.numel(), chunk):
                n = min(chunk, a.numel() - i)
                if done[k] is not None:
                    done[k].synchronize()  # its previous copy has left the buffer
                bufs[k][:n].copy_(a[i : i + n])
                b[i : i + n].copy_(bufs[k][:n], non_blocking=True)
                done[k] = stream.record_event()
                k ^= 1
            out[name] = dst
    stream.synchronize()
    return out


def release_staged(staged: StagedWeights) -> None:
    """Drop a swapped-in staging (the served buffers hold its values now): its device blocks
    back to the driver (``STAGE_RELEASE`` "free") or kept for the next update's, the host
    heap's freed pages back to the OS."""
    staged.tensors.clear()
    if staged.staged_on == "device" and STAGE_RELEASE == "free":
        torch.cuda.empty_cache()
    release_host_memory()


def _check_tokenizer(engine: WeightsHolder, path: Path) -> None:
    """ValueError unless ``path``'s tokenizer loads with the served SID layout and vocabulary."""
    try:
        tok = load_tokenizer(str(path))
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure: this checkpoint
        raise ValueError(f"its tokenizer does not load ({type(exc).__name__}: {exc})") from None
    layout = resolve_sid_layout(tok, engine.config.sid)
    _differences(_layout_fields(layout), _layout_fields(engine.layout), "SID layout field")
    if vocab_digest(tok) != engine.vocab_digest:
        raise ValueError("its tokenizer's vocabulary differs from the served tokenizer's")


def copy_weights(model: torch.nn.Module, staged: StagedWeights, batched: bool = False) -> None:
    """Copy every staged tensor into the model's own (same storage, so captured graphs and
    views of the weights read the new values); waits for the copies on CUDA. ``batched``: one
    ``torch._foreach_copy_`` over the tensors staged on the served ones' device (fewer kernel
    launches; the swaps probe times it beside the per-tensor copies), the rest one by one."""
    served = model_tensors(model)
    pairs = [(dst, staged.tensors[name]) for name, dst in served.items()]
    with torch.no_grad():
        if batched:
            same = [(d, s) for d, s in pairs if s.device == d.device]
            if same:
                torch._foreach_copy_([d for d, _ in same], [s for _, s in same], non_blocking=True)
            pairs = [(d, s) for d, s in pairs if s.device != d.device]
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)
    if any(t.is_cuda for t in served.values()):
        torch.cuda.synchronize()


class WeightUpdater:
    """``update(path)`` on any thread but the engine thread: stages the checkpoint where it is
    called, swaps it through ``call_when_idle`` (runs a function on the engine thread once no
    request runs) and answers with the new identity and timings. Counts updates by outcome
    (ok / rejected / busy) and keeps the last swap's time."""

    def __init__(
        self, engine: WeightsHolder, call_when_idle: Callable[[Callable[[], Any]], Future]
    ):
        self.engine = engine
        self.call_when_idle = call_when_idle
        self.guard = SwapGuard(
            "weight update", "a weight update is already running; retry once it answers"
        )
        self.updates = 0

    def update(self, model_path: str, label: str | None = None) -> dict[str, Any]:
        """ValueError for a checkpoint that cannot serve here (nothing changes),
        ``ReloadBusyError`` while another update runs."""

        def stage() -> StagedWeights:
            if getattr(self.engine, "weights", None) is None:
                raise ValueError("this engine cannot update its weights")
            return stage_weights(self.engine, model_path, self.updates + 1, label)

        def swap(staged: StagedWeights) -> float:
            swap_ms = self.call_when_idle(lambda: self.engine.swap_weights(staged)).result()
            self.updates += 1  # before the next update may stage (still one at a time)
            return swap_ms

        staged, swap_ms, wait_ms = self.guard.run(stage, swap)
        t0 = time.perf_counter()
        release_staged(staged)
        release_ms = (time.perf_counter() - t0) * 1e3
        v = staged.version
        log.info(
            "weights %s swapped in: hash %s (built %s: load %.1f ms of which the copy %.1f ms, "
            "hash %.1f ms; staged on %s; swap %.1f ms after %.1f ms waiting for the running "
            "requests; released in %.1f ms)",
            v.path, v.hash, staged.built_in, staged.load_ms, staged.copy_ms, staged.hash_ms,
            staged.staged_on, swap_ms, wait_ms - swap_ms, release_ms,
        )  # fmt: skip
        return {
            "success": True,
            "message": f"Succeeded to update model weights from {v.path}.",
            "num_paused_requests": 0,
            "model_path": v.path,
            "weights_hash": v.hash,
            "weights_version": v.version,
            "weight_version": v.label,
            "load_ms": round(staged.load_ms, 3),
            "copy_ms": round(staged.copy_ms, 3),  # load_ms's last part: the copy to the device
            "hash_ms": round(staged.hash_ms, 3),
            "staged_on": staged.staged_on,  # where the new tensors waited: device, host, cpu
            # the engine thread's copy + cache flush, and how long the update waited for
            # the requests running when it was asked, then the swap
            "swap_ms": round(swap_ms, 3),
            "swap_wait_ms": round(wait_ms, 3),
            "release_ms": round(release_ms, 3),  # after the swap: the staging's memory freed
        }

    def stats(self) -> dict[str, float]:
        return self.guard.stats("weight_updates", "weights_last_swap_ms")
