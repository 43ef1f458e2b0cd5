"""Measure the A/B gate itself: its false-alarm rate (A/A) and the slowdowns it catches.

    python scripts/gate_calibration.py --aa 20 --delays 0.005,0.05,0.15 --reps 5 \\
        --gate-arg=--pin-cpus --out DIR

Every repetition is one full ``flashrec-bench gate MATRIX --baseline-ref HEAD`` run: the
baseline is HEAD in a worktree, the candidate this checkout (the same engine code when only
harness or docs files differ). A/A runs must pass; a run with ``--candidate-env
FLASHREC_TEST_STEP_DELAY_MS=D`` (a sleep after every engine step of the candidate only) should
fail. Writes ``DIR/calibration.json`` and prints a summary table. Takes about 2 minutes a run on
2 cores with the CI matrix; not a unit test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def run_gate(matrix: str, out: Path, delay_ms: float, pairs: int | None, extra: list[str]) -> dict:
    argv = [sys.executable, "-m", "harness", "gate", matrix, "--baseline-ref", "HEAD"]
    argv += ["--out", str(out), *extra]
    if pairs:
        argv += ["--pairs", str(pairs)]
    if delay_ms:
        argv += ["--candidate-env", f"FLASHREC_TEST_STEP_DELAY_MS={delay_ms:g}"]
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
    return {
        "delay_ms": delay_ms,
        "exit": proc.returncode,
        "gate": comparison.get("gate", {}).get("status"),
        "failed_gates": [
            g["name"]
            for g in comparison.get("gates", {}).get("results", [])
            if g["status"] == "fail"
        ],
        "seconds": round(time.monotonic() - t0, 1),
        "metrics": deltas,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", default="matrices/ci_gate.yaml")
    p.add_argument("--aa", type=int, default=20, help="A/A repetitions")
    p.add_argument("--delays", default="0.1,0.2,0.3", help="planted delays (ms), comma-separated")
    p.add_argument("--reps", type=int, default=5, help="repetitions per delay")
    p.add_argument("--pairs", type=int, help="override the matrix's rounds (pairs)")
    p.add_argument("--out", type=Path, default=Path("reports/gate-calibration"))
    p.add_argument("--gate-arg", action="append", default=[], help="extra gate flag (repeat)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    meta = {
        "command": " ".join(sys.argv),
        "commit": commit.stdout.strip(),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "matrix": args.matrix,
    }
    planted = [float(d) for d in args.delays.split(",") if d]
    delays = []  # round-robin, so that A/A and planted runs see the same machine over time
    for i in range(max(args.aa, args.reps)):
        delays += ([0.0] if i < args.aa else []) + (planted if i < args.reps else [])
    runs = []
    for i, delay in enumerate(delays):
        res = run_gate(
            args.matrix, args.out / f"run{i:03d}-d{delay:g}", delay, args.pairs, args.gate_arg
        )
        runs.append(res)
        print(json.dumps(res), flush=True)
        (args.out / "calibration.json").write_text(json.dumps({**meta, "runs": runs}, indent=1))
    print("\ndelay_ms  runs  gate_failed  s/run  measured slowdown per metric: median [min, max] %")
    for delay in sorted({r["delay_ms"] for r in runs}):
        rs = [r for r in runs if r["delay_ms"] == delay]
        failed = sum(r["gate"] == "fail" for r in rs)
        secs = sum(r["seconds"] for r in rs) / len(rs)
        parts = []
        for key in sorted({k for r in rs for k in r["metrics"]}):
            d = sorted(r["metrics"][key]["delta_pct"] for r in rs if key in r["metrics"])
            name = key.rsplit(",", 1)[-1]
            parts.append(f"{name} {d[len(d) // 2]:+.1f} [{d[0]:+.1f}, {d[-1]:+.1f}]")
        print(f"{delay:8g}  {len(rs):4d}  {failed:11d}  {secs:5.0f}  " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
