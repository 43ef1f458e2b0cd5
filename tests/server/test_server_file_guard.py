"""Catalog paths a client or an operator names: a FIFO, a device, a directory or a file over
``--max-catalog-bytes`` is refused with its reason (400 for ``/update_catalog``, an exit at
start-up), never read forever; the reload lock is free after each; and SIGTERM ends the server
by its deadline even while a reload is in flight, with the engine in or out of process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from server_helpers import parse_metrics, wait_for
from test_server_lifecycle import ROOT, start

from flashrec import boundedread
from flashrec.sid.catalog import load_catalog

SHUTDOWN_S = 2.0


def serve_argv(ckpt: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "flashrec", "serve", "--model-path", str(ckpt),
        "--sid-vocab-file", str(ckpt / "catalog.json"), "--device", "cpu", "--host",
        "127.0.0.1", "--port", "0", "--no-warmup", "--no-gc-freeze", "--shutdown-timeout-s",
        str(SHUTDOWN_S), "--batch-slots", "64", "--beam-width", "4", *flags,
    ]  # fmt: skip


@pytest.fixture
def fifo(tmp_path: Path):
    """A FIFO no one writes to; opened for writing at the end, so that a reader stuck on it
    (the fault under test) is released."""
    path = tmp_path / "catalog.fifo"
    os.mkfifo(path)
    yield path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass  # no reader waiting


def in_thread(fn, timeout: float = 30.0):
    """``fn()``'s exception (None when it returned), or TimeoutError when it hung."""
    out: list = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else TimeoutError(f"still reading after {timeout} s")


def test_bounded_read_refuses_what_is_not_a_regular_file_within_the_cap(
    tmp_path: Path, fifo: Path
) -> None:
    big = tmp_path / "big.txt"
    big.write_text("1,2,3\n" * 1000)
    for path, why in ((fifo, "FIFO"), ("/dev/zero", "character device"), (tmp_path, "directory")):
        exc = in_thread(lambda p=path: load_catalog(p))
        assert isinstance(exc, ValueError) and why in str(exc), exc

    def capped() -> None:
        with boundedread.using(100, 10.0):  # the limits of the reading thread
            load_catalog(big)

    exc = in_thread(capped)
    assert isinstance(exc, ValueError) and "--max-catalog-bytes" in str(exc), exc
    assert len(load_catalog(big)) == 1  # the default cap: read whole
    assert boundedread.read_bytes(big, max_bytes=6000) == big.read_bytes()


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_update_catalog_refuses_bad_paths_and_frees_the_lock(
    procs, tiny_checkpoint: Path, tmp_path: Path, fifo: Path, engine_process: str
) -> None:
    catalog = tiny_checkpoint / "catalog.json"
    cap = catalog.stat().st_size + 1000
    big = tmp_path / "big.json"
    big.write_text(catalog.read_text() + " " * 2000)  # valid JSON, over the cap
    p = start(procs, serve_argv(
        tiny_checkpoint, "--engine-process", engine_process, "--max-catalog-bytes", str(cap)
    ))  # fmt: skip
    bad = {fifo: "FIFO", "/dev/zero": "character device", tmp_path: "directory"}
    bad[big] = "--max-catalog-bytes"
    for path, why in bad.items():
        r = requests.post(p.url + "/update_catalog", json={"path": str(path)}, timeout=60)
        assert r.status_code == 400 and why in r.json()["error"]["message"], (path, r.text)
    ok = requests.post(p.url + "/update_catalog", json={"path": str(catalog)}, timeout=60)
    assert ok.status_code == 200, ok.text  # no reload left holding the lock
    m = parse_metrics(requests.get(p.url + "/metrics", timeout=30).text)
    assert m["flashrec_catalog_reloads_rejected_total"] == len(bad)
    assert m["flashrec_catalog_reloads_ok_total"] == 1


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_sigterm_ends_the_server_by_its_deadline_during_a_reload(
    procs, tiny_checkpoint: Path, tmp_path: Path, engine_process: str
) -> None:
    gate = tmp_path / "gate"  # absent: every reload waits (tests/plants)
    argv = serve_argv(tiny_checkpoint, "--engine-process", engine_process)
    p = start(procs, argv, env={"FLASHREC_TEST_RELOAD_GATE": str(gate)})
    url, body = p.url + "/update_catalog", {"path": str(tiny_checkpoint / "catalog.json")}
    answers: list = []

    def held_reload() -> None:
        try:
            answers.append(requests.post(url, json=body, timeout=120).status_code)
        except requests.RequestException as exc:
            answers.append(exc)

    threading.Thread(target=held_reload, daemon=True).start()
    waiting = Path(str(gate) + ".waiting")  # the plant's word: a reload waits at the gate
    wait_for(waiting.exists, 60, "the reload in flight")
    assert requests.post(url, json=body, timeout=30).status_code == 409  # it holds the lock
    t0 = time.monotonic()
    p.p.send_signal(signal.SIGTERM)
    try:
        code = p.p.wait(timeout=100)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    # drain deadline, then cancel, close and exit: seconds, even on a loaded machine; a reload
    # that holds the exit holds it for a minute or more (the engine process's stop timeout)
    tail = "".join(p.log[-30:])
    assert code == 0 and took < SHUTDOWN_S + 28, f"exit {code} after {took:.1f} s:\n{tail}"
    wait_for(lambda: bool(answers), 30, "the held reload answered")
    assert answers[0] == 503 or isinstance(answers[0], requests.RequestException), answers


def test_a_fifo_catalog_flag_is_refused_before_loading(tiny_checkpoint: Path, fifo: Path) -> None:
    argv = serve_argv(tiny_checkpoint)
    argv[argv.index("--sid-vocab-file") + 1] = str(fifo)
    try:
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("flashrec serve hung on a FIFO --sid-vocab-file")
    assert r.returncode == 1 and "FIFO" in r.stderr, r.stderr
