"""FlashRec as a worker behind the real sglang-router (``python -m sglang_router.launch_router``).

Two ``flashrec serve`` processes on the tiny synthetic model, each in its own process group, the
router in a third; all torn down (and checked gone) whatever the test did. What the router does
to a worker is in ``docs/deploy.md``: GET ``/health`` at registration and every
``--health-check-interval-secs``, GET ``/server_info`` and ``/model_info`` at registration,
requests re-serialized from its own typed schema, a failed send retried on another worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from server_helpers import parse_metrics, polled, wait_for

from harness.servers.launch import free_port, group_members

pytest.importorskip(
    "sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)"
)

CHAT = "/v1/chat/completions"
START_S = 120.0  # a loaded 2-core machine: model load of two servers at once


@dataclass
class Proc:
    """One child process in a process group of its own, its output in ``log``."""

    popen: subprocess.Popen
    log: Path

    @property
    def pgid(self) -> int:
        return self.popen.pid

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left after 20 s; reap the leader."""
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait(10)
        if group_members(self.pgid):
            self.kill(signal.SIGKILL)


def spawn(argv: list[str], log: Path) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Proc(popen, log)


def start_worker(model: Path, log: Path) -> Proc:
    port = free_port()
    argv = [
        sys.executable, "-m", "flashrec", "serve", "--model-path", str(model),
        "--sid-vocab-file", str(model / "catalog.json"), "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--beam-width", "4", "--batch-slots", "256",
        "--kv-pool-tokens", "65536", "--max-seq-len", "4096", "--no-warmup",
        "--served-model-name", "tiny",
    ]  # fmt: skip
    proc = spawn(argv, log)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return proc


def start_router(urls: list[str], policy: str, log: Path) -> tuple[Proc, str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--worker-urls", *urls, "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
        "--log-level", "warn",
    ]  # fmt: skip
    return spawn(argv, log), f"http://127.0.0.1:{port}"


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def router_workers(router: str) -> dict[str, bool]:
    """worker URL -> healthy, as the router sees it ({} while it does not answer)."""
    try:
        body = requests.get(router + "/workers", timeout=2).json()
    except (requests.RequestException, ValueError):
        return {}
    return {w["url"]: w["is_healthy"] for w in body.get("workers", [])}


def served(url: str) -> float:
    """Generation requests this worker answered (``flashrec_requests_total``, all labels)."""
    m = parse_metrics(requests.get(url + "/metrics", timeout=10).text)
    return sum(v for k, v in m.items() if k.startswith("flashrec_requests_total"))


@dataclass
class Cluster:
    router: str
    workers: list[Proc]
    router_proc: Proc
    procs: list[Proc] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]  # type: ignore[attr-defined]


@contextmanager
def cluster(model: Path, tmp: Path, policy: str) -> Iterator[Cluster]:
    """Two workers, then the router in front of them (workers first: the router re-checks a
    worker that is not yet healthy only every ``--worker-startup-check-interval``)."""
    procs: list[Proc] = []
    try:
        workers = [start_worker(model, tmp / f"worker{i}.log") for i in range(2)]
        procs += workers
        for w in workers:
            ok = polled(lambda w=w: healthy(w.url) or w.popen.poll() is not None, START_S, 0.2)
            assert ok and w.popen.poll() is None, f"worker did not start:\n{w.tail()}"
        router_proc, router = start_router([w.url for w in workers], policy, tmp / "router.log")
        procs.append(router_proc)
        ok = polled(
            lambda: (
                list(router_workers(router).values()) == [True, True]
                or router_proc.popen.poll() is not None
            ),
            60.0,
            0.1,
        )
        assert ok and router_proc.popen.poll() is None, f"router not ready:\n{router_proc.tail()}"
        yield Cluster(router, workers, router_proc, procs)
    finally:
        for p in reversed(procs):
            p.stop()
        left = {p.pgid: group_members(p.pgid) for p in procs}
        assert not any(left.values()), f"processes left running: {left}"


@pytest.fixture(scope="module")
def rr(tiny_model, tmp_path_factory) -> Iterator[Cluster]:
    """Two workers behind the router, round robin (each request alternates replicas)."""
    with cluster(tiny_model, tmp_path_factory.mktemp("router"), "round_robin") as c:
        yield c


def chat_body(text: str, n: int = 4) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "n": n,
        "max_tokens": 3,
        "temperature": 0,
    }


def gen_body(text: str, n: int = 8) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"n": n, "max_new_tokens": 3, "temperature": 0}}


def beams(path: str, body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a greedy answer must keep: each beam's text, tokens and score (to 1e-5: a prompt
    prefilled whole or after a cached prefix differs in the last float bits), in order."""
    if path == CHAT:
        out = [
            (c["message"]["content"], c["sglext"]["token_ids"], c["sglext"]["sequence_score"])
            for c in body["choices"]
        ]
        tail: tuple[Any, ...] = (body["model"], body["catalog_hash"])
    else:
        out = [
            (b["text"], b["output_ids"], b["meta_info"]["sequence_score"])
            for b in body["meta_info"]["beam_results"]
        ]
        tail = (body["meta_info"]["catalog_hash"],)
    return [(t, ids, pytest.approx(s, abs=1e-5)) for t, ids, s in out] + [tail]


def post(url: str, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(url + path, json=body, timeout=60)


def test_probes_answered(rr: Cluster) -> None:
    """Every registration probe is answered: the router takes the served name as the model id
    and logs no fallback to the deprecated ``/get_*`` names (which it does on a 404)."""
    for url in rr.urls:
        info = requests.get(url + "/server_info", timeout=10)
        old = requests.get(url + "/get_server_info", timeout=10)
        assert info.status_code == old.status_code == 200
        assert info.json()["served_model_name"] == "tiny"
        assert info.json().keys() == old.json().keys()
        model = requests.get(url + "/model_info", timeout=10)
        assert model.status_code == 200
        assert model.json() == requests.get(url + "/get_model_info", timeout=10).json()
        assert model.json()["is_generation"] is True
        assert model.json()["architectures"] == ["Qwen3ForCausalLM"]
        assert "model_path" not in model.json() and "tokenizer_path" not in model.json()
    workers = requests.get(rr.router + "/workers", timeout=5).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(rr.urls)
    assert {w["model_id"] for w in workers} == {"tiny"}
    ids = [m["id"] for m in requests.get(rr.router + "/v1/models", timeout=5).json()["data"]]
    assert ids == ["tiny"]
    log = rr.router_proc.tail()
    assert "returned 404" not in log and "falling back" not in log, log


@pytest.mark.parametrize("path", [CHAT, "/generate"])
def test_beams_through_router_equal_direct(rr: Cluster, path: str) -> None:
    """Greedy beams through the router equal the same request sent to a worker directly, on
    both replicas (round robin alternates them)."""
    make = chat_body if path == CHAT else gen_body
    before = [served(u) for u in rr.urls]
    for i in range(4):
        body = make(f"user {i} history: item {i} item {i + 1}")
        via = post(rr.router, path, body)
        assert via.status_code == 200, via.text
        direct = [post(u, path, body) for u in rr.urls]
        assert [d.status_code for d in direct] == [200, 200]
        want = beams(path, direct[0].json())
        assert beams(path, direct[1].json()) == want
        assert beams(path, via.json()) == want
        assert len(want) == (body["n"] if path == CHAT else body["sampling_params"]["n"]) + 1
    after = [served(u) for u in rr.urls]
    # 4 direct requests each, and the router's 4 split between them
    assert [a - b for a, b in zip(after, before, strict=True)] == [6, 6]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "a", "sampling_params": {"n": 100000}}),
        (
            CHAT,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
        ),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6}),
    ],
)
def test_worker_error_passed_through(rr: Cluster, path: str, body: dict[str, Any]) -> None:
    """A body the router accepts but FlashRec rejects: the client gets FlashRec's status and
    error body unchanged, from whichever replica took it."""
    direct = post(rr.urls[0], path, body)
    assert direct.status_code == 400
    for _ in range(2):  # both replicas
        via = post(rr.router, path, body)
        assert via.status_code == 400
        assert via.json() == direct.json()


def test_router_own_limits(rr: Cluster) -> None:
    """What the router rejects itself, before any worker sees it: chat ``n`` over 10 (400),
    a batched ``/generate`` ``text`` list (422)."""
    before = [served(u) for u in rr.urls]
    over = post(rr.router, CHAT, chat_body("hi", n=11))
    assert over.status_code == 400 and "n" in over.json()["error"]["message"]
    assert post(rr.urls[0], CHAT, chat_body("hi", n=11)).status_code == 200  # FlashRec: fine
    batched = post(rr.router, "/generate", {"text": ["a", "b"], "sampling_params": {"n": 2}})
    assert batched.status_code == 422
    assert [served(u) for u in rr.urls] == [before[0] + 1, before[1]]


def test_killed_replica(tiny_model, tmp_path) -> None:
    """SIGKILL one replica under load: no request fails (a send to the dead replica is retried
    on the other), its health checks take it out within a few intervals, and every answer is
    the greedy one."""
    with cluster(tiny_model, tmp_path, "round_robin") as c:
        want = {p: beams(p, post(c.urls[1], p, mk("x")).json()) for p, mk in _PATHS.items()}
        results: list[tuple[float, str, int, Any]] = []
        stop = threading.Event()

        def client(path: str) -> None:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    r = post(c.router, path, _PATHS[path]("x"))
                    got = beams(path, r.json()) if r.status_code == 200 else r.text
                    results.append((t, path, r.status_code, got))
                except requests.RequestException as exc:
                    results.append((t, path, -1, repr(exc)))

        threads = [threading.Thread(target=client, args=(p,)) for p in (*_PATHS, *_PATHS)]
        for th in threads:
            th.start()
        try:
            wait_for(lambda: len(results) >= 20, 30, "requests before the kill")
            dead, live = c.workers[0].url, c.workers[1].url  # type: ignore[attr-defined]
            live_before = served(live)
            killed = time.monotonic()
            c.workers[0].kill()
            wait_for(lambda: router_workers(c.router).get(dead) is False, 30, "the router")
            noticed = time.monotonic() - killed
            n_after = len(results)
            wait_for(lambda: len(results) >= n_after + 20, 30, "requests after")
        finally:
            stop.set()
            for th in threads:
                th.join(60)
        during = [r for r in results if r[0] >= killed]
        print(f"health checks took the replica out after {noticed:.1f} s; "
              f"{len(during)} requests sent after the kill")  # fmt: skip
        assert noticed < 15.0  # 3 failed checks 1 s apart, plus the check's own time
        assert len(during) >= 20
        bad = [r for r in results if r[2] != 200 or r[3] != want[r[1]]]
        assert not bad, bad[:5]
        assert router_workers(c.router).get(live) is True
        assert served(live) - live_before >= len(during)  # all answered by the live one


_PATHS = {CHAT: lambda t: chat_body(t), "/generate": lambda t: gen_body(t)}
