"""A weight update's CPU work in a child interpreter, so that the serving process's threads run on.

Hashing a checkpoint and building it on the CPU (reading its safetensors files, fusing, FP8
quantization) take seconds of CPU and the model's size of host memory: in the serving process
they compete with the engine thread for the interpreter lock, the cores and the C heap. Under
``--weights-build child`` a child does it (``python -m flashrec.engine.weights_child``: a plain
subprocess, so that a daemonic engine process may start it, never a fork of a process holding
threads and CUDA), at a lower priority and with a quarter of the cores for its threads. It
writes every tensor into one file of a temporary directory (``/dev/shm`` where it has room),
which the parent maps: the tensors come back without a copy on the host, and their pages go
when the last one is dropped. A child that fails is a ``ValueError`` naming its error: nothing
served changes.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from flashrec.childrun import run_json_child

_ALIGN = 64  # each tensor's offset in the file: a multiple of every element size


def builds_in_child(mode: str) -> bool:
    """``--weights-build``: ``child`` or ``server`` (the default: on a GPU a child neither
    shortened the stall of an update under load nor made it cheaper, docs/baselines.md)."""
    return mode == "child"


def scratch_dir(need_bytes: int) -> str | None:
    """``/dev/shm`` where it has room for ``need_bytes`` and a quarter more, else None (the
    system's temporary directory)."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return "/dev/shm" if free >= need_bytes * 1.25 else None


def write_pack(tensors: dict[str, torch.Tensor], out: Path) -> None:
    """``tensors`` into ``out`` (raw bytes, aligned) and ``out.json`` (name -> dtype, shape,
    offset, bytes)."""
    index, offset = {}, 0
    with open(out, "wb") as fh:
        for name, t in tensors.items():
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            pad = -offset % _ALIGN
            fh.write(b"\0" * pad)
            offset += pad
            fh.write(memoryview(raw.numpy()))
            index[name] = [str(t.dtype).removeprefix("torch."), list(t.shape), offset, raw.numel()]
            offset += raw.numel()
    Path(f"{out}.json").write_text(json.dumps(index))


def read_pack(path: Path) -> dict[str, torch.Tensor]:
    """The tensors ``write_pack`` wrote, as views of one private mapping of ``path``."""
    index = json.loads(Path(f"{path}.json").read_text())
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    out = {}
    for name, (dtype, shape, offset, nbytes) in index.items():
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes else (
            torch.empty(0, dtype=torch.uint8)
        )  # fmt: skip
        out[name] = raw.view(getattr(torch, dtype)).reshape(shape)
    return out


def build_in_child(
    model_path: str, dtype: torch.dtype, use_fp8: bool, need_bytes: int
) -> tuple[dict[str, torch.Tensor], str, float, float]:
    """``(tensors, hash, build_ms, hash_ms)`` of ``model_path`` built by a child as
    ``build_model`` builds it here; ValueError if the child fails."""
    with tempfile.TemporaryDirectory(prefix="flashrec-weights-", dir=scratch_dir(need_bytes)) as d:
        out = Path(d) / "tensors.bin"
        job = {"model_path": model_path, "dtype": str(dtype).removeprefix("torch."),
               "use_fp8": use_fp8, "out": str(out)}  # fmt: skip
        try:
            answer = run_json_child("flashrec.engine.weights_child", job, "the weights builder")
        except ValueError as exc:
            raise ValueError(f"{exc} (--weights-build server builds it in this process)") from None
        if "error" in answer:
            raise ValueError(f"building it failed ({answer['error']}: {answer['message']})")
        tensors = read_pack(out)  # mapped: the pages outlive the directory's removal
    return tensors, answer["hash"], answer["build_ms"], answer["hash_ms"]


def _child() -> int:
    """The child's side: a job (JSON) on stdin, the pack to ``out``, one JSON line on stdout
    (``{"hash", "build_ms", "hash_ms"}``, or ``{"error", "message"}`` and exit 2)."""
    from flashrec.config import ModelConfig
    from flashrec.models.loader import build_model, checkpoint_hash, model_tensors

    job = json.load(sys.stdin)
    try:
        os.nice(10)  # the serving process's threads first
    except OSError:
        pass
    torch.set_num_threads(max(1, (os.cpu_count() or 4) // 4))
    try:
        t0 = time.perf_counter()
        digest = checkpoint_hash(job["model_path"])
        t1 = time.perf_counter()
        mc = ModelConfig.from_path(Path(job["model_path"]))
        model = build_model(mc, job["model_path"], getattr(torch, job["dtype"]), job["use_fp8"])
        write_pack(model_tensors(model), Path(job["out"]))
        t2 = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - named back to the parent, which refuses
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 2
    print(json.dumps({"hash": digest, "build_ms": (t2 - t1) * 1e3, "hash_ms": (t1 - t0) * 1e3}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
