"""A large catalog parsed in a child process: the same catalog and the same errors as parsed
here, the read limits applied there, and the calling process's other threads left running."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
from probe_helpers import load_probe

from flashrec import boundedread
from flashrec.sid import childload
from flashrec.sid.catalog import load_catalog, write_catalog_json
from flashrec.sid.layout import SidLayout
from flashrec.sid.version import build_catalog_version

K = 256
LAYOUT = SidLayout(code_start=1000, codebook_size=K, num_levels=3, sid_begin=2536, sid_end=2537)


def _codes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, K, size=(n, 3))


def test_child_parse_equals_parse_here(tmp_path):
    path = tmp_path / "c.json"
    write_catalog_json(_codes(500), path)
    here = load_catalog(path, layout=LAYOUT)
    child = childload.load_catalog_codes(path, layout=LAYOUT, child_bytes=0)
    assert childload.parse_where(path, 0) == "child"
    np.testing.assert_array_equal(child.codes, here.codes)
    assert child.source == here.source and child.pids is None


@pytest.mark.parametrize(
    "text,why",
    [('{"1,2": {}, "1,2,3": {}', "not JSON"), ('{"1,2,999": {}}', "outside the layout")],
)
def test_child_errors_keep_type_and_message(tmp_path, text, why):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as here:
        load_catalog(path, layout=LAYOUT)
    with pytest.raises(ValueError) as child:
        childload.load_catalog_codes(path, layout=LAYOUT, child_bytes=0)
    assert type(child.value) is type(here.value), why
    assert str(child.value) == str(here.value)


def test_child_applies_the_callers_read_limits(tmp_path):
    path = tmp_path / "c.json"
    write_catalog_json(_codes(500), path)
    with boundedread.using(max_bytes=64, timeout_s=10):
        for child_bytes in (0, 1 << 40):  # parsed there, parsed here: refused alike
            with pytest.raises(ValueError, match="over the 64-byte cap"):
                childload.load_catalog_codes(path, layout=LAYOUT, child_bytes=child_bytes)


def _in_a_daemon(path: str, out) -> None:
    cat = childload.load_catalog_codes(path, layout=LAYOUT, child_bytes=0)
    out.put(cat.codes.tolist())


def test_a_daemonic_process_may_parse_in_a_child(tmp_path):
    """The server's engine process is daemonic (``--engine-process on``), and a daemonic
    multiprocessing process may not start children of its own: the child is a plain one."""
    path = tmp_path / "c.json"
    write_catalog_json(_codes(50), path)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_in_a_daemon, args=(str(path), q), daemon=True)
    p.start()
    try:
        codes = q.get(timeout=120)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    np.testing.assert_array_equal(np.array(codes), load_catalog(path, layout=LAYOUT).codes)


def test_a_child_that_dies_is_a_value_error(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    write_catalog_json(_codes(50), path)
    monkeypatch.setattr(childload.sys, "executable", "/bin/false")
    with pytest.raises(ValueError, match="the catalog reader process failed"):
        childload.load_catalog_codes(path, layout=LAYOUT, child_bytes=0)


def test_paths_that_are_not_regular_files_stay_here(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert childload.parse_where(fifo, 0) == "here"
    assert childload.parse_where(tmp_path / "missing.json", 0) == "here"
    assert childload.parse_where(tmp_path, 0) == "here"


def _max_gap_while(fn) -> float:
    """The longest another thread of this process waited to run while ``fn`` ran (seconds):
    the 1 ms ticker of ``scripts/probes/reload_stall_probe.py``."""
    return max(load_probe("reload_stall_probe").ticking(fn)[1])


def test_a_large_reload_leaves_other_threads_running(tmp_path, monkeypatch):
    """1M SIDs (~35 MB): parsed here, the parse holds the interpreter lock for about a second
    on end; parsed in the child, this process's other threads keep running (the engine
    thread of a server whose catalog reloads)."""
    path = tmp_path / "big.json"
    write_catalog_json(_codes(1_000_000, seed=1), path)
    assert os.path.getsize(path) >= childload.CHILD_BYTES
    versions = []

    def build():
        versions.append(build_catalog_version(path, LAYOUT, 3, "cpu"))

    child_gap = _max_gap_while(build)
    monkeypatch.setattr(childload, "CHILD_BYTES", 1 << 40)  # the same file parsed here
    here_gap = _max_gap_while(build)
    assert versions[0].hash == versions[1].hash and versions[0].size == versions[1].size
    assert child_gap < 0.5, f"another thread waited {child_gap:.2f} s during a child parse"
    assert here_gap > 2 * child_gap, (here_gap, child_gap)
