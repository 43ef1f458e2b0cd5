"""The report's prefix-cache and replicas section: per cell, the radix hit rate and prefill
tokens per request its server(s) counted (:mod:`harness.metrics.replicas`), and for a cell
served by replicas behind a router, the router's policy and each replica's requests and hit
rate. A cell with one replica behind the router beside the same cell direct shows the
router's own overhead in their QPS and p50."""

from __future__ import annotations

from harness.report.model import Report, as_report
from harness.report.render import med_ci, num
from harness.report.render_stages import Table

REPLICAS_NOTE = (
    "radix hit rate = prompt tokens served from the servers' prefix caches / prompt tokens; "
    "prefill tokens / request = prompt tokens minus those hits, per request served (both from "
    "the servers' /metrics over the measured rounds, summed over replicas). Routed cells: "
    "requests served and hit rate per replica, over all measured rounds; the router's own "
    "overhead is a 1-replica routed cell's QPS and p50 beside the same cell served directly."
)


def _replicas(server: dict) -> str:
    rows = server.get("replicas") or []
    parts = [
        f"r{r.get('replica', i)}: {r.get('requests', '-')} req, "
        f"hit {num(r.get('radix_hit_rate'), '.2f')}"
        for i, r in enumerate(rows)
    ]
    return "; ".join(parts) or "-"


def replicas_table(report: Report | dict) -> Table | None:
    """Cells whose servers count their prefix cache, or that ran behind a router."""
    report = as_report(report)
    rows = []
    for c in report.cells:
        server = c.server or {}
        if "server_radix_hit_rate" not in (c.metrics or {}) and not server.get("router"):
            continue
        router = server.get("router") or {}
        how = f"{router.get('policy')} x {len(server.get('replica_servers') or [])}"
        rows.append(
            [
                c.id,
                how if router else "direct",
                med_ci(c.metrics.get("qps")),
                med_ci(c.metrics.get("latency_p50_ms"), ".1f"),
                med_ci(c.metrics.get("server_radix_hit_rate"), ".3f"),
                med_ci(c.metrics.get("server_prefill_tokens_per_request"), ".1f"),
                _replicas(server),
            ]
        )
    if not rows:
        return None
    head = ["cell", "served by", "QPS", "p50 ms", "radix hit rate", "prefill tokens / request"]
    return head + ["per replica (requests, hit rate)"], rows
