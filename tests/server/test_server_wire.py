"""``flashrec.server.wire``: content codings, size caps, parse errors and read timeouts, sent
from raw sockets (the odd headers no client library sends) to the fake-engine server."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
import requests
from raw_http import Answer, exchange, parse, request_bytes, trickle
from server_helpers import ServerThread, fake_server

from flashrec.server import wire

CHAT = {"messages": [{"role": "user", "content": "hello"}], "n": 2}
GEN = {"text": "hello", "sampling_params": {"n": 2}}
BODIES = {"/v1/chat/completions": CHAT, "/generate": GEN}
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    with fake_server(header_timeout_s=1.0, body_timeout_s=1.0) as s:
        yield s


def send(srv: ServerThread, path: str, body: bytes, **headers: str) -> Answer:
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    return exchange(srv.server.port, request_bytes(path, body, hdrs))


def assert_json_error(ans: Answer, status: int) -> dict:
    assert ans.status == status, (ans.status, ans.body, ans.error)
    assert ans.headers["content-type"].startswith("application/json")
    err = ans.json()["error"]
    assert set(err) == ERROR_KEYS and err["code"] == status and err["message"]
    return err


def errors_total(srv: ServerThread, status: int) -> float:
    return srv.metrics().get(f'flashrec_http_errors_total{{status="{status}"}}', 0.0)


# -- reproducers of issue 26 (each a 500, plain text or reset before wire.py) ---------------


@pytest.mark.parametrize("path", sorted(BODIES))
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_coding_on_a_plain_body_is_400(srv: ServerThread, path: str, coding: str) -> None:
    before = srv.metrics().get('flashrec_requests_total{endpoint="chat",outcome="error"}')
    ans = send(srv, path, json.dumps(BODIES[path]).encode(), Content_Encoding=coding)
    err = assert_json_error(ans, 400)
    assert coding in err["message"] and err["type"] == "invalid_request_error"
    assert srv.metrics().get('flashrec_requests_total{endpoint="chat",outcome="error"}') == before


@pytest.mark.parametrize("path", sorted(BODIES))
@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "foo", "gzip;q=1"])
def test_unsupported_coding_is_415_json(srv: ServerThread, path: str, coding: str) -> None:
    err = assert_json_error(send(srv, path, b"{}", Content_Encoding=coding), 415)
    assert "gzip, deflate, identity" in err["message"]


@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_ten_megabytes_with_a_coding_is_413(srv: ServerThread, coding: str) -> None:
    big = b"x" * (10 << 20)
    ans = send(srv, "/generate", big, Content_Encoding=coding)
    assert not ans.dropped, ans.error
    assert_json_error(ans, 413)
    assert srv.get("/health").status_code == 200


# -- what the decoder accepts and refuses ----------------------------------------------------


@pytest.mark.parametrize("path", sorted(BODIES))
def test_encoded_bodies_get_the_plain_answer(srv: ServerThread, path: str) -> None:
    plain = json.dumps(BODIES[path]).encode()
    want = send(srv, path, plain)
    assert want.status == 200
    for coding, data in (
        ("gzip", gzip.compress(plain)),
        ("x-gzip", gzip.compress(plain)),
        ("deflate", zlib.compress(plain)),
        ("identity", plain),
        ("deflate, gzip", gzip.compress(zlib.compress(plain))),  # applied left to right
        ("GZip , identity", gzip.compress(plain)),
    ):
        got = send(srv, path, data, Content_Encoding=coding)
        assert got.status == 200, (coding, got.body)
        assert _beams(got.json()) == _beams(want.json()), coding


def _beams(body: dict) -> list:
    if "choices" in body:
        return [c["message"]["content"] for c in body["choices"]]
    return [b["text"] for b in body["meta_info"]["beam_results"]]


def test_bombs_and_broken_streams(srv: ServerThread) -> None:
    limit = srv.config.max_body_bytes
    bomb = gzip.compress(b"[" + b" " * (4 * limit) + b"]")
    assert len(bomb) < limit // 100
    err = assert_json_error(send(srv, "/generate", bomb, Content_Encoding="gzip"), 413)
    assert "decoded" in err["message"]
    nested = gzip.compress(gzip.compress(b" " * (4 * limit)))  # tiny on the wire
    assert_json_error(send(srv, "/generate", nested, Content_Encoding="gzip, gzip"), 413)
    plain = json.dumps(GEN).encode()
    whole = gzip.compress(plain)
    for data, why in (
        (whole[:-6], "truncated"),
        (whole + b"tail", "after the end"),
        (whole[:10] + b"\x00" * 20 + whole[30:], "cannot decode"),
        (b"", "truncated"),
    ):
        err = assert_json_error(send(srv, "/generate", data, Content_Encoding="gzip"), 400)
        assert why in err["message"], (why, err)
    chain = ", ".join(["gzip"] * (wire.MAX_CODINGS + 1))
    assert_json_error(send(srv, "/generate", whole, Content_Encoding=chain), 415)


def test_declared_length_over_the_limit_is_413_unread() -> None:
    with fake_server(max_body_bytes=4096) as small:
        # only the headers are sent: the answer cannot wait for the 1 GB it announces
        ans = exchange(
            small.server.port,
            request_bytes("/generate", b"", {"Content-Length": str(1 << 30)}),
            timeout=10,
        )
        err = assert_json_error(ans, 413)
        assert "4096" in err["message"]


def test_content_type_is_not_checked(srv: ServerThread) -> None:
    body = json.dumps(CHAT).encode()
    for ctype in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/x; b=1"):
        hdrs = {} if ctype is None else {"Content-Type": ctype}
        ans = exchange(srv.server.port, request_bytes("/v1/chat/completions", body, hdrs))
        assert ans.status == 200, (ctype, ans.body)
    utf16 = json.dumps(CHAT).encode("utf-16")  # json.loads detects the UTF encodings
    assert send(srv, "/v1/chat/completions", utf16, Content_Type="application/json").status == 200
    latin = '{"messages": [{"role": "user", "content": "\xe9"}]}'.encode("latin-1")
    ans = send(srv, "/v1/chat/completions", latin, Content_Type="application/json; charset=latin-1")
    assert_json_error(ans, 400)


def test_chunked_and_odd_transfer_encodings(srv: ServerThread) -> None:
    body = json.dumps(GEN).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    ok = exchange(
        srv.server.port,
        request_bytes("/generate", chunked, {"Transfer-Encoding": "chunked"}),
    )
    assert ok.status == 200
    gz = gzip.compress(body)
    ok = exchange(
        srv.server.port,
        request_bytes(
            "/generate",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(gz), gz),
            {"Transfer-Encoding": "chunked", "Content-Encoding": "gzip"},
        ),
    )
    assert ok.status == 200
    ok = exchange(  # a transfer coding before chunked is undone too
        srv.server.port,
        request_bytes(
            "/generate",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(gz), gz),
            {"Transfer-Encoding": "gzip, chunked"},
        ),
    )
    assert ok.status == 200
    before = errors_total(srv, 400)
    bad = [
        {"Transfer-Encoding": "gzip"},
        {"Transfer-Encoding": "chunked, gzip"},
        {"Transfer-Encoding": "chunked", "Content-Length": "3"},
        {"Transfer-Encoding": "foo, chunked"},
        {"Content-Length": "-1"},
        {"Content-Length": "1, 2"},
        {"X-Bad\x01": "1"},
    ]
    for headers in bad:
        ans = exchange(srv.server.port, request_bytes("/generate", chunked, headers))
        assert 400 <= ans.status < 500, (headers, ans)
        assert_json_error(ans, ans.status)
    for raw in (b"GARBAGE\r\n\r\n", b"POST /generate HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x00\xa5"):
        ans = exchange(srv.server.port, raw)
        assert_json_error(ans, 400)
    assert errors_total(srv, 400) >= before + len(bad)
    assert srv.get("/health").status_code == 200


def test_unexpected_handler_error_is_a_counted_500(
    srv: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    key = 'flashrec_requests_total{endpoint="generate",outcome="error"}'
    before, before_500 = srv.metrics()[key], errors_total(srv, 500)
    monkeypatch.setattr(srv.server.state.backend, "build_prompt", broken)
    ans = send(srv, "/generate", json.dumps(GEN).encode())
    monkeypatch.undo()
    err = assert_json_error(ans, 500)
    assert err["type"] == "internal_error" and "planted" in err["message"]
    m = srv.metrics()
    assert m[key] == before + 1 and errors_total(srv, 500) == before_500 + 1


# -- slow clients ----------------------------------------------------------------------------


def test_slow_headers_get_408_while_others_are_served(srv: ServerThread) -> None:
    head = request_bytes("/v1/chat/completions", json.dumps(CHAT).encode())
    result: dict = {}
    slow = threading.Thread(
        target=lambda: result.update(zip(("ans", "s"), trickle(srv.server.port, head, 0.05)))
    )
    slow.start()
    served = 0
    while slow.is_alive():  # other clients are answered meanwhile
        assert srv.post("/v1/chat/completions", CHAT).status_code == 200
        served += 1
        time.sleep(0.05)
    slow.join()
    # the request takes ~len(head) * 0.05 s (> 10 s) to send; the server stops it at ~1 s
    assert_json_error(result["ans"], 408)
    assert result["s"] < len(head) * 0.05 / 2 and served >= 1
    assert errors_total(srv, 408) >= 1


def test_silent_connection_is_closed(srv: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", srv.server.port), timeout=30) as s:
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed without an answer: nothing was asked
        assert time.monotonic() - t0 < 20


def test_stalled_body_gets_408(srv: ServerThread) -> None:
    body = json.dumps(CHAT).encode()
    head = request_bytes("/v1/chat/completions", b"", {"Content-Length": str(len(body))})
    with socket.create_connection(("127.0.0.1", srv.server.port), timeout=30) as s:
        s.sendall(head + body[:10])  # headers complete, the body never is
        t0 = time.monotonic()
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        waited = time.monotonic() - t0
    err = assert_json_error(parse(got), 408)
    assert "body" in err["message"] and waited < 20  # closed, not held for good
    assert requests.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=10).ok


def test_expect_header(srv: ServerThread) -> None:
    body = json.dumps(GEN).encode()
    with socket.create_connection(("127.0.0.1", srv.server.port), timeout=30) as s:
        s.sendall(
            request_bytes(
                "/generate", b"", {"Expect": "100-continue", "Content-Length": str(len(body))}
            )
        )
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")  # asked before the body
        s.sendall(body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert parse(got).status == 200
    before = errors_total(srv, 417)
    err = assert_json_error(send(srv, "/generate", body, Expect="gzip"), 417)
    assert "100-continue" in err["message"] and errors_total(srv, 417) == before + 1
