"""``flashrec-bench reference-server``: the HF reference server's flags
(:mod:`harness.servers.reference_server`)."""

from __future__ import annotations

import argparse

from harness.servers.reference_server import DTYPES, run_reference_server
from harness.servers.reference_server import __doc__ as SERVER_DOC


def add_reference_server_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flashrec-bench reference-server``."""
    parser.add_argument("--model-path", required=True, help="HF checkpoint directory")
    parser.add_argument("--sid-vocab-file", help="catalog of valid SIDs (trie constraint)")
    parser.add_argument("--sid", help="override the SID layout (as flashrec --sid)")
    parser.add_argument(
        "--packed-base",
        type=int,
        default=None,
        help="base of the catalog's packed-integer keys (as flashrec --packed-base; default 8192)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (keep it on loopback)")
    parser.add_argument("--port", type=int, default=8001, help="bind port (0 = pick a free one)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument(
        "--logprob-scope",
        default="level",
        choices=["level", "sid", "full"],
        help="log_softmax scope, as the engine's --logprob-scope",
    )
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="prompt tokens per prefill forward (0: whole prompt; default 512 for float32 on "
        "CUDA, whose SDPA fallback would hold beams x prompt^2 scores, else 0)",
    )
    parser.add_argument(
        "--search",
        choices=("generate", "shared"),
        default=None,
        help="beam search: HF generate (every beam its own copy of the prompt) or shared (one "
        "prompt prefill, HF's per-step rule); default shared for float32 on CUDA, else generate",
    )
    parser.add_argument("--served-model-name", default="hf-reference")


def main(argv: list[str] | None = None) -> int:
    """``flashrec-bench reference-server ARGS`` (argv without the subcommand)."""
    parser = argparse.ArgumentParser(
        prog="flashrec-bench reference-server", description=SERVER_DOC.split("\n\n")[0]
    )
    add_reference_server_args(parser)
    return run_reference_server(parser.parse_args(argv))
