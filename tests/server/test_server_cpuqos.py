"""``--cpu-dma-latency-us``: the PM QoS bound written while requests are in flight, lifted after."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from pathlib import Path

import pytest
from server_helpers import fake_server, polled

from flashrec.config import ServerConfig
from flashrec.server import cpuqos
from flashrec.server.cpuqos import NO_BOUND_US, CpuLatencyHold

CHAT = {"messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 4}
REAL = Path(cpuqos.DEVICE)


def written(path: Path) -> list[int]:
    """The bounds written to a stand-in file, in order."""
    data = path.read_bytes()
    return [v for (v,) in struct.iter_unpack("=i", data)]


def test_hold_writes_while_active_and_lifts_after_the_linger(tmp_path: Path) -> None:
    """The bound is written once when the first request begins, kept while any is in flight
    and across a new request inside the linger, and lifted once the linger passes idle."""
    dev = tmp_path / "qos"
    dev.write_bytes(b"")

    async def run() -> list[list[int]]:
        hold = CpuLatencyHold(7, str(dev), linger_s=0.05)
        hold.open()
        seen = [written(dev)]
        hold.enter()
        hold.enter()
        hold.leave()
        assert hold.held and hold.bound_us == 7
        hold.leave()  # the last one: lifted only after the linger
        await asyncio.sleep(0.01)
        hold.enter()  # back inside the linger: no lift, no second write
        hold.leave()
        seen.append(written(dev))
        await asyncio.sleep(0.2)
        assert not hold.held and hold.bound_us == -1
        seen.append(written(dev))
        hold.enter()  # after an idle spell: written again
        seen.append(written(dev))
        assert hold.engaged == 2
        hold.close()
        return seen

    seen = asyncio.run(run())
    assert seen == [
        [NO_BOUND_US],
        [NO_BOUND_US, 7],
        [NO_BOUND_US, 7, NO_BOUND_US],
        [NO_BOUND_US, 7, NO_BOUND_US, 7],
    ]


def test_server_holds_the_bound_during_a_request_and_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served request writes the bound; ``/metrics`` shows it held while the request runs
    and -1 once the server is idle past the linger; without the flag nothing is written."""
    dev = tmp_path / "qos"
    dev.write_bytes(b"")
    monkeypatch.setattr(cpuqos, "DEVICE", str(dev))
    with fake_server(step_delay_s=0.2, cpu_dma_latency_us=0) as srv:
        assert srv.metrics()["flashrec_cpu_dma_latency_bound_us"] == -1
        answers: list[int] = []
        t = threading.Thread(
            target=lambda: answers.append(srv.post("/v1/chat/completions", CHAT).status_code)
        )
        t.start()
        assert polled(lambda: srv.metrics()["flashrec_cpu_dma_latency_bound_us"] == 0, 10.0)
        t.join(60)
        assert answers == [200]
        assert polled(lambda: srv.metrics()["flashrec_cpu_dma_latency_bound_us"] == -1, 10.0)
        assert written(dev) == [NO_BOUND_US, 0, NO_BOUND_US]
    dev.write_bytes(b"")
    with fake_server() as srv:
        assert srv.post("/v1/chat/completions", CHAT).status_code == 200
        assert srv.metrics()["flashrec_cpu_dma_latency_bound_us"] == -1
    assert written(dev) == []


def test_server_without_the_device_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for a bound it cannot hold, the server exits 1 at start-up (its log says which file
    and why) rather than serve without it; out-of-range values are refused."""
    monkeypatch.setattr(cpuqos, "DEVICE", str(tmp_path / "missing" / "qos"))
    srv = fake_server(cpu_dma_latency_us=0)
    with pytest.raises(RuntimeError, match="exited during start-up"):
        srv.start()
    assert srv.exit_code == 1
    for bad in (-2, 1_000_001):
        with pytest.raises(ValueError, match="--cpu-dma-latency-us"):
            ServerConfig(model_path="x", cpu_dma_latency_us=bad)


def effective_us() -> int:
    """The system's current wake-up latency target, as the kernel reports it."""
    with REAL.open("rb") as f:
        return struct.unpack("=i", f.read(4))[0]


@pytest.mark.skipif(
    not (REAL.exists() and os.access(REAL, os.W_OK) and os.access(REAL, os.R_OK)),
    reason="needs Linux's /dev/cpu_dma_latency, readable and writable (root)",
)
def test_the_kernel_takes_the_bound_and_drops_it_on_close() -> None:
    """Against the real file: while held, the kernel's target is at most the bound (another
    process may hold a lower one); lifted or closed, it is back to what it was."""
    before = effective_us()
    bound = 0 if before > 0 else before

    async def run() -> tuple[int, int]:
        hold = CpuLatencyHold(bound, linger_s=0.0)
        hold.open()
        try:
            hold.enter()
            during = effective_us()
            hold.leave()
            await asyncio.sleep(0.05)
            return during, effective_us()
        finally:
            hold.close()

    during, lifted = asyncio.run(run())
    assert during <= bound
    assert lifted == before
    assert effective_us() == before
