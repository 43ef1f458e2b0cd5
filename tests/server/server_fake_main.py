"""``python tests/server/server_fake_main.py [serve flags] [--step-delay-s S]``.

The production process path (``flashrec.server.serve``: bind, URL line, signals, drain) over
``server_fakes.FakeEngine``, for lifecycle tests that need a deterministic slow engine.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from server_fakes import FakeEngine  # noqa: E402

from flashrec.config import ServerConfig, config_from_args  # noqa: E402
from flashrec.engine.loop import EngineLoop  # noqa: E402
from flashrec.parentwatch import watch_from_env  # noqa: E402
from flashrec.server import add_serve_args, serve  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    watch_from_env()  # as ``flashrec serve``: dies with the test that launched it
    config = config_from_args(ServerConfig, args)
    return serve(EngineLoop(FakeEngine(config, step_delay_s=args.step_delay_s)), config)


if __name__ == "__main__":
    sys.exit(main())
