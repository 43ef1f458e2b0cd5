"""Runs a launched server that knows nothing of the watchdog pipe (``kind: command``: SGLang,
vLLM, any script) so that it still dies with its launcher.

    python -m harness.servers.guard -- CMD [ARG ...]

The guard reads the pipe ``$FLASHREC_PARENT_WATCH_FD`` names (``flashrec.parentwatch``)
and runs CMD as its child in the guard's own process group, so the launcher's signals to that
group reach CMD unchanged (the guard itself ignores them and waits for CMD). When the pipe reads
end-of-file (the launcher closed it or died, ``kill -9`` included) the group gets SIGTERM, and
after ``--grace-s`` SIGKILL. The guard exits with CMD's code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from flashrec.parentwatch import PARENT_WATCH_ENV, watch_fd

# the launcher's name for CMD's own environment (harness.servers.launch.GUARD_ENV; not
# imported from there: the guard stays light)
GUARD_CHILD_ENV = "FLASHREC_GUARD_CHILD_ENV"


def _stop_group(grace_s: float) -> None:
    """SIGTERM this process group, then SIGKILL it (the guard included) after ``grace_s``."""
    os.killpg(os.getpgrp(), signal.SIGTERM)
    time.sleep(grace_s)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.servers.guard", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--grace-s", type=float, default=10.0,
                    help="seconds between SIGTERM and SIGKILL once the launcher is gone")  # fmt: skip
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command after --")
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # a group of our own: stopping it never reaches whoever started us
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raw = os.environ.pop(PARENT_WATCH_ENV, "")
    # CMD's own environment (its PYTHONPATH may hold another package named flashrec, which
    # this guard must not import): the launcher hands it over apart from the guard's
    own = json.loads(os.environ.pop(GUARD_CHILD_ENV, "") or "{}")
    # CMD gets default dispositions back (an ignored signal would otherwise be inherited)
    child = subprocess.Popen(
        cmd, restore_signals=True, preexec_fn=_default_signals, env={**os.environ, **own}
    )
    if raw:
        fd = int(raw)
        os.set_inheritable(fd, False)
        watch_fd(fd, lambda: _stop_group(args.grace_s))
    code = child.wait()
    return code if code >= 0 else 128 - code


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
