"""Answer-body encoders of two versions side by side, same process, interleaved: the
``chat_completion_json`` / ``generate_result_json`` of this checkout against those of a git
ref (``flashrec/server/responses.py`` at that ref), on beams shaped like the engine's (3 SID
tokens + the end token, text from a SID table, float scores). Checks both write the same text.

    python scripts/probes/body_bench.py [--ref HEAD~1] [--beams 50 256 512] [--reps 300] [--columns]

--columns: this checkout's encoders get the beams as the engine retires them
(``BeamColumns``), the ref's as a list of ``BeamResult`` (a ref from before the columns): the
served respond path of the two versions, not the encoders on one input.
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

from flashrec.engine.request import BeamColumns, BeamResult, GenResult  # noqa: E402
from flashrec.server import responses as here  # noqa: E402

CODES, BASE = 8192, 1000


def _at_ref(ref: str):
    src = subprocess.run(
        ["git", "show", f"{ref}:flashrec/server/responses.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "responses_ref.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("responses_ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sid_text(codes: int = CODES) -> Callable[[list[int]], str]:
    """The text of a beam's ids: a table of 3 x ``codes`` SID tokens from id ``BASE`` and the
    end token at ``BASE - 1``."""
    table = {BASE + i: f"<s_{'abc'[i // codes]}_{i % codes}>" for i in range(3 * codes)}
    table[BASE - 1] = "<|sid_end|>"

    def text(ids: list[int]) -> str:
        return "".join(map(table.__getitem__, ids))

    return text


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


def as_columns(r: GenResult, text: Callable[[list[int]], str]) -> GenResult:
    """``r`` with its beams as the engine retires them (``BeamColumns``)."""
    cols = BeamColumns.from_beams(r.beams, text)
    return GenResult(r.rid, cols, r.prompt_tokens, r.cached_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="HEAD~1")
    ap.add_argument("--beams", type=int, nargs="+", default=[50, 256, 512])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--columns", action="store_true", help="this checkout gets BeamColumns")
    ap.add_argument("--both-columns", action="store_true", help="both versions get BeamColumns")
    args = ap.parse_args()
    ref = _at_ref(args.ref)
    rng = random.Random(0)
    text = sid_text()

    def result(n: int) -> GenResult:
        return sid_answer(n, rng, text)

    mine = (lambda r: as_columns(r, text)) if args.columns else (lambda r: r)

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
            same = json.loads(build(ref, r)) == json.loads(build(here, mine(r)))
            assert same, "the two versions write different JSON"
            times: dict[str, list[float]] = {"ref": [], "here": []}
            for rep in range(args.reps):
                order = (
                    (("ref", ref), ("here", here)) if rep % 2 else (("here", here), ("ref", ref))
                )
                for name, mod in order:
                    r = result(n)  # fresh beams: text is built on first read, as served
                    r = mine(r) if name == "here" or args.both_columns else r
                    t0 = time.perf_counter()
                    build(mod, r)
                    times[name].append(time.perf_counter() - t0)
            a, b = (statistics.median(times[k]) * 1e3 for k in ("ref", "here"))
            print(f"n={n} {kind}: ref {a:.3f} ms, this checkout {b:.3f} ms, {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
