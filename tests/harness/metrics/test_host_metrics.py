"""Other processes' CPU use on the host during measured rounds (harness.metrics.host): the
/proc parsing, the arithmetic and the note on fake files; the accounting on this machine's
real /proc with processes that burn a fixed amount of CPU time; and a matrix run beside CPU
burners that gets the note."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import base_matrix, fake_engine, run_cli, write_matrix

from harness.metrics import host

TICK = host._tick()


def _stat_line(pid: int, comm: str, pgrp: int, ticks: tuple[int, int, int, int]) -> str:
    u, s, cu, cs = ticks
    # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority ...
    return f"{pid} ({comm}) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 {u} {s} {cu} {cs} 20 0 1 0\n"


def _fake_proc(tmp_path: Path, procs: list[tuple[int, str, int, tuple]], cpu: list[int]) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3\n")
    for pid, comm, pgrp, ticks in procs:
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(_stat_line(pid, comm, pgrp, ticks))
    (root / "self").mkdir()  # not a pid: skipped
    return root


def test_parse_stat_reads_past_odd_command_names():
    line = _stat_line(42, "py (worker) 1", 7, (10, 5, 3, 2))
    assert host.parse_stat(line) == (7, 20.0)
    assert host.parse_stat("garbage") is None
    assert host.parse_stat("1 (x) S 1 2") is None  # too few fields


def test_group_and_machine_cpu_from_proc_files(tmp_path):
    root = _fake_proc(
        tmp_path,
        [
            (100, "server", 100, (300, 100, 50, 50)),
            (101, "engine (proc)", 100, (200, 0, 0, 0)),
            (200, "other", 200, (900, 0, 0, 0)),
        ],
        # user nice system idle iowait irq softirq steal
        [1000, 100, 400, 5000, 30, 20, 10, 60],
    )
    assert host.group_cpu(100, root) == pytest.approx(700 / TICK)
    assert host.group_cpu(999, root) == 0.0
    busy, steal = host.machine_cpu(root)
    assert busy == pytest.approx(1500 / TICK) and steal == pytest.approx(60 / TICK)
    s = host.sample(100, root)
    assert s is not None and s.server_s == pytest.approx(700 / TICK)
    assert host.sample(None, root) is None  # an external server: no group, nothing recorded
    assert host.sample(100, tmp_path / "missing") is None  # no /proc: nothing, not zero


def test_the_leaders_own_time_leaves_its_reaped_children_out(tmp_path):
    root = _fake_proc(
        tmp_path,
        [(100, "server (http)", 100, (300, 100, 50, 50)), (101, "engine", 100, (200, 0, 0, 0))],
        [1000, 100, 400, 5000, 30, 20, 10, 60],
    )
    # utime + stime only
    assert host.sample(100, root, main=True).main_s == pytest.approx(400 / TICK)
    assert host.sample(555, root, main=True).main_s is None  # gone
    assert host.sample(100, root).main_s is None  # a guarded command: its leader is the guard


def test_several_groups_summed_without_a_main_share(tmp_path):
    """Replicas behind a router: the router's and every replica's groups together, and no
    main-process share (no one process is the server)."""
    root = _fake_proc(
        tmp_path,
        [
            (100, "router", 100, (40, 10, 0, 0)),
            (200, "replica", 200, (300, 100, 50, 50)),
            (201, "engine", 200, (200, 0, 0, 0)),
            (300, "replica", 300, (100, 0, 0, 0)),
            (400, "other", 400, (900, 0, 0, 0)),
        ],
        [1000, 100, 400, 5000, 30, 20, 10, 60],
    )
    s = host.sample([100, 200, 300], root, main=True)
    assert s.server_s == pytest.approx((50 + 500 + 200 + 100) / TICK)
    assert s.main_s is None
    assert host.sample([200], root, main=True).main_s == pytest.approx(400 / TICK)
    assert host.sample([], root) is None  # an external server: nothing, not zero


def test_server_cpu_per_request_and_the_main_process_cores():
    a = host.HostSample(t=10.0, busy_s=100.0, steal_s=0.0, server_s=20.0, harness_s=5.0, main_s=8.0)
    b = host.HostSample(t=12.0, busy_s=105.0, steal_s=0.0, server_s=23.0, harness_s=5.5, main_s=9.5)
    got = host.server_cpu(a, b, 500)
    assert got["server_cpu_ms_per_request"] == pytest.approx(6.0)  # 3 s over 500 requests
    assert got["server_main_cpu_ms_per_request"] == pytest.approx(3.0)
    assert got["server_main_cpu_cores"] == pytest.approx(0.75)  # 1.5 s over 2 s of wall
    plain = host.server_cpu(
        host.HostSample(10.0, 100.0, 0.0, 20.0, 5.0),
        host.HostSample(12.0, 105.0, 0.0, 23.0, 5.5),
        3,
    )
    assert set(plain) == {"server_cpu_ms_per_request"}  # no leader's time: no main-process share
    assert host.server_cpu(a, b, 0) == {} and host.server_cpu(a, None, 5) == {}


def test_other_cpu_subtracts_the_server_and_the_harness():
    a = host.HostSample(t=10.0, busy_s=100.0, steal_s=1.0, server_s=20.0, harness_s=5.0)
    b = host.HostSample(t=12.0, busy_s=105.0, steal_s=1.5, server_s=22.0, harness_s=5.5)
    got = host.other_cpu(a, b)
    # 5 s busy in 2 s; 2.5 s of it ours -> 1.25 cores of other work
    assert got["host_other_cpu_cores"] == pytest.approx(1.25)
    assert got["host_steal_cores"] == pytest.approx(0.25)
    assert got["harness_cpu_cores"] == pytest.approx(0.25)  # 0.5 s of the harness in 2 s
    assert got["host_window_s"] == pytest.approx(2.0)
    assert host.other_cpu(a, None) == {} and host.other_cpu(None, b) == {}
    c = host.HostSample(t=12.0, busy_s=101.0, steal_s=1.0, server_s=22.0, harness_s=5.5)
    assert host.other_cpu(a, c)["host_other_cpu_cores"] == 0.0  # clamped, never negative


def test_busy_host_note_weighs_rounds_by_their_length():
    quiet = {"host_other_cpu_cores": 0.1, "host_steal_cores": 0.0, "host_window_s": 2.0}
    spike = {"host_other_cpu_cores": 3.0, "host_steal_cores": 0.0, "host_window_s": 0.1}
    busy = {"host_other_cpu_cores": 1.0, "host_steal_cores": 0.0, "host_window_s": 2.0}
    steal = {"host_other_cpu_cores": 0.0, "host_steal_cores": 0.8, "host_window_s": 2.0}
    assert host.busy_host_note([quiet, quiet]) is None
    # (0.2 + 0.3 + 0.2) / 4.1 s = 0.17 cores on average: a short spike is not a busy host
    assert host.busy_host_note([quiet, spike, quiet]) is None
    note = host.busy_host_note([quiet, busy, busy])
    assert note and "0.70 CPU cores on average" in note and "up to 1.00" in note
    assert "steal" in (host.busy_host_note([steal]) or "")
    assert host.busy_host_note([]) is None
    short = {"host_other_cpu_cores": 2.0, "host_steal_cores": 0.0, "host_window_s": 0.4}
    assert host.busy_host_note([short, short]) is None  # 0.8 s in all: too coarse to judge


# a process that says "ready" once its imports are done; on "go", burns CPU_S of CPU time (not
# wall time: the amount holds on a loaded machine), optionally first in a child it waits for,
# then says "done" and waits to be killed
BURN = """
import subprocess, sys, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
print("ready", flush=True)
sys.stdin.readline()
if sys.argv[2] == "child":
    subprocess.run([sys.executable, "-c", "import time\\nt=time.process_time()\\n"
                    "while time.process_time() - t < %s: pass" % sys.argv[1]], check=True)
burn(float(sys.argv[1]))
print("done", flush=True)
time.sleep(600)
"""


def _burner(cpu_s: float, child: bool, own_group: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BURN, str(cpu_s), "child" if child else "alone"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc accounting")
def test_real_proc_counts_the_group_with_reaped_children_and_sees_others():
    server = _burner(0.3, child=True, own_group=True)  # 0.3 s in a reaped child + 0.3 s
    other = _burner(0.4, child=False, own_group=False)  # not the server's group
    try:
        for p in (server, other):  # both started (their imports are not part of the window)
            assert p.stdout.readline().strip() == "ready"
        before = host.sample(server.pid, main=True)
        for p in (server, other):
            p.stdin.write("go\n")
            p.stdin.flush()
        assert server.stdout.readline().strip() == "done"
        assert other.stdout.readline().strip() == "done"
        after = host.sample(server.pid, main=True)
    finally:
        for p in (server, other):
            p.kill()
            p.wait()
    assert before is not None and after is not None
    # the group's 0.6 s, the reaped child's included (ticks of 10 ms: a few lost at the edges)
    assert after.server_s - before.server_s >= 0.5
    # the leader's own 0.3 s, without its child's
    assert 0.2 <= after.main_s - before.main_s <= 0.45
    got = host.other_cpu(before, after)
    wall = got["host_window_s"]
    # the other burner's 0.4 s is other work (anything else on the machine only adds to it)
    assert got["host_other_cpu_cores"] * wall >= 0.3


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc accounting")
def test_a_cell_measured_beside_cpu_burners_says_so(tmp_path, marker, capsys):
    # 5 ms of CPU per request: a round's 50 ms reads well above /proc's 10 ms ticks
    engine = fake_engine("--latency-ms", "60", "--cpu-ms", "5", "--marker", marker)
    m = base_matrix(engine, load={"rounds": 3, "beam_width": 4, "request_timeout_s": 10})
    code = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 120: pass"
    burners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        out = tmp_path / "out"
        assert run_cli(str(write_matrix(tmp_path, m)), "--out", str(out)) == 0
    finally:
        for p in burners:
            p.kill()
            p.wait()
    cell = json.loads((out / "report.json").read_text())["cells"][0]
    other = cell["metrics"]["host_other_cpu_cores"]
    assert len(other["values"]) == 3 and other["median"] >= 0.5, other
    assert "host_steal_cores" in cell["metrics"]
    # the load generator measured itself, never more than its one event loop can use (its
    # os.times ticks are 10 ms: a short round can read 0; the figure is unit-tested exactly)
    assert 0 <= cell["metrics"]["harness_cpu_cores"]["median"] < 1.5
    # the server's own CPU per request; no main-process share behind a guard (kind command)
    assert cell["metrics"]["server_cpu_ms_per_request"]["median"] >= 3
    assert "server_main_cpu_cores" not in cell["metrics"]
    assert any(n.startswith("busy host during the measured rounds") for n in cell["notes"])
    assert "host_other_cpu_cores" in (out / "summary.csv").read_text().splitlines()[0]
    # and said while the run went on, not only in the report
    assert f"cell {cell['id']}: busy host during the measured rounds" in capsys.readouterr().err
