"""Every server URL the harness takes (``--url`` flags, matrix ``url`` fields) is checked before
any request: a URL without a scheme, with another scheme or without a host is a usage error
naming the URL and what is wrong, not a run of connection errors."""

from __future__ import annotations

import socket

import pytest
from bench_helpers import run_cli

from harness.spec.matrix import SpecError, parse_spec


@pytest.fixture
def listener():
    """A bound, listening port on 127.0.0.1 that no one accepts on: ``connected()`` tells
    whether anything tried to connect to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)

    def connected() -> bool:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    try:
        yield sock.getsockname()[1], connected
    finally:
        sock.close()


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        run_cli(*argv)
    assert info.value.code == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "command",
    [
        ["quick", "--url", "{url}"],
        ["eval", "{dataset}", "--url", "{url}"],
        ["eval-dataset", "{out}", "--model-path", "{out}", "--reference-url", "{url}"],
        ["witness", "--url", "{url}", "--tokenizer", "{out}"],
    ],
)
def test_a_url_without_scheme_is_refused_before_any_request(command, tmp_path, capsys, listener):
    port, connected = listener
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"messages": [{"role": "user", "content": "q"}], "answer": "<s_a_1>"}\n')
    url = f"127.0.0.1:{port}"  # a server listens there, but the URL has no scheme
    argv = [a.format(url=url, dataset=dataset, out=tmp_path) for a in command]
    err = _usage_error(capsys, *argv)
    assert f"'{url}' has no scheme (did you mean 'http://{url}'?)" in err, err
    assert not connected(), "a request was sent to a URL that was refused"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://127.0.0.1:8000", "has the scheme 'ftp': only http:// and https://"),
        ("http://:8000", "has no host"),
        ("http://127.0.0.1:99999", "has a bad port"),
        ("localhost:8000", "has no scheme (did you mean 'http://localhost:8000'?)"),
        ("http:/127.0.0.1:8000", "is malformed"),
        ("", "is empty"),
    ],
)
def test_each_kind_of_bad_url_is_named(capsys, url, words):
    err = _usage_error(capsys, "quick", "--url", url)
    assert f"argument --url: '{url}' {words}" in err, err


def test_good_urls_pass():
    from harness.spec.url import url_problem

    for url in ("http://127.0.0.1:8000", "https://example.org", "HTTP://h:1/", "http://[::1]:8"):
        assert url_problem(url) is None, url


GOOD = """\
name: t
engine:
  kind: external
  url: http://127.0.0.1:1
"""


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (GOOD.replace("http://127.0.0.1:1", "127.0.0.1:1"), 4, "engine.url",
         "url '127.0.0.1:1' has no scheme (did you mean 'http://127.0.0.1:1'?)"),
        (GOOD + "quality:\n  generate:\n    reference_url: ftp://h:1\n", 7,
         "quality.generate.reference_url", "reference_url 'ftp://h:1' has the scheme 'ftp'"),
        (GOOD + "parity:\n  reference_url: h:1\n", 5, "parity",
         "reference_url 'h:1' has no scheme"),
        (GOOD + "parity:\n  candidates:\n    - {name: a, url: 'http://'}\n", 5, "parity",
         "candidates[0].url 'http://' has no host"),
    ],
)  # fmt: skip
def test_matrix_urls_are_checked_at_load_at_their_line(text, line, field, words):
    with pytest.raises(SpecError) as info:
        parse_spec(text, "m.yaml")
    err = info.value
    assert (err.line, err.field) == (line, field), str(err)
    assert words in str(err), str(err)
