"""How long a catalog reload or a weight update stops the other threads of its process: a 1 ms
ticker thread runs beside ``build_catalog_version`` of a comma-key JSON catalog (``--sids``
random SIDs as ``write_catalog_json`` writes them, or ``--path``), parsed here and parsed in a
child process (``flashrec.sid.childload``), alternating, ``--reps`` times each; with
``--weights DIR``, beside ``stage_weights`` of checkpoint DIR on an engine serving DIR: on
the CPU built here with the served tokenizer's files recognised, with its load forced, then in
a child process (weights_child); on CUDA built here and staged on the device by each way of
copying (one copy per tensor, paced pieces, pieces through pinned buffers), then on the host,
with the swap's copy and the release after it ticked too (there each tick also makes a small
pinned copy to the device and a small kernel on a stream of its own, as the engine's step
does, and waits for them: the driver's and the copy engine's stalls).

    python scripts/probes/reload_stall_probe.py [--sids 1500000] [--reps 2] [--path FILE]
    python scripts/probes/reload_stall_probe.py --weights DIR [--reps 2]
    python scripts/probes/reload_stall_probe.py --weights DIR --device cuda --quantization fp8

Prints one JSON line per load: where it was parsed, its seconds, and the ticker's longest wait
and total waits over 20 ms (the engine thread of a serving process waits as long).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/probes/)
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from flashrec.sid import childload  # noqa: E402
from flashrec.sid.catalog import write_catalog_json  # noqa: E402
from flashrec.sid.layout import SidLayout  # noqa: E402
from flashrec.sid.version import build_catalog_version  # noqa: E402

K = 8192
LAYOUT = SidLayout(code_start=1000, codebook_size=K, num_levels=3, sid_begin=999, sid_end=998)


def ticking(fn, gpu: bool = False) -> tuple[float, list[float]]:
    """``fn()``'s seconds, and the gaps of a 1 ms ticker thread beside it (with ``gpu``, each
    tick also runs a small kernel on its own stream and waits for it: the driver's stalls)."""
    gaps, stop = [0.0], threading.Event()
    if gpu:
        import torch

        x, stream = torch.zeros(1024, device="cuda"), torch.cuda.Stream()
        x_host = torch.ones(1024).pin_memory()  # as the engine's metadata: a small pinned copy

    def tick():
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.001)
            if gpu:
                with torch.cuda.stream(stream):
                    x.copy_(x_host, non_blocking=True)
                    x.add_(1)
                stream.synchronize()
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=tick)
    t.start()
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        took = time.perf_counter() - t0
        stop.set()
        t.join()
    return took, gaps


def _waits(took: float, gaps: list[float]) -> dict:
    return {
        "seconds": round(took, 3),
        "longest_wait_ms": round(max(gaps) * 1e3, 1),
        "waits_over_20ms_s": round(sum(g for g in gaps if g > 0.02), 3),
    }


def timed(path: str, where: str) -> dict:
    childload.CHILD_BYTES = 0 if where == "child" else 1 << 50
    out = []
    took, gaps = ticking(lambda: out.append(build_catalog_version(path, LAYOUT, None, "cpu")))
    return {"parsed": where, "sids": out[0].size, **_waits(took, gaps)}


def _stage_ticked(eng, model: str, gpu: bool) -> dict:
    """One staging ticked; on CUDA also the swap's copy and the release after it."""
    from flashrec.engine import weights as w

    out = []
    took, gaps = ticking(lambda: out.append(w.stage_weights(eng, model, 1, None)), gpu)
    row = _waits(took, gaps)
    if gpu:
        took, gaps = ticking(lambda: w.copy_weights(eng.runner.model, out[0]), gpu)
        row["copy"] = _waits(took, gaps)
        took, gaps = ticking(lambda: w.release_staged(out[0]), gpu)
        row["release"] = _waits(took, gaps)
    return row


# on CUDA (built here): staged in device memory by each way of copying (weights.STAGE_COPY),
# then on the host
GPU_VARIANTS = ("whole", "paced", "pinned", "host")


def weights(model: str, reps: int, device: str, quantization: str) -> None:
    from flashrec.config import EngineConfig
    from flashrec.engine import weights as w
    from flashrec.engine import weights_child as wc
    from flashrec.engine.engine import Engine

    cfg = dict(model_path=model, device=device, quantization=quantization)
    if device == "cuda":  # few graphs, no FlashInfer: only the staging is timed
        cfg.update(attention_backend="triton", cuda_graph_max_bs=64, batch_slots=64)
    eng = Engine(EngineConfig(**cfg))
    served, on_device, where = eng.tokenizer_files, w.stages_on_device, wc.builds_in_child
    gpu = device == "cuda"
    variants = ("recognised", "loaded", "child") if not gpu else GPU_VARIANTS
    copy = w.STAGE_COPY
    for _ in range(reps):
        for variant in variants:
            w.STAGE_COPY = variant if variant in ("whole", "paced", "pinned") else copy
            eng.tokenizer_files = served if variant != "loaded" else ""
            wc.builds_in_child = lambda mode, c=variant == "child": c
            w.stages_on_device = on_device if variant != "host" else lambda need, free: False
            row = {"stage_weights": model, "variant": variant, **_stage_ticked(eng, model, gpu)}
            print(json.dumps(row), flush=True)
    w.stages_on_device, wc.builds_in_child, w.STAGE_COPY = on_device, where, copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sids", type=int, default=1_500_000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--path", help="a catalog of one's own (codes below 8192, 3 levels)")
    ap.add_argument("--weights", metavar="DIR", help="time a weight update's staging instead")
    ap.add_argument("--device", default="cpu", help="with --weights: cpu or cuda")
    ap.add_argument("--quantization", default="none", help="with --weights: none or fp8")
    a = ap.parse_args()
    if a.weights:
        weights(a.weights, a.reps, a.device, a.quantization)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = a.path
        if path is None:
            path = str(Path(tmp) / "catalog.json")
            codes = np.random.default_rng(0).integers(0, K, size=(a.sids, 3))
            write_catalog_json(codes, path)
        for _ in range(a.reps):
            for where in ("here", "child"):
                print(json.dumps(timed(path, where)), flush=True)


if __name__ == "__main__":
    main()
