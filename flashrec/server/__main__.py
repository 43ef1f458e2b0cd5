"""``python -m flashrec.server ...``: the same as ``flashrec serve ...``."""

from __future__ import annotations

import argparse
import sys

from flashrec.server.app import add_serve_args, serve_main


def main(argv: list[str] | None = None) -> int:
    """Parse the serve flags and run the server."""
    parser = argparse.ArgumentParser(prog="flashrec serve", description=__doc__)
    add_serve_args(parser)
    return serve_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
