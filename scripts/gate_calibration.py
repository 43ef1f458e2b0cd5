r"""Measure the A/B gate itself: its false-alarm rate (A/A) and the slowdowns it catches.

    python scripts/gate_calibration.py --aa 20 --delays 0.005,0.05,0.15 --spins 30,60,100,150 \
        --reps 5 --gate-arg=--pin-cpus --out DIR

Every repetition is one full ``flashrec-bench gate MATRIX --baseline-ref HEAD`` run: the
baseline is HEAD in a worktree, the candidate this checkout (the same engine code when only
harness or docs files differ). A/A runs must pass. Two planted slowdowns, candidate only:

* ``--delays`` (ms): ``FLASHREC_TEST_STEP_DELAY_MS``, a sleep after every step of the engine
  loop. A sleep also costs a wake-up, and a sleeping engine thread lets other threads run, so
  its real cost varies with the machine's load: the measured slowdown is what counts.
* ``--spins`` (us): ``FLASHREC_CALIB_SPIN_US``, a busy-wait after every ``Scheduler.step``.
  CPU work like a real regression, so its cost is proportional: the sweep that finds the
  smallest slowdown caught.

Both are test plants (``tests/plants/flashrec_plants.py``), not product code: this script puts
``tests/plants`` first on the servers' PYTHONPATH, and its ``sitecustomize`` installs a plant
where its variable is set, i.e. in the candidate only.

Runs are interleaved round-robin so that every kind sees the same machine over time. Writes
``DIR/calibration.json`` and prints a summary. Each run is a whole gate run (minutes with the CI
matrix on 2 cores): not a unit test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

PLANTS = Path(__file__).resolve().parents[1] / "tests" / "plants"
KNOBS = {"sleep_ms": "FLASHREC_TEST_STEP_DELAY_MS", "spin_us": "FLASHREC_CALIB_SPIN_US"}


def run_gate(args, out: Path, kind: str, value: float) -> dict:
    argv = [sys.executable, "-m", "harness", "gate", args.matrix, "--baseline-ref", "HEAD"]
    argv += ["--out", str(out), *args.gate_arg]
    if args.pairs:
        argv += ["--pairs", str(args.pairs)]
    if kind != "none":
        argv += ["--candidate-env", f"{KNOBS[kind]}={value:g}"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    comparison = json.loads((out / "compare.json").read_text())
    deltas = {}
    for cell in comparison.get("cells", []):
        for metric in ("qps", "latency_p50_ms"):
            r = cell.get("metrics", {}).get(metric)
            if r and r.get("delta_pct") is not None:
                deltas[f"{cell['id']}:{metric}"] = {
                    k: r.get(k) for k in ("delta_pct", "band_pct", "p_value", "verdict")
                }
    gates = comparison.get("gates", {}).get("results", [])
    return {
        "plant": kind,
        "value": value,
        "exit": proc.returncode,
        "gate": comparison.get("gate", {}).get("status"),
        "failed_gates": [g["name"] for g in gates if g["status"] == "fail"],
        "seconds": round(time.monotonic() - t0, 1),
        "metrics": deltas,
    }


def summary(runs: list[dict]) -> list[str]:
    lines = ["plant      value  runs  failed  s/run  measured change: median [min, max] %"]
    for kind, value in sorted({(r["plant"], r["value"]) for r in runs}):
        rs = [r for r in runs if (r["plant"], r["value"]) == (kind, value)]
        failed = sum(r["gate"] == "fail" for r in rs)
        parts = []
        for key in sorted({k for r in rs for k in r["metrics"]}):
            d = sorted(r["metrics"][key]["delta_pct"] for r in rs if key in r["metrics"])
            name = key.rsplit(",", 1)[-1]
            parts.append(f"{name} {d[len(d) // 2]:+.1f} [{d[0]:+.1f}, {d[-1]:+.1f}]")
        secs = sum(r["seconds"] for r in rs) / len(rs)
        lines.append(
            f"{kind:9} {value:6g}  {len(rs):4d}  {failed:6d}  {secs:5.0f}  " + "; ".join(parts)
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", default="matrices/ci_gate.yaml")
    p.add_argument("--aa", type=int, default=20, help="A/A repetitions")
    p.add_argument("--delays", default="", help="planted sleeps (ms), comma-separated")
    p.add_argument("--spins", default="", help="planted busy-waits (us), comma-separated")
    p.add_argument("--reps", type=int, default=5, help="repetitions per planted value")
    p.add_argument("--pairs", type=int, help="override the matrix's rounds (pairs)")
    p.add_argument("--out", type=Path, default=Path("reports/gate-calibration"))
    p.add_argument("--gate-arg", action="append", default=[], help="extra gate flag (repeat)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PLANTS), os.environ.get("PYTHONPATH")])
    )
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True)
    meta = {
        "command": " ".join(sys.argv),
        "commit": git.stdout.strip() + (" (+ uncommitted changes)" if dirty.stdout else ""),
        "machine": f"{platform.node()} {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs, {platform.platform()}",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "matrix": args.matrix,
    }
    planted = [("sleep_ms", float(d)) for d in args.delays.split(",") if d]
    planted += [("spin_us", float(s)) for s in args.spins.split(",") if s]
    plan: list[tuple[str, float]] = []  # round-robin: every kind sees the same machine
    for i in range(max(args.aa, args.reps)):
        plan += ([("none", 0.0)] if i < args.aa else []) + (planted if i < args.reps else [])
    runs = []
    for i, (kind, value) in enumerate(plan):
        runs.append(run_gate(args, args.out / f"run{i:03d}-{kind}{value:g}", kind, value))
        print(json.dumps(runs[-1]), flush=True)
        (args.out / "calibration.json").write_text(json.dumps({**meta, "runs": runs}, indent=1))
    print("\n" + "\n".join(summary(runs)))
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
