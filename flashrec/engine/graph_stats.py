"""Graph health: which captured CUDA graph served each decode and prefill forward, which ran
eagerly and why, and every capture (by kind and size), start-up or later.

A forward that silently leaves the graphs costs up to half the QPS (the seed notes), so every
one is counted, and ``/metrics`` (``flashrec_graph_*``) and ``/get_server_info``
(``engine.graphs``) show the counts. The choice of path is made here, by pure functions of what
was captured and the batch (``decode_path``, ``prefill_path``), so it is testable without a GPU;
the runner asks them and runs what they say.

Kinds: ``decode`` (the model forward over beam rows, ``graph.py``), ``step`` (the whole decode
step, ``--enable-step-graph``), ``prefill`` (one prompt, ``prefill_graph.py``), ``piecewise``
(a batch, cut at attention, ``piecewise.py``). A piecewise bucket is one capture of its
L + 1 pieces.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("flashrec")

KINDS = {"decode": ("decode", "step"), "prefill": ("prefill", "piecewise")}

# why a forward ran eagerly, per phase (every reason is exported, 0 until it happens)
DEVICE_CPU = "device_cpu"  # no CUDA device: nothing is captured
DISABLED = "disabled"  # --disable-cuda-graph, or both prefill graph kinds set to 0 tokens
OVER_MAX_BATCH = "over_max_batch"  # decode rows over the largest graph (--cuda-graph-max-bs)
ATTENTION_DECLINED = "attention_declined"  # the attention backend cannot replay this batch
OVER_MAX_TOKENS = "over_max_tokens"  # new tokens over the largest prefill bucket
OVER_MAX_PROMPTS = "over_max_prompts"  # more prompts than a piecewise graph holds
SHAPE_NOT_CAPTURED = "shape_not_captured"  # only the one-prompt graph, and this is not one
REASONS = {
    "decode": (DEVICE_CPU, DISABLED, OVER_MAX_BATCH, ATTENTION_DECLINED),
    "prefill": (DEVICE_CPU, DISABLED, OVER_MAX_TOKENS, OVER_MAX_PROMPTS, SHAPE_NOT_CAPTURED),
}


def off_reason(device_type: str) -> str:
    """Why a runner without graphs of a kind has none: no CUDA device, or switched off."""
    return DEVICE_CPU if device_type != "cuda" else DISABLED


def decode_path(
    sizes: Sequence[int], rows: int, attention_fits: bool, off: str
) -> tuple[str, str | None]:
    """``("decode", None)`` (a replay of the decode graphs) or ``("eager", reason)`` for a
    decode forward of ``rows`` beam rows, given the captured decode sizes (empty: none, for
    reason ``off``) and whether the attention backend can replay the batch."""
    if not sizes:
        return "eager", off
    if rows > max(sizes):
        return "eager", OVER_MAX_BATCH
    if not attention_fits:
        return "eager", ATTENTION_DECLINED
    return "decode", None


def prefill_path(
    one_prompt: bool | None,
    piecewise: bool | None,
    prompts: int,
    tokens: int,
    max_tokens: int,
    max_prompts: int,
    captured: bool,
    off: str,
) -> tuple[str, str | None]:
    """How a prefill batch runs: ``("prefill" | "piecewise", None)`` for a graph that takes it,
    ``("eager", reason)`` otherwise. ``one_prompt`` / ``piecewise``: whether that graph kind
    takes this batch (None: the runner has none); ``max_tokens`` / ``max_prompts``: the largest
    bucket and prompt count of the widest kind it has; ``captured``: whether that kind was
    captured (False on CPU, where the same padded forward runs eagerly, for reason ``off``)."""
    if one_prompt:
        return ("prefill", None) if captured else ("eager", off)
    if piecewise:
        return ("piecewise", None) if captured else ("eager", off)
    if one_prompt is None and piecewise is None:
        return "eager", off
    if piecewise is None and prompts == 1 and tokens > max_tokens:
        return "eager", OVER_MAX_TOKENS
    if piecewise is None:
        return "eager", SHAPE_NOT_CAPTURED
    if prompts > max_prompts:
        return "eager", OVER_MAX_PROMPTS
    return "eager", OVER_MAX_TOKENS


class GraphStats:
    """The counters, kept on the engine thread (``snapshot`` is taken there too)."""

    def __init__(self) -> None:
        # kind -> {size: graphs captured at it}
        self.captured: dict[str, dict[int, int]] = {k: {} for ks in KINDS.values() for k in ks}
        self._captures: list | None = None  # the snapshot's capture list, until the next one
        self.captures_after_warmup = dict.fromkeys(self.captured, 0)
        self.replays = dict.fromkeys(self.captured, 0)
        self.eager = {(p, r): 0 for p, rs in REASONS.items() for r in rs}
        self.warm = False  # set at the end of the server's warm-up (EngineLoop.warmup)
        self._logged: set = set()  # eager decode reasons / widths already logged

    def capture(self, kind: str, size: int) -> None:
        """One graph of ``kind`` captured at ``size`` (rows or tokens)."""
        sizes = self.captured[kind]
        sizes[size] = sizes.get(size, 0) + 1
        self._captures = None
        if self.warm:
            self.captures_after_warmup[kind] += 1

    def end_warmup(self) -> None:
        """From now on a capture is a capture while serving."""
        self.warm = True

    def replay(self, kind: str) -> None:
        self.replays[kind] += 1

    def eager_forward(self, phase: str, reason: str) -> None:
        self.eager[phase, reason] += 1

    def warn_eager(self, reason: str | None, rows: int, sizes: Sequence[int]) -> None:
        """Log an eager decode forward of a runner with graphs: once for a batch the attention
        backend declined, once per width over the largest graph."""
        if reason == ATTENTION_DECLINED and reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "a decode batch whose prompts outgrow the attention backend's staging buffer "
                "runs eagerly, through the Triton kernel (logged once)"
            )
        elif reason == OVER_MAX_BATCH and rows not in self._logged:
            self._logged.add(rows)
            log.warning(
                "a decode batch of %d rows runs eagerly: the largest decode graph holds %d "
                "(raise --cuda-graph-max-bs to the widest request's n, or lower the request's n)",
                rows, max(sizes),
            )  # fmt: skip

    def count(self, phase: str, path: tuple[str, str | None]) -> None:
        """Count one forward of ``phase`` as ``decode_path`` / ``prefill_path`` chose it:
        ``(kind replayed, None)`` or ``("eager", reason)``."""
        kind, reason = path
        if reason is None:
            self.replay(kind)
        else:
            self.eager_forward(phase, reason)

    def snapshot(self) -> dict[str, Any]:
        """Plain values for ``/metrics`` (picklable: an engine process sends them over the
        pipe): ``captures`` ``[(kind, size, count)]``, ``captures_after_warmup`` and
        ``replays`` ``{kind: count}``, ``eager`` ``[(phase, reason, count)]``, ``warm``."""
        if self._captures is None:  # taken every step: built once per capture
            self._captures = [
                (kind, s, n)
                for kind, sizes in self.captured.items()
                for s, n in sorted(sizes.items())
            ]
        return {
            "captures": list(self._captures),
            "captures_after_warmup": dict(self.captures_after_warmup),
            "replays": dict(self.replays),
            "eager": [(p, r, n) for (p, r), n in self.eager.items()],
            "warm": self.warm,
        }

    def info(self) -> dict[str, Any]:
        """``describe(self.snapshot())``."""
        return describe(self.snapshot())


def describe(snap: dict[str, Any]) -> dict[str, Any]:
    """What ``/get_server_info`` shows (``graphs``) of a ``GraphStats.snapshot()``: the
    captured sizes per kind, the counts of captures (all, after warm-up), of replays per phase
    and kind and of eager forwards per phase and reason."""
    sizes: dict[str, list[int]] = {k: [] for ks in KINDS.values() for k in ks}
    for kind, size, _ in snap["captures"]:
        sizes.setdefault(kind, []).append(size)
    eager: dict[str, dict[str, int]] = {p: {} for p in REASONS}
    for phase, reason, n in snap["eager"]:
        eager.setdefault(phase, {})[reason] = n
    replays = snap["replays"]
    return {
        "captured_sizes": sizes,
        "captures": sum(n for _, _, n in snap["captures"]),
        "captures_after_warmup": sum(snap["captures_after_warmup"].values()),
        "warm": snap["warm"],
        "replays": {p: {k: replays.get(k, 0) for k in ks} for p, ks in KINDS.items()},
        "eager_forwards": eager,
    }


def snapshot_of(runner: Any) -> dict[str, Any]:
    """``runner.graph_stats.snapshot()``; {} for a runner that keeps none (a test's stand-in)."""
    stats = getattr(runner, "graph_stats", None)
    return stats.snapshot() if stats is not None else {}


def end_warmup_of(runner: Any) -> None:
    """``runner.graph_stats.end_warmup()``, where the runner keeps graph stats."""
    stats = getattr(runner, "graph_stats", None)
    if stats is not None:
        stats.end_warmup()
