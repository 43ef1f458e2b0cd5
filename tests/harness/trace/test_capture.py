"""harness.trace.capture: wait until trace files are complete and stable; the trace prefixes
it sends FlashRec."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from pathlib import Path

import pytest

from harness.trace.capture import is_complete, wait_until_stable


class SlowWriter(threading.Thread):
    """Writes ``data`` to ``path`` in ``chunks`` pieces over ``seconds``; ``done_at`` is the
    monotonic time of the last write."""

    def __init__(self, path: Path, data: bytes, seconds: float, chunks: int = 8) -> None:
        super().__init__()
        self.path, self.data, self.seconds, self.chunks = path, data, seconds, chunks
        self.done_at = 0.0
        self.start()

    def run(self) -> None:
        step = len(self.data) // self.chunks + 1
        with open(self.path, "wb") as f:
            for i in range(self.chunks):
                time.sleep(self.seconds / self.chunks)
                f.write(self.data[i * step : (i + 1) * step])
                f.flush()
        self.done_at = time.monotonic()


def payload(n: int = 20000) -> bytes:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "ts": i, "dur": 1} for i in range(n)
    ]
    return gzip.compress(json.dumps({"traceEvents": events}).encode(), compresslevel=1)


def test_is_complete_rejects_partial_gzip(tmp_path):
    data = payload()
    p = tmp_path / "a.trace.json.gz"
    p.write_bytes(data[: len(data) // 2])
    assert not is_complete(p)
    p.write_bytes(data)
    assert is_complete(p)
    j = tmp_path / "b.json"
    j.write_text('{"traceEvents": [')
    assert not is_complete(j)
    j.write_text('{"traceEvents": []}\n')
    assert is_complete(j)


def test_waits_for_slowly_written_files(tmp_path):
    data = payload()
    (tmp_path / "sub").mkdir()
    writers = [
        SlowWriter(tmp_path / "r0.trace.json.gz", data, 1.2),
        SlowWriter(tmp_path / "sub" / "r1.trace.json.gz", data, 1.6),
    ]
    res = asyncio.run(wait_until_stable(tmp_path, settle_s=0.4, timeout_s=20, poll_s=0.05))
    returned = time.monotonic()
    for w in writers:
        w.join()
    assert res.status == "complete"
    last = max(w.done_at for w in writers)
    assert returned >= last + 0.4, "returned before the slower file was written and settled"
    assert len(res.files) == 2
    assert all(f["size_bytes"] == len(data) for f in res.files)
    assert all(is_complete(Path(f["path"])) for f in res.files)


def test_waits_through_pauses_longer_than_poll(tmp_path):
    data = payload()
    w = SlowWriter(tmp_path / "x.trace.json.gz", data, 1.0, chunks=3)  # ~0.33 s pauses
    res = asyncio.run(wait_until_stable(tmp_path, settle_s=0.2, timeout_s=20, poll_s=0.05))
    w.join()
    # a pause may look stable, but the partial gzip is not complete: it must keep waiting
    assert res.status == "complete" and res.files[0]["size_bytes"] == len(data)


def test_timeout_and_missing(tmp_path):
    (tmp_path / "bad.trace.json.gz").write_bytes(payload()[:100])
    res = asyncio.run(wait_until_stable(tmp_path, settle_s=0.1, timeout_s=0.5, poll_s=0.05))
    assert res.status == "timeout"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = asyncio.run(wait_until_stable(empty, settle_s=0.1, timeout_s=0.3, poll_s=0.05))
    assert res.status == "missing"


def test_an_earlier_runs_traces_never_stand_in_for_this_ones(tmp_path):
    """A folder that already holds a complete trace from an earlier run (a rerun into the
    same --out, --resume): with ``since``, that file does not count; the wait ends on the
    new file, or reports ``missing`` when none comes."""
    import os

    old = tmp_path / "earlier.trace.json.gz"
    old.write_bytes(payload())
    past = time.time() - 600
    os.utime(old, (past, past))
    asked = time.time()
    res = asyncio.run(
        wait_until_stable(tmp_path, settle_s=0.1, timeout_s=0.5, poll_s=0.05, since=asked)
    )
    assert res.status == "missing" and res.files == []
    w = SlowWriter(tmp_path / "now.trace.json.gz", payload(), 0.5)
    res = asyncio.run(
        wait_until_stable(tmp_path, settle_s=0.2, timeout_s=20, poll_s=0.05, since=asked)
    )
    w.join()
    assert res.status == "complete" and [Path(f["path"]).name for f in res.files] == [
        "now.trace.json.gz"
    ]
    # without ``since`` (callers that own a fresh folder) every file counts, as before
    res = asyncio.run(wait_until_stable(tmp_path, settle_s=0.1, timeout_s=20, poll_s=0.05))
    assert len(res.files) == 2


def test_trace_prefix_is_accepted_by_flashrec_for_long_cell_ids(tmp_path: Path) -> None:
    """The H200 matrix's cell ids run to 74 characters; FlashRec takes prefixes of at most 64.
    Every prefix the harness sends must pass FlashRec's own validation, and two long ids that
    differ only at the end must not share a prefix (their traces would mix)."""
    from flashrec.profiler import ProfileError, parse_options
    from harness.trace.capture import trace_prefix

    base = "flashrec,beam_width=256,concurrency=1,quantization=bf16,prompt_tokens="
    ids = [base + "1000", base + "5000", "flashrec,beam_width=50", "a b/c"]
    prefixes = [trace_prefix(i) for i in ids]
    for p in prefixes:
        opts = parse_options({"output_dir": str(tmp_path), "profile_prefix": p}, tmp_path)
        assert opts.profile_prefix == p
    assert len(set(prefixes)) == len(prefixes)
    assert prefixes[2] == "flashrec_beam_width_50"  # short ids keep their readable form
    with pytest.raises(ProfileError, match="1-64"):
        parse_options({"profile_prefix": "x" * 65}, tmp_path)
