"""Answer-body encoders of two versions side by side, same process, interleaved: the
``chat_completion_json`` / ``generate_result_json`` of this checkout against those of a git
ref (``flashrec/server/responses.py`` at that ref, over that ref's
``flashrec/engine/request.py``: its beam columns and SID text), on beams shaped like the
engine's (3 SID tokens + the end token, text from a SID table, float scores). Checks both
write the same JSON.

    python scripts/probes/body_bench.py [--ref HEAD~1] [--beams 50 256 512] [--reps 300] \
        [--columns | --both-columns] [--ref-tree DIR]

--columns: this checkout's encoders get the beams as the engine retires them
(``BeamColumns``), the ref's as a list of ``BeamResult`` (a ref from before the columns): the
served respond path of the two versions, not the encoders on one input. --both-columns: each
version gets its own ``BeamColumns`` (the served path of two refs that both have them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/probes/)
sys.path.insert(0, str(ROOT))

from flashrec.engine.request import BeamColumns, BeamResult, GenResult, SidText  # noqa: E402
from flashrec.server import responses as here  # noqa: E402

CODES, BASE = 8192, 1000


def _load(name: str, src: str):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _at_ref(ref: str, tree: str | None = None):
    """``flashrec/server/responses.py`` at ``ref``, over ``flashrec/engine/request.py`` at
    ``ref`` (the beam columns and SID text it was written against) where that file exists;
    with ``tree``, the two files under that directory instead (a machine without the ref's
    history: copy them there)."""

    def show(path: str) -> str | None:
        if tree is not None:
            f = Path(tree) / path
            return f.read_text() if f.is_file() else None
        out = subprocess.run(
            ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout if out.returncode == 0 else None

    src = show("flashrec/server/responses.py")
    assert src is not None, f"no flashrec/server/responses.py at {ref}"
    request = show("flashrec/engine/request.py")
    if request is not None:
        _load("request_ref", request)
        src = src.replace("from flashrec.engine.request import", "from request_ref import")
    return _load("responses_ref", src)


def sid_text(codes: int = CODES, source: type | None = None) -> Callable[[list[int]], str]:
    """The text of a beam's ids as the engine makes it (``SidText`` over a table, of
    ``source``'s version where given): 3 x ``codes`` SID tokens from id ``BASE`` and the end
    token at ``BASE - 1``."""
    table = {BASE + i: f"<s_{'abc'[i // codes]}_{i % codes}>" for i in range(3 * codes)}
    table[BASE - 1] = "<|sid_end|>"
    return (source or SidText).from_table(table, None)


def sid_answer(
    n: int, rng: random.Random, text: Callable[[list[int]], str], codes: int = CODES
) -> GenResult:
    """An answer of ``n`` beams shaped like the engine's: 3 SID tokens of ``codes`` each and
    the end token, float scores, texts through ``text`` (:func:`sid_text`)."""
    beams = [
        BeamResult(
            [BASE + lvl * codes + rng.randrange(codes) for lvl in range(3)] + [BASE - 1],
            -rng.uniform(0, 20),
            -rng.uniform(0, 5),
            "stop",
            text,
        )  # fmt: skip
        for _ in range(n)
    ]
    return GenResult(f"chatcmpl-{rng.getrandbits(128):032x}", beams, 1000, 0)


def as_columns(
    r: GenResult, text: Callable[[list[int]], str], cls: type = BeamColumns
) -> GenResult:
    """``r`` with its beams as the engine retires them (``BeamColumns``, or ``cls``: another
    version's)."""
    cols = cls.from_beams(r.beams, text)
    return GenResult(r.rid, cols, r.prompt_tokens, r.cached_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="HEAD~1")
    ap.add_argument(
        "--ref-tree", default=None,
        help="read the ref's two files from this directory (its flashrec/...), not git",
    )  # fmt: skip
    ap.add_argument("--beams", type=int, nargs="+", default=[50, 256, 512])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--columns", action="store_true", help="this checkout gets BeamColumns")
    ap.add_argument("--both-columns", action="store_true", help="both versions get BeamColumns")
    args = ap.parse_args()
    ref = _at_ref(args.ref, args.ref_tree)
    rng = random.Random(0)
    text = sid_text()

    def result(n: int) -> GenResult:
        return sid_answer(n, rng, text)

    mine = (lambda r: as_columns(r, text)) if args.columns else (lambda r: r)
    old = sys.modules.get("request_ref")  # the ref's own columns and SID text, where it has them
    old_text = sid_text(source=old.SidText) if old and hasattr(old, "SidText") else text
    old_cols = getattr(ref, "BeamColumns", BeamColumns)

    def theirs(r: GenResult) -> GenResult:
        return as_columns(r, old_text, old_cols) if args.both_columns else r

    print(
        f"{platform.machine()}, Python {platform.python_version()}, ref {args.ref}"
        + (", this checkout on BeamColumns" if args.columns else "")
    )
    bodies = {
        "chat": lambda mod, r: mod.chat_completion_json(r, "m", 1),
        "generate": lambda mod, r: mod.generate_result_json(r, 0.1),
    }
    for n in args.beams:
        for kind, build in bodies.items():
            r = result(n)
            # the same JSON (the text itself may differ: separators, escaping, float exponents)
            same = json.loads(build(ref, theirs(r))) == json.loads(build(here, mine(r)))
            assert same, "the two versions write different JSON"
            times: dict[str, list[float]] = {"ref": [], "here": []}
            for rep in range(args.reps):
                order = (
                    (("ref", ref), ("here", here)) if rep % 2 else (("here", here), ("ref", ref))
                )
                for name, mod in order:
                    r = result(n)  # fresh beams: text is built on first read, as served
                    r = mine(r) if name == "here" else theirs(r)
                    t0 = time.perf_counter()
                    build(mod, r)
                    times[name].append(time.perf_counter() - t0)
            a, b = (statistics.median(times[k]) * 1e3 for k in ("ref", "here"))
            print(f"n={n} {kind}: ref {a:.3f} ms, this checkout {b:.3f} ms, {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
