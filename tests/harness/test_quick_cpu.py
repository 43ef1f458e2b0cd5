"""``flashrec-bench quick`` on a CPU server: the flags left to their (GPU-sized) defaults take
a CPU-sized cell, and the run says so and why; flags given keep their values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from bench_helpers import run_cli

from harness.quick import CPU_CELL

GPU_CELL = {"median_tokens": 2465, "requests": 64, "warmup_requests": 8}
CPU_WORKLOAD = {
    "median_tokens": CPU_CELL["prompt_tokens"],
    "requests": CPU_CELL["requests"],
    "warmup_requests": CPU_CELL["warmup"],
}


def _matrix(capsys, *argv: str) -> tuple[dict, str]:
    assert run_cli("quick", *argv, "--print-matrix") == 0
    out = capsys.readouterr()
    text = out.out[out.out.index("name: quick") :]  # after an in-process server's log lines
    workload = yaml.safe_load(text)["workload"]
    return {k: workload[k] for k in GPU_CELL}, " ".join(out.err.split())


def test_a_launched_cpu_server_gets_a_cpu_sized_cell(capsys, tiny_model):
    assert CPU_WORKLOAD["median_tokens"] < GPU_CELL["median_tokens"] // 4
    got, err = _matrix(capsys, "--model-path", str(tiny_model), "--device", "cpu")
    assert got == CPU_WORKLOAD
    assert "the server runs on CPU (--device cpu): a CPU-sized cell" in err, err
    assert f"--prompt-tokens {CPU_CELL['prompt_tokens']}" in err
    # flags given keep their values; only the others are sized for the CPU
    got, err = _matrix(capsys, "--model-path", str(tiny_model), "--device", "cpu",
                       "--prompt-tokens", "1000", "--requests", "10")  # fmt: skip
    assert got == {"median_tokens": 1000, "requests": 10, "warmup_requests": CPU_CELL["warmup"]}
    assert "--prompt-tokens" not in err.split("CPU-sized cell", 1)[1].split(";")[0]
    # every one given: nothing to change, nothing said
    got, err = _matrix(capsys, "--model-path", str(tiny_model), "--device", "cpu",
                       "--prompt-tokens", "2465", "--requests", "64", "--warmup", "8")  # fmt: skip
    assert got == GPU_CELL and "CPU-sized" not in err


def test_a_gpu_server_keeps_the_defaults(capsys, tiny_model):
    got, err = _matrix(capsys, "--model-path", str(tiny_model), "--device", "cuda")
    assert got == GPU_CELL and "CPU-sized" not in err


def test_a_running_cpu_server_is_read_from_its_server_info(capsys, tiny_model):
    """``--url``: the device comes from the server's ``/get_server_info``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from server_helpers import real_server

    with real_server(tiny_model) as srv:
        got, err = _matrix(capsys, "--url", srv.url)
    assert got == CPU_WORKLOAD
    assert "its /get_server_info says device cpu" in err, err


@pytest.mark.parametrize("where", ["fake", "dead"])
def test_a_server_that_does_not_say_its_device_keeps_the_defaults(capsys, fake_url, where):
    from harness.servers.launch import free_port

    url = fake_url if where == "fake" else f"http://127.0.0.1:{free_port()}"
    got, err = _matrix(capsys, "--url", url)
    assert got == GPU_CELL and "CPU-sized" not in err
