"""scripts/serve.sh: which flags each variable becomes, env-file precedence, and a real start."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from test_server_lifecycle import Proc

from flashrec.cli import build_parser
from flashrec.config import ServerConfig, config_from_args

ROOT = Path(__file__).resolve().parents[2]
SERVE_SH = ROOT / "scripts" / "serve.sh"
EXAMPLE = ROOT / "scripts" / "serve.env.example"
VARS = (
    "MODEL_PATH",
    "SID_VOCAB_FILE",
    "SID",
    "HOST",
    "PORT",
    "CUDA_VISIBLE_DEVICES",
    "QUANTIZATION",
    "KV_CACHE_DTYPE",
    "MEM_FRACTION_STATIC",
    "CUDA_GRAPH_MAX_BS",
    "BATCH_SLOTS",
    "BEAM_WIDTH",
    "LPM_AGING_MS",
    "EXTRA_SERVER_ARGS",
    "SERVE_ENV",
    "PYTHON",
)


def dry_run(env_file: Path | None, **env: str) -> tuple[dict[str, str], list[str], int, str]:
    """(env assignments, argv after ``python``, exit code, stderr) of a dry run."""
    base = {k: v for k, v in os.environ.items() if k not in VARS}
    if env_file is not None:
        base["SERVE_ENV"] = str(env_file)
    out = subprocess.run(
        ["bash", str(SERVE_SH)],
        env={**base, **env, "SERVE_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode:
        return {}, [], out.returncode, out.stderr
    words = shlex.split(out.stdout)
    assert words[0] == "env"
    assigns = {}
    i = 1
    while "=" in words[i] and not words[i].startswith("-"):
        k, _, v = words[i].partition("=")
        assigns[k] = v
        i += 1
    return assigns, words[i:], 0, out.stderr


def flags(argv: list[str]) -> dict[str, str]:
    assert argv[1:4] == ["-m", "flashrec", "serve"]
    rest = argv[4:]
    return {rest[i]: rest[i + 1] for i in range(0, len(rest) - 1, 2)}


def test_every_variable_becomes_its_flag(tmp_path: Path) -> None:
    envs, argv, code, err = dry_run(
        EXAMPLE,
        MODEL_PATH="/models/One Rec",
        SID_VOCAB_FILE="/c/sid2pid.json",
        SID="261:453/64,begin=453,end=454",
        HOST="0.0.0.0",
        PORT="9001",
        CUDA_VISIBLE_DEVICES="3",
        QUANTIZATION="fp8",
        KV_CACHE_DTYPE="fp8_e4m3",
        MEM_FRACTION_STATIC="0.7",
        CUDA_GRAPH_MAX_BS="4096",
        BATCH_SLOTS="4096",
        BEAM_WIDTH="512",
        LPM_AGING_MS="150",
        EXTRA_SERVER_ARGS="--max-queue-len 64",
    )
    assert code == 0, err
    assert envs["PYTHONPATH"].split(":")[0] == str(ROOT)
    assert envs["CUDA_VISIBLE_DEVICES"] == "3"
    assert flags(argv) == {
        "--model-path": "/models/One Rec",
        "--sid-vocab-file": "/c/sid2pid.json",
        "--sid": "261:453/64,begin=453,end=454",
        "--host": "0.0.0.0",
        "--port": "9001",
        "--quantization": "fp8",
        "--kv-cache-dtype": "fp8_e4m3",
        "--mem-fraction-static": "0.7",
        "--cuda-graph-max-bs": "4096",
        "--batch-slots": "4096",
        "--beam-width": "512",
        "--lpm-aging-ms": "150",
        "--max-queue-len": "64",
    }
    cfg = config_from_args(ServerConfig, build_parser().parse_args(argv[3:]))
    assert (cfg.model_path, cfg.port, cfg.batch_slots, cfg.beam_width) == (
        "/models/One Rec",
        9001,
        4096,
        512,
    )
    assert (cfg.lpm_aging_ms, cfg.mem_fraction_static, cfg.max_queue_len) == (150.0, 0.7, 64)


def test_only_set_variables_and_defaults() -> None:
    envs, argv, code, err = dry_run(EXAMPLE, MODEL_PATH="/m")
    assert code == 0, err
    assert "CUDA_VISIBLE_DEVICES" not in envs
    assert flags(argv) == {"--model-path": "/m", "--host": "127.0.0.1", "--port": "8000"}


def test_env_file_and_precedence(tmp_path: Path) -> None:
    f = tmp_path / "serve.env"
    f.write_text(
        "MODEL_PATH=/from/file\nBEAM_WIDTH=50\nPORT=7000\n"
        "EXTRA_SERVER_ARGS='--no-warmup --max-seq-len 2048'\n"
    )
    _, argv, code, err = dry_run(f, PORT="7100")
    assert code == 0, err
    assert argv[-3:] == ["--no-warmup", "--max-seq-len", "2048"]
    got = flags(argv[:-3])
    assert got["--model-path"] == "/from/file" and got["--beam-width"] == "50"
    assert got["--port"] == "7100"  # the caller's environment wins over the file


def test_errors() -> None:
    _, _, code, err = dry_run(EXAMPLE)
    assert code == 2 and "MODEL_PATH" in err
    _, _, code, err = dry_run(Path("/nonexistent/serve.env"), MODEL_PATH="/m")
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_serve_sh_starts_tiny_model(tiny_checkpoint: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "serve.env"
    env_file.write_text(
        f"MODEL_PATH={tiny_checkpoint}\nSID_VOCAB_FILE={tiny_checkpoint / 'catalog.json'}\n"
        "PORT=0\nBATCH_SLOTS=64\nBEAM_WIDTH=4\n"
        "EXTRA_SERVER_ARGS='--device cpu --kv-pool-tokens 16384'\n"
    )
    proc = Proc(["bash", str(SERVE_SH)], env={"SERVE_ENV": str(env_file), "PYTHON": sys.executable})
    try:
        proc.wait_url()
        proc.wait_healthy()
        r = requests.post(proc.url + "/generate", json={"text": "hi"}, timeout=60)
        assert r.status_code == 200 and len(r.json()["meta_info"]["beam_results"]) == 4
        proc.p.send_signal(signal.SIGTERM)
        assert proc.p.wait(timeout=60) == 0
    finally:
        proc.close()
