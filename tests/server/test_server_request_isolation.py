"""One client cannot fail another's request: numbers the engine cannot hold (a temperature
beyond float32, a seed beyond int64, ...) are a 400 naming the field, and under concurrent
load of normal clients such requests cause no other answer than their own 400s. Covered with
the engine in the server process and in a process of its own (``--engine-process on``),
where a request that bypasses the HTTP checks is also refused alone by the engine."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_helpers import ServerThread, process_server

from flashrec.engine.request import GenRequest

CHAT, GEN = "/v1/chat/completions", "/generate"
MSG = [{"role": "user", "content": "shoes for running"}]
GOOD_CLIENTS, GOOD_REQUESTS = 4, 8  # each normal client sends this many, one after another
MIN_BAD = 20  # bad requests sent while the normal clients run, at least

# (path, body, the field the 400 must name); every one of these must fail alone
BAD: list[tuple[str, dict[str, Any], str]] = [
    (CHAT, {"messages": MSG, "temperature": 1e308}, "temperature"),  # the report's probe
    (GEN, {"text": "x", "sampling_params": {"temperature": 1e308}}, "sampling_params.temperature"),
    (CHAT, {"messages": MSG, "temperature": 3.5e38}, "temperature"),  # just above float32
    (CHAT, {"messages": MSG, "temperature": 10**400}, "temperature"),  # an integer too large
    (CHAT, {"messages": MSG, "seed": 2**63}, "seed"),  # beyond int64
    (
        GEN,
        {"text": "x", "sampling_params": {"sampling_seed": 2**64}},
        "sampling_params.sampling_seed",
    ),
    (CHAT, {"messages": MSG, "n": 10**30}, "n"),
    (CHAT, {"messages": MSG, "max_tokens": 10**30}, "max_tokens"),
    (
        GEN,
        {"text": "x", "sampling_params": {"max_new_tokens": -1}},
        "sampling_params.max_new_tokens",
    ),
    (GEN, {"input_ids": [2**70]}, "input_ids"),
]


def _good(i: int) -> tuple[str, dict[str, Any]]:
    """Normal traffic: greedy and sampled chat, sampled /generate."""
    if i % 3 == 0:
        return CHAT, {"messages": MSG, "n": 4}
    if i % 3 == 1:
        return CHAT, {"messages": MSG, "n": 4, "temperature": 0.8, "seed": i}
    return GEN, {"text": f"history {i}", "sampling_params": {"n": 4, "temperature": 0.5}}


def _load(srv: ServerThread, during=None) -> tuple[Counter, list[str], int]:
    """Normal clients and a bad client at once; returns the normal answers' status counts,
    the bad answers that were not a 400 naming their field, and the bad requests sent.
    ``during`` (optional) runs on one more thread while the normal clients do."""
    good: Counter = Counter()
    wrong: list[str] = []
    sent = 0
    lock = threading.Lock()
    done = threading.Event()

    def normal(c: int) -> None:
        for k in range(GOOD_REQUESTS):
            path, body = _good(c * GOOD_REQUESTS + k)
            r = srv.post(path, body)
            with lock:
                good[r.status_code] += 1
                if r.status_code != 200:
                    wrong.append(f"normal {path}: {r.status_code} {r.text[:300]}")

    def bad() -> None:
        nonlocal sent
        i = 0
        while not done.is_set() or i < MIN_BAD:
            path, body, field = BAD[i % len(BAD)]
            r = srv.post(path, body)
            i += 1
            with lock:
                sent += 1
                err = r.json().get("error", {}) if r.status_code == 400 else {}
                if err.get("param") != field or field.split(".")[-1] not in err.get("message", ""):
                    wrong.append(f"bad {path} {field}: {r.status_code} {r.text[:300]}")

    threads = [threading.Thread(target=normal, args=(c,)) for c in range(GOOD_CLIENTS)]
    extra = [threading.Thread(target=bad), threading.Thread(target=bad)]
    if during is not None:
        extra.append(threading.Thread(target=during))
    for t in threads + extra:
        t.start()
    for t in threads:
        t.join(timeout=300)
    done.set()
    for t in extra:
        t.join(timeout=300)
    return good, wrong, sent


def _check(srv: ServerThread, during=None) -> None:
    good, wrong, sent = _load(srv, during)
    assert not wrong, "\n".join(wrong[:10])
    assert good == {200: GOOD_CLIENTS * GOOD_REQUESTS}
    assert sent >= MIN_BAD
    m = srv.wait_engine_idle()
    assert m["flashrec_running_requests"] == 0


def test_bad_numbers_are_400s_and_fail_no_other_client(real: ServerThread) -> None:
    _check(real)


@pytest.fixture(scope="module")
def proc_srv(tiny_checkpoint: Path) -> Iterator[ServerThread]:
    with process_server(tiny_checkpoint) as srv:
        yield srv


def test_with_the_engine_in_its_own_process(proc_srv: ServerThread) -> None:
    """The same load; besides, requests that skip the HTTP checks (submitted to the engine
    process as they are) are refused there, each alone, naming the value."""
    (build,) = proc_srv.engine.prompt_builders(1)
    ids = build(messages=MSG)
    refused: list[str] = []

    def bypass() -> None:
        for i in range(10):
            req = GenRequest(f"bypass-{i}", ids, 4, 4, temperature=1e308 if i % 2 else 0.5,
                             seed=None if i % 2 else 2**64)  # fmt: skip
            try:
                proc_srv.served.proc.submit(req).result(timeout=60)
            except ValueError as exc:
                refused.append(str(exc))

    _check(proc_srv, during=bypass)
    assert len(refused) == 10
    assert sum("temperature" in e for e in refused) == 5
    assert sum("seed" in e for e in refused) == 5


def test_the_temperature_bound_is_float32s_largest() -> None:
    """The HTTP bound: float32's largest finite value is accepted, the next double is not."""
    from flashrec.engine.request import MAX_TEMPERATURE
    from flashrec.server.errors import APIError
    from flashrec.server.protocol import Limits, parse_chat

    limits = Limits(max_beam_rows=8, vocab_size=100, max_seq_len=64, default_n=4,
                    default_max_tokens=4)  # fmt: skip
    assert parse_chat({"messages": MSG, "temperature": MAX_TEMPERATURE}, limits)
    with pytest.raises(APIError) as err:
        parse_chat({"messages": MSG, "temperature": math.nextafter(MAX_TEMPERATURE, 1e39)}, limits)
    assert err.value.status == 400 and err.value.param == "temperature"
    assert "float32" in str(err.value)
