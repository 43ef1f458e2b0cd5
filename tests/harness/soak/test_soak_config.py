"""The soak's command-line values: durations, actions, tolerances, and the bad ones."""

from __future__ import annotations

import math

import pytest

from harness.soak.actions import ACTIONS, takes_argument
from harness.soak.config import (
    TOLERANCES,
    SoakConfig,
    parse_action,
    parse_duration,
    parse_tolerance,
)


@pytest.mark.parametrize(
    "text,seconds", [("90", 90), ("45s", 45), ("10m", 600), ("1.5h", 5400), ("1d", 86400)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10x", "-5s", "0", "1h30m"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_actions_take_their_arguments_in_turn():
    known = takes_argument()
    a = parse_action("2m", "update_catalog=a.json,b.json", known)
    assert (a.period_s, a.name) == (120, "update_catalog")
    assert [a.arg(k) for k in range(3)] == ["a.json", "b.json", "a.json"]
    assert parse_action("30s", "flush_cache", known).arg(0) is None
    assert set(ACTIONS) >= {"flush_cache", "update_catalog", "update_weights"}


@pytest.mark.parametrize(
    "period,action,message",
    [
        ("1m", "restart", "unknown action"),
        ("1m", "update_catalog", "needs an argument"),
        ("1m", "flush_cache=x", "takes no argument"),
        ("soon", "flush_cache", "duration"),
    ],
)
def test_bad_actions(period, action, message):
    with pytest.raises(ValueError, match=message):
        parse_action(period, action, takes_argument())


def test_tolerances():
    assert parse_tolerance("rss_mib=2") == ("rss_mib", (2.0, TOLERANCES["rss_mib"][1]))
    assert parse_tolerance("p99_ms=5:20") == ("p99_ms", (5.0, 20.0))
    assert parse_tolerance("fds=inf")[1][0] == math.inf
    for bad in ("rss=1", "rss_mib", "rss_mib=x", "rss_mib=-1", "fds=1:y"):
        with pytest.raises(ValueError):
            parse_tolerance(bad)


def test_config_checks_its_values():
    SoakConfig(duration_s=60, rate=4)
    for bad in ({"rate": 0}, {"interval_s": -1}, {"warmup_s": 60}, {"beam_width": 0},
                {"probe_key": "weights"}):  # fmt: skip
        with pytest.raises(ValueError):
            SoakConfig(**{"duration_s": 60, "rate": 4, **bad})


def test_an_actions_outcome_keeps_the_answers_phase_times():
    """``(ok, detail, timings)``: the answer's numeric ``*_ms`` fields, nothing else (not a
    bool, a string or another number); a refused answer is not ok, whatever its status."""
    from harness.soak.actions import _outcome

    body = {"success": True, "load_ms": 3650.4, "copy_ms": 420, "hash_ms": "3150",
            "weights_version": 2, "staged_on": "device", "flag_ms": True}  # fmt: skip
    ok, detail, timings = _outcome(200, body)
    assert (
        ok and detail.startswith("HTTP 200: ") and timings == {"load_ms": 3650.4, "copy_ms": 420.0}
    )
    assert _outcome(200, {"success": False, "message": "no"})[0] is False
    assert _outcome(400, "bad request") == (False, "HTTP 400: bad request", {})
