"""``PlanRing``: FlashInfer prefill plans are never rewritten while the GPU has yet to copy them.

A model of the hazard runs on the CPU: a stream of queued operations that run later, a wrapper
whose ``plan`` writes a host buffer and queues a copy that reads it when it runs (as FlashInfer's
page-locked plan buffer does), and forwards that read what the copy delivered. The GPU test in
``tests/gpu/test_gpu_flashinfer.py`` runs the real wrappers behind a delayed stream."""

from __future__ import annotations

import pytest

from flashrec.layers.attention_flashinfer import PlanRing


class Stream:
    """Operations queued now, run in order later (``run_until``), like a CUDA stream."""

    def __init__(self) -> None:
        self.ops: list = []
        self.done = 0

    def queue(self, op) -> int:
        self.ops.append(op)
        return len(self.ops)

    def run_until(self, n: int) -> None:
        while self.done < n:
            self.ops[self.done]()
            self.done += 1


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream, self.mark = stream, 0

    def record(self) -> None:
        self.mark = self.stream.queue(lambda: None)

    def query(self) -> bool:
        return self.stream.done >= self.mark

    def synchronize(self) -> None:
        self.stream.run_until(self.mark)


class Wrapper:
    """``plan`` fills a host buffer and queues its copy; ``run`` queues a kernel that reads
    the device copy and records what it saw."""

    def __init__(self, stream: Stream, seen: list) -> None:
        self.stream, self.seen = stream, seen
        self.host = self.device = None

    def plan(self, lengths) -> None:
        self.host = lengths  # written now, on the host

        def copy() -> None:  # reads the host buffer when the stream gets here
            self.device = self.host

        self.stream.queue(copy)

    def run(self, forward: int) -> None:
        self.stream.queue(lambda: self.seen.append((forward, self.device)))


def _forwards(ring_size: int | None, n: int = 7) -> list:
    """n forwards planned and queued while the stream runs nothing (a host far ahead), then
    the stream drains; returns what each forward's kernel saw."""
    stream, seen = Stream(), []
    if ring_size is None:  # one wrapper, planned again and again (the engine before)
        w = Wrapper(stream, seen)
        for f in range(n):
            w.plan((f, f + 1))
            w.run(f)
    else:
        ring = PlanRing(lambda: Wrapper(stream, seen), lambda: Event(stream), ring_size)
        for f in range(n):
            ring.plan((f, f + 1))
            ring.current.run(f)
    stream.run_until(len(stream.ops))
    return seen


def test_one_wrapper_replanned_ahead_of_the_stream_gives_forwards_the_wrong_plan() -> None:
    seen = _forwards(None)
    assert [plan for _, plan in seen] == [(6, 7)] * 7  # every forward ran the last plan


@pytest.mark.parametrize("size", [1, 2, 3])
def test_every_forward_runs_its_own_plan(size: int) -> None:
    seen = _forwards(size)
    assert seen == [(f, (f, f + 1)) for f in range(7)]


def test_waits_only_when_the_host_is_a_ring_ahead() -> None:
    stream, seen = Stream(), []
    ring = PlanRing(lambda: Wrapper(stream, seen), lambda: Event(stream), 3)
    for f in range(3):  # three plans, nothing run yet: each goes to a fresh wrapper
        ring.plan((f,))
        ring.current.run(f)
    assert ring.waits == 0 and stream.done == 0
    ring.plan((3,))  # the first wrapper again: its copy has not run, so the host waits for it
    assert ring.waits == 1 and stream.done >= 1
    stream.run_until(len(stream.ops))
    ring.current.run(3)
    ring.plan((4,))  # the GPU is past everything: no wait
    assert ring.waits == 1
    stream.run_until(len(stream.ops))
    assert [p for _, p in seen] == [(0,), (1,), (2,), (3,)]


def test_current_is_the_wrapper_planned_last_and_size_is_checked() -> None:
    stream = Stream()
    made: list = []

    def make() -> Wrapper:
        made.append(Wrapper(stream, []))
        return made[-1]

    ring = PlanRing(make, lambda: Event(stream), 2)
    ring.plan((1,))
    assert ring.current is made[0]
    ring.plan((2,))
    assert ring.current is made[1]
    ring.plan((3,))
    assert ring.current is made[0]
    with pytest.raises(ValueError, match="at least one"):
        PlanRing(make, lambda: Event(stream), 0)
