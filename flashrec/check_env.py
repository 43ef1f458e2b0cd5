"""``python -m flashrec.check_env``: what this machine has for FlashRec, and what is missing.

Exit status 0 when every piece the requested features need is present; otherwise one line per
missing piece (``MISSING: ...``) and exit 1. ``--require`` picks the features: cpu (default),
gpu (CUDA + a GPU), fp8 (compute capability >= 8.9), flashinfer, triton.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import subprocess
import sys

FEATURES = ("cpu", "gpu", "fp8", "flashinfer", "triton")


def _version(mod: str) -> str | None:
    try:
        m = importlib.import_module(mod)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    return str(getattr(m, "__version__", "unknown"))


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return (
            out.stdout.strip().splitlines()[0]
            if out.returncode == 0 and out.stdout.strip()
            else None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def collect() -> dict:
    info: dict = {"python": platform.python_version(), "platform": platform.platform()}
    info["torch"] = _version("torch")
    info["cuda_available"] = False
    if info["torch"]:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if info["cuda_available"]:
            info["gpu"] = torch.cuda.get_device_name(0)
            info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    info["driver"] = _driver()
    info["flashinfer"] = _version("flashinfer")
    info["triton"] = _version("triton")
    info["transformers"] = _version("transformers")
    # the design notes' troubleshooting list names sgl-kernel: FlashRec does not use it (its
    # wheels are built against other torch versions; Triton and torch._scaled_mm cover it)
    sgl = _version("sgl_kernel")
    info["sgl_kernel"] = f"{sgl} (not used)" if sgl else "not needed"
    return info


def missing(info: dict, features: list[str]) -> list[str]:
    out = []
    if not info["torch"]:
        out.append(
            "torch is not importable: pip install torch (CPU: torch==2.13.0; GPU: a CUDA build >= 2.6)"
        )
    for f in features:
        if f in ("gpu", "fp8", "flashinfer") and not info["cuda_available"]:
            out.append(
                f"{f}: no CUDA GPU visible to torch (torch.version.cuda={info.get('torch_cuda')}, driver={info['driver']})"
            )
            continue
        if f == "fp8":
            cc = tuple(int(x) for x in info["compute_capability"].split("."))
            if cc < (8, 9):
                out.append(
                    f"fp8: GPU compute capability {info['compute_capability']} < 8.9 (FP8 GEMMs need Ada/Hopper or newer)"
                )
        if f == "flashinfer" and not info["flashinfer"]:
            out.append("flashinfer: not installed (pip install flashinfer-python==0.6.18.post1)")
        if f == "triton" and not info["triton"]:
            out.append(
                "triton: not installed (pip install triton); fused FP8 kernels fall back to PyTorch"
            )
    return out


def add_check_env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--require",
        default="cpu",
        help=f"comma-separated features to require: {', '.join(FEATURES)}",
    )


def run_check_env(args: argparse.Namespace) -> int:
    info = collect()
    for k, v in info.items():
        print(f"{k:20s} {v}")
    feats = [f.strip() for f in args.require.split(",") if f.strip()]
    bad = [f for f in feats if f not in FEATURES]
    if bad:
        print(f"unknown feature(s) {bad}; known: {', '.join(FEATURES)}", file=sys.stderr)
        return 2
    miss = missing(info, feats)
    for line in miss:
        print(f"MISSING: {line}")
    if not miss:
        print(f"OK: everything required for {', '.join(feats)} is present")
    return 1 if miss else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashrec.check_env", description=__doc__)
    add_check_env_args(p)
    return run_check_env(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
