"""harness.trace: trace summaries (GPU and host fields, the CLI) and their report lines."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from harness.trace.gpu import NO_SPAN
from harness.trace.host import span_breakdown
from harness.trace.summary import main, summarize_events, summarize_trace


def gpu_events() -> list[dict]:
    k = lambda name, ts, dur: {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    rt = lambda name, ts: {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1}  # noqa: E731
    return [
        k("sm90_fp8_e4m3_gemm", 0, 40),
        k("flash_attn_fwd", 40, 10),
        k("fp8_scaled_mm_kernel", 150, 30),
        k("rmsnorm", 180, 20),
        k("ampere_bf16_gemm", 500, 10),
        rt("cudaGraphLaunch", 100),
        rt("cudaLaunchKernel", 1),
        rt("cudaLaunchKernel", 2),
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 600},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "pid": 1, "tid": 1},
    ]


def test_gpu_summary():
    s = summarize_events(gpu_events())
    assert s["device"] == "gpu" and s["steps"] == 1
    assert s["gpu_busy_fraction"] == pytest.approx(110 / 510, abs=1e-4)
    gaps = s["largest_gaps_us"]
    assert gaps[0]["gap_us"] == 300 and gaps[0]["before"] == "rmsnorm"
    assert gaps[1]["gap_us"] == 100 and gaps[1]["after"] == "fp8_scaled_mm_kernel"
    # gaps over 300 us: none (the 300 us one is not over); the 100 us one is too short
    assert s["gaps_over"] == {"threshold_us": 300.0, "count": 0, "total_us": 0, "fraction": 0}
    late = summarize_events(gpu_events() + [_kernel("late_kernel", 1500, 10)])
    assert late["gaps_over"]["count"] == 1 and late["gaps_over"]["total_us"] == 990
    assert late["gaps_over"]["fraction"] == pytest.approx(990 / 1510, abs=1e-4)
    # no FlashRec decode span in this trace: any graph launch counts (another engine's trace)
    assert s["decode_graph_replay"] is True and s["cuda_graph_launches"] == 1
    assert s["decode_graph_launches"] == "n/a"
    assert s["kernel_launches"] == 2
    assert s["top_kernels"][0]["name"] == "sm90_fp8_e4m3_gemm"
    assert s["gemm"]["total_us"] == 80 and s["gemm"]["fp8_us"] == 70
    assert s["gemm"]["is_fp8"] is True


def _span(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def _gspan(name: str, ts: float, dur: float) -> dict:
    """A device-side annotation (the profiler's GPU copy of a host span)."""
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": ts, "dur": dur}


def _kernel(name: str, ts: float, dur: float, regs: int | None = None) -> dict:
    """A kernel event, with the registers per thread the profiler records when given."""
    args = {"args": {"registers per thread": regs}} if regs else {}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, **args}


def _report_lines(tmp_path: Path, events: list[dict]) -> list[str]:
    """REPORT.md's trace lines for ``events`` written as a gzipped trace and summarized."""
    from harness.report.render_stages import trace_lines

    p = tmp_path / f"t{len(list(tmp_path.iterdir()))}.trace.json.gz"
    for e in events:
        e.setdefault("pid", 0)
        e.setdefault("tid", 0)
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    report = {
        "cells": [{"id": "c", "trace": {"status": "complete", "files": [summarize_trace(p)]}}]
    }
    return trace_lines(report)


def test_decode_graph_replay_counts_only_launches_inside_decode_spans():
    """The prefill graphs (one-prompt and piecewise) launch graphs too: a trace whose decode
    ran eagerly must not read as CUDA-graph decode."""

    def rt(ts: float) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts, "dur": 1}

    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10}
    eager = [
        kernel,
        _span("flashrec.prefill", 0, 100),
        rt(10),
        rt(20),
        _span("flashrec.decode", 200, 50),
    ]
    s = summarize_events(eager)
    assert s["cuda_graph_launches"] == 2 and s["decode_graph_launches"] == 0
    assert s["decode_graph_replay"] is False
    graphed = eager + [rt(210), _span("flashrec.decode_step", 300, 50), rt(349)]
    s = summarize_events(graphed)
    assert s["cuda_graph_launches"] == 4 and s["decode_graph_launches"] == 2
    assert s["decode_graph_replay"] is True


def test_cpu_summary_says_gpu_fields_are_na(tmp_path):
    p = tmp_path / "cpu.trace.json.gz"
    ops = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "ts": i, "dur": 1} for i in range(100)
    ]
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": ops}).encode()))
    s = summarize_trace(p)
    assert s["device"] == "cpu"
    for f in ("gpu_busy_fraction", "largest_gaps_us", "top_kernels", "gemm", "decode_graph_replay"):
        assert s[f] == "n/a"
    assert s["cpu_op_time_us"] > 0 and s["top_cpu_ops"][0]["name"].startswith("op")
    assert s["size_bytes"] == p.stat().st_size
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"xx")
    assert "error" in summarize_trace(bad)


def test_gpu_idle_is_charged_to_the_outermost_host_span():
    """Gaps between GPU work (merged intervals) go to the outermost host span running at the
    gap's midpoint, never to a span nested in it, else to "(no host span)"; the limit line
    names the span the GPU waited on most, or says GPU-bound from 80% busy on."""
    from harness.trace.gpu import NO_SPAN, idle_by_host

    k = lambda ts, dur: {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur}  # noqa: E731

    def a(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    events = [
        k(0, 10),
        k(5, 10),  # overlaps the first: one busy interval 0-15
        k(115, 5),  # gap 15-115 (100 us), midpoint 65: inside prefill (and its nested layer)
        k(150, 10),  # gap 120-150 (30 us), midpoint 135: no span
        k(200, 10),  # gap 160-200 (40 us), midpoint 180: results
        a("flashrec.prefill", 10, 100),
        a("flashrec.layer", 50, 30),
        a("flashrec.results", 170, 20),
        a("ProfilerStep#1", 0, 300),  # profiler step markers never count
    ]
    s = idle_by_host(events)
    rows = {r["span"]: r["idle_us"] for r in s["gpu_idle_by_host"]}
    assert rows == {"flashrec.prefill": 100.0, "flashrec.results": 40.0, NO_SPAN: 30.0}
    assert s["gpu_idle_us"] == 170.0
    assert s["gpu_idle_by_host"][0]["pct_of_window"] == pytest.approx(100 * 100 / 210, abs=0.01)
    assert s["limit"].startswith("host-bound") and "flashrec.prefill" in s["limit"]
    assert "launch-bound" in s["limit"]  # the prefill launches a forward
    # the same gaps with the host in the scheduler's results span instead of a forward
    between = [k(0, 15), k(115, 5), a("flashrec.results", 15, 100)]
    limit = idle_by_host(between)["limit"]
    assert limit.startswith("host-bound (host work between forwards)"), limit
    assert idle_by_host([k(0, 10), k(200, 10)])["limit"].startswith("host-bound (between steps)")
    busy = [k(0, 90), k(95, 5), a("flashrec.decode", 0, 100)]
    assert idle_by_host(busy)["limit"].startswith("gpu-bound: the GPU is busy 95.0%")
    assert idle_by_host([a("x", 0, 5)]) == {}  # no GPU work: nothing to say


def test_trace_summary_command(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "t.trace.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": gpu_events()}, fh)
    out = subprocess.run(
        [sys.executable, "-m", "harness.trace.summary", str(p), "--top", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    s = json.loads(out.stdout)
    assert s["device"] == "gpu" and len(s["top_kernels"]) == 2 and s["cuda_graph_launches"] == 1


def test_host_stalls_and_decode_cadence():
    def rt(name, ts, dur):
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": name,
            "ts": ts,
            "dur": dur,
        }

    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10},
        rt("cudaMalloc", 1, 300),
        rt("cudaStreamSynchronize", 400, 50),
        rt("cudaStreamSynchronize", 900, 30),
        rt("cudaLaunchKernel", 2, 1),
        _span("flashrec.decode", 100, 200),
        _span("flashrec.decode", 1100, 400),
        _span("flashrec.decode_step", 2100, 300),
    ]
    s = summarize_events(events)
    assert s["host_stalls"] == {
        "cudaMalloc": {"count": 1, "total_us": 300.0},
        "cudaStreamSynchronize": {"count": 2, "total_us": 80.0},
    }
    assert s["decode_steps"] == 3 and s["decode_span_us_mean"] == 300.0
    assert s["decode_interval_us_mean"] == 1000.0
    assert s["decode_duty"] == 0.3  # 300 us of host decode per 1,000 us between steps
    cpu = summarize_events([{"ph": "X", "cat": "cpu_op", "name": "op", "ts": 0, "dur": 5}])
    assert cpu["host_stalls"] == "n/a" and cpu["decode_steps"] == 0


def test_gpu_idle_by_python_frame():
    """With Python stacks in the trace, each GPU gap goes to the innermost frame running on
    the engine thread (the one with flashrec.* spans) at its midpoint."""

    def k(ts, dur):
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "tid": 9}

    def py(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur,
                "pid": 1, "tid": tid}  # fmt: skip

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "flashrec.prefill", "ts": 0, "dur": 1000,
         "pid": 1, "tid": 1},  # fmt: skip
        py("runner.py(280): prefill", 0, 1000),
        py("fp8.py(150): fp8_linear", 100, 300),
        py("jit.py(700): run", 150, 100),
        py("other_thread.py(1): spin", 0, 2000, tid=2),  # not the engine thread
        k(0, 150), k(250, 10),  # gap 150-250, midpoint 200: in jit.py run
        k(460, 40), k(560, 10),  # gap 260-460 (mid 360: fp8_linear), 500-560 (mid 530: prefill)
        k(1800, 10),  # gap 570-1800, midpoint 1185: no frame on the engine thread
    ]  # fmt: skip
    s = summarize_events(events)
    rows = {r["frame"]: r["idle_us"] for r in s["gpu_idle_by_python"]}
    assert rows == {
        "jit.py(700): run": 100.0,
        "fp8.py(150): fp8_linear": 200.0,
        "runner.py(280): prefill": 60.0,
        "(no host span)": 1230.0,
    }
    assert summarize_events(events[:1] + events[6:])["gpu_idle_by_python"] == "n/a"


def test_report_trace_lines_show_the_new_fields(tmp_path):
    """REPORT.md's trace section prints the limit, the idle split by host span and by Python
    frame, the allocator / sync calls and the decode cadence of a summary."""
    events = gpu_events() + [
        _span("flashrec.prefill", 40, 120),
        _span("flashrec.decode", 300, 100),
        {
            "ph": "X",
            "cat": "python_function",
            "name": "runner.py(1): prefill",
            "ts": 40,
            "dur": 120,
            "pid": 0,
            "tid": 0,
        },  # fmt: skip
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 450, "dur": 7},
    ]
    text = "\n".join(_report_lines(tmp_path, events))
    assert "**limit: host-bound" in text and "GPU idle while the host is in" in text
    (frames,) = [line for line in text.splitlines() if "GPU idle by Python frame" in line]
    assert "runner.py(1): prefill 0.1 ms" in frames
    assert "allocator calls and syncs: cudaStreamSynchronize x1" in text
    assert "decode: 1 steps" in text


def test_gpu_time_is_charged_to_the_outermost_device_span():
    """Kernels fall in the outermost device-side annotation they start in (a layer span inside
    a prefill span counts as the prefill), with per-kernel launches, mean, longest and
    registers; kernels outside every device span go to (no host span)."""
    events = [
        _gspan("flashrec.prefill", 0, 100),
        _gspan("flashrec.layer", 10, 50),  # nested: charged to the prefill
        _gspan("flashrec.decode_step", 200, 100),
        _kernel("gemm", 10, 30, 168),
        _kernel("gemm", 45, 10, 168),
        _kernel("norm", 80, 5),
        _kernel("attn", 200, 40, 255),
        _kernel("attn", 250, 20, 255),
        _kernel("gemm", 275, 10, 168),
        _kernel("copy", 400, 3),
    ]
    rows = summarize_events(events)["gpu_time_by_span"]
    assert [r["span"] for r in rows] == ["flashrec.decode_step", "flashrec.prefill", NO_SPAN]
    decode, prefill, rest = rows
    assert decode["gpu_us"] == 70 and decode["ops"] == 3
    assert decode["pct"] == pytest.approx(100 * 70 / 118, abs=0.01)
    attn = decode["top"][0]
    assert (attn["name"], attn["count"], attn["mean_us"], attn["max_us"], attn["registers"]) == (
        "attn",
        2,
        30.0,
        40.0,
        255,
    )
    assert prefill["gpu_us"] == 45 and [t["name"] for t in prefill["top"]] == ["gemm", "norm"]
    assert prefill["top"][1]["registers"] is None
    assert rest["gpu_us"] == 3
    # how many such spans the trace holds, and each span's time by kind of kernel
    assert (decode["spans"], prefill["spans"], rest["spans"]) == (1, 1, 0)
    kinds = {r["name"]: (r["total_us"], r["count"]) for r in decode["by_class"]}
    assert kinds == {"attention": (60, 2), "GEMM": (10, 1)}
    assert {r["name"]: r["total_us"] for r in prefill["by_class"]} == {
        "GEMM": 40,
        "norm / activation / quant": 5,
    }
    # no device-side annotations (another engine's trace): not applicable
    assert summarize_events(events[3:])["gpu_time_by_span"] == "n/a"


def test_report_lists_gpu_time_by_span(tmp_path):
    events = [_gspan("flashrec.decode_step", 0, 50), _kernel("Kernel", 0, 40, 255)]
    events += [_gspan("flashrec.decode_step", 60, 50), _kernel("rms_norm_kernel", 60, 10)]
    text = "\n".join(_report_lines(tmp_path, events))
    assert "GPU time by span" in text
    assert (
        "flashrec.decode_step x2 0.1 ms (100.0% of GPU time, 2 ops): Kernel 0.0 ms (1 x 40 us, "
        "max 40, 255 regs); rms_norm_kernel 0.0 ms (1 x 10 us, max 10); by kind: other 80%, "
        "norm / activation / quant 20%" in text
    )


def test_gpu_bound_limit_names_the_span_and_kernel_the_gpu_works_in():
    events = [
        _gspan("flashrec.prefill", 0, 300),
        _gspan("flashrec.decode_step", 300, 100),
        _kernel("gemm", 0, 200),
        _kernel("norm", 200, 95),
        _kernel("attn", 300, 95),
    ]
    s = summarize_events(events)
    assert s["limit"] == (
        "gpu-bound: the GPU is busy 98.7% of the traced window; most GPU time in "
        "flashrec.prefill (76%), led by gemm (68% of it)"
    )
    # without device-side spans the limit stays as it was
    assert summarize_events(events[2:])["limit"] == (
        "gpu-bound: the GPU is busy 98.7% of the traced window"
    )


def test_report_counts_gpu_gaps_over_the_threshold(tmp_path):
    """REPORT.md's trace lines say how many GPU gaps exceed 0.3 ms and how long they last
    together (the GPU waiting for the host at step boundaries), and say nothing without one."""

    def lines(events):
        return [x for x in _report_lines(tmp_path, events) if "GPU gaps over" in x]

    assert lines(gpu_events()) == []  # its longest gap is exactly 300 us: not over
    (line,) = lines(gpu_events() + [_kernel("late", 1500, 10), _kernel("later", 2510, 10)])
    assert "GPU gaps over 0.3 ms: 2, 2.0 ms together (79.0% of the window)" in line


def test_span_breakdown_direct_children_self_time_and_launched_gpu_work(tmp_path, capsys):
    """The inside of one host span: its direct children on its thread (nested events counted
    once, at the outermost level), its own time, and the kernels its runtime calls launched
    (matched by correlation id); another thread's events in the same window do not count."""

    def ev(cat, name, ts, dur, tid=1, corr=None):
        e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}
        if corr is not None:
            e["args"] = {"correlation": corr}
        return e

    events = [
        ev("user_annotation", "flashrec.prefill", 0, 1000),
        ev("user_annotation", "flashrec.layer", 100, 300),
        ev("cpu_op", "aten::mm", 150, 100),  # inside the layer: not a direct child
        ev("cuda_runtime", "cudaLaunchKernel", 160, 10, corr=7),  # nested, still launched
        ev("user_annotation", "flashrec.layer", 500, 200),
        ev("cuda_runtime", "cudaGraphLaunch", 800, 100, corr=9),
        ev("cpu_op", "aten::add", 300, 50, tid=2),  # another thread
        ev("kernel", "gemm_kernel", 170, 40, corr=7),
        ev("kernel", "graph_kernel", 900, 60, corr=9),
        ev("kernel", "graph_kernel", 960, 60, corr=9),
        ev("kernel", "other_kernel", 1200, 30, corr=11),  # launched elsewhere
        ev("user_annotation", "flashrec.prefill", 2000, 100),  # a second, empty occurrence
    ]
    b = span_breakdown(events, "flashrec.prefill")
    assert b["count"] == 2 and b["host_us"] == 1100.0 and b["host_us_mean"] == 550.0
    kids = {c["name"]: (c["total_us"], c["count"]) for c in b["children"]}
    assert kids == {"flashrec.layer": (500.0, 2), "cudaGraphLaunch": (100.0, 1)}
    assert b["self_us"] == 1100.0 - 600.0
    assert b["gpu_us"] == 160.0 and b["gpu_ops"] == 3
    assert b["gpu_top"][0] == {"name": "graph_kernel", "total_us": 120.0, "count": 2}
    assert span_breakdown(events, "flashrec.nothing") == {"span": "flashrec.nothing", "count": 0}
    # the command line: python -m harness.trace.summary TRACE --span NAME
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert main([str(path), "--span", "flashrec.prefill", "--span", "flashrec.layer"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [x["span"] for x in out] == ["flashrec.prefill", "flashrec.layer"]
    assert out[1]["count"] == 2 and out[1]["children"][0]["name"] == "aten::mm"


def test_gpu_time_by_kind_of_kernel():
    """Attention before GEMM (FlashInfer / cuDNN names carry GEMM-like words), the row-wise
    kernels between the GEMMs, copies, and the rest; shares of the summed operation time."""
    events = [
        _kernel("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT", 0, 50),
        _kernel("void flashinfer::PrefillWithKVCacheKernel<cutlass::half_t>", 50, 20),
        _kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", 70, 5),
        _kernel("beam_decode_attention_kernel", 75, 5),
        _kernel("rms_norm_kernel", 80, 6),
        _kernel("silu_mul_kernel", 86, 4),
        _kernel("per_token_quant_kernel", 90, 2),
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pinned -> Device)",
            "ts": 92,
            "dur": 3,
        },
        _kernel("void at::native::elementwise_kernel<direct_copy_kernel_cuda>", 95, 1),
        _kernel("DeviceRadixSortOnesweepKernel", 96, 4),
    ]
    got = {
        r["name"]: (r["total_us"], r["count"])
        for r in summarize_events(events)["gpu_time_by_class"]
    }
    assert got == {
        "GEMM": (50, 1),
        "attention": (30, 3),
        "norm / activation / quant": (12, 3),
        "copy / memset": (4, 2),
        "other": (4, 1),
    }
    rows = summarize_events(events)["gpu_time_by_class"]
    assert [r["name"] for r in rows][:2] == ["GEMM", "attention"]  # largest first
    assert sum(r["pct"] for r in rows) == pytest.approx(100)
    # the element-wise share as one number: 12 of 100 us
    assert summarize_events(events)["elementwise_pct"] == pytest.approx(12.0)
    no_norm = [e for e in events if not re.search("norm|silu|quant", e["name"])]
    assert summarize_events(no_norm)["elementwise_pct"] == 0.0
    # a class of one's own goes first: an unnamed kernel counted as attention
    mine = summarize_events(events, classes=(("attention", r"Sort"),))["gpu_time_by_class"]
    assert {r["name"]: r["total_us"] for r in mine}["attention"] == 34
    assert "other" not in {r["name"] for r in mine}
    assert summarize_events([_span("x", 0, 5)])["gpu_time_by_class"] == "n/a"  # CPU trace
    assert summarize_events([_span("x", 0, 5)])["elementwise_pct"] == "n/a"


def test_trace_summary_command_takes_kernel_classes(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "t.trace.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": gpu_events()}, fh)
    cmd = [sys.executable, "-m", "harness.trace.summary", str(p)]
    out = subprocess.run([*cmd, "--class", "mine=rmsnorm"], capture_output=True, text=True)
    rows = {r["name"]: r["total_us"] for r in json.loads(out.stdout)["gpu_time_by_class"]}
    assert rows == {"GEMM": 80, "mine": 20, "attention": 10}
    bad = subprocess.run([*cmd, "--class", "noequals"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected NAME=REGEX" in bad.stderr
    bad = subprocess.run([*cmd, "--class", "x=("], capture_output=True, text=True)
    assert bad.returncode == 2 and "bad regex" in bad.stderr


def test_report_lists_gpu_time_by_kind(tmp_path):
    events = [_kernel("nvjet_sm90_tst_gemm", 0, 3000), _kernel("rms_norm_kernel", 3000, 1000)]
    text = "\n".join(_report_lines(tmp_path, events))
    assert "GPU time by kind: GEMM 3.0 ms (75.0%), norm / activation / quant 1.0 ms (25.0%)" in text


def test_named_spans_are_broken_down_in_the_summary_and_the_report(tmp_path):
    """summarize_trace(spans=...) adds one span_breakdown per name (count 0 for a span the trace
    lacks) and the report's trace lines show each: its host time, own time, launched GPU work
    and direct children; without names the summary has no such key."""
    from harness.report.render_stages import trace_lines

    events = [
        _span("flashrec.beam", 0, 400),
        {"ph": "X", "cat": "cpu_op", "name": "aten::stack", "ts": 10, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 200, "dur": 50,
         "args": {"correlation": 3}},
        {**_kernel("step_kernel", 260, 900), "args": {"correlation": 3}},
        _span("flashrec.beam", 2000, 200),
    ]  # fmt: skip
    for e in events:
        e.setdefault("pid", 0)
        e.setdefault("tid", 0)
    p = tmp_path / "t.trace.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    assert "span_breakdown" not in summarize_trace(p)
    s = summarize_trace(p, spans=("flashrec.beam", "flashrec.results"))
    beam, results = s["span_breakdown"]
    assert beam["count"] == 2 and beam["host_us"] == 600.0 and beam["self_us"] == 450.0
    assert beam["gpu_us"] == 900.0 and results == {"span": "flashrec.results", "count": 0}
    lines = trace_lines({"cells": [{"id": "c", "trace": {"status": "complete", "files": [s]}}]})
    text = "\n".join(lines)
    assert (
        "host span flashrec.beam x2: 0.30 ms each on the host, 0.5 ms of 0.6 in its own code; "
        "it launched 0.9 ms of GPU work (1 ops)" in text
    )
    assert "aten::stack 0.10 ms (x1, 16.7%)" in text
    assert "host span flashrec.results: not in the trace" in text


BASE = 1_796_600_000.0  # a trace's baseTimeNanoseconds, in s


def _gpu_trace(tmp_path: Path, kernels: list[dict]) -> Path:
    """``kernels`` (ts in us from BASE) written as a torch.profiler-like gzipped trace."""
    for e in kernels:
        e.setdefault("pid", 0)
        e.setdefault("tid", 0)
    p = tmp_path / f"t{len(list(tmp_path.iterdir()))}.trace.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": kernels, "baseTimeNanoseconds": int(BASE * 1e9)}, fh)
    return p


def _rendered(summary: dict) -> str:
    """REPORT.md's trace lines for one cell whose traced round wrote ``summary``."""
    from harness.report.render_stages import trace_lines

    cells = [{"id": "c", "trace": {"status": "complete", "files": [summary]}}]
    return "\n".join(trace_lines({"cells": cells}))


def _req(start_ms: float, stop_ms: float, answer_ms: float) -> tuple[float, float, float]:
    """A request's (engine start, engine end, answer) in Unix s, from ms after BASE + 1 s."""
    return tuple(BASE + 1.0 + t / 1e3 for t in (start_ms, stop_ms, answer_ms))


def test_gpu_work_per_request_over_the_engine_spans_in_the_window(tmp_path):
    """A trace with torch.profiler's ``baseTimeNanoseconds``: its GPU window in Unix time
    (base + ts). With no answers to measure between, the window's busy time is shared by the
    requests' parts of it: each counted by the share of its engine span inside the window
    (two whole, two halves, one outside: 3 requests); the time per kernel class likewise. The
    report says the figure, and what the GPU never idle would allow."""
    from harness.trace.summary import work_per_request

    p = _gpu_trace(
        tmp_path,
        [
            _kernel("nvjet_sm90_tst_gemm", 1_000_000, 3000),
            _kernel("rms_norm_kernel", 1_003_000, 1000),
            _kernel("nvjet_sm90_tst_gemm", 1_010_000, 2000),  # a 6 ms idle gap before it
        ],
    )
    s = summarize_trace(p)
    assert s["gpu_busy_us"] == 6000.0 and s["gpu_window_us"] == [1_000_000, 1_012_000]
    lo, hi = s["gpu_window_unix"]
    assert abs(lo - (BASE + 1.0)) < 1e-6 and abs(hi - (BASE + 1.012)) < 1e-6
    reqs = [_req(0, 6, 7), _req(6, 12, 13), _req(-4, 4, 5), _req(10, 14, 15), _req(20, 30, 31)]
    w = work_per_request(s, reqs)
    assert w["estimate"] == "engine spans" and w["requests_counted"] == 3.0
    assert w["requests_in_window"] == 2  # answers inside the window, said beside
    assert w["gpu_ms_per_request"] == 2.0  # 6 ms of GPU work over 3 requests
    assert w["gpu_ms_per_request_by_class"] == {
        "GEMM": round(5.0 / 3, 3),
        "norm / activation / quant": round(1.0 / 3, 3),
    }
    assert w["qps_at_full_busy"] == 500.0  # 3 requests per 6 ms of GPU work
    # less than one request's share of the window: nothing to divide by
    assert work_per_request(s, [_req(11, 13, 14)]) == {"requests_in_window": 0}
    thin = work_per_request(s, [_req(-20, 1, 2)])  # answered inside, 1/21 of its span there
    assert thin == {"requests_in_window": 1}
    assert "holds 1 answers but under one request's engine time" in _rendered({**s, **thin})
    text = _rendered({**s, **w})
    assert (
        "GPU work per request: 2.00 ms (GEMM 1.67, norm / activation / quant 0.33), the traced "
        "window's work over the 3.00 requests whose engine spans it holds; with the GPU never "
        "idle that is 500.0 QPS"
    ) in text
    text = _rendered({**s, "requests_in_window": 0})
    assert "no request was answered inside the traced window" in text


def test_gpu_work_per_request_between_answers_one_at_a_time(tmp_path):
    """One request at a time, 3 ms of GPU work each, answered 0.5 ms after its work: the
    busy time between the first and the last answer inside the window is the work of the two
    requests answered after the first, 3 ms each, as run. The window's whole busy time over
    its answers would count the last request's work without its answer (4 ms, 1.33x)."""
    from harness.trace.summary import busy_between, work_per_request

    p = _gpu_trace(
        tmp_path, [_kernel("nvjet_sm90_tst_gemm", 1_000_000 + k * 5000, 3000) for k in range(4)]
    )
    busy: list = []
    s = summarize_trace(p, busy_out=busy)
    assert busy == [(1_000_000 + k * 5000, 1_003_000 + k * 5000) for k in range(4)]
    assert busy_between(busy, 1_001_000, 1_011_000) == 2000 + 3000 + 1000
    assert busy_between(busy, 1_003_500, 1_004_500) == 0.0  # inside a gap
    reqs = [_req(k * 5, k * 5 + 3, k * 5 + 3.5) for k in range(4)]  # 3 answers inside
    w = work_per_request(s, reqs, busy)
    assert w["requests_in_window"] == 3 and w["requests_counted"] == 2
    assert w["estimate"] == "between answers"
    assert w["gpu_ms_per_request"] == 3.0 and w["qps_at_full_busy"] == round(2 / 0.006, 2)
    assert w["gpu_ms_per_request_by_class"] == {"GEMM": 3.0}
    assert s["gpu_busy_us"] / 1e3 / w["requests_in_window"] == 4.0
    # a pause after the first request (read as two waves) whose spans to the second wave
    # cover under half the window: the span from the first answer to the last still holds
    # whole requests
    starts = [0, 27, 32, 37, 42, 47, 52]  # ms; the last request is answered after the window
    kernels = [_kernel("nvjet_sm90_tst_gemm", 1_000_000 + t * 1000, 3000) for t in starts]
    busy = []
    s2 = summarize_trace(_gpu_trace(tmp_path, kernels), busy_out=busy)
    w2 = work_per_request(s2, [_req(t, t + 3, t + 3.5) for t in starts], busy)
    assert w2["estimate"] == "between answers" and w2["requests_counted"] == 5
    assert w2["gpu_ms_per_request"] == 3.0
    text = _rendered({**s, **w})
    assert (
        "GPU work per request: 3.00 ms (GEMM 3.00), the GPU's work between two of the 3 "
        "answers inside the traced window at the same point of their rhythm, over the 2 "
        "answered in between; with the GPU never idle that is 333.3 QPS"
    ) in text


def test_gpu_work_per_request_between_whole_waves(tmp_path):
    """A batched load: waves of four requests, 8 ms of GPU work a wave, the wave's answers
    0.1 ms apart after it. The span ends at the third wave's first answer, so that it holds
    whole waves: 16 ms of work over 8 answers, 2 ms each, as run (ending at the last answer
    would count 11 answers: 1.45 ms). A single wave's answers span too little of the window
    to measure between: the engine spans share the window instead."""
    from harness.trace.summary import work_per_request

    kernels = [_kernel("nvjet_sm90_tst_gemm", 1_000_000 + k * 10_000, 8000) for k in range(4)]
    busy: list = []
    s = summarize_trace(_gpu_trace(tmp_path, kernels), busy_out=busy)
    reqs = [
        _req(k * 10, k * 10 + 8, k * 10 + 8.5 + j * 0.1) for k in range(4) for j in range(4)
    ]  # wave 3 answers after the window (it ends at 38 ms)
    w = work_per_request(s, reqs, busy)
    assert w["estimate"] == "between answers" and w["requests_in_window"] == 12
    assert w["requests_counted"] == 8 and w["gpu_ms_per_request"] == 2.0
    one = [_kernel("nvjet_sm90_tst_gemm", 1_000_000, 8000)]
    busy = []
    s = summarize_trace(_gpu_trace(tmp_path, one), busy_out=busy)
    wave = [_req(0, 8, 7.6 + j * 0.1) for j in range(4)]  # answered as the window ends
    w = work_per_request(s, wave, busy)
    assert w["estimate"] == "engine spans" and w["requests_counted"] == 4.0
    assert w["gpu_ms_per_request"] == 2.0


def test_gpu_work_per_request_between_the_big_waves_of_a_served_pattern(tmp_path):
    """The answer times of a served n=512 c=8 traced window (H100): waves of 5-7 answers with
    stragglers between them, the window opening and ending on a straggler. The span runs from
    the first big wave's first answer (130.2 ms) to the last one's (389.1 ms): 16 answers, two
    whole periods of a wave and its stragglers. Ended at the last wave of any size (the
    straggler at 464.7 ms) it would count 24 answers for less than three periods' work. The
    GPU is kept busy all through, so the figure is the span over its answers."""
    from harness.trace.summary import work_per_request

    busy: list = []
    s = summarize_trace(
        _gpu_trace(tmp_path, [_kernel("nvjet_sm90_tst_gemm", 1_000_000, 505_000)]), busy_out=busy
    )
    offsets = [121.8, 130.2, 130.7, 131.0, 132.5, 132.9, 133.3, 136.9, 224.5, 264.1, 264.5,
               265.9, 266.6, 267.0, 271.3, 277.5, 338.6, 389.1, 389.6, 389.9, 390.6, 391.1,
               403.4, 408.5, 464.7]  # fmt: skip
    w = work_per_request(s, [_req(t - 100, t - 1, t) for t in offsets], busy)
    assert w["estimate"] == "between answers" and w["requests_in_window"] == 25
    assert w["requests_counted"] == 16
    assert w["gpu_ms_per_request"] == pytest.approx((389.1 - 130.2) / 16, abs=1e-3)


def test_no_work_per_request_without_a_base_time_or_gpu_work(tmp_path):
    """A trace without ``baseTimeNanoseconds`` has no Unix window, and a CPU-only one no busy
    time: nothing is estimated (never a figure from a missing clock)."""
    from harness.trace.summary import work_per_request

    gpu = [_kernel("nvjet_sm90_tst_gemm", 0, 1000)]
    cpu = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10}]
    for name, events, base in (("g", gpu, None), ("c", cpu, 1_796_600_000 * 10**9)):
        for e in events:
            e.setdefault("pid", 0)
            e.setdefault("tid", 0)
        p = tmp_path / f"{name}.trace.json.gz"
        doc = {"traceEvents": events, **({"baseTimeNanoseconds": base} if base else {})}
        with gzip.open(p, "wt") as fh:
            json.dump(doc, fh)
        s = summarize_trace(p)
        assert "gpu_window_unix" not in s
        assert work_per_request(s, [(1_796_600_000.0,) * 3]) == {}


def test_torch_profiler_files_count_ts_from_their_base_time(tmp_path):
    """The fact the per-request estimate (and the fake's ``--gpu-trace``) rests on, checked on
    the installed torch: a chrome trace it exports carries ``baseTimeNanoseconds``, and base +
    ``ts`` is the Unix time of the event."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from harness.trace.events import load_trace

    before = time.time()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x = torch.randn(64, 64)
        _ = x @ x
    after = time.time()
    path = tmp_path / "cpu.trace.json"
    prof.export_chrome_trace(str(path))
    events, base_s = load_trace(path)
    ts = [e["ts"] for e in events if e.get("ph") == "X" and "ts" in e]
    assert base_s is not None and ts
    assert before - 0.01 <= base_s + min(ts) / 1e6 <= base_s + max(ts) / 1e6 <= after + 0.01
