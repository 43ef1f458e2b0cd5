"""RSS, open fds and threads of every process of a server's process group, from /proc.

Of a process's fds, ``conns`` are the server's side of client connections still open at both
ends (ESTABLISHED TCP sockets on the server's port, from ``/proc/net/tcp`` and ``tcp6``): how
many the load generator keeps is its own choice (a client pool that grew during a stall keeps
every connection in rotation), so a leak is read from the others (``fds - conns``), where a
socket the client closed and the server did not (CLOSE_WAIT) still counts.

A launched server runs in a process group of its own (its pid is the group's id,
:mod:`harness.servers.launch`); its engine process, extra front ends and any helper process
it spawns are members. Each process is named by its role where the server says it
(:func:`roles`: ``frontend-<i>`` from ``/get_server_info``'s ``frontend``, ``engine`` from
``engine.engine_process_pid``), else by what /proc says (``resource-tracker``) or ``proc``,
with its pid: ``engine-4242``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from harness.servers.launch import group_members

MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class ProcSample:
    """One process at one moment."""

    pid: int
    rss_mib: float
    fds: int
    threads: int
    conns: int = 0  # fds that are open client connections on the server's port


def established_inodes(port: int) -> set[int]:
    """Socket inodes of the ESTABLISHED TCP connections whose local port is ``port`` (the
    server's side of each open client connection)."""
    out: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (Path("/proc/net") / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()  # sl local rem st ... uid timeout inode
            if len(f) > 9 and f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(int(f[9]))
    return out


def _count_sockets(fd_dir: Path, fds: list[str], inodes: set[int]) -> int:
    n = 0
    for fd in fds:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            n += 1
    return n


def read_proc(pid: int, conn_inodes: set[int] | None = None) -> ProcSample | None:
    """``pid``'s RSS (MiB), open fds and threads, and of its fds those among ``conn_inodes``
    (:func:`established_inodes`); None when it is gone or unreadable."""
    base = Path("/proc") / str(pid)
    try:
        status = (base / "status").read_text()
        fds = os.listdir(base / "fd")
        conns = _count_sockets(base / "fd", fds, conn_inodes) if conn_inodes else 0
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        rss_kib = float(fields.get("VmRSS", "0 kB").split()[0])
        threads = int(fields["Threads"].strip())
    except (KeyError, ValueError, IndexError):
        return None
    return ProcSample(pid, rss_kib / 1024.0, len(fds), threads, conns)


def sample_group(pgid: int, port: int | None = None) -> dict[int, ProcSample]:
    """Every live member of process group ``pgid``, by pid (with ``port``, each one's open
    client connections on it)."""
    inodes = established_inodes(port) if port else None
    out = {}
    for pid in sorted(group_members(pgid)):
        s = read_proc(pid, inodes)
        if s is not None:
            out[pid] = s
    return out


def cmdline(pid: int) -> str:
    """A process's command line, space-separated ("" once it is gone)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def roles(base_url: str, pgid: int | None, tries: int = 24) -> dict[int, str]:
    """pid -> role of the server's processes that say who they are: each front end that
    answers ``/get_server_info`` (a fresh connection per try, so that the kernel spreads
    them over the front ends that share the port) and the engine process it names."""
    out: dict[int, str] = {}
    conn = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        for _ in range(tries):
            try:
                async with session.get(f"{base_url}/get_server_info") as r:
                    info = await r.json(content_type=None) if r.status == 200 else {}
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                break
            front = info.get("frontend") if isinstance(info, dict) else None
            if isinstance(front, dict) and isinstance(front.get("pid"), int):
                out[front["pid"]] = f"frontend-{front.get('index', 0)}"
            engine = info.get("engine") if isinstance(info, dict) else None
            if isinstance(engine, dict) and isinstance(engine.get("engine_process_pid"), int):
                out[engine["engine_process_pid"]] = "engine"
            count = front.get("count", 1) if isinstance(front, dict) else 1
            if sum(r.startswith("frontend") for r in out.values()) >= count:
                break
    if pgid is not None and pgid not in out:
        out[pgid] = "server"
    return out


def role_of(pid: int, known: dict[int, str]) -> str:
    """The role of a process of the group: the one the server named, else from /proc."""
    role = known.get(pid)
    if role is None:
        role = "resource-tracker" if "resource_tracker" in cmdline(pid) else "proc"
    return role
