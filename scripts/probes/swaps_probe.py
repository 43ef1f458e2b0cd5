"""A long-lived server's swaps on a real model, in one process: several named catalogs held at
once (device bytes of each trie, the CUDA allocator's growth per catalog, build times), a
catalog reload and a rollback of one name, a weight update from a checkpoint directory (stage,
hash, swap times) and the beams of a request per catalog before and after it.

    python scripts/probes/swaps_probe.py --model-path /dev/shm/onerec --catalogs 3 \
        --catalog-size 1500000 [--weights-from DIR] [--copy-ab PAIRS] [-- ENGINE FLAG=VALUE ...]

The first catalog is the model's own ``catalog.json``; the others are synthetic catalogs of the
same size and depth, other seeds (written beside the model once). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/probes/)
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from flashrec.config import EngineConfig  # noqa: E402
from flashrec.engine import weights as w  # noqa: E402
from flashrec.engine.engine import Engine  # noqa: E402
from flashrec.engine.loop import EngineLoop  # noqa: E402
from flashrec.models.loader import model_tensors  # noqa: E402
from flashrec.prompt import load_tokenizer  # noqa: E402
from flashrec.sid.catalog import load_catalog  # noqa: E402
from flashrec.sid.layout import resolve_sid_layout  # noqa: E402
from flashrec.synth import synth_catalog, write_catalog_json  # noqa: E402


def catalogs(model: Path, count: int, size: int, depth: int, k: int) -> list[tuple[str, str]]:
    out = [("c0", str(model / "catalog.json"))]
    for i in range(1, count):
        path = model / f"probe_catalog_{i}.json"
        if not path.exists():
            write_catalog_json(synth_catalog(size, k, depth, seed=100 + i), path)
        out.append((f"c{i}", str(path)))
    return out


def allocated() -> int:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    return 0


def copy_pairs(engine: Engine, model: str, pairs: int) -> dict:
    """The swap's copy (``copy_weights``) per tensor and batched, ``pairs`` interleaved times
    on one staging of ``model`` (no request running): milliseconds of each, and whether the
    served tensors equal the staged ones byte for byte after one more batched copy."""
    staged = w.stage_weights(engine, model, 99, "copy-ab")
    model_ = engine.runner.model
    ms: dict[str, list[float]] = {"each": [], "batched": []}
    for i in range(2 * pairs):
        how = ("each", "batched")[(i + i // 2) % 2]  # ABBA order
        t0 = time.perf_counter()
        w.copy_weights(model_, staged, batched=how == "batched")
        ms[how].append(round((time.perf_counter() - t0) * 1e3, 2))
    w.copy_weights(model_, staged, batched=True)  # the timed order may end on "each"
    served = model_tensors(model_)
    equal = all(
        torch.equal(t.view(torch.uint8), staged.tensors[n].to(t.device).view(torch.uint8))
        for n, t in served.items()
    )
    out = {"staged_on": staged.staged_on, "tensors": len(served), "ms": ms, "equal": equal,
           "median_ms": {k: sorted(v)[len(v) // 2] for k, v in ms.items()}}  # fmt: skip
    w.release_staged(staged)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--catalogs", type=int, default=3)
    ap.add_argument("--catalog-size", type=int, default=1_500_000)
    ap.add_argument("--weights-from", help="checkpoint to update to (default: --model-path)")
    ap.add_argument("--beams", type=int, default=50)
    ap.add_argument("--copy-ab", type=int, default=0, metavar="PAIRS",
                    help="then time the swap's copy per tensor against one batched copy, "
                    "PAIRS interleaved pairs on one staging")  # fmt: skip
    ap.add_argument("engine", nargs="*", help="engine settings FLAG=VALUE (EngineConfig names)")
    a = ap.parse_args()
    model = Path(a.model_path)
    layout = resolve_sid_layout(load_tokenizer(str(model)), None)
    depth, k = load_catalog(str(model / "catalog.json"), layout=layout).depth, layout.codebook_size
    t0 = time.perf_counter()
    named = catalogs(model, a.catalogs, a.catalog_size, depth, k)
    write_s = time.perf_counter() - t0
    extra = dict(kv.split("=", 1) for kv in a.engine)
    for key, value in list(extra.items()):  # ints and floats as such
        for conv in (int, float):
            try:
                extra[key] = conv(value)
                break
            except ValueError:
                continue
    before = allocated()
    t1 = time.perf_counter()
    cfg = EngineConfig(model_path=str(model), sid_vocab_file=tuple(f"{n}={p}" for n, p in named),
                       **extra)  # fmt: skip
    engine = Engine(cfg)
    start_s = time.perf_counter() - t1
    held = engine.catalogs.info()
    # each catalog's trie alone: the allocator's growth per one more 1.5M-SID catalog
    per_catalog = []
    for name, path in named[:2]:
        b0 = allocated()
        version = engine.build_catalog(path)
        per_catalog.append({"name": name, "allocated_bytes": allocated() - b0,
                            "trie_bytes": version.trie.nbytes(), "load_ms": version.load_ms,
                            "build_ms": version.build_ms})  # fmt: skip
        del version
    loop = EngineLoop(engine)
    loop.start()
    try:
        prompt = engine.build_prompt(messages=[{"role": "user", "content": "probe " * 200}])

        def top(name: str) -> tuple[str, list[int]]:
            fut = loop.submit(engine.new_request(prompt, n=a.beams, catalog=name))
            res = fut.result(timeout=600)
            return res.catalog_hash, list(map(int, res.beams.token_ids[0]))

        tops = {n: top(n) for n, _ in named}
        reload = loop.reload_catalog(named[-1][1], name=named[1][0])  # c1 <- the last file
        after_reload = top(named[1][0])
        rollback = loop.rollback_catalog(named[1][0])
        after_rollback = top(named[1][0])
        weights = loop.update_weights(a.weights_from or str(model))
        after_weights = {n: top(n) for n, _ in named}
    finally:
        loop.stop()
    copy_ab = copy_pairs(engine, str(model), a.copy_ab) if a.copy_ab else None
    print(json.dumps({
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "catalogs_written_s": round(write_s, 1),
        "engine_start_s": round(start_s, 1),
        "engine_allocated_bytes": allocated() - before,
        "held": held,
        "per_catalog": per_catalog,
        "reload": reload,
        "reload_serves_new_file": after_reload[0] == tops[named[-1][0]][0],
        "rollback": rollback,
        "rollback_serves_old": after_rollback == tops[named[1][0]],
        "weights": weights,
        "same_answers_after_same_weights": after_weights == tops,
        "copy_ab": copy_ab,
    }, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
