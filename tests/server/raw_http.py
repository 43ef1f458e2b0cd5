"""A bare HTTP/1.1 client over a socket, for requests no library sends (odd headers, bytes
that are not HTTP, slow senders): one request per connection, the answer read to the close."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """What came back: ``status`` 0 when the connection closed (or reset) without an answer."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str = ""  # the socket error, when the connection was reset

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def dropped(self) -> bool:
        return self.status == 0


def request_bytes(
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    method: str = "POST",
    length: bool = True,
) -> bytes:
    """One request; ``Content-Length`` is added (when ``length``) unless ``headers`` name it
    (or ``Transfer-Encoding``); ``Connection: close`` always."""
    hdrs = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
    names = {k.lower() for k in hdrs}
    if length and "content-length" not in names and "transfer-encoding" not in names:
        hdrs["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return head.encode("latin-1") + b"\r\n" + body


def parse(raw: bytes) -> Answer:
    """The first final response in ``raw`` (status line, headers, the body as far as it
    came); interim ``1xx`` answers (``100 Continue``) are skipped."""
    while raw.startswith(b"HTTP/1.1 1") or raw.startswith(b"HTTP/1.0 1"):
        _, sep, raw = raw.partition(b"\r\n\r\n")
        if not sep:
            return Answer(0)
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/"):
        return Answer(0, body=raw)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return Answer(status, headers, body)


def exchange(port: int, data: bytes, timeout: float = 60.0) -> Answer:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        chunks: list[bytes] = []
        try:
            s.sendall(data)
            while chunk := s.recv(1 << 16):
                chunks.append(chunk)
        except OSError as exc:  # a reset while sending or reading
            ans = parse(b"".join(chunks))
            ans.error = repr(exc)
            return ans
    return parse(b"".join(chunks))


def trickle(port: int, data: bytes, gap_s: float, timeout: float = 60.0) -> tuple[Answer, float]:
    """Send ``data`` one byte every ``gap_s`` (a slow client) until the server answers or
    closes; the answer and the seconds from the first byte to it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setblocking(False)
        t0 = time.monotonic()
        got = b""
        for i in range(len(data)):
            try:
                s.send(data[i : i + 1])
            except OSError:  # closed by the server
                break
            time.sleep(gap_s)
            try:
                chunk = s.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                break
            got += chunk
            if not chunk or got:
                break
        s.settimeout(timeout)
        try:
            while chunk := s.recv(1 << 16):
                got += chunk
        except OSError:
            pass
        return parse(got), time.monotonic() - t0
